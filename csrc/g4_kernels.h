/* g4_kernels.h: the C API that Cython sees. One table of kernels per ISA, chosen at run time.
 *
 * Argument conventions (every kernel):
 *   w            quantised weights: n_rows rows of `w_row_bytes` bytes, raw GGUF block layout
 *   x            activations for n_tok tokens, `x_row_bytes` apart: block_q8_K rows for K-quants,
 *                block_q8_0 rows for the 32-blocks (Q8_0, Q5_0, Q4_0), float rows for F32/F16/BF16
 *   y            output, y[t * ldy + r] for token t and weight row r (token-major, like activations)
 *   k            reduction length in elements (multiple of the type's block size; 16 for float types)
 *   [r0, r1)     the weight rows this call computes; nothing outside y[t*ldy + r0 .. r1) is written
 *   n_tok        tokens in this product (1 = GEMV, 2..16 = verify batch, more = prefill)
 * Kernels never allocate, hold no state and are thread safe for disjoint row ranges.
 *
 * Semantics shared by every ISA (so every table gives bit-identical results, and a batch row
 * equals the single-token result bit for bit):
 *   - quantised products: per block, an exact integer dot product (with the sub-block scales and
 *     mins folded in as integers), then per block, in block order:
 *        Q8_0/Q5_0/Q4_0: acc = acc + (float)isum * (d_w * d_x)            (d_w * d_x is exact)
 *        Q4_K/Q5_K:      acc = acc + ((d_w*d_x) * (float)S - (dmin_w*d_x) * (float)M)
 *        Q6_K:           acc = acc + (d_w*d_x) * (float)S
 *     with acc starting at +0.0f; no FMA contraction anywhere.
 *   - float products: 16 lanes, lane l sums w[i]*x[i] for i % 16 == l in order (mul then add),
 *     then lanes fold as l[i] += l[i+s] for s = 8, 4, 2, 1; the result is l[0].
 *   - activation quantisation: Q8_K as ggml (iscale = -127/max, signed max), Q8_0 with
 *     d = amax/127, q = round-half-even(x * (1/d)); both round half to even.
 */
#ifndef G4_KERNELS_H
#define G4_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { G4_ISA_REF = 0, G4_ISA_AVX2 = 1, G4_ISA_AVX512 = 2, G4_ISA_AMX = 3, G4_ISA_COUNT = 4 } g4_isa;

/* Weight types we compute with, numbered as in ggml (GGMLQuantizationType). */
typedef enum {
    G4_TYPE_F32 = 0,
    G4_TYPE_F16 = 1,
    G4_TYPE_Q4_0 = 2,
    G4_TYPE_Q5_0 = 6,
    G4_TYPE_Q8_0 = 8,
    G4_TYPE_Q4_K = 12,
    G4_TYPE_Q5_K = 13,
    G4_TYPE_Q6_K = 14,
    G4_TYPE_BF16 = 30,
    /* gemma4cpu's own: Q4_K repacked 8 rows at a time (block_q4_K_r8 in g4_blocks.h); not a GGUF
     * type. Same traits as Q4_K (g4_wt_index gives G4_WT_Q4_K) but its rows are only meaningful
     * in groups of 8: n_rows, row ranges and row splits must be multiples of 8, and row_bytes
     * exactly k/256 * 144. g4_type_gemm picks its product. */
    G4_TYPE_Q4_K_R8 = 1012,
} g4_type;

/* Compact index of a weight type in the table (G4_WT_*), -1 if unsupported. */
enum { G4_WT_F32, G4_WT_F16, G4_WT_BF16, G4_WT_Q4_0, G4_WT_Q5_0, G4_WT_Q8_0,
       G4_WT_Q4_K, G4_WT_Q5_K, G4_WT_Q6_K, G4_WT_COUNT };

/* How activations are presented to a weight type's product. */
typedef enum { G4_ACT_F32 = 0, G4_ACT_Q8_0 = 1, G4_ACT_Q8_K = 2 } g4_act;

typedef void (*g4_dequant_fn)(const void *w, float *y, int64_t k);
typedef void (*g4_quant_fn)(const float *x, void *y, int64_t k);
typedef void (*g4_gemm_fn)(const void *w, size_t w_row_bytes, const void *x, size_t x_row_bytes,
                           float *y, int64_t ldy, int64_t n_tok, int64_t k, int64_t r0, int64_t r1);

typedef struct {
    g4_dequant_fn dequant_row; /* one row of k elements -> float, bit-identical to gguf.quants */
    g4_gemm_fn gemm;           /* product over n_tok tokens for rows [r0, r1) */
    /* optional (NULL: none): the same product for any n_tok, used by the pool's prefill path on one
     * L2 row chunk instead of one gemm call per 16-token tile; must give gemm's bits */
    g4_gemm_fn gemm_wide;
} g4_wt_kernels;

typedef struct g4_kernels {
    const char *isa;                    /* "ref", "avx2", "avx512", "amx" */
    g4_quant_fn quantize_row_q8_0;      /* k % 32 == 0 */
    g4_quant_fn quantize_row_q8_K;      /* k % 256 == 0 */
    g4_wt_kernels wt[G4_WT_COUNT];
    g4_gemm_fn gemm_q4_K_r8;            /* G4_TYPE_Q4_K_R8, rows [r0, r1) multiples of 8 */
} g4_kernels;

