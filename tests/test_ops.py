"""Per-row vector ops of the forward pass (gemma4cpu/_ops.pxi) against float64 numpy."""
import numpy as np
import pytest

from gemma4cpu import _kernels
from gemma4cpu.model import rmsnorm

U32 = 2.0 ** -24


@pytest.mark.parametrize("d", [1, 16, 256, 640, 5376])
@pytest.mark.parametrize("with_w", [True, False])
def test_rmsnorm_matches_float64(d, with_w):
    """Sum of squares in double (error ~ d u64, negligible), then three float32 roundings: the
    scale, x*s, (x*s)*w: |y - y64| <= 3 u |y64| (+ tiny slack for the scale's double error)."""
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((7, d)) * rng.uniform(0.01, 100, (7, 1))).astype(np.float32)
    w = rng.uniform(-2, 2, d).astype(np.float32) if with_w else None
    y = rmsnorm(x, w, 1e-6)
    x64 = x.astype(np.float64)
    y64 = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + 1e-6)
    if with_w:
        y64 = y64 * w
    err = np.abs(y - y64)
    assert (err <= 3.01 * U32 * np.abs(y64) + 1e-30).all(), float((err / np.abs(y64)).max() / U32)
    # the bound is tight enough to catch a wrong mean (dividing by d - 1 instead of d) where d > 1
    if d > 1:
        wrong = y64 * np.sqrt(d / (d - 1))
        assert not (np.abs(y - wrong) <= 3.01 * U32 * np.abs(y64)).all()


def test_rmsnorm_rows_are_batch_invariant_and_shape_free():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    y = rmsnorm(x, w, 1e-6)
    assert y.shape == x.shape
    for i in range(5):
        np.testing.assert_array_equal(rmsnorm(x[i:i + 1], w, 1e-6).view(np.uint32), y[i:i + 1].view(np.uint32))


def test_rmsnorm_argument_errors():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="weight has 4 values"):
        _kernels.rmsnorm_rows(x, np.ones(4, np.float32), 1e-6, np.empty_like(x))
    with pytest.raises(ValueError, match="out"):
        _kernels.rmsnorm_rows(x, None, 1e-6, np.empty((3, 8), np.float32))
