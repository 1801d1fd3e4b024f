/* `dynmo plan --bench`: times the exact partition on random 1,000 x 64 and
 * 10,000 x 1,024 instances (median of repeats), counts diffusion rounds
 * against the stage count, and sets every method's quality side by side on
 * random and profiled-like inputs. Every timed answer is also checked: the
 * returned bottleneck must be feasible and the next smaller double not, and
 * a wrong answer fails the run (exit 1). The figures go to
 * docs/PERFORMANCE.md under "Balancers".
 *
 * Must not: time an answer it does not check, or use inputs that change
 * from run to run (the instances come from a seed, --seed N). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "tools/plan/plan.h"

struct synthetic {
    const char *name;
    int blocks;
    double *fwd_ms, *bwd_ms, *params; /* (blocks) */
    int64_t *mem_bytes;               /* (blocks) */
    struct balance_profile profile;
};

static uint64_t bench_seed = 1;

static double uniform01(uint64_t stream, uint64_t index)
{
    return (dm_hash64(bench_seed, stream, index) >> 11) * 0x1.0p-53;
}

/* fp32 parameters, gradients and two AdamW moments: 16 bytes a parameter. */
#define BYTES_PER_PARAM 16

static void synthetic_alloc(struct synthetic *s, const char *name, int n)
{
    s->name = name;
    s->blocks = n;
    s->fwd_ms = dm_alloc((size_t)n * sizeof(double));
    s->bwd_ms = dm_alloc((size_t)n * sizeof(double));
    s->params = dm_alloc((size_t)n * sizeof(double));
    s->mem_bytes = dm_alloc((size_t)n * sizeof(int64_t));
    s->profile = (struct balance_profile){
        .blocks = n, .fwd_ms = s->fwd_ms, .bwd_ms = s->bwd_ms,
        .params = s->params, .mem_bytes = s->mem_bytes};
}

static void synthetic_free(struct synthetic *s)
{
    dm_free(s->fwd_ms);
    dm_free(s->bwd_ms);
    dm_free(s->params);
    dm_free(s->mem_bytes);
}

static struct balance_extra extra(double fwd, double bwd, double params)
{
    return (struct balance_extra){fwd, bwd, params, (int64_t)params * BYTES_PER_PARAM, 0.0};
}

/* Independent random blocks: fwd in [1, 3) ms, bwd about twice fwd,
 * 0.5-1.5 M parameters; a light embedding and a heavy head. */
static void make_random(struct synthetic *s, int n, uint64_t stream)
{
    synthetic_alloc(s, "random", n);
    for (int i = 0; i < n; i++) {
        s->fwd_ms[i] = 1 + 2 * uniform01(stream, 4 * (uint64_t)i);
        s->bwd_ms[i] = s->fwd_ms[i] * (1.8 + 0.4 * uniform01(stream, 4 * (uint64_t)i + 1));
        s->params[i] = floor(1e6 * (0.5 + uniform01(stream, 4 * (uint64_t)i + 2)));
        s->mem_bytes[i] = (int64_t)s->params[i] * BYTES_PER_PARAM;
    }
    s->profile.embed = extra(0.5, 0.5, 4e6);
    s->profile.head = extra(4, 8, 4e6);
}

/* The head alone is the bottleneck: every other boundary has slack, the
 * widest case for the least-movement pass. */
static void make_skewed(struct synthetic *s, int n, int stages)
{
    make_random(s, n, 7);
    s->name = "skewed";
    double per_stage = 6.0 * n / stages;
    s->profile.head = extra(per_stage * 10, per_stage * 20, 4e6);
}

/* A GPT-like profile of 48 equal blocks in two dynamic states. freezing:
 * the first 32 blocks frozen (backward computes no weight gradients, about
 * half the time). pruning: global magnitude pruning left sparsity rising
 * with depth, 0-90%, and sparse blocks run proportionally faster. */
