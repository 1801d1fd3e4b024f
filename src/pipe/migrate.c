/* Live migration (engine_relayout, pipe.h): the blocks that change stage
 * travel with their weights, Adam moments and dynamic state, each as one
 * MPI message (over the devices' transport the slab goes device to
 * device, and MPI carries the header and dynamic state), and every rank
 * rebuilds its block array and activation slots for the new ranges. A
 * block whose slab is larger than one message should carry (MPI counts
 * are ints: 2 GiB, a dense block of C 3,870 with its moments) sends its
 * header alone and then its slab in pieces of at most PIECE_BYTES, in
 * order on one tag.
 * Which blocks move is balance_migration_plan's answer; what a block's
 * message holds is the model's (block_pack_meta and its slab). Must not:
 * choose a layout (the caller hands it one). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "pipe/engine_internal.h"

/* The most bytes of a slab one message carries: 1 GiB, well under the
 * 2 GiB an int count allows, a size MPI libraries move at full speed.
 * DYNMO_TEST_MIGRATE_PIECE_BYTES sets it smaller, so that tests move
 * small blocks in pieces. */
#define PIECE_BYTES ((size_t)1 << 30)

static size_t piece_bytes(void)
{
    static size_t bytes;
    if (!bytes) {
        const char *text = getenv("DYNMO_TEST_MIGRATE_PIECE_BYTES");
        long v = text ? atol(text) : 0;
        bytes = v >= 4 && (size_t)v < PIECE_BYTES ? (size_t)v & ~(size_t)3 : PIECE_BYTES;
    }
    return bytes;
}

/* The requests and datatypes of one migration: a few per block, grown as
 * posted. */
struct posted {
    MPI_Request *reqs;
    MPI_Datatype *types;   /* MPI_DATATYPE_NULL for a piece (plain bytes) */
    int count;
    long capacity;
};

static void posted_add(struct posted *p, MPI_Request req, MPI_Datatype type)
{
    long capacity = p->capacity;   /* the two arrays grow together */
    p->reqs = dm_grow(p->reqs, sizeof *p->reqs, p->count, &capacity, 16);
    p->types = dm_grow(p->types, sizeof *p->types, p->count, &p->capacity, 16);
    p->reqs[p->count] = req;
    p->types[p->count++] = type;
}

/* Whether block blk's slab goes in pieces after its header (both sides
 * decide alike: the slab's size is the model's). */
static int in_pieces(const struct block *blk)
{
    return 3 * blk->nparams * sizeof(float) > piece_bytes();
}

/* Posts the pieces of a large block's slab (params; then m and v, which
 * are adjacent; or its staging's 3 nparams floats) to or from `peer`. */
static void post_pieces(struct posted *p, const struct block *blk, float *staging, int peer,
                        int recv)
{
    size_t n = blk->nparams * sizeof(float);
    char *regions[2] = {staging ? (char *)staging : (char *)blk->params,
                        staging ? (char *)(staging + blk->nparams) : (char *)blk->m};
    size_t sizes[2] = {n, 2 * n};
    for (int r = 0; r < 2; r++)
        for (size_t at = 0; at < sizes[r]; at += piece_bytes()) {
            size_t bytes = sizes[r] - at < piece_bytes() ? sizes[r] - at : piece_bytes();
            MPI_Request req;
            if (recv)
                WORLD_MPI(MPI_Irecv(regions[r] + at, (int)bytes, MPI_BYTE, peer,
                                    TAG_BLOCK_PIECE + blk->index, MPI_COMM_WORLD, &req));
            else
                WORLD_MPI(MPI_Isend(regions[r] + at, (int)bytes, MPI_BYTE, peer,
                                    TAG_BLOCK_PIECE + blk->index, MPI_COMM_WORLD, &req));
            posted_add(p, req, MPI_DATATYPE_NULL);
        }
}

/* The datatype of one migrating block's message: its header and dynamic
 * state (meta, meta_bytes), its parameters and its Adam moments (m and v
 * are adjacent in the slab), addressed absolutely (MPI_BOTTOM). The
 * floats are the slab's own when the host reads the backend's memory,
 * else the block's host staging (params, then m and v). Without blk, the
 * header alone (the slab goes device to device, exchange_slabs). */
