/* `dynmo simulate`'s output: one file per policy shaped like a run log
 * (root attribute kind "simulation", the datasets of docs/runlog.md that
 * a simulation has, written through the run log's writer), so that `dynmo
 * inspect`, `dynmo report` and `dynmo plan`-style scripts read it, and the
 * summary table as text. All of it is written into a new directory beside
 * DIR and renamed into place: DIR is the whole new output, the previous
 * one, or absent, never half of one. A DIR holding files simulate does not
 * write is refused rather than replaced.
 *
 * Must not: compute anything (simulate_policy.c did), or write anywhere
 * but beside DIR. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/ckpt.h"
#include "tools/out_dir.h"
#include "tools/simulate/simulate.h"

#define PATH_BYTES (OUT_DIR_PATH_BYTES + 256)   /* a file in out_dir.tmp */

/* Step t's per-step and per-stage rows. */
static void write_step(struct runlog *log, const struct sim_setup *setup,
                       const struct sim_result *res, int t)
{
    const struct sim_step *st = &res->steps[t];
    long n = setup->blocks, S = setup->stages;
    runlog_append_scalar(log, RUNLOG_STEP_MS, (float)st->step_ms);
    runlog_append_scalar(log, RUNLOG_STEP_TOKENS_PER_S,
                         (float)(setup->tokens_per_step / (st->step_ms / 1e3)));
    runlog_append_scalar(log, RUNLOG_STEP_BUBBLE, (float)st->bubble);
    runlog_append_scalar(log, RUNLOG_STEP_IMBALANCE, (float)st->imbalance);
    runlog_append_int_scalar(log, RUNLOG_STEP_RANKS, st->stages * setup->replicas);
    runlog_append_scalar(log, "/steps/migrate_ms", (float)st->migrate_ms);
    runlog_append_row(log, RUNLOG_LAYER_FWD_MS, res->fwd + t * n, (int)n);
    runlog_append_row(log, RUNLOG_LAYER_BWD_MS, res->bwd + t * n, (int)n);
    runlog_append_row(log, RUNLOG_LAYER_UPDATE_MS, res->update + t * n, (int)n);
    const struct sim_trajectory *tr = setup->traj;
    float *row = dm_alloc((size_t)n * sizeof(float));
    for (int k = 0; k < sim_state_count(); k++) {   /* each under its signal's name */
        if (!tr->present[k]) continue;
        for (long u = 0; u < n; u++)   /* a unit has its block's state */
            row[u] = tr->value[k][t * tr->blocks + (setup->split ? u / 2 : u)];
        runlog_append_row(log, sim_state_signal(k)->cost_dataset, row, (int)n);
    }
    dm_free(row);
    runlog_append_int_row(log, RUNLOG_LAYOUT_HISTORY, res->layout + t * S, (int)S);
    runlog_append_row(log, RUNLOG_STAGE_BUSY_MS, res->busy + t * S, (int)S);
    runlog_append_row(log, RUNLOG_STAGE_IDLE_MS, res->idle + t * S, (int)S);
    runlog_append_row(log, RUNLOG_STAGE_UPDATE_MS, res->stage_update + t * S, (int)S);
}

/* DIR/<policy>.h5: the policy's simulated run, its configuration the
 * simulated model's with the policy's balance.method and initial layout. */
static void write_policy(const char *dir, const struct sim_setup *setup,
                         const struct sim_policy *policy, const struct sim_result *res)
{
    char path[PATH_BYTES + 64];
    snprintf(path, sizeof path, "%s/%s.h5", dir, policy->name);
    struct dm_config cfg = setup->cfg;
    snprintf(cfg.method, sizeof cfg.method, "%s", policy->method ? policy->method : "none");
    snprintf(cfg.initial, sizeof cfg.initial, "%s",
             policy->kind == SIM_STATIC_PARAMS ? "params" : "uniform");
    cfg.repack_enable = policy->kind == SIM_REPACK;
    cfg.repack_every = setup->repack_every;
    cfg.repack_epsilon = setup->repack_epsilon;
    struct runlog *log = runlog_create_kind(path, &cfg, SIMULATION_KIND);
    const struct balance_sharing *sh = setup->sharing;
    if (sh) runlog_set_sharing(log, sh->stages, sh->group, sh->groups, sh->cores, NULL, sh->turns);
    for (int t = 0; t < setup->steps; t++) write_step(log, setup, res, t);
    for (int d = 0; d < res->decision_count; d++)
        runlog_append_row(log, RUNLOG_BALANCE_DECISIONS,
                          res->decisions + (long)d * BALANCE_DECISION_COLUMNS,
                          BALANCE_DECISION_COLUMNS);
    runlog_close(log);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[PATH_BYTES + 64], err[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (dm_write_file_atomic(path, text, strlen(text), err, sizeof err) != 0)
        dm_user_error("simulate: %s", err);
}

#define SIM_OUT_DIR(run_dir) {.tool = "simulate", .what = "the simulation", \
                             .writer = "dynmo simulate", .inputs = &(run_dir), .input_count = 1}

void sim_check_output(const char *dir, const char *run_dir)
{
    struct out_dir o = SIM_OUT_DIR(run_dir);
    out_dir_check(&o, dir);
}

void sim_write_output(const char *dir, const char *run_dir, const struct sim_setup *setup,
                      const struct sim_policy *policies, const struct sim_result *results,
                      int count, const char *summary)
{
    struct out_dir o = SIM_OUT_DIR(run_dir);
    out_dir_begin(&o, dir);
    for (int i = 0; i < count; i++) write_policy(o.tmp, setup, &policies[i], &results[i]);
    write_text(o.tmp, "summary.txt", summary);
    out_dir_commit(&o);
}
