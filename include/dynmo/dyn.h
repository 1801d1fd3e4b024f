/* dynmo dyn: the dynamism schemes (layer freezing, early exit, gradual
 * global magnitude pruning; later sparse attention, mixture of depths;
 * mixture of experts is the model's own, model.moe_every) behind one small interface of hooks that the
 * pipeline engine calls on every rank:
 *
 *   dyn_before_step   at a step boundary, before any micro-batch: a scheme
 *                     may change the model (prune weights, freeze blocks);
 *   (inside a block)  the scheme's state lives in the blocks' slabs (frozen
 *                     flag, masks, CSR) and in struct gpt (exit control), so
 *                     block_forward / block_backward honour it;
 *   dyn_after_reduce  after the step's gradient reduction, with every
 *                     block's global gradient sum of squares (the same
 *                     numbers on every rank): decisions made here are
 *                     deterministic and identical everywhere.
 *
 * A scheme never looks at the layout or the balancer: those only see the
 * profiled times that its changes produce. Every decision depends only on
 * the config, the seed, the step and the model's numbers, never on timing,
 * so static and balanced runs compute the same bits. */
#ifndef DYNMO_DYN_H
#define DYNMO_DYN_H

#include <mpi.h>
#include "dynmo/core.h"
#include "dynmo/model.h"

struct dyn;

/* What the engine tells a scheme about where it runs. pipeline_comm holds
 * the S stage ranks of this data-parallel replica in stage order (a
 * scheme that needs the whole model, such as global pruning, talks over
 * it; replicas hold identical weights and decide identically). */
struct dyn_env {
    MPI_Comm pipeline_comm;
    int stage, stages;
};

/* The validation pass of a config: config_validate's checks, then every
 * scheme's rules over its keys and its refusals of other schemes, in the
 * table's order (dyn.c), then dyn.kind against the schemes. The first
 * problem is a user error (exit 2) naming the key. Not collective. */
void dyn_config_validate(const struct dm_config *cfg);

/* Builds the scheme dyn.kind names ("none", "freeze", "early_exit",
 * "prune"); user error for an unknown kind (dyn_config_validate checked
 * its values). */
struct dyn *dyn_create(const struct dm_config *cfg, const struct dyn_env *env);
void dyn_destroy(struct dyn *dyn);
const char *dyn_kind_name(const struct dyn *dyn);

/* Collective over pipeline_comm: before step `step` (0-based) runs. */
void dyn_before_step(struct dyn *dyn, struct gpt *model, int step);

/* Not collective: after the gradient reduction of step `step`, with
 * block_sumsq[l] the global sum of squared gradients of block l
 * (layers entries, identical on every rank). */
void dyn_after_reduce(struct dyn *dyn, struct gpt *model, int step, const double *block_sumsq);

/* One line for the step's progress output ("frozen 3/32", "sparsity
 * 52.0%", "exited 41%"), or an empty string. */
void dyn_describe(const struct dyn *dyn, const struct gpt *model, char *buf, size_t size);

/* The scheme's own state across steps (freezing's gradient-norm window),
 * the same on every rank, for checkpoints: dyn_state_size doubles (0 when
 * the scheme keeps none: its state is all in the slabs), written by
 * dyn_state_save. dyn_state_restore takes what a checkpoint of the same
 * dyn.kind held: 0, or -1 with a reason in err when it does not fit this
 * run (the caller then starts the scheme's state afresh, as a checkpoint
 * without it does). Call restore before the first dyn_before_step. */
long dyn_state_size(const struct dyn *dyn);
void dyn_state_save(const struct dyn *dyn, double *out);
int dyn_state_restore(struct dyn *dyn, const double *in, long n, char *err, size_t errsize);

/* ---- signals -------------------------------------------------------------
 * What a scheme measures per layer, step by step, declared as a named list
 * by its descriptor: the engine gathers every active scheme's signals into
 * the step's profile (pipe/stats.c), the run log writes each as the
 * dataset it names, and inspect, report and simulate read them by walking
 * the list (docs/runlog.md has the datasets). None of them names a scheme. */

/* The columns of a signal's row. */
enum dyn_signal_columns {
    DYN_SIGNAL_LAYERS = 0,   /* one per layer of the model */
    DYN_SIGNAL_BLOCKS = 1,   /* one per block of the scheme, in layer order */
    DYN_SIGNAL_CELLS = 2,    /* cells (dyn_signal.cells) per block of the scheme, block-major */
};

