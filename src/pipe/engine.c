/* The pipeline engine: executes one stage's instruction list per step,
 * moves activations and gradients between neighbouring stages as
 * non-blocking MPI messages, reduces gradients across data-parallel
 * replicas in a fixed order, steps the optimizer, profiles every block and
 * stage, and migrates blocks live when the layout changes.
 *
 * Every wait polls (MPI_Test, then sched_yield, or a short sleep when the
 * rank shares its CPUs: world_wait_round), collectives included: with
 * more ranks than cores, MPICH's blocking waits spin and starve the rank
 * that would let them finish. The engine never decides a layout: callers
 * hand it one (engine_relayout). */
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
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
};

struct slot {
    struct gpt_acts acts;
    float *dout;          /* (b,T,C) gradient received from the next stage */
    float *din;           /* (b,T,C) gradient sent to the previous stage */
    MPI_Request send_act, send_grad;
    MPI_Request send_exit;   /* early exit: exit layers sent with the activation */
    int busy_mb;          /* micro-batch whose activations live here, or -1 */
};

struct engine {
    struct dm_config cfg;
    struct pipe_grid grid;
    struct gpt_shape shape;
    int micro_B, T, micro_batches;  /* per replica */
    int *layout;                    /* (S) */
    struct gpt model;
    struct block_scratch scratch;
    int nslots;
    struct slot *slots;
    struct pipe_instr *instrs;
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
    MPI_Request gather_req;         /* the last step's profile gather */
    long steps_done;                /* optimizer steps completed */
    volatile int *watched_flag;
    int stop_requested;
    struct layout_history history;  /* this world's layouts and the steps they held from */
    int pending_migrated;
    double pending_migrated_bytes, pending_migrate_ms;
    int weights_pending;        /* engine_resume initialises them if it loads nothing */
};

static int rank_of(const struct pipe_grid *g, int stage, int replica)
{
    return replica * g->stages + stage;
}

/* ---- layouts -------------------------------------------------------------- */

void layout_format(char *buf, size_t size, const int *counts, int stages)
{
    size_t used = 0;
    buf[0] = 0;
    for (int s = 0; s < stages; s++)
        used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s%d",
                                 s ? "," : "", counts[s]);
}

/* DeepSpeed's equal-parameters layout: the exact min-max partition of
 * parameter counts (embedding on the first stage, final norm on the last). */
static void layout_params(int *counts, int stages, int layers, const struct dm_config *cfg)
{
    struct gpt_shape shape = gpt_shape_from_config(cfg);
    double *cost = dm_alloc((size_t)layers * sizeof(double));
    int64_t *mem = dm_alloc((size_t)layers * sizeof(int64_t));
    for (int b = 0; b < layers; b++) {
        cost[b] = (double)block_param_count(shape.channels);
        mem[b] = (int64_t)(4 * block_param_count(shape.channels) * sizeof(float));
    }
    struct balance_costs costs = {
        .blocks = layers, .cost = cost, .mem_bytes = mem,
        .first_cost = (double)(shape.vocab + shape.max_seq) * shape.channels,
        .last_cost = 2.0 * shape.channels,
    };
    char err[256];
    struct balance_result res;
    if (balance_partition(&costs, stages, 0, NULL, 0, counts, &res, err, sizeof err) != BALANCE_OK)
        dm_user_error("balance.initial = params: %s", err);
    dm_free(cost);
    dm_free(mem);
}

void layout_from_spec(int *counts, const char *spec, int stages, int layers,
                      const struct dm_config *cfg)
{
    if (stages > layers)
        dm_user_error("parallel.pp = %d exceeds model.layers = %d: every stage needs a block",
                      stages, layers);
    if (!strcmp(spec, "uniform")) {
        char err[256];
        if (balance_static_uniform(layers, stages, counts, err, sizeof err) != BALANCE_OK)
            dm_user_error("balance.initial = uniform: %s", err);
    } else if (!strcmp(spec, "params")) {
        layout_params(counts, stages, layers, cfg);
    } else if (!strncmp(spec, "explicit:", 9)) {
        const char *p = spec + 9;
        int n = 0, sum = 0;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || (*end && *end != ','))
                dm_user_error("balance.initial = '%s': expected explicit:n1,n2,... with "
                              "integers", spec);
            if (v < 1)
                dm_user_error("balance.initial = '%s': stage %d has %ld blocks; every "
                              "stage needs at least one", spec, n, v);
            if (n < stages) counts[n] = (int)v;
            n++;
            sum += (int)v;
            p = *end ? end + 1 : end;
        }
        if (n != stages)
            dm_user_error("balance.initial = '%s' lists %d stages but parallel.pp = %d",
                          spec, n, stages);
        if (sum != layers)
            dm_user_error("balance.initial = '%s' covers %d blocks but model.layers = %d",
                          spec, sum, layers);
    } else {
        dm_user_error("balance.initial = '%s' must be uniform, params or explicit:n1,n2,...",
                      spec);
    }
}

/* ---- building ------------------------------------------------------------- */

static void first_block_of(const int *layout, int stage, int *first, int *count)
{
    int f = 0;
    for (int s = 0; s < stage; s++) f += layout[s];
    *first = f;
    *count = layout[stage];
}

static void slots_alloc(struct engine *eng)
{
    size_t btc = (size_t)eng->micro_B * eng->T * eng->shape.channels;
    eng->slots = dm_alloc((size_t)eng->nslots * sizeof *eng->slots);
    for (int i = 0; i < eng->nslots; i++) {
        struct slot *sl = &eng->slots[i];
        gpt_acts_alloc(&sl->acts, &eng->model, eng->micro_B, eng->T);
        sl->dout = dm_alloc(btc * sizeof(float));
        sl->din = dm_alloc(btc * sizeof(float));
        sl->send_act = MPI_REQUEST_NULL;
        sl->send_exit = MPI_REQUEST_NULL;
        sl->send_grad = MPI_REQUEST_NULL;
        sl->busy_mb = -1;
    }
}

