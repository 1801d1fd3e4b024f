/* Hash-sparse attention (src/model/hash_attention.c) and the mixture-of-
 * depths block (src/model/mod.c) on their own.
 *
 * Hash-sparse attention:
 *
 *   - with one bucket it is ordinary causal attention: output and gradient
 *     match attention_forward / attention_backward (tolerance 1e-5), and it
 *     visits every causal tile;
 *   - finite differences of the backward for a fixed rotation with 4
 *     buckets (the buckets are checked to be the same on both sides of
 *     every difference);
 *   - a query attends only to keys of its bucket at earlier or equal
 *     positions and to its own key (checked against a direct loop), and
 *     more buckets visit fewer tiles;
 *   - the rotation is a pure function of (seed, layer, step), and each of
 *     its columns has unit norm;
 *   - no query is left without a key: with random q, k at T 2048 / 8
 *     buckets, T 256 / 8 and T 64 / 4 (where 0.3%, 2.7% and 4.6% of the
 *     rows found no key of their bucket and output 0 before the own-key
 *     rule) no row outputs 0, and the rows counted as attending to their
 *     own key alone are exactly those the definition says;
 *   - forward and backward give the same bits for 1 and 2 threads.
 *
 * Mixture of depths:
 *   - top-k chooses exactly k tokens per sequence (ties: lower position);
 *   - tokens not chosen pass through bit for bit; a chosen token gets
 *     x + r (f(x) - x) with f the block run on the chosen tokens alone;
 *   - finite differences of the backward (input, router weight, block
 *     weights) for fixed routing, top-k and an uneven causal-style choice
 *     (sequences of different counts, one with no token at all);
 *   - a MoD block with hash attention: its packed chosen tokens get what
 *     the hash block gives each sequence's chosen tokens alone, and finite
 *     differences of its backward (a bucket that changed under a
 *     difference would show as a gross error; none does: 9e-5);
 *   - the causal predictor is an MLP (hidden width H, ReLU): its logit
 *     against the formula computed directly, and finite differences of
 *     its binary cross-entropy with respect to every weight (W1, b1, w2,
 *     b2; a difference that moves a hidden unit across its ReLU kink is
 *     left out and counted), and the gradient scaled and added into what
 *     dweight held.
 *
 * Both against PyTorch (tests/reference/make_mod_hash_fixture.py, committed
 * as tests/reference/fixture_mod_hash.bin): outputs and gradients within
 * 1e-4. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/rotation_group.h"
#include "dynmo/model.h"
#include "dyn/hash.h"
#include "dyn/mod.h"
#include "testing.h"

enum { B = 2, T = 80, C = 16, NH = 2, HS = C / NH };

static float *floats(size_t n) { return calloc(n, sizeof(float)); }

static void fill(float *x, size_t n, uint64_t stream, float std)
{
    for (size_t i = 0; i < n; i++) x[i] = std * dm_normal(7, stream, i);
}

struct hash_run {
    float *out, *lse, *dqkv;
    int *order, *bucket;
    long tiles_fwd, tiles_bwd, alone;
};

static void hash_run_alloc(struct hash_run *r)
{
    r->out = floats((size_t)B * T * C);
    r->lse = floats((size_t)B * NH * T);
    r->dqkv = floats((size_t)B * T * 3 * C);
    r->order = calloc((size_t)B * NH * 2 * T, sizeof(int));
    r->bucket = calloc((size_t)B * NH * 2 * T, sizeof(int));
}

static void hash_run_free(struct hash_run *r)
{
    free(r->out); free(r->lse); free(r->dqkv); free(r->order); free(r->bucket);
}

static void hash_run(struct hash_run *r, const float *qkv, const float *rotation, int nb,
                     const float *dout)
{
    r->tiles_fwd = group_attention_forward(r->out, r->lse, r->order, r->bucket, &r->alone, qkv,
                                           rotation, B, T, C, NH, nb);
    if (dout)
        r->tiles_bwd = group_attention_backward(r->dqkv, dout, qkv, r->out, r->lse, r->order,
                                                r->bucket, B, T, C, NH);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static void test_one_bucket_is_dense(void)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = floats(nqkv), *dout = floats(nout);
    fill(qkv, nqkv, 1, 1.0f);
    fill(dout, nout, 2, 1.0f);
    float *out = floats(nout), *att = floats((size_t)B * NH * T * T);
    float *scratch = floats((size_t)B * NH * T * T), *dqkv = floats(nqkv);
    attention_forward(out, att, qkv, B, T, C, NH);
    attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    struct hash_run r;
    hash_run_alloc(&r);
    hash_run(&r, qkv, NULL, 1, dout);
    double dout_max = max_abs_diff(out, r.out, nout), dgrad_max = max_abs_diff(dqkv, r.dqkv, nqkv);
    printf("one bucket vs dense causal attention: output max |diff| %.3g, gradient %.3g\n",
           dout_max, dgrad_max);
    CHECK(dout_max <= 1e-5);
    CHECK(dgrad_max <= 1e-5);
    long tiles_per_item = 0, nt = (T + GROUP_TILE - 1) / GROUP_TILE;
    for (long i = 0; i < nt; i++) tiles_per_item += i + 1;
    CHECK_MSG(r.tiles_fwd == B * NH * tiles_per_item && r.tiles_bwd == r.tiles_fwd,
              "tiles %ld / %ld, causal %ld", r.tiles_fwd, r.tiles_bwd, B * NH * tiles_per_item);
    hash_run_free(&r);
    free(qkv); free(dout); free(out); free(att); free(scratch); free(dqkv);
}

/* The output of one query computed directly from its definition: the
 * keys of its bucket at or before it, and its own key. */
