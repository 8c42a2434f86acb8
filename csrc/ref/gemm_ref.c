/* gemm_ref.c: scalar reference products W[r0:r1] . x[t] for every weight type.
 * This file *defines* the arithmetic every SIMD table must reproduce bit for bit (g4_kernels.h):
 * exact integer dot products per block, then a fixed sequence of float ops per block, no FMA.
 * GEMV is the n_tok = 1 case of the same function, so batch invariance holds by construction. */
#include <string.h>
#include "../g4_blocks.h"
#include "../g4_impl.h"

#define ROW(base, r, bytes) ((const void *)((const uint8_t *)(base) + (size_t)(r) * (bytes)))

/* ---- float weights: 16 lanes, lane l takes elements i % 16 == l, then a fixed fold ---- */
static inline float g4_fold16(float *l) {
    for (int s = 8; s >= 1; s >>= 1)
        for (int i = 0; i < s; i++) l[i] = l[i] + l[i + s];
    return l[0];
}

#define G4_FLOAT_GEMM_REF(NAME, WT, CONV)                                                          \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,         \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                  \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const WT *wr = (const WT *)ROW(w, r, wrb);                                             \
            for (int64_t t = 0; t < n_tok; t++) {                                                  \
                const float *xt = (const float *)ROW(x, t, xrb);                                   \
                float lane[16] = {0};                                                              \
                for (int64_t i = 0; i < k; i += 16)                                                \
                    for (int l = 0; l < 16; l++) {                                                 \
                        const float p = CONV(wr[i + l]) * xt[i + l];                               \
                        lane[l] = lane[l] + p;                                                     \
                    }                                                                              \
                y[t * ldy + r] = g4_fold16(lane);                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#define G4_ID(v) (v)
G4_FLOAT_GEMM_REF(g4_gemm_f32_f32_ref, float, G4_ID)
G4_FLOAT_GEMM_REF(g4_gemm_f16_f32_ref, g4_half, g4_fp16_to_fp32)
G4_FLOAT_GEMM_REF(g4_gemm_bf16_f32_ref, g4_bf16, g4_bf16_to_fp32)

/* ---- 32-blocks against Q8_0 activations: acc = acc + (float)isum * (d_w * d_x) ---- */
static inline int g4_q4_0_q(const block_q4_0 *b, int e) {
    return (e < 16 ? (b->qs[e] & 0xF) : (b->qs[e - 16] >> 4)) - 8;
}
static inline int g4_q5_0_q(const block_q5_0 *b, int e) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const int lo = e < 16 ? (b->qs[e] & 0xF) : (b->qs[e - 16] >> 4);
    return (lo | (int)(((qh >> e) & 1u) << 4)) - 16;
}
static inline int g4_q8_0_q(const block_q8_0 *b, int e) { return b->qs[e]; }

#define G4_Q32_GEMM_REF(NAME, BT, QFN)                                                             \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,         \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                  \
        const int64_t nb = k / 32;                                                                 \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const BT *wr = (const BT *)ROW(w, r, wrb);                                             \
            for (int64_t t = 0; t < n_tok; t++) {                                                  \
                const block_q8_0 *xt = (const block_q8_0 *)ROW(x, t, xrb);                         \
                float acc = 0.0f;                                                                  \
                for (int64_t b = 0; b < nb; b++) {                                                 \
                    int32_t isum = 0;                                                              \
                    for (int e = 0; e < 32; e++) isum += QFN(&wr[b], e) * xt[b].qs[e];             \
                    const float dd = g4_fp16_to_fp32(wr[b].d) * g4_fp16_to_fp32(xt[b].d);          \
                    acc = acc + (float)isum * dd;                                                  \
                }                                                                                  \
                y[t * ldy + r] = acc;                                                              \
            }                                                                                      \
        }                                                                                          \
    }

G4_Q32_GEMM_REF(g4_gemm_q4_0_q8_0_ref, block_q4_0, g4_q4_0_q)
G4_Q32_GEMM_REF(g4_gemm_q5_0_q8_0_ref, block_q5_0, g4_q5_0_q)
G4_Q32_GEMM_REF(g4_gemm_q8_0_q8_0_ref, block_q8_0, g4_q8_0_q)

/* ---- K-quants against Q8_K activations ---- */
/* Q4_K/Q5_K: S = sum_j sc_j * isum_j, M = sum_j m_j * bsum32_j (exact int32; |S| < 2^26),
 * acc = acc + ((d*d8) * (float)S - (dmin*d8) * (float)M). */
