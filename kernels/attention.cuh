/* The per-thread arithmetic of attention's layout kernels (attention.cu):
 * q, k, v of every (batch, head) out of qkv (B, T, 3C) into contiguous
 * (B, NH, T, hs) tensors for the strided-batched products, the heads'
 * outputs back into (B, T, C), and the gradients back into dqkv. Each
 * element is written by one thread; pure copies. */
#ifndef DYNMO_KERNELS_ATTENTION_CUH
#define DYNMO_KERNELS_ATTENTION_CUH

#include "common.cuh"

/* q, k, v (B, NH, T, hs) = the three thirds of qkv (B, T, 3C) */
DM_HD void attention_permute_thread(struct dm_thread t, float *q, float *k, float *v,
                                    const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    long total = (long)B * NH * T * hs;
    for (long e = dm_thread_first(t); e < total; e += dm_thread_stride(t)) {
        long d = e % hs, i = (e / hs) % T, h = (e / ((long)hs * T)) % NH;
        long b = e / ((long)hs * T * NH);
        const float *from = qkv + (b * T + i) * 3 * C + h * hs + d;
        q[e] = from[0];
        k[e] = from[C];
        v[e] = from[2 * C];
    }
}

/* out (B, T, C) = y (B, NH, T, hs) with the heads side by side */
DM_HD void attention_unpermute_thread(struct dm_thread t, float *out, const float *y, int B,
                                      int T, int C, int NH)
{
    int hs = C / NH;
    long total = (long)B * T * C;
    for (long e = dm_thread_first(t); e < total; e += dm_thread_stride(t)) {
        long c = e % C, i = (e / C) % T, b = e / ((long)C * T);
        long h = c / hs, d = c % hs;
        out[e] = y[((b * NH + h) * T + i) * hs + d];
    }
}

/* y (B, NH, T, hs) = out (B, T, C) split into heads (unpermute's inverse) */
DM_HD void attention_split_heads_thread(struct dm_thread t, float *y, const float *out, int B,
                                        int T, int C, int NH)
{
    int hs = C / NH;
    long total = (long)B * NH * T * hs;
    for (long e = dm_thread_first(t); e < total; e += dm_thread_stride(t)) {
        long d = e % hs, i = (e / hs) % T, h = (e / ((long)hs * T)) % NH;
        long b = e / ((long)hs * T * NH);
        y[e] = out[(b * T + i) * C + h * hs + d];
    }
}

/* dqkv (B, T, 3C) = [dq | dk | dv], each (B, NH, T, hs); overwritten */
DM_HD void attention_gradient_thread(struct dm_thread t, float *dqkv, const float *dq,
                                     const float *dk, const float *dv, int B, int T, int C,
                                     int NH)
{
    int hs = C / NH;
    long total = (long)B * T * 3 * C;
    for (long e = dm_thread_first(t); e < total; e += dm_thread_stride(t)) {
        long c3 = e % (3 * C), i = (e / (3 * C)) % T, b = e / (3L * C * T);
        long part = c3 / C, c = c3 % C, h = c / hs, d = c % hs;
        const float *from = part == 0 ? dq : part == 1 ? dk : dv;
        dqkv[e] = from[((b * NH + h) * T + i) * hs + d];
    }
}

#endif
