/* `dynmo plan --from-run DIR --step N`: one step's per-block costs, the
 * run's layout and micro-batches, and the processor sharing it recorded,
 * read from DIR/runlog.h5 (docs/balance.md).
 *
 * The profile: /layers/fwd_ms and /layers/bwd_ms (per micro-batch),
 * parameters per block from the model the config describes (a scheme's
 * blocks may be larger; nonzero ones when the log has the per-layer
 * signal a scheme declares as sparsity, /layers/sparsity), slab bytes of a dense block, and the embedding and
 * head as the first and last stage's compute per micro-batch beyond their
 * blocks (/stages/busy_ms), a third forward, two thirds backward. Where
 * the log has /layers/update_ms and /stages/update_ms for every step, the
 * blocks' updates come from the first, the stages' update time leaves their
 * per-micro-batch compute, and the embedding's and head's updates are the
 * first and last stage's update beyond their blocks'. An interleaved
 * run's chunks (/layout/chunks) become the layout, its ends the first and
 * last chunk's; a zb run's weight parts come from /layers/wgrad_ms.
 *
 * Must not: write to the log, or go on past a missing or bad dataset (a
 * user error naming it, exit 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "tools/plan/plan.h"

/* A problem with the run log: one message naming it, exit 2. */
#define run_error(f, ...) runlog_file_fail((f), "--from-run", __VA_ARGS__)

/* The model (its channels, layers and the schemes' extensions, which make
 * blocks differ in size), the micro-batches, units and schedule from the
 * run's config (the root attribute config, checked key by key:
 * runlog_file_config). */
static void read_run_config(struct runlog_file *f, struct gpt_shape *shape,
                            struct plan_run *run)
{
    char err[1200];
    struct dm_config cfg;
    int status = runlog_file_config(f, &cfg, err, sizeof err);
    if (status < 0) run_error(f, "%s", err);
    if (status > 0) run_error(f, "%s has no model config", runlog_file_path(f));
    *shape = dyn_shape_from_config(&cfg);
    run->micro_batches = cfg.micro_batches;
    run->units = balance_units_parse(cfg.units) == BALANCE_UNITS_SUBLAYER
                     ? BALANCE_UNITS_SUBLAYER : BALANCE_UNITS_BLOCK;
    run->schedule = config_schedule(&cfg);
    run->virtual_stages = run->schedule == DM_SCHEDULE_INTERLEAVED ? cfg.virtual_stages : 1;
}

/* The steps the log holds; *with_update when it has the blocks' updates
 * for every one of them (a resumed log of an older dynmo starts them
 * late, and then none are used). */
static long read_run_steps(struct runlog_file *f, int *with_update, int units)
{
    int sublayer = units == BALANCE_UNITS_SUBLAYER;
    const char *fwd_name = sublayer ? RUNLOG_UNIT_FWD_MS : RUNLOG_LAYER_FWD_MS;
    const struct runlog_dataset_info *fwd = runlog_file_dataset(f, fwd_name);
    const struct runlog_dataset_info *update =
        runlog_file_dataset(f, sublayer ? RUNLOG_UNIT_UPDATE_MS : RUNLOG_LAYER_UPDATE_MS);
    if (!fwd || fwd->rank != 2)
        run_error(f, "%s has no dataset %s", runlog_file_path(f), fwd_name);
    *with_update = update && update->rank == 2 && update->dims[0] == fwd->dims[0];
    return fwd->dims[0];
}

/* One step's row of a dataset of `width` columns into row, the first n
 * each a time >= 0 (a step the log does not hold has NaN). */
static void read_times(struct runlog_file *f, const char *name, long step, float *row,
                       int width, int n, const char *what)
{
    char err[1200];
    if (runlog_file_row(f, name, step - 1, row, width, err, sizeof err)) run_error(f, "%s", err);
    for (int i = 0; i < n; i++)
        if (!(row[i] >= 0) || !isfinite(row[i]))
            run_error(f, "%s: %s %d at step %ld has %g ms in %s (measured times are >= 0; a "
                      "step the log does not hold has NaN)", runlog_file_path(f), what, i,
                      step, (double)row[i], name);
}

