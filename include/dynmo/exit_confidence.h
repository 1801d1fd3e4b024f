/* Early exit's confidence of one token, written once for the CPU ops
 * (src/model/exit.c's exit_softmax_confidence, exit_saturation_confidence)
 * and the plugin's kernels (kernels/exit.cuh, one thread per token): the
 * same comparisons and ties, the same double sums in channel order, so
 * the same bits (dynmo/shared_fn.h). */
#ifndef DYNMO_EXIT_CONFIDENCE_H
#define DYNMO_EXIT_CONFIDENCE_H

#include <math.h>
#include "dynmo/shared_fn.h"

/* The exit head's top-1 minus top-2 probability of one token (V) */
DM_SHARED_FN float exit_softmax_confidence_of(const float *pr, int V)
{
    float top1 = -1.0f, top2 = -1.0f;
    for (int v = 0; v < V; v++) {
        if (pr[v] > top1) {
            top2 = top1;
            top1 = pr[v];
        } else if (pr[v] > top2) {
            top2 = pr[v];
        }
    }
    return top1 - top2;
}

/* The cosine of one token's hidden state before (a) and after (b) the
 * block (C each), 0 when either norm is 0 */
DM_SHARED_FN float exit_saturation_of(const float *a, const float *b, int C)
{
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int c = 0; c < C; c++) {
        ab += (double)a[c] * b[c];
        aa += (double)a[c] * a[c];
        bb += (double)b[c] * b[c];
    }
    return (aa > 0 && bb > 0) ? (float)(ab / sqrt(aa * bb)) : 0.0f;
}

#endif
