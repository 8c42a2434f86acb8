/* quant_avx2.c: activation quantisers (Q8_K, Q8_0) and row dequantisation, bit-identical to
 * csrc/ref/quant_ref.c. Rounding: _mm256_cvtps_epi32 under the default MXCSR (nearest even), as
 * rintf. Conversion to int8 keeps the low byte of the int32 (as the C cast does on gcc/clang,
 * including the 0x80000000 that out-of-range and NaN products convert to). */
#include "avx2.h"

/* 4 x 8 int32 (each already reduced to its low byte, 0..255) -> 32 bytes in element order. */
static inline __m256i g4_pack_low_bytes(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packus_epi32(a, b); /* [a0-3 b0-3 | a4-7 b4-7] */
    const __m256i cd = _mm256_packus_epi32(c, d);
    const __m256i v = _mm256_packus_epi16(ab, cd); /* [a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7] */
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline float g4_hmax8(__m256 m) {
    __m128 v = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    v = _mm_max_ps(v, _mm_movehl_ps(v, v));
    v = _mm_max_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}

void g4_quantize_row_q8_K_avx2(const float *x, void *vy, int64_t k) {
    block_q8_K *y = (block_q8_K *)vy;
    const int64_t nb = k / QK_K;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lowbyte = _mm256_set1_epi32(0xff), i127 = _mm256_set1_epi32(127);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK_K;
        /* |x| as first operand: a NaN element yields the running max (the ref skips NaNs). */
        __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 16) {
            m0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + j), absmask), m0);
            m1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + j + 8), absmask), m1);
        }
        const float amax = g4_hmax8(_mm256_max_ps(m0, m1));
        if (amax < G4_Q8K_TINY) { /* see g4_blocks.h */
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        /* the ref keeps the first element of largest magnitude */
        float max = 0.0f;
        const __m256 av = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 v = _mm256_loadu_ps(xb + j);
            const int msk = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, absmask), av, _CMP_EQ_OQ));
            if (msk) { max = xb[j + __builtin_ctz((unsigned)msk)]; break; }
        }
        const float iscale = -127.0f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        __m256i s[8];
        for (int j = 0; j < 8; j++) {
            __m256i q[4];
            for (int u = 0; u < 4; u++) {
                __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(xb + 32 * j + 8 * u)));
                v = _mm256_min_epi32(v, i127);
                q[u] = _mm256_and_si256(v, lowbyte);
            }
            const __m256i qb = g4_pack_low_bytes(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * j), qb);
            /* [sum4 x4 of elems 32j..32j+15 | of 32j+16..32j+31] */
            s[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qb), ones16);
        }
        /* hadd(hadd(s0,s1),hadd(s2,s3)) = [g0 g2 g4 g6 | g1 g3 g5 g7] (g = group of 16) */
        const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        const __m256i A = _mm256_permutevar8x32_epi32(
            _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3])), perm);
        const __m256i B = _mm256_permutevar8x32_epi32(
            _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7])), perm);
        const __m256i bs = _mm256_permute4x64_epi64(_mm256_packs_epi32(A, B), 0xD8);
        _mm256_storeu_si256((__m256i *)y[i].bsums, bs);
        y[i].d = 1.0f / iscale;
    }
}

void g4_quantize_row_q8_0_avx2(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = (block_q8_0 *)vy;
    const int64_t nb = k / QK8_0;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lowbyte = _mm256_set1_epi32(0xff);
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK8_0;
        const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_setzero_ps());
        m = _mm256_max_ps(_mm256_and_ps(v1, absmask), m);
        m = _mm256_max_ps(_mm256_and_ps(v2, absmask), m);
        m = _mm256_max_ps(_mm256_and_ps(v3, absmask), m);
        const float amax = g4_hmax8(m);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = g4_fp32_to_fp16(d);
        const __m256 iv = _mm256_set1_ps(id);
        const __m256i q0 = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_mul_ps(v0, iv)), lowbyte);
        const __m256i q1 = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_mul_ps(v1, iv)), lowbyte);
        const __m256i q2 = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_mul_ps(v2, iv)), lowbyte);
        const __m256i q3 = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_mul_ps(v3, iv)), lowbyte);
        _mm256_storeu_si256((__m256i *)y[i].qs, g4_pack_low_bytes(q0, q1, q2, q3));
    }
}

/* ---- dequantisation ---------------------------------------------------------------------- */
void g4_dequant_row_f32_avx2(const void *w, float *y, int64_t k) { memcpy(y, w, (size_t)k * 4); }

void g4_dequant_row_f16_avx2(const void *w, float *y, int64_t k) {
    const g4_half *h = (const g4_half *)w;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(h + i));
        /* vcvtph2ps quiets signalling NaNs; the ref keeps their bits: take those lanes scalar */
        const __m128i e = _mm_and_si128(v, _mm_set1_epi16(0x7c00));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(e, _mm_set1_epi16(0x7c00)))) {
            for (int j = 0; j < 8; j++) y[i + j] = g4_fp16_to_fp32(h[i + j]);
        } else {
            _mm256_storeu_ps(y + i, _mm256_cvtph_ps(v));
        }
    }
    for (; i < k; i++) y[i] = g4_fp16_to_fp32(h[i]);
}

void g4_dequant_row_bf16_avx2(const void *w, float *y, int64_t k) {
    const g4_bf16 *h = (const g4_bf16 *)w;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_slli_epi32(v, 16));
    }
    for (; i < k; i++) y[i] = g4_bf16_to_fp32(h[i]);
}

