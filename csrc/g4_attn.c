/* g4_attn.c: KV-cache storage helpers and the whole-layer flash-attention entry over the pool.
 * Compiled with baseline flags (no float arithmetic here beyond f16 conversion); the kernels live
 * in csrc/{ref,avx2,avx512}/attn_*.c and are chosen by the active kernel table's ISA name (amx:
 * avx512's), so
 * gemma4cpu.isa.use(name) switches attention together with the products. */
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "g4_attn.h"
#include "g4_blocks.h"
#include "g4_kernels.h"
#include "g4_impl.h"
#include "g4_pool.h"

size_t g4_kv_head_bytes(int kv_type, int hd) {
    if (hd <= 0 || hd % 32) return 0;
    switch (kv_type) {
    case G4_KV_F32: return (size_t)hd * 4;
    case G4_KV_F16: return (size_t)hd * 2;
    case G4_KV_Q8_0: return (size_t)(hd / 32) * sizeof(block_q8_0);
    case G4_KV_Q4_0: return (size_t)(hd / 32) * sizeof(block_q4_0);
    default: return 0;
    }
}

size_t g4_kv_slot_bytes(int kv_type, int n_head_kv, int hd) {
    if (n_head_kv <= 0) return 0;
    return (size_t)n_head_kv * g4_kv_head_bytes(kv_type, hd);
}

/* f32 -> f16 rows for the cache. With F16C (every AVX2 CPU) 8 at a time by vcvtps2ph, round to
 * nearest even: the same bits as g4_fp32_to_fp16 for every input (overflow to inf from 65520,
 * subnormals rounded, NaN quieted with its payload truncated), ~50x faster (a 270M pp512 spent
 * 40 ms of 1.15 s in the scalar loop). */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) static void kv_f16_row_f16c(const float *src, g4_half *h, int64_t k) {
    int64_t e = 0;
    for (; e + 8 <= k; e += 8)
        _mm_storeu_si128((__m128i *)(h + e), _mm256_cvtps_ph(_mm256_loadu_ps(src + e), _MM_FROUND_TO_NEAREST_INT));
    for (; e < k; e++) h[e] = g4_fp32_to_fp16(src[e]);
}
#endif

static void kv_f16_row(const float *src, g4_half *h, int64_t k) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (g4_cpu_features() & G4_F_F16C) {
        kv_f16_row_f16c(src, h, k);
        return;
    }
#endif
    for (int64_t e = 0; e < k; e++) h[e] = g4_fp32_to_fp16(src[e]);
}

int g4_kv_store(int kv_type, const float *x, int64_t n, int n_head_kv, int hd, void *cache, size_t slot_bytes,
                const int64_t *slots) {
    const size_t need = g4_kv_slot_bytes(kv_type, n_head_kv, hd);
    if (!need || slot_bytes < need || n < 0) return -1;
    const int64_t k = (int64_t)n_head_kv * hd;
    for (int64_t r = 0; r < n; r++) {
        const float *src = x + r * k;
        uint8_t *dst = (uint8_t *)cache + (size_t)slots[r] * slot_bytes;
        switch (kv_type) {
        case G4_KV_F32: memcpy(dst, src, (size_t)k * sizeof(float)); break;
        case G4_KV_F16: kv_f16_row(src, (g4_half *)dst, k); break;
        case G4_KV_Q8_0: g4_quantize_row_q8_0_ref(src, dst, k); break;
        default: g4_kv_quantize_row_q4_0_ref(src, dst, k); break;
        }
    }
    return 0;
}

const g4_attn_kernels *g4_attn_for(const char *isa) {
#if defined(__x86_64__) || defined(__i386__)
    /* the amx table's attention is the avx512 one (no tile code in attention) */
    if (isa && (!strcmp(isa, "avx512") || !strcmp(isa, "amx"))) return &g4_attn_avx512;
    if (isa && !strcmp(isa, "avx2")) return &g4_attn_avx2;
#else
    (void)isa;
#endif
    return &g4_attn_ref;
}

