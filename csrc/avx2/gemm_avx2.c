/* gemm_avx2.c: products W[r0:r1] . x[t] for every weight type, bit-identical to csrc/ref/gemm_ref.c.
 *
 * Every (row, token) result follows the reference sequence exactly: per block an exact integer dot
 * product (sub-block scales and mins folded in as integers), then the block's float ops (separate
 * mul and sub/add, never FMA), added to the token's accumulator in block order. What the SIMD code
 * changes is only how the exact integers are formed and how the work is shared:
 *   - one token, 8 rows at once ("ROWS8"): per block the 8 rows' int32 vectors are reduced by
 *     one transpose-add (g4_avx2_hsum8x8) and the float ops run with one row per lane, so no
 *     scalar step is left per block (decode is compute-bound on cores with 128-bit SIMD units
 *     such as Zen 1: that step was 15-25 % of the time); the next 8-row group is prefetched
 *     slice by slice (g4_r8_prefetch);
 *   - one token, one row ("ONE": the rows left over): per block an int32 vector; the vectors of
 *     a group of blocks (4 for Q4_K/Q5_K:
 *     S and M together, 8 for Q6_K and the 32-blocks) are reduced by one transpose-add, then the
 *     float ops of the group run as vector ops and their results are added in block order;
 *   - 2..8 tokens ("TOK"): each weight block is read and unpacked once (per sub-block pair the
 *     quants and scales stay in registers while every token runs over them); per block the token
 *     vectors are reduced by one transpose-add and the float ops run with one token per lane,
 *     acc = acc + P being the same per-lane sequence as the scalar loop. Q4_K/Q5_K take M (mins x
 *     bsums) for 8 tokens at once from a per-call table, and the activation scales d come from a
 *     per-call table too (both built once per call and shared by every row);
 *   - 2..4 tokens of the 32-blocks ("TOKB"): blocks x tokens share one transpose;
 *   - token lanes from the start ("TOKX": 5..8-token chunks of Q4_0 / Q5_0; "TOKX2": 13..16-token
 *     tiles of Q4_0 / Q5_0 / Q8_0 / Q4_K / Q6_K, both chunks per pass): the activations of each
 *     8-token chunk are re-laid once per call (dword j of every token side by side, g4_build_x4 /
 *     g4_build_x4k), each dword of a row's codes is broadcast by an in-lane shuffle and one maddubs
 *     gives 8 tokens' pair sums; int16 partial sums stay exact (bounds at each kernel), so no
 *     transpose per block (measured on Zen 3: 0.57-0.86x the time of TOK at 16 tokens).
 * More than 8 tokens run as chunks of 8 per row (the row stays in L1/L2 between chunks); more than
 * 16 tokens as tiles of 16. The per-call tables cover a range of blocks at a time (G4_CAPB,
 * G4_CAPB32, G4_CAPX, G4_CAPXK); a longer row continues its accumulators through y, which holds
 * the same float. */
#include "avx2.h"

/* Pins an accumulator to a register at this point: without it GCC re-associates the fully
 * unrolled integer sums into a tree and spills every partial product to the stack. */
#define G4_KEEP(v) __asm__("" : "+x"(v))

/* 8 halves as one vector, packed in general registers first (they are idle in these loops; eight
 * vector inserts cost ~16 vector ops on Zen 3) */
static inline __m128i g4_h16x8(uint16_t h0, uint16_t h1, uint16_t h2, uint16_t h3, uint16_t h4, uint16_t h5,
                               uint16_t h6, uint16_t h7) {
    const uint64_t lo = (uint64_t)h0 | (uint64_t)h1 << 16 | (uint64_t)h2 << 32 | (uint64_t)h3 << 48;
    const uint64_t hi = (uint64_t)h4 | (uint64_t)h5 << 16 | (uint64_t)h6 << 32 | (uint64_t)h7 << 48;
    return _mm_insert_epi64(_mm_cvtsi64_si128((long long)lo), (long long)hi, 1);
}
/* Shared by the one-token paths: 8 fp16 scales stride bytes apart (0 past n) as one float
 * vector (8 blocks of a row, or the same block of 8 rows), and the in-order scalar adds of a
 * group's per-block float results p[0..n-1] to an accumulator (the reference's sequence). */
static inline __m256 g4_h8(const uint8_t *p, size_t stride, int n) {
    uint16_t h[8];
    if (n == 8) {
        for (int i = 0; i < 8; i++) memcpy(&h[i], p + i * stride, 2);
        return _mm256_cvtph_ps(g4_h16x8(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]));
    }
    for (int i = 0; i < 8; i++) {
        h[i] = 0;
        if (i < n) memcpy(&h[i], p + i * stride, 2);
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}
static inline float g4_add8(__m256 p, int n, float acc) {
    const __m128 lo = _mm256_castps256_ps128(p), hi = _mm256_extractf128_ps(p, 1);
    __m128 a = _mm_add_ss(_mm_set_ss(acc), lo);
    if (n > 1) a = _mm_add_ss(a, _mm_movehdup_ps(lo));
    if (n > 2) a = _mm_add_ss(a, _mm_movehl_ps(lo, lo));
    if (n > 3) a = _mm_add_ss(a, _mm_shuffle_ps(lo, lo, 3));
    if (n > 4) a = _mm_add_ss(a, hi);
    if (n > 5) a = _mm_add_ss(a, _mm_movehdup_ps(hi));
    if (n > 6) a = _mm_add_ss(a, _mm_movehl_ps(hi, hi));
    if (n > 7) a = _mm_add_ss(a, _mm_shuffle_ps(hi, hi, 3));
    return _mm_cvtss_f32(a);
}

/* =============================== Q4_K / Q5_K x Q8_K ======================================= */
/* The 8 scales of a Q4_K/Q5_K block as int16, broadcast to both lanes (returned); the 8 mins as
 * int16 pairs [m0 m0 m1 m1 .. m7 m7] (to madd with the 16 bsums) and as [m0 .. m7] (m16). */
static inline __m256i g4_k45_scb(const uint8_t *s, __m256i *mins, __m128i *m16) {
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
    *m16 = _mm_cvtepu8_epi16(m8);
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
/* bit j of every qh byte moved to 0x10 (16-bit shifts: the mask drops what crosses bytes) */
static inline __m256i g4_q5_hbit(__m256i qh, const int j) {
    const __m256i b4 = _mm256_set1_epi8(0x10);
    switch (j) {
    case 0: return _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4);
    case 1: return _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4);
    case 2: return _mm256_and_si256(_mm256_slli_epi16(qh, 2), b4);
    case 3: return _mm256_and_si256(_mm256_slli_epi16(qh, 1), b4);
    case 4: return _mm256_and_si256(qh, b4);
    case 5: return _mm256_and_si256(_mm256_srli_epi16(qh, 1), b4);
    case 6: return _mm256_and_si256(_mm256_srli_epi16(qh, 2), b4);
    default: return _mm256_and_si256(_mm256_srli_epi16(qh, 3), b4);
    }
}
static inline void g4_q5_K_pair(const block_q5_K *b, int g, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * g));
    *lo = _mm256_or_si256(_mm256_and_si256(q, m4), g4_q5_hbit(qh, 2 * g));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), g4_q5_hbit(qh, 2 * g + 1));
}

#define G4_K45_DOT1(NAME, BT, PAIR)                                                                \
    static inline void NAME(const BT *b, const block_q8_K *xb, __m256i *S, __m256i *M) {           \
        __m256i mins;                                                                              \
        __m128i m16;                                                                               \
        const __m256i scb = g4_k45_scb(b->scales, &mins, &m16);                                    \
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

/* One token: groups of 4 blocks, their S and M reduced together by one transpose into the lane
 * order [S0 M0 S1 M1 S2 M2 S3 M3]; the float ops of the 4 blocks then run as vector ops on that
 * order (d, dmin of block i are its first 4 bytes, converted together: [d0 dmin0 d1 dmin1 ..]),
 * each lane the reference's exact op: dd = d * dx, dm = dmin * dx, P = dd * S - dm * M; the
 * 4 P are then added to the accumulator one at a time in block order. */
static inline __m128i g4_k45_dpair(const void *b) {
    uint32_t v;
    memcpy(&v, b, 4);
    return _mm_cvtsi32_si128((int)v);
}
static inline float g4_k45_epi4(__m256i sm, const void *b0, size_t bstride, const block_q8_K *xb, int nbg,
                                float acc) {
    const uint8_t *b = (const uint8_t *)b0;
    __m128i h = g4_k45_dpair(b);
    float dx1 = 0.0f, dx2 = 0.0f, dx3 = 0.0f;
    if (nbg > 1) h = _mm_insert_epi32(h, (int)_mm_cvtsi128_si32(g4_k45_dpair(b + bstride)), 1), dx1 = xb[1].d;
    if (nbg > 2) h = _mm_insert_epi32(h, (int)_mm_cvtsi128_si32(g4_k45_dpair(b + 2 * bstride)), 2), dx2 = xb[2].d;
    if (nbg > 3) h = _mm_insert_epi32(h, (int)_mm_cvtsi128_si32(g4_k45_dpair(b + 3 * bstride)), 3), dx3 = xb[3].d;
    const float dx0 = xb[0].d;
    const __m256 dx = _mm256_setr_ps(dx0, dx0, dx1, dx1, dx2, dx2, dx3, dx3);
    const __m256 p = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), dx), _mm256_cvtepi32_ps(sm));
    const __m256 dp = _mm256_sub_ps(p, _mm256_movehdup_ps(p)); /* lane 2i: dd_i S_i - dm_i M_i */
    const __m128 lo = _mm256_castps256_ps128(dp), hi = _mm256_extractf128_ps(dp, 1);
    __m128 a = _mm_set_ss(acc);
    a = _mm_add_ss(a, lo);
    if (nbg > 1) a = _mm_add_ss(a, _mm_movehl_ps(lo, lo));
    if (nbg > 2) a = _mm_add_ss(a, hi);
    if (nbg > 3) a = _mm_add_ss(a, _mm_movehl_ps(hi, hi));
    return _mm_cvtss_f32(a);
}
#define G4_K45_ONE(NAME, BT, DOT1)                                                                 \
    static float NAME(const BT *wr, const block_q8_K *xb, int64_t nb, float acc) {                \
        for (int64_t bg = 0; bg < nb; bg += 4) {                                                   \
            const int nbg = (int)(nb - bg < 4 ? nb - bg : 4);                                      \
            __m256i S[4], M[4];                                                                    \
            for (int i = 0; i < 4; i++) {                                                          \
                if (i < nbg) DOT1(&wr[bg + i], &xb[bg + i], &S[i], &M[i]);                         \
                else S[i] = M[i] = _mm256_setzero_si256();                                         \
            }                                                                                      \
            const __m256i sm = g4_avx2_hsum8x8(S[0], M[0], S[1], M[1], S[2], M[2], S[3], M[3]);    \
            acc = g4_k45_epi4(sm, &wr[bg], sizeof(BT), &xb[bg], nbg, acc);                         \
        }                                                                                          \
        return acc;                                                                                \
    }
