/* dynmo pipe: the process grid, layouts of blocks over stages, and the
 * engine that executes one stage's instruction list each step (the
 * schedules themselves are pure and live in balance: schedule_stage in
 * dynmo/balance.h), moves activations and gradients between neighbouring
 * stages, reduces gradients across data-parallel replicas and migrates
 * blocks when the layout changes.
 *
 * The engine runs steps and moves blocks; it decides nothing about
 * checkpoints or layouts: callers hand it a layout (engine_relayout) and
 * say when to save. This header declares no MPI types, so including it
 * does not pull in <mpi.h>. */
#ifndef DYNMO_PIPE_H
#define DYNMO_PIPE_H

#include <stddef.h>
#include "dynmo/core.h"
#include "dynmo/model.h"

/* ---- the process grid ----------------------------------------------------
 * P = S * D ranks: rank = replica * S + stage, so one replica's pipeline is
 * a run of consecutive ranks. Collective over MPI_COMM_WORLD. */

struct pipe_grid {
    int stages, replicas;      /* S, D */
    int stage, replica;        /* this rank's coordinates */
    int rank, world_size;
};

/* ---- the engine --------------------------------------------------------- */

struct dyn_signal_row;   /* dynmo/dyn.h */

struct engine;

/* Checks that parallel.pp x parallel.dp is the world size (user error
 * otherwise) and fills g with this rank's coordinates. Not collective. */
void pipe_grid_init(struct pipe_grid *g, int stages, int replicas);

/* Collective: builds the grid from parallel.pp and parallel.dp
 * (pipe_grid_init), this rank's blocks of `layout` (stages entries, the
 * same on every rank; balance_layout_from_spec; under interleaved stages
 * x parallel.virtual entries, the chunks', virtual stage c S + s being
 * chunk c of stage s), activation slots and the stage's instruction list. defer_weights = 1 leaves the blocks' weights
 * unset for a checkpoint load into engine_model or engine_init_weights (a
 * restart does not compute weights it then overwrites); 0 initialises
 * them from train.seed. */
struct engine *engine_create(const struct dm_config *cfg, const int *layout, int defer_weights);
/* The weights of a fresh start (train.seed), after engine_create with
 * defer_weights when no checkpoint was loaded. Not collective. */
void engine_init_weights(struct engine *eng);
void engine_destroy(struct engine *eng);

/* The per-step results that rank 0 logs. Valid on rank 0 after
 * engine_step; the profile arrays have one entry per block or stage. */
#define STEP_TRACE_COLUMNS 8
struct step_stats {
    float loss;               /* mean over the step's tokens */
    double grad_norm, lr;
    double step_ms;
    double *layer_fwd_ms;     /* (layers) per micro-batch, averaged over the step */
    double *layer_bwd_ms;     /* (layers) */
    double *layer_wgrad_ms;   /* (layers) zb: the weight parts' share of layer_bwd_ms */
    double *layer_mem_bytes;  /* (layers) parameter slab bytes */
    double *layer_sparsity;   /* (layers) pruned fraction of the block's matrices (the
                                 balancer prices CSR blocks by it) */
    double *layer_update_ms;  /* (layers) the block's share of the step's end, once a
                                 step: gradient norm, masking, optimizer, zeroing */
    /* The same six figures per unit of placement (balance.units): with
     * whole-block units the layer figures again; with sublayer units
     * (2 layers) each half of every block apart, unit 2l its attention and
     * 2l + 1 its MLP (forward and backward measured apart, the slab's bytes
     * and the update time shared by the halves' parameters, under zb each
     * half's weight part), which the layer figures sum. What the balancer
     * takes. */
    int units;
    double *unit_fwd_ms, *unit_bwd_ms, *unit_mem_bytes, *unit_sparsity, *unit_update_ms;
    double *unit_wgrad_ms;
    double *stage_compute_ms; /* (stages) max over replicas */
    double *stage_wait_ms;    /* (stages) time waiting on neighbours, max over replicas */
    double *stage_peak_mb;    /* (stages) peak resident MiB, max over replicas */
    double *stage_update_ms;  /* (stages) the step's end (part of compute): tied and
                                 replica gradient sums, gradient norm, optimizer
                                 update, zeroing; max over replicas */
    double bubble_ratio;      /* sum of idle / (stages * step time) */
    double imbalance;         /* Eq. 2 on stage compute: (max - min) / mean */
    int *layout;              /* (stages) blocks per stage during the step */
    int chunks;               /* interleaved: stages x virtual, else 0 */
    int *chunk_layout;        /* (chunks) units per chunk, chunk c of stage s at c S + s */
    int stop_requested;       /* some rank's watched flag was set (all ranks) */
    char dyn_text[96];        /* the dynamism scheme's state (dyn_describe) */
    /* run.trace_from: on a traced step, trace_rows rows of STEP_TRACE_COLUMNS
     * (rank 0; 0 rows otherwise): step, rank, stage, op (enum schedule_op),
     * micro-batch (-1 for the step's end), start ms (after rank 0's step
     * start: the same clock on one node), wall ms, thread CPU ms. */
    float *trace;
    int trace_rows;
    /* The active schemes' signals (dynmo/dyn.h), each combined over the
     * micro-batches and replicas as it declares: signal_count rows. */
    int signal_count;
    struct dyn_signal_row *signals;
    int migrated_blocks;      /* by the re-layout before this step */
    double migrated_bytes, migrate_ms;
};

