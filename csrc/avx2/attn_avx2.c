/* attn_avx2.c: flash attention with AVX2 + FMA + F16C (no AVX-512). Same algorithm as
 * csrc/ref/attn_ref.c (read its header comment) with blocks of 32 slots instead of 64 (BLOCK:
 * a block's K and V rows of a 256-dim f16 head then fit a 32 KiB L1D); otherwise the differences
 * from the reference are only in float rounding: FMA in the dot products and the V accumulation,
 * the dot product summed in one 8-lane accumulator over the 8-element chunks folded at the end,
 * a block's weights summed likewise in 8 lanes, and a polynomial exp (exp_ps below) instead of
 * libm's expf.
 *
 * Loop nest (../g4_attn_tiles.h; each (row, head) sees the same operation sequence whatever the
 * nest around it):
 *   rows in tiles of G4_ATTN_ROW_TILE, kv heads, then blocks of slots; in a block, the (row, head)
 *   pairs of the rows that see the same slots go in tiles of up to G4_ATTN_HEAD_TILE pairs. A
 *   block's K/V rows are read once per tile (scores: all tile pairs against two K rows; V: two
 *   pairs per pass). */
#include <immintrin.h>
#include <math.h>

#include "../g4_attn_tiles.h"
#include "../g4_blocks.h"

#define AI static inline __attribute__((always_inline))
#define BLOCK 32 /* slots per block (g4_attn.h) */

/* exp for x <= 88.37 (the scores here are always <= 0 after the max shift): Cephes expf
 * (n = floor(x log2 e + 1/2), r = x - n ln2 in two parts, degree-5 minimax polynomial, 2^n by
 * exponent bits). Max error measured over every float in [-87.3, 0]: see tests/test_flash_attn.py
 * (EXP_ULP). x < -87.3 (results below FLT_MIN) gives 0. */
AI __m256 exp_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, lo);
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    const __m256i n = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
    return _mm256_andnot_ps(under, y);
}

AI float exp1(float x) { return _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(x))); }

AI float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 values of block b of a head row, exact (d * q fits in float32). */
AI void load32(const int type, const uint8_t *row, int64_t b, __m256 v[4]) {
    if (type == G4_KV_F32) {
        const float *p = (const float *)row + 32 * b;
        for (int c = 0; c < 4; c++) v[c] = _mm256_loadu_ps(p + 8 * c);
    } else if (type == G4_KV_F16) {
        const g4_half *p = (const g4_half *)row + 32 * b;
        for (int c = 0; c < 4; c++) v[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8 * c)));
    } else if (type == G4_KV_Q8_0) {
        const block_q8_0 *blk = (const block_q8_0 *)row + b;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(blk->d));
        const __m128i q0 = _mm_loadu_si128((const __m128i *)blk->qs);
        const __m128i q1 = _mm_loadu_si128((const __m128i *)(blk->qs + 16));
        v[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)));
        v[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))));
        v[2] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)));
        v[3] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))));
    } else { /* q4_0: low nibbles = elements 0..15, high nibbles = 16..31 */
        const block_q4_0 *blk = (const block_q4_0 *)row + b;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(blk->d));
        const __m128i raw = _mm_loadu_si128((const __m128i *)blk->qs);
        const __m128i m4 = _mm_set1_epi8(0xF), e8 = _mm_set1_epi8(8);
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), e8);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), e8);
        v[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
        v[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
        v[2] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
        v[3] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
    }
}

/* 8 values (chunk e of 4) of block b of a head row, exact; same values as load32. */
AI __m256 load8(const int type, const uint8_t *row, int64_t b, int e) {
    if (type == G4_KV_F32) return _mm256_loadu_ps((const float *)row + 32 * b + 8 * e);
    if (type == G4_KV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const g4_half *)row + 32 * b + 8 * e)));
    if (type == G4_KV_Q8_0) {
        const block_q8_0 *blk = (const block_q8_0 *)row + b;
        const __m128i q = _mm_loadl_epi64((const __m128i *)(blk->qs + 8 * e));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(blk->d)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
    const block_q4_0 *blk = (const block_q4_0 *)row + b; /* q4_0: elements 8e.. from nibbles */
    const __m128i raw = _mm_loadl_epi64((const __m128i *)(blk->qs + 8 * (e & 1)));
    const __m128i nib = (e < 2) ? _mm_and_si128(raw, _mm_set1_epi8(0xF))
                                : _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0xF));
    const __m128i q = _mm_sub_epi8(nib, _mm_set1_epi8(8));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(blk->d)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
}

typedef g4_attn_tile_ctx tile_ctx;

