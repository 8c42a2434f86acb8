/* table_amx.c: the amx table = the avx512 table with AMX-INT8 tile products for Q8_0, Q4_0, Q5_0 and
 * Q4_K weights (csrc/amx/gemm_amx.c, gemm_q4k_amx.c), and wide (prefill) entries for Q4_0 / Q5_0.
 * Selected when the CPU has AMX-INT8 and AVX-512 VBMI and the kernel grants this process the tile state
 * (arch_prctl ARCH_REQ_XCOMP_PERM, g4_dispatch.c). */
#include "amx.h"

const g4_kernels g4_kernels_amx =
    G4_AVX512_FAMILY_TABLE("amx", g4_gemm_q4_0_q8_0_amx, g4_gemm_q5_0_q8_0_amx, g4_gemm_q8_0_q8_0_amx,
                           g4_gemm_q4_K_q8_K_amx, g4_gemm_wide_q4_0_q8_0_amx, g4_gemm_wide_q5_0_q8_0_amx);
