"""Products (GEMV, small-batch GEMM, prefill GEMM) for every weight type on every ISA.

Three oracles (style.md 11.3): float64 numpy with bounds derived from the arithmetic, the scalar
C reference table (bit-exact: every table implements the same integer-then-float sequence,
g4_kernels.h), and the single-token result (batch invariance, bit-exact).
"""
import numpy as np
import pytest

from gemma4cpu import isa as isa_mod
from gemma4cpu import kernels as K
from gemma4cpu.ref import quants as R
from gemma4cpu.synth import random_rows
from conftest import ALL_TYPES, QUANT_TYPES

U = 2.0 ** -24  # unit roundoff of float32
REAL_WIDTHS = [640, 1536, 2560, 2816, 5376, 8192, 16384, 21504]  # Gemma 4 / Gemma 3 270M widths


def _k_ok(t, k):
    return k % K.type_info(t)[2] == 0


def _act(t, x):
    """(xa bytes for gemm_rows, float64 values the kernel actually multiplies)."""
    if t in ("F32", "F16", "BF16"):
        return x.view(np.uint8), x.astype(np.float64)
    xa = K.quantize_act(t, x)
    ref = R.quantize_row_q8_K if K.type_info(t)[3] == "q8_K" else R.quantize_row_q8_0
    xq = np.stack([R.dequant_act(ref(row)) for row in x])
    return xa, xq


def tight_bound(t, w, k, xq):
    """|y_kernel - W_gguf . xq| (float64) bound, derived in g4_kernels.h terms:
    quantised types: per block 3 roundings on each of the two products + 1 on their difference
    (4u of sum |d sc q xq| + |dmin m xq|), accumulation over nb blocks (nb u of the same sum), and
    u for gguf's own float32 rounding of the reference weights: (5 + nb) u sum A_i.
    float types: one rounding per product, k/16 sequential adds per lane, 4 fold adds."""
    A = R.weight_magnitudes(w, t).reshape(w.shape[0], k)
    mag = np.abs(xq) @ A.T  # (n_tok, n_rows): sum_i A_i |xq_i|
    if t in ("F32", "F16", "BF16"):
        c = k / 16 + 5
    else:
        c = 5 + k / K.type_info(t)[0]
    return c * U * mag * (1 + 1e-6) + 1e-300


def check_product(t, w, k, x, y, r0=0, r1=None):
    r1 = w.shape[0] if r1 is None else r1
    W = R.dequantize(w, t).reshape(w.shape[0], k).astype(np.float64)
    _, xq = _act(t, x)
    want_q = xq @ W.T
    tb = tight_bound(t, w, k, xq)
    err = np.abs(y[:, r0:r1].astype(np.float64) - want_q[:, r0:r1])
    assert np.all(err <= tb[:, r0:r1]), f"{t}: max err/bound {np.max(err / tb[:, r0:r1]):.3g}"
    # against the unquantised activations: add sum_i |W_i| * activation error bound
    if t not in ("F32", "F16", "BF16"):
        e = np.stack([R.act_error_bound(row, K.type_info(t)[3]) for row in x])
        loose = tb + e @ np.abs(W).T
        err2 = np.abs(y[:, r0:r1].astype(np.float64) - (x.astype(np.float64) @ W.T)[:, r0:r1])
        assert np.all(err2 <= loose[:, r0:r1])
    return err, tb


@pytest.mark.parametrize("t", ALL_TYPES)
@pytest.mark.parametrize("k,n_rows", [(256, 1), (512, 17), (2816, 33), (5376, 7)])
def test_product_within_derived_bound(isa, rng, t, k, n_rows):
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((3, k)).astype(np.float32)
    xa, _ = _act(t, x)
    y = np.full((3, n_rows), np.nan, np.float32)
    K.gemm_rows(t, w, k, xa, y)
    check_product(t, w, k, x, y)


@pytest.mark.parametrize("t", ["Q4_K", "Q8_0", "Q6_K", "Q5_0", "F16"])
@pytest.mark.parametrize("k", REAL_WIDTHS)
def test_real_gemma_widths(isa, rng, t, k):
    if not _k_ok(t, k):
        pytest.skip(f"{t} rows need k % {K.type_info(t)[2]} == 0")
    w = random_rows(t, 5, k, rng)
    x = rng.standard_normal((2, k)).astype(np.float32)
    y = K.matmul(K.Pool(1), t, w, k, x)
    check_product(t, w, k, x, y)


