/* Layer freezing (dyn.kind=freeze), in the spirit of Egeria and
 * PipeTransformer: blocks that have stopped learning stop training, front
 * to back.
 *
 * The criterion uses only the global per-block gradient norms that the
 * engine passes to after_reduce (the same numbers on every rank), never a
 * time: for the first block that is not frozen yet, every freeze_every
 * steps, compare the mean gradient norm of the last freeze_window steps
 * (a) with that of the freeze_window steps before (b); when
 * |a - b| / b < freeze_threshold the block freezes, and the next block is
 * tested the same way at the same check, up to freeze_per_check blocks
 * (default 1, as Egeria). At most freeze_max blocks freeze (default: all but
 * the last). A decision made after the reduction of step s takes effect
 * at once: step s's optimizer update already skips the block (its
 * gradient of step s is dropped), the same on every rank and every layout,
 * and a checkpoint written after step s holds the flag.
 *
 * The frozen flag lives in each block's slab (struct block.frozen, pack
 * flag BLOCK_FLAG_FROZEN): it migrates with the block and is saved in
 * checkpoints. The scheme's own state, the gradient-norm history, is saved
 * too (state_save: the window, the depth, the steps recorded and the ring),
 * so that a resumed run decides at the same steps as one that never
 * stopped; a checkpoint without it (or with another window) starts the
 * window again. The frozen prefix is recovered from the blocks (one
 * reduction over the pipeline at the first step). Freezing is
 * prefix-only, so a frozen block always has every block before it frozen
 * and does no backward at all (gpt_backward skips it, and skips the
 * embedding's gradient). This file must not look at the layout or at
 * timings. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dyn/scheme.h"

extern const struct dyn_scheme dyn_scheme_freeze;   /* below; frozen_of_log asks about it */

struct freeze {
    int layers, window, every, max_frozen, per_check;
    double threshold;
    MPI_Comm comm;
    int prefix;          /* blocks [0, prefix) are frozen */
    int started;         /* prefix recovered from the slabs */
    long recorded;       /* steps in the history since the (re)start */
    double *history;     /* (layers, 2 * window) ring of gradient norms */
};

static void freeze_check(const struct dm_config *cfg)
{
    if (strcmp(cfg->dyn_kind, "freeze") != 0) return;
    if (cfg->freeze_max > cfg->layers)
        dm_user_error("dyn.freeze_max = %d exceeds model.layers = %d", cfg->freeze_max,
                      cfg->layers);
    long norms = (long)cfg->layers * 2 * cfg->freeze_window;
    if (norms + 3 > DYN_STATE_MAX)
        dm_user_error("dyn.freeze_window = %d over %d blocks keeps %ld gradient norms, more "
                      "than a checkpoint holds (%ld): choose a shorter window",
                      cfg->freeze_window, cfg->layers, norms, DYN_STATE_MAX - 3);
}

static void *freeze_create(const struct dm_config *cfg, const struct dyn_env *env)
{
    struct freeze *f = dm_alloc(sizeof *f);
    f->layers = cfg->layers;
    f->window = cfg->freeze_window;
    f->every = cfg->freeze_every;
    f->threshold = cfg->freeze_threshold;
    f->per_check = cfg->freeze_per_check;
    f->max_frozen = cfg->freeze_max < 0 ? cfg->layers - 1 : cfg->freeze_max;
    f->comm = env->pipeline_comm;
    f->history = dm_alloc((size_t)cfg->layers * 2 * (size_t)f->window * sizeof(double));
    return f;
}

static void freeze_destroy(void *state, struct gpt *model)
{
    (void)model;
    struct freeze *f = state;
    dm_free(f->history);
    dm_free(f);
}

/* Marks this rank's blocks and models (its chunks) with the current
 * prefix. A block that freezes now has this step's gradients, which no one
 * zeroes after (frozen blocks' gradients stay zero: struct block), so they
 * go now. */
static void apply_prefix(const struct freeze *f, struct gpt *const *models, int count)
{
    for (int c = 0; c < count; c++) {
        struct gpt *model = models[c];
        model->frozen_prefix = f->prefix;
        for (int i = 0; i < model->num_blocks; i++) {
            struct block *blk = &model->blocks[i];
            int frozen = model->first_block + i < f->prefix;
            if (frozen && !blk->frozen)
                backend_current()->zero(blk->grads, blk->nparams * sizeof(float));
            blk->frozen = frozen;
        }
    }
}

