/* dynmo balance: the paper's load balancers (DynMo sections 3.3-3.4) as pure
 * functions over arrays: static baselines, the exact memory-capped min-max
 * partition, the decentralised diffusion balancer, re-packing onto fewer
 * stages, the pipeline schedules (GPipe, 1F1B, ZB-H1, interleaved 1F1B) as
 * per-stage instruction lists, the step-time predictor that is the one
 * simulator of those lists,
 * and the diff of two layouts into a migration plan.
 *
 * Nothing here calls MPI, touches the model or does I/O: arrays in, a layout
 * out, so that every algorithm is unit-tested in isolation and the pipeline
 * engine can call any of them on profiled numbers. Every function is
 * deterministic, is not collective, and allocates only scratch memory that
 * it frees before returning (except schedule_build, whose lists the caller
 * frees with schedule_free). Arrays passed in stay owned by the caller.
 *
 * Vocabulary. A unit of placement is a transformer block (balance.units =
 * block) or half of one (balance.units = sublayer: block j is unit 2j, its
 * attention, and unit 2j + 1, its MLP). Every function below that speaks
 * of "blocks" takes units: its arrays hold one entry per unit and its
 * counts count units; only the functions of "units of placement" know
 * which kind they are. A layout over S stages is an array `counts` of S
 * unit counts, every one >= 1, summing to the number of units: stage s
 * owns the contiguous units [start_s, start_s + counts[s]) with start_0 =
 * 0. The embedding always sits on stage 0 and the head (with the loss) on
 * stage S - 1; both count in that stage's cost and memory.
 *
 * Stage cost, defined once and used everywhere (balancers, predictor, tests,
 * `dynmo plan`): let P[0] = 0 and P[k+1] = P[k] + cost[k] in double, left
 * to right over all blocks. The cost of stage s owning [a, b) is
 *
 *     c = P[b] - P[a];  if (s == 0) c = first + c;  if (s == S-1) c = c + last;
 *
 * evaluated in exactly that order. With non-negative costs this is monotone
 * (a stage never gets cheaper by taking another block), and it is exact for
 * integer-valued costs below 2^53 (parameter counts). "Exact" for the
 * partitioners means: the returned maximum stage cost equals the minimum over
 * all layouts of this very expression, bit for bit.
 *
 * Errors. Functions that can fail return BALANCE_OK (0) or a negative
 * status, and then write a one-line message naming the offending block,
 * stage or argument into err (errsize bytes, always NUL-terminated; err may
 * be NULL). They never abort on bad input; the schedule functions take
 * sizes validated before and treat bad ones as internal errors (below). */
#ifndef DYNMO_BALANCE_H
#define DYNMO_BALANCE_H

#include <stddef.h>
#include <stdint.h>
#include "dynmo/core.h"

enum balance_status {
    BALANCE_OK = 0,
    BALANCE_BAD_INPUT = -1,   /* NaN, negative value, fewer blocks than stages, bad layout */
    BALANCE_INFEASIBLE = -2,  /* well-formed, but no layout fits the memory capacity */
};

/* ---- inputs ------------------------------------------------------------ */

/* What one balancer minimises: a cost per block (milliseconds, or
 * parameters) and the memory each block occupies, plus the fixed extras of
 * the first stage (embedding) and the last stage (head + loss). */
struct balance_costs {
    int blocks;                 /* n >= 1 */
    const double *cost;         /* (n) finite, >= 0 */
    const int64_t *mem_bytes;   /* (n) >= 0: the block's slab, what migrates */
    double first_cost;          /* embedding, on stage 0 */
    double last_cost;           /* head + loss, on stage S-1 */
    int64_t first_mem_bytes;
    int64_t last_mem_bytes;
};

/* One profile of the model, per micro-batch: what `dynmo plan` reads from a
 * CSV and what the engine's profiler summarises. */
struct balance_extra {
    double fwd_ms, bwd_ms, params;
    int64_t mem_bytes;
    double update_ms;           /* once a step: optimizer update, gradient norm */
};

/* Stages that share processors: stage s runs in group group[s] (0 <= g < groups),
 * and the stages of group g share cores[g] processors (> 0, may be fractional).
 * With turns 0, at each instant the stages of group g that are computing each
 * progress at rate min(1, cores[g] / computing stages of g) (processor
 * sharing, as a time-slicing OS gives over a step). With turns 1 (cores[g]
 * whole), they take turns as dynmo's ranks do (parallel.turns): an
 * instruction whose input is ready waits for a free core of its group, the
 * waiting ones start in the order they became ready, and each runs alone
 * until it ends. NULL in a profile: a processor per stage. */
struct balance_sharing {
    int stages;
    int groups;
    const int *group;      /* (stages) */
    const double *cores;   /* (groups) */
    int turns;             /* 0: processor sharing; 1: turns (last: 0 when omitted) */
};

struct balance_profile {
    int blocks;                 /* n >= 1 */
    const double *fwd_ms;       /* (n) forward time of one micro-batch */
    const double *bwd_ms;       /* (n) backward time of one micro-batch */
    const double *params;       /* (n) parameter count (exact below 2^53) */
    const int64_t *mem_bytes;   /* (n) */
    struct balance_extra embed; /* on stage 0 */
    struct balance_extra head;  /* head + loss, on stage S-1 */
    /* How the stages share processors, for a layout on sharing->stages
     * stages; NULL, or a layout on another stage count: one processor per
     * stage. Last, so that initialisers that omit it mean "dedicated". */
    const struct balance_sharing *sharing;
    /* (n) once a step, NULL = none: the block's share of the step's end
     * (gradient norm, optimizer update, zeroing its gradients; nothing for
     * a frozen block). The predictor runs a stage's updates before its
     * first instruction (balance_predict_shared). */
    const double *update_ms;
    /* (n) zb only, NULL = half of each bwd_ms: the weight-gradient part of
     * bwd_ms (the embedding's and head's: half of theirs). */
    const double *wgrad_ms;
    /* Interleaved: chunks per stage v (0 or 1: none). A layout of this
     * profile then has S v entries, the model's chunks in pipeline order:
     * chunk c of stage s is entry c S + s; the embedding is on entry 0, the
     * head on the last. */
    int virtual_stages;
};

