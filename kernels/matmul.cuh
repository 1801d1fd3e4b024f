/* The per-thread arithmetic around the cuBLAS products of matmul.cu:
 * the output's starting value (residual + bias, as src/model/ops.c sets
 * it before its sgemm adds the product) and the bias gradient (one
 * thread per output channel summing the rows in order in double, the
 * CPU's order, so the CPU's bits). */
#ifndef DYNMO_KERNELS_MATMUL_CUH
#define DYNMO_KERNELS_MATMUL_CUH

#include "common.cuh"

/* out (N, OC) = residual + bias, or bias, per element (either may be NULL,
 * not both) */
DM_HD void matmul_init_thread(struct dm_thread t, float *out, const float *bias,
                              const float *residual, int N, int OC)
{
    for (long e = dm_thread_first(t); e < (long)N * OC; e += dm_thread_stride(t)) {
        float b = bias ? bias[e % OC] : 0.0f;
        out[e] = residual ? residual[e] + b : b;
    }
}

/* one output channel per step: dbias[o] += sum_n dout[n, o] */
DM_HD void matmul_dbias_thread(struct dm_thread t, float *dbias, const float *dout, int N,
                               int OC)
{
    for (long o = dm_thread_first(t); o < OC; o += dm_thread_stride(t)) {
        double acc = 0.0;
        for (long n = 0; n < N; n++) acc += dout[n * OC + o];
        dbias[o] += (float)acc;
    }
}

#endif
