/* test_dyn: the model side of layer freezing and early exit.
 *
 * - early exit, forward and backward by finite differences: a tiny GPT with
 *   a fixed exit pattern (gpt_exit.forced) and exit-head losses; the loss
 *   is the final loss plus the weighted exit losses, and every block
 *   parameter's analytic gradient matches a central difference (in float,
 *   so the tolerance is loose; the largest difference is printed);
 * - an exited token's hidden state is copied forward bit for bit, and
 *   block_forward_rows with every token active agrees with block_forward;
 * - freezing: a frozen block packs and unpacks with its flag, computes no
 *   weight gradient, passes the same input gradient back, and a frozen
 *   prefix leaves the later blocks' gradients bit-identical. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/model.h"
#include "testing.h"

static const struct gpt_shape shape = {.vocab = 16, .max_seq = 8, .layers = 4, .heads = 2,
                                       .channels = 8};
enum { B = 2, T = 6, N = B * T };

static void set_batch(struct gpt_acts *acts)
{
    for (int n = 0; n < N; n++) {
        acts->tokens[n] = (int)((n * 7 + 3) % shape.vocab);
        acts->targets[n] = (int)((n * 5 + 1) % shape.vocab);
    }
}

static double total_loss(struct gpt *m, struct gpt_acts *acts)
{
    m->exit->exit_loss_sum = 0.0;
    float loss = gpt_forward(m, acts);
    return (double)loss + m->exit->exit_loss_sum;
}

static void test_exit_fd(void)
{
    struct gpt m;
    gpt_build(&m, &shape, 0, shape.layers, 1, 1, 7);
    /* make the biases and norms non-trivial */
    for (int b = 0; b < shape.layers; b++)
        for (size_t i = 0; i < m.blocks[b].nparams; i++)
            m.blocks[b].params[i] += 0.05f * dm_normal(5, 100 + (uint64_t)b, i);
    int forced[N];
    for (int n = 0; n < N; n++) forced[n] = shape.layers;
    /* tokens leave after block 1 or 2; the last token of each row and some
     * middle ones stay; one row has every token but one gone */
    int pattern[N] = {1, 4, 2, 1, 4, 4, 1, 1, 2, 1, 1, 4};
    memcpy(forced, pattern, sizeof forced);
    struct gpt_exit x = {.from = 1, .allow = 1, .confidence = GPT_EXIT_SOFTMAX,
                         .threshold = 2.0f, .loss_weight = 0.7f, .wte = m.wte,
                         .lnf_w = m.lnf_w, .lnf_b = m.lnf_b, .forced = forced};
    m.exit = &x;
    struct gpt_acts acts;
    gpt_acts_alloc(&acts, &m, B, T);
    set_batch(&acts);
    struct block_scratch scratch;
    block_scratch_alloc(&scratch, B, T, shape.channels, shape.heads);
    gpt_zero_grads(&m);
    total_loss(&m, &acts);
    /* exited tokens are copied forward bit for bit */
    size_t BTC = (size_t)N * shape.channels;
    for (int n = 0; n < N; n++)
        for (int l = forced[n] + 1; l < shape.layers; l++)
            CHECK(!memcmp(acts.residual + (l + 1) * BTC + (size_t)n * shape.channels,
                          acts.residual + l * BTC + (size_t)n * shape.channels,
                          (size_t)shape.channels * sizeof(float)));
    gpt_backward(&m, &acts, &scratch, 1.0f, NULL, NULL);
    gpt_tie_wte_grads(&m, NULL);
    double worst = 0.0;
    int checked = 0;
    for (int b = 0; b < shape.layers; b++) {
        struct block *blk = &m.blocks[b];
        for (size_t i = 0; i < blk->nparams; i += 7) {
            float keep = blk->params[i];
            float h = 1e-2f;
            blk->params[i] = keep + h;
            double up = total_loss(&m, &acts);
            blk->params[i] = keep - h;
            double down = total_loss(&m, &acts);
            blk->params[i] = keep;
            double fd = (up - down) / (2.0 * h), an = blk->grads[i];
            double diff = fabs(fd - an);
            if (diff > worst) worst = diff;
            CHECK_MSG(diff <= 2e-3 + 0.05 * fabs(fd), "block %d param %zu: analytic %g, "
                      "finite difference %g", b, i, an, fd);
            checked++;
        }
    }
    printf("early exit finite differences: %d parameters, largest difference %.3g\n", checked,
           worst);
    /* every token active: block_forward_rows agrees with block_forward */
    int rows[N];
    for (int n = 0; n < N; n++) rows[n] = n;
    float *out1 = dm_alloc(BTC * sizeof(float)), *out2 = dm_alloc(BTC * sizeof(float));
    float *work = dm_alloc(BTC * sizeof(float));
    block_forward(&m.blocks[1], &acts.blocks[1], out1, acts.residual + BTC, B, T);
    block_forward_rows(&m.blocks[1], &acts.blocks[1], out2, acts.residual + BTC, B, T, rows, N,
                       work);
    double d = 0.0;
    for (size_t i = 0; i < BTC; i++) d = fmax(d, fabs(out1[i] - out2[i]));
    CHECK_MSG(d < 1e-5, "rows forward differs from block_forward by %g", d);
    dm_free(out1);
    dm_free(out2);
    dm_free(work);
    gpt_acts_free(&acts);
    block_scratch_free(&scratch);
    gpt_free(&m);
}

