/* The pipeline engine (pipe.h): builds one stage of the pipeline (its
 * blocks, activation slots and instruction list) and executes the list
 * each step, moving activations and gradients between neighbouring stages
 * as non-blocking MPI messages (or device to device over the devices'
 * transport, device_comm.c), then the step's end (reduce.c) and the
 * optimizer; the profile goes to rank 0 (stats.c), blocks move between
 * stages on request (migrate.c).
 *
 * Every wait polls (world_wait): with more ranks than cores, MPICH's
 * blocking waits spin and starve the rank that would let them finish.
 * The engine runs steps and moves blocks; it never decides a layout or a
 * checkpoint: callers hand it a layout, and save or load its model. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "pipe/engine_internal.h"

/* The engine's parts (engine_internal.h), in the order they run. */
const struct engine_part *const engine_parts[] = {&engine_part_ep, NULL};

void engine_after_step(struct engine *eng, int step) { engine_parts_run(eng, decide, step); }

static void slots_alloc(struct engine *eng)
{
    size_t btc = (size_t)eng->micro_B * eng->T * eng->shape.channels;
    eng->slots = dm_alloc((size_t)eng->nslots * sizeof *eng->slots);
    for (int i = 0; i < eng->nslots; i++) {
        struct slot *sl = &eng->slots[i];
        gpt_acts_alloc(&sl->acts, &eng->model, eng->micro_B, eng->T);
        sl->dout = backend_current()->alloc(btc * sizeof(float));
        sl->din = backend_current()->alloc(btc * sizeof(float));
        if (!eng->pipe_comm) {   /* MPI's host staging; the transport needs none */
            sl->act_host = backend_staging(btc * sizeof(float));
            sl->grad_host = backend_staging(btc * sizeof(float));
            sl->recv_host = backend_staging(btc * sizeof(float));
        }
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
        backend_current()->free(sl->dout);
        backend_current()->free(sl->din);
        backend_staging_free(sl->act_host);
        backend_staging_free(sl->grad_host);
        backend_staging_free(sl->recv_host);
        for (int b = 0; b < sl->wgrad_capacity; b++) block_wgrad_free(&sl->wgrads[b]);
        dm_free(sl->wgrads);
    }
    dm_free(eng->slots);
    eng->slots = NULL;
}

void pipe_grid_init(struct pipe_grid *g, int stages, int replicas)
{
    g->stages = stages;
    g->replicas = replicas;
    g->rank = dm_rank();
    g->world_size = dm_world_size();
    if (stages * replicas != g->world_size)
        dm_user_error("parallel.pp x parallel.dp = %d x %d = %d but the job has %d ranks "
                      "(run mpiexec -n %d, or change parallel.pp / parallel.dp)",
                      stages, replicas, stages * replicas, g->world_size, stages * replicas);
    g->stage = g->rank % stages;
    g->replica = g->rank / stages;
}

void engine_mark_halves(struct engine *eng)
{
    if (!eng->sublayer) return;
    struct gpt *m = &eng->model;
    int first_unit, units;
    first_block_of(eng->layout, eng->grid.stage, &first_unit, &units);
    for (int i = 0; i < m->num_blocks; i++) m->blocks[i].halves = BLOCK_HALVES;
    if (first_unit % 2) m->blocks[0].halves = BLOCK_HALF_MLP;
    if ((first_unit + units) % 2) m->blocks[m->num_blocks - 1].halves = BLOCK_HALF_ATTENTION;
}

void engine_use_chunk(struct engine *eng, int c)
{
    if (!eng->chunks || c == eng->chunk) return;
    eng->chunks[eng->chunk] = (struct engine_chunk){eng->model, eng->slots};
    eng->model = eng->chunks[c].model;
    eng->slots = eng->chunks[c].slots;
    eng->chunk = c;
}

struct gpt *const *engine_chunks_apart(struct engine *eng, int *count)
{
    *count = eng->virtual;
    if (!eng->chunks) {
        eng->chunk_models[0] = &eng->model;
        return eng->chunk_models;
    }
    engine_use_chunk(eng, 0);
    eng->chunks[0] = (struct engine_chunk){eng->model, eng->slots};
    for (int c = 0; c < eng->virtual; c++) eng->chunk_models[c] = &eng->chunks[c].model;
    return eng->chunk_models;
}

