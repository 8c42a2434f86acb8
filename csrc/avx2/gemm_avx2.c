/* gemm_avx2.c: products W[r0:r1] . x[t] for every weight type, bit-identical to csrc/ref/gemm_ref.c.
 *
 * Quantised types: a group of blocks (4 for Q4_K/Q5_K, 8 for Q6_K and the 32-blocks) of one row is
 * unpacked once into L1 scratch (nibbles split, sub-block scales broadcast to int16 vectors), then
 * every token runs over it: per block an exact int32 vector (maddubs/madd), the group's vectors are
 * reduced together by one transpose-add (g4_avx2_hsum8x8), the per-block float ops of the reference
 * run vectorised over the group's blocks (separate mul and sub, no FMA), and the results are added
 * to the token's accumulator one block at a time, in block order, exactly like the reference. */
#include "avx2.h"


#define G4_TCH 16 /* tokens per pass over a row (the accumulators live in a local array) */

/* =============================== Q4_K / Q5_K x Q8_K ======================================= */
typedef struct {
    __m256i q[8];  /* sub-block j: 32 unsigned quants (0..15 or 0..31) */
    __m256i sc[8]; /* sub-block j: its 6-bit scale in all 16 int16 lanes */
    __m256i mins;  /* int16 [m0 m0 m1 m1 .. m7 m7], pairs with the 16 bsums */
} g4_k45_unp;

static inline void g4_k45_scales(const uint8_t *s, g4_k45_unp *u) {
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&a2, s + 8, 4);
    const uint32_t sc_lo = a0 & 0x3f3f3f3fu, m_lo = a1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (a2 & 0x0f0f0f0fu) | (((a0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((a2 >> 4) & 0x0f0f0f0fu) | (((a1 >> 6) & 0x03030303u) << 4);
    const __m128i sc8 = _mm_cvtsi64_si128((long long)(sc_lo | ((uint64_t)sc_hi << 32)));
    const __m128i m8 = _mm_cvtsi64_si128((long long)(m_lo | ((uint64_t)m_hi << 32)));
    const __m256i scb = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
    for (int j = 0; j < 8; j++)
        u->sc[j] = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
    u->mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
}

static inline void g4_q4_K_unpack(const block_q4_K *b, g4_k45_unp *u) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int g = 0; g < 4; g++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * g));
        u->q[2 * g] = _mm256_and_si256(q, m4);
        u->q[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    g4_k45_scales(b->scales, u);
}

static inline void g4_q5_K_unpack(const block_q5_K *b, g4_k45_unp *u) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
    for (int g = 0; g < 4; g++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * g));
        const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * g))), bh = _mm256_set1_epi8((char)(2 << (2 * g)));
        const __m256i hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), b4);
        const __m256i hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), b4);
        u->q[2 * g] = _mm256_or_si256(_mm256_and_si256(q, m4), hl);
        u->q[2 * g + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hh);
    }
    g4_k45_scales(b->scales, u);
}

/* S = sum_j sc_j * isum_j and M = sum_j m_j * bsum32_j, as 8 int32 lanes each */
static inline void g4_k45_dot(const g4_k45_unp *u, const block_q8_K *xb, __m256i *S, __m256i *M) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int j = 0; j < 8; j += 2) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * j));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * j + 32));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[j], x0), u->sc[j]));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[j + 1], x1), u->sc[j + 1]));
    }
    *S = _mm256_add_epi32(s0, s1);
    *M = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), u->mins);
}

/* Block-direct variant (used for a single token): S and M of one block straight from the raw
 * block, no scratch. HB(g, hi) gives the fifth bits of sub-block 2g+hi (zero for Q4_K). */
