/* test_dyn: the model side of layer freezing and early exit.
 *
 * - early exit, forward and backward by finite differences: a tiny GPT with
 *   a fixed exit pattern (gpt_exit.forced) and exit-head losses; the loss
 *   is the final loss plus the weighted exit losses, and every block
 *   parameter's analytic gradient matches a central difference (in float,
 *   so the tolerance is loose; the largest difference is printed);
 * - an exited token's hidden state is copied forward bit for bit, and
 *   block_forward_rows with every token active agrees with block_forward;
 * - block_forward_rows / block_backward_rows against the full block at a
 *   size where attention runs in several query and key blocks (T = 70):
 *   an active token's output is the full block's, and the gradients are
 *   the full block's with the exited tokens' output gradient set to zero
 *   (plus the copy path for their input gradient), for several patterns;
 * - freezing: a frozen block packs and unpacks with its flag, computes no
 *   weight gradient, passes the same input gradient back, and a frozen
 *   prefix leaves the later blocks' gradients bit-identical.
 *
 * `test_dyn --bench [threads]` times one block of the early-exit demo
 * shape (C = 128, 4 heads, a micro-batch of 2 x 64 tokens), forward plus
 * backward, with every token active and with a share of the tokens gone
 * (spread over the positions), and the exit head on top: what a token
 * that left saves in a later block. */
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

/* Largest |a - b| / (1 + |b|) over n floats. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]) / (1.0 + fabs(b[i])));
    return worst;
}

static void test_rows_vs_full(void)
{
    static const struct gpt_shape rs = {.vocab = 16, .max_seq = 70, .layers = 2, .heads = 2,
                                        .channels = 32};
    enum { RB = 2, RT = 70, RN = RB * RT, RC = 32 };
    size_t NC = (size_t)RN * RC;
    struct block full, part;
    block_init(&full, 1, &rs, 11);
    block_init(&part, 1, &rs, 11);
    for (size_t i = 0; i < full.nparams; i++)    /* non-trivial norms and biases */
        full.params[i] = part.params[i] = full.params[i] + 0.05f * dm_normal(5, 200, i);
    struct block_acts fa, pa;
    block_acts_alloc(&fa, RB, RT, RC, rs.heads);
    block_acts_alloc(&pa, RB, RT, RC, rs.heads);
    struct block_scratch s;
    block_scratch_alloc(&s, RB, RT, RC, rs.heads);
    float *in = dm_alloc(NC * sizeof(float)), *dout = dm_alloc(NC * sizeof(float));
    float *dmask = dm_alloc(NC * sizeof(float)), *work = dm_alloc(NC * sizeof(float));
    float *out_f = dm_alloc(NC * sizeof(float)), *out_p = dm_alloc(NC * sizeof(float));
    float *din_f = dm_alloc(NC * sizeof(float)), *din_p = dm_alloc(NC * sizeof(float));
    for (size_t i = 0; i < NC; i++) {
        in[i] = dm_normal(6, 1, i);
        dout[i] = dm_normal(6, 2, i);
    }
    for (int pattern = 0; pattern < 5; pattern++) {
        int rows[RN], na = 0;
        for (int n = 0; n < RN; n++) {
            int t = n % RT, keep;
            switch (pattern) {
            case 0: keep = dm_uniform(7, 3, (uint64_t)n) < 0.5; break;     /* random half */
            case 1: keep = dm_uniform(7, 4, (uint64_t)n) < 0.1; break;     /* few left */
            case 2: keep = t != RT - 1 && t % 3 != 0; break;   /* last position gone */
            case 3: keep = n < RT ? t < 40 : t == 0; break;    /* a short and a one-token row */
            default: keep = n >= RT; break;                     /* a whole sequence gone */
            }
            if (keep) rows[na++] = n;
        }
        char active[RN] = {0};
        for (int i = 0; i < na; i++) active[rows[i]] = 1;
        memset(full.grads, 0, full.nparams * sizeof(float));
        memset(part.grads, 0, part.nparams * sizeof(float));
        block_forward(&full, &fa, out_f, in, RB, RT);
        block_forward_rows(&part, &pa, out_p, in, RB, RT, rows, na, work);
        for (int n = 0; n < RN; n++)     /* exited: copied forward */
            if (!active[n]) memcpy(out_f + (size_t)n * RC, in + (size_t)n * RC, RC * sizeof(float));
        double dfwd = rel_diff(out_p, out_f, NC);
        for (size_t i = 0; i < NC; i++) dmask[i] = active[i / RC] ? dout[i] : 0.0f;
        block_backward(&full, &fa, &s, din_f, dmask, in, RB, RT);
        for (size_t i = 0; i < NC; i++)
            if (!active[i / RC]) din_f[i] += dout[i];
        block_backward_rows(&part, &pa, &s, din_p, dout, in, RB, RT, rows, na, work);
        double ddin = rel_diff(din_p, din_f, NC);
        double dgrad = rel_diff(part.grads, full.grads, full.nparams);
        printf("rows vs full block, pattern %d (%d of %d active): out %.2g, din %.2g, "
               "grads %.2g\n", pattern, na, RN, dfwd, ddin, dgrad);
        CHECK_MSG(dfwd < 1e-5, "pattern %d: rows forward differs by %g", pattern, dfwd);
        CHECK_MSG(ddin < 1e-4, "pattern %d: rows input gradient differs by %g", pattern, ddin);
        CHECK_MSG(dgrad < 1e-4, "pattern %d: rows weight gradients differ by %g", pattern,
                  dgrad);
    }
    float *bufs[] = {in, dout, dmask, work, out_f, out_p, din_f, din_p};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dm_free(bufs[i]);
    block_acts_free(&fa);
    block_acts_free(&pa);
    block_scratch_free(&s);
    block_free(&full);
    block_free(&part);
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

