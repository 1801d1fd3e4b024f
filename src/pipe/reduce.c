/* The step's gradient sums (engine_internal.h): the tied embedding
 * gradient between the first and last stage, the data-parallel sum over
 * replicas in replica order, and the global gradient norm in unit order,
 * so that every layout and replica count gives the same bits as one rank.
 * Every wait polls (world_wait). Must not: decide anything about layouts
 * or checkpoints. */
#include <math.h>
#include <string.h>
#include "pipe/engine_internal.h"

/* The halves over the devices' own transport (device_comm.c), device to
 * device: each end sends its half and receives the other's at once. */
static void exchange_tied_on_devices(struct engine *eng)
{
    const struct pipe_grid *g = &eng->grid;
    struct gpt *m = &eng->model;
    size_t n = (size_t)eng->shape.vocab * (size_t)eng->shape.channels;
    int peer = g->stage == 0 ? g->stages - 1 : 0;
    struct dm_comm_op ops[2] = {
        {.buf = g->stage == 0 ? m->dwte : m->dwte_head, .count = n, .peer = peer, .recv = 0},
        {.buf = eng->tied_theirs, .count = n, .peer = peer, .recv = 1},
    };
    engine_transport_exchange(eng, eng->pipe_comm, ops, 2);
    gpt_tie_wte_grads(m, eng->tied_theirs);
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
    engine_use_chunk(eng, g->stage == 0 ? 0 : eng->virtual - 1);   /* the embedding's, the head's */
    if (eng->pipe_comm) {
        exchange_tied_on_devices(eng);
        return;
    }
    long n = (long)eng->shape.vocab * eng->shape.channels;
    size_t bytes = (size_t)n * sizeof(float);
    int peer = rank_of(g, g->stage == 0 ? g->stages - 1 : 0, g->replica);
    /* MPI moves host memory: this half copied down, theirs up (on a
     * backend the host reads, neither), through the engine's pool */
    float *staging = staging_pool_host(&eng->staging, STAGING_TIED, 2 * bytes);
    const float *mine = backend_read(staging, g->stage == 0 ? m->dwte : m->dwte_head, bytes);
    float *theirs = staging ? staging + n : dm_alloc(bytes);
    MPI_Request reqs[2];
    WORLD_MPI(MPI_Irecv(theirs, (int)n, MPI_FLOAT, peer, TAG_TIED, MPI_COMM_WORLD, &reqs[0]));
    WORLD_MPI(MPI_Isend(mine, (int)n, MPI_FLOAT, peer, TAG_TIED, MPI_COMM_WORLD, &reqs[1]));
    eng->wait_s += world_wait_all(2, reqs);
    if (staging) {
        float *device = staging_pool_device(&eng->staging, STAGING_TIED, bytes);
        backend_write_end(device, theirs, bytes);
        gpt_tie_wte_grads(m, device);
    } else {
        gpt_tie_wte_grads(m, theirs);
        dm_free(theirs);
    }
}

/* Sums one float array across the D replicas of this stage, in replica
 * order 0, 1, ..., D-1 on every replica, so the result does not depend on
 * timing or on MPI's reduction algorithm. In pieces of at most
 * REPLICA_SUM_PIECE floats, so that an MPI count (an int) never overflows
 * (the sum is element-wise: the same bits in any pieces). */
#define REPLICA_SUM_PIECE (1L << 28)

static void replica_sum(struct engine *eng, float *x, long n, float *gathered, float *staging)
{
    if (eng->replica_comm) {   /* in place on the device (device_comm.c) */
        double t0 = dm_now();
        backend_current()->comm_all_reduce_sum(eng->replica_comm, x, (size_t)n);
        eng->wait_s += dm_now() - t0;
        return;
    }
    int D = eng->grid.replicas;
    for (long at = 0; at < n; at += REPLICA_SUM_PIECE) {
        long len = n - at < REPLICA_SUM_PIECE ? n - at : REPLICA_SUM_PIECE;
        size_t bytes = (size_t)len * sizeof(float);
        const float *mine = backend_read(staging, x + at, bytes);   /* MPI reads the host's */
        MPI_Request req;
        WORLD_MPI(MPI_Iallgather(mine, (int)len, MPI_FLOAT, gathered, (int)len, MPI_FLOAT,
                                 eng->stage_comm, &req));
        eng->wait_s += world_wait(&req);
        float *sum = backend_write_begin(staging, x + at);
        for (long i = 0; i < len; i++) {
            float s = gathered[i];
            for (int r = 1; r < D; r++) s += gathered[(long)r * len + i];
            sum[i] = s;
        }
        backend_write_end(x + at, sum, bytes);
    }
}


