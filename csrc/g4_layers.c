/* g4_layers.c: the dense layer of Model._forward_chunk in C (see g4_layers.h). Every step below is
 * the same C function the Python loop reaches through its wrapper, called with the same arguments
 * in the same order, so the bits match; what goes away is the Python between the calls (~15 calls
 * a layer, ~9-11 % of a 270M decode step with 2 threads). */
#include "g4_layers.h"

#include <stdio.h>

#include "g4_attn.h"
#include "g4_kernels.h"
#include "g4_ops.h"

static int mm(g4_pool *pool, const g4_lmat *m, const float *x, int64_t n, float *y, char *msg, size_t msg_len) {
    return g4_matmul_split(pool, m->type, m->w, m->row_bytes, m->n_rows, x, m->k, n, m->k, y, m->n_rows, 0,
                           m->n_rows, m->split, m->n_split, m->wg, msg, msg_len);
}

#define STEP(expr)                                                                                    \
    do {                                                                                              \
        if ((expr) != 0) return -1;                                                                   \
    } while (0)

int g4_layer_attn(g4_pool *pool, const g4_layer *L, const g4_lkv *kv, int k_type, int v_type, float *x, int64_t n,
                  int64_t D, const int32_t *pos, const float *cos, const float *sin, double eps, int a_ready,
                  const g4_lws *ws, char *msg, size_t msg_len) {
    const int hd = L->hd, hq = L->n_head;
    const g4_lkv *c = &kv[L->src];
    if (!a_ready) g4_rmsnorm_rows(x, L->attn_norm, eps, ws->a, n, D);
    STEP(mm(pool, &L->q, ws->a, n, ws->q, msg, msg_len));
    g4_norm_rope(ws->q, L->q_norm, eps, cos, sin, hq, n * hq, hd, ws->q);
    if (L->k.w) {
        const int hkv = c->n_head_kv;
        STEP(mm(pool, &L->k, ws->a, n, ws->kr, msg, msg_len));
        const float *vr = ws->kr; /* K = V layers: V is the raw K projection */
        if (L->v.w) {
            STEP(mm(pool, &L->v, ws->a, n, ws->vr, msg, msg_len));
            vr = ws->vr;
        }
        g4_norm_rope(ws->kr, L->k_norm, eps, cos, sin, hkv, n * hkv, hd, ws->kn);
        if (L->v_norm) {
            g4_rmsnorm_rows(vr, NULL, eps, ws->vr, n * hkv, hd);
            vr = ws->vr;
        }
        for (int64_t i = 0; i < n; i++) ws->slots[i] = pos[i] % c->n_slots;
        if (g4_kv_store(k_type, ws->kn, n, hkv, hd, c->k, c->k_slot, ws->slots) != 0 ||
            g4_kv_store(v_type, vr, n, hkv, hd, c->v, c->v_slot, ws->slots) != 0) {
            snprintf(msg, msg_len, "cache store failed (kv types %d / %d, %d heads of %d)", k_type, v_type, hkv, hd);
            return -1;
        }
        for (int64_t i = 0; i < n; i++) c->pos[ws->slots[i]] = pos[i];
    }
    g4_attn_args a;
    a.q = ws->q;
    a.q_stride = (int64_t)hq * hd;
    a.q_pos = pos;
    a.n_q = n;
    a.k = c->used ? c->k : NULL;
    a.v = c->used ? c->v : NULL;
    a.k_slot_bytes = c->k_slot;
    a.v_slot_bytes = c->v_slot;
    a.kv_pos = c->used ? c->pos : NULL;
    a.n_slots = c->used;
    a.k_type = k_type;
    a.v_type = v_type;
    a.n_head = hq;
    a.n_head_kv = c->n_head_kv;
    a.hd = c->hd;
    a.window = L->window;
    a.scale = L->attn_scale;
    a.softcap = 0.0f;
    a.out = ws->att;
    a.out_stride = (int64_t)hq * hd;
    STEP(g4_flash_attn(pool, &a, msg, msg_len));
    STEP(mm(pool, &L->o, ws->att, n, ws->ao, msg, msg_len));
    g4_add_rmsnorm(x, ws->ao, L->post_attn_norm, eps, L->ffn_norm, ws->f, n, D);
    return 0;
}

int g4_layer_ffn(g4_pool *pool, const g4_layer *L, float *x, int64_t n, int64_t D, double eps, const g4_lws *ws,
                 char *msg, size_t msg_len) {
    const int64_t ff = L->gate.n_rows;
    STEP(mm(pool, &L->gate, ws->f, n, ws->g, msg, msg_len));
    STEP(mm(pool, &L->up, ws->f, n, ws->u, msg, msg_len));
    g4_gelu_mul(pool, ws->g, ff, ws->u, ff, ws->h, ff, n, ff);
    STEP(mm(pool, &L->down, ws->h, n, ws->mo, msg, msg_len));
    g4_add_rmsnorm(x, ws->mo, L->post_ffw_norm, eps, L->fuse_next ? L->next_attn_norm : NULL,
                   L->fuse_next ? ws->a : NULL, n, D);
    if (L->out_scale != 1.0f)
        for (int64_t i = 0; i < n * D; i++) x[i] = x[i] * L->out_scale;
    return 0;
}
