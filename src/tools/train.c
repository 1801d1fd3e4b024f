/* `dynmo train` and `dynmo bench`: the one-rank trainer.
 *
 * A step: for each micro-batch, load it, run the model forward and
 * backward (gradients accumulate, scaled by 1/micro_batches); clip by the
 * global gradient norm; one AdamW update; log. Everything that decides
 * the numbers (weights, data order, reduction orders) depends only on the
 * config and seed, so the loss is bit-identical run after run. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "dynmo/tools.h"
#include "pipe/world.h"

struct trainer {
    struct dm_config cfg;
    struct gpt model;
    struct gpt_acts acts;
    struct block_scratch scratch;
    int micro_B, T;
};

static void trainer_init(struct trainer *tr, const struct dm_config *cfg)
{
    tr->cfg = *cfg;
    tr->micro_B = cfg->batch / cfg->micro_batches;
    tr->T = cfg->seq;
    struct gpt_shape shape = gpt_shape_from_config(cfg);
    gpt_build(&tr->model, &shape, 0, shape.layers, 1, 1, cfg->seed);
    gpt_acts_alloc(&tr->acts, &tr->model, tr->micro_B, tr->T);
    block_scratch_alloc(&tr->scratch, tr->micro_B, tr->T, shape.channels, shape.heads);
}

static void trainer_free(struct trainer *tr)
{
    block_scratch_free(&tr->scratch);
    gpt_acts_free(&tr->acts);
    gpt_free(&tr->model);
}

struct step_result {
    float loss;        /* mean over the step's tokens, summed in micro-batch order */
    double grad_norm;  /* before clipping */
    double lr;
};

/* One optimizer step on global samples [first_sample, first_sample+batch). */
static struct step_result trainer_step(struct trainer *tr, struct loader *ld, int step)
{
    const struct dm_config *cfg = &tr->cfg;
    struct step_result res = {0};
    float loss_sum = 0.0f;
    for (int mb = 0; mb < cfg->micro_batches; mb++) {
        if (ld) {
            long first = (long)step * cfg->batch + (long)mb * tr->micro_B;
            loader_fill(ld, first, tr->micro_B, tr->acts.tokens, tr->acts.targets);
        }
        loss_sum += gpt_forward(&tr->model, &tr->acts);
        gpt_backward(&tr->model, &tr->acts, &tr->scratch, 1.0f / (float)cfg->micro_batches,
                     NULL, NULL);
    }
    res.loss = loss_sum / (float)cfg->micro_batches;
    res.grad_norm = sqrt(gpt_grad_sumsq(&tr->model));
    float scale = 1.0f;
    if (cfg->grad_clip > 0 && res.grad_norm > cfg->grad_clip)
        scale = (float)(cfg->grad_clip / res.grad_norm);
    res.lr = lr_at_step(cfg, step);
    gpt_adamw_update(&tr->model, res.lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay,
                     scale, step + 1);
    gpt_zero_grads(&tr->model);
    return res;
}

/* Mean loss over cfg->eval_batches batches of the validation file, always
 * the same samples (the first ones of epoch 0), forward only. */
static float trainer_eval(struct trainer *tr, struct loader *val)
{
    const struct dm_config *cfg = &tr->cfg;
    float sum = 0.0f;
    int count = 0;
    for (int b = 0; b < cfg->eval_batches; b++) {
        for (int mb = 0; mb < cfg->micro_batches; mb++) {
            long first = (long)b * cfg->batch + (long)mb * tr->micro_B;
            loader_fill(val, first, tr->micro_B, tr->acts.tokens, tr->acts.targets);
            sum += gpt_forward(&tr->model, &tr->acts);
            count++;
        }
    }
    return sum / (float)count;
}

/* ---- command line ------------------------------------------------------- */

struct train_args {
    const char *config_path;
    int warmup_steps, timed_steps;   /* bench only */
};

static void parse_train_args(int argc, char **argv, struct dm_config *cfg,
                             struct train_args *args, int is_bench)
{
    const char *cmd = is_bench ? "bench" : "train";
    config_defaults(cfg);
    args->config_path = NULL;
    args->warmup_steps = 3;
    args->timed_steps = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) dm_user_error("%s: --config needs a file", cmd);
            args->config_path = argv[++i];
        }
    }
    if (args->config_path) config_load_file(cfg, args->config_path);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
        } else if (is_bench && (!strcmp(a, "--warmup") || !strcmp(a, "--steps"))) {
            if (i + 1 >= argc) dm_user_error("bench: %s needs a number", a);
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < (a[2] == 'w' ? 0 : 1) || v > 100000)
                dm_user_error("bench: %s = '%s' must be an integer in [%d, 100000]", a,
                              argv[i], a[2] == 'w' ? 0 : 1);
            if (a[2] == 'w') args->warmup_steps = (int)v;
            else args->timed_steps = (int)v;
        } else if (strchr(a, '=') && a[0] != '-') {
            config_apply_override(cfg, a);
        } else {
            dm_user_error("%s: unknown argument '%s' (usage: dynmo %s --config FILE "
                          "[section.key=value ...]%s)", cmd, a, cmd,
                          is_bench ? " [--warmup N] [--steps N]" : "");
        }
    }
    config_validate(cfg);
}