static void direct_query(float *o, const float *qkv, const int *bucket, long b, int h, int t)
{
    float scale = (float)(1.0 / sqrt((double)HS));
    double s[T], mx = -INFINITY, sum = 0.0;
    const float *q = qkv + (b * T + t) * 3L * C + h * HS;
    for (int j = 0; j <= t; j++) {
        s[j] = -INFINITY;
        if (bucket[t] != bucket[T + j] && j != t) continue;
        const float *k = qkv + (b * T + j) * 3L * C + C + h * HS;
        double dot = 0.0;
        for (int d = 0; d < HS; d++) dot += (double)q[d] * k[d];
        s[j] = dot * scale;
        if (s[j] > mx) mx = s[j];
    }
    double acc[HS] = {0};
    for (int j = 0; j <= t; j++) {
        if (s[j] == -INFINITY) continue;
        double p = exp(s[j] - mx);
        sum += p;
        const float *v = qkv + (b * T + j) * 3L * C + 2 * C + h * HS;
        for (int d = 0; d < HS; d++) acc[d] += p * v[d];
    }
    for (int d = 0; d < HS; d++) o[d] = sum > 0.0 ? (float)(acc[d] / sum) : 0.0f;
}

static void test_buckets_and_tiles(void)
{
    size_t nqkv = (size_t)B * T * 3 * C;
    float *qkv = floats(nqkv), *rotation = floats((size_t)NH * HS * 4);
    fill(qkv, nqkv, 3, 1.0f);
    hash_rotation_draw(rotation, NH, HS, 8, 11, 3, 5);
    struct hash_run r1, r8;
    hash_run_alloc(&r1);
    hash_run_alloc(&r8);
    hash_run(&r1, qkv, NULL, 1, NULL);
    hash_run(&r8, qkv, rotation, 8, NULL);
    double worst = 0.0;
    int alone = 0, used[8] = {0};
    for (long b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int *bucket = r8.bucket + (b * NH + h) * 2L * T;
            for (int t = 0; t < T; t++) {
                float o[HS];
                direct_query(o, qkv, bucket, b, h, t);
                const float *got = r8.out + (b * T + t) * (long)C + h * HS;
                double d = max_abs_diff(o, got, HS);
                if (d > worst) worst = d;
                int mates = 0;   /* keys of its bucket at or before it */
                for (int j = 0; j <= t; j++) mates += bucket[T + j] == bucket[t];
                alone += mates == 0;
                used[bucket[t]] = 1;
                /* the order is a stable sort by bucket */
                const int *order = r8.order + (b * NH + h) * 2L * T;
                if (t > 0) {
                    int p = order[t - 1], q = order[t];
                    CHECK(bucket[p] < bucket[q] || (bucket[p] == bucket[q] && p < q));
                }
            }
        }
    int buckets_used = 0;
    for (int i = 0; i < 8; i++) buckets_used += used[i];
    printf("8 buckets: max |diff| to the direct definition %.3g; %d of 8 buckets used; "
           "%d queries with their own key alone (counted %ld); tiles %ld vs %ld with one "
           "bucket\n", worst, buckets_used, alone, r8.alone, r8.tiles_fwd,
           r1.tiles_fwd);
    CHECK(worst <= 1e-5);
    CHECK(r8.alone == alone && r1.alone == 0);
    CHECK(buckets_used >= 6);
    CHECK(r8.tiles_fwd < r1.tiles_fwd);
    hash_run_free(&r1);
    hash_run_free(&r8);
    free(qkv); free(rotation);
}

