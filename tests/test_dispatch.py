"""Run-time ISA dispatch: selection, refusal of unknown/unsupported ISAs, visible fallbacks."""
import os
import subprocess
import sys

import pytest

from gemma4cpu import isa

# Table entries allowed to point at the scalar reference, per ISA. Keep this list explicit:
# a new fallback (or a SIMD kernel silently dropped) fails the test.
ALLOWED_FALLBACKS = {
    "avx2": set(),
    "avx512": set(),
    "amx": set(),
}


def test_ref_always_available_and_auto_picks_best():
    av = isa.available()
    assert av[0] == "ref"
    with isa.use("auto"):
        assert isa.active() == av[-1]


@pytest.mark.parametrize("name", ["avx2", "avx512", "amx"])
def test_fallbacks_match_allow_list(name):
    if name not in isa.available():
        pytest.skip(f"{name} not runnable here")
    assert set(isa.fallbacks(name)) == ALLOWED_FALLBACKS[name]


def test_unknown_isa_is_an_error():
    with pytest.raises(ValueError, match="unknown ISA"):
        isa.select("sse9")


def test_env_override_and_refusal():
    env = dict(os.environ, GEMMA4CPU_ISA="ref")
    out = subprocess.run([sys.executable, "-c", "from gemma4cpu import isa; print(isa.active())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ref"
    env["GEMMA4CPU_ISA"] = "bogus"
    bad = subprocess.run([sys.executable, "-c", "import gemma4cpu"], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "GEMMA4CPU_ISA='bogus'" in bad.stderr


def test_unsupported_isa_is_refused_not_downgraded():
    missing = [n for n in ("avx2", "avx512", "amx") if n not in isa.available()]
    if not missing:
        pytest.skip("this CPU runs every table; nothing to refuse")
    with pytest.raises(RuntimeError, match="not supported"):
        isa.select(missing[0])


def test_features_are_consistent_with_available():
    f = set(isa.cpu_features())
    if "avx512" in isa.available():
        assert {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni"} <= f
    if "avx2" in isa.available():
        assert {"avx2", "fma", "f16c"} <= f
    if "amx" in isa.available():
        assert {"amx_int8", "avx512vbmi", "avx512vnni"} <= f and "avx512" in isa.available()
    # the report names every slot
    rep = isa.table_report("ref")
    assert "gemm_q4_K" in rep and all(v == "ref" for v in rep.values())
