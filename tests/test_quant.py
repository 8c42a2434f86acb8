"""Activation quantisers: every ISA equals the numpy reference bit for bit."""
import numpy as np
import pytest

from gemma4cpu import kernels as K
from gemma4cpu.ref import quants as R


def _edge_rows(rng, k):
    rows = [
        rng.standard_normal(k).astype(np.float32),
        np.zeros(k, np.float32),                                        # all zero -> d = 0
        (rng.standard_normal(k) * 1e-30).astype(np.float32),           # tiny
        (rng.standard_normal(k) * 1e30).astype(np.float32),            # huge
        np.where(rng.random(k) < 0.5, 3.0, -3.0).astype(np.float32),   # ties in max |x|, both signs
        np.full(k, -2.5, np.float32),                                   # negative max
    ]
    # exact .5 rounding cases: with amax = 127, q = x*1 for Q8_0-like scale; use half-integers
    half = (rng.integers(-126, 126, k) + 0.5).astype(np.float32)
    half[::64] = 127.0
    rows.append(half)
    one_spike = np.zeros(k, np.float32)
    one_spike[5] = 7.0
    rows.append(one_spike)
    return np.stack(rows)


@pytest.mark.parametrize("k", [256, 512, 5376])
def test_q8_K_bit_exact(isa, rng, k):
    x = _edge_rows(rng, k)
    got = K.quantize_act("Q4_K", x)
    for i in range(x.shape[0]):
        want = R.quantize_row_q8_K(x[i]).view(np.uint8)
        np.testing.assert_array_equal(got[i], want, err_msg=f"row {i}")


@pytest.mark.parametrize("k", [32, 640, 5376])
def test_q8_0_bit_exact(isa, rng, k):
    x = _edge_rows(rng, k)
    got = K.quantize_act("Q8_0", x)
    for i in range(x.shape[0]):
        want = R.quantize_row_q8_0(x[i]).view(np.uint8)
        np.testing.assert_array_equal(got[i], want, err_msg=f"row {i}")


def test_q8_K_values_are_in_range_and_bsums_consistent(rng):
    x = rng.standard_normal(1024).astype(np.float32)
    b = R.quantize_row_q8_K(x)
    assert np.abs(b["qs"].astype(int)).max() == 127
    np.testing.assert_array_equal(b["bsums"], b["qs"].reshape(-1, 16, 16).astype(int).sum(-1))
    # the activation error bound holds for the reference itself
    err = np.abs(x.astype(np.float64) - R.dequant_act(b))
    assert np.all(err <= R.act_error_bound(x, "q8_K"))
