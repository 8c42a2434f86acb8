/* attn_avx512.c: flash attention with AVX-512 F/BW/VL/DQ (+F16C). Same algorithm and block
 * boundaries as csrc/avx2/attn_avx2.c (read its header comment); the dot product is summed in two
 * 16-lane accumulators (the two halves of each 32-block) folded at the end by _mm512_reduce_add_ps;
 * a tile is up to 8 (row, head) pairs of one kv head, taken across the rows of a verify batch or
 * prefill tile that see the same slots, so each K/V row is converted once for all of them; K/V rows
 * are prefetched (they lie a slot apart); the block max and weight sum run in 16 lanes; exp is the
 * same Cephes polynomial in 16 lanes. The score loops are functions of their own per (K type, tile
 * size), as in attn_avx2.c (inlined, the accumulators went to the stack): bench/bench_attn.py on a
 * Zen 5 EPYC, 1 thread, alternated processes, same output bits: prefill 0.70-0.76x the time,
 * 4 verify rows after 4096 positions 0.59-0.60x, one decode row 0.66-0.70x (f16 / q8_0 cache). */
#include <immintrin.h>
#include <math.h>

#include "../g4_attn_tiles.h"
#include "../g4_blocks.h"

#define AI static inline __attribute__((always_inline))

/* Cephes expf, as exp_ps in attn_avx2.c (same constants and operation order, 16 lanes). */
AI __m512 exp_ps(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
    x = _mm512_max_ps(x, lo);
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    const __m512 z = _mm512_mul_ps(x, x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, z, x);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    const __m512i n = _mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127));
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(n, 23)));
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

AI float exp1(float x) { return _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(x))); }

/* 32 values of block b of a head row, exact (d * q fits in float32). */
AI void load32(const int type, const uint8_t *row, int64_t b, __m512 v[2]) {
    if (type == G4_KV_F32) {
        const float *p = (const float *)row + 32 * b;
        v[0] = _mm512_loadu_ps(p);
        v[1] = _mm512_loadu_ps(p + 16);
    } else if (type == G4_KV_F16) {
        const g4_half *p = (const g4_half *)row + 32 * b;
        v[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        v[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16)));
    } else if (type == G4_KV_Q8_0) {
        const block_q8_0 *blk = (const block_q8_0 *)row + b;
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(blk->d));
        v[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)blk->qs))));
        v[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk->qs + 16)))));
    } else { /* q4_0: low nibbles = elements 0..15, high nibbles = 16..31 */
        const block_q4_0 *blk = (const block_q4_0 *)row + b;
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(blk->d));
        const __m128i raw = _mm_loadu_si128((const __m128i *)blk->qs);
        const __m128i m4 = _mm_set1_epi8(0xF), e8 = _mm_set1_epi8(8);
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), e8);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), e8);
        v[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)));
        v[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)));
    }
}

/* Cache rows are [slot][kv head][hd], so one head's rows lie a whole slot apart (8 KiB for 16 f16
 * heads of 256): every row is in another 4 KiB page, where the hardware prefetchers stop, and the
 * score loop waited on each row. K rows are fetched G4X_APF slots ahead into L1 and each V row into
 * L2 while its scores are computed (the V pass reads it next). */
#ifndef G4X_APF
#define G4X_APF 4
#endif
AI void attn_prefetch(const uint8_t *p, size_t n, const int hint) {
    for (size_t o = 0; o < n; o += 64) {
        if (hint == _MM_HINT_T0) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
        else _mm_prefetch((const char *)p + o, _MM_HINT_T1);
    }
}

/* A tile is up to QT query vectors, (row, head) pairs of one kv head whose rows see the same slots
 * of the block (in a verify batch or a prefill tile that is every block but the causal diagonal):
 * each K and V row is loaded and converted once for all of them, and the accumulators stay in
 * registers (QT = 8: 16 score accumulators, then 16 V accumulators over 32 dims). Per pair the
 * float operations and their order are those of a lone pair, so grouping never changes a bit. */
#define QT 8

/* lanes of a 16-slot piece that hold slots of the block (n = slots left from this piece on) */
AI __mmask16 slot_mask(int n) { return (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1); }

typedef g4_attn_tile_ctx tile_ctx;

typedef float score_buf[QT][G4_ATTN_BLOCK + 16];

/* scores of NQ pairs against the nv slots idx[] of a block, scaled (and soft-capped): per (pair,
 * slot) two accumulators (the two 16-halves of each 32-block) folded at the end */
