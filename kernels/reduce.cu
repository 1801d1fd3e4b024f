/* The device reductions (reduce.cuh) and the device-side memory ops of
 * the table: zero, copy between device buffers. Every one runs on the
 * plugin's stream; sum_squares waits for its one double (polling). */
#include "plugin.h"
#include "reduce.cuh"

__global__ void sumsq_chunk_kernel(double *partial, const float *x, long n)
{
    sumsq_chunk_thread(DM_THREAD_HERE, partial, x, n);
}

__global__ void sumsq_total_kernel(double *total, const double *partial, long chunks)
{
    sumsq_total_thread(DM_THREAD_HERE, total, partial, chunks);
}

double cuda_sum_squares(const float *x, long n)
{
    long chunks = dm_sumsq_chunks(n);
    if (chunks == 0) return 0.0;
    /* partial sums, then the total after them, in double (2 floats each) */
    double *partial = (double *)dm_cuda_scratch(SCRATCH_REDUCE, 2 * (size_t)(chunks + 1));
    sumsq_chunk_kernel<<<dm_grid_for(chunks, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                         dm_cuda_stream()>>>(partial, x, n);
    LAUNCH_CHECK(sumsq_chunk_kernel);
    sumsq_total_kernel<<<1, 1, 0, dm_cuda_stream()>>>(partial + chunks, partial, chunks);
    LAUNCH_CHECK(sumsq_total_kernel);
    double total = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&total, partial + chunks, sizeof total, cudaMemcpyDeviceToHost,
                               dm_cuda_stream()));
    dm_cuda_stream_wait(dm_cuda_stream());
    return total;
}

void cuda_zero(void *dst, size_t bytes)
{
    if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, dm_cuda_stream()));
}

void cuda_copy_on_device(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, dm_cuda_stream()));
}