G4_K45_ONE(g4_q4_K_one, block_q4_K, g4_q4_K_dot1)
G4_K45_ONE(g4_q5_K_one, block_q5_K, g4_q5_K_dot1)

/* The 8-row passes read 8 interleaved streams, which the hardware prefetchers do not follow over
 * short rows (k = 640: 8 x 680 bytes; measured 18 % slower than one row at a time from memory on
 * Zen 1). The 8 rows of a group are one contiguous region and so are the next group's: step b of
 * nb prefetches the b-th slice of the next region, so it is in cache when its pass starts. */
static inline void g4_r8_prefetch(const uint8_t *next, int64_t b, size_t step) {
    const uint8_t *p = next + (size_t)b * step;
    for (size_t o = 0; o < step; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}
/* One token, 8 rows at once (lane = row), as the 32-blocks' rows8: per block the 8 rows' S and M
 * are reduced by two transposes and the float ops run with one row per lane in the reference's
 * per-row sequence (dd = d * dx, dm = dmin * dx, acc = acc + (dd * S - dm * M)), no scalar step
 * per block; d and dmin (each block's first 4 bytes) of the 8 rows are converted together. */
#define G4_K45_ROWS8(NAME, BT, DOT1)                                                               \
    static void NAME(const uint8_t *w, size_t wrb, const block_q8_K *xb, int64_t nb, float *yr,    \
                     const uint8_t *next) {                                                        \
        const BT *wr[8];                                                                           \
        for (int i = 0; i < 8; i++) wr[i] = (const BT *)(w + (size_t)i * wrb);                     \
        __m256 acc = _mm256_setzero_ps();                                                          \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            if (next) g4_r8_prefetch(next, b, 8 * sizeof(BT));                                     \
            __m256i S[8], M[8];                                                                    \
            uint32_t dm[8];                                                                        \
            for (int i = 0; i < 8; i++) {                                                          \
                DOT1(&wr[i][b], &xb[b], &S[i], &M[i]);                                             \
                memcpy(&dm[i], &wr[i][b], 4);                                                      \
            }                                                                                      \
            const __m256 sf = _mm256_cvtepi32_ps(g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7])); \
            const __m256 mf = _mm256_cvtepi32_ps(g4_avx2_hsum8x8(M[0], M[1], M[2], M[3], M[4], M[5], M[6], M[7])); \
            const __m256i v = _mm256_loadu_si256((const __m256i *)dm);                            \
            /* [d0..d3 dmin0..dmin3 | d4..d7 dmin4..dmin7] -> [d0..d7 | dmin0..dmin7] */           \
            const __m256i h = _mm256_permute4x64_epi64(                                            \
                _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(v, 16)), 0xd8); \
            const __m256 dx = _mm256_set1_ps(xb[b].d);                                             \
            const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), dx);       \
            const __m256 dn = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), dx);  \
            acc = _mm256_add_ps(acc, _mm256_sub_ps(_mm256_mul_ps(dd, sf), _mm256_mul_ps(dn, mf))); \
        }                                                                                          \
        _mm256_storeu_ps(yr, acc);                                                                 \
    }
G4_K45_ROWS8(g4_q4_K_rows8, block_q4_K, g4_q4_K_dot1)
G4_K45_ROWS8(g4_q5_K_rows8, block_q5_K, g4_q5_K_dot1)

/* [sum of v[0], .., sum of v[NT-1], 0 ..] */
static inline __m256i g4_hsum_nt(const __m256i *v, const int NT) {
    const __m256i z = _mm256_setzero_si256();
    return g4_avx2_hsum8x8(v[0], NT > 1 ? v[1] : z, NT > 2 ? v[2] : z, NT > 3 ? v[3] : z,
                           NT > 4 ? v[4] : z, NT > 5 ? v[5] : z, NT > 6 ? v[6] : z, NT > 7 ? v[7] : z);
}

/* Per-call tables for a chunk of up to 8 tokens (built once, shared by every row):
 *   mt[4b + p]: int16 pairs (B_{2p}[t], B_{2p+1}[t]) for t = 0..7, B_j = bsum over sub-block j
 *               of 32, so that sum_p madd(mt[4b + p], (m_{2p}, m_{2p+1})) = M of 8 tokens at once;
 *   dxt[8b + t]: the token's block scale d (0 for padding tokens). */
#define G4_CAPB 96 /* blocks per table range (k <= 24576 in one range) */
static void g4_build_tabs(const uint8_t *x, size_t xrb, int nt, int64_t b0, int64_t nbr, __m256i *mt,
                          float *dxt) {
    for (int64_t b = 0; b < nbr; b++) {
        int32_t *v = (int32_t *)&mt[4 * b];
        for (int t = 0; t < 8; t++) {
            if (t < nt) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xrb) + b0 + b;
                if (mt)
                    for (int p = 0; p < 4; p++) {
                        const int16_t lo = (int16_t)(xb->bsums[4 * p] + xb->bsums[4 * p + 1]);
                        const int16_t hi = (int16_t)(xb->bsums[4 * p + 2] + xb->bsums[4 * p + 3]);
                        v[8 * p + t] = (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16));
                    }
                dxt[8 * b + t] = xb->d;
            } else {
                if (mt)
                    for (int p = 0; p < 4; p++) v[8 * p + t] = 0;
                dxt[8 * b + t] = 0.0f;
            }
        }
    }
}

/* int16 (m_{2p}, m_{2p+1}) in every dword, from the 8 mins as int16 */
static inline __m256i g4_minpair(__m128i m16, const int p) {
    return _mm256_broadcastd_epi32(_mm_shuffle_epi32(m16, p * 0x55));
}

static inline __m256 g4_load_acc(const float *y, int64_t ldy, int64_t r, const int NT) {
    return _mm256_setr_ps(y[r], NT > 1 ? y[ldy + r] : 0.0f, NT > 2 ? y[2 * ldy + r] : 0.0f,
                          NT > 3 ? y[3 * ldy + r] : 0.0f, NT > 4 ? y[4 * ldy + r] : 0.0f,
                          NT > 5 ? y[5 * ldy + r] : 0.0f, NT > 6 ? y[6 * ldy + r] : 0.0f,
                          NT > 7 ? y[7 * ldy + r] : 0.0f);
}
/* the twin of g4_load_acc: lane t of acc to y[t * ldy + r], t < NT */
static inline void g4_store_acc(float *y, int64_t ldy, int64_t r, __m256 acc, const int NT) {
    float a[8];
    _mm256_storeu_ps(a, acc);
    for (int t = 0; t < NT; t++) y[t * ldy + r] = a[t];
}

/* NT tokens (2..8) vectorised across tokens: per block and sub-block pair the quants and scales
 * sit in registers while every token runs over them; per block the NT S vectors are reduced by
 * one transpose, M comes from the table, and the float ops run with one token per lane. */
#define G4_K45_TOK(NAME, BT, PAIR)                                                                 \
    static inline __attribute__((always_inline)) void NAME(                                        \
        const BT *wr, int64_t nb, const uint8_t *x, size_t xrb, float *y, int64_t ldy, int64_t r,  \
        const __m256i *mt, const float *dxt, int first, const int NT) {                            \
        const block_q8_K *xt[8];                                                                   \
        for (int t = 0; t < NT; t++) xt[t] = (const block_q8_K *)(x + (size_t)t * xrb);            \
        __m256 acc = first ? _mm256_setzero_ps() : g4_load_acc(y, ldy, r, NT);                     \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const BT *wb = &wr[b];                                                                 \
            __m256i mins;                                                                          \
            __m128i m16;                                                                           \
            const __m256i scb = g4_k45_scb(wb->scales, &mins, &m16);                               \
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
                    G4_KEEP(S[t]);                                                                 \
                }                                                                                  \
            }                                                                                      \
            /* mins as int16 [m0 .. m7] in the low lane; pair p = dword p */                      \
            const __m256i *mb = &mt[4 * b];                                                        \
            const __m256i Mi = _mm256_add_epi32(                                                   \
                _mm256_add_epi32(_mm256_madd_epi16(mb[0], g4_minpair(m16, 0)), _mm256_madd_epi16(mb[1], g4_minpair(m16, 1))), \
                _mm256_add_epi32(_mm256_madd_epi16(mb[2], g4_minpair(m16, 2)), _mm256_madd_epi16(mb[3], g4_minpair(m16, 3)))); \
            const __m256 Sf = _mm256_cvtepi32_ps(g4_hsum_nt(S, NT));                               \
            const __m256 Mf = _mm256_cvtepi32_ps(Mi);                                              \
            const __m256 dx = _mm256_loadu_ps(dxt + 8 * b);                                        \
            const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->d)), dx);      \
            const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->dmin)), dx);   \
            acc = _mm256_add_ps(acc, _mm256_sub_ps(_mm256_mul_ps(dd, Sf), _mm256_mul_ps(dm, Mf))); \
        }                                                                                          \
        g4_store_acc(y, ldy, r, acc, NT);                                                          \
    }
