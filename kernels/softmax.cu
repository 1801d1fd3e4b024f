/* The softmax cross-entropy kernels of the CUDA backend (softmax.cuh):
 * the forward one block per row (max, exponentials, sum by tree
 * reductions), the backward element-wise (the CPU's bits). */
#include "plugin.h"
#include "softmax.cuh"

__global__ void crossentropy_forward_kernel(float *losses, float *probs, const float *logits,
                                            const int *targets, int V)
{
    extern __shared__ float shared[];
    float *most = shared, *sum = shared + blockDim.x;
    struct dm_thread t = DM_THREAD_HERE;
    const float *row = logits + t.block * V;
    float *p = probs + t.block * V;
    softmax_max_phase(t, most, row, V);
    __syncthreads();
    dm_block_max(most);
    softmax_exp_phase(t, sum, most, p, row, V);
    __syncthreads();
    dm_block_sum(sum);
    softmax_normalize_phase(t, p, sum, V, V);
    crossentropy_loss_phase(t, losses, most, sum, logits, targets, V);
}

__global__ void crossentropy_backward_kernel(float *dlogits, const float *probs,
                                             const int *targets, float scale, int N, int V)
{
    crossentropy_backward_thread(DM_THREAD_HERE, dlogits, probs, targets, scale, N, V);
}

void cuda_crossentropy_forward(float *losses, float *probs, const float *logits,
                               const int *targets, int N, int V)
{
    if (N == 0) return;
    size_t shared = 2 * DM_CUDA_THREADS * sizeof(float);
    crossentropy_forward_kernel<<<N, DM_CUDA_THREADS, shared, dm_cuda_stream()>>>(
        losses, probs, logits, targets, V);
    LAUNCH_CHECK(crossentropy_forward_kernel);
}

void cuda_crossentropy_softmax_backward(float *dlogits, const float *probs, const int *targets,
                                        float dloss_scale, int N, int V)
{
    crossentropy_backward_kernel<<<dm_grid_for((long)N * V, DM_CUDA_THREADS), DM_CUDA_THREADS,
                                   0, dm_cuda_stream()>>>(dlogits, probs, targets, dloss_scale,
                                                          N, V);
    LAUNCH_CHECK(crossentropy_backward_kernel);
}