/* Collective over all ranks: one optimizer step on global samples
 * [step * batch, (step + 1) * batch) of loader. */
const struct step_stats *engine_step(struct engine *eng, struct loader *loader, int step);

/* Collective: mean validation loss over cfg->eval_batches batches (the
 * same samples every time); valid on rank 0. */
float engine_eval(struct engine *eng, struct loader *val);

/* Fills the token ids and the targets ((count, T) each, row-major) of
 * samples [first, first + count) of a forward-only pass. */
typedef void (*engine_fill_fn)(void *ctx, long first, int count, int *tokens, int *targets);

/* Collective over all ranks: a forward-only pass of the model, as laid
 * out over the stages, over `samples` samples. They are cut into batches
 * of the engine's micro-batch (train.batch / (parallel.dp x
 * train.micro_batches) samples; the last batch takes the rest), replica r
 * takes the contiguous run of batches [n r / D, n (r + 1) / D), and each
 * batch runs through its replica's stages; fill is called on the first
 * and last stage for each batch they run. On rank 0 sums (samples
 * entries; NULL elsewhere) receives each sample's loss sum: its T
 * per-token cross-entropies added in position order in double. Each
 * sample's sum is the same bits for every layout and replica count: a
 * batch is computed by the same blocks in the same company. The model's
 * weights and state are not changed (gpt_forward's step is the model's
 * `step`). */
void engine_forward_samples(struct engine *eng, long samples, engine_fill_fn fill, void *ctx,
                            double *sums);

/* Collective, at a step boundary: switches to the layout `counts` as
 * given on rank 0 (it is broadcast first; other ranks' counts are
 * ignored and may be NULL). Each
 * block that changes owner travels as one message (its packed slab);
 * activation buffers are rebuilt for the new ranges. Records the
 * migration in the next step's stats. */
void engine_relayout(struct engine *eng, const int *counts);

/* Collective over each replica's stages, with balance.units = sublayer
 * (nothing otherwise): where a stage boundary falls inside block j, the
 * stage holding j's MLP sends that half's parameters and Adam moments,
 * and its header (the block's dynamic state, such as MoE's, is its MLP's),
 * to the stage holding j's attention, which copies them into its own slab
 * of j (the MLP half's place there, otherwise unused) and takes the state:
 * the attention's holder then has the whole block, as a checkpoint writes
 * it (ckpt_meta's unit_layout). Nothing the step computes changes; the copy is stale
 * after the next step. */
void engine_gather_split_blocks(struct engine *eng);

/* Collective, after every step: each engine part's decisions inside a
 * stage (engine_internal.h, struct engine_part's decide), such as expert
 * placement (moe.placement, docs/moe.md): the part adds the step's loads
 * and, at a decision, moves what it places between the ranks of its
 * group. No-op for a part with nothing to decide. */
void engine_after_step(struct engine *eng, int step);

/* The value of *flag (e.g. set by a signal handler) is folded into every
 * step's global reduction, so all ranks learn at the same step boundary
 * that some rank asked to stop: step_stats.stop_requested. */
void engine_watch_flag(struct engine *eng, volatile int *flag);

const struct pipe_grid *engine_grid(const struct engine *eng);
/* The units each stage holds (S counts); under interleaved a stage's v
 * chunks together. */
const int *engine_layout(const struct engine *eng);
/* The units of each chunk, virtual stage c S + s at c S + s (S v counts,
 * v = parallel.virtual; engine_layout's when v = 1). */
const int *engine_chunk_layout(const struct engine *eng);
/* This rank's part of the model (its blocks, and the embedding or head on
 * the end stages): what checkpoints save and load. Owned by the engine. */
struct gpt *engine_model(struct engine *eng);
/* Under interleaved (parallel.virtual = v chunks a rank): chunk c's
 * model, valid until the next call into the engine (a step, a relayout
 * or another chunk's model); engine_model is chunk 0's between steps.
 * engine_chunk_models: the v chunks' models side by side (copies of the
 * structs, their tensors the engine's) for a checkpoint to read. */
struct gpt *engine_chunk_model(struct engine *eng, int c);
void engine_chunk_models(struct engine *eng, struct gpt *models);

/* The dynamism scheme the engine runs (its state for checkpoints). */
struct dyn;
struct dyn *engine_dyn(struct engine *eng);

#endif
