/* g4_pool.h: a persistent pthread worker pool with per-worker CPU pinning.
 * Worker 0 is the calling thread (no hand-off latency); workers 1..n-1 are threads of the pool.
 * A pinned pool pins the caller to cpus[0] for the duration of each g4_pool_run and then gives
 * it back the affinity it had; g4_pool_enter/g4_pool_leave hold that pin across many runs (one
 * pair of affinity calls per session instead of three calls per run).
 * Workers may be split into contiguous groups (one per NUMA node): a task asks which group a
 * worker is in (g4_pool_group_of) and can give each group its own share (rows placed on its node).
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
 * while it runs a task or holds a session), or NULL for no pinning. NULL with msg on failure. */
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
/* Session: pin the calling thread to cpus[0] until the matching leave (nests). Only one thread
 * holds a session at a time; returns 1 if the caller holds it now, 0 if another thread does
 * (then the caller's runs pin and restore per run). No-op (returns 1) for an unpinned pool. */
int g4_pool_enter(g4_pool *p);
void g4_pool_leave(g4_pool *p);    /* restores the affinity saved by the outermost enter */
/* Groups: first[0] = 0 < first[1] < ... < first[n_groups] = n; group g = workers
 * [first[g], first[g+1]). Default: one group. Not while a task runs. 0, or -1 with msg. */
int g4_pool_set_groups(g4_pool *p, int n_groups, const int *first, char *msg, size_t msg_len);
int g4_pool_n_groups(const g4_pool *p);
int g4_pool_group_first(const g4_pool *p, int g);  /* first worker of group g (g = n_groups: n) */
/* For worker ith: its group, its index inside the group and the group's size. */
void g4_pool_group_of(const g4_pool *p, int ith, int *group, int *local, int *count);

#ifdef __cplusplus
}
#endif
#endif
