/* In-process A/B of two builds of one ISA's gemm entry with T pinned threads, for hosts whose
 * bandwidth moves between runs (bench/ab_kernels.sh -t T builds it). The two builds are shared
 * libraries opened with RTLD_LOCAL, so each keeps its own symbols; the calls alternate old, new,
 * old, new, ... on the same weights, each call split by rows over the threads (thread t takes rows
 * [t*R/T, (t+1)*R/T), the engine's split) between two barriers, timed by thread 0. A pair (old
 * then new, or new then old: the order flips every pair) sees the same moment of the host, so the
 * median of the per-pair ratios new/old is what this reports, beside each build's median time.
 *
 *   ./kp OLD.so NEW.so ISA TYPE K ROWS NTOK PAIRS CPULIST     e.g. ... avx512 q4_K 5376 200000 1 15 0,1
 *
 * Weights, activations and the output hash as in kernel_micro.c (kernel_bench.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernel_bench.h"

typedef void (*gemm_fn)(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t, int64_t,
                        int64_t);

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static struct {
    gemm_fn f[2];
    const uint8_t *w, *x;
    size_t wrb, xrb;
    float *y[2];
    int64_t rows, nt, k;
    int T, npairs;
    int cpus[64];
    pthread_barrier_t bar;
    double *t[2];
} g;

static void *worker(void *arg) {
    const int ith = (int)(intptr_t)arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(g.cpus[ith], &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
        fprintf(stderr, "cannot pin thread %d to CPU %d\n", ith, g.cpus[ith]);
        exit(1);
    }
    const int64_t r0 = g.rows * ith / g.T, r1 = g.rows * (ith + 1) / g.T;
    for (int c = -2; c < 2 * g.npairs; c++) { /* two untimed warm-up calls, then the pairs */
        const int p = c < 0 ? c + 2 : c / 2;
        const int which = c < 0 ? c + 2 : ((c & 1) ^ (p & 1)); /* order flips every pair */
        pthread_barrier_wait(&g.bar);
        const double t0 = ith == 0 ? kb_now() : 0.0;
        g.f[which](g.w, g.wrb, g.x, g.xrb, g.y[which], g.rows, g.nt, g.k, r0, r1);
        pthread_barrier_wait(&g.bar);
        if (ith == 0 && c >= 0) g.t[which][p] = kb_now() - t0;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: %s OLD.so NEW.so ISA TYPE K ROWS NTOK PAIRS CPULIST\n", argv[0]);
        return 2;
    }
    const char *isa = argv[3], *t = argv[4];
    g.k = atoll(argv[5]), g.rows = atoll(argv[6]), g.nt = atoll(argv[7]), g.npairs = atoi(argv[8]);
    for (char *s = argv[9], *e; *s; s = *e ? e + 1 : e) {
        if (g.T == 64) { fprintf(stderr, "at most 64 CPUs\n"); return 2; }
        g.cpus[g.T++] = (int)strtol(s, &e, 10);
        if (e == s || (*e && *e != ',')) { fprintf(stderr, "CPULIST: comma-separated CPU numbers\n"); return 2; }
    }
    char gname[64], qname[64];
    kb_type ty;
    if (kb_type_of(t, &ty) != 0) { fprintf(stderr, "unknown type %s\n", t); return 2; }
    const size_t qk = ty.qk;
    if (g.k <= 0 || g.k % (int64_t)qk || g.rows < g.T || g.nt <= 0 || g.npairs < 1) {
        fprintf(stderr, "K a positive multiple of %zu, ROWS >= threads, NTOK and PAIRS positive\n", qk);
        return 2;
    }
    snprintf(gname, sizeof gname, "g4_gemm_%s_q8_%s_%s", t, qk == 32 ? "0" : "K", isa);
    snprintf(qname, sizeof qname, "g4_quantize_row_q8_%s_%s", qk == 32 ? "0" : "K", isa);
    kb_quant_fn q = NULL;
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(argv[1 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        g.f[i] = (gemm_fn)dlsym(h, gname);
        if (!g.f[i]) { fprintf(stderr, "%s: no %s\n", argv[1 + i], gname); return 1; }
        if (i == 0) q = (kb_quant_fn)dlsym(h, qname);
    }
    if (!q) { fprintf(stderr, "no %s\n", qname); return 1; }
    g.wrb = (size_t)(g.k / (int64_t)qk) * ty.bs, g.xrb = (size_t)(g.k / (int64_t)qk) * (qk == 32 ? 34 : 292);
    uint8_t *w = aligned_alloc(64, (g.wrb * (size_t)g.rows + 63) / 64 * 64);
    uint8_t *x = aligned_alloc(64, (g.xrb * (size_t)g.nt + 63) / 64 * 64);
    float *xf = malloc(sizeof(float) * (size_t)g.k);
    for (int i = 0; i < 2; i++) g.y[i] = aligned_alloc(64, (sizeof(float) * (size_t)(g.rows * g.nt) + 63) / 64 * 64);
    g.t[0] = calloc((size_t)g.npairs, sizeof(double)), g.t[1] = calloc((size_t)g.npairs, sizeof(double));
    if (!w || !x || !xf || !g.y[0] || !g.y[1] || !g.t[0] || !g.t[1]) { fprintf(stderr, "out of memory\n"); return 1; }
    kb_fill(&ty, w, g.wrb, g.rows, g.k, x, g.xrb, g.nt, xf, q);
    g.w = w, g.x = x;
    pthread_barrier_init(&g.bar, NULL, (unsigned)g.T);
    pthread_t th[64];
    for (int i = 1; i < g.T; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    worker((void *)0);
    for (int i = 1; i < g.T; i++) pthread_join(th[i], NULL);
    double *ratio = malloc(sizeof(double) * (size_t)g.npairs);
    for (int p = 0; p < g.npairs; p++) ratio[p] = g.t[1][p] / g.t[0][p];
    const double mr = median(ratio, g.npairs), lo = ratio[g.npairs / 4], hi = ratio[(3 * g.npairs) / 4];
    const double to = median(g.t[0], g.npairs), tn = median(g.t[1], g.npairs);
    const double gb = (double)g.wrb * (double)g.rows / 1e9;
    const size_t ny = sizeof(float) * (size_t)(g.rows * g.nt);
    const uint64_t ho = kb_hash(g.y[0], ny), hn = kb_hash(g.y[1], ny);
    printf("%s k=%lld rows=%lld ntok=%lld threads=%d pairs=%d: old %.3f ms (%.1f GB/s) new %.3f ms (%.1f GB/s); "
           "new/old median of pairs %.3f (IQR %.3f-%.3f); %s\n",
           t, (long long)g.k, (long long)g.rows, (long long)g.nt, g.T, g.npairs, to * 1e3, gb / to, tn * 1e3, gb / tn,
           mr, lo, hi, ho == hn ? "same output" : "OUTPUT DIFFERS");
    return 0;
}