static void block_message_type(MPI_Datatype *type, void *meta, int meta_bytes,
                               const struct block *blk, float *staging)
{
    if (!blk || in_pieces(blk)) {   /* the slab goes apart: exchange_slabs, post_pieces */
        MPI_Aint where;
        WORLD_MPI(MPI_Get_address(meta, &where));
        WORLD_MPI(MPI_Type_create_hindexed(1, &meta_bytes, &where, MPI_BYTE, type));
        WORLD_MPI(MPI_Type_commit(type));
        return;
    }
    if ((size_t)meta_bytes + 3 * blk->nparams * sizeof(float) > INT_MAX)
        DM_FATAL("migrating block %d: a header of %d bytes and a slab of %zu in one message",
                 blk->index, meta_bytes, 3 * blk->nparams * sizeof(float));
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
static void post_sends(struct engine *eng, const struct balance_move *moves, int nmoves,
                       struct posted *p, void **metas, float **stagings)
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
    for (int k = 0; k < nmoves; k++) {
        const struct balance_move *mv = &moves[k];
        if (mv->src_stage != g->stage) continue;
        struct block *blk = &m->blocks[mv->block - m->first_block];
        int meta_bytes = (int)block_meta_size(blk), peer = rank_of(g, mv->dst_stage, g->replica);
        metas[mv->block] = dm_alloc((size_t)meta_bytes);
        block_pack_meta(blk, metas[mv->block]);
        stagings[mv->block] = staging;
        if (staging) stage_down(blk, staging);
        MPI_Datatype type;
        MPI_Request req;
        block_message_type(&type, metas[mv->block], meta_bytes, eng->pipe_comm ? NULL : blk,
                           staging);
        WORLD_MPI(MPI_Isend(MPI_BOTTOM, 1, type, peer, TAG_BLOCK + mv->block, MPI_COMM_WORLD,
                            &req));
        posted_add(p, req, type);
        if (!eng->pipe_comm && in_pieces(blk)) post_pieces(p, blk, staging, peer, 0);
        if (staging) staging += staged_floats(blk);
    }
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
    size_t slab_bytes = eng->pipe_comm || in_pieces(&arrived[b])
                            ? 0 : staged_floats(&arrived[b]) * sizeof(float);
    if ((size_t)count < slab_bytes + 64)
        DM_FATAL("migrating block %d: a message of %d bytes is too short", b, count);
    meta_bytes[b] = count - (int)slab_bytes;
    metas[b] = dm_alloc((size_t)meta_bytes[b]);
}

/* The blocks this rank receives, straight into their slabs (into their
 * staging on a device): every arrival probed and prepared first, so that
 * the staging is sized once. */
static void post_receives(struct engine *eng, const struct balance_move *moves, int nmoves,
                          struct posted *p, void **metas, int *meta_bytes,
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
    for (int k = 0; k < nmoves; k++) {
        const struct balance_move *mv = &moves[k];
        if (mv->dst_stage != g->stage) continue;
        int b = mv->block, peer = rank_of(g, mv->src_stage, g->replica);
        stagings[b] = staging;
        MPI_Datatype type;
        MPI_Request req;
        block_message_type(&type, metas[b], meta_bytes[b], eng->pipe_comm ? NULL : &arrived[b],
                           staging);
        WORLD_MPI(MPI_Irecv(MPI_BOTTOM, 1, type, peer, TAG_BLOCK + b, MPI_COMM_WORLD, &req));
        posted_add(p, req, type);
        if (!eng->pipe_comm && in_pieces(&arrived[b])) post_pieces(p, &arrived[b], staging, peer, 1);
        if (staging) staging += staged_floats(&arrived[b]);
    }
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

    struct posted posted = {0};
    void **metas = dm_alloc((size_t)(L + 1) * sizeof(void *));
    int *meta_bytes = dm_alloc((size_t)(L + 1) * sizeof(int));
    struct block *arrived = dm_alloc((size_t)(L + 1) * sizeof(struct block));
    float **stagings = dm_alloc((size_t)(L + 1) * sizeof(float *));
    post_sends(eng, moves, nmoves, &posted, metas, stagings);
    post_receives(eng, moves, nmoves, &posted, metas, meta_bytes, arrived, stagings);
    world_wait_all(posted.count, posted.reqs);
    if (eng->pipe_comm) exchange_slabs(eng, moves, nmoves, arrived);
    unpack_arrivals(eng, arrived, metas, meta_bytes, stagings);
    for (int i = 0; i < posted.count; i++)
        if (posted.types[i] != MPI_DATATYPE_NULL) WORLD_MPI(MPI_Type_free(&posted.types[i]));
    adopt_blocks(eng, counts, arrived);
    engine_parts_run(eng, forget);
    for (int b = 0; b < L; b++)
        if (metas[b]) dm_free(metas[b]);
    memcpy(eng->layout, counts, (size_t)S * sizeof(int));

    /* Every rank reports the plan's totals; the time is this rank's. */
    eng->pending_migrated = nmoves;
    eng->pending_migrated_bytes = (double)bytes;
    eng->pending_migrate_ms = (dm_now() - t0) * 1e3;
    dm_free(posted.reqs);
    dm_free(posted.types);
    dm_free(metas);
    dm_free(meta_bytes);
    dm_free(arrived);
    dm_free(stagings);
    dm_free(moves);
    dm_free(mem);
    dm_free(counts);
}
