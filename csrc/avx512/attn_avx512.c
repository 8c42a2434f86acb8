/* attn_avx512.c: flash attention with AVX-512 F/BW/VL/DQ (+F16C). Same algorithm, block
 * boundaries and loop nest as csrc/avx2/attn_avx2.c (read its header comment); the dot product
 * is summed in two 16-lane accumulators (the two halves of each 32-block) folded at the end by
 * _mm512_reduce_add_ps, scores are computed for two K rows at a time, V is accumulated for all
 * (up to 4) heads of a tile in one pass over 64-element pieces, and exp
 * is the same Cephes polynomial in 16 lanes. */
#include <immintrin.h>
#include <math.h>

#include "../g4_attn.h"
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

/* Per-(row, head-tile) running state. */
typedef struct {
    float m[G4_ATTN_HEAD_TILE], l[G4_ATTN_HEAD_TILE];
} row_state;

typedef struct {
    const g4_attn_args *a;
    const uint8_t *K, *V;
    size_t koff, voff;
    int64_t nb;
} tile_ctx;

/* One (row, block) step for NT heads: scores, online-softmax update, V accumulation into o. */
AI void block_step(const int kt, const int vt, const int NT, const tile_ctx *c, const float *const *q, float *const *o,
                   row_state *st, const int64_t *idx, int nv) {
    const g4_attn_args *a = c->a;
    const int64_t nb = c->nb;
    float p[G4_ATTN_HEAD_TILE][G4_ATTN_BLOCK + 16] __attribute__((aligned(64)));
    float alpha[G4_ATTN_HEAD_TILE];
    /* scores: every head of the tile against two K rows at a time (one when a single visible slot
     * is left); per (head, slot) two accumulators (the two 16-halves of each 32-block) folded at
     * the end, the same sequence on both paths */
    int j = 0;
    for (; j + 1 < nv; j += 2) {
        const uint8_t *kr0 = c->K + (size_t)idx[j] * a->k_slot_bytes + c->koff;
        const uint8_t *kr1 = c->K + (size_t)idx[j + 1] * a->k_slot_bytes + c->koff;
        __m512 a0[G4_ATTN_HEAD_TILE][2], a1[G4_ATTN_HEAD_TILE][2];
        for (int t = 0; t < NT; t++) a0[t][0] = a1[t][0] = a0[t][1] = a1[t][1] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m512 k0[2], k1[2];
            load32(kt, kr0, b, k0);
            load32(kt, kr1, b, k1);
            for (int t = 0; t < NT; t++) {
                const __m512 q0 = _mm512_loadu_ps(q[t] + 32 * b), q1 = _mm512_loadu_ps(q[t] + 32 * b + 16);
                a0[t][0] = _mm512_fmadd_ps(q0, k0[0], a0[t][0]);
                a1[t][0] = _mm512_fmadd_ps(q1, k0[1], a1[t][0]);
                a0[t][1] = _mm512_fmadd_ps(q0, k1[0], a0[t][1]);
                a1[t][1] = _mm512_fmadd_ps(q1, k1[1], a1[t][1]);
            }
        }
        for (int t = 0; t < NT; t++)
            for (int e = 0; e < 2; e++) {
                float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[t][e], a1[t][e])) * a->scale;
                if (a->softcap > 0.0f) s = a->softcap * tanhf(s / a->softcap);
                p[t][j + e] = s;
            }
    }
    if (j < nv) {
        const uint8_t *kr = c->K + (size_t)idx[j] * a->k_slot_bytes + c->koff;
        __m512 a0[G4_ATTN_HEAD_TILE], a1[G4_ATTN_HEAD_TILE];
        for (int t = 0; t < NT; t++) a0[t] = a1[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m512 k[2];
            load32(kt, kr, b, k);
            for (int t = 0; t < NT; t++) {
                a0[t] = _mm512_fmadd_ps(_mm512_loadu_ps(q[t] + 32 * b), k[0], a0[t]);
                a1[t] = _mm512_fmadd_ps(_mm512_loadu_ps(q[t] + 32 * b + 16), k[1], a1[t]);
            }
        }
        for (int t = 0; t < NT; t++) {
            float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t])) * a->scale;
            if (a->softcap > 0.0f) s = a->softcap * tanhf(s / a->softcap);
            p[t][j] = s;
        }
    }
    /* online softmax update per head */
    for (int t = 0; t < NT; t++) {
        float mb = -INFINITY;
        for (int j = 0; j < nv; j++) mb = p[t][j] > mb ? p[t][j] : mb;
        const float mo = st->m[t], mn = mo > mb ? mo : mb;
        alpha[t] = mo == -INFINITY ? 0.0f : exp1(mo - mn);
        const __m512 vm = _mm512_set1_ps(mn);
        for (int j = 0; j < nv; j += 16)
            _mm512_store_ps(&p[t][j], exp_ps(_mm512_sub_ps(_mm512_load_ps(&p[t][j]), vm)));
        float sum = 0.0f;
        for (int j = 0; j < nv; j++) sum += p[t][j];
        st->l[t] = st->l[t] * alpha[t] + sum;
        st->m[t] = mn;
    }
    /* V: o = o * alpha, then o += p_j v_j in slot order; all heads of the tile in one pass, two
     * 32-blocks at a time (16 accumulators) while two are left, then one */
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        __m512 acc[G4_ATTN_HEAD_TILE][4];
        for (int t = 0; t < NT; t++) {
            const __m512 al = _mm512_set1_ps(alpha[t]);
            for (int e = 0; e < 4; e++) acc[t][e] = _mm512_mul_ps(_mm512_loadu_ps(o[t] + 32 * b + 16 * e), al);
        }
        for (int j = 0; j < nv; j++) {
            const uint8_t *vr = c->V + (size_t)idx[j] * a->v_slot_bytes + c->voff;
            __m512 v[4];
            load32(vt, vr, b, v);
            load32(vt, vr, b + 1, v + 2);
            for (int t = 0; t < NT; t++) {
                const __m512 pj = _mm512_set1_ps(p[t][j]);
                for (int e = 0; e < 4; e++) acc[t][e] = _mm512_fmadd_ps(pj, v[e], acc[t][e]);
            }
        }
        for (int t = 0; t < NT; t++)
            for (int e = 0; e < 4; e++) _mm512_storeu_ps(o[t] + 32 * b + 16 * e, acc[t][e]);
    }
    if (b < nb) {
        __m512 acc[G4_ATTN_HEAD_TILE][2];
        for (int t = 0; t < NT; t++) {
            const __m512 al = _mm512_set1_ps(alpha[t]);
            acc[t][0] = _mm512_mul_ps(_mm512_loadu_ps(o[t] + 32 * b), al);
            acc[t][1] = _mm512_mul_ps(_mm512_loadu_ps(o[t] + 32 * b + 16), al);
        }
        for (int j = 0; j < nv; j++) {
            __m512 v[2];
            load32(vt, c->V + (size_t)idx[j] * a->v_slot_bytes + c->voff, b, v);
            for (int t = 0; t < NT; t++) {
                const __m512 pj = _mm512_set1_ps(p[t][j]);
                acc[t][0] = _mm512_fmadd_ps(pj, v[0], acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(pj, v[1], acc[t][1]);
            }
        }
        for (int t = 0; t < NT; t++) {
            _mm512_storeu_ps(o[t] + 32 * b, acc[t][0]);
            _mm512_storeu_ps(o[t] + 32 * b + 16, acc[t][1]);
        }
    }
}

