/* Expert parallelism (parallel.ep = P > 1, docs/moe.md): the experts phase
 * of this stage's MoE blocks, run over the P ranks of the stage's expert
 * group (replicas q P .. q P + P - 1 of the stage). Expert e belongs to
 * group rank e / (E / P) (with moe.placement, the rank the block's order
 * names: position i of the order is rank i / (E / P)'s), and only that
 * rank holds it: its parameters,
 * gradients and Adam moments (the block's slab holds the shared tensors,
 * the router and the owned experts; the scheme splits its shape for the
 * rank, moe_shape_shard through dyn_shape_for_rank). The
 * model hands over each micro-batch's rows grouped by expert
 * (moe_exchange); this file sends every owner its experts' rows
 * (MPI_Ialltoallv), runs the owned experts over each source's rows
 * separately, sends the outputs back, and in the backward does the same
 * for the output gradients, returning the input gradients. The owner keeps
 * the expert gradients of each source's rows apart, accumulated over the
 * micro-batches as the source would have (moe.c's local phase), and at the
 * step's end sums them over every replica that holds the expert, in
 * replica order (its reduce hook): the same bits as
 * parallel.ep = 1. Every wait polls (world_wait).
 *
 * On a device whose memory the host cannot read (backend_current()'s
 * host_access is 0: CUDA, the strict emulated device) the rows, the
 * experts' products and the gradient sums stay in the backend's memory
 * and its ops run the experts and add the sums (residual_forward, in the
 * same order, so the same bits). When every rank has a device of its own
 * the rows and the holders' sums go device to device over the devices'
 * transport (device_comm.c; NCCL on CUDA); otherwise only what MPI reads
 * and writes crosses, through the engine's staging pool (copied down
 * before a send, up after a receive). The counts are host ints, on MPI.
 * On the CPU nothing is staged and MPI is handed the tensors themselves.
 *
 * With moe.placement = balanced (or random, a test aid) the experts move
 * between the ranks of a group at the balancing decisions
 * (ep_decide_placement, the part's decide): stage replica 0 asks src/balance for the
 * placement of each of its MoE blocks from the loads the steps since the
 * last decision routed, and the stage's ranks exchange the experts that
 * change rank (weights and Adam moments). The rows then go to the rank
 * the order names; each expert still sees each source's rows apart, so
 * the bits do not change.
 *
 * With moe.replicas_max = R > 0 the decision also places up to R copies of
 * hot experts on other ranks of the group (src/balance/replicate.c): a
 * copy serves the rows of some sources in place of the expert's rank.
 * Every rank of the group has E/P + R slots, its owned experts then the
 * copies it holds, and a source sends each expert's rows to the one slot
 * that serves it. A copy's holder keeps each source's gradients apart as
 * the owner would and sends them to the owner before the replica sum,
 * where they take the place that source's rows would have filled; the
 * owner alone keeps the Adam moments and sends the updated weights to the
 * copies before the next forward. The same bits, again.
 *
 * Must not: sum anything in an order that depends on timing. */
#include <limits.h>
#include <math.h>
#include <string.h>
#include "dynmo/moe.h"
#include "pipe/engine_internal.h"

/* The expert moves whose (bytes, ms) price the next ones (the oldest
 * overwritten). */
#define EXPERT_MOVES_KEPT 8

/* What the owner keeps of one micro-batch's block between its forward and
 * its backward, found again by the model's key (x, h, a in the backend's
 * memory; counts on the host). */
struct ep_entry {
    const void *key;
    int layer;
    int *counts;          /* (P, E/P) rows received per source and owned expert */
    size_t room;          /* rows x, h, a have room for */
    float *x, *h, *a;     /* (rows, C), (rows, H), (rows, H) */
};

/* The expert gradients an owner keeps of one block over a step: per
 * source rank of the group and owned expert, the sum over the source's
 * micro-batches. The owner's own source sums in the slab's gradients
 * (zero until then, and where the step's total goes); the others here. */
struct ep_grads {
    int layer;
    float *sum;           /* (P - 1, E/P, expert_params): sources but this rank, in order
                             (the backend's memory) */
};

/* One MoE block's copies of experts in this rank's group (moe.replicas_max):
 * the same table on every rank of the group. */
struct ep_copies {
    int layer;
    int n;                       /* copies in use, copy[0 .. n) */
    struct balance_copy *copy;   /* (replicas_max) */
    float *weights;              /* (replicas_max, expert_params) this rank's copies', in
                                    copy order */
    float *grads;                /* (replicas_max, P, expert_params) their sums per source */
    int fresh;                   /* weights are their owners' as of the last update */
};

struct ep_state {
    struct moe_exchange exchange;
    struct engine *eng;
    MPI_Comm comm;        /* the stage's expert group, by group rank */
    MPI_Comm holders;     /* the stage's replicas of this group rank, by group */
    /* the same groups over the devices' transport (device_comm.c), or NULL */
    struct dm_backend_comm *comm_dev, *holders_dev;
    struct dm_comm_op *ops;   /* (2 max(P, groups) + 2) */
    int P, rank, groups, group;   /* group: this rank's expert group */
    size_t tokens;        /* a micro-batch's tokens, B T */
    size_t grouped;       /* the most grouped rows a micro-batch's block has, k B T */
    double *wait_s;
    struct ep_entry *entries;
    int nentries;
    struct ep_grads *grads;
    int ngrads;
    struct staging_pool *staging;   /* the engine's: what MPI sends and receives on a device */
    /* scratch in the backend's memory, grow-only */
    float *rows_out, *dh, *dx_out, *grads_out, *gathered, *total;
    size_t rows_out_n, dh_n, dx_out_n, grads_out_n, gathered_n, total_n;
    int *send_counts, *send_displs, *recv_counts, *recv_displs, *expert_counts;
    int *position_offset; /* (E + 1) the grouped rows' offsets by position of the order */
    float *by_position, *by_position_back;   /* rows regrouped by position (placement) */
    size_t by_position_n, by_position_back_n;
    /* moe.placement: the loads routed since the last decision (layer L's
     * experts at L E), the steps they cover, the expert moves so far */
    int placement;        /* PLACEMENT_* */
    int copies_max;       /* moe.replicas_max */
    int stride;           /* slots of a group rank: its E/P experts, then copies_max */
    int *pos_expert;      /* (P stride) the expert whose rows this rank sends to each
                             slot of the group, -1 none */
    struct ep_copies *copies;
    long ncopies, copies_room;
    double *loads;
    int load_steps;
    double moved_bytes[EXPERT_MOVES_KEPT], moved_ms[EXPERT_MOVES_KEPT];
    int moves_kept;
};

enum { PLACEMENT_STATIC, PLACEMENT_BALANCED, PLACEMENT_RANDOM };

/* The exchange's tensors: host memory from dm_alloc on a backend the host
 * reads (the CPU: uninitialised unless zero is set, as before), else the
 * backend's (zero-filled). */
static float *tensor_alloc(size_t floats, int zero)
{
    const struct dm_backend *ops = backend_current();
    size_t bytes = floats * sizeof(float);
    if (!ops->host_access) return ops->alloc(bytes);
    return zero ? dm_alloc(bytes) : dm_alloc_uninit(bytes);
}

