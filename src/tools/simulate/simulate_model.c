/* `dynmo simulate`'s inputs: a run log read whole (its configuration,
 * per-block and per-stage times, layouts, the blocks' dynamic state and
 * the processor sharing), the cost model fitted to it (each block's
 * forward, backward and update time as a function of its state, least
 * squares over every step and block), and the trajectory of the states,
 * from the run mapped by relative depth and time or from a scenario file.
 *
 * The fit stays here, beside balance/predict.c rather than in it: the
 * predictor prices a layout from the costs a running job measured at its
 * current states (pure, online, no files), while this fits cost as a
 * function of state over a whole run log to extrapolate to other shapes
 * and trajectories; it reads run logs, which the balance module, below
 * ckpt, must not.
 *
 * Must not: write anything, or go on past a missing dataset the model
 * needs or a bad scenario (a user error naming the file, exit 2). It reads
 * run logs through the ckpt module's readers only. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "tools/plan/plan.h"
#include "tools/simulate/simulate.h"

static const char *const state_names[SIM_STATE_COUNT] = {"active", "sparsity", "frozen",
                                                         "tiles", "mod_tokens", "moe_load"};
static const float state_neutral[SIM_STATE_COUNT] = {1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f};

const char *sim_state_name(int state)
{
    return state >= 0 && state < SIM_STATE_COUNT ? state_names[state] : "?";
}

float sim_state_neutral(int state)
{
    return state_neutral[state];
}

static void trajectory_alloc(struct sim_trajectory *t, int steps, int blocks)
{
    memset(t, 0, sizeof *t);
    t->steps = steps;
    t->blocks = blocks;
    size_t n = (size_t)steps * (size_t)blocks;
    for (int k = 0; k < SIM_STATE_COUNT; k++) {
        t->value[k] = dm_alloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) t->value[k][i] = state_neutral[k];
    }
}

void sim_check_size(long steps, long units)
{
    if (steps * units > SIM_MAX_CELLS)
        dm_user_error("simulate: %ld steps x %ld blocks is too large to simulate (at most "
                      "%ld block-steps)", steps, units, SIM_MAX_CELLS);
}

void sim_trajectory_neutral(struct sim_trajectory *t, const struct sim_trajectory *src)
{
    trajectory_alloc(t, src->steps, src->blocks);
    for (long i = 0; i < (long)src->steps * src->blocks; i++)
        t->value[SIM_MOE_LOAD][i] = src->value[SIM_MOE_LOAD][i] > 0 ? 1.0f : 0.0f;
}

void sim_trajectory_free(struct sim_trajectory *t)
{
    for (int k = 0; k < SIM_STATE_COUNT; k++) dm_free(t->value[k]);
    memset(t, 0, sizeof *t);
}

/* ---- the run log ---------------------------------------------------------- */

