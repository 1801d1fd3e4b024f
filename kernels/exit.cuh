/* The per-thread arithmetic of early exit's confidence kernels (exit.cu):
 * one thread per active token, through the per-token functions the CPU
 * ops use too (dynmo/exit_confidence.h), so the bits are the CPU's. No
 * reduction across threads: nothing to order. */
#ifndef DYNMO_KERNELS_EXIT_CUH
#define DYNMO_KERNELS_EXIT_CUH

#include "common.cuh"
#include "dynmo/exit_confidence.h"

/* one token per step: conf[k] = top-1 minus top-2 of probs row k (n, V) */
DM_HD void exit_softmax_confidence_thread(struct dm_thread t, float *conf, const float *probs,
                                          int n, int V)
{
    for (long k = dm_thread_first(t); k < n; k += dm_thread_stride(t))
        conf[k] = exit_softmax_confidence_of(probs + k * V, V);
}

/* one token per step: conf[k] = cosine of rows rows[k] of in and out (C
 * each), 0 when either norm is 0 */
DM_HD void exit_saturation_confidence_thread(struct dm_thread t, float *conf, const float *in,
                                             const float *out, const int *rows, int n, int C)
{
    for (long k = dm_thread_first(t); k < n; k += dm_thread_stride(t))
        conf[k] = exit_saturation_of(in + (long)rows[k] * C, out + (long)rows[k] * C, C);
}

#endif