static void make_profiled(struct synthetic *s, const char *kind)
{
    int n = 48;
    synthetic_alloc(s, kind, n);
    for (int i = 0; i < n; i++) {
        double jitter = 0.97 + 0.06 * uniform01(11, (uint64_t)i);
        double fwd = 2.0 * jitter, bwd = 4.0 * jitter, params = 7087872;
        if (!strcmp(kind, "freezing") && i < 32) bwd = 2.0 * jitter;
        if (!strcmp(kind, "pruning")) {
            double sparsity = 0.9 * i / (n - 1);
            fwd *= 1 - 0.8 * sparsity;
            bwd *= 1 - 0.8 * sparsity;
            params = floor(params * (1 - sparsity));
        }
        s->fwd_ms[i] = fwd;
        s->bwd_ms[i] = bwd;
        s->params[i] = params;
        s->mem_bytes[i] = (int64_t)params * BYTES_PER_PARAM;
    }
    s->profile.embed = extra(0.3, 0.6, 38597376);
    s->profile.head = extra(6.0, 12.0, 38597376);
}

/* Times balance_partition on time costs; returns the median ms, or -1 when
 * the answer fails its certificate. */
static double time_partition(const struct synthetic *s, int stages, int64_t cap,
                             const int *current, int repeats, double *bottleneck)
{
    int n = s->blocks;
    double *cost = dm_alloc((size_t)n * sizeof(double));
    struct balance_costs costs;
    balance_costs_from_profile(&costs, &s->profile, BALANCE_COST_TIME, cost);
    int *counts = dm_alloc((size_t)stages * sizeof(int));
    double *ms = dm_alloc((size_t)repeats * sizeof(double));
    struct balance_result res;
    char err[256];
    int ok = 1;
    for (int r = 0; r < repeats; r++) {
        double t0 = dm_now();
        int rc = balance_partition(&costs, stages, cap, current, stages, counts,
                                   &res, err, sizeof err);
        ms[r] = (dm_now() - t0) * 1e3;
        if (rc) {
            printf("FAIL: partition %s %dx%d: %s\n", s->name, n, stages, err);
            ok = 0;
            break;
        }
    }
    if (ok) {
        double max_cost;
        int64_t max_mem;
        balance_layout_max(&costs, stages, counts, &max_cost, &max_mem);
        ok = max_cost == res.max_stage_cost && (cap == 0 || max_mem <= cap) &&
             balance_fits(&costs, stages, cap, max_cost) &&
             !balance_fits(&costs, stages, cap, nextafter(max_cost, 0.0));
        if (!ok) printf("FAIL: partition %s %dx%d is not certified optimal\n",
                        s->name, n, stages);
        *bottleneck = max_cost;
    }
    double result = ok ? dm_median(ms, repeats) : -1;
    dm_free(ms);
    dm_free(counts);
    dm_free(cost);
    return result;
}

static int64_t total_mem(const struct synthetic *s)
{
    int64_t total = s->profile.embed.mem_bytes + s->profile.head.mem_bytes;
    for (int i = 0; i < s->blocks; i++) total += s->mem_bytes[i];
    return total;
}

