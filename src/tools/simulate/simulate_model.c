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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "tools/plan/plan.h"
#include "tools/simulate/simulate.h"

/* The states: every registered signal with a cost role, ordered by role
 * and then by the table (a stable insertion sort), built once. */
static const struct dyn_signal *states[SIM_STATES_MAX];
static int state_count = -1;

static void states_init(void)
{
    if (state_count >= 0) return;
    const struct dyn_signal *all[DYN_SIGNALS_MAX * 4];
    int n = dyn_signals_all(all, DYN_SIGNALS_MAX * 4), count = 0;
    for (int i = 0; i < n; i++) {
        if (all[i]->cost == DYN_COST_NONE) continue;
        if (count == SIM_STATES_MAX) DM_FATAL("more than %d signals with a cost role", count);
        int k = count++;
        for (; k > 0 && states[k - 1]->cost > all[i]->cost; k--) states[k] = states[k - 1];
        states[k] = all[i];
    }
    state_count = count;
}

int sim_state_count(void)
{
    states_init();
    return state_count;
}

const struct dyn_signal *sim_state_signal(int state)
{
    states_init();
    return states[state];
}

const char *sim_state_name(int state)
{
    return state >= 0 && state < sim_state_count() ? states[state]->cost_name : "?";
}

float sim_state_neutral(int state)
{
    return sim_state_signal(state)->neutral;
}

enum dyn_cost_role sim_state_role(int state)
{
    return sim_state_signal(state)->cost;
}

int sim_state_of_role(enum dyn_cost_role role)
{
    for (int k = 0; k < sim_state_count(); k++)
        if (states[k]->cost == role) return k;
    return -1;
}

static void trajectory_alloc(struct sim_trajectory *t, int steps, int blocks)
{
    memset(t, 0, sizeof *t);
    t->steps = steps;
    t->blocks = blocks;
    size_t n = (size_t)steps * (size_t)blocks;
    for (int k = 0; k < sim_state_count(); k++) {
        t->value[k] = dm_alloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) t->value[k][i] = sim_state_neutral(k);
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
    for (int k = 0; k < sim_state_count(); k++) {
        if (sim_state_role(k) != DYN_COST_BUSIEST_RANK) continue;
        for (long i = 0; i < (long)src->steps * src->blocks; i++)
            t->value[k][i] = src->value[k][i] > 0 ? 1.0f : 0.0f;
    }
}

void sim_trajectory_free(struct sim_trajectory *t)
{
    for (int k = 0; k < SIM_STATES_MAX; k++) dm_free(t->value[k]);
    memset(t, 0, sizeof *t);
}

/* ---- the run log ---------------------------------------------------------- */

