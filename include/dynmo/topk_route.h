/* The routing of one token to the top k of E scores and its backward:
 * the arithmetic the CPU ops (src/model/routing_ops.c's route_topk_forward
 * and route_topk_backward) and the plugin's kernels (kernels/moe.cuh, one
 * thread per token) share, written once (dynmo/shared_fn.h); mixture of
 * experts (src/dyn/moe/) is its user. Each function walks one token's
 * choices in order with the same float and double sums from the same
 * start, libm's exp and log in double, so the bits are the same wherever
 * exp and log are glibc's (the CPU, the emulated device; CUDA's double exp
 * and log are within an ulp). */
#ifndef DYNMO_TOPK_ROUTE_H
#define DYNMO_TOPK_ROUTE_H

#include <math.h>
#include "dynmo/shared_fn.h"

/* From one token's logits z (E): its scores s (softmax probabilities, or
 * sigmoid scores), *lse (the log-sum-exp), the top-k choice by score (+
 * bias for the sigmoid router; a strict > over ascending experts gives
 * ties to the lower index), each chosen expert's score, and the gates
 * from the unbiased scores: for k = 1 the chosen score itself (Switch
 * Transformer's gate: renormalised over one expert it would be 1, and the
 * router would get no gradient from the loss); for k >= 2 the chosen
 * scores renormalised over the chosen (GShard, Mixtral; 1/k when they sum
 * to 0). */
DM_SHARED_FN void topk_route_token(float *s, float *lse, int *chosen, float *choice_score,
                                   float *gate, const float *z, const float *bias, int E, int k,
                                   int sigmoid)
{
    double top = z[0];
    for (int e = 1; e < E; e++) top = z[e] > top ? z[e] : top;
    double sum = 0.0;
    for (int e = 0; e < E; e++) sum += exp((double)z[e] - top);
    *lse = (float)(top + log(sum));
    for (int e = 0; e < E; e++)
        s[e] = sigmoid ? (float)(1.0 / (1.0 + exp(-(double)z[e])))
                       : (float)(exp((double)z[e] - top) / sum);
    for (int j = 0; j < k; j++) {
        int best = -1;
        float best_key = 0.0f;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= chosen[i] == e;
            if (taken) continue;
            float key = sigmoid ? s[e] + bias[e] : s[e];
            if (best < 0 || key > best_key) {
                best = e;
                best_key = key;
            }
        }
        chosen[j] = best;
        choice_score[j] = s[best];
    }
    if (k == 1) {
        gate[0] = s[chosen[0]];
        return;
    }
    double denom = 0.0;
    for (int j = 0; j < k; j++) denom += s[chosen[j]];
    for (int j = 0; j < k; j++)
        gate[j] = denom > 0.0 ? (float)(s[chosen[j]] / denom) : 1.0f / (float)k;
}

/* The scores' gradient ds (E, into dz) of one token through its gates:
 * for k = 1 g = s_chosen, so ds_chosen = dg; for k >= 2 g_j = s_j /
 * sum_S s, so ds_i = (dg_i - sum_j dg_j g_j) / sum_S s. */
DM_SHARED_FN void topk_route_dgates(float *dz, const float *s, const int *chosen, const float *gate,
                                    const float *dg, int E, int k)
{
    for (int e = 0; e < E; e++) dz[e] = 0.0f;
    if (k == 1) {
        dz[chosen[0]] = dg[0];
        return;
    }
    double denom = 0.0, dot = 0.0;
    for (int j = 0; j < k; j++) {
        denom += s[chosen[j]];
        dot += (double)dg[j] * gate[j];
    }
    if (denom > 0.0)
        for (int j = 0; j < k; j++) dz[chosen[j]] += (float)(((double)dg[j] - dot) / denom);
}

/* + the aux loss's gradient in the scores: d/d P_i of alpha E sum f_i P_i
 * is alpha E f_i, over N tokens (f counts choices: no gradient). */
DM_SHARED_FN void topk_route_daux(float *dz, const float *s, const int *selected, int N, int E,
                                  int k, int sigmoid, double alpha)
{
    double sum = 0.0, weighted = 0.0;
    if (sigmoid)
        for (int e = 0; e < E; e++) sum += s[e];
    for (int e = 0; e < E; e++) {
        double coef = alpha * E * ((double)selected[e] / ((double)k * N)) / N;
        if (!sigmoid) {
            dz[e] += (float)coef;
        } else {
            dz[e] += (float)(coef / sum);
            weighted += coef * s[e];
        }
    }
    if (sigmoid)
        for (int e = 0; e < E; e++) dz[e] -= (float)(weighted / (sum * sum));
}

/* The scores' gradient to the logits' (the sigmoid's or the softmax's
 * Jacobian), + the z-loss's: d(beta mean lse^2)/dz = beta 2 lse
 * softmax(z) / N. */
DM_SHARED_FN void topk_route_dlogits(float *dz, const float *s, const float *z, float lse, int N,
                                     int E, int sigmoid, double beta)
{
    if (sigmoid) {
        for (int e = 0; e < E; e++) dz[e] = dz[e] * (s[e] * (1.0f - s[e]));
    } else {
        double inner = 0.0;
        for (int e = 0; e < E; e++) inner += (double)dz[e] * s[e];
        for (int e = 0; e < E; e++) dz[e] = s[e] * (float)((double)dz[e] - inner);
    }
    if (beta > 0.0)
        for (int e = 0; e < E; e++)
            dz[e] += (float)(beta * 2.0 * (double)lse * exp((double)z[e] - (double)lse) / N);
}

/* One token's logits' gradient dz (E) from its gates' dg (k), the aux
 * loss's (alpha > 0) and the z-loss's (beta > 0). */
DM_SHARED_FN void topk_route_back_token(float *dz, const float *dg, const float *z, const float *s,
                                        float lse, const int *chosen, const float *gate,
                                        const int *selected, int N, int E, int k, int sigmoid,
                                        double alpha, double beta)
{
    topk_route_dgates(dz, s, chosen, gate, dg, E, k);
    if (alpha > 0.0) topk_route_daux(dz, s, selected, N, E, k, sigmoid, alpha);
    topk_route_dlogits(dz, s, z, lse, N, E, sigmoid, beta);
}

#endif
