/* Live migration (engine_relayout, pipe.h): the units of placement that
 * change stage (blocks, or with balance.units = sublayer a block's
 * attention or MLP half) travel with their weights, Adam moments and
 * their block's dynamic state, each as one MPI message (over the devices'
 * transport the floats go device to device, and MPI carries the header
 * and dynamic state), and every rank rebuilds its block array and
 * activation slots for the new ranges. A half that reaches the stage
 * holding its block's other half joins that block (the block is whole
 * there again); a stage that sends one half of a block it holds whole
 * keeps the other. A unit whose floats are larger than one message
 * should carry (MPI counts are ints: 2 GiB, a dense block of C 3,870 with
 * its moments) sends its header alone and then its floats in pieces of at
 * most PIECE_BYTES, in order on one tag.
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

/* What a migration moves: a unit of placement, block `block` whole
 * (balance.units = block) or one half of it (sublayer: unit 2b its
 * attention, 2b + 1 its MLP), and where its floats sit in the block's slab
 * (block_half_range: the same offset into params, m and v). */
struct unit_ref {
    int unit, block, half;
};

static struct unit_ref unit_ref(const struct engine *eng, int unit)
{
    if (!eng->sublayer) return (struct unit_ref){unit, unit, BLOCK_HALVES};
    return (struct unit_ref){unit, unit / 2, unit % 2 ? BLOCK_HALF_MLP : BLOCK_HALF_ATTENTION};
}

/* The unit's floats in its block: params, m and v each at offset. */
static size_t unit_floats(const struct block *blk, int half, size_t *offset)
{
    size_t count;
    block_half_range(blk, half, offset, &count);
    return count;
}

/* Whether the unit's floats go in pieces after its header (both sides
 * decide alike: the slab's size is the model's). */
static int in_pieces(const struct block *blk, int half)
{
    size_t offset;
    return 3 * unit_floats(blk, half, &offset) * sizeof(float) > piece_bytes();
}

/* Posts the pieces of a large unit's floats (params, m, v of its range;
 * or its staging's 3 x its floats) to or from `peer`. */
static void post_pieces(struct posted *p, const struct block *blk, struct unit_ref u,
                        float *staging, int peer, int recv)
{
    size_t offset, count = unit_floats(blk, u.half, &offset), n = count * sizeof(float);
    char *regions[3] = {staging ? (char *)staging : (char *)(blk->params + offset),
                        staging ? (char *)(staging + count) : (char *)(blk->m + offset),
                        staging ? (char *)(staging + 2 * count) : (char *)(blk->v + offset)};
    for (int r = 0; r < 3; r++)
        for (size_t at = 0; at < n; at += piece_bytes()) {
            size_t bytes = n - at < piece_bytes() ? n - at : piece_bytes();
            MPI_Request req;
            if (recv)
                WORLD_MPI(MPI_Irecv(regions[r] + at, (int)bytes, MPI_BYTE, peer,
                                    TAG_BLOCK_PIECE + u.unit, MPI_COMM_WORLD, &req));
            else
                WORLD_MPI(MPI_Isend(regions[r] + at, (int)bytes, MPI_BYTE, peer,
                                    TAG_BLOCK_PIECE + u.unit, MPI_COMM_WORLD, &req));
            posted_add(p, req, MPI_DATATYPE_NULL);
        }
}

/* The datatype of one migrating unit's message: its block's header and
 * dynamic state (meta, meta_bytes), then the unit's parameters and Adam
 * moments (its ranges of params, m and v), addressed absolutely
 * (MPI_BOTTOM). The floats are the slab's own when the host reads the
 * backend's memory, else the unit's host staging (params, then m, then
 * v). Without blk, the header alone (the floats go device to device,
 * exchange_slabs, or in pieces, post_pieces). */
