/* bandwidth.c: a self-contained memory read-bandwidth probe (loaded by bandwidth.py via ctypes).
 *
 * g4bw_measure() allocates one buffer, lets every thread first-touch its own slice (so on a
 * multi-node machine each slice lives on the node of the CPU that reads it), then runs
 * `warmup + runs` timed passes: all threads wait on a barrier, read-sum their slice, wait on a
 * second barrier. One pass is timed by thread 0 from the first barrier to the second, so a
 * pass takes as long as its slowest thread. GB/s of each pass (1e9 bytes) go to out_gbs.
 *
 * g4bw_measure_node() does the same with the whole buffer bound to one memory node (mbind
 * MPOL_BIND before the first touch), for the node-to-node matrix: threads on node i reading
 * memory of node j.
 *
 * g4bw_measure_layout() takes the read pattern too: the number of side-by-side streams a thread
 * splits its slice into and the software prefetch distance (0: none). g4bw_measure /
 * g4bw_measure_node walk 8 streams with prefetch 512 bytes ahead (see read_sum). The read loop
 * uses 256-bit integer adds on four independent accumulators when compiled with
 * -mavx2 (the Python side does that only on CPUs with AVX2), so a pass is limited by memory,
 * not by instruction throughput; without AVX2 it is a scalar 64-bit loop with four
 * accumulators. The sums are folded into a volatile sink so the compiler cannot drop reads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__AVX2__)
#include <immintrin.h>
#define G4BW_KIND "avx2"
#else
#define G4BW_KIND "scalar"
#endif

const char *g4bw_kind(void) { return G4BW_KIND; }

static volatile uint64_t g4bw_sink;

/* Read-sum n bytes at p (n a multiple of 1024, p 64-byte aligned) as `streams` contiguous
 * streams read side by side, each with a software prefetch pf bytes ahead (pf 0: none). Which
 * pattern reads most depends on the core: one sequential
 * stream per core under-reads what the core can pull: the GEMV kernels read 8-16 rows at once with
 * prefetch and beat it by 15-25 % (2-vCPU Xeon VM: 1 stream 20.1 GB/s with 2 threads, 8 streams +
 * prefetch 24.9 GB/s, medians of 6 passes), which made "% of bandwidth" read above 100 %; on a
 * 2-vCPU AMD EPYC Zen 5 VM, 2 streams without prefetch read 39-41 GB/s on one core where 8
 * streams + prefetch read 32-34 (bandwidth.py measures several patterns and keeps the best). */
#define G4BW_STREAMS 8 /* the default layout (g4bw_measure / g4bw_measure_node) */
#define G4BW_PF 512
static uint64_t read_sum(const uint8_t *p, size_t n, int streams, int pf) {
    const size_t sl = n / (size_t)streams / 128u * 128u; /* bytes per stream */
#if defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < sl; i += 128)
        for (int s = 0; s < streams; s++) {
            const uint8_t *q = p + (size_t)s * sl + i;
            if (pf > 0) {
                _mm_prefetch((const char *)q + pf, _MM_HINT_T0);
                _mm_prefetch((const char *)q + pf + 64, _MM_HINT_T0);
            }
            a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)q));
            a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(q + 32)));
            a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(q + 64)));
            a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(q + 96)));
        }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a0);
    uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < sl; i += 32)
        for (int s = 0; s < streams; s++) {
            const uint64_t *q = (const uint64_t *)(p + (size_t)s * sl + i);
            s0 += q[0];
            s1 += q[1];
            s2 += q[2];
            s3 += q[3];
        }
    uint64_t sum = s0 + s1 + s2 + s3;