void engine_chunks_rejoin(struct engine *eng)
{
    if (eng->chunks) eng->model = eng->chunks[0].model;
}

void engine_stage_units(const struct engine *eng, int *counts)
{
    int S = eng->grid.stages;
    for (int s = 0; s < S; s++) {
        counts[s] = 0;
        for (int c = 0; c < eng->virtual; c++) counts[s] += eng->layout[c * S + s];
    }
}

/* Builds chunk c's model (the engine's current one): the blocks of
 * virtual stage c S + stage under eng->layout, with the embedding on
 * virtual stage 0 and the head on the last. */
static void build_chunk_model(struct engine *eng, int c, int defer_weights)
{
    const struct pipe_grid *g = &eng->grid;
    int vstage = c * g->stages + g->stage, last = g->stages * eng->virtual - 1;
    int per = eng->sublayer ? 2 : 1, first_unit, units;
    first_block_of(eng->layout, vstage, &first_unit, &units);
    int first = first_unit / per, count = (first_unit + units + per - 1) / per - first;
    if (defer_weights)
        gpt_build_deferred(&eng->model, &eng->shape, first, count, vstage == 0, vstage == last);
    else
        gpt_build(&eng->model, &eng->shape, first, count, vstage == 0, vstage == last,
                  eng->cfg.seed);
}

/* The stage's instruction list (v chunks under interleaved) and the
 * activation slots a chunk needs at most: the list's peak. */
static void build_instructions(struct engine *eng)
{
    const struct pipe_grid *g = &eng->grid;
    enum dm_schedule kind = config_schedule(&eng->cfg);
    int total = eng->micro_batches * eng->virtual;
    eng->instrs = dm_alloc(SCHEDULE_MAX_INSTRS(total) * sizeof(struct schedule_instr));
    eng->ninstrs = schedule_stage_chunks(eng->instrs, kind, g->stage, g->stages, eng->virtual,
                                         eng->micro_batches);
    eng->nslots = schedule_list_peak(eng->instrs, eng->ninstrs, kind);
}

struct engine *engine_create(const struct dm_config *cfg, const int *layout, int defer_weights)
{
    struct engine *eng = dm_alloc(sizeof *eng);
    eng->cfg = *cfg;
    struct pipe_grid *g = &eng->grid;
    pipe_grid_init(g, cfg->pp, cfg->dp);
    eng->shape = dyn_shape_for_rank(cfg, g->replica);   /* this rank's parts of the blocks */
    eng->micro_batches = cfg->micro_batches;
    eng->micro_B = cfg->batch / (cfg->dp * cfg->micro_batches);
    eng->T = cfg->seq;
    eng->virtual = config_schedule(cfg) == DM_SCHEDULE_INTERLEAVED ? cfg->virtual_stages : 1;
    if (eng->virtual > 1) eng->chunks = dm_alloc((size_t)eng->virtual * sizeof *eng->chunks);
    eng->chunk_models = dm_alloc((size_t)eng->virtual * sizeof *eng->chunk_models);
    size_t layout_bytes = (size_t)g->stages * eng->virtual * sizeof(int);
    eng->layout = dm_alloc(layout_bytes);
    memcpy(eng->layout, layout, layout_bytes);
    eng->stage_units = dm_alloc((size_t)g->stages * sizeof(int));
    engine_stage_units(eng, eng->stage_units);

    /* Units (balance.units): with sublayer the stage's first block may be
     * its MLP half only and its last its attention half only. */
    eng->sublayer = !strcmp(cfg->units, "sublayer");
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        build_chunk_model(eng, c, defer_weights);
    }
    engine_use_chunk(eng, 0);
    engine_mark_halves(eng);
    block_scratch_alloc(&eng->scratch, eng->micro_B, eng->T, eng->shape.channels,
                        eng->shape.heads);
    build_instructions(eng);
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->stage, g->replica, &eng->stage_comm));
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->replica, g->stage, &eng->pipeline_comm));
    engine_device_comm_init(eng);
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        slots_alloc(eng);
    }
    engine_use_chunk(eng, 0);
    struct dyn_env env = {.pipeline_comm = eng->pipeline_comm, .stage = g->stage,
                          .stages = g->stages};
    eng->dyn = dyn_create(cfg, &env);
    engine_parts_run(eng, init);
    engine_stats_alloc(eng);
    return eng;
}

