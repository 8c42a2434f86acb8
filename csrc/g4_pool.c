/* g4_pool.c: see g4_pool.h. Linux (futex, sched_setaffinity per thread). */
#define _GNU_SOURCE
#include "g4_pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define G4_RELAX() _mm_pause()
#else
#define G4_RELAX() ((void)0)
#endif

#define G4_MAX_THREADS 1024

typedef struct {
    g4_pool *pool;
    int ith;
    pthread_t thread;
    _Atomic long tid;
} g4_worker;

struct g4_pool {
    int n;
    int spin_us;
    int *cpus;              /* n entries or NULL */
    g4_worker *workers;     /* n entries; [0] is the caller */
    _Atomic uint32_t gen;   /* bumped once per task (futex word) */
    _Atomic int pending;    /* workers 1..n-1 still running the current task */
    _Atomic int stop;
    _Atomic int sleepers;   /* workers inside futex_wait (or about to be) */
    g4_task_fn fn;
    void *ctx;
    long caller_tid;        /* the thread that last ran work as worker 0 */
    void *scratch;
    size_t scratch_bytes;
    int n_groups;
    int *group_first;       /* n_groups + 1 worker bounds */
    int *group_of;          /* n entries */
    _Atomic long session_tid;   /* thread holding a session (0: none) */
    int session_depth;
    int session_saved_ok;
    cpu_set_t session_saved;    /* the session holder's affinity before it entered */
};

static long g4_gettid(void) { return (long)syscall(SYS_gettid); }

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int pin_self(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof(set), &set); /* 0 = calling thread */
}

static void *worker_main(void *arg) {
    g4_worker *w = (g4_worker *)arg;
    g4_pool *p = w->pool;
    atomic_store(&w->tid, g4_gettid());
    if (p->cpus) pin_self(p->cpus[w->ith]); /* checked by the creator via read-back */
    uint32_t seen = 0;
    for (;;) {
        /* wait for a new generation: spin, then sleep */
        uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g == seen) {
            const double t0 = now_us();
            unsigned it = 0;
            while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
                G4_RELAX();
                if ((++it & 255u) == 0 && now_us() - t0 > p->spin_us) {
                    /* seq_cst pairs with the caller's bump-then-check: either it sees us
                     * counted and wakes us, or futex_wait sees the new generation */
                    atomic_fetch_add(&p->sleepers, 1);
                    futex_wait(&p->gen, seen);
                    atomic_fetch_sub(&p->sleepers, 1);
                }
            }
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->ctx, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

g4_pool *g4_pool_create(int n_threads, const int *cpus, int spin_us, char *msg, size_t msg_len) {
    if (n_threads < 1 || n_threads > G4_MAX_THREADS) {
        snprintf(msg, msg_len, "thread count %d out of range 1..%d", n_threads, G4_MAX_THREADS);
        return NULL;
    }
    g4_pool *p = calloc(1, sizeof(*p));
    if (!p) { snprintf(msg, msg_len, "out of memory"); return NULL; }
    p->n = n_threads;
    p->spin_us = spin_us < 0 ? 0 : spin_us;
    p->workers = calloc((size_t)n_threads, sizeof(g4_worker));
    if (!p->workers) { free(p); snprintf(msg, msg_len, "out of memory"); return NULL; }
    if (cpus) {
        p->cpus = malloc(sizeof(int) * (size_t)n_threads);
        if (!p->cpus) { free(p->workers); free(p); snprintf(msg, msg_len, "out of memory"); return NULL; }
        for (int i = 0; i < n_threads; i++) {
            if (cpus[i] < 0 || cpus[i] >= CPU_SETSIZE) {
                snprintf(msg, msg_len, "cpu %d out of range", cpus[i]);
                free(p->cpus); free(p->workers); free(p);
                return NULL;
            }
            p->cpus[i] = cpus[i];
        }
    }
    p->caller_tid = -1;
    p->n_groups = 1;
    p->group_first = malloc(sizeof(int) * 2);
    p->group_of = calloc((size_t)n_threads, sizeof(int));
    if (!p->group_first || !p->group_of) {
        snprintf(msg, msg_len, "out of memory");
        free(p->group_first); free(p->group_of); free(p->cpus); free(p->workers); free(p);
        return NULL;
    }
    p->group_first[0] = 0;
    p->group_first[1] = n_threads;
    for (int i = 0; i < n_threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i;
        atomic_store(&p->workers[i].tid, -1);
    }
    for (int i = 1; i < n_threads; i++) {
        int rc = pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]);
        if (rc != 0) {
            snprintf(msg, msg_len, "pthread_create failed for worker %d: %s", i, strerror(rc));
            p->n = i; /* destroy joins the ones that started */
            g4_pool_destroy(p);
            return NULL;
        }
    }
    /* wait until every worker has published its tid (and pinned itself) */
    for (int i = 1; i < n_threads; i++)
        while (atomic_load(&p->workers[i].tid) < 0) sched_yield();
    return p;
}

