/* The per-thread arithmetic of the layernorm kernels (layernorm.cu).
 *
 * Forward: one block per row, three phases around two tree sums (mean,
 * then variance). Backward, input gradient: one block per row, two phases
 * around the tree sums of dnorm and dnorm * norm. Backward, parameter
 * gradients: one thread per column walks the rows in chunks of
 * DM_LN_ROWS, a float partial per chunk added to a double in chunk order,
 * then once into dweight and dbias: src/model/ops.c's order, so its bits.
 * eps 1e-5 as on the CPU. */
#ifndef DYNMO_KERNELS_LAYERNORM_CUH
#define DYNMO_KERNELS_LAYERNORM_CUH

#include "common.cuh"

#define DM_LN_EPS 1e-5
#define DM_LN_ROWS 32

/* sum[thread] = this thread's share of row block's sum */
DM_HD void layernorm_forward_sum_phase(struct dm_thread t, float *sum, const float *inp, int C)
{
    const float *x = inp + t.block * C;
    float s = 0.0f;
    for (int i = t.thread; i < C; i += t.threads) s += x[i];
    sum[t.thread] = s;
}

/* var[thread] = this thread's share of sum (x - mean)^2; sum[0] is the row sum */
DM_HD void layernorm_forward_var_phase(struct dm_thread t, float *var, const float *sum,
                                       const float *inp, int C)
{
    const float *x = inp + t.block * C;
    float m = sum[0] / (float)C;
    float s = 0.0f;
    for (int i = t.thread; i < C; i += t.threads) {
        float d = x[i] - m;
        s += d * d;
    }
    var[t.thread] = s;
}

DM_HD void layernorm_forward_out_phase(struct dm_thread t, float *out, float *mean, float *rstd,
                                       const float *sum, const float *var, const float *inp,
                                       const float *weight, const float *bias, int C)
{
    const float *x = inp + t.block * C;
    float *y = out + t.block * C;
    float m = sum[0] / (float)C;
    float s = (float)(1.0 / sqrt((double)var[0] / C + DM_LN_EPS));
    for (int i = t.thread; i < C; i += t.threads) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    if (t.thread == 0) {
        mean[t.block] = m;
        rstd[t.block] = s;
    }
}

/* sum_d[thread], sum_dn[thread]: shares of sum dnorm, sum dnorm * norm */
DM_HD void layernorm_backward_sums_phase(struct dm_thread t, float *sum_d, float *sum_dn,
                                         const float *dout, const float *inp,
                                         const float *weight, const float *mean,
                                         const float *rstd, int C)
{
    const float *x = inp + t.block * C, *dy = dout + t.block * C;
    float m = mean[t.block], s = rstd[t.block];
    float a = 0.0f, b = 0.0f;
    for (int i = t.thread; i < C; i += t.threads) {
        float dnorm = dy[i] * weight[i];
        a += dnorm;
        b += dnorm * ((x[i] - m) * s);
    }
    sum_d[t.thread] = a;
    sum_dn[t.thread] = b;
}

/* dinp = base + rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)), base
 * dresidual, or dinp itself when dresidual is NULL (accumulate) */
DM_HD void layernorm_backward_dinp_phase(struct dm_thread t, float *dinp,
                                         const float *dresidual, const float *sum_d,
                                         const float *sum_dn, const float *dout,
                                         const float *inp, const float *weight,
                                         const float *mean, const float *rstd, int C)
{
    const float *x = inp + t.block * C, *dy = dout + t.block * C;
    float *dx = dinp + t.block * C;
    const float *base = dresidual ? dresidual + t.block * C : dx;
    float m = mean[t.block], s = rstd[t.block];
    float mean_d = sum_d[0] / (float)C, mean_dn = sum_dn[0] / (float)C;
    for (int i = t.thread; i < C; i += t.threads) {
        float norm = (x[i] - m) * s;
        dx[i] = base[i] + s * (dy[i] * weight[i] - mean_d - norm * mean_dn);
    }
}

/* one column per step: dweight += sum dy norm, dbias += sum dy (either may be NULL) */
DM_HD void layernorm_backward_params_thread(struct dm_thread t, float *dweight, float *dbias,
                                            const float *dout, const float *inp,
                                            const float *mean, const float *rstd, int N,
                                            int C)
{
    for (long c = dm_thread_first(t); c < C; c += dm_thread_stride(t)) {
        double acc_w = 0.0, acc_b = 0.0;
        for (long n0 = 0; n0 < N; n0 += DM_LN_ROWS) {
            long n1 = n0 + DM_LN_ROWS < N ? n0 + DM_LN_ROWS : N;
            float pw = 0.0f, pb = 0.0f;
            for (long n = n0; n < n1; n++) {
                float dy = dout[n * C + c];
                pw += dy * ((inp[n * C + c] - mean[n]) * rstd[n]);
                pb += dy;
            }
            acc_w += pw;
            acc_b += pb;
        }
        if (dweight) dweight[c] += (float)acc_w;
        if (dbias) dbias[c] += (float)acc_b;
    }
}

#endif