/* 16 bytes -> two vectors of 8 floats of (int)byte - off, elements 0..7 and 8..15 */
static inline void g4_store_q16(float *y, __m128i b, __m256 d) {
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)));
    _mm256_storeu_ps(y, _mm256_mul_ps(d, lo));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, hi));
}

void g4_dequant_row_q4_0_avx2(const void *w, float *y, int64_t k) {
    const block_q4_0 *b = (const block_q4_0 *)w;
    const __m128i m4 = _mm_set1_epi8(0x0f), o8 = _mm_set1_epi8(8);
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const __m256 d = _mm256_set1_ps(g4_fp16_to_fp32(b[i].d));
        const __m128i q = _mm_loadu_si128((const __m128i *)b[i].qs);
        g4_store_q16(y, _mm_sub_epi8(_mm_and_si128(q, m4), o8), d);
        g4_store_q16(y + 16, _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), o8), d);
    }
}

/* the 32 fifth bits of a q5_0 block as bytes 0x10 / 0x00 (element order) */
static inline __m256i g4_q5_0_hbits(const uint8_t *qh4) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bitm = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bitm), bitm);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* signed q5_0 values (-16..15) of one block, element order */
static inline __m256i g4_q5_0_values(const block_q5_0 *b) {
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    return _mm256_sub_epi8(_mm256_or_si256(nib, g4_q5_0_hbits(b->qh)), _mm256_set1_epi8(16));
}

void g4_dequant_row_q5_0_avx2(const void *w, float *y, int64_t k) {
    const block_q5_0 *b = (const block_q5_0 *)w;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const __m256 d = _mm256_set1_ps(g4_fp16_to_fp32(b[i].d));
        const __m256i v = g4_q5_0_values(&b[i]);
        g4_store_q16(y, _mm256_castsi256_si128(v), d);
        g4_store_q16(y + 16, _mm256_extracti128_si256(v, 1), d);
    }
}

void g4_dequant_row_q8_0_avx2(const void *w, float *y, int64_t k) {
    const block_q8_0 *b = (const block_q8_0 *)w;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const __m256 d = _mm256_set1_ps(g4_fp16_to_fp32(b[i].d));
        for (int j = 0; j < 32; j += 8) {
            const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j))));
            _mm256_storeu_ps(y + j, _mm256_mul_ps(q, d));
        }
    }
}

/* y[0..31] = d1 * (float)q - m1 for 32 bytes q (0..31) */
static inline void g4_store_km32(float *y, __m256i q, __m256 d1, __m256 m1) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i p[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    for (int u = 0; u < 4; u++) {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p[u]));
        _mm256_storeu_ps(y + 8 * u, _mm256_sub_ps(_mm256_mul_ps(d1, f), m1));
    }
}

static inline void g4_unpack_scales_k4(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 8; j++) g4_get_scale_min_k4(j, q, &sc[j], &m[j]);
}

void g4_dequant_row_q4_K_avx2(const void *w, float *y, int64_t k) {
    const block_q4_K *b = (const block_q4_K *)w;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = g4_fp16_to_fp32(b[i].d), dmin = g4_fp16_to_fp32(b[i].dmin);
        uint8_t sc[8], m[8];
        g4_unpack_scales_k4(b[i].scales, sc, m);
        for (int g = 0; g < 4; g++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * g));
            for (int h = 0; h < 2; h++) {
                const int j = 2 * g + h;
                const __m256i v = _mm256_and_si256(h ? _mm256_srli_epi16(q, 4) : q, m4);
                g4_store_km32(y, v, _mm256_set1_ps(d * (float)sc[j]), _mm256_set1_ps(dmin * (float)m[j]));
                y += 32;
            }
        }
    }
}

void g4_dequant_row_q5_K_avx2(const void *w, float *y, int64_t k) {
    const block_q5_K *b = (const block_q5_K *)w;
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = g4_fp16_to_fp32(b[i].d), dmin = g4_fp16_to_fp32(b[i].dmin);
        uint8_t sc[8], m[8];
        g4_unpack_scales_k4(b[i].scales, sc, m);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b[i].qh);
        for (int g = 0; g < 4; g++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * g));
            for (int h = 0; h < 2; h++) {
                const int j = 2 * g + h;
                const __m256i bit = _mm256_set1_epi8((char)(1 << j));
                const __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), b4);
                const __m256i v = _mm256_or_si256(_mm256_and_si256(h ? _mm256_srli_epi16(q, 4) : q, m4), hb);
                g4_store_km32(y, v, _mm256_set1_ps(d * (float)sc[j]), _mm256_set1_ps(dmin * (float)m[j]));
                y += 32;
            }
        }
    }
}

void g4_dequant_row_q6_K_avx2(const void *w, float *y, int64_t k) {
    const block_q6_K *b = (const block_q6_K *)w;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3), o32 = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = g4_fp16_to_fp32(b[i].d);
        for (int c32 = 0; c32 < 8; c32++) { /* elements 32*c32 .. +31 */
            const int hh = c32 / 4, c = c32 % 4;
            const __m256i ql = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * hh + 32 * (c % 2)));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * hh));
            const __m256i lo = _mm256_and_si256(c / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m2);
            const __m256i v = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), o32);
            for (int h16 = 0; h16 < 2; h16++) {
                const __m256 ds = _mm256_set1_ps(d * (float)b[i].scales[2 * c32 + h16]);
                const __m128i q = h16 ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
                g4_store_q16(y + 32 * c32 + 16 * h16, q, ds);
            }
        }
        y += QK_K;
    }
}
