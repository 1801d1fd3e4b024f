/* `dynmo train`: the training loop around the pipeline engine (one rank is
 * a pipeline of one stage). It reads as set-up, the step loop, the policy
 * at each step's end (a signal, a re-pack, a checkpoint), and the report.
 *
 * A step runs the stage's schedule (micro-batches forward and backward,
 * gradients accumulated), reduces gradients, clips by the global norm and
 * takes one AdamW step; rank 0 logs it. Everything that decides the
 * numbers (weights, data order, reduction orders) depends only on the
 * config and seed, so the loss is bit-identical run after run and for
 * every layout. The pieces live in train_setup.c, train_log.c,
 * train_balance.c and train_ckpt.c; this file only orchestrates them. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"
#include "dynmo/tools.h"
#include "dynmo/world.h"
#include "tools/train/train.h"

/* SIGUSR1, SIGTERM, SIGINT: stop at the next step boundary, with a
 * checkpoint (exit 75: resubmit unchanged) when there is a ckpt.dir, and
 * otherwise with 128 + the signal, as a shell reports a process the signal
 * ended (a job chain must not resubmit a run that saved nothing). The
 * handler only records the signal; the engine folds it into every step's
 * global reduction so all ranks stop at the same step. */
static volatile int stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
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
    sigaction(SIGINT, &sa, NULL);
}

static void print_usage_train(void)
{
    printf("usage: dynmo train --config FILE [section.key=value ...]\n"
           "Trains the GPT the config describes; writes <run.out_dir>/runlog.h5.\n"
           "Sections: model, train, data, run (docs/config.md lists every key).\n");
}

/* Everything one training run holds. */
struct trainer {
    struct dm_config cfg;
    int threads, stages;
    struct train_data data;
    struct engine *eng;
    struct train_balancer *balancer;
    struct layout_history history;
    struct runlog *log;             /* rank 0 */
    int log_width;                  /* per-stage columns of the run log */
    char log_path[1200];
    long start_step;
    int steps_done;
    double t_start, t_built, t_loaded, run_start;
    /* the report (rank 0) */
    double first_loss, last_loss, last_val, timed_ms;
    int timed_steps;
    struct stage_totals totals;
};

/* Collective: config, data, engine, balancer, resume, run log. */
static void train_setup(struct trainer *tr, int argc, char **argv)
{
    struct dm_config *cfg = &tr->cfg;
    struct train_args args;
    train_parse_args(argc, argv, cfg, &args, 0);
    train_open_backend(cfg);
    tr->threads = train_threads_for_rank(cfg);
    dm_threads_init(tr->threads);
    train_open_data(&tr->data, cfg);
    train_check_paths(cfg);

    struct pipe_grid grid;
    pipe_grid_init(&grid, cfg->pp, cfg->dp);   /* its error comes before the layout's */
    int S = tr->stages = grid.stages;
    int V = S * cfg->virtual_stages;   /* interleaved: v chunks a stage, else V = S */
    int *layout = dm_alloc((size_t)V * sizeof(int));
    train_initial_layout(layout, cfg, V);
    train_check_units(cfg);
    int *per_stage = dm_alloc((size_t)S * sizeof(int));   /* a stage's chunks together */
    for (int c = 0; c < V; c++) per_stage[c % S] += layout[c];
    train_check_memory(cfg, per_stage, S);
    tr->eng = engine_create(cfg, layout, train_may_resume(cfg));
    layout_history_init(&tr->history, train_unit_count(cfg));
    layout_history_push(&tr->history, 0, per_stage, S);
    dm_free(layout);
    dm_free(per_stage);
    tr->balancer = train_balancer_create(cfg, S);
    engine_watch_flag(tr->eng, &stop_signal);
    tr->t_built = dm_now();
    tr->start_step = train_resume(tr->eng, cfg, tr->data.train_file.checksum,
                                  &tr->history);
    tr->steps_done = (int)tr->start_step;
    tr->t_loaded = dm_now();

    snprintf(tr->log_path, sizeof tr->log_path, "%s/" RUNLOG_FILE_NAME, cfg->out_dir);
    tr->log_width = S;
    if (dm_rank() == 0)
        tr->log = train_open_runlog(tr->log_path, cfg, tr->start_step, S, &tr->log_width);
    struct gpt_shape shape = dyn_shape_from_config(cfg);
    char text[256];
    layout_format(text, sizeof text, engine_chunk_layout(tr->eng), V);
    dm_log("dynmo %s: %d layers x %d channels, %d heads, %.2fM parameters; batch %d x %d "
           "tokens in %d micro-batches; %d ranks (pp %d x dp %d, %s, layout %s); %d threads "
           "per rank\n",
           DYNMO_VERSION, shape.layers, shape.channels, shape.heads,
           (double)gpt_param_count(&shape) / 1e6, cfg->batch, cfg->seq, cfg->micro_batches,
           dm_world_size(), S, grid.replicas, cfg->schedule, text, tr->threads);
    train_balancer_share_processors(tr->balancer, cfg, tr->threads, tr->log);
    tr->first_loss = tr->last_loss = tr->last_val = NAN;
    stage_totals_init(&tr->totals, S);
    dm_startup_done();   /* from here on what the run made is the run's */
}