static double loss_of(const float *out, const float *w, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)out[i] * w[i];
    return s;
}

static void test_finite_differences(void)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    size_t nbucket = (size_t)B * NH * 2 * T;
    float *qkv = floats(nqkv), *w = floats(nout), *rotation = floats((size_t)NH * HS * 2);
    fill(qkv, nqkv, 4, 1.0f);
    fill(w, nout, 5, 1.0f);
    hash_rotation_draw(rotation, NH, HS, 4, 11, 0, 0);
    struct hash_run r, p;
    hash_run_alloc(&r);
    hash_run_alloc(&p);
    hash_run(&r, qkv, rotation, 4, w);
    double worst = 0.0;
    int checked = 0, skipped = 0;
    const double eps = 1e-2;
    for (size_t i = 0; i < nqkv; i += 37) {
        float keep = qkv[i];
        qkv[i] = keep + (float)eps;
        hash_run(&p, qkv, rotation, 4, NULL);
        int same = memcmp(p.bucket, r.bucket, nbucket * sizeof(int)) == 0;
        double up = loss_of(p.out, w, nout);
        qkv[i] = keep - (float)eps;
        hash_run(&p, qkv, rotation, 4, NULL);
        same = same && memcmp(p.bucket, r.bucket, nbucket * sizeof(int)) == 0;
        double down = loss_of(p.out, w, nout);
        qkv[i] = keep;
        if (!same) { skipped++; continue; }
        double numeric = (up - down) / (2 * eps);
        double err = fabs(numeric - r.dqkv[i]) / (1.0 + fabs(numeric));
        if (err > worst) worst = err;
        checked++;
    }
    printf("finite differences, 4 buckets, fixed rotation: %d entries, worst relative error "
           "%.3g (%d skipped: a bucket changed)\n", checked, worst, skipped);
    CHECK(checked > 100);
    CHECK(worst <= 5e-3);
    hash_run_free(&r);
    hash_run_free(&p);
    free(qkv); free(w); free(rotation);
}

static void test_rotation(void)
{
    size_t n = (size_t)NH * HS * 4;
    float *a = floats(n), *b = floats(n), *c = floats(n);
    hash_rotation_draw(a, NH, HS, 8, 42, 2, 10);
    hash_rotation_draw(b, NH, HS, 8, 42, 2, 10);
    hash_rotation_draw(c, NH, HS, 8, 42, 2, 11);
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    CHECK(memcmp(a, c, n * sizeof(float)) != 0);
    hash_rotation_draw(c, NH, HS, 8, 42, 3, 10);
    CHECK(memcmp(a, c, n * sizeof(float)) != 0);
    free(a); free(b); free(c);
}

/* R (NH, hs, nb/2): every column (hs values of one head) has unit norm. */
static void test_rotation_columns(void)
{
    enum { RNH = 4, RHS = 16, HALF = 4 };
    float R[RNH * RHS * HALF];
    double worst = 0.0;
    for (int layer = 0; layer < 3; layer++) {
        hash_rotation_draw(R, RNH, RHS, 2 * HALF, 1337, layer, 7);
        for (int h = 0; h < RNH; h++)
            for (int c = 0; c < HALF; c++) {
                double squares = 0.0;
                for (int d = 0; d < RHS; d++) {
                    double x = R[(h * RHS + d) * HALF + c];
                    squares += x * x;
                }
                worst = fmax(worst, fabs(sqrt(squares) - 1.0));
            }
    }
    printf("rotation: %d columns of 16, worst |norm - 1| %.3g\n", 3 * RNH * HALF, worst);
    CHECK(worst <= 1e-6);
}

/* Random q, k, v at the sizes of configs/hash.ini's heads (hs 16): no
 * query row outputs 0 (every query attends at least to its own key, whose
 * value row is not 0), every lse is finite, and the rows counted as
 * attending to their own key alone are those whose bucket holds no key at
 * or before them. */