G4_K45_TOK(g4_q4_K_tok, block_q4_K, g4_q4_K_pair)
G4_K45_TOK(g4_q5_K_tok, block_q5_K, g4_q5_K_pair)

/* Q4_K, 16-token tiles (13..16 tokens, "TOKX2"): lanes are tokens from the start, as the 32-block
 * TOKX2. The Q8_K activations of each 8-token chunk are re-laid once per call (g4_build_x4k:
 * xk[512 b + 64 s + 8 j + t] = bytes 32 s + 4 j .. + 3 of token t's block b); per sub-block s each
 * dword of the codes is broadcast by one in-lane shuffle, one maddubs per chunk gives all 8 tokens'
 * pair sums, the int16 sums over the 8 dwords stay exact (8 x 2 x 15 x 128 < 2^15) and one madd by
 * the sub-block scale widens them. M comes from the mt table and the float ops are TOK's, in the
 * same lanes (tokens), so the bits are TOK's. */
#define G4_CAPXK 8 /* Q8_K blocks per xk range: 8 x 2 KiB per chunk of 8 tokens */
static inline void g4_tr8x8_store(const __m256i *v, __m256i *o) { /* o[j] = dword j of v[0..7] */
    __m256i c[8];
    g4_tr8x8_epi32(v, c);
    for (int j = 0; j < 8; j++) _mm256_store_si256(o + j, c[j]);
}
static void g4_build_x4k(const uint8_t *x, size_t xrb, int nt, int64_t b0, int64_t nbr, uint32_t *xk) {
    for (int64_t b = 0; b < nbr; b++)
        for (int sb = 0; sb < 8; sb++) {
            __m256i v[8];
            for (int t = 0; t < 8; t++)
                v[t] = t < nt ? _mm256_loadu_si256((const __m256i *)(((const block_q8_K *)(x + (size_t)t * xrb) + b0 + b)->qs + 32 * sb))
                              : _mm256_setzero_si256();
            g4_tr8x8_store(v, (__m256i *)(xk + 512 * b + 64 * sb));
        }
}
#define G4_XK_SUB(V, SC, SB)                                                                       \
    {                                                                                              \
        const __m256i wl = _mm256_permute2x128_si256(V, V, 0x00), wh = _mm256_permute2x128_si256(V, V, 0x11); \
        const __m256i *x0 = (const __m256i *)(xk0 + 512 * b + 64 * (SB));                         \
        const __m256i *x1 = (const __m256i *)(xk1 + 512 * b + 64 * (SB));                         \
        __m256i a0, a1;                                                                            \
        G4_XK_J(0) G4_XK_J(1) G4_XK_J(2) G4_XK_J(3) G4_XK_J(4) G4_XK_J(5) G4_XK_J(6) G4_XK_J(7)    \
        S0 = _mm256_add_epi32(S0, _mm256_madd_epi16(a0, SC));                                      \
        S1 = _mm256_add_epi32(S1, _mm256_madd_epi16(a1, SC));                                      \
    }
#define G4_XK_J(J)                                                                                 \
    {                                                                                              \
        const __m256i wb = _mm256_shuffle_epi32(J < 4 ? wl : wh, (J % 4) * 0x55);                  \
        const __m256i q0 = _mm256_maddubs_epi16(wb, _mm256_load_si256(x0 + J));                    \
        const __m256i q1 = _mm256_maddubs_epi16(wb, _mm256_load_si256(x1 + J));                    \
        if (J == 0) a0 = q0, a1 = q1;                                                              \
        else a0 = _mm256_add_epi16(a0, q0), a1 = _mm256_add_epi16(a1, q1);                         \
        G4_KEEP(a0);                                                                               \
        G4_KEEP(a1);                                                                               \
    }
static inline __attribute__((always_inline)) __m256i g4_k45_mins8(const __m256i *mb, __m128i m16) {
    return _mm256_add_epi32(
        _mm256_add_epi32(_mm256_madd_epi16(mb[0], g4_minpair(m16, 0)), _mm256_madd_epi16(mb[1], g4_minpair(m16, 1))),
        _mm256_add_epi32(_mm256_madd_epi16(mb[2], g4_minpair(m16, 2)), _mm256_madd_epi16(mb[3], g4_minpair(m16, 3))));
}
static inline __attribute__((always_inline)) void g4_q4_K_tokx2(const block_q4_K *wr, int64_t nb, const uint32_t *xk0,
    const uint32_t *xk1, float *y0, float *y1, int64_t ldy, int64_t r, const __m256i *mt0, const __m256i *mt1,
    const uint32_t *b60, const uint32_t *b61, const float *dx0, const float *dx1, int first, const int NT1) {
    (void)b60, (void)b61;
    __m256 acc0 = first ? _mm256_setzero_ps() : g4_load_acc(y0, ldy, r, 8);
    __m256 acc1 = first ? _mm256_setzero_ps() : g4_load_acc(y1, ldy, r, NT1);
    for (int64_t b = 0; b < nb; b++) {
        const block_q4_K *wb = &wr[b];
        __m256i mins;
        __m128i m16;
        const __m256i scb = g4_k45_scb(wb->scales, &mins, &m16);
        __m256i S0 = _mm256_setzero_si256(), S1 = S0;
        for (int g = 0; g < 4; g++) {
            __m256i lo, hi;
            g4_q4_K_pair(wb, g, &lo, &hi);
            G4_XK_SUB(lo, g4_scsel(scb, 2 * g), 2 * g)
            G4_XK_SUB(hi, g4_scsel(scb, 2 * g + 1), 2 * g + 1)
        }
        const __m256 d = _mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->d)), dmin = _mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->dmin));
        {
            const __m256 dx = _mm256_loadu_ps(dx0 + 8 * b);
            const __m256 Sf = _mm256_cvtepi32_ps(S0), Mf = _mm256_cvtepi32_ps(g4_k45_mins8(&mt0[4 * b], m16));
            acc0 = _mm256_add_ps(acc0, _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, dx), Sf), _mm256_mul_ps(_mm256_mul_ps(dmin, dx), Mf)));
        }
        {
            const __m256 dx = _mm256_loadu_ps(dx1 + 8 * b);
            const __m256 Sf = _mm256_cvtepi32_ps(S1), Mf = _mm256_cvtepi32_ps(g4_k45_mins8(&mt1[4 * b], m16));
            acc1 = _mm256_add_ps(acc1, _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, dx), Sf), _mm256_mul_ps(_mm256_mul_ps(dmin, dx), Mf)));
        }
    }
    g4_store_acc(y0, ldy, r, acc0, 8);
    g4_store_acc(y1, ldy, r, acc1, NT1);
}

#define G4_KQ_X2(TOKX2, NT1) TOKX2(wr, nbr, xk[0], xk[1], y0, y1, ldy, r, mt[0], mt[1], b6[0], b6[1], dxt[0], dxt[1], first, NT1)
#define g4_no_tokx2(wr, nb, xk0, xk1, y0, y1, ldy, r, mt0, mt1, b60, b61, dx0, dx1, first, NT1) ((void)(wr), (void)(y0), (void)(y1), (void)(first))
/* Q6_K's bias table for TOKX2: b6[64 b + 8 p + t] = token t's (bsum_2p, bsum_2p+1) of block b as an int16 pair */
static void g4_build_b6(const uint8_t *x, size_t xrb, int nt, int64_t b0, int64_t nbr, uint32_t *b6) {
    for (int64_t b = 0; b < nbr; b++) {
        __m256i v[8];
        for (int t = 0; t < 8; t++)
            v[t] = t < nt ? _mm256_loadu_si256((const __m256i *)((const block_q8_K *)(x + (size_t)t * xrb) + b0 + b)->bsums)
                          : _mm256_setzero_si256();
        g4_tr8x8_store(v, (__m256i *)(b6 + 64 * b));
    }
}
/* Driver for the K-quants: token tiles of 16 (two chunks of 8), block ranges of G4_CAPB with the
 * per-chunk tables on the stack; a row's accumulators continue across block ranges through y. */