@pytest.mark.parametrize("t", ALL_TYPES)
def test_simd_equals_reference_bit_for_bit(isa, rng, t):
    if isa == "ref":
        pytest.skip("the reference is the oracle here")
    k, n_rows, n_tok = 2816 if _k_ok(t, 2816) else 2560, 37, 5
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    x[1] = 0.0  # a zero activation row: d = 0 blocks
    xa = K.quantize_act(t, x) if t not in ("F32", "F16", "BF16") else x
    y = K.gemm_rows(t, w, k, xa, np.full((n_tok, n_rows), np.nan, np.float32))
    with isa_mod.use("ref"):
        xr = K.quantize_act(t, x) if t not in ("F32", "F16", "BF16") else x
        np.testing.assert_array_equal(np.asarray(xa).view(np.uint8), np.asarray(xr).view(np.uint8))
        yr = K.gemm_rows(t, w, k, xr, np.full((n_tok, n_rows), np.nan, np.float32))
    np.testing.assert_array_equal(y.view(np.uint32), yr.view(np.uint32))


@pytest.mark.parametrize("t", ALL_TYPES)
def test_batch_invariance(isa, rng, t):
    """Row i of an n-token product equals the 1-token product of x[i], bit for bit, n = 1..16."""
    k = 512
    n_rows = 21
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((16, k)).astype(np.float32)
    single = np.stack([K.gemm_rows(t, w, k, _act(t, x[i:i + 1])[0], np.empty((1, n_rows), np.float32))[0]
                       for i in range(16)])
    ns = range(1, 17) if t in ("Q4_K", "Q8_0", "Q5_0") else (1, 2, 3, 4, 5, 7, 8, 9, 13, 16)
    for n in ns:
        y = K.gemm_rows(t, w, k, _act(t, x[:n])[0], np.empty((n, n_rows), np.float32))
        np.testing.assert_array_equal(y.view(np.uint32), single[:n].view(np.uint32), err_msg=f"n={n}")


