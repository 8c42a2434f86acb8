"""gemma4cpu.kv_cache: append / truncate / ring wrap / rollback across the ring boundary, shared
layer reads, and the attention over the cache against the float64 reference on the full history
(spec 2.4-2.6, 4.6; style.md 11.8: rings sized window + max_draft that can rewind after wrap)."""
from types import SimpleNamespace

import numpy as np
import pytest

from gemma4cpu import _kernels
from gemma4cpu.kv_cache import KVCache, LayerSpec, flash_attention
from gemma4cpu.ref import ops
from gemma4cpu.ref import quants as R

from test_flash_attn import GGUF_NAME, attn_bound

H, HKV, HD, W = 4, 2, 64, 8


@pytest.fixture(scope="module")
def pool():
    p = _kernels.Pool(2)
    yield p
    p.close()


class History:
    """What the cache should hold: the value the kernel reads (f16/quantised rounding applied) of
    every position ever appended and not rolled back, by position."""

    def __init__(self, t="f16"):
        self.t = t
        self.k, self.v = [], []

    def add(self, k, v):
        for rows, dst in ((k, self.k), (v, self.v)):
            buf = np.zeros((rows.shape[0], _kernels.kv_slot_bytes(_kernels.KV_TYPES[self.t], HKV, HD)), np.uint8)
            _kernels.kv_store(_kernels.KV_TYPES[self.t], rows, HKV, HD, buf, np.arange(rows.shape[0], dtype=np.int64))
            dst.extend(R.dequantize(buf, GGUF_NAME[self.t]).astype(np.float64).reshape(-1, HKV, HD))

    def truncate(self, n):
        del self.k[n:], self.v[n:]


def rows(rng, m):
    return rng.standard_normal((m, HKV * HD)).astype(np.float32), rng.standard_normal((m, HKV * HD)).astype(np.float32)


def check_attention(pool, cache, hist, il, rng, q_pos, window, isa_name="ref"):
    """The cache's attention for queries at q_pos equals the float64 attention over the full history
    (positions 0..len-1, masked by window) within the derived bound."""
    q = rng.standard_normal((len(q_pos), H * HD)).astype(np.float32)
    got = cache.attention(pool, il, q, np.asarray(q_pos, np.int32), H, scale=HD ** -0.5)
    n = len(hist.k)
    case = SimpleNamespace(q=q, q_pos=np.asarray(q_pos, np.int32), kv_pos=np.arange(n, dtype=np.int32),
                           kd=np.array(hist.k).reshape(n, HKV, HD), vd=np.array(hist.v).reshape(n, HKV, HD),
                           H=H, Hkv=HKV, hd=HD, window=window, scale=HD ** -0.5, softcap=0.0)
    case.ref = lambda k=None, v=None: ops.attention(q.reshape(-1, H, HD), case.kd, case.vd, case.q_pos,
                                                   case.kv_pos, window, case.scale, return_weights=True)
    want, b = attn_bound(case, isa_name)
    assert np.all(np.abs(got.reshape(want.shape) - want) <= b), f"max err/bound {np.max(np.abs(got.reshape(want.shape) - want) / b):.3g}"


def test_sizes_and_types():
    specs = [LayerSpec(HKV, HD, W), LayerSpec(HKV, 2 * HD, 0)]
    c = KVCache(specs, n_ctx=100, max_draft=3, type_k="q8_0", type_v="q4_0")
    assert c.n_slots == [W + 3, 100]
    assert c.k[0].shape == (W + 3, HKV * 2 * 34) and c.v[0].shape == (W + 3, HKV * 2 * 18)
    assert c.k[1].shape == (100, HKV * 4 * 34)
    c = KVCache(specs, n_ctx=100, max_draft=3, max_batch=16)
    assert c.n_slots == [W + 15, 100] and c.k[0].shape == (W + 15, HKV * HD * 2)
    c = KVCache(specs, n_ctx=5, max_draft=3)  # a ring never larger than the context
    assert c.n_slots == [5, 5]
    with pytest.raises(ValueError, match="unknown cache type"):
        KVCache(specs, 10, type_k="q5_0")
    with pytest.raises(ValueError, match="multiple of 32"):
        KVCache([LayerSpec(2, 48, 0)], 10)


def test_append_errors(rng):
    c = KVCache([LayerSpec(HKV, HD, W), LayerSpec(HKV, HD, 0)], n_ctx=20, max_draft=2)
    k, v = rows(rng, 3)
    with pytest.raises(ValueError, match="positions must be 0..2"):
        c.append(0, k, v, positions=[1, 2, 3])
    with pytest.raises(ValueError, match="must both be"):
        c.append(0, k, v[:2])
    with pytest.raises(ValueError, match="not a producing layer"):
        c.append(2, k, v)
    k4, v4 = rows(rng, 4)
    with pytest.raises(ValueError, match="max_batch=3"):
        c.append(0, k4, v4)
    c.append(0, k, v, positions=[0, 1, 2])
    assert (c.layer_len(0), c.layer_len(1), c.n) == (3, 0, 0)
    c.append(1, *rows(rng, 20))  # full layer: any batch up to n_ctx
    with pytest.raises(ValueError, match="context full"):
        c.append(1, *rows(rng, 1))
    with pytest.raises(ValueError, match="cannot truncate a cache of 3 positions to 4"):
        c.truncate(4)