/* A problem with the run log: one message naming it, exit 2. */
#define run_error(f, ...) runlog_file_fail((f), "simulate", __VA_ARGS__)

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
        for (int u = 0; run->unit_fwd && u < 2 * run->layers; u++) {
            long i = r * 2 * run->layers + u;
            if (!time_ok(run->unit_fwd[i], 0) || !time_ok(run->unit_bwd[i], 0) ||
                !time_ok(run->unit_update[i], 0))
                run_error(f, "%s: unit %d at step %ld has forward %g, backward %g, update %g "
                          "ms (measured times are >= 0)", run->path, u, r + 1,
                          (double)run->unit_fwd[i], (double)run->unit_bwd[i],
                          (double)run->unit_update[i]);
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

/* The layouts, each row a layout of model.layers blocks (of twice as many
 * units under balance.units = sublayer) or a filler row
 * (runlog_file_layouts), at least as many rows as the step times. */
static void read_layouts(struct sim_run *run, struct runlog_file *f, long rows)
{
    char err[1200];
    struct runlog_layouts l;
    if (runlog_file_layouts(f, run->layers * run->units_per_block, &l, err, sizeof err) < 0)
        run_error(f, "%s", err);
    run->layout = l.counts;
    run->layout_stages = l.stages;
    run->width = l.width;
    if (l.rows < rows)
        run_error(f, "%s: %s has %ld rows, %s %ld", run->path, RUNLOG_LAYOUT_HISTORY, l.rows,
                  RUNLOG_STEP_MS, rows);
}

/* The run log as the schemes read it (struct dyn_log_reader): a dataset
 * that cannot be read, or a problem a scheme finds, is the run's error. */
struct log_reading {
    struct sim_run *run;
    struct runlog_file *f;
    const char *hidden;    /* a dataset the schemes are not shown, or NULL */
};

static int reader_has(void *ctx, const char *dataset)
{
    struct log_reading *rd = ctx;
    if (rd->hidden && !strcmp(dataset, rd->hidden)) return 0;
    return runlog_file_dataset(rd->f, dataset) != NULL;
}

static long reader_floats(void *ctx, const char *dataset, float **values, int *cols)
{
    struct log_reading *rd = ctx;
    char err[1200];
    long rows = runlog_file_matrix(rd->f, dataset, values, cols, err, sizeof err);
    if (rows < 0) run_error(rd->f, "%s", err);
    return rows;
}

static long reader_ints(void *ctx, const char *dataset, int **values, int *cols)
{
    struct log_reading *rd = ctx;
    char err[1200];
    long rows = runlog_file_int_matrix(rd->f, dataset, values, cols, err, sizeof err);
    if (rows < 0) run_error(rd->f, "%s", err);
    return rows;
}

__attribute__((noreturn))
static void reader_fail(void *ctx, const char *text)
{
    run_error(((struct log_reading *)ctx)->f, "%s", text);
}

/* A state's signal as its dataset holds it: one value per layer, or one
 * per block of its scheme spread onto those (the others neutral); NULL
 * when the log has none. */
static float *signal_matrix(struct sim_run *run, struct runlog_file *f, long rows,
                            const struct dyn_signal *signal, const struct gpt_shape *shape)
{
    int L = run->layers;
    if (signal->columns == DYN_SIGNAL_LAYERS)
        return read_blocks(run, f, signal->dataset, rows, L, 0);
    int width = dyn_signal_width(signal, shape);
    if (!width || signal->columns != DYN_SIGNAL_BLOCKS) return NULL;
    float *own = read_blocks(run, f, signal->dataset, rows, width, 0);
    if (!own) return NULL;
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    for (long r = 0; r < rows; r++)
        for (int l = 0, j = 0; l < L; l++)
            m[r * L + l] = dyn_signal_layer(signal, shape, l) ? own[r * width + j++]
                                                              : signal->neutral;
    dm_free(own);
    return m;
}

/* One state's (rows, layers) matrix as the log records it (its signal's
 * cost_of_log under cfg, or its dataset), or NULL. With hide, the
 * scheme's cost_of_log is not shown the signal's own dataset (what the run
 * measured under its own config) and prices the state from what else the
 * log holds under cfg. */
static float *state_matrix(struct sim_run *run, struct runlog_file *f, long rows, int k,
                           const struct dm_config *cfg, int hide)
{
    const struct dyn_signal *signal = sim_state_signal(k);
    struct gpt_shape shape = dyn_shape_from_config(&run->cfg);
    if (!signal->cost_of_log) return signal_matrix(run, f, rows, signal, &shape);
    struct log_reading reading = {run, f, hide ? signal->dataset : NULL};
    const struct dyn_log_reader rd = {&reading, cfg, run->path, reader_has, reader_floats,
                                      reader_ints, reader_fail};
    return signal->cost_of_log(&rd, &shape, rows);
}

/* The range a state of a measured step must be in. */
static int state_ok(int k, float v)
{
    enum dyn_cost_role role = sim_state_role(k);
    float high = role == DYN_COST_TILE_SHARE ? 1e30f   /* a count, made a share below */
               : role == DYN_COST_BUSIEST_RANK ? (float)DYN_COST_BUSIEST_MAX : 1.0f;
    return v >= 0.0f && v <= high;
}

/* The block states the log records (each state's signal: its dataset or
 * its cost_of_log), a share of tiles as a share of the largest; at a
 * measured step each in its role's range. */
static void read_states(struct sim_run *run, struct runlog_file *f, long rows, const long *keep,
                        int count)
{
    int L = run->layers;
    trajectory_alloc(&run->state, count, L);
    for (int k = 0; k < sim_state_count(); k++) {
        int tiles = sim_state_role(k) == DYN_COST_TILE_SHARE;
        float *m = state_matrix(run, f, rows, k, &run->cfg, 0);
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
            if (tiles && m[i] > most) most = m[i];
        }
        for (long i = 0; i < (long)count * L; i++)
            run->state.value[k][i] = tiles ? (most > 0 ? m[i] / most : 1.0f) : m[i];
        run->state.present[k] = 1;
        dm_free(m);
    }
}

