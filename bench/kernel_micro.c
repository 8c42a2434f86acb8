/* Single-thread microbenchmark of one ISA's gemm entry, for A/B comparisons of kernel builds
 * (bench/ab_kernels.sh builds it against two source trees and alternates the two binaries).
 *
 *   cc -O2 -DG4_ISA=avx2 -Icsrc bench/kernel_micro.c <libg4_avx2.a> <libg4_ref.a> -lm -o km
 *   ./km TYPE K ROWS NTOK [REPS]        TYPE: q4_0 q5_0 q8_0 q4_K q5_K q6_K
 *
 * Weights are random bytes with every fp16 scale set to a sane value; activations are random
 * floats quantised by the same ISA's quantiser (valid Q8_0 / Q8_K blocks, bsums included). The
 * rows are one contiguous matrix of ROWS rows, so ROWS picks the level the weights come from
 * (L1/L2/L3/memory). Prints the best time of REPS calls (default 1000), ns per row x token x 32
 * elements, GMAC/s and a hash of the output bytes: two builds that claim bit-identical results
 * must print the same hash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef G4_ISA
#define G4_ISA avx2
#endif
#define G4_CAT3(a, b, c) a##b##c
#define G4_SYM(base, isa) G4_CAT3(base, _, isa)
#define G4_FN(base) G4_SYM(base, G4_ISA)

typedef void (*gemm_fn)(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t, int64_t,
                        int64_t);
typedef void (*quant_fn)(const float *, void *, int64_t);
#define G4_DECL_GEMM(name) void G4_FN(name)(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, \
                                            int64_t, int64_t, int64_t);
G4_DECL_GEMM(g4_gemm_q4_0_q8_0)
G4_DECL_GEMM(g4_gemm_q5_0_q8_0)
G4_DECL_GEMM(g4_gemm_q8_0_q8_0)
G4_DECL_GEMM(g4_gemm_q4_K_q8_K)
G4_DECL_GEMM(g4_gemm_q5_K_q8_K)
G4_DECL_GEMM(g4_gemm_q6_K_q8_K)
void G4_FN(g4_quantize_row_q8_0)(const float *, void *, int64_t);
void G4_FN(g4_quantize_row_q8_K)(const float *, void *, int64_t);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TYPE K ROWS NTOK [REPS]\n", argv[0]);
        return 2;
    }
    const char *t = argv[1];
    const int64_t k = atoll(argv[2]), rows = atoll(argv[3]), nt = atoll(argv[4]);
    const int reps = argc > 5 ? atoi(argv[5]) : 1000;
    gemm_fn f;
    quant_fn q;
    size_t bs, qk, xbs;
    /* offsets of the fp16 scale fields in a block (-1: none) */
    int d0, d1 = -1;
    if (!strcmp(t, "q4_0")) f = G4_FN(g4_gemm_q4_0_q8_0), bs = 18, qk = 32, d0 = 0;
    else if (!strcmp(t, "q5_0")) f = G4_FN(g4_gemm_q5_0_q8_0), bs = 22, qk = 32, d0 = 0;
    else if (!strcmp(t, "q8_0")) f = G4_FN(g4_gemm_q8_0_q8_0), bs = 34, qk = 32, d0 = 0;
    else if (!strcmp(t, "q4_K")) f = G4_FN(g4_gemm_q4_K_q8_K), bs = 144, qk = 256, d0 = 0, d1 = 2;
    else if (!strcmp(t, "q5_K")) f = G4_FN(g4_gemm_q5_K_q8_K), bs = 176, qk = 256, d0 = 0, d1 = 2;
    else if (!strcmp(t, "q6_K")) f = G4_FN(g4_gemm_q6_K_q8_K), bs = 210, qk = 256, d0 = 208;
    else {
        fprintf(stderr, "unknown type %s\n", t);
        return 2;
    }
    q = qk == 32 ? G4_FN(g4_quantize_row_q8_0) : G4_FN(g4_quantize_row_q8_K);
    xbs = qk == 32 ? 34 : 292;
    if (k <= 0 || k % (int64_t)qk || rows <= 0 || nt <= 0 || reps <= 0) {
        fprintf(stderr, "K must be a positive multiple of %zu; ROWS, NTOK, REPS positive\n", qk);
        return 2;
    }
    const size_t wrb = (size_t)(k / (int64_t)qk) * bs, xrb = (size_t)(k / (int64_t)qk) * xbs;
    uint8_t *w = aligned_alloc(64, (wrb * (size_t)rows + 63) / 64 * 64);
    uint8_t *x = aligned_alloc(64, (xrb * (size_t)nt + 63) / 64 * 64);
    float *xf = malloc(sizeof(float) * (size_t)k);
    float *y = aligned_alloc(64, (sizeof(float) * (size_t)(rows * nt) + 63) / 64 * 64);
    if (!w || !x || !xf || !y) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < wrb * (size_t)rows; i++) w[i] = (uint8_t)next_u32();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < k / (int64_t)qk; b++) {
            uint8_t *p = w + (size_t)r * wrb + (size_t)b * bs;
            const uint16_t h = (uint16_t)(0x2c00 + (next_u32() & 0x3ff)); /* fp16 in [1/16, 1/8) */
            memcpy(p + d0, &h, 2);
            if (d1 >= 0) memcpy(p + d1, &h, 2);
        }
    for (int64_t tk = 0; tk < nt; tk++) {
        for (int64_t i = 0; i < k; i++) xf[i] = (float)((int32_t)(next_u32() % 2001) - 1000) * 1e-3f;
        q(xf, x + (size_t)tk * xrb, k);
    }
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        const double t0 = now();
        f(w, wrb, x, xrb, y, rows, nt, k, 0, rows);
        const double dt = now() - t0;
        if (dt < best) best = dt;
    }
    uint64_t hash = 1469598103934665603ull; /* FNV-1a over the output bytes */
    const uint8_t *yb = (const uint8_t *)y;
    for (size_t i = 0; i < sizeof(float) * (size_t)(rows * nt); i++) hash = (hash ^ yb[i]) * 1099511628211ull;
    const double blocks = (double)rows * (double)nt * ((double)k / 32.0);
    printf("%s k=%lld rows=%lld ntok=%lld: %.4f ms, %.4f ns per row-token-32block, %.2f GMAC/s, hash %016llx\n", t,
           (long long)k, (long long)rows, (long long)nt, best * 1e3, best * 1e9 / blocks,
           (double)rows * (double)nt * (double)k / best / 1e9, (unsigned long long)hash);
    free(w), free(x), free(xf), free(y);
    return 0;
}