static void unit_message_type(MPI_Datatype *type, void *meta, int meta_bytes,
                              const struct block *blk, struct unit_ref u, float *staging)
{
    if (!blk || in_pieces(blk, u.half)) {
        MPI_Aint where;
        WORLD_MPI(MPI_Get_address(meta, &where));
        WORLD_MPI(MPI_Type_create_hindexed(1, &meta_bytes, &where, MPI_BYTE, type));
        WORLD_MPI(MPI_Type_commit(type));
        return;
    }
    size_t offset, count = unit_floats(blk, u.half, &offset);
    if ((size_t)meta_bytes + 3 * count * sizeof(float) > INT_MAX)
        DM_FATAL("migrating unit %d: a header of %d bytes and %zu floats in one message",
                 u.unit, meta_bytes, 3 * count);
    int bytes = (int)(count * sizeof(float));
    int lengths[4] = {meta_bytes, bytes, bytes, bytes};
    MPI_Aint where[4];
    WORLD_MPI(MPI_Get_address(meta, &where[0]));
    WORLD_MPI(MPI_Get_address(staging ? staging : blk->params + offset, &where[1]));
    WORLD_MPI(MPI_Get_address(staging ? staging + count : blk->m + offset, &where[2]));
    WORLD_MPI(MPI_Get_address(staging ? staging + 2 * count : blk->v + offset, &where[3]));
    WORLD_MPI(MPI_Type_create_hindexed(4, lengths, where, MPI_BYTE, type));
    WORLD_MPI(MPI_Type_commit(type));
}

/* The migrating units' floats go through host staging for MPI where the
 * host cannot read them (a device): params, then m, then v, 3 x the
 * unit's floats, carved in plan order from one buffer of the engine's
 * pool per direction, so that migrating allocates nothing after the
 * largest migration so far (pinned allocation is slow on a GPU). NULL on
 * the CPU, where MPI reads the slabs themselves. */
static size_t staged_floats(const struct block *blk, int half)
{
    size_t offset;
    return 3 * unit_floats(blk, half, &offset);
}

/* A unit's parameters and moments into its staging (a device). */
static void stage_down(const struct block *blk, int half, float *staging)
{
    size_t offset, count = unit_floats(blk, half, &offset), bytes = count * sizeof(float);
    backend_current()->copy_to_host(staging, blk->params + offset, bytes);
    backend_current()->copy_to_host(staging + count, blk->m + offset, bytes);
    backend_current()->copy_to_host(staging + 2 * count, blk->v + offset, bytes);
}

static void stage_up(struct block *blk, int half, const float *staging)
{
    size_t offset, count = unit_floats(blk, half, &offset), bytes = count * sizeof(float);
    backend_current()->copy_to_device(blk->params + offset, staging, bytes);
    backend_current()->copy_to_device(blk->m + offset, staging + count, bytes);
    backend_current()->copy_to_device(blk->v + offset, staging + 2 * count, bytes);
}

/* Whether virtual stage `vstage` (a stage when v = 1) is one of this
 * rank's chunks; if so it becomes the current chunk, whose blocks
 * held_block and arrival_block look at. */
static int take_chunk(struct engine *eng, int vstage)
{
    int S = eng->grid.stages;
    if (vstage % S != eng->grid.stage) return 0;
    engine_use_chunk(eng, vstage / S);
    return 1;
}

/* The rank of virtual stage `vstage` in this replica. */
static int rank_of_vstage(const struct engine *eng, int vstage)
{
    return rank_of(&eng->grid, vstage % eng->grid.stages, eng->grid.replica);
}

/* This rank's block `block` before the migration (in the current
 * chunk), or NULL. */
static struct block *held_block(struct engine *eng, int block)
{
    struct gpt *m = &eng->model;
    int i = block - m->first_block;
    return i >= 0 && i < m->num_blocks ? &m->blocks[i] : NULL;
}

/* The units this rank sends: each as one message gathered from its
 * block's header and dynamic state, its parameters and its moments,
 * straight from the slab with no packing copy (from its staging on a
 * device). */
