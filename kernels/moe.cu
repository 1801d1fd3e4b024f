/* The mixture-of-experts kernels of the CUDA backend (moe.cuh): the
 * routing (one thread per token; the balancing losses' sums one thread
 * per expert) and its backward (per token), and the combine, its backward
 * and the dispatch's backward, element-wise over the routing's row and
 * gate arrays, so that with local experts only the choice (and the
 * assignment of rows the host makes of it) crosses, not the logits or
 * the block's rows. */
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

__global__ void moe_route_forward_kernel(float *scores, float *lse, int *choice,
                                         float *choice_score, float *gate, const float *logits,
                                         const float *bias, int N, int E, int k, int sigmoid)
{
    moe_route_forward_thread(DM_THREAD_HERE, scores, lse, choice, choice_score, gate, logits,
                             bias, N, E, k, sigmoid);
}

__global__ void moe_route_sums_kernel(double *sums, const float *scores, const float *lse, int N,
                                      int E, int sigmoid)
{
    moe_route_sums_thread(DM_THREAD_HERE, sums, scores, lse, N, E, sigmoid);
}

__global__ void moe_route_backward_kernel(float *dlogits, const float *dgate,
                                          const float *logits, const float *scores,
                                          const float *lse, const int *choice, const float *gate,
                                          const int *selected, int N, int E, int k, int sigmoid,
                                          double alpha, double beta)
{
    moe_route_backward_thread(DM_THREAD_HERE, dlogits, dgate, logits, scores, lse, choice, gate,
                              selected, N, E, k, sigmoid, alpha, beta);
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

void cuda_moe_route_forward(float *scores, float *lse, int *choice, float *choice_score,
                            float *gate, const float *logits, const float *bias, int N, int E,
                            int k, int sigmoid)
{
    if (N == 0) return;
    moe_route_forward_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                               dm_cuda_stream()>>>(scores, lse, choice, choice_score, gate,
                                                   logits, bias, N, E, k, sigmoid);
    LAUNCH_CHECK(moe_route_forward_kernel);
}

void cuda_moe_route_sums(double *sums, const float *scores, const float *lse, int N, int E,
                         int sigmoid)
{
    moe_route_sums_kernel<<<dm_grid_for((long)E + 1, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                            dm_cuda_stream()>>>(sums, scores, lse, N, E, sigmoid);
    LAUNCH_CHECK(moe_route_sums_kernel);
}

void cuda_moe_route_backward(float *dlogits, const float *dgate, const float *logits,
                             const float *scores, const float *lse, const int *choice,
                             const float *gate, const int *selected, int N, int E, int k,
                             int sigmoid, double alpha, double beta)
{
    if (N == 0) return;
    moe_route_backward_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                dm_cuda_stream()>>>(dlogits, dgate, logits, scores, lse, choice,
                                                    gate, selected, N, E, k, sigmoid, alpha,
                                                    beta);
    LAUNCH_CHECK(moe_route_backward_kernel);
}
