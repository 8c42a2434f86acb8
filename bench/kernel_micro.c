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

#include "kernel_bench.h"

#ifndef G4_ISA
#define G4_ISA avx2
#endif
#define G4_CAT3(a, b, c) a##b##c
#define G4_SYM(base, isa) G4_CAT3(base, _, isa)
#define G4_FN(base) G4_SYM(base, G4_ISA)

typedef void (*gemm_fn)(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t, int64_t,
                        int64_t);
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

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TYPE K ROWS NTOK [REPS]\n", argv[0]);
        return 2;
    }
    const char *t = argv[1];
    const int64_t k = atoll(argv[2]), rows = atoll(argv[3]), nt = atoll(argv[4]);
    const int reps = argc > 5 ? atoi(argv[5]) : 1000;
    kb_type ty;
    gemm_fn f = NULL;
    if (kb_type_of(t, &ty) != 0) {
        fprintf(stderr, "unknown type %s\n", t);
        return 2;
    }
    if (!strcmp(t, "q4_0")) f = G4_FN(g4_gemm_q4_0_q8_0);
    else if (!strcmp(t, "q5_0")) f = G4_FN(g4_gemm_q5_0_q8_0);
    else if (!strcmp(t, "q8_0")) f = G4_FN(g4_gemm_q8_0_q8_0);
    else if (!strcmp(t, "q4_K")) f = G4_FN(g4_gemm_q4_K_q8_K);
    else if (!strcmp(t, "q5_K")) f = G4_FN(g4_gemm_q5_K_q8_K);
    else f = G4_FN(g4_gemm_q6_K_q8_K);
    const size_t qk = ty.qk;
    const kb_quant_fn q = qk == 32 ? G4_FN(g4_quantize_row_q8_0) : G4_FN(g4_quantize_row_q8_K);
    const size_t xbs = qk == 32 ? 34 : 292;
    if (k <= 0 || k % (int64_t)qk || rows <= 0 || nt <= 0 || reps <= 0) {
        fprintf(stderr, "K must be a positive multiple of %zu; ROWS, NTOK, REPS positive\n", qk);
        return 2;
    }
    const size_t wrb = (size_t)(k / (int64_t)qk) * ty.bs, xrb = (size_t)(k / (int64_t)qk) * xbs;
    uint8_t *w = aligned_alloc(64, (wrb * (size_t)rows + 63) / 64 * 64);
    uint8_t *x = aligned_alloc(64, (xrb * (size_t)nt + 63) / 64 * 64);
    float *xf = malloc(sizeof(float) * (size_t)k);
    float *y = aligned_alloc(64, (sizeof(float) * (size_t)(rows * nt) + 63) / 64 * 64);
    if (!w || !x || !xf || !y) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    kb_fill(&ty, w, wrb, rows, k, x, xrb, nt, xf, q);
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        const double t0 = kb_now();
        f(w, wrb, x, xrb, y, rows, nt, k, 0, rows);
        const double dt = kb_now() - t0;
        if (dt < best) best = dt;
    }
    const uint64_t hash = kb_hash(y, sizeof(float) * (size_t)(rows * nt));
    const double blocks = (double)rows * (double)nt * ((double)k / 32.0);
    printf("%s k=%lld rows=%lld ntok=%lld: %.4f ms, %.4f ns per row-token-32block, %.2f GMAC/s, hash %016llx\n", t,
           (long long)k, (long long)rows, (long long)nt, best * 1e3, best * 1e9 / blocks,
           (double)rows * (double)nt * (double)k / best / 1e9, (unsigned long long)hash);
    free(w), free(x), free(xf), free(y);
    return 0;
}
