/* Causal attention on the CUDA backend: the heads permuted out of their
 * rows into contiguous (B, NH, T, hs) tensors (attention.cuh), the
 * products as strided-batched cuBLAS calls over the B NH heads
 * (gemm.cuh), the causal softmax and its backward one block per row
 * (softmax.cuh). att is (B, NH, T, T) by position, zero above the
 * diagonal; the scratch the caller passes holds d(scores). The permuted
 * copies live in the plugin's scratch.
 *
 * Early exit's rows (only the active tokens ask, every token answers):
 * the compact queries are scattered into a zeroed full-length Q, the
 * dense attention runs, and the active rows are gathered back; inactive
 * rows get a zero output gradient, so they add nothing to dK and dV.
 * Exact, but it computes every query row: no faster than dense. Its att
 * is by position, not compact as on the CPU (only this backend's
 * backward reads it). */
#include <math.h>
#include "attention.cuh"
#include "elementwise.cuh"
#include "plugin.h"
#include "softmax.cuh"

__global__ void attention_permute_kernel(float *q, float *k, float *v, const float *qsrc,
                                         int ldq, const float *ksrc, const float *vsrc, int ldkv,
                                         int B, int T, int C, int NH)
{
    attention_permute_thread(DM_THREAD_HERE, q, k, v, qsrc, ldq, ksrc, vsrc, ldkv, B, T, C, NH);
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

__global__ void attention_gradient_kernel(float *dqdst, int ldq, float *dkdst, float *dvdst,
                                          int ldkv, const float *dq, const float *dk,
                                          const float *dv, int B, int T, int C, int NH)
{
    attention_gradient_thread(DM_THREAD_HERE, dqdst, ldq, dkdst, dvdst, ldkv, dq, dk, dv, B, T,
                              C, NH);
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

struct heads {
    float *q, *k, *v, *y, *dy, *dq, *dk, *dv;   /* (B, NH, T, hs) each */
    float *qfull, *full;                         /* (B T, C) each: rows version */
};

/* The plugin's scratch cut into the tensors above. */
static struct heads heads_scratch(int B, int T, int C)
{
    long per = (long)B * T * C;
    float *base = dm_cuda_scratch(SCRATCH_ATTENTION, 10 * per);
    struct heads h;
    float **slot[] = {&h.q, &h.k, &h.v, &h.y, &h.dy, &h.dq, &h.dk, &h.dv, &h.qfull, &h.full};
    for (int i = 0; i < 10; i++) *slot[i] = base + i * per;
    return h;
}

/* att = softmax(scale q k^T) causal, y = att v, over the B NH heads */
static void heads_forward(const struct heads *h, float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, items = B * NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    dm_cuda_gemm(dm_gemm_attention_scores(att, h->q, h->k, items, T, hs, scale));
    attention_softmax_forward_kernel<<<(unsigned)((long)items * T), DM_CUDA_THREADS,
                                       2 * DM_CUDA_THREADS * sizeof(float), dm_cuda_stream()>>>(
        att, T);
    LAUNCH_CHECK(attention_softmax_forward_kernel);
    dm_cuda_gemm(dm_gemm_attention_values(h->y, att, h->v, items, T, hs));
}

/* dq, dk, dv from dy, the saved att and q, k, v; scores: (B, NH, T, T) */
static void heads_backward(const struct heads *h, float *scores, const float *att, int B, int T,
                           int C, int NH)
{
    int hs = C / NH, items = B * NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    dm_cuda_gemm(dm_gemm_attention_dprobs(scores, h->dy, h->v, items, T, hs));
    attention_softmax_backward_kernel<<<(unsigned)((long)items * T), DM_CUDA_THREADS,
                                        DM_CUDA_THREADS * sizeof(float), dm_cuda_stream()>>>(
        scores, att, scale, T);
    LAUNCH_CHECK(attention_softmax_backward_kernel);
    dm_cuda_gemm(dm_gemm_attention_dq(h->dq, scores, h->k, items, T, hs));
    dm_cuda_gemm(dm_gemm_attention_dk(h->dk, scores, h->q, items, T, hs));
    dm_cuda_gemm(dm_gemm_attention_dv(h->dv, att, h->dy, items, T, hs));
}

static void permute(const struct heads *h, const float *qsrc, int ldq, const float *ksrc,
                    const float *vsrc, int ldkv, int B, int T, int C, int NH)
{
    attention_permute_kernel<<<grid_of((long)B * T * C), DM_CUDA_THREADS, 0, dm_cuda_stream()>>>(
        h->q, h->k, h->v, qsrc, ldq, ksrc, vsrc, ldkv, B, T, C, NH);
    LAUNCH_CHECK(attention_permute_kernel);
}

/* dst (B T, C) = src (n, C) at rows, every other row zero */
static void scatter_full(float *dst, const float *src, const int *rows, int n, int B, int T,
                         int C)
{
    CUDA_CHECK(cudaMemsetAsync(dst, 0, (size_t)B * T * C * sizeof(float), dm_cuda_stream()));
    cuda_rows_scatter(dst, src, rows, n, C, 0);
}

void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH)
{
    struct heads h = heads_scratch(B, T, C);
    permute(&h, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, B, T, C, NH);
    heads_forward(&h, att, B, T, C, NH);
    attention_unpermute_kernel<<<grid_of((long)B * T * C), DM_CUDA_THREADS, 0,
                                 dm_cuda_stream()>>>(out, h.y, B, T, C, NH);
    LAUNCH_CHECK(attention_unpermute_kernel);
}

void cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH)
{
    struct heads h = heads_scratch(B, T, C);
    permute(&h, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, B, T, C, NH);
    attention_split_heads_kernel<<<grid_of((long)B * T * C), DM_CUDA_THREADS, 0,
                                   dm_cuda_stream()>>>(h.dy, dout, B, T, C, NH);
    LAUNCH_CHECK(attention_split_heads_kernel);
    heads_backward(&h, scratch, att, B, T, C, NH);
    attention_gradient_kernel<<<grid_of((long)B * T * C), DM_CUDA_THREADS, 0,
                                dm_cuda_stream()>>>(dqkv, 3 * C, dqkv + C, dqkv + 2 * C, 3 * C,
                                                    h.dq, h.dk, h.dv, B, T, C, NH);
    LAUNCH_CHECK(attention_gradient_kernel);
}