/* The mean of the first n columns of a dataset (rows of `width`) over
 * the steps of the range. */
static void mean_times(struct runlog_file *f, const char *name, const struct plan_steps *steps,
                       float *row, int width, double *mean, int n, const char *what)
{
    for (int i = 0; i < n; i++) mean[i] = 0.0;
    for (long t = steps->first; t <= steps->last; t++) {
        read_times(f, name, t, row, width, n, what);
        for (int i = 0; i < n; i++) mean[i] += row[i];
    }
    for (int i = 0; i < n; i++) mean[i] /= (double)(steps->last - steps->first + 1);
}

/* The units' times (means over the steps), parameters, memory and
 * updates (zeros without updates) into in's arrays, which it allocates:
 * the blocks' (/layers/), or with sublayer units each half's (/units/;
 * block j's attention 2j, its MLP 2j + 1, a block's sparsity for both);
 * the sparsity is the last step's. */
static void read_run_blocks(struct plan_input *in, struct runlog_file *f,
                            const struct plan_steps *steps, const struct gpt_shape *shape,
                            int with_update, int units)
{
    char err[1200];
    int L = in->blocks, per = balance_units_per_block(units);
    const char *fwd_name = per == 2 ? RUNLOG_UNIT_FWD_MS : RUNLOG_LAYER_FWD_MS;
    const char *bwd_name = per == 2 ? RUNLOG_UNIT_BWD_MS : RUNLOG_LAYER_BWD_MS;
    const char *update_name = per == 2 ? RUNLOG_UNIT_UPDATE_MS : RUNLOG_LAYER_UPDATE_MS;
    in->fwd_ms = dm_alloc((size_t)L * sizeof(double));
    in->bwd_ms = dm_alloc((size_t)L * sizeof(double));
    in->params = dm_alloc((size_t)L * sizeof(double));
    in->mem_bytes = dm_alloc((size_t)L * sizeof(int64_t));
    in->update_ms = dm_alloc((size_t)L * sizeof(double));
    float *row = dm_alloc((size_t)L * sizeof(float)), *sparsity = dm_alloc((size_t)L * sizeof(float));
    const char *what = per == 2 ? "unit" : "block";
    mean_times(f, fwd_name, steps, row, L, in->fwd_ms, L, what);
    mean_times(f, bwd_name, steps, row, L, in->bwd_ms, L, what);
    if (with_update) mean_times(f, update_name, steps, row, L, in->update_ms, L, what);
    /* The pruned share of each block's matrices: the per-layer signal a
     * scheme declares as sparsity (dyn.h's cost roles). */
    const struct dyn_signal *pruned = dyn_signal_of_cost(DYN_COST_SPARSITY);
    if (pruned && pruned->columns == DYN_SIGNAL_LAYERS && runlog_file_dataset(f, pruned->dataset) &&
        runlog_file_row(f, pruned->dataset, steps->last - 1, sparsity, L / per, err, sizeof err))
        run_error(f, "%s", err);
    for (int u = L - 1; per == 2 && u >= 0; u--) sparsity[u] = sparsity[u / 2];
    for (int l = 0; l < L; l++) {
        if (!(sparsity[l] >= 0 && sparsity[l] <= 1))
            run_error(f, "%s: %s %d at step %ld has sparsity %g (a sparsity is in [0, 1])",
                      runlog_file_path(f), what, l, steps->last, (double)sparsity[l]);
        int half = per == 1 ? BLOCK_HALVES : l % 2 ? BLOCK_HALF_MLP : BLOCK_HALF_ATTENTION;
        double size = (double)gpt_unit_param_count(shape, l / per, half);
        in->params[l] = floor(size * (1.0 - sparsity[l]) + 0.5);
        in->mem_bytes[l] = (int64_t)(16 * size);
    }
    dm_free(row);
    dm_free(sparsity);
}