/* How the step's value of a column combines every rank's (value, weight). */
enum dyn_signal_combine {
    DYN_COMBINE_SUM = 0,         /* the sum over every rank: counts over micro-batches and
                                    replicas */
    DYN_COMBINE_REPLICA0 = 1,    /* replica 0's: a block's state, the same on every replica
                                    (or already summed over them) */
    DYN_COMBINE_REPLICA_MEAN = 2,/* the mean over the replicas of each replica's value */
    DYN_COMBINE_RATIO = 3,       /* the values' sum over the weights' sum, every rank (0
                                    without weight) */
    DYN_COMBINE_PER_FORWARD = 4, /* replica 0's over the step's forwards (micro-batches x
                                    replicas) */
    DYN_COMBINE_BUSIEST = 5,     /* over the ranks with a weight: the largest value over
                                    their mean (0 when all are 0) */
};

struct dyn_signal {
    const char *dataset;    /* the run log's dataset, "/mod/tokens" */
    const char *label;      /* its name in tables and figures */
    const char *unit;       /* what one value counts: "tokens", "share", "tiles" */
    const char *meaning;    /* one line: what it says about the block */
    enum dyn_signal_columns columns;
    enum dyn_signal_combine combine;
    int is_int;             /* an int32 dataset; float32 otherwise */
    int filler;             /* an int dataset's value for a step not measured (floats: NaN) */
    /* Whether a run of cfg writes it (NULL: whenever its scheme runs). */
    int (*written)(const struct dm_config *cfg);
    /* DYN_SIGNAL_CELLS: the cells of each block. */
    int (*cells)(const struct gpt_shape *shape);
    /* This rank's value of block i of model, cell by cell, and a weight
     * (RATIO, BUSIEST); a count since the last read is zeroed. NULL: the
     * signal is derived by readers from another dataset, not gathered. */
    void (*read)(struct gpt *model, int i, double *value, double *weight);
};

/* The signals a run of cfg gathers and writes: every active scheme's, in
 * the table's order, as pointers into out (at most max; returns the count). */
int dyn_signals(const struct dm_config *cfg, const struct dyn_signal **out, int max);
/* The declaration of run-log dataset `name`, any registered scheme's, or NULL. */
const struct dyn_signal *dyn_signal_of_dataset(const char *name);
/* Whether layer `layer` is one of the blocks of the scheme that declared
 * signal (a DYN_SIGNAL_LAYERS signal: every layer), and the columns of its
 * row for shape: layers, the scheme's blocks, or those times the cells. */
int dyn_signal_layer(const struct dyn_signal *signal, const struct gpt_shape *shape, int layer);
int dyn_signal_width(const struct dyn_signal *signal, const struct gpt_shape *shape);
int dyn_signal_cells(const struct dyn_signal *signal, const struct gpt_shape *shape);

/* A signal's step, combined (struct step_stats, dynmo/pipe.h). */
struct dyn_signal_row {
    const struct dyn_signal *signal;
    int columns;
    double *values;    /* (columns) */
};
/* Each active scheme's note on the step from its rows ("MoD 25.0% tokens"),
 * handed to emit one by one (tokens: the step's tokens). */
void dyn_step_notes(const struct dm_config *cfg, const struct dyn_signal_row *rows, int count,
                    double tokens, void (*emit)(void *ctx, const char *note), void *ctx);

/* The most signals all schemes of a run declare. */
#define DYN_SIGNALS_MAX 32

/* The most doubles a scheme's state may hold (dyn_create refuses a
 * configuration whose state would exceed it; a checkpoint whose state does
 * is no file dynmo wrote). */
#define DYN_STATE_MAX (1L << 27)

/* Offline, without a run (the checkpoint checker's): whether state[0..n)
 * is a state that scheme `kind` can have saved for a model of `layers`
 * blocks, by the scheme's own rules (freezing: its header, its length, a
 * count of steps, finite non-negative norms). Returns 0, or -1 with the
 * reason in err (also for a kind that keeps no state). Not collective. */
int dyn_state_check(const char *kind, const double *state, long n, int layers, char *err,
                    size_t errsize);

#endif
