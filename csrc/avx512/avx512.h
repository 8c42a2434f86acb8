/* avx512.h: prototypes and small shared helpers of the avx512 (F+BW+VL+DQ+VNNI) table.
 * Every kernel here reproduces the scalar reference (csrc/ref/) bit for bit; see g4_kernels.h. */
#ifndef G4_AVX512_H
#define G4_AVX512_H

#include <immintrin.h>

#include "../g4_blocks.h"
#include "../g4_impl.h"

G4_DECLARE_ISA(avx512)

#define G4_AI static inline __attribute__((always_inline))

/* The avx512 table's initializer, shared with the amx table (csrc/amx/table_amx.c), which differs
 * only in its name, its Q4_0 / Q5_0 / Q8_0 and Q4_K products and its wide (prefill) Q4_0 / Q5_0 entries
 * (NULL in the avx512 table). */
#define G4_AVX512_FAMILY_TABLE(NAME, GEMM_Q4_0, GEMM_Q5_0, GEMM_Q8_0, GEMM_Q4_K, WIDE_Q4_0, WIDE_Q5_0)                      \
    {                                                                                              \
        .isa = NAME,                                                                               \
        .quantize_row_q8_0 = g4_quantize_row_q8_0_avx512,                                          \
        .quantize_row_q8_K = g4_quantize_row_q8_K_avx512,                                          \
        .wt = {                                                                                    \
            [G4_WT_F32] = {g4_dequant_row_f32_avx512, g4_gemm_f32_f32_avx512},                     \
            [G4_WT_F16] = {g4_dequant_row_f16_avx512, g4_gemm_f16_f32_avx512},                     \
            [G4_WT_BF16] = {g4_dequant_row_bf16_avx512, g4_gemm_bf16_f32_avx512},                  \
            [G4_WT_Q4_0] = {g4_dequant_row_q4_0_avx512, GEMM_Q4_0, WIDE_Q4_0},                     \
            [G4_WT_Q5_0] = {g4_dequant_row_q5_0_avx512, GEMM_Q5_0, WIDE_Q5_0},                     \
            [G4_WT_Q8_0] = {g4_dequant_row_q8_0_avx512, GEMM_Q8_0},                                \
            [G4_WT_Q4_K] = {g4_dequant_row_q4_K_avx512, GEMM_Q4_K},                                \
            [G4_WT_Q5_K] = {g4_dequant_row_q5_K_avx512, g4_gemm_q5_K_q8_K_avx512},                 \
            [G4_WT_Q6_K] = {g4_dequant_row_q6_K_avx512, g4_gemm_q6_K_q8_K_avx512},                 \
        },                                                                                         \
        /* the AVX2 kernel (every AVX-512 CPU runs it); the engine repacks only on avx2 */          \
        .gemm_q4_K_r8 = g4_gemm_q4_K_r8_q8_K_avx2,                                                 \
    }

/* Exact f16 -> f32 for 16 lanes, bit-identical to g4_fp16_to_fp32 including NaN payloads
 * (vcvtph2ps would quiet a signalling NaN; the reference keeps the bits). */
G4_AI __m512 g4x_half16_to_ps(__m256i h) {
    const __m512 f = _mm512_cvtph_ps(h);
    const __m512i w = _mm512_cvtepu16_epi32(h);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7fff)),
                                                   _mm512_set1_epi32(0x7c00));
    if (__builtin_expect(nan == 0, 1)) return f;
    const __m512i bits = _mm512_or_si512(
        _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16),
        _mm512_or_si512(_mm512_set1_epi32(0x7f800000), _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x3ff)), 13)));
    return _mm512_mask_blend_ps(nan, f, _mm512_castsi512_ps(bits));
}

/* One merge step of a transposed horizontal reduction: lanes whose bit H is clear get
 * a[i] + a[i^H], lanes whose bit H is set get b[i] + b[i^H]. Integer adds: exact. */
