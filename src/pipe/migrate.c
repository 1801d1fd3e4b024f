/* Live migration (engine_relayout, pipe.h): the blocks that change stage
 * travel with their weights, Adam moments and dynamic state, each as one
 * MPI message (over the devices' transport the slab goes device to
 * device, and MPI carries the header and dynamic state), and every rank
 * rebuilds its block array and activation slots for the new ranges.
 * Which blocks move is balance_migration_plan's answer; what a block's
 * message holds is the model's (block_pack_meta and its slab). Must not:
 * choose a layout (the caller hands it one). */
#include <limits.h>
#include <string.h>
#include "pipe/engine_internal.h"

/* The datatype of one migrating block's message: its header and dynamic
 * state (meta, meta_bytes), its parameters and its Adam moments (m and v
 * are adjacent in the slab), addressed absolutely (MPI_BOTTOM). The
 * floats are the slab's own when the host reads the backend's memory,
 * else the block's host staging (params, then m and v). Without blk, the
 * header alone (the slab goes device to device, exchange_slabs). */
static void block_message_type(MPI_Datatype *type, void *meta, int meta_bytes,
                               const struct block *blk, float *staging)
{
    if (!blk) {   /* the slab goes over the devices' transport (exchange_slabs) */
        MPI_Aint where;
        WORLD_MPI(MPI_Get_address(meta, &where));
        WORLD_MPI(MPI_Type_create_hindexed(1, &meta_bytes, &where, MPI_BYTE, type));
        WORLD_MPI(MPI_Type_commit(type));
        return;
    }
    /* MPI counts are ints, and the receiver sizes the message in bytes:
     * one block's message must stay under 2 GiB. */
    size_t bytes = (size_t)meta_bytes + 3 * blk->nparams * sizeof(float);
    if (bytes > INT_MAX)
        DM_FATAL("migrating block %d: its message would be %zu bytes, more than one MPI "
                 "message holds (%d); this block is too large to migrate", blk->index, bytes,
                 INT_MAX);
    int lengths[3] = {meta_bytes, (int)(blk->nparams * sizeof(float)),
                      (int)(2 * blk->nparams * sizeof(float))};
    MPI_Aint where[3];
    WORLD_MPI(MPI_Get_address(meta, &where[0]));
    WORLD_MPI(MPI_Get_address(staging ? staging : blk->params, &where[1]));
    WORLD_MPI(MPI_Get_address(staging ? staging + blk->nparams : blk->m, &where[2]));
    WORLD_MPI(MPI_Type_create_hindexed(3, lengths, where, MPI_BYTE, type));
    WORLD_MPI(MPI_Type_commit(type));
}

/* The migrating blocks' slabs go through host staging for MPI where the
 * host cannot read them (a device): params, then m and v, 3 nparams
 * floats a block, carved in plan order from one buffer of the engine's
 * pool per direction, so that migrating allocates nothing after the
 * largest migration so far (pinned allocation is slow on a GPU). NULL on
 * the CPU, where MPI reads the slabs themselves. */
static size_t staged_floats(const struct block *blk)
{
    return 3 * blk->nparams;
}

/* A block's parameters and moments into its staging (a device). */
static void stage_down(const struct block *blk, float *staging)
{
    size_t bytes = blk->nparams * sizeof(float);
    backend_current()->copy_to_host(staging, blk->params, bytes);
    backend_current()->copy_to_host(staging + blk->nparams, blk->m, 2 * bytes);
}

static void stage_up(struct block *blk, const float *staging)
{
    size_t bytes = blk->nparams * sizeof(float);
    backend_current()->copy_to_device(blk->params, staging, bytes);
    backend_current()->copy_to_device(blk->m, staging + blk->nparams, 2 * bytes);
}

/* The blocks this rank sends: each as one message gathered from its
 * header and dynamic state, its parameters and its moments, straight from
 * the slab with no packing copy (from its staging on a device). */
static int post_sends(struct engine *eng, const struct balance_move *moves, int nmoves,
                      MPI_Request *reqs, MPI_Datatype *types, void **metas, float **stagings)
{
    const struct pipe_grid *g = &eng->grid;
    struct gpt *m = &eng->model;
    size_t floats = 0;
    for (int k = 0; k < nmoves; k++)
        if (moves[k].src_stage == g->stage)
            floats += staged_floats(&m->blocks[moves[k].block - m->first_block]);
    float *staging = eng->pipe_comm ? NULL
                                    : staging_pool_host(&eng->staging, STAGING_MIGRATE_SEND,
                                                        floats * sizeof(float));
    int n = 0;
    for (int k = 0; k < nmoves; k++) {
        const struct balance_move *mv = &moves[k];
        if (mv->src_stage != g->stage) continue;
        struct block *blk = &m->blocks[mv->block - m->first_block];
        int meta_bytes = (int)block_meta_size(blk);
        metas[mv->block] = dm_alloc((size_t)meta_bytes);
        block_pack_meta(blk, metas[mv->block]);
        stagings[mv->block] = staging;
        if (staging) stage_down(blk, staging);
        block_message_type(&types[n], metas[mv->block], meta_bytes, eng->pipe_comm ? NULL : blk,
                           staging);
        if (staging) staging += staged_floats(blk);
        WORLD_MPI(MPI_Isend(MPI_BOTTOM, 1, types[n], rank_of(g, mv->dst_stage, g->replica),
                            TAG_BLOCK + mv->block, MPI_COMM_WORLD, &reqs[n]));
        n++;
    }
    return n;
}

