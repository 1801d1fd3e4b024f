/* Early exit's confidence kernels of the CUDA backend (exit.cuh): one
 * thread per active token, so only the n confidences, not the exit
 * head's probabilities or the block's rows, need come down to the host
 * that decides. */
#include "exit.cuh"
#include "plugin.h"

__global__ void exit_softmax_confidence_kernel(float *conf, const float *probs, int n, int V)
{
    exit_softmax_confidence_thread(DM_THREAD_HERE, conf, probs, n, V);
}

__global__ void exit_saturation_confidence_kernel(float *conf, const float *in,
                                                  const float *out, const int *rows, int n,
                                                  int C)
{
    exit_saturation_confidence_thread(DM_THREAD_HERE, conf, in, out, rows, n, C);
}

void cuda_exit_softmax_confidence(float *conf, const float *probs, int n, int V)
{
    if (n == 0) return;
    exit_softmax_confidence_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                     dm_cuda_stream()>>>(conf, probs, n, V);
    LAUNCH_CHECK(exit_softmax_confidence_kernel);
}

void cuda_exit_saturation_confidence(float *conf, const float *in, const float *out,
                                     const int *rows, int n, int C)
{
    if (n == 0) return;
    exit_saturation_confidence_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                        dm_cuda_stream()>>>(conf, in, out, rows, n, C);
    LAUNCH_CHECK(exit_saturation_confidence_kernel);
}