static void tensor_free(void *p)
{
    const struct dm_backend *ops = backend_current();
    if (!p) return;
    if (ops->host_access) dm_free(p);
    else ops->free(p);
}

static void tensor_zero(float *p, size_t floats)
{
    const struct dm_backend *ops = backend_current();
    if (ops->host_access) memset(p, 0, floats * sizeof(float));
    else ops->zero(p, floats * sizeof(float));
}

/* to += from, n floats, element by element (the same bits on the host and
 * through the table's residual_forward). */
static void tensor_add(float *to, const float *from, size_t n)
{
    const struct dm_backend *ops = backend_current();
    if (!ops->host_access) {
        ops->residual_forward(to, to, from, (long)n);
        return;
    }
    for (size_t i = 0; i < n; i++) to[i] += from[i];
}

static float *grow(float **buf, size_t *have, size_t need)
{
    if (need > *have) {
        tensor_free(*buf);
        *buf = tensor_alloc(need, 0);
        *have = need;
    }
    return *buf;
}

/* An MPI count: the caller's sizes are size_t; MPI's are int. */
static int mpi_count(size_t n, const char *what)
{
    if (n > INT_MAX)
        DM_FATAL("expert parallelism: %s is %zu elements, more than one MPI message holds "
                 "(%d); use a smaller micro-batch or more expert-parallel ranks", what, n, INT_MAX);
    return (int)n;
}

static float *grads_for(struct ep_state *xp, const struct block *blk)
{
    size_t n = (size_t)(xp->P - 1) * moe_owned_experts(&block_moe_of(blk)->cfg) * block_moe_of(blk)->expert_params;
    for (int i = 0; i < xp->ngrads; i++)
        if (xp->grads[i].layer == blk->index) return xp->grads[i].sum;
    struct ep_grads *grown = dm_alloc((size_t)(xp->ngrads + 1) * sizeof *grown);
    if (xp->ngrads) memcpy(grown, xp->grads, (size_t)xp->ngrads * sizeof *grown);
    dm_free(xp->grads);
    xp->grads = grown;
    xp->grads[xp->ngrads].layer = blk->index;
    xp->grads[xp->ngrads].sum = tensor_alloc(n, 1);   /* zero */
    return xp->grads[xp->ngrads++].sum;
}

static struct ep_entry *entry_for(struct ep_state *xp, const void *key, int layer,
                                  int create)
{
    for (int i = 0; i < xp->nentries; i++)
        if (xp->entries[i].key == key && xp->entries[i].layer == layer) return &xp->entries[i];
    if (!create) DM_FATAL("expert parallelism: no forward kept for block %d", layer);
    struct ep_entry *grown = dm_alloc((size_t)(xp->nentries + 1) * sizeof *grown);
    if (xp->nentries) memcpy(grown, xp->entries, (size_t)xp->nentries * sizeof *grown);
    dm_free(xp->entries);
    xp->entries = grown;
    struct ep_entry *en = &xp->entries[xp->nentries++];
    en->key = key;
    en->layer = layer;
    return en;
}

/* blk's copies (created empty), or with create 0 NULL when it has none. */
static struct ep_copies *copies_for(struct ep_state *xp, const struct block *blk, int create)
{
    for (long i = 0; i < xp->ncopies; i++)
        if (xp->copies[i].layer == blk->index) return &xp->copies[i];
    if (!create) return NULL;
    xp->copies = dm_grow(xp->copies, sizeof *xp->copies, xp->ncopies, &xp->copies_room, 4);
    struct ep_copies *cp = &xp->copies[xp->ncopies++];
    size_t Pe = block_moe_of(blk)->expert_params, R = (size_t)xp->copies_max;
    cp->layer = blk->index;
    cp->copy = dm_alloc(R * sizeof *cp->copy);
    cp->weights = tensor_alloc(R * Pe, 1);
    cp->grads = tensor_alloc(R * (size_t)xp->P * Pe, 1);
    return cp;
}

static void copies_free(struct ep_state *xp)
{
    for (long i = 0; i < xp->ncopies; i++) {
        dm_free(xp->copies[i].copy);
        tensor_free(xp->copies[i].weights);
        tensor_free(xp->copies[i].grads);
    }
    dm_free(xp->copies);
    xp->copies = NULL;
    xp->ncopies = xp->copies_room = 0;
}

/* The position of expert e in moe's order (its rank: / (E / P)). */
static int position_of(const struct block_moe *moe, int e)
{
    int i = 0;
    while (moe->order[i] != e) i++;
    return i;
}

/* Copy c's slot among the copies its holder holds: per + the copies
 * before it with the same holder. */
static int copy_slot(const struct ep_copies *cp, int c, int per)
{
    int k = 0;
    for (int b = 0; b < c; b++) k += cp->copy[b].holder == cp->copy[c].holder;
    return per + k;
}

/* Where this rank's rows of each expert go, by slot of the group (rank p's
 * slot j at p stride + j) into xp->pos_expert: the expert's own slot, or
 * the slot of the copy that serves this rank. Returns whether that is the
 * order's positions as they are (no copies, stride E/P, identity order). */
static int destinations(struct ep_state *xp, const struct block_moe *moe,
                        const struct ep_copies *cp)
{
    int E = moe->cfg.experts, P = xp->P, per = E / P, S = xp->stride, plain = S == per;
    for (int i = 0; i < P * S; i++) xp->pos_expert[i] = -1;
    for (int i = 0; i < E; i++) {
        xp->pos_expert[(i / per) * S + i % per] = moe->order[i];
        plain &= moe->order[i] == i;
    }
    for (int c = 0; cp && c < cp->n; c++) {
        const struct balance_copy *k = &cp->copy[c];
        if (!(k->sources >> xp->rank & 1)) continue;
        int i = position_of(moe, k->item);
        xp->pos_expert[(i / per) * S + i % per] = -1;
        xp->pos_expert[k->holder * S + copy_slot(cp, c, per)] = k->item;
        plain = 0;
    }
    return plain;
}

/* The all-to-all's counts and displacements, in floats: this rank's
 * grouped rows by owner (send_counts, send_displs) and the owned experts'
 * rows by source (recv_counts, recv_displs). Returns the floats of the
 * latter; the former's are offset[E] width. */
static size_t exchange_counts(struct ep_state *xp, const int *offset,
                              const struct ep_entry *en, int per, int width)
{
    size_t at = 0;
    for (int p = 0; p < xp->P; p++) {
        size_t rows = (size_t)(offset[(p + 1) * per] - offset[p * per]), from = 0;
        for (int j = 0; j < per; j++) from += (size_t)en->counts[p * per + j];
        xp->send_counts[p] = mpi_count(rows * width, "a rank's rows");
        xp->send_displs[p] = mpi_count((size_t)offset[p * per] * width, "a rank's rows");
        xp->recv_counts[p] = mpi_count(from * width, "a rank's rows");
        xp->recv_displs[p] = mpi_count(at, "the rows received");
        at += from * width;
    }
    return at;
}

/* The all-to-all over the devices' transport: to each other rank p of the
 * group, counts[p] floats of send from displs[p], and from it rcounts[p]
 * into recv at rdispls[p], all at once; this rank's own part copied on
 * the device. */
