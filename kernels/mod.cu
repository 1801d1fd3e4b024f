/* The mixture-of-depths kernels of the CUDA backend (mod.cuh): the
 * router and the top-k choice, the CPU's bits and choices. */
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
