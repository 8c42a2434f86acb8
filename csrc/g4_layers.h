/* g4_layers.h: one transformer layer of a dense Gemma 3 / Gemma 4 model for a few tokens, in C.
 *
 * The decode and verify steps (1..16 tokens) run the layer loop here instead of in Python
 * (gemma4cpu/_layers.pxi builds the plan from a loaded model; gemma4cpu.model runs it): the same
 * kernels, norms and order of float operations as Model._forward_chunk's Python loop, so the two
 * give the same bits (tests/test_layer_loop.py). Layers with experts (MoE) or per-layer
 * embeddings are not handled here; a model with such a layer keeps the Python loop.
 */
#ifndef G4_LAYERS_H
#define G4_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "g4_pool.h"

typedef struct {
    int type;                /* ggml type id */
    const void *w;           /* raw rows (n_rows x row_bytes); NULL: the matrix is absent */
    size_t row_bytes;
    int64_t n_rows, k;
    const int64_t *split;    /* NUMA row split over the pool's groups (g4_matmul_split), or NULL */
    const void *const *wg;   /* per-group copies, or NULL */
    int n_split;
} g4_lmat;

typedef struct {
    void *k, *v;             /* cache rows (n_slots x k_slot / v_slot bytes) of a producing layer */
    int32_t *pos;            /* position held by each slot, -1 = empty */
    int64_t n_slots;         /* slots: positions map to slot pos % n_slots */
    int64_t used;            /* slots the attention reads (after this call's append) */
    size_t k_slot, v_slot;
    int n_head_kv, hd;
} g4_lkv;

typedef struct {
    g4_lmat q, k, v, o, gate, up, down; /* k.w NULL: a KV-shared layer (reads cache `src`); v.w NULL: V = raw K */
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffw_norm;
    const float *next_attn_norm; /* used when fuse_next: the next layer's input norm in the same pass */
    int fuse_next;
    int n_head, hd, v_norm;
    int src;                 /* index of the producing layer whose cache this layer reads (and writes if k.w) */
    int32_t window;          /* the reading layer's sliding window, 0 = full */
    float attn_scale, out_scale;
    int rope;                /* which cos / sin table */
} g4_layer;

/* Scratch of one call, each at least n_tok x the width named */
typedef struct {
    float *a;       /* D: attn_norm(x) (carried to the next layer when fused) */
    float *q, *att; /* n_head * hd_max */
    float *kr, *vr, *kn; /* n_head_kv * hd_max */
    float *f, *ao, *mo;  /* D */
    float *g, *u, *h;    /* n_ff */
    int64_t *slots;      /* n_tok */
} g4_lws;

/* The two halves of layer L on n tokens at positions pos[0..n) (int32, consecutive), residual x (n x D)
 * in place; the caller checks for an interrupt between them (each half is a bounded amount of work).
 * attn: x += post_attn_norm(o . attention(q, cache)), ws->f = ffn_norm(x). a_ready: ws->a already holds
 * attn_norm(x) (the previous layer fused it). cos / sin: (n x hd/2). The layer's K / V rows are stored
 * in kv[L->src] at slots pos % n_slots with kv_pos updated; the caller does the bookkeeping (lengths,
 * ring limits, kv[].used) beforehand.
 * ffn: x += post_ffw_norm(down . gelu(gate . f) * (up . f)), then ws->a = the next layer's attn_norm(x)
 * when L->fuse_next, then x *= out_scale.
 * Both return 0, or -1 with msg on a kernel error. */
int g4_layer_attn(g4_pool *pool, const g4_layer *L, const g4_lkv *kv, int k_type, int v_type, float *x, int64_t n,
                  int64_t D, const int32_t *pos, const float *cos, const float *sin, double eps, int a_ready,
                  const g4_lws *ws, char *msg, size_t msg_len);
int g4_layer_ffn(g4_pool *pool, const g4_layer *L, float *x, int64_t n, int64_t D, double eps, const g4_lws *ws,
                 char *msg, size_t msg_len);

#endif
