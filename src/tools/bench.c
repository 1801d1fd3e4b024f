/* `dynmo bench`: times training steps of the configured model on one
 * fixed batch of random tokens (no dataset needed) and checks that the
 * loss falls; under mpiexec it times the pipeline, and `--migration`
 * times block migration against plain MPI messages of the same bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"
#include "dynmo/world.h"
#include "tools/train/train.h"

/* ---- bench -------------------------------------------------------------- */


/* Model FLOPs of one training step (forward + backward = 3x forward):
 * matmuls 2 * (L * 12 C^2 + V C) per token, attention 2 * 2 * T * C per
 * token per layer (Q K^T and att V counted over the full T x T square, the
 * usual convention, although the causal half is skipped). */
static double step_flops(const struct dm_config *cfg)
{
    double C = cfg->channels, L = cfg->layers, V = cfg->vocab, T = cfg->seq;
    double per_token_fwd = 2.0 * (L * 12.0 * C * C + V * C) + L * 4.0 * T * C;
    return 3.0 * per_token_fwd * cfg->batch * T;
}


/* bench --migration: on 2 stages, moves all but one block from stage 0 to
 * stage 1 and back, `reps` times each way, and compares the bytes per
 * second of block migration with plain MPI messages of the same size. */
static int bench_migration(struct engine *eng, const struct dm_config *cfg, int reps)
{
    if (cfg->pp != 2 || dm_world_size() != 2 || cfg->virtual_stages != 1)
        dm_user_error("bench --migration needs 2 ranks, parallel.pp=2 (mpiexec -n 2) and one "
                      "chunk a stage (not parallel.schedule = interleaved)");
    int L = cfg->layers;
    int there[2] = {1, L - 1}, back[2] = {L - 1, 1};
    double seconds = 0, bytes = 0;
    /* One untimed round trip first, as for the plain send: it takes the
     * first allocations' page faults. */
    engine_relayout(eng, there);
    engine_relayout(eng, back);
    for (int r = 0; r < reps; r++) {
        double t0 = dm_now();
        engine_relayout(eng, there);
        engine_relayout(eng, back);
        seconds += dm_now() - t0;
    }
    /* The moving blocks 1 .. L-2 (a scheme's blocks may differ in size). */
    struct gpt_shape shape = dyn_shape_from_config(cfg);
    size_t moved_bytes = 0;
    for (int b = 1; b < L - 1; b++) {
        struct block probe;
        block_prepare_receive(&probe, b, &shape);
        moved_bytes += block_pack_size(&probe);
        block_free(&probe);
    }
    bytes = 2.0 * reps * (double)moved_bytes;
    double raw = world_transfer_rate(moved_bytes, reps);
    dm_log("bench --migration: %d blocks of %.2f MB each way, %d round trips\n", L - 2,
           moved_bytes / 1e6 / (L - 2), reps);
    dm_log("bench --migration: block migration %.0f MB/s (header, slabs sent straight, "
           "new block arrays and buffers); plain MPI send of the same bytes %.0f MB/s; ratio %.0f%%\n",
           bytes / seconds / 1e6, raw / 1e6, 100 * (bytes / seconds) / raw);
    return DM_EXIT_OK;
}


/* What the timed steps measured (rank 0's sums). */
struct bench_result {
    double *ms;                     /* (warm-up + timed) step times */
    float first_loss, last_loss;
    double bubble, imbalance;       /* means over the timed steps */
    double *stage_ms;               /* (stages) mean compute */
    double *layer_fwd, *layer_bwd;  /* (layers) sums */
};

/* Step 0 of the schedule every time: the same batch, so the loss must
 * fall (the correctness guard of the report). */
