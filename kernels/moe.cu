/* The mixture-of-experts kernels of the CUDA backend (moe.cuh): the
 * combine, its backward and the dispatch's backward, element-wise over
 * the routing's row and gate arrays, so that with local experts only the
 * routing's small arrays cross to and from the host that routes, not the
 * block's rows. */
#include "moe.cuh"
#include "plugin.h"

__global__ void moe_combine_forward_kernel(float *out, const float *res1, const float *y,
                                           const float *gate, const int *row, int N, int k,
                                           int C)
{
    moe_combine_forward_thread(DM_THREAD_HERE, out, res1, y, gate, row, N, k, C);
}

__global__ void moe_combine_dy_kernel(float *dy, const float *dout, const float *gate,
                                      const int *row, int N, int k, int C)
{
    moe_combine_dy_thread(DM_THREAD_HERE, dy, dout, gate, row, N, k, C);
}

__global__ void moe_combine_dgate_kernel(float *dgate, const float *dout, const float *y,
                                         const int *row, int N, int k, int C)
{
    moe_combine_dgate_thread(DM_THREAD_HERE, dgate, dout, y, row, N, k, C);
}

__global__ void moe_dispatch_backward_kernel(float *d_ln2, const float *dx, const int *row,
                                             int N, int k, int C)
{
    moe_dispatch_backward_thread(DM_THREAD_HERE, d_ln2, dx, row, N, k, C);
}

void cuda_moe_combine_forward(float *out, const float *res1, const float *y, const float *gate,
                              const int *row, int N, int k, int C)
{
    if (N == 0) return;
    moe_combine_forward_kernel<<<dm_grid_for((long)N * C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                 dm_cuda_stream()>>>(out, res1, y, gate, row, N, k, C);
    LAUNCH_CHECK(moe_combine_forward_kernel);
}

void cuda_moe_combine_backward(float *dy, float *dgate, const float *dout, const float *y,
                               const float *gate, const int *row, int N, int k, int C)
{
    if (N == 0) return;
    moe_combine_dy_kernel<<<dm_grid_for((long)N * k * C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                            dm_cuda_stream()>>>(dy, dout, gate, row, N, k, C);
    LAUNCH_CHECK(moe_combine_dy_kernel);
    moe_combine_dgate_kernel<<<dm_grid_for((long)N * k, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                               dm_cuda_stream()>>>(dgate, dout, y, row, N, k, C);
    LAUNCH_CHECK(moe_combine_dgate_kernel);
}

void cuda_moe_dispatch_backward(float *d_ln2, const float *dx, const int *row, int N, int k,
                                int C)
{
    if (N == 0) return;
    moe_dispatch_backward_kernel<<<dm_grid_for((long)N * C, DM_CUDA_THREADS), DM_CUDA_THREADS,
                                   0, dm_cuda_stream()>>>(d_ln2, dx, row, N, k, C);
    LAUNCH_CHECK(moe_dispatch_backward_kernel);
}