static void test_no_empty_rows(void)
{
    const struct { int T, buckets; } cases[] = {{2048, 8}, {256, 8}, {64, 4}};
    enum { EB = 4, EC = 64, ENH = 4, EHS = EC / ENH };
    for (int k = 0; k < 3; k++) {
        int ET = cases[k].T, nb = cases[k].buckets;
        long rows = (long)EB * ENH * ET;
        size_t nqkv = (size_t)EB * ET * 3 * EC;
        float *qkv = floats(nqkv), *out = floats((size_t)EB * ET * EC), *lse = floats(rows);
        float *R = floats((size_t)ENH * EHS * nb / 2);
        int *order = calloc(2 * (size_t)rows, sizeof(int));
        int *bucket = calloc(2 * (size_t)rows, sizeof(int));
        fill(qkv, nqkv, 40 + k, 1.0f);
        hash_rotation_draw(R, ENH, EHS, nb, 1337, k, 0);
        long alone = -1;
        group_attention_forward(out, lse, order, bucket, &alone, qkv, R, EB, ET, EC, ENH, nb);
        long zero = 0, infinite = 0, want_alone = 0;
        for (long r = 0; r < rows; r++) {   /* r = (b, h, t) */
            long b = r / (ENH * ET), h = r / ET % ENH, t = r % ET;
            const float *o = out + (b * ET + t) * EC + h * EHS;
            int z = 1;
            for (int d = 0; d < EHS; d++) z &= o[d] == 0.0f;
            zero += z;
            infinite += !isfinite(lse[r]);
            const int *bk = bucket + (b * ENH + h) * 2L * ET;
            int mates = 0;
            for (int j = 0; j <= t && !mates; j++) mates = bk[ET + j] == bk[t];
            want_alone += !mates;
        }
        printf("T %d, %d buckets, random q and k: %ld of %ld query rows output 0, %ld lse not "
               "finite; %ld (%.2f%%) attend to their own key alone (counted %ld)\n", ET, nb,
               zero, rows, infinite, want_alone, 100.0 * want_alone / rows, alone);
        CHECK(zero == 0 && infinite == 0);
        CHECK(alone == want_alone);
        free(qkv); free(out); free(lse); free(R); free(order); free(bucket);
    }
}

static void test_thread_count(void)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = floats(nqkv), *dout = floats(nout), *rotation = floats((size_t)NH * HS * 2);
    fill(qkv, nqkv, 6, 1.0f);
    fill(dout, nout, 8, 1.0f);
    hash_rotation_draw(rotation, NH, HS, 4, 1, 1, 1);
    struct hash_run r[2];
    for (int k = 0; k < 2; k++) {
        dm_threads_shutdown();
        dm_threads_init(k + 1);
        hash_run_alloc(&r[k]);
        hash_run(&r[k], qkv, rotation, 4, dout);
    }
    int same = memcmp(r[0].out, r[1].out, nout * sizeof(float)) == 0 &&
               memcmp(r[0].dqkv, r[1].dqkv, nqkv * sizeof(float)) == 0;
    printf("hash attention forward and backward on 1 and 2 threads: %s\n",
           same ? "same bits" : "DIFFERENT");
    CHECK(same);
    for (int k = 0; k < 2; k++) hash_run_free(&r[k]);
    free(qkv); free(dout); free(rotation);
}

/* ---- mixture of depths ---- */

enum { MB = 2, MT = 12, MN = MB * MT };

struct mod_fixture {
    struct block blk;
    struct block_acts acts;
    struct block_scratch scratch;
    struct mod_acts m;
    float *in, *out, *w, *router_w, *din, *work, *drouter;
};

static void mod_fixture_init(struct mod_fixture *f, int buckets)
{
    struct dm_config cfg;   /* the shape through the schemes (hash attention, seed 9) */
    config_defaults(&cfg);
    cfg.vocab = 32;
    cfg.max_seq = MT;
    cfg.layers = 2;
    cfg.heads = NH;
    cfg.channels = C;
    cfg.seed = 9;
    if (buckets) snprintf(cfg.attention, sizeof cfg.attention, "hash");
    cfg.hash_buckets = buckets;
    struct gpt_shape shape = dyn_shape_from_config(&cfg);
    block_init(&f->blk, 1, &shape, 5);
    fill(f->blk.params, f->blk.nparams, 20, 0.2f);
    block_acts_alloc(&f->acts, MB, MT, C, NH);
    block_scratch_alloc(&f->scratch, MB, MT, C, NH);
    mod_acts_alloc(&f->m, MB, MT, C);
    f->in = floats((size_t)MN * C);
    f->out = floats((size_t)MN * C);
    f->w = floats((size_t)MN * C);
    f->din = floats((size_t)MN * C);
    f->work = floats((size_t)MN * C);
    f->router_w = floats(C);
    f->drouter = floats(C);
    fill(f->in, (size_t)MN * C, 21, 1.0f);
    fill(f->w, (size_t)MN * C, 22, 1.0f);
    fill(f->router_w, C, 23, 0.3f);
}

static void mod_fixture_free(struct mod_fixture *f)
{
    block_free(&f->blk);
    block_acts_free(&f->acts);
    block_scratch_free(&f->scratch);
    mod_acts_free(&f->m);
    free(f->in); free(f->out); free(f->w); free(f->din); free(f->work);
    free(f->router_w); free(f->drouter);
}