/* counts[0..n) of a row of layouts (width columns) as the plan's layout:
 * the same in every step of the range (a re-layout inside it mixes two
 * layouts' times), halved when a sublayer run is planned in whole blocks
 * (no block split). dm_alloc'd. */
static int *range_layout(struct runlog_file *f, const char *name, const int *rows, int width,
                         int n, const struct plan_steps *steps, int halve)
{
    const int *last = rows + (steps->last - 1) * width;
    for (long t = steps->first; t < steps->last; t++)
        if (memcmp(rows + (t - 1) * width, last, (size_t)n * sizeof(int)))
            run_error(f, "%s: %s differs at steps %ld and %ld (a re-layout inside steps "
                      "%ld-%ld): give --step a range of one layout", runlog_file_path(f), name,
                      t, steps->last, steps->first, steps->last);
    int *layout = dm_alloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        if (halve && last[i] % 2)
            run_error(f, "%s: %s at step %ld splits a block (entry %d holds %d units): plan "
                      "it in the run's sublayer units (leave out --units block)",
                      runlog_file_path(f), name, steps->last, i, last[i]);
        layout[i] = halve ? last[i] / 2 : last[i];
    }
    return layout;
}

/* The layout over the range: its rows of the history, layouts of the
 * run's `layers` units (runlog_file_layouts); *width is the history's row
 * width. The end stages' extras are read through it. */
static void read_run_layout(struct runlog_file *f, const struct plan_steps *steps, int layers,
                            int halve, int **layout, int *stages, int *width)
{
    char err[1200];
    struct runlog_layouts l;
    if (runlog_file_layouts(f, layers, &l, err, sizeof err) < 0) run_error(f, "%s", err);
    long step = steps->last;
    if (step > l.rows || l.stages[step - 1] == 0) {
        runlog_layouts_free(&l);
        run_error(f, "%s has no layout for step %ld", runlog_file_path(f), step);
    }
    *width = l.width;
    *stages = l.stages[step - 1];
    *layout = range_layout(f, RUNLOG_LAYOUT_HISTORY, l.counts, l.width, l.width, steps, halve);
    runlog_layouts_free(&l);
}

/* Under interleaved, the chunks' layout over the range (/layout/chunks):
 * S v counts over the run's units. */
static int *read_run_chunks(struct runlog_file *f, const struct plan_steps *steps, int S, int V,
                            int units, int halve)
{
    char err[1200];
    const struct runlog_dataset_info *d = runlog_file_dataset(f, RUNLOG_LAYOUT_CHUNKS);
    if (!d || d->rank != 2 || d->dims[1] != (long)S * V)
        run_error(f, "%s: an interleaved run of %d stages x %d chunks needs %s with %d "
                  "columns", runlog_file_path(f), S, V, RUNLOG_LAYOUT_CHUNKS, S * V);
    int *rows = NULL, width = 0;
    long count = runlog_file_int_matrix(f, RUNLOG_LAYOUT_CHUNKS, &rows, &width, err, sizeof err);
    if (count < 0) run_error(f, "%s", err);
    if (steps->last > count)
        run_error(f, "%s: %s has no row for step %ld", runlog_file_path(f),
                  RUNLOG_LAYOUT_CHUNKS, steps->last);
    long sum = 0;
    int bad = 0;
    for (int c = 0; c < S * V; c++) {
        int n = rows[(steps->last - 1) * width + c];
        bad |= n < 1;
        sum += n;
    }
    if (bad || sum != units)
        run_error(f, "%s: %s at step %ld is not a layout of the run's %d units over %d "
                  "chunks (each at least one)", runlog_file_path(f), RUNLOG_LAYOUT_CHUNKS,
                  steps->last, units, S * V);
    int *chunks = range_layout(f, RUNLOG_LAYOUT_CHUNKS, rows, width, S * V, steps, halve);
    dm_free(rows);
    return chunks;
}