void engine_init_weights(struct engine *eng)
{
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        gpt_init_weights(&eng->model, eng->cfg.seed);
    }
    engine_use_chunk(eng, 0);
}

void engine_destroy(struct engine *eng)
{
    engine_stats_free(eng);
    engine_parts_run(eng, free);
    staging_pool_free(&eng->staging);
    engine_device_comm_free(eng);
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        slots_free(eng);
        gpt_free(&eng->model);
    }
    dm_free(eng->chunks);
    dm_free(eng->chunk_models);
    block_scratch_free(&eng->scratch);
    dyn_destroy(eng->dyn);
    WORLD_MPI(MPI_Comm_free(&eng->stage_comm));
    WORLD_MPI(MPI_Comm_free(&eng->pipeline_comm));
    dm_free(eng->instrs);
    dm_free(eng->layout);
    dm_free(eng->stage_units);
    dm_free(eng);
}

const struct pipe_grid *engine_grid(const struct engine *eng) { return &eng->grid; }
const int *engine_layout(const struct engine *eng)
{
    return eng->chunks ? eng->stage_units : eng->layout;
}
const int *engine_chunk_layout(const struct engine *eng) { return eng->layout; }

struct gpt *engine_chunk_model(struct engine *eng, int c)
{
    DM_ASSERT(c >= 0 && c < eng->virtual);
    engine_use_chunk(eng, c);
    return &eng->model;
}

void engine_chunk_models(struct engine *eng, struct gpt *models)
{
    for (int c = 0; c < eng->virtual; c++) models[c] = *engine_chunk_model(eng, c);
    engine_use_chunk(eng, 0);
}
struct gpt *engine_model(struct engine *eng) { return &eng->model; }
struct dyn *engine_dyn(struct engine *eng) { return eng->dyn; }
void engine_watch_flag(struct engine *eng, volatile int *flag) { eng->watched_flag = flag; }

/* ---- one step ------------------------------------------------------------- */

static struct slot *slot_for(struct engine *eng, int mb)
{
    return &eng->slots[mb % eng->nslots];
}

/* The stage `direction` (-1: previous, +1: next) of this one along the
 * virtual stages: under interleaved the last stage's next is stage 0
 * (its next chunk) and stage 0's previous the last stage. */
static int neighbour_rank(const struct engine *eng, int direction)
{
    const struct pipe_grid *g = &eng->grid;
    return rank_of(g, (g->stage + direction + g->stages) % g->stages, g->replica);
}

/* The tag of mb's message between the current chunk and its neighbour
 * `direction`: base + the chunk of the lower of the two virtual stages
 * x m + mb, so that the v hops between two ranks never share a tag (with
 * one chunk, base + mb). */
static int hop_tag(const struct engine *eng, int base, int mb, int direction)
{
    int chunk = eng->chunk - (direction < 0 && eng->grid.stage == 0);
    return base + chunk * eng->micro_batches + mb;
}

/* Global sample index of micro-batch mb of this replica in step `step`. */
static long first_sample(const struct engine *eng, int step, int mb)
{
    return (long)step * eng->cfg.batch +
           (long)eng->grid.replica * eng->micro_batches * eng->micro_B + (long)mb * eng->micro_B;
}

/* The micro-batch's token ids and targets from the loader, copied to the
 * device (gpt_acts_inputs). */
static void fill_inputs(struct engine *eng, struct loader *loader, long first,
                        struct gpt_acts *acts)
{
    int *tokens, *targets;
    gpt_acts_inputs(acts, &tokens, &targets);
    loader_fill(loader, first, eng->micro_B, tokens, targets);
    gpt_acts_inputs_ready(acts);
}

