/* The per-thread arithmetic of attention's layout kernels (attention.cu):
 * q, k, v of every (batch, head) out of their rows into contiguous
 * (B, NH, T, hs) tensors for the strided-batched products, the heads'
 * outputs back into (B, T, C), and the gradients back into rows. Each
 * element is written by one thread; pure copies. */
#ifndef DYNMO_KERNELS_ATTENTION_CUH
#define DYNMO_KERNELS_ATTENTION_CUH

#include "common.cuh"

/* q, k, v (B, NH, T, hs) = the heads of the query rows (B T, C; row
 * stride ldq) and the key and value rows (row stride ldkv): for the
 * dense attention the three thirds of qkv (B, T, 3C), for early exit's
 * rows a full-length Q beside the kv (B T, 2C) */
DM_HD void attention_permute_thread(struct dm_thread t, float *q, float *k, float *v,
                                    const float *qsrc, int ldq, const float *ksrc,
                                    const float *vsrc, int ldkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    long total = (long)B * NH * T * hs;
    for (long e = dm_thread_first(t); e < total; e += dm_thread_stride(t)) {
        long d = e % hs, i = (e / hs) % T, h = (e / ((long)hs * T)) % NH;
        long b = e / ((long)hs * T * NH), row = b * T + i, col = h * hs + d;
        q[e] = qsrc[row * ldq + col];
        k[e] = ksrc[row * ldkv + col];
        v[e] = vsrc[row * ldkv + col];
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

/* The gradients (B, NH, T, hs) back into rows: dq into dqdst (row
 * stride ldq), dk and dv into dkdst, dvdst (row stride ldkv); overwritten.
 * Dense: the thirds of dqkv (B, T, 3C); early exit: a full-length dQ and
 * dkv (B T, 2C). One thread per destination row element. */
DM_HD void attention_gradient_thread(struct dm_thread t, float *dqdst, int ldq, float *dkdst,
                                     float *dvdst, int ldkv, const float *dq, const float *dk,
                                     const float *dv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    long total = (long)B * T * C;
    for (long e = dm_thread_first(t); e < total; e += dm_thread_stride(t)) {
        long c = e % C, row = e / C, i = row % T, b = row / T;
        long from = ((b * NH + c / hs) * T + i) * hs + c % hs;
        dqdst[row * ldq + c] = dq[from];
        dkdst[row * ldkv + c] = dk[from];
        dvdst[row * ldkv + c] = dv[from];
    }
}

#endif