static void exchange_on_devices(struct ep_state *xp, const float *send, const int *counts,
                                const int *displs, float *recv, const int *rcounts,
                                const int *rdispls)
{
    int n = 0, me = xp->rank;
    for (int p = 0; p < xp->P; p++) {
        if (p == me) continue;
        xp->ops[n++] = (struct dm_comm_op){(float *)send + displs[p], (size_t)counts[p], p, 0};
        xp->ops[n++] = (struct dm_comm_op){recv + rdispls[p], (size_t)rcounts[p], p, 1};
    }
    engine_transport_exchange(xp->eng, xp->comm_dev, xp->ops, n);
    DM_ASSERT(counts[me] == rcounts[me]);
    if (counts[me] > 0)
        backend_current()->copy_on_device(recv + rdispls[me], send + displs[me],
                                          (size_t)counts[me] * sizeof(float));
}

/* Sends each owner p the rows of its experts (offset[p E/P] .. offset[(p
 * + 1) E/P]) of send, width floats a row, into recv (ordered by source,
 * then expert); with back set, the reverse: counts per source come from
 * en and rows return to their sources' grouped order. send and recv are
 * the backend's: on a device, staged through the pool. */
static void exchange_rows(struct ep_state *xp, const int *offset, const struct ep_entry *en,
                          int per, const float *send, float *recv, int width, int back)
{
    int *mine = xp->send_counts, *mine_d = xp->send_displs;
    int *theirs = xp->recv_counts, *theirs_d = xp->recv_displs;
    size_t owned = exchange_counts(xp, offset, en, per, width);
    if (xp->comm_dev) {
        if (back) exchange_on_devices(xp, send, theirs, theirs_d, recv, mine, mine_d);
        else exchange_on_devices(xp, send, mine, mine_d, recv, theirs, theirs_d);
        return;
    }
    size_t grouped = (size_t)offset[xp->P * per] * width;
    size_t sent = (back ? owned : grouped) * sizeof(float);
    size_t received = (back ? grouped : owned) * sizeof(float);
    /* staging for the most either side can hold (the entry's room, the
     * model's k N grouped rows), so that it is sized once */
    size_t most = en->room > xp->grouped ? en->room : xp->grouped;
    size_t stage = most * (size_t)width * sizeof(float);
    if (stage < sent) stage = sent;
    if (stage < received) stage = received;
    const float *send_h = backend_read(staging_pool_host(xp->staging, STAGING_PART_SEND, stage),
                                       send, sent);
    float *recv_h = backend_write_begin(
        staging_pool_host(xp->staging, STAGING_PART_RECV, stage), recv);
    MPI_Request req;
    if (!back)
        WORLD_MPI(MPI_Ialltoallv(send_h, mine, mine_d, MPI_FLOAT, recv_h, theirs, theirs_d,
                                 MPI_FLOAT, xp->comm, &req));
    else
        WORLD_MPI(MPI_Ialltoallv(send_h, theirs, theirs_d, MPI_FLOAT, recv_h, mine, mine_d,
                                 MPI_FLOAT, xp->comm, &req));
    *xp->wait_s += world_wait(&req);
    backend_write_end(recv, recv_h, received);
}

/* The rows an owner makes room for when rows arrive for an entry: on a
 * device with a capacity, the most that can arrive (each of P sources
 * sends at most capacity rows per owned expert, and min(k, E/P) rows per
 * token), so that the buffers are sized in the first step and later
 * steps allocate nothing (device allocation is slow); dropless (the most
 * is P times the mean) and on the CPU, what arrived, grown when a step
 * brings more. */
static size_t rows_room(const struct ep_state *xp, const struct block *blk, size_t rows)
{
    const struct moe_params *cfg = &block_moe_of(blk)->cfg;
    int P = xp->P, per = cfg->experts / P, k = cfg->top_k;
    double factor = (double)cfg->capacity_factor;
    if (!(factor > 0.0) || backend_current()->host_access) return rows + 1;
    size_t capacity = (size_t)ceil((double)k * (double)xp->tokens * factor / cfg->experts);
    size_t most = (size_t)P * (size_t)per * capacity;
    size_t by_tokens = (size_t)P * xp->tokens * (size_t)(k < per ? k : per);
    if (by_tokens < most) most = by_tokens;
    return (rows > most ? rows : most) + 1;
}

static int total_rows(const struct ep_entry *en, int P, int per)
{
    int n = 0;
    for (int i = 0; i < P * per; i++) n += en->counts[i];
    return n;
}

/* The grouped rows' offsets by slot of the group (xp->pos_expert's
 * experts; an empty slot has none) into xp->position_offset; the rows
 * themselves, width floats each, copied into that grouping unless it is
 * the grouping by expert (then offset and rows as they are). Returns the
 * rows to send. */
static const float *rows_by_position(struct ep_state *xp, const struct block_moe *moe,
                                     const struct ep_copies *cp, const int *offset,
                                     const float *rows, int width, const int **position_offset)
{
    int slots = xp->P * xp->stride, *at = xp->position_offset;
    if (destinations(xp, moe, cp)) {
        *position_offset = offset;
        return rows;
    }
    at[0] = 0;
    for (int i = 0; i < slots; i++) {
        int e = xp->pos_expert[i];
        at[i + 1] = at[i] + (e < 0 ? 0 : offset[e + 1] - offset[e]);
    }
    *position_offset = at;
    float *out = grow(&xp->by_position, &xp->by_position_n, (size_t)at[slots] * width + 1);
    for (int i = 0; i < slots; i++) {
        int e = xp->pos_expert[i];
        if (e >= 0)
            memcpy(out + (size_t)at[i] * width, rows + (size_t)offset[e] * width,
                   (size_t)(offset[e + 1] - offset[e]) * width * sizeof(float));
    }
    return out;
}

/* Where the rows coming back land: by slot in scratch when rows_by_position
 * regrouped them (at is not offset; rows_by_expert then puts them into
 * out), else out. */
static float *landing_by_position(struct ep_state *xp, const struct block_moe *moe,
                                  const int *offset, const int *at, float *out, int width)
{
    if (at == offset) return out;
    return grow(&xp->by_position_back, &xp->by_position_back_n,
                (size_t)offset[moe->cfg.experts] * width + 1);
}

static void rows_by_expert(const struct ep_state *xp, const int *offset, const float *landed,
                           float *out, int width)
{
    if (landed == out) return;
    const int *at = xp->position_offset;
    for (int i = 0; i < xp->P * xp->stride; i++) {
        int e = xp->pos_expert[i];
        if (e >= 0)
            memcpy(out + (size_t)offset[e] * width, landed + (size_t)at[i] * width,
                   (size_t)(offset[e + 1] - offset[e]) * width * sizeof(float));
    }
}

/* The parameters slot j of this rank serves with: an owned expert's in
 * the slab, or a copy's. */
static const float *slot_weights(const struct ep_state *xp, const struct block *blk,
                                 const struct ep_copies *cp, int j)
{
    const struct block_moe *moe = block_moe_of(blk);
    int per = moe->cfg.experts / xp->P;
    if (j < per) return moe->experts_p + (size_t)j * moe->expert_params;
    DM_ASSERT(cp && cp->fresh);
    return cp->weights + (size_t)(j - per) * moe->expert_params;
}