#define G4_KQ_GEMM(NAME, BT, ONE, TOK, TOKX2, X2, ROWS8, USE_R8, NEEDM)                                   \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,         \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                  \
        const int64_t nb = k / QK_K;                                                               \
        if (n_tok == 1) { /* decode: 8 rows at a time (USE_R8), then the rest one by one */     \
            int64_t r = r0;                                                                        \
            if (USE_R8)                                                                            \
                for (; r + 8 <= r1; r += 8)                                                        \
                    ROWS8((const uint8_t *)G4_ROWP(w, r, wrb), wrb, (const block_q8_K *)x, nb, y + r, \
                          r + 8 < r1 ? (const uint8_t *)G4_ROWP(w, r + 8, wrb) : NULL);            \
            for (; r < r1; r++) y[r] = ONE((const BT *)G4_ROWP(w, r, wrb), (const block_q8_K *)x, nb, 0.0f); \
            return;                                                                                \
        }                                                                                          \
        __m256i mt[2][NEEDM ? 4 * G4_CAPB : 1];                                                    \
        float dxt[2][8 * G4_CAPB];                                                                 \
        uint32_t xk[2][X2 ? 512 * G4_CAPXK : 1] __attribute__((aligned(32)));                      \
        uint32_t b6[2][X2 == 2 ? 64 * G4_CAPXK : 1] __attribute__((aligned(32)));                  \
        for (int64_t tt = 0; tt < n_tok; tt += 16) {                                               \
            const int ntt = (int)(n_tok - tt < 16 ? n_tok - tt : 16);                              \
            const int nch = (ntt + 7) / 8;                                                         \
            const int x2 = X2 && ntt >= 13; /* both chunks by TOKX2 */                             \
            const int64_t range = x2 ? G4_CAPXK : G4_CAPB;                                         \
            for (int64_t b0 = 0; b0 < nb; b0 += range) {                                           \
                const int64_t nbr = nb - b0 < range ? nb - b0 : range;                             \
                for (int c = 0; c < nch; c++) {                                                    \
                    const int nt = ntt - 8 * c < 8 ? ntt - 8 * c : 8;                              \
                    if (nt > 1)                                                                    \
                        g4_build_tabs((const uint8_t *)x + (size_t)(tt + 8 * c) * xrb, xrb, nt, b0, nbr, \
                                      NEEDM ? mt[c] : NULL, dxt[c]);                               \
                    if (x2) g4_build_x4k((const uint8_t *)x + (size_t)(tt + 8 * c) * xrb, xrb, nt, b0, nbr, xk[c]); \
                    if (x2 && X2 == 2) g4_build_b6((const uint8_t *)x + (size_t)(tt + 8 * c) * xrb, xrb, nt, b0, nbr, b6[c]); \
                }                                                                                  \
                for (int64_t r = r0; r < r1; r++) {                                                \
                    const BT *wr = (const BT *)G4_ROWP(w, r, wrb) + b0;                            \
                    if (x2) {                                                                      \
                        float *y0 = y + tt * ldy, *y1 = y + (tt + 8) * ldy;                        \
                        const int first = b0 == 0;                                                 \
                        switch (ntt - 8) {                                                         \
                        case 5: G4_KQ_X2(TOKX2, 5); break;                                         \
                        case 6: G4_KQ_X2(TOKX2, 6); break;                                         \
                        case 7: G4_KQ_X2(TOKX2, 7); break;                                         \
                        default: G4_KQ_X2(TOKX2, 8); break;                                        \
                        }                                                                          \
                        continue;                                                                  \
                    }                                                                              \
                    for (int c = 0; c < nch; c++) {                                                \
                        const int nt = ntt - 8 * c < 8 ? ntt - 8 * c : 8;                          \
                        const uint8_t *xt = (const uint8_t *)x + (size_t)(tt + 8 * c) * xrb + (size_t)b0 * sizeof(block_q8_K); \
                        float *yt = y + (tt + 8 * c) * ldy;                                        \
                        const int first = b0 == 0;                                                 \
                        switch (nt) {                                                              \
                        case 1: yt[r] = ONE(wr, (const block_q8_K *)xt, nbr, first ? 0.0f : yt[r]); break; \
                        case 2: TOK(wr, nbr, xt, xrb, yt, ldy, r, mt[c], dxt[c], first, 2); break; \
                        case 3: TOK(wr, nbr, xt, xrb, yt, ldy, r, mt[c], dxt[c], first, 3); break; \
                        case 4: TOK(wr, nbr, xt, xrb, yt, ldy, r, mt[c], dxt[c], first, 4); break; \
                        case 5: TOK(wr, nbr, xt, xrb, yt, ldy, r, mt[c], dxt[c], first, 5); break; \
                        case 6: TOK(wr, nbr, xt, xrb, yt, ldy, r, mt[c], dxt[c], first, 6); break; \
                        case 7: TOK(wr, nbr, xt, xrb, yt, ldy, r, mt[c], dxt[c], first, 7); break; \
                        default: TOK(wr, nbr, xt, xrb, yt, ldy, r, mt[c], dxt[c], first, 8); break; \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

G4_KQ_GEMM(g4_gemm_q4_K_q8_K_avx2, block_q4_K, g4_q4_K_one, g4_q4_K_tok, g4_q4_K_tokx2, 1, g4_q4_K_rows8, 1, 1)
G4_KQ_GEMM(g4_gemm_q5_K_q8_K_avx2, block_q5_K, g4_q5_K_one, g4_q5_K_tok, g4_no_tokx2, 0, g4_q5_K_rows8, 1, 1)

/* ===================================== Q6_K x Q8_K ========================================= */
/* S = sum_j sc_j * sum_l (q - 32) x = sum_j sc_j (sum_l q x) - 32 sum_j sc_j bsum_j (exact int32) */
static inline __m256i g4_q6_chunk(const block_q6_K *b, int i) { /* elements 32i..32i+31, q in 0..63 */
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const int hh = i / 4, c = i % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * hh + 32 * (c % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * hh));
    const __m256i lo = _mm256_and_si256(c / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
    /* bits 2c, 2c+1 of every qh byte moved to 0x30 by one shift (the mask drops what crosses bytes) */
    const __m256i hi = _mm256_and_si256(c == 3 ? _mm256_srli_epi16(qh, 2) : _mm256_slli_epi16(qh, 4 - 2 * c),
                                        _mm256_set1_epi8(0x30));
    return _mm256_or_si256(lo, hi);
}
/* The 16 scales of a Q6_K block as int16: sc16 = [sc0..sc7 | sc8..sc15] (for the bias), and each
 * half duplicated into both lanes ([sc0..7 | sc0..7], [sc8..15 | sc8..15]) so that the scale pair
 * of chunk i is one in-lane shuffle (no cross-lane permute per chunk). */
typedef struct { __m128i lo, hi; } g4_q6_scales;
static inline g4_q6_scales g4_q6_sc16(const block_q6_K *b) {
    const __m128i s8 = _mm_loadu_si128((const __m128i *)b->scales);
    g4_q6_scales r;
    r.lo = _mm_cvtepi8_epi16(s8);
    r.hi = _mm_cvtepi8_epi16(_mm_srli_si128(s8, 8));
    return r;
}
static inline __m256i g4_q6_sc(g4_q6_scales sc, int i) { /* int16 [sc_{2i} x8 | sc_{2i+1} x8] */
    const int a = (2 * i) % 8, b = (2 * i + 1) % 8; /* words of the duplicated half */
    const __m256i pick = _mm256_setr_epi8(2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1,
                                          2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1,
                                          2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1,
                                          2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1);
    const __m128i h = i < 4 ? sc.lo : sc.hi;
    return _mm256_shuffle_epi8(_mm256_set_m128i(h, h), pick);
}
/* the same pair by one cross-lane permute of [sc0..sc7 | sc8..sc15]: fewer live registers, which
 * the token loops need (measured on Zen 1, 2..8 tokens: the in-lane form above was 10 % slower) */
static inline __m256i g4_q6_sc_perm(g4_q6_scales sc, int i) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(_mm256_set_m128i(sc.hi, sc.lo), _mm256_set1_epi32(i)), pick);
}
static inline __m256i g4_q6_bias(const block_q8_K *xb, g4_q6_scales sc) {
    return _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), _mm256_set_m128i(sc.hi, sc.lo)), 5);
}

static inline __m256i g4_q6_dot1(const block_q6_K *b, const block_q8_K *xb) {
    const g4_q6_scales sc16 = g4_q6_sc16(b);
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int i = 0; i < 8; i += 2) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * i));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * i + 32));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(g4_q6_chunk(b, i), x0), g4_q6_sc(sc16, i)));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(g4_q6_chunk(b, i + 1), x1), g4_q6_sc(sc16, i + 1)));
    }
    return _mm256_sub_epi32(_mm256_add_epi32(s0, s1), g4_q6_bias(xb, sc16));
}

static float g4_q6_K_one(const block_q6_K *wr, const block_q8_K *xb, int64_t nb, float acc) {
    for (int64_t bg = 0; bg < nb; bg += 8) {
        const int nbg = (int)(nb - bg < 8 ? nb - bg : 8);
        __m256i S[8];
        for (int i = 0; i < 8; i++) S[i] = i < nbg ? g4_q6_dot1(&wr[bg + i], &xb[bg + i]) : _mm256_setzero_si256();
        int32_t is[8];
        _mm256_storeu_si256((__m256i *)is, g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7]));
        for (int i = 0; i < nbg; i++) {
            const float dd = g4_fp16_to_fp32_f16c(wr[bg + i].d) * xb[bg + i].d;
            acc = acc + dd * (float)is[i];
        }
    }
    return acc;
}

/* one token, 8 rows at once (lane = row), as g4_q4_K_rows8: dd = d * dx, acc = acc + dd * S */
static void g4_q6_K_rows8(const uint8_t *w, size_t wrb, const block_q8_K *xb, int64_t nb, float *yr,
                          const uint8_t *next) {
    const block_q6_K *wr[8];
    for (int i = 0; i < 8; i++) wr[i] = (const block_q6_K *)(w + (size_t)i * wrb);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (next) g4_r8_prefetch(next, b, 8 * sizeof(block_q6_K));
        __m256i S[8];
        for (int i = 0; i < 8; i++) S[i] = g4_q6_dot1(&wr[i][b], &xb[b]);
        const __m256 sf = _mm256_cvtepi32_ps(g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7]));
        const __m256 dw = g4_h8((const uint8_t *)&wr[0][b].d, wrb, 8);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb[b].d)), sf));
    }
    _mm256_storeu_ps(yr, acc);
}

