"""Flash attention (csrc/g4_attn.h) on every ISA against the float64 naive attention of
gemma4cpu/ref/ops.py, with a bound derived from the float32 arithmetic (style.md 11.3 rule 9).

The cache types are made exact first: the reference runs on the values the kernel reads (the
cache bytes dequantised by gguf.quants, an independent reading of the GGUF block layouts), so
what remains is float32 rounding, bounded per output element by `attn_bound` below. Quantised
caches are checked a second time against the unquantised K/V with a bound derived from their
actual quantisation error (`quant_bound`).
"""
import numpy as np
import pytest

from gemma4cpu import _kernels
from gemma4cpu import isa as isa_mod
from gemma4cpu.kv_cache import KV_TYPES
from gemma4cpu.ref import ops
from gemma4cpu.ref import quants as R

U = 2.0 ** -24  # float32 unit roundoff
# exp's max error in ulp of the result, measured over every float in [-87.3, 0] (the only
# arguments the kernels pass: s - max <= 0): glibc expf 0.502 (ref table), the Cephes polynomial
# of attn_avx2.c / attn_avx512.c 1.010 (both). One ulp of y is at most 2u*y.
EXP_ULP = {"ref": 0.51, "avx2": 1.02, "avx512": 1.02, "amx": 1.02}  # amx runs the avx512 attention
TANH_ULP = 2.0  # glibc tanhf (x86_64 libm-test-ulps); softcap only, same call in every ISA
GGUF_NAME = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}
TYPES = list(GGUF_NAME)


def gamma(n):
    n = np.asarray(n, dtype=np.float64)
    return n * U / (1 - n * U)


# ---- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool1():
    p = _kernels.Pool(1)
    yield p
    p.close()


@pytest.fixture(scope="module")
def pool2():
    p = _kernels.Pool(2)
    yield p
    p.close()


def store(rows, t, hkv, hd):
    """float rows (n, hkv*hd) -> (cache bytes (n, slot_bytes), exact values the kernel reads (n, hkv, hd))."""
    n = rows.shape[0]
    buf = np.zeros((n, _kernels.kv_slot_bytes(KV_TYPES[t], hkv, hd)), np.uint8)
    _kernels.kv_store(KV_TYPES[t], np.ascontiguousarray(rows, np.float32), hkv, hd, buf, np.arange(n, dtype=np.int64))
    vals = R.dequantize(buf, GGUF_NAME[t]).astype(np.float64).reshape(n, hkv, hd) if n else np.zeros((0, hkv, hd))
    return buf, vals


class Case:
    """A random cache of n_slots slots (positions shuffled over the slots, some empty) and n_q queries."""

    def __init__(self, rng, n_q=6, n_slots=150, H=8, Hkv=2, hd=256, kt="f16", vt="f16", window=0,
                 scale=None, softcap=0.0, empty=0.1, q_pos=None, kv_pos=None, qmag=1.0):
        self.H, self.Hkv, self.hd, self.kt, self.vt = H, Hkv, hd, kt, vt
        self.window, self.softcap = window, softcap
        self.scale = 1.0 / np.sqrt(hd) if scale is None else scale
        self.q = (rng.standard_normal((n_q, H * hd)) * qmag).astype(np.float32)
        self.kf = rng.standard_normal((n_slots, Hkv * hd)).astype(np.float32)
        self.vf = rng.standard_normal((n_slots, Hkv * hd)).astype(np.float32)
        self.kb, self.kd = store(self.kf, kt, Hkv, hd)
        self.vb, self.vd = store(self.vf, vt, Hkv, hd)
        if kv_pos is None:
            kv_pos = rng.permutation(n_slots).astype(np.int32)
            kv_pos[rng.random(n_slots) < empty] = -1
        self.kv_pos = np.asarray(kv_pos, np.int32)
        if q_pos is None:
            q_pos = rng.integers(0, max(n_slots, 1), n_q)
        self.q_pos = np.asarray(q_pos, np.int32)

    def args(self):
        return (self.q, self.q_pos, self.kb, self.vb, self.kv_pos, KV_TYPES[self.kt], KV_TYPES[self.vt],
                self.H, self.Hkv, self.hd, self.window, self.scale, self.softcap)

    def run(self, pool, out=None):
        if out is None:
            out = np.full(self.q.shape, np.nan, np.float32)
        _kernels.flash_attn(pool, *self.args(), out)
        return out

    def ref(self, k=None, v=None):
        n_q = self.q.shape[0]
        return ops.attention(self.q.reshape(n_q, self.H, self.hd), self.kd if k is None else k,
                             self.vd if v is None else v, self.q_pos, self.kv_pos, self.window, self.scale,
                             self.softcap, return_weights=True)


