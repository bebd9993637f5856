/*
 * Fork-join thread pool (see threadpool.h).
 *
 * Dispatch: the caller bumps a generation counter; workers spin on it for a short while (so
 * back-to-back regions of a decode step do not pay for a futex wake-up), then fall back to a
 * condition variable. The barrier is a sense-reversing counter barrier with the same spin.
 * A pool made with kvp_pool_init_sleepy also sleeps on a condition variable in the barrier and
 * while the caller waits for the region to end, once its spin budget is spent.
 */
#include "core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The spin-wait hint: PAUSE on x86, YIELD on ARM (both tell the core that it is spinning, which
 * saves power and frees a sibling hyper-thread); nothing elsewhere. */
static inline void kvp_spin_pause(void)
{
#if defined(__x86_64__)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

#define KVP_POOL_SPIN 20000 /* polls (pauses, then yields; a few ms) before a worker sleeps */

struct kvp_pool {
    int n_threads;
    pthread_t *threads; /* [n_threads - 1] workers; the caller is thread 0 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t cv_wait; /* sleepy pools: region end and barrier release */
    int spin_limit;         /* polls before a wait sleeps; 0: the waits never sleep */
    atomic_uint generation;   /* bumped once per region */
    atomic_int n_done;        /* workers finished with the current region */
    atomic_int stop;
    kvp_pool_fn fn;
    void *ctx;
    /* barrier */
    atomic_int bar_count;
    atomic_uint bar_sense;
};

/* Wait politely: spin briefly (the other threads are usually microseconds away), then yield the
 * core so that an oversubscribed machine (more runnable threads than cores) still makes progress
 * instead of burning whole time slices in the spin. */
static inline void relax(int spins)
{
    if (spins < 2000)
        kvp_spin_pause();
    else
        sched_yield();
}

/* Sleepy pools: wake whoever sleeps in wait_until (taking the mutex orders the wake-up after the
 * waiter's check of the condition). */
static void wake_waiters(struct kvp_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    pthread_cond_broadcast(&pool->cv_wait);
    pthread_mutex_unlock(&pool->mu);
}

/* Wait until *u != old (u given) or *v >= target: spin, then (sleepy pools) sleep. */
static void wait_until(struct kvp_pool *pool, atomic_uint *u, atomic_int *v, unsigned old,
                       int target)
{
#define KVP_WAIT_DONE_                                                                             \
    (u ? atomic_load_explicit(u, memory_order_acquire) != old                                     \
       : atomic_load_explicit(v, memory_order_acquire) >= target)
    for (int spins = 0; !KVP_WAIT_DONE_; spins++) {
        if (pool->spin_limit && spins >= pool->spin_limit) {
            pthread_mutex_lock(&pool->mu);
            while (!KVP_WAIT_DONE_)
                pthread_cond_wait(&pool->cv_wait, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
            return;
        }
        relax(spins);
    }
#undef KVP_WAIT_DONE_
}

struct worker_arg {
    struct kvp_pool *pool;
    int ith;
};

static void *worker_main(void *p)
{
    struct worker_arg *arg = p;
    struct kvp_pool *pool = arg->pool;
    int ith = arg->ith;
    free(arg);
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        int spin = pool->spin_limit ? pool->spin_limit : KVP_POOL_SPIN;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load(&pool->stop)) {
            if (++spins < spin) {
                relax(spins);
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop))
            return NULL;
        seen = gen;
        pool->fn(pool->ctx, ith, pool->n_threads);
        if (atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_acq_rel) ==
                pool->n_threads - 2 &&
            pool->spin_limit)
            wake_waiters(pool);
    }
}

int kvp_pool_init(int n_threads, struct kvp_pool **out, struct kvp_err *err)
{
    return kvp_pool_init_sleepy(n_threads, 0, out, err);
}

int kvp_pool_init_sleepy(int n_threads, int spin_limit, struct kvp_pool **out,
                         struct kvp_err *err)
{
    if (n_threads < 1 || n_threads > 256)
        return kvp_err_set(err, KVP_EINVAL, "thread count %d out of range 1..256", n_threads);
    struct kvp_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return kvp_err_set(err, KVP_ENOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    p->spin_limit = spin_limit > 0 ? spin_limit : 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->cv_wait, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads)
            goto fail_free_pool;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *arg = malloc(sizeof(*arg));
        if (!arg)
            goto fail_stop;
        arg->pool = p;
        arg->ith = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            p->n_threads = i; /* join only what started */
            goto fail_stop;
        }
    }
    *out = p;
    return 0;

fail_stop:
    kvp_pool_free(p);
    return kvp_err_set(err, KVP_ENOMEM, "thread pool: cannot start %d threads", n_threads);
fail_free_pool:
    free(p);
    return kvp_err_set(err, KVP_ENOMEM, "thread pool: out of memory");
}

void kvp_pool_free(struct kvp_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++)
        pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->cv_wait);
    free(p);
}

int kvp_pool_size(const struct kvp_pool *p)
{
    return p ? p->n_threads : 1;
}

void kvp_pool_run(struct kvp_pool *p, kvp_pool_fn fn, void *ctx)
{
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->n_done, 0);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n_threads);
    wait_until(p, NULL, &p->n_done, 0, p->n_threads - 1);
}

void kvp_pool_barrier(struct kvp_pool *p)
{
    if (!p || p->n_threads == 1)
        return;
    unsigned sense = atomic_load_explicit(&p->bar_sense, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) == p->n_threads - 1) {
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->bar_sense, 1, memory_order_release);
        if (p->spin_limit)
            wake_waiters(p);
        return;
    }
    wait_until(p, &p->bar_sense, NULL, sense, 0);
}