enum balance_cost_kind {
    BALANCE_COST_TIME = 0,      /* fwd_ms + bwd_ms per block */
    BALANCE_COST_PARAMS = 1,    /* params per block */
};

/* The embedding's and head's time extras from one measured step: what the
 * first and last stage computed beyond their blocks. Per micro-batch,
 * (busy - update) / m - the stage's blocks' fwd + bwd, split a third
 * forward, two thirds backward; once a step, update - the stage's blocks'
 * updates (update_ms NULL: none). Negative differences (noise) become 0;
 * with one stage the two share its extra equally. busy[0], update[0] are
 * the first stage's compute and step-end ms, busy[1], update[1] the last
 * stage's. Sets the time fields of *embed and *head, leaves the others. */
void balance_end_stage_extras(const double *fwd_ms, const double *bwd_ms,
                              const double *update_ms, const int *counts,
                              int stages, int micro_batches,
                              const double busy[2], const double update[2],
                              struct balance_extra *embed,
                              struct balance_extra *head);

/* Under interleaved (virtual_stages chunks per stage, chunk c of stage s
 * being virtual stage c stages + s, chunks[] units per virtual stage):
 * each virtual stage's compute and step-end ms as the end-stage extras
 * read them, its stage's less its other chunks' units (per micro-batch
 * fwd + bwd times micro_batches, and their updates). Exact for the first
 * and last virtual stage, which hold the embedding and the head; the
 * middle ones also carry their stage's share of the ends. */
void balance_chunk_stage_times(const double *fwd_ms, const double *bwd_ms,
                               const double *update_ms, const int *chunks, int stages,
                               int virtual_stages, int micro_batches,
                               const double *stage_compute_ms,
                               const double *stage_update_ms, double *vcompute,
                               double *vupdate);

/* Fills costs from profile: cost[i] = fwd_ms[i] + bwd_ms[i] (one rounding)
 * or params[i], extras likewise. `cost` is a caller-owned array of
 * profile->blocks doubles that costs->cost points into afterwards; the
 * memory arrays are shared with the profile. Cannot fail. */
void balance_costs_from_profile(struct balance_costs *costs,
                                const struct balance_profile *profile,
                                enum balance_cost_kind kind, double *cost);

/* Checks that costs can be laid out on `stages` stages under mem_cap
 * (bytes per stage, 0 = no cap): every value finite and >= 0, at least one
 * block per stage, no block (with the embedding on stage 0, the head on the
 * last) larger than a stage, and enough total room. Returns BALANCE_OK,
 * BALANCE_BAD_INPUT or BALANCE_INFEASIBLE with a message naming the block
 * or the stage count. Every balancer below starts with this check. */
int balance_check_costs(const struct balance_costs *costs, int stages,
                        int64_t mem_cap, char *err, size_t errsize);

/* Checks a layout: `stages` >= 1 counts, each >= 1, summing to blocks. The
 * message names the first bad stage. */
int balance_check_layout(const int *counts, int stages, int blocks,
                         char *err, size_t errsize);

/* ---- units of placement ------------------------------------------------ */

enum balance_units {
    BALANCE_UNITS_BLOCK = 0,    /* a unit is a block */
    BALANCE_UNITS_SUBLAYER = 1, /* block j is units 2j (attention) and 2j + 1 (MLP) */
};

/* "block", "sublayer"; NULL for a value out of range. */
const char *balance_units_name(enum balance_units units);
/* The units named `name`, or -1. */
int balance_units_parse(const char *name);
/* Units per block: 1 or 2. */
int balance_units_per_block(enum balance_units units);

/* The same stage boundaries in other units, over `blocks` blocks: `from`
 * (stages entries, a valid layout of from_units) into `to` (stages
 * entries). Block to sublayer doubles every count. Sublayer to block keeps
 * a boundary between two blocks where it is; a boundary inside block j
 * (after its attention) moves before block j (the block goes whole to the
 * stage that held its MLP), or after it when that would leave the stage
 * before with no block; when neither keeps every stage a block the layout
 * cannot map: BALANCE_BAD_INPUT with a message naming the layout. Units to
 * the same units copies. */
int balance_layout_convert(const int *from, enum balance_units from_units, int stages,
                           int blocks, enum balance_units to_units, int *to, char *err,
                           size_t errsize);
/* A whole-block layout for any sublayer layout `from` (stages entries,
 * 2 x blocks units) into `to`: the layout balance_layout_convert maps to
 * where it maps; where it cannot (a stage that holds less than a whole
 * block), each boundary moves only as far as leaves every stage a block.
 * It describes a sublayer layout in whole blocks (a checkpoint's
 * /layout/blocks_per_stage); it is not where the units ran. Fails
 * (BALANCE_BAD_INPUT, naming the counts) only when stages > blocks or
 * `from` is no layout of the units. */
int balance_layout_nearest_blocks(const int *from, int stages, int blocks, int *to, char *err,
                                  size_t errsize);

/* ---- evaluating a layout ------------------------------------------------ */

/* The cost of stage `stage` of `stages` owning blocks [begin, end), by the
 * definition at the top of this file. O(end). */
double balance_stage_cost(const struct balance_costs *costs, int stages,
                          int stage, int begin, int end);