static void slots_free(struct engine *eng)
{
    for (int i = 0; i < eng->nslots; i++) {
        struct slot *sl = &eng->slots[i];
        world_wait(&sl->send_act);
        world_wait(&sl->send_exit);
        world_wait(&sl->send_grad);
        gpt_acts_free(&sl->acts);
        dm_free(sl->dout);
        dm_free(sl->din);
    }
    dm_free(eng->slots);
    eng->slots = NULL;
}

static void history_push(struct engine *eng, long step)
{
    layout_history_push(&eng->history, step, eng->layout, eng->grid.stages);
}

/* Whether engine_resume may load a checkpoint under cfg. */
static int may_resume(const struct dm_config *cfg)
{
    if (!strcmp(cfg->resume, "none")) return 0;
    return strcmp(cfg->resume, "auto") != 0 || cfg->ckpt_dir[0] != '\0';
}

#define TRACE_FIELDS 5   /* op, micro-batch, start, wall, cpu */

/* Doubles a rank sends for a traced step: its count and step start, then
 * TRACE_FIELDS per instruction, room for the longest list. */
static size_t trace_block(const struct engine *eng)
{
    return 2 + (size_t)TRACE_FIELDS * SCHEDULE_MAX_INSTRS(eng->micro_batches);
}

static double thread_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct engine *engine_create(const struct dm_config *cfg, int resuming)
{
    struct engine *eng = dm_alloc(sizeof *eng);
    eng->cfg = *cfg;
    struct pipe_grid *g = &eng->grid;
    g->stages = cfg->pp;
    g->replicas = cfg->dp;
    g->rank = dm_rank();
    g->world_size = dm_world_size();
    if (g->stages * g->replicas != g->world_size)
        dm_user_error("parallel.pp x parallel.dp = %d x %d = %d but the job has %d ranks "
                      "(run mpiexec -n %d, or change parallel.pp / parallel.dp)",
                      g->stages, g->replicas, g->stages * g->replicas, g->world_size,
                      g->stages * g->replicas);
    g->stage = g->rank % g->stages;
    g->replica = g->rank / g->stages;
    eng->shape = gpt_shape_from_config(cfg);
    eng->micro_batches = cfg->micro_batches;
    eng->micro_B = cfg->batch / (cfg->dp * cfg->micro_batches);
    eng->T = cfg->seq;
    eng->layout = dm_alloc((size_t)g->stages * sizeof(int));
    layout_from_spec(eng->layout, cfg->initial, g->stages, eng->shape.layers, cfg);

    int first, count;
    first_block_of(eng->layout, g->stage, &first, &count);
    eng->weights_pending = resuming && may_resume(cfg);
    if (eng->weights_pending)
        gpt_build_deferred(&eng->model, &eng->shape, first, count, g->stage == 0,
                           g->stage == g->stages - 1);
    else
        gpt_build(&eng->model, &eng->shape, first, count, g->stage == 0,
                  g->stage == g->stages - 1, cfg->seed);
    block_scratch_alloc(&eng->scratch, eng->micro_B, eng->T, eng->shape.channels,
                        eng->shape.heads);
    eng->instrs = dm_alloc(SCHEDULE_MAX_INSTRS(eng->micro_batches) * sizeof(struct pipe_instr));
    eng->ninstrs = schedule_stage(eng->instrs, config_schedule(cfg), g->stage, g->stages,
                                  eng->micro_batches);
    eng->nslots = config_schedule(cfg) == DM_SCHEDULE_GPIPE
                      ? eng->micro_batches
                      : (g->stages - g->stage < eng->micro_batches ? g->stages - g->stage
                                                                   : eng->micro_batches);
    slots_alloc(eng);
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->stage, g->replica, &eng->stage_comm));
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->replica, g->stage, &eng->pipeline_comm));
    struct dyn_env env = {.pipeline_comm = eng->pipeline_comm, .stage = g->stage,
                          .stages = g->stages};
    eng->dyn = dyn_create(cfg, &env);

    int L = eng->shape.layers, S = g->stages;
    struct step_stats *st = &eng->stats;
    if (cfg->trace_from > 0) {
        size_t block = trace_block(eng);
        eng->trace_mine = dm_alloc(block * sizeof(double));
        if (g->rank == 0) {
            eng->trace_all = dm_alloc(block * (size_t)g->world_size * sizeof(double));
            st->trace = dm_alloc((size_t)g->world_size *
                                 SCHEDULE_MAX_INSTRS(eng->micro_batches) *
                                 STEP_TRACE_COLUMNS * sizeof(float));
        }
    }
    st->layer_fwd_ms = dm_alloc((size_t)L * sizeof(double));
    st->layer_bwd_ms = dm_alloc((size_t)L * sizeof(double));
    st->layer_mem_bytes = dm_alloc((size_t)L * sizeof(double));
    st->layer_sparsity = dm_alloc((size_t)L * sizeof(double));
    st->layer_active = dm_alloc((size_t)L * sizeof(double));
    st->layer_update_ms = dm_alloc((size_t)L * sizeof(double));
    st->stage_update_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_compute_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_wait_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_peak_mb = dm_alloc((size_t)S * sizeof(double));
    st->layout = dm_alloc((size_t)S * sizeof(int));
    /* per rank: loss sum, compute, wait, peak, then fwd/bwd/mem/sparsity/active/
     * update per layer, then the stage's update */
    eng->gather_len = 5 + 6 * L;
    eng->gather_send = dm_alloc((size_t)eng->gather_len * sizeof(double));
    eng->gather_recv = dm_alloc((size_t)eng->gather_len * g->world_size * sizeof(double));
    eng->gather_req = MPI_REQUEST_NULL;
    layout_history_init(&eng->history, L);
    history_push(eng, 0);
    return eng;
}