#ifndef G4X_MERGE_MODE
#define G4X_MERGE_MODE 0
#endif
G4_AI __m512i g4x_merge(__m512i a, __m512i b, const int h) {
    const __mmask16 m = h == 1 ? 0xAAAA : h == 2 ? 0xCCCC : h == 4 ? 0xF0F0 : 0xFF00;
    if (G4X_MERGE_MODE == 0 || (G4X_MERGE_MODE == 1 && h <= 2)) {
        /* blend, swap the other blend within 128-bit lanes, add */
        const __m512i c1 = _mm512_mask_blend_epi32(m, a, b);
        const __m512i c2 = _mm512_mask_blend_epi32(m, b, a);
        __m512i s;
        if (h == 1) s = _mm512_shuffle_epi32(c2, _MM_PERM_CDAB);
        else if (h == 2) s = _mm512_shuffle_epi32(c2, _MM_PERM_BADC);
        else if (h == 4) s = _mm512_shuffle_i32x4(c2, c2, 0xB1);
        else s = _mm512_shuffle_i32x4(c2, c2, 0x4E);
        return _mm512_add_epi32(c1, s);
    }
    /* lane i takes a[i^h] (bit h of i clear) or b[i^h] (set): one vpermt2d */
    const __m512i idx = h == 1 ? _mm512_setr_epi32(1, 16, 3, 18, 5, 20, 7, 22, 9, 24, 11, 26, 13, 28, 15, 30)
                      : h == 2 ? _mm512_setr_epi32(2, 3, 16, 17, 6, 7, 20, 21, 10, 11, 24, 25, 14, 15, 28, 29)
                      : h == 4 ? _mm512_setr_epi32(4, 5, 6, 7, 16, 17, 18, 19, 12, 13, 14, 15, 24, 25, 26, 27)
                               : _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23);
    return _mm512_add_epi32(_mm512_mask_blend_epi32(m, a, b), _mm512_permutex2var_epi32(a, idx, b));
}

/* Row-group accumulators whose 16 lanes are (row, token) items: lane i is row rowof[i], token
 * tokof[i] of the group starting at row r with nr valid rows (valid[i]: the lane holds an item at
 * all). Load starts from 0 in the first chunk (c0 == 0) and from y after it; store writes only
 * real items. Shared by the Q4_K/Q5_K and Q6_K small-batch paths. */
G4_AI __m512 g4x_items_load(const float *y, int64_t ldy, int64_t r, int nr, int64_t c0, const int *valid,
                            const int *rowof, const int *tokof) {
    _Alignas(64) float a[16];
    for (int i = 0; i < 16; i++)
        a[i] = (c0 > 0 && valid[i] && rowof[i] < nr) ? y[tokof[i] * ldy + r + rowof[i]] : 0.0f;
    return _mm512_load_ps(a);
}

G4_AI void g4x_items_store(float *y, int64_t ldy, int64_t r, int nr, __m512 acc, const int *valid,
                           const int *rowof, const int *tokof) {
    _Alignas(64) float a[16];
    _mm512_store_ps(a, acc);
    for (int i = 0; i < 16; i++)
        if (valid[i] && rowof[i] < nr) y[tokof[i] * ldy + r + rowof[i]] = a[i];
}

/* The one-token streams (q6_gemv_stream, k_gemv_stream) read a 16-row group a pass of `pr` rows at a
 * time (row0 = the pass's first row in the group starting at row r), pass_bytes per pass of a
 * sub-chunk, and prefetch, at each block they read, the rows of the pass at least pfb bytes ahead
 * (whole passes; crossing into the next group, never at or past r1). Fills nx with those rows'
 * pointers at byte offset off into the row and returns their count. */
G4_AI int g4x_stream_rows_ahead(const uint8_t *w, size_t wrb, int64_t r, int64_t r1, int row0, int pr,
                                int64_t pass_bytes, int64_t pfb, size_t off, const uint8_t **nx) {
    const int64_t ahead = (pfb + pass_bytes - 1) / pass_bytes;
    int n = 0;
    for (int j = 0; j < pr; j++) {
        const int64_t rr = r + row0 + ahead * pr + j;
        if (rr < r1) nx[n++] = w + (size_t)rr * wrb + off;
    }
    return n;
}

/* the cache lines of block b (bb bytes) of each of the n rows nx, into L1 */
G4_AI void g4x_prefetch_block(const uint8_t *const *nx, int n, int64_t b, int bb) {
    for (int j = 0; j < n; j++)
        for (int o = 0; o < bb; o += 64) _mm_prefetch((const char *)nx[j] + (size_t)b * bb + o, _MM_HINT_T0);
}

#endif