static void post_sends(struct engine *eng, const struct balance_move *moves, int nmoves,
                       struct posted *p, void **metas, float **stagings)
{
    size_t floats = 0;
    for (int k = 0; k < nmoves; k++)
        if (take_chunk(eng, moves[k].src_stage)) {
            struct unit_ref u = unit_ref(eng, moves[k].block);
            floats += staged_floats(held_block(eng, u.block), u.half);
        }
    float *staging = eng->pipe_comm ? NULL
                                    : staging_pool_host(&eng->staging, STAGING_MIGRATE_SEND,
                                                        floats * sizeof(float));
    for (int k = 0; k < nmoves; k++) {
        const struct balance_move *mv = &moves[k];
        if (!take_chunk(eng, mv->src_stage)) continue;
        struct unit_ref u = unit_ref(eng, mv->block);
        struct block *blk = held_block(eng, u.block);
        int meta_bytes = (int)block_meta_size(blk), peer = rank_of_vstage(eng, mv->dst_stage);
        metas[u.unit] = dm_alloc((size_t)meta_bytes);
        block_pack_meta(blk, metas[u.unit]);
        stagings[u.unit] = staging;
        if (staging) stage_down(blk, u.half, staging);
        MPI_Datatype type;
        MPI_Request req;
        unit_message_type(&type, metas[u.unit], meta_bytes, eng->pipe_comm ? NULL : blk, u,
                          staging);
        WORLD_MPI(MPI_Isend(MPI_BOTTOM, 1, type, peer, TAG_BLOCK + u.unit, MPI_COMM_WORLD,
                            &req));
        posted_add(p, req, type);
        if (!eng->pipe_comm && in_pieces(blk, u.half)) post_pieces(p, blk, u, staging, peer, 0);
        if (staging) staging += staged_floats(blk, u.half);
    }
}

/* Where unit u arrives: into this rank's own block when it holds the
 * block (it receives the half it lacks), else into the block's arrival
 * (arrived[block]), whose slab the first of its units allocates. */
static struct block *arrival_block(struct engine *eng, struct unit_ref u, struct block *arrived)
{
    struct block *held = held_block(eng, u.block);
    if (held) return held;
    if (!arrived[u.block].slab) block_prepare_receive(&arrived[u.block], u.block, &eng->shape);
    return &arrived[u.block];
}

/* The bytes of unit `unit`'s header message from rank src, by a polled
 * probe (the dynamic state varies). */
static int probe_header(int src, int unit)
{
    int found = 0, count = 0;
    MPI_Status status;
    double t0 = dm_now();
    while (!found) {
        WORLD_MPI(MPI_Iprobe(src, TAG_BLOCK + unit, MPI_COMM_WORLD, &found, &status));
        if (!found) world_wait_round(t0);
    }
    WORLD_MPI(MPI_Get_count(&status, MPI_BYTE, &count));
    return count;
}

/* Unit u's message from stage src: its size (probe_header), its block's
 * slab made ready (arrival_block) and its header's buffer. */
static void probe_arrival(struct engine *eng, struct unit_ref u, int src, struct block *arrived,
                          void **metas, int *meta_bytes)
{
    int count = probe_header(src, u.unit);
    struct block *blk = arrival_block(eng, u, arrived);
    size_t slab_bytes = eng->pipe_comm || in_pieces(blk, u.half)
                            ? 0 : staged_floats(blk, u.half) * sizeof(float);
    if ((size_t)count < slab_bytes + 64)
        DM_FATAL("migrating unit %d: a message of %d bytes is too short", u.unit, count);
    meta_bytes[u.unit] = count - (int)slab_bytes;
    metas[u.unit] = dm_alloc((size_t)meta_bytes[u.unit]);
}

/* The units this rank receives, straight into their slabs (into their
 * staging on a device): every arrival probed and prepared first, so that
 * the staging is sized once. */