/* Block b's message from stage src: its size by a probe (the dynamic
 * state varies), the block's slab allocated (the model's size for its
 * parameters and moments) and its header's buffer. */
static void probe_arrival(struct engine *eng, int b, int src, struct block *arrived, void **metas,
                          int *meta_bytes)
{
    int found = 0, count = 0;
    MPI_Status status;
    double t0 = dm_now();
    while (!found) {
        WORLD_MPI(MPI_Iprobe(src, TAG_BLOCK + b, MPI_COMM_WORLD, &found, &status));
        if (!found) world_wait_round(t0);
    }
    WORLD_MPI(MPI_Get_count(&status, MPI_BYTE, &count));
    block_prepare_receive(&arrived[b], b, &eng->shape);
    size_t slab_bytes = eng->pipe_comm ? 0 : staged_floats(&arrived[b]) * sizeof(float);
    if ((size_t)count < slab_bytes + 64)
        DM_FATAL("migrating block %d: a message of %d bytes is too short", b, count);
    meta_bytes[b] = count - (int)slab_bytes;
    metas[b] = dm_alloc((size_t)meta_bytes[b]);
}

/* The blocks this rank receives, straight into their slabs (into their
 * staging on a device): every arrival probed and prepared first, so that
 * the staging is sized once. */
static int post_receives(struct engine *eng, const struct balance_move *moves, int nmoves,
                         MPI_Request *reqs, MPI_Datatype *types, void **metas, int *meta_bytes,
                         struct block *arrived, float **stagings)
{
    const struct pipe_grid *g = &eng->grid;
    size_t floats = 0;
    for (int k = 0; k < nmoves; k++) {
        if (moves[k].dst_stage != g->stage) continue;
        probe_arrival(eng, moves[k].block, rank_of(g, moves[k].src_stage, g->replica), arrived,
                      metas, meta_bytes);
        floats += staged_floats(&arrived[moves[k].block]);
    }
    float *staging = eng->pipe_comm ? NULL
                                    : staging_pool_host(&eng->staging, STAGING_MIGRATE_RECV,
                                                        floats * sizeof(float));
    int n = 0;
    for (int k = 0; k < nmoves; k++) {
        const struct balance_move *mv = &moves[k];
        if (mv->dst_stage != g->stage) continue;
        int b = mv->block;
        stagings[b] = staging;
        block_message_type(&types[n], metas[b], meta_bytes[b], eng->pipe_comm ? NULL : &arrived[b],
                           staging);
        if (staging) staging += staged_floats(&arrived[b]);
        WORLD_MPI(MPI_Irecv(MPI_BOTTOM, 1, types[n], rank_of(g, mv->src_stage, g->replica),
                            TAG_BLOCK + b, MPI_COMM_WORLD, &reqs[n]));
        n++;
    }
    return n;
}

/* Over the devices' transport (eng->pipe_comm), the moving blocks' slabs
 * go device to device, all in one exchange: each block's parameters, then
 * its moments (m and v are adjacent), in plan order on both sides, into
 * the arrivals' slabs (block_prepare_receive's). */
static void exchange_slabs(struct engine *eng, const struct balance_move *moves, int nmoves,
                           struct block *arrived)
{
    const struct pipe_grid *g = &eng->grid;
    struct gpt *m = &eng->model;
    struct dm_comm_op *ops = dm_alloc((size_t)(2 * nmoves + 1) * sizeof *ops);
    int n = 0;
    for (int k = 0; k < nmoves; k++) {
        const struct balance_move *mv = &moves[k];
        int recv = mv->dst_stage == g->stage;
        if (!recv && mv->src_stage != g->stage) continue;
        struct block *blk = recv ? &arrived[mv->block] : &m->blocks[mv->block - m->first_block];
        int peer = recv ? mv->src_stage : mv->dst_stage;
        ops[n++] = (struct dm_comm_op){blk->params, blk->nparams, peer, recv};
        ops[n++] = (struct dm_comm_op){blk->m, 2 * blk->nparams, peer, recv};
    }
    engine_transport_exchange(eng, eng->pipe_comm, ops, n);
    dm_free(ops);
}