static void reduce_replicas(struct engine *eng)
{
    if (eng->grid.replicas == 1) return;
    struct gpt *m = &eng->model;
    float *gathered = NULL, *staging = NULL;
    if (eng->replica_comm) {
        world_release_turn();   /* the transport polls on its own (replica_sum) */
    } else {
        size_t biggest = m->embed_nparams;
        for (int i = 0; i < m->num_blocks; i++)
            if (m->blocks[i].nparams > biggest) biggest = m->blocks[i].nparams;
        gathered = dm_alloc(biggest * (size_t)eng->grid.replicas * sizeof(float));
        size_t piece = biggest < REPLICA_SUM_PIECE ? biggest : REPLICA_SUM_PIECE;
        staging = staging_pool_host(&eng->staging, STAGING_REPLICA_SUM, piece * sizeof(float));
    }
    double clock = dm_profile_now();
    for (int i = 0; i < m->num_blocks; i++) {
        /* frozen on every replica alike, with zero gradients (struct block) */
        if (m->blocks[i].frozen) continue;
        /* the floats every replica holds (an engine part sums the split parts) */
        replica_sum(eng, m->blocks[i].grads, (long)block_replicated_floats(&m->blocks[i]),
                    gathered, staging);
        gpt_charge_update(m, i, &clock);
    }
    engine_parts_run(eng, reduce);   /* the split parts, by their holders */
    /* The tied wte halves were combined already (exchange_tied_grads). */
    if (m->embed_slab) replica_sum(eng, m->dwte, (long)m->embed_nparams, gathered, staging);
    if (gathered) dm_free(gathered);
}

/* Where each layer's split parts sit among the gradient norm's units:
 * at[l] (L + 1 entries, at[L] all of them), after the L + 3 units. */
static int *shard_places(const struct engine *eng)
{
    int L = eng->shape.layers;
    int *at = dm_alloc((size_t)(L + 1) * sizeof(int));
    for (int l = 0; l < L; l++) at[l + 1] = at[l] + gpt_block_shard_units(&eng->shape, l);
    return at;
}

/* This rank's terms of the gradient norm. units (L + 3 + parts): the
 * embedding, block 0..L-1, the head, the watched flag, then one slot per
 * split part of a block (L + 3 + at[l] + part). Each term has exactly one
 * contributor: replica 0 of a stage its units, the rank of the stage's
 * first group of parallel.ep replicas (replica < ep) that holds a part
 * its slot. */
static void grad_norm_terms(struct engine *eng, double *units, const int *at)
{
    struct gpt *m = &eng->model;
    int L = eng->shape.layers, ep = eng->cfg.ep > 1 ? eng->cfg.ep : 1;
    int first = eng->grid.replica == 0, holder = eng->grid.replica < ep;
    if (first && m->has_embed) units[0] = gpt_embed_grad_sumsq(m);
    double clock = dm_profile_now();
    for (int i = 0; i < m->num_blocks; i++) {
        const struct block *blk = &m->blocks[i];
        int layer = m->first_block + i;
        if (at[layer + 1] == at[layer]) {
            /* Sublayer units: each half summed on its own and the two
             * added, so a block split over two stages (each sending its
             * half's sum, the other terms zero) gives the same bits. */
            if (first && eng->sublayer && !block_is_half(blk))
                units[1 + layer] = block_half_grad_sumsq(blk, BLOCK_HALF_ATTENTION) +
                                   block_half_grad_sumsq(blk, BLOCK_HALF_MLP);
            else if (first) units[1 + layer] = block_grad_sumsq(blk);
        } else if (first || holder) {
            int held = block_held_parts(blk);
            double *parts = dm_alloc((size_t)(held > 0 ? held : 1) * sizeof(double));
            double shared = block_grad_sumsq_parts(blk, parts);
            for (int j = 0; j < held; j++)
                units[L + 3 + at[layer] + block_held_part(blk, j)] = parts[j];
            dm_free(parts);
            if (first) units[1 + layer] = shared;
        }
        if (!blk->frozen && (first || holder)) gpt_charge_update(m, i, &clock);
    }
    if (first && m->has_head) units[L + 1] = gpt_head_grad_sumsq(m);
}

