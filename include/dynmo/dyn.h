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