static void post_receives(struct engine *eng, const struct balance_move *moves, int nmoves,
                          struct posted *p, void **metas, int *meta_bytes,
                          struct block *arrived, float **stagings)
{
    size_t floats = 0;
    for (int k = 0; k < nmoves; k++) {
        if (!take_chunk(eng, moves[k].dst_stage)) continue;
        struct unit_ref u = unit_ref(eng, moves[k].block);
        probe_arrival(eng, u, rank_of_vstage(eng, moves[k].src_stage), arrived, metas,
                      meta_bytes);
        floats += staged_floats(arrival_block(eng, u, arrived), u.half);
    }
    float *staging = eng->pipe_comm ? NULL
                                    : staging_pool_host(&eng->staging, STAGING_MIGRATE_RECV,
                                                        floats * sizeof(float));
    for (int k = 0; k < nmoves; k++) {
        const struct balance_move *mv = &moves[k];
        if (!take_chunk(eng, mv->dst_stage)) continue;
        struct unit_ref u = unit_ref(eng, mv->block);
        struct block *blk = arrival_block(eng, u, arrived);
        int peer = rank_of_vstage(eng, mv->src_stage);
        stagings[u.unit] = staging;
        MPI_Datatype type;
        MPI_Request req;
        unit_message_type(&type, metas[u.unit], meta_bytes[u.unit], eng->pipe_comm ? NULL : blk,
                          u, staging);
        WORLD_MPI(MPI_Irecv(MPI_BOTTOM, 1, type, peer, TAG_BLOCK + u.unit, MPI_COMM_WORLD,
                            &req));
        posted_add(p, req, type);
        if (!eng->pipe_comm && in_pieces(blk, u.half)) post_pieces(p, blk, u, staging, peer, 1);
        if (staging) staging += staged_floats(blk, u.half);
    }
}

/* Over the devices' transport (eng->pipe_comm), the moving units' floats
 * go device to device, all in one exchange: each unit's parameters, then
 * its m, then its v, in plan order on both sides, into the arrivals'
 * slabs (arrival_block). */
static void exchange_slabs(struct engine *eng, const struct balance_move *moves, int nmoves,
                           struct block *arrived)
{
    const struct pipe_grid *g = &eng->grid;
    struct dm_comm_op *ops = dm_alloc((size_t)(3 * nmoves + 1) * sizeof *ops);
    int n = 0;
    for (int k = 0; k < nmoves; k++) {
        const struct balance_move *mv = &moves[k];
        int recv = mv->dst_stage == g->stage;
        if (!recv && mv->src_stage != g->stage) continue;
        struct unit_ref u = unit_ref(eng, mv->block);
        struct block *blk = recv ? arrival_block(eng, u, arrived) : held_block(eng, u.block);
        int peer = recv ? mv->src_stage : mv->dst_stage;
        size_t offset, count = unit_floats(blk, u.half, &offset);
        ops[n++] = (struct dm_comm_op){blk->params + offset, count, peer, recv};
        ops[n++] = (struct dm_comm_op){blk->m + offset, count, peer, recv};
        ops[n++] = (struct dm_comm_op){blk->v + offset, count, peer, recv};
    }
    engine_transport_exchange(eng, eng->pipe_comm, ops, n);
    dm_free(ops);
}

/* The new block array of the current chunk: the blocks it keeps (whole
 * or a half, with any half it received), then the arrivals in place; the
 * old array's blocks it no longer holds any half of are freed. */
static void adopt_chunk_blocks(struct engine *eng, const int *counts, struct block *arrived)
{
    struct gpt *m = &eng->model;
    int per = eng->sublayer ? 2 : 1, first_unit, units;
    first_block_of(counts, eng->chunk * eng->grid.stages + eng->grid.stage, &first_unit, &units);
    int new_first = first_unit / per;
    int new_count = (first_unit + units + per - 1) / per - new_first;
    for (int i = 0; i < eng->nslots; i++) {
        world_wait(&eng->slots[i].send_act);
        world_wait(&eng->slots[i].send_exit);
        world_wait(&eng->slots[i].send_grad);
    }
    struct block *blocks = dm_alloc((size_t)(new_count ? new_count : 1) * sizeof(struct block));
    for (int b = new_first; b < new_first + new_count; b++) {
        struct block *dst = &blocks[b - new_first], *held = held_block(eng, b);
        if (held) {
            *dst = *held;
            held->slab = NULL;   /* ownership moved */
        } else {
            DM_ASSERT(arrived[b].slab);
            *dst = arrived[b];
        }
    }
    for (int i = 0; i < m->num_blocks; i++)
        if (m->blocks[i].slab) block_free(&m->blocks[i]);
    gpt_replace_blocks(m, blocks, new_first, new_count);
    for (int i = 0; i < eng->nslots; i++) gpt_acts_resize(&eng->slots[i].acts, &eng->model);
}

