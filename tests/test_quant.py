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
        (rng.standard_normal(k) * 1e-36).astype(np.float32),           # a clamped GELU tail
        (rng.standard_normal(k) * 1e-38).astype(np.float32),           # -127/max would be inf
        np.full(k, 2.0 ** -80, np.float32),                             # at the Q8_K tiny limit
        np.full(k, -np.nextafter(np.float32(2.0 ** -80), np.float32(0)), np.float32),  # just below
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


def test_q8_K_tiny_blocks_are_zero_and_the_rest_untouched(isa, rng):
    """Blocks with max |x| below 2^-80 quantise to zeros with d = 0 (csrc/g4_blocks.h: otherwise
    -127/max overflows, or every kernel scale product is subnormal); the other blocks of the row
    are quantised as if alone, and the limit itself still quantises normally."""
    x = rng.standard_normal(1024).astype(np.float32)
    x[256:512] *= np.float32(1e-37)
    x[768:1024] = np.float32(2.0 ** -80)
    b = K.quantize_act("Q4_K", x[None])[0].view(R.block_q8_K)
    assert b["d"][1] == 0 and not b["qs"][1].any() and not b["bsums"][1].any()
    assert b["d"][3] != 0 and np.all(b["qs"][3] == -127)
    for i in (0, 2):
        alone = R.quantize_row_q8_K(x[256 * i:256 * (i + 1)])
        np.testing.assert_array_equal(b[i:i + 1].view(np.uint8), alone.view(np.uint8))
    assert np.all(np.isfinite(R.dequant_act(b)))


def test_q4k_product_with_tiny_block_equals_zeroed_block(isa, rng):
    """A weight product whose activations hold an all-tiny block equals, bit for bit, the product
    with that block set to zero, for 1..16 tokens (one row path per token count)."""
    from gemma4cpu.synth import random_rows
    k = 1024
    w = random_rows("Q4_K", 40, k, rng)
    pool = K.Pool(1)
    for n in (1, 4, 9, 16):
        x = rng.standard_normal((n, k)).astype(np.float32)
        x[:, 512:768] = (rng.standard_normal((n, 256)) * 1e-36).astype(np.float32)
        z = x.copy()
        z[:, 512:768] = 0
        np.testing.assert_array_equal(K.matmul(pool, "Q4_K", w, k, x), K.matmul(pool, "Q4_K", w, k, z))
