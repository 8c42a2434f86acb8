/* noarch_tables.c: on non-x86 hosts the SIMD tables exist only as names; dispatch never
 * selects them (g4_isa_supported returns 0), so they simply alias the reference kernels. */
#include "g4_impl.h"
const g4_kernels g4_kernels_avx2 = {.isa = "avx2"};
const g4_kernels g4_kernels_avx512 = {.isa = "avx512"};
const g4_kernels g4_kernels_amx = {.isa = "amx"};
