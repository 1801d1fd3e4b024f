/* The engine's state and the pieces its files share (engine.c: building
 * and the step; reduce.c: the step's gradient sums; stats.c: the profile
 * and the trace; migrate.c: moving blocks; the engine's parts, which a
 * scheme's parallelism adds: engine_part_ep's). Private to src/pipe. */
#ifndef DYNMO_PIPE_ENGINE_INTERNAL_H
#define DYNMO_PIPE_ENGINE_INTERNAL_H

#include <mpi.h>
#include "dynmo/backend.h"
#include "dynmo/balance.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"
#include "dynmo/world.h"

/* Message tags: activations and gradients carry the micro-batch; blocks
 * carry their layer index; tied-embedding gradients their own tag. */
enum {
    TAG_ACT = 0,
    TAG_GRAD = 1 << 20,
    TAG_BLOCK = 2 << 20,
    TAG_TIED = 3 << 20,
    TAG_EXIT = 4 << 20,   /* early exit: the micro-batch's exit layers */
    TAG_BLOCK_PIECE = 5 << 20,   /* a large block's slab, piece by piece (migrate.c) */
};

/* One micro-batch's activations in flight on this stage. */
struct slot {
    struct gpt_acts acts;
    float *dout;          /* (b,T,C) gradient received from the next stage */
    float *din;           /* (b,T,C) gradient sent to the previous stage */
    /* Host staging of what MPI sends and receives (b,T,C each; NULL on a
     * backend whose memory the host reads, where MPI uses the tensors). */
    float *act_host, *grad_host, *recv_host;
    MPI_Request send_act, send_grad;
    MPI_Request send_exit;   /* early exit: exit layers sent with the activation */
    int busy_mb;          /* micro-batch whose activations live here, or -1 */
    /* zb: each block's output gradients from BWD until WGRAD (grown to the
     * stage's block count by the BWD that needs them) */
    struct block_wgrad *wgrads;
    int wgrad_capacity;
};

/* The purposes of the engine's staging pool (staging.c): one host buffer
 * (and one device buffer) of each, grow-only. */
enum staging_purpose {
    STAGING_TIED,          /* the tied embedding's halves (reduce.c) */
    STAGING_REPLICA_SUM,   /* a piece of a replica sum (reduce.c) */
    STAGING_PART_SEND,     /* an engine part's exchange: what a rank sends */
    STAGING_PART_RECV,     /* ... and what it receives */
    STAGING_MIGRATE_SEND,  /* migration: the slabs of the blocks a rank sends (migrate.c) */
    STAGING_MIGRATE_RECV,  /* ... and of those it receives */
    STAGING_PURPOSES
};

struct staging_pool {
    void *host[STAGING_PURPOSES], *device[STAGING_PURPOSES];
    size_t host_bytes[STAGING_PURPOSES], device_bytes[STAGING_PURPOSES];
};

/* Fields of a traced instruction: op, micro-batch, start, wall, cpu. */
#define TRACE_FIELDS 5

/* Interleaved 1F1B (parallel.virtual = v > 1): a rank's chunk c is
 * virtual stage c S + stage, its own model (contiguous blocks) and
 * activation slots. The chunk an instruction addresses is the one in
 * eng->model and eng->slots (engine_use_chunk); the others rest here. */
struct engine_chunk {
    struct gpt model;
    struct slot *slots;
};

