/* quant_avx512.c: activation quantisers (Q8_K, Q8_0) and row dequantisation, avx512 table.
 * Bit-identical to csrc/ref/quant_ref.c: same float ops in the same order per element, round
 * half to even through MXCSR (vcvtps2dq == rintf), int8 by truncation like the C casts. */
#include <math.h>

#include "avx512.h"

/* abs-max of 16 lanes with NaN lanes ignored (as `if (ax > amax)` does) */
G4_AI __m512 g4x_absmax_acc(__m512 acc, __m512 x) {
    const __m512 ax = _mm512_abs_ps(x);
    return _mm512_max_ps(ax, acc); /* NaN in ax -> acc (second operand) */
}

void g4_quantize_row_q8_K_avx512(const float *x, void *vy, int64_t k) {
    block_q8_K *y = (block_q8_K *)vy;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK_K;
        __m512 v[16];
        __m512 am = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++) {
            v[j] = _mm512_loadu_ps(xb + 16 * j);
            am = g4x_absmax_acc(am, v[j]);
        }
        const float amax = _mm512_reduce_max_ps(am);
        if (amax < G4_Q8K_TINY) { /* see g4_blocks.h */
            y[i].d = 0.0f;
            memset(y[i].qs, 0, sizeof(y[i].qs));
            memset(y[i].bsums, 0, sizeof(y[i].bsums));
            continue;
        }
        /* first element whose |x| equals amax (the reference keeps the first on ties) */
        const __m512 vam = _mm512_set1_ps(amax);
        float max = 0.0f;
        for (int j = 0; j < 16; j++) {
            const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(v[j]), vam, _CMP_EQ_OQ);
            if (m) { max = xb[16 * j + __builtin_ctz((unsigned)m)]; break; }
        }
        const float iscale = -127.0f / max;
        const __m512 vs = _mm512_set1_ps(iscale);
        const __m512i c127 = _mm512_set1_epi32(127);
        for (int j = 0; j < 16; j++) {
            const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vs, v[j])), c127);
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * j), _mm512_cvtepi32_epi8(q));
        }
        /* bsums: sum of each 16 int8 via sadbw on the biased bytes */
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        uint64_t s[32];
        for (int j = 0; j < 4; j++) {
            const __m512i q = _mm512_xor_si512(_mm512_loadu_si512(y[i].qs + 64 * j), bias);
            _mm512_storeu_si512(s + 8 * j, _mm512_sad_epu8(q, _mm512_setzero_si512()));
        }
        for (int j = 0; j < 16; j++) y[i].bsums[j] = (int16_t)((int)(s[2 * j] + s[2 * j + 1]) - 16 * 128);
        y[i].d = 1.0f / iscale;
    }
}

void g4_quantize_row_q8_0_avx512(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = (block_q8_0 *)vy;
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * i), v1 = _mm512_loadu_ps(x + 32 * i + 16);
        const __m512 am = g4x_absmax_acc(g4x_absmax_acc(_mm512_setzero_ps(), v0), v1);
        const float amax = _mm512_reduce_max_ps(am);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = g4_fp32_to_fp16(d);
        const __m512 vid = _mm512_set1_ps(id);
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vid))));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vid))));
    }
}

/* ---- dequantisation ---------------------------------------------------------------------- */
void g4_dequant_row_f32_avx512(const void *w, float *y, int64_t k) { memcpy(y, w, (size_t)k * 4); }

void g4_dequant_row_f16_avx512(const void *w, float *y, int64_t k) {
    const g4_half *h = (const g4_half *)w;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm512_storeu_ps(y + i, g4x_half16_to_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    for (; i < k; i++) y[i] = g4_fp16_to_fp32(h[i]);
}

void g4_dequant_row_bf16_avx512(const void *w, float *y, int64_t k) {
    const g4_bf16 *h = (const g4_bf16 *)w;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16)
        _mm512_storeu_si512(y + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + i))), 16));
    for (; i < k; i++) y[i] = g4_bf16_to_fp32(h[i]);
}

G4_AI float g4x_h2f(const void *p) {
    g4_half h;
    memcpy(&h, p, 2);
    return g4_fp16_to_fp32(h);
}