static void freeze_before_step(void *state, struct gpt *const *models, int count, int step)
{
    (void)step;
    struct freeze *f = state;
    if (!f->started) {
        /* After a resume the flags are in the blocks: count them over the
         * pipeline (freezing is prefix-only, so the count is the prefix). */
        int mine = 0, total = 0;   /* a block split over two stages counts once */
        for (int c = 0; c < count; c++)
            for (int i = 0; i < models[c]->num_blocks; i++)
                mine += models[c]->blocks[i].frozen &&
                        models[c]->blocks[i].halves != BLOCK_HALF_MLP;
        MPI_Request req;
        WORLD_MPI(MPI_Iallreduce(&mine, &total, 1, MPI_INT, MPI_SUM, f->comm, &req));
        world_wait(&req);
        if (total > f->prefix) f->prefix = total;
        f->started = 1;
    }
    apply_prefix(f, models, count);
}

static double window_mean(const struct freeze *f, int layer, long newest_back)
{
    /* mean of the window steps ending newest_back steps before the newest */
    int W2 = 2 * f->window;
    double sum = 0.0;
    for (int k = 0; k < f->window; k++) {
        long r = f->recorded - 1 - newest_back - k;
        sum += f->history[(size_t)layer * W2 + (size_t)(r % W2)];
    }
    return sum / f->window;
}

static void freeze_after_reduce(void *state, struct gpt *const *models, int count, int step,
                                const double *block_sumsq)
{
    struct freeze *f = state;
    int W2 = 2 * f->window;
    for (int l = 0; l < f->layers; l++)
        f->history[(size_t)l * W2 + (size_t)(f->recorded % W2)] = sqrt(block_sumsq[l]);
    f->recorded++;
    if ((step + 1) % f->every != 0 || f->recorded < W2) return;
    for (int n = 0; n < f->per_check && f->prefix < f->max_frozen; n++) {
        double recent = window_mean(f, f->prefix, 0);
        double before = window_mean(f, f->prefix, f->window);
        if (!(before > 0.0) || fabs(recent - before) / before >= f->threshold) break;
        f->prefix++;
    }
    /* At once: this step's optimizer update already skips the new frozen
     * blocks, and a checkpoint written after this step holds their flags. */
    apply_prefix(f, models, count);
}

static void freeze_describe(const void *state, struct gpt *const *models, int count, char *buf,
                            size_t size)
{
    (void)models;
    (void)count;
    const struct freeze *f = state;
    snprintf(buf, size, "frozen %d/%d", f->prefix, f->layers);
}

/* The state as doubles: window, layers, steps recorded, then the ring. */
static long freeze_state_size(const void *state)
{
    const struct freeze *f = state;
    return 3 + (long)f->layers * 2 * f->window;
}

static void freeze_state_save(const void *state, double *out)
{
    const struct freeze *f = state;
    out[0] = f->window;
    out[1] = f->layers;
    out[2] = (double)f->recorded;
    memcpy(out + 3, f->history, (size_t)f->layers * 2 * (size_t)f->window * sizeof(double));
}

/* Whether in[0..n) is a freezing state for `layers` blocks: a window in
 * 1..1000000 steps (dyn.freeze_window's range), the depth, a whole count of
 * steps recorded, and the ring of finite non-negative gradient norms. */
static int freeze_state_check(const double *in, long n, int layers, char *err, size_t errsize)
{
    if (n < 3) {
        snprintf(err, errsize, "%ld values, fewer than its header's 3 (window, blocks, steps "
                 "recorded)", n);
        return -1;
    }
    if (!(in[0] >= 1.0 && in[0] <= 1e6) || in[0] != floor(in[0]) || in[1] != layers) {
        snprintf(err, errsize, "its header says a window of %g steps over %g blocks (a window "
                 "is 1..1000000 steps; the model has %d blocks)", in[0], in[1], layers);
        return -1;
    }
    long want = 3 + (long)layers * 2 * (long)in[0];
    if (n != want) {
        snprintf(err, errsize, "%ld values, but a window of %g steps over %d blocks takes %ld",
                 n, in[0], layers, want);
        return -1;
    }
    if (!(in[2] >= 0.0 && in[2] <= 1e15) || in[2] != floor(in[2])) {
        snprintf(err, errsize, "its count of recorded steps (%g) is not a count", in[2]);
        return -1;
    }
    for (long i = 3; i < n; i++)
        if (!(in[i] >= 0.0) || isinf(in[i])) {
            snprintf(err, errsize, "value %ld (block %ld of the window) is %g, not a gradient "
                     "norm (finite, >= 0)", i, (i - 3) / (2 * (long)in[0]), in[i]);
            return -1;
        }
    return 0;
}