typedef float score_buf[G4_ATTN_HEAD_TILE][BLOCK + 8];

/* Scores of a tile's NT (row, head) pairs against the nv slots idx[] of a block, scaled (and
 * soft-capped): every pair against two K rows at a time (one when a single visible slot is left);
 * per (pair, slot) one accumulator over the 8-element chunks in order (8 independent chains for 4
 * pairs x 2 rows), the same sequence on both paths and whatever the tile's other pairs. */
AI void scores(const int kt, const int NT, const tile_ctx *c, const float *const *q, score_buf p,
               const int64_t *idx, int nv) {
    const g4_attn_args *a = c->a;
    const int64_t nb = c->nb;
    int j = 0;
    for (; j + 1 < nv; j += 2) {
        const uint8_t *kr0 = c->K + (size_t)idx[j] * a->k_slot_bytes + c->koff;
        const uint8_t *kr1 = c->K + (size_t)idx[j + 1] * a->k_slot_bytes + c->koff;
        __m256 acc[G4_ATTN_HEAD_TILE][2];
        for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++)
            for (int e = 0; e < 4; e++) {
                const __m256 k0 = load8(kt, kr0, b, e), k1 = load8(kt, kr1, b, e);
                for (int t = 0; t < NT; t++) {
                    const __m256 qv = _mm256_loadu_ps(q[t] + 32 * b + 8 * e);
                    acc[t][0] = _mm256_fmadd_ps(qv, k0, acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(qv, k1, acc[t][1]);
                }
            }
        for (int t = 0; t < NT; t++)
            for (int e = 0; e < 2; e++) {
                float s = hsum(acc[t][e]) * a->scale;
                if (a->softcap > 0.0f) s = a->softcap * tanhf(s / a->softcap);
                p[t][j + e] = s;
            }
    }
    if (j < nv) {
        const uint8_t *kr = c->K + (size_t)idx[j] * a->k_slot_bytes + c->koff;
        __m256 acc[G4_ATTN_HEAD_TILE];
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++)
            for (int e = 0; e < 4; e++) {
                const __m256 k0 = load8(kt, kr, b, e);
                for (int t = 0; t < NT; t++)
                    acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(q[t] + 32 * b + 8 * e), k0, acc[t]);
            }
        for (int t = 0; t < NT; t++) {
            float s = hsum(acc[t]) * a->scale;
            if (a->softcap > 0.0f) s = a->softcap * tanhf(s / a->softcap);
            p[t][j] = s;
        }
    }
}

/* The score loops as functions of their own, one per (K type, NT): inlined into the (K type,
 * V type, NT) step GCC kept the 8 accumulators on the stack (a store-forward in every FMA chain). */
#define G4_SCORES(NAME, KT, NT)                                                                 \
    static __attribute__((noinline)) void NAME(const tile_ctx *c, const float *const *q, score_buf p, \
                                               const int64_t *idx, int nv) {                    \
        scores(KT, NT, c, q, p, idx, nv);                                                       \
    }
