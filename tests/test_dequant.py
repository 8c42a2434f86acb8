"""Row dequantisation: every type x every ISA equals gguf.quants.dequantize bit for bit."""
import numpy as np
import pytest

from gemma4cpu import kernels as K
from gemma4cpu.ref import quants as R
from gemma4cpu.synth import random_rows
from conftest import ALL_TYPES


@pytest.mark.parametrize("t", ALL_TYPES)
@pytest.mark.parametrize("k", [256, 2816])
def test_dequant_matches_gguf(isa, rng, t, k):
    w = random_rows(t, 9, k, rng)
    got = K.dequantize(t, w, k)
    want = R.dequantize(w, t).reshape(9, k)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("t", ["Q8_0", "Q4_0", "Q5_0"])
def test_dequant_32_blocks_at_640(isa, rng, t):
    w = random_rows(t, 3, 640, rng)
    np.testing.assert_array_equal(K.dequantize(t, w, 640).view(np.uint32),
                                  R.dequantize(w, t).reshape(3, 640).view(np.uint32))


def test_dequant_random_bytes_including_nonfinite_scales(isa, rng):
    # raw random bytes: ~3% of f16 scales are inf/nan; the C must still agree with gguf bit for bit
    for t in ["Q4_K", "Q6_K", "Q8_0"]:
        rb = K.row_bytes(t, 512)
        w = rng.integers(0, 256, (16, rb), dtype=np.uint8)
        got = K.dequantize(t, w, 512)
        want = R.dequantize(w, t).reshape(16, 512)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), t


def test_dequant_rejects_bad_k():
    w = np.zeros((2, 144), np.uint8)
    with pytest.raises(ValueError):
        K.dequantize("Q4_K", w, 100)