void engine_destroy(struct engine *eng)
{
    world_wait(&eng->gather_req);
    slots_free(eng);
    block_scratch_free(&eng->scratch);
    gpt_free(&eng->model);
    dyn_destroy(eng->dyn);
    WORLD_MPI(MPI_Comm_free(&eng->stage_comm));
    WORLD_MPI(MPI_Comm_free(&eng->pipeline_comm));
    struct step_stats *st = &eng->stats;
    dm_free(st->layer_fwd_ms);
    dm_free(st->layer_bwd_ms);
    dm_free(st->layer_mem_bytes);
    dm_free(st->layer_sparsity);
    dm_free(st->layer_active);
    dm_free(st->layer_update_ms);
    dm_free(st->stage_update_ms);
    dm_free(st->trace);
    dm_free(eng->trace_mine);
    dm_free(eng->trace_all);
    dm_free(st->stage_compute_ms);
    dm_free(st->stage_wait_ms);
    dm_free(st->stage_peak_mb);
    dm_free(st->layout);
    dm_free(eng->gather_send);
    dm_free(eng->gather_recv);
    dm_free(eng->instrs);
    dm_free(eng->layout);
    layout_history_free(&eng->history);
    dm_free(eng);
}

const struct pipe_grid *engine_grid(const struct engine *eng) { return &eng->grid; }
const int *engine_layout(const struct engine *eng) { return eng->layout; }

/* ---- one step ------------------------------------------------------------- */

static struct slot *slot_for(struct engine *eng, int mb)
{
    return &eng->slots[mb % eng->nslots];
}

/* Global sample index of micro-batch mb of this replica in step `step`. */
static long first_sample(const struct engine *eng, int step, int mb)
{
    return (long)step * eng->cfg.batch +
           (long)eng->grid.replica * eng->micro_batches * eng->micro_B + (long)mb * eng->micro_B;
}

/* Forms the tied wte gradient on the stages that hold wte: the first
 * stage (embedding half, dwte) and the last stage (head half, dwte_head)
 * swap halves, and gpt_tie_wte_grads adds them as embedding + head on
 * both, the same bits as one rank. */
static void exchange_tied_grads(struct engine *eng)
{
    const struct pipe_grid *g = &eng->grid;
    struct gpt *m = &eng->model;
    if (g->stages == 1) {
        gpt_tie_wte_grads(m, NULL);
        return;
    }
    if (g->stage != 0 && g->stage != g->stages - 1) return;
    long n = (long)eng->shape.vocab * eng->shape.channels;
    int peer = rank_of(g, g->stage == 0 ? g->stages - 1 : 0, g->replica);
    float *mine = g->stage == 0 ? m->dwte : m->dwte_head;
    float *theirs = dm_alloc((size_t)n * sizeof(float));
    MPI_Request reqs[2];
    WORLD_MPI(MPI_Irecv(theirs, (int)n, MPI_FLOAT, peer, TAG_TIED, MPI_COMM_WORLD, &reqs[0]));
    WORLD_MPI(MPI_Isend(mine, (int)n, MPI_FLOAT, peer, TAG_TIED, MPI_COMM_WORLD, &reqs[1]));
    eng->wait_s += world_wait_all(2, reqs);
    gpt_tie_wte_grads(m, theirs);
    dm_free(theirs);
}

/* Sums one float array across the D replicas of this stage, in replica
 * order 0, 1, ..., D-1 on every replica, so the result does not depend on
 * timing or on MPI's reduction algorithm. */
static void replica_sum(struct engine *eng, float *x, long n, float *gathered)
{
    int D = eng->grid.replicas;
    MPI_Request req;
    WORLD_MPI(MPI_Iallgather(x, (int)n, MPI_FLOAT, gathered, (int)n, MPI_FLOAT, eng->stage_comm,
                          &req));
    eng->wait_s += world_wait(&req);
    for (long i = 0; i < n; i++) {
        float s = gathered[i];
        for (int r = 1; r < D; r++) s += gathered[(long)r * n + i];
        x[i] = s;
    }
}

static void reduce_replicas(struct engine *eng)
{
    if (eng->grid.replicas == 1) return;
    struct gpt *m = &eng->model;
    size_t biggest = m->embed_nparams;
    for (int i = 0; i < m->num_blocks; i++)
        if (m->blocks[i].nparams > biggest) biggest = m->blocks[i].nparams;
    float *gathered = dm_alloc(biggest * (size_t)eng->grid.replicas * sizeof(float));
    double clock = dm_profile_now();
    for (int i = 0; i < m->num_blocks; i++) {
        /* frozen on every replica alike, with zero gradients (struct block) */
        if (m->blocks[i].frozen) continue;
        replica_sum(eng, m->blocks[i].grads, (long)m->blocks[i].nparams, gathered);
        gpt_charge_update(m, i, &clock);
    }
    /* The tied wte halves were combined already (exchange_tied_grads). */
    if (m->embed_slab) replica_sum(eng, m->dwte, (long)m->embed_nparams, gathered);
    dm_free(gathered);
}

/* The global gradient norm: each unit (embedding, block 0..L-1, head) is
 * summed by its owner in a fixed order; the units are combined by a sum
 * where each has exactly one non-zero contributor (replica 0 of its
 * stage), and added in unit order on every rank: the same bits as one
 * rank computing everything. */
static double global_grad_norm(struct engine *eng)
{
    int L = eng->shape.layers;
    /* units[L + 2] carries the watched flag of every rank. */
    double *units = dm_alloc((size_t)(L + 3) * sizeof(double));
    double *total = dm_alloc((size_t)(L + 3) * sizeof(double));
    units[L + 2] = (eng->watched_flag && *eng->watched_flag) ? 1.0 : 0.0;
    if (eng->grid.replica == 0) {
        struct gpt *m = &eng->model;
        units[0] = gpt_embed_grad_sumsq(m);
        double clock = dm_profile_now();
        for (int i = 0; i < m->num_blocks; i++) {
            units[1 + m->first_block + i] = block_grad_sumsq(&m->blocks[i]);
            if (!m->blocks[i].frozen) gpt_charge_update(m, i, &clock);   /* it did nothing */
        }
        units[L + 1] = gpt_head_grad_sumsq(m);
    }
    if (eng->grid.world_size > 1) {
        MPI_Request req;
        WORLD_MPI(MPI_Iallreduce(units, total, L + 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &req));
        eng->wait_s += world_wait(&req);
    } else {
        memcpy(total, units, (size_t)(L + 3) * sizeof(double));
    }
    eng->stop_requested = total[L + 2] > 0.0;
    dyn_after_reduce(eng->dyn, &eng->model, eng->current_step, total + 1);
    double sum = 0.0;
    for (int u = 0; u < L + 2; u++) sum += total[u];
    dm_free(units);
    dm_free(total);
    return sqrt(sum);
}

