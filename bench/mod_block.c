/* bench/mod_block.c: whether a mixture-of-depths block's cost follows the
 * tokens it processes when sequences choose unevenly. Three choices over
 * a (B, T) micro-batch, timed alternately in one process (forward +
 * backward, medians over REPS): even (every sequence the same count),
 * skewed (the same tokens in all, but the first sequence takes most), and
 * padded (every sequence the skewed choice's longest count: what a block
 * that pads each sequence to the longest would compute), in a rotating
 * order. Before timing it
 * checks that the tokens not chosen pass through bit for bit (exit 1 if
 * not). Built by `make build/bench/mod_block`; run by
 * bench/mod_block.sh. Environment: B, T, C, NH, TOKENS (in all), REPS,
 * THREADS; defaults configs/mod.ini's micro-batch (B 2, T 256, C 128,
 * 4 heads), 64 tokens, 21 repeats, 1 thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "dynmo/model.h"

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

struct mod_bench {
    struct block blk;
    struct block_acts acts;
    struct block_scratch scratch;
    struct mod_acts m;
    float *in, *out, *dout, *din, *work, *router_w, *drouter;
    int B, T, C;
};

static void mod_bench_init(struct mod_bench *f, int B, int T, int C, int NH)
{
    struct gpt_shape shape = {.vocab = 256, .max_seq = T, .layers = 12, .heads = NH,
                              .channels = C};
    size_t n = (size_t)B * T * C;
    f->B = B; f->T = T; f->C = C;
    block_init(&f->blk, 1, &shape, 1337);
    block_acts_alloc(&f->acts, B, T, C, NH);
    block_scratch_alloc(&f->scratch, B, T, C, NH);
    mod_acts_alloc(&f->m, B, T, C);
    f->in = malloc(n * sizeof(float));
    f->out = malloc(n * sizeof(float));
    f->dout = malloc(n * sizeof(float));
    f->din = malloc(n * sizeof(float));
    f->work = malloc(n * sizeof(float));
    f->router_w = malloc((size_t)C * sizeof(float));
    f->drouter = calloc((size_t)C, sizeof(float));
    for (size_t i = 0; i < n; i++) {
        f->in[i] = dm_normal(1, 1, i);
        f->dout[i] = 1e-3f * dm_normal(1, 2, i);
    }
    for (int c = 0; c < C; c++) f->router_w[c] = 0.02f * dm_normal(1, 3, (uint64_t)c);
}

static void mod_bench_free(struct mod_bench *f)
{
    block_free(&f->blk);
    block_acts_free(&f->acts);
    block_scratch_free(&f->scratch);
    mod_acts_free(&f->m);
    free(f->in); free(f->out); free(f->dout); free(f->din); free(f->work);
    free(f->router_w); free(f->drouter);
}

static double mod_step(struct mod_bench *f, const int *chosen)
{
    double t0 = dm_now();
    mod_block_forward(&f->blk, &f->acts, &f->m, f->out, f->in, f->router_w, chosen, f->B, f->T);
    mod_block_backward(&f->blk, &f->acts, &f->scratch, &f->m, f->din, f->drouter, f->dout,
                       f->router_w, f->B, f->T, f->work);
    return dm_now() - t0;
}

/* chosen: count[b] tokens of sequence b, spread evenly over its positions */
static void choose(int *chosen, const int *count, int B, int T)
{
    memset(chosen, 0, (size_t)B * T * sizeof(int));
    for (int b = 0; b < B; b++)
        for (int i = 0; i < count[b]; i++) chosen[(long)b * T + (long)i * T / count[b]] = 1;
}

static int pass_through_ok(struct mod_bench *f, const int *chosen)
{
    mod_step(f, chosen);
    for (long n = 0; n < (long)f->B * f->T; n++)
        if (!chosen[n] && memcmp(f->out + n * f->C, f->in + n * f->C,
                                 (size_t)f->C * sizeof(float)) != 0)
            return 0;
    return 1;
}

int main(void)
{
    int B = env_int("B", 2), T = env_int("T", 256), C = env_int("C", 128);
    int NH = env_int("NH", 4), tokens = env_int("TOKENS", 64), reps = env_int("REPS", 21);
    dm_threads_init(env_int("THREADS", 1));
    if (B < 2 || tokens < 2 * B || tokens > B * T) {
        fprintf(stderr, "bench_mod_block: need B >= 2 and 2 B <= TOKENS <= B T\n");
        return 2;
    }
    int *even = malloc((size_t)B * sizeof(int)), *skew = malloc((size_t)B * sizeof(int));
    int *pad = malloc((size_t)B * sizeof(int));
    for (int b = 0; b < B; b++) { even[b] = tokens / B + (b < tokens % B); skew[b] = 2; }
    skew[0] = tokens - 2 * (B - 1) < T ? tokens - 2 * (B - 1) : T;
    for (int b = 0; b < B; b++) pad[b] = skew[0];
    int *chosen[3];
    const int *counts[3] = {even, skew, pad};
    for (int k = 0; k < 3; k++) {
        chosen[k] = malloc((size_t)B * T * sizeof(int));
        choose(chosen[k], counts[k], B, T);
    }
    struct mod_bench f;
    mod_bench_init(&f, B, T, C, NH);
    int ok = pass_through_ok(&f, chosen[1]);
    long processed[3];
    double *t = malloc(3 * (size_t)reps * sizeof(double));
    for (int r = 0; r < reps; r++)
        for (int j = 0; j < 3; j++) {   /* the order rotates: none always runs first */
            int k = (r + j) % 3;
            t[k * reps + r] = mod_step(&f, chosen[k]);
            processed[k] = f.m.tokens;
        }
    double even_ms = 1e3 * dm_median(t, reps), skew_ms = 1e3 * dm_median(t + reps, reps);
    double pad_ms = 1e3 * dm_median(t + 2 * reps, reps);
    printf("MoD block B %d, T %d, C %d, %d heads, %d repeats (medians, forward + backward); "
           "skipped tokens unchanged: %s\n"
           "  even   %4ld tokens (longest %d): %.2f ms\n"
           "  skewed %4ld tokens (longest %d): %.2f ms, %.3f of even\n"
           "  padded %4ld tokens (every sequence %d): %.2f ms, %.3f of even\n",
           B, T, C, NH, reps, ok ? "yes" : "NO", processed[0], even[0], even_ms, processed[1],
           skew[0], skew_ms, skew_ms / even_ms, processed[2], pad[0], pad_ms, pad_ms / even_ms);
    mod_bench_free(&f);
    for (int k = 0; k < 3; k++) free(chosen[k]);
    free(even); free(skew); free(pad); free(t);
    dm_threads_shutdown();
    return ok ? 0 : 1;
}
