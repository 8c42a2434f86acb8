/* gemm_q4k_r8_avx2.c: Q4_K_R8 x Q8_K products (G4_TYPE_Q4_K_R8, block_q4_K_r8 in g4_blocks.h),
 * bit-identical to the Q4_K reference on the same rows.
 *
 * Lane = row: a 32-byte load of q[g][i] holds one dword of codes of each of the 8 rows, so a
 * token's activation dword is broadcast once and one maddubs serves 8 rows. Per sub-block the
 * int16 sums of 8 maddubs stay exact (|sum| <= 8 x 2 x 15 x 128 = 30720 < 2^15); one madd by the
 * 8 rows' scales (a byte shuffle of the transposed scale dwords) gives the int32 S; the mins M
 * take 4 madds per token. Then, per block, the reference's float ops with one row per lane:
 * acc = acc + ((d * dx) * (float)S - (dmin * dx) * (float)M), no FMA. No horizontal sums, no
 * scalar step per block: on Zen 3 with both cores streaming, ~0.8x the time of the row-layout
 * kernel for one token (bench/experiments/q4k_r8.c); 2..4 tokens share each code load. Each
 * superblock prefetches the one two ahead (18 lines): from memory, one token 1.70 -> 1.40 ns per
 * row x 32-block, one thread (distances 1 / 2 / 4: 1.45 / 1.40 / 1.40).
 * Tokens go in chunks of 4; the pool (csrc/g4_dispatch.c) sends more than 12 tokens to the
 * row-layout kernels on unpacked L2 chunks instead. */
#include <string.h>

#include "avx2.h"

#define G4_AI static inline __attribute__((always_inline))
#define G4_R8_PF 2 /* prefetch distance in superblocks */

/* per-lane int16 pair [v, v] of byte j (0..3) of each dword */
G4_AI __m256i r8_bsel(__m256i v, int j) {
    const __m256i c = _mm256_setr_epi8(j, -1, j, -1, 4 + j, -1, 4 + j, -1, 8 + j, -1, 8 + j, -1, 12 + j, -1, 12 + j, -1,
                                       j, -1, j, -1, 4 + j, -1, 4 + j, -1, 8 + j, -1, 8 + j, -1, 12 + j, -1, 12 + j, -1);
    return _mm256_shuffle_epi8(v, c);
}
/* per-lane int16 pair [byte j, byte j+1] of each dword */
G4_AI __m256i r8_bpair(__m256i v, int j) {
    const __m256i c = _mm256_setr_epi8(j, -1, j + 1, -1, 4 + j, -1, 5 + j, -1, 8 + j, -1, 9 + j, -1, 12 + j, -1, 13 + j,
                                       -1, j, -1, j + 1, -1, 4 + j, -1, 5 + j, -1, 8 + j, -1, 9 + j, -1, 12 + j, -1,
                                       13 + j, -1);
    return _mm256_shuffle_epi8(v, c);
}

/* sub-block scales (j < 4: low 6 bits of dword 0; j >= 4: dword 2's nibbles | dword 0's top bits) */
G4_AI __m256i r8_scales(const block_q4_K_r8 *k, int hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3f = _mm256_set1_epi8(0x3f), m03 = _mm256_set1_epi8(0x03);
    const __m256i A0 = _mm256_loadu_si256((const __m256i *)k->a[0]);
    if (!hi) return _mm256_and_si256(A0, m3f);
    const __m256i A2 = _mm256_loadu_si256((const __m256i *)k->a[2]);
    return _mm256_or_si256(_mm256_and_si256(A2, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(A0, 6), m03), 4));
}
G4_AI __m256i r8_mins(const block_q4_K_r8 *k, int hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3f = _mm256_set1_epi8(0x3f), m03 = _mm256_set1_epi8(0x03);
    const __m256i A1 = _mm256_loadu_si256((const __m256i *)k->a[1]);
    if (!hi) return _mm256_and_si256(A1, m3f);
    const __m256i A2 = _mm256_loadu_si256((const __m256i *)k->a[2]);
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A2, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(A1, 6), m03), 4));
}