static void run_forward(struct engine *eng, struct loader *loader, int step, int mb,
                        float *loss_sum)
{
    struct slot *sl = slot_for(eng, mb);
    struct gpt *m = &eng->model;
    DM_ASSERT(sl->busy_mb == -1);
    sl->busy_mb = mb;
    if ((m->has_embed || m->has_head || m->exit) && loader)   /* exit heads need targets */
        loader_fill(loader, first_sample(eng, step, mb), eng->micro_B, sl->acts.tokens,
                    sl->acts.targets);
    double t0 = dm_profile_now();
    float loss = gpt_forward(m, &sl->acts);
    eng->compute_s += dm_profile_now() - t0;
    if (m->has_head) *loss_sum += loss;
}

static void run_backward(struct engine *eng, int mb)
{
    struct slot *sl = slot_for(eng, mb);
    struct gpt *m = &eng->model;
    DM_ASSERT(sl->busy_mb == mb);
    eng->wait_s += world_wait(&sl->send_grad);   /* din is about to change */
    float scale = 1.0f / (float)(eng->micro_batches * eng->grid.replicas);
    /* a stage frozen with everything before it has nothing to compute */
    int work = m->has_head || m->first_block + m->num_blocks > m->frozen_prefix;
    if (work) world_compute_begin();
    double t0 = dm_profile_now();
    gpt_backward(m, &sl->acts, &eng->scratch, scale, m->has_head ? NULL : sl->dout,
                 m->has_embed ? NULL : sl->din);
    eng->compute_s += dm_profile_now() - t0;
}

static size_t act_count(const struct engine *eng)
{
    return (size_t)eng->micro_B * eng->T * eng->shape.channels;
}

static float *slot_output(struct engine *eng, struct slot *sl)
{
    return sl->acts.residual + (size_t)eng->model.num_blocks * act_count(eng);
}

/* Executes this stage's list for one step; returns the stage's loss sum
 * (last stage) over its micro-batches. */
static float run_schedule(struct engine *eng, struct loader *loader, int step, double *grad_norm,
                          double *lr)
{
    const struct pipe_grid *g = &eng->grid;
    int prev = rank_of(g, g->stage - 1, g->replica), next = rank_of(g, g->stage + 1, g->replica);
    int n = (int)act_count(eng);
    float loss_sum = 0.0f;
    for (int k = 0; k < eng->ninstrs; k++) {
        const struct pipe_instr *in = &eng->instrs[k];
        int mb = in->micro_batch;
        struct slot *sl = mb >= 0 ? slot_for(eng, mb) : NULL;
        MPI_Request req;
        double trace_wall = 0.0, trace_cpu = 0.0;
        if (eng->tracing) {
            trace_wall = dm_now();
            trace_cpu = thread_cpu_seconds();
        }
        switch (in->op) {
        case PIPE_RECV_ACT:
            eng->wait_s += world_wait(&sl->send_act);
            eng->wait_s += world_wait(&sl->send_exit);
            WORLD_MPI(MPI_Irecv(sl->acts.residual, n, MPI_FLOAT, prev, TAG_ACT + mb,
                             MPI_COMM_WORLD, &req));
            eng->wait_s += world_wait(&req);
            if (eng->model.exit) {
                WORLD_MPI(MPI_Irecv(gpt_exit_layers(&eng->model, &sl->acts),
                                 eng->micro_B * eng->T, MPI_INT, prev, TAG_EXIT + mb,
                                 MPI_COMM_WORLD, &req));
                eng->wait_s += world_wait(&req);
            }
            break;
        case PIPE_FWD:
            world_compute_begin();
            run_forward(eng, loader, step, mb, &loss_sum);
            break;
        case PIPE_SEND_ACT:
            WORLD_MPI(MPI_Isend(slot_output(eng, sl), n, MPI_FLOAT, next, TAG_ACT + mb,
                             MPI_COMM_WORLD, &sl->send_act));
            if (eng->model.exit)
                WORLD_MPI(MPI_Isend(gpt_exit_layers(&eng->model, &sl->acts),
                                 eng->micro_B * eng->T, MPI_INT, next, TAG_EXIT + mb,
                                 MPI_COMM_WORLD, &sl->send_exit));
            break;
        case PIPE_RECV_GRAD:
            WORLD_MPI(MPI_Irecv(sl->dout, n, MPI_FLOAT, next, TAG_GRAD + mb, MPI_COMM_WORLD, &req));
            eng->wait_s += world_wait(&req);
            break;
        case PIPE_BWD:
            run_backward(eng, mb);
            break;
        case PIPE_SEND_GRAD:
            WORLD_MPI(MPI_Isend(sl->din, n, MPI_FLOAT, prev, TAG_GRAD + mb, MPI_COMM_WORLD,
                             &sl->send_grad));
            break;
        case PIPE_REDUCE_GRADS: {
            double t0 = dm_profile_now();
            double w0 = eng->wait_s;
            gpt_mask_pruned_grads(&eng->model);
            exchange_tied_grads(eng);
            reduce_replicas(eng);
            *grad_norm = global_grad_norm(eng);
            /* CPU time hardly grows while a wait sleeps; wall time does */
            double waited = dm_profile_is_cpu_time() ? 0.0 : eng->wait_s - w0;
            double spent = (dm_profile_now() - t0) - waited;
            eng->compute_s += spent;
            eng->update_s += spent;
            break;
        }
        case PIPE_OPTIMIZER_STEP: {
            double t0 = dm_profile_now();
            const struct dm_config *cfg = &eng->cfg;
            float scale = 1.0f;
            if (cfg->grad_clip > 0 && *grad_norm > cfg->grad_clip)
                scale = (float)(cfg->grad_clip / (*grad_norm + 1e-6));   /* as torch clip_grad_norm_ */
            *lr = lr_at_step(cfg, step);
            world_compute_begin();
            gpt_adamw_update(&eng->model, *lr, cfg->beta1, cfg->beta2, cfg->eps,
                             cfg->weight_decay, scale, step + 1);
            gpt_zero_grads(&eng->model);
            double spent = dm_profile_now() - t0;
            eng->compute_s += spent;
            eng->update_s += spent;
            break;
        }
        default:
            DM_FATAL("unknown instruction %d", (int)in->op);
        }
        if (in->op == PIPE_BWD) sl->busy_mb = -1;
        if (eng->tracing) {
            double *r = eng->trace_mine + 2 + (size_t)TRACE_FIELDS * eng->trace_count++;
            r[0] = in->op;
            r[1] = mb;
            r[2] = (trace_wall - eng->step_t0) * 1e3;
            r[3] = (dm_now() - trace_wall) * 1e3;
            r[4] = (thread_cpu_seconds() - trace_cpu) * 1e3;
        }
    }
    world_release_turn();
    for (int i = 0; i < eng->nslots; i++) {
        eng->wait_s += world_wait(&eng->slots[i].send_act);
        eng->wait_s += world_wait(&eng->slots[i].send_exit);
        eng->wait_s += world_wait(&eng->slots[i].send_grad);
    }
    return loss_sum;
}

