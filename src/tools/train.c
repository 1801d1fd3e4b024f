/* `dynmo train` and `dynmo bench`: the training loop around the pipeline
 * engine (one rank is a pipeline of one stage).
 *
 * A step runs the stage's schedule (micro-batches forward and backward,
 * gradients accumulated), reduces gradients, clips by the global norm and
 * takes one AdamW step; rank 0 logs it. Everything that decides the
 * numbers (weights, data order, reduction orders) depends only on the
 * config and seed, so the loss is bit-identical run after run and for
 * every layout. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"
#include "dynmo/tools.h"
#include "dynmo/world.h"
#include "tools/balancing.h"

/* ---- command line ------------------------------------------------------- */

struct train_args {
    const char *config_path;
    int warmup_steps, timed_steps;   /* bench only */
    int migration;                   /* bench --migration */
};

static void parse_train_args(int argc, char **argv, struct dm_config *cfg,
                             struct train_args *args, int is_bench)
{
    const char *cmd = is_bench ? "bench" : "train";
    config_defaults(cfg);
    args->config_path = NULL;
    args->warmup_steps = 3;
    args->timed_steps = 10;
    args->migration = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) dm_user_error("%s: --config needs a file", cmd);
            if (args->config_path)
                dm_user_error("%s: --config given twice (%s, %s): give one file and "
                              "section.key=value overrides", cmd, args->config_path, argv[i + 1]);
            args->config_path = argv[++i];
        }
    }
    if (!args->config_path)
        dm_user_error("%s: no --config FILE (usage: dynmo %s --config FILE "
                      "[section.key=value ...]%s)", cmd, cmd,
                      is_bench ? " [--warmup N] [--steps N]" : "");
    config_load_file(cfg, args->config_path);
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
        } else if (is_bench && !strcmp(a, "--migration")) {
            args->migration = 1;
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

/* One step line and the run-log rows of a step (rank 0). */
static void log_step(struct runlog *log, const struct dm_config *cfg, int step,
                     const struct step_stats *st, double tokens_per_step, double mean_ms,
                     int stages, int width)
{
    runlog_append_scalar(log, RUNLOG_STEP_LOSS, st->loss);
    runlog_append_scalar(log, RUNLOG_STEP_MS, (float)st->step_ms);
    runlog_append_scalar(log, RUNLOG_STEP_LR, (float)st->lr);
    runlog_append_scalar(log, RUNLOG_STEP_GRAD_NORM, (float)st->grad_norm);
    runlog_append_scalar(log, RUNLOG_STEP_TOKENS_PER_S,
                         (float)(tokens_per_step / st->step_ms * 1e3));
    runlog_append_scalar(log, RUNLOG_STEP_PEAK_RSS_MB,
                         (float)((double)dm_peak_rss_bytes() / 1048576.0));
    runlog_append_int_scalar(log, RUNLOG_STEP_RANKS, dm_world_size());
    runlog_append_scalar(log, RUNLOG_STEP_BUBBLE, (float)st->bubble_ratio);
    runlog_append_scalar(log, RUNLOG_STEP_IMBALANCE, (float)st->imbalance);
    /* Per-stage rows keep the first world's width (NaN / 0 past a re-pack). */
    float *row = dm_alloc((size_t)(cfg->layers > width ? cfg->layers : width) * sizeof(float));
    int *irow = dm_alloc((size_t)width * sizeof(int));
    for (int l = 0; l < cfg->layers; l++) row[l] = (float)st->layer_fwd_ms[l];
    runlog_append_row(log, RUNLOG_LAYER_FWD_MS, row, cfg->layers);
    for (int l = 0; l < cfg->layers; l++) row[l] = (float)st->layer_bwd_ms[l];
    runlog_append_row(log, RUNLOG_LAYER_BWD_MS, row, cfg->layers);
    if (!strcmp(cfg->dyn_kind, "prune")) {
        for (int l = 0; l < cfg->layers; l++) row[l] = (float)st->layer_sparsity[l];
        runlog_append_row(log, RUNLOG_LAYER_SPARSITY, row, cfg->layers);
    }
    if (!strcmp(cfg->dyn_kind, "early_exit")) {
        for (int l = 0; l < cfg->layers; l++) row[l] = (float)st->layer_active[l];
        runlog_append_row(log, RUNLOG_LAYER_ACTIVE, row, cfg->layers);
    }
    for (int l = 0; l < cfg->layers; l++) row[l] = (float)st->layer_update_ms[l];
    runlog_append_row(log, RUNLOG_LAYER_UPDATE_MS, row, cfg->layers);
    for (int s = 0; s < width; s++) row[s] = s < stages ? (float)st->stage_compute_ms[s] : NAN;
    runlog_append_row(log, RUNLOG_STAGE_BUSY_MS, row, width);
    for (int s = 0; s < width; s++) row[s] = s < stages ? (float)st->stage_wait_ms[s] : NAN;
    runlog_append_row(log, RUNLOG_STAGE_IDLE_MS, row, width);
    for (int s = 0; s < width; s++) row[s] = s < stages ? (float)st->stage_update_ms[s] : NAN;
    runlog_append_row(log, RUNLOG_STAGE_UPDATE_MS, row, width);
    for (int s = 0; s < width; s++) irow[s] = s < stages ? st->layout[s] : 0;
    runlog_append_int_row(log, RUNLOG_LAYOUT_HISTORY, irow, width);
    for (int r = 0; r < st->trace_rows; r++)
        runlog_append_row(log, RUNLOG_TRACE_EVENTS, st->trace + (size_t)r * STEP_TRACE_COLUMNS,
                          STEP_TRACE_COLUMNS);
    dm_free(row);
    dm_free(irow);

    if ((step + 1) % cfg->log_every != 0 && step + 1 != cfg->steps) return;
    char eta[32];
    format_eta(eta, sizeof eta, mean_ms * (cfg->steps - step - 1) / 1e3);
    dm_log("step %d/%d | loss %.4f | lr %.2e | grad norm %.3f | %.0f ms | %.0f tok/s | ETA %s",
           step + 1, cfg->steps, st->loss, st->lr, st->grad_norm, st->step_ms,
           tokens_per_step / st->step_ms * 1e3, eta);
    if (stages > 1)
        dm_log(" | bubble %.1f%% | imbalance %.2f", 100.0 * st->bubble_ratio, st->imbalance);
    if (st->dyn_text[0]) dm_log(" | %s", st->dyn_text);
    if (st->migrated_blocks > 0) {
        char layout[256];
        layout_format(layout, sizeof layout, st->layout, stages);
        dm_log(" | migrated %d blocks, %.1f MB, %.0f ms -> %s", st->migrated_blocks,
               st->migrated_bytes / 1e6, st->migrate_ms, layout);
    }
}

/* The end-of-run table: per stage, compute max / min over the logged
 * steps and their ratio, total wait and mean bubble (STYLE.md: the
 * max/min ratio is the product). */
struct stage_totals {
    double *compute_max, *compute_min, *wait_sum, *compute_sum;
    double step_sum;
    int steps;
};

static void stage_totals_add(struct stage_totals *t, const struct step_stats *st, int stages)
{
    for (int s = 0; s < stages; s++) {
        double c = st->stage_compute_ms[s];
        if (t->steps == 0 || c > t->compute_max[s]) t->compute_max[s] = c;
        if (t->steps == 0 || c < t->compute_min[s]) t->compute_min[s] = c;
        t->wait_sum[s] += st->stage_wait_ms[s];
        t->compute_sum[s] += c;
    }
    t->step_sum += st->step_ms;
    t->steps++;
}

static void stage_totals_print(const struct stage_totals *t, int stages)
{
    if (t->steps == 0) return;
    dm_log("\nper stage over %d steps (ms per step):\n", t->steps);
    dm_log("  stage  compute max  compute min  max/min   wait mean  bubble %%\n");
    for (int s = 0; s < stages; s++) {
        double mean_step = t->step_sum / t->steps;
        double busy = t->compute_sum[s] / t->steps;
        double bubble = mean_step > 0 ? 100.0 * (1.0 - busy / mean_step) : 0.0;
        dm_log("  %5d  %11.1f  %11.1f  %7.2f  %10.1f  %8.1f\n", s, t->compute_max[s],
               t->compute_min[s],
               t->compute_min[s] > 0 ? t->compute_max[s] / t->compute_min[s] : 0.0,
               t->wait_sum[s] / t->steps, bubble < 0 ? 0.0 : bubble);
    }
}

/* SIGUSR1 / SIGTERM: checkpoint at the next step boundary, exit 75. The
 * handler only sets the flag; the engine folds it into every step's global
 * reduction so all ranks stop at the same step. */
static volatile int stop_signal;
static void on_stop_signal(int sig)
{
    (void)sig;
    stop_signal = 1;
}

static void install_signal_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* Rank 0: <ckpt.dir>/next_world (docs/jobs.md), written to a temporary
 * name, fsynced and renamed, after the checkpoint it names is complete. */
static void write_next_world(const char *dir, int pp, int dp, const int *layout, long step,
                             const char *ckpt_path)
{
    char tmp[1200], final[1200], text[2048], layout_text[512];
    snprintf(tmp, sizeof tmp, "%s/next_world.tmp", dir);
    snprintf(final, sizeof final, "%s/next_world", dir);
    layout_format(layout_text, sizeof layout_text, layout, pp);
    const char *base = strrchr(ckpt_path, '/');
    base = base ? base + 1 : ckpt_path;
    int n = snprintf(text, sizeof text,
                     "# written by dynmo %s on re-pack: the next world of this job chain\n"
                     "ranks = %d\npp = %d\ndp = %d\nlayout = %s\nstep = %ld\ncheckpoint = %s\n",
                     DYNMO_VERSION, pp * dp, pp, dp, layout_text, step, base);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) dm_user_error_local("cannot write %s: %s", tmp, dm_errno_text());
    if (write(fd, text, (size_t)n) != n || fsync(fd) != 0)
        dm_user_error_local("cannot write %s: %s", tmp, dm_errno_text());
    close(fd);
    if (rename(tmp, final) != 0)
        dm_user_error_local("cannot rename %s: %s", tmp, dm_errno_text());
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

/* The run log continues across restarts: every per-step dataset is cut back
 * to the resumed step (the trace to its rows of steps up to it), per-stage
 * rows keep the first world's width. */
static struct runlog *open_runlog(const char *path, const struct dm_config *cfg, long start,
                                  int stages, int *width)
{
    *width = stages;
    if (start == 0 || access(path, F_OK) != 0) return runlog_create(path, cfg);
    int *rows = NULL, ncols = 0;
    char err[512];
    if (runlog_read_int_matrix(path, RUNLOG_LAYOUT_HISTORY, &rows, &ncols, err, sizeof err) > 0 &&
        ncols > stages)
        *width = ncols;
    dm_free(rows);
    float *trace = NULL;   /* rows in step order; column 0 is the 1-based step */
    long trace_rows = runlog_read_matrix(path, RUNLOG_TRACE_EVENTS, &trace, &ncols, err,
                                         sizeof err), trace_keep = 0;
    while (trace_keep < trace_rows && trace[trace_keep * ncols] <= (float)start) trace_keep++;
    dm_free(trace);
    struct runlog *log = runlog_open_append(path);
    if (trace_rows > trace_keep) runlog_truncate(log, RUNLOG_TRACE_EVENTS, trace_keep);
    static const char *per_step[] = {
        RUNLOG_STEP_LOSS, RUNLOG_STEP_MS, RUNLOG_STEP_LR, RUNLOG_STEP_GRAD_NORM,
        RUNLOG_STEP_TOKENS_PER_S, RUNLOG_STEP_PEAK_RSS_MB, RUNLOG_STEP_RANKS,
        RUNLOG_STEP_BUBBLE, RUNLOG_STEP_IMBALANCE, RUNLOG_LAYER_FWD_MS, RUNLOG_LAYER_BWD_MS,
        RUNLOG_STAGE_BUSY_MS, RUNLOG_STAGE_IDLE_MS, RUNLOG_LAYOUT_HISTORY, RUNLOG_LAYER_SPARSITY,
        RUNLOG_LAYER_ACTIVE, RUNLOG_LAYER_UPDATE_MS, RUNLOG_STAGE_UPDATE_MS,
    };
    for (size_t i = 0; i < sizeof per_step / sizeof *per_step; i++)
        if (runlog_rows(log, per_step[i]) > start) runlog_truncate(log, per_step[i], start);
    long evals = cfg->eval_every > 0 ? start / cfg->eval_every : 0;
    if (runlog_rows(log, RUNLOG_EVAL_STEP) > evals) {
        runlog_truncate(log, RUNLOG_EVAL_STEP, evals);
        runlog_truncate(log, RUNLOG_EVAL_LOSS, evals);
    }
    return log;
}

/* When stages time-share processors (more ranks than CPUs), profiles
 * measure CPU time, so a block costs what it computes and not how long it
 * waited for a CPU, the ranks take turns computing (parallel.turns), and
 * the balancer predicts with the sharing. Collective. Returns the number of
 * groups (0: a processor per stage); *turns says whether they take turns. */
static int share_processors(const struct dm_config *cfg, int stages, int threads,
                            struct balancer *bal, int *group, double *cores, int *turns)
{
    *turns = 0;
    int groups = world_stage_sharing(stages, group, cores);
    if (!groups) return 0;
    /* A thread's CPU time is the rank's only when it computes alone. */
    char unused[8];
    if (world_agree(threads > 1, "", MPI_COMM_WORLD, unused, sizeof unused)) {
        dm_log("processors: stages share them, but some rank runs %d threads: profiling "
               "wall time with a processor per stage\n", threads);
        return 0;
    }
    dm_profile_cpu_time(1);
    if (cfg->turns && world_take_turns()) {
        /* unbound ranks have pinned themselves: the groups are now per CPU */
        groups = world_stage_sharing(stages, group, cores);
        /* the predictor's turns need whole cores: a group's share of its
         * CPU when other replicas run there too */
        for (int g = 0; g < groups; g++) cores[g] = fmax(1.0, round(cores[g]));
        *turns = 1;
        if (!groups) return 0;   /* pinned, replica 0's stages share no CPU */
    }
    balancer_set_sharing(bal, groups, group, cores, *turns);
    char text[512] = "";
    size_t used = 0;
    for (int s = 0; s < stages && used < sizeof text; s++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%d", s ? "," : "", group[s]);
    for (int g = 0; g < groups && used < sizeof text; g++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%.3g", g ? "," : " with ",
                                 cores[g]);
    dm_log("processors: stages share them (groups %s cores); profiling CPU time, waits "
           "sleep%s\n", text, *turns ? ", ranks take turns computing" : "");
    return groups;
}

int cmd_train(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage_train();
            return DM_EXIT_OK;
        }
    double t_start = dm_now();
    install_signal_handlers();
    world_init(&argc, &argv);
    struct dm_config cfg;
    struct train_args args;
    parse_train_args(argc, argv, &cfg, &args, 0);
    int threads = threads_for_this_rank(&cfg);
    dm_threads_init(threads);

    /* Every rank opens and checks the token files; a problem on any rank
     * is one message and status 2 on all. */
    struct token_file train_file, val_file;
    int have_val = cfg.eval_every > 0;
    char data_error[WORLD_MESSAGE_BYTES] = "";
    int data_bad = token_file_try_open(&train_file, cfg.train_path, (uint32_t)cfg.vocab,
                                       (uint64_t)cfg.seq + 1, data_error,
                                       sizeof data_error) != 0;
    if (!data_bad && have_val)
        data_bad = token_file_try_open(&val_file, cfg.val_path, (uint32_t)cfg.vocab,
                                       (uint64_t)cfg.seq + 1, data_error,
                                       sizeof data_error) != 0;
    char agreed[WORLD_MESSAGE_BYTES];
    if (world_agree(data_bad, data_error, MPI_COMM_WORLD, agreed, sizeof agreed))
        dm_user_error("%s", agreed);
    struct loader train_loader, val_loader;
    loader_init(&train_loader, &train_file, cfg.seq, cfg.seed);
    if (have_val) loader_init(&val_loader, &val_file, cfg.seq, cfg.seed);

    struct engine *eng = engine_create(&cfg, 1);
    const struct pipe_grid *grid = engine_grid(eng);
    int stages = grid->stages;
    struct balancer *bal = balancer_create(&cfg, stages);
    engine_watch_flag(eng, &stop_signal);
    double t_built = dm_now();
    long start_step = engine_resume(eng);
    double t_loaded = dm_now();

    char log_path[1200];
    snprintf(log_path, sizeof log_path, "%s/" RUNLOG_FILE_NAME, cfg.out_dir);
    struct runlog *log = NULL;
    int log_width = stages;
    if (dm_rank() == 0) {
        make_dirs(cfg.out_dir);
        log = open_runlog(log_path, &cfg, start_step, stages, &log_width);
    }
    struct gpt_shape shape = gpt_shape_from_config(&cfg);
    char layout[256];
    layout_format(layout, sizeof layout, engine_layout(eng), stages);
    dm_log("dynmo %s: %d layers x %d channels, %d heads, %.2fM parameters; batch %d x %d "
           "tokens in %d micro-batches; %d ranks (pp %d x dp %d, %s, layout %s); %d threads "
           "per rank\n",
           DYNMO_VERSION, shape.layers, shape.channels, shape.heads,
           (double)gpt_param_count(&shape) / 1e6, cfg.batch, cfg.seq, cfg.micro_batches,
           dm_world_size(), stages, grid->replicas, cfg.schedule, layout, threads);
    int *share_group = dm_alloc((size_t)stages * sizeof(int));
    double *share_cores = dm_alloc((size_t)stages * sizeof(double));
    int share_turns = 0;
    int share_groups = share_processors(&cfg, stages, threads, bal, share_group, share_cores,
                                        &share_turns);
    if (log)
        runlog_set_sharing(log, stages, share_group, share_groups, share_cores, share_turns);

    double tokens_per_step = (double)cfg.batch * cfg.seq;
    double first_loss = NAN, last_loss = NAN, last_val = NAN;
    double timed_ms = 0;
    int timed_steps = 0;
    struct stage_totals totals = {
        .compute_max = dm_alloc((size_t)stages * sizeof(double)),
        .compute_min = dm_alloc((size_t)stages * sizeof(double)),
        .wait_sum = dm_alloc((size_t)stages * sizeof(double)),
        .compute_sum = dm_alloc((size_t)stages * sizeof(double)),
    };
    double run_start = dm_now();
    int exit_status = DM_EXIT_OK;
    int *repack_layout = dm_alloc((size_t)(stages + 1) * sizeof(int));
    int steps_done = (int)start_step;
    for (int step = (int)start_step; step < cfg.steps; step++) {
        const struct step_stats *st = engine_step(eng, &train_loader, step);
        steps_done = step + 1;
        if (step == start_step && start_step > 0)
            dm_log("restart: start-up %.2f s (MPI, config, data, model), checkpoint read and "
                   "reshard %.2f s, first step %.2f s: %.2f s from launch to the end of the "
                   "first step\n", t_built - t_start, t_loaded - t_built, dm_now() - t_loaded,
                   dm_now() - t_start);
        int nonfinite = 0;
        if (dm_rank() == 0) {
            if (step == start_step) first_loss = st->loss;
            last_loss = st->loss;
            if (step > start_step) {   /* the first step pays page faults and warm-up */
                timed_ms += st->step_ms;
                timed_steps++;
                stage_totals_add(&totals, st, stages);
            }
            nonfinite = !isfinite(st->loss);
            log_step(log, &cfg, step, st, tokens_per_step,
                     timed_steps ? timed_ms / timed_steps : st->step_ms, stages, log_width);
        }
        if (have_val && ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps)) {
            last_val = engine_eval(eng, &val_loader);
            if (dm_rank() == 0) {
                runlog_append_int_scalar(log, RUNLOG_EVAL_STEP, step + 1);
                runlog_append_scalar(log, RUNLOG_EVAL_LOSS, (float)last_val);
                if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps)
                    dm_log(" | val %.4f", last_val);
            }
        }
        if (dm_rank() == 0) {
            if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) dm_log("\n");
            runlog_flush(log);
            if (nonfinite)
                dm_user_error_local("step %d: the loss is not finite; lower train.lr (now %g) "
                                    "or check the data", step + 1, cfg.lr);
        }
        balancer_after_step(bal, eng, log, st, step);

        /* Stop on a signal: checkpoint, exit 75 (resubmit unchanged). */
        char saved[1200];
        if (st->stop_requested) {
            if (cfg.ckpt_dir[0]) {
                engine_save(eng, cfg.ckpt_dir, cfg.keep, step + 1, saved, sizeof saved);
                dm_log("signal: checkpoint %s written at step %d; exiting with status 75\n",
                       saved, step + 1);
            } else {
                dm_log("signal: stopping at step %d without a checkpoint (no ckpt.dir); "
                       "exiting with status 75\n", step + 1);
            }
            exit_status = DM_EXIT_SIGNAL;
            break;
        }
        /* Re-pack: fewer stages keep the predicted step time within
         * (1 + epsilon): checkpoint, describe the next world, exit 3. */
        if (cfg.repack_enable && (step + 1) % cfg.repack_every == 0 && step + 1 < cfg.steps) {
            if (dm_rank() == 0) {
                int min_stages = (cfg.repack_min_ranks + grid->replicas - 1) / grid->replicas;
                repack_layout[0] = balancer_repack_plan(bal, st, cfg.repack_epsilon, min_stages,
                                                        repack_layout + 1);
            }
            world_bcast_ints(repack_layout, stages + 1);
            if (repack_layout[0] < stages) {
                engine_save(eng, cfg.ckpt_dir, cfg.keep, step + 1, saved, sizeof saved);
                if (dm_rank() == 0) {
                    write_next_world(cfg.ckpt_dir, repack_layout[0], grid->replicas,
                                     repack_layout + 1, step + 1, saved);
                    char next[256];
                    layout_format(next, sizeof next, repack_layout + 1, repack_layout[0]);
                    dm_log("repack: step %d: %d stages keep the predicted step time within "
                           "%.0f%%: checkpoint %s, next world %d ranks (pp %d x dp %d, layout "
                           "%s) in %s/next_world; exiting with status 3\n",
                           step + 1, repack_layout[0], 100 * cfg.repack_epsilon, saved,
                           repack_layout[0] * grid->replicas, repack_layout[0], grid->replicas,
                           next, cfg.ckpt_dir);
                }
                exit_status = DM_EXIT_REPACK;
                break;
            }
        }
        if (cfg.ckpt_dir[0] && cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0 &&
            step + 1 < cfg.steps) {
            engine_save(eng, cfg.ckpt_dir, cfg.keep, step + 1, saved, sizeof saved);
            dm_log("checkpoint: %s\n", saved);
        }
        if (cfg.ckpt_dir[0] && step + 1 == cfg.steps) {
            engine_save(eng, cfg.ckpt_dir, cfg.keep, step + 1, saved, sizeof saved);
            dm_log("checkpoint: %s (final)\n", saved);
        }
    }
    dm_free(repack_layout);
    double wall = dm_now() - run_start;
    if (dm_rank() == 0) {
        runlog_close(log);
        int steps_run = steps_done - (int)start_step;
        double mean_ms = timed_steps ? timed_ms / timed_steps
                                     : wall * 1e3 / (steps_run ? steps_run : 1);
        if (stages > 1) stage_totals_print(&totals, stages);
        dm_log("\nsummary: %d steps (%ld to %d) in %.1f s on %d ranks\n", steps_run,
               start_step + (steps_run > 0), steps_done, wall, dm_world_size());
        if (steps_run == 0) {
            dm_log("  nothing to train: the run was already at step %ld of train.steps = %d\n",
                   start_step, cfg.steps);
        } else {
            dm_log("  loss: %.4f at the first step, %.4f at the last\n", first_loss, last_loss);
            if (have_val) dm_log("  validation loss: %.4f\n", last_val);
            dm_log("  throughput: %.0f tokens/s (%.1f ms/step%s)\n",
                   tokens_per_step / mean_ms * 1e3, mean_ms,
                   timed_steps ? ", steps after the first" : "");
        }
        dm_log("  peak memory: %.0f MiB resident on rank 0\n",
               (double)dm_peak_rss_bytes() / 1048576.0);
        dm_log("  run log: %s\n", log_path);
    }
    dm_free(totals.compute_max);
    dm_free(totals.compute_min);
    dm_free(totals.wait_sum);
    dm_free(totals.compute_sum);
    balancer_destroy(bal);
    dm_free(share_group);
    dm_free(share_cores);
    engine_destroy(eng);
    loader_free(&train_loader);
    token_file_close(&train_file);
    if (have_val) {
        loader_free(&val_loader);
        token_file_close(&val_file);
    }
    dm_threads_shutdown();
    world_finalize();
    return exit_status;
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

