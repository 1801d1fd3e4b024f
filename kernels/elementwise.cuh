/* The per-thread arithmetic of the element-wise kernels (elementwise.cu):
 * GELU forward and backward, the residual sum and the row gathers of the
 * dynamic schemes. Grid-stride loops over the elements; each element is
 * written by exactly one thread with the CPU op's arithmetic, so the bits
 * are the CPU's (src/model/ops.c, src/model/backend.c). */
#ifndef DYNMO_KERNELS_ELEMENTWISE_CUH
#define DYNMO_KERNELS_ELEMENTWISE_CUH

#include "common.cuh"

#define DM_GELU_K 0.7978845608028654f     /* sqrt(2/pi) */
#define DM_GELU_C 0.044715f

/* gelu(x) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
DM_HD float dm_gelu_value(float x)
{
    float u = DM_GELU_K * (x + DM_GELU_C * x * x * x);
    return x * (1.0f / (1.0f + dm_exp_accurate(-(2.0f * u))));
}

/* gelu'(x) = s + 2 x s (1 - s) du/dx, s = sigmoid(2u), 1 - s = e s */
DM_HD float dm_gelu_grad(float x)
{
    float u = DM_GELU_K * (x + DM_GELU_C * x * x * x);
    float e_neg = dm_exp_accurate(-2.0f * u);
    float s = 1.0f / (1.0f + e_neg);
    float du = DM_GELU_K * (1.0f + 3.0f * DM_GELU_C * x * x);
    return s + 2.0f * x * s * (e_neg * s) * du;
}

DM_HD void gelu_forward_thread(struct dm_thread t, float *out, const float *inp, long N)
{
    for (long i = dm_thread_first(t); i < N; i += dm_thread_stride(t))
        out[i] = dm_gelu_value(inp[i]);
}

/* dinp = gelu'(inp) * dout, overwritten; dinp may be dout */
DM_HD void gelu_backward_thread(struct dm_thread t, float *dinp, const float *inp,
                                const float *dout, long N)
{
    for (long i = dm_thread_first(t); i < N; i += dm_thread_stride(t))
        dinp[i] = dm_gelu_grad(inp[i]) * dout[i];
}

/* out = a + b; out may be a or b */
DM_HD void residual_forward_thread(struct dm_thread t, float *out, const float *a,
                                   const float *b, long N)
{
    for (long i = dm_thread_first(t); i < N; i += dm_thread_stride(t)) out[i] = a[i] + b[i];
}

/* dst (n, C) = rows `rows` of src; one element per step */
DM_HD void rows_gather_thread(struct dm_thread t, float *dst, const float *src,
                              const int *rows, int n, int C)
{
    for (long e = dm_thread_first(t); e < (long)n * C; e += dm_thread_stride(t)) {
        long i = e / C, c = e % C;
        dst[e] = src[(long)rows[i] * C + c];
    }
}

/* rows `rows` of dst = src (n, C), or += with add; rows distinct */
DM_HD void rows_scatter_thread(struct dm_thread t, float *dst, const float *src,
                               const int *rows, int n, int C, int add)
{
    for (long e = dm_thread_first(t); e < (long)n * C; e += dm_thread_stride(t)) {
        long i = e / C, c = e % C;
        float *to = dst + (long)rows[i] * C + c;
        *to = add ? *to + src[e] : src[e];
    }
}

#endif