static void run_steps(struct engine *eng, struct loader *ld, const struct dm_config *cfg,
                      const struct train_args *args, struct bench_result *r)
{
    int S = cfg->pp, L = cfg->layers, total = args->warmup_steps + args->timed_steps;
    for (int s = 0; s < total; s++) {
        const struct step_stats *st = engine_step(eng, ld, 0);
        r->ms[s] = st->step_ms;
        if (s == 0) r->first_loss = st->loss;
        r->last_loss = st->loss;
        if (s >= args->warmup_steps && dm_rank() == 0) {
            r->bubble += st->bubble_ratio / args->timed_steps;
            r->imbalance += st->imbalance / args->timed_steps;
            for (int k = 0; k < S; k++)
                r->stage_ms[k] += st->stage_compute_ms[k] / args->timed_steps;
            for (int l = 0; l < L; l++) {
                r->layer_fwd[l] += st->layer_fwd_ms[l];
                r->layer_bwd[l] += st->layer_bwd_ms[l];
            }
        }
        dm_log("bench step %d/%d: %.1f ms%s\n", s + 1, total, r->ms[s],
               s < args->warmup_steps ? " (warm-up)" : "");
    }
}

/* The schedule's bound: each stage's measured compute per micro-batch
 * (split into forward and backward, and under interleaved over its chunks,
 * in its blocks' proportion), simulated with zero communication and no
 * waiting. layout: the chunks' (S v counts; the stages' when v = 1). */
static void print_bound(const struct dm_config *cfg, const int *layout,
                        const struct bench_result *r, double median)
{
    int S = cfg->pp, v = cfg->virtual_stages, V = S * v;
    double *stage_fwd = dm_alloc((size_t)V * sizeof(double));
    double *stage_bwd = dm_alloc((size_t)V * sizeof(double));
    double *stage_all = dm_alloc((size_t)S * sizeof(double));   /* a stage's blocks' ms */
    for (int k = 0, b = 0; k < V; k++)
        for (int j = 0; j < layout[k]; j++, b++)
            stage_all[k % S] += r->layer_fwd[b] + r->layer_bwd[b];
    for (int k = 0, b = 0; k < V; k++) {
        double f = 0, w = 0;
        for (int j = 0; j < layout[k]; j++, b++) {
            f += r->layer_fwd[b];
            w += r->layer_fwd[b] + r->layer_bwd[b];
        }
        double share = stage_all[k % S] > 0 ? w / stage_all[k % S] : 1.0 / v;
        double per_mb = r->stage_ms[k % S] / cfg->micro_batches * share;
        stage_fwd[k] = w > 0 ? per_mb * f / w : per_mb / 3;
        stage_bwd[k] = per_mb - stage_fwd[k];
    }
    struct balance_prediction pred;
    char err[256];
    if (balance_predict_chunks(stage_fwd, stage_bwd, NULL, NULL, S, v, cfg->micro_batches,
                               config_schedule(cfg), NULL, &pred, err, sizeof err) == 0)
        dm_log("bench: %s bound from the measured stage compute: %.1f ms/step "
               "(bubble %.1f%%); measured median is %.1f%% above it\n",
               cfg->schedule, pred.step_ms, 100 * pred.bubble_ratio,
               100 * (median / pred.step_ms - 1));
    dm_free(stage_fwd);
    dm_free(stage_bwd);
    dm_free(stage_all);
}

/* Rank 0: the report; returns whether the loss fell. */
static int report(const struct dm_config *cfg, const struct train_args *args, int threads,
                  const int *layout, struct bench_result *r)
{
    double *timed = r->ms + args->warmup_steps;
    double median = dm_median(timed, args->timed_steps);
    double tokens_n = (double)cfg->batch * cfg->seq;
    int ok = isfinite(r->last_loss) && r->last_loss < r->first_loss;
    dm_log("bench: %d layers x %d channels, batch %d x %d in %d micro-batches, %d ranks "
           "(pp %d x dp %d), %d threads per rank\n",
           cfg->layers, cfg->channels, cfg->batch, cfg->seq, cfg->micro_batches,
           dm_world_size(), cfg->pp, cfg->dp, threads);
    dm_log("bench: median %.1f ms/step over %d steps (after %d warm-up), %.0f tokens/s, "
           "%.1f GFLOP/s, peak RSS %.0f MiB (rank 0)\n",
           median, args->timed_steps, args->warmup_steps, tokens_n / median * 1e3,
           step_flops(cfg) / median / 1e6, (double)dm_peak_rss_bytes() / 1048576.0);
    if (dm_world_size() > 1) {
        dm_log("bench: bubble %.1f%%, imbalance %.3f (means over the timed steps)\n",
               100 * r->bubble, r->imbalance);
        print_bound(cfg, layout, r, median);
    }
    dm_log("bench: loss %.4f -> %.4f on a fixed batch: %s\n", r->first_loss, r->last_loss,
           ok ? "ok" : "WRONG (the loss did not fall)");
    return ok;
}