/* --- type traits ---------------------------------------------------------------------- */
int g4_wt_index(int ggml_type);            /* G4_WT_* or -1 */
int g4_type_block_size(int ggml_type);     /* elements per block, 0 if unsupported */
int g4_type_block_bytes(int ggml_type);    /* bytes per block, 0 if unsupported */
g4_act g4_type_act(int ggml_type);         /* activation format for products */
size_t g4_act_row_bytes(g4_act act, int64_t k);
/* k granularity for products: the block size, or 16 for float weights */
int g4_type_k_multiple(int ggml_type);
/* rows granularity: 8 for G4_TYPE_Q4_K_R8, else 1 */
int g4_type_row_multiple(int ggml_type);
/* The product of table k for this type (Q4_K_R8 included); NULL if unsupported. */
g4_gemm_fn g4_type_gemm(const struct g4_kernels *k, int ggml_type);
/* Q4_K rows <-> Q4_K_R8 groups: n_rows (a multiple of 8) rows of k elements, row_bytes =
 * k/256*144 apart in both. src == dst is allowed (in place: one group at a time through a
 * 8-row buffer on the heap). Return 0, or -1 on bad arguments / no memory for that buffer. */
int g4_repack_q4_K_r8(const void *src, void *dst, int64_t n_rows, int64_t k);
int g4_unpack_q4_K_r8(const void *src, void *dst, int64_t n_rows, int64_t k);

/* --- dispatch ----------------------------------------------------------------------- */
/* 1 if this CPU and OS can run the table compiled for `isa` (CPUID + XGETBV). */
int g4_isa_supported(g4_isa isa);
/* NULL when the CPU or OS lacks the ISA. */
const g4_kernels *g4_kernels_for(g4_isa isa);
/* The table for name ("ref", "avx2", "avx512", "auto"); NULL for unknown/unsupported names. */
const g4_kernels *g4_kernels_select(const char *name);
/* The table every pool operation uses; set by g4_set_active (default: best supported). */
const g4_kernels *g4_active(void);
void g4_set_active(const g4_kernels *k);
/* 1 if entry `slot` of `k` points at the scalar reference implementation (a visible fallback).
 * slot: 0 = quantize_row_q8_0, 1 = quantize_row_q8_K, 2 + 2*wt = dequant_row, 3 + 2*wt = gemm,
 * 2 + 2*G4_WT_COUNT = gemm_q4_K_r8. */
int g4_slot_count(void);
const char *g4_slot_name(int slot);
int g4_slot_is_ref(const g4_kernels *k, int slot);
/* CPU feature bits detected once per process (CPUID + the OS's XGETBV state), for dispatch and reports */
enum {
    G4_F_AVX2 = 1u << 0, G4_F_FMA = 1u << 1, G4_F_F16C = 1u << 2, G4_F_AVX512F = 1u << 3, G4_F_AVX512BW = 1u << 4,
    G4_F_AVX512VL = 1u << 5, G4_F_AVX512DQ = 1u << 6, G4_F_AVX512VNNI = 1u << 7, G4_F_AVX512BF16 = 1u << 8,
    G4_F_AMX_INT8 = 1u << 9, G4_F_BMI2 = 1u << 10, G4_F_AVX512VBMI = 1u << 11,
};
uint32_t g4_cpu_features(void);
const char *g4_cpu_feature_name(int bit); /* NULL past the last bit */

/* --- whole-operation entry points (release the GIL around these) --------------------- */
struct g4_pool;
/* y[t, r0:r1] = W[r0:r1] . x[t] for t < n_tok, x float (n_tok, k) with row stride ldx (floats).
 * Quantises the activations with the active table into the pool's scratch, then splits the rows
 * statically over the pool's workers. Returns 0, or -1 with msg filled (bad arguments / OOM). */
int g4_matmul(struct g4_pool *pool, int ggml_type, const void *w, size_t w_row_bytes, int64_t n_rows,
              const float *x, int64_t ldx, int64_t n_tok, int64_t k, float *y, int64_t ldy,
              int64_t r0, int64_t r1, char *msg, size_t msg_len);
/* The same with rows placed per worker group (g4_pool_set_groups; NUMA distribute / mirror):
 * group g computes rows [split[g], split[g+1]) of [r0, r1) over its own workers, reading W from
 * w_group[g] (a copy of all n_rows rows; NULL: every group reads w). split has n_split + 1
 * bounds from 0 to n_rows, n_split = the pool's group count; split NULL = g4_matmul. A row's
 * result never depends on which worker computes it, so any split gives the same bits. */
int g4_matmul_split(struct g4_pool *pool, int ggml_type, const void *w, size_t w_row_bytes, int64_t n_rows,
                    const float *x, int64_t ldx, int64_t n_tok, int64_t k, float *y, int64_t ldy,
                    int64_t r0, int64_t r1, const int64_t *split, int n_split, const void *const *w_group,
                    char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif
