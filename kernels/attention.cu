/* Causal attention on the CUDA backend: the heads of qkv permuted into
 * contiguous (B, NH, T, hs) tensors (attention.cuh), the products as
 * strided-batched cuBLAS calls over the B NH heads (gemm.cuh), the causal
 * softmax and its backward one block per row (softmax.cuh). att keeps
 * the CPU's layout (B, NH, T, T), zero above the diagonal; the scratch
 * the caller passes holds d(scores). The permuted copies live in the
 * plugin's scratch. */
#include <math.h>
#include "attention.cuh"
#include "plugin.h"
#include "softmax.cuh"

__global__ void attention_permute_kernel(float *q, float *k, float *v, const float *qkv, int B,
                                         int T, int C, int NH)
{
    attention_permute_thread(DM_THREAD_HERE, q, k, v, qkv, B, T, C, NH);
}

__global__ void attention_unpermute_kernel(float *out, const float *y, int B, int T, int C,
                                           int NH)
{
    attention_unpermute_thread(DM_THREAD_HERE, out, y, B, T, C, NH);
}

__global__ void attention_split_heads_kernel(float *y, const float *out, int B, int T, int C,
                                             int NH)
{
    attention_split_heads_thread(DM_THREAD_HERE, y, out, B, T, C, NH);
}

__global__ void attention_gradient_kernel(float *dqkv, const float *dq, const float *dk,
                                          const float *dv, int B, int T, int C, int NH)
{
    attention_gradient_thread(DM_THREAD_HERE, dqkv, dq, dk, dv, B, T, C, NH);
}

/* one block per row of att (rows = B NH T): query r % T sees keys 0 .. r % T */
__global__ void attention_softmax_forward_kernel(float *att, int T)
{
    extern __shared__ float shared[];
    float *most = shared, *sum = shared + blockDim.x;
    struct dm_thread t = DM_THREAD_HERE;
    float *row = att + t.block * T;
    int valid = (int)(t.block % T) + 1;
    softmax_max_phase(t, most, row, valid);
    __syncthreads();
    dm_block_max(most);
    softmax_exp_phase(t, sum, most, row, row, valid);
    __syncthreads();
    dm_block_sum(sum);
    softmax_normalize_phase(t, row, sum, valid, T);
}

__global__ void attention_softmax_backward_kernel(float *dscores, const float *att, float scale,
                                                  int T)
{
    extern __shared__ float dot[];
    struct dm_thread t = DM_THREAD_HERE;
    attention_softmax_backward_dot_phase(t, dot, att, dscores, T);
    __syncthreads();
    dm_block_sum(dot);
    attention_softmax_backward_phase(t, dscores, dot, att, scale, T);
}

static unsigned grid_of(long n)
{
    return dm_grid_for(n, DM_CUDA_THREADS);
}

void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH)
{
    int hs = C / NH, items = B * NH;
    long per = (long)items * T * hs;
    float *q = dm_cuda_scratch(SCRATCH_ATTENTION, 4 * per), *k = q + per, *v = k + per;
    float *y = v + per;
    float scale = (float)(1.0 / sqrt((double)hs));
    cudaStream_t s = dm_cuda_stream();
    attention_permute_kernel<<<grid_of(per), DM_CUDA_THREADS, 0, s>>>(q, k, v, qkv, B, T, C, NH);
    LAUNCH_CHECK(attention_permute_kernel);
    dm_cuda_gemm(dm_gemm_attention_scores(att, q, k, items, T, hs, scale));
    attention_softmax_forward_kernel<<<(unsigned)((long)items * T), DM_CUDA_THREADS,
                                       2 * DM_CUDA_THREADS * sizeof(float), s>>>(att, T);
    LAUNCH_CHECK(attention_softmax_forward_kernel);
    dm_cuda_gemm(dm_gemm_attention_values(y, att, v, items, T, hs));
    attention_unpermute_kernel<<<grid_of(per), DM_CUDA_THREADS, 0, s>>>(out, y, B, T, C, NH);
    LAUNCH_CHECK(attention_unpermute_kernel);
}

void cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, items = B * NH;
    long per = (long)items * T * hs;
    float *q = dm_cuda_scratch(SCRATCH_ATTENTION, 7 * per), *k = q + per, *v = k + per;
    float *dy = v + per, *dq = dy + per, *dk = dq + per, *dv = dk + per;
    float scale = (float)(1.0 / sqrt((double)hs));
    cudaStream_t s = dm_cuda_stream();
    attention_permute_kernel<<<grid_of(per), DM_CUDA_THREADS, 0, s>>>(q, k, v, qkv, B, T, C, NH);
    LAUNCH_CHECK(attention_permute_kernel);
    attention_split_heads_kernel<<<grid_of(per), DM_CUDA_THREADS, 0, s>>>(dy, dout, B, T, C, NH);
    LAUNCH_CHECK(attention_split_heads_kernel);
    dm_cuda_gemm(dm_gemm_attention_dprobs(scratch, dy, v, items, T, hs));
    attention_softmax_backward_kernel<<<(unsigned)((long)items * T), DM_CUDA_THREADS,
                                        DM_CUDA_THREADS * sizeof(float), s>>>(scratch, att,
                                                                              scale, T);
    LAUNCH_CHECK(attention_softmax_backward_kernel);
    dm_cuda_gemm(dm_gemm_attention_dq(dq, scratch, k, items, T, hs));
    dm_cuda_gemm(dm_gemm_attention_dk(dk, scratch, q, items, T, hs));
    dm_cuda_gemm(dm_gemm_attention_dv(dv, att, dy, items, T, hs));
    attention_gradient_kernel<<<grid_of(3 * (long)B * T * C), DM_CUDA_THREADS, 0, s>>>(
        dqkv, dq, dk, dv, B, T, C, NH);
    LAUNCH_CHECK(attention_gradient_kernel);
}