struct engine {
    struct dm_config cfg;
    struct pipe_grid grid;
    struct gpt_shape shape;
    int micro_B, T, micro_batches;  /* per replica */
    int *layout;                    /* (S v) units per virtual stage (balance.units) */
    int virtual;                    /* chunks per rank v (parallel.virtual; 1 but interleaved) */
    int chunk;                      /* the chunk in model and slots */
    struct engine_chunk *chunks;    /* (v) the resting chunks; NULL when v = 1 */
    struct gpt **chunk_models;      /* (v) engine_chunks_apart's pointers */
    int *stage_units;               /* (S) each stage's units, its chunks together */
    int sublayer;                   /* balance.units = sublayer: a unit is half a block */
    struct gpt model;
    struct block_scratch scratch;
    int nslots;
    struct slot *slots;
    struct schedule_instr *instrs;
    int ninstrs;
    /* Tracing (run.trace_from): per instruction of the step, op, micro-batch,
     * start (ms after this rank's step start), wall ms and thread CPU ms;
     * then gathered to rank 0 (trace_all, one block of TRACE_FIELDS x
     * ninstrs_max + 2 doubles a rank: count, step start). */
    double *trace_mine, *trace_all;
    int trace_count, tracing;
    double step_t0;
    MPI_Comm stage_comm;            /* the D replicas of this stage */
    MPI_Comm pipeline_comm;         /* the S stages of this replica */
    struct dyn *dyn;
    int current_step;
    /* profile of the current step (per-block times live in the model:
     * model.block_fwd_s / block_bwd_s) */
    double compute_s, wait_s;
    double update_s;      /* the step's end: part of compute_s */
    /* stats gathered on rank 0 */
    struct step_stats stats;
    double *gather_send, *gather_recv;
    int gather_len;
    int *signal_at;                 /* (stats.signal_count) each signal's place in a profile */
    MPI_Request gather_req;         /* the last step's profile gather */
    volatile int *watched_flag;
    int stop_requested;
    int pending_migrated;
    struct ep_state *ep;            /* the parallel.ep part's (engine_part_ep), or NULL */
    struct staging_pool staging;    /* the step's host staging of device tensors (staging.c) */
    /* The devices' own transport (device_comm.c): set (the same on every
     * rank) when every rank has a device of its own; then replica_comm
     * over the stage's replicas (D > 1) and pipe_comm over the replica's
     * stages (S > 1; group rank = stage), else NULL and MPI carries all,
     * through the staging where the host cannot read. tied_theirs: the
     * other half of the tied embedding's gradient (V C floats of the
     * device) on the first and last stage. pending: a send that goes with
     * the receive right after it (engine_transport_send). */
    int transport;
    struct dm_backend_comm *replica_comm, *pipe_comm;
    float *tied_theirs;
    struct dm_comm_op pending;
    int has_pending;
    double pending_migrated_bytes, pending_migrate_ms;
};

static inline int rank_of(const struct pipe_grid *g, int stage, int replica)
{
    return replica * g->stages + stage;
}

static inline size_t act_count(const struct engine *eng)
{
    return (size_t)eng->micro_B * eng->T * eng->shape.channels;
}

/* The stage's output activations in a slot: the residual after its last
 * block. */
static inline float *slot_output(struct engine *eng, struct slot *sl)
{
    return sl->acts.residual + (size_t)eng->model.num_blocks * act_count(eng);
}

/* Makes chunk c the one in eng->model and eng->slots, putting the
 * current one back among eng->chunks (nothing when v = 1). engine.c. */
void engine_use_chunk(struct engine *eng, int c);

/* The chunks' models at places of their own, for a hook that takes them
 * together (dyn.h): returns pointers to them (*count = v of them, chunk
 * 0's among eng->chunks; with one chunk, eng->model). engine_chunks_rejoin
 * makes chunk 0 the current one again, with what the hook did to it.
 * engine.c. */
struct gpt *const *engine_chunks_apart(struct engine *eng, int *count);
void engine_chunks_rejoin(struct engine *eng);

/* The units each stage holds, its chunks together (S counts; the
 * layout itself when v = 1). engine.c. */
void engine_stage_units(const struct engine *eng, int *counts);

/* First block and block count of `stage` under `layout`. */
static inline void first_block_of(const int *layout, int stage, int *first, int *count)
{
    int f = 0;
    for (int s = 0; s < stage; s++) f += layout[s];
    *first = f;
    *count = layout[stage];
}

/* With balance.units = sublayer, sets each block's halves for this
 * stage's unit range (eng->layout): an MLP half alone first when the range
 * starts inside a block, an attention half alone last when it ends inside
 * one, every other block BLOCK_HALVES. Nothing with whole-block units. */
void engine_mark_halves(struct engine *eng);

/* reduce.c. The step's end before the optimizer: masks pruned gradients,
 * forms the tied embedding gradient, sums gradients over the replicas in
 * replica order (the parts of a block that an engine part splits over
 * ranks by their holders), sums the blocks' step values over the replicas
 * and hands them to the model (gpt_end_step), and returns the global
 * gradient norm (all ranks; it also carries every rank's watched flag
 * into eng->stop_requested). Collective; its waits count in eng->wait_s. */