AI void scores(const int kt, const int NQ, const tile_ctx *c, const float *const *q, score_buf p, const int64_t *idx,
               int nv) {
    const g4_attn_args *a = c->a;
    const int64_t nb = c->nb;
    for (int j = 0; j < nv; j++) {
        const uint8_t *kr = c->K + (size_t)idx[j] * a->k_slot_bytes + c->koff;
        if (j + G4X_APF < nv) attn_prefetch(c->K + (size_t)idx[j + G4X_APF] * a->k_slot_bytes + c->koff, c->hbk, _MM_HINT_T0);
        attn_prefetch(c->V + (size_t)idx[j] * a->v_slot_bytes + c->voff, c->hbv, _MM_HINT_T1);
        __m512 a0[QT], a1[QT];
#pragma GCC unroll 8
        for (int t = 0; t < NQ; t++) a0[t] = a1[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m512 k[2];
            load32(kt, kr, b, k);
#pragma GCC unroll 8
            for (int t = 0; t < NQ; t++) {
                a0[t] = _mm512_fmadd_ps(_mm512_loadu_ps(q[t] + 32 * b), k[0], a0[t]);
                a1[t] = _mm512_fmadd_ps(_mm512_loadu_ps(q[t] + 32 * b + 16), k[1], a1[t]);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < NQ; t++) {
            float sc = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t])) * a->scale;
            if (a->softcap > 0.0f) sc = a->softcap * tanhf(sc / a->softcap);
            p[t][j] = sc;
        }
    }
}

/* The score loops as functions of their own, one per (K type, NQ), as in attn_avx2.c: inlined into
 * the (K type, V type, NQ) step, GCC may keep accumulators on the stack. */
#define G4_SCORES(NAME, KT, NQ)                                                                     \
    static __attribute__((noinline)) void NAME(const tile_ctx *c, const float *const *q, score_buf p, \
                                               const int64_t *idx, int nv) {                        \
        scores(KT, NQ, c, q, p, idx, nv);                                                           \
    }