/* Gathers every rank's profile on rank 0 (a non-blocking gather: the other
 * ranks go on at once; rank 0, which finishes its step last in both
 * schedules, polls it) and fills eng->stats there. */
static void gather_stats(struct engine *eng, float loss_sum, double step_s)
{
    const struct pipe_grid *g = &eng->grid;
    struct gpt *m = &eng->model;
    int L = eng->shape.layers, S = g->stages;
    double *v = eng->gather_send;
    memset(v, 0, (size_t)eng->gather_len * sizeof(double));
    v[0] = loss_sum;
    v[1] = eng->compute_s;
    v[2] = eng->wait_s;
    v[3] = (double)dm_peak_rss_bytes();
    for (int i = 0; i < m->num_blocks; i++) {
        int layer = m->first_block + i;
        v[4 + layer] = m->block_fwd_s[i];
        v[4 + L + layer] = m->block_bwd_s[i];
        v[4 + 2 * L + layer] = (double)block_pack_size(&m->blocks[i]);
        v[4 + 3 * L + layer] = block_matrix_sparsity(&m->blocks[i]);
        const struct gpt_exit *x = m->exit;
        v[4 + 4 * L + layer] = x && x->layer_tokens && x->layer_tokens[layer] > 0
                                   ? x->layer_computed[layer] / x->layer_tokens[layer] : 1.0;
        v[4 + 5 * L + layer] = m->block_update_s[i];
    }
    v[4 + 6 * L] = eng->update_s;
    world_wait(&eng->gather_req);   /* the previous step's gather (non-root ranks) */
    WORLD_MPI(MPI_Igather(v, eng->gather_len, MPI_DOUBLE, eng->gather_recv, eng->gather_len,
                       MPI_DOUBLE, 0, MPI_COMM_WORLD, &eng->gather_req));
    if (g->rank != 0) return;
    world_wait(&eng->gather_req);

    struct step_stats *st = &eng->stats;
    double mb_count = (double)eng->micro_batches;
    float loss_total = 0.0f;
    for (int r = 0; r < g->replicas; r++)
        loss_total += (float)eng->gather_recv[(size_t)rank_of(g, S - 1, r) * eng->gather_len];
    st->loss = loss_total / (float)(eng->micro_batches * g->replicas);
    st->step_ms = step_s * 1e3;
    for (int l = 0; l < L; l++) {
        st->layer_fwd_ms[l] = st->layer_bwd_ms[l] = st->layer_mem_bytes[l] = 0.0;
        st->layer_sparsity[l] = st->layer_active[l] = st->layer_update_ms[l] = 0.0;
    }
    for (int s = 0; s < S; s++) {
        st->stage_compute_ms[s] = st->stage_wait_ms[s] = st->stage_peak_mb[s] = 0.0;
        st->stage_update_ms[s] = 0.0;
        st->layout[s] = eng->layout[s];
    }
    double idle = 0.0, cmax = 0.0, cmin = INFINITY, csum = 0.0;
    for (int r = 0; r < g->world_size; r++) {
        const double *x = eng->gather_recv + (size_t)r * eng->gather_len;
        int s = r % S, rep = r / S;
        if (x[1] * 1e3 > st->stage_compute_ms[s]) st->stage_compute_ms[s] = x[1] * 1e3;
        if (x[2] * 1e3 > st->stage_wait_ms[s]) st->stage_wait_ms[s] = x[2] * 1e3;
        if (x[3] / 1048576.0 > st->stage_peak_mb[s]) st->stage_peak_mb[s] = x[3] / 1048576.0;
        if (x[4 + 6 * L] * 1e3 > st->stage_update_ms[s]) st->stage_update_ms[s] = x[4 + 6 * L] * 1e3;
        double busy = x[1] > step_s ? step_s : x[1];
        idle += step_s - busy;
        if (rep == 0)
            for (int l = 0; l < L; l++) {
                st->layer_fwd_ms[l] += x[4 + l] * 1e3 / mb_count;
                st->layer_bwd_ms[l] += x[4 + L + l] * 1e3 / mb_count;
                st->layer_mem_bytes[l] += x[4 + 2 * L + l];
                st->layer_sparsity[l] += x[4 + 3 * L + l];
                st->layer_active[l] += x[4 + 4 * L + l];
                st->layer_update_ms[l] += x[4 + 5 * L + l] * 1e3;
            }
    }
    for (int s = 0; s < S; s++) {
        double c = st->stage_compute_ms[s];
        cmax = c > cmax ? c : cmax;
        cmin = c < cmin ? c : cmin;
        csum += c;
    }
    st->imbalance = csum > 0 ? (cmax - cmin) / (csum / S) : 0.0;
    st->bubble_ratio = step_s > 0 ? idle / (g->world_size * step_s) : 0.0;
}

