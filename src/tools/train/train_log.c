/* What `dynmo train` writes and prints (train.h): the run log's rows of
 * every step, the progress line, the per-stage table and the summary at
 * the end. Rank 0 only; nothing here decides anything. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"
#include "tools/train/train.h"


static void format_eta(char *buf, size_t size, double seconds)
{
    int s = (int)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%dh%02dm", s / 3600, (s % 3600) / 60);
    else if (s >= 60) snprintf(buf, size, "%dm%02ds", s / 60, s % 60);
    else snprintf(buf, size, "%ds", s);
}

/* One step line and the run-log rows of a step (rank 0). */
/* The step's scalars: one row each in /steps/. */
static void append_scalars(struct runlog *log, const struct step_stats *st,
                           double tokens_per_step)
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
}

/* One row of `n` values as float32 in dataset `name`. */
static void append_doubles(struct runlog *log, const char *name, const double *values, int n,
                           float *row)
{
    for (int k = 0; k < n; k++) row[k] = (float)values[k];
    runlog_append_row(log, name, row, n);
}

/* A per-stage row keeps the first world's width: NaN past a re-pack. */
static void append_stage_row(struct runlog *log, const char *name, const double *values,
                             int stages, int width, float *row)
{
    for (int s = 0; s < width; s++) row[s] = s < stages ? (float)values[s] : NAN;
    runlog_append_row(log, name, row, width);
}

/* Each signal's row (float32, or int32 where it declares so). */
static void append_signal_rows(struct runlog *log, const struct step_stats *st)
{
    for (int k = 0; k < st->signal_count; k++) {
        const struct dyn_signal_row *r = &st->signals[k];
        int n = r->columns;
        if (r->signal->is_int) {
            int *row = dm_alloc((size_t)(n ? n : 1) * sizeof(int));
            for (int c = 0; c < n; c++) row[c] = (int)r->values[c];
            runlog_append_int_row(log, r->signal->dataset, row, n);
            dm_free(row);
        } else {
            float *row = dm_alloc((size_t)(n ? n : 1) * sizeof(float));
            append_doubles(log, r->signal->dataset, r->values, n, row);
            dm_free(row);
        }
    }
}

/* The per-block, per-stage and trace rows of the step. */
static void append_rows(struct runlog *log, const struct dm_config *cfg,
                        const struct step_stats *st, int stages, int width)
{
    int L = cfg->layers, U = st->units, most = U > width ? U : width;
    float *row = dm_alloc((size_t)most * sizeof(float));
    append_doubles(log, RUNLOG_LAYER_FWD_MS, st->layer_fwd_ms, L, row);
    append_doubles(log, RUNLOG_LAYER_BWD_MS, st->layer_bwd_ms, L, row);
    if (schedule_splits_backward(config_schedule(cfg)))
        append_doubles(log, RUNLOG_LAYER_WGRAD_MS, st->layer_wgrad_ms, L, row);
    append_signal_rows(log, st);
    append_doubles(log, RUNLOG_LAYER_UPDATE_MS, st->layer_update_ms, L, row);
    if (U != L) {   /* balance.units = sublayer: the units apart */
        append_doubles(log, RUNLOG_UNIT_FWD_MS, st->unit_fwd_ms, U, row);
        append_doubles(log, RUNLOG_UNIT_BWD_MS, st->unit_bwd_ms, U, row);
        append_doubles(log, RUNLOG_UNIT_UPDATE_MS, st->unit_update_ms, U, row);
        if (schedule_splits_backward(config_schedule(cfg)))
            append_doubles(log, RUNLOG_UNIT_WGRAD_MS, st->unit_wgrad_ms, U, row);
    }
    append_stage_row(log, RUNLOG_STAGE_BUSY_MS, st->stage_compute_ms, stages, width, row);
    append_stage_row(log, RUNLOG_STAGE_IDLE_MS, st->stage_wait_ms, stages, width, row);
    append_stage_row(log, RUNLOG_STAGE_UPDATE_MS, st->stage_update_ms, stages, width, row);
    int *irow = dm_alloc((size_t)width * sizeof(int));
    for (int s = 0; s < width; s++) irow[s] = s < stages ? st->layout[s] : 0;
    runlog_append_int_row(log, RUNLOG_LAYOUT_HISTORY, irow, width);
    if (st->chunks) runlog_append_int_row(log, RUNLOG_LAYOUT_CHUNKS, st->chunk_layout, st->chunks);
    for (int r = 0; r < st->trace_rows; r++)
        runlog_append_row(log, RUNLOG_TRACE_EVENTS, st->trace + (size_t)r * STEP_TRACE_COLUMNS,
                          STEP_TRACE_COLUMNS);
    dm_free(row);
    dm_free(irow);
}