/* Every chunk's new block array (adopt_chunk_blocks). */
static void adopt_blocks(struct engine *eng, const int *counts, struct block *arrived)
{
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        adopt_chunk_blocks(eng, counts, arrived);
    }
    engine_use_chunk(eng, 0);
}

/* The arrived units (all messages complete; meta_bytes set for those
 * this rank received): their floats up from the host staging (a device;
 * the pool's, kept); then the headers and dynamic state. A whole block
 * takes its own. Under sublayer units a block's state is its MLP half's
 * where the two differ (an extension wholly in the MLP, such as MoE,
 * keeps its state where the MLP runs; a pruning mask and the frozen flag
 * are the same on both): a block that arrived takes its MLP's header if
 * that came, else its attention's; an MLP half that joins this rank's
 * own block brings the block its header, an attention half leaves its. */
static void unpack_arrivals(struct engine *eng, struct block *arrived, void **metas,
                            const int *meta_bytes, float **stagings)
{
    char err[256];
    int per = eng->sublayer ? 2 : 1, U = eng->shape.layers * per;
    for (int unit = 0; unit < U; unit++) {
        if (!meta_bytes[unit] || !stagings[unit]) continue;
        struct unit_ref u = unit_ref(eng, unit);
        struct block *held = held_block(eng, u.block);
        stage_up(held ? held : &arrived[u.block], u.half, stagings[unit]);
    }
    for (int unit = 0; unit < U; unit++) {
        struct unit_ref u = unit_ref(eng, unit);
        /* a whole block never arrives where it is held (under interleaved
         * the current chunk need not be the one it arrives in) */
        if (!meta_bytes[unit]) continue;
        struct block *held = per == 2 ? held_block(eng, u.block) : NULL;
        if (per == 2 && u.half == BLOCK_HALF_ATTENTION && (held || meta_bytes[unit + 1]))
            continue;   /* the block's MLP (here, or arriving) gives its header */
        struct block *blk = held ? held : &arrived[u.block];
        if (block_unpack_meta_begin(blk, metas[unit], (size_t)meta_bytes[unit], &eng->shape,
                                    err, sizeof err) ||
            block_unpack_meta_end(blk, metas[unit], (size_t)meta_bytes[unit], err, sizeof err))
            DM_FATAL("migrating unit %d: %s", unit, err);
    }
}

