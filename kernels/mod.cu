/* The mixture-of-depths kernels of the CUDA backend (mod.cuh): the
 * router and the top-k choice, the CPU's bits and choices. */
#include <stdlib.h>
#include "mod.cuh"
#include "plugin.h"

__global__ void mod_router_kernel(float *router, const float *in, const float *weight, int N,
                                  int C)
{
    mod_router_thread(DM_THREAD_HERE, router, in, weight, N, C);
}

__global__ void mod_select_topk_kernel(int *chosen, const float *router, int B, int T, int k)
{
    mod_select_topk_thread(DM_THREAD_HERE, chosen, router, B, T, k);
}

void cuda_mod_router_forward(float *router, const float *in, const float *weight, int N, int C)
{
    mod_router_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                        dm_cuda_stream()>>>(router, in, weight, N, C);
    LAUNCH_CHECK(mod_router_kernel);
}

void cuda_mod_select_topk(int *chosen, const float *router, int B, int T, int k)
{
    mod_select_topk_kernel<<<dm_grid_for((long)B * T, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                             dm_cuda_stream()>>>(chosen, router, B, T, k);
    LAUNCH_CHECK(mod_select_topk_kernel);
}

__global__ void mod_predictor_kernel(float *loss, float *grad, int *chosen, const float *in,
                                     const float *weight, const int *target, int N, int C)
{
    mod_predictor_thread(DM_THREAD_HERE, loss, grad, chosen, in, weight, target, N, C);
}

__global__ void mod_predictor_dweight_kernel(float *dweight, const float *grad, const float *in,
                                             int N, int C)
{
    mod_predictor_dweight_thread(DM_THREAD_HERE, dweight, grad, in, N, C);
}

/* the mean of loss[0..N) in double, tokens in order (mod.c's) */
static float mean_loss(const float *loss, int N)
{
    float *host = (float *)malloc((size_t)N * sizeof(float) + 1);
    if (!host) dm_cuda_fail(__FILE__, __LINE__, "malloc", "out of memory");
    CUDA_CHECK(cudaMemcpyAsync(host, loss, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost,
                               dm_cuda_stream()));
    dm_cuda_stream_wait(dm_cuda_stream());
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += host[n];
    free(host);
    return (float)(sum / N);
}

float cuda_mod_predictor_forward_backward(float *dweight, int *chosen, const float *in,
                                          const float *weight, const int *target, int N, int C)
{
    float *loss = dm_cuda_scratch(SCRATCH_MOD, 2 * (size_t)N + 2), *grad = loss + N + 1;
    mod_predictor_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                           dm_cuda_stream()>>>(loss, grad, chosen, in, weight, target, N, C);
    LAUNCH_CHECK(mod_predictor_kernel);
    if (!target) return 0.0f;
    if (dweight) {
        mod_predictor_dweight_kernel<<<dm_grid_for(C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                       dm_cuda_stream()>>>(dweight, grad, in, N, C);
        LAUNCH_CHECK(mod_predictor_dweight_kernel);
    }
    return mean_loss(loss, N);
}