static int bench_partition(int repeats)
{
    static const int shapes[][2] = {{1000, 64}, {10000, 1024}};
    int failures = 0;
    printf("## exact partition (partition-time), median of %d runs\n\n", repeats);
    printf("| input | blocks x stages | mem cap | from | ms | bottleneck ms |\n");
    printf("|---|---|---|---|---|---|\n");
    for (int k = 0; k < 2; k++) {
        int n = shapes[k][0], S = shapes[k][1];
        struct synthetic inputs[2];
        make_random(&inputs[0], n, 3);
        make_skewed(&inputs[1], n, S);
        int *uniform = dm_alloc((size_t)S * sizeof(int));
        balance_static_uniform(n, S, uniform, NULL, 0);
        for (int which = 0; which < 2; which++) {
            struct synthetic *s = &inputs[which];
            int64_t caps[2] = {0, (int64_t)(1.3 * (double)total_mem(s) / S)};
            for (int c = 0; c < 2; c++) {
                double bottleneck = 0;
                double ms = time_partition(s, S, caps[c], uniform, repeats, &bottleneck);
                failures += ms < 0;
                char cap_text[32] = "none";
                if (caps[c]) snprintf(cap_text, sizeof cap_text, "1.3x mean");
                printf("| %s | %d x %d | %s | uniform | %.3f | %.3f |\n", s->name, n,
                       S, cap_text, ms, bottleneck);
            }
        }
        /* The steady state: the current layout is already optimal. */
        double *cost = dm_alloc((size_t)n * sizeof(double));
        struct balance_costs costs;
        balance_costs_from_profile(&costs, &inputs[0].profile, BALANCE_COST_TIME, cost);
        int *optimal = dm_alloc((size_t)S * sizeof(int));
        balance_partition(&costs, S, 0, uniform, S, optimal, NULL, NULL, 0);
        double bottleneck = 0;
        double ms = time_partition(&inputs[0], S, 0, optimal, repeats, &bottleneck);
        failures += ms < 0;
        printf("| random | %d x %d | none | optimal | %.3f | %.3f |\n", n, S, ms,
               bottleneck);
        dm_free(optimal);
        dm_free(cost);
        dm_free(uniform);
        synthetic_free(&inputs[0]);
        synthetic_free(&inputs[1]);
    }
    printf("\n");
    return failures;
}

static void bench_diffusion(void)
{
    printf("## diffusion (diffusion-time) from static-uniform, 16 random blocks "
           "per stage\n\n");
    printf("| stages | rounds | ms | max stage / exact optimum |\n");
    printf("|---|---|---|---|\n");
    for (int S = 2; S <= 512; S *= 2) {
        struct synthetic s;
        make_random(&s, 16 * S, 5);
        double *cost = dm_alloc((size_t)s.blocks * sizeof(double));
        struct balance_costs costs;
        balance_costs_from_profile(&costs, &s.profile, BALANCE_COST_TIME, cost);
        int *counts = dm_alloc((size_t)S * sizeof(int));
        struct balance_result diffusion, exact;
        double t0 = dm_now();
        balance_diffusion(&costs, S, 0, NULL, 0, 0, counts, &diffusion, NULL, 0);
        double ms = (dm_now() - t0) * 1e3;
        balance_partition(&costs, S, 0, NULL, 0, counts, &exact, NULL, 0);
        printf("| %d | %d%s | %.3f | %.4f |\n", S, diffusion.rounds,
               diffusion.converged ? "" : " (limit)", ms,
               diffusion.max_stage_cost / exact.max_stage_cost);
        dm_free(counts);
        dm_free(cost);
        synthetic_free(&s);
    }
    printf("\n");
}

static void bench_repack(void)
{
    printf("## repack (1F1B, epsilon 0.05) of 1000 random blocks from 64 "
           "uniform stages\n\n");
    printf("| micro-batches | stages after | ms |\n|---|---|---|\n");
    struct synthetic s;
    make_random(&s, 1000, 9);
    int S = 64;
    int *uniform = dm_alloc((size_t)S * sizeof(int));
    int *counts = dm_alloc((size_t)S * sizeof(int));
    balance_static_uniform(s.blocks, S, uniform, NULL, 0);
    for (int m = 64; m <= 1024; m *= 4) {
        struct balance_result res;
        double t0 = dm_now();
        balance_repack(&s.profile, uniform, S, 0, m, DM_SCHEDULE_1F1B, 0.05, counts,
                       &res, NULL, 0);
        printf("| %d | %d | %.1f |\n", m, res.stages, (dm_now() - t0) * 1e3);
    }
    printf("\n");
    dm_free(counts);
    dm_free(uniform);
    synthetic_free(&s);
}

