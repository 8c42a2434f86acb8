/* kernel_bench.h: what bench/kernel_micro.c and bench/kernel_pair.c share: the clock, the weight
 * types' block layouts, the random weights and activations (one generator, one seed, so both
 * harnesses build the same bytes for the same arguments) and the output hash. */
#ifndef G4_KERNEL_BENCH_H
#define G4_KERNEL_BENCH_H
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef void (*kb_quant_fn)(const float *, void *, int64_t);

static double kb_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t kb_rng = 0x9e3779b97f4a7c15ull;
static uint32_t kb_next_u32(void) {
    kb_rng ^= kb_rng << 13, kb_rng ^= kb_rng >> 7, kb_rng ^= kb_rng << 17;
    return (uint32_t)(kb_rng >> 16);
}

/* block bytes, block elements, offsets of the fp16 scale fields in a block (d1 -1: none) */
typedef struct {
    size_t bs, qk;
    int d0, d1;
} kb_type;

/* 0 and *ty filled for a known TYPE (q4_0 q5_0 q8_0 q4_K q5_K q6_K), else -1 */
static int kb_type_of(const char *t, kb_type *ty) {
    static const struct { const char *name; kb_type ty; } types[] = {
        {"q4_0", {18, 32, 0, -1}},   {"q5_0", {22, 32, 0, -1}},   {"q8_0", {34, 32, 0, -1}},
        {"q4_K", {144, 256, 0, 2}}, {"q5_K", {176, 256, 0, 2}}, {"q6_K", {210, 256, 208, -1}},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (!strcmp(t, types[i].name)) {
            *ty = types[i].ty;
            return 0;
        }
    return -1;
}

/* Random weight bytes (rows x wrb) with every fp16 scale in [1/16, 1/8), then nt rows of
 * activations: random floats in [-1, 1] (xf: k floats of scratch) quantised by q. */
static void kb_fill(const kb_type *ty, uint8_t *w, size_t wrb, int64_t rows, int64_t k, uint8_t *x, size_t xrb,
                    int64_t nt, float *xf, kb_quant_fn q) {
    for (size_t i = 0; i < wrb * (size_t)rows; i++) w[i] = (uint8_t)kb_next_u32();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < k / (int64_t)ty->qk; b++) {
            uint8_t *p = w + (size_t)r * wrb + (size_t)b * ty->bs;
            const uint16_t h = (uint16_t)(0x2c00 + (kb_next_u32() & 0x3ff));
            memcpy(p + ty->d0, &h, 2);
            if (ty->d1 >= 0) memcpy(p + ty->d1, &h, 2);
        }
    for (int64_t tk = 0; tk < nt; tk++) {
        for (int64_t i = 0; i < k; i++) xf[i] = (float)((int32_t)(kb_next_u32() % 2001) - 1000) * 1e-3f;
        q(xf, x + (size_t)tk * xrb, k);
    }
}

/* FNV-1a over n bytes: two builds that claim bit-identical results must print the same hash */
static uint64_t kb_hash(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
#endif