#define G4_SCORES_NQ(PFX, KT)                                                                       \
    G4_SCORES(PFX##_1, KT, 1) G4_SCORES(PFX##_2, KT, 2) G4_SCORES(PFX##_3, KT, 3)                   \
    G4_SCORES(PFX##_4, KT, 4) G4_SCORES(PFX##_5, KT, 5) G4_SCORES(PFX##_6, KT, 6)                   \
    G4_SCORES(PFX##_7, KT, 7) G4_SCORES(PFX##_8, KT, 8)
G4_SCORES_NQ(scores_f32, G4_KV_F32)
G4_SCORES_NQ(scores_f16, G4_KV_F16)
G4_SCORES_NQ(scores_q8_0, G4_KV_Q8_0)
G4_SCORES_NQ(scores_q4_0, G4_KV_Q4_0)

AI void scores_call(const int kt, const int NQ, const tile_ctx *c, const float *const *q, score_buf p,
                    const int64_t *idx, int nv) {
#define G4_SC(PFX)                                                                                  \
    (NQ == 1 ? PFX##_1 : NQ == 2 ? PFX##_2 : NQ == 3 ? PFX##_3 : NQ == 4 ? PFX##_4 :                 \
     NQ == 5 ? PFX##_5 : NQ == 6 ? PFX##_6 : NQ == 7 ? PFX##_7 : PFX##_8)(c, q, p, idx, nv)
    if (kt == G4_KV_F32) G4_SC(scores_f32);
    else if (kt == G4_KV_F16) G4_SC(scores_f16);
    else if (kt == G4_KV_Q8_0) G4_SC(scores_q8_0);
    else G4_SC(scores_q4_0);
#undef G4_SC
}

/* One block step for NQ pairs: scores, online-softmax update, V accumulation into o. */
AI void block_step(const int kt, const int vt, const int NQ, const tile_ctx *c, const float *const *q, float *const *o,
                   float *mst, float *lst, const int64_t *idx, int nv) {
    const g4_attn_args *a = c->a;
    const int64_t nb = c->nb;
    score_buf p __attribute__((aligned(64)));
    float alpha[QT];
    scores_call(kt, NQ, c, q, p, idx, nv);
    /* online softmax update per pair */
    for (int t = 0; t < NQ; t++) {
        /* max in 16 lanes (exact in any order); the sum of the block's weights in 16 lanes, folded
         * by _mm512_reduce_add_ps (a fixed order: the scalar chain of 64 dependent adds cost as
         * much as the scores of a lone pair) */
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < nv; j += 16)
            mv = _mm512_mask_max_ps(mv, slot_mask(nv - j), mv, _mm512_load_ps(&p[t][j]));
        const float mb = _mm512_reduce_max_ps(mv);
        const float mo = mst[t], mn = mo > mb ? mo : mb;
        alpha[t] = mo == -INFINITY ? 0.0f : exp1(mo - mn);
        const __m512 vm = _mm512_set1_ps(mn);
        __m512 sv = _mm512_setzero_ps();
        for (int j = 0; j < nv; j += 16) {
            const __m512 e = exp_ps(_mm512_sub_ps(_mm512_load_ps(&p[t][j]), vm));
            _mm512_store_ps(&p[t][j], e);
            sv = _mm512_mask_add_ps(sv, slot_mask(nv - j), sv, e);
        }
        const float sum = _mm512_reduce_add_ps(sv);
        lst[t] = lst[t] * alpha[t] + sum;
        mst[t] = mn;
    }
    /* V: o = o * alpha, then o += p_j v_j in slot order; all pairs in one pass over VB 16-lane
     * pieces (64 dims for up to 4 pairs, 32 for more) */
    const int VB = NQ <= 4 ? 4 : 2;
    for (int64_t b = 0; b < nb; b += VB / 2) {
        const int vb = (VB == 4 && b + 1 >= nb) ? 2 : VB; /* a last single 32-block */
        __m512 acc[QT][4];
#pragma GCC unroll 8
        for (int t = 0; t < NQ; t++) {
            const __m512 al = _mm512_set1_ps(alpha[t]);
            acc[t][0] = _mm512_mul_ps(_mm512_loadu_ps(o[t] + 32 * b), al);
            acc[t][1] = _mm512_mul_ps(_mm512_loadu_ps(o[t] + 32 * b + 16), al);
            if (vb == 4) {
                acc[t][2] = _mm512_mul_ps(_mm512_loadu_ps(o[t] + 32 * b + 32), al);
                acc[t][3] = _mm512_mul_ps(_mm512_loadu_ps(o[t] + 32 * b + 48), al);
            }
        }
        for (int j = 0; j < nv; j++) {
            const uint8_t *vr = c->V + (size_t)idx[j] * a->v_slot_bytes + c->voff;
            __m512 v[4];
            load32(vt, vr, b, v);
            if (vb == 4) load32(vt, vr, b + 1, v + 2);
#pragma GCC unroll 8
            for (int t = 0; t < NQ; t++) {
                const __m512 pj = _mm512_set1_ps(p[t][j]);
                acc[t][0] = _mm512_fmadd_ps(pj, v[0], acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(pj, v[1], acc[t][1]);
                if (vb == 4) {
                    acc[t][2] = _mm512_fmadd_ps(pj, v[2], acc[t][2]);
                    acc[t][3] = _mm512_fmadd_ps(pj, v[3], acc[t][3]);
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < NQ; t++)
            for (int e = 0; e < vb; e++) _mm512_storeu_ps(o[t] + 32 * b + 16 * e, acc[t][e]);
    }
}

#define NQ_CASES(KT, VT)                                                                 \
    switch (nq) {                                                                        \
    case 1: block_step(KT, VT, 1, c, q, o, m, l, idx, nv); break;                        \
    case 2: block_step(KT, VT, 2, c, q, o, m, l, idx, nv); break;                        \
    case 3: block_step(KT, VT, 3, c, q, o, m, l, idx, nv); break;                        \
    case 4: block_step(KT, VT, 4, c, q, o, m, l, idx, nv); break;                        \
    case 5: block_step(KT, VT, 5, c, q, o, m, l, idx, nv); break;                        \
    case 6: block_step(KT, VT, 6, c, q, o, m, l, idx, nv); break;                        \
    case 7: block_step(KT, VT, 7, c, q, o, m, l, idx, nv); break;                        \
    default: block_step(KT, VT, 8, c, q, o, m, l, idx, nv); break;                       \
    }
#define VT_CASES(KT)                                                                     \
    switch (vt) {                                                                        \
    case G4_KV_F32: NQ_CASES(KT, G4_KV_F32) break;                                       \
    case G4_KV_F16: NQ_CASES(KT, G4_KV_F16) break;                                       \
    case G4_KV_Q8_0: NQ_CASES(KT, G4_KV_Q8_0) break;                                     \
    default: NQ_CASES(KT, G4_KV_Q4_0) break;                                             \
    }

/* One block step, specialised for the K type, V type and tile size. */
static void step(int kt, int vt, int nq, const tile_ctx *c, const float *const *q, float *const *o, float *m,
                 float *l, const int64_t *idx, int nv) {
    switch (kt) {
    case G4_KV_F32: VT_CASES(G4_KV_F32) break;
    case G4_KV_F16: VT_CASES(G4_KV_F16) break;
    case G4_KV_Q8_0: VT_CASES(G4_KV_Q8_0) break;
    default: VT_CASES(G4_KV_Q4_0) break;
    }
}

static void flash_attn_avx512(const g4_attn_args *a, int64_t i0, int64_t i1, int h0, int h1) {
    g4_attn_tiles(a, i0, i1, h0, h1, G4_ATTN_BLOCK, QT, step);
}

const g4_attn_kernels g4_attn_avx512 = {.isa = "avx512", .flash_attn = flash_attn_avx512, .block = G4_ATTN_BLOCK};
