/* table_ref.c: the scalar reference table (runs on any x86-64 or other CPU). */
#include "../g4_impl.h"

#define G4_WT(DQ, GEMM) {(g4_dequant_fn)(DQ), (g4_gemm_fn)(GEMM)}

const g4_kernels g4_kernels_ref = {
    .isa = "ref",
    .quantize_row_q8_0 = g4_quantize_row_q8_0_ref,
    .quantize_row_q8_K = g4_quantize_row_q8_K_ref,
    .wt = {
        [G4_WT_F32] = G4_WT(g4_dequant_row_f32_ref, g4_gemm_f32_f32_ref),
        [G4_WT_F16] = G4_WT(g4_dequant_row_f16_ref, g4_gemm_f16_f32_ref),
        [G4_WT_BF16] = G4_WT(g4_dequant_row_bf16_ref, g4_gemm_bf16_f32_ref),
        [G4_WT_Q4_0] = G4_WT(g4_dequant_row_q4_0_ref, g4_gemm_q4_0_q8_0_ref),
        [G4_WT_Q5_0] = G4_WT(g4_dequant_row_q5_0_ref, g4_gemm_q5_0_q8_0_ref),
        [G4_WT_Q8_0] = G4_WT(g4_dequant_row_q8_0_ref, g4_gemm_q8_0_q8_0_ref),
        [G4_WT_Q4_K] = G4_WT(g4_dequant_row_q4_K_ref, g4_gemm_q4_K_q8_K_ref),
        [G4_WT_Q5_K] = G4_WT(g4_dequant_row_q5_K_ref, g4_gemm_q5_K_q8_K_ref),
        [G4_WT_Q6_K] = G4_WT(g4_dequant_row_q6_K_ref, g4_gemm_q6_K_q8_K_ref),
    },
    .gemm_q4_K_r8 = g4_gemm_q4_K_r8_q8_K_ref,
};