def attn_bound(case, isa_name, k=None, v=None):
    """Per-element bound on |kernel - float64 attention on the values the kernel reads| (n_q, H, hd).

    Per (row i, head h), visible slots j (n of them, in nb blocks), p_j the exact softmax weights:
      score  E_j = gamma(hd) * scale * sum_d |q_d k_jd| + u |s_j|      (dot of hd terms in any order
             or with FMA, then the scale product); softcap adds u|s_pre| (s/c) + (TANH_ULP*2+1) u |s|;
             the max is an exact max of computed scores, so its error is common to all j and cancels.
      weight each p_j = exp(s_j - m) is off by a relative eta: E_j, the rounding of s_j - m (u R, R the
             score range), exp itself (c_e = 2u EXP_ULP), and per block rescale alpha = exp(m - m')
             (c_e + u for its argument's share of R + u for the product with acc / l):
             eta = max_j E_j + 2 u R + c_e (nb + 1) + u nb.
             Numerator and denominator carry independent such errors, so
             |out' - out| <= eta / (1 - eta) * (sum_j p_j |v_jd| + |out_d|).
      sums   acc = sum_j p_j v_j (n products + n adds, or n FMAs), l = sum_j p_j, then out = acc / l:
             gamma(n + 1) * (sum_j p_j |v_jd| + |out_d|) + u |out_d|.
      floor  exps that underflow (< 2^-126): n * 2^-126 * (max |v| + |out|).
    Second-order terms (products of the above, all < 1e-3 relative) are covered by 1.001."""
    out, p, s = case.ref(k, v)  # out (n_q, H, hd); p, s (H, n_q, n_slots)
    n_q, H, hd = out.shape
    kk = np.repeat(case.kd if k is None else k, H // case.Hkv, axis=1)
    vv = np.repeat(case.vd if v is None else v, H // case.Hkv, axis=1)
    vis = ops.visible_mask(case.q_pos, case.kv_pos, case.window)            # (n_q, n_slots)
    n = vis.sum(axis=1).astype(np.float64)                                  # (n_q,)
    ns = vis.shape[1]
    block = _kernels.attn_block(isa_name)                                  # slots per block
    pad = (-ns) % block
    nb = np.pad(vis, ((0, 0), (0, pad))).reshape(n_q, -1, block).any(axis=2).sum(axis=1)
    q = np.abs(case.q.astype(np.float64).reshape(n_q, H, hd))
    S = np.einsum("ihd,jhd->hij", q, np.abs(kk)) * abs(case.scale)         # (H, n_q, ns)
    s_fin = np.where(vis[None], s, 0.0)
    E = gamma(hd) * S
    if case.softcap:
        s_pre = np.einsum("ihd,jhd->hij", case.q.astype(np.float64).reshape(n_q, H, hd), kk) * case.scale
        E = E + 2 * U * np.abs(s_pre) + (2 * TANH_ULP + 1) * U * np.abs(s_fin)
    else:
        E = E + U * np.abs(s_fin)
    E = np.where(vis[None], E, 0.0).max(axis=2)                            # (H, n_q)
    smax = np.where(vis[None], s, -np.inf).max(axis=2)
    smin = np.where(vis[None], s, np.inf).min(axis=2)
    R = np.where(n[None] > 0, smax - smin, 0.0)
    ce = 2 * U * EXP_ULP[isa_name]
    eta = E + 2 * U * R + ce * (nb[None] + 1) + U * nb[None]                # (H, n_q)
    pv = np.einsum("hij,jhd->ihd", p, np.abs(vv))                           # sum_j p_j |v_jd|
    ao = np.abs(out)
    et = eta.T[:, :, None]
    b = et / (1 - et) * (pv + ao) + gamma(n + 1)[:, None, None] * (pv + ao) + U * ao
    b = b + (n * 2.0 ** -126)[:, None, None] * (np.abs(vv).max(initial=0) + ao)
    return out, b * 1.001


def check(case, got, isa_name):
    want, b = attn_bound(case, isa_name)
    got = got.reshape(want.shape).astype(np.float64)
    err = np.abs(got - want)
    assert np.all(np.isfinite(got)), "non-finite output"
    assert np.all(err <= b), f"max err/bound {np.max(err / b):.3g} at {np.unravel_index(np.argmax(err / b), err.shape)}"
    return err, b


# ---- against the float64 reference --------------------------------------------------------------
@pytest.mark.parametrize("kt", TYPES)
@pytest.mark.parametrize("vt", TYPES)
def test_types_hd256(isa, pool1, rng, kt, vt):
    c = Case(rng, kt=kt, vt=vt)
    err, b = check(c, c.run(pool1), isa)
    assert err.max() > 0  # float32 arithmetic against float64: an exact match would mean self-comparison


@pytest.mark.parametrize("hd,H,Hkv", [(512, 4, 1), (512, 8, 2), (32, 6, 3), (96, 10, 2), (160, 3, 3)])
@pytest.mark.parametrize("kt,vt", [("f16", "f16"), ("q8_0", "q4_0"), ("f32", "q8_0")])
def test_head_dims_and_gqa(isa, pool1, rng, hd, H, Hkv, kt, vt):
    c = Case(rng, n_q=5, n_slots=100, H=H, Hkv=Hkv, hd=hd, kt=kt, vt=vt, window=40)
    check(c, c.run(pool1), isa)


def test_gqa_mapping_exact(isa, pool1, rng):
    """V of kv head g is the constant g + 1, so query head h must output exactly h // (H/Hkv) + 1."""
    H, Hkv, hd = 12, 3, 64
    c = Case(rng, n_q=3, n_slots=70, H=H, Hkv=Hkv, hd=hd, q_pos=[69, 30, 5], empty=0.0)
    c.vf = np.repeat(np.arange(1, Hkv + 1, dtype=np.float32), hd)[None].repeat(70, 0)
    c.vb, c.vd = store(c.vf, "f16", Hkv, hd)
    out = c.run(pool1).reshape(3, H, hd)
    # the weights sum to 1 only up to rounding: the constant comes back within the sums' bound
    want = (np.arange(H) // (H // Hkv) + 1).astype(np.float64)[None, :, None]
    _, b = attn_bound(c, isa)
    assert np.all(np.abs(out - want) <= b)
    assert np.all(np.abs(out - want) <= 1e-5 * want)
    for g in range(Hkv):  # and a head of another group would be off by >= 1
        assert np.all(np.abs(out[:, g * 4:(g + 1) * 4] - (g + 1)) < 0.5)


@pytest.mark.parametrize("W", [5, 70])
@pytest.mark.parametrize("dL", ["1", "2", "W-1", "W", "W+1", "2W+3"])
def test_sliding_window_lengths(isa, pool1, rng, W, dL):
    """A sequence of L positions (shuffled over the slots) queried at every position."""
    L = {"1": 1, "2": 2, "W-1": W - 1, "W": W, "W+1": W + 1, "2W+3": 2 * W + 3}[dL]
    c = Case(rng, n_q=L, n_slots=L, H=4, Hkv=2, hd=64, window=W, empty=0.0, q_pos=np.arange(L))
    out = c.run(pool1)
    check(c, out, isa)
    # the mask itself: with V = one-hot position codes, row i must put zero weight outside its window
    vis = ops.visible_mask(c.q_pos, c.kv_pos, W)
    assert np.array_equal(vis.sum(1), np.minimum(np.arange(L) + 1, W))


def test_full_causal_and_softcap(isa, pool1, rng):
    c = Case(rng, n_q=7, n_slots=200, H=4, Hkv=2, hd=256, softcap=5.0, scale=0.25, empty=0.2)
    check(c, c.run(pool1), isa)


def test_gemma4_scale_wide_scores(isa, pool1, rng):
    """Gemma 4 uses scale 1: scores spread over tens of units, most weights tiny or underflowing."""
    c = Case(rng, n_q=4, n_slots=260, H=8, Hkv=2, hd=256, scale=1.0, qmag=1.0, empty=0.05)
    _, _, s = c.ref()
    assert np.nanmax(np.where(np.isfinite(s), s, np.nan)) - np.nanmin(np.where(np.isfinite(s), s, np.nan)) > 100
    check(c, c.run(pool1), isa)


def test_empty_and_unseen(isa, pool1, rng):
    # all slots empty, rows before every position, and a cache with no slots at all: rows get 0
    c = Case(rng, n_q=3, n_slots=80, H=2, Hkv=1, hd=64, empty=1.0)
    assert np.array_equal(c.run(pool1), np.zeros_like(c.q))
    c = Case(rng, n_q=3, n_slots=80, H=2, Hkv=1, hd=64, empty=0.0, q_pos=[-1, -5, 10])
    c.kv_pos = np.arange(11, 91, dtype=np.int32)
    c.kv_pos[3] = 10
    out = c.run(pool1)
    assert np.array_equal(out[:2], np.zeros_like(out[:2]))
    # row 2 sees exactly one slot (position 10 in slot 3): its output is that V row, exactly
    assert np.array_equal(out[2].reshape(2, 64), np.repeat(c.vd[3], 2, axis=0).astype(np.float32))
    c = Case(rng, n_q=2, n_slots=0, H=2, Hkv=1, hd=64)
    assert np.array_equal(c.run(pool1), np.zeros_like(c.q))


def test_empty_slots_may_hold_garbage(isa, pool1, rng):
    """Empty (-1) and future slots are never read into the sums: NaN there must not leak."""
    c = Case(rng, n_q=4, n_slots=130, H=4, Hkv=2, hd=64, empty=0.3, q_pos=[20, 60, 100, 129])
    hidden = (c.kv_pos < 0) | (c.kv_pos > 129)
    kb, vb = c.kb.copy(), c.vb.copy()
    kb[hidden] = 0xFF  # f16 0xFFFF = NaN
    vb[hidden] = 0xFF
    want = c.run(pool1)
    c.kb, c.vb = kb, vb
    got = c.run(pool1)
    assert np.array_equal(got, want)


# ---- quantised caches against the unquantised K/V ----------------------------------------------
def quant_bound(case):
    """|out(K~, V~) - out(K, V)| for the exact softmax, K~/V~ the dequantised cache, K/V the float rows:
    with D = max_j |s~_j - s_j| <= scale * sum_d |q_d| |k~_jd - k_jd|, every weight moves by a factor
    within [e^-2D, e^2D], and since the weights sum to 1 both ways,
      |out~ - out| <= (e^2D - 1) * sum_j p_j |v_j - out| + max_j |v~_jd - v_jd|   (j visible)."""
    n_q, H, hd = case.q.shape[0], case.H, case.hd
    kf = case.kf.astype(np.float64).reshape(-1, case.Hkv, hd)
    vf = case.vf.astype(np.float64).reshape(-1, case.Hkv, hd)
    out, p, _ = case.ref(kf, vf)
    g = H // case.Hkv
    dk = np.repeat(np.abs(case.kd - kf), g, axis=1)
    dv = np.repeat(np.abs(case.vd - vf), g, axis=1)
    vis = ops.visible_mask(case.q_pos, case.kv_pos, case.window)
    q = np.abs(case.q.astype(np.float64).reshape(n_q, H, hd))
    D = np.where(vis[None], np.einsum("ihd,jhd->hij", q, dk) * abs(case.scale), 0).max(axis=2)  # (H, n_q)
    spread = np.einsum("hij,ijhd->ihd", p, np.abs(np.repeat(vf, g, axis=1)[None] - out[:, None]))
    dvmax = np.where(vis[:, :, None, None], dv[None], 0).max(axis=1)                           # (n_q, H, hd)
    return out, np.expm1(2 * D.T)[:, :, None] * spread + dvmax


@pytest.mark.parametrize("kt,vt", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"), ("f16", "q4_0")])
def test_quantised_cache_vs_float(isa, pool1, rng, kt, vt):
    c = Case(rng, n_q=5, n_slots=120, H=4, Hkv=2, hd=256, kt=kt, vt=vt, window=90)
    got = c.run(pool1).reshape(5, c.H, c.hd).astype(np.float64)
    want, qb = quant_bound(c)
    _, fb = attn_bound(c, isa)
    err = np.abs(got - want)
    assert np.all(err <= qb + fb), f"max err/bound {np.max(err / (qb + fb)):.3g}"


# ---- the bound can fail ------------------------------------------------------------------------
def test_bound_catches_a_wrong_value(isa, pool1, rng):
    """Change one f16 K value of the slot a row weights most behind the reference's back (flip mantissa
    bit 8: up to a quarter of the value): the kernel's result must then violate the bound."""
    c = Case(rng, n_q=1, n_slots=64, H=1, Hkv=1, hd=64, scale=1.0, qmag=0.3, empty=0.0, q_pos=[63])
    _, p, _ = c.ref()
    j = int(np.argmax(p[0, 0]))  # the slot with the largest weight
    d = int(np.argmax(np.abs(c.q[0])))
    kb = c.kb.copy()
    h = kb[j].view(np.uint16)
    h[d] ^= 0x0100
    c_bad = Case.__new__(Case)
    c_bad.__dict__.update(c.__dict__)
    c_bad.kb = kb
    got = c_bad.run(pool1)
    want, b = attn_bound(c, isa)
    assert np.any(np.abs(got.reshape(want.shape) - want) > b)


# ---- batch invariance, ranges, threads ----------------------------------------------------------
@pytest.mark.parametrize("Hkv, rows", [(2, "random"), (2, "prefill"), (8, "prefill"), (1, "verify")])
def test_batch_invariance(isa, pool1, rng, Hkv, rows):
    """Row i's output is the same bits whatever other rows share the call (verify / prefill batches).
    'prefill' / 'verify' rows are consecutive positions over an in-order cache, so runs of rows see
    the same slots of most blocks and share tiles with different mates for every split."""
    n = 16
    if rows == "random":
        q_pos, kv_pos = rng.integers(0, 300, n), None
    else:
        q_pos, kv_pos = np.arange(300 - n, 300) if rows == "verify" else np.arange(100, 100 + n), np.arange(300)
    c = Case(rng, n_q=n, n_slots=300, H=8, Hkv=Hkv, hd=256, window=0 if rows == "verify" else 200, q_pos=q_pos,
             kv_pos=kv_pos)
    full = c.run(pool1)
    for size in range(1, n + 1):
        for i0 in range(0, n, size):
            i1 = min(i0 + size, n)
            sub = Case.__new__(Case)
            sub.__dict__.update(c.__dict__)
            sub.q, sub.q_pos = np.ascontiguousarray(c.q[i0:i1]), np.ascontiguousarray(c.q_pos[i0:i1])
            assert np.array_equal(sub.run(pool1), full[i0:i1]), f"rows {i0}:{i1}"


def test_range_writes_only_its_rectangle(isa, pool1, rng):
    """Direct kernel calls on [i0,i1) x [h0,h1): that rectangle is finite and bit-equal to the whole
    call, everything else of a NaN-poisoned out stays NaN (heads cut across GQA groups too)."""
    c = Case(rng, n_q=9, n_slots=140, H=8, Hkv=2, hd=64, window=100)
    full = c.run(pool1)
    for i0, i1, h0, h1 in [(0, 9, 0, 8), (2, 5, 1, 7), (8, 9, 3, 4), (0, 1, 0, 3), (4, 9, 5, 8)]:
        out = np.full(c.q.shape, np.nan, np.float32)
        _kernels.flash_attn_range(*c.args(), out, i0, i1, h0, h1)
        o3, f3 = out.reshape(9, 8, 64), full.reshape(9, 8, 64)
        inside = np.zeros((9, 8), bool)
        inside[i0:i1, h0:h1] = True
        assert np.array_equal(o3[inside], f3[inside])
        assert np.all(np.isnan(o3[~inside]))


@pytest.mark.parametrize("n_q", [1, 3, 40])
def test_threads_identical(isa, pool1, pool2, rng, n_q):
    c = Case(rng, n_q=n_q, n_slots=200, H=8, Hkv=2, hd=128, kt="q8_0", window=150,
             q_pos=rng.integers(0, 200, n_q))
    assert np.array_equal(c.run(pool1), c.run(pool2))


def test_isas_agree_within_bounds(pool1, rng):
    """Every pair of ISAs differs by at most the sum of their bounds (last-bit differences only)."""
    avail = isa_mod.available()
    c = Case(rng, n_q=4, n_slots=180, H=8, Hkv=2, hd=256, kt="f16", vt="q8_0", window=120)
    outs, bounds = {}, {}
    for name in avail:
        with isa_mod.use(name):
            outs[name] = c.run(pool1).reshape(4, 8, 256).astype(np.float64)
            bounds[name] = attn_bound(c, name)[1]
    for a in avail:
        for b in avail:
            assert np.all(np.abs(outs[a] - outs[b]) <= bounds[a] + bounds[b])


# ---- table, storage, errors ----------------------------------------------------------------------
def test_table_report():
    for name in isa_mod.available():
        rep = _kernels.attn_table_report(name)
        assert rep == {"flash_attn": "ref" if name == "ref" else "simd"}, (name, rep)
        # blocks: a whole number of 8-slot exp vectors, at most the 64 the headers size buffers for
        assert _kernels.attn_block(name) in (8, 16, 32, 64), name
        with isa_mod.use(name):  # the amx table runs the avx512 attention (no tile code there)
            assert _kernels.attn_active() == ("avx512" if name == "amx" else name)


def test_f16_store_rounds_every_edge_like_numpy():
    """The f16 cache store (vcvtps2ph where the CPU has F16C, 8 lanes at a time; the scalar rounding
    on other CPUs) against numpy's round-to-nearest-even float16, on the edges: ties at
    every exponent, the overflow threshold 65520, subnormal halves and their ties, signed zeros,
    infinities; NaNs keep sign and top payload bits with the quiet bit set."""
    f = np.float32
    edge = [0.0, -0.0, 1.0, 65504.0, 65519.996, 65520.0, -65520.0, 1e9, np.inf, -np.inf,
            2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 3 * 2.0 ** -25, 2.0 ** -14, 2.0 ** -14 * (1 - 2 ** -12),
            1 + 2 ** -11, 1 + 3 * 2 ** -11, -(1 + 2 ** -11), 2.0 ** -26, 6e-8, -6e-8, 1e-30]
    rng = np.random.default_rng(3)
    nans = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFA5A5A5, 0x7FBFFFFF], np.uint32)  # quiet, signalling
    bits = rng.integers(0, 2 ** 32, 200, dtype=np.uint64).astype(np.uint32)  # any pattern
    x = np.concatenate([np.array(edge, f), nans.view(f), bits.view(f)])
    x = np.resize(x, 3 * 128).reshape(3, 128).astype(f)   # 128-wide rows: the 8-lane path and no tail
    b, _ = store(x, "f16", 1, 128)
    got = b.view(np.uint16).reshape(x.shape)
    xb = x.view(np.uint32)
    nan = np.isnan(x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    want_nan = (((xb >> 16) & 0x8000) | 0x7E00 | ((xb >> 13) & 0x3FF)).astype(np.uint16)
    want = np.where(nan, want_nan, want)
    assert nan.any() and (np.abs(x[~nan]) >= 65520).any()
    np.testing.assert_array_equal(got, want)


def test_store_matches_references(rng):
    x = (rng.standard_normal((5, 2 * 64)) * rng.uniform(0.01, 100, (5, 1))).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block
    b, vals = store(x, "f16", 2, 64)
    assert np.array_equal(b.view(np.float16), x.astype(np.float16))
    b, vals = store(x, "f32", 2, 64)
    assert np.array_equal(b.view(np.float32), x)
    b, _ = store(x, "q8_0", 2, 64)
    want = np.stack([R.quantize_row_q8_0(r).view(np.uint8) for r in x])
    assert np.array_equal(b, want)
    b, vals = store(x, "q4_0", 2, 64)
    want = q4_0_ref(x)
    assert np.array_equal(b, want.view(np.uint8).reshape(5, -1))
    # q4_0 error: |x - d q| <= |d| / 2 inside [-8d, 7d], <= |d| at the clamped end, + f16 rounding of d
    d = np.abs(want["d"].astype(np.float64))
    assert np.all(np.abs(vals.reshape(5, -1, 32) - x.reshape(5, -1, 32)) <= (d * (1 + 8 * 2.0 ** -11))[..., None] * 1.0001)


def q4_0_ref(x):
    """numpy q4_0 cache quantiser (csrc/g4_attn.h): max = element of largest |x| (first on ties),
    d = max / -8, q = clamp(rint(x * (1/d)) + 8, 0, 15), d stored f16."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    dt = np.dtype([("d", "<f2"), ("qs", "u1", 16)])
    out = np.zeros(blocks.shape[0], dtype=dt)
    idx = np.argmax(np.abs(blocks), axis=1)
    mx = blocks[np.arange(blocks.shape[0]), idx]
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(blocks * idv[:, None]) + 8, 0, 15).astype(np.uint8)
    out["d"] = d.astype(np.float16)
    out["qs"] = q[:, :16] | (q[:, 16:] << 4)
    return out.reshape(x.shape[0], -1)


def test_argument_errors(pool1, rng):
    c = Case(rng, n_q=2, n_slots=10, H=4, Hkv=2, hd=64)
    out = np.zeros(c.q.shape, np.float32)
    a = list(c.args())
    with pytest.raises(ValueError, match="multiple of 32"):
        _kernels.kv_slot_bytes(KV_TYPES["f16"], 2, 48)
    bad = a.copy()
    bad[7] = 3  # n_head 4 with n_head_kv 3
    with pytest.raises(ValueError, match="multiple of n_head_kv"):
        _kernels.flash_attn(pool1, *bad, out)
    bad = a.copy()
    bad[2] = c.kb[:, :-2].copy()
    with pytest.raises(ValueError, match="needs"):
        _kernels.flash_attn(pool1, *bad, out)
    bad = a.copy()
    bad[1] = c.q_pos[:1].copy()
    with pytest.raises(ValueError, match="q_pos"):
        _kernels.flash_attn(pool1, *bad, out)
    with pytest.raises(ValueError, match="out must be"):
        _kernels.flash_attn(pool1, *a, out[:1].copy())
    with pytest.raises(ValueError, match="outside"):
        _kernels.flash_attn_range(*a, out, 0, 3, 0, 4)