static void quality_row(const struct synthetic *s, int stages, const char *method,
                        int used_stages, const int *counts, int micro_batches)
{
    double *cost = dm_alloc((size_t)s->blocks * sizeof(double));
    struct balance_costs costs;
    balance_costs_from_profile(&costs, &s->profile, BALANCE_COST_TIME, cost);
    double max_ms;
    balance_layout_max(&costs, used_stages, counts, &max_ms, NULL);
    struct balance_prediction p;
    balance_predict(&s->profile, used_stages, counts, micro_batches,
                    DM_SCHEDULE_1F1B, &p, NULL, 0);
    printf("| %s %dx%d | %s | %d | %.3f | %.1f | %.3f |\n", s->name, s->blocks,
           stages, method, used_stages, max_ms, p.step_ms, p.bubble_ratio);
    dm_free(cost);
}

static void bench_quality(void)
{
    printf("## quality: every method on the same inputs (1F1B, m = 4 x stages, "
           "repack epsilon 0.05, from static-uniform)\n\n");
    printf("| input | method | stages | max stage ms | step ms | bubble |\n");
    printf("|---|---|---|---|---|---|\n");
    struct synthetic inputs[4];
    int stages[4] = {64, 8, 8, 16};
    make_random(&inputs[0], 1000, 9);
    make_profiled(&inputs[1], "freezing");
    make_profiled(&inputs[2], "pruning");
    make_profiled(&inputs[3], "pruning");
    for (int k = 0; k < 4; k++) {
        struct synthetic *s = &inputs[k];
        int S = stages[k], m = 4 * S;
        int *counts = dm_alloc((size_t)S * sizeof(int));
        int *uniform = dm_alloc((size_t)S * sizeof(int));
        balance_static_uniform(s->blocks, S, uniform, NULL, 0);
        for (int method = 0; method < BALANCE_METHOD_COUNT; method++) {
            struct balance_result res;
            if (balance_propose(method, &s->profile, S, NULL, NULL, counts, &res,
                                NULL, 0) == BALANCE_OK)
                quality_row(s, S, balance_method_name(method), S, counts, m);
        }
        struct balance_result res;
        if (balance_repack(&s->profile, uniform, S, 0, m, DM_SCHEDULE_1F1B, 0.05,
                           counts, &res, NULL, 0) == BALANCE_OK)
            quality_row(s, S, "repack (from uniform)", res.stages, counts, m);
        int *balanced = dm_alloc((size_t)S * sizeof(int));
        balance_propose(BALANCE_PARTITION_TIME, &s->profile, S, NULL, NULL, balanced,
                        NULL, NULL, 0);
        if (balance_repack(&s->profile, balanced, S, 0, m, DM_SCHEDULE_1F1B, 0.05,
                           counts, &res, NULL, 0) == BALANCE_OK)
            quality_row(s, S, "repack (from partition-time)", res.stages, counts, m);
        dm_free(balanced);
        dm_free(uniform);
        dm_free(counts);
        synthetic_free(s);
    }
    printf("\n");
}

int plan_bench(int argc, char **argv)
{
    int repeats = 21;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--repeats")) {
            char *end;
            long v = strtol(argv[i + 1], &end, 10);
            if (*end || v < 1 || v > 100000)
                dm_user_error("--repeats: '%s' is not a whole number in [1, 100000]",
                              argv[i + 1]);
            repeats = (int)v;
        }
        if (!strcmp(argv[i], "--seed")) {
            char *end;
            unsigned long long v = strtoull(argv[i + 1], &end, 10);
            if (*end) dm_user_error("--seed: '%s' is not a whole number", argv[i + 1]);
            bench_seed = v;
        }
    }
    printf("# dynmo plan --bench --repeats %d --seed %llu\n\n", repeats,
           (unsigned long long)bench_seed);
    int failures = bench_partition(repeats);
    bench_diffusion();
    bench_repack();
    bench_quality();
    if (failures) {
        printf("%d benchmark answers failed their correctness check\n", failures);
        return DM_EXIT_INTERNAL;
    }
    return DM_EXIT_OK;
}