static inline __m256i g4_k45_scb(const uint8_t *s, __m256i *mins) {
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&a2, s + 8, 4);
    const uint32_t sc_lo = a0 & 0x3f3f3f3fu, m_lo = a1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (a2 & 0x0f0f0f0fu) | (((a0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((a2 >> 4) & 0x0f0f0f0fu) | (((a1 >> 6) & 0x03030303u) << 4);
    const __m128i sc8 = _mm_cvtsi64_si128((long long)(sc_lo | ((uint64_t)sc_hi << 32)));
    const __m128i m8 = _mm_cvtsi64_si128((long long)(m_lo | ((uint64_t)m_hi << 32)));
    *mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
}

static inline __m256i g4_scsel(__m256i scb, int j) {
    return _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
}

/* quants of sub-blocks 2g (lo) and 2g+1 (hi) of a Q4_K / Q5_K block */
static inline void g4_q4_K_pair(const block_q4_K *b, int g, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * g));
    *lo = _mm256_and_si256(q, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
}
static inline void g4_q5_K_pair(const block_q5_K *b, int g, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * g));
    const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * g))), bh = _mm256_set1_epi8((char)(2 << (2 * g)));
    *lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), b4));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                          _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), b4));
}

#define G4_K45_DOT1(NAME, BT, PAIR)                                                                \
    static inline void NAME(const BT *b, const block_q8_K *xb, __m256i *S, __m256i *M) {           \
        __m256i mins;                                                                              \
        const __m256i scb = g4_k45_scb(b->scales, &mins);                                          \
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();                          \
        for (int g = 0; g < 4; g++) {                                                              \
            __m256i lo, hi;                                                                        \
            PAIR(b, g, &lo, &hi);                                                                  \
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * g));             \
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * g + 32));        \
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), g4_scsel(scb, 2 * g))); \
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), g4_scsel(scb, 2 * g + 1))); \
        }                                                                                          \
        *S = _mm256_add_epi32(s0, s1);                                                             \
        *M = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), mins);              \
    }
G4_K45_DOT1(g4_q4_K_dot1, block_q4_K, g4_q4_K_pair)
G4_K45_DOT1(g4_q5_K_dot1, block_q5_K, g4_q5_K_pair)

/* One token: groups of 4 blocks, their S and M reduced together, float ops over the 4 blocks,
 * then added to the accumulator in block order. */
#define G4_K45_ONE(NAME, BT, DOT1)                                                                 \
    static float NAME(const BT *wr, const block_q8_K *xb, int64_t nb) {                           \
        float acc = 0.0f;                                                                          \
        for (int64_t bg = 0; bg < nb; bg += 4) {                                                   \
            const int nbg = (int)(nb - bg < 4 ? nb - bg : 4);                                      \
            __m256i S[4], M[4];                                                                    \
            uint16_t dh[8] = {0};                                                                  \
            float dxs[4] = {0};                                                                    \
            for (int i = 0; i < 4; i++) {                                                          \
                if (i < nbg) {                                                                     \
                    DOT1(&wr[bg + i], &xb[bg + i], &S[i], &M[i]);                                  \
                    dh[i] = wr[bg + i].d;                                                          \
                    dh[4 + i] = wr[bg + i].dmin;                                                   \
                    dxs[i] = xb[bg + i].d;                                                         \
                } else {                                                                           \
                    S[i] = M[i] = _mm256_setzero_si256();                                          \
                }                                                                                  \
            }                                                                                      \
            const __m256i R = g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], M[0], M[1], M[2], M[3]);     \
            const __m256 dwm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));              \
            const __m128 dx = _mm_loadu_ps(dxs);                                                   \
            const __m128 P = _mm_sub_ps(                                                           \
                _mm_mul_ps(_mm_mul_ps(_mm256_castps256_ps128(dwm), dx), _mm_cvtepi32_ps(_mm256_castsi256_si128(R))), \
                _mm_mul_ps(_mm_mul_ps(_mm256_extractf128_ps(dwm, 1), dx), _mm_cvtepi32_ps(_mm256_extracti128_si256(R, 1)))); \
            float p[4];                                                                            \
            _mm_storeu_ps(p, P);                                                                   \
            for (int i = 0; i < nbg; i++) acc = acc + p[i];                                        \
        }                                                                                          \
        return acc;                                                                                \
    }