/* NT tokens (1..4) x one group of 8 rows: y[t * ldy + lane]. Few live vectors (16 ymm on AVX2):
 * per sub-block one int16 sum per token, the scales and mins re-read from L1 where used. */
G4_AI void r8_group(const block_q4_K_r8 *B, int64_t nb, const block_q8_K *const *xt, float *y, int64_t ldy,
                    const int NT) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const block_q4_K_r8 *k = &B[b];
        { /* two superblocks ahead (the next group's first ones at the end: contiguous) */
            const char *pf = (const char *)&B[b + G4_R8_PF];
            for (int l = 0; l < (int)sizeof(block_q4_K_r8); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
        }
        __m256i S[4];
        for (int t = 0; t < NT; t++) S[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) { /* sub-block j: codes group j / 2, low nibbles for even j */
            const int g = j / 2, h = j % 2;
            __m256i s16[4];
            for (int t = 0; t < NT; t++) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)k->q[g][i]);
                const __m256i c = h ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
                for (int t = 0; t < NT; t++) {
                    int32_t xv;
                    memcpy(&xv, xt[t][b].qs + 32 * j + 4 * i, 4);
                    s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(c, _mm256_set1_epi32(xv)));
                }
            }
            const __m256i sc = r8_bsel(r8_scales(k, j >= 4), j & 3);
            for (int t = 0; t < NT; t++) S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(s16[t], sc));
        }
        const __m256 df = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)k->d));
        const __m256 mf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)k->dmin));
        for (int t = 0; t < NT; t++) {
            /* M = sum_j m_j (bsums[2j] + bsums[2j+1]) */
            const __m256i b8 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xt[t][b].bsums),
                                                 _mm256_set1_epi16(1));
            const __m256i P = _mm256_packs_epi32(b8, b8); /* exact: |pair sum| <= 2 x 16 x 128 */
            const __m256i mlo = r8_mins(k, 0), mhi = r8_mins(k, 1);
            __m256i M = _mm256_madd_epi16(r8_bpair(mlo, 0), _mm256_permutevar8x32_epi32(P, _mm256_set1_epi32(0)));
            M = _mm256_add_epi32(M, _mm256_madd_epi16(r8_bpair(mlo, 2), _mm256_permutevar8x32_epi32(P, _mm256_set1_epi32(1))));
            M = _mm256_add_epi32(M, _mm256_madd_epi16(r8_bpair(mhi, 0), _mm256_permutevar8x32_epi32(P, _mm256_set1_epi32(4))));
            M = _mm256_add_epi32(M, _mm256_madd_epi16(r8_bpair(mhi, 2), _mm256_permutevar8x32_epi32(P, _mm256_set1_epi32(5))));
            const __m256 dx = _mm256_set1_ps(xt[t][b].d);
            const __m256 dd = _mm256_mul_ps(df, dx), dn = _mm256_mul_ps(mf, dx);
            acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(S[t])),
                                                         _mm256_mul_ps(dn, _mm256_cvtepi32_ps(M))));
        }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
}

void g4_gemm_q4_K_r8_q8_K_avx2(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,
                               int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {
    const int64_t nb = k / QK_K;
    /* groups outside, token chunks inside: a group's later chunks read it from L1 / L2 */
    for (int64_t r = r0; r < r1; r += 8) {
        const block_q4_K_r8 *G = (const block_q4_K_r8 *)G4_ROWP(w, r, wrb);
        for (int64_t t0 = 0; t0 < n_tok; t0 += 4) {
            const int n = n_tok - t0 < 4 ? (int)(n_tok - t0) : 4;
            const block_q8_K *xt[4];
            for (int t = 0; t < n; t++) xt[t] = (const block_q8_K *)((const uint8_t *)x + (size_t)(t0 + t) * xrb);
            float *yy = y + t0 * ldy + r;
            switch (n) {
            case 1: r8_group(G, nb, xt, yy, ldy, 1); break;
            case 2: r8_group(G, nb, xt, yy, ldy, 2); break;
            case 3: r8_group(G, nb, xt, yy, ldy, 3); break;
            default: r8_group(G, nb, xt, yy, ldy, 4); break;
            }
        }
    }
}