static double mod_loss(struct mod_fixture *f, const int *chosen)
{
    mod_block_forward(&f->blk, &f->acts, &f->m, f->out, f->in, f->router_w, chosen, MB, MT);
    return loss_of(f->out, f->w, (size_t)MN * C);
}

static void mod_check_pass_through(struct mod_fixture *f, const int *chosen, const char *name)
{
    mod_loss(f, chosen);
    int same = 1, moved = 1;
    for (int n = 0; n < MN; n++) {
        int eq = memcmp(f->out + (long)n * C, f->in + (long)n * C, C * sizeof(float)) == 0;
        if (!chosen[n] && !eq) same = 0;
        if (chosen[n] && eq) moved = 0;
    }
    /* a chosen token against the block run on its sequence's chosen tokens alone */
    double worst = 0.0;
    for (int b = 0; b < MB; b++) {
        int pos[MT], k = 0;
        for (int t = 0; t < MT; t++)
            if (chosen[b * MT + t]) pos[k++] = t;
        if (k == 0) continue;
        float *x = floats((size_t)k * C), *y = floats((size_t)k * C);
        for (int i = 0; i < k; i++)
            memcpy(x + (long)i * C, f->in + ((long)b * MT + pos[i]) * C, C * sizeof(float));
        struct block_acts acts;
        block_acts_alloc(&acts, 1, MT, C, NH);
        block_forward(&f->blk, &acts, y, x, 1, k);
        for (int i = 0; i < k; i++) {
            long row = (long)b * MT + pos[i];
            float r = 0.0f;
            for (int c = 0; c < C; c++) r += f->router_w[c] * x[(long)i * C + c];
            for (int c = 0; c < C; c++) {
                float want = x[(long)i * C + c] + r * (y[(long)i * C + c] - x[(long)i * C + c]);
                double d = fabs(want - f->out[row * C + c]);
                if (d > worst) worst = d;
            }
        }
        block_acts_free(&acts);
        free(x); free(y);
    }
    printf("MoD %s: %ld tokens processed (kmax %d); skipped tokens %s; chosen vs the block "
           "on them alone max |diff| %.3g\n", name, f->m.tokens, f->m.kmax,
           same ? "bit for bit unchanged" : "CHANGED", worst);
    CHECK(same);
    CHECK(moved);
    CHECK(worst <= 1e-5);
}

static void mod_finite_differences(struct mod_fixture *f, const int *chosen, const char *name)
{
    size_t nin = (size_t)MN * C;
    mod_loss(f, chosen);
    memset(f->blk.grads, 0, f->blk.nparams * sizeof(float));
    memset(f->drouter, 0, C * sizeof(float));
    mod_block_backward(&f->blk, &f->acts, &f->scratch, &f->m, f->din, f->drouter, f->w,
                       f->router_w, MB, MT, f->work);
    const double eps = 1e-2;
    double worst = 0.0;
    int checked = 0;
    struct { float *x; const float *g; size_t n, stride; } sets[3] = {
        {f->in, f->din, nin, 7},
        {f->router_w, f->drouter, C, 1},
        {f->blk.params, f->blk.grads, f->blk.nparams, 61},
    };
    for (int s = 0; s < 3; s++)
        for (size_t i = 0; i < sets[s].n; i += sets[s].stride) {
            float keep = sets[s].x[i];
            sets[s].x[i] = keep + (float)eps;
            double up = mod_loss(f, chosen);
            sets[s].x[i] = keep - (float)eps;
            double down = mod_loss(f, chosen);
            sets[s].x[i] = keep;
            double numeric = (up - down) / (2 * eps);
            double err = fabs(numeric - sets[s].g[i]) / (1.0 + fabs(numeric));
            if (err > worst) worst = err;
            checked++;
        }
    printf("MoD finite differences, %s (fixed routing): %d entries (input, router, block), "
           "worst relative error %.3g\n", name, checked, worst);
    CHECK(worst <= 5e-3);
}