enum { WALK_SEND, WALK_RECEIVE };

/* The items of the copies' exchange between this rank and peer p in one
 * direction (dir: what this rank sends p, or receives from it), in copy
 * order, then source order: their floats; with buf, each item also copied
 * into buf (sending) or out of it into its place (receiving). Out (back
 * 0): each copy's weights, from its owner's slab to its holder's copy;
 * back: each source's gradient sums, from the holder to the owner's sums,
 * in the place that source's rows would have filled there. */
static size_t copies_walk(struct ep_state *xp, struct block *blk, const struct ep_copies *cp,
                          int back, int p, int dir, float *buf)
{
    struct block_moe *moe = block_moe_of(blk);
    int P = xp->P, per = moe->cfg.experts / P, me = xp->rank;
    size_t Pe = moe->expert_params, n = 0;
    float *sum = back && dir == WALK_RECEIVE ? grads_for(xp, blk) : NULL;
    for (int c = 0; c < cp->n; c++) {
        const struct balance_copy *k = &cp->copy[c];
        int at = position_of(moe, k->item), owner = at / per;
        int from = back ? k->holder : owner, to = back ? owner : k->holder;
        if (dir == WALK_SEND ? from != me || to != p : from != p || to != me) continue;
        int slot = copy_slot(cp, c, per) - per;
        for (int s = 0; s < P; s++) {
            if (back ? !(k->sources >> s & 1) : s > 0) continue;
            if (buf && dir == WALK_SEND)
                memcpy(buf + n,
                       back ? cp->grads + ((size_t)slot * P + s) * Pe
                            : moe->experts_p + (size_t)(at % per) * Pe,
                       Pe * sizeof(float));
            else if (buf)
                memcpy(back ? sum + ((size_t)(s - (s > me)) * per + at % per) * Pe
                            : cp->weights + (size_t)slot * Pe,
                       buf + n, Pe * sizeof(float));
            n += Pe;
        }
    }
    return n;
}

/* copies_walk's items of every peer, by one all-to-all over the group. */
static void copies_exchange(struct ep_state *xp, struct block *blk, struct ep_copies *cp,
                            int back)
{
    int P = xp->P;
    size_t sent = 0, received = 0;
    for (int p = 0; p < P; p++) {
        size_t out = copies_walk(xp, blk, cp, back, p, WALK_SEND, NULL);
        size_t in = copies_walk(xp, blk, cp, back, p, WALK_RECEIVE, NULL);
        xp->send_counts[p] = mpi_count(out, "the copies' exchange");
        xp->send_displs[p] = mpi_count(sent, "the copies' exchange");
        xp->recv_counts[p] = mpi_count(in, "the copies' exchange");
        xp->recv_displs[p] = mpi_count(received, "the copies' exchange");
        sent += out;
        received += in;
    }
    float *send = dm_alloc_uninit((sent + 1) * sizeof(float));
    float *recv = dm_alloc_uninit((received + 1) * sizeof(float));
    for (int p = 0; p < P; p++)
        copies_walk(xp, blk, cp, back, p, WALK_SEND, send + xp->send_displs[p]);
    MPI_Request req;
    WORLD_MPI(MPI_Ialltoallv(send, xp->send_counts, xp->send_displs, MPI_FLOAT, recv,
                             xp->recv_counts, xp->recv_displs, MPI_FLOAT, xp->comm, &req));
    *xp->wait_s += world_wait(&req);
    for (int p = 0; p < P; p++)
        copies_walk(xp, blk, cp, back, p, WALK_RECEIVE, recv + xp->recv_displs[p]);
    dm_free(send);
    dm_free(recv);
}

/* blk's copies in use, or NULL. */
static struct ep_copies *copies_in_use(struct ep_state *xp, const struct block *blk)
{
    struct ep_copies *cp = copies_for(xp, blk, 0);
    return cp && cp->n > 0 ? cp : NULL;
}

/* blk's copies in use, their weights made the owners' first (collective
 * over the group: every rank reaches a block's forward together), or
 * NULL. */
static struct ep_copies *fresh_copies(struct ep_state *xp, struct block *blk)
{
    struct ep_copies *cp = copies_in_use(xp, blk);
    if (!cp) return NULL;
    if (!cp->fresh) {
        copies_exchange(xp, blk, cp, 0);
        cp->fresh = 1;
    }
    return cp;
}

static void ep_forward(void *ctx, struct block *blk, const void *key, const int *offset,
                       const float *x, float *y)
{
    struct ep_state *xp = ctx;
    const struct block_moe *moe = block_moe_of(blk);
    int P = xp->P, S = xp->stride, C = blk->C, H = moe->cfg.hidden;
    struct ep_copies *cp = fresh_copies(xp, blk);
    struct ep_entry *en = entry_for(xp, key, blk->index, 1);
    if (!en->counts) en->counts = dm_alloc((size_t)P * S * sizeof(int));
    const int *at;
    const float *send = rows_by_position(xp, moe, cp, offset, x, C, &at);
    for (int i = 0; i < P * S; i++) xp->expert_counts[i] = at[i + 1] - at[i];
    MPI_Request req;
    WORLD_MPI(MPI_Ialltoall(xp->expert_counts, S, MPI_INT, en->counts, S, MPI_INT, xp->comm,
                            &req));
    *xp->wait_s += world_wait(&req);
    size_t rows = (size_t)total_rows(en, P, S);
    if (rows + 1 > en->room) {
        tensor_free(en->x);
        tensor_free(en->h);
        tensor_free(en->a);
        en->room = rows_room(xp, blk, rows);
        en->x = tensor_alloc(en->room * C, 0);
        en->h = tensor_alloc(en->room * H, 0);
        en->a = tensor_alloc(en->room * H, 0);
    }
    exchange_rows(xp, at, en, S, send, en->x, C, 0);
    block_moe_of(blk)->rows_taken += (double)rows;
    float *out = grow(&xp->rows_out, &xp->rows_out_n, en->room * C);
    size_t r = 0;
    for (int s = 0; s < P; s++)
        for (int j = 0; j < S; j++) {
            int n = en->counts[s * S + j];
            if (n > 0)
                moe_expert_forward(blk, slot_weights(xp, blk, cp, j), en->x + r * C, n,
                                   en->h + r * H, en->a + r * H, out + r * C);
            r += (size_t)n;
        }
    float *landed = landing_by_position(xp, moe, offset, at, y, C);
    exchange_rows(xp, at, en, S, out, landed, C, 1);
    rows_by_expert(xp, offset, landed, y, C);
}

/* Each source's gradients of this micro-batch (grads: by source, then
 * slot), formed from zero, added to that source's sum as the source adds
 * its own with ep = 1: an owned expert's into the slab (this rank's own
 * source) or the other sources' sums, a copy's into the copy's sums. */
static void add_source_grads(struct ep_state *xp, struct block *blk, struct ep_copies *cp,
                             const float *grads)
{
    struct block_moe *moe = block_moe_of(blk);
    int P = xp->P, S = xp->stride, per = moe->cfg.experts / P;
    size_t Pe = moe->expert_params, one = (size_t)per * Pe;
    float *sum = grads_for(xp, blk);
    for (int s = 0; s < P; s++) {
        float *to = s == xp->rank ? moe->experts_g : sum + (size_t)(s - (s > xp->rank)) * one;
        tensor_add(to, grads + (size_t)s * S * Pe, one);
        for (int j = per; cp && j < S; j++)
            tensor_add(cp->grads + ((size_t)(j - per) * P + s) * Pe,
                       grads + ((size_t)s * S + j) * Pe, Pe);
    }
}

