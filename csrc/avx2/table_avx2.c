/* table_avx2.c: the avx2 table (AVX2 + FMA + F16C + BMI2; no AVX-512, no VNNI). Every slot has
 * its own SIMD kernel (quant_avx2.c, gemm_avx2.c), bit-identical to the ref table. Entries still
 * pointing at *_ref functions would be fallbacks that g4_slot_is_ref reports. */
#include "avx2.h"

#define G4_WT(DQ, GEMM) {(g4_dequant_fn)(DQ), (g4_gemm_fn)(GEMM)}

const g4_kernels g4_kernels_avx2 = {
    .isa = "avx2",
    .quantize_row_q8_0 = g4_quantize_row_q8_0_avx2,
    .quantize_row_q8_K = g4_quantize_row_q8_K_avx2,
    .wt = {
        [G4_WT_F32] = G4_WT(g4_dequant_row_f32_avx2, g4_gemm_f32_f32_avx2),
        [G4_WT_F16] = G4_WT(g4_dequant_row_f16_avx2, g4_gemm_f16_f32_avx2),
        [G4_WT_BF16] = G4_WT(g4_dequant_row_bf16_avx2, g4_gemm_bf16_f32_avx2),
        [G4_WT_Q4_0] = G4_WT(g4_dequant_row_q4_0_avx2, g4_gemm_q4_0_q8_0_avx2),
        [G4_WT_Q5_0] = G4_WT(g4_dequant_row_q5_0_avx2, g4_gemm_q5_0_q8_0_avx2),
        [G4_WT_Q8_0] = G4_WT(g4_dequant_row_q8_0_avx2, g4_gemm_q8_0_q8_0_avx2),
        [G4_WT_Q4_K] = G4_WT(g4_dequant_row_q4_K_avx2, g4_gemm_q4_K_q8_K_avx2),
        [G4_WT_Q5_K] = G4_WT(g4_dequant_row_q5_K_avx2, g4_gemm_q5_K_q8_K_avx2),
        [G4_WT_Q6_K] = G4_WT(g4_dequant_row_q6_K_avx2, g4_gemm_q6_K_q8_K_avx2),
    },
    .gemm_q4_K_r8 = g4_gemm_q4_K_r8_q8_K_avx2,
};
