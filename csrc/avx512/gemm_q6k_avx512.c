/* gemm_q6k_avx512.c: Q6_K weights x Q8_K activations, avx512 + VNNI (bit-identical to gemm_ref.c).
 * Per block: q (0..63, unsigned) . x with vpdpbusd, minus 32 * bsums (the -32 offset), with the
 * signed 8-bit group scales applied exactly through vpackssdw + vpmaddwd; the 16-lane int32
 * partial vectors of up to 16 tokens are reduced together (lane = token), then
 * acc = acc + (d*d8) * (float)S runs on 16 token lanes in block order. */
#include "avx512.h"

#define DXB 256 /* blocks per chunk of the d8 table */

G4_AI void q6_gemm(const int NT, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                   int64_t k, int64_t r0, int64_t r1) {
    const int64_t nb = k / QK_K;
    _Alignas(64) float dx[DXB * 16];
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    /* pack(D_v, D_v') puts lanes 4q..4q+3 of D_v (group 4v+q) then of D_v' (group 4v'+q) in 128-bit lane q */
    const __m512i i01 = _mm512_set_epi16(7, 7, 7, 7, 3, 3, 3, 3, 6, 6, 6, 6, 2, 2, 2, 2,
                                         5, 5, 5, 5, 1, 1, 1, 1, 4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i i23 = _mm512_add_epi16(i01, _mm512_set1_epi16(8));
    for (int64_t c0 = 0; c0 < nb; c0 += DXB) {
        const int kc = (int)(nb - c0 < DXB ? nb - c0 : DXB);
        for (int b = 0; b < kc; b++)
            for (int t = 0; t < 16; t++)
                dx[b * 16 + t] = t < NT ? ((const block_q8_K *)(x + (size_t)t * xrb))[c0 + b].d : 0.0f;
        for (int64_t r = r0; r < r1; r++) {
            const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * wrb) + c0;
            _Alignas(64) float a[16];
            for (int t = 0; t < 16; t++) a[t] = (c0 > 0 && t < NT) ? y[t * ldy + r] : 0.0f;
            __m512 acc = _mm512_load_ps(a);
            float acc1 = a[0];
            for (int b = 0; b < kc; b++) {
                const block_q6_K *B = wb + b;
                __m512i W[4];
                for (int v = 0; v < 4; v++) {
                    const int h = v / 2, s = 4 * (v % 2);
                    const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(B->ql + 64 * h), s), m4);
                    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(B->qh + 32 * h)));
                    const __m512i cnt = _mm512_setr_epi64(2 * (v % 2) * 2, 2 * (v % 2) * 2, 2 * (v % 2) * 2, 2 * (v % 2) * 2,
                                                          2 * (v % 2) * 2 + 2, 2 * (v % 2) * 2 + 2, 2 * (v % 2) * 2 + 2, 2 * (v % 2) * 2 + 2);
                    const __m512i hi = _mm512_and_si512(_mm512_srlv_epi64(qh, cnt), m3);
                    W[v] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
                }
                const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)B->scales));
                const __m512i scz = _mm512_castsi256_si512(sc16);
                const __m512i p01 = _mm512_permutexvar_epi16(i01, scz), p23 = _mm512_permutexvar_epi16(i23, scz);
                __m512i V[16];
                for (int t = 0; t < NT; t++) {
                    const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xrb) + c0 + b;
                    __m512i D[4];
                    for (int v = 0; v < 4; v++)
                        D[v] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[v], _mm512_loadu_si512(xb->qs + 64 * v));
                    const __m512i s01 = _mm512_madd_epi16(_mm512_packs_epi32(D[0], D[1]), p01);
                    const __m512i s23 = _mm512_madd_epi16(_mm512_packs_epi32(D[2], D[3]), p23);
                    const __m256i bsc = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), sc16);
                    V[t] = _mm512_sub_epi32(_mm512_add_epi32(s01, s23), _mm512_zextsi256_si512(_mm256_slli_epi32(bsc, 5)));
                }
                const float dwf = g4_fp16_to_fp32(B->d);
                if (NT == 1) {
                    const int32_t S = _mm512_reduce_add_epi32(V[0]);
                    const float dd = dwf * dx[b * 16];
                    acc1 = acc1 + dd * (float)S;
                } else {
                    for (int t = NT; t < 16; t++) V[t] = _mm512_setzero_si512();
                    __m512i U[8], T[4], X[2];
                    for (int u = 0; u < 8; u++) U[u] = g4x_merge(V[2 * u], V[2 * u + 1], 1);
                    for (int u = 0; u < 4; u++) T[u] = g4x_merge(U[2 * u], U[2 * u + 1], 2);
                    for (int u = 0; u < 2; u++) X[u] = g4x_merge(T[2 * u], T[2 * u + 1], 4);
                    const __m512i S = g4x_merge(X[0], X[1], 8);
                    const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(dwf), _mm512_load_ps(dx + b * 16));
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(S)));
                }
            }
            if (NT == 1) y[r] = acc1;
            else {
                _mm512_store_ps(a, acc);
                for (int t = 0; t < NT; t++) y[t * ldy + r] = a[t];
            }
        }
    }
}

#define Q6_CASES \
    switch (n_tok) { \
    case 1: q6_gemm(1, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 2: q6_gemm(2, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 3: q6_gemm(3, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 4: q6_gemm(4, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 5: q6_gemm(5, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 6: q6_gemm(6, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 7: q6_gemm(7, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 8: q6_gemm(8, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 9: q6_gemm(9, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 10: q6_gemm(10, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 11: q6_gemm(11, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 12: q6_gemm(12, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 13: q6_gemm(13, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 14: q6_gemm(14, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 15: q6_gemm(15, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    default: q6_gemm(16, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    }

static void q6k_tile(const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                     int64_t n_tok, int64_t k, int64_t r0, int64_t r1) { Q6_CASES }

void g4_gemm_q6_K_q8_K_avx512(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,
                              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < n_tok; t += 16)
        q6k_tile((const uint8_t *)w, wrb, (const uint8_t *)x + (size_t)t * xrb, xrb, y + t * ldy, ldy,
                 n_tok - t < 16 ? n_tok - t : 16, k, r0, r1);
}