static int threads_for_this_rank(const struct dm_config *cfg)
{
    if (cfg->threads > 0) return cfg->threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int local = world_local_size();
    long n = cores / (local > 0 ? local : 1);
    return n < 1 ? 1 : (int)n;
}

static void make_dirs(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            dm_user_error("cannot create directory %s: %s", buf, dm_errno_text());
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        dm_user_error("cannot create directory %s: %s", buf, dm_errno_text());
}

static void format_eta(char *buf, size_t size, double seconds)
{
    int s = (int)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%dh%02dm", s / 3600, (s % 3600) / 60);
    else if (s >= 60) snprintf(buf, size, "%dm%02ds", s / 60, s % 60);
    else snprintf(buf, size, "%ds", s);
}

static void print_usage_train(void)
{
    printf("usage: dynmo train --config FILE [section.key=value ...]\n"
           "Trains the GPT the config describes; writes <run.out_dir>/runlog.h5.\n"
           "Sections: model, train, data, run (docs/config.md lists every key).\n");
}

int cmd_train(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage_train();
            return DM_EXIT_OK;
        }
    world_init(&argc, &argv);
    struct dm_config cfg;
    struct train_args args;
    parse_train_args(argc, argv, &cfg, &args, 0);
    if (dm_world_size() != 1)
        dm_user_error("this build trains on one rank; run without mpiexec or with -n 1 "
                      "(pipeline parallelism is not implemented yet)");
    int threads = threads_for_this_rank(&cfg);
    dm_threads_init(threads);

    struct token_file train_file, val_file;
    token_file_open(&train_file, cfg.train_path, (uint32_t)cfg.vocab, (uint64_t)cfg.seq + 1);
    int have_val = cfg.eval_every > 0;
    if (have_val)
        token_file_open(&val_file, cfg.val_path, (uint32_t)cfg.vocab, (uint64_t)cfg.seq + 1);
    struct loader train_loader, val_loader;
    loader_init(&train_loader, &train_file, cfg.seq, cfg.seed);
    if (have_val) loader_init(&val_loader, &val_file, cfg.seq, cfg.seed);

    make_dirs(cfg.out_dir);
    char log_path[1200];
    snprintf(log_path, sizeof log_path, "%s/" RUNLOG_FILE_NAME, cfg.out_dir);
    struct runlog *log = runlog_create(log_path, &cfg);

    struct trainer tr;
    trainer_init(&tr, &cfg);
    struct gpt_shape shape = gpt_shape_from_config(&cfg);
    dm_log("dynmo %s: %d layers x %d channels, %d heads, %.2fM parameters; batch %d x %d "
           "tokens in %d micro-batches; %d threads\n",
           DYNMO_VERSION, shape.layers, shape.channels, shape.heads,
           (double)gpt_param_count(&shape) / 1e6, cfg.batch, cfg.seq, cfg.micro_batches,
           threads);

    double tokens_per_step = (double)cfg.batch * cfg.seq;
    double first_loss = NAN, last_loss = NAN, last_val = NAN;
    double timed_ms = 0;
    int timed_steps = 0;
    double run_start = dm_now();
    for (int step = 0; step < cfg.steps; step++) {
        double t0 = dm_now();
        struct step_result r = trainer_step(&tr, &train_loader, step);
        double ms = (dm_now() - t0) * 1e3;
        if (step == 0) first_loss = r.loss;
        last_loss = r.loss;
        if (step > 0) {   /* the first step pays page faults and warm-up */
            timed_ms += ms;
            timed_steps++;
        }
        double mean_ms = timed_steps ? timed_ms / timed_steps : ms;
        runlog_append_scalar(log, RUNLOG_STEP_LOSS, r.loss);
        runlog_append_scalar(log, RUNLOG_STEP_MS, (float)ms);
        runlog_append_scalar(log, RUNLOG_STEP_LR, (float)r.lr);
        runlog_append_scalar(log, RUNLOG_STEP_GRAD_NORM, (float)r.grad_norm);
        runlog_append_scalar(log, RUNLOG_STEP_TOKENS_PER_S, (float)(tokens_per_step / ms * 1e3));
        runlog_append_scalar(log, RUNLOG_STEP_PEAK_RSS_MB,
                             (float)((double)dm_peak_rss_bytes() / 1048576.0));
        if (!isfinite(r.loss))
            dm_user_error("step %d: the loss is %f; lower train.lr (now %g) or check the data",
                          step + 1, r.loss, cfg.lr);
        if (have_val && ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps)) {
            last_val = trainer_eval(&tr, &val_loader);
            runlog_append_int_scalar(log, RUNLOG_EVAL_STEP, step + 1);
            runlog_append_scalar(log, RUNLOG_EVAL_LOSS, (float)last_val);
        }
        runlog_flush(log);
        if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) {
            char eta[32];
            format_eta(eta, sizeof eta, mean_ms * (cfg.steps - step - 1) / 1e3);
            dm_log("step %d/%d | loss %.4f | lr %.2e | grad norm %.3f | %.0f ms | %.0f tok/s | ETA %s",
                   step + 1, cfg.steps, r.loss, r.lr, r.grad_norm, ms,
                   tokens_per_step / ms * 1e3, eta);
            if (have_val && ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps))
                dm_log(" | val %.4f", last_val);
            dm_log("\n");
        }
    }
    double wall = dm_now() - run_start;
    runlog_close(log);
    double mean_ms = timed_steps ? timed_ms / timed_steps : wall * 1e3 / (cfg.steps ? cfg.steps : 1);
    dm_log("\nsummary: %d steps in %.1f s\n", cfg.steps, wall);
    dm_log("  loss: %.4f at the first step, %.4f at the last\n", first_loss, last_loss);
    if (have_val) dm_log("  validation loss: %.4f\n", last_val);
    dm_log("  throughput: %.0f tokens/s (%.1f ms/step, steps after the first)\n",
           tokens_per_step / mean_ms * 1e3, mean_ms);
    dm_log("  peak memory: %.0f MiB resident\n", (double)dm_peak_rss_bytes() / 1048576.0);
    dm_log("  run log: %s\n", log_path);

    trainer_free(&tr);
    loader_free(&train_loader);
    token_file_close(&train_file);
    if (have_val) {
        loader_free(&val_loader);
        token_file_close(&val_file);
    }
    dm_threads_shutdown();
    world_finalize();
    return DM_EXIT_OK;
}

