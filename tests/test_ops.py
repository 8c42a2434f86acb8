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


def test_gelu_mul_matches_float64():
    """float32 evaluation of 0.5 g (1 + tanh(c (g + a g^3))) u: about 8 roundings of at most u
    each, relative to their intermediates. Where g is very negative, 1 + tanh cancels and the
    error becomes absolute in tanh's result (<= a few u), scaled by 0.5 |g u|. So
    |y - y64| <= 16 u (|y64| + |g u|) covers both regimes with room for tanhf's 1-2 ulp."""
    from gemma4cpu.model import gelu_mul
    rng = np.random.default_rng(1)
    g = (rng.standard_normal((9, 300)) * 4).astype(np.float32)
    u = rng.standard_normal((9, 300)).astype(np.float32)
    y = gelu_mul(g, u)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    y64 = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64 ** 3))) * u64
    tol = 16 * U32 * (np.abs(y64) + np.abs(g64 * u64))
    assert (np.abs(y - y64) <= tol).all()
    # erf-GELU instead of the tanh form differs by up to ~1e-3 |g u|: far outside the bound
    from math import erf
    erf_v = np.vectorize(erf)
    y_erf = 0.5 * g64 * (1 + erf_v(g64 / np.sqrt(2))) * u64
    assert not (np.abs(y - y_erf) <= tol).all()
    # strided halves of a fused gate-up product, and batch invariance
    gu = np.concatenate([g, u], axis=1)
    np.testing.assert_array_equal(gelu_mul(gu[:, :300], gu[:, 300:]), y)
    np.testing.assert_array_equal(gelu_mul(g[3:4], u[3:4]), y[3:4])
    # far tail (exp argument above 88.7, g below about -10.2): exactly zero, as float32 tanh gives (not a
    # ~1e-36 residue that would reach the next product's activations)
    gt = np.array([[-10.3, -12.0, -50.0, -300.0, -3e4, -np.float32(3e38)]], np.float32)
    assert not gelu_mul(gt, np.ones_like(gt)).any()
    assert gelu_mul(np.array([[-9.0]], np.float32), np.ones((1, 1), np.float32))[0, 0] < 0


def test_gelu_mul_16_lanes_equal_4_lanes():
    """Where the CPU has AVX-512 gelu_mul runs 16 lanes at a time, where it has AVX2 8 (after the
    16-lane part, so both widths are crossed on an AVX-512 host): the same bits as the 4-lane code on
    every kind of input (both tails, zeros, subnormals, infinities, NaN, lengths around 16)."""
    from gemma4cpu.model import gelu_mul
    rng = np.random.default_rng(4)
    special = np.array([0.0, -0.0, 1e-40, -1e-40, 9.0, -9.0, -10.2, -10.3, 44.0, -44.0, 88.0, -88.0, 3e38, -3e38,
                        np.inf, -np.inf, np.nan], np.float32)
    for n in (1, 15, 16, 17, 31, 33, 640, 1000):
        g = np.concatenate([special, (rng.standard_normal(n) * rng.choice([0.1, 3.0, 30.0], n))]).astype(np.float32)
        g = rng.permutation(g)[None, :]
        u = rng.standard_normal(g.shape).astype(np.float32)
        wide = _kernels.set_gelu_wide(False)
        try:
            narrow = gelu_mul(g, u)
        finally:
            _kernels.set_gelu_wide(wide)
        np.testing.assert_array_equal(gelu_mul(g, u).view(np.uint32), narrow.view(np.uint32), err_msg=f"n={n}")


@pytest.mark.skipif("avx2" not in __import__("gemma4cpu.isa").isa.cpu_features(),
                    reason="the 8-lane row norms need AVX2")