@pytest.mark.parametrize("t", ["f16", "q8_0"])
def test_ring_wrap_decode(pool, rng, t):
    """Token-by-token decode far past the ring size: every step sees exactly its window."""
    c = KVCache([LayerSpec(HKV, HD, W)], n_ctx=200, max_draft=3, type_k=t, type_v=t)
    hist = History(t)
    for p in range(40):
        k, v = rows(rng, 1)
        c.append(0, k, v)
        hist.add(k, v)
        held = np.sort(c.pos[0][c.pos[0] >= 0])
        assert np.array_equal(held, np.arange(max(0, p + 1 - (W + 3)), p + 1))
        check_attention(pool, c, hist, 0, rng, [p], W)


def test_rollback_across_ring_boundary(pool, rng):
    """Speculative rounds: verify batches of 1 + k drafts (k <= max_draft), reject some, continue;
    the rejected rows straddle the wrap point of the ring (the case a naive rotating cache loses)."""
    md = 3
    c = KVCache([LayerSpec(HKV, HD, W), LayerSpec(HKV, HD, 0)], n_ctx=300, max_draft=md)
    hist = History()
    P = 0
    for rnd in range(30):
        k_drafts = int(rng.integers(0, md + 1))
        m = 1 + k_drafts
        for il in range(2):
            kk, vv = rows(rng, m)
            c.append(il, kk, vv)
            if il == 0:
                hist.add(kk, vv)
                batch = (kk, vv)
        # the verify batch attends with every row (the first still sees its whole window)
        check_attention(pool, c, hist, 0, rng, list(range(P, P + m)), W)
        accepted = int(rng.integers(0, k_drafts + 1))
        n_new = P + accepted + 1
        c.truncate(n_new)
        hist.truncate(n_new)
        assert c.n == n_new and np.all(c.pos[0] < n_new) and np.all(c.pos[1][n_new:] == -1)
        # after the rollback the next token's window is intact
        check_attention(pool, c, hist, 0, rng, [n_new - 1], W)
        P = n_new
    assert P > c.n_slots[0] + 10  # the ring wrapped several times
    del batch


def test_rollback_limit(rng):
    md = 2
    c = KVCache([LayerSpec(HKV, HD, W)], n_ctx=100, max_draft=md)
    for _ in range(30):
        c.append(0, *rows(rng, 1))
    # 30 positions in a ring of W + 2 = 10 slots: positions 20..29 held; position n needs n-7..n-1
    with pytest.raises(ValueError, match="no longer holds positions"):
        c.truncate(30 - md - 2)
    c.truncate(30 - md - 1)  # max_draft + 1 back is always allowed
    assert c.n == 27 and sorted(c.pos[0][c.pos[0] >= 0]) == list(range(20, 27))
    with pytest.raises(ValueError, match="no longer holds positions"):
        c.truncate(26)
    # truncate(0) after a wrap is a reset: nothing of the past is needed, and the ring refills
    c.truncate(0)
    assert c.n == 0 and np.all(c.pos[0] == -1)
    for _ in range(12):
        c.append(0, *rows(rng, 1))
    assert sorted(c.pos[0][c.pos[0] >= 0]) == list(range(2, 12))
    # before the first wrap, any rollback is fine
    c = KVCache([LayerSpec(HKV, HD, W)], n_ctx=100, max_draft=md)
    for _ in range(9):
        c.append(0, *rows(rng, 1))
    c.truncate(0)
    assert c.n == 0 and np.all(c.pos[0] == -1)


def test_append_after_rollback_overwrites_stale_slots(pool, rng):
    c = KVCache([LayerSpec(HKV, HD, W)], n_ctx=100, max_draft=3)
    hist = History()
    for _ in range(25):
        k, v = rows(rng, 1)
        c.append(0, k, v)
        hist.add(k, v)
    k, v = rows(rng, 4)
    c.append(0, k, v)
    c.truncate(26)  # keep 1 of 4
    hist.add(k[:1], v[:1])
    k, v = rows(rng, 4)  # a new batch at 26..29 over the stale slots of 27..28
    c.append(0, k, v)
    hist.add(k, v)
    check_attention(pool, c, hist, 0, rng, [26, 27, 28, 29], W)


def test_shared_layer_reads(pool, rng):
    """KV-shared layers (spec 2.6) read the producing layer of their type: the same call as the
    producer's own (bit for bit), with the reader's window."""
    cfg = SimpleNamespace(n_layer_kv=2, n_head_kv=[HKV, HKV, HKV, HKV], head_dim=[HD, HD, HD, HD],
                          is_swa=[True, False, True, False], sliding_window=W, kv_source=[0, 1, 0, 1])
    c = KVCache.from_config(cfg, n_ctx=64, max_draft=2)
    assert c.n_slots == [W + 2, 64] and c.source == [0, 1, 0, 1]
    for _ in range(20):
        for il in range(2):
            c.append(il, *rows(rng, 1))
    q = rng.standard_normal((1, H * HD)).astype(np.float32)
    qp = np.array([19], np.int32)
    for reader, producer in ((2, 0), (3, 1)):
        a = c.attention(pool, reader, q, qp, H)
        b = c.attention(pool, producer, q, qp, H)
        assert np.array_equal(a, b)
        k, v, kp = c.view(producer)
        direct = flash_attention(pool, q, qp, k, v, kp, H, HKV, HD, window=cfg.sliding_window if producer == 0 else 0)
        assert np.array_equal(a, direct)
    with pytest.raises(ValueError, match="outside the 4 layers"):
        c.attention(pool, 4, q, qp, H)
