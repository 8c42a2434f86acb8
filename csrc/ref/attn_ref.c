/* attn_ref.c: scalar reference flash attention (the oracle of the avx2/avx512 versions) and the
 * q4_0 cache quantiser. Compiled -O2 -ffp-contract=off, no intrinsics. Contract: csrc/g4_attn.h.
 *
 * Per (query row i, head h), with G = n_head / n_head_kv and kv head g = h / G:
 *   m = -inf, l = 0, o[0:hd] = 0
 *   for each block of G4_ATTN_BLOCK slots (fixed boundaries), over its visible slots j (in slot order):
 *     s_j   = scale * (q . k_j)            (q . k summed in element order, float32)
 *     s_j   = softcap * tanh(s_j / softcap) if softcap > 0
 *     m'    = max(m, max_j s_j);  alpha = m == -inf ? 0 : exp(m - m')
 *     p_j   = exp(s_j - m');      l = l * alpha + sum_j p_j   (summed in slot order)
 *     o[d]  = o[d] * alpha, then o[d] += p_j * v_j[d] for each j in slot order
 *   o /= l   (a row that sees no slot keeps o = 0)
 */
#include <math.h>

#include "../g4_attn_tiles.h"
#include "../g4_blocks.h"

/* 32 values of block `b` of a head row, as float (exact: d * q fits in float32). */
static void dequant32(int type, const uint8_t *row, int64_t b, float *y) {
    switch (type) {
    case G4_KV_F32:
        memcpy(y, (const float *)row + 32 * b, 32 * sizeof(float));
        break;
    case G4_KV_F16: {
        const g4_half *h = (const g4_half *)row + 32 * b;
        for (int j = 0; j < 32; j++) y[j] = g4_fp16_to_fp32(h[j]);
        break;
    }
    case G4_KV_Q8_0: {
        const block_q8_0 *blk = (const block_q8_0 *)row + b;
        const float d = g4_fp16_to_fp32(blk->d);
        for (int j = 0; j < 32; j++) y[j] = d * (float)blk->qs[j];
        break;
    }
    default: { /* G4_KV_Q4_0: low nibble of qs[j] = element j, high nibble = element j + 16 */
        const block_q4_0 *blk = (const block_q4_0 *)row + b;
        const float d = g4_fp16_to_fp32(blk->d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((blk->qs[j] & 0xF) - 8);
            y[j + 16] = d * (float)((blk->qs[j] >> 4) - 8);
        }
        break;
    }
    }
}

static void flash_attn_ref(const g4_attn_args *a, int64_t i0, int64_t i1, int h0, int h1) {
    const int hd = a->hd, G = a->n_head / a->n_head_kv;
    const int64_t nb = hd / 32;
    const size_t hbk = g4_kv_head_bytes(a->k_type, hd), hbv = g4_kv_head_bytes(a->v_type, hd);
    const uint8_t *K = (const uint8_t *)a->k, *V = (const uint8_t *)a->v;
    float buf[32];
    for (int64_t i = i0; i < i1; i++) {
        const int32_t qp = a->q_pos[i];
        for (int h = h0; h < h1; h++) {
            const float *q = a->q + i * a->q_stride + (int64_t)h * hd;
            float *o = a->out + i * a->out_stride + (int64_t)h * hd;
            const size_t koff = (size_t)(h / G) * hbk, voff = (size_t)(h / G) * hbv;
            float m = -INFINITY, l = 0.0f;
            for (int d = 0; d < hd; d++) o[d] = 0.0f;
            for (int64_t s0 = 0; s0 < a->n_slots; s0 += G4_ATTN_BLOCK) {
                const int64_t s1 = s0 + G4_ATTN_BLOCK < a->n_slots ? s0 + G4_ATTN_BLOCK : a->n_slots;
                int64_t idx[G4_ATTN_BLOCK];
                float p[G4_ATTN_BLOCK];
                int nv = 0;
                for (int64_t s = s0; s < s1; s++)
                    if (g4_attn_visible(a->kv_pos[s], qp, a->window)) idx[nv++] = s;
                if (!nv) continue;
                float mb = -INFINITY;
                for (int j = 0; j < nv; j++) {
                    const uint8_t *kr = K + (size_t)idx[j] * a->k_slot_bytes + koff;
                    float acc = 0.0f;
                    for (int64_t b = 0; b < nb; b++) {
                        dequant32(a->k_type, kr, b, buf);
                        for (int e = 0; e < 32; e++) acc += q[32 * b + e] * buf[e];
                    }
                    float sc = acc * a->scale;
                    if (a->softcap > 0.0f) sc = a->softcap * tanhf(sc / a->softcap);
                    p[j] = sc;
                    if (sc > mb) mb = sc;
                }
                const float mn = m > mb ? m : mb;
                const float alpha = m == -INFINITY ? 0.0f : expf(m - mn);
                float sum = 0.0f;
                for (int j = 0; j < nv; j++) {
                    p[j] = expf(p[j] - mn);
                    sum += p[j];
                }
                l = l * alpha + sum;
                m = mn;
                for (int d = 0; d < hd; d++) o[d] = o[d] * alpha;
                for (int j = 0; j < nv; j++) {
                    const uint8_t *vr = V + (size_t)idx[j] * a->v_slot_bytes + voff;
                    for (int64_t b = 0; b < nb; b++) {
                        dequant32(a->v_type, vr, b, buf);
                        for (int e = 0; e < 32; e++) o[32 * b + e] = o[32 * b + e] + p[j] * buf[e];
                    }
                }
            }
            if (l > 0.0f)
                for (int d = 0; d < hd; d++) o[d] = o[d] / l;
        }
    }
}

void g4_kv_quantize_row_q4_0_ref(const float *x, void *vy, int64_t k) {
    block_q4_0 *y = (block_q4_0 *)vy;
    for (int64_t i = 0; i < k / 32; i++) {
        const float *xb = x + 32 * i;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) { amax = ax; max = xb[j]; }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = g4_fp32_to_fp16(d);
        uint8_t q[32];
        for (int j = 0; j < 32; j++) {
            int v = (int)rintf(xb[j] * id) + 8;
            q[j] = (uint8_t)(v < 0 ? 0 : v > 15 ? 15 : v);
        }
        for (int j = 0; j < 16; j++) y[i].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

const g4_attn_kernels g4_attn_ref = {.isa = "ref", .flash_attn = flash_attn_ref, .block = G4_ATTN_BLOCK};