#define NT_CASES(KT, VT)                                                                 \
    switch (nt) {                                                                        \
    case 1: block_step(KT, VT, 1, c, q, o, st, idx, nv); break;                          \
    case 2: block_step(KT, VT, 2, c, q, o, st, idx, nv); break;                          \
    case 3: block_step(KT, VT, 3, c, q, o, st, idx, nv); break;                          \
    default: block_step(KT, VT, 4, c, q, o, st, idx, nv); break;                         \
    }
#define VT_CASES(KT)                                                                     \
    switch (vt) {                                                                        \
    case G4_KV_F32: NT_CASES(KT, G4_KV_F32) break;                                       \
    case G4_KV_F16: NT_CASES(KT, G4_KV_F16) break;                                       \
    case G4_KV_Q8_0: NT_CASES(KT, G4_KV_Q8_0) break;                                     \
    default: NT_CASES(KT, G4_KV_Q4_0) break;                                             \
    }

/* One (row, block) step, specialised for the K type, V type and head-tile size. */
static void step(int kt, int vt, int nt, const tile_ctx *c, const float *const *q, float *const *o,
                 row_state *st, const int64_t *idx, int nv) {
    switch (kt) {
    case G4_KV_F32: VT_CASES(G4_KV_F32) break;
    case G4_KV_F16: VT_CASES(G4_KV_F16) break;
    case G4_KV_Q8_0: VT_CASES(G4_KV_Q8_0) break;
    default: VT_CASES(G4_KV_Q4_0) break;
    }
}

