/* The engine's staging pool (engine_internal.h): the host buffers that MPI
 * reads and writes for the step's device tensors (the tied embedding's
 * exchange, the replica sums, the engine parts' rows and gradients),
 * and the device buffers they are copied up into, one of each per
 * purpose, grown (at least doubled) when a step needs more and kept until
 * engine_destroy, so that a step allocates nothing after the first
 * (pinned allocation, cudaHostAlloc, is slow); migration's slabs too
 * (migrate.c). On a backend whose memory the host reads (the CPU) there
 * is no staging: staging_pool_host returns NULL and the callers hand MPI
 * the tensors themselves, as before.
 *
 * Must not: hold anything between two uses that a caller relies on (the
 * contents are scratch), or be used by two users of one purpose at once. */
#include "pipe/engine_internal.h"

void *staging_pool_host(struct staging_pool *pool, enum staging_purpose purpose, size_t bytes)
{
    const struct dm_backend *ops = backend_current();
    if (ops->host_access) return NULL;
    DM_ASSERT(purpose >= 0 && purpose < STAGING_PURPOSES);
    if (bytes > pool->host_bytes[purpose] || !pool->host[purpose]) {
        if (pool->host[purpose]) ops->free_host(pool->host[purpose]);
        /* at least twice what it held: a need that creeps up (a larger
         * migration each time) regrows it a few times, not every time */
        if (bytes < 2 * pool->host_bytes[purpose]) bytes = 2 * pool->host_bytes[purpose];
        pool->host[purpose] = ops->alloc_host(bytes ? bytes : 1);
        pool->host_bytes[purpose] = bytes;
    }
    return pool->host[purpose];
}

void *staging_pool_device(struct staging_pool *pool, enum staging_purpose purpose, size_t bytes)
{
    const struct dm_backend *ops = backend_current();
    DM_ASSERT(!ops->host_access && purpose >= 0 && purpose < STAGING_PURPOSES);
    if (bytes > pool->device_bytes[purpose] || !pool->device[purpose]) {
        if (pool->device[purpose]) ops->free(pool->device[purpose]);
        pool->device[purpose] = ops->alloc(bytes ? bytes : 1);
        pool->device_bytes[purpose] = bytes;
    }
    return pool->device[purpose];
}

void staging_pool_free(struct staging_pool *pool)
{
    const struct dm_backend *ops = backend_current();
    for (int k = 0; k < STAGING_PURPOSES; k++) {
        if (pool->host[k]) ops->free_host(pool->host[k]);
        if (pool->device[k]) ops->free(pool->device[k]);
        pool->host[k] = pool->device[k] = NULL;
        pool->host_bytes[k] = pool->device_bytes[k] = 0;
    }
}
