/* table_avx512.c: the avx512 table (AVX-512 F/BW/VL/DQ + VNNI). Entries still pointing at *_ref
 * functions are fallbacks that g4_slot_is_ref reports and tests/test_dispatch.py allow-lists. */
#include "avx512.h"

const g4_kernels g4_kernels_avx512 = G4_AVX512_FAMILY_TABLE("avx512", g4_gemm_q4_0_q8_0_avx512, g4_gemm_q5_0_q8_0_avx512,
                                                              g4_gemm_q8_0_q8_0_avx512, g4_gemm_q4_K_q8_K_avx512, NULL, NULL);
