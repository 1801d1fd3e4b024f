/* The element-wise kernels of the CUDA backend: GELU forward and
 * backward, the residual sum, the row gathers. One kernel per op and
 * direction; the arithmetic is elementwise.cuh's (the CPU's bits). */
#include "elementwise.cuh"
#include "plugin.h"

__global__ void gelu_forward_kernel(float *out, const float *inp, long N)
{
    gelu_forward_thread(DM_THREAD_HERE, out, inp, N);
}

__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, long N)
{
    gelu_backward_thread(DM_THREAD_HERE, dinp, inp, dout, N);
}

__global__ void residual_forward_kernel(float *out, const float *a, const float *b, long N)
{
    residual_forward_thread(DM_THREAD_HERE, out, a, b, N);
}

__global__ void rows_gather_kernel(float *dst, const float *src, const int *rows, int n, int C)
{
    rows_gather_thread(DM_THREAD_HERE, dst, src, rows, n, C);
}

__global__ void rows_scatter_kernel(float *dst, const float *src, const int *rows, int n, int C,
                                    int add)
{
    rows_scatter_thread(DM_THREAD_HERE, dst, src, rows, n, C, add);
}

void cuda_gelu_forward(float *out, const float *inp, long N)
{
    gelu_forward_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                          dm_cuda_stream()>>>(out, inp, N);
    LAUNCH_CHECK(gelu_forward_kernel);
}

void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, long N)
{
    gelu_backward_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                           dm_cuda_stream()>>>(dinp, inp, dout, N);
    LAUNCH_CHECK(gelu_backward_kernel);
}

void cuda_residual_forward(float *out, const float *a, const float *b, long N)
{
    residual_forward_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                              dm_cuda_stream()>>>(out, a, b, N);
    LAUNCH_CHECK(residual_forward_kernel);
}

void cuda_rows_gather(float *dst, const float *src, const int *rows, int n, int C)
{
    if (n == 0) return;
    rows_gather_kernel<<<dm_grid_for((long)n * C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                         dm_cuda_stream()>>>(dst, src, rows, n, C);
    LAUNCH_CHECK(rows_gather_kernel);
}

void cuda_rows_scatter(float *dst, const float *src, const int *rows, int n, int C, int add)
{
    if (n == 0) return;
    rows_scatter_kernel<<<dm_grid_for((long)n * C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                          dm_cuda_stream()>>>(dst, src, rows, n, C, add);
    LAUNCH_CHECK(rows_scatter_kernel);
}
