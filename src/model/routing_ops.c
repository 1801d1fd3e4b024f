/* The ops of routing tokens to the top k of E scores, the CPU's entries
 * of the op table of the same names (dynmo/backend.h says what each
 * computes): the routing of each token (its scores, top-k choice and
 * gates; dynmo/topk_route.h, the kernels' too), the sums of the balancing
 * losses, the combination of the routed rows' outputs and its backward,
 * the dispatch's backward, the routing's backward. The scheme that uses
 * them, mixture of experts, is src/dyn/moe/. Each token or row is one work
 * item in a fixed order, so results do not depend on the thread count.
 * Nothing here calls MPI. */
#include <math.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/model.h"
#include "dynmo/topk_route.h"
#include "model/internal.h"

/* What the routing's CPU op reads and writes (backend.h: route_topk_forward). */
struct route_args {
    float *scores, *lse, *choice_score, *gate;
    int *choice;
    const float *logits, *bias;
    int N, E, k, sigmoid;
};

/* Token t: its scores, log-sum-exp, top-k choice (and the chosen
 * experts' scores) and gates (dynmo/topk_route.h, the kernels' too). */
static void route_token(const struct route_args *a, long t)
{
    int E = a->E, k = a->k;
    topk_route_token(a->scores + t * E, a->lse + t, a->choice + t * k, a->choice_score + t * k,
                     a->gate + t * k, a->logits + t * E, a->bias, E, k, a->sigmoid);
}

static void route_range(void *arg, long begin, long end)
{
    for (long t = begin; t < end; t++) route_token(arg, t);
}

void route_topk_forward(float *scores, float *lse, int *choice, float *choice_score, float *gate,
                       const float *logits, const float *bias, int N, int E, int k, int sigmoid)
{
    struct route_args a = {.scores = scores, .lse = lse, .choice_score = choice_score,
                           .gate = gate, .choice = choice, .logits = logits, .bias = bias,
                           .N = N, .E = E, .k = k, .sigmoid = sigmoid};
    dm_parallel_for(N, 16, route_range, &a);
}

/* Token-major on the CPU; each sum still runs over the tokens in order,
 * so one thread per expert (the kernel) gives the same bits. */
void route_topk_sums(double *sums, const float *scores, const float *lse, int N, int E,
                    int sigmoid)
{
    memset(sums, 0, ((size_t)E + 1) * sizeof(double));
    for (int t = 0; t < N; t++) {
        const float *s = scores + (size_t)t * E;
        double norm = 1.0;
        if (sigmoid) {
            norm = 0.0;
            for (int e = 0; e < E; e++) norm += s[e];
        }
        for (int e = 0; e < E; e++) sums[e] += s[e] / norm;
        sums[E] += (double)lse[t] * lse[t];
    }
}

/* What the combine, its backward and the dispatch's backward read: the
 * routing's row and gate (N, k) and the grouped rows. */
struct routed_args {
    float *out, *dgate;
    const float *in, *y, *gate;
    const int *row;
    int k, C;
};

/* out[t] = res1[t] (in), then + gate x y[row] over t's kept slots. */
static void combine_range(void *arg, long begin, long end)
{
    const struct routed_args *a = arg;
    int C = a->C, k = a->k;
    for (long t = begin; t < end; t++) {
        float *o = a->out + t * C;
        memcpy(o, a->in + t * C, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            int r = a->row[t * k + j];
            if (r < 0) continue;   /* dropped: contributes nothing */
            float g = a->gate[t * k + j];
            const float *y = a->y + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += g * y[c];
        }
    }
}

void routed_combine_forward(float *out, const float *res1, const float *y, const float *gate,
                         const int *row, int N, int k, int C)
{
    struct routed_args a = {.out = out, .in = res1, .y = y, .gate = gate, .row = row, .k = k,
                            .C = C};
    dm_parallel_for(N, 16, combine_range, &a);
}

/* Per kept pair (t, j) of row r: dy[r] (out) = gate x dout[t] (in);
 * dgate = dout[t] . y[r] (in double, in channel order); a dropped pair's
 * dgate is 0. */
static void combine_back_range(void *arg, long begin, long end)
{
    const struct routed_args *a = arg;
    int C = a->C, k = a->k;
    for (long t = begin; t < end; t++) {
        const float *d = a->in + t * C;
        for (int j = 0; j < k; j++) {
            long p = t * k + j;
            int r = a->row[p];
            if (r < 0) {
                a->dgate[p] = 0.0f;
                continue;
            }
            float g = a->gate[p];
            const float *y = a->y + (size_t)r * C;
            float *dy = a->out + (size_t)r * C;
            double dot = 0.0;
            for (int c = 0; c < C; c++) {
                dy[c] = g * d[c];
                dot += (double)d[c] * y[c];
            }
            a->dgate[p] = (float)dot;
        }
    }
}

void routed_combine_backward(float *dy, float *dgate, const float *dout, const float *y,
                          const float *gate, const int *row, int N, int k, int C)
{
    struct routed_args a = {.out = dy, .dgate = dgate, .in = dout, .y = y, .gate = gate,
                            .row = row, .k = k, .C = C};
    dm_parallel_for(N, 16, combine_back_range, &a);
}

/* d_ln2[t] (out) = sum of dx (in) over t's kept pairs, in slot order. */
static void scatter_back_range(void *arg, long begin, long end)
{
    const struct routed_args *a = arg;
    int C = a->C, k = a->k;
    for (long t = begin; t < end; t++) {
        float *d = a->out + t * C;
        memset(d, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < k; j++) {
            int r = a->row[t * k + j];
            if (r < 0) continue;
            const float *x = a->in + (size_t)r * C;
            for (int c = 0; c < C; c++) d[c] += x[c];
        }
    }
}

void routed_dispatch_backward(float *d_ln2, const float *dx, const int *row, int N, int k, int C)
{
    struct routed_args a = {.out = d_ln2, .in = dx, .row = row, .k = k, .C = C};
    dm_parallel_for(N, 16, scatter_back_range, &a);
}

/* What the routing's backward reads and writes (backend.h:
 * route_topk_backward). */
struct route_back_args {
    float *dlogits;
    const float *dgate, *logits, *scores, *lse, *gate;
    const int *choice, *selected;
    double alpha, beta;     /* the aux and z-loss scales */
    int N, E, k, sigmoid;
};

/* Token t's logits' gradient: through the gates, the aux loss (through P
 * only: f counts choices and has no gradient) and the z-loss
 * (dynmo/topk_route.h, the kernels' too). */
static void route_back_token(const struct route_back_args *a, long t)
{
    int E = a->E, k = a->k;
    topk_route_back_token(a->dlogits + t * E, a->dgate + t * k, a->logits + t * E,
                          a->scores + t * E, a->lse[t], a->choice + t * k, a->gate + t * k,
                          a->selected, a->N, E, k, a->sigmoid, a->alpha, a->beta);
}

static void route_back_range(void *arg, long begin, long end)
{
    for (long t = begin; t < end; t++) route_back_token(arg, t);
}

void route_topk_backward(float *dlogits, const float *dgate, const float *logits,
                        const float *scores, const float *lse, const int *choice,
                        const float *gate, const int *selected, int N, int E, int k, int sigmoid,
                        double alpha, double beta)
{
    struct route_back_args a = {.dlogits = dlogits, .dgate = dgate, .logits = logits,
                                .scores = scores, .lse = lse, .gate = gate, .choice = choice,
                                .selected = selected, .alpha = alpha, .beta = beta, .N = N,
                                .E = E, .k = k, .sigmoid = sigmoid};
    dm_parallel_for(N, 16, route_back_range, &a);
}