static void run_forward(struct engine *eng, struct loader *loader, int step, int mb,
                        float *loss_sum)
{
    struct slot *sl = slot_for(eng, mb);
    struct gpt *m = &eng->model;
    DM_ASSERT(sl->busy_mb == -1);
    sl->busy_mb = mb;
    if ((m->has_embed || m->has_head || m->exit) && loader)   /* exit heads need targets */
        fill_inputs(eng, loader, first_sample(eng, step, mb), &sl->acts);
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

/* zb's BWD: the input gradient, each block's (or half's, with
 * balance.units = sublayer) weight-gradient inputs kept in the slot until
 * the micro-batch's WGRAD (run_wgrad). */
static void run_backward_input(struct engine *eng, int mb)
{
    struct slot *sl = slot_for(eng, mb);
    struct gpt *m = &eng->model;
    DM_ASSERT(sl->busy_mb == mb);
    eng->wait_s += world_wait(&sl->send_grad);   /* din is about to change */
    if (sl->wgrad_capacity < m->num_blocks) {
        struct block_wgrad *grown = dm_alloc((size_t)m->num_blocks * sizeof *grown);
        memcpy(grown, sl->wgrads, (size_t)sl->wgrad_capacity * sizeof *grown);
        for (int b = sl->wgrad_capacity; b < m->num_blocks; b++)
            block_wgrad_alloc(&grown[b], eng->micro_B, eng->T, eng->shape.channels);
        dm_free(sl->wgrads);
        sl->wgrads = grown;
        sl->wgrad_capacity = m->num_blocks;
    }
    float scale = 1.0f / (float)(eng->micro_batches * eng->grid.replicas);
    int work = m->has_head || m->first_block + m->num_blocks > m->frozen_prefix;
    if (work) world_compute_begin();
    double t0 = dm_profile_now();
    gpt_backward_input(m, &sl->acts, &eng->scratch, scale, m->has_head ? NULL : sl->dout,
                       m->has_embed ? NULL : sl->din, sl->wgrads);
    eng->compute_s += dm_profile_now() - t0;
}

/* zb's WGRAD: the blocks' weight gradients of mb; frees its slot. */
static void run_wgrad(struct engine *eng, int mb)
{
    struct slot *sl = slot_for(eng, mb);
    struct gpt *m = &eng->model;
    DM_ASSERT(sl->busy_mb == mb);
    if (m->first_block + m->num_blocks > m->frozen_prefix) world_compute_begin();
    double t0 = dm_profile_now();
    gpt_backward_weight(m, &sl->acts, sl->wgrads);
    eng->compute_s += dm_profile_now() - t0;
    sl->busy_mb = -1;
}

/* Receives mb's input activations (and, with early exit, its tokens' exit
 * layers) from the previous stage, once the slot's last sends are out. */
static void receive_activations(struct engine *eng, struct slot *sl, int mb)
{
    const struct pipe_grid *g = &eng->grid;
    int prev = neighbour_rank(eng, -1);
    MPI_Request req;
    eng->wait_s += world_wait(&sl->send_act);
    eng->wait_s += world_wait(&sl->send_exit);
    if (eng->pipe_comm) {
        engine_transport_receive(eng, sl->acts.residual, act_count(eng), g->stage - 1);
    } else {
        float *into = backend_write_begin(sl->recv_host, sl->acts.residual);
        WORLD_MPI(MPI_Irecv(into, (int)act_count(eng), MPI_FLOAT, prev,
                            hop_tag(eng, TAG_ACT, mb, -1), MPI_COMM_WORLD, &req));
        eng->wait_s += world_wait(&req);
        backend_write_end(sl->acts.residual, into, (size_t)act_count(eng) * sizeof(float));
    }
    if (eng->model.exit) {
        WORLD_MPI(MPI_Irecv(gpt_exit_layers(&eng->model, &sl->acts), eng->micro_B * eng->T,
                            MPI_INT, prev, hop_tag(eng, TAG_EXIT, mb, -1), MPI_COMM_WORLD,
                            &req));
        eng->wait_s += world_wait(&req);
    }
}

/* Receives mb's output gradient from the next stage into dout. */
static void receive_gradient(struct engine *eng, struct slot *sl, int mb)
{
    const struct pipe_grid *g = &eng->grid;
    int next = neighbour_rank(eng, 1), n = (int)act_count(eng);
    if (eng->pipe_comm) {
        engine_transport_receive(eng, sl->dout, act_count(eng), g->stage + 1);
        return;
    }
    float *into = backend_write_begin(sl->recv_host, sl->dout);
    MPI_Request req;
    WORLD_MPI(MPI_Irecv(into, n, MPI_FLOAT, next, hop_tag(eng, TAG_GRAD, mb, 1), MPI_COMM_WORLD,
                        &req));
    eng->wait_s += world_wait(&req);
    backend_write_end(sl->dout, into, (size_t)n * sizeof(float));
}

/* Posts mb's output activations (and exit layers) to the next stage;
 * over the transport, paired with the receive that follows when it is
 * from the same stage (pair set: engine_transport_send). */
static void send_activations(struct engine *eng, struct slot *sl, int mb, int pair)
{
    const struct pipe_grid *g = &eng->grid;
    int next = neighbour_rank(eng, 1);
    if (eng->pipe_comm) {
        engine_transport_send(eng, slot_output(eng, sl), act_count(eng), g->stage + 1, pair);
    } else {
        if (sl->act_host) eng->wait_s += world_wait(&sl->send_act);   /* the staging is free */
        const float *from = backend_read(sl->act_host, slot_output(eng, sl),
                                         (size_t)act_count(eng) * sizeof(float));
        WORLD_MPI(MPI_Isend(from, (int)act_count(eng), MPI_FLOAT, next,
                            hop_tag(eng, TAG_ACT, mb, 1), MPI_COMM_WORLD, &sl->send_act));
    }
    if (eng->model.exit)
        WORLD_MPI(MPI_Isend(gpt_exit_layers(&eng->model, &sl->acts), eng->micro_B * eng->T,
                            MPI_INT, next, hop_tag(eng, TAG_EXIT, mb, 1), MPI_COMM_WORLD,
                            &sl->send_exit));
}

/* Posts mb's input gradient (din) to the previous stage. */
static void send_gradient(struct engine *eng, struct slot *sl, int mb, int pair)
{
    size_t n = act_count(eng);
    if (eng->pipe_comm) {
        engine_transport_send(eng, sl->din, n, eng->grid.stage - 1, pair);
        return;
    }
    WORLD_MPI(MPI_Isend(backend_read(sl->grad_host, sl->din, n * sizeof(float)), (int)n,
                        MPI_FLOAT, neighbour_rank(eng, -1), hop_tag(eng, TAG_GRAD, mb, -1),
                        MPI_COMM_WORLD, &sl->send_grad));
}

/* The step's last sends of every chunk, waited for. */
static void wait_sends(struct engine *eng)
{
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        for (int i = 0; i < eng->nslots; i++) {
            eng->wait_s += world_wait(&eng->slots[i].send_act);
            eng->wait_s += world_wait(&eng->slots[i].send_exit);
            eng->wait_s += world_wait(&eng->slots[i].send_grad);
        }
    }
    engine_use_chunk(eng, 0);
}

