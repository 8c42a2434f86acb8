/* g4_attn.h: flash attention over a KV cache, one call per layer (all heads, all query rows).
 *
 *   q       float32, n_q rows of n_head * hd, `q_stride` floats between rows (head h at h * hd)
 *   q_pos   int32[n_q], absolute position of each query row
 *   k, v    the cache: n_slots slots, each n_head_kv heads of hd values, K in `k_type` and V in
 *           `v_type` (G4_KV_F32, G4_KV_F16, G4_KV_Q8_0, G4_KV_Q4_0 - the quantised ones as 32-blocks
 *           along hd, GGUF block layouts), `k_slot_bytes` / `v_slot_bytes` bytes between slots
 *   kv_pos  int32[n_slots], the absolute position held by each slot, -1 for an empty slot
 *           (a ring buffer's slots are in any order: masking is by position, never by slot index)
 *   mask    slot s is visible to query row i iff kv_pos[s] >= 0 and kv_pos[s] <= q_pos[i] and
 *           (window == 0 or q_pos[i] - kv_pos[s] < window)
 *   GQA     query head h reads kv head h / (n_head / n_head_kv)
 *   scale   applied to q.k before the softmax; softcap: if > 0, s = softcap * tanh(s / softcap)
 *   out     float32, n_q rows of n_head * hd, `out_stride` floats between rows
 * Online softmax over blocks of slots with float32 accumulation; a row that sees no slot gets 0.
 * [i0, i1) x [h0, h1): the query rows and heads this call computes (threads split these).
 */
#ifndef G4_ATTN_H
#define G4_ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { G4_KV_F32 = 0, G4_KV_F16 = 1, G4_KV_Q8_0 = 8, G4_KV_Q4_0 = 2 } g4_kv_type;

typedef struct {
    const float *q;
    int64_t q_stride;
    const int32_t *q_pos;
    int64_t n_q;
    const void *k;
    const void *v;
    size_t k_slot_bytes, v_slot_bytes;
    const int32_t *kv_pos;
    int64_t n_slots;
    int k_type, v_type;
    int n_head, n_head_kv, hd;
    int32_t window;
    float scale, softcap;
    float *out;
    int64_t out_stride;
} g4_attn_args;

typedef void (*g4_attn_fn)(const g4_attn_args *a, int64_t i0, int64_t i1, int h0, int h1);

typedef struct {
    const char *isa;
    g4_attn_fn flash_attn;
    int block; /* slots per block of this kernel (<= G4_ATTN_BLOCK): part of its operation sequence */
} g4_attn_kernels;

extern const g4_attn_kernels g4_attn_ref;
extern const g4_attn_kernels g4_attn_avx2;
extern const g4_attn_kernels g4_attn_avx512;

/* Slots are visited in blocks of a table's `block` slots (fixed boundaries s0 = 0, block,
 * 2 block, ...; ref and avx512 64 = G4_ATTN_BLOCK, the largest; avx2 32, so that a block's K and V
 * rows of a 256-dim f16 head fit the 32 KiB L1D of the AVX2 cores it was measured on); the
 * online-softmax rescale happens once per block that holds a visible slot. Every (row, head)
 * runs the same operation sequence whatever n_q, [i0, i1), [h0, h1) or the thread split, so a
 * row's output never depends on the other rows of the call (bit for bit, within one ISA).
 * Query heads that share a kv head are processed together, in tiles of (row, head) pairs across
 * the rows that see the same slots of a block (up to G4_ATTN_HEAD_TILE pairs in avx2, 8 in avx512)
 * so each K/V row is read once per tile; up to G4_ATTN_ROW_TILE rows sweep each block together. */
#define G4_ATTN_BLOCK 64
#define G4_ATTN_HEAD_TILE 4
#define G4_ATTN_ROW_TILE 8

/* Bytes of one head row (hd values) of a cache type, 0 if hd is not a positive multiple of 32. */
size_t g4_kv_head_bytes(int kv_type, int hd);
/* The attention table for an ISA name ("ref", "avx2", "avx512"); unknown names get ref.
 * g4_flash_attn uses g4_attn_for(g4_active()->isa). */
const g4_attn_kernels *g4_attn_for(const char *isa);
/* q4_0 cache quantiser (csrc/ref/attn_ref.c): per 32-block, max = the element of largest
 * magnitude (first on ties), d = max / -8, q = clamp(rint(x * (1/d)) + 8, 0, 15), d stored f16
 * (ggml's layout and scale; half-to-even rounding as everywhere in gemma4cpu). */
void g4_kv_quantize_row_q4_0_ref(const float *x, void *y, int64_t k);

/* Bytes of one slot's heads (k or v) for a cache type, 0 if hd is not valid for it. */
size_t g4_kv_slot_bytes(int kv_type, int n_head_kv, int hd);
/* Store n rows of (n_head_kv * hd) floats into cache slots (quantising as the type requires). */
int g4_kv_store(int kv_type, const float *x, int64_t n, int n_head_kv, int hd, void *cache,
                size_t slot_bytes, const int64_t *slots);
struct g4_pool;
/* Whole-layer attention over the pool with the active ISA's kernel; 0 or -1 with msg. */
int g4_flash_attn(struct g4_pool *pool, const g4_attn_args *a, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif
