/* quant_ref.c: scalar reference for activation quantisation (Q8_K, Q8_0) and row dequantisation
 * of every weight type. The oracle for the SIMD tables: compiled -O2 -ffp-contract=off, no
 * intrinsics. Dequantisation is bit-identical to gguf.quants.dequantize (same float op order).
 * Block layouts: csrc/g4_blocks.h (from ggml's ggml-common.h). */
#include <math.h>

#include "../g4_blocks.h"
#include "../g4_impl.h"

/* Q8_K as ggml's quantize_row_q8_K_ref: iscale = -127/max with max the signed element of largest
 * magnitude (first one on ties), q = min(127, rint(iscale * x)), d = 1/iscale, bsums per 16;
 * a block with amax < G4_Q8K_TINY (and an all-zero one) is all zeros with d = 0. */
void g4_quantize_row_q8_K_ref(const float *x, void *vy, int64_t k) {
    block_q8_K *y = (block_q8_K *)vy;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) { amax = ax; max = xb[j]; }
        }
        if (amax < G4_Q8K_TINY) {
            y[i].d = 0.0f;
            memset(y[i].qs, 0, sizeof(y[i].qs));
            memset(y[i].bsums, 0, sizeof(y[i].bsums));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = (int)rintf(iscale * xb[j]);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}

/* Q8_0 activations: d = amax/127, id = 1/d, q = rint(x * id) (half to even), d stored as f16. */
void g4_quantize_row_q8_0_ref(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = (block_q8_0 *)vy;
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) amax = ax;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = g4_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)rintf(xb[j] * id);
    }
}

void g4_dequant_row_f32_ref(const void *w, float *y, int64_t k) { memcpy(y, w, (size_t)k * 4); }

void g4_dequant_row_f16_ref(const void *w, float *y, int64_t k) {
    const g4_half *h = (const g4_half *)w;
    for (int64_t i = 0; i < k; i++) y[i] = g4_fp16_to_fp32(h[i]);
}

void g4_dequant_row_bf16_ref(const void *w, float *y, int64_t k) {
    const g4_bf16 *h = (const g4_bf16 *)w;
    for (int64_t i = 0; i < k; i++) y[i] = g4_bf16_to_fp32(h[i]);
}

void g4_dequant_row_q4_0_ref(const void *w, float *y, int64_t k) {
    const block_q4_0 *b = (const block_q4_0 *)w;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const float d = g4_fp16_to_fp32(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[i].qs[j] & 0xF) - 8);
            y[j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

void g4_dequant_row_q5_0_ref(const void *w, float *y, int64_t k) {
    const block_q5_0 *b = (const block_q5_0 *)w;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const float d = g4_fp16_to_fp32(b[i].d);
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int lo = (b[i].qs[j] & 0xF) | (int)(((qh >> j) & 1u) << 4);
            const int hi = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
    }
}

void g4_dequant_row_q8_0_ref(const void *w, float *y, int64_t k) {
    const block_q8_0 *b = (const block_q8_0 *)w;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const float d = g4_fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

void g4_dequant_row_q4_K_ref(const void *w, float *y, int64_t k) {
    const block_q4_K *b = (const block_q4_K *)w;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = g4_fp16_to_fp32(b[i].d);
        const float dmin = g4_fp16_to_fp32(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            g4_get_scale_min_k4(j, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((q[l] >> shift) & 0xF) - m1;
        }
    }
}

void g4_dequant_row_q5_K_ref(const void *w, float *y, int64_t k) {
    const block_q5_K *b = (const block_q5_K *)w;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = g4_fp16_to_fp32(b[i].d);
        const float dmin = g4_fp16_to_fp32(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            g4_get_scale_min_k4(j, b[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                const int v = ((q[l] >> shift) & 0xF) | (((b[i].qh[l] >> j) & 1) << 4);
                *y++ = d1 * (float)v - m1;
            }
        }
    }
}

/* Q6_K element e of a block: h = e/128, c = (e%128)/32, l = e%32;
 * low 4 bits: ql[64h + 32(c%2) + l] >> 4(c/2); high 2 bits: qh[32h + l] >> 2c; value - 32. */
static inline int g4_q6_K_value(const block_q6_K *b, int e) {
    const int h = e / 128, c = (e % 128) / 32, l = e % 32;
    const int lo = (b->ql[64 * h + 32 * (c % 2) + l] >> (4 * (c / 2))) & 0xF;
    const int hi = (b->qh[32 * h + l] >> (2 * c)) & 3;
    return (lo | (hi << 4)) - 32;
}

void g4_dequant_row_q6_K_ref(const void *w, float *y, int64_t k) {
    const block_q6_K *b = (const block_q6_K *)w;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = g4_fp16_to_fp32(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            const float ds = d * (float)b[i].scales[e / 16];
            *y++ = ds * (float)g4_q6_K_value(&b[i], e);
        }
    }
}