@pytest.mark.parametrize("t", ["Q4_K", "Q8_0", "Q6_K", "Q5_0", "Q4_0", "F16"])
@pytest.mark.parametrize("n_tok", [17, 64, 100])
def test_prefill_tiles_equal_single_token(isa, rng, t, n_tok):
    """The pool's prefill path (token tiles, L2 row chunks, 2 threads) changes no bit."""
    k, n_rows = 512, 300
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    y = K.matmul(K.Pool(2), t, w, k, x)
    for i in (0, n_tok // 2, n_tok - 1):
        yi = K.gemm_rows(t, w, k, _act(t, x[i:i + 1])[0], np.empty((1, n_rows), np.float32))
        np.testing.assert_array_equal(y[i].view(np.uint32), yi[0].view(np.uint32))


@pytest.mark.parametrize("t", ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("k,n_tok", [(21504, 40), (32768, 33), (21504, 31)])
def test_prefill_wide_rows_equal_single_token(isa, rng, t, k, n_tok):
    """The pool's prefill path at widths where the amx table's wide Q4_0 / Q5_0 entry unpacks its row
    chunk in several cache slices (k = 21504: 16 rows a slice, 45 rows = 2 full slices and a partial
    16-row group), and where it must fall back to its tiled entry (k = 32768: a 16-row group exceeds
    the cache; n_tok < 32); for the avx2 16-token paths the re-laid activations then span many block
    ranges (rows continue through y). Every row still equals the single-token product bit for bit."""
    n_rows = 45
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    y = K.matmul(K.Pool(2), t, w, k, x)
    for i in (0, 17, n_tok - 1):
        yi = K.gemm_rows(t, w, k, _act(t, x[i:i + 1])[0], np.empty((1, n_rows), np.float32))
        np.testing.assert_array_equal(y[i].view(np.uint32), yi[0].view(np.uint32), err_msg=f"token {i}")


@pytest.mark.parametrize("t", ALL_TYPES)
@pytest.mark.parametrize("r0,r1", [(0, 0), (3, 7), (0, 1), (16, 33), (32, 33), (5, 40)])
@pytest.mark.parametrize("n_tok", [3, 9, 16])  # 9: the amx Q4_K tile path, with two token groups; 16: the amx 32-block full-tile path (masked row stores)
def test_partial_row_ranges_write_only_their_rows(isa, rng, t, r0, r1, n_tok):
    k, n_rows = 256, 40
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    y = np.full((n_tok, n_rows), np.nan, np.float32)
    K.gemm_rows(t, w, k, _act(t, x)[0], y, r0, r1)
    inside = np.zeros(n_rows, bool)
    inside[r0:r1] = True
    assert np.all(np.isfinite(y[:, inside])), "a row in range was not written"
    assert np.all(np.isnan(y[:, ~inside])), "a row outside the range was written"
    if r1 > r0:
        check_product(t, w, k, x, y, r0, r1)


@pytest.mark.parametrize("t", ["Q4_K", "Q8_0", "Q5_0", "F16"])
@pytest.mark.parametrize("offset", [4, 32])
def test_misaligned_weights(isa, rng, t, offset):
    """GGUF tensor data is only 32-byte aligned (and we accept any offset)."""
    k, n_rows = 512, 9
    w = random_rows(t, n_rows, k, rng)
    buf = np.zeros(w.size + 128, np.uint8)
    base = (-buf.ctypes.data) % 64
    wm = buf[base + offset: base + offset + w.size].reshape(w.shape)
    wm[...] = w
    x = rng.standard_normal((2, k)).astype(np.float32)
    xa = _act(t, x)[0]
    y1 = K.gemm_rows(t, wm, k, xa, np.empty((2, n_rows), np.float32))
    y2 = K.gemm_rows(t, w, k, xa, np.empty((2, n_rows), np.float32))
    np.testing.assert_array_equal(y1.view(np.uint32), y2.view(np.uint32))


@pytest.mark.parametrize("t", QUANT_TYPES)
def test_bound_catches_one_flipped_nibble(isa, rng, t):
    """The tight bound is not vacuous: changing one quant of one weight breaks it."""
    k, n_rows = 512, 4
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    xa, xq = _act(t, x)
    y = K.gemm_rows(t, w, k, xa, np.empty((1, n_rows), np.float32))
    check_product(t, w, k, x, y)  # passes on the true weights
    W = R.dequantize(w, t).reshape(n_rows, k)
    qs_offset = {"Q4_0": 2, "Q5_0": 6, "Q8_0": 2, "Q4_K": 16, "Q5_K": 48, "Q6_K": 0}[t]
    # flip bit 3 of one quant byte (a nibble's top bit; +-8 on an int8), choosing among the
    # first 16 quant bytes the one whose weight meets the largest activation
    best = None
    for j in range(16):
        cand = w.copy()
        cand[2, qs_offset + j] ^= 0x08
        changed = np.flatnonzero(R.dequantize(cand, t).reshape(n_rows, k)[2] != W[2])
        score = np.abs(xq[0, changed]).max() if changed.size else 0.0
        if best is None or score > best[0]:
            best = (score, cand)
    assert best[0] > 0.1, "no quant byte met a non-negligible activation"
    bad = best[1]
    # the product of the *original* weights must violate the bound computed for `bad`
    with pytest.raises(AssertionError):
        check_product(t, bad, k, x, y)


@pytest.mark.parametrize("t", ["Q4_K", "Q8_0", "Q6_K", "BF16"])
def test_one_and_two_threads_identical(isa, rng, t):
    k, n_rows = 1536, 250
    w = random_rows(t, n_rows, k, rng)
    for n_tok in (1, 4, 20):
        x = rng.standard_normal((n_tok, k)).astype(np.float32)
        y1 = K.matmul(K.Pool(1), t, w, k, x)
        y2 = K.matmul(K.Pool(2), t, w, k, x)
        np.testing.assert_array_equal(y1.view(np.uint32), y2.view(np.uint32))


def test_bad_arguments_are_refused():
    rng = np.random.default_rng(1)
    w = random_rows("Q4_K", 4, 512, rng)
    pool = K.Pool(1)
    x = np.zeros((1, 512), np.float32)
    with pytest.raises(ValueError, match="multiple"):
        K.matmul(pool, "Q4_K", w[:, :100], 100, x[:, :100])
    with pytest.raises(ValueError, match="row range"):
        K.matmul(pool, "Q4_K", w, 512, x, r0=2, r1=9)
    with pytest.raises(ValueError):
        K.matmul(pool, "Q4_K", w, 512, np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError, match="unsupported"):
        K.matmul(pool, "IQ4_XS", w, 512, x)


@pytest.mark.parametrize("t", ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0"])
def test_small_batch_long_rows_equal_reference_and_single_token(isa, rng, t):
    """Every n_tok = 1..16 on the 31B FFN-down width (k = 21504: the activations of one call do not
    fit one stack chunk, so the chunk loop and its carried accumulators run), with a row count that
    is no multiple of any row group: bit-identical to the scalar reference and to the 1-token result."""
    k, n_rows = 21504, 19
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((16, k)).astype(np.float32)
    x[3, : k // 2] = 0.0  # zero blocks (d = 0) in the middle of a batch
    single = np.stack([K.gemm_rows(t, w, k, _act(t, x[i:i + 1])[0], np.empty((1, n_rows), np.float32))[0]
                       for i in range(16)])
    for n in range(1, 17):
        xa = _act(t, x[:n])[0]
        y = K.gemm_rows(t, w, k, xa, np.full((n, n_rows), np.nan, np.float32))
        np.testing.assert_array_equal(y.view(np.uint32), single[:n].view(np.uint32), err_msg=f"n={n}")
        if isa != "ref":
            with isa_mod.use("ref"):
                yr = K.gemm_rows(t, w, k, xa, np.full((n, n_rows), np.nan, np.float32))
            np.testing.assert_array_equal(y.view(np.uint32), yr.view(np.uint32), err_msg=f"n={n} vs ref")


@pytest.mark.parametrize("t", ["Q4_K", "Q5_K", "Q6_K"])
def test_activation_byte_minus_128_equals_reference(isa, rng, t):
    """The quantiser never emits -128, but a Q8_K block may hold it (kernels take activation bytes
    from callers): a batch with one such byte (bsums kept consistent) equals the reference and the
    single-token result. The Q6_K batch path keeps per-lane sums in int16 only for |x| <= 127."""
    k, n_rows = 1024, 11
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((6, k)).astype(np.float32)
    xa = np.array(_act(t, x)[0], copy=True)
    blk = xa.reshape(6, -1, 292)  # Q8_K: f32 d, int8 qs[256], int16 bsums[16]
    qs = blk[..., 4:260].view(np.int8)
    for tok, b, i in ((2, 1, 37), (5, 3, 255), (0, 0, 0)):
        qs[tok, b, i] = -128
        bs = qs[tok, b].astype(np.int32).reshape(16, 16).sum(1).astype(np.int16)
        blk[tok, b, 260:292] = bs.view(np.uint8)
    blk[4, 2, 4:260] = np.uint8(0x80)  # a whole block of -128 ...
    blk[4, 2, 260:292] = np.full(16, -128 * 16, np.int16).view(np.uint8)
    if t == "Q6_K":  # ... against a row of q = 0 (q - 32 = -32): 8 products of 4096 per lane = 32768,
        w = np.array(w, copy=True)  # one past int16, the case the batch path must not pack
        w.reshape(n_rows, -1, 210)[0, 2, :192] = 0  # ql, qh = 0; scales and d kept
    single = np.stack([K.gemm_rows(t, w, k, xa[i:i + 1], np.empty((1, n_rows), np.float32))[0] for i in range(6)])
    y = K.gemm_rows(t, w, k, xa, np.full((6, n_rows), np.nan, np.float32))
    np.testing.assert_array_equal(y.view(np.uint32), single.view(np.uint32))
    if isa != "ref":
        with isa_mod.use("ref"):
            yr = K.gemm_rows(t, w, k, xa, np.full((6, n_rows), np.nan, np.float32))
        np.testing.assert_array_equal(y.view(np.uint32), yr.view(np.uint32))


@pytest.mark.parametrize("n_tok", [2, 6, 8, 9, 16])
def test_q4k_any_bsums_equal_reference(isa, rng, n_tok):
    """Kernels take Q8_K bytes from callers, so the bsums need not be the sums the quantiser writes
    (those stay within +-4096 per 32 elements). The amx Q4_K tile path splits each 32-element bsum
    as 128*hi + lo (hi a signed byte), which holds for -16384 <= bsum32 <= 16383, and hands any call
    beyond that to the avx512 kernel. Both edges of the split (tile path), one past the top and a
    pair summing to 32000 (fallback; the avx2 batch path keeps bsum32 in int16, so the contract
    stops there), against the scalar reference and the single-token results, bit for bit."""
    t, k, n_rows = "Q4_K", 1024, 19
    w = random_rows(t, n_rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    base = np.array(_act(t, x)[0], copy=True)
    for pairs in (((8192, 8191), (-8192, -8192)), ((8192, 8192),), ((16000, 16000), (-16000, -16000))):
        xa = base.copy()
        bs = xa.reshape(n_tok, -1, 292)[..., 260:292].view(np.int16)  # (n_tok, blocks, 16)
        for i, (a, b) in enumerate(pairs):
            tok, blk, j = (i * 5) % n_tok, (i * 3) % bs.shape[1], (2 * i + 1) % 8
            bs[tok, blk, 2 * j], bs[tok, blk, 2 * j + 1] = a, b
        y = K.gemm_rows(t, w, k, xa, np.full((n_tok, n_rows), np.nan, np.float32))
        single = np.stack([K.gemm_rows(t, w, k, xa[i:i + 1], np.empty((1, n_rows), np.float32))[0]
                           for i in range(n_tok)])
        np.testing.assert_array_equal(y.view(np.uint32), single.view(np.uint32), err_msg=str(pairs))
        if isa != "ref":
            with isa_mod.use("ref"):
                yr = K.gemm_rows(t, w, k, xa, np.full((n_tok, n_rows), np.nan, np.float32))
            np.testing.assert_array_equal(y.view(np.uint32), yr.view(np.uint32), err_msg=str(pairs))
