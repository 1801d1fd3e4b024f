/* The pruning kernels of the CUDA backend (prune.cuh): one round's
 * histogram of the radix select (a thread per chunk of weights, then a
 * thread per bucket adding the chunks in order) and the masking by the
 * cut (a thread per weight), so that a pruning step moves histograms and
 * masks between host and device, never a block's slab. */
#include "prune.cuh"
#include "plugin.h"

__global__ void prune_histogram_chunk_kernel(long *partial, const float *weights, long n,
                                             uint32_t base, uint64_t prefix, int shift)
{
    prune_histogram_chunk_thread(DM_THREAD_HERE, partial, weights, n, base, prefix, shift);
}

__global__ void prune_histogram_sum_kernel(long *counts, const long *partial, long n)
{
    prune_histogram_sum_thread(DM_THREAD_HERE, counts, partial, n);
}

__global__ void prune_mask_kernel(unsigned char *mask, float *params, float *grads, float *m,
                                  float *v, long n, uint32_t base, uint64_t cut)
{
    prune_mask_thread(DM_THREAD_HERE, mask, params, grads, m, v, n, base, cut);
}

void cuda_prune_histogram(long *counts, long *partial, const float *weights, long n,
                          unsigned int base, unsigned long long prefix, int shift)
{
    if (n == 0) return;
    prune_histogram_chunk_kernel<<<dm_grid_for(dm_prune_chunks(n), DM_CUDA_THREADS),
                                   DM_CUDA_THREADS, 0, dm_cuda_stream()>>>(partial, weights, n,
                                                                           base, prefix, shift);
    LAUNCH_CHECK(prune_histogram_chunk_kernel);
    prune_histogram_sum_kernel<<<dm_grid_for(DM_PRUNE_BUCKETS, DM_CUDA_THREADS), DM_CUDA_THREADS,
                                 0, dm_cuda_stream()>>>(counts, partial, n);
    LAUNCH_CHECK(prune_histogram_sum_kernel);
}

void cuda_prune_mask(unsigned char *mask, float *params, float *grads, float *m, float *v, long n,
                     unsigned int base, unsigned long long cut)
{
    if (n == 0) return;
    prune_mask_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                        dm_cuda_stream()>>>(mask, params, grads, m, v, n, base, cut);
    LAUNCH_CHECK(prune_mask_kernel);
}