def test_row_norms_8_lanes_equal_the_portable_code():
    """Where the CPU has AVX2 the row norms (sum of squares in 8 double lanes, scale, weight, the
    residual add, the rotation) run 8 lanes at a time: the same bits as the portable code for
    lengths on both sides of 8 (the scalar tail continues the lanes' partial sums), with and
    without weights, for values from 1e-30 to 1e30, zeros and a row of zeros."""
    rng = np.random.default_rng(12)
    for d in (1, 2, 7, 8, 9, 15, 16, 17, 30, 256, 640, 1002):
        n = 5
        x = (rng.standard_normal((n, d)) * rng.choice([1e-30, 1e-3, 1.0, 40.0, 1e30], (n, 1))).astype(np.float32)
        x[0, ::3] = 0.0
        x[1] = 0.0
        y = (rng.standard_normal((n, d)) * 3).astype(np.float32)
        for w in (None, (1 + rng.standard_normal(d)).astype(np.float32)):
            cos = sin = None
            if d % 2 == 0:
                ang = rng.standard_normal((n, d // 2)).astype(np.float32)
                cos, sin = np.cos(ang), np.sin(ang)
            outs = []
            for wide in (False, True):
                old = _kernels.set_norm_wide(wide)
                try:
                    o1 = np.empty_like(x)
                    _kernels.rmsnorm_rows(x, w, 1e-6, o1)
                    xa, o2 = x.copy(), np.empty_like(x)
                    _kernels.add_rmsnorm(xa, y, w, 1e-6, w, o2)
                    xb = x.copy()
                    _kernels.add_rmsnorm(xb, y, w, 1e-6)
                    o3 = None
                    if cos is not None:
                        o3 = np.empty_like(x)
                        _kernels.norm_rope(x, w, 1e-6, cos, sin, 1, o3)
                    outs.append((o1, xa, o2, xb, o3))
                finally:
                    _kernels.set_norm_wide(old)
            (p1, pa, p2, pb, p3), (q1, qa, q2, qb, q3) = outs
            for a, b, what in ((p1, q1, "rmsnorm"), (pa, qa, "add"), (p2, q2, "add+norm"), (pb, qb, "add, no out2")):
                np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"{what} d={d} w={w is not None}")
            if p3 is not None:
                np.testing.assert_array_equal(_bits(q3), _bits(p3), err_msg=f"norm_rope d={d} w={w is not None}")
    assert np.isfinite(q1).all() and (q1 != 0).any()          # the last case computed something


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_gelu_mul_over_the_pool_equals_the_serial_loop(threads):
    """The pooled GELU (csrc/g4_ops.c, elements split over the workers, 64-byte pieces) gives the
    serial Cython loop's bits for every element: sizes below and above the one-thread cutoff, a
    split that falls mid-row, strided halves of a fused gate-up product, a PLE-style 3-D slice, and
    one row. A worker that skipped or repeated a piece would leave the NaN poison or differ."""
    from gemma4cpu import kernels as K
    from gemma4cpu.model import gelu_mul
    rng = np.random.default_rng(7)
    pool = K.Pool(threads, None)
    for n, d in [(1, 640), (3, 1000), (4, 21504), (7, 2049)]:
        g = (rng.standard_normal((n, d)) * 4).astype(np.float32)
        u = rng.standard_normal((n, d)).astype(np.float32)
        serial = gelu_mul(g, u)
        out = np.full((n, d), np.nan, np.float32)
        _kernels.gelu_mul(g, u, out, pool)
        np.testing.assert_array_equal(out.view(np.uint32), serial.view(np.uint32), err_msg=f"{n}x{d}")
        gu = np.concatenate([g, u], axis=1)
        np.testing.assert_array_equal(gelu_mul(gu[:, :d], gu[:, d:], pool).view(np.uint32), serial.view(np.uint32))
        # a value does not depend on where it sits (4-lane body vs. row tail, split points)
        np.testing.assert_array_equal(gelu_mul(g[:, 1:], u[:, 1:], pool), serial[:, 1:])
        np.testing.assert_array_equal(gelu_mul(g[:, :-3], u[:, :-3]), serial[:, :-3])
    ple = rng.standard_normal((5, 3, 256)).astype(np.float32)
    g = rng.standard_normal((5, 256)).astype(np.float32)
    np.testing.assert_array_equal(gelu_mul(g, ple[:, 1, :], pool), gelu_mul(g, ple[:, 1, :]))


# The fused forward-pass steps (norm_rope, add_rmsnorm) must give the very bits of the unfused
# numpy + rmsnorm sequence they replace: the forward pass's results (and every test against HF
# that bounds them) were established on that sequence.

def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("hd,n_rot,with_w", [(256, 256, True), (512, 128, True), (64, 64, False), (2, 2, True)])
def test_norm_rope_equals_rmsnorm_then_apply_rope(hd, n_rot, with_w):
    """Partial rotation (n_rot < hd: the proportional RoPE of full layers, cos 1 / sin 0 on the
    rest) and freq factors included; several heads per token, several tokens."""
    from gemma4cpu.model import apply_rope, norm_rope, rope_tables
    rng = np.random.default_rng(hd + n_rot)
    n, h = 5, 3
    x = (rng.standard_normal((n, h, hd)) * rng.uniform(0.1, 30, (n, h, 1))).astype(np.float32)
    w = rng.uniform(-2, 2, hd).astype(np.float32) if with_w else None
    ff = rng.uniform(1, 4, hd // 2).astype(np.float32) if n_rot < hd else None
    cos, sin = rope_tables(np.arange(100, 100 + n), hd, n_rot, 10000.0, ff)
    want = apply_rope(rmsnorm(x, w, 1e-6), cos, sin)
    got = norm_rope(x, w, 1e-6, cos, sin)
    assert got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))
    # out may alias x
    xr = x.reshape(n * h, hd).copy()
    _kernels.norm_rope(xr, w, 1e-6, cos, sin, h, xr)
    np.testing.assert_array_equal(_bits(xr), _bits(want.reshape(n * h, hd)))
    # the check can fail: a swapped sin sign is caught
    bad = norm_rope(x, w, 1e-6, cos, -sin)
    assert not np.array_equal(_bits(bad), _bits(want))