#define G4_K45_GEMM_REF(NAME, BT, HIGHBIT, WB)                                                     \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,         \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                  \
        const int64_t nb = k / QK_K;                                                               \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const BT *wr = (const BT *)ROW(w, r, wrb);                                             \
            for (int64_t t = 0; t < n_tok; t++) {                                                  \
                const block_q8_K *xt = (const block_q8_K *)ROW(x, t, xrb);                         \
                float acc = 0.0f;                                                                  \
                for (int64_t b = 0; b < nb; b++) {                                                 \
                    BT tmpb;                                                                       \
                    const BT *wb = WB;                                                             \
                    int32_t S = 0, M = 0;                                                          \
                    for (int j = 0; j < 8; j++) {                                                  \
                        uint8_t sc, m;                                                             \
                        g4_get_scale_min_k4(j, wb->scales, &sc, &m);                               \
                        const uint8_t *q = wb->qs + 32 * (j / 2);                                  \
                        const int shift = 4 * (j % 2);                                             \
                        int32_t isum = 0;                                                          \
                        for (int l = 0; l < 32; l++) {                                             \
                            const int v = ((q[l] >> shift) & 0xF) | HIGHBIT;                       \
                            isum += v * xt[b].qs[32 * j + l];                                      \
                        }                                                                          \
                        S += (int32_t)sc * isum;                                                   \
                        M += (int32_t)m * (xt[b].bsums[2 * j] + xt[b].bsums[2 * j + 1]);           \
                    }                                                                              \
                    const float dd = g4_fp16_to_fp32(wb->d) * xt[b].d;                             \
                    const float dm = g4_fp16_to_fp32(wb->dmin) * xt[b].d;                          \
                    acc = acc + (dd * (float)S - dm * (float)M);                                   \
                }                                                                                  \
                y[t * ldy + r] = acc;                                                              \
            }                                                                                      \
        }                                                                                          \
    }

/* row r's superblock b of Q4_K_R8 weights, gathered back into a block_q4_K */
static inline const block_q4_K *g4_r8_block(const void *w, size_t wrb, int64_t r, int64_t b, block_q4_K *o) {
    g4_r8_get((const block_q4_K_r8 *)ROW(w, r & ~(int64_t)7, wrb) + b, (int)(r & 7), o);
    return o;
}

G4_K45_GEMM_REF(g4_gemm_q4_K_q8_K_ref, block_q4_K, 0, ((void)tmpb, &wr[b]))
G4_K45_GEMM_REF(g4_gemm_q5_K_q8_K_ref, block_q5_K, (((wb->qh[l] >> j) & 1) << 4), ((void)tmpb, &wr[b]))
/* Q4_K_R8: the Q4_K reference on each row's gathered blocks (rows [r0, r1) multiples of 8) */
G4_K45_GEMM_REF(g4_gemm_q4_K_r8_q8_K_ref, block_q4_K, 0, ((void)wr, g4_r8_block(w, wrb, r, b, &tmpb)))

/* Q6_K: S = sum_{j<16} sc_j * sum_{16 elems} (q-32)*x  (exact, |S| < 2^28); acc = acc + (d*d8)*(float)S */
void g4_gemm_q6_K_q8_K_ref(const void *w, size_t wrb, const void *x, size_t xrb, float *y,
                           int64_t ldy, int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {
    const int64_t nb = k / QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const block_q6_K *wr = (const block_q6_K *)ROW(w, r, wrb);
        for (int64_t t = 0; t < n_tok; t++) {
            const block_q8_K *xt = (const block_q8_K *)ROW(x, t, xrb);
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t S = 0;
                for (int j = 0; j < 16; j++) {
                    int32_t isum = 0;
                    for (int l = 0; l < 16; l++) {
                        const int e = 16 * j + l;
                        const int hh = e / 128, c = (e % 128) / 32, ll = e % 32;
                        const int lo = (wr[b].ql[64 * hh + 32 * (c % 2) + ll] >> (4 * (c / 2))) & 0xF;
                        const int hi = (wr[b].qh[32 * hh + ll] >> (2 * c)) & 3;
                        isum += ((lo | (hi << 4)) - 32) * xt[b].qs[e];
                    }
                    S += (int32_t)wr[b].scales[j] * isum;
                }
                const float dd = g4_fp16_to_fp32(wr[b].d) * xt[b].d;
                acc = acc + dd * (float)S;
            }
            y[t * ldy + r] = acc;
        }
    }
}