void cuda_attention_forward_rows(float *out, float *att, const float *q, const float *kv,
                                 const int *rows, int nactive, int B, int T, int C, int NH)
{
    struct heads h = heads_scratch(B, T, C);
    scatter_full(h.qfull, q, rows, nactive, B, T, C);
    permute(&h, h.qfull, C, kv, kv + C, 2 * C, B, T, C, NH);
    heads_forward(&h, att, B, T, C, NH);
    attention_unpermute_kernel<<<grid_of((long)B * T * C), DM_CUDA_THREADS, 0,
                                 dm_cuda_stream()>>>(h.full, h.y, B, T, C, NH);
    LAUNCH_CHECK(attention_unpermute_kernel);
    cuda_rows_gather(out, h.full, rows, nactive, C);
}

void cuda_attention_backward_rows(float *dq, float *dkv, float *scratch, const float *dout,
                                  const float *q, const float *kv, const float *att,
                                  const int *rows, int nactive, int B, int T, int C, int NH)
{
    struct heads h = heads_scratch(B, T, C);
    scatter_full(h.qfull, q, rows, nactive, B, T, C);
    permute(&h, h.qfull, C, kv, kv + C, 2 * C, B, T, C, NH);
    scatter_full(h.full, dout, rows, nactive, B, T, C);
    attention_split_heads_kernel<<<grid_of((long)B * T * C), DM_CUDA_THREADS, 0,
                                   dm_cuda_stream()>>>(h.dy, h.full, B, T, C, NH);
    LAUNCH_CHECK(attention_split_heads_kernel);
    heads_backward(&h, scratch, att, B, T, C, NH);
    attention_gradient_kernel<<<grid_of((long)B * T * C), DM_CUDA_THREADS, 0,
                                dm_cuda_stream()>>>(h.qfull, C, dkv, dkv + C, 2 * C, h.dq, h.dk,
                                                    h.dv, B, T, C, NH);
    LAUNCH_CHECK(attention_gradient_kernel);
    cuda_rows_gather(dq, h.qfull, rows, nactive, C);
}
