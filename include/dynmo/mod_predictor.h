/* Mixture of depths' causal predictor on one token, and the terms of its
 * weight gradient: the arithmetic the CPU op (src/model/mod.c's
 * mod_predictor_forward_backward) and the plugin's kernels
 * (kernels/mod.cuh, a thread per token, then one per weight) share,
 * written once (dynmo/shared_fn.h), so the two give the same bits.
 *
 * The predictor is a small MLP of hidden width H on the token's block
 * input x (C), taken without its gradient (stop-gradient):
 *
 *     a = W1 x + b1 (H),  logit = w2 . relu(a) + b2
 *
 * its weight laid out [W1 (H, C) row-major | b1 (H) | w2 (H) | b2 (1)],
 * mod_predictor_params(C, H) floats. It is trained with the binary
 * cross-entropy of sigmoid(logit) against the top-k choice (torch's
 * stable form); dlogit = (sigmoid(logit) - y) / N for the mean over N
 * tokens. Plain C that is also C++; no other dynmo header but
 * shared_fn.h. */
#ifndef DYNMO_MOD_PREDICTOR_H
#define DYNMO_MOD_PREDICTOR_H

#include <math.h>
#include "dynmo/shared_fn.h"

/* The predictor's floats for C channels and hidden width H (>= 1). */
DM_SHARED_FN long mod_predictor_params(int C, int H)
{
    return (long)H * C + 2L * H + 1;
}

enum { MOD_PREDICTOR_LANES = 8 };

/* u . v over n floats in MOD_PREDICTOR_LANES partial sums (element i
 * into lane i mod LANES, in order), added lane by lane at the end: a
 * fixed order that a compiler vectorizes without reassociating. */
DM_SHARED_FN float mod_predictor_dot(const float *u, const float *v, int n)
{
    float lane[MOD_PREDICTOR_LANES];
    for (int k = 0; k < MOD_PREDICTOR_LANES; k++) lane[k] = 0.0f;
    int i = 0;
    for (; i + MOD_PREDICTOR_LANES <= n; i += MOD_PREDICTOR_LANES)
        for (int k = 0; k < MOD_PREDICTOR_LANES; k++) lane[k] += u[i + k] * v[i + k];
    for (int k = 0; i < n; i++, k++) lane[k] += u[i] * v[i];
    float s = lane[0];
    for (int k = 1; k < MOD_PREDICTOR_LANES; k++) s += lane[k];
    return s;
}

/* The logit of token x; a (H) its hidden pre-activations, b1 added to
 * each unit's dot product, the logit summed over the hidden units in
 * order and b2 added last. */
DM_SHARED_FN float mod_predictor_logit(float *a, const float *x, const float *weight, int C, int H)
{
    const float *w1 = weight, *b1 = weight + (long)H * C, *w2 = b1 + H;
    float logit = 0.0f;
    for (int j = 0; j < H; j++) {
        float s = b1[j] + mod_predictor_dot(w1 + (long)j * C, x, C);
        a[j] = s;
        logit += w2[j] * (s > 0.0f ? s : 0.0f);
    }
    return logit + w2[H];
}

/* The binary cross-entropy of sigmoid(logit) against y (0/1), torch's
 * stable form. */
DM_SHARED_FN float mod_predictor_bce(float logit, int y)
{
    return (logit > 0.0f ? logit : 0.0f) - logit * (y ? 1.0f : 0.0f) +
           log1pf(expf(-fabsf(logit)));
}

/* d(mean BCE over N tokens)/d(logit) of one token. */
DM_SHARED_FN float mod_predictor_dlogit(float logit, int y, int N)
{
    return (1.0f / (1.0f + expf(-logit)) - (y ? 1.0f : 0.0f)) / (float)N;
}

/* d/d(a_j) of one token with dlogit g: g w2[j] through an active ReLU,
 * else 0. */
DM_SHARED_FN float mod_predictor_dhidden(float g, const float *a, const float *weight, int j,
                                         int C, int H)
{
    return a[j] > 0.0f ? g * weight[(long)H * C + H + j] : 0.0f;
}

/* One token's term of the gradient of weight element e (the layout
 * above), from its dlogit g, pre-activations a (H) and input x (C). A
 * weight's gradient is the sum of its terms over the tokens in order. */
DM_SHARED_FN float mod_predictor_term(long e, float g, const float *a, const float *x,
                                      const float *weight, int C, int H)
{
    long HC = (long)H * C;
    if (e < HC) return mod_predictor_dhidden(g, a, weight, (int)(e / C), C, H) * x[e % C];
    if (e < HC + H) return mod_predictor_dhidden(g, a, weight, (int)(e - HC), C, H);
    if (e < HC + 2L * H) {
        float h = a[e - HC - H];
        return g * (h > 0.0f ? h : 0.0f);
    }
    return g;
}

#endif
