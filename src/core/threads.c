/* The process-wide thread pool behind dm_parallel_for.
 *
 * OpenBLAS is set to one thread so that its threads never compete with
 * ours: every op, matmuls included, splits its own work here. Workers spin
 * briefly on a generation counter after each task (ops come back to back
 * within a step) and then sleep on a condition variable, so an idle rank
 * does not burn its core. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "dynmo/core.h"

void openblas_set_num_threads(int num_threads);

#define POOL_MAX 64
#define SPIN_ROUNDS 20000

static struct {
    int count;                       /* threads including the caller */
    pthread_t tids[POOL_MAX];
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_ulong generation;         /* bumped for every task */
    atomic_int pending;              /* workers still running the task */
    atomic_int sleepers;
    atomic_int stop;
    dm_range_fn fn;
    void *arg;
    long n, chunk;
} pool;

static void run_share(int tid)
{
    long begin = (long)tid * pool.chunk;
    long end = begin + pool.chunk;
    if (end > pool.n) end = pool.n;
    if (begin < end) pool.fn(pool.arg, begin, end);
}

static void *worker_main(void *arg)
{
    int tid = (int)(long)arg;
    unsigned long seen = 0;
    for (;;) {
        unsigned long gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            if (atomic_load(&pool.stop)) return NULL;
            if (++spins < SPIN_ROUNDS) {
                __builtin_ia32_pause();
                continue;
            }
            pthread_mutex_lock(&pool.lock);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.generation) == seen && !atomic_load(&pool.stop))
                pthread_cond_wait(&pool.wake, &pool.lock);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.lock);
            spins = 0;
        }
        seen = gen;
        if (atomic_load(&pool.stop)) return NULL;
        run_share(tid);
        atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_release);
    }
}

void dm_threads_init(int n)
{
    if (n < 1) n = 1;
    if (n > POOL_MAX) n = POOL_MAX;
    openblas_set_num_threads(1);
    if (pool.count) dm_threads_shutdown();
    pool.count = n;
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    atomic_store(&pool.generation, 0);
    atomic_store(&pool.stop, 0);
    atomic_store(&pool.sleepers, 0);
    for (int t = 1; t < n; t++) {
        if (pthread_create(&pool.tids[t], NULL, worker_main, (void *)(long)t) != 0)
            DM_FATAL("pthread_create failed for worker %d", t);
    }
}

int dm_threads_count(void) { return pool.count ? pool.count : 1; }

void dm_threads_shutdown(void)
{
    if (pool.count <= 1) {
        pool.count = 0;
        return;
    }
    pthread_mutex_lock(&pool.lock);
    atomic_store(&pool.stop, 1);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    for (int t = 1; t < pool.count; t++) pthread_join(pool.tids[t], NULL);
    pthread_mutex_destroy(&pool.lock);
    pthread_cond_destroy(&pool.wake);
    pool.count = 0;
}

void dm_parallel_for(long n, long grain, dm_range_fn fn, void *arg)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int threads = dm_threads_count();
    long units = (n + grain - 1) / grain;
    if (threads == 1 || units == 1) {
        fn(arg, 0, n);
        return;
    }
    if (units < threads) threads = (int)units;
    long per = (units + threads - 1) / threads;
    pool.fn = fn;
    pool.arg = arg;
    pool.n = n;
    pool.chunk = per * grain;
    int workers = pool.count - 1;
    atomic_store(&pool.pending, workers);
    atomic_fetch_add(&pool.generation, 1);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    run_share(0);
    int spins = 0;
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) {
        if (++spins < SPIN_ROUNDS) __builtin_ia32_pause();
        else sched_yield();
    }
}
