/* The per-thread arithmetic of the mixture-of-depths kernels (mod.cu):
 * the router r = w . x of each token, summed in order as
 * src/model/mod.c does (same bits), and the top-k choice per sequence
 * without a sort: token t of sequence b is chosen when fewer than k
 * tokens rank before it (a larger value, or an equal value at a lower
 * position), the CPU's total order, so the same choice. Router values
 * are finite (the CPU's order is undefined for NaN too). The causal
 * predictor (dynmo/mod_predictor.h, the CPU's arithmetic): one thread per
 * token for the MLP's hidden pre-activations, logit, choice, loss and
 * dlogit, one per weight for its gradient, the tokens' terms summed in
 * order from zero as mod.c does; the loss is summed on the host in token
 * order. The block over
 * the chosen tokens: the combination forward and the backward's scale
 * one element per step, the backward's combination in three kernels
 * without atomics (dr per token, din per element, the router weight's
 * gradient per channel over the tokens in order), mod.c's arithmetic in
 * mod.c's order (same bits). */
#ifndef DYNMO_KERNELS_MOD_CUH
#define DYNMO_KERNELS_MOD_CUH

#include "common.cuh"
#include "dynmo/mod_predictor.h"

/* one token per step: router[n] = weight . in[n, :] */
DM_HD void mod_router_thread(struct dm_thread t, float *router, const float *in,
                             const float *weight, int N, int C)
{
    for (long n = dm_thread_first(t); n < N; n += dm_thread_stride(t)) {
        const float *x = in + n * C;
        float s = 0.0f;
        for (int c = 0; c < C; c++) s += weight[c] * x[c];
        router[n] = s;
    }
}

/* one token per step: chosen[b, t] = its rank in sequence b is below k */
DM_HD void mod_select_topk_thread(struct dm_thread t, int *chosen, const float *router, int B,
                                  int T, int k)
{
    for (long e = dm_thread_first(t); e < (long)B * T; e += dm_thread_stride(t)) {
        const float *r = router + (e / T) * T;
        int pos = (int)(e % T), before = 0;
        float v = r[pos];
        for (int u = 0; u < T && before < k; u++)
            before += r[u] > v || (r[u] == v && u < pos);
        chosen[e] = before < k;
    }
}

/* The causal predictor, one token per step: its hidden pre-activations
 * hidden[n, :] (H) and logit; chosen[n] = logit > 0 (chosen may be NULL);
 * with target, the token's binary cross-entropy in loss[n] and its
 * dlogit in grad[n] */
DM_HD void mod_predictor_thread(struct dm_thread t, float *loss, float *grad, float *hidden,
                                int *chosen, const float *in, const float *weight,
                                const int *target, int N, int C, int H)
{
    for (long n = dm_thread_first(t); n < N; n += dm_thread_stride(t)) {
        float *a = hidden + n * H;
        float logit = mod_predictor_logit(a, in + n * C, weight, C, H);
        if (chosen) chosen[n] = logit > 0.0f;
        if (!target) continue;
        loss[n] = mod_predictor_bce(logit, target[n]);
        grad[n] = mod_predictor_dlogit(logit, target[n], (int)N);
    }
}

/* one predictor weight per step: dweight[e] += scale x (its gradient, the
 * tokens' terms summed in order from zero) */
DM_HD void mod_predictor_dweight_thread(struct dm_thread t, float *dweight, float scale,
                                        const float *grad, const float *hidden, const float *in,
                                        const float *weight, int N, int C, int H)
{
    long P = mod_predictor_params(C, H);
    for (long e = dm_thread_first(t); e < P; e += dm_thread_stride(t)) {
        float acc = 0.0f;
        for (long n = 0; n < N; n++)
            acc += mod_predictor_term(e, grad[n], hidden + n * H, in + n * C, weight, C, H);
        dweight[e] += scale * acc;
    }
}

/* one channel per step: dweight[c] += grad[n] in[n, c] for n in order
 * (the router weight's gradient in the backward's combination with
 * grad = dr, in = the gathered rows) */
DM_HD void mod_dweight_thread(struct dm_thread t, float *dweight, const float *grad,
                               const float *in, int N, int C)
{
    for (long c = dm_thread_first(t); c < C; c += dm_thread_stride(t)) {
        float acc = dweight[c];
        for (long n = 0; n < N; n++) acc += grad[n] * in[n * C + c];
        dweight[c] = acc;
    }
}

/* one element per step: out[rows[j], c] = x + r (f - x) of packed row j */
DM_HD void mod_combine_forward_thread(struct dm_thread t, float *out, const float *gathered_in,
                                      const float *gathered_out, const float *router,
                                      const int *rows, int n, int C)
{
    for (long e = dm_thread_first(t); e < (long)n * C; e += dm_thread_stride(t)) {
        long row = rows[e / C], c = e % C;
        float x = gathered_in[e];
        out[row * C + c] = x + router[row] * (gathered_out[e] - x);
    }
}

/* one element per step: work[j, c] = r din[rows[j], c] */
DM_HD void mod_scale_chosen_thread(struct dm_thread t, float *work, const float *din,
                                   const float *router, const int *rows, int n, int C)
{
    for (long e = dm_thread_first(t); e < (long)n * C; e += dm_thread_stride(t)) {
        long row = rows[e / C], c = e % C;
        work[e] = router[row] * din[row * C + c];
    }
}

/* one packed row per step: dr[j] = din[rows[j], :] . (f - x), before
 * mod_combine_din_thread changes din */
DM_HD void mod_combine_dr_thread(struct dm_thread t, float *dr, const float *din,
                                 const float *gathered_in, const float *gathered_out,
                                 const int *rows, int n, int C)
{
    for (long j = dm_thread_first(t); j < n; j += dm_thread_stride(t)) {
        const float *d = din + (long)rows[j] * C;
        const float *x = gathered_in + j * C, *f = gathered_out + j * C;
        float s = 0.0f;
        for (int c = 0; c < C; c++) s += d[c] * (f[c] - x[c]);
        dr[j] = s;
    }
}

/* one element per step: din[rows[j], c] = (1 - r) din + work[j, c] + dr[j] w[c] */
DM_HD void mod_combine_din_thread(struct dm_thread t, float *din, const float *dr,
                                  const float *work, const float *router,
                                  const float *router_weight, const int *rows, int n, int C)
{
    for (long e = dm_thread_first(t); e < (long)n * C; e += dm_thread_stride(t)) {
        long j = e / C, c = e % C, row = rows[j];
        float r = router[row];
        float *d = din + row * C + c;
        *d = (1.0f - r) * *d + work[e] + dr[j] * router_weight[c];
    }
}

#endif
