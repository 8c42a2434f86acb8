/* g4_pool.h: a persistent pthread worker pool with per-worker CPU pinning.
 * Worker 0 is the calling thread (no hand-off latency); workers 1..n-1 are threads of the pool.
 * Dispatch: the caller bumps a generation counter; workers spin on it for `spin_us`
 * microseconds after their last task, then sleep on a futex. One g4_pool_run per whole
 * operation: each worker gets (ith, nth) and takes its own static share. */
#ifndef G4_POOL_H
#define G4_POOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct g4_pool g4_pool;
typedef void (*g4_task_fn)(void *ctx, int ith, int nth);

/* cpus: n_threads CPU ids (worker i pinned to cpus[i]; worker 0 = each calling thread, pinned
 * the first time it runs a task), or NULL for no pinning. Returns NULL with msg on failure. */
g4_pool *g4_pool_create(int n_threads, const int *cpus, int spin_us, char *msg, size_t msg_len);
void g4_pool_destroy(g4_pool *p);
int g4_pool_size(const g4_pool *p);
int g4_pool_cpu(const g4_pool *p, int i);   /* the CPU worker i is pinned to, -1 if unpinned */
long g4_pool_tid(const g4_pool *p, int i);  /* Linux thread id of worker i (0: last caller) */
/* Runs fn(ctx, i, n) on every worker i (the caller does i = 0) and returns when all are done.
 * Not reentrant: callers serialise (the Cython layer holds a lock). */
void g4_pool_run(g4_pool *p, g4_task_fn fn, void *ctx);
/* A 64-byte aligned scratch area of at least `bytes`, kept between calls; NULL on OOM. */
void *g4_pool_scratch(g4_pool *p, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