#endif
    for (size_t i = sl * (size_t)streams; i < n; i += 8) { /* the tail the streams leave (none for n % 1024 == 0) */
        uint64_t v;
        memcpy(&v, p + i, 8);
        sum += v;
    }
    return sum;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    int n_threads, passes;
    int streams, pf;         /* read pattern (read_sum) */
    const int *cpus;
    uint8_t *buf;
    size_t slice;            /* bytes per thread (multiple of 4096) */
    pthread_barrier_t bar;
    double *pass_s;          /* passes entries, written by thread 0 */
    int pin_errors;          /* threads whose pinning failed */
    int go;                  /* 0: wait, 1: run, -1: creating a thread failed, exit */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} g4bw_ctx;

typedef struct {
    g4bw_ctx *c;
    int ith;
} g4bw_arg;

static void *worker(void *argp) {
    g4bw_arg *a = (g4bw_arg *)argp;
    g4bw_ctx *c = a->c;
    pthread_mutex_lock(&c->mu);
    while (c->go == 0) pthread_cond_wait(&c->cv, &c->mu);
    const int go = c->go;
    pthread_mutex_unlock(&c->mu);
    if (go < 0) return NULL;
    if (c->cpus) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(c->cpus[a->ith], &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) {
            pthread_mutex_lock(&c->mu);
            c->pin_errors++;
            pthread_mutex_unlock(&c->mu);
        }
    }
    uint8_t *mine = c->buf + (size_t)a->ith * c->slice;
    /* first touch by the reading thread; non-zero pattern so nothing can be special-cased */
    for (size_t i = 0; i < c->slice; i += 8) {
        uint64_t v = (uint64_t)(i + (size_t)a->ith) * 0x9E3779B97F4A7C15ull;
        memcpy(mine + i, &v, 8);
    }
    uint64_t acc = 0;
    for (int r = 0; r < c->passes; r++) {
        pthread_barrier_wait(&c->bar);
        double t0 = a->ith == 0 ? now_s() : 0.0;
        acc += read_sum(mine, c->slice, c->streams, c->pf);
        pthread_barrier_wait(&c->bar);
        if (a->ith == 0) c->pass_s[r] = now_s() - t0;
    }
    g4bw_sink += acc; /* racy by design: only keeps the sums alive */
    return NULL;
}

/* Returns 0 on success, else an errno-style code with msg filled. out_gbs gets `runs` values
 * (the `warmup` passes before them are not reported). bytes is rounded down to a multiple of
 * 4096 * n_threads. cpus may be NULL (no pinning). */
int g4bw_measure_node(int n_threads, const int *cpus, size_t bytes, int mem_node, int warmup, int runs,
                      double *out_gbs, int *out_pin_errors, char *msg, size_t msg_len);

int g4bw_measure(int n_threads, const int *cpus, size_t bytes, int warmup, int runs,
                 double *out_gbs, int *out_pin_errors, char *msg, size_t msg_len) {
    return g4bw_measure_node(n_threads, cpus, bytes, -1, warmup, runs, out_gbs, out_pin_errors, msg, msg_len);
}

/* mem_node >= 0: the buffer's pages are all allocated on that node (MPOL_BIND), else first touch. */
int g4bw_measure_layout(int n_threads, const int *cpus, size_t bytes, int mem_node, int streams, int pf,
                        int warmup, int runs, double *out_gbs, int *out_pin_errors, char *msg, size_t msg_len);
int g4bw_measure_node(int n_threads, const int *cpus, size_t bytes, int mem_node, int warmup, int runs,
                      double *out_gbs, int *out_pin_errors, char *msg, size_t msg_len) {
    return g4bw_measure_layout(n_threads, cpus, bytes, mem_node, G4BW_STREAMS, G4BW_PF, warmup, runs, out_gbs,
                               out_pin_errors, msg, msg_len);
}
/* streams: 1..64 side-by-side streams per thread; pf: prefetch distance in bytes (0: none, else a
 * multiple of 64 up to 1 MiB). */
