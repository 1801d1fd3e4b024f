/* bench/hash_block.c: the cost of a hash-attention block against a dense
 * block at the same length, forward + backward, timed alternately in one
 * process (dense, hash, dense, hash, ...) so that the machine's load
 * falls on both alike; prints the medians and their ratio, for the whole
 * block and for the attention op alone. Before timing it checks that a
 * hash block with one bucket gives the dense block's output and input
 * gradient (within 1e-5): a wrong answer fails the run (exit 1).
 * Built by `make build/bench/hash_block`; run by bench/hash_block.sh.
 * Usage: hash_block [T ...] with BUCKETS, C, NH, B, REPS, THREADS
 * from the environment (defaults: configs/hash.ini's micro-batch: 8
 * buckets, C 64, 4 heads, B 2; 15 repeats; 1 thread, as one of 2 ranks
 * on 2 cores runs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "dynmo/model.h"

struct bench_block {
    struct block blk;
    struct block_acts acts;
    struct block_scratch scratch;
};

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static void bench_block_init(struct bench_block *b, int buckets, int B, int T, int C, int NH)
{
    struct gpt_shape shape = {.vocab = 256, .max_seq = T, .layers = 8, .heads = NH,
                              .channels = C, .hash = {.buckets = buckets, .seed_lo = 1337}};
    block_init(&b->blk, 1, &shape, 1337);
    block_acts_alloc(&b->acts, B, T, C, NH);
    block_scratch_alloc(&b->scratch, B, T, C, NH);
    b->acts.hash_step = 3;
}

static void bench_block_free(struct bench_block *b)
{
    block_free(&b->blk);
    block_acts_free(&b->acts);
    block_scratch_free(&b->scratch);
}

/* forward and backward of the block; returns the seconds taken */
static double block_step(struct bench_block *b, float *out, float *din, const float *in,
                         const float *dout, int B, int T)
{
    double t0 = dm_now();
    block_forward(&b->blk, &b->acts, out, in, B, T);
    block_backward(&b->blk, &b->acts, &b->scratch, din, dout, in, B, T);
    return dm_now() - t0;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= worst)) worst = d;   /* NaN counts as worst */
    }
    return worst;
}

/* The attention op alone, dense or hash, forward + backward. */
static double attention_step(struct bench_block *b, int hash, int B, int T)
{
    int C = b->blk.C, NH = b->blk.NH;
    double t0 = dm_now();
    if (hash) {
        hash_block_attention_forward(&b->blk, &b->acts, B, T);
        hash_block_attention_backward(&b->blk, &b->acts, b->scratch.d_qkv, b->acts.atty, B, T);
    } else {
        attention_forward(b->acts.atty, b->acts.att, b->acts.qkv, B, T, C, NH);
        attention_backward(b->scratch.d_qkv, b->scratch.d_att, b->acts.atty, b->acts.qkv,
                           b->acts.att, B, T, C, NH);
    }
    return dm_now() - t0;
}

/* One bucket against dense: the same output and input gradient. */
static int check_one_bucket(struct bench_block *dense, const float *in, const float *dout,
                            int B, int T, int C, int NH)
{
    size_t n = (size_t)B * T * C;
    float *o1 = calloc(n, sizeof(float)), *o2 = calloc(n, sizeof(float));
    float *d1 = calloc(n, sizeof(float)), *d2 = calloc(n, sizeof(float));
    struct bench_block one;
    bench_block_init(&one, 1, B, T, C, NH);
    block_step(dense, o1, d1, in, dout, B, T);
    block_step(&one, o2, d2, in, dout, B, T);
    double out_diff = max_abs_diff(o1, o2, n), grad_diff = max_abs_diff(d1, d2, n);
    int ok = out_diff <= 1e-5 && grad_diff <= 1e-5;
    printf("T %d: one bucket vs dense block: output max |diff| %.3g, input gradient %.3g: %s\n",
           T, out_diff, grad_diff, ok ? "ok" : "FAILED");
    bench_block_free(&one);
    free(o1); free(o2); free(d1); free(d2);
    return ok;
}

static int bench_length(int T, int buckets, int B, int C, int NH, int reps)
{
    size_t n = (size_t)B * T * C;
    float *in = malloc(n * sizeof(float)), *dout = malloc(n * sizeof(float));
    float *out = malloc(n * sizeof(float)), *din = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        in[i] = dm_normal(1, 1, i);
        dout[i] = 1e-3f * dm_normal(1, 2, i);
    }
    struct bench_block dense, hash;
    bench_block_init(&dense, 0, B, T, C, NH);
    bench_block_init(&hash, buckets, B, T, C, NH);
    int ok = check_one_bucket(&dense, in, dout, B, T, C, NH);
    double *t = malloc(4 * (size_t)reps * sizeof(double));
    block_step(&dense, out, din, in, dout, B, T);   /* warm up both */
    block_step(&hash, out, din, in, dout, B, T);
    hash.blk.hash_tiles = 0;
    for (int r = 0; r < reps; r++) {
        t[r] = block_step(&dense, out, din, in, dout, B, T);
        t[reps + r] = block_step(&hash, out, din, in, dout, B, T);
        t[2 * reps + r] = attention_step(&dense, 0, B, T);
        t[3 * reps + r] = attention_step(&hash, 1, B, T);
    }
    long nt = (T + GROUP_TILE - 1) / GROUP_TILE;
    double causal = (double)B * NH * nt * (nt + 1) / 2;   /* one direction */
    double tiles = hash.blk.hash_tiles / (4.0 * reps) / causal;
    double bd = dm_median(t, reps), bh = dm_median(t + reps, reps);
    double ad = dm_median(t + 2 * reps, reps), ah = dm_median(t + 3 * reps, reps);
    printf("T %d, %d buckets, B %d, C %d, %d heads, %d repeats (medians, forward + backward):\n"
           "  block: dense %.2f ms, hash %.2f ms, hash/dense %.3f\n"
           "  attention op: dense %.2f ms, hash %.2f ms, hash/dense %.3f; "
           "tiles visited %.3f of the causal ones\n",
           T, buckets, B, C, NH, reps, 1e3 * bd, 1e3 * bh, bh / bd, 1e3 * ad, 1e3 * ah,
           ah / ad, tiles);
    bench_block_free(&dense);
    bench_block_free(&hash);
    free(in); free(dout); free(out); free(din); free(t);
    return ok;
}

int main(int argc, char **argv)
{
    int buckets = env_int("BUCKETS", 8), C = env_int("C", 64), NH = env_int("NH", 4);
    int B = env_int("B", 2), reps = env_int("REPS", 15), threads = env_int("THREADS", 1);
    dm_threads_init(threads);
    int ok = 1;
    static char *lengths[] = {"1024", "2048"};
    char **list = argc > 1 ? argv + 1 : lengths;
    int count = argc > 1 ? argc - 1 : 2;
    printf("hash_block: %d thread(s)\n", threads);
    for (int i = 0; i < count; i++) ok &= bench_length(atoi(list[i]), buckets, B, C, NH, reps);
    dm_threads_shutdown();
    return ok ? 0 : 1;
}
