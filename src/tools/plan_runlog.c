/* `dynmo plan --from-run DIR --step N`: one step's per-block costs, the
 * run's layout and micro-batches, and the processor sharing it recorded,
 * read from DIR/runlog.h5 (docs/balance.md).
 *
 * The profile: /layers/fwd_ms and /layers/bwd_ms (per micro-batch),
 * parameters per block from the model config (model.channels, and the
 * mixture-of-experts keys, whose blocks are larger; nonzero ones when the log has
 * /layers/sparsity), slab bytes of a dense block, and the embedding and
 * head as the first and last stage's compute per micro-batch beyond their
 * blocks (/stages/busy_ms), a third forward, two thirds backward. Where
 * the log has /layers/update_ms and /stages/update_ms for every step, the
 * blocks' updates come from the first, the stages' update time leaves their
 * per-micro-batch compute, and the embedding's and head's updates are the
 * first and last stage's update beyond their blocks'.
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
#include "tools/plan.h"

static long config_value(const char *text, const char *key, long fallback)
{
    size_t n = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, key, n) && p[n] == ' ') return strtol(strchr(p, '=') + 1, NULL, 10);
    return fallback;
}

/* The model (its channels, layers and the schemes' extensions, which make
 * blocks differ in size) and the micro-batches from the run's config (the
 * root attribute config). */
static void read_run_config(const char *path, struct gpt_shape *shape, int *micro_batches)
{
    char err[512];
    char *config = NULL;
    if (runlog_read_root_attr(path, "config", &config, err, sizeof err) != 0)
        dm_user_error("--from-run: %s", err);
    struct dm_config cfg;   /* the keys that size the blocks, the schemes' with them */
    config_defaults(&cfg);
    cfg.channels = (int)config_value(config, "model.channels", 0);
    cfg.layers = (int)config_value(config, "model.layers", 0);
    cfg.moe_every = (int)config_value(config, "model.moe_every", 0);
    cfg.experts = (int)config_value(config, "model.experts", 0);
    cfg.expert_hidden = (int)config_value(config, "model.expert_hidden", 0);
    *micro_batches = (int)config_value(config, "train.micro_batches", 1);
    free(config);
    if (cfg.channels <= 0 || cfg.layers <= 0 || cfg.moe_every < 0 ||
        (cfg.moe_every > 0 && cfg.experts <= 0))
        dm_user_error("--from-run: %s has no model config", path);
    *shape = dyn_shape_from_config(&cfg);
}

/* The steps the log holds; *with_update when it has the blocks' updates
 * for every one of them (a resumed log of an older dynmo starts them
 * late, and then none are used). */
static long read_run_steps(const char *path, int *with_update)
{
    char err[512];
    float *rows = NULL;
    int ncols = 0;
    long nsteps = runlog_read_matrix(path, RUNLOG_LAYER_FWD_MS, &rows, &ncols, err, sizeof err);
    if (nsteps < 0) dm_user_error("--from-run: %s", err);
    free(rows);
    rows = NULL;
    *with_update = runlog_read_matrix(path, RUNLOG_LAYER_UPDATE_MS, &rows, &ncols, err,
                                      sizeof err) == nsteps;
    free(rows);
    return nsteps;
}

/* The blocks' times, parameters, memory and updates (zeros without
 * updates) at step (1-based) into in's arrays, which it allocates. */
static void read_run_blocks(struct plan_input *in, const char *path, long step,
                            const struct gpt_shape *shape, int with_update)
{
    char err[512];
    int L = in->blocks;
    in->fwd_ms = dm_alloc((size_t)L * sizeof(double));
    in->bwd_ms = dm_alloc((size_t)L * sizeof(double));
    in->params = dm_alloc((size_t)L * sizeof(double));
    in->mem_bytes = dm_alloc((size_t)L * sizeof(int64_t));
    in->update_ms = dm_alloc((size_t)L * sizeof(double));
    float *fwd = dm_alloc((size_t)L * sizeof(float)), *bwd = dm_alloc((size_t)L * sizeof(float));
    float *sparsity = dm_alloc((size_t)L * sizeof(float));
    float *update = dm_alloc((size_t)L * sizeof(float));
    if (runlog_read_row(path, RUNLOG_LAYER_FWD_MS, step - 1, fwd, L, err, sizeof err) ||
        runlog_read_row(path, RUNLOG_LAYER_BWD_MS, step - 1, bwd, L, err, sizeof err))
        dm_user_error("--from-run: %s", err);
    if (runlog_read_row(path, "/layers/sparsity", step - 1, sparsity, L, err, sizeof err))
        memset(sparsity, 0, (size_t)L * sizeof(float));
    if (with_update &&
        runlog_read_row(path, RUNLOG_LAYER_UPDATE_MS, step - 1, update, L, err, sizeof err))
        dm_user_error("--from-run: %s", err);
    for (int l = 0; l < L; l++) {
        double size = (double)gpt_block_param_count(shape, l);
        in->fwd_ms[l] = fwd[l];
        in->bwd_ms[l] = bwd[l];
        in->params[l] = floor(size * (1.0 - sparsity[l]) + 0.5);
        in->mem_bytes[l] = (int64_t)(16 * size);
        in->update_ms[l] = update[l];
    }
    dm_free(fwd);
    dm_free(bwd);
    dm_free(sparsity);
    dm_free(update);
}