static void flash_attn_avx512(const g4_attn_args *a, int64_t i0, int64_t i1, int h0, int h1) {
    const int hd = a->hd, G = a->n_head / a->n_head_kv;
    const size_t hbk = g4_kv_head_bytes(a->k_type, hd), hbv = g4_kv_head_bytes(a->v_type, hd);
    for (int64_t r0 = i0; r0 < i1; r0 += G4_ATTN_ROW_TILE) {
        const int nr = (int)(i1 - r0 < G4_ATTN_ROW_TILE ? i1 - r0 : G4_ATTN_ROW_TILE);
        for (int g = h0 / G; g * G < h1; g++) {
            const int hs = g * G > h0 ? g * G : h0, he = (g + 1) * G < h1 ? (g + 1) * G : h1;
            const tile_ctx c = {a, (const uint8_t *)a->k, (const uint8_t *)a->v, (size_t)g * hbk, (size_t)g * hbv,
                               hd / 32};
            for (int t0 = hs; t0 < he; t0 += G4_ATTN_HEAD_TILE) {
                const int nt = he - t0 < G4_ATTN_HEAD_TILE ? he - t0 : G4_ATTN_HEAD_TILE;
                row_state st[G4_ATTN_ROW_TILE];
                const float *q[G4_ATTN_ROW_TILE][G4_ATTN_HEAD_TILE];
                float *o[G4_ATTN_ROW_TILE][G4_ATTN_HEAD_TILE];
                for (int r = 0; r < nr; r++)
                    for (int t = 0; t < nt; t++) {
                        st[r].m[t] = -INFINITY;
                        st[r].l[t] = 0.0f;
                        q[r][t] = a->q + (r0 + r) * a->q_stride + (int64_t)(t0 + t) * hd;
                        o[r][t] = a->out + (r0 + r) * a->out_stride + (int64_t)(t0 + t) * hd;
                        memset(o[r][t], 0, (size_t)hd * sizeof(float));
                    }
                for (int64_t s0 = 0; s0 < a->n_slots; s0 += G4_ATTN_BLOCK) {
                    const int64_t s1 = s0 + G4_ATTN_BLOCK < a->n_slots ? s0 + G4_ATTN_BLOCK : a->n_slots;
                    for (int r = 0; r < nr; r++) {
                        const int32_t qp = a->q_pos[r0 + r];
                        int64_t idx[G4_ATTN_BLOCK];
                        int nv = 0;
                        for (int64_t s = s0; s < s1; s++) {
                            const int32_t kp = a->kv_pos[s];
                            if (kp >= 0 && kp <= qp && (a->window == 0 || (int64_t)qp - kp < (int64_t)a->window))
                                idx[nv++] = s;
                        }
                        if (nv) step(a->k_type, a->v_type, nt, &c, q[r], o[r], &st[r], idx, nv);
                    }
                }
                for (int r = 0; r < nr; r++)
                    for (int t = 0; t < nt; t++) {
                        if (!(st[r].l[t] > 0.0f)) continue;
                        const __m512 l = _mm512_set1_ps(st[r].l[t]);
                        for (int d = 0; d < hd; d += 16)
                            _mm512_storeu_ps(o[r][t] + d, _mm512_div_ps(_mm512_loadu_ps(o[r][t] + d), l));
                    }
            }
        }
    }
}

const g4_attn_kernels g4_attn_avx512 = {.isa = "avx512", .flash_attn = flash_attn_avx512};
