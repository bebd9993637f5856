/*
 * A small fork-join thread pool tuned for per-token work: n-1 workers spin briefly on a
 * generation counter before sleeping, so dispatching one parallel region costs about a
 * microsecond, which matters when a decode step of a tiny model takes tens of microseconds.
 * The caller's thread is worker 0. Inside a region, kvp_pool_barrier synchronises all threads,
 * so a whole forward pass can run as one region with barriers between operations.
 */
#ifndef KVP_CORE_THREADPOOL_H
#define KVP_CORE_THREADPOOL_H

#include "core/err.h"

struct kvp_pool;

/* fn(ctx, ith, nth): ith in [0, nth). */
typedef void (*kvp_pool_fn)(void *ctx, int ith, int nth);

int kvp_pool_init(int n_threads, struct kvp_pool **out, struct kvp_err *err);
/* A pool for regions of a millisecond or more on a possibly shared machine (the trainer): every
 * wait (a worker for work, the caller for the region's end, the barrier) spins spin_limit polls
 * and then sleeps, so a thread waiting for a descheduled one does not burn the CPU. */
int kvp_pool_init_sleepy(int n_threads, int spin_limit, struct kvp_pool **out,
                         struct kvp_err *err);
void kvp_pool_free(struct kvp_pool *p);
int kvp_pool_size(const struct kvp_pool *p);

/* Run fn on every thread and return when all are done. Not reentrant. */
void kvp_pool_run(struct kvp_pool *p, kvp_pool_fn fn, void *ctx);

/* Wait until every thread of the running region reaches the barrier. Only valid inside
 * kvp_pool_run. */
void kvp_pool_barrier(struct kvp_pool *p);

/* Split [0, n) evenly: this thread's half-open range. */
static inline void kvp_split_range(long n, int ith, int nth, long *begin, long *end)
{
    long per = (n + nth - 1) / nth;
    long b = per * ith;
    long e = b + per;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

#endif