void engine_relayout(struct engine *eng, const int *root_counts)
{
    const struct pipe_grid *g = &eng->grid;
    int S = g->stages * eng->virtual, U = eng->stats.units, L = eng->shape.layers;
    double t0 = dm_now();
    int *counts = dm_alloc((size_t)S * sizeof(int));   /* S: the virtual stages */
    if (g->rank == 0) memcpy(counts, root_counts, (size_t)S * sizeof(int));
    world_bcast_ints(counts, S);
    char err[256];
    if (balance_check_layout(counts, S, U, err, sizeof err) != BALANCE_OK)
        DM_FATAL("engine_relayout: %s", err);
    if (!memcmp(counts, eng->layout, (size_t)S * sizeof(int))) {
        dm_free(counts);
        return;
    }
    /* The bytes of a unit are its slab's as the last step measured them
     * (rank 0's profile; the other ranks report nothing). */
    int64_t *mem = dm_alloc((size_t)U * sizeof(int64_t));
    for (int u = 0; u < U; u++) mem[u] = (int64_t)eng->stats.unit_mem_bytes[u];
    struct balance_move *moves = dm_alloc((size_t)(U + 1) * sizeof *moves);
    int nmoves = 0;
    int64_t bytes = 0;
    if (balance_migration_plan(mem, U, 0, eng->layout, S, counts, S, moves, &nmoves, &bytes, err,
                               sizeof err) != BALANCE_OK)
        DM_FATAL("migration plan: %s", err);

    struct posted posted = {0};
    void **metas = dm_alloc((size_t)(U + 1) * sizeof(void *));
    int *meta_bytes = dm_alloc((size_t)(U + 1) * sizeof(int));
    struct block *arrived = dm_alloc((size_t)(L + 1) * sizeof(struct block));
    float **stagings = dm_alloc((size_t)(U + 1) * sizeof(float *));
    post_sends(eng, moves, nmoves, &posted, metas, stagings);
    post_receives(eng, moves, nmoves, &posted, metas, meta_bytes, arrived, stagings);
    world_wait_all(posted.count, posted.reqs);
    if (eng->pipe_comm) exchange_slabs(eng, moves, nmoves, arrived);
    unpack_arrivals(eng, arrived, metas, meta_bytes, stagings);
    for (int i = 0; i < posted.count; i++)
        if (posted.types[i] != MPI_DATATYPE_NULL) WORLD_MPI(MPI_Type_free(&posted.types[i]));
    adopt_blocks(eng, counts, arrived);
    memcpy(eng->layout, counts, (size_t)S * sizeof(int));
    engine_stage_units(eng, eng->stage_units);
    engine_mark_halves(eng);
    engine_parts_run(eng, forget);
    for (int u = 0; u < U; u++)
        if (metas[u]) dm_free(metas[u]);

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

void engine_gather_split_blocks(struct engine *eng)
{
    if (!eng->sublayer) return;
    struct gpt *m = &eng->model;
    const struct pipe_grid *g = &eng->grid;
    struct block *first = &m->blocks[0], *last = &m->blocks[m->num_blocks - 1];
    int send = first->halves == BLOCK_HALF_MLP, receive = last->halves == BLOCK_HALF_ATTENTION;
    if (!send && !receive) return;
    /* Over MPI in the pieces of a large unit's migration, from and into
     * the slabs (through host staging where the host cannot read them). */
    struct posted posted = {0};
    float *sent = NULL, *received = NULL;
    void *meta = NULL;
    int meta_bytes = 0;
    /* the MLP's header too: the block's state is its MLP's (unpack_arrivals) */
    if (send) {
        struct unit_ref u = {2 * first->index + 1, first->index, BLOCK_HALF_MLP};
        int peer = rank_of(g, g->stage - 1, g->replica);
        sent = staging_pool_host(&eng->staging, STAGING_MIGRATE_SEND,
                                 staged_floats(first, u.half) * sizeof(float));
        if (sent) stage_down(first, u.half, sent);
        post_pieces(&posted, first, u, sent, peer, 0);
        size_t bytes = block_meta_size(first);
        DM_ASSERT(bytes <= INT_MAX);
        meta_bytes = (int)bytes;
        meta = dm_alloc(bytes);
        block_pack_meta(first, meta);
        MPI_Request req;
        WORLD_MPI(MPI_Isend(meta, meta_bytes, MPI_BYTE, peer, TAG_BLOCK + u.unit, MPI_COMM_WORLD,
                            &req));
        posted_add(&posted, req, MPI_DATATYPE_NULL);
    }
    void *header = NULL;
    int header_bytes = 0;
    if (receive) {
        struct unit_ref u = {2 * last->index + 1, last->index, BLOCK_HALF_MLP};
        int peer = rank_of(g, g->stage + 1, g->replica);
        received = staging_pool_host(&eng->staging, STAGING_MIGRATE_RECV,
                                     staged_floats(last, u.half) * sizeof(float));
        post_pieces(&posted, last, u, received, peer, 1);
        header_bytes = probe_header(peer, u.unit);
        header = dm_alloc((size_t)header_bytes);
        MPI_Request req;
        WORLD_MPI(MPI_Irecv(header, header_bytes, MPI_BYTE, peer, TAG_BLOCK + u.unit,
                            MPI_COMM_WORLD, &req));
        posted_add(&posted, req, MPI_DATATYPE_NULL);
    }
    world_wait_all(posted.count, posted.reqs);
    if (received) stage_up(last, BLOCK_HALF_MLP, received);
    if (header) {
        char err[256];
        if (block_unpack_meta_begin(last, header, (size_t)header_bytes, &eng->shape, err,
                                    sizeof err) ||
            block_unpack_meta_end(last, header, (size_t)header_bytes, err, sizeof err))
            DM_FATAL("gathering block %d: %s", last->index, err);
    }
    dm_free(meta);
    dm_free(header);
    dm_free(posted.reqs);
    dm_free(posted.types);
}