/* Each step's embedding and head: what the first and last stage computed
 * beyond their units (balance_end_stage_extras, as the controller takes
 * them; a sublayer run's layouts count units, priced by its unit costs). */
static void read_extras(struct sim_run *run)
{
    int U = run->layers * run->units_per_block, T = run->steps;
    const float *fwd = run->unit_fwd ? run->unit_fwd : run->fwd;
    const float *bwd = run->unit_fwd ? run->unit_bwd : run->bwd;
    const float *update = run->unit_fwd ? run->unit_update : run->update;
    double *f = dm_alloc((size_t)U * sizeof(double)), *b = dm_alloc((size_t)U * sizeof(double));
    double *u = dm_alloc((size_t)U * sizeof(double));
    run->embed = dm_alloc((size_t)T * sizeof *run->embed);
    run->head = dm_alloc((size_t)T * sizeof *run->head);
    for (int t = 0; t < T; t++) {
        for (int l = 0; l < U; l++) {
            f[l] = fwd[(long)t * U + l];
            b[l] = bwd[(long)t * U + l];
            u[l] = update ? update[(long)t * U + l] : 0.0;
        }
        const int *layout = run->layout + (long)t * run->width;
        int S = run->layout_stages[t];
        const float *busy = run->busy + (long)t * run->width;
        const float *stage_update = run->stage_update ? run->stage_update + (long)t * run->width
                                                      : NULL;
        double ends_busy[2] = {busy[0], busy[S - 1]};
        double ends_update[2] = {stage_update ? stage_update[0] : 0.0,
                                 stage_update ? stage_update[S - 1] : 0.0};
        balance_end_stage_extras(f, b, update ? u : NULL, layout, S, run->micro_batches,
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
    run->units_per_block = balance_units_per_block(balance_units_parse(run->cfg.units));
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
    if (run->units_per_block == 2) {   /* balance.units = sublayer: the units measured apart */
        const char *names[3] = {RUNLOG_UNIT_FWD_MS, RUNLOG_UNIT_BWD_MS, RUNLOG_UNIT_UPDATE_MS};
        float **into[3] = {&run->unit_fwd, &run->unit_bwd, &run->unit_update};
        for (int k = 0; k < 3; k++) {
            if (!runlog_file_dataset(f, names[k]))
                run_error(f, "%s is a run of balance.units = sublayer without %s (its units' "
                          "measured costs)", run->path, names[k]);
            *into[k] = read_blocks(run, f, names[k], rows, 2 * run->layers, 1);
        }
    }
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
    keep_rows(run->unit_fwd, 2 * run->layers, keep, count);
    keep_rows(run->unit_bwd, 2 * run->layers, keep, count);
    keep_rows(run->unit_update, 2 * run->layers, keep, count);
    keep_rows(run->busy, run->width, keep, count);
    keep_rows(run->stage_update, run->width, keep, count);
    for (int i = 0; i < count; i++) {
        memmove(run->layout + (size_t)i * run->width, run->layout + (size_t)keep[i] * run->width,
                (size_t)run->width * sizeof(int));
        run->layout_stages[i] = run->layout_stages[keep[i]];
    }
    run->steps = count;
    run->rows = rows;
    run->kept = keep;
    run->first_step = (int)keep[0] + 1;
    run->stages = run->layout_stages[0];
    read_extras(run);
    plan_sharing_from_run(&run->plan_sharing, dir, run->stages, stages > 0 ? stages : run->stages);
    read_replica_sharing(run, f);
    runlog_close_read(f);
}

void sim_run_place_experts(struct sim_run *run, int ep, const char *placement, int replicas_max)
{
    char err[1200];
    struct runlog_file *f = runlog_open_read(run->path, err, sizeof err);
    if (!f) dm_user_error("simulate: %s", err);
    struct dm_config cfg = run->cfg;
    cfg.ep = ep;
    snprintf(cfg.moe_placement, sizeof cfg.moe_placement, "%s", placement);
    cfg.replicas_max = replicas_max;
    int L = run->layers, count = run->steps;
    for (int k = 0; k < sim_state_count(); k++) {
        if (sim_state_role(k) != DYN_COST_BUSIEST_RANK || !run->state.present[k]) continue;
        float *m = state_matrix(run, f, run->rows, k, &cfg, 1);
        if (!m)
            run_error(f, "%s has no per-expert counts (/moe/tokens) to place on %d ranks",
                      run->path, ep);
        keep_rows(m, L, run->kept, count);
        for (long i = 0; i < (long)count * L; i++) {
            if (!state_ok(k, m[i])) {
                float v = m[i];
                dm_free(m);
                run_error(f, "%s: block %ld at step %ld has %s %g under the placement",
                          run->path, i % L, run->kept[i / L] + 1, sim_state_name(k), (double)v);
            }
            run->state.value[k][i] = m[i];
        }
        dm_free(m);
    }
    runlog_close_read(f);
}

void sim_run_free(struct sim_run *run)
{
    dm_free(run->kept);
    dm_free(run->shares);
    dm_free(run->embed);
    dm_free(run->head);
    dm_free(run->fwd);
    dm_free(run->bwd);
    dm_free(run->update);
    dm_free(run->unit_fwd);
    dm_free(run->unit_bwd);
    dm_free(run->unit_update);
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

/* How many features the fit has: 1, then each state's by its role. */
static int feature_count(void)
{
    int n = 1;
    for (int k = 0; k < sim_state_count(); k++)
        switch (sim_state_role(k)) {
        case DYN_COST_TOKEN_SHARE: case DYN_COST_ROUTED_SHARE: case DYN_COST_SPARSITY: n += 2;
            break;
        case DYN_COST_TILE_SHARE: case DYN_COST_BUSIEST_RANK: n += 1; break;
        default: break;
        }
    return n;
}

/* The class of a block in state: 1 when frozen (no weight gradient). */
static int frozen_class(const float *state)
{
    int k = sim_state_of_role(DYN_COST_FROZEN);
    return k >= 0 && state[k] != 0;
}

/* The features of a block in `state` (sim_state_count() values), those
 * of a state the fit does not use zero: 1, then per state by its role: a
 * share of tokens x and x^2, sparsity s as in CSR and in CSR x density
 * (s reaches csr), a share of tiles, a busiest-rank load. */
static void features(double *phi, const float *state, float csr, const int *uses)
{
    int p = 0;
    phi[p++] = 1.0;
    for (int k = 0; k < sim_state_count(); k++) {
        double x = uses[k] ? state[k] : 0.0;
        switch (sim_state_role(k)) {
        case DYN_COST_TOKEN_SHARE: case DYN_COST_ROUTED_SHARE:
            phi[p++] = x;
            phi[p++] = x * x;
            break;
        case DYN_COST_SPARSITY: {
            double in_csr = uses[k] && state[k] >= csr ? 1.0 : 0.0;
            phi[p++] = in_csr;
            phi[p++] = in_csr * (1.0 - state[k]);
            break;
        }
        case DYN_COST_TILE_SHARE: case DYN_COST_BUSIEST_RANK: phi[p++] = x; break;
        default: break;
        }
    }
}

/* Solves (A + ridge) x = b for a symmetric P x P A (the leading block of
 * A) by Gaussian elimination with partial pivoting; the small ridge makes
 * features that never vary (all-zero columns) come out 0. */
static void solve(double A[SIM_FEATURES_MAX][SIM_FEATURES_MAX], double *b, double *x, int P)
{
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

static double predict(const double *beta, const double *phi, int P)
{
    double t = 0;
    for (int k = 0; k < P; k++) t += beta[k] * phi[k];
    return t > 0 ? t : 0;
}

/* Least squares of one direction and class over the steps after the
 * first; with limit > 0 samples whose residual against the previous fit
 * exceeds it are left out (noise spikes of a shared machine). */
static long fit_one(struct sim_model *model, const struct sim_run *run, int direction, int cls,
                    double limit)
{
    double A[SIM_FEATURES_MAX][SIM_FEATURES_MAX] = {{0}}, b[SIM_FEATURES_MAX] = {0};
    double phi[SIM_FEATURES_MAX], *beta = model->beta[direction][cls];
    long count = 0, L = run->layers;
    int P = model->features;
    float state[SIM_STATES_MAX];
    for (long i = L; i < (long)run->steps * L; i++) {
        for (int k = 0; k < sim_state_count(); k++) state[k] = run->state.value[k][i];
        if (frozen_class(state) != cls) continue;
        features(phi, state, run->csr_sparsity, model->uses);
        double y = measured(run, direction, i);
        if (!isfinite(y) || (limit > 0 && fabs(predict(beta, phi, P) - y) > limit)) continue;
        for (int p = 0; p < P; p++) {
            b[p] += phi[p] * y;
            for (int q = 0; q < P; q++) A[p][q] += phi[p] * phi[q];
        }
        count++;
    }
    if (count) solve(A, b, beta, P);
    return count;
}

/* Four times the median absolute residual of the fit (in ms), the cut for
 * the second pass. */
static double residual_limit(const struct sim_model *model, const struct sim_run *run,
                             int direction, int cls, double *scratch)
{
    long n = 0, L = run->layers;
    double phi[SIM_FEATURES_MAX];
    float state[SIM_STATES_MAX];
    for (long i = L; i < (long)run->steps * L; i++) {
        for (int k = 0; k < sim_state_count(); k++) state[k] = run->state.value[k][i];
        if (frozen_class(state) != cls || !isfinite(measured(run, direction, i))) continue;
        features(phi, state, run->csr_sparsity, model->uses);
        scratch[n++] = fabs(predict(model->beta[direction][cls], phi, model->features) -
                            measured(run, direction, i));
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
    float state[SIM_STATES_MAX];
    for (long i = L; i < (long)run->steps * L; i++) {
        double y = run->fwd[i] + run->bwd[i], f, b, u;
        for (int k = 0; k < sim_state_count(); k++) state[k] = run->state.value[k][i];
        sim_model_block(model, state, run->csr_sparsity, &f, &b, &u);
        if (y > 0) scratch[n++] = fabs(f + b - y) / y;
    }
    return dm_median(scratch, n);
}

/* Each direction's and class's coefficients (fit_one twice, the second
 * without the outliers of the first); a class the run never had: frozen
 * blocks forward as training ones and do no backward or update; training
 * blocks as frozen ones forward. */
static void fit_classes(struct sim_model *model, const struct sim_run *run, double *scratch)
{
    for (int d = 0; d < SIM_DIRECTIONS; d++)
        for (int c = 0; c < 2; c++) {
            long n = fit_one(model, run, d, c, 0.0);
            if (n > 0) n = fit_one(model, run, d, c, residual_limit(model, run, d, c, scratch));
            if (d == SIM_FWD) model->fitted[c] = n > 0;
            model->samples += d == SIM_FWD ? n : 0;
        }
    int missing = !model->fitted[1] ? 1 : !model->fitted[0] ? 0 : -1;
    if (missing >= 0)
        for (int p = 0; p < model->features; p++) {
            model->beta[SIM_FWD][missing][p] = model->beta[SIM_FWD][1 - missing][p];
            model->beta[SIM_BWD][missing][p] = missing ? 0.0 : model->beta[SIM_BWD][1][p];
            model->beta[SIM_UPDATE][missing][p] = missing ? 0.0 : model->beta[SIM_UPDATE][1][p];
        }
}

/* A sublayer run's units: the attentions' (h = 0) and the MLPs' (h = 1)
 * measured costs fitted apart to their blocks' states, with the block
 * fit's features, into model->unit_beta[h]. */
static void fit_units(struct sim_model *model, const struct sim_run *run, double *scratch)
{
    long n = (long)run->steps * run->layers;
    float *half = dm_alloc((size_t)3 * (size_t)n * sizeof(float));
    const float *from[3] = {run->unit_fwd, run->unit_bwd, run->unit_update};
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 3; k++)
            for (long i = 0; i < n; i++) half[k * n + i] = from[k][2 * i + h];
        struct sim_run view = *run;
        view.fwd = half;
        view.bwd = half + n;
        view.update = half + 2 * n;
        struct sim_model part = *model;
        memset(part.beta, 0, sizeof part.beta);
        fit_classes(&part, &view, scratch);
        memcpy(model->unit_beta[h], part.beta, sizeof part.beta);
    }
    model->unit_fitted = 1;
    dm_free(half);
}

void sim_model_fit(struct sim_model *model, const struct sim_run *run)
{
    memset(model, 0, sizeof *model);
    model->features = feature_count();
    long total = (long)run->steps * run->layers;
    for (int k = 0; k < sim_state_count(); k++) {
        int frozen = sim_state_role(k) == DYN_COST_FROZEN;
        float lo = INFINITY, hi = -INFINITY;
        for (long i = run->layers; !frozen && i < total; i++) {
            lo = fminf(lo, run->state.value[k][i]);
            hi = fmaxf(hi, run->state.value[k][i]);
        }
        model->uses[k] = run->state.present[k] && (frozen || hi > lo);
    }
    double *scratch = dm_alloc((size_t)total * sizeof(double));
    fit_classes(model, run, scratch);
    fit_extras(model, run);
    model->fit_error = fit_error(model, run, scratch);
    if (run->unit_fwd) fit_units(model, run, scratch);
    dm_free(scratch);
}

void sim_model_block(const struct sim_model *model, const float *state, float csr,
                     double *fwd, double *bwd, double *update)
{
    if (model->hardware) {
        sim_hardware_block(model->hardware, -1, state, fwd, bwd, update);
        return;
    }
    double phi[SIM_FEATURES_MAX];
    int cls = frozen_class(state), P = model->features;
    features(phi, state, csr, model->uses);
    *fwd = predict(model->beta[SIM_FWD][cls], phi, P);
    *bwd = predict(model->beta[SIM_BWD][cls], phi, P);
    *update = predict(model->beta[SIM_UPDATE][cls], phi, P);
}

void sim_model_unit(const struct sim_model *model, int half, const float *state, float csr,
                    double *fwd, double *bwd, double *update)
{
    double phi[SIM_FEATURES_MAX];
    int cls = frozen_class(state), P = model->features;
    features(phi, state, csr, model->uses);
    *fwd = predict(model->unit_beta[half][SIM_FWD][cls], phi, P);
    *bwd = predict(model->unit_beta[half][SIM_BWD][cls], phi, P);
    *update = predict(model->unit_beta[half][SIM_UPDATE][cls], phi, P);
}

void sim_model_block_at(const struct sim_model *model, int block, const float *state,
                        float csr, double *fwd, double *bwd, double *update)
{
    if (model->hardware) sim_hardware_block(model->hardware, block, state, fwd, bwd, update);
    else sim_model_block(model, state, csr, fwd, bwd, update);
}

/* ---- trajectories --------------------------------------------------------- */

/* The layers of shape that carry signal (its scheme's blocks, or every
 * layer of a per-layer signal) into layer; returns how many. */
static int carriers_of(const struct dyn_signal *signal, const struct gpt_shape *shape, int *layer)
{
    int n = 0;
    for (int l = 0; l < shape->layers; l++)
        if (dyn_signal_layer(signal, shape, l)) layer[n++] = l;
    return n;
}

/* The state of carrier `ordinal` of `target` at its relative depth in one
 * step's row of the source, interpolated between the two nearest of its
 * `count` carriers (at layers layer[]). */
static double at_depth(const float *row, const int *layer, int count, int ordinal, int target)
{
    double x = ((ordinal + 0.5) / target) * count - 0.5;
    int lo = x <= 0 ? 0 : (int)floor(x), hi = lo + 1 < count ? lo + 1 : count - 1;
    if (lo > count - 1) lo = count - 1;
    double w = x <= 0 ? 0.0 : x - lo;
    return (1 - w) * row[layer[lo]] + w * row[layer[hi]];
}

void sim_trajectory_map(struct sim_trajectory *out, const struct sim_trajectory *src,
                        const struct dm_config *cfg, int blocks, int steps)
{
    trajectory_alloc(out, steps, blocks);
    int L = src->blocks;
    struct dm_config deeper = *cfg;
    deeper.layers = blocks;
    struct gpt_shape from = dyn_shape_from_config(cfg), to = dyn_shape_from_config(&deeper);
    int *source = dm_alloc((size_t)(L > 0 ? L : 1) * sizeof(int));
    int *ordinal = dm_alloc((size_t)blocks * sizeof(int));
    for (int k = 0; k < sim_state_count(); k++) {
        out->present[k] = src->present[k];
        const struct dyn_signal *signal = sim_state_signal(k);
        int count = carriers_of(signal, &from, source), target = 0;
        for (int j = 0; j < blocks; j++)
            ordinal[j] = dyn_signal_layer(signal, &to, j) ? target++ : -1;
        for (int t = 0; t < steps; t++) {
            long from_row = (long)((double)t * src->steps / steps) * L;
            for (int j = 0; j < blocks; j++) {
                double value = ordinal[j] < 0 || !count ? sim_state_neutral(k)
                             : at_depth(src->value[k] + from_row, source, count, ordinal[j],
                                        target);
                if (sim_state_role(k) == DYN_COST_FROZEN)   /* frozen blocks stay a prefix */
                    value = value >= 0.5 && (j == 0 || out->value[k][(long)t * blocks + j - 1]);
                out->value[k][(long)t * blocks + j] = (float)value;
            }
        }
    }
    dm_free(source);
    dm_free(ordinal);
}

/* The columns of a scenario's header: -2 step, -1 block, else a state. */
static int scenario_header(const char *path, char *line, int *column, int *count)
{
    *count = 0;
    int have_step = 0, have_block = 0, states = 0;
    char names[512] = "";
    for (int k = 0; k < sim_state_count(); k++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                 sim_state_name(k));
    for (char *field = strtok(line, ",\r\n"); field; field = strtok(NULL, ",\r\n")) {
        while (*field == ' ') field++;
        int c = !strcmp(field, "step") ? -2 : !strcmp(field, "block") ? -1 : -3;
        for (int k = 0; c == -3 && k < sim_state_count(); k++)
            if (!strcmp(field, sim_state_name(k))) c = k;
        if (c == -3)
            dm_user_error("simulate: %s:1: unknown column '%s' (step, block, %s)", path, field,
                          names);
        if (*count >= 2 + sim_state_count())
            dm_user_error("simulate: %s:1: too many columns", path);
        have_step |= c == -2;
        have_block |= c == -1;
        states += c >= 0;
        column[(*count)++] = c;
    }
    if (!have_step || !have_block || !states)
        dm_user_error("simulate: %s:1: the header must name step, block and at least one of "
                      "%s", path, names);
    return 0;
}

struct scenario_row {
    long step;
    int block;
    float value[SIM_STATES_MAX];
};

/* The largest value a scenario may give state k, by its role. */
static double scenario_high(int k)
{
    switch (sim_state_role(k)) {
    case DYN_COST_SPARSITY: return 0.999999;   /* a block keeps a weight */
    case DYN_COST_BUSIEST_RANK: return DYN_COST_BUSIEST_MAX;
    default: return 1;
    }
}

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
    int column[2 + SIM_STATES_MAX], columns = 0;
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
        for (int k = 0; k < sim_state_count(); k++) r->value[k] = sim_state_neutral(k);
        int c = 0;
        for (char *field = strtok(line, ",\n"); field; field = strtok(NULL, ",\n"), c++) {
            if (c >= columns) dm_user_error("simulate: %s:%ld: more fields than the header's %d",
                                            path, number, columns);
            const char *name = column[c] == -2 ? "step" : column[c] == -1 ? "block"
                             : sim_state_name(column[c]);
            double v = scenario_number(path, number, field, name, column[c] == -2 ? 1 : 0,
                                       column[c] == -2 ? 1e9 : column[c] == -1 ? 1e6
                                                     : scenario_high(column[c]));
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
    int present[SIM_STATES_MAX] = {0};
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
    int frozen_state = sim_state_of_role(DYN_COST_FROZEN);
    long current = 0, next = 0;   /* first rows of the step in force and of the next listed */
    while (next < count && rows[next].step == rows[0].step) next++;
    for (int t = 0; t < steps; t++) {
        while (next < count && rows[next].step <= t + 1) {
            current = next;
            while (next < count && rows[next].step == rows[current].step) next++;
        }
        for (long r = current; r < next; r++)
            for (int k = 0; k < sim_state_count(); k++)
                out->value[k][(long)t * blocks + rows[r].block] = rows[r].value[k];
        const float *frozen = frozen_state >= 0 ? out->value[frozen_state] + (long)t * blocks
                                                : NULL;
        for (int b = 1; frozen && b < blocks; b++)
            if (frozen[b] != 0 && frozen[b - 1] == 0)
                dm_user_error("simulate: %s: at step %d block %d is frozen but block %d is "
                              "not (frozen blocks are a prefix)", path, t + 1, b, b - 1);
    }
    free(rows);
}