/* bench --migration: on 2 stages, moves all but one block from stage 0 to
 * stage 1 and back, `reps` times each way, and compares the bytes per
 * second of block migration with plain MPI messages of the same size. */
static int bench_migration(struct engine *eng, const struct dm_config *cfg, int reps)
{
    if (cfg->pp != 2 || dm_world_size() != 2)
        dm_user_error("bench --migration needs 2 ranks and parallel.pp=2 (mpiexec -n 2)");
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
    struct block probe;
    struct gpt_shape shape = gpt_shape_from_config(cfg);
    block_init(&probe, 0, &shape, cfg->seed);
    size_t block_bytes = block_pack_size(&probe);
    block_free(&probe);
    bytes = 2.0 * reps * (L - 2) * (double)block_bytes;
    double raw = world_transfer_rate((size_t)(L - 2) * block_bytes, reps);
    dm_log("bench --migration: %d blocks of %.2f MB each way, %d round trips\n", L - 2,
           block_bytes / 1e6, reps);
    dm_log("bench --migration: block migration %.0f MB/s (header, slabs sent straight, "
           "new block arrays and buffers); plain MPI send of the same bytes %.0f MB/s; ratio %.0f%%\n",
           bytes / seconds / 1e6, raw / 1e6, 100 * (bytes / seconds) / raw);
    return DM_EXIT_OK;
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
    parse_train_args(argc, argv, &cfg, &args, 1);
    int threads = threads_for_this_rank(&cfg);
    dm_threads_init(threads);
    /* One fixed batch of random tokens from the seed, served through an
     * in-memory token file so the engine loads it like any data. */
    struct token_file tf;
    memset(&tf, 0, sizeof tf);
    snprintf(tf.path, sizeof tf.path, "(random tokens)");
    tf.vocab = (uint32_t)cfg.vocab;
    tf.count = (uint64_t)cfg.batch * cfg.seq + 1;
    uint16_t *tokens = dm_alloc(tf.count * sizeof(uint16_t));
    for (uint64_t i = 0; i < tf.count; i++)
        tokens[i] = (uint16_t)(dm_hash64(cfg.seed, 1, i) % (uint64_t)cfg.vocab);
    tf.tokens = tokens;
    struct loader ld;
    loader_init(&ld, &tf, cfg.seq, cfg.seed);
    struct engine *eng = engine_create(&cfg, 0);
    if (args.migration) {
        int code = bench_migration(eng, &cfg, args.timed_steps);
        engine_destroy(eng);
        loader_free(&ld);
        dm_free(tokens);
        dm_threads_shutdown();
        world_finalize();
        return code;
    }

    int total = args.warmup_steps + args.timed_steps;
    double *ms = dm_alloc((size_t)total * sizeof *ms);
    float first_loss = 0, last_loss = 0;
    double bubble = 0, imbalance = 0;
    int S = cfg.pp, L = cfg.layers;
    double *stage_ms = dm_alloc((size_t)S * sizeof(double));
    double *stage_fwd = dm_alloc((size_t)S * sizeof(double));
    double *stage_bwd = dm_alloc((size_t)S * sizeof(double));
    double *layer_fwd = dm_alloc((size_t)L * sizeof(double));
    double *layer_bwd = dm_alloc((size_t)L * sizeof(double));
    for (int s = 0; s < total; s++) {
        /* Step 0 of the schedule every time: the same batch, so the loss
         * must fall (the correctness guard below). */
        const struct step_stats *st = engine_step(eng, &ld, 0);
        ms[s] = st->step_ms;
        if (s == 0) first_loss = st->loss;
        last_loss = st->loss;
        if (s >= args.warmup_steps && dm_rank() == 0) {
            bubble += st->bubble_ratio / args.timed_steps;
            imbalance += st->imbalance / args.timed_steps;
            for (int k = 0; k < S; k++) stage_ms[k] += st->stage_compute_ms[k] / args.timed_steps;
            for (int l = 0; l < L; l++) {
                layer_fwd[l] += st->layer_fwd_ms[l];
                layer_bwd[l] += st->layer_bwd_ms[l];
            }
        }
        dm_log("bench step %d/%d: %.1f ms%s\n", s + 1, total, ms[s],
               s < args.warmup_steps ? " (warm-up)" : "");
    }
    int ok = 1;
    if (dm_rank() == 0) {
        qsort(ms + args.warmup_steps, (size_t)args.timed_steps, sizeof *ms, compare_double);
        double median = ms[args.warmup_steps + args.timed_steps / 2];
        if (args.timed_steps % 2 == 0)
            median = 0.5 * (median + ms[args.warmup_steps + args.timed_steps / 2 - 1]);
        double tokens_n = (double)cfg.batch * cfg.seq;
        ok = isfinite(last_loss) && last_loss < first_loss;
        dm_log("bench: %d layers x %d channels, batch %d x %d in %d micro-batches, %d ranks "
               "(pp %d x dp %d), %d threads per rank\n",
               cfg.layers, cfg.channels, cfg.batch, cfg.seq, cfg.micro_batches,
               dm_world_size(), cfg.pp, cfg.dp, threads);
        dm_log("bench: median %.1f ms/step over %d steps (after %d warm-up), %.0f tokens/s, "
               "%.1f GFLOP/s, peak RSS %.0f MiB (rank 0)\n",
               median, args.timed_steps, args.warmup_steps, tokens_n / median * 1e3,
               step_flops(&cfg) / median / 1e6, (double)dm_peak_rss_bytes() / 1048576.0);
        if (dm_world_size() > 1) {
            dm_log("bench: bubble %.1f%%, imbalance %.3f (means over the timed steps)\n",
                   100 * bubble, imbalance);
            /* The schedule's bound: each stage's measured compute per
             * micro-batch (split into forward and backward in its blocks'
             * proportion), simulated with zero communication and no waiting. */
            const int *layout = engine_layout(eng);
            for (int k = 0, b = 0; k < S; k++) {
                double f = 0, w = 0;
                for (int j = 0; j < layout[k]; j++, b++) {
                    f += layer_fwd[b];
                    w += layer_fwd[b] + layer_bwd[b];
                }
                double per_mb = stage_ms[k] / cfg.micro_batches;
                stage_fwd[k] = w > 0 ? per_mb * f / w : per_mb / 3;
                stage_bwd[k] = per_mb - stage_fwd[k];
            }
            struct balance_prediction pred;
            char err[256];
            if (balance_predict_stages(stage_fwd, stage_bwd, S, cfg.micro_batches,
                                       config_schedule(&cfg), &pred, err, sizeof err) == 0)
                dm_log("bench: %s bound from the measured stage compute: %.1f ms/step "
                       "(bubble %.1f%%); measured median is %.1f%% above it\n",
                       cfg.schedule, pred.step_ms, 100 * pred.bubble_ratio,
                       100 * (median / pred.step_ms - 1));
        }
        dm_log("bench: loss %.4f -> %.4f on a fixed batch: %s\n", first_loss, last_loss,
               ok ? "ok" : "WRONG (the loss did not fall)");
    }
    dm_free(ms);
    dm_free(stage_ms);
    dm_free(stage_fwd);
    dm_free(stage_bwd);
    dm_free(layer_fwd);
    dm_free(layer_bwd);
    engine_destroy(eng);
    loader_free(&ld);
    dm_free(tokens);
    dm_threads_shutdown();
    world_finalize();
    return ok ? DM_EXIT_OK : DM_EXIT_INTERNAL;
}