static void ep_backward(void *ctx, struct block *blk, const void *key, const int *offset,
                        const float *dy, float *dx)
{
    struct ep_state *xp = ctx;
    struct block_moe *moe = block_moe_of(blk);
    int P = xp->P, S = xp->stride, C = blk->C, H = moe->cfg.hidden;
    size_t Pe = moe->expert_params;
    struct ep_copies *cp = copies_in_use(xp, blk);
    struct ep_entry *en = entry_for(xp, key, blk->index, 0);
    const int *at;
    const float *send = rows_by_position(xp, moe, cp, offset, dy, C, &at);
    float *dy_in = grow(&xp->rows_out, &xp->rows_out_n, en->room * C);
    exchange_rows(xp, at, en, S, send, dy_in, C, 0);
    float *dh = grow(&xp->dh, &xp->dh_n, en->room * H);
    float *dx_out = grow(&xp->dx_out, &xp->dx_out_n, en->room * C);
    float *grads = NULL;
    if (!blk->frozen) {
        grads = grow(&xp->grads_out, &xp->grads_out_n, (size_t)P * S * Pe);
        tensor_zero(grads, (size_t)P * S * Pe);
    }
    size_t r = 0;
    for (int s = 0; s < P; s++)
        for (int j = 0; j < S; j++) {
            int n = en->counts[s * S + j];
            if (n > 0)
                moe_expert_backward(blk, slot_weights(xp, blk, cp, j),
                                    grads ? grads + ((size_t)s * S + j) * Pe : NULL,
                                    dy_in + r * C, en->x + r * C, en->h + r * H, en->a + r * H,
                                    n, dh + r * H, dx_out + r * C);
            r += (size_t)n;
        }
    float *landed = landing_by_position(xp, moe, offset, at, dx, C);
    exchange_rows(xp, at, en, S, dx_out, landed, C, 1);
    rows_by_expert(xp, offset, landed, dx, C);
    if (grads) add_source_grads(xp, blk, cp, grads);
}

/* gather_holders over the devices' transport: to every other group q
 * this rank's own and others, from it q's into their places; this
 * group's copied on the device. */
static void gather_holders_on_devices(struct ep_state *xp, float *gathered,
                                      const float *own, const float *others, size_t one)
{
    const struct dm_backend *ops = backend_current();
    int groups = xp->groups, me = xp->group, n = 0;
    size_t rest = (size_t)(xp->P - 1) * one;
    float *all_others = gathered + (size_t)groups * one;
    for (int q = 0; q < groups; q++) {
        if (q == me) continue;
        xp->ops[n++] = (struct dm_comm_op){(float *)own, one, q, 0};
        xp->ops[n++] = (struct dm_comm_op){(float *)others, rest, q, 0};
        xp->ops[n++] = (struct dm_comm_op){gathered + (size_t)q * one, one, q, 1};
        xp->ops[n++] = (struct dm_comm_op){all_others + (size_t)q * rest, rest, q, 1};
    }
    engine_transport_exchange(xp->eng, xp->holders_dev, xp->ops, n);
    ops->copy_on_device(gathered + (size_t)me * one, own, one * sizeof(float));
    ops->copy_on_device(all_others + (size_t)me * rest, others, rest * sizeof(float));
}

/* The holders' slabs' gradients (own, one floats each) and sums (others,
 * (P - 1) one each) gathered by group into one buffer of the backend's:
 * every group's own, then every group's others. */
static float *gather_holders(struct ep_state *xp, const float *own, const float *others,
                             size_t one)
{
    int P = xp->P, groups = xp->groups;
    size_t own_bytes = one * sizeof(float), others_bytes = (size_t)(P - 1) * own_bytes;
    size_t all_bytes = (size_t)groups * (own_bytes + others_bytes);
    float *gathered = grow(&xp->gathered, &xp->gathered_n, (size_t)groups * P * one);
    if (xp->holders_dev) {
        gather_holders_on_devices(xp, gathered, own, others, one);
        return gathered;
    }
    float *send = staging_pool_host(xp->staging, STAGING_PART_SEND, own_bytes + others_bytes);
    const float *own_h = backend_read(send, own, own_bytes);
    const float *others_h = backend_read(send ? send + one : NULL, others, others_bytes);
    float *recv = backend_write_begin(staging_pool_host(xp->staging, STAGING_PART_RECV,
                                                        all_bytes), gathered);
    MPI_Request req[2];
    int n_own = mpi_count(one, "an expert shard's gradients");
    int n_others = mpi_count((size_t)(P - 1) * one, "an expert shard's gradients");
    WORLD_MPI(MPI_Iallgather(own_h, n_own, MPI_FLOAT, recv, n_own, MPI_FLOAT, xp->holders,
                             &req[0]));
    WORLD_MPI(MPI_Iallgather(others_h, n_others, MPI_FLOAT, recv + (size_t)groups * one, n_others,
                             MPI_FLOAT, xp->holders, &req[1]));
    *xp->wait_s += world_wait_all(2, req);
    backend_write_end(gathered, recv, all_bytes);
    return gathered;
}

/* out = from[0] + from[1] + ... + from[D - 1], element by element in that
 * order; out may be one of the sources. On the host element i of every
 * source is read before it is written; on a device the sum forms in
 * scratch (the table's residual_forward, the same bits) and is copied. */
static void sum_sources(struct ep_state *xp, float *out, const float **from, int D,
                        size_t one)
{
    const struct dm_backend *ops = backend_current();
    if (ops->host_access) {
        for (size_t i = 0; i < one; i++) {
            float total = from[0][i];
            for (int r = 1; r < D; r++) total += from[r][i];
            out[i] = total;
        }
        return;
    }
    float *total = grow(&xp->total, &xp->total_n, one);
    ops->residual_forward(total, from[0], from[1], (long)one);   /* D >= P >= 2 */
    for (int r = 2; r < D; r++) ops->residual_forward(total, total, from[r], (long)one);
    ops->copy_on_device(out, total, one * sizeof(float));
}

/* Sums blk's held experts' gradients over every replica of the stage, in
 * replica order q P + s: the per-source sums of the D / P ranks that hold
 * these experts (one per expert group, all of the same group rank: each
 * one's own source in its slab, the others in its sums), gathered by
 * group. The same bits as ep = 1's replica sum of the whole slab. */
static void reduce_block(struct ep_state *xp, struct block *blk)
{
    struct block_moe *moe = block_moe_of(blk);
    int P = xp->P, groups = xp->groups, D = P * groups;
    size_t one = (size_t)moe_owned_experts(&moe->cfg) * moe->expert_params;
    float *sum = grads_for(xp, blk), *own = moe->experts_g, *others = sum;
    if (groups > 1) {
        own = gather_holders(xp, moe->experts_g, sum, one);
        others = own + (size_t)groups * one;
    }
    const float **from = dm_alloc((size_t)D * sizeof *from);   /* replica r's sum */
    for (int r = 0; r < D; r++) {
        int q = r / P, s = r % P;
        from[r] = s == xp->rank ? own + (size_t)q * one
                                : others + ((size_t)q * (P - 1) + (size_t)(s - (s > xp->rank))) * one;
    }
    sum_sources(xp, moe->experts_g, from, D, one);
    dm_free(from);
    tensor_zero(sum, (size_t)(P - 1) * one);
}