/* The bytes of stage `stage` owning [begin, end), extras included. */
int64_t balance_stage_mem(const struct balance_costs *costs, int stages,
                          int stage, int begin, int end);

/* The maximum stage cost and maximum stage memory of a valid layout
 * (either output may be NULL). O(blocks). */
void balance_layout_max(const struct balance_costs *costs, int stages,
                        const int *counts, double *max_cost,
                        int64_t *max_mem_bytes);

/* Whether some layout on `stages` stages has every stage cost <= bound and
 * every stage within mem_cap (0 = no cap). Inputs must pass
 * balance_check_costs. This is the greedy probe the exact partitioner
 * searches with; tests and benchmarks use it to certify optimality. */
int balance_fits(const struct balance_costs *costs, int stages,
                 int64_t mem_cap, double bound);

/* ---- balancers ---------------------------------------------------------- */

/* What a balancer reports besides its layout. */
struct balance_result {
    double max_stage_cost;      /* of the returned layout, cost units */
    int64_t max_stage_mem_bytes;
    int64_t bytes_moved;        /* vs the current (or reference) layout */
    int blocks_moved;
    int rounds;                 /* diffusion: rounds until the last move */
    int converged;              /* diffusion: 1 unless max_rounds stopped it */
    int stages;                 /* repack: stages of the returned layout */
};

/* The layout balance.initial names, for S stages over the units of
 * `blocks` blocks (model.layers) in `units`: "uniform"
 * (balance_static_uniform over the units), "params" (DeepSpeed's equal
 * parameters: the exact min-max partition of params, the per-unit
 * parameter counts with the embedding's and head's, which only this spec
 * reads) or "explicit:n1,n2,...,nS" (unit counts). Writes counts (stages
 * entries). Returns BALANCE_OK, or BALANCE_BAD_INPUT with a message naming
 * the key (an explicit list of the wrong length or sum, a stage with no
 * unit or a count that is no integer in range, more stages than units, an
 * unknown spec). */
int balance_layout_from_spec(const char *spec, int stages, int blocks, enum balance_units units,
                             const struct balance_costs *params, int *counts, char *err,
                             size_t errsize);

/* "n1,n2,...,nS" into buf (cut at size). */
void layout_format(char *buf, size_t size, const int *counts, int stages);

/* Megatron-LM's static layout: equal block counts. With n = q*S + r blocks,
 * the first r stages get q + 1 blocks and the rest q (the remainder goes to
 * the front, as numpy.array_split does). Ignores cost and memory. Fails only
 * when blocks < stages or stages < 1. */
int balance_static_uniform(int blocks, int stages, int *counts,
                           char *err, size_t errsize);

/* The exact memory-capped min-max partition (partition-time with time
 * costs, partition-params and static-params with parameter costs).
 *
 * Returns in counts (stages entries) a layout that minimises the maximum
 * stage cost exactly, subject to every stage's memory (extras included)
 * being <= mem_cap (0 = no cap). Among all layouts achieving that minimum
 * it returns the one that moves the fewest bytes from `current` (a layout
 * of current_stages stages over the same blocks; a block moves when its
 * stage index changes; bytes are its mem_bytes), then the fewest blocks,
 * then the one whose last boundary is earliest, then the one before it, and
 * so on. current == NULL means the static-uniform layout on `stages`.
 *
 * Method: the optimum is the smallest double B for which a greedy probe
 * packs the blocks into the stages; it is found by bisecting the ordinals of
 * doubles, snapping to costs the probe proves, O(S log n) per probe and at
 * most 64 probes. A dynamic program over the boundary positions that can
 * lie on an optimal layout (between the forward and backward greedy
 * packings at B), with monotone-deque window maxima, then picks the
 * least-movement layout, searching windows around current's boundaries
 * first. O(64 S log n + width of the boundary ranges searched); see
 * docs/balance.md. res may be NULL. */
int balance_partition(const struct balance_costs *costs, int stages,
                      int64_t mem_cap, const int *current, int current_stages,
                      int *counts, struct balance_result *res,
                      char *err, size_t errsize);

/* The paper's decentralised diffusion balancer, from `current` (stages
 * entries; NULL = static-uniform), which must fit mem_cap.
 *
 * Rounds alternate between the pairs (0,1),(2,3),... and (1,2),(3,4),...:
 * in a round each stage talks to one neighbour only, and the heavier of a
 * pair hands its boundary blocks one by one to the lighter while that
 * strictly lowers the pair's maximum, the receiver stays within mem_cap and
 * the giver keeps a block. Stops when two consecutive rounds move nothing,
 * when max - min stage cost < gamma (gamma <= 0: never), or after max_rounds
 * rounds (<= 0: 1,000,000). Each move lowers the sorted vector of stage
 * costs, so it always terminates; the result is a local optimum, not
 * necessarily the global one. res->rounds counts rounds up to the last one
 * that moved a block. */
int balance_diffusion(const struct balance_costs *costs, int stages,
                      int64_t mem_cap, const int *current, double gamma,
                      int max_rounds, int *counts, struct balance_result *res,
                      char *err, size_t errsize);

/* ---- schedules ------------------------------------------------------------ */

/* A schedule says, for each of S stages, the exact order in which that
 * stage receives activations, runs forwards, sends activations, receives
 * gradients, runs backwards and sends gradients for each of m
 * micro-batches in one optimizer step, then reduces gradients across data
 * parallel replicas and steps the optimizer. The engine executes a stage's
 * list as it is; the predictor below simulates the same lists. Sends are
 * assumed not to block (the engine posts them as non-blocking sends); a
 * receive waits for the matching send of the neighbouring stage. Between
 * two neighbours, sends and receives of one kind occur in the same
 * micro-batch order on both sides, so FIFO channels (MPI's non-overtaking
 * messages) match them.
 *
 * Unlike the rest of this file, the schedule functions take sizes that were
 * validated before (the configuration, or the predictor's own checks): bad
 * sizes are internal errors (DM_ASSERT), not a status. */