static void test_freeze(void)
{
    struct gpt a, f;
    gpt_build(&a, &shape, 0, shape.layers, 1, 1, 11);
    gpt_build(&f, &shape, 0, shape.layers, 1, 1, 11);
    /* pack carries the flag */
    f.blocks[0].frozen = f.blocks[1].frozen = 1;
    f.frozen_prefix = 2;
    size_t bytes = block_pack_size(&f.blocks[1]);
    void *buf = dm_alloc(bytes);
    block_pack(&f.blocks[1], buf);
    struct block copy;
    memset(&copy, 0, sizeof copy);
    char err[256];
    CHECK(block_unpack(&copy, buf, bytes, &shape, err, sizeof err) == 0);
    CHECK(copy.frozen == 1);
    block_free(&copy);
    dm_free(buf);
    struct gpt_acts aa, fa;
    gpt_acts_alloc(&aa, &a, B, T);
    gpt_acts_alloc(&fa, &f, B, T);
    set_batch(&aa);
    set_batch(&fa);
    struct block_scratch scratch;
    block_scratch_alloc(&scratch, B, T, shape.channels, shape.heads);
    gpt_zero_grads(&a);
    gpt_zero_grads(&f);
    float la = gpt_forward(&a, &aa), lf = gpt_forward(&f, &fa);
    CHECK(la == lf);
    gpt_backward(&a, &aa, &scratch, 1.0f, NULL, NULL);
    gpt_backward(&f, &fa, &scratch, 1.0f, NULL, NULL);
    for (int b = 0; b < shape.layers; b++) {
        size_t n = f.blocks[b].nparams;
        if (b < 2) {
            double s = 0.0;
            for (size_t i = 0; i < n; i++) s += fabs(f.blocks[b].grads[i]);
            CHECK_MSG(s == 0.0, "frozen block %d has gradient %g", b, s);
        } else {
            CHECK_MSG(!memcmp(a.blocks[b].grads, f.blocks[b].grads, n * sizeof(float)),
                      "block %d after the frozen prefix has different gradients", b);
        }
    }
    /* a frozen block outside the prefix: no weight gradient, same din */
    struct block *blk = &f.blocks[2];
    size_t BTC = (size_t)N * shape.channels;
    float *dout = dm_alloc(BTC * sizeof(float)), *din1 = dm_alloc(BTC * sizeof(float));
    float *din2 = dm_alloc(BTC * sizeof(float));
    for (size_t i = 0; i < BTC; i++) dout[i] = 0.01f * dm_normal(3, 3, i);
    gpt_zero_grads(&f);
    block_backward(blk, &fa.blocks[2], &scratch, din1, dout, fa.residual + 2 * BTC, B, T);
    gpt_zero_grads(&f);
    blk->frozen = 1;
    block_backward(blk, &fa.blocks[2], &scratch, din2, dout, fa.residual + 2 * BTC, B, T);
    double s = 0.0;
    for (size_t i = 0; i < blk->nparams; i++) s += fabs(blk->grads[i]);
    CHECK(s == 0.0);
    CHECK(!memcmp(din1, din2, BTC * sizeof(float)));
    dm_free(dout);
    dm_free(din1);
    dm_free(din2);
    gpt_acts_free(&aa);
    gpt_acts_free(&fa);
    block_scratch_free(&scratch);
    gpt_free(&a);
    gpt_free(&f);
}

int main(void)
{
    dm_threads_init(2);
    test_exit_fd();
    test_freeze();
    dm_threads_shutdown();
    return testing_report("test_dyn");
}
