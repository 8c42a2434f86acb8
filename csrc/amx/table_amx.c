/* table_amx.c: the amx table = the avx512 table with AMX-INT8 tile products for Q8_0 weights
 * (csrc/amx/gemm_amx.c). Selected when the CPU has AMX-INT8 and AVX-512 VBMI and the
 * kernel grants this process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, g4_dispatch.c). */
#include "amx.h"

#define G4_WT(DQ, GEMM) {(g4_dequant_fn)(DQ), (g4_gemm_fn)(GEMM)}

const g4_kernels g4_kernels_amx = {
    .isa = "amx",
    .quantize_row_q8_0 = g4_quantize_row_q8_0_avx512,
    .quantize_row_q8_K = g4_quantize_row_q8_K_avx512,
    .wt = {
        [G4_WT_F32] = G4_WT(g4_dequant_row_f32_avx512, g4_gemm_f32_f32_avx512),
        [G4_WT_F16] = G4_WT(g4_dequant_row_f16_avx512, g4_gemm_f16_f32_avx512),
        [G4_WT_BF16] = G4_WT(g4_dequant_row_bf16_avx512, g4_gemm_bf16_f32_avx512),
        [G4_WT_Q4_0] = G4_WT(g4_dequant_row_q4_0_avx512, g4_gemm_q4_0_q8_0_avx512),
        [G4_WT_Q5_0] = G4_WT(g4_dequant_row_q5_0_avx512, g4_gemm_q5_0_q8_0_avx512),
        [G4_WT_Q8_0] = G4_WT(g4_dequant_row_q8_0_avx512, g4_gemm_q8_0_q8_0_amx),
        [G4_WT_Q4_K] = G4_WT(g4_dequant_row_q4_K_avx512, g4_gemm_q4_K_q8_K_avx512),
        [G4_WT_Q5_K] = G4_WT(g4_dequant_row_q5_K_avx512, g4_gemm_q5_K_q8_K_avx512),
        [G4_WT_Q6_K] = G4_WT(g4_dequant_row_q6_K_avx512, g4_gemm_q6_K_q8_K_avx512),
    },
};
