/* g4_impl.h: prototypes of every per-ISA kernel, for the dispatch tables.
 * Names follow g4_<op>_<wtype>_<atype>_<isa>; the ISA suffix is always the last token. */
#ifndef G4_IMPL_H
#define G4_IMPL_H

#include "g4_kernels.h"

#define G4_DECLARE_ISA(S)                                                                         \
    void g4_quantize_row_q8_0_##S(const float *x, void *y, int64_t k);                              \
    void g4_quantize_row_q8_K_##S(const float *x, void *y, int64_t k);                              \
    void g4_dequant_row_f32_##S(const void *w, float *y, int64_t k);                                \
    void g4_dequant_row_f16_##S(const void *w, float *y, int64_t k);                                \
    void g4_dequant_row_bf16_##S(const void *w, float *y, int64_t k);                               \
    void g4_dequant_row_q4_0_##S(const void *w, float *y, int64_t k);                               \
    void g4_dequant_row_q5_0_##S(const void *w, float *y, int64_t k);                               \
    void g4_dequant_row_q8_0_##S(const void *w, float *y, int64_t k);                               \
    void g4_dequant_row_q4_K_##S(const void *w, float *y, int64_t k);                               \
    void g4_dequant_row_q5_K_##S(const void *w, float *y, int64_t k);                               \
    void g4_dequant_row_q6_K_##S(const void *w, float *y, int64_t k);                               \
    void g4_gemm_f32_f32_##S(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, \
                             int64_t, int64_t, int64_t);                                            \
    void g4_gemm_f16_f32_##S(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, \
                             int64_t, int64_t, int64_t);                                            \
    void g4_gemm_bf16_f32_##S(const void *, size_t, const void *, size_t, float *, int64_t,         \
                              int64_t, int64_t, int64_t, int64_t);                                  \
    void g4_gemm_q4_0_q8_0_##S(const void *, size_t, const void *, size_t, float *, int64_t,        \
                               int64_t, int64_t, int64_t, int64_t);                                 \
    void g4_gemm_q5_0_q8_0_##S(const void *, size_t, const void *, size_t, float *, int64_t,        \
                               int64_t, int64_t, int64_t, int64_t);                                 \
    void g4_gemm_q8_0_q8_0_##S(const void *, size_t, const void *, size_t, float *, int64_t,        \
                               int64_t, int64_t, int64_t, int64_t);                                 \
    void g4_gemm_q4_K_q8_K_##S(const void *, size_t, const void *, size_t, float *, int64_t,        \
                               int64_t, int64_t, int64_t, int64_t);                                 \
    void g4_gemm_q5_K_q8_K_##S(const void *, size_t, const void *, size_t, float *, int64_t,        \
                               int64_t, int64_t, int64_t, int64_t);                                 \
    void g4_gemm_q6_K_q8_K_##S(const void *, size_t, const void *, size_t, float *, int64_t,        \
                               int64_t, int64_t, int64_t, int64_t);

G4_DECLARE_ISA(ref)
/* Q4_K_R8 products (G4_TYPE_Q4_K_R8): the reference and the AVX2 kernel (also in the avx512 tables) */
void g4_gemm_q4_K_r8_q8_K_ref(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t,
                              int64_t, int64_t);
void g4_gemm_q4_K_r8_q8_K_avx2(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t,
                               int64_t, int64_t);

/* Tables defined in csrc/<isa>/table_<isa>.c; entries may point at *_ref functions, which
 * g4_slot_is_ref reports (tests allow-list them). */
extern const g4_kernels g4_kernels_ref;
extern const g4_kernels g4_kernels_avx2;
extern const g4_kernels g4_kernels_avx512;
extern const g4_kernels g4_kernels_amx;

#endif