int g4bw_measure_layout(int n_threads, const int *cpus, size_t bytes, int mem_node, int streams, int pf,
                        int warmup, int runs, double *out_gbs, int *out_pin_errors, char *msg, size_t msg_len) {
    if (n_threads < 1 || runs < 1 || warmup < 0) {
        snprintf(msg, msg_len, "bad arguments: threads=%d runs=%d warmup=%d", n_threads, runs, warmup);
        return EINVAL;
    }
    if (streams < 1 || streams > 64 || pf < 0 || pf > (1 << 20) || pf % 64) {
        snprintf(msg, msg_len, "bad read pattern: streams=%d (1..64), prefetch=%d (0..1 MiB, a multiple of 64)",
                 streams, pf);
        return EINVAL;
    }
    size_t slice = bytes / (size_t)n_threads / 4096u * 4096u;
    if (slice < (size_t)streams * 128u) {
        snprintf(msg, msg_len, "buffer of %zu bytes too small for %d threads x %d streams", bytes, n_threads, streams);
        return EINVAL;
    }
    size_t total = slice * (size_t)n_threads;
    void *mem = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        snprintf(msg, msg_len, "mmap of %zu bytes failed: %s", total, strerror(errno));
        return ENOMEM;
    }
#ifdef MADV_HUGEPAGE
    madvise(mem, total, MADV_HUGEPAGE); /* fewer TLB misses; harmless if THP is off */
#endif
    if (mem_node >= 0) {
#ifdef SYS_mbind
        unsigned long mask[16] = {0};
        if (mem_node >= 1024) {
            snprintf(msg, msg_len, "node %d out of range", mem_node);
            munmap(mem, total);
            return EINVAL;
        }
        mask[mem_node / 64] = 1ul << (mem_node % 64);
        if (syscall(SYS_mbind, mem, total, 2 /* MPOL_BIND */, mask, 1025ul, 0u) != 0) {
            snprintf(msg, msg_len, "mbind to node %d failed: %s", mem_node, strerror(errno));
            munmap(mem, total);
            return errno;
        }
#else
        snprintf(msg, msg_len, "no mbind system call on this platform");
        munmap(mem, total);
        return ENOSYS;
#endif
    }
    g4bw_ctx c;
    memset(&c, 0, sizeof(c));
    c.n_threads = n_threads;
    c.passes = warmup + runs;
    c.streams = streams;
    c.pf = pf;
    c.cpus = cpus;
    c.buf = (uint8_t *)mem;
    c.slice = slice;
    c.pass_s = calloc((size_t)c.passes, sizeof(double));
    pthread_t *th = calloc((size_t)n_threads, sizeof(pthread_t));
    g4bw_arg *args = calloc((size_t)n_threads, sizeof(g4bw_arg));
    int rc = 0;
    if (!c.pass_s || !th || !args) {
        snprintf(msg, msg_len, "out of memory");
        rc = ENOMEM;
        goto done;
    }
    pthread_barrier_init(&c.bar, NULL, (unsigned)n_threads);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    int started = 0;
    for (int i = 0; i < n_threads; i++) {
        args[i].c = &c;
        args[i].ith = i;
        int e = pthread_create(&th[i], NULL, worker, &args[i]);
        if (e != 0) {
            snprintf(msg, msg_len, "pthread_create failed for thread %d: %s", i, strerror(e));
            rc = e;
            break;
        }
        started++;
    }
    pthread_mutex_lock(&c.mu);
    c.go = rc == 0 ? 1 : -1; /* the barrier counts n_threads: run only if all started */
    pthread_cond_broadcast(&c.cv);
    pthread_mutex_unlock(&c.mu);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&c.bar);
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
    if (rc != 0) goto done;
    for (int r = 0; r < runs; r++) out_gbs[r] = (double)total / c.pass_s[warmup + r] / 1e9;
    if (out_pin_errors) *out_pin_errors = c.pin_errors;
done:
    free(args);
    free(th);
    free(c.pass_s);
    munmap(mem, total);
    return rc;
}