/* REDUCE_GRADS: the step's gradient sums and norm; its compute (not its
 * waits) counts as the step's end. */
static double reduce_grads(struct engine *eng)
{
    double t0 = dm_profile_now();
    double w0 = eng->wait_s;
    double grad_norm = engine_reduce_grads(eng);
    /* CPU time hardly grows while a wait sleeps; wall time does */
    double waited = dm_profile_is_cpu_time() ? 0.0 : eng->wait_s - w0;
    double spent = (dm_profile_now() - t0) - waited;
    eng->compute_s += spent;
    eng->update_s += spent;
    return grad_norm;
}

/* OPTIMIZER_STEP: clipping by the global norm, AdamW, zeroed gradients;
 * returns the learning rate it used. */
static double optimizer_step(struct engine *eng, int step, double grad_norm)
{
    double t0 = dm_profile_now();
    const struct dm_config *cfg = &eng->cfg;
    float scale = 1.0f;
    if (cfg->grad_clip > 0 && grad_norm > cfg->grad_clip)
        scale = (float)(cfg->grad_clip / (grad_norm + 1e-6));   /* as torch clip_grad_norm_ */
    double lr = lr_at_step(cfg, step);
    world_compute_begin();
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        gpt_adamw_update(&eng->model, lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay,
                         scale, step + 1);
        gpt_zero_grads(&eng->model);
    }
    engine_use_chunk(eng, 0);
    double spent = dm_profile_now() - t0;
    eng->compute_s += spent;
    eng->update_s += spent;
    return lr;
}