void g4_pool_destroy(g4_pool *p) {
    if (!p) return;
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    futex_wake_all(&p->gen);
    for (int i = 1; i < p->n; i++) pthread_join(p->workers[i].thread, NULL);
    free(p->scratch);
    free(p->group_first);
    free(p->group_of);
    free(p->cpus);
    free(p->workers);
    free(p);
}

int g4_pool_size(const g4_pool *p) { return p->n; }
int g4_pool_cpu(const g4_pool *p, int i) { return (p->cpus && i >= 0 && i < p->n) ? p->cpus[i] : -1; }
long g4_pool_tid(const g4_pool *p, int i) {
    if (i < 0 || i >= p->n) return -1;
    return i == 0 ? p->caller_tid : atomic_load(&p->workers[i].tid);
}

void g4_pool_run(g4_pool *p, g4_task_fn fn, void *ctx) {
    const long me = g4_gettid();
    /* outside a session the caller is pinned for this run only and gets its affinity back */
    cpu_set_t saved;
    int restore = 0;
    if (p->cpus && atomic_load_explicit(&p->session_tid, memory_order_relaxed) != me &&
        sched_getaffinity(0, sizeof(saved), &saved) == 0 &&
        !(CPU_COUNT(&saved) == 1 && CPU_ISSET(p->cpus[0], &saved))) {
        pin_self(p->cpus[0]);
        restore = 1;
    }
    p->caller_tid = me;
    if (p->n == 1) {
        fn(ctx, 0, 1);
    } else {
        p->fn = fn;
        p->ctx = ctx;
        atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
        atomic_fetch_add(&p->gen, 1);
        if (atomic_load(&p->sleepers) != 0) futex_wake_all(&p->gen);
        fn(ctx, 0, p->n);
        unsigned it = 0;
        while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) {
            G4_RELAX();
            if ((++it & 4095u) == 0) sched_yield();
        }
    }
    if (restore) sched_setaffinity(0, sizeof(saved), &saved);
}

int g4_pool_enter(g4_pool *p) {
    if (!p->cpus) return 1;
    const long me = g4_gettid();
    long owner = atomic_load(&p->session_tid);
    if (owner == me) {
        p->session_depth++;
        return 1;
    }
    owner = 0;
    if (!atomic_compare_exchange_strong(&p->session_tid, &owner, me)) return 0;
    p->session_saved_ok = sched_getaffinity(0, sizeof(p->session_saved), &p->session_saved) == 0;
    p->session_depth = 1;
    pin_self(p->cpus[0]);
    return 1;
}

void g4_pool_leave(g4_pool *p) {
    if (!p->cpus || atomic_load(&p->session_tid) != g4_gettid()) return;
    if (--p->session_depth > 0) return;
    if (p->session_saved_ok) sched_setaffinity(0, sizeof(p->session_saved), &p->session_saved);
    atomic_store(&p->session_tid, 0);
}

int g4_pool_set_groups(g4_pool *p, int n_groups, const int *first, char *msg, size_t msg_len) {
    if (n_groups < 1 || n_groups > p->n || first[0] != 0 || first[n_groups] != p->n) {
        snprintf(msg, msg_len, "%d groups over %d workers: bounds must run from 0 to %d", n_groups, p->n, p->n);
        return -1;
    }
    for (int g = 0; g < n_groups; g++)
        if (first[g + 1] <= first[g]) {
            snprintf(msg, msg_len, "group %d is empty (bounds must increase)", g);
            return -1;
        }
    int *gf = malloc(sizeof(int) * (size_t)(n_groups + 1));
    if (!gf) { snprintf(msg, msg_len, "out of memory"); return -1; }
    for (int g = 0; g <= n_groups; g++) gf[g] = first[g];
    for (int g = 0; g < n_groups; g++)
        for (int i = first[g]; i < first[g + 1]; i++) p->group_of[i] = g;
    free(p->group_first);
    p->group_first = gf;
    p->n_groups = n_groups;
    return 0;
}

int g4_pool_n_groups(const g4_pool *p) { return p->n_groups; }
int g4_pool_group_first(const g4_pool *p, int g) {
    return (g >= 0 && g <= p->n_groups) ? p->group_first[g] : -1;
}

void g4_pool_group_of(const g4_pool *p, int ith, int *group, int *local, int *count) {
    const int g = p->group_of[ith];
    *group = g;
    *local = ith - p->group_first[g];
    *count = p->group_first[g + 1] - p->group_first[g];
}

void *g4_pool_scratch(g4_pool *p, size_t bytes) {
    if (bytes <= p->scratch_bytes) return p->scratch;
    void *q = NULL;
    const size_t rounded = (bytes + 4095u) & ~(size_t)4095u;
    if (posix_memalign(&q, 64, rounded) != 0) return NULL;
    free(p->scratch);
    p->scratch = q;
    p->scratch_bytes = rounded;
    return q;
}