static void test_mod_block(void)
{
    struct mod_fixture f;
    mod_fixture_init(&f, 0);
    int chosen[MN];
    float router[MN];
    mod_router_forward(router, f.in, f.router_w, MN, C);
    int k = mod_capacity_tokens(0.5, MT);
    mod_select_topk(chosen, router, MB, MT, k);
    for (int b = 0; b < MB; b++) {
        int n = 0;
        for (int t = 0; t < MT; t++) n += chosen[b * MT + t];
        CHECK_MSG(n == k, "sequence %d chose %d tokens, capacity %d", b, n, k);
    }
    CHECK(mod_capacity_tokens(1.0, MT) == MT && mod_capacity_tokens(0.01, MT) == 1);
    /* ties go to the lower position */
    float flat[MT] = {0};
    int tie[MT];
    mod_select_topk(tie, flat, 1, MT, 3);
    CHECK(tie[0] && tie[1] && tie[2] && !tie[3]);
    mod_check_pass_through(&f, chosen, "top-k, capacity 0.5");
    mod_finite_differences(&f, chosen, "top-k");
    /* uneven: sequence 0 takes 7 scattered tokens, sequence 1 none */
    int uneven[MN] = {0};
    const int pick[7] = {0, 2, 3, 5, 8, 10, 11};
    for (int i = 0; i < 7; i++) uneven[pick[i]] = 1;
    mod_check_pass_through(&f, uneven, "uneven choice");
    mod_finite_differences(&f, uneven, "uneven choice");
    uneven[MT + 4] = 1;   /* and sequence 1 one token: 8 packed rows, 7 + 1 */
    mod_finite_differences(&f, uneven, "uneven choice, both sequences");
    mod_fixture_free(&f);
}

/* The tiles blk's hash attention visited since the last call: the
 * scheme's signal /hash/tiles read from a model of that one block. */
static double hash_tiles(struct block *blk)
{
    struct gpt view = {.blocks = blk, .num_blocks = 1, .first_block = blk->index};
    double value = 0.0, weight = 0.0;
    dyn_signal_of_dataset("/hash/tiles")->read(&view, 0, &value, &weight);
    return value;
}

/* A MoD block with hash attention (4 buckets): its chosen tokens, packed,
 * get what the hash block gives each sequence's chosen tokens alone (the
 * same rotation: step 0 for both), and every other token passes through. */
static void test_mod_hash_block(void)
{
    struct mod_fixture f;
    mod_fixture_init(&f, 4);
    int uneven[MN] = {0};
    const int pick[9] = {0, 1, 3, 4, 6, 7, 9, 10, 11};
    for (int i = 0; i < 9; i++) uneven[pick[i]] = 1;
    uneven[MT + 2] = uneven[MT + 5] = uneven[MT + 8] = 1;
    hash_tiles(&f.blk);   /* from zero */
    mod_check_pass_through(&f, uneven, "with 4-bucket hash attention, 9 + 3 tokens");
    CHECK(f.m.tokens == 12 && hash_tiles(&f.blk) > 0);
    mod_finite_differences(&f, uneven, "with 4-bucket hash attention");
    mod_fixture_free(&f);
}

/* The predictor's logit of token n computed directly from the MLP's
 * definition, in double; pre (H) its hidden pre-activations. */
static double direct_logit(double *pre, const float *x, const float *w, int H)
{
    const float *w1 = w, *b1 = w + H * C, *w2 = b1 + H, *b2 = w2 + H;
    double logit = *b2;
    for (int j = 0; j < H; j++) {
        double a = b1[j];
        for (int c = 0; c < C; c++) a += (double)w1[j * C + c] * x[c];
        pre[j] = a;
        logit += w2[j] * (a > 0.0 ? a : 0.0);
    }
    return logit;
}