#define G4_SCORES_NT(PFX, KT) \
    G4_SCORES(PFX##_1, KT, 1) G4_SCORES(PFX##_2, KT, 2) G4_SCORES(PFX##_3, KT, 3) G4_SCORES(PFX##_4, KT, 4)
G4_SCORES_NT(scores_f32, G4_KV_F32)
G4_SCORES_NT(scores_f16, G4_KV_F16)
G4_SCORES_NT(scores_q8_0, G4_KV_Q8_0)
G4_SCORES_NT(scores_q4_0, G4_KV_Q4_0)

AI void scores_call(const int kt, const int NT, const tile_ctx *c, const float *const *q, score_buf p,
                    const int64_t *idx, int nv) {
#define G4_SC(PFX) (NT == 1 ? PFX##_1 : NT == 2 ? PFX##_2 : NT == 3 ? PFX##_3 : PFX##_4)(c, q, p, idx, nv)
    if (kt == G4_KV_F32) G4_SC(scores_f32);
    else if (kt == G4_KV_F16) G4_SC(scores_f16);
    else if (kt == G4_KV_Q8_0) G4_SC(scores_q8_0);
    else G4_SC(scores_q4_0);
#undef G4_SC
}

/* One block step for NT (row, head) pairs that see the same slots idx[0..nv): scores, online-softmax
 * update (running max m, sum l), V accumulation into o. */
AI void block_step(const int kt, const int vt, const int NT, const tile_ctx *c, const float *const *q, float *const *o,
                   float *mst, float *lst, const int64_t *idx, int nv) {
    const g4_attn_args *a = c->a;
    const int64_t nb = c->nb;
    score_buf p __attribute__((aligned(32)));
    float alpha[G4_ATTN_HEAD_TILE];
    scores_call(kt, NT, c, q, p, idx, nv);
    /* online softmax update per pair: max in 8 lanes (exact in any order); the block's weights
     * summed in 8 lanes in slot order, then folded by hsum (a fixed order; the scalar chain of nv
     * dependent adds per pair was the longest latency chain of a block step) */
    for (int t = 0; t < NT; t++) {
        __m256 mv = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < nv; j += 8) {
            const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nv - j),
                                                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
            mv = _mm256_max_ps(mv, _mm256_blendv_ps(mv, _mm256_load_ps(&p[t][j]), live));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float mb = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        const float mo = mst[t], mn = mo > mb ? mo : mb;
        alpha[t] = mo == -INFINITY ? 0.0f : exp1(mo - mn);
        const __m256 vm = _mm256_set1_ps(mn);
        __m256 sv = _mm256_setzero_ps();
        for (int j = 0; j < nv; j += 8) {
            const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nv - j),
                                                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
            const __m256 e = exp_ps(_mm256_sub_ps(_mm256_load_ps(&p[t][j]), vm));
            _mm256_store_ps(&p[t][j], e);
            sv = _mm256_add_ps(sv, _mm256_and_ps(e, live));
        }
        lst[t] = lst[t] * alpha[t] + hsum(sv);
        mst[t] = mn;
    }
    /* V: o = o * alpha, then o += p_j v_j in slot order; two pairs per pass (8 accumulators) */
    for (int t0 = 0; t0 < NT; t0 += 2) {
        const int np = NT - t0 >= 2 ? 2 : 1;
        for (int64_t b = 0; b < nb; b++) {
            __m256 acc[2][4];
            for (int t = 0; t < np; t++) {
                const __m256 al = _mm256_set1_ps(alpha[t0 + t]);
                for (int e = 0; e < 4; e++) acc[t][e] = _mm256_mul_ps(_mm256_loadu_ps(o[t0 + t] + 32 * b + 8 * e), al);
            }
            for (int j = 0; j < nv; j++) {
                __m256 v[4];
                load32(vt, c->V + (size_t)idx[j] * a->v_slot_bytes + c->voff, b, v);
                for (int t = 0; t < np; t++) {
                    const __m256 pj = _mm256_set1_ps(p[t0 + t][j]);
                    for (int e = 0; e < 4; e++) acc[t][e] = _mm256_fmadd_ps(pj, v[e], acc[t][e]);
                }
            }
            for (int t = 0; t < np; t++)
                for (int e = 0; e < 4; e++) _mm256_storeu_ps(o[t0 + t] + 32 * b + 8 * e, acc[t][e]);
        }
    }
}

#define NT_CASES(KT, VT)                                                                 \
    switch (nt) {                                                                        \
    case 1: block_step(KT, VT, 1, c, q, o, m, l, idx, nv); break;                        \
    case 2: block_step(KT, VT, 2, c, q, o, m, l, idx, nv); break;                        \
    case 3: block_step(KT, VT, 3, c, q, o, m, l, idx, nv); break;                        \
    default: block_step(KT, VT, 4, c, q, o, m, l, idx, nv); break;                       \
    }
#define VT_CASES(KT)                                                                     \
    switch (vt) {                                                                        \
    case G4_KV_F32: NT_CASES(KT, G4_KV_F32) break;                                       \
    case G4_KV_F16: NT_CASES(KT, G4_KV_F16) break;                                       \
    case G4_KV_Q8_0: NT_CASES(KT, G4_KV_Q8_0) break;                                     \
    default: NT_CASES(KT, G4_KV_Q4_0) break;                                             \
    }

/* One block step, specialised for the K type, V type and tile size. */
static void step(int kt, int vt, int nt, const tile_ctx *c, const float *const *q, float *const *o, float *m,
                 float *l, const int64_t *idx, int nv) {
    switch (kt) {
    case G4_KV_F32: VT_CASES(G4_KV_F32) break;
    case G4_KV_F16: VT_CASES(G4_KV_F16) break;
    case G4_KV_Q8_0: VT_CASES(G4_KV_Q8_0) break;
    default: VT_CASES(G4_KV_Q4_0) break;
    }
}

static void flash_attn_avx2(const g4_attn_args *a, int64_t i0, int64_t i1, int h0, int h1) {
    g4_attn_tiles(a, i0, i1, h0, h1, BLOCK, G4_ATTN_HEAD_TILE, step);
}

const g4_attn_kernels g4_attn_avx2 = {.isa = "avx2", .flash_attn = flash_attn_avx2, .block = BLOCK};