static inline __attribute__((always_inline)) void g4_q6_K_tok(const block_q6_K *wr, int64_t nb, const uint8_t *x,
                                                              size_t xrb, float *y, int64_t ldy, int64_t r,
                                                              const __m256i *mt, const float *dxt, int first, const int NT) {
    (void)mt;
    const block_q8_K *xt[8];
    for (int t = 0; t < NT; t++) xt[t] = (const block_q8_K *)(x + (size_t)t * xrb);
    __m256 acc = first ? _mm256_setzero_ps() : g4_load_acc(y, ldy, r, NT);
    for (int64_t b = 0; b < nb; b++) {
        const block_q6_K *wb = &wr[b];
        const g4_q6_scales sc16 = g4_q6_sc16(wb);
        __m256i S[8];
        for (int t = 0; t < NT; t++) S[t] = _mm256_setzero_si256();
        for (int i = 0; i < 8; i++) {
            const __m256i q = g4_q6_chunk(wb, i), sc = g4_q6_sc_perm(sc16, i);
            for (int t = 0; t < NT; t++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(xt[t][b].qs + 32 * i));
                S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), sc));
                G4_KEEP(S[t]);
            }
        }
        for (int t = 0; t < NT; t++) S[t] = _mm256_sub_epi32(S[t], g4_q6_bias(&xt[t][b], sc16));
        const __m256 Sf = _mm256_cvtepi32_ps(g4_hsum_nt(S, NT));
        const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->d)), _mm256_loadu_ps(dxt + 8 * b));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(dd, Sf));
    }
    g4_store_acc(y, ldy, r, acc, NT);
}

/* Q6_K, 16-token tiles (TOKX2): token lanes as for Q4_K. Codes 0..63: a pair sum reaches
 * 2 x 63 x 128, so int16 sums cover 2 dwords (32256 < 2^15); each 16-element sub-block (4 dwords)
 * is two madds by its scale. The -32 offset: 32 sum_j sc_j bsum_j(t), from the bias table b6
 * (token lanes of the bsum pairs) by madd with the scale pairs. Same integers as TOK, TOK's float ops. */
/* dwords D, D + 1 of both chunks: int16 pair sums (exact, see above) widened by madd with the
 * sub-block scale; the accumulators are pinned after each step (else GCC hoists all 16 products
 * of a chunk pair and spills) */
#define G4_Q6X_2(W, SC, D)                                                                         \
    {                                                                                              \
        const __m256i w0 = _mm256_shuffle_epi32(W, ((D) % 4) * 0x55), w1 = _mm256_shuffle_epi32(W, ((D) % 4 + 1) * 0x55); \
        const __m256i u0 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_load_si256(x0 + (D))),  \
                                            _mm256_maddubs_epi16(w1, _mm256_load_si256(x0 + (D) + 1))); \
        const __m256i u1 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_load_si256(x1 + (D))),  \
                                            _mm256_maddubs_epi16(w1, _mm256_load_si256(x1 + (D) + 1))); \
        S0 = _mm256_add_epi32(S0, _mm256_madd_epi16(u0, SC));                                      \
        S1 = _mm256_add_epi32(S1, _mm256_madd_epi16(u1, SC));                                      \
        G4_KEEP(S0);                                                                               \
        G4_KEEP(S1);                                                                               \
    }
static inline __attribute__((always_inline)) void g4_q6_K_tokx2(const block_q6_K *wr, int64_t nb, const uint32_t *xk0,
    const uint32_t *xk1, float *y0, float *y1, int64_t ldy, int64_t r, const __m256i *mt0, const __m256i *mt1,
    const uint32_t *b60, const uint32_t *b61, const float *dx0, const float *dx1, int first, const int NT1) {
    (void)mt0, (void)mt1;
    __m256 acc0 = first ? _mm256_setzero_ps() : g4_load_acc(y0, ldy, r, 8);
    __m256 acc1 = first ? _mm256_setzero_ps() : g4_load_acc(y1, ldy, r, NT1);
    for (int64_t b = 0; b < nb; b++) {
        const block_q6_K *wb = &wr[b];
        __m256i S0 = _mm256_setzero_si256(), S1 = S0;
        for (int i = 0; i < 8; i++) {
            const __m256i q = g4_q6_chunk(wb, i);
            const __m256i wl = _mm256_permute2x128_si256(q, q, 0x00), wh = _mm256_permute2x128_si256(q, q, 0x11);
            const __m256i sa = _mm256_set1_epi16((short)(int8_t)wb->scales[2 * i]);
            const __m256i sb = _mm256_set1_epi16((short)(int8_t)wb->scales[2 * i + 1]);
            const __m256i *x0 = (const __m256i *)(xk0 + 512 * b + 64 * i), *x1 = (const __m256i *)(xk1 + 512 * b + 64 * i);
            G4_Q6X_2(wl, sa, 0) G4_Q6X_2(wl, sa, 2) G4_Q6X_2(wh, sb, 4) G4_Q6X_2(wh, sb, 6)
        }
        /* bias: sum_p madd((bsum_2p, bsum_2p+1) of 8 tokens, (sc_2p, sc_2p+1)) */
        __m256i B0 = _mm256_setzero_si256(), B1 = B0;
        for (int p = 0; p < 8; p++) {
            const uint32_t pr = (uint32_t)(uint16_t)(int16_t)(int8_t)wb->scales[2 * p] |
                                ((uint32_t)(uint16_t)(int16_t)(int8_t)wb->scales[2 * p + 1] << 16);
            const __m256i sp = _mm256_set1_epi32((int)pr);
            B0 = _mm256_add_epi32(B0, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(b60 + 64 * b + 8 * p)), sp));
            B1 = _mm256_add_epi32(B1, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(b61 + 64 * b + 8 * p)), sp));
        }
        const __m256 d = _mm256_set1_ps(g4_fp16_to_fp32_f16c(wb->d));
        const __m256 Sf0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(S0, _mm256_slli_epi32(B0, 5)));
        const __m256 Sf1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(S1, _mm256_slli_epi32(B1, 5)));
        acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_loadu_ps(dx0 + 8 * b)), Sf0));
        acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_loadu_ps(dx1 + 8 * b)), Sf1));
    }
    g4_store_acc(y0, ldy, r, acc0, 8);
    g4_store_acc(y1, ldy, r, acc1, NT1);
}
G4_KQ_GEMM(g4_gemm_q6_K_q8_K_avx2, block_q6_K, g4_q6_K_one, g4_q6_K_tok, g4_q6_K_tokx2, 2, g4_q6_K_rows8, 1, 0)

/* ============================ Q8_0 / Q5_0 / Q4_0 x Q8_0 ==================================== */
/* Weights of a block as signed int8. Q8_0: maddubs(|w|, sign(x, w)) (exact for x > -128; see
 * g4_q8_0_act_has_m128 for the rest);
 * Q5_0/Q4_0 (|w| <= 16): maddubs(|x|, sign(w, x)), exact for every int8 x.
 * The unsigned codes u (Q4_0: 0..15, Q5_0: 0..31; w = u - 8 / u - 16) are what the 5..8-token path
 * multiplies: maddubs(u, x) is exact for every int8 x (|2 x 31 x 128| < 2^15), and
 * sum (u - off) x = sum u x - off sum x, the last term taken from a per-call table. */

/* the 16 bytes of nibbles -> [low nibbles | high nibbles]: one broadcast load, one per-lane shift */
static inline __m256i g4_nib32(const uint8_t *qs) {
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
}
static inline __m256i g4_q4_0_uvals(const block_q4_0 *b) { return g4_nib32(b->qs); }
static inline __m256i g4_q4_0_vals(const block_q4_0 *b) {
    return _mm256_sub_epi8(g4_q4_0_uvals(b), _mm256_set1_epi8(8));
}