enum schedule_op {
    SCHEDULE_RECV_ACT,       /* receive mb's input activations from stage s-1 */
    SCHEDULE_FWD,            /* forward of mb through this stage's layers */
    SCHEDULE_SEND_ACT,       /* send mb's output activations to stage s+1 */
    SCHEDULE_RECV_GRAD,      /* receive the gradient of mb's output from s+1 */
    SCHEDULE_BWD,            /* backward of mb; accumulates parameter gradients */
    SCHEDULE_SEND_GRAD,      /* send the gradient of mb's input to stage s-1 */
    SCHEDULE_REDUCE_GRADS,   /* data-parallel gradient reduction (no mb) */
    SCHEDULE_OPTIMIZER_STEP, /* optimizer step of this stage's layers (no mb) */
    SCHEDULE_WGRAD,          /* zb: weight gradient of mb (the BWD before it was
                                the input gradient only); accumulates parameter
                                gradients */
    SCHEDULE_OP_COUNT
};

struct schedule_instr {
    enum schedule_op op;
    int micro_batch;         /* 0..m-1; -1 for REDUCE_GRADS and OPTIMIZER_STEP */
    int chunk;               /* interleaved: the rank's model chunk 0..v-1, which is
                                virtual stage chunk x stages + stage; else 0 */
};

/* Instructions one stage needs at most for m micro-batches (for m x v
 * with interleaved's v chunks). */
