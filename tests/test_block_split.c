/* The split backward of the zero-bubble schedule. Each op's two halves
 * (matmul and layernorm: input gradient, weight gradient) against central
 * finite differences of sum(out * dout) in double, and their sum against
 * the whole backward bit for bit; the block's input and weight parts, run
 * in ZB-H1's order over two micro-batches (F0 F1 B0 B1 W0 W1), against
 * block_backward in 1F1B's (F0 B0 F1 B1): the same din and the same
 * gradients, bit for bit, for a whole block and for each half of one
 * (balance.units = sublayer); a frozen block's weight part adds nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/model.h"
#include "testing.h"

static void fill(float *x, long n, uint64_t stream, float std)
{
    for (long i = 0; i < n; i++) x[i] = std * dm_normal(17, stream, (uint64_t)i);
}

static double dot(const float *a, const float *b, long n)
{
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Central difference of f at x[i] (step h), f read through eval. */
typedef double (*objective)(void *ctx);
static double central(float *x, long i, float h, objective eval, void *ctx)
{
    float keep = x[i];
    x[i] = keep + h;
    double up = eval(ctx);
    x[i] = keep - h;
    double down = eval(ctx);
    x[i] = keep;
    return (up - down) / (2.0 * h);
}

enum { N = 6, C = 8, OC = 5 };

struct mm { float inp[N * C], weight[OC * C], bias[OC], dout[N * OC], out[N * OC]; };

static double mm_loss(void *ctx)
{
    struct mm *m = ctx;
    matmul_forward(m->out, m->inp, m->weight, m->bias, N, C, OC);
    return dot(m->out, m->dout, N * OC);
}

struct ln { float inp[N * C], weight[C], bias[C], dout[N * C], out[N * C], mean[N], rstd[N]; };

static double ln_loss(void *ctx)
{
    struct ln *l = ctx;
    layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->weight, l->bias, N, C);
    return dot(l->out, l->dout, N * C);
}

/* The largest |analytic - numeric| over x's entries. */
static double worst_difference(const float *analytic, float *x, long n, objective eval,
                               void *ctx)
{
    double worst = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs(analytic[i] - central(x, i, 1e-2f, eval, ctx));
        if (d > worst) worst = d;
    }
    return worst;
}

static void test_ops(void)
{
    struct mm m;
    fill(m.inp, N * C, 1, 1);
    fill(m.weight, OC * C, 2, 0.5f);
    fill(m.bias, OC, 3, 0.5f);
    fill(m.dout, N * OC, 4, 1);
    float dinp[N * C], dw[OC * C] = {0}, db[OC] = {0};
    matmul_backward_input(dinp, m.dout, m.weight, N, C, OC);
    matmul_backward_weight(dw, db, m.dout, m.inp, N, C, OC);
    double e_in = worst_difference(dinp, m.inp, N * C, mm_loss, &m);
    double e_w = worst_difference(dw, m.weight, OC * C, mm_loss, &m);
    double e_b = worst_difference(db, m.bias, OC, mm_loss, &m);
    printf("matmul halves vs finite differences: input %.2e, weight %.2e, bias %.2e\n",
           e_in, e_w, e_b);
    CHECK(e_in < 2e-3 && e_w < 2e-3 && e_b < 2e-3);
    float whole_in[N * C], whole_w[OC * C] = {0}, whole_b[OC] = {0};
    matmul_backward_overwrite(whole_in, whole_w, whole_b, m.dout, m.inp, m.weight, N, C, OC);
    CHECK(memcmp(whole_in, dinp, sizeof dinp) == 0 && memcmp(whole_w, dw, sizeof dw) == 0 &&
          memcmp(whole_b, db, sizeof db) == 0);

    struct ln l;
    fill(l.inp, N * C, 5, 1);
    fill(l.weight, C, 6, 0.5f);
    fill(l.bias, C, 7, 0.5f);
    fill(l.dout, N * C, 8, 1);
    ln_loss(&l);
    float ldinp[N * C] = {0}, lw[C] = {0}, lb[C] = {0};
    layernorm_backward_input(ldinp, l.dout, l.inp, l.weight, l.mean, l.rstd, N, C);
    layernorm_backward_weight(lw, lb, l.dout, l.inp, l.mean, l.rstd, N, C);
    e_in = worst_difference(ldinp, l.inp, N * C, ln_loss, &l);
    e_w = worst_difference(lw, l.weight, C, ln_loss, &l);
    e_b = worst_difference(lb, l.bias, C, ln_loss, &l);
    printf("layernorm halves vs finite differences: input %.2e, weight %.2e, bias %.2e\n",
           e_in, e_w, e_b);
    CHECK(e_in < 5e-3 && e_w < 2e-3 && e_b < 2e-3);
    float all_in[N * C] = {0}, all_w[C] = {0}, all_b[C] = {0};
    layernorm_backward(all_in, all_w, all_b, l.dout, l.inp, l.weight, l.mean, l.rstd, N, C);
    CHECK(memcmp(all_in, ldinp, sizeof ldinp) == 0 && memcmp(all_w, lw, sizeof lw) == 0 &&
          memcmp(all_b, lb, sizeof lb) == 0);
}