static double time_block(struct block *blk, struct block_acts *ba, struct block_scratch *s,
                         float *out, float *din, const float *in, const float *dout,
                         int Bb, int Tb, const int *rows, int na, float *work)
{
    enum { REPS = 30 };
    double best = INFINITY;
    for (int r = 0; r < REPS; r++) {
        double t0 = dm_now();
        if (na == Bb * Tb) {
            block_forward(blk, ba, out, in, Bb, Tb);
            block_backward(blk, ba, s, din, dout, in, Bb, Tb);
        } else {
            block_forward_rows(blk, ba, out, in, Bb, Tb, rows, na, work);
            block_backward_rows(blk, ba, s, din, dout, in, Bb, Tb, rows, na, work);
        }
        double t = dm_now() - t0;
        if (t < best) best = t;
    }
    return best * 1e3;
}

static void bench(int threads)
{
    static const struct gpt_shape bs = {.vocab = 256, .max_seq = 64, .layers = 4, .heads = 4,
                                        .channels = 128};
    enum { BB = 2, TB = 64, NB = BB * TB };
    dm_threads_init(threads);
    struct gpt m;
    gpt_build(&m, &bs, 0, bs.layers, 1, 1, 7);
    struct gpt_acts acts;
    gpt_acts_alloc(&acts, &m, BB, TB);
    struct block_scratch s;
    block_scratch_alloc(&s, BB, TB, bs.channels, bs.heads);
    size_t BTC = (size_t)NB * bs.channels;
    float *in = dm_alloc(BTC * sizeof(float)), *out = dm_alloc(BTC * sizeof(float));
    float *dout = dm_alloc(BTC * sizeof(float)), *din = dm_alloc(BTC * sizeof(float));
    float *work = dm_alloc(BTC * sizeof(float));
    for (size_t i = 0; i < BTC; i++) {
        in[i] = dm_normal(3, 1, i);
        dout[i] = 1e-3f * dm_normal(3, 2, i);
    }
    struct block *blk = &m.blocks[1];
    printf("early-exit block, C %d, %d heads, micro-batch %d x %d, %d thread(s); "
           "best of 30, ms\n", bs.channels, bs.heads, BB, TB, threads);
    printf("%-8s %-10s %-12s %s\n", "active", "fwd+bwd", "vs all", "per active token (us)");
    double full = 0.0;
    for (int pct = 100; pct >= 0; pct -= 25) {
        int rows[NB], na = 0;
        /* the share pct of the tokens stays, spread over the positions */
        for (int n = 0; n < NB; n++)
            if ((n * 37 % 100) < pct) rows[na++] = n;
        double ms = time_block(blk, &acts.blocks[1], &s, out, din, in, dout, BB, TB, rows, na,
                               work);
        if (pct == 100) full = ms;
        printf("%3d%%     %-10.3f %-12.2f %.2f\n", 100 * na / NB, ms, ms / full,
               na ? 1e3 * ms / na : 0.0);
    }
    /* The same block with its exit head (softmax confidence, exit loss),
     * every token active: what the head adds per block. */
    struct gpt_exit x = {.from = 0, .allow = 0, .confidence = GPT_EXIT_SOFTMAX,
                         .threshold = 2.0f, .loss_weight = 1.0f, .wte = m.wte,
                         .lnf_w = m.lnf_w, .lnf_b = m.lnf_b};
    m.exit = &x;
    for (int n = 0; n < NB; n++) acts.targets[n] = n % bs.vocab;
    exit_begin_forward(&m, &acts);
    double best = INFINITY;
    for (int r = 0; r < 30; r++) {
        double t0 = dm_now();
        exit_forward_block(&m, &acts, 1, out, in);
        exit_backward_block(&m, &acts, &s, 1, din, dout, in, 1.0f, NULL);
        best = fmin(best, dm_now() - t0);
    }
    printf("with its exit head, every token active: %.3f ms (%.2f of the block alone)\n",
           best * 1e3, best * 1e3 / full);
    m.exit = NULL;
    dm_free(in);
    dm_free(out);
    dm_free(dout);
    dm_free(din);
    dm_free(work);
    gpt_acts_free(&acts);
    block_scratch_free(&s);
    gpt_free(&m);
    dm_threads_shutdown();
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        bench(argc > 2 ? atoi(argv[2]) : 1);
        return 0;
    }
    dm_threads_init(2);
    test_exit_fd();
    test_rows_vs_full();
    test_freeze();
    dm_threads_shutdown();
    return testing_report("test_dyn");
}
