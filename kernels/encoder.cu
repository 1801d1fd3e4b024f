/* The embedding kernels of the CUDA backend (encoder.cuh). The backward
 * runs one thread per channel over the tokens in order: no atomics, the
 * CPU's bits, and C-wide parallelism only (it is a small part of a step). */
#include "encoder.cuh"
#include "plugin.h"

__global__ void encoder_forward_kernel(float *out, const int *tokens, const float *wte,
                                       const float *wpe, int B, int T, int C)
{
    encoder_forward_thread(DM_THREAD_HERE, out, tokens, wte, wpe, B, T, C);
}

__global__ void encoder_backward_kernel(float *dwte, float *dwpe, const float *dout,
                                        const int *tokens, int B, int T, int C)
{
    encoder_backward_thread(DM_THREAD_HERE, dwte, dwpe, dout, tokens, B, T, C);
}

void cuda_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                          int B, int T, int C)
{
    encoder_forward_kernel<<<dm_grid_for((long)B * T * C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                             dm_cuda_stream()>>>(out, tokens, wte, wpe, B, T, C);
    LAUNCH_CHECK(encoder_forward_kernel);
}

void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                           int B, int T, int C)
{
    encoder_backward_kernel<<<dm_grid_for(C, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                              dm_cuda_stream()>>>(dwte, dwpe, dout, tokens, B, T, C);
    LAUNCH_CHECK(encoder_backward_kernel);
}