/* byte i of the result: 0xff where bit i of qh is set, else 0 */
static inline __m256i g4_q5_0_hmask(const block_q5_0 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i notbit = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeull); /* all bits but bit i%8 */
    return _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf), notbit),
                             _mm256_set1_epi8(-1));
}
static inline __m256i g4_q5_0_uvals(const block_q5_0 *b) {
    return _mm256_or_si256(g4_nib32(b->qs), _mm256_and_si256(g4_q5_0_hmask(b), _mm256_set1_epi8(0x10)));
}
static inline __m256i g4_q5_0_vals(const block_q5_0 *b) { /* nib - 16 where the bit is clear, else nib */
    return _mm256_sub_epi8(g4_nib32(b->qs), _mm256_andnot_si256(g4_q5_0_hmask(b), _mm256_set1_epi8(0x10)));
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
    static float PFX##_one(const BT *wr, const block_q8_0 *xb, int64_t nb, float acc) {            \
        for (int64_t bg = 0; bg < nb; bg += 8) {                                                   \
            const int nbg = (int)(nb - bg < 8 ? nb - bg : 8);                                      \
            __m256i S[8];                                                                          \
            for (int i = 0; i < 8; i++) {                                                          \
                if (i < nbg) {                                                                     \
                    const __m256i wv = VALS(&wr[bg + i]);                                          \
                    S[i] = g4_q32_dot(wv, _mm256_abs_epi8(wv), xb[bg + i].qs, SMALLW);              \
                } else {                                                                           \
                    S[i] = _mm256_setzero_si256();                                                 \
                }                                                                                  \
            }                                                                                      \
            const __m256 is = _mm256_cvtepi32_ps(g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7])); \
            const __m256 dd = _mm256_mul_ps(g4_h8((const uint8_t *)&wr[bg].d, sizeof(BT), nbg),    \
                                            g4_h8((const uint8_t *)&xb[bg].d, sizeof(block_q8_0), nbg)); \
            acc = g4_add8(_mm256_mul_ps(is, dd), nbg, acc);                                        \
        }                                                                                          \
        return acc;                                                                                \
    }                                                                                              \
    /* one token, 8 rows at once (lane = row): per block the 8 rows' int32 vectors are reduced by  \
     * one transpose and the float ops run with one row per lane, the reference's per-row sequence \
     * (dd = d_w * d_x, acc = acc + S * dd in block order) without a scalar step per block.       \
     * The x block is loaded once for the 8 rows. */                                               \
    static void PFX##_rows8(const uint8_t *w, size_t wrb, const block_q8_0 *xb, int64_t nb, float *yr, \
                            const uint8_t *next) {                                                 \
        const BT *wr[8];                                                                           \
        for (int i = 0; i < 8; i++) wr[i] = (const BT *)(w + (size_t)i * wrb);                     \
        __m256 acc = _mm256_setzero_ps();                                                          \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            if (next) g4_r8_prefetch(next, b, 8 * sizeof(BT));                                     \
            __m256i S[8];                                                                          \
            for (int i = 0; i < 8; i++) {                                                          \
                const __m256i wv = VALS(&wr[i][b]);                                                \
                S[i] = g4_q32_dot(wv, _mm256_abs_epi8(wv), xb[b].qs, SMALLW);                      \
            }                                                                                      \
            const __m256 sf = _mm256_cvtepi32_ps(g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7])); \
            const __m256 dw = g4_h8((const uint8_t *)&wr[0][b].d, wrb, 8);                         \
            const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(g4_fp16_to_fp32_f16c(xb[b].d)));    \
            acc = _mm256_add_ps(acc, _mm256_mul_ps(sf, dd));                                       \
        }                                                                                          \
        _mm256_storeu_ps(yr, acc);                                                                 \
    }                                                                                              \
    /* 5..8 tokens of Q8_0, token lanes after one transpose per block (Q4_0 / Q5_0 take TOKX) */ \
    static inline __attribute__((always_inline)) void PFX##_tok(const BT *wr, int64_t nb, const uint8_t *x, \
        size_t xrb, float *y, int64_t ldy, int64_t r, const float *dxt, int first, const int NT) { \
        const block_q8_0 *xt[8];                                                                   \
        for (int t = 0; t < NT; t++) xt[t] = (const block_q8_0 *)(x + (size_t)t * xrb);            \
        __m256 acc = first ? _mm256_setzero_ps() : g4_load_acc(y, ldy, r, NT);                     \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const __m256i wv = VALS(&wr[b]), aw = _mm256_abs_epi8(wv);                             \
            __m256i S[8];                                                                          \
            for (int t = 0; t < NT; t++) S[t] = g4_q32_dot(wv, aw, xt[t][b].qs, SMALLW);           \
            const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wr[b].d)), _mm256_loadu_ps(dxt + 8 * b)); \
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(g4_hsum_nt(S, NT)), dd));     \
        }                                                                                          \
        g4_store_acc(y, ldy, r, acc, NT);                                                          \
    }

/* 2..4 tokens: blocks x tokens share one transpose (4 blocks x 2 tokens or 2 blocks x 4 tokens),
 * lane (i, t) = block i, token t; each block's lanes are then added to the token accumulators in
 * block order. */
#define G4_XH(l) ((l) % NTP < NT ? xt[(l) % NTP][bg + (l) / NTP].d : (uint16_t)0)
#define G4_WH(l) ((l) % NTP < NT ? wr[bg + (l) / NTP].d : (uint16_t)0)
#define G4_Q32_TOKB(PFX, BT, VALS, SMALLW)                                                         \
    static inline __attribute__((always_inline)) void PFX##_tokb(const BT *wr, int64_t nb, const uint8_t *x, \
        size_t xrb, float *y, int64_t ldy, int64_t r, int first, const int NT) {                   \
        const int NTP = NT <= 2 ? 2 : 4, BPG = 8 / NTP;                                            \
        const block_q8_0 *xt[4];                                                                   \
        for (int t = 0; t < NT; t++) xt[t] = (const block_q8_0 *)(x + (size_t)t * xrb);            \
        const __m256i z = _mm256_setzero_si256();                                                  \
        __m128 acc = first ? _mm_setzero_ps() : _mm256_castps256_ps128(g4_load_acc(y, ldy, r, NT)); \
        int64_t bg = 0;                                                                            \
        for (; bg + BPG <= nb; bg += BPG) {                                                        \
            __m256i S[8];                                                                          \
            _Pragma("GCC unroll 8") for (int i = 0; i < BPG; i++) {                                \
                const __m256i wv = VALS(&wr[bg + i]), aw = _mm256_abs_epi8(wv);                    \
                _Pragma("GCC unroll 8") for (int t = 0; t < NTP; t++)                              \
                    S[i * NTP + t] = t < NT ? g4_q32_dot(wv, aw, xt[t][bg + i].qs, SMALLW) : z;    \
            }                                                                                      \
            const __m256i R = g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7]);     \
            const __m128i wh = g4_h16x8(G4_WH(0), G4_WH(1), G4_WH(2), G4_WH(3), G4_WH(4), G4_WH(5), G4_WH(6), G4_WH(7)); \
            const __m128i xh = g4_h16x8(G4_XH(0), G4_XH(1), G4_XH(2), G4_XH(3), G4_XH(4), G4_XH(5), G4_XH(6), G4_XH(7)); \
            const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(wh), _mm256_cvtph_ps(xh));             \
            const __m256 P = _mm256_mul_ps(_mm256_cvtepi32_ps(R), dd);                             \
            const __m128 lo = _mm256_castps256_ps128(P), hi = _mm256_extractf128_ps(P, 1);         \
            if (NTP == 4) {                                                                        \
                acc = _mm_add_ps(acc, lo);                                                         \
                acc = _mm_add_ps(acc, hi);                                                         \
            } else {                                                                               \
                acc = _mm_add_ps(acc, lo);                                                         \
                acc = _mm_add_ps(acc, _mm_movehl_ps(lo, lo));                                      \
                acc = _mm_add_ps(acc, hi);                                                         \
                acc = _mm_add_ps(acc, _mm_movehl_ps(hi, hi));                                      \
            }                                                                                      \
        }                                                                                          \
        for (; bg < nb; bg++) { /* tail blocks: one block, token lanes */                         \
            const __m256i wv = VALS(&wr[bg]), aw = _mm256_abs_epi8(wv);                            \
            __m256i S[8];                                                                          \
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)                                    \
                S[t] = t < NT ? g4_q32_dot(wv, aw, xt[t][bg].qs, SMALLW) : z;                      \
            const __m256i R = g4_avx2_hsum8x8(S[0], S[1], S[2], S[3], S[4], S[5], S[6], S[7]);     \
            const __m128i xh = _mm_setr_epi16(xt[0][bg].d, NT > 1 ? xt[1][bg].d : 0, NT > 2 ? xt[2][bg].d : 0, \
                                              NT > 3 ? xt[3][bg].d : 0, 0, 0, 0, 0);               \
            const __m128 dd = _mm_mul_ps(_mm_set1_ps(g4_fp16_to_fp32_f16c(wr[bg].d)), _mm_cvtph_ps(xh)); \
            acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(_mm256_castsi256_si128(R)), dd));     \
        }                                                                                          \
        float a[4];                                                                                \
        _mm_storeu_ps(a, acc);                                                                     \
        for (int t = 0; t < NT; t++) y[t * ldy + r] = a[t];                                        \
    }
G4_Q32_TOKB(g4_q8_0, block_q8_0, g4_q8_0_vals, 0)
G4_Q32_TOKB(g4_q5_0, block_q5_0, g4_q5_0_vals, 1)
G4_Q32_TOKB(g4_q4_0, block_q4_0, g4_q4_0_vals, 1)

G4_Q32_KERNELS(g4_q8_0, block_q8_0, g4_q8_0_vals, 0)
G4_Q32_KERNELS(g4_q5_0, block_q5_0, g4_q5_0_vals, 1)
G4_Q32_KERNELS(g4_q4_0, block_q4_0, g4_q4_0_vals, 1)

/* generic driver: rows outer, tokens in chunks of 8 (ONE for a single token) */
#define G4_CAPB32 512 /* 32-blocks per dx-table range (k <= 16384 in one range) */
/* dxt[8b + t]: token t's block scale; bsx (off != 0): off x the sum of token t's block quants */
static void g4_build_dx32(const uint8_t *x, size_t xrb, int nt, int64_t b0, int64_t nbr, float *dxt, int32_t *bsx,
                          int off) {
    for (int64_t b = 0; b < nbr; b++)
        for (int t = 0; t < 8; t++) {
            const block_q8_0 *xb = (const block_q8_0 *)(x + (size_t)t * xrb) + b0 + b;
            dxt[8 * b + t] = t < nt ? g4_fp16_to_fp32_f16c(xb->d) : 0.0f;
            if (off) {
                int32_t sum = 0;
                if (t < nt)
                    for (int i = 0; i < QK8_0; i++) sum += xb->qs[i];
                bsx[8 * b + t] = off * sum;
            }
        }
}