/* Rank 0: the step's rows and line, and what the report needs of it. */
static void record_step(struct trainer *tr, const struct step_stats *st, int step)
{
    if (step == tr->start_step) tr->first_loss = st->loss;
    tr->last_loss = st->loss;
    if (step > tr->start_step) {   /* the first step pays page faults and warm-up */
        tr->timed_ms += st->step_ms;
        tr->timed_steps++;
        stage_totals_add(&tr->totals, st, tr->stages);
    }
    double tokens_per_step = (double)tr->cfg.batch * tr->cfg.seq;
    train_log_step(tr->log, &tr->cfg, step, st, tokens_per_step,
                   tr->timed_steps ? tr->timed_ms / tr->timed_steps : st->step_ms, tr->stages,
                   tr->log_width);
}

/* Collective: the validation pass when one is due after step `step`. */
static void evaluate(struct trainer *tr, int step)
{
    const struct dm_config *cfg = &tr->cfg;
    if (!tr->data.have_val || ((step + 1) % cfg->eval_every != 0 && step + 1 != cfg->steps))
        return;
    tr->last_val = engine_eval(tr->eng, &tr->data.val);
    if (dm_rank() != 0) return;
    runlog_append_int_scalar(tr->log, RUNLOG_EVAL_STEP, step + 1);
    runlog_append_scalar(tr->log, RUNLOG_EVAL_LOSS, (float)tr->last_val);
    if ((step + 1) % cfg->log_every == 0 || step + 1 == cfg->steps)
        dm_log(" | val %.4f", tr->last_val);
}

/* Collective: a checkpoint of the running job after `steps` steps. */
static void save(struct trainer *tr, long steps, char *path, size_t path_size)
{
    train_save(tr->eng, &tr->cfg, tr->data.train_file.checksum, &tr->history, steps, path,
               path_size);
}

/* Collective: re-pack when fewer stages keep the predicted step time
 * within (1 + epsilon): checkpoint, describe the next world, return 1. */
static int repack(struct trainer *tr, const struct step_stats *st, int step)
{
    const struct dm_config *cfg = &tr->cfg;
    const struct pipe_grid *grid = engine_grid(tr->eng);
    int S = tr->stages;
    int *plan = dm_alloc((size_t)(S + 1) * sizeof(int));   /* stages, then the layout */
    if (dm_rank() == 0) {
        int min_stages = (cfg->repack_min_ranks + grid->replicas - 1) / grid->replicas;
        plan[0] = train_balancer_repack(tr->balancer, st, cfg->repack_epsilon, min_stages,
                                        plan + 1);
    }
    world_bcast_ints(plan, S + 1);
    int shrinks = plan[0] < S;
    if (shrinks) {
        char saved[1200];
        save(tr, step + 1, saved, sizeof saved);
        if (dm_rank() == 0) {
            char err[1024];
            if (ckpt_write_next_world(cfg->ckpt_dir, plan[0], grid->replicas, plan + 1,
                                      step + 1, err, sizeof err) != 0)
                dm_user_error_local("%s", err);
            char next[256];
            layout_format(next, sizeof next, plan + 1, plan[0]);
            dm_log("repack: step %d: %d stages keep the predicted step time within "
                   "%.0f%%: checkpoint %s, next world %d ranks (pp %d x dp %d, layout "
                   "%s) in %s/next_world; exiting with status 3\n",
                   step + 1, plan[0], 100 * cfg->repack_epsilon, saved,
                   plan[0] * grid->replicas, plan[0], grid->replicas, next, cfg->ckpt_dir);
        }
    }
    dm_free(plan);
    return shrinks;
}

/* Collective, after step `step`: a signal ends the run with a checkpoint
 * (75), a re-pack with one and the next world (3); otherwise a periodic
 * or final checkpoint. Returns -1 to go on, or the exit status. */