def test_norm_rope_argument_errors():
    x = np.ones((6, 8), np.float32)
    cos = sin = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="whole number of tokens"):
        _kernels.norm_rope(x, None, 1e-6, cos, sin, 4, np.empty_like(x))
    with pytest.raises(ValueError, match="do not fit"):
        _kernels.norm_rope(x, None, 1e-6, cos, sin, 2, np.empty_like(x))
    with pytest.raises(ValueError, match="weight has 3 values"):
        _kernels.norm_rope(x, np.ones(3, np.float32), 1e-6, cos, sin, 3, np.empty_like(x))
    with pytest.raises(ValueError, match="even"):
        _kernels.norm_rope(np.ones((2, 3), np.float32), None, 1e-6, np.ones((2, 1), np.float32),
                           np.ones((2, 1), np.float32), 1, np.empty((2, 3), np.float32))


@pytest.mark.parametrize("w1,w2", [(True, True), (False, True), (True, False), (True, None)])
def test_add_rmsnorm_equals_numpy_residual_then_rmsnorm(w1, w2):
    """x + rmsnorm(y, w) in place, then rmsnorm(x, w2) (w2 False: weight-less norm; None: no
    second norm at all), bit for bit."""
    rng = np.random.default_rng(7)
    d = 640
    x = rng.standard_normal((4, d)).astype(np.float32) * 10
    y = rng.standard_normal((4, d)).astype(np.float32)
    wa = rng.uniform(-2, 2, d).astype(np.float32) if w1 else None
    wb = rng.uniform(-2, 2, d).astype(np.float32) if w2 else None
    want_x = x + rmsnorm(y, wa, 1e-6)
    got_x = x.copy()
    if w2 is None:
        _kernels.add_rmsnorm(got_x, y, wa, 1e-6)
    else:
        out2 = np.full_like(x, np.nan)
        _kernels.add_rmsnorm(got_x, y, wa, 1e-6, wb, out2)
        np.testing.assert_array_equal(_bits(out2), _bits(rmsnorm(want_x, wb, 1e-6)))
    np.testing.assert_array_equal(_bits(got_x), _bits(want_x))
    assert not np.array_equal(_bits(got_x), _bits(x))  # x was really updated in place


def test_add_rmsnorm_argument_errors():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="y"):
        _kernels.add_rmsnorm(x, np.ones((3, 8), np.float32), None, 1e-6)
    with pytest.raises(ValueError, match="out2"):
        _kernels.add_rmsnorm(x, x.copy(), None, 1e-6, None, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="second weight has 2"):
        _kernels.add_rmsnorm(x, x.copy(), None, 1e-6, np.ones(2, np.float32), np.empty_like(x))


@pytest.mark.parametrize("threads", [2, 3])
def test_norms_over_the_pool_equal_the_serial_calls(threads):
    """rmsnorm_rows, norm_rope and add_rmsnorm split large calls (>= 65536 values) over the pool's
    workers by rows (norm_rope by token): bit for bit the calling-thread result, also with a row
    count that does not divide evenly."""
    from gemma4cpu.kernels import Pool
    from gemma4cpu.model import rope_tables
    pool = Pool(threads)
    rng = np.random.default_rng(11)
    n, d, heads, hd = 301, 640, 4, 256
    x = (rng.standard_normal((n, d)) * 5).astype(np.float32)
    y = rng.standard_normal((n, d)).astype(np.float32)
    w, w2 = rng.uniform(-2, 2, d).astype(np.float32), rng.uniform(-2, 2, d).astype(np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    _kernels.rmsnorm_rows(x, w, 1e-6, a)
    _kernels.rmsnorm_rows(x, w, 1e-6, b, pool)
    np.testing.assert_array_equal(_bits(a), _bits(b))
    q = (rng.standard_normal((n * heads, hd)) * 3).astype(np.float32)
    cos, sin = rope_tables(np.arange(7, 7 + n), hd, hd, 10000.0, None)
    wq = rng.uniform(-2, 2, hd).astype(np.float32)
    a, b = np.empty_like(q), np.empty_like(q)
    _kernels.norm_rope(q, wq, 1e-6, cos, sin, heads, a)
    _kernels.norm_rope(q, wq, 1e-6, cos, sin, heads, b, pool)
    np.testing.assert_array_equal(_bits(a), _bits(b))
    x1, x2, o1, o2 = x.copy(), x.copy(), np.empty_like(x), np.empty_like(x)
    _kernels.add_rmsnorm(x1, y, w, 1e-6, w2, o1)
    _kernels.add_rmsnorm(x2, y, w, 1e-6, w2, o2, pool)
    np.testing.assert_array_equal(_bits(x1), _bits(x2))
    np.testing.assert_array_equal(_bits(o1), _bits(o2))
    assert not np.array_equal(_bits(x1), _bits(x))
