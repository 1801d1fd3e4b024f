/* The layernorm kernels of the CUDA backend (layernorm.cuh): the forward
 * and the input gradient one block per row with tree sums in shared
 * memory, the parameter gradients one thread per channel in the CPU's
 * order. No atomics. */
#include "layernorm.cuh"
#include "plugin.h"

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *weight, const float *bias, int C)
{
    extern __shared__ float shared[];
    float *sum = shared, *var = shared + blockDim.x;
    struct dm_thread t = DM_THREAD_HERE;
    layernorm_forward_sum_phase(t, sum, inp, C);
    __syncthreads();
    dm_block_sum(sum);
    layernorm_forward_var_phase(t, var, sum, inp, C);
    __syncthreads();
    dm_block_sum(var);
    layernorm_forward_out_phase(t, out, mean, rstd, sum, var, inp, weight, bias, C);
}

__global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dresidual,
                                               const float *dout, const float *inp,
                                               const float *weight, const float *mean,
                                               const float *rstd, int C)
{
    extern __shared__ float shared[];
    float *sum_d = shared, *sum_dn = shared + blockDim.x;
    struct dm_thread t = DM_THREAD_HERE;
    layernorm_backward_sums_phase(t, sum_d, sum_dn, dout, inp, weight, mean, rstd, C);
    __syncthreads();
    dm_block_sum(sum_d);
    dm_block_sum(sum_dn);
    layernorm_backward_dinp_phase(t, dinp, dresidual, sum_d, sum_dn, dout, inp, weight, mean,
                                  rstd, C);
}

__global__ void layernorm_backward_params_kernel(float *dweight, float *dbias, const float *dout,
                                                 const float *inp, const float *mean,
                                                 const float *rstd, int N, int C)
{
    layernorm_backward_params_thread(DM_THREAD_HERE, dweight, dbias, dout, inp, mean, rstd, N,
                                     C);
}

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C)
{
    if (N == 0) return;
    size_t shared = 2 * DM_CUDA_THREADS * sizeof(float);
    layernorm_forward_kernel<<<N, DM_CUDA_THREADS, shared, dm_cuda_stream()>>>(
        out, mean, rstd, inp, weight, bias, C);
    LAUNCH_CHECK(layernorm_forward_kernel);
}

void cuda_layernorm_backward_residual(float *dinp, const float *dresidual, float *dweight,
                                      float *dbias, const float *dout, const float *inp,
                                      const float *weight, const float *mean, const float *rstd,
                                      int N, int C)
{
    if (N == 0) return;
    if (dinp) {
        size_t shared = 2 * DM_CUDA_THREADS * sizeof(float);
        layernorm_backward_dinp_kernel<<<N, DM_CUDA_THREADS, shared, dm_cuda_stream()>>>(
            dinp, dresidual, dout, inp, weight, mean, rstd, C);
        LAUNCH_CHECK(layernorm_backward_dinp_kernel);
    }
    if (dweight || dbias) {
        layernorm_backward_params_kernel<<<dm_grid_for(C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                           dm_cuda_stream()>>>(dweight, dbias, dout, inp, mean,
                                                               rstd, N, C);
        LAUNCH_CHECK(layernorm_backward_params_kernel);
    }
}

void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C)
{
    cuda_layernorm_backward_residual(dinp, NULL, dweight, dbias, dout, inp, weight, mean, rstd,
                                     N, C);
}
