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
 * Weights, activations and the output hash as in kernel_micro.c (same generator, same seed). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*gemm_fn)(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t, int64_t,
                        int64_t);
typedef void (*quant_fn)(const float *, void *, int64_t);

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
        const double t0 = ith == 0 ? now() : 0.0;
        g.f[which](g.w, g.wrb, g.x, g.xrb, g.y[which], g.rows, g.nt, g.k, r0, r1);
        pthread_barrier_wait(&g.bar);
        if (ith == 0 && c >= 0) g.t[which][p] = now() - t0;
    }
    return NULL;
}

static uint64_t fnv(const float *y, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const uint8_t *b = (const uint8_t *)y;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
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
    size_t bs, qk;
    int d0 = 0, d1 = -1;
    if (!strcmp(t, "q4_0")) bs = 18, qk = 32;
    else if (!strcmp(t, "q5_0")) bs = 22, qk = 32;
    else if (!strcmp(t, "q8_0")) bs = 34, qk = 32;
    else if (!strcmp(t, "q4_K")) bs = 144, qk = 256, d1 = 2;
    else if (!strcmp(t, "q5_K")) bs = 176, qk = 256, d1 = 2;
    else if (!strcmp(t, "q6_K")) bs = 210, qk = 256, d0 = 208;
    else { fprintf(stderr, "unknown type %s\n", t); return 2; }
    if (g.k <= 0 || g.k % (int64_t)qk || g.rows < g.T || g.nt <= 0 || g.npairs < 1) {
        fprintf(stderr, "K a positive multiple of %zu, ROWS >= threads, NTOK and PAIRS positive\n", qk);
        return 2;
    }
    snprintf(gname, sizeof gname, "g4_gemm_%s_q8_%s_%s", t, qk == 32 ? "0" : "K", isa);
    snprintf(qname, sizeof qname, "g4_quantize_row_q8_%s_%s", qk == 32 ? "0" : "K", isa);
    quant_fn q = NULL;
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(argv[1 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        g.f[i] = (gemm_fn)dlsym(h, gname);
        if (!g.f[i]) { fprintf(stderr, "%s: no %s\n", argv[1 + i], gname); return 1; }
        if (i == 0) q = (quant_fn)dlsym(h, qname);
    }
    if (!q) { fprintf(stderr, "no %s\n", qname); return 1; }
    g.wrb = (size_t)(g.k / (int64_t)qk) * bs, g.xrb = (size_t)(g.k / (int64_t)qk) * (qk == 32 ? 34 : 292);
    uint8_t *w = aligned_alloc(64, (g.wrb * (size_t)g.rows + 63) / 64 * 64);
    uint8_t *x = aligned_alloc(64, (g.xrb * (size_t)g.nt + 63) / 64 * 64);
    float *xf = malloc(sizeof(float) * (size_t)g.k);
    for (int i = 0; i < 2; i++) g.y[i] = aligned_alloc(64, (sizeof(float) * (size_t)(g.rows * g.nt) + 63) / 64 * 64);
    g.t[0] = calloc((size_t)g.npairs, sizeof(double)), g.t[1] = calloc((size_t)g.npairs, sizeof(double));
    if (!w || !x || !xf || !g.y[0] || !g.y[1] || !g.t[0] || !g.t[1]) { fprintf(stderr, "out of memory\n"); return 1; }
    for (size_t i = 0; i < g.wrb * (size_t)g.rows; i++) w[i] = (uint8_t)next_u32();
    for (int64_t r = 0; r < g.rows; r++)
        for (int64_t b = 0; b < g.k / (int64_t)qk; b++) {
            uint8_t *p = w + (size_t)r * g.wrb + (size_t)b * bs;
            const uint16_t h = (uint16_t)(0x2c00 + (next_u32() & 0x3ff)); /* fp16 in [1/16, 1/8) */
            memcpy(p + d0, &h, 2);
            if (d1 >= 0) memcpy(p + d1, &h, 2);
        }
    for (int64_t tk = 0; tk < g.nt; tk++) {
        for (int64_t i = 0; i < g.k; i++) xf[i] = (float)((int32_t)(next_u32() % 2001) - 1000) * 1e-3f;
        q(xf, x + (size_t)tk * g.xrb, g.k);
    }
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
    const uint64_t ho = fnv(g.y[0], (size_t)(g.rows * g.nt)), hn = fnv(g.y[1], (size_t)(g.rows * g.nt));
    printf("%s k=%lld rows=%lld ntok=%lld threads=%d pairs=%d: old %.3f ms (%.1f GB/s) new %.3f ms (%.1f GB/s); "
           "new/old median of pairs %.3f (IQR %.3f-%.3f); %s\n",
           t, (long long)g.k, (long long)g.rows, (long long)g.nt, g.T, g.npairs, to * 1e3, gb / to, tn * 1e3, gb / tn,
           mr, lo, hi, ho == hn ? "same output" : "OUTPUT DIFFERS");
    return 0;
}
