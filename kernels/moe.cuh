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

/* one token per step, from its logits z (E): the scores (softmax
 * probabilities, or sigmoid scores), the log-sum-exp, the top-k choice
 * by score (+ bias for the sigmoid router; a strict > over ascending
 * experts gives ties to the lower index), each chosen expert's score, and
 * the gates (the chosen scores renormalised; 1/k when they sum to 0) */
DM_HD void moe_route_forward_thread(struct dm_thread t, float *scores, float *lse, int *choice,
                                    float *choice_score, float *gate, const float *logits,
                                    const float *bias, int N, int E, int k, int sigmoid)
{
    for (long token = dm_thread_first(t); token < N; token += dm_thread_stride(t)) {
        const float *z = logits + token * E;
        float *s = scores + token * E;
        int *chosen = choice + token * k;
        double top = z[0];
        for (int e = 1; e < E; e++) top = z[e] > top ? z[e] : top;
        double sum = 0.0;
        for (int e = 0; e < E; e++) sum += exp((double)z[e] - top);
        lse[token] = (float)(top + log(sum));
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
            choice_score[token * k + j] = s[best];
        }
        double denom = 0.0;
        for (int j = 0; j < k; j++) denom += s[chosen[j]];
        for (int j = 0; j < k; j++)
            gate[token * k + j] = denom > 0.0 ? (float)(s[chosen[j]] / denom) : 1.0f / (float)k;
    }
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

/* the scores' gradient ds (E, in dz) of one token through its gates:
 * gates g_j = s_j / sum_S s, so ds_i = (dg_i - sum_j dg_j g_j) / sum_S s */
DM_HD void moe_route_dgates(float *dz, const float *s, const int *chosen, const float *gate,
                            const float *dg, int E, int k)
{
    for (int e = 0; e < E; e++) dz[e] = 0.0f;
    double denom = 0.0, dot = 0.0;
    for (int j = 0; j < k; j++) {
        denom += s[chosen[j]];
        dot += (double)dg[j] * gate[j];
    }
    if (denom > 0.0)
        for (int j = 0; j < k; j++) dz[chosen[j]] += (float)(((double)dg[j] - dot) / denom);
}

/* + the aux loss's gradient in the scores: d/d P_i of alpha E sum f_i P_i
 * is alpha E f_i, over N tokens (f counts choices: no gradient) */
DM_HD void moe_route_daux(float *dz, const float *s, const int *selected, int N, int E, int k,
                          int sigmoid, double alpha)
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

/* the scores' gradient to the logits' (the sigmoid's or the softmax's
 * Jacobian), + the z-loss's: d(beta mean lse^2)/dz = beta 2 lse
 * softmax(z) / N */
DM_HD void moe_route_dlogits(float *dz, const float *s, const float *z, float lse, int N, int E,
                             int sigmoid, double beta)
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

/* one token per step: its logits' gradient (E) from its gates' (k), the
 * aux loss's (alpha > 0) and the z-loss's (beta > 0) */
DM_HD void moe_route_backward_thread(struct dm_thread t, float *dlogits, const float *dgate,
                                     const float *logits, const float *scores, const float *lse,
                                     const int *choice, const float *gate, const int *selected,
                                     int N, int E, int k, int sigmoid, double alpha, double beta)
{
    for (long token = dm_thread_first(t); token < N; token += dm_thread_stride(t)) {
        float *dz = dlogits + token * E;
        const float *s = scores + token * E;
        moe_route_dgates(dz, s, choice + token * k, gate + token * k, dgate + token * k, E, k);
        if (alpha > 0.0) moe_route_daux(dz, s, selected, N, E, k, sigmoid, alpha);
        moe_route_dlogits(dz, s, logits + token * E, lse[token], N, E, sigmoid, beta);
    }
}

#endif
