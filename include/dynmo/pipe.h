/* dynmo pipe: pipeline schedules as instruction lists (this part is pure:
 * no MPI, no model, no I/O), and later the process grid, transport, the
 * engine that executes a stage's list and layer migration.
 *
 * A schedule says, for each of S stages, the exact order in which that
 * stage receives activations, runs forwards, sends activations, receives
 * gradients, runs backwards and sends gradients for each of m
 * micro-batches in one optimizer step, then reduces gradients across data
 * parallel replicas and steps the optimizer. Sends are assumed not to block
 * (the engine posts them as non-blocking sends); a receive waits for the
 * matching send of the neighbouring stage. Between two neighbours, sends
 * and receives of one kind occur in the same micro-batch order on both
 * sides, so FIFO channels (MPI's non-overtaking messages) match them. */
#ifndef DYNMO_PIPE_H
#define DYNMO_PIPE_H

#include <mpi.h>
#include <stddef.h>
#include "dynmo/core.h"
#include "dynmo/model.h"

/* ---- schedules --------------------------------------------------------- */

enum pipe_op {
    PIPE_RECV_ACT,       /* receive mb's input activations from stage s-1 */
    PIPE_FWD,            /* forward of mb through this stage's layers */
    PIPE_SEND_ACT,       /* send mb's output activations to stage s+1 */
    PIPE_RECV_GRAD,      /* receive the gradient of mb's output from s+1 */
    PIPE_BWD,            /* backward of mb; accumulates parameter gradients */
    PIPE_SEND_GRAD,      /* send the gradient of mb's input to stage s-1 */
    PIPE_REDUCE_GRADS,   /* data-parallel gradient reduction (no mb) */
    PIPE_OPTIMIZER_STEP, /* optimizer step of this stage's layers (no mb) */
    PIPE_OP_COUNT
};

struct pipe_instr {
    enum pipe_op op;
    int micro_batch;     /* 0..m-1; -1 for REDUCE_GRADS and OPTIMIZER_STEP */
};

/* Instructions one stage needs at most for m micro-batches. */
#define SCHEDULE_MAX_INSTRS(micro_batches) (6 * (micro_batches) + 2)

/* Writes stage `stage`'s instruction list (of `stages` stages, 0-based) for
 * `micro_batches` micro-batches into out, which holds at least
 * SCHEDULE_MAX_INSTRS(micro_batches) entries; returns the count.
 *
 * GPipe (fill-drain): every forward, then every backward.
 * 1F1B: a warm-up of min(S-s-1, m) forwards on stage s, then alternating
 * one forward and one backward, then a cool-down of the remaining
 * backwards. Both run forwards and backwards in ascending micro-batch order,
 * so the order in which gradients accumulate, and with it every result, is
 * the same for both schedules and for any number of stages.
 * The first stage has no RECV_ACT and no SEND_GRAD; the last stage has no
 * SEND_ACT and no RECV_GRAD (its FWD ends in the loss and its BWD starts
 * from it). Every list ends with REDUCE_GRADS, OPTIMIZER_STEP.
 * Pure; bad sizes (stages < 1, micro_batches < 1, stage out of range) are
 * internal errors: the configuration was validated before. */
int schedule_stage(struct pipe_instr *out, enum dm_schedule kind, int stage,
                   int stages, int micro_batches);

/* The lists of all stages in one allocation (for the simulator, tests and
 * tools; a rank needs only its own, from schedule_stage). */
struct pipe_schedule {
    enum dm_schedule kind;
    int stages, micro_batches;
    int *offset;               /* (stages + 1): stage s is instr[offset[s] .. offset[s+1]) */
    struct pipe_instr *instr;  /* (offset[stages]) */
};

/* Fills sched with every stage's list; free with schedule_free. */
void schedule_build(struct pipe_schedule *sched, enum dm_schedule kind, int stages,
                    int micro_batches);
void schedule_free(struct pipe_schedule *sched);

/* Most micro-batches whose activations stage `stage` holds at once (from
 * its FWD until its BWD): min(S-s, m) for 1F1B, m for GPipe. */
int schedule_peak_activations(const struct pipe_schedule *sched, int stage);

/* "FWD", "RECV_ACT", ... for logs and tools. */
const char *schedule_op_name(enum pipe_op op);

/* The timing of one simulated optimizer step. */
struct schedule_timing {
    double step_ms;        /* when the last stage finishes its list */
    double *busy_ms;       /* (stages) compute time of each stage: m*(fwd+bwd) + update */
    double *idle_ms;       /* (stages) step_ms - busy_ms: the stage's bubble */
    double bubble_fraction;/* sum(idle) / (stages * step_ms) */
};

