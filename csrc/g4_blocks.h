/* g4_blocks.h: GGUF block layouts used by gemma4cpu, plus scalar f16/bf16 conversions.
 *
 * Layouts follow ggml's ggml-common.h (names kept exactly: block_q4_K, QK_K, ...), so that
 * greps line up across llama.cpp and gemma4cpu. Sizes are pinned three ways: the static_asserts
 * below, the numpy dtypes in gemma4cpu/ref/blocks.py, and gguf.GGML_QUANT_SIZES (tests/test_blocks.py).
 * All structs are byte-packed in GGUF files; every member here is naturally aligned for its
 * offset so no packing pragma is needed, except block_q8_K which is only ever produced by us.
 */
#ifndef G4_BLOCKS_H
#define G4_BLOCKS_H

#include <assert.h>
#include <stdint.h>
#include <string.h>

#define QK_K 256
#define QK4_0 32
#define QK5_0 32
#define QK8_0 32
#define K_SCALE_SIZE 12
/* Q8_K activation blocks whose largest |x| is below this (2^-80) quantise to zero (d = 0). Without
 * the rule, -127/max overflows to inf for |max| < ~3.7e-37 (garbage codes), and a block of values
 * near 1e-36 (a tanh-GELU's clamped tail) gets d ~ 1e-38: every d * d8 in the kernels is then
 * subnormal, and the microcode assists made a 31B-shaped down projection 4x slower. Above it,
 * d8 >= 2^-87 and d8 times any f16 scale (>= 2^-24) stays a normal float. */
#define G4_Q8K_TINY 0x1p-80f

typedef uint16_t g4_half; /* IEEE binary16 bits */
typedef uint16_t g4_bf16; /* bfloat16 bits */

typedef struct { g4_half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;                  /* 18 B / 32 */
typedef struct { g4_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;   /* 22 B / 32 */
typedef struct { g4_half d; int8_t qs[QK8_0]; } block_q8_0;                        /* 34 B / 32 */
typedef struct {                                                                   /* 144 B / 256 */
    g4_half d;                    /* super-block scale for the 6-bit sub-block scales */
    g4_half dmin;                 /* super-block scale for the 6-bit sub-block mins */
    uint8_t scales[K_SCALE_SIZE]; /* 8 scales + 8 mins, 6 bits each (see g4_get_scale_min_k4) */
    uint8_t qs[QK_K / 2];         /* 4-bit quants: qs[32g+i] low nibble = elem 64g+i, high = 64g+32+i */
} block_q4_K;
typedef struct {                                                                   /* 176 B / 256 */
    g4_half d;
    g4_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];         /* bit j of qh[i] = 5th bit of elem 32j+i */
    uint8_t qs[QK_K / 2];         /* low 4 bits, same order as q4_K */
} block_q5_K;
typedef struct {                                                                   /* 210 B / 256 */
    uint8_t ql[QK_K / 2];         /* low 4 bits */
    uint8_t qh[QK_K / 4];         /* high 2 bits */
    int8_t scales[QK_K / 16];     /* 8-bit sub-block scales, one per 16 elements */
    g4_half d;
} block_q6_K;
typedef struct {                                                                   /* 292 B / 256: activations only */
    float d;                      /* dequant: x = d * qs */
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];     /* sum of qs over each group of 16 */
} block_q8_K;

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
/* Q4_K repacked 8 rows at a time ("R8", gemma4cpu's own layout, not a GGUF type; G4_TYPE_Q4_K_R8).
 * Rows 8i..8i+7 of a matrix keep their bytes (8 x row_bytes) but hold, per superblock b, one
 * block_q4_K_r8 at offset 1152 b: the 8 rows' d, their dmin, the 12 scale bytes of each row as 3
 * dwords transposed (a[w][row] = bytes 4w..4w+3 of that row's scales), then the codes of each
 * 32-byte group g as 8 vectors of one dword per row (q[g][i][row] = qs[32g+4i..32g+4i+3] of that
 * row). A 32-byte load of q[g][i] holds 4 codes bytes of each of the 8 rows (lane = row), so one
 * token's product needs no horizontal sums. Same bits per row as block_q4_K, only moved. */
typedef struct {
    g4_half d[8];
    g4_half dmin[8];
    uint32_t a[3][8];
    uint32_t q[4][8][8];
} block_q4_K_r8;
static_assert(sizeof(block_q4_K_r8) == 8 * sizeof(block_q4_K), "block_q4_K_r8 size");
/* The layout's one definition, per row `lane` (0..7) of a group's superblock: its d, dmin and scale
 * bytes (head), and its codes. Repacking, unpacking and the reference product all go through these. */
static inline void g4_r8_get_head(const block_q4_K_r8 *s, int lane, block_q4_K *o) {
    o->d = s->d[lane];
    o->dmin = s->dmin[lane];
    for (int w = 0; w < 3; w++) memcpy(o->scales + 4 * w, &s->a[w][lane], 4);
}
static inline void g4_r8_get(const block_q4_K_r8 *s, int lane, block_q4_K *o) {
    g4_r8_get_head(s, lane, o);
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 8; i++) memcpy(o->qs + 32 * g + 4 * i, &s->q[g][i][lane], 4);
}
static inline void g4_r8_put(const block_q4_K *s, int lane, block_q4_K_r8 *o) {
    o->d[lane] = s->d;
    o->dmin[lane] = s->dmin;
    for (int w = 0; w < 3; w++) memcpy(&o->a[w][lane], s->scales + 4 * w, 4);
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 8; i++) memcpy(&o->q[g][i][lane], s->qs + 32 * g + 4 * i, 4);
}

static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

/* Exact binary16 -> binary32 (subnormals, inf and NaN included). */
static inline float g4_fp16_to_fp32(g4_half h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        uint32_t e = 113;
        while ((mant & 0x400u) == 0) { mant <<= 1; e--; }
        bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* binary32 -> binary16, round to nearest even (same as F16C vcvtps2ph imm 0 and numpy astype). */
static inline g4_half g4_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (g4_half)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN, keep quiet */
    if (ax >= 0x477ff000u) return (g4_half)(sign | 0x7c00u);                          /* overflow -> inf */
    if (ax < 0x38800000u) { /* result is subnormal or zero */
        if (ax < 0x33000000u) return (g4_half)sign;                                   /* < half of min subnormal */
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (g4_half)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (g4_half)(sign | r);
}

static inline float g4_bf16_to_fp32(g4_bf16 h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block j (0..7), layout (gguf-py's diagram):
 *  0 EEAAAAAA   4 eeaaaaaa   8 eeeeEEEE      A..D = scales 0..3, a..d = mins 0..3 (low 6 bits)
 *  1 FFBBBBBB   5 ffbbbbbb   9 ffffFFFF      E..H = scales 4..7: low 4 bits in bytes 8..11,
 *  2 GGCCCCCC   6 ggcccccc  10 ggggGGGG                          high 2 bits on top of bytes 0..3
 *  3 HHDDDDDD   7 hhdddddd  11 hhhhHHHH      e..h = mins 4..7 likewise (bytes 8..11 high, 4..7 top) */
static inline void g4_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

#endif