G4_K45_ONE(g4_q4_K_one, block_q4_K, g4_q4_K_dot1)
G4_K45_ONE(g4_q5_K_one, block_q5_K, g4_q5_K_dot1)

/* NT tokens (2..8) vectorised across tokens: per block and sub-block pair the quants and scales
 * sit in registers while every token runs over them; per block the NT S and M vectors are
 * reduced by two transposes and the float ops run with one token per lane. */
static inline __m256i g4_hsum_nt(const __m256i *v, const int NT) {
    const __m256i z = _mm256_setzero_si256();
    return g4_avx2_hsum8x8(v[0], NT > 1 ? v[1] : z, NT > 2 ? v[2] : z, NT > 3 ? v[3] : z,
                           NT > 4 ? v[4] : z, NT > 5 ? v[5] : z, NT > 6 ? v[6] : z, NT > 7 ? v[7] : z);
}

/* [x_t[b].d for t < NT, 0 beyond] */
static inline __m256 g4_dx_nt(const block_q8_K *const *xt, int64_t b, const int NT) {
    return _mm256_setr_ps(xt[0][b].d, NT > 1 ? xt[1][b].d : 0.0f, NT > 2 ? xt[2][b].d : 0.0f,
                          NT > 3 ? xt[3][b].d : 0.0f, NT > 4 ? xt[4][b].d : 0.0f, NT > 5 ? xt[5][b].d : 0.0f,
                          NT > 6 ? xt[6][b].d : 0.0f, NT > 7 ? xt[7][b].d : 0.0f);
}
static inline __m128i g4_insert_epi16(__m128i v, uint16_t h, const int t) {
    switch (t) {
    case 0: return _mm_insert_epi16(v, h, 0);
    case 1: return _mm_insert_epi16(v, h, 1);
    case 2: return _mm_insert_epi16(v, h, 2);
    case 3: return _mm_insert_epi16(v, h, 3);
    case 4: return _mm_insert_epi16(v, h, 4);
    case 5: return _mm_insert_epi16(v, h, 5);
    case 6: return _mm_insert_epi16(v, h, 6);
    default: return _mm_insert_epi16(v, h, 7);
    }
}

#define G4_K45_TOK(NAME, BT, PAIR)                                                                 \
    static inline __attribute__((always_inline)) void NAME(                                        \
        const BT *wr, int64_t nb, const uint8_t *x, size_t xrb, float *y, int64_t ldy, int64_t r,  \
        const int NT) {                                                                            \
        const block_q8_K *xt[8];                                                                   \
        for (int t = 0; t < NT; t++) xt[t] = (const block_q8_K *)(x + (size_t)t * xrb);            \
        __m256 acc = _mm256_setzero_ps();                                                          \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const BT *wb = &wr[b];                                                                 \
            __m256i mins;                                                                          \
            const __m256i scb = g4_k45_scb(wb->scales, &mins);                                     \
            __m256i S[8];                                                                          \
            for (int t = 0; t < NT; t++) S[t] = _mm256_setzero_si256();                            \
            for (int g = 0; g < 4; g++) {                                                          \
                __m256i lo, hi;                                                                    \
                PAIR(wb, g, &lo, &hi);                                                             \
                const __m256i sl = g4_scsel(scb, 2 * g), sh = g4_scsel(scb, 2 * g + 1);            \
                for (int t = 0; t < NT; t++) {                                                     \
                    const int8_t *xq = xt[t][b].qs + 64 * g;                                       \
                    const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xq)), sl); \
                    const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 32))), sh); \
                    S[t] = _mm256_add_epi32(S[t], _mm256_add_epi32(pl, ph));                       \
                }                                                                                  \
            }                                                                                      \
            const __m256 Sf = _mm256_cvtepi32_ps(g4_hsum_nt(S, NT));                               \
            __m256i Mv[8];                                                                         \
            for (int t = 0; t < NT; t++)                                                           \
                Mv[t] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xt[t][b].bsums), mins); \
            const __m256 Mf = _mm256_cvtepi32_ps(g4_hsum_nt(Mv, NT));                              \
            const __m256 dx = g4_dx_nt(xt, b, NT);                                                 \
            const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->d)), dx);      \
            const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->dmin)), dx);   \
            acc = _mm256_add_ps(acc, _mm256_sub_ps(_mm256_mul_ps(dd, Sf), _mm256_mul_ps(dm, Mf))); \
        }                                                                                          \
        float a[8];                                                                                \
        _mm256_storeu_ps(a, acc);                                                                  \
        for (int t = 0; t < NT; t++) y[t * ldy + r] = a[t];                                        \
    }