/* The new block array of this rank: the blocks that stay, then the
 * arrivals in place; the old array's leavers are freed. */
static void adopt_blocks(struct engine *eng, const int *counts, struct block *arrived)
{
    struct gpt *m = &eng->model;
    int new_first, new_count;
    first_block_of(counts, eng->grid.stage, &new_first, &new_count);
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
    for (int i = 0; i < eng->nslots; i++) gpt_acts_resize(&eng->slots[i].acts, &eng->model);
}

/* The arrived blocks (all messages complete): their slabs up from the
 * host staging (a device; the pool's, kept), their headers and dynamic
 * state unpacked. */
static void unpack_arrivals(struct engine *eng, struct block *arrived, void **metas,
                            const int *meta_bytes, float **stagings)
{
    char err[256];
    for (int b = 0; b < eng->shape.layers; b++) {
        if (arrived[b].slab && stagings[b]) stage_up(&arrived[b], stagings[b]);
        if (!arrived[b].slab) continue;
        if (block_unpack_meta_begin(&arrived[b], metas[b], (size_t)meta_bytes[b], &eng->shape,
                                    err, sizeof err) ||
            block_unpack_meta_end(&arrived[b], metas[b], (size_t)meta_bytes[b], err, sizeof err))
            DM_FATAL("migrating block %d: %s", b, err);
    }
}

void engine_relayout(struct engine *eng, const int *root_counts)
{
    const struct pipe_grid *g = &eng->grid;
    int S = g->stages, L = eng->shape.layers;
    double t0 = dm_now();
    int *counts = dm_alloc((size_t)S * sizeof(int));
    if (g->rank == 0) memcpy(counts, root_counts, (size_t)S * sizeof(int));
    world_bcast_ints(counts, S);
    char err[256];
    if (balance_check_layout(counts, S, L, err, sizeof err) != BALANCE_OK)
        DM_FATAL("engine_relayout: %s", err);
    if (!memcmp(counts, eng->layout, (size_t)S * sizeof(int))) {
        dm_free(counts);
        return;
    }
    /* The bytes of a block are its slab as the last step measured it
     * (rank 0's profile; the other ranks report nothing). */
    int64_t *mem = dm_alloc((size_t)L * sizeof(int64_t));
    for (int b = 0; b < L; b++) mem[b] = (int64_t)eng->stats.layer_mem_bytes[b];
    struct balance_move *moves = dm_alloc((size_t)(L + 1) * sizeof *moves);
    int nmoves = 0;
    int64_t bytes = 0;
    if (balance_migration_plan(mem, L, 0, eng->layout, S, counts, S, moves, &nmoves, &bytes, err,
                               sizeof err) != BALANCE_OK)
        DM_FATAL("migration plan: %s", err);

    MPI_Request *reqs = dm_alloc((size_t)(L + 1) * sizeof(MPI_Request));
    MPI_Datatype *types = dm_alloc((size_t)(L + 1) * sizeof(MPI_Datatype));
    void **metas = dm_alloc((size_t)(L + 1) * sizeof(void *));
    int *meta_bytes = dm_alloc((size_t)(L + 1) * sizeof(int));
    struct block *arrived = dm_alloc((size_t)(L + 1) * sizeof(struct block));
    float **stagings = dm_alloc((size_t)(L + 1) * sizeof(float *));
    int n = post_sends(eng, moves, nmoves, reqs, types, metas, stagings);
    n += post_receives(eng, moves, nmoves, reqs + n, types + n, metas, meta_bytes, arrived,
                       stagings);
    world_wait_all(n, reqs);
    if (eng->pipe_comm) exchange_slabs(eng, moves, nmoves, arrived);
    unpack_arrivals(eng, arrived, metas, meta_bytes, stagings);
    for (int i = 0; i < n; i++) WORLD_MPI(MPI_Type_free(&types[i]));
    adopt_blocks(eng, counts, arrived);
    engine_expert_parallel_forget(eng);
    for (int b = 0; b < L; b++)
        if (metas[b]) dm_free(metas[b]);
    memcpy(eng->layout, counts, (size_t)S * sizeof(int));

    /* Every rank reports the plan's totals; the time is this rank's. */
    eng->pending_migrated = nmoves;
    eng->pending_migrated_bytes = (double)bytes;
    eng->pending_migrate_ms = (dm_now() - t0) * 1e3;
    dm_free(reqs);
    dm_free(types);
    dm_free(metas);
    dm_free(meta_bytes);
    dm_free(arrived);
    dm_free(stagings);
    dm_free(moves);
    dm_free(mem);
    dm_free(counts);
}