/* Restores a state of this window and depth; another one does not fit
 * (the caller says the window starts again). */
static int freeze_state_restore(void *state, const double *in, long n, char *err,
                                size_t errsize)
{
    struct freeze *f = state;
    if (n < 3 || in[0] != f->window || in[1] != f->layers) {
        snprintf(err, errsize, "its gradient-norm window is %g steps over %g blocks, this "
                 "run's %d over %d: the window starts again", n >= 3 ? in[0] : 0.0,
                 n >= 3 ? in[1] : 0.0, f->window, f->layers);
        return -1;
    }
    if (freeze_state_check(in, n, f->layers, err, errsize) != 0) return -1;
    f->recorded = (long)in[2];
    memcpy(f->history, in + 3, (size_t)(n - 3) * sizeof(double));
    return 0;
}

static const char *const freeze_keys[] = {"dyn.freeze_window", "dyn.freeze_threshold",
                                          "dyn.freeze_every", "dyn.freeze_max",
                                          "dyn.freeze_per_check", NULL};

/* A frozen block does no update at the step's end: its update_ms is 0. */
static int frozen_figure_of(const struct dm_config *cfg)
{
    return !strcmp(cfg->dyn_kind, "freeze");
}

static void frozen_of_update(const struct dm_config *cfg, const struct gpt_shape *shape,
                             const float *row, float *layers)
{
    (void)cfg;
    for (int l = 0; l < shape->layers; l++)
        layers[l] = isfinite(row[l]) ? row[l] == 0.0f : row[l];
}

/* The cost model's frozen blocks in a log of a freeze run: those that did
 * no update (a log with the blocks' and the stages' update times). */
static float *frozen_of_log(const struct dyn_log_reader *rd, const struct gpt_shape *shape,
                            long rows)
{
    if (!dyn_scheme_active(&dyn_scheme_freeze, rd->cfg) ||
        !rd->has(rd->ctx, "/layers/update_ms") || !rd->has(rd->ctx, "/stages/update_ms"))
        return NULL;
    int L = shape->layers;
    float *update = dyn_log_floats(rd, "/layers/update_ms", rows, L);
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    for (long i = 0; i < rows * L; i++) m[i] = update[i] == 0.0f;
    dm_free(update);
    return m;
}

/* Not gathered (read NULL): readers derive it from /layers/update_ms, and
 * a simulation writes it (docs/simulate.md). */
static const struct dyn_signal freeze_signals[] = {
    {.dataset = "/layers/frozen",
     .label = "frozen",
     .unit = "1 = frozen",
     .meaning = "1 when the block was frozen (did no update at the step's end)",
     .columns = DYN_SIGNAL_LAYERS,
     .combine = DYN_COMBINE_REPLICA0,
     .figure_label = "frozen",
     .figure_unit = "1 = frozen",
     .source = "/layers/update_ms",
     .figure_of = frozen_figure_of,
     .to_layers = frozen_of_update,
     .cost = DYN_COST_FROZEN,
     .cost_name = "frozen",
     .cost_dataset = "/layers/frozen",
     .neutral = 0.0f,
     .cost_of_log = frozen_of_log},
};

const struct dyn_scheme dyn_scheme_freeze = {
    .name = "freeze",
    .kind = "freeze",
    .keys = freeze_keys,
    .check = freeze_check,
    .title = "freezing",
    .create = freeze_create,
    .destroy = freeze_destroy,
    .before_step = freeze_before_step,
    .after_reduce = freeze_after_reduce,
    .describe = freeze_describe,
    .state_size = freeze_state_size,
    .state_save = freeze_state_save,
    .state_restore = freeze_state_restore,
    .state_check = freeze_state_check,
    DYN_SIGNALS(freeze_signals),
};
