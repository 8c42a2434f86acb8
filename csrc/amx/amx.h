/* amx.h: helpers of the amx table (the avx512 table plus AMX-INT8 tile products).
 *
 * Tile instructions are issued through inline asm with a "memory" clobber, never through the
 * compiler's _tile_* intrinsics: GCC 12's intrinsics do not tell the optimiser that ldtilecfg /
 * tileloadd read memory and tilestored writes it, so stores to a tile config or to a staging
 * buffer can be dropped or moved past the tile instruction (the llama.cpp AMX crash on this
 * toolchain: a tile config whose fields never reached memory). With the clobber every C store
 * before a tile load is in memory, and every C load after a tile store sees its bytes. */
#ifndef G4_AMX_H
#define G4_AMX_H

#include "../avx512/avx512.h"

G4_DECLARE_ISA(amx)
void g4_gemm_wide_q4_0_q8_0_amx(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t,
                                int64_t, int64_t);
void g4_gemm_wide_q5_0_q8_0_amx(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t,
                                int64_t, int64_t);

typedef struct {
    uint8_t palette;   /* 1 */
    uint8_t start_row; /* 0 */
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile i */
    uint8_t rows[16];   /* rows of tile i */
} __attribute__((aligned(64))) g4_tilecfg;

_Static_assert(sizeof(g4_tilecfg) == 64, "tile config is 64 bytes");

G4_AI void g4t_config(const g4_tilecfg *c) { __asm__ volatile("ldtilecfg (%0)" ::"r"(c) : "memory"); }
G4_AI void g4t_release(void) { __asm__ volatile("tilerelease" ::: "memory"); }

#define G4T_LOAD(T, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #T ::"r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define G4T_STORE(T, base, stride) \
    __asm__ volatile("tilestored %%tmm" #T ", (%0,%1,1)" ::"r"((void *)(base)), "r"((long)(stride)) : "memory")
#define G4T_ZERO(T) __asm__ volatile("tilezero %%tmm" #T ::)
/* C += A . B with A unsigned bytes, B signed bytes (Intel operand order: tdpbusd C, A, B) */
#define G4T_DPBUSD(C, A, B) __asm__ volatile("tdpbusd %%tmm" #B ", %%tmm" #A ", %%tmm" #C ::)
/* C += A . B, both signed bytes */
#define G4T_DPBSSD(C, A, B) __asm__ volatile("tdpbssd %%tmm" #B ", %%tmm" #A ", %%tmm" #C ::)

#endif