/* The embedding and head: the first and last stage's time beyond their
 * blocks (balance_end_stage_extras), over the range's mean; under
 * interleaved the first and last chunk's, their stage's less its other
 * chunks' blocks. */
static void read_run_ends(struct plan_input *in, struct runlog_file *f,
                          const struct plan_steps *steps, const struct plan_run *run, int width,
                          int with_update)
{
    int S = run->stages, V = S * run->virtual_stages;
    float *row = dm_alloc((size_t)width * sizeof(float));
    double *times = dm_alloc((size_t)2 * (width + V) * sizeof(double));
    double *compute = times, *update = times + width, *vcompute = times + 2 * width,
           *vupdate = vcompute + V;
    mean_times(f, RUNLOG_STAGE_BUSY_MS, steps, row, width, compute, S, "stage");
    if (with_update)
        mean_times(f, RUNLOG_STAGE_UPDATE_MS, steps, row, width, update, S, "stage");
    const int *layout = run->chunk_layout ? run->chunk_layout : run->layout;
    if (run->chunk_layout)
        balance_chunk_stage_times(in->fwd_ms, in->bwd_ms, in->update_ms, run->chunk_layout, S,
                                  run->virtual_stages, run->micro_batches, compute, update,
                                  vcompute, vupdate);
    else
        for (int s = 0; s < S; s++) {
            vcompute[s] = compute[s];
            vupdate[s] = update[s];
        }
    double ends_busy[2] = {vcompute[0], vcompute[V - 1]};
    double ends_update[2] = {vupdate[0], vupdate[V - 1]};
    balance_end_stage_extras(in->fwd_ms, in->bwd_ms, in->update_ms, layout, V,
                             run->micro_batches, ends_busy, ends_update, &in->profile.embed,
                             &in->profile.head);
    dm_free(times);
    dm_free(row);
}

/* Under zb, the units' weight parts (/layers/wgrad_ms, or /units/wgrad_ms
 * with sublayer units), their mean over the range, when the log has them
 * for every step; NULL otherwise. */
static double *read_run_wgrad(struct runlog_file *f, const struct plan_steps *steps, int L,
                              long nsteps, int units)
{
    const char *name = units == BALANCE_UNITS_SUBLAYER ? RUNLOG_UNIT_WGRAD_MS
                                                       : RUNLOG_LAYER_WGRAD_MS;
    const struct runlog_dataset_info *d = runlog_file_dataset(f, name);
    if (!d || d->rank != 2 || d->dims[0] != nsteps) return NULL;
    float *row = dm_alloc((size_t)L * sizeof(float));
    double *wgrad = dm_alloc((size_t)L * sizeof(double));
    mean_times(f, name, steps, row, L, wgrad, L,
               units == BALANCE_UNITS_SUBLAYER ? "unit" : "block");
    dm_free(row);
    return wgrad;
}

void plan_read_run(struct plan_input *in, const char *dir, const struct plan_steps *steps,
                   int as_blocks, struct plan_run *run)
{
    char path[1200], err[1200];
    snprintf(path, sizeof path, "%s/" RUNLOG_FILE_NAME, dir);
    struct runlog_file *f = runlog_open_read(path, err, sizeof err);
    if (!f) dm_user_error("--from-run: %s", err);
    struct gpt_shape shape;
    int with_update;
    memset(run, 0, sizeof *run);
    read_run_config(f, &shape, run);
    int logged = shape.layers * balance_units_per_block(run->units);   /* the log's units */
    int halve = as_blocks && run->units == BALANCE_UNITS_SUBLAYER;
    if (as_blocks) run->units = BALANCE_UNITS_BLOCK;
    int layers = shape.layers * balance_units_per_block(run->units);   /* the plan's */
    long nsteps = read_run_steps(f, &with_update, run->units);
    if (steps->first < 1 || steps->first > steps->last || steps->last > nsteps) {
        runlog_close_read(f);
        dm_user_error("--step %ld-%ld: %s has steps 1..%ld", steps->first, steps->last, path,
                      nsteps);
    }
    memset(in, 0, sizeof *in);
    in->blocks = layers;
    read_run_blocks(in, f, steps, &shape, with_update, run->units);
    int width = 0;
    read_run_layout(f, steps, logged, halve, &run->layout, &run->stages, &width);
    if (run->virtual_stages > 1)
        run->chunk_layout = read_run_chunks(f, steps, run->stages, run->virtual_stages, logged,
                                            halve);
    read_run_ends(in, f, steps, run, width, with_update);
    if (run->schedule == DM_SCHEDULE_ZB)
        in->wgrad_ms = read_run_wgrad(f, steps, layers, nsteps, run->units);
    runlog_close_read(f);
    if (with_update) in->profile.update_ms = in->update_ms;
    in->profile.wgrad_ms = in->wgrad_ms;
    in->has_embed = in->has_head = 1;
    in->profile.blocks = layers;
    in->profile.fwd_ms = in->fwd_ms;
    in->profile.bwd_ms = in->bwd_ms;
    in->profile.params = in->params;
    in->profile.mem_bytes = in->mem_bytes;
}