static void print_note(void *ctx, const char *note)
{
    (void)ctx;
    dm_log(" | %s", note);
}

void train_log_step(struct runlog *log, const struct dm_config *cfg, int step,
                    const struct step_stats *st, double tokens_per_step, double mean_ms,
                    int stages, int width)
{
    append_scalars(log, st, tokens_per_step);
    append_rows(log, cfg, st, stages, width);
    runlog_end_step(log);   /* a dataset this run does not write: a filler row */
    if ((step + 1) % cfg->log_every != 0 && step + 1 != cfg->steps) return;
    char eta[32];
    format_eta(eta, sizeof eta, mean_ms * (cfg->steps - step - 1) / 1e3);
    dm_log("step %d/%d | loss %.4f | lr %.2e | grad norm %.3f | %.0f ms | %.0f tok/s | ETA %s",
           step + 1, cfg->steps, st->loss, st->lr, st->grad_norm, st->step_ms,
           tokens_per_step / st->step_ms * 1e3, eta);
    if (stages > 1)
        dm_log(" | bubble %.1f%% | imbalance %.2f", 100.0 * st->bubble_ratio, st->imbalance);
    if (st->dyn_text[0]) dm_log(" | %s", st->dyn_text);
    dyn_step_notes(cfg, st->signals, st->signal_count, tokens_per_step, print_note, NULL);
    if (st->migrated_blocks > 0) {
        char layout[256];
        layout_format(layout, sizeof layout, st->layout, stages);
        dm_log(" | migrated %d %s, %.1f MB, %.0f ms -> %s", st->migrated_blocks,
               strcmp(cfg->units, "sublayer") ? "blocks" : "units", st->migrated_bytes / 1e6,
               st->migrate_ms, layout);
    }
}

/* The end-of-run table: per stage, compute max / min over the logged
 * steps and their ratio, total wait and mean bubble (STYLE.md: the
 * max/min ratio is the product). */
void stage_totals_init(struct stage_totals *t, int stages)
{
    memset(t, 0, sizeof *t);
    t->compute_max = dm_alloc((size_t)stages * sizeof(double));
    t->compute_min = dm_alloc((size_t)stages * sizeof(double));
    t->wait_sum = dm_alloc((size_t)stages * sizeof(double));
    t->compute_sum = dm_alloc((size_t)stages * sizeof(double));
}

void stage_totals_free(struct stage_totals *t)
{
    dm_free(t->compute_max);
    dm_free(t->compute_min);
    dm_free(t->wait_sum);
    dm_free(t->compute_sum);
}


void stage_totals_add(struct stage_totals *t, const struct step_stats *st, int stages)
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


void stage_totals_print(const struct stage_totals *t, int stages)
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

/* The run log continues across restarts: every per-step dataset is cut back
 * to the resumed step or filled up to it (runlog_resume_at), the trace to
 * its rows of steps up to it, the evaluations to theirs; per-stage datasets
 * are as wide as the most stages any segment had. */
struct runlog *train_open_runlog(const char *path, const struct dm_config *cfg, long start,
                                  int stages, int *width)
{
    *width = stages;
    char err[1200];
    if (dm_make_dirs(cfg->out_dir, err, sizeof err) != 0) dm_user_error_local("%s", err);
    if (start == 0 || access(path, F_OK) != 0) {
        int is_new = access(path, F_OK) != 0;
        struct runlog *log = runlog_create(path, cfg);
        if (is_new) dm_startup_created_file(path);   /* gone again if start-up fails */
        runlog_resume_at(log, start);   /* a new run.out_dir: filler for the steps before */
        return log;
    }
    int ncols = 0;
    float *trace = NULL;   /* rows in step order; column 0 is the 1-based step */
    long trace_rows = runlog_read_matrix(path, RUNLOG_TRACE_EVENTS, &trace, &ncols, err,
                                         sizeof err), trace_keep = 0;
    while (trace_keep < trace_rows && trace[trace_keep * ncols] <= (float)start) trace_keep++;
    dm_free(trace);
    struct runlog *log = runlog_open_append(path);
    if (trace_rows > trace_keep) runlog_truncate(log, RUNLOG_TRACE_EVENTS, trace_keep);
    runlog_resume_at(log, start);
    long evals = cfg->eval_every > 0 ? start / cfg->eval_every : 0;
    if (runlog_rows(log, RUNLOG_EVAL_STEP) > evals) {
        runlog_truncate(log, RUNLOG_EVAL_STEP, evals);
        runlog_truncate(log, RUNLOG_EVAL_LOSS, evals);
    }
    return log;
}