/* Collective on a traced step: every rank's instruction records to rank 0,
 * which lays them out as step_stats.trace rows (pipe.h). */
static void gather_trace(struct engine *eng, int step)
{
    const struct pipe_grid *g = &eng->grid;
    size_t block = trace_block(eng);
    eng->trace_mine[0] = eng->trace_count;
    eng->trace_mine[1] = eng->step_t0 * 1e3;
    MPI_Request req;
    WORLD_MPI(MPI_Igather(eng->trace_mine, (int)block, MPI_DOUBLE, eng->trace_all, (int)block,
                       MPI_DOUBLE, 0, MPI_COMM_WORLD, &req));
    world_wait(&req);
    if (g->rank != 0) return;
    struct step_stats *st = &eng->stats;
    int rows = 0;
    for (int r = 0; r < g->world_size; r++) {
        const double *x = eng->trace_all + (size_t)r * block;
        for (int k = 0; k < (int)x[0]; k++) {
            const double *e = x + 2 + (size_t)TRACE_FIELDS * k;
            float *row = st->trace + (size_t)rows++ * STEP_TRACE_COLUMNS;
            row[0] = (float)(step + 1);
            row[1] = (float)r;
            row[2] = (float)(r % g->stages);
            row[3] = (float)e[0];
            row[4] = (float)e[1];
            /* on one node all ranks read the same clock: starts from rank 0's */
            row[5] = (float)(e[2] + x[1] - eng->trace_all[1]);
            row[6] = (float)e[3];
            row[7] = (float)e[4];
        }
    }
    st->trace_rows = rows;
}

const struct step_stats *engine_step(struct engine *eng, struct loader *loader, int step)
{
    struct gpt *m = &eng->model;
    for (int i = 0; i < m->num_blocks; i++)
        m->block_fwd_s[i] = m->block_bwd_s[i] = m->block_update_s[i] = 0.0;
    eng->compute_s = eng->wait_s = eng->update_s = 0.0;
    eng->current_step = step;
    const struct dm_config *cfg = &eng->cfg;
    eng->tracing = cfg->trace_from > 0 && step + 1 >= cfg->trace_from &&
                   step + 1 < cfg->trace_from + cfg->trace_steps;
    eng->trace_count = 0;
    double t0 = dm_now();
    eng->step_t0 = t0;
    dyn_before_step(eng->dyn, m, step);
    double grad_norm = 0.0, lr = 0.0;
    float loss_sum = run_schedule(eng, loader, step, &grad_norm, &lr);
    double step_s = dm_now() - t0;
    gather_stats(eng, loss_sum, step_s);
    struct step_stats *st = &eng->stats;
    st->trace_rows = 0;
    if (eng->tracing) gather_trace(eng, step);
    st->grad_norm = grad_norm;
    st->lr = lr;
    st->stop_requested = eng->stop_requested;
    if (eng->grid.rank == 0) dyn_describe(eng->dyn, m, st->dyn_text, sizeof st->dyn_text);
    eng->steps_done = step + 1;
    st->migrated_blocks = eng->pending_migrated;
    st->migrated_bytes = eng->pending_migrated_bytes;
    st->migrate_ms = eng->pending_migrate_ms;
    eng->pending_migrated = 0;
    eng->pending_migrated_bytes = eng->pending_migrate_ms = 0.0;
    return st;
}

/* Forward only over the validation samples; the last stages' loss sums are
 * combined on rank 0. */
float engine_eval(struct engine *eng, struct loader *val)
{
    const struct pipe_grid *g = &eng->grid;
    int prev = rank_of(g, g->stage - 1, g->replica), next = rank_of(g, g->stage + 1, g->replica);
    int n = (int)act_count(eng);
    struct slot *sl = &eng->slots[0];
    struct gpt *m = &eng->model;
    float sum = 0.0f;
    int count = 0;
    for (int b = 0; b < eng->cfg.eval_batches; b++) {
        for (int mb = 0; mb < eng->micro_batches; mb++) {
            MPI_Request req;
            if (g->stage > 0) {
                WORLD_MPI(MPI_Irecv(sl->acts.residual, n, MPI_FLOAT, prev, TAG_ACT + mb,
                                 MPI_COMM_WORLD, &req));
                world_wait(&req);
                if (m->exit) {
                    WORLD_MPI(MPI_Irecv(gpt_exit_layers(m, &sl->acts), eng->micro_B * eng->T,
                                     MPI_INT, prev, TAG_EXIT + mb, MPI_COMM_WORLD, &req));
                    world_wait(&req);
                }
            }
            loader_fill(val, first_sample(eng, b, mb), eng->micro_B, sl->acts.tokens,
                        sl->acts.targets);
            float loss = gpt_forward(m, &sl->acts);
            if (m->has_head) sum += loss;
            count++;
            if (g->stage < g->stages - 1) {
                WORLD_MPI(MPI_Isend(slot_output(eng, sl), n, MPI_FLOAT, next, TAG_ACT + mb,
                                 MPI_COMM_WORLD, &req));
                world_wait(&req);
                if (m->exit) {
                    WORLD_MPI(MPI_Isend(gpt_exit_layers(m, &sl->acts), eng->micro_B * eng->T,
                                     MPI_INT, next, TAG_EXIT + mb, MPI_COMM_WORLD, &req));
                    world_wait(&req);
                }
            }
        }
    }
    for (int i = 0; i < m->num_blocks; i++) m->block_fwd_s[i] = 0.0;
    /* Sum over the last stages of all replicas onto rank 0. */
    double mine = (g->stage == g->stages - 1) ? (double)sum : 0.0, total = 0.0;
    MPI_Request req;
    WORLD_MPI(MPI_Ireduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD, &req));
    world_wait(&req);
    return (float)(total / ((double)count * g->replicas));
}

