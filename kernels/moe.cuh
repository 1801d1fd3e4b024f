/* The per-thread arithmetic of the mixture-of-experts kernels (moe.cu):
 * the routing (scores, log-sum-exp, top-k and gates; the balancing
 * losses' sums) and its backward, and the combine and its backward, and
 * the dispatch's backward over the routing's arrays (row and gate, (N,
 * k): each pair's grouped row, -1 when dropped, and its gate weight).
 * A routing thread walks one token's experts in order (the sums: one
 * expert's tokens in order), a combine thread a token's k slots in order,
 * as src/model/moe.c's CPU ops do (the same float and double sums from
 * the same start, the same comparisons and ties, libm's exp and log in
 * double), so the bits are the CPU's wherever exp and log are glibc's
 * (the emulated device; CUDA's double exp and log are within an ulp).
 * Kept pairs have distinct rows: no two threads write one element, and
 * nothing is reduced across threads. */
#ifndef DYNMO_KERNELS_MOE_CUH
#define DYNMO_KERNELS_MOE_CUH

#include "common.cuh"
#include "dynmo/topk_route.h"

/* one element (token, c) per step: out = res1, then + gate x y[row] over
 * the token's kept slots in order */
DM_HD void moe_combine_forward_thread(struct dm_thread t, float *out, const float *res1,
                                      const float *y, const float *gate, const int *row,
                                      int N, int k, int C)
{
    for (long e = dm_thread_first(t); e < (long)N * C; e += dm_thread_stride(t)) {
        long token = e / C, c = e % C;
        float o = res1[e];
        for (int j = 0; j < k; j++) {
            int r = row[token * k + j];
            if (r < 0) continue;   /* dropped: contributes nothing */
            o += gate[token * k + j] * y[(long)r * C + c];
        }
        out[e] = o;
    }
}

/* one element (pair, c) per step: dy[row] = gate x dout[token] for each
 * kept pair; the rows of dropped pairs are not written */
DM_HD void moe_combine_dy_thread(struct dm_thread t, float *dy, const float *dout,
                                 const float *gate, const int *row, int N, int k, int C)
{
    for (long e = dm_thread_first(t); e < (long)N * k * C; e += dm_thread_stride(t)) {
        long pair = e / C, c = e % C;
        int r = row[pair];
        if (r >= 0) dy[(long)r * C + c] = gate[pair] * dout[(pair / k) * C + c];
    }
}

/* one pair per step: dgate = dout[token] . y[row] in double in channel
 * order, 0 for a dropped pair */
DM_HD void moe_combine_dgate_thread(struct dm_thread t, float *dgate, const float *dout,
                                    const float *y, const int *row, int N, int k, int C)
{
    for (long pair = dm_thread_first(t); pair < (long)N * k; pair += dm_thread_stride(t)) {
        int r = row[pair];
        if (r < 0) {
            dgate[pair] = 0.0f;
            continue;
        }
        const float *d = dout + (pair / k) * C, *yr = y + (long)r * C;
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)d[c] * yr[c];
        dgate[pair] = (float)dot;
    }
}

/* one element (token, c) per step: d_ln2 = the sum of dx[row] over the
 * token's kept slots in order, from 0 */
DM_HD void moe_dispatch_backward_thread(struct dm_thread t, float *d_ln2, const float *dx,
                                        const int *row, int N, int k, int C)
{
    for (long e = dm_thread_first(t); e < (long)N * C; e += dm_thread_stride(t)) {
        long token = e / C, c = e % C;
        float d = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = row[token * k + j];
            if (r < 0) continue;
            d += dx[(long)r * C + c];
        }
        d_ln2[e] = d;
    }
}

/* ---- the routing: one thread per token (per expert for the sums) ---------- */

/* one token per step: its routing from its logits (dynmo/topk_route.h) */
DM_HD void moe_route_forward_thread(struct dm_thread t, float *scores, float *lse, int *choice,
                                    float *choice_score, float *gate, const float *logits,
                                    const float *bias, int N, int E, int k, int sigmoid)
{
    for (long token = dm_thread_first(t); token < N; token += dm_thread_stride(t))
        topk_route_token(scores + token * E, lse + token, choice + token * k,
                         choice_score + token * k, gate + token * k, logits + token * E, bias, E,
                         k, sigmoid);
}

/* one output per step: sums[e] (e < E) = the sum over tokens in order of
 * expert e's normalised score (the softmax probability, or the sigmoid
 * score over the token's score sum, in double), sums[E] = the sum of
 * lse^2 in token order */
DM_HD void moe_route_sums_thread(struct dm_thread t, double *sums, const float *scores,
                                 const float *lse, int N, int E, int sigmoid)
{
    for (long e = dm_thread_first(t); e <= E; e += dm_thread_stride(t)) {
        double total = 0.0;
        for (long token = 0; token < N; token++) {
            if (e == E) {
                total += (double)lse[token] * lse[token];
                continue;
            }
            const float *s = scores + token * E;
            double norm = 1.0;
            if (sigmoid) {
                norm = 0.0;
                for (int i = 0; i < E; i++) norm += s[i];
            }
            total += s[e] / norm;
        }
        sums[e] = total;
    }
}

/* one token per step: its logits' gradient from its gates', the aux
 * loss's (alpha > 0) and the z-loss's (beta > 0) (dynmo/topk_route.h) */
DM_HD void moe_route_backward_thread(struct dm_thread t, float *dlogits, const float *dgate,
                                     const float *logits, const float *scores, const float *lse,
                                     const int *choice, const float *gate, const int *selected,
                                     int N, int E, int k, int sigmoid, double alpha, double beta)
{
    for (long token = dm_thread_first(t); token < N; token += dm_thread_stride(t))
        topk_route_back_token(dlogits + token * E, dgate + token * k, logits + token * E,
                              scores + token * E, lse[token], choice + token * k,
                              gate + token * k, selected, N, E, k, sigmoid, alpha, beta);
}

#endif