static void ep_reduce(struct engine *eng)
{
    struct ep_state *xp = eng->ep;
    struct gpt *m = &eng->model;
    if (!xp) return;
    for (int i = 0; i < m->num_blocks; i++) {
        struct block *blk = &m->blocks[i];
        if (!block_moe_of(blk) || blk->frozen) continue;
        struct ep_copies *cp = copies_in_use(xp, blk);
        if (cp) {   /* the copies' sources' sums to the owners */
            copies_exchange(xp, blk, cp, 1);
            size_t Pe = block_moe_of(blk)->expert_params;
            tensor_zero(cp->grads, (size_t)xp->copies_max * xp->P * Pe);
            cp->fresh = 0;   /* the update changes the owners' weights */
        }
        reduce_block(xp, blk);
    }
}

/* What the exchange kept for blocks (activations between a forward and
 * its backward, the per-source gradient sums, zero between steps) is let
 * go when the stage's blocks change: after a migration none of it is
 * needed, and the entries of blocks that left would never be found
 * again. */
static void ep_forget(struct engine *eng)
{
    struct ep_state *xp = eng->ep;
    if (!xp) return;
    for (int i = 0; i < xp->nentries; i++) {
        dm_free(xp->entries[i].counts);
        tensor_free(xp->entries[i].x);
        tensor_free(xp->entries[i].h);
        tensor_free(xp->entries[i].a);
    }
    dm_free(xp->entries);
    xp->entries = NULL;
    xp->nentries = 0;
    for (int i = 0; i < xp->ngrads; i++) tensor_free(xp->grads[i].sum);
    dm_free(xp->grads);
    xp->grads = NULL;
    xp->ngrads = 0;
    copies_free(xp);
    int current = eng->chunk;
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        for (int i = 0; i < eng->model.num_blocks; i++) {
            struct block_moe *moe = block_moe_of(&eng->model.blocks[i]);
            if (moe) memset(moe->copies, 0, (size_t)moe->cfg.experts * sizeof(int));
        }
    }
    engine_use_chunk(eng, current);
}

/* Hands the MoE blocks of every chunk's model `runtime` (the exchange, or
 * NULL: none); chunk 0 is the current one after. */
static void chunks_set_exchange(struct engine *eng, const void *runtime)
{
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        gpt_ext_set_runtime(&eng->model, &moe_ext_ops, runtime);
    }
    engine_use_chunk(eng, 0);
}

/* Hands the model's MoE blocks an exchange over the stage's expert group
 * (collective; nothing unless parallel.ep > 1 and the model has them). */
static void ep_init(struct engine *eng)
{
    const struct pipe_grid *g = &eng->grid;
    const struct moe_params *moe = moe_params_of(&eng->shape);
    int P = eng->cfg.ep;
    if (P <= 1 || !moe) return;
    struct ep_state *xp = dm_alloc(sizeof *xp);
    xp->P = P;
    xp->rank = g->replica % P;
    xp->wait_s = &eng->wait_s;
    xp->tokens = (size_t)eng->micro_B * (size_t)eng->T;
    xp->grouped = xp->tokens * (size_t)moe->top_k;
    xp->staging = &eng->staging;
    int groups = g->replicas / P;
    xp->groups = groups;
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->stage * groups + g->replica / P, xp->rank,
                             &xp->comm));
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->stage * P + xp->rank, g->replica / P,
                             &xp->holders));
    xp->eng = eng;
    xp->group = g->replica / P;
    xp->comm_dev = engine_transport_over(eng, xp->comm);
    xp->holders_dev = engine_transport_over(eng, xp->holders);
    xp->ops = dm_alloc((size_t)(4 * (P > groups ? P : groups) + 2) * sizeof *xp->ops);
    xp->copies_max = eng->cfg.replicas_max;
    xp->stride = moe->experts / P + xp->copies_max;
    size_t slots = (size_t)P * xp->stride;
    xp->send_counts = dm_alloc((4 * (size_t)P + slots) * sizeof(int));
    xp->send_displs = xp->send_counts + P;
    xp->recv_counts = xp->send_counts + 2 * P;
    xp->recv_displs = xp->send_counts + 3 * P;
    xp->expert_counts = xp->send_counts + 4 * P;
    xp->position_offset = dm_alloc((slots + 1) * sizeof(int));
    xp->pos_expert = dm_alloc(slots * sizeof(int));
    const char *placement = eng->cfg.moe_placement;
    xp->placement = !strcmp(placement, "balanced") ? PLACEMENT_BALANCED
                    : !strcmp(placement, "random") ? PLACEMENT_RANDOM
                                                   : PLACEMENT_STATIC;
    xp->loads = dm_alloc((size_t)eng->shape.layers * moe->experts * sizeof(double));
    xp->exchange.ctx = xp;
    xp->exchange.experts_forward = ep_forward;
    xp->exchange.experts_backward = ep_backward;
    eng->ep = xp;
    chunks_set_exchange(eng, &xp->exchange);
    if (g->rank == 0) {
        int C = eng->shape.channels;
        double mib = 16.0 / 1048576.0;   /* params, grads, m, v */
        dm_log("expert parallelism: %d experts per MoE block over %d ranks of each stage's "
               "replicas, %d each; an MoE block's slab is %.2f MiB on each rank (%.2f MiB "
               "with every expert), plus %.2f MiB of the other sources' expert gradients\n",
               moe->experts, P, moe->shard_count, mib * moe_block_param_count(C, moe),
               mib * moe_full_param_count(C, moe),
               0.25 * mib * (moe->experts - moe->shard_count) *
                   (double)moe_expert_param_count(C, moe->hidden));
    }
}

static void ep_free(struct engine *eng)
{
    struct ep_state *xp = eng->ep;
    if (!xp) return;
    chunks_set_exchange(eng, NULL);
    ep_forget(eng);
    tensor_free(xp->rows_out);
    tensor_free(xp->dh);
    tensor_free(xp->dx_out);
    tensor_free(xp->grads_out);
    tensor_free(xp->gathered);
    tensor_free(xp->total);
    dm_free(xp->send_counts);
    dm_free(xp->position_offset);
    dm_free(xp->pos_expert);
    dm_free(xp->loads);
    tensor_free(xp->by_position);
    tensor_free(xp->by_position_back);
    if (xp->comm_dev) backend_current()->comm_free(xp->comm_dev);
    if (xp->holders_dev) backend_current()->comm_free(xp->holders_dev);
    dm_free(xp->ops);
    WORLD_MPI(MPI_Comm_free(&xp->comm));
    WORLD_MPI(MPI_Comm_free(&xp->holders));
    dm_free(xp);
    eng->ep = NULL;
}

/* A block's time on an expert-parallel stage is its busiest rank's: the
 * forward and backward seconds of the current chunk's blocks become their
 * maxima over the expert group (polled), and the rank's compute grows by
 * what that adds. */