/* The layout at step (its stages are the leading positive entries of the
 * history's row); *width is the history's row width. It must cover the
 * run's `layers` blocks: the end stages' extras are read through it. */
static void read_run_layout(const char *path, long step, int layers, int **layout,
                            int *stages, int *width)
{
    char err[512];
    int *history = NULL;
    if (runlog_read_int_matrix(path, RUNLOG_LAYOUT_HISTORY, &history, width, err,
                               sizeof err) < step)
        dm_user_error("--from-run: %s has no layout for step %ld", path, step);
    int S = 0;
    long covered = 0;
    while (S < *width && history[(step - 1) * *width + S] > 0)
        covered += history[(step - 1) * *width + S++];
    if (S == 0)
        dm_user_error("--from-run: %s has no layout for step %ld", path, step);
    if (covered != layers)
        dm_user_error("--from-run: %s: the layout at step %ld covers %ld blocks, but "
                      "model.layers is %d", path, step, covered, layers);
    *stages = S;
    *layout = dm_alloc((size_t)S * sizeof(int));
    memcpy(*layout, history + (step - 1) * *width, (size_t)S * sizeof(int));
    free(history);
}

/* The embedding and head: the first and last stage's time beyond their
 * blocks' (balance_end_stage_extras). */
static void read_run_ends(struct plan_input *in, const char *path, long step,
                          const int *layout, int S, int width, int micro_batches,
                          int with_update)
{
    char err[512];
    float *busy = dm_alloc((size_t)width * sizeof(float));
    float *stage_update = dm_alloc((size_t)width * sizeof(float));
    if (runlog_read_row(path, RUNLOG_STAGE_BUSY_MS, step - 1, busy, width, err, sizeof err))
        dm_user_error("--from-run: %s", err);
    if (with_update && runlog_read_row(path, RUNLOG_STAGE_UPDATE_MS, step - 1, stage_update,
                                       width, err, sizeof err))
        dm_user_error("--from-run: %s", err);
    double ends_busy[2] = {busy[0], busy[S - 1]};
    double ends_update[2] = {stage_update[0], stage_update[S - 1]};
    balance_end_stage_extras(in->fwd_ms, in->bwd_ms, in->update_ms, layout, S, micro_batches,
                             ends_busy, ends_update, &in->profile.embed, &in->profile.head);
    dm_free(busy);
    dm_free(stage_update);
}

void plan_read_run(struct plan_input *in, const char *dir, long step, int **layout,
                   int *stages, int *micro_batches)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/" RUNLOG_FILE_NAME, dir);
    struct gpt_shape shape;
    int with_update;
    read_run_config(path, &shape, micro_batches);
    int layers = shape.layers;
    long nsteps = read_run_steps(path, &with_update);
    if (step < 1 || step > nsteps)
        dm_user_error("--step %ld: %s has steps 1..%ld", step, path, nsteps);
    memset(in, 0, sizeof *in);
    in->blocks = layers;
    read_run_blocks(in, path, step, &shape, with_update);
    int width = 0;
    read_run_layout(path, step, layers, layout, stages, &width);
    read_run_ends(in, path, step, *layout, *stages, width, *micro_batches, with_update);
    if (with_update) in->profile.update_ms = in->update_ms;
    in->has_embed = in->has_head = 1;
    in->profile.blocks = layers;
    in->profile.fwd_ms = in->fwd_ms;
    in->profile.bwd_ms = in->bwd_ms;
    in->profile.params = in->params;
    in->profile.mem_bytes = in->mem_bytes;
}

/* group_turns: absent in logs from before parallel.turns (fluid), else one
 * value, 0 or 1. */
static int read_run_turns(const char *path)
{
    char err[768];
    int *turns = NULL;
    long turns_count = runlog_read_root_ints(path, RUNLOG_ATTR_GROUP_TURNS, &turns, err,
                                             sizeof err);
    if (turns_count < 0) dm_user_error("--from-run: %s", err);
    if (turns_count > 1 || (turns_count == 1 && turns[0] != 0 && turns[0] != 1))
        dm_user_error("--from-run: %s: the attribute %s must be one value, 0 or 1", path,
                      RUNLOG_ATTR_GROUP_TURNS);
    int took_turns = turns_count == 1 && turns[0] == 1;
    dm_free(turns);
    return took_turns;
}

void plan_sharing_from_run(struct plan_sharing *ps, const char *dir, int run_stages,
                           int stages)
{
    char path[1200], err[768];
    snprintf(path, sizeof path, "%s/" RUNLOG_FILE_NAME, dir);
    int *group = NULL;
    double *cores = NULL;
    long group_count = runlog_read_root_ints(path, RUNLOG_ATTR_STAGE_GROUPS, &group, err,
                                             sizeof err);
    if (group_count < 0) dm_user_error("--from-run: %s", err);
    long core_count = runlog_read_root_doubles(path, RUNLOG_ATTR_GROUP_CORES, &cores, err,
                                               sizeof err);
    if (core_count < 0) dm_user_error("--from-run: %s", err);
    int took_turns = read_run_turns(path);
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