#define SCHEDULE_MAX_INSTRS(micro_batches) (7 * (micro_batches) + 2)

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
 * ZB-H1 (zb; Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
 * each backward split into BWD, the input gradient that the previous stage
 * waits for, and WGRAD, the weight gradient that nobody waits for. Stage s
 * runs 1F1B's forwards and BWDs in 1F1B's order, and a WGRAD follows each
 * BWD except that the first s WGRADs are held back, each running one BWD
 * later, and the held ones end the list: the weight gradients fill the
 * slots 1F1B leaves idle while every stage holds at most min(S, m)
 * micro-batches (1F1B's peak, stage 0's), each from its FWD until its
 * WGRAD. With equal F, B, W times the step is (3m + S - 1) F against
 * 1F1B's 3(m + S - 1) F: a bubble of (S - 1)/(3m) of the compute against
 * (S - 1)/m. WGRADs too run in ascending micro-batch order.
 * Interleaved needs schedule_stage_chunks; with one chunk it is 1F1B.
 * Bad sizes (stages < 1, micro_batches < 1, stage out of range, an unknown
 * kind) are internal errors. */
int schedule_stage(struct schedule_instr *out, enum dm_schedule kind, int stage,
                   int stages, int micro_batches);

/* The same with `virtual` chunks per stage (out holds
 * SCHEDULE_MAX_INSTRS(micro_batches x virtual)). Interleaved 1F1B
 * (Megatron-LM's virtual stages): stage s holds chunks c = 0..v-1, chunk c
 * being virtual stage c S + s of the V = S v that the model is laid out on;
 * the last stage's chunk c sends to the first stage's chunk c + 1. The
 * stage's m v forwards run in groups of S micro-batches, chunk by chunk
 * (the k-th forward is micro-batch (k / (S v)) S + k mod S of chunk
 * (k / S) mod v; the backwards the same with the chunks in reverse), with
 * a warm-up of 2 (S - s - 1) + (v - 1) S forwards (all m v when m = S),
 * then one forward and one backward alternately, then the remaining
 * backwards. Needs micro_batches a multiple of stages when virtual > 1
 * (an internal error otherwise: the configuration refuses it). Each chunk
 * runs its forwards and backwards in ascending micro-batch order. With
 * equal chunks the step is m (f + b) + (S - 1)(f + b) / v, f and b a
 * stage's (all its chunks') times. Other kinds need virtual = 1. */
int schedule_stage_chunks(struct schedule_instr *out, enum dm_schedule kind, int stage,
                          int stages, int virtual, int micro_batches);

/* The lists of all stages in one allocation (for tools and tests; a rank
 * needs only its own, from schedule_stage). */
struct schedule {
    enum dm_schedule kind;
    int stages, micro_batches;
    int *offset;                   /* (stages + 1): stage s is instr[offset[s] .. offset[s+1]) */
    struct schedule_instr *instr;  /* (offset[stages]) */
    int virtual;                   /* chunks per stage (1 but for interleaved) */
};

/* Fills sched with every stage's list. The arrays belong to sched until
 * schedule_free, which frees them and zeroes sched. */
void schedule_build(struct schedule *sched, enum dm_schedule kind, int stages,
                    int micro_batches);
/* The same with `virtual` chunks per stage (schedule_stage_chunks). */
void schedule_build_chunks(struct schedule *sched, enum dm_schedule kind, int stages,
                           int virtual, int micro_batches);
void schedule_free(struct schedule *sched);

/* Most micro-batches (micro-batch and chunk pairs, interleaved) whose
 * activations stage `stage` holds at once, from its FWD until its last
 * backward op (WGRAD under zb, else BWD): min(S-s, m) for 1F1B, m for
 * GPipe, min(S, m) for zb. */
int schedule_peak_activations(const struct schedule *sched, int stage);
/* The same for one stage's list of n instructions of schedule `kind`: the
 * activation slots the stage needs. */
int schedule_list_peak(const struct schedule_instr *list, int n, enum dm_schedule kind);

/* Whether the schedule splits each backward into BWD and WGRAD (zb). */
int schedule_splits_backward(enum dm_schedule kind);

/* "1f1b", "gpipe", "zb", "interleaved"; "?" for a value out of range. */
const char *schedule_name(enum dm_schedule kind);

/* "FWD", "RECV_ACT", ... for logs and tools; "?" for a value out of range. */
const char *schedule_op_name(enum schedule_op op);

/* ---- predictor ---------------------------------------------------------- */

struct balance_prediction {
    double step_ms;             /* one optimizer step: all micro-batches */
    double bubble_ratio;        /* idle fraction of stages x step_ms */
    int bottleneck_stage;       /* first stage with the largest fwd + bwd */
};

/* Predicts the step time of a pipeline whose stage s takes stage_fwd_ms[s]
 * and stage_bwd_ms[s] per micro-batch, by simulating the instruction
 * lists of schedule_stage with zero communication time: each stage runs the
 * FWD and BWD instructions of its list in order (transfers take no time),
 * and an instruction starts when its stage is free and its input is ready
 * (forward k of stage s after forward k of stage s-1; backward k after
 * backward k of stage s+1, and after forward k). So GPipe runs all m
 * forwards then all m backwards; 1F1B runs min(S-s-1, m) warm-up forwards,
 * then alternates one forward and one backward, then drains.
 * bubble_ratio = 1 - sum_s m (f_s + b_s) / (S step_ms). For equal stages
 * both give step = (m + S - 1)(f + b), bubble = (S - 1)/(m + S - 1).
 * O(S m) time and memory. */
int balance_predict_stages(const double *stage_fwd_ms,
                           const double *stage_bwd_ms, int stages,
                           int micro_batches, enum dm_schedule schedule,
                           struct balance_prediction *out,
                           char *err, size_t errsize);

/* Checks a sharing: stages >= 1 and groups >= 1, both arrays present, every
 * group id in [0, groups), every core count finite and > 0 (whole, at most
 * 1e6, with turns). The message
 * names the first bad stage or group. */
int balance_check_sharing(const struct balance_sharing *sharing, char *err,
                          size_t errsize);

/* 1 when a checked sharing (or NULL) changes predictions on `stages`
 * stages: it is for that stage count and some group holds more stages than
 * it has cores; 0 when every stage may as well have a processor of its own. */
int balance_sharing_oversubscribed(const struct balance_sharing *sharing,
                                   int stages);

/* The same with each stage's optimizer update, and when stages share
 * processors.
 *
 * Update. stage_update_ms (NULL = none) is what stage s computes once a step
 * after its last backward: the gradient norm (a reduction over every stage,
 * so a barrier) and its optimizer update. The steady state of repeated steps
 * is predicted: stage s starts its list stage_update_ms[s] into the step,
 * after the previous step's update, so the fill hides the update of a stage
 * that would wait for its first input anyway; step_ms runs until every list
 * is done (the next barrier), and bubble_ratio counts the update as busy.
 *
 * Sharing. With sharing NULL, on another stage count than `stages`, or with
 * no group holding more stages than it has cores, a processor per stage:
 * without updates this is balance_predict_stages (its result, bit for bit).
 * Otherwise an event-driven simulation of the same instruction lists
 * and dependencies (an update is an instruction whose input is always
 * ready), time jumping from one instruction's completion to the next. Fluid
 * (turns 0): a stage is computing while its next instruction's input is
 * ready, and each computing stage of group g progresses at rate
 * min(1, cores[g] / computing stages of g). Turns: a ready instruction
 * queues for a core of its group; queued instructions start first come first
 * served (the stage that has just finished an instruction asks before the
 * stages that instruction made ready, then by stage number), run at rate 1
 * and hold the core until they end; an instruction of no work needs no
 * core. bubble_ratio keeps its definition,
 * 1 - sum_s (m (f_s + b_s) + u_s) / (S step_ms): under sharing it also
 * counts the time a stage waits for a processor, so it can be large. Update
 * times must be finite and >= 0, and a non-NULL sharing must pass
 * balance_check_sharing whatever its stage count (BALANCE_BAD_INPUT naming
 * the entry). O(S m (S + groups)) when shared. */
int balance_predict_shared(const double *stage_fwd_ms,
                           const double *stage_bwd_ms,
                           const double *stage_update_ms, int stages,
                           int micro_batches, enum dm_schedule schedule,
                           const struct balance_sharing *sharing,
                           struct balance_prediction *out,
                           char *err, size_t errsize);

/* The same with v = `virtual` chunks per stage (interleaved; any other
 * schedule needs v = 1) and, for zb, the weight gradients apart: fwd_ms,
 * bwd_ms and wgrad_ms have S v entries, virtual stage c S + s being chunk c
 * of stage s; bwd_ms is the whole backward and wgrad_ms (zb only; NULL =
 * half of it) the part of it that is WGRAD, so that zb's BWD costs bwd_ms
 * - wgrad_ms. stage_update_ms has S entries (a stage's, all its chunks').
 * Interleaved with v > 1 needs micro_batches a multiple of S, and wgrad_ms
 * at most bwd_ms (BALANCE_BAD_INPUT). bubble_ratio and bottleneck_stage
 * count a stage's chunks together. With v = 1 and no wgrad_ms this is
 * balance_predict_shared. */
int balance_predict_chunks(const double *fwd_ms, const double *bwd_ms,
                           const double *wgrad_ms, const double *stage_update_ms,
                           int stages, int virtual, int micro_batches,
                           enum dm_schedule schedule, const struct balance_sharing *sharing,
                           struct balance_prediction *out, char *err, size_t errsize);

/* The same for a layout of profile: stage times are the stage costs (top of
 * this file) of fwd_ms, bwd_ms and update_ms separately, extras included;
 * the stages share processors as profile->sharing says
 * (balance_predict_shared). With profile->virtual_stages = v > 1 `stages`
 * counts chunks (S v, counts with as many entries) and the prediction is
 * balance_predict_chunks' on S stages; zb splits each stage's backward with
 * profile->wgrad_ms. */
int balance_predict(const struct balance_profile *profile, int stages,
                    const int *counts, int micro_batches,
                    enum dm_schedule schedule, struct balance_prediction *out,
                    char *err, size_t errsize);

/* ---- re-packing ----------------------------------------------------------- */

/* The fewest stages whose predicted step time stays within (1 + epsilon) of
 * the current layout's and whose stages all fit mem_cap, with its layout.
 *
 * `current` (current_stages entries) must fit mem_cap. Stage counts k that
 * cannot qualify (m times the best bottleneck on k stages already exceeds
 * the bound, or the memory does not fit) are skipped by bisection; from the
 * first viable k upwards the candidates are the exact time partition on k
 * stages (balance_partition, least movement from current), polished by a
 * short local search on the predicted time, and the first-fit merge below
 * with target k. The first candidate whose predicted step time is
 * <= (1 + epsilon) * current's is returned, so the result is never worse
 * than Algorithm 2; it is not proven minimal (the prediction is not a
 * function of the bottleneck alone). Falls back to the current layout,
 * which always qualifies. counts needs current_stages entries; res->stages
 * tells how many were used. */
int balance_repack(const struct balance_profile *profile,
                   const int *current, int current_stages, int64_t mem_cap,
                   int micro_batches, enum dm_schedule schedule,
                   double epsilon, int *counts, struct balance_result *res,
                   char *err, size_t errsize);

/* The paper's Algorithm 2 (first-fit pairwise merging under a memory cap),
 * kept contiguous: for each active stage in order, its blocks merge into the
 * next active stage when the two fit mem_cap together (0 = no cap) and more
 * than target_stages stages are active. Time is ignored. Writes the merged
 * layout into counts (current_stages entries available) and its stage count
 * into *out_stages. Merging never splits a stage: a `current` with a stage
 * over mem_cap is refused (BALANCE_INFEASIBLE, the stage named), never
 * returned over the cap. */
int balance_repack_first_fit(const struct balance_costs *costs,
                             const int *current, int current_stages,
                             int64_t mem_cap, int target_stages, int *counts,
                             int *out_stages, char *err, size_t errsize);

/* ---- migration plan -------------------------------------------------------- */

/* The head, when a stage-count change moves the last stage. */
#define BALANCE_HEAD_BLOCK (-1)

struct balance_move {
    int block;                  /* block index, or BALANCE_HEAD_BLOCK */
    int src_stage, dst_stage;
    int64_t bytes;
};

/* The moves that turn layout `from` into layout `to` over the same blocks:
 * one entry per block whose stage changes, in block order, then the head
 * when the last stage's index changes (the embedding never moves). `moves`
 * must hold blocks + 1 entries. Writes the count and total bytes (either
 * may be NULL). */
int balance_migration_plan(const int64_t *mem_bytes, int blocks,
                           int64_t head_mem_bytes, const int *from,
                           int from_stages, const int *to, int to_stages,
                           struct balance_move *moves, int *move_count,
                           int64_t *total_bytes, char *err, size_t errsize);

/* The predicted milliseconds of a migration of `bytes`, from n measured
 * ones (bytes[i], ms[i]): the least-squares line ms = a + b x bytes with
 * a, b >= 0 (a negative slope becomes the mean time, a negative intercept
 * the best line through the origin). A migration pays a fixed part
 * whatever it moves (docs/balance.md), so a line, not one migration's time
 * per byte. n = 1, or all of one size: their mean time; n = 0: 0. */
double balance_migration_cost_ms(const double *bytes, const double *ms, int n,
                                 double at_bytes);

/* ---- methods by name ------------------------------------------------------ */

enum balance_method {
    BALANCE_STATIC_UNIFORM = 0,
    BALANCE_STATIC_PARAMS,
    BALANCE_PARTITION_PARAMS,
    BALANCE_PARTITION_TIME,
    BALANCE_DIFFUSION_PARAMS,
    BALANCE_DIFFUSION_TIME,
    BALANCE_METHOD_COUNT,
};

/* "static-uniform", "static-params", ... ; NULL for an unknown value. */
const char *balance_method_name(enum balance_method method);
/* Returns the method named `name`, or -1. */
int balance_method_parse(const char *name);

struct balance_options {
    int64_t mem_cap;            /* bytes per stage, 0 = no cap */
    double gamma;               /* diffusion: stop when max - min < gamma */
    int max_rounds;             /* diffusion: <= 0 = 1,000,000 */
    /* partition-time when the prediction decides (balance_propose): the
     * step it simulates (micro_batches <= 0: 4 x stages). */
    int micro_batches;
    enum dm_schedule schedule;
};

/* What the engine calls every balance.every steps: the layout `method`
 * proposes for profile on `stages` stages, moving from `current` (NULL =
 * static-uniform). static-uniform and static-params are the baselines:
 * they ignore the memory cap and the current layout (static-params is the
 * exact equal-parameter partition, which a static run computes once at step
 * 0). partition-* and diffusion-* honour mem_cap. res gets the cost in the
 * method's own units (ms or parameters) and the movement from current.
 *
 * partition-time when profile->sharing applies to `stages` and some group
 * holds more stages than cores, or when the profile has update times (a
 * non-zero update_ms, embed.update_ms or head.update_ms): the min-max layout
 * of fwd + bwd is no longer the fastest (stages of one group compete for
 * their cores; a stage's update delays its next step unless the fill hides
 * it), so three starts (the min-max partition, static-uniform and current,
 * each within mem_cap) are polished by local search on the predicted step
 * time (balance_predict; one boundary moved by one block while the
 * prediction strictly drops, at most 256 predictions per start and about
 * 2e6 simulated instructions, 2 S m each: none on very large pipelines),
 * and the fastest wins; ties go to the one
 * that moves the fewest blocks from current, then to the earlier start. A
 * non-NULL profile->sharing is checked first by every method. */
int balance_propose(enum balance_method method,
                    const struct balance_profile *profile, int stages,
                    const int *current, const struct balance_options *options,
                    int *counts, struct balance_result *res,
                    char *err, size_t errsize);

/* ---- the balancing controller ---------------------------------------------
 * What `dynmo train` runs after every step (src/balance/controller.c): a
 * moving average of the measured profile, and every `every` steps a
 * decision: propose a layout with the configured method, predict the step
 * time of the current and the proposed layout, and apply the proposal only
 * when it is predicted at least min_improvement faster and the saving over
 * the next interval beats min_gain times the predicted migration cost
 * (fitted to the migrations measured so far). Pure like the rest of this
 * module: the caller broadcasts the layout, migrates and logs. */

/* Columns of a decision row (the run log's /balance/decisions): step,
 * predicted ms/step of the current layout, predicted ms/step of the
 * proposal, measured ms of the decision step, applied (0/1), blocks moved,
 * measured ms of the step after, bytes moved. */
#define BALANCE_DECISION_COLUMNS 8

struct balance_controller_config {
    const char *method;         /* balance.method: none, random, partition, diffusion, or a
                                   method name (balance_method_name) */
    const char *cost;           /* balance.cost (params, time): for partition and diffusion */
    int stages, blocks, every, micro_batches;
    enum dm_schedule schedule;
    int virtual_stages;         /* interleaved: chunks per stage v (0 or 1: none); stages
                                   then counts the S v chunks, the layouts have as many
                                   entries, and the predictions are interleaved's on S
                                   stages (balance_predict) */
    uint64_t seed;              /* random draws its layouts from (seed, step) */
    double min_gain, min_improvement;
    double block_params;        /* parameters of one dense block */
    double block_matrix_weights;/* of which in the prunable matrices */
    const double *unit_matrix_weights; /* (blocks) each unit's prunable matrix weights
                                   when units differ (balance.units = sublayer: an
                                   attention unit holds 4C^2, an MLP unit 8C^2), or
                                   NULL: all block_matrix_weights. Copied. */
    const double *block_param_counts; /* (blocks) each block's parameters when blocks
                                   differ (mixture-of-experts blocks), or NULL: all
                                   block_params. Copied. */
};

/* One measured step as the controller reads it; arrays stay the caller's. */
struct balance_observation {
    const double *fwd_ms, *bwd_ms;      /* (blocks) per micro-batch */
    const double *wgrad_ms;             /* (blocks) zb: the weight parts' share of bwd_ms,
                                           or NULL (the predictor takes half) */
    const double *update_ms;            /* (blocks) once a step */
    const double *mem_bytes;            /* (blocks) slab bytes */
    const double *sparsity;             /* (blocks) pruned share of the matrices */
    const double *stage_compute_ms;     /* (stages) */
    const double *stage_update_ms;      /* (stages) */
    const int *layout;                  /* (stages) during the step */
    double step_ms;
    int migrated_blocks;                /* by the re-layout before the step */
    double migrated_bytes, migrate_ms;
};

/* What one decision weighed (for the trainer's log line). */
struct balance_decision {
    int step;                   /* 1-based */
    const char *method;         /* NULL when no decision was taken */
    int changed;                /* the proposal differs from the current layout */
    int enough;                 /* predicted at least min_improvement faster */
    int apply;                  /* the layout changes */
    double now_ms, next_ms;     /* predicted ms/step, current and proposed */
    double saving_ms;           /* (now - next) x every */
    int every;                  /* steps until the next decision */
    double migrate_ms;          /* predicted migration cost */
};

struct balance_controller;

/* BALANCE_OK when balance.method (with balance.cost) names a policy the
 * controller runs; otherwise BALANCE_BAD_INPUT and a message listing the
 * valid names. */
int balance_controller_valid_method(const char *method, const char *cost, char *err,
                                    size_t errsize);

/* A controller for cfg (copied); NULL with a message for an unknown method
 * or impossible sizes. Free with balance_controller_destroy. */
struct balance_controller *balance_controller_create(const struct balance_controller_config *cfg,
                                                     char *err, size_t errsize);
void balance_controller_destroy(struct balance_controller *ctl);

/* Stages share processors (NULL: a processor per stage): every prediction
 * uses it. The arrays it points to stay the caller's and must outlive ctl. */
void balance_controller_set_sharing(struct balance_controller *ctl,
                                    const struct balance_sharing *sharing);

/* 0 for balance.method = none: the controller never changes a layout. */
int balance_controller_active(const struct balance_controller *ctl);
/* Whether the step (0-based) ends with a decision. */
int balance_controller_is_decision_step(const struct balance_controller *ctl, int step);

/* Folds one measured step into the averages (and its migration into the
 * migration cost fit). When the previous step decided, its row is now
 * complete: copied into row, return 1; otherwise 0. */
int balance_controller_observe(struct balance_controller *ctl,
                               const struct balance_observation *obs,
                               float row[BALANCE_DECISION_COLUMNS]);

/* After observing step `step`: the proposed layout into proposal (stages
 * entries) and what was weighed into *d; the caller switches to the
 * proposal when d->apply is 1. On a step that is no decision step the
 * proposal is the current layout, d->apply 0 and d->method NULL. Returns
 * BALANCE_OK, or an error with a message when the method or the prediction
 * failed (then d->apply is 0). */
int balance_controller_decide(struct balance_controller *ctl,
                              const struct balance_observation *obs, int step, int *proposal,
                              struct balance_decision *d, char *err, size_t errsize);

/* The re-pack planner (balance_repack) on the averaged profile: the fewest
 * stages whose predicted step time stays within (1 + epsilon) of the current
 * layout's, but no fewer than min_stages (then the exact time partition on
 * min_stages). Returns the new stage count (the current one when nothing
 * smaller qualifies, with a message in err when the planner failed) and its
 * layout in counts (stages entries available). */
int balance_controller_repack(struct balance_controller *ctl,
                              const struct balance_observation *obs, double epsilon,
                              int min_stages, int *counts, char *err, size_t errsize);

/* ---- expert placement (placement.c, moe.placement = balanced) -----------
 * The problem is generic (E items with loads over P groups of E / P
 * items each), so the names here are; the items are MoE experts. A placement of one MoE block's E experts over the P ranks of an expert-
 * parallel group is an order: position i holds expert order[i] and belongs
 * to rank i / (E / P); each rank's E / P experts are in ascending order.
 * Loads are per expert (token-expert pairs, any unit); a rank's load is
 * the sum of its experts'. */

/* The busiest rank's load under order. */
double balance_placement_busiest(const double *loads, const int *order, int E, int ranks);
/* Experts whose rank differs between two placements. */
int balance_placement_moves(const int *from, const int *to, int E, int ranks);
/* The placement of expert-parallel ranks without balancing: rank r holds
 * experts r E / P .. (r + 1) E / P - 1. */
void balance_placement_identity(int *order, int E);
/* The placement (into order, E entries) that minimises the busiest rank's
 * load: exact for E <= 12, else longest load first then improving swaps;
 * its parts go to the ranks that already hold most of their experts
 * (current), and current itself when nothing is better. E % ranks == 0. */
void balance_placement_plan(const double *loads, int E, int ranks, const int *current, int *order);

struct balance_placement_input {
    const double *loads;        /* (items) the load per step of each expert */
    const int *current;         /* (items) where the experts are */
    int items, ranks;           /* experts of the block, ranks of the group */
    double ms_per_load;         /* the busiest rank's milliseconds per unit of load */
    int every;                  /* steps until the next decision */
    double bytes_per_item;      /* what one expert's move carries (weights, Adam moments) */
    /* the expert moves so far (bytes, ms each), the migration cost's fit
     * (balance_migration_cost_ms): none gives a cost of 0 */
    const double *moved_bytes, *moved_ms;
    int moves_kept;
};
struct balance_placement_decision {
    double now_load, next_load; /* the busiest rank's load per step, now and planned */
    int moves;                  /* experts that change rank */
    double bytes;               /* what the moves carry */
    double saving_ms;           /* (now - next) ms_per_load every */
    double migrate_ms;          /* the predicted cost of the moves */
    int apply;                  /* the moves pay: saving > cost, and something moves */
};
/* The plan for in and whether to take it: next (experts entries) is the
 * plan when d->apply is 1, else in->current. */
void balance_placement_decide(const struct balance_placement_input *in, int *next,
                              struct balance_placement_decision *d);
/* ---- expert replication (replicate.c, moe.replicas_max) -----------------
 * A copy of expert `item` on rank `holder` of the group: the rows that the
 * group's ranks in `sources` (a bit each) route to the expert go to the
 * copy instead of the expert's rank (never the owner's own rows). Loads
 * as above; each source counts for 1 / ranks of an expert's load. */
#define BALANCE_COPY_RANKS_MAX 64
struct balance_copy {
    int item, holder;
    uint64_t sources;
};
/* Each rank's load (ranks entries) under order and n copies. */
void balance_copies_loads(const double *loads, const int *order, int E, int ranks,
                          const struct balance_copy *copies, int n, double *rank_load);
double balance_copies_busiest(const double *loads, const int *order, int E, int ranks,
                              const struct balance_copy *copies, int n);
/* Up to copies_max copies (into copies) that lower the busiest rank's load
 * under order, one at a time, each the one that lowers it most; returns
 * how many. */
int balance_copies_plan(const double *loads, const int *order, int E, int ranks, int copies_max,
                        struct balance_copy *copies);
struct balance_copies_decision {
    double now_load, next_load; /* the busiest rank's load a step without and with the copies */
    int copies;                 /* copies to hold (0 when they do not pay) */
    double bytes;               /* what they carry each step: weights out, gradients back */
    double saving_ms, cost_ms;  /* a step's: (now - next) ms_per_load, and the bytes' cost */
    int apply;
};
/* The copies for in (its loads, ranks, ms_per_load and the moves' fit)
 * on top of order, kept when the step's saving exceeds the step's cost of
 * carrying them (bytes_per_source: one expert's weights). */
void balance_copies_decide(const struct balance_placement_input *in, const int *order,
                           int copies_max, double bytes_per_source,
                           struct balance_copy *copies, struct balance_copies_decision *d);
/* Random copies drawn from (seed, step, block) (moe.placement = random, a
 * test aid): returns how many (at most copies_max). */
int balance_copies_random(const int *order, int E, int ranks, int copies_max, uint64_t seed,
                          uint64_t step, int block, struct balance_copy *copies);

/* A random placement drawn from (seed, step, block), each rank's experts
 * ascending: moe.placement = random, a test aid. */
void balance_placement_random(int *order, int E, int ranks, uint64_t seed, uint64_t step,
                              int block);

#endif