/* Simulates sched on an ideal machine: stage s takes fwd_ms[s] for each FWD
 * and bwd_ms[s] for each BWD, update_ms[s] (may be NULL: 0) for
 * REDUCE_GRADS + OPTIMIZER_STEP together; a message arrives send_ms after
 * its SEND (0 is fine) and sends do not block; a RECV waits for its message.
 * Writes into timing, whose busy_ms and idle_ms arrays the caller provides
 * (stages entries each; either may be NULL). Returns 0, or -1 when the
 * lists deadlock (some RECV can never be matched), which the schedules of
 * schedule_build never do. Pure. The balancer has its own cost model; this
 * one is the reference for what a list means in time. */
int schedule_simulate(const struct pipe_schedule *sched, const double *fwd_ms,
                      const double *bwd_ms, const double *update_ms, double send_ms,
                      struct schedule_timing *timing);


/* ---- the process grid ----------------------------------------------------
 * P = S * D ranks: rank = replica * S + stage, so one replica's pipeline is
 * a run of consecutive ranks. Collective over MPI_COMM_WORLD. */

struct pipe_grid {
    int stages, replicas;      /* S, D */
    int stage, replica;        /* this rank's coordinates */
    int rank, world_size;
};

/* ---- the engine --------------------------------------------------------- */

struct engine;

/* Checks that parallel.pp x parallel.dp is the world size (user error
 * otherwise) and fills g with this rank's coordinates. Not collective. */
void pipe_grid_init(struct pipe_grid *g, int stages, int replicas);

/* Collective: builds the grid from parallel.pp and parallel.dp
 * (pipe_grid_init), this rank's blocks of `layout` (stages entries, the
 * same on every rank; balance_layout_from_spec), activation slots and the
 * stage's instruction list. defer_weights = 1 leaves the blocks' weights
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
    double *layer_mem_bytes;  /* (layers) parameter slab bytes */
    double *layer_sparsity;   /* (layers) pruned fraction of the block's matrices */
    double *layer_active;     /* (layers) share of the tokens a block computed (early
                                 exit; 1 otherwise) */
    double *layer_update_ms;  /* (layers) the block's share of the step's end, once a
                                 step: gradient norm, masking, optimizer, zeroing */
    double *stage_compute_ms; /* (stages) max over replicas */
    double *stage_wait_ms;    /* (stages) time waiting on neighbours, max over replicas */
    double *stage_peak_mb;    /* (stages) peak resident MiB, max over replicas */
    double *stage_update_ms;  /* (stages) the step's end (part of compute): tied and
                                 replica gradient sums, gradient norm, optimizer
                                 update, zeroing; max over replicas */
    double bubble_ratio;      /* sum of idle / (stages * step time) */
    double imbalance;         /* Eq. 2 on stage compute: (max - min) / mean */
    int *layout;              /* (stages) blocks per stage during the step */
    int stop_requested;       /* some rank's watched flag was set (all ranks) */
    char dyn_text[96];        /* the dynamism scheme's state (dyn_describe) */
    /* run.trace_from: on a traced step, trace_rows rows of STEP_TRACE_COLUMNS
     * (rank 0; 0 rows otherwise): step, rank, stage, op (enum pipe_op),
     * micro-batch (-1 for the step's end), start ms (after rank 0's step
     * start: the same clock on one node), wall ms, thread CPU ms. */
    float *trace;
    int trace_rows;
    int migrated_blocks;      /* by the re-layout before this step */
    double migrated_bytes, migrate_ms;
};

/* Collective over all ranks: one optimizer step on global samples
 * [step * batch, (step + 1) * batch) of loader. */
const struct step_stats *engine_step(struct engine *eng, struct loader *loader, int step);

/* Collective: mean validation loss over cfg->eval_batches batches (the
 * same samples every time); valid on rank 0. */
float engine_eval(struct engine *eng, struct loader *val);

/* Collective, at a step boundary: switches to the layout `counts` as
 * given on rank 0 (it is broadcast first; other ranks' counts are
 * ignored and may be NULL). Each
 * block that changes owner travels as one message (its packed slab);
 * activation buffers are rebuilt for the new ranges. Records the
 * migration in the next step's stats. */
void engine_relayout(struct engine *eng, const int *counts);

/* The value of *flag (e.g. set by a signal handler) is folded into every
 * step's global reduction, so all ranks learn at the same step boundary
 * that some rank asked to stop: step_stats.stop_requested. */
void engine_watch_flag(struct engine *eng, volatile int *flag);

const struct pipe_grid *engine_grid(const struct engine *eng);
const int *engine_layout(const struct engine *eng);
/* This rank's part of the model (its blocks, and the embedding or head on
 * the end stages): what checkpoints save and load. Owned by the engine. */
struct gpt *engine_model(struct engine *eng);

#endif