/* The global gradient norm: each unit (embedding, block 0..L-1, head) is
 * summed by its owner in a fixed order, a block's split parts by their
 * holders; the units are combined by a sum where each has exactly one
 * non-zero contributor, a block's part terms added to its unit in part
 * order (block_grad_sumsq_parts), and the units added in unit order on
 * every rank: the same bits as one rank computing everything. */
static double global_grad_norm(struct engine *eng)
{
    int L = eng->shape.layers, *at = shard_places(eng);
    int n = L + 3 + at[L];
    double *units = dm_alloc((size_t)n * sizeof(double));
    double *total = dm_alloc((size_t)n * sizeof(double));
    units[L + 2] = (eng->watched_flag && *eng->watched_flag) ? 1.0 : 0.0;
    for (int c = 0; c < eng->virtual; c++) {   /* each unit in one chunk */
        engine_use_chunk(eng, c);
        grad_norm_terms(eng, units, at);
    }
    engine_use_chunk(eng, 0);
    if (eng->grid.world_size > 1) {
        MPI_Request req;
        WORLD_MPI(MPI_Iallreduce(units, total, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &req));
        eng->wait_s += world_wait(&req);
    } else {
        memcpy(total, units, (size_t)n * sizeof(double));
    }
    for (int l = 0; l < L; l++)
        for (int u = at[l]; u < at[l + 1]; u++) total[1 + l] += total[L + 3 + u];
    eng->stop_requested = total[L + 2] > 0.0;
    int count;
    struct gpt *const *models = engine_chunks_apart(eng, &count);
    dyn_after_reduce(eng->dyn, models, count, eng->current_step, total + 1);
    engine_chunks_rejoin(eng);
    double sum = 0.0;
    for (int u = 0; u < L + 2; u++) sum += total[u];
    dm_free(units);
    dm_free(total);
    dm_free(at);
    return sqrt(sum);
}

/* The blocks' step values (gpt_step_values: an extension's counts)
 * summed over the replicas of this
 * stage, which hold the same blocks, handed to the model (gpt_end_step),
 * the same on every replica. Counts are integers in doubles, so the sum
 * is exact in any order. */
static void reduce_step_values(struct engine *eng)
{
    struct gpt *m = &eng->model;
    int n = gpt_step_values(m, NULL);
    if (n == 0) return;
    double *mine = dm_alloc((size_t)n * sizeof(double));
    double *total = dm_alloc((size_t)n * sizeof(double));
    gpt_step_values(m, mine);
    if (eng->grid.replicas > 1) {
        MPI_Request req;
        WORLD_MPI(MPI_Iallreduce(mine, total, n, MPI_DOUBLE, MPI_SUM, eng->stage_comm, &req));
        eng->wait_s += world_wait(&req);
    } else {
        memcpy(total, mine, (size_t)n * sizeof(double));
    }
    gpt_end_step(m, total);
    dm_free(mine);
    dm_free(total);
}

double engine_reduce_grads(struct engine *eng)
{
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        gpt_mask_pruned_grads(&eng->model);
    }
    exchange_tied_grads(eng);
    for (int c = 0; c < eng->virtual; c++) {   /* every replica in the same chunk order */
        engine_use_chunk(eng, c);
        reduce_replicas(eng);
        reduce_step_values(eng);
    }
    engine_use_chunk(eng, 0);
    return global_grad_norm(eng);
}
