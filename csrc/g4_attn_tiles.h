/* g4_attn_tiles.h: the loop nest the SIMD flash-attention kernels share (csrc/avx2/attn_avx2.c,
 * csrc/avx512/attn_avx512.c), and the visibility rule of every kernel. Included by those files
 * only; compiled with each one's flags. No intrinsics here. */
#ifndef G4_ATTN_TILES_H
#define G4_ATTN_TILES_H

#include <math.h>
#include <string.h>

#include "g4_attn.h"

/* slot position kp is visible from query position qp (causal, sliding window when window > 0;
 * kp < 0 marks an empty slot) */
static inline int g4_attn_visible(int32_t kp, int32_t qp, int32_t window) {
    return kp >= 0 && kp <= qp && (window == 0 || (int64_t)qp - (int64_t)kp < (int64_t)window);
}

/* What a kernel's block step needs of the kv group it works on. */
typedef struct {
    const g4_attn_args *a;
    const uint8_t *K, *V;
    size_t koff, voff; /* bytes to the group's head row within a slot */
    int64_t nb;        /* 32-element blocks of a head row (hd / 32) */
    size_t hbk, hbv;   /* bytes of one head row of K, V */
} g4_attn_tile_ctx;

/* One block step for nt (row, head) pairs that see the same slots idx[0..nv): q / o point at each
 * pair's query and output rows, m / l at its running max and sum. */
typedef void (*g4_attn_step_fn)(int kt, int vt, int nt, const g4_attn_tile_ctx *c, const float *const *q,
                                float *const *o, float *m, float *l, const int64_t *idx, int nv);

#define G4_ATTN_MAXG 64 /* heads per kv head handled in one pass (more: several passes over the group) */

/* Rows [i0, i1) x heads [h0, h1): rows in tiles of G4_ATTN_ROW_TILE, kv groups, then blocks of
 * `block` slots (<= G4_ATTN_BLOCK); in a block, the (row, head) pairs of runs of consecutive rows
 * that see the same slots go to `step` in tiles of up to `tile` pairs (a causal prefill's rows
 * below the block's diagonal, a verify batch's rows before its last block). A pair's operations
 * do not depend on its tile mates, so the result stays batch-invariant. o = o / l at the end
 * (a pair that saw no slot keeps o = 0). */
static inline void g4_attn_tiles(const g4_attn_args *a, int64_t i0, int64_t i1, int h0, int h1, int block,
                                 int tile, g4_attn_step_fn step) {
    const int hd = a->hd, G = a->n_head / a->n_head_kv;
    const size_t hbk = g4_kv_head_bytes(a->k_type, hd), hbv = g4_kv_head_bytes(a->v_type, hd);
    for (int64_t r0 = i0; r0 < i1; r0 += G4_ATTN_ROW_TILE) {
        const int nr = (int)(i1 - r0 < G4_ATTN_ROW_TILE ? i1 - r0 : G4_ATTN_ROW_TILE);
        for (int g = h0 / G; g * G < h1; g++) {
            const int hs0 = g * G > h0 ? g * G : h0, he0 = (g + 1) * G < h1 ? (g + 1) * G : h1;
            const g4_attn_tile_ctx c = {a, (const uint8_t *)a->k, (const uint8_t *)a->v, (size_t)g * hbk,
                                        (size_t)g * hbv, hd / 32, hbk, hbv};
            for (int hs = hs0; hs < he0; hs += G4_ATTN_MAXG) {
                const int nh = he0 - hs < G4_ATTN_MAXG ? he0 - hs : G4_ATTN_MAXG;
                /* pairs (r, t) in row-major order: pair r * nh + t */
                float m[G4_ATTN_ROW_TILE * G4_ATTN_MAXG], l[G4_ATTN_ROW_TILE * G4_ATTN_MAXG];
                const float *qp[G4_ATTN_ROW_TILE * G4_ATTN_MAXG];
                float *op[G4_ATTN_ROW_TILE * G4_ATTN_MAXG];
                for (int r = 0; r < nr; r++)
                    for (int t = 0; t < nh; t++) {
                        const int u = r * nh + t;
                        m[u] = -INFINITY;
                        l[u] = 0.0f;
                        qp[u] = a->q + (r0 + r) * a->q_stride + (int64_t)(hs + t) * hd;
                        op[u] = a->out + (r0 + r) * a->out_stride + (int64_t)(hs + t) * hd;
                        memset(op[u], 0, (size_t)hd * sizeof(float));
                    }
                for (int64_t s0 = 0; s0 < a->n_slots; s0 += block) {
                    const int64_t s1 = s0 + block < a->n_slots ? s0 + block : a->n_slots;
                    int64_t idx[G4_ATTN_ROW_TILE][G4_ATTN_BLOCK];
                    int nv[G4_ATTN_ROW_TILE];
                    for (int r = 0; r < nr; r++) {
                        const int32_t qpos = a->q_pos[r0 + r];
                        nv[r] = 0;
                        for (int64_t s = s0; s < s1; s++)
                            if (g4_attn_visible(a->kv_pos[s], qpos, a->window)) idx[r][nv[r]++] = s;
                    }
                    /* runs of consecutive rows with the same visible slots share tiles */
                    for (int r = 0; r < nr;) {
                        int re = r + 1;
                        while (re < nr && nv[re] == nv[r] && !memcmp(idx[re], idx[r], (size_t)nv[r] * sizeof(int64_t))) re++;
                        if (nv[r])
                            for (int u = r * nh; u < re * nh; u += tile) {
                                const int nt = re * nh - u < tile ? re * nh - u : tile;
                                step(a->k_type, a->v_type, nt, &c, qp + u, op + u, m + u, l + u, idx[r], nv[r]);
                            }
                        r = re;
                    }
                }
                for (int u = 0; u < nr * nh; u++) {
                    if (!(l[u] > 0.0f)) continue;
                    for (int d = 0; d < hd; d++) op[u][d] /= l[u]; /* correctly rounded: any width */
                }
            }
        }
    }
}

#endif