G4_K45_TOK(g4_q4_K_tok, block_q4_K, g4_q4_K_pair)
G4_K45_TOK(g4_q5_K_tok, block_q5_K, g4_q5_K_pair)

#define G4_K45_GEMM(NAME, BT, ONE, TOK)                                                            \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,         \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                  \
        const int64_t nb = k / QK_K;                                                               \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const BT *wr = (const BT *)G4_ROWP(w, r, wrb);                                         \
            for (int64_t t0 = 0; t0 < n_tok; t0 += 8) {                                            \
                const int nt = (int)(n_tok - t0 < 8 ? n_tok - t0 : 8);                             \
                const uint8_t *xt = (const uint8_t *)x + (size_t)t0 * xrb;                         \
                float *yt = y + t0 * ldy;                                                          \
                switch (nt) {                                                                      \
                case 1: yt[r] = ONE(wr, (const block_q8_K *)xt, nb); break;                        \
                case 2: TOK(wr, nb, xt, xrb, yt, ldy, r, 2); break;                                \
                case 3: TOK(wr, nb, xt, xrb, yt, ldy, r, 3); break;                                \
                case 4: TOK(wr, nb, xt, xrb, yt, ldy, r, 4); break;                                \
                case 5: TOK(wr, nb, xt, xrb, yt, ldy, r, 5); break;                                \
                case 6: TOK(wr, nb, xt, xrb, yt, ldy, r, 6); break;                                \
                case 7: TOK(wr, nb, xt, xrb, yt, ldy, r, 7); break;                                \
                default: TOK(wr, nb, xt, xrb, yt, ldy, r, 8); break;                               \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

G4_K45_GEMM(g4_gemm_q4_K_q8_K_avx2, block_q4_K, g4_q4_K_one, g4_q4_K_tok)
G4_K45_GEMM(g4_gemm_q5_K_q8_K_avx2, block_q5_K, g4_q5_K_one, g4_q5_K_tok)

/* ===================================== Q6_K x Q8_K ========================================= */
/* S = sum_j sc_j * sum_l (q - 32) x = sum_j sc_j (sum_l q x) - 32 sum_j sc_j bsum_j (exact int32) */
static inline __m256i g4_q6_chunk(const block_q6_K *b, int i) { /* elements 32i..32i+31, q in 0..63 */
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    const int hh = i / 4, c = i % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * hh + 32 * (c % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * hh));
    const __m256i lo = _mm256_and_si256(c / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m2);
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}
static inline __m256i g4_q6_sc(__m256i sc16, int i) { /* int16 [sc_{2i} x8 | sc_{2i+1} x8] */
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(i)), pick);
}
static inline __m256i g4_q6_sc16(const block_q6_K *b) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
}
static inline __m256i g4_q6_bias(const block_q8_K *xb, __m256i sc16) {
    return _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), sc16), 5);
}

static inline __m256i g4_q6_dot1(const block_q6_K *b, const block_q8_K *xb) {
    const __m256i sc16 = g4_q6_sc16(b);
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int i = 0; i < 8; i += 2) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * i));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * i + 32));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(g4_q6_chunk(b, i), x0), g4_q6_sc(sc16, i)));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(g4_q6_chunk(b, i + 1), x1), g4_q6_sc(sc16, i + 1)));
    }
    return _mm256_sub_epi32(_mm256_add_epi32(s0, s1), g4_q6_bias(xb, sc16));
}

static float g4_q6_K_one(const block_q6_K *wr, const block_q8_K *xb, int64_t nb) {
    float acc = 0.0f;
    for (int64_t bg = 0; bg < nb; bg += 8) {
        const int nbg = (int)(nb - bg < 8 ? nb - bg : 8);
        __m256i S[8];
        uint16_t dh[8] = {0};
        float dxs[8] = {0};
        for (int i = 0; i < 8; i++) {
            if (i < nbg) {
                S[i] = g4_q6_dot1(&wr[bg + i], &xb[bg + i]);
                dh[i] = wr[bg + i].d;
                dxs[i] = xb[bg + i].d;
            } else {
                S[i] = _mm256_setzero_si256();
            }
        }
        const __m256i R = g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7]);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
        const __m256 P = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_loadu_ps(dxs)), _mm256_cvtepi32_ps(R));
        float p[8];
        _mm256_storeu_ps(p, P);
        for (int i = 0; i < nbg; i++) acc = acc + p[i];
    }
    return acc;
}

static inline __attribute__((always_inline)) void g4_q6_K_tok(const block_q6_K *wr, int64_t nb, const uint8_t *x,
                                                              size_t xrb, float *y, int64_t ldy, int64_t r, const int NT) {
    const block_q8_K *xt[8];
    for (int t = 0; t < NT; t++) xt[t] = (const block_q8_K *)(x + (size_t)t * xrb);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const block_q6_K *wb = &wr[b];
        const __m256i sc16 = g4_q6_sc16(wb);
        __m256i S[8];
        for (int t = 0; t < NT; t++) S[t] = _mm256_setzero_si256();
        for (int i = 0; i < 8; i++) {
            const __m256i q = g4_q6_chunk(wb, i), sc = g4_q6_sc(sc16, i);
            for (int t = 0; t < NT; t++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(xt[t][b].qs + 32 * i));
                S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), sc));
            }
        }
        for (int t = 0; t < NT; t++) S[t] = _mm256_sub_epi32(S[t], g4_q6_bias(&xt[t][b], sc16));
        const __m256 Sf = _mm256_cvtepi32_ps(g4_hsum_nt(S, NT));
        const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->d)), g4_dx_nt(xt, b, NT));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(dd, Sf));
    }
    float a[8];
    _mm256_storeu_ps(a, acc);
    for (int t = 0; t < NT; t++) y[t * ldy + r] = a[t];
}

G4_K45_GEMM(g4_gemm_q6_K_q8_K_avx2, block_q6_K, g4_q6_K_one, g4_q6_K_tok)

/* ============================ Q8_0 / Q5_0 / Q4_0 x Q8_0 ==================================== */
/* Weights of a block as signed int8. Q8_0: maddubs(|w|, sign(x, w)) (exact except for a pair
 * w < 0, x = -128, which a Q8_0 activation only holds when its block scale is sub-normal);
 * Q5_0/Q4_0 (|w| <= 16): maddubs(|x|, sign(w, x)), exact for every int8 x. */
static inline __m256i g4_q4_0_vals(const block_q4_0 *b) {
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs), m4 = _mm_set1_epi8(0x0f);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
}

static inline __m256i g4_q5_0_vals(const block_q5_0 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bitm = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bitm), bitm), _mm256_set1_epi8(0x10));
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs), m4 = _mm_set1_epi8(0x0f);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    return _mm256_sub_epi8(_mm256_or_si256(nib, hb), _mm256_set1_epi8(16));
}

static inline __m256i g4_q8_0_vals(const block_q8_0 *b) { return _mm256_loadu_si256((const __m256i *)b->qs); }

/* exact int32 lanes of one block product; aw = |w| (only used for SMALLW == 0) */
static inline __m256i g4_q32_dot(__m256i wv, __m256i aw, const int8_t *xq, const int SMALLW) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)xq);
    const __m256i p = SMALLW ? _mm256_maddubs_epi16(_mm256_abs_epi8(x), _mm256_sign_epi8(wv, x))
                             : _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, wv));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

#define G4_Q32_KERNELS(PFX, BT, VALS, SMALLW)                                                      \
    static float PFX##_one(const BT *wr, const block_q8_0 *xb, int64_t nb) {                       \
        float acc = 0.0f;                                                                          \
        for (int64_t bg = 0; bg < nb; bg += 8) {                                                   \
            const int nbg = (int)(nb - bg < 8 ? nb - bg : 8);                                      \
            __m256i S[8];                                                                          \
            uint16_t dh[8] = {0}, xh[8] = {0};                                                     \
            for (int i = 0; i < 8; i++) {                                                          \
                if (i < nbg) {                                                                     \
                    const __m256i wv = VALS(&wr[bg + i]);                                          \
                    S[i] = g4_q32_dot(wv, _mm256_abs_epi8(wv), xb[bg + i].qs, SMALLW);              \
                    dh[i] = wr[bg + i].d;                                                          \
                    xh[i] = xb[bg + i].d;                                                          \
                } else {                                                                           \
                    S[i] = _mm256_setzero_si256();                                                 \
                }                                                                                  \
            }                                                                                      \
            const __m256i R = g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7]);     \
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));              \
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xh));              \
            const __m256 P = _mm256_mul_ps(_mm256_cvtepi32_ps(R), _mm256_mul_ps(dw, dx));          \
            float p[8];                                                                            \
            _mm256_storeu_ps(p, P);                                                                \
            for (int i = 0; i < nbg; i++) acc = acc + p[i];                                        \
        }                                                                                          \
        return acc;                                                                                \
    }                                                                                              \
    static inline __attribute__((always_inline)) void PFX##_tok(const BT *wr, int64_t nb, const uint8_t *x, \
        size_t xrb, float *y, int64_t ldy, int64_t r, const int NT) {                              \
        const block_q8_0 *xt[8];                                                                   \
        for (int t = 0; t < NT; t++) xt[t] = (const block_q8_0 *)(x + (size_t)t * xrb);            \
        __m256 acc = _mm256_setzero_ps();                                                          \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const __m256i wv = VALS(&wr[b]), aw = _mm256_abs_epi8(wv);                             \
            __m256i S[8];                                                                          \
            __m128i xh = _mm_setzero_si128();                                                      \
            for (int t = 0; t < NT; t++) {                                                         \
                S[t] = g4_q32_dot(wv, aw, xt[t][b].qs, SMALLW);                                    \
                xh = g4_insert_epi16(xh, xt[t][b].d, t);                                          \
            }                                                                                      \
            const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wr[b].d)), _mm256_cvtph_ps(xh)); \
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(g4_hsum_nt(S, NT)), dd));     \
        }                                                                                          \
        float a[8];                                                                                \
        _mm256_storeu_ps(a, acc);                                                                  \
        for (int t = 0; t < NT; t++) y[t * ldy + r] = a[t];                                        \
    }

G4_Q32_KERNELS(g4_q8_0, block_q8_0, g4_q8_0_vals, 0)
G4_Q32_KERNELS(g4_q5_0, block_q5_0, g4_q5_0_vals, 1)
G4_Q32_KERNELS(g4_q4_0, block_q4_0, g4_q4_0_vals, 1)

/* generic driver: rows outer, tokens in chunks of 8 (ONE for a single token) */
#define G4_Q32_GEMM(NAME, BT, ONE, TOK)                                                            \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,         \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                  \
        const int64_t nb = k / 32;                                                                 \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const BT *wr = (const BT *)G4_ROWP(w, r, wrb);                                         \
            for (int64_t t0 = 0; t0 < n_tok; t0 += 8) {                                            \
                const int nt = (int)(n_tok - t0 < 8 ? n_tok - t0 : 8);                             \
                const uint8_t *xt = (const uint8_t *)x + (size_t)t0 * xrb;                         \
                float *yt = y + t0 * ldy;                                                          \
                switch (nt) {                                                                      \
                case 1: yt[r] = ONE(wr, (const block_q8_0 *)xt, nb); break;                        \
                case 2: TOK(wr, nb, xt, xrb, yt, ldy, r, 2); break;                                \
                case 3: TOK(wr, nb, xt, xrb, yt, ldy, r, 3); break;                                \
                case 4: TOK(wr, nb, xt, xrb, yt, ldy, r, 4); break;                                \
                case 5: TOK(wr, nb, xt, xrb, yt, ldy, r, 5); break;                                \
                case 6: TOK(wr, nb, xt, xrb, yt, ldy, r, 6); break;                                \
                case 7: TOK(wr, nb, xt, xrb, yt, ldy, r, 7); break;                                \
                default: TOK(wr, nb, xt, xrb, yt, ldy, r, 8); break;                               \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

G4_Q32_GEMM(g4_gemm_q8_0_q8_0_avx2, block_q8_0, g4_q8_0_one, g4_q8_0_tok)
G4_Q32_GEMM(g4_gemm_q5_0_q8_0_avx2, block_q5_0, g4_q5_0_one, g4_q5_0_tok)
G4_Q32_GEMM(g4_gemm_q4_0_q8_0_avx2, block_q4_0, g4_q4_0_one, g4_q4_0_tok)

/* ================================ F32 / F16 / BF16 x F32 =================================== */
static inline __m256 g4_ld_f32(const void *p) { return _mm256_loadu_ps((const float *)p); }
static inline __m256 g4_ld_f16(const void *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 g4_ld_bf16(const void *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

#define G4_FLOAT_GEMM(NAME, ESZ, LD)                                                               \
    static inline __attribute__((always_inline)) void NAME##_nt(                                  \
        const uint8_t *wr, const void *x, size_t xrb, float *y, int64_t ldy, int64_t t0, int NT,   \
        int64_t k, int64_t r) {                                                                    \
        __m256 lo[4], hi[4];                                                                       \
        const float *xt[4];                                                                        \
        for (int t = 0; t < NT; t++) {                                                             \
            lo[t] = _mm256_setzero_ps();                                                           \
            hi[t] = _mm256_setzero_ps();                                                           \
            xt[t] = (const float *)G4_ROWP(x, t0 + t, xrb);                                        \
        }                                                                                          \
        for (int64_t i = 0; i < k; i += 16) {                                                      \
            const __m256 w0 = LD(wr + (size_t)i * ESZ), w1 = LD(wr + (size_t)(i + 8) * ESZ);      \
            for (int t = 0; t < NT; t++) {                                                         \
                lo[t] = _mm256_add_ps(lo[t], _mm256_mul_ps(w0, _mm256_loadu_ps(xt[t] + i)));       \
                hi[t] = _mm256_add_ps(hi[t], _mm256_mul_ps(w1, _mm256_loadu_ps(xt[t] + i + 8)));   \
            }                                                                                      \
        }                                                                                          \
        for (int t = 0; t < NT; t++) y[(t0 + t) * ldy + r] = g4_avx2_fold16(lo[t], hi[t]);         \
    }                                                                                              \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,         \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                  \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const uint8_t *wr = (const uint8_t *)G4_ROWP(w, r, wrb);                               \
            int64_t t0 = 0;                                                                        \
            for (; t0 + 4 <= n_tok; t0 += 4) NAME##_nt(wr, x, xrb, y, ldy, t0, 4, k, r);           \
            for (; t0 < n_tok; t0++) NAME##_nt(wr, x, xrb, y, ldy, t0, 1, k, r);                   \
        }                                                                                          \
    }

G4_FLOAT_GEMM(g4_gemm_f32_f32_avx2, 4, g4_ld_f32)
G4_FLOAT_GEMM(g4_gemm_f16_f32_avx2, 2, g4_ld_f16)
G4_FLOAT_GEMM(g4_gemm_bf16_f32_avx2, 2, g4_ld_bf16)