/* One fixed batch of random tokens from the seed, served through an
 * in-memory token stream so the engine loads it like any data. */
static uint32_t *random_batch(struct token_file *tf, const struct dm_config *cfg)
{
    uint64_t count = (uint64_t)cfg->batch * cfg->seq + 1;
    uint32_t *tokens = dm_alloc(count * sizeof(uint32_t));
    for (uint64_t i = 0; i < count; i++)
        tokens[i] = (uint32_t)(dm_hash64(cfg->seed, 1, i) % (uint64_t)cfg->vocab);
    token_file_from_memory(tf, "(random tokens)", tokens, count, (uint32_t)cfg->vocab);
    return tokens;
}

int cmd_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dynmo bench --config FILE [section.key=value ...] [--warmup N] "
                   "[--steps N]\nTimes training steps on one fixed batch of random tokens "
                   "(no dataset needed): median ms/step, tokens/s, GFLOP/s, peak RSS.\n"
                   "Under mpiexec it times the pipeline the config describes.\n");
            return DM_EXIT_OK;
        }
    world_init(&argc, &argv);
    struct dm_config cfg;
    struct train_args args;
    train_parse_args(argc, argv, &cfg, &args, 1);
    train_open_backend(&cfg);
    int threads = train_threads_for_rank(&cfg);
    dm_threads_init(threads);
    struct token_file tf;
    uint32_t *tokens = random_batch(&tf, &cfg);
    struct loader ld;
    loader_init(&ld, &tf, cfg.seq, cfg.seed);
    struct pipe_grid grid;
    pipe_grid_init(&grid, cfg.pp, cfg.dp);   /* its error comes before the layout's */
    int chunks = cfg.pp * cfg.virtual_stages;   /* interleaved: the chunks' layout */
    int *layout = dm_alloc((size_t)chunks * sizeof(int));
    train_initial_layout(layout, &cfg, chunks);
    if (chunks == cfg.pp) train_check_memory(&cfg, layout, cfg.pp);
    struct engine *eng = engine_create(&cfg, layout, 0);
    dm_free(layout);
    int status;
    if (args.migration) {
        status = bench_migration(eng, &cfg, args.timed_steps);
    } else {
        struct bench_result r = {
            .ms = dm_alloc((size_t)(args.warmup_steps + args.timed_steps) * sizeof(double)),
            .stage_ms = dm_alloc((size_t)cfg.pp * sizeof(double)),
            .layer_fwd = dm_alloc((size_t)cfg.layers * sizeof(double)),
            .layer_bwd = dm_alloc((size_t)cfg.layers * sizeof(double)),
        };
        run_steps(eng, &ld, &cfg, &args, &r);
        int ok = dm_rank() != 0 || report(&cfg, &args, threads, engine_chunk_layout(eng), &r);
        status = ok ? DM_EXIT_OK : DM_EXIT_INTERNAL;
        dm_free(r.ms);
        dm_free(r.stage_ms);
        dm_free(r.layer_fwd);
        dm_free(r.layer_bwd);
    }
    engine_destroy(eng);
    loader_free(&ld);
    token_file_close(&tf);
    dm_free(tokens);
    dm_threads_shutdown();
    world_finalize(status);
    return status;
}
