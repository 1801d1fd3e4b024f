/* Hash-sparse attention on the CUDA backend (hash.cuh): buckets, the
 * stable orders and the tile count with the CPU's bits, then one thread
 * per query (forward, dq) or key (dk, dv) over the partners of its
 * bucket (and its own key). The rotation is drawn on the host
 * (hash_rotation_draw) and copied to the device by the caller. Returns the
 * tiles visited, and the forward the queries with their own key alone,
 * summed on the host in a fixed order from per-row counts. */
#include <stdlib.h>
#include "hash.cuh"
#include "plugin.h"

__global__ void hash_bucket_kernel(int *bucket, const float *qkv, const float *rotation, int B,
                                   int T, int C, int NH, int buckets)
{
    hash_bucket_thread(DM_THREAD_HERE, bucket, qkv, rotation, B, T, C, NH, buckets);
}

__global__ void hash_order_kernel(int *order, const int *bucket, int B, int NH, int T)
{
    hash_order_thread(DM_THREAD_HERE, order, bucket, B, NH, T);
}

__global__ void hash_tiles_kernel(long *tiles, long *alone, const int *order,
                                  const int *bucket, int B, int NH, int T)
{
    hash_tiles_thread(DM_THREAD_HERE, tiles, alone, order, bucket, B, NH, T);
}

__global__ void hash_forward_kernel(float *out, float *lse, const int *order, const int *bucket,
                                    const float *qkv, int B, int T, int C, int NH)
{
    hash_forward_thread(DM_THREAD_HERE, out, lse, order, bucket, qkv, B, T, C, NH);
}

__global__ void hash_delta_kernel(float *delta, const float *dout, const float *out, int B, int T,
                                  int C, int NH)
{
    hash_delta_thread(DM_THREAD_HERE, delta, dout, out, B, T, C, NH);
}

__global__ void hash_dq_kernel(float *dqkv, const float *dout, const float *qkv,
                               const float *lse, const float *delta, const int *order,
                               const int *bucket, int B, int T, int C, int NH)
{
    hash_dq_thread(DM_THREAD_HERE, dqkv, dout, qkv, lse, delta, order, bucket, B, T, C, NH);
}

__global__ void hash_dkv_kernel(float *dqkv, const float *dout, const float *qkv,
                                const float *lse, const float *delta, const int *order,
                                const int *bucket, int B, int T, int C, int NH)
{
    hash_dkv_thread(DM_THREAD_HERE, dqkv, dout, qkv, lse, delta, order, bucket, B, T, C, NH);
}

static unsigned grid_of(long n)
{
    return dm_grid_for(n, DM_CUDA_THREADS);
}

/* the tiles of (B, NH) items with an allowed pair, and with alone the
 * queries that attend to their own key alone, counted on the device */
static long count_tiles(long *alone, const int *order, const int *bucket, int B, int NH, int T)
{
    long rows = (T + DM_HASH_TILE - 1) / DM_HASH_TILE, n = (long)B * NH * rows, total = 0;
    long counts = alone ? 2 * n : n;
    long *tiles = (long *)dm_cuda_scratch(SCRATCH_HASH_TILES,
                                          (size_t)counts * sizeof(long) / sizeof(float));
    hash_tiles_kernel<<<grid_of(n), DM_CUDA_THREADS, 0, dm_cuda_stream()>>>(
        tiles, alone ? tiles + n : NULL, order, bucket, B, NH, T);
    LAUNCH_CHECK(hash_tiles_kernel);
    long *host = (long *)malloc((size_t)counts * sizeof(long));
    if (!host) dm_cuda_fail(__FILE__, __LINE__, "malloc", "out of memory");
    CUDA_CHECK(cudaMemcpyAsync(host, tiles, (size_t)counts * sizeof(long),
                               cudaMemcpyDeviceToHost, dm_cuda_stream()));
    dm_cuda_stream_wait(dm_cuda_stream());
    for (long i = 0; i < n; i++) total += host[i];
    if (alone) {
        *alone = 0;
        for (long i = n; i < 2 * n; i++) *alone += host[i];
    }
    free(host);
    return total;
}

long cuda_hash_attention_forward(float *out, float *lse, int *order, int *bucket, long *alone,
                                 const float *qkv, const float *rotation, int B, int T, int C,
                                 int NH, int buckets)
{
    long sides = (long)B * NH * 2 * T, queries = (long)B * NH * T;
    cudaStream_t s = dm_cuda_stream();
    hash_bucket_kernel<<<grid_of(sides), DM_CUDA_THREADS, 0, s>>>(
        bucket, qkv, buckets > 1 ? rotation : NULL, B, T, C, NH, buckets);
    LAUNCH_CHECK(hash_bucket_kernel);
    hash_order_kernel<<<grid_of(sides), DM_CUDA_THREADS, 0, s>>>(order, bucket, B, NH, T);
    LAUNCH_CHECK(hash_order_kernel);
    hash_forward_kernel<<<grid_of(queries), DM_CUDA_THREADS, 0, s>>>(out, lse, order, bucket, qkv,
                                                                     B, T, C, NH);
    LAUNCH_CHECK(hash_forward_kernel);
    return count_tiles(alone, order, bucket, B, NH, T);
}

long cuda_hash_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, const int *order,
                                  const int *bucket, int B, int T, int C, int NH)
{
    long queries = (long)B * NH * T;
    float *delta = dm_cuda_scratch(SCRATCH_HASH_DELTA, (size_t)queries);
    cudaStream_t s = dm_cuda_stream();
    hash_delta_kernel<<<grid_of(queries), DM_CUDA_THREADS, 0, s>>>(delta, dout, out, B, T, C, NH);
    LAUNCH_CHECK(hash_delta_kernel);
    hash_dq_kernel<<<grid_of(queries), DM_CUDA_THREADS, 0, s>>>(dqkv, dout, qkv, lse, delta,
                                                                order, bucket, B, T, C, NH);
    LAUNCH_CHECK(hash_dq_kernel);
    hash_dkv_kernel<<<grid_of(queries), DM_CUDA_THREADS, 0, s>>>(dqkv, dout, qkv, lse, delta,
                                                                 order, bucket, B, T, C, NH);
    LAUNCH_CHECK(hash_dkv_kernel);
    return count_tiles(NULL, order, bucket, B, NH, T);
}