static void test_mod_predictor(void)
{
    enum { H = 6 };
    long P = H * C + 2 * H + 1;
    float *in = floats((size_t)MN * C), *w = floats(P), *dw = floats(P), *dw2 = floats(P);
    fill(in, (size_t)MN * C, 30, 1.0f);
    fill(w, P, 31, 0.5f);
    int target[MN], chosen[MN];
    for (int n = 0; n < MN; n++) target[n] = (n * 7) % 3 == 0;
    float loss = mod_predictor_forward_backward(dw, 1.0f, chosen, in, w, target, MN, C, H);
    /* the logit, choice and loss against the definition */
    int agree = 1;
    double direct_loss = 0.0, worst_logit = 0.0;
    long active = 0;
    for (int n = 0; n < MN; n++) {
        double pre[H], logit = direct_logit(pre, in + (long)n * C, w, H);
        for (int j = 0; j < H; j++) active += pre[j] > 0.0;
        if (chosen[n] != (logit > 0.0)) agree = 0;
        double p = 1.0 / (1.0 + exp(-logit));
        direct_loss -= target[n] ? log(p) : log(1.0 - p);
        worst_logit = fmax(worst_logit, fabs(logit));
    }
    direct_loss /= MN;
    /* finite differences of the BCE for every weight */
    double worst = 0.0;
    int checked = 0, kinks = 0;
    const double eps = 1e-3;
    for (long e = 0; e < P; e++) {
        float keep = w[e];
        int crossed = 0;
        double f[2];
        for (int side = 0; side < 2; side++) {
            w[e] = keep + (float)(side ? -eps : eps);
            f[side] = mod_predictor_forward_backward(NULL, 0.0f, NULL, in, w, target, MN, C, H);
            for (int n = 0; n < MN && e < H * C + H; n++) {   /* W1 and b1 move a unit */
                double pre[H], base[H];
                direct_logit(pre, in + (long)n * C, w, H);
                w[e] = keep;
                direct_logit(base, in + (long)n * C, w, H);
                w[e] = keep + (float)(side ? -eps : eps);
                for (int j = 0; j < H; j++) crossed |= (pre[j] > 0.0) != (base[j] > 0.0);
            }
        }
        w[e] = keep;
        if (crossed) {
            kinks++;
            continue;
        }
        double numeric = (f[0] - f[1]) / (2 * eps);
        double err = fabs(numeric - dw[e]) / (1.0 + fabs(numeric));
        if (err > worst) worst = err;
        checked++;
    }
    /* scale and accumulate: dw2 starts at 1 and gets 1 + 0.5 x the gradient */
    for (long e = 0; e < P; e++) dw2[e] = 1.0f;
    mod_predictor_forward_backward(dw2, 0.5f, NULL, in, w, target, MN, C, H);
    double worst_scaled = 0.0;
    for (long e = 0; e < P; e++)
        worst_scaled = fmax(worst_scaled, fabs(dw2[e] - (1.0 + 0.5 * dw[e])));
    printf("MoD predictor, an MLP of hidden width %d (%ld weights; %.0f%% of the hidden units "
           "active, |logit| up to %.2f): loss %.7f vs %.7f directly; binary cross-entropy "
           "finite differences over %d weights worst relative error %.3g (%d left out: a "
           "ReLU kink crossed); scaled accumulation max |diff| %.3g\n", H, P,
           100.0 * active / (MN * H), worst_logit, loss, direct_loss, checked, worst, kinks,
           worst_scaled);
    CHECK(agree);
    CHECK(fabs(loss - direct_loss) <= 1e-5);
    CHECK(worst <= 5e-3 && checked >= P - 10);
    CHECK(worst_scaled <= 1e-6);
    free(in); free(w); free(dw); free(dw2);
}

/* ---- the PyTorch fixture ---- */

#define MOD_HASH_FIXTURE "tests/reference/fixture_mod_hash.bin"

struct fixture_array {
    char name[64];
    unsigned kind;
    unsigned long long n;
    void *data;
};

static struct fixture_array fixture_arrays[32];
static int fixture_count;

static int fixture_load(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char magic[8];
    unsigned count;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "DMMODH01", 8) != 0 ||
        fread(&count, 4, 1, f) != 1 || count > 32) {
        fclose(f);
        return -1;
    }
    for (unsigned i = 0; i < count; i++) {
        struct fixture_array *a = &fixture_arrays[i];
        unsigned len;
        if (fread(&len, 4, 1, f) != 1 || len >= sizeof a->name ||
            fread(a->name, 1, len, f) != len || fread(&a->kind, 4, 1, f) != 1 ||
            fread(&a->n, 8, 1, f) != 1) {
            fclose(f);
            return -1;
        }
        a->name[len] = 0;
        a->data = malloc(a->n * 4);
        if (fread(a->data, 4, a->n, f) != a->n) {
            fclose(f);
            return -1;
        }
    }
    fixture_count = (int)count;
    fclose(f);
    return 0;
}

static void *fixture_get(const char *name, unsigned long long n)
{
    for (int i = 0; i < fixture_count; i++)
        if (strcmp(fixture_arrays[i].name, name) == 0) {
            CHECK_MSG(fixture_arrays[i].n == n, "%s has %llu elements, expected %llu", name,
                      fixture_arrays[i].n, n);
            return fixture_arrays[i].data;
        }
    DM_FATAL("fixture array %s missing", name);
}