/* A problem with the run log: one message naming it, exit 2. */
__attribute__((noreturn, format(printf, 2, 3)))
static void run_error(struct runlog_file *f, const char *fmt, ...)
{
    char text[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    runlog_close_read(f);
    dm_user_error("simulate: %s", text);
}

/* A per-block (or per-stage) matrix of the run; required ones missing are
 * a user error, optional ones NULL. Rows beyond `rows` are ignored; fewer
 * are an error, as are columns other than `cols`. */
static float *read_blocks(const struct sim_run *run, struct runlog_file *f, const char *name,
                          long rows, int cols, int required)
{
    char err[1200];
    if (!runlog_file_dataset(f, name)) {
        if (required)
            run_error(f, "%s has no %s: a run log without per-block costs cannot drive a "
                      "simulation", run->path, name);
        return NULL;
    }
    float *values = NULL;
    int ncols = 0;
    long got = runlog_file_matrix(f, name, &values, &ncols, err, sizeof err);
    if (got < 0) run_error(f, "%s", err);
    if (got < rows || ncols != cols) {
        dm_free(values);
        run_error(f, "%s: %s has %ld rows of %d, expected %ld of %d", run->path, name, got,
                  ncols, rows, cols);
    }
    return values;
}

/* Keeps rows keep[0..count) of a (rows, cols) matrix, in place. */
static void keep_rows(float *m, int cols, const long *keep, int count)
{
    if (!m) return;
    for (int i = 0; i < count; i++)
        memmove(m + (size_t)i * cols, m + (size_t)keep[i] * cols, (size_t)cols * sizeof *m);
}

/* A measured time: finite and >= 0 (> 0 for a step). */
static int time_ok(float ms, int positive)
{
    return isfinite(ms) && (positive ? ms > 0 : ms >= 0);
}

/* The steps the run measured: a layout (a resumed run's log starts with
 * filler rows, which are left out) and a finite step time and block
 * costs; a measured row's times must be times (>= 0, the step's > 0). */
static int measured_steps(struct sim_run *run, struct runlog_file *f, long rows, long *keep)
{
    int count = 0;
    for (long r = 0; r < rows; r++) {
        int ok = run->layout_stages[r] > 0 && !isnan(run->step_ms[r]);
        for (int l = 0; ok && l < run->layers; l++)
            ok = !isnan(run->fwd[r * run->layers + l]) && !isnan(run->bwd[r * run->layers + l]);
        if (!ok) continue;
        if (!time_ok(run->step_ms[r], 1))
            run_error(f, "%s: %s at step %ld is %g ms", run->path, RUNLOG_STEP_MS, r + 1,
                      (double)run->step_ms[r]);
        for (int l = 0; l < run->layers; l++) {
            float fwd = run->fwd[r * run->layers + l], bwd = run->bwd[r * run->layers + l];
            float update = run->update ? run->update[r * run->layers + l] : 0.0f;
            if (!time_ok(fwd, 0) || !time_ok(bwd, 0) || !time_ok(update, 0))
                run_error(f, "%s: block %d at step %ld has forward %g, backward %g, update %g "
                          "ms (measured times are >= 0)", run->path, l, r + 1, (double)fwd,
                          (double)bwd, (double)update);
        }
        for (int s = 0; s < run->layout_stages[r]; s++) {
            float busy = run->busy[r * run->width + s];
            float update = run->stage_update ? run->stage_update[r * run->width + s] : 0.0f;
            if (!time_ok(busy, 0) || !time_ok(update, 0))
                run_error(f, "%s: stage %d at step %ld has busy %g, update %g ms (measured "
                          "times are >= 0)", run->path, s, r + 1, (double)busy, (double)update);
        }
        keep[count++] = r;
    }
    return count;
}

/* The layouts, each row a layout of model.layers blocks or a filler row
 * (runlog_file_layouts), at least as many rows as the step times. */
static void read_layouts(struct sim_run *run, struct runlog_file *f, long rows)
{
    char err[1200];
    struct runlog_layouts l;
    if (runlog_file_layouts(f, run->layers, &l, err, sizeof err) < 0) run_error(f, "%s", err);
    run->layout = l.counts;
    run->layout_stages = l.stages;
    run->width = l.width;
    if (l.rows < rows)
        run_error(f, "%s: %s has %ld rows, %s %ld", run->path, RUNLOG_LAYOUT_HISTORY, l.rows,
                  RUNLOG_STEP_MS, rows);
}

/* The layer of each of the blocks that carry signal's columns in run's
 * model (the scheme's own rule, dyn_signal_layer), into layer (at most
 * max); returns how many. */
static int carrier_layers(const struct sim_run *run, const char *dataset, int *layer, int max)
{
    const struct dyn_signal *signal = dyn_signal_of_dataset(dataset);
    struct gpt_shape shape = dyn_shape_from_config(&run->cfg);
    int n = 0;
    for (int l = 0; signal && l < run->layers && n < max; l++)
        if (dyn_signal_layer(signal, &shape, l)) layer[n++] = l;
    return n;
}

/* Each MoD block's share of the step's tokens (/mod/tokens counts them
 * over the micro-batches and replicas, against batch x seq), the other
 * blocks 1; a validation pass counts into the next step, so the share is
 * capped at 1. NULL without MoD blocks. */
static float *mod_shares(const struct sim_run *run, struct runlog_file *f, long rows)
{
    int L = run->layers, *layer = dm_alloc((size_t)L * sizeof(int));
    int blocks = carrier_layers(run, "/mod/tokens", layer, L);
    if (!blocks || !runlog_file_dataset(f, "/mod/tokens")) {
        dm_free(layer);
        return NULL;
    }
    float *tokens = read_blocks(run, f, "/mod/tokens", rows, blocks, 0);
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    double per_step = (double)run->cfg.batch * run->cfg.seq;
    for (long i = 0; i < rows * L; i++) m[i] = 1.0f;
    for (long r = 0; r < rows; r++)
        for (int j = 0; j < blocks; j++)
            m[r * L + layer[j]] = (float)fmin(1.0, tokens[r * blocks + j] / per_step);
    dm_free(layer);
    dm_free(tokens);
    return m;
}

/* The MoE blocks' busiest expert rank as the run measured it
 * (/moe/rank_load, parallel.ep > 1: over every expert group), spread onto
 * the layers (dense blocks 0). */
static float *moe_rank_loads(const struct sim_run *run, struct runlog_file *f, long rows,
                             const int *layer, int blocks)
{
    int L = run->layers;
    float *load = read_blocks(run, f, "/moe/rank_load", rows, blocks, 1);
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    for (long i = 0; i < rows * L; i++) m[i] = 0.0f;
    for (long r = 0; r < rows; r++)
        for (int j = 0; j < blocks; j++) {
            float g = load[r * blocks + j];
            if (!(g >= 0.0f && g <= SIM_MAX_MOE_LOAD)) {
                dm_free(load);
                dm_free(m);
                run_error(f, "%s: %s[%ld][%d] is %g (must be in [0, %g])", run->path,
                          "/moe/rank_load", r, j, g, SIM_MAX_MOE_LOAD);
            }
            m[r * L + layer[j]] = g > 0.0f ? g : 1.0f;
        }
    dm_free(load);
    return m;
}

/* An MoE block's busiest expert rank over the step. A run with its
 * experts split over ranks records it (/moe/rank_load, moe_rank_loads);
 * older logs are priced from the counts: expert e is on rank e / (E / ep)
 * of its group (docs/moe.md), a rank's load is the pairs its experts kept
 * (routed - dropped), and the state is the busiest rank's over routed /
 * ep (with ep = 1 the kept share; dropless, busiest over mean), the
 * counts summed over the expert groups. Dense blocks 0. NULL without MoE
 * blocks. A step's counts (not a filler row of -1) have 0 <= dropped <=
 * routed. */
static float *moe_counted_loads(const struct sim_run *run, struct runlog_file *f, long rows,
                                const int *layer, int blocks);

static float *moe_loads(const struct sim_run *run, struct runlog_file *f, long rows)
{
    int L = run->layers, ep = run->cfg.ep;
    int *layer = dm_alloc((size_t)L * sizeof(int));
    int blocks = carrier_layers(run, "/moe/tokens", layer, L);
    float *m = NULL;
    if (blocks && ep > 1 && runlog_file_dataset(f, "/moe/rank_load"))
        m = moe_rank_loads(run, f, rows, layer, blocks);
    else if (blocks && runlog_file_dataset(f, "/moe/tokens"))
        m = moe_counted_loads(run, f, rows, layer, blocks);
    dm_free(layer);
    return m;
}

/* moe_loads from the counts: blocks MoE blocks at layer[]. */
static float *moe_counted_loads(const struct sim_run *run, struct runlog_file *f, long rows,
                                const int *layer, int blocks)
{
    char err[1200];
    int L = run->layers, E = run->cfg.experts, ep = run->cfg.ep, cols = 0, dcols = 0;
    int *routed = NULL, *dropped = NULL;
    long got = runlog_file_int_matrix(f, "/moe/tokens", &routed, &cols, err, sizeof err);
    if (got < 0) run_error(f, "%s", err);
    if (got < rows || cols != blocks * E) {
        dm_free(routed);
        run_error(f, "%s: %s has %ld rows of %d, expected %ld of %d", run->path,
                  "/moe/tokens", got, cols, rows, blocks * E);
    }
    if (runlog_file_dataset(f, "/moe/dropped") &&
        (runlog_file_int_matrix(f, "/moe/dropped", &dropped, &dcols, err, sizeof err) < rows ||
         dcols != cols)) {
        dm_free(routed);
        dm_free(dropped);
        run_error(f, "%s: %s does not match %s", run->path, "/moe/dropped",
                  "/moe/tokens");
    }
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    for (long i = 0; i < rows * L; i++) m[i] = 0.0f;
    for (long r = 0; r < rows; r++) {
        if (routed[r * cols] < 0) {   /* a step this log does not hold */
            for (int l = 0; l < L; l++) m[r * L + l] = NAN;
            continue;
        }
        for (int j = 0; j < blocks; j++) {
            const int *c = routed + r * cols + (long)j * E;
            const int *d = dropped ? dropped + r * cols + (long)j * E : NULL;
            double total = 0, busiest = 0, rank = 0;
            for (int e = 0; e < E; e++) {
                if (c[e] < 0 || (d && (d[e] < 0 || d[e] > c[e]))) {
                    int pairs = c[e], lost = d ? d[e] : 0;
                    dm_free(routed);
                    dm_free(dropped);
                    dm_free(m);
                    run_error(f, "%s: at step %ld expert %d of MoE block %d routed %d and "
                              "dropped %d pairs (need 0 <= dropped <= routed)", run->path,
                              r + 1, e, j, pairs, lost);
                }
                total += c[e];
                rank += c[e] - (d ? d[e] : 0);
                if ((e + 1) % (E / ep) == 0) { busiest = fmax(busiest, rank); rank = 0; }
            }
            m[r * L + layer[j]] = total > 0 ? (float)(busiest * ep / total) : 1.0f;
        }
    }
    dm_free(routed);
    dm_free(dropped);
    return m;
}

/* One state's (rows, layers) matrix as the log records it, or NULL. */
static float *state_matrix(struct sim_run *run, struct runlog_file *f, long rows, int k)
{
    static const char *const names[SIM_STATE_COUNT] = {"/layers/active",
        "/layers/sparsity", NULL, "/hash/tiles", NULL, NULL};
    int L = run->layers;
    if (names[k]) return read_blocks(run, f, names[k], rows, L, 0);
    if (k == SIM_MOD_TOKENS) return mod_shares(run, f, rows);
    if (k == SIM_MOE_LOAD) return moe_loads(run, f, rows);
    if (strcmp(run->cfg.dyn_kind, "freeze") || !run->update) return NULL;
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    for (long i = 0; i < rows * L; i++) m[i] = run->update[i] == 0.0f;
    return m;
}

/* The range a state of a measured step must be in. */
static int state_ok(int k, float v)
{
    static const float high[SIM_STATE_COUNT] = {1, 1, 1, 1e30f, 1, SIM_MAX_MOE_LOAD};
    return v >= 0.0f && v <= high[k];
}

/* The block states the log records: /layers/active, /layers/sparsity,
 * /hash/tiles (as a share of the largest), frozen blocks (freeze runs:
 * those that did no update), MoD blocks' token shares and MoE blocks'
 * busiest expert rank; at a measured step each in its range. */
static void read_states(struct sim_run *run, struct runlog_file *f, long rows, const long *keep,
                        int count)
{
    int L = run->layers;
    trajectory_alloc(&run->state, count, L);
    run->state.every[SIM_MOD_TOKENS] = run->cfg.mod_every;
    run->state.every[SIM_MOE_LOAD] = run->cfg.moe_every;
    for (int k = 0; k < SIM_STATE_COUNT; k++) {
        float *m = state_matrix(run, f, rows, k);
        if (!m) continue;
        keep_rows(m, L, keep, count);
        float most = 0;
        for (long i = 0; i < (long)count * L; i++) {
            if (!state_ok(k, m[i])) {
                float v = m[i];
                dm_free(m);
                run_error(f, "%s: block %ld at step %ld has %s %g", run->path, i % L,
                          keep[i / L] + 1, sim_state_name(k), (double)v);
            }
            if (k == SIM_TILES && m[i] > most) most = m[i];
        }
        for (long i = 0; i < (long)count * L; i++)
            run->state.value[k][i] = k == SIM_TILES ? (most > 0 ? m[i] / most : 1.0f) : m[i];
        run->state.present[k] = 1;
        dm_free(m);
    }
}

/* Each step's embedding and head: what the first and last stage computed
 * beyond their blocks (balance_end_stage_extras, as the controller takes
 * them). */
static void read_extras(struct sim_run *run)
{
    int L = run->layers, T = run->steps;
    double *f = dm_alloc((size_t)L * sizeof(double)), *b = dm_alloc((size_t)L * sizeof(double));
    double *u = dm_alloc((size_t)L * sizeof(double));
    run->embed = dm_alloc((size_t)T * sizeof *run->embed);
    run->head = dm_alloc((size_t)T * sizeof *run->head);
    for (int t = 0; t < T; t++) {
        for (int l = 0; l < L; l++) {
            f[l] = run->fwd[(long)t * L + l];
            b[l] = run->bwd[(long)t * L + l];
            u[l] = run->update ? run->update[(long)t * L + l] : 0.0;
        }
        const int *layout = run->layout + (long)t * run->width;
        int S = run->layout_stages[t];
        const float *busy = run->busy + (long)t * run->width;
        const float *stage_update = run->stage_update ? run->stage_update + (long)t * run->width
                                                      : NULL;
        double ends_busy[2] = {busy[0], busy[S - 1]};
        double ends_update[2] = {stage_update ? stage_update[0] : 0.0,
                                 stage_update ? stage_update[S - 1] : 0.0};
        balance_end_stage_extras(f, b, run->update ? u : NULL, layout, S, run->micro_batches,
                                 ends_busy, ends_update, &run->embed[t], &run->head[t]);
    }
    dm_free(f);
    dm_free(b);
    dm_free(u);
}

/* The run's groups' shares of their CPUs with the other replicas' ranks
 * (the attribute group_shares, written when those ranks took turns on the
 * same CPUs): the sharing its D replicas had, as processor sharing. */
static void read_replica_sharing(struct sim_run *run, struct runlog_file *f)
{
    const struct plan_sharing *ps = &run->plan_sharing;
    char err[1200];
    long n = runlog_file_attr_doubles(f, RUNLOG_ATTR_GROUP_SHARES, &run->shares, err, sizeof err);
    if (n < 0) run_error(f, "%s", err);
    if (n == 0 || !ps->group) return;
    if (n != ps->sharing.groups)
        run_error(f, "%s: %s has %ld entries but the run has %d stage groups", run->path,
                  RUNLOG_ATTR_GROUP_SHARES, n, ps->sharing.groups);
    run->replica_sharing = ps->sharing;
    run->replica_sharing.cores = run->shares;
    run->replica_sharing.turns = 0;
    if (balance_check_sharing(&run->replica_sharing, err, sizeof err))
        run_error(f, "%s: %s: %s", run->path, RUNLOG_ATTR_GROUP_SHARES, err);
}

void sim_run_read(struct sim_run *run, const char *dir, int stages)
{
    char err[1200];
    memset(run, 0, sizeof *run);
    snprintf(run->path, sizeof run->path, "%s/" RUNLOG_FILE_NAME, dir);
    struct runlog_file *f = runlog_open_read(run->path, err, sizeof err);
    if (!f) dm_user_error("simulate: %s", err);
    int status = runlog_file_config(f, &run->cfg, err, sizeof err);
    if (status < 0) run_error(f, "%s", err);
    if (status > 0)
        run_error(f, "%s has no configuration (root attribute config)", run->path);
    run->layers = run->cfg.layers;
    run->micro_batches = run->cfg.micro_batches;
    run->schedule = config_schedule(&run->cfg);
    run->csr_sparsity = (float)run->cfg.csr_sparsity;
    if (!runlog_file_dataset(f, RUNLOG_STEP_MS))
        run_error(f, "%s has no %s", run->path, RUNLOG_STEP_MS);
    long rows = runlog_file_series(f, RUNLOG_STEP_MS, &run->step_ms, err, sizeof err);
    if (rows < 0) run_error(f, "%s", err);
    run->fwd = read_blocks(run, f, RUNLOG_LAYER_FWD_MS, rows, run->layers, 1);
    run->bwd = read_blocks(run, f, RUNLOG_LAYER_BWD_MS, rows, run->layers, 1);
    if (!runlog_file_dataset(f, RUNLOG_LAYOUT_HISTORY) ||
        !runlog_file_dataset(f, RUNLOG_STAGE_BUSY_MS))
        run_error(f, "%s has no %s or %s (layouts and stage times)", run->path,
                  RUNLOG_LAYOUT_HISTORY, RUNLOG_STAGE_BUSY_MS);
    read_layouts(run, f, rows);
    run->busy = read_blocks(run, f, RUNLOG_STAGE_BUSY_MS, rows, run->width, 1);
    if (runlog_file_dataset(f, RUNLOG_LAYER_UPDATE_MS) &&
        runlog_file_dataset(f, RUNLOG_STAGE_UPDATE_MS)) {
        run->update = read_blocks(run, f, RUNLOG_LAYER_UPDATE_MS, rows, run->layers, 1);
        run->stage_update = read_blocks(run, f, RUNLOG_STAGE_UPDATE_MS, rows, run->width, 1);
    }
    long *keep = dm_alloc((size_t)(rows ? rows : 1) * sizeof(long));
    int count = measured_steps(run, f, rows, keep);
    if (count < 3) {
        dm_free(keep);
        run_error(f, "%s has %d measured steps; the cost model needs at least 3", run->path,
                  count);
    }
    read_states(run, f, rows, keep, count);
    float *step_ms = run->step_ms;
    for (int i = 0; i < count; i++) step_ms[i] = step_ms[keep[i]];
    keep_rows(run->fwd, run->layers, keep, count);
    keep_rows(run->bwd, run->layers, keep, count);
    keep_rows(run->update, run->layers, keep, count);
    keep_rows(run->busy, run->width, keep, count);
    keep_rows(run->stage_update, run->width, keep, count);
    for (int i = 0; i < count; i++) {
        memmove(run->layout + (size_t)i * run->width, run->layout + (size_t)keep[i] * run->width,
                (size_t)run->width * sizeof(int));
        run->layout_stages[i] = run->layout_stages[keep[i]];
    }
    run->steps = count;
    run->first_step = (int)keep[0] + 1;
    run->stages = run->layout_stages[0];
    read_extras(run);
    dm_free(keep);
    plan_sharing_from_run(&run->plan_sharing, dir, run->stages, stages > 0 ? stages : run->stages);
    read_replica_sharing(run, f);
    runlog_close_read(f);
}

void sim_run_free(struct sim_run *run)
{
    dm_free(run->shares);
    dm_free(run->embed);
    dm_free(run->head);
    dm_free(run->fwd);
    dm_free(run->bwd);
    dm_free(run->update);
    dm_free(run->busy);
    dm_free(run->stage_update);
    dm_free(run->layout);
    dm_free(run->layout_stages);
    dm_free(run->step_ms);
    dm_free(run->plan_sharing.group);
    dm_free(run->plan_sharing.cores);
    sim_trajectory_free(&run->state);
    memset(run, 0, sizeof *run);
}

/* ---- the cost model ------------------------------------------------------- */

/* The features of a block in `state` (SIM_STATE_COUNT values), those the
 * fit does not use zero: 1, active, active^2, in CSR, in CSR x density,
 * tiles, MoD tokens, MoD tokens^2, MoE load. */
static void features(double *phi, const float *state, float csr, const int *uses)
{
    double a = state[SIM_ACTIVE], s = state[SIM_SPARSITY];
    double in_csr = uses[SIM_SPARSITY] && s >= csr ? 1.0 : 0.0;
    phi[0] = 1.0;
    phi[1] = uses[SIM_ACTIVE] ? a : 0.0;
    phi[2] = uses[SIM_ACTIVE] ? a * a : 0.0;
    phi[3] = in_csr;
    phi[4] = in_csr * (1.0 - s);
    phi[5] = uses[SIM_TILES] ? state[SIM_TILES] : 0.0;
    double m = uses[SIM_MOD_TOKENS] ? state[SIM_MOD_TOKENS] : 0.0;
    phi[6] = m;
    phi[7] = m * m;
    phi[8] = uses[SIM_MOE_LOAD] ? state[SIM_MOE_LOAD] : 0.0;
}

/* Solves (A + ridge) x = b for a symmetric SIM_FEATURES x SIM_FEATURES A by
 * Gaussian elimination with partial pivoting; the small ridge makes
 * features that never vary (all-zero columns) come out 0. */
static void solve(double A[SIM_FEATURES][SIM_FEATURES], double *b, double *x)
{
    enum { P = SIM_FEATURES };
    double trace = 0;
    for (int i = 0; i < P; i++) trace += A[i][i];
    for (int i = 0; i < P; i++) A[i][i] += 1e-9 * trace / P + 1e-300;
    for (int c = 0; c < P; c++) {
        int pivot = c;
        for (int r = c + 1; r < P; r++)
            if (fabs(A[r][c]) > fabs(A[pivot][c])) pivot = r;
        for (int k = 0; k < P; k++) {
            double t = A[c][k]; A[c][k] = A[pivot][k]; A[pivot][k] = t;
        }
        double t = b[c]; b[c] = b[pivot]; b[pivot] = t;
        for (int r = c + 1; r < P; r++) {
            double f = A[r][c] / A[c][c];
            for (int k = c; k < P; k++) A[r][k] -= f * A[c][k];
            b[r] -= f * b[c];
        }
    }
    for (int r = P - 1; r >= 0; r--) {
        double sum = b[r];
        for (int k = r + 1; k < P; k++) sum -= A[r][k] * x[k];
        x[r] = sum / A[r][r];
    }
}

static float measured(const struct sim_run *run, int direction, long i)
{
    return direction == SIM_FWD ? run->fwd[i] : direction == SIM_BWD ? run->bwd[i]
         : run->update ? run->update[i] : 0.0f;
}

static double predict(const double *beta, const double *phi)
{
    double t = 0;
    for (int k = 0; k < SIM_FEATURES; k++) t += beta[k] * phi[k];
    return t > 0 ? t : 0;
}

/* Least squares of one direction and class over the steps after the
 * first; with limit > 0 samples whose residual against the previous fit
 * exceeds it are left out (noise spikes of a shared machine). */
static long fit_one(struct sim_model *model, const struct sim_run *run, int direction, int cls,
                    double limit)
{
    double A[SIM_FEATURES][SIM_FEATURES] = {{0}}, b[SIM_FEATURES] = {0}, phi[SIM_FEATURES];
    double *beta = model->beta[direction][cls];
    long count = 0, L = run->layers;
    float state[SIM_STATE_COUNT];
    for (long i = L; i < (long)run->steps * L; i++) {
        for (int k = 0; k < SIM_STATE_COUNT; k++) state[k] = run->state.value[k][i];
        if ((state[SIM_FROZEN] != 0) != cls) continue;
        features(phi, state, run->csr_sparsity, model->uses);
        double y = measured(run, direction, i);
        if (!isfinite(y) || (limit > 0 && fabs(predict(beta, phi) - y) > limit)) continue;
        for (int p = 0; p < SIM_FEATURES; p++) {
            b[p] += phi[p] * y;
            for (int q = 0; q < SIM_FEATURES; q++) A[p][q] += phi[p] * phi[q];
        }
        count++;
    }
    if (count) solve(A, b, beta);
    return count;
}

/* Four times the median absolute residual of the fit (in ms), the cut for
 * the second pass. */
static double residual_limit(const struct sim_model *model, const struct sim_run *run,
                             int direction, int cls, double *scratch)
{
    long n = 0, L = run->layers;
    double phi[SIM_FEATURES];
    float state[SIM_STATE_COUNT];
    for (long i = L; i < (long)run->steps * L; i++) {
        for (int k = 0; k < SIM_STATE_COUNT; k++) state[k] = run->state.value[k][i];
        if ((state[SIM_FROZEN] != 0) != cls || !isfinite(measured(run, direction, i))) continue;
        features(phi, state, run->csr_sparsity, model->uses);
        scratch[n++] = fabs(predict(model->beta[direction][cls], phi) - measured(run, direction, i));
    }
    return 4.0 * dm_median(scratch, n) + 1e-6;
}

/* The embedding's and head's extras: medians over the steps after the
 * first of what the end stages computed beyond their blocks (run->embed,
 * run->head). */
static void fit_extras(struct sim_model *model, const struct sim_run *run)
{
    int T = run->steps;
    double *fields = dm_alloc((size_t)6 * T * sizeof(double));
    for (int t = 1; t < T; t++) {
        const struct balance_extra *e = &run->embed[t], *h = &run->head[t];
        double v[6] = {e->fwd_ms, e->bwd_ms, e->update_ms, h->fwd_ms, h->bwd_ms, h->update_ms};
        for (int k = 0; k < 6; k++) fields[(long)k * T + t - 1] = v[k];
    }
    double m[6];
    for (int k = 0; k < 6; k++) m[k] = dm_median(fields + (long)k * T, T - 1);
    model->embed = (struct balance_extra){.fwd_ms = m[0], .bwd_ms = m[1], .update_ms = m[2]};
    model->head = (struct balance_extra){.fwd_ms = m[3], .bwd_ms = m[4], .update_ms = m[5]};
    dm_free(fields);
}

/* Median relative error of the fitted fwd + bwd against the measured. */
static double fit_error(const struct sim_model *model, const struct sim_run *run, double *scratch)
{
    long n = 0, L = run->layers;
    float state[SIM_STATE_COUNT];
    for (long i = L; i < (long)run->steps * L; i++) {
        double y = run->fwd[i] + run->bwd[i], f, b, u;
        for (int k = 0; k < SIM_STATE_COUNT; k++) state[k] = run->state.value[k][i];
        sim_model_block(model, state, run->csr_sparsity, &f, &b, &u);
        if (y > 0) scratch[n++] = fabs(f + b - y) / y;
    }
    return dm_median(scratch, n);
}

void sim_model_fit(struct sim_model *model, const struct sim_run *run)
{
    memset(model, 0, sizeof *model);
    long total = (long)run->steps * run->layers;
    for (int k = 0; k < SIM_STATE_COUNT; k++) {
        float lo = INFINITY, hi = -INFINITY;
        for (long i = run->layers; k != SIM_FROZEN && i < total; i++) {
            lo = fminf(lo, run->state.value[k][i]);
            hi = fmaxf(hi, run->state.value[k][i]);
        }
        model->uses[k] = run->state.present[k] && (k == SIM_FROZEN || hi > lo);
    }
    double *scratch = dm_alloc((size_t)total * sizeof(double));
    for (int d = 0; d < SIM_DIRECTIONS; d++)
        for (int c = 0; c < 2; c++) {
            long n = fit_one(model, run, d, c, 0.0);
            if (n > 0) n = fit_one(model, run, d, c, residual_limit(model, run, d, c, scratch));
            if (d == SIM_FWD) model->fitted[c] = n > 0;
            model->samples += d == SIM_FWD ? n : 0;
        }
    /* A class the run never had: frozen blocks forward as training ones and
     * do no backward or update; training blocks as frozen ones forward. */
    int missing = !model->fitted[1] ? 1 : !model->fitted[0] ? 0 : -1;
    if (missing >= 0)
        for (int p = 0; p < SIM_FEATURES; p++) {
            model->beta[SIM_FWD][missing][p] = model->beta[SIM_FWD][1 - missing][p];
            model->beta[SIM_BWD][missing][p] = missing ? 0.0 : model->beta[SIM_BWD][1][p];
            model->beta[SIM_UPDATE][missing][p] = missing ? 0.0 : model->beta[SIM_UPDATE][1][p];
        }
    fit_extras(model, run);
    model->fit_error = fit_error(model, run, scratch);
    dm_free(scratch);
}

void sim_model_block(const struct sim_model *model, const float *state, float csr,
                     double *fwd, double *bwd, double *update)
{
    double phi[SIM_FEATURES];
    int cls = state[SIM_FROZEN] != 0;
    features(phi, state, csr, model->uses);
    *fwd = predict(model->beta[SIM_FWD][cls], phi);
    *bwd = predict(model->beta[SIM_BWD][cls], phi);
    *update = predict(model->beta[SIM_UPDATE][cls], phi);
}

/* ---- trajectories --------------------------------------------------------- */

/* The state of block j of `blocks` at its relative depth in one step's
 * row of the source (L blocks), interpolated between the two nearest
 * blocks that carry it (every `every`-th, or all); a block that does not
 * carry it gets `neutral`. */
static double at_depth(const float *row, int L, int every, int j, int blocks, float neutral)
{
    int p = every > 1 ? every : 1, carriers = L / p, target = blocks / p;
    if ((j + 1) % p || !carriers || !target) return neutral;
    double x = (((j + 1) / p - 1 + 0.5) / target) * carriers - 0.5;
    int lo = x <= 0 ? 0 : (int)floor(x), hi = lo + 1 < carriers ? lo + 1 : carriers - 1;
    if (lo > carriers - 1) lo = carriers - 1;
    double w = x <= 0 ? 0.0 : x - lo;
    return (1 - w) * row[(lo + 1) * p - 1] + w * row[(hi + 1) * p - 1];
}

void sim_trajectory_map(struct sim_trajectory *out, const struct sim_trajectory *src,
                        int blocks, int steps)
{
    trajectory_alloc(out, steps, blocks);
    int L = src->blocks;
    for (int k = 0; k < SIM_STATE_COUNT; k++) {
        out->present[k] = src->present[k];
        out->every[k] = src->every[k];
    }
    for (int t = 0; t < steps; t++) {
        long from = (long)((double)t * src->steps / steps) * L;
        for (int j = 0; j < blocks; j++) {
            for (int k = 0; k < SIM_STATE_COUNT; k++) {
                double value = at_depth(src->value[k] + from, L, src->every[k], j, blocks,
                                        state_neutral[k]);
                if (k == SIM_FROZEN)   /* frozen blocks stay a prefix */
                    value = value >= 0.5 && (j == 0 || out->value[k][(long)t * blocks + j - 1]);
                out->value[k][(long)t * blocks + j] = (float)value;
            }
        }
    }
}

/* The columns of a scenario's header: -2 step, -1 block, else a state. */
static int scenario_header(const char *path, char *line, int *column, int *count)
{
    *count = 0;
    int have_step = 0, have_block = 0, states = 0;
    for (char *field = strtok(line, ",\r\n"); field; field = strtok(NULL, ",\r\n")) {
        while (*field == ' ') field++;
        int c = !strcmp(field, "step") ? -2 : !strcmp(field, "block") ? -1 : -3;
        for (int k = 0; c == -3 && k < SIM_STATE_COUNT; k++)
            if (!strcmp(field, state_names[k])) c = k;
        if (c == -3)
            dm_user_error("simulate: %s:1: unknown column '%s' (step, block, active, "
                          "sparsity, frozen, tiles, mod_tokens, moe_load)", path, field);
        if (*count >= 2 + SIM_STATE_COUNT)
            dm_user_error("simulate: %s:1: too many columns", path);
        have_step |= c == -2;
        have_block |= c == -1;
        states += c >= 0;
        column[(*count)++] = c;
    }
    if (!have_step || !have_block || !states)
        dm_user_error("simulate: %s:1: the header must name step, block and at least one of "
                      "active, sparsity, frozen, tiles, mod_tokens, moe_load", path);
    return 0;
}

struct scenario_row {
    long step;
    int block;
    float value[SIM_STATE_COUNT];
};

static double scenario_number(const char *path, long line, const char *field, const char *name,
                              double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(field, &end);
    while (*end == ' ' || *end == '\r') end++;
    if (end == field || *end || errno || !isfinite(v) || v < lo || v > hi)
        dm_user_error("simulate: %s:%ld: %s '%s' is not a number in [%g, %g]", path, line,
                      name, field, lo, hi);
    return v;
}

/* Reads the rows of a scenario (header checked); returns the count. */
static long scenario_rows(const char *path, struct scenario_row **rows, int *present)
{
    FILE *f = fopen(path, "r");
    if (!f) dm_user_error("simulate: cannot open the scenario %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long count = 0, capacity = 0, number = 0;
    int column[2 + SIM_STATE_COUNT], columns = 0;
    static const double hi[SIM_STATE_COUNT] = {1, 0.999999, 1, 1, 1, SIM_MAX_MOE_LOAD};
    while (getline(&line, &cap, f) > 0) {
        number++;
        if (line[0] == '#' || line[strspn(line, " \r\n")] == '\0') continue;
        if (!columns) {
            scenario_header(path, line, column, &columns);
            for (int c = 0; c < columns; c++) if (column[c] >= 0) present[column[c]] = 1;
            continue;
        }
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 1024;
            *rows = realloc(*rows, (size_t)capacity * sizeof **rows);
            if (!*rows) DM_FATAL("out of memory reading the scenario %s", path);
        }
        struct scenario_row *r = &(*rows)[count++];
        for (int k = 0; k < SIM_STATE_COUNT; k++) r->value[k] = state_neutral[k];
        int c = 0;
        for (char *field = strtok(line, ",\n"); field; field = strtok(NULL, ",\n"), c++) {
            if (c >= columns) dm_user_error("simulate: %s:%ld: more fields than the header's %d",
                                            path, number, columns);
            const char *name = column[c] == -2 ? "step" : column[c] == -1 ? "block"
                             : state_names[column[c]];
            double v = scenario_number(path, number, field, name, column[c] == -2 ? 1 : 0,
                                       column[c] == -2 ? 1e9 : column[c] == -1 ? 1e6
                                                                               : hi[column[c]]);
            if (column[c] < 0 && v != floor(v))
                dm_user_error("simulate: %s:%ld: %s '%s' is not a whole number", path, number,
                              name, field);
            if (column[c] == -2) r->step = (long)v;
            else if (column[c] == -1) r->block = (int)v;
            else r->value[column[c]] = (float)v;
        }
        if (c != columns)
            dm_user_error("simulate: %s:%ld: %d fields, the header has %d", path, number, c, columns);
    }
    free(line);
    fclose(f);
    if (!columns) dm_user_error("simulate: the scenario %s is empty", path);
    return count;
}

/* Checks that each listed step lists blocks 0..blocks-1 once each, with its
 * frozen blocks a prefix, and that listed steps ascend from step 1. */
static void scenario_check(const char *path, const struct scenario_row *rows, long count,
                           int blocks, char *seen)
{
    if (rows[0].step != 1)
        dm_user_error("simulate: %s: the first listed step is %ld; the scenario must start "
                      "at step 1", path, rows[0].step);
    for (long i = 0; i < count;) {
        long step = rows[i].step, j = i;
        memset(seen, 0, (size_t)blocks);
        for (; j < count && rows[j].step == step; j++) {
            if (seen[rows[j].block])
                dm_user_error("simulate: %s: step %ld lists block %d twice", path, step,
                              rows[j].block);
            seen[rows[j].block] = 1;
        }
        if (j < count && rows[j].step < step)
            dm_user_error("simulate: %s: step %ld comes after step %ld: list steps in "
                          "ascending order", path, rows[j].step, step);
        for (int b = 0; b < blocks; b++)
            if (!seen[b])
                dm_user_error("simulate: %s: step %ld has no row for block %d (every listed "
                              "step lists blocks 0..%d)", path, step, b, blocks - 1);
        i = j;
    }
}

void sim_scenario_read(struct sim_trajectory *out, const char *path, int steps)
{
    struct scenario_row *rows = NULL;
    int present[SIM_STATE_COUNT] = {0};
    long count = scenario_rows(path, &rows, present);
    if (count == 0) dm_user_error("simulate: the scenario %s has no rows", path);
    int blocks = 0;
    for (long i = 0; i < count; i++) if (rows[i].block + 1 > blocks) blocks = rows[i].block + 1;
    char *seen = dm_alloc((size_t)blocks);
    scenario_check(path, rows, count, blocks, seen);
    dm_free(seen);
    long last = rows[count - 1].step;
    if (steps <= 0) steps = (int)last;
    sim_check_size(steps, blocks);
    trajectory_alloc(out, steps, blocks);
    memcpy(out->present, present, sizeof present);
    long current = 0, next = 0;   /* first rows of the step in force and of the next listed */
    while (next < count && rows[next].step == rows[0].step) next++;
    for (int t = 0; t < steps; t++) {
        while (next < count && rows[next].step <= t + 1) {
            current = next;
            while (next < count && rows[next].step == rows[current].step) next++;
        }
        for (long r = current; r < next; r++)
            for (int k = 0; k < SIM_STATE_COUNT; k++)
                out->value[k][(long)t * blocks + rows[r].block] = rows[r].value[k];
        for (int b = 1; b < blocks; b++)
            if (out->value[SIM_FROZEN][(long)t * blocks + b] != 0 &&
                out->value[SIM_FROZEN][(long)t * blocks + b - 1] == 0)
                dm_user_error("simulate: %s: at step %d block %d is frozen but block %d is "
                              "not (frozen blocks are a prefix)", path, t + 1, b, b - 1);
    }
    free(rows);
}
