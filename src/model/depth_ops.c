/* The ops of token routing by depth, the CPU's entries of the op table of
 * the same names (dynmo/backend.h; model.h says what each computes): the
 * scalar router, the top-k choice per sequence, the causal MLP predictor
 * (dynmo/mod_predictor.h) forward and backward, and the combination of a
 * block's output over the chosen rows with the rest. The scheme that uses
 * them, mixture of depths, is src/dyn/mod.c. Nothing here calls MPI. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/mod_predictor.h"
#include "dynmo/model.h"
#include "model/internal.h"

void mod_router_forward(float *router, const float *in, const float *weight, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = in + (long)n * C;
        float s = 0.0f;
        for (int c = 0; c < C; c++) s += weight[c] * x[c];
        router[n] = s;
    }
}

struct ranked {
    float value;
    int pos;
};

/* larger value first; equal values: lower position first (a total order,
 * so qsort's instability does not matter) */
static int ranked_compare(const void *pa, const void *pb)
{
    const struct ranked *a = pa, *b = pb;
    if (a->value != b->value) return a->value > b->value ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

void mod_select_topk(int *chosen, const float *router, int B, int T, int k)
{
    DM_ASSERT(k >= 0 && k <= T);
    struct ranked *r = dm_alloc((size_t)T * sizeof *r);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            r[t].value = router[(long)b * T + t];
            r[t].pos = t;
            chosen[(long)b * T + t] = 0;
        }
        qsort(r, (size_t)T, sizeof *r, ranked_compare);
        for (int i = 0; i < k; i++) chosen[(long)b * T + r[i].pos] = 1;
    }
    dm_free(r);
}

/* Token by token in order; each weight's gradient summed over the tokens
 * in order from zero (the terms of dynmo/mod_predictor.h, in loops that
 * give each weight the same terms in the same order as
 * mod_predictor_term), then scaled into dweight. */
float mod_predictor_forward_backward(float *dweight, float scale, int *chosen, const float *in,
                                     const float *weight, const int *target, int N, int C, int H)
{
    long P = mod_predictor_params(C, H), HC = (long)H * C;
    float *a = dm_alloc((size_t)H * sizeof(float));
    float *sum = dweight && target ? dm_alloc((size_t)P * sizeof(float)) : NULL;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        const float *x = in + (long)n * C;
        float logit = mod_predictor_logit(a, x, weight, C, H);
        if (chosen) chosen[n] = logit > 0.0f;
        if (!target) continue;
        loss += mod_predictor_bce(logit, target[n]);
        if (!sum) continue;
        float g = mod_predictor_dlogit(logit, target[n], N);
        for (int j = 0; j < H; j++) {
            float dh = mod_predictor_dhidden(g, a, weight, j, C, H);
            float *row = sum + (long)j * C;
            for (int c = 0; c < C; c++) row[c] += dh * x[c];
            sum[HC + j] += dh;
            sum[HC + H + j] += g * (a[j] > 0.0f ? a[j] : 0.0f);
        }
        sum[P - 1] += g;
    }
    if (sum)
        for (long e = 0; e < P; e++) dweight[e] += scale * sum[e];
    dm_free(sum);
    dm_free(a);
    return target ? (float)(loss / N) : 0.0f;
}

void mod_combine_forward(float *out, const float *gathered_in, const float *gathered_out,
                         const float *router, const int *rows, int n, int C)
{
    for (int j = 0; j < n; j++) {
        long row = rows[j];
        const float *x = gathered_in + (long)j * C, *f = gathered_out + (long)j * C;
        float r = router[row];
        float *o = out + row * C;
        for (int c = 0; c < C; c++) o[c] = x[c] + r * (f[c] - x[c]);
    }
}

void mod_scale_chosen(float *work, const float *din, const float *router, const int *rows, int n,
                      int C)
{
    for (int j = 0; j < n; j++) {
        long row = rows[j];
        float r = router[row];
        const float *d = din + row * C;
        float *g = work + (long)j * C;
        for (int c = 0; c < C; c++) g[c] = r * d[c];
    }
}

void mod_combine_backward(float *din, float *drouter_weight, const float *gathered_in,
                          const float *gathered_out, const float *work, const float *router,
                          const float *router_weight, const int *rows, int n, int C)
{
    for (int j = 0; j < n; j++) {
        long row = rows[j];
        const float *x = gathered_in + (long)j * C, *f = gathered_out + (long)j * C;
        const float *g = work + (long)j * C;
        float r = router[row];
        float *d = din + row * C;
        float dr = 0.0f;
        for (int c = 0; c < C; c++) dr += d[c] * (f[c] - x[c]);
        for (int c = 0; c < C; c++) d[c] = (1.0f - r) * d[c] + g[c] + dr * router_weight[c];
        if (drouter_weight)
            for (int c = 0; c < C; c++) drouter_weight[c] += dr * x[c];
    }
}