static void test_against_pytorch(void)
{
    if (fixture_load(MOD_HASH_FIXTURE)) {
        CHECK_MSG(0, "cannot read %s (run from the repository root)", MOD_HASH_FIXTURE);
        return;
    }
    {   /* hash-sparse attention: B 2, T 64, C 16, NH 2, 4 buckets */
        enum { HB = 2, HT = 64, HC = 16, HNH = 2 };
        const float *qkv = fixture_get("hash.qkv", HB * HT * 3 * HC);
        const float *R = fixture_get("hash.rotation", HNH * (HC / HNH) * 2);
        const float *dout = fixture_get("hash.dout", HB * HT * HC);
        float *out = floats(HB * HT * HC), *lse = floats(HB * HNH * HT);
        float *dqkv = floats(HB * HT * 3 * HC);
        int *order = calloc(HB * HNH * 2 * HT, sizeof(int));
        int *bucket = calloc(HB * HNH * 2 * HT, sizeof(int));
        group_attention_forward(out, lse, order, bucket, NULL, qkv, R, HB, HT, HC, HNH, 4);
        group_attention_backward(dqkv, dout, qkv, out, lse, order, bucket, HB, HT, HC, HNH);
        double d_out = max_abs_diff(out, fixture_get("hash.out", HB * HT * HC), HB * HT * HC);
        double d_grad = max_abs_diff(dqkv, fixture_get("hash.dqkv", HB * HT * 3 * HC),
                                     HB * HT * 3 * HC);
        printf("hash attention vs PyTorch: output max |diff| %.3g, gradient %.3g\n", d_out,
               d_grad);
        CHECK(d_out <= 1e-4);
        CHECK(d_grad <= 1e-4);
        free(out); free(lse); free(dqkv); free(order); free(bucket);
    }
    {   /* the MoD block: B 2, T 12 (MB, MT), C 16, NH 2, capacity 0.5 */
        struct mod_fixture f;
        mod_fixture_init(&f, 0);
        size_t nin = (size_t)MN * C;
        memcpy(f.blk.params, fixture_get("mod.params", f.blk.nparams),
               f.blk.nparams * sizeof(float));
        memcpy(f.in, fixture_get("mod.x", nin), nin * sizeof(float));
        memcpy(f.router_w, fixture_get("mod.router_w", C), C * sizeof(float));
        const int *want_chosen = fixture_get("mod.chosen", MN);
        int chosen[MN];
        float router[MN];
        mod_router_forward(router, f.in, f.router_w, MN, C);
        mod_select_topk(chosen, router, MB, MT, mod_capacity_tokens(0.5, MT));
        CHECK(memcmp(chosen, want_chosen, sizeof chosen) == 0);
        mod_block_forward(&f.blk, &f.acts, &f.m, f.out, f.in, f.router_w, chosen, MB, MT);
        memset(f.blk.grads, 0, f.blk.nparams * sizeof(float));
        memset(f.drouter, 0, C * sizeof(float));
        memcpy(f.w, fixture_get("mod.dout", nin), nin * sizeof(float));
        mod_block_backward(&f.blk, &f.acts, &f.scratch, &f.m, f.din, f.drouter, f.w,
                           f.router_w, MB, MT, f.work);
        double d_out = max_abs_diff(f.out, fixture_get("mod.out", nin), nin);
        double d_x = max_abs_diff(f.din, fixture_get("mod.dx", nin), nin);
        double d_r = max_abs_diff(f.drouter, fixture_get("mod.drouter_w", C), C);
        double d_p = max_abs_diff(f.blk.grads, fixture_get("mod.dparams", f.blk.nparams),
                                  f.blk.nparams);
        int H = *(const int *)fixture_get("mod.predictor_hidden", 1);
        long P = (long)H * C + 2L * H + 1;
        float *u = fixture_get("mod.predictor_w", P), *du = floats(P);
        float loss = mod_predictor_forward_backward(du, 1.0f, NULL, f.in, u, chosen, MN, C, H);
        double d_loss = fabs(loss - *(float *)fixture_get("mod.predictor_loss", 1));
        double d_u = max_abs_diff(du, fixture_get("mod.dpredictor_w", P), P);
        free(du);
        printf("MoD block vs PyTorch: output max |diff| %.3g, input gradient %.3g, router "
               "%.3g, block weights %.3g; MLP predictor (hidden %d) loss %.3g, its gradient "
               "%.3g\n", d_out, d_x, d_r, d_p, H, d_loss, d_u);
        CHECK(d_out <= 1e-4 && d_x <= 1e-4 && d_r <= 1e-4 && d_p <= 1e-4);
        CHECK(d_loss <= 1e-5 && d_u <= 1e-4);
        mod_fixture_free(&f);
    }
    for (int i = 0; i < fixture_count; i++) free(fixture_arrays[i].data);
}

int main(void)
{
    dm_threads_init(2);
    test_one_bucket_is_dense();
    test_buckets_and_tiles();
    test_finite_differences();
    test_rotation();
    test_rotation_columns();
    test_no_empty_rows();
    test_thread_count();
    test_mod_block();
    test_mod_hash_block();
    test_mod_predictor();
    test_against_pytorch();
    dm_threads_shutdown();
    return testing_report("test_hash_mod");
}