/* Whether the send at instruction k goes over the transport together with
 * the receive right after it, from the same stage: the steady state of
 * 1F1B, where this stage sends forward and takes a gradient back while
 * the next stage sends that gradient and takes the activation (each
 * blocking send alone would wait for the other). Any other send goes
 * alone, at once, so that the next stage can start. */
static int pairs_with_next(const struct engine *eng, int k)
{
    if (k + 1 >= eng->ninstrs) return 0;
    enum schedule_op op = eng->instrs[k].op, next = eng->instrs[k + 1].op;
    return (op == SCHEDULE_SEND_ACT && next == SCHEDULE_RECV_GRAD) ||
           (op == SCHEDULE_SEND_GRAD && next == SCHEDULE_RECV_ACT);
}

/* Executes this stage's list for one step; returns the stage's loss sum
 * (last stage) over its micro-batches. */
static float run_schedule(struct engine *eng, struct loader *loader, int step, double *grad_norm,
                          double *lr)
{
    float loss_sum = 0.0f;
    for (int k = 0; k < eng->ninstrs; k++) {
        const struct schedule_instr *in = &eng->instrs[k];
        int mb = in->micro_batch;
        if (mb >= 0) engine_use_chunk(eng, in->chunk);
        struct slot *sl = mb >= 0 ? slot_for(eng, mb) : NULL;
        double trace_wall = eng->tracing ? dm_now() : 0.0;
        double trace_cpu = eng->tracing ? engine_thread_cpu_seconds() : 0.0;
        switch (in->op) {
        case SCHEDULE_RECV_ACT:
            receive_activations(eng, sl, mb);
            break;
        case SCHEDULE_FWD:
            world_compute_begin();
            run_forward(eng, loader, step, mb, &loss_sum);
            break;
        case SCHEDULE_SEND_ACT:
            send_activations(eng, sl, mb, pairs_with_next(eng, k));
            break;
        case SCHEDULE_RECV_GRAD:
            receive_gradient(eng, sl, mb);
            break;
        case SCHEDULE_BWD:
            if (schedule_splits_backward(config_schedule(&eng->cfg))) {
                run_backward_input(eng, mb);   /* the slot lives until WGRAD */
            } else {
                run_backward(eng, mb);
                sl->busy_mb = -1;
            }
            break;
        case SCHEDULE_WGRAD:
            run_wgrad(eng, mb);
            break;
        case SCHEDULE_SEND_GRAD:
            send_gradient(eng, sl, mb, pairs_with_next(eng, k));
            break;
        case SCHEDULE_REDUCE_GRADS:
            *grad_norm = reduce_grads(eng);
            break;
        case SCHEDULE_OPTIMIZER_STEP:
            *lr = optimizer_step(eng, step, *grad_norm);
            break;
        default:
            DM_FATAL("unknown instruction %d", (int)in->op);
        }
        if (eng->tracing) engine_trace_record(eng, in, trace_wall, trace_cpu);
    }
    world_release_turn();
    wait_sends(eng);
    return loss_sum;
}

/* Each chunk's step begins: its blocks' times zeroed, the step's number
 * set (hash attention's rotations), the scheme's and the model's step
 * begun. */
static void begin_chunks(struct engine *eng, int step)
{
    int count;
    struct gpt *const *models = engine_chunks_apart(eng, &count);
    for (int c = 0; c < count; c++) {
        struct gpt *m = models[c];
        m->step = step;
        for (int i = 0; i < m->num_blocks; i++)
            m->block_fwd_s[i] = m->block_bwd_s[i] = m->block_update_s[i] = m->block_wgrad_s[i] =
                m->attention_fwd_s[i] = m->attention_bwd_s[i] = m->attention_wgrad_s[i] = 0.0;
    }
    dyn_before_step(eng->dyn, models, count, step);
    for (int c = 0; c < count; c++)
        gpt_begin_step(models[c]);   /* a validation pass in between counted nothing */
    engine_chunks_rejoin(eng);
}