static void profile_chunk(struct engine *eng, struct ep_state *xp)
{
    struct gpt *m = &eng->model;
    if (m->num_blocks == 0) return;
    int n = m->num_blocks;
    double *mine = dm_alloc(2 * (size_t)n * sizeof(double));
    double *most = dm_alloc(2 * (size_t)n * sizeof(double));
    memcpy(mine, m->block_fwd_s, (size_t)n * sizeof(double));
    memcpy(mine + n, m->block_bwd_s, (size_t)n * sizeof(double));
    MPI_Request req;
    WORLD_MPI(MPI_Iallreduce(mine, most, 2 * n, MPI_DOUBLE, MPI_MAX, xp->comm, &req));
    world_wait(&req);
    memcpy(m->block_fwd_s, most, (size_t)n * sizeof(double));
    memcpy(m->block_bwd_s, most + n, (size_t)n * sizeof(double));
    /* The stage's compute as if each block took its busiest rank's time, so
     * that the stage's time less its blocks' is still its own other work
     * (the embedding, the head: the end-stage extras of balance.h). */
    for (int i = 0; i < 2 * n; i++) eng->compute_s += most[i] - mine[i];
    dm_free(mine);
    dm_free(most);
}

static void ep_profile(struct engine *eng)
{
    struct ep_state *xp = eng->ep;
    if (!xp) return;
    int current = eng->chunk;
    for (int c = 0; c < eng->virtual; c++) {   /* the group's ranks hold the same chunks */
        engine_use_chunk(eng, c);
        profile_chunk(eng, xp);
    }
    engine_use_chunk(eng, current);
}


/* ---- moe.placement: experts moved between the ranks of a group ------------------------ */

/* Moves blk's experts within this rank's expert group from its order to
 * next: each expert that changes rank goes from its holder to its new one
 * with its weights and Adam moments (the gradients are zero between
 * steps), by one all-to-all over the group; each rank's slots are then its
 * experts of next, ascending. Every rank of the group calls it with the
 * same next. Returns the floats this rank sent. */
static size_t relocate_block(struct ep_state *xp, struct block *blk, const int *next)
{
    struct block_moe *moe = block_moe_of(blk);
    int P = xp->P, E = moe->cfg.experts, per = E / P, me = xp->rank;
    size_t Pe = moe->expert_params, one = 3 * Pe;   /* params, m, v */
    size_t at = (size_t)(moe->experts_p - blk->params);
    float *tensor[3] = {blk->params + at, blk->m + at, blk->v + at};
    int *was = dm_alloc((size_t)E * sizeof(int)), *now = dm_alloc((size_t)E * sizeof(int));
    int *old_slot = dm_alloc((size_t)E * sizeof(int)), *place = dm_alloc((size_t)E * sizeof(int));
    for (int i = 0; i < E; i++) {
        was[moe->order[i]] = i / per;
        now[next[i]] = i / per;
        old_slot[moe->order[i]] = i % per;
    }
    /* counts in floats, experts ascending within each peer */
    size_t sent = 0, received = 0;
    for (int p = 0; p < P; p++) {
        size_t out = 0, in = 0;
        for (int e = 0; e < E; e++) {
            if (p == me) continue;
            if (was[e] == me && now[e] == p) out++;
            if (was[e] == p && now[e] == me) {
                place[e] = (int)(received / one + in);
                in++;
            }
        }
        xp->send_counts[p] = mpi_count(out * one, "an expert move");
        xp->send_displs[p] = mpi_count(sent, "an expert move");
        xp->recv_counts[p] = mpi_count(in * one, "an expert move");
        xp->recv_displs[p] = mpi_count(received, "an expert move");
        sent += out * one;
        received += in * one;
    }
    float *send = dm_alloc_uninit((sent + 1) * sizeof(float));
    float *recv = dm_alloc_uninit((received + 1) * sizeof(float));
    size_t k = 0;
    for (int p = 0; p < P; p++)
        for (int e = 0; e < E; e++)
            if (p != me && was[e] == me && now[e] == p)
                for (int t = 0; t < 3; t++, k += Pe)
                    memcpy(send + k, tensor[t] + (size_t)old_slot[e] * Pe, Pe * sizeof(float));
    MPI_Request req;
    WORLD_MPI(MPI_Ialltoallv(send, xp->send_counts, xp->send_displs, MPI_FLOAT, recv,
                             xp->recv_counts, xp->recv_displs, MPI_FLOAT, xp->comm, &req));
    *xp->wait_s += world_wait(&req);
    /* the new slots, from the old ones kept aside and what arrived */
    size_t region = (size_t)per * Pe;
    float *kept = dm_alloc_uninit(3 * region * sizeof(float) + 1);
    for (int t = 0; t < 3; t++) memcpy(kept + t * region, tensor[t], region * sizeof(float));
    for (int j = 0; j < per; j++) {
        int e = next[me * per + j];
        for (int t = 0; t < 3; t++) {
            const float *from = was[e] == me ? kept + t * region + (size_t)old_slot[e] * Pe
                                             : recv + (size_t)place[e] * one + (size_t)t * Pe;
            memcpy(tensor[t] + (size_t)j * Pe, from, Pe * sizeof(float));
        }
    }
    memset(moe->experts_g, 0, region * sizeof(float));
    memcpy(moe->order, next, (size_t)E * sizeof(int));
    dm_free(kept);
    dm_free(send);
    dm_free(recv);
    dm_free(was);
    dm_free(now);
    dm_free(old_slot);
    dm_free(place);
    return sent;
}

/* One block's choice as stage replica 0 makes it and the stage's ranks
 * take it: its next order, then its copies (a count, then item, holder
 * and sources each), int64 throughout. */
static size_t choice_size(const struct ep_state *xp, int E)
{
    return (size_t)E + 1 + 3 * (size_t)xp->copies_max;
}

/* The copies on top of next (moe.replicas_max): random ones (moe.placement
 * = random), or the planner's over the same loads, kept when their
 * saving a step exceeds what carrying them costs a step. */
static int choose_copies(struct ep_state *xp, const struct block *blk,
                         const struct balance_placement_input *in, const int *next, int step,
                         struct balance_copy *copies)
{
    const struct block_moe *moe = block_moe_of(blk);
    if (xp->copies_max == 0) return 0;
    if (xp->placement == PLACEMENT_RANDOM)
        return balance_copies_random(next, in->items, xp->P, xp->copies_max, xp->eng->cfg.seed,
                                     (uint64_t)step, blk->index, copies);
    struct balance_copies_decision d;
    balance_copies_decide(in, next, xp->copies_max,
                          sizeof(float) * (double)moe->expert_params, copies, &d);
    if (d.copies > 0 && xp->eng->grid.rank == 0)
        dm_log("placement: step %d: block %d: %d expert copies, busiest expert rank %.0f -> "
               "%.0f pairs a step, saving %.2f ms a step vs carrying them ~%.2f ms\n",
               step + 1, blk->index, d.copies, d.now_load, d.next_load, d.saving_ms, d.cost_ms);
    return d.copies;
}

/* Stage replica 0's choice for blk (local index i) into choice (choice_size
 * entries): a random order (moe.placement = random), or the planner's over
 * the loads routed since the last decision, priced like a block move (its
 * weights and two moments; the fit of the expert moves so far); then its
 * copies. */