/* ---- live migration -------------------------------------------------------- */

static int stage_of_block(const int *layout, int stages, int block)
{
    int end = 0;
    for (int s = 0; s < stages; s++) {
        end += layout[s];
        if (block < end) return s;
    }
    DM_FATAL("block %d outside the layout", block);
}

/* The datatype of one migrating block's message: its header and dynamic
 * state (meta, meta_bytes), its parameters and its Adam moments (m and v
 * are adjacent in the slab), addressed absolutely (MPI_BOTTOM). */
static void block_message_type(MPI_Datatype *type, void *meta, int meta_bytes,
                               const struct block *blk)
{
    int lengths[3] = {meta_bytes, (int)(blk->nparams * sizeof(float)),
                      (int)(2 * blk->nparams * sizeof(float))};
    MPI_Aint where[3];
    WORLD_MPI(MPI_Get_address(meta, &where[0]));
    WORLD_MPI(MPI_Get_address(blk->params, &where[1]));
    WORLD_MPI(MPI_Get_address(blk->m, &where[2]));
    WORLD_MPI(MPI_Type_create_hindexed(3, lengths, where, MPI_BYTE, type));
    WORLD_MPI(MPI_Type_commit(type));
}

void engine_relayout(struct engine *eng, const int *root_counts)
{
    const struct pipe_grid *g = &eng->grid;
    int S = g->stages, L = eng->shape.layers;
    double t0 = dm_now();
    int *counts = dm_alloc((size_t)S * sizeof(int));
    if (g->rank == 0) memcpy(counts, root_counts, (size_t)S * sizeof(int));
    if (g->world_size > 1) {
        MPI_Request breq;
        WORLD_MPI(MPI_Ibcast(counts, S, MPI_INT, 0, MPI_COMM_WORLD, &breq));
        world_wait(&breq);
    }
    int total = 0;
    for (int s = 0; s < S; s++) {
        DM_ASSERT(counts[s] >= 1);
        total += counts[s];
    }
    DM_ASSERT(total == L);
    if (!memcmp(counts, eng->layout, (size_t)S * sizeof(int))) {
        dm_free(counts);
        return;
    }
    struct gpt *m = &eng->model;
    int new_first, new_count;
    first_block_of(counts, g->stage, &new_first, &new_count);

    /* A block that leaves travels as one message gathered from three
     * places (an MPI hindexed datatype): its header and dynamic state, its
     * parameters and its Adam moments, straight from the slab with no
     * packing copy. The receiver probes for the size (the dynamic state
     * varies), allocates the new slab and scatters the message into it. */
    int nsend = 0, moved = 0;
    double bytes = 0.0;
    MPI_Request *reqs = dm_alloc((size_t)(L + 1) * sizeof(MPI_Request));
    MPI_Datatype *types = dm_alloc((size_t)(L + 1) * sizeof(MPI_Datatype));
    int ntypes = 0;
    void **metas = dm_alloc((size_t)(L + 1) * sizeof(void *));
    int *meta_bytes = dm_alloc((size_t)(L + 1) * sizeof(int));
    struct block *arrived = dm_alloc((size_t)(L + 1) * sizeof(struct block));
    size_t slab_bytes = 3 * block_param_count(eng->shape.channels) * sizeof(float);
    for (int b = 0; b < L; b++) {
        int from = stage_of_block(eng->layout, S, b), to = stage_of_block(counts, S, b);
        if (from == to || from != g->stage) continue;
        struct block *blk = &m->blocks[b - m->first_block];
        meta_bytes[b] = (int)block_meta_size(blk);
        metas[b] = dm_alloc((size_t)meta_bytes[b]);
        block_pack_meta(blk, metas[b]);
        block_message_type(&types[ntypes], metas[b], meta_bytes[b], blk);
        WORLD_MPI(MPI_Isend(MPI_BOTTOM, 1, types[ntypes], rank_of(g, to, g->replica),
                         TAG_BLOCK + b, MPI_COMM_WORLD, &reqs[nsend++]));
        ntypes++;
    }
    for (int b = 0; b < L; b++) {
        int from = stage_of_block(eng->layout, S, b), to = stage_of_block(counts, S, b);
        if (from == to) continue;
        moved++;
        if (to != g->stage) continue;
        int src = rank_of(g, from, g->replica), found = 0, count = 0;
        MPI_Status status;
        double t0 = dm_now();
        while (!found) {
            WORLD_MPI(MPI_Iprobe(src, TAG_BLOCK + b, MPI_COMM_WORLD, &found, &status));
            if (!found) world_wait_round(t0);
        }
        WORLD_MPI(MPI_Get_count(&status, MPI_BYTE, &count));
        if ((size_t)count < slab_bytes + 64)
            DM_FATAL("migrating block %d: a message of %d bytes is too short", b, count);
        meta_bytes[b] = count - (int)slab_bytes;
        metas[b] = dm_alloc((size_t)meta_bytes[b]);
        block_prepare_receive(&arrived[b], b, &eng->shape);
        block_message_type(&types[ntypes], metas[b], meta_bytes[b], &arrived[b]);
        WORLD_MPI(MPI_Irecv(MPI_BOTTOM, 1, types[ntypes], src, TAG_BLOCK + b, MPI_COMM_WORLD,
                         &reqs[nsend++]));
        ntypes++;
    }
    world_wait_all(nsend, reqs);
    for (int b = 0; b < L; b++) {
        if (!arrived[b].slab) continue;
        char err[256];
        if (block_unpack_meta_begin(&arrived[b], metas[b], (size_t)meta_bytes[b], &eng->shape,
                                    err, sizeof err) ||
            block_unpack_meta_end(&arrived[b], metas[b], (size_t)meta_bytes[b], err, sizeof err))
            DM_FATAL("migrating block %d: %s", b, err);
    }
    for (int i = 0; i < ntypes; i++) WORLD_MPI(MPI_Type_free(&types[i]));
    dm_free(types);
    dm_free(meta_bytes);
    /* Every rank reports the same totals: the bytes of all moved blocks. */
    for (int b = 0; b < L; b++) {
        int from = stage_of_block(eng->layout, S, b), to = stage_of_block(counts, S, b);
        if (from != to) bytes += (double)eng->stats.layer_mem_bytes[b];
    }

    /* Build the new block array: keep the blocks that stay, unpack arrivals. */
    for (int i = 0; i < eng->nslots; i++) {
        world_wait(&eng->slots[i].send_act);
        world_wait(&eng->slots[i].send_exit);
        world_wait(&eng->slots[i].send_grad);
    }
    struct block *blocks = dm_alloc((size_t)(new_count ? new_count : 1) * sizeof(struct block));
    for (int b = new_first; b < new_first + new_count; b++) {
        struct block *dst = &blocks[b - new_first];
        if (b >= m->first_block && b < m->first_block + m->num_blocks) {
            *dst = m->blocks[b - m->first_block];
            m->blocks[b - m->first_block].slab = NULL;   /* ownership moved */
        } else {
            *dst = arrived[b];
        }
    }
    for (int i = 0; i < m->num_blocks; i++)
        if (m->blocks[i].slab) block_free(&m->blocks[i]);
    gpt_replace_blocks(m, blocks, new_first, new_count);
    for (int b = 0; b < L; b++)
        if (metas[b]) dm_free(metas[b]);
    dm_free(reqs);
    dm_free(metas);
    dm_free(arrived);
    memcpy(eng->layout, counts, (size_t)S * sizeof(int));
    dm_free(counts);
    history_push(eng, eng->steps_done);
    for (int i = 0; i < eng->nslots; i++) gpt_acts_resize(&eng->slots[i].acts, &eng->model);

    /* Everyone reports the same totals; the time is this rank's. */
    eng->pending_migrated = moved;
    eng->pending_migrated_bytes = bytes;
    eng->pending_migrate_ms = (dm_now() - t0) * 1e3;
}