static int end_of_step(struct trainer *tr, const struct step_stats *st, int step)
{
    const struct dm_config *cfg = &tr->cfg;
    char saved[1200];
    if (st->stop_requested) {
        if (cfg->ckpt_dir[0]) {
            save(tr, step + 1, saved, sizeof saved);
            dm_log("signal: checkpoint %s written at step %d; exiting with status 75\n", saved,
                   step + 1);
            return DM_EXIT_SIGNAL;
        }
        int sig = world_max_int(stop_signal);   /* the same status on every rank */
        dm_log("signal: %s at step %d and no ckpt.dir: stopping without a checkpoint; exiting "
               "with status %d\n", strsignal(sig), step + 1, 128 + sig);
        return 128 + sig;
    }
    if (cfg->repack_enable && (step + 1) % cfg->repack_every == 0 && step + 1 < cfg->steps &&
        repack(tr, st, step))
        return DM_EXIT_REPACK;
    if (!cfg->ckpt_dir[0]) return -1;
    if (cfg->ckpt_every > 0 && (step + 1) % cfg->ckpt_every == 0 && step + 1 < cfg->steps) {
        save(tr, step + 1, saved, sizeof saved);
        dm_log("checkpoint: %s\n", saved);
    }
    if (step + 1 == cfg->steps) {
        save(tr, step + 1, saved, sizeof saved);
        dm_log("checkpoint: %s (final)\n", saved);
    }
    return -1;
}

/* Collective: runs the steps from the resumed one; returns the status. */
static int train_loop(struct trainer *tr)
{
    const struct dm_config *cfg = &tr->cfg;
    tr->run_start = dm_now();
    for (int step = (int)tr->start_step; step < cfg->steps; step++) {
        const struct step_stats *st = engine_step(tr->eng, &tr->data.train, step);
        tr->steps_done = step + 1;
        if (step == tr->start_step && tr->start_step > 0)
            dm_log("restart: start-up %.2f s (MPI, config, data, model), checkpoint read and "
                   "reshard %.2f s, first step %.2f s: %.2f s from launch to the end of the "
                   "first step\n", tr->t_built - tr->t_start, tr->t_loaded - tr->t_built,
                   dm_now() - tr->t_loaded, dm_now() - tr->t_start);
        if (dm_rank() == 0) record_step(tr, st, step);
        evaluate(tr, step);
        if (dm_rank() == 0) {
            if ((step + 1) % cfg->log_every == 0 || step + 1 == cfg->steps) dm_log("\n");
            runlog_flush(tr->log);
            if (!isfinite(st->loss))
                dm_user_error_local("step %d: the loss is not finite; lower train.lr (now %g) "
                                    "or check the data", step + 1, cfg->lr);
        }
        engine_after_step(tr->eng, step);
        train_balancer_after_step(tr->balancer, tr->eng, tr->log, st, step);
        layout_history_push(&tr->history, step + 1, engine_layout(tr->eng), tr->stages);
        int status = end_of_step(tr, st, step);
        if (status >= 0) return status;
    }
    return DM_EXIT_OK;
}

/* Rank 0: the per-stage table and the summary. */
static void report(const struct trainer *tr)
{
    const struct dm_config *cfg = &tr->cfg;
    double wall = dm_now() - tr->run_start;
    int steps_run = tr->steps_done - (int)tr->start_step;
    double mean_ms = tr->timed_steps ? tr->timed_ms / tr->timed_steps
                                     : wall * 1e3 / (steps_run ? steps_run : 1);
    if (tr->stages > 1) stage_totals_print(&tr->totals, tr->stages);
    dm_log("\nsummary: %d steps (%ld to %d) in %.1f s on %d ranks\n", steps_run,
           tr->start_step + (steps_run > 0), tr->steps_done, wall, dm_world_size());
    if (steps_run == 0) {
        dm_log("  nothing to train: the run was already at step %ld of train.steps = %d\n",
               tr->start_step, cfg->steps);
    } else {
        dm_log("  loss: %.4f at the first step, %.4f at the last\n", tr->first_loss,
               tr->last_loss);
        if (tr->data.have_val && isfinite(tr->last_val))
            dm_log("  validation loss: %.4f\n", tr->last_val);
        else if (tr->data.have_val)
            dm_log("  validation loss: none yet (every %d steps: train.eval_every)\n",
                   cfg->eval_every);
        dm_log("  throughput: %.0f tokens/s (%.1f ms/step%s)\n",
               (double)cfg->batch * cfg->seq / mean_ms * 1e3, mean_ms,
               tr->timed_steps ? ", steps after the first" : "");
    }
    dm_log("  peak memory: %.0f MiB resident on rank 0\n",
           (double)dm_peak_rss_bytes() / 1048576.0);
    dm_log("  run log: %s\n", tr->log_path);
}

static void train_teardown(struct trainer *tr)
{
    stage_totals_free(&tr->totals);
    layout_history_free(&tr->history);
    train_balancer_destroy(tr->balancer);
    engine_destroy(tr->eng);
    train_close_data(&tr->data);
    dm_threads_shutdown();
}

int cmd_train(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage_train();
            return DM_EXIT_OK;
        }
    struct trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.t_start = dm_now();
    install_signal_handlers();
    world_init(&argc, &argv);
    train_setup(&tr, argc, argv);
    int status = train_loop(&tr);
    if (dm_rank() == 0) {
        runlog_close(tr.log);
        report(&tr);
    }
    train_teardown(&tr);
    world_finalize(status);
    return status;
}