/* Static split of the (row, head) pairs; every pair runs the same kernel code whichever worker
 * takes it, so the thread count never changes a bit of the output.
 *   at least 2 units per thread, a unit being (tile of G4_ATTN_ROW_TILE rows, kv group): units
 *       dealt round-robin, tile-major (causal rows grow in cost; round-robin keeps workers even,
 *       and each unit's K/V rows are read by one worker). A verify batch of 4 rows on 2 threads
 *       is one row tile, so it is split by kv group: the former rule (whole row tiles once
 *       n_q >= 2 * threads) gave all of it to one worker, 10 ms instead of ~4 per 6 31B layers.
 *   otherwise (few kv heads, decode):  the flattened (row, head) list cut into equal ranges,
 *       rounded to whole kv groups when a range holds at least one group. */
typedef struct {
    const g4_attn_args *a;
    g4_attn_fn fn;
} attn_ctx;

static void attn_task(void *vctx, int ith, int nth) {
    const attn_ctx *c = (const attn_ctx *)vctx;
    const g4_attn_args *a = c->a;
    const int H = a->n_head, G = a->n_head / a->n_head_kv;
    const int64_t ntile = (a->n_q + G4_ATTN_ROW_TILE - 1) / G4_ATTN_ROW_TILE, ng = a->n_head_kv;
    if (ntile * ng >= 2 * (int64_t)nth) {
        for (int64_t u = ith; u < ntile * ng; u += nth) {
            const int64_t r = (u / ng) * G4_ATTN_ROW_TILE;
            const int g = (int)(u % ng);
            c->fn(a, r, r + G4_ATTN_ROW_TILE < a->n_q ? r + G4_ATTN_ROW_TILE : a->n_q, g * G, (g + 1) * G);
        }
        return;
    }
    const int64_t units = a->n_q * H;
    int64_t per = (units + nth - 1) / nth;
    if (per >= G) per = (per + G - 1) / G * G;
    int64_t u = per * ith;
    const int64_t u1 = u + per < units ? u + per : units;
    while (u < u1) {
        const int64_t r = u / H;
        const int hs = (int)(u % H);
        const int he = (int)(u1 - r * H < H ? u1 - r * H : H);
        c->fn(a, r, r + 1, hs, he);
        u = r * H + he;
    }
}

int g4_flash_attn(struct g4_pool *pool, const g4_attn_args *a, char *msg, size_t msg_len) {
    if (!a) { snprintf(msg, msg_len, "no arguments"); return -1; }
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv) {
        snprintf(msg, msg_len, "n_head=%d is not a positive multiple of n_head_kv=%d", a->n_head, a->n_head_kv);
        return -1;
    }
    const size_t hbk = g4_kv_head_bytes(a->k_type, a->hd), hbv = g4_kv_head_bytes(a->v_type, a->hd);
    if (!hbk || !hbv) {
        snprintf(msg, msg_len, "k_type=%d v_type=%d with hd=%d: hd must be a positive multiple of 32 and the "
                 "types among f32(0) f16(1) q4_0(2) q8_0(8)", a->k_type, a->v_type, a->hd);
        return -1;
    }
    if (a->k_slot_bytes < (size_t)a->n_head_kv * hbk || a->v_slot_bytes < (size_t)a->n_head_kv * hbv) {
        snprintf(msg, msg_len, "slot bytes k=%zu v=%zu < %zu, %zu for %d kv heads of hd=%d", a->k_slot_bytes,
                 a->v_slot_bytes, (size_t)a->n_head_kv * hbk, (size_t)a->n_head_kv * hbv, a->n_head_kv, a->hd);
        return -1;
    }
    if (a->n_slots > 0 && (!a->k || !a->v || !a->kv_pos)) { snprintf(msg, msg_len, "null cache"); return -1; }
    const int64_t width = (int64_t)a->n_head * a->hd;
    if (a->n_q < 0 || a->n_slots < 0) { snprintf(msg, msg_len, "negative n_q or n_slots"); return -1; }
    if (a->q_stride < width || a->out_stride < width) {
        snprintf(msg, msg_len, "row strides q=%lld out=%lld < n_head*hd=%lld", (long long)a->q_stride,
                 (long long)a->out_stride, (long long)width);
        return -1;
    }
    if (a->window < 0 || !(a->softcap >= 0.0f)) {
        snprintf(msg, msg_len, "window=%d and softcap=%g must be >= 0", a->window, (double)a->softcap);
        return -1;
    }
    if (a->n_q == 0) return 0;
    attn_ctx c = {a, g4_attn_for(g4_active()->isa)->flash_attn};
    if (g4_pool_size(pool) == 1) attn_task(&c, 0, 1);
    else g4_pool_run(pool, attn_task, &c);
    return 0;
}