static void choose_placement(struct ep_state *xp, const struct engine *eng, int i, int step,
                             int64_t *choice)
{
    const struct gpt *m = &eng->model;
    const struct block *blk = &m->blocks[i];
    const struct block_moe *moe = block_moe_of(blk);
    int E = moe->cfg.experts, P = xp->P, layer = blk->index;
    int *next = dm_alloc((size_t)E * sizeof(int));
    double *loads = dm_alloc((size_t)E * sizeof(double)), *last = dm_alloc((size_t)E * sizeof(double));
    for (int e = 0; e < E; e++) {
        loads[e] = xp->loads[(size_t)layer * E + e] / xp->load_steps;
        last[e] = (double)moe->tokens[e];
    }
    /* the busiest rank's last step: its block's time over its load */
    double busiest = balance_placement_busiest(last, moe->order, E, P);
    double ms = 1000.0 * (m->block_fwd_s[i] + m->block_bwd_s[i]);
    struct balance_placement_input in = {
        .loads = loads, .current = moe->order, .items = E, .ranks = P,
        .ms_per_load = busiest > 0 ? ms / busiest : 0.0, .every = eng->cfg.every,
        .bytes_per_item = 3.0 * sizeof(float) * (double)moe->expert_params,
        .moved_bytes = xp->moved_bytes, .moved_ms = xp->moved_ms,
        .moves_kept = xp->moves_kept < EXPERT_MOVES_KEPT ? xp->moves_kept : EXPERT_MOVES_KEPT,
    };
    if (xp->placement == PLACEMENT_RANDOM) {
        balance_placement_random(next, E, P, eng->cfg.seed, (uint64_t)step, layer);
    } else {
        struct balance_placement_decision d;
        balance_placement_decide(&in, next, &d);
        if (d.moves > 0 && eng->grid.rank == 0)
            dm_log("placement: step %d: block %d: busiest expert rank %.0f -> %.0f pairs a step, "
                   "saving %.1f ms over %d steps vs moving %d experts ~%.1f ms: %s\n", step + 1,
                   layer, d.now_load, d.next_load, d.saving_ms, in.every, d.moves, d.migrate_ms,
                   d.apply ? "moving" : "skipped");
    }
    struct balance_copy *copies = dm_alloc(((size_t)xp->copies_max + 1) * sizeof *copies);
    int n = choose_copies(xp, blk, &in, next, step, copies);
    for (int e = 0; e < E; e++) choice[e] = next[e];
    choice[E] = n;
    for (int c = 0; c < n; c++) {
        choice[E + 1 + 3 * c] = copies[c].item;
        choice[E + 2 + 3 * c] = copies[c].holder;
        choice[E + 3 + 3 * c] = (int64_t)copies[c].sources;
    }
    dm_free(copies);
    dm_free(next);
    dm_free(loads);
    dm_free(last);
}

/* blk's copies from its choice (after its relocation: the owners are the
 * new order's), stale until the next forward brings their weights. */
static void take_copies(struct ep_state *xp, struct block *blk, const int64_t *choice)
{
    struct block_moe *moe = block_moe_of(blk);
    int E = moe->cfg.experts, n = (int)choice[E];
    memset(moe->copies, 0, (size_t)E * sizeof(int));
    struct ep_copies *cp = copies_for(xp, blk, n > 0);
    if (!cp) return;
    cp->n = n;
    cp->fresh = 0;
    for (int c = 0; c < n; c++) {
        cp->copy[c] = (struct balance_copy){(int)choice[E + 1 + 3 * c], (int)choice[E + 2 + 3 * c],
                                            (uint64_t)choice[E + 3 + 3 * c]};
        moe->copies[cp->copy[c].item]++;
    }
}

/* The part's decide (engine_after_step): expert placement of the MoE
 * blocks of every chunk (interleaved: v of them), in chunk and block
 * order; the current chunk is kept. */
static void ep_decide_placement(struct engine *eng, int step)
{
    struct ep_state *xp = eng->ep;
    if (!xp || xp->placement == PLACEMENT_STATIC) return;
    const struct moe_params *p = moe_params_of(&eng->shape);
    int E = p->experts, n = 0, current = eng->chunk;
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        struct gpt *m = &eng->model;
        for (int i = 0; i < m->num_blocks; i++) {
            const struct block_moe *moe = block_moe_of(&m->blocks[i]);
            if (!moe) continue;
            for (int e = 0; e < E; e++)
                xp->loads[(size_t)m->blocks[i].index * E + e] += (double)moe->tokens[e];
            n++;
        }
    }
    xp->load_steps++;
    int decide = xp->placement == PLACEMENT_RANDOM || (step + 1) % eng->cfg.every == 0;
    if (!decide || n == 0) {
        engine_use_chunk(eng, current);
        return;
    }
    size_t one = choice_size(xp, E);
    int64_t *choices = dm_alloc((size_t)n * one * sizeof(int64_t));
    if (eng->grid.replica == 0)
        for (int c = 0, b = 0; c < eng->virtual; c++) {
            engine_use_chunk(eng, c);
            for (int i = 0; i < eng->model.num_blocks; i++)
                if (block_moe_of(&eng->model.blocks[i]))
                    choose_placement(xp, eng, i, step, choices + (size_t)b++ * one);
        }
    MPI_Request req;
    WORLD_MPI(MPI_Ibcast(choices, n * (int)one, MPI_INT64_T, 0, eng->stage_comm, &req));
    eng->wait_s += world_wait(&req);
    double t0 = dm_now();
    size_t sent = 0;
    int moved = 0, *next = dm_alloc((size_t)E * sizeof(int));
    for (int c = 0, b = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        struct gpt *m = &eng->model;
        for (int i = 0; i < m->num_blocks; i++) {
            struct block_moe *moe = block_moe_of(&m->blocks[i]);
            if (!moe) continue;
            for (int e = 0; e < E; e++) next[e] = (int)choices[(size_t)b * one + e];
            b++;
            if (!memcmp(next, moe->order, (size_t)E * sizeof(int))) continue;
            sent += relocate_block(xp, &m->blocks[i], next);
            moved = 1;
        }
    }
    if (moved) {
        ep_forget(eng);
        int slot = xp->moves_kept++ % EXPERT_MOVES_KEPT;
        xp->moved_bytes[slot] = (double)sent * sizeof(float);
        xp->moved_ms[slot] = 1000.0 * (dm_now() - t0);
    }
    for (int c = 0, b = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        for (int i = 0; i < eng->model.num_blocks; i++)
            if (block_moe_of(&eng->model.blocks[i]))
                take_copies(xp, &eng->model.blocks[i], choices + (size_t)b++ * one);
    }
    engine_use_chunk(eng, current);
    memset(xp->loads, 0, (size_t)eng->shape.layers * E * sizeof(double));
    xp->load_steps = 0;
    dm_free(next);
    dm_free(choices);
}

const struct engine_part engine_part_ep = {
    .carries = "expert rows",
    .init = ep_init,
    .free = ep_free,
    .profile = ep_profile,
    .reduce = ep_reduce,
    .forget = ep_forget,
    .decide = ep_decide_placement,
};