/* ---- bench -------------------------------------------------------------- */

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

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

int cmd_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dynmo bench --config FILE [section.key=value ...] [--warmup N] "
                   "[--steps N]\nTimes training steps on random tokens: median ms/step, "
                   "tokens/s, GFLOP/s, peak RSS.\n");
            return DM_EXIT_OK;
        }
    world_init(&argc, &argv);
    struct dm_config cfg;
    struct train_args args;
    parse_train_args(argc, argv, &cfg, &args, 1);
    int threads = threads_for_this_rank(&cfg);
    dm_threads_init(threads);
    struct trainer tr;
    trainer_init(&tr, &cfg);
    /* Random tokens from the seed: the benchmark needs no dataset. */
    long n = (long)tr.micro_B * tr.T;
    for (long i = 0; i < n; i++) {
        tr.acts.tokens[i] = (int)(dm_hash64(cfg.seed, 1, (uint64_t)i) % (uint64_t)cfg.vocab);
        tr.acts.targets[i] = (int)(dm_hash64(cfg.seed, 2, (uint64_t)i) % (uint64_t)cfg.vocab);
    }
    int total = args.warmup_steps + args.timed_steps;
    double *ms = calloc((size_t)total, sizeof *ms);
    float first_loss = 0, last_loss = 0;
    for (int s = 0; s < total; s++) {
        double t0 = dm_now();
        struct step_result r = trainer_step(&tr, NULL, s);
        ms[s] = (dm_now() - t0) * 1e3;
        if (s == 0) first_loss = r.loss;
        last_loss = r.loss;
        dm_log("bench step %d/%d: %.1f ms%s\n", s + 1, total, ms[s],
               s < args.warmup_steps ? " (warm-up)" : "");
    }
    qsort(ms + args.warmup_steps, (size_t)args.timed_steps, sizeof *ms, compare_double);
    double median = ms[args.warmup_steps + args.timed_steps / 2];
    if (args.timed_steps % 2 == 0)
        median = 0.5 * (median + ms[args.warmup_steps + args.timed_steps / 2 - 1]);
    double tokens = (double)cfg.batch * cfg.seq;
    /* Correctness guard (nccl-tests habit): training on one fixed batch must
     * lower its loss; a broken kernel fails the benchmark. */
    int ok = isfinite(last_loss) && last_loss < first_loss;
    dm_log("bench: %d layers x %d channels, batch %d x %d, %d threads\n", cfg.layers,
           cfg.channels, cfg.batch, cfg.seq, threads);
    dm_log("bench: median %.1f ms/step over %d steps (after %d warm-up), %.0f tokens/s, "
           "%.1f GFLOP/s, peak RSS %.0f MiB\n",
           median, args.timed_steps, args.warmup_steps, tokens / median * 1e3,
           step_flops(&cfg) / median / 1e6, (double)dm_peak_rss_bytes() / 1048576.0);
    dm_log("bench: loss %.4f -> %.4f on a fixed batch: %s\n", first_loss, last_loss,
           ok ? "ok" : "WRONG (the loss did not fall)");
    free(ms);
    trainer_free(&tr);
    dm_threads_shutdown();
    world_finalize();
    return ok ? DM_EXIT_OK : DM_EXIT_INTERNAL;
}