/* ---- checkpoints ------------------------------------------------------------ */

void engine_watch_flag(struct engine *eng, volatile int *flag) { eng->watched_flag = flag; }

void engine_save(struct engine *eng, const char *dir, int keep, long steps_done,
                 char *path_out, size_t path_out_size)
{
    const struct pipe_grid *g = &eng->grid;
    int S = g->stages, D = g->replicas, L = eng->shape.layers;
    char config_text[16384];
    config_print(&eng->cfg, config_text, sizeof config_text);
    long *cursor = dm_alloc((size_t)D * sizeof(long));
    for (int r = 0; r < D; r++)
        cursor[r] = steps_done * eng->cfg.batch + (long)r * eng->micro_batches * eng->micro_B;
    struct ckpt_meta meta = {
        .step = steps_done,
        .optimizer_steps = steps_done,
        .lr_schedule_step = steps_done,
        .seed = eng->cfg.seed,
        .config_text = config_text,
        .pp = S,
        .dp = D,
        .data_cursor = cursor,
        .layout = eng->layout,
        .history = eng->history,   /* borrowed: save only reads it */
    };
    int *frozen = dm_alloc((size_t)L * sizeof(int));   /* own blocks' entries only */
    for (int i = 0; i < eng->model.num_blocks; i++)
        frozen[eng->model.first_block + i] = eng->model.blocks[i].frozen != 0;
    meta.frozen = frozen;
    char err[1024];
    if (ckpt_save(dir, keep, &eng->model, &meta, g->stage, g->replica, MPI_COMM_WORLD, path_out,
                  path_out_size, err, sizeof err) != 0)
        dm_user_error("%s", err);
    dm_free(cursor);
    dm_free(frozen);
}

static long resume_from_checkpoint(struct engine *eng);

long engine_resume(struct engine *eng)
{
    long step = resume_from_checkpoint(eng);
    if (eng->weights_pending) {   /* nothing loaded: the fresh start's weights */
        gpt_init_weights(&eng->model, eng->cfg.seed);
        eng->weights_pending = 0;
    }
    return step;
}

/* Loads the checkpoint cfg names, if any (clearing weights_pending), and
 * returns its step; 0 when there is none. */
static long resume_from_checkpoint(struct engine *eng)
{
    const struct dm_config *cfg = &eng->cfg;
    if (!strcmp(cfg->resume, "none")) return 0;
    struct ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    char path[1200];
    if (!strcmp(cfg->resume, "auto")) {
        if (!cfg->ckpt_dir[0]) return 0;
        if (!ckpt_resume_auto(cfg->ckpt_dir, &eng->model, &meta, MPI_COMM_WORLD, path,
                              sizeof path))
            return 0;
    } else {
        snprintf(path, sizeof path, "%s", cfg->resume);
        ckpt_load(path, &eng->model, &meta, MPI_COMM_WORLD);
    }
    eng->weights_pending = 0;
    if (meta.seed != cfg->seed)
        dm_user_error("checkpoint %s was written with train.seed = %llu but this run has %llu: "
                      "resuming would change the data order", path,
                      (unsigned long long)meta.seed, (unsigned long long)cfg->seed);
    if (meta.step > cfg->steps)
        dm_user_error("checkpoint %s is at step %ld, beyond train.steps = %d", path, meta.step,
                      cfg->steps);
    /* The history carries over when it has this world's stage count. */
    layout_history_free(&eng->history);
    layout_history_init(&eng->history, eng->shape.layers);
    for (int k = 0; k < meta.history.count; k++)
        if (meta.history.stages[k] == eng->grid.stages)
            layout_history_push(&eng->history, meta.history.step[k],
                                layout_history_entry(&meta.history, k), eng->grid.stages);
    history_push(eng, meta.step);
    eng->steps_done = meta.step;
    dm_log("resumed from %s at step %ld (written by %d x %d ranks, layout now ", path, meta.step,
           meta.pp, meta.dp);
    char layout[256];
    layout_format(layout, sizeof layout, eng->layout, eng->grid.stages);
    dm_log("%s)\n", layout);
    long step = meta.step;
    ckpt_meta_free(&meta);
    return step;
}