double engine_reduce_grads(struct engine *eng);

/* A part of the engine that a scheme's parallelism adds (engine_part_ep,
 * over parallel.ep replicas of a stage); every hook may be NULL; carries
 * names what it exchanges, for the transport's line (NULL: nothing). init
 * (collective, after the model is built) and free; profile (collective,
 * after the step's schedule: the blocks' times as the part sees them);
 * reduce (collective, inside engine_reduce_grads: the step's gradient
 * sums of the parts it splits); forget (after a migration: what it kept
 * per block); decide (collective, after every step through
 * engine_after_step: what the part places inside the stage, such as
 * expert placement). engine_parts lists them (engine.c), NULL-terminated;
 * engine_parts_run calls a hook of each in order, with the hook's
 * arguments after eng. */
struct engine_part {
    const char *carries;
    void (*init)(struct engine *eng);
    void (*free)(struct engine *eng);
    void (*profile)(struct engine *eng);
    void (*reduce)(struct engine *eng);
    void (*forget)(struct engine *eng);
    void (*decide)(struct engine *eng, int step);   /* engine_after_step */
};
extern const struct engine_part engine_part_ep;
extern const struct engine_part *const engine_parts[];
#define engine_parts_run(eng, hook, ...)                                       \
    do {                                                                       \
        for (int part_ = 0; engine_parts[part_]; part_++)                      \
            if (engine_parts[part_]->hook) engine_parts[part_]->hook(eng, ##__VA_ARGS__); \
    } while (0)

/* staging.c. staging_pool_host: purpose's host buffer of at least bytes
 * (alloc_host: pinned on CUDA; its contents scratch), grown when smaller;
 * NULL on a backend whose memory the host reads (the CPU), which needs
 * no staging. staging_pool_device: the same in the backend's memory, for
 * a backend without host access only. staging_pool_free (engine_destroy)
 * releases both. Not collective. */
void *staging_pool_host(struct staging_pool *pool, enum staging_purpose purpose, size_t bytes);
void *staging_pool_device(struct staging_pool *pool, enum staging_purpose purpose, size_t bytes);
void staging_pool_free(struct staging_pool *pool);

/* device_comm.c. init (collective) decides whether the job uses the
 * devices' own transport (eng->transport: the backend has one and every
 * rank has a device of its own, world_devices_distinct) and makes
 * replica_comm and pipe_comm; says which on rank 0 (not on the CPU).
 * engine_transport_over: a transport communicator over an MPI
 * communicator's ranks (collective over it), or NULL when the job has no
 * transport or the group is one rank. engine_transport_exchange: the
 * transfers over comm at once, waited for (eng->wait_s).
 * engine_transport_send: count floats of the device to stage `stage`
 * over pipe_comm, at once, or with pair set, together with the next
 * engine_transport_receive (the receive right after it, from the same
 * stage, whose own send pairs with this receive). */
void engine_device_comm_init(struct engine *eng);
void engine_device_comm_free(struct engine *eng);
struct dm_backend_comm *engine_transport_over(const struct engine *eng, MPI_Comm comm);
void engine_transport_exchange(struct engine *eng, struct dm_backend_comm *comm,
                               const struct dm_comm_op *ops, int n);
void engine_transport_send(struct engine *eng, const float *buf, size_t count, int stage,
                           int pair);
void engine_transport_receive(struct engine *eng, float *buf, size_t count, int stage);

/* stats.c. The step's statistics and trace buffers (rank 0 gathers). */
void engine_stats_alloc(struct engine *eng);
void engine_stats_free(struct engine *eng);
/* Collective: every rank's profile to rank 0, which fills eng->stats (a
 * non-blocking gather: the other ranks go on at once). */
void engine_gather_stats(struct engine *eng, float loss_sum, double step_s);
/* Collective on a traced step: every rank's instruction records to rank 0,
 * which lays them out as step_stats.trace rows (pipe.h). */
void engine_gather_trace(struct engine *eng, int step);
/* The calling thread's CPU seconds, for tracing. */
double engine_thread_cpu_seconds(void);
/* Records one traced instruction that began at wall / cpu seconds. */
void engine_trace_record(struct engine *eng, const struct schedule_instr *in, double wall,
                         double cpu);

#endif