enum { BB = 2, TT = 8, MB = 2 };

/* Two micro-batches through one block: 1F1B's order with block_backward,
 * or ZB-H1's with the two parts; din of each into din[mb], the gradients
 * in blk. */
static void run_block(struct block *blk, int split, float *const *in, float *const *dout,
                      float **din)
{
    int Cb = blk->C;
    long n = (long)BB * TT * Cb;
    struct block_acts acts[MB];
    struct block_wgrad w[MB];
    struct block_scratch s;
    block_scratch_alloc(&s, BB, TT, Cb, blk->NH);
    float *out = dm_alloc((size_t)n * sizeof(float));
    float *grad = dm_alloc((size_t)n * sizeof(float));
    for (int mb = 0; mb < MB; mb++) {
        block_acts_alloc(&acts[mb], BB, TT, Cb, blk->NH);
        block_wgrad_alloc(&w[mb], BB, TT, Cb);
    }
    for (int mb = 0; mb < MB; mb++) {
        block_forward(blk, &acts[mb], out, in[mb], BB, TT);
        if (split) continue;
        memcpy(grad, dout[mb], (size_t)n * sizeof(float));
        block_backward(blk, &acts[mb], &s, grad, grad, in[mb], BB, TT);   /* din aliases dout */
        memcpy(din[mb], grad, (size_t)n * sizeof(float));
    }
    for (int mb = 0; split && mb < MB; mb++) {
        memcpy(grad, dout[mb], (size_t)n * sizeof(float));
        block_backward_input(blk, &acts[mb], &s, &w[mb], grad, grad, in[mb], BB, TT);
        memcpy(din[mb], grad, (size_t)n * sizeof(float));
    }
    for (int mb = 0; split && mb < MB; mb++)
        block_backward_weight(blk, &acts[mb], &w[mb], in[mb], BB, TT);
    for (int mb = 0; mb < MB; mb++) {
        block_acts_free(&acts[mb]);
        block_wgrad_free(&w[mb]);
    }
    dm_free(grad);
    dm_free(out);
    block_scratch_free(&s);
}

static void test_block(int frozen, int halves)
{
    static const char *const names[] = {"block", "attention half", "MLP half"};
    const char *what = names[halves];
    struct gpt_shape shape = {.vocab = 32, .max_seq = 16, .layers = 2, .heads = 4,
                              .channels = 32};
    long n = (long)BB * TT * shape.channels;
    float *in[MB], *dout[MB], *din_whole[MB], *din_split[MB];
    for (int mb = 0; mb < MB; mb++) {
        in[mb] = dm_alloc((size_t)n * sizeof(float));
        dout[mb] = dm_alloc((size_t)n * sizeof(float));
        din_whole[mb] = dm_alloc((size_t)n * sizeof(float));
        din_split[mb] = dm_alloc((size_t)n * sizeof(float));
        fill(in[mb], n, 20 + mb, 1);
        fill(dout[mb], n, 30 + mb, 0.1f);
    }
    struct block whole, split;
    block_init(&whole, 1, &shape, 5);
    block_init(&split, 1, &shape, 5);
    whole.frozen = split.frozen = frozen;
    whole.halves = split.halves = halves;
    run_block(&whole, 0, in, dout, din_whole);
    run_block(&split, 1, in, dout, din_split);
    for (int mb = 0; mb < MB; mb++)
        CHECK_MSG(memcmp(din_whole[mb], din_split[mb], (size_t)n * sizeof(float)) == 0,
                  "%s%s: micro-batch %d's input gradient differs", frozen ? "frozen " : "",
                  what, mb);
    size_t grads = whole.nparams * sizeof(float);
    CHECK_MSG(memcmp(whole.grads, split.grads, grads) == 0,
              "%s%s: the weight gradients differ", frozen ? "frozen " : "", what);
    double norm = dot(split.grads, split.grads, (long)split.nparams);
    CHECK(frozen ? norm == 0 : norm > 0);
    printf("%s%s: 2 micro-batches, F F B B W W = F B F B bit for bit (gradient norm^2 %.3g)\n",
           frozen ? "frozen " : "", what, norm);
    block_free(&whole);
    block_free(&split);
    for (int mb = 0; mb < MB; mb++) {
        dm_free(in[mb]);
        dm_free(dout[mb]);
        dm_free(din_whole[mb]);
        dm_free(din_split[mb]);
    }
}

int main(void)
{
    test_ops();
    for (int halves = 0; halves <= BLOCK_HALF_MLP; halves++) {
        test_block(0, halves);
        test_block(1, halves);
    }
    return testing_report("test_block_split");
}