/* group_turns: absent in logs from before parallel.turns (fluid), else one
 * value, 0 or 1. */
static int read_run_turns(struct runlog_file *f)
{
    char err[1200];
    int *turns = NULL;
    long turns_count = runlog_file_attr_ints(f, RUNLOG_ATTR_GROUP_TURNS, &turns, err,
                                             sizeof err);
    if (turns_count < 0) run_error(f, "%s", err);
    if (turns_count > 1 || (turns_count == 1 && turns[0] != 0 && turns[0] != 1)) {
        dm_free(turns);
        run_error(f, "%s: the attribute %s must be one value, 0 or 1", runlog_file_path(f),
                  RUNLOG_ATTR_GROUP_TURNS);
    }
    int took_turns = turns_count == 1 && turns[0] == 1;
    dm_free(turns);
    return took_turns;
}

void plan_sharing_from_run(struct plan_sharing *ps, const char *dir, int run_stages,
                           int stages)
{
    char path[1200], err[1200];
    snprintf(path, sizeof path, "%s/" RUNLOG_FILE_NAME, dir);
    struct runlog_file *f = runlog_open_read(path, err, sizeof err);
    if (!f) dm_user_error("--from-run: %s", err);
    int *group = NULL;
    double *cores = NULL;
    long group_count = runlog_file_attr_ints(f, RUNLOG_ATTR_STAGE_GROUPS, &group, err,
                                             sizeof err);
    if (group_count < 0) run_error(f, "%s", err);
    long core_count = runlog_file_attr_doubles(f, RUNLOG_ATTR_GROUP_CORES, &cores, err,
                                               sizeof err);
    if (core_count < 0) run_error(f, "%s", err);
    int took_turns = read_run_turns(f);
    runlog_close_read(f);
    if (!group_count && !core_count) return;
    if (!group_count || !core_count)
        dm_user_error("--from-run: %s has the attribute %s but not %s (both or neither)",
                      path, group_count ? RUNLOG_ATTR_STAGE_GROUPS : RUNLOG_ATTR_GROUP_CORES,
                      group_count ? RUNLOG_ATTR_GROUP_CORES : RUNLOG_ATTR_STAGE_GROUPS);
    if (group_count != run_stages)
        dm_user_error("--from-run: %s: stage_groups has %ld entries but the run "
                      "has %d stages", path, group_count, run_stages);
    struct balance_sharing sharing = {run_stages, (int)core_count, group, cores, took_turns};
    if (balance_check_sharing(&sharing, err, sizeof err))
        dm_user_error("--from-run: %s: stage_groups and group_cores: %s", path, err);
    if (stages != run_stages) {
        snprintf(ps->note, sizeof ps->note, "the run's %d stages shared "
                 "processors, but --stages is %d", run_stages, stages);
        dm_free(group);
        dm_free(cores);
        return;
    }
    ps->group = group;
    ps->cores = cores;
    ps->sharing = sharing;
    ps->from_run = 1;
}