void g4_dequant_row_q8_0_avx512(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    for (int64_t i = 0; i < k / 32; i++, b += 34, y += 32) {
        const __m512 d = _mm512_set1_ps(g4x_h2f(b));
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2))));
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18))));
        _mm512_storeu_ps(y, _mm512_mul_ps(q0, d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(q1, d));
    }
}

void g4_dequant_row_q4_0_avx512(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    const __m512i m4 = _mm512_set1_epi32(0xF), c8 = _mm512_set1_epi32(8);
    for (int64_t i = 0; i < k / 32; i++, b += 18, y += 32) {
        const __m512 d = _mm512_set1_ps(g4x_h2f(b));
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(q, m4), c8));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(q, 4), c8));
        _mm512_storeu_ps(y, _mm512_mul_ps(d, lo));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, hi));
    }
}

void g4_dequant_row_q5_0_avx512(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    const __m512i m4 = _mm512_set1_epi32(0xF), c16 = _mm512_set1_epi32(16), one = _mm512_set1_epi32(1);
    const __m512i sh = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t i = 0; i < k / 32; i++, b += 22, y += 32) {
        const __m512 d = _mm512_set1_ps(g4x_h2f(b));
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 6)));
        const __m512i hl = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)qh), sh), one), 4);
        const __m512i hh = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)(qh >> 16)), sh), one), 4);
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(q, m4), hl), c16));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(_mm512_srli_epi32(q, 4), hh), c16));
        _mm512_storeu_ps(y, _mm512_mul_ps(d, lo));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, hi));
    }
}

G4_AI void g4x_k4_dequant(const block_q4_K *b, const uint8_t *qh, float *y) {
    const float d = g4_fp16_to_fp32(b->d), dmin = g4_fp16_to_fp32(b->dmin);
    const __m512i m4 = _mm512_set1_epi32(0xF), one = _mm512_set1_epi32(1);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        g4_get_scale_min_k4(j, b->scales, &sc, &m);
        const float d1f = d * (float)sc, m1f = dmin * (float)m;
        const __m512 d1 = _mm512_set1_ps(d1f), m1 = _mm512_set1_ps(m1f);
        const uint8_t *q = b->qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int h = 0; h < 2; h++) {
            __m512i v = _mm512_and_si512(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * h))), shift), m4);
            if (qh) v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(
                              _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + 16 * h))), j), one), 4));
            _mm512_storeu_ps(y + 32 * j + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d1, _mm512_cvtepi32_ps(v)), m1));
        }
    }
}

void g4_dequant_row_q4_K_avx512(const void *w, float *y, int64_t k) {
    const block_q4_K *b = (const block_q4_K *)w;
    for (int64_t i = 0; i < k / QK_K; i++) g4x_k4_dequant(&b[i], NULL, y + i * QK_K);
}

void g4_dequant_row_q5_K_avx512(const void *w, float *y, int64_t k) {
    const block_q5_K *b = (const block_q5_K *)w;
    for (int64_t i = 0; i < k / QK_K; i++) {
        block_q4_K t; /* same header and qs layout; qh passed separately */
        memcpy(&t, &b[i], 16);
        memcpy(t.qs, b[i].qs, sizeof(t.qs));
        g4x_k4_dequant(&t, b[i].qh, y + i * QK_K);
    }
}

void g4_dequant_row_q6_K_avx512(const void *w, float *y, int64_t k) {
    const block_q6_K *b = (const block_q6_K *)w;
    const __m512i m4 = _mm512_set1_epi32(0xF), m3 = _mm512_set1_epi32(3), c32 = _mm512_set1_epi32(32);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = g4_fp16_to_fp32(b[i].d);
        for (int g = 0; g < 16; g++) { /* 16 elements e = 16g..16g+15 share scale g */
            const int e = 16 * g, hh = e / 128, c = (e % 128) / 32, ll = e % 32;
            const float dsf = d * (float)b[i].scales[g];
            const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                                   (const __m128i *)(b[i].ql + 64 * hh + 32 * (c % 2) + ll))), 4 * (c / 2)), m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                                   (const __m128i *)(b[i].qh + 32 * hh + ll))), 2 * c), m3);
            const __m512 q = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), c32));
            _mm512_storeu_ps(y + i * QK_K + e, _mm512_mul_ps(_mm512_set1_ps(dsf), q));
        }
    }
}
