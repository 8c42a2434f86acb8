/* avx2.h: prototypes and small shared helpers of the avx2 table (AVX2 + FMA + F16C + BMI2 only;
 * no AVX-512, no VNNI). FMA is never used: every float op mirrors csrc/ref bit for bit. */
#ifndef G4_AVX2_H
#define G4_AVX2_H

#include <immintrin.h>

#include "../g4_blocks.h"
#include "../g4_impl.h"
#include "../g4_x86_256.h"

G4_DECLARE_ISA(avx2)

#define G4_ROWP(base, r, bytes) ((const void *)((const uint8_t *)(base) + (size_t)(r) * (bytes)))

/* f16 -> f32 with F16C (exact for every non-NaN value; NaNs come out quiet). */
static inline float g4_fp16_to_fp32_f16c(g4_half h) { return _cvtsh_ss(h); }

/* Sums of the 8 int32 lanes of each of a..h, returned as [sum a, sum b, ..., sum h]. Exact. */
static inline __m256i g4_avx2_hsum8x8(__m256i a, __m256i b, __m256i c, __m256i d, __m256i e,
                                      __m256i f, __m256i g, __m256i h) {
    const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
    const __m256i ef = _mm256_add_epi32(_mm256_unpacklo_epi32(e, f), _mm256_unpackhi_epi32(e, f));
    const __m256i gh = _mm256_add_epi32(_mm256_unpacklo_epi32(g, h), _mm256_unpackhi_epi32(g, h));
    /* ab = [a0+a2, b0+b2, a1+a3, b1+b3 | a4+a6, b4+b6, a5+a7, b5+b7] */
    const __m256i abcd = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    const __m256i efgh = _mm256_add_epi32(_mm256_unpacklo_epi64(ef, gh), _mm256_unpackhi_epi64(ef, gh));
    /* abcd = [A_lo, B_lo, C_lo, D_lo | A_hi, B_hi, C_hi, D_hi] */
    return _mm256_add_epi32(_mm256_permute2x128_si256(abcd, efgh, 0x20),
                            _mm256_permute2x128_si256(abcd, efgh, 0x31));
}

/* 16 float lanes (lo = lanes 0..7, hi = lanes 8..15) folded as l[i] += l[i+s], s = 8, 4, 2, 1. */
static inline float g4_avx2_fold16(__m256 lo, __m256 hi) {
    const __m256 v8 = _mm256_add_ps(lo, hi);
    const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    const __m128 v1 = _mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1));
    return _mm_cvtss_f32(v1);
}

#endif