const struct step_stats *engine_step(struct engine *eng, struct loader *loader, int step)
{
    eng->compute_s = eng->wait_s = eng->update_s = 0.0;
    eng->current_step = step;
    const struct dm_config *cfg = &eng->cfg;
    eng->tracing = cfg->trace_from > 0 && step + 1 >= cfg->trace_from &&
                   step + 1 < cfg->trace_from + cfg->trace_steps;
    eng->trace_count = 0;
    double t0 = dm_now();
    eng->step_t0 = t0;
    begin_chunks(eng, step);
    double grad_norm = 0.0, lr = 0.0;
    float loss_sum = run_schedule(eng, loader, step, &grad_norm, &lr);
    double step_s = dm_now() - t0;
    engine_parts_run(eng, profile);
    engine_gather_stats(eng, loss_sum, step_s);
    struct step_stats *st = &eng->stats;
    st->trace_rows = 0;
    if (eng->tracing) engine_gather_trace(eng, step);
    st->grad_norm = grad_norm;
    st->lr = lr;
    st->stop_requested = eng->stop_requested;
    if (eng->grid.rank == 0) {
        int count;
        struct gpt *const *models = engine_chunks_apart(eng, &count);
        dyn_describe(eng->dyn, models, count, st->dyn_text, sizeof st->dyn_text);
        engine_chunks_rejoin(eng);
    }
    st->migrated_blocks = eng->pending_migrated;
    st->migrated_bytes = eng->pending_migrated_bytes;
    st->migrate_ms = eng->pending_migrate_ms;
    eng->pending_migrated = 0;
    eng->pending_migrated_bytes = eng->pending_migrate_ms = 0.0;
    return st;
}

/* One validation micro-batch through chunk c: received from the previous
 * virtual stage, computed, sent on to the next; returns its loss where
 * the chunk holds the head, else 0. */
static float eval_chunk(struct engine *eng, struct loader *val, long first, int mb, int c)
{
    engine_use_chunk(eng, c);
    int S = eng->grid.stages, vstage = c * S + eng->grid.stage;
    struct slot *sl = &eng->slots[0];
    if (vstage > 0) receive_activations(eng, sl, mb);
    fill_inputs(eng, val, first, &sl->acts);
    float loss = gpt_forward(&eng->model, &sl->acts);
    if (vstage < S * eng->virtual - 1) {
        send_activations(eng, sl, mb, 0);
        world_wait(&sl->send_act);   /* the slot is used again at once */
        world_wait(&sl->send_exit);
    }
    for (int i = 0; i < eng->model.num_blocks; i++)   /* the profile counts training only */
        eng->model.block_fwd_s[i] = eng->model.attention_fwd_s[i] = 0.0;
    return eng->model.has_head ? loss : 0.0f;
}

/* Forward only over the validation samples; the last stages' loss sums are
 * combined on rank 0. */
float engine_eval(struct engine *eng, struct loader *val)
{
    const struct pipe_grid *g = &eng->grid;
    int chunks;
    struct gpt *const *models = engine_chunks_apart(eng, &chunks);
    dyn_before_eval(eng->dyn, models, chunks);   /* the weights after the step's update */
    engine_chunks_rejoin(eng);
    float sum = 0.0f;
    int count = 0;
    for (int b = 0; b < eng->cfg.eval_batches; b++) {
        for (int mb = 0; mb < eng->micro_batches; mb++) {
            for (int c = 0; c < eng->virtual; c++)
                sum += eval_chunk(eng, val, first_sample(eng, b, mb), mb, c);
            count++;
        }
    }
    engine_use_chunk(eng, 0);
    /* Sum over the last stages of all replicas onto rank 0. */
    double mine = (g->stage == g->stages - 1) ? (double)sum : 0.0, total = 0.0;
    MPI_Request req;
    WORLD_MPI(MPI_Ireduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD, &req));
    world_wait(&req);
    return (float)(total / ((double)count * g->replicas));
}
