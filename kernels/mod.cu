/* The mixture-of-depths kernels of the CUDA backend (mod.cuh): the
 * router and the top-k choice, the causal predictor, and the combination
 * of the block over the chosen tokens forward and backward, the CPU's
 * bits and choices. */
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

__global__ void mod_predictor_kernel(float *loss, float *grad, float *hidden, int *chosen,
                                     const float *in, const float *weight, const int *target,
                                     int N, int C, int H)
{
    mod_predictor_thread(DM_THREAD_HERE, loss, grad, hidden, chosen, in, weight, target, N, C,
                         H);
}

__global__ void mod_predictor_dweight_kernel(float *dweight, float scale, const float *grad,
                                             const float *hidden, const float *in,
                                             const float *weight, int N, int C, int H)
{
    mod_predictor_dweight_thread(DM_THREAD_HERE, dweight, scale, grad, hidden, in, weight, N,
                                 C, H);
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

/* scratch: loss (N + 1), grad (N + 1), the hidden pre-activations (N, H) */
float cuda_mod_predictor_forward_backward(float *dweight, float scale, int *chosen,
                                          const float *in, const float *weight,
                                          const int *target, int N, int C, int H)
{
    float *loss = dm_cuda_scratch(SCRATCH_MOD, (2 + (size_t)H) * N + 2), *grad = loss + N + 1;
    float *hidden = grad + N + 1;
    long P = mod_predictor_params(C, H);
    mod_predictor_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                           dm_cuda_stream()>>>(loss, grad, hidden, chosen, in, weight, target, N,
                                               C, H);
    LAUNCH_CHECK(mod_predictor_kernel);
    if (!target) return 0.0f;
    if (dweight) {
        mod_predictor_dweight_kernel<<<dm_grid_for(P, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                       dm_cuda_stream()>>>(dweight, scale, grad, hidden, in,
                                                           weight, N, C, H);
        LAUNCH_CHECK(mod_predictor_dweight_kernel);
    }
    return mean_loss(loss, N);
}

__global__ void mod_combine_forward_kernel(float *out, const float *gathered_in,
                                           const float *gathered_out, const float *router,
                                           const int *rows, int n, int C)
{
    mod_combine_forward_thread(DM_THREAD_HERE, out, gathered_in, gathered_out, router, rows, n,
                               C);
}

__global__ void mod_scale_chosen_kernel(float *work, const float *din, const float *router,
                                        const int *rows, int n, int C)
{
    mod_scale_chosen_thread(DM_THREAD_HERE, work, din, router, rows, n, C);
}

__global__ void mod_combine_dr_kernel(float *dr, const float *din, const float *gathered_in,
                                      const float *gathered_out, const int *rows, int n, int C)
{
    mod_combine_dr_thread(DM_THREAD_HERE, dr, din, gathered_in, gathered_out, rows, n, C);
}

__global__ void mod_combine_din_kernel(float *din, const float *dr, const float *work,
                                       const float *router, const float *router_weight,
                                       const int *rows, int n, int C)
{
    mod_combine_din_thread(DM_THREAD_HERE, din, dr, work, router, router_weight, rows, n, C);
}

__global__ void mod_combine_dweight_kernel(float *drouter_weight, const float *dr,
                                           const float *gathered_in, int n, int C)
{
    mod_dweight_thread(DM_THREAD_HERE, drouter_weight, dr, gathered_in, n, C);
}

void cuda_mod_combine_forward(float *out, const float *gathered_in, const float *gathered_out,
                              const float *router, const int *rows, int n, int C)
{
    if (n == 0) return;
    mod_combine_forward_kernel<<<dm_grid_for((long)n * C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                 dm_cuda_stream()>>>(out, gathered_in, gathered_out, router,
                                                     rows, n, C);
    LAUNCH_CHECK(mod_combine_forward_kernel);
}

void cuda_mod_scale_chosen(float *work, const float *din, const float *router, const int *rows,
                           int n, int C)
{
    if (n == 0) return;
    mod_scale_chosen_kernel<<<dm_grid_for((long)n * C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                              dm_cuda_stream()>>>(work, din, router, rows, n, C);
    LAUNCH_CHECK(mod_scale_chosen_kernel);
}

/* dr per token into the scratch (stream order keeps it apart from the
 * predictor's use of the same slot), then din, then the weight gradient */
void cuda_mod_combine_backward(float *din, float *drouter_weight, const float *gathered_in,
                               const float *gathered_out, const float *work, const float *router,
                               const float *router_weight, const int *rows, int n, int C)
{
    if (n == 0) return;
    float *dr = dm_cuda_scratch(SCRATCH_MOD, (size_t)n);
    mod_combine_dr_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                            dm_cuda_stream()>>>(dr, din, gathered_in, gathered_out, rows, n, C);
    LAUNCH_CHECK(mod_combine_dr_kernel);
    mod_combine_din_kernel<<<dm_grid_for((long)n * C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                             dm_cuda_stream()>>>(din, dr, work, router, router_weight, rows, n,
                                                 C);
    LAUNCH_CHECK(mod_combine_din_kernel);
    if (!drouter_weight) return;
    mod_combine_dweight_kernel<<<dm_grid_for(C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                 dm_cuda_stream()>>>(drouter_weight, dr, gathered_in, n, C);
    LAUNCH_CHECK(mod_combine_dweight_kernel);
}