/* Q4_0 / Q5_0, 5..8 tokens ("TOKX"): lanes are tokens from the start, so no per-block transpose.
 * The activations of a chunk are re-laid once per call (g4_build_x4): xi[64 b + 8 j + t] = bytes
 * 4j..4j+3 of token t's block b (0 for padding tokens). Per block, dword j of the unsigned codes is
 * broadcast (one in-lane shuffle of the half holding it: a store and reloads stall on store
 * forwarding) and maddubs(codes, xi[b][j]) gives every token's two pair sums of elements 4j..4j+3;
 * the int16 sums of several j are exact (Q5_0: 4 x 2 x 31 x 128 < 2^15; Q4_0: 8 x 2 x 15 x 128),
 * then widened by madd, and off x bsum (table bsx) subtracted: each lane holds the block's exact
 * signed integer sum for its token, and the float ops are the TOK path's. */
#define G4_CAPX 64 /* blocks per xi range: 64 x 256 bytes per chunk of 8 tokens */
static void g4_build_x4(const uint8_t *x, size_t xrb, int nt, int64_t b0, int64_t nbr, uint32_t *xi) {
    for (int64_t b = 0; b < nbr; b++) {
        __m256i v[8];
        for (int t = 0; t < 8; t++)
            v[t] = t < nt ? _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)(x + (size_t)t * xrb) + b0 + b)->qs)
                          : _mm256_setzero_si256();
        g4_tr8x8_store(v, (__m256i *)(xi + 64 * b));
    }
}
#define G4_Q32_TOKX(PFX, BT, UVALS, OFF)                                                           \
    static inline __attribute__((always_inline)) void PFX##_tokx(const BT *wr, int64_t nb, const uint32_t *xi, \
        float *y, int64_t ldy, int64_t r, const float *dxt, const int32_t *bsx, int first, const int NT) { \
        __m256 acc = first ? _mm256_setzero_ps() : g4_load_acc(y, ldy, r, NT);                     \
        const __m256i one = _mm256_set1_epi16(1);                                                  \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const __m256i wu = UVALS(&wr[b]);                                                      \
            const __m256i wl = _mm256_permute2x128_si256(wu, wu, 0x00), wh = _mm256_permute2x128_si256(wu, wu, 0x11); \
            const __m256i *xv = (const __m256i *)(xi + 64 * b);                                    \
            __m256i p[8];                                                                          \
            p[0] = _mm256_maddubs_epi16(_mm256_shuffle_epi32(wl, 0x00), _mm256_load_si256(xv + 0)); \
            p[1] = _mm256_maddubs_epi16(_mm256_shuffle_epi32(wl, 0x55), _mm256_load_si256(xv + 1)); \
            p[2] = _mm256_maddubs_epi16(_mm256_shuffle_epi32(wl, 0xaa), _mm256_load_si256(xv + 2)); \
            p[3] = _mm256_maddubs_epi16(_mm256_shuffle_epi32(wl, 0xff), _mm256_load_si256(xv + 3)); \
            p[4] = _mm256_maddubs_epi16(_mm256_shuffle_epi32(wh, 0x00), _mm256_load_si256(xv + 4)); \
            p[5] = _mm256_maddubs_epi16(_mm256_shuffle_epi32(wh, 0x55), _mm256_load_si256(xv + 5)); \
            p[6] = _mm256_maddubs_epi16(_mm256_shuffle_epi32(wh, 0xaa), _mm256_load_si256(xv + 6)); \
            p[7] = _mm256_maddubs_epi16(_mm256_shuffle_epi32(wh, 0xff), _mm256_load_si256(xv + 7)); \
            const __m256i h0 = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])); \
            const __m256i h1 = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])); \
            const __m256i S = OFF == 8 ? _mm256_madd_epi16(_mm256_add_epi16(h0, h1), one)          \
                                       : _mm256_add_epi32(_mm256_madd_epi16(h0, one), _mm256_madd_epi16(h1, one)); \
            const __m256i R = _mm256_sub_epi32(S, _mm256_loadu_si256((const __m256i *)(bsx + 8 * b))); \
            const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(g4_fp16_to_fp32_f16c(wr[b].d)), _mm256_loadu_ps(dxt + 8 * b)); \
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(R), dd));                    \
        }                                                                                          \
        g4_store_acc(y, ldy, r, acc, NT);                                                          \
    }
/* Both chunks of a 16-token tile at once (chunk 0 full, chunk 1 with NT1 = 5..8 tokens): each
 * broadcast of the codes serves 16 tokens, so the per-block unpacking is shared by twice the work. */
#define G4_X4_STEP(W, J)                                                                           \
    {                                                                                              \
        const __m256i wb = _mm256_shuffle_epi32(W, (J % 4) * 0x55);                                \
        const __m256i q0 = _mm256_maddubs_epi16(wb, _mm256_load_si256(x0 + J));                   \
        const __m256i q1 = _mm256_maddubs_epi16(wb, _mm256_load_si256(x1 + J));                   \
        if (J == 0) a0 = q0, a1 = q1;                                                              \
        else if (J == 4) b0_ = q0, b1 = q1;                                                        \
        else if (J < 4) a0 = _mm256_add_epi16(a0, q0), a1 = _mm256_add_epi16(a1, q1);              \
        else b0_ = _mm256_add_epi16(b0_, q0), b1 = _mm256_add_epi16(b1, q1);                       \
        if (J < 4) { G4_KEEP(a0); G4_KEEP(a1); } else { G4_KEEP(b0_); G4_KEEP(b1); }               \
    }
#define G4_Q32_TOKX2(PFX, BT, UVALS, OFF)                                                          \
    static inline __attribute__((always_inline)) void PFX##_tokx2(const BT *wr, int64_t nb, const uint32_t *xi0, \
        const uint32_t *xi1, float *y0, float *y1, int64_t ldy, int64_t r, const float *dx0, const float *dx1, \
        const int32_t *bs0, const int32_t *bs1, int first, const int NT1) {                        \
        __m256 acc0 = first ? _mm256_setzero_ps() : g4_load_acc(y0, ldy, r, 8);                    \
        __m256 acc1 = first ? _mm256_setzero_ps() : g4_load_acc(y1, ldy, r, NT1);                  \
        const __m256i one = _mm256_set1_epi16(1);                                                  \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const __m256i wu = UVALS(&wr[b]);                                                      \
            const __m256i wl = _mm256_permute2x128_si256(wu, wu, 0x00), wh = _mm256_permute2x128_si256(wu, wu, 0x11); \
            const __m256i *x0 = (const __m256i *)(xi0 + 64 * b), *x1 = (const __m256i *)(xi1 + 64 * b); \
            __m256i a0, a1, b0_, b1;                                                               \
            G4_X4_STEP(wl, 0) G4_X4_STEP(wl, 1) G4_X4_STEP(wl, 2) G4_X4_STEP(wl, 3)                \
            G4_X4_STEP(wh, 4) G4_X4_STEP(wh, 5) G4_X4_STEP(wh, 6) G4_X4_STEP(wh, 7)                \
            const __m256i S0 = OFF == 8 ? _mm256_madd_epi16(_mm256_add_epi16(a0, b0_), one)        \
                                        : _mm256_add_epi32(_mm256_madd_epi16(a0, one), _mm256_madd_epi16(b0_, one)); \
            const __m256i S1 = OFF == 8 ? _mm256_madd_epi16(_mm256_add_epi16(a1, b1), one)         \
                                        : _mm256_add_epi32(_mm256_madd_epi16(a1, one), _mm256_madd_epi16(b1, one)); \
            const __m256 dw = _mm256_set1_ps(g4_fp16_to_fp32_f16c(wr[b].d));                       \
            const __m256i R0 = _mm256_sub_epi32(S0, _mm256_loadu_si256((const __m256i *)(bs0 + 8 * b))); \
            const __m256i R1 = _mm256_sub_epi32(S1, _mm256_loadu_si256((const __m256i *)(bs1 + 8 * b))); \
            acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(_mm256_cvtepi32_ps(R0), _mm256_mul_ps(dw, _mm256_loadu_ps(dx0 + 8 * b)))); \
            acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_cvtepi32_ps(R1), _mm256_mul_ps(dw, _mm256_loadu_ps(dx1 + 8 * b)))); \
        }                                                                                          \
        g4_store_acc(y0, ldy, r, acc0, 8);                                                         \
        g4_store_acc(y1, ldy, r, acc1, NT1);                                                       \
    }
G4_Q32_TOKX2(g4_q5_0, block_q5_0, g4_q5_0_uvals, 16)
G4_Q32_TOKX2(g4_q4_0, block_q4_0, g4_q4_0_uvals, 8)
/* Q8_0 (signed codes): maddubs(|w|, sign(x, w)) per product as in its other paths (the -128 guard
 * of the entry covers the exception); a pair sum reaches 2 x 127 x 127, so every product vector is
 * widened by its own madd. */
#define G4_X4_STEPS(J)                                                                             \
    {                                                                                              \
        const __m256i ws = _mm256_shuffle_epi32(J < 4 ? wl : wh, (J % 4) * 0x55);                  \
        const __m256i wa = _mm256_shuffle_epi32(J < 4 ? al : ah, (J % 4) * 0x55);                  \
        S0 = _mm256_add_epi32(S0, _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(_mm256_load_si256(x0 + J), ws)), one)); \
        S1 = _mm256_add_epi32(S1, _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(_mm256_load_si256(x1 + J), ws)), one)); \
        G4_KEEP(S0);                                                                               \
        G4_KEEP(S1);                                                                               \
    }
