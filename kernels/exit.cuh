/* The per-thread arithmetic of early exit's confidence kernels (exit.cu):
 * one thread per active token walks its row in order, as
 * src/model/exit.c's softmax_confidence and saturation do (the same
 * comparisons and ties, the same double sums in channel order), so the
 * bits are the CPU's. No reduction across threads: nothing to order. */
#ifndef DYNMO_KERNELS_EXIT_CUH
#define DYNMO_KERNELS_EXIT_CUH

#include "common.cuh"

/* one token per step: conf[k] = top-1 minus top-2 of probs row k (n, V) */
DM_HD void exit_softmax_confidence_thread(struct dm_thread t, float *conf, const float *probs,
                                          int n, int V)
{
    for (long k = dm_thread_first(t); k < n; k += dm_thread_stride(t)) {
        const float *p = probs + k * V;
        float top1 = -1.0f, top2 = -1.0f;
        for (int v = 0; v < V; v++) {
            if (p[v] > top1) {
                top2 = top1;
                top1 = p[v];
            } else if (p[v] > top2) {
                top2 = p[v];
            }
        }
        conf[k] = top1 - top2;
    }
}

/* one token per step: conf[k] = cosine of rows rows[k] of in and out (C
 * each), 0 when either norm is 0 */
DM_HD void exit_saturation_confidence_thread(struct dm_thread t, float *conf, const float *in,
                                             const float *out, const int *rows, int n, int C)
{
    for (long k = dm_thread_first(t); k < n; k += dm_thread_stride(t)) {
        const float *a = in + (long)rows[k] * C, *b = out + (long)rows[k] * C;
        double ab = 0.0, aa = 0.0, bb = 0.0;
        for (int c = 0; c < C; c++) {
            ab += (double)a[c] * b[c];
            aa += (double)a[c] * a[c];
            bb += (double)b[c] * b[c];
        }
        conf[k] = (aa > 0 && bb > 0) ? (float)(ab / sqrt(aa * bb)) : 0.0f;
    }
}

#endif