static inline __attribute__((always_inline)) void g4_q8_0_tokx2(const block_q8_0 *wr, int64_t nb, const uint32_t *xi0,
    const uint32_t *xi1, float *y0, float *y1, int64_t ldy, int64_t r, const float *dx0, const float *dx1,
    const int32_t *bs0, const int32_t *bs1, int first, const int NT1) {
    (void)bs0, (void)bs1;
    __m256 acc0 = first ? _mm256_setzero_ps() : g4_load_acc(y0, ldy, r, 8);
    __m256 acc1 = first ? _mm256_setzero_ps() : g4_load_acc(y1, ldy, r, NT1);
    const __m256i one = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)wr[b].qs), aw = _mm256_abs_epi8(wv);
        const __m256i wl = _mm256_permute2x128_si256(wv, wv, 0x00), wh = _mm256_permute2x128_si256(wv, wv, 0x11);
        const __m256i al = _mm256_permute2x128_si256(aw, aw, 0x00), ah = _mm256_permute2x128_si256(aw, aw, 0x11);
        const __m256i *x0 = (const __m256i *)(xi0 + 64 * b), *x1 = (const __m256i *)(xi1 + 64 * b);
        __m256i S0 = _mm256_setzero_si256(), S1 = S0;
        G4_X4_STEPS(0) G4_X4_STEPS(1) G4_X4_STEPS(2) G4_X4_STEPS(3)
        G4_X4_STEPS(4) G4_X4_STEPS(5) G4_X4_STEPS(6) G4_X4_STEPS(7)
        const __m256 dw = _mm256_set1_ps(g4_fp16_to_fp32_f16c(wr[b].d));
        acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(_mm256_cvtepi32_ps(S0), _mm256_mul_ps(dw, _mm256_loadu_ps(dx0 + 8 * b))));
        acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_cvtepi32_ps(S1), _mm256_mul_ps(dw, _mm256_loadu_ps(dx1 + 8 * b))));
    }
    g4_store_acc(y0, ldy, r, acc0, 8);
    g4_store_acc(y1, ldy, r, acc1, NT1);
}
G4_Q32_TOKX(g4_q5_0, block_q5_0, g4_q5_0_uvals, 16)
G4_Q32_TOKX(g4_q4_0, block_q4_0, g4_q4_0_uvals, 8)
/* Q8_0 has no TOKX path (its codes are signed: the sign trick needs one more op per product) */
#define g4_q8_0_tokx(...) ((void)0)

/* driver: token tiles of 16 (chunks of 8; ONE for a single token, TOKB for 2..4, TOK with a
 * per-call dx table for 5..8), rows inside; the accumulators continue across dx-table ranges
 * through y */
#define G4_Q32_GEMM(NAME, BT, ONE, TOK, TOKB, TOKX, TOKX2, ROWS8, GUARD, OFF)                      \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,         \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                  \
        const int64_t nb = k / 32;                                                                 \
        GUARD                                                                                      \
        if (n_tok == 1) { /* decode: 8 rows at a time, then the rest one by one */                 \
            int64_t r = r0;                                                                        \
            for (; r + 8 <= r1; r += 8)                                                            \
                ROWS8((const uint8_t *)G4_ROWP(w, r, wrb), wrb, (const block_q8_0 *)x, nb, y + r,  \
                      r + 8 < r1 ? (const uint8_t *)G4_ROWP(w, r + 8, wrb) : NULL);                \
            for (; r < r1; r++) y[r] = ONE((const BT *)G4_ROWP(w, r, wrb), (const block_q8_0 *)x, nb, 0.0f); \
            return;                                                                                \
        }                                                                                          \
        float dxt[2][8 * G4_CAPB32];                                                               \
        int32_t bsx[2][OFF ? 8 * G4_CAPX : 1];                                                     \
        uint32_t xi[2][64 * G4_CAPX] __attribute__((aligned(32)));                                 \
        for (int64_t tt = 0; tt < n_tok; tt += 16) {                                               \
            const int ntt = (int)(n_tok - tt < 16 ? n_tok - tt : 16);                              \
            const int nch = (ntt + 7) / 8;                                                         \
            const int x2 = ntt >= 13; /* both chunks by TOKX2, on the re-laid activations */     \
            const int64_t range = ntt >= 5 ? (OFF || x2 ? G4_CAPX : G4_CAPB32) : nb;               \
            for (int64_t b0 = 0; b0 < nb; b0 += range) {                                           \
                const int64_t nbr = nb - b0 < range ? nb - b0 : range;                             \
                for (int c = 0; c < nch; c++) {                                                    \
                    const int nt = ntt - 8 * c < 8 ? ntt - 8 * c : 8;                              \
                    const uint8_t *xc = (const uint8_t *)x + (size_t)(tt + 8 * c) * xrb;           \
                    if (nt >= 5) g4_build_dx32(xc, xrb, nt, b0, nbr, dxt[c], bsx[c], OFF);         \
                    if (nt >= 5 && (OFF || x2)) g4_build_x4(xc, xrb, nt, b0, nbr, xi[c]);          \
                }                                                                                  \
                const int first = b0 == 0;                                                         \
                for (int64_t r = r0; r < r1; r++) {                                                \
                    const BT *wr = (const BT *)G4_ROWP(w, r, wrb) + b0;                            \
                    if (x2) { /* two TOKX chunks in one pass over the row */                       \
                        float *y0 = y + tt * ldy, *y1 = y + (tt + 8) * ldy;                        \
                        switch (ntt - 8) {                                                         \
                        case 5: TOKX2(wr, nbr, xi[0], xi[1], y0, y1, ldy, r, dxt[0], dxt[1], bsx[0], bsx[1], first, 5); break; \
                        case 6: TOKX2(wr, nbr, xi[0], xi[1], y0, y1, ldy, r, dxt[0], dxt[1], bsx[0], bsx[1], first, 6); break; \
                        case 7: TOKX2(wr, nbr, xi[0], xi[1], y0, y1, ldy, r, dxt[0], dxt[1], bsx[0], bsx[1], first, 7); break; \
                        default: TOKX2(wr, nbr, xi[0], xi[1], y0, y1, ldy, r, dxt[0], dxt[1], bsx[0], bsx[1], first, 8); break; \
                        }                                                                          \
                        continue;                                                                  \
                    }                                                                              \
                    for (int c = 0; c < nch; c++) {                                                \
                        const int nt = ntt - 8 * c < 8 ? ntt - 8 * c : 8;                          \
                        const uint8_t *xt = (const uint8_t *)x + (size_t)(tt + 8 * c) * xrb + (size_t)b0 * sizeof(block_q8_0); \
                        float *yt = y + (tt + 8 * c) * ldy;                                        \
                        switch (nt) {                                                              \
                        case 1: yt[r] = ONE(wr, (const block_q8_0 *)xt, nbr, first ? 0.0f : yt[r]); break; \
                        case 2: TOKB(wr, nbr, xt, xrb, yt, ldy, r, first, 2); break;               \
                        case 3: TOKB(wr, nbr, xt, xrb, yt, ldy, r, first, 3); break;               \
                        case 4: TOKB(wr, nbr, xt, xrb, yt, ldy, r, first, 4); break;               \
                        case 5: if (OFF) TOKX(wr, nbr, xi[c], yt, ldy, r, dxt[c], bsx[c], first, 5); else TOK(wr, nbr, xt, xrb, yt, ldy, r, dxt[c], first, 5); break; \
                        case 6: if (OFF) TOKX(wr, nbr, xi[c], yt, ldy, r, dxt[c], bsx[c], first, 6); else TOK(wr, nbr, xt, xrb, yt, ldy, r, dxt[c], first, 6); break; \
                        case 7: if (OFF) TOKX(wr, nbr, xi[c], yt, ldy, r, dxt[c], bsx[c], first, 7); else TOK(wr, nbr, xt, xrb, yt, ldy, r, dxt[c], first, 7); break; \
                        default: if (OFF) TOKX(wr, nbr, xi[c], yt, ldy, r, dxt[c], bsx[c], first, 8); else TOK(wr, nbr, xt, xrb, yt, ldy, r, dxt[c], first, 8); break; \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

/* A Q8_0 activation byte of -128 (only produced when its block scale is sub-normal) would break
 * the sign trick; such calls (never seen with real activations) go to the reference kernel. */
static int g4_q8_0_act_has_m128(const void *x, size_t xrb, int64_t n_tok, int64_t nb) {
    const __m256i m = _mm256_set1_epi8((char)-128);
    __m256i hit = _mm256_setzero_si256();
    for (int64_t t = 0; t < n_tok; t++) {
        const block_q8_0 *xb = (const block_q8_0 *)G4_ROWP(x, t, xrb);
        for (int64_t b = 0; b < nb; b++)
            hit = _mm256_or_si256(hit, _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)xb[b].qs), m));
    }
    return !_mm256_testz_si256(hit, hit);
}
#define G4_Q8_0_GUARD                                                                              \
    if (g4_q8_0_act_has_m128(x, xrb, n_tok, nb)) {                                                 \
        g4_gemm_q8_0_q8_0_ref(w, wrb, x, xrb, y, ldy, n_tok, k, r0, r1);                           \
        return;                                                                                    \
    }

G4_Q32_GEMM(g4_gemm_q8_0_q8_0_avx2, block_q8_0, g4_q8_0_one, g4_q8_0_tok, g4_q8_0_tokb, g4_q8_0_tokx, g4_q8_0_tokx2, g4_q8_0_rows8, G4_Q8_0_GUARD, 0)
G4_Q32_GEMM(g4_gemm_q5_0_q8_0_avx2, block_q5_0, g4_q5_0_one, g4_q5_0_tok, g4_q5_0_tokb, g4_q5_0_tokx, g4_q5_0_tokx2, g4_q5_0_rows8, , 16)
G4_Q32_GEMM(g4_gemm_q4_0_q8_0_avx2, block_q4_0, g4_q4_0_one, g4_q4_0_tok, g4_q4_0_tokb, g4_q4_0_tokx, g4_q4_0_tokx2, g4_q4_0_rows8, , 8)

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
