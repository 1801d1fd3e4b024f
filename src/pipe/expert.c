/* Expert parallelism (parallel.ep = P > 1, docs/moe.md): the experts phase
 * of this stage's MoE blocks, run over the P ranks of the stage's expert
 * group (replicas q P .. q P + P - 1 of the stage). Expert e belongs to
 * group rank e / (E / P), and only that rank holds it: its parameters,
 * gradients and Adam moments (the block's slab holds the shared tensors,
 * the router and the owned experts; engine_expert_parallel_shard). The
 * model hands over each micro-batch's rows grouped by expert
 * (moe_exchange); this file sends every owner its experts' rows
 * (MPI_Ialltoallv), runs the owned experts over each source's rows
 * separately, sends the outputs back, and in the backward does the same
 * for the output gradients, returning the input gradients. The owner keeps
 * the expert gradients of each source's rows apart, accumulated over the
 * micro-batches as the source would have (moe.c's local phase), and at the
 * step's end sums them over every replica that holds the expert, in
 * replica order (engine_expert_parallel_reduce): the same bits as
 * parallel.ep = 1. Every wait polls (world_wait).
 *
 * Must not: decide which experts a rank owns beyond e / (E / P), or sum
 * anything in an order that depends on timing. */
#include <limits.h>
#include <string.h>
#include "pipe/engine_internal.h"

/* What the owner keeps of one micro-batch's block between its forward and
 * its backward, found again by the model's key. */
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
    float *sum;           /* (P - 1, E/P, expert_params): sources but this rank, in order */
};

struct expert_parallel {
    struct moe_exchange exchange;
    MPI_Comm comm;        /* the stage's expert group, by group rank */
    MPI_Comm holders;     /* the stage's replicas of this group rank, by group */
    int P, rank, groups;
    double *wait_s;
    double *step_rows;    /* (layers) rows this rank's experts took in the step's forwards */
    struct ep_entry *entries;
    int nentries;
    struct ep_grads *grads;
    int ngrads;
    /* scratch, grow-only */
    float *rows_out, *dh, *grads_out, *gathered;
    size_t rows_out_n, dh_n, grads_out_n, gathered_n;
    int *send_counts, *send_displs, *recv_counts, *recv_displs, *expert_counts;
};

static float *grow(float **buf, size_t *have, size_t need)
{
    if (need > *have) {
        dm_free(*buf);
        *buf = dm_alloc_uninit(need * sizeof(float));
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

static float *grads_for(struct expert_parallel *xp, const struct block *blk)
{
    size_t n = (size_t)(xp->P - 1) * moe_owned_experts(&blk->moe->cfg) * blk->moe->expert_params;
    for (int i = 0; i < xp->ngrads; i++)
        if (xp->grads[i].layer == blk->index) return xp->grads[i].sum;
    struct ep_grads *grown = dm_alloc((size_t)(xp->ngrads + 1) * sizeof *grown);
    if (xp->ngrads) memcpy(grown, xp->grads, (size_t)xp->ngrads * sizeof *grown);
    dm_free(xp->grads);
    xp->grads = grown;
    xp->grads[xp->ngrads].layer = blk->index;
    xp->grads[xp->ngrads].sum = dm_alloc(n * sizeof(float));   /* zero */
    return xp->grads[xp->ngrads++].sum;
}

static struct ep_entry *entry_for(struct expert_parallel *xp, const void *key, int layer,
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

/* Sends each owner p the rows of its experts (offset[p E/P] .. offset[(p
 * + 1) E/P]) of rows_in, width floats a row, into recv (ordered by source,
 * then expert); with back set, the reverse: counts per source come from
 * en and rows return to their sources' grouped order. */
static void exchange_rows(struct expert_parallel *xp, const int *offset, const struct ep_entry *en,
                          int per, const float *send, float *recv, int width, int back)
{
    int P = xp->P;
    int *mine = xp->send_counts, *mine_d = xp->send_displs;
    int *theirs = xp->recv_counts, *theirs_d = xp->recv_displs;
    size_t at = 0;
    for (int p = 0; p < P; p++) {
        size_t rows = (size_t)(offset[(p + 1) * per] - offset[p * per]), from = 0;
        for (int j = 0; j < per; j++) from += (size_t)en->counts[p * per + j];
        mine[p] = mpi_count(rows * width, "a rank's rows");
        mine_d[p] = mpi_count((size_t)offset[p * per] * width, "a rank's rows");
        theirs[p] = mpi_count(from * width, "a rank's rows");
        theirs_d[p] = mpi_count(at, "the rows received");
        at += from * width;
    }
    MPI_Request req;
    if (!back)
        WORLD_MPI(MPI_Ialltoallv(send, mine, mine_d, MPI_FLOAT, recv, theirs, theirs_d, MPI_FLOAT,
                                 xp->comm, &req));
    else
        WORLD_MPI(MPI_Ialltoallv(send, theirs, theirs_d, MPI_FLOAT, recv, mine, mine_d, MPI_FLOAT,
                                 xp->comm, &req));
    *xp->wait_s += world_wait(&req);
}

static int total_rows(const struct ep_entry *en, int P, int per)
{
    int n = 0;
    for (int i = 0; i < P * per; i++) n += en->counts[i];
    return n;
}

static void ep_forward(void *ctx, struct block *blk, const void *key, const int *offset,
                       const float *x, float *y)
{
    struct expert_parallel *xp = ctx;
    int P = xp->P, E = blk->moe->cfg.experts, per = E / P, C = blk->C,
        H = blk->moe->cfg.hidden;
    struct ep_entry *en = entry_for(xp, key, blk->index, 1);
    if (!en->counts) en->counts = dm_alloc((size_t)E * sizeof(int));
    for (int e = 0; e < E; e++) xp->expert_counts[e] = offset[e + 1] - offset[e];
    MPI_Request req;
    WORLD_MPI(MPI_Ialltoall(xp->expert_counts, per, MPI_INT, en->counts, per, MPI_INT, xp->comm,
                            &req));
    *xp->wait_s += world_wait(&req);
    size_t rows = (size_t)total_rows(en, P, per);
    if (rows + 1 > en->room) {
        dm_free(en->x);
        dm_free(en->h);
        dm_free(en->a);
        en->room = rows + 1;
        en->x = dm_alloc_uninit(en->room * C * sizeof(float));
        en->h = dm_alloc_uninit(en->room * H * sizeof(float));
        en->a = dm_alloc_uninit(en->room * H * sizeof(float));
    }
    exchange_rows(xp, offset, en, per, x, en->x, C, 0);
    xp->step_rows[blk->index] += (double)rows;
    float *out = grow(&xp->rows_out, &xp->rows_out_n, (rows + 1) * C);
    size_t r = 0;
    for (int s = 0; s < P; s++)
        for (int j = 0; j < per; j++) {
            int n = en->counts[s * per + j];
            moe_expert_forward(blk, xp->rank * per + j, en->x + r * C, n, en->h + r * H,
                               en->a + r * H, out + r * C);
            r += (size_t)n;
        }
    exchange_rows(xp, offset, en, per, out, y, C, 1);
}

static void ep_backward(void *ctx, struct block *blk, const void *key, const int *offset,
                        const float *dy, float *dx)
{
    struct expert_parallel *xp = ctx;
    struct block_moe *moe = blk->moe;
    int P = xp->P, E = moe->cfg.experts, per = E / P, C = blk->C, H = moe->cfg.hidden;
    size_t Pe = moe->expert_params;
    struct ep_entry *en = entry_for(xp, key, blk->index, 0);
    size_t rows = (size_t)total_rows(en, P, per);
    float *dy_in = grow(&xp->rows_out, &xp->rows_out_n, (rows + 1) * C);
    exchange_rows(xp, offset, en, per, dy, dy_in, C, 0);
    float *dh = grow(&xp->dh, &xp->dh_n, (rows + 1) * H);
    float *dx_out = dm_alloc_uninit((rows + 1) * C * sizeof(float));
    float *grads = NULL;
    if (!blk->frozen) {
        grads = grow(&xp->grads_out, &xp->grads_out_n, (size_t)P * per * Pe);
        memset(grads, 0, (size_t)P * per * Pe * sizeof(float));
    }
    size_t r = 0;
    for (int s = 0; s < P; s++)
        for (int j = 0; j < per; j++) {
            int n = en->counts[s * per + j];
            moe_expert_backward(blk, xp->rank * per + j,
                                grads ? grads + ((size_t)s * per + j) * Pe : NULL, dy_in + r * C,
                                en->x + r * C, en->h + r * H, en->a + r * H, n, dh + r * H,
                                dx_out + r * C);
            r += (size_t)n;
        }
    exchange_rows(xp, offset, en, per, dx_out, dx, C, 1);
    dm_free(dx_out);
    if (!grads) return;
    /* Each source's gradients of this micro-batch, formed from zero, are
     * added to that source's sum as the source adds its own with ep = 1. */
    float *sum = grads_for(xp, blk);
    size_t one = (size_t)per * Pe;
    for (int s = 0; s < P; s++) {
        float *to = s == xp->rank ? moe->experts_g : sum + (size_t)(s - (s > xp->rank)) * one;
        const float *from = grads + (size_t)s * one;
        for (size_t i = 0; i < one; i++) to[i] += from[i];
    }
}

/* Sums blk's held experts' gradients over every replica of the stage, in
 * replica order q P + s: the per-source sums of the D / P ranks that hold
 * these experts (one per expert group, all of the same group rank: each
 * one's own source in its slab, the others in its sums), gathered by
 * group. The same bits as ep = 1's replica sum of the whole slab. */
static void reduce_block(struct expert_parallel *xp, struct block *blk)
{
    struct block_moe *moe = blk->moe;
    int P = xp->P, groups = xp->groups, D = P * groups;
    size_t one = (size_t)moe_owned_experts(&moe->cfg) * moe->expert_params;
    float *sum = grads_for(xp, blk), *own = moe->experts_g, *others = sum;
    if (groups > 1) {
        own = grow(&xp->gathered, &xp->gathered_n, (size_t)D * one);
        others = own + (size_t)groups * one;
        MPI_Request req[2];
        int n_own = mpi_count(one, "an expert shard's gradients");
        int n_others = mpi_count((size_t)(P - 1) * one, "an expert shard's gradients");
        WORLD_MPI(MPI_Iallgather(moe->experts_g, n_own, MPI_FLOAT, own, n_own, MPI_FLOAT,
                                 xp->holders, &req[0]));
        WORLD_MPI(MPI_Iallgather(sum, n_others, MPI_FLOAT, others, n_others, MPI_FLOAT,
                                 xp->holders, &req[1]));
        *xp->wait_s += world_wait_all(2, req);
    }
    const float **from = dm_alloc((size_t)D * sizeof *from);   /* replica r's sum */
    for (int r = 0; r < D; r++) {
        int q = r / P, s = r % P;
        from[r] = s == xp->rank ? own + (size_t)q * one
                                : others + ((size_t)q * (P - 1) + (size_t)(s - (s > xp->rank))) * one;
    }
    for (size_t i = 0; i < one; i++) {   /* reads element i of every source before writing it */
        float total = from[0][i];
        for (int r = 1; r < D; r++) total += from[r][i];
        moe->experts_g[i] = total;
    }
    dm_free(from);
    memset(sum, 0, (size_t)(P - 1) * one * sizeof(float));
}

void engine_expert_parallel_reduce(struct engine *eng)
{
    struct expert_parallel *xp = eng->expert_parallel;
    struct gpt *m = &eng->model;
    if (!xp) return;
    for (int i = 0; i < m->num_blocks; i++)
        if (m->blocks[i].moe && !m->blocks[i].frozen) reduce_block(xp, &m->blocks[i]);
}

/* What the exchange kept for blocks (activations between a forward and
 * its backward, the per-source gradient sums, zero between steps) is let
 * go when the stage's blocks change: after a migration none of it is
 * needed, and the entries of blocks that left would never be found
 * again. */
void engine_expert_parallel_forget(struct engine *eng)
{
    struct expert_parallel *xp = eng->expert_parallel;
    if (!xp) return;
    for (int i = 0; i < xp->nentries; i++) {
        dm_free(xp->entries[i].counts);
        dm_free(xp->entries[i].x);
        dm_free(xp->entries[i].h);
        dm_free(xp->entries[i].a);
    }
    dm_free(xp->entries);
    xp->entries = NULL;
    xp->nentries = 0;
    for (int i = 0; i < xp->ngrads; i++) dm_free(xp->grads[i].sum);
    dm_free(xp->grads);
    xp->grads = NULL;
    xp->ngrads = 0;
}

double engine_expert_parallel_take_rows(struct engine *eng, int layer)
{
    struct expert_parallel *xp = eng->expert_parallel;
    if (!xp) return 0.0;
    double rows = xp->step_rows[layer];
    xp->step_rows[layer] = 0.0;
    return rows;
}

void engine_expert_parallel_shard(struct engine *eng)
{
    int P = eng->cfg.ep;
    struct gpt_moe *moe = &eng->shape.moe;
    if (P <= 1 || !moe->every) return;
    moe->shard_count = moe->experts / P;
    moe->shard_first = (eng->grid.replica % P) * moe->shard_count;
}

void engine_expert_parallel_init(struct engine *eng)
{
    const struct pipe_grid *g = &eng->grid;
    int P = eng->cfg.ep;
    if (P <= 1 || !eng->shape.moe.every) return;
    struct expert_parallel *xp = dm_alloc(sizeof *xp);
    xp->P = P;
    xp->rank = g->replica % P;
    xp->wait_s = &eng->wait_s;
    xp->step_rows = dm_alloc((size_t)eng->shape.layers * sizeof(double));
    int groups = g->replicas / P;
    xp->groups = groups;
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->stage * groups + g->replica / P, xp->rank,
                             &xp->comm));
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->stage * P + xp->rank, g->replica / P,
                             &xp->holders));
    xp->send_counts = dm_alloc((size_t)(4 * P + eng->shape.moe.experts) * sizeof(int));
    xp->send_displs = xp->send_counts + P;
    xp->recv_counts = xp->send_counts + 2 * P;
    xp->recv_displs = xp->send_counts + 3 * P;
    xp->expert_counts = xp->send_counts + 4 * P;
    xp->exchange.ctx = xp;
    xp->exchange.experts_forward = ep_forward;
    xp->exchange.experts_backward = ep_backward;
    eng->expert_parallel = xp;
    gpt_moe_set_exchange(&eng->model, &xp->exchange);
    if (g->rank == 0) {
        const struct gpt_moe *moe = &eng->shape.moe;
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

void engine_expert_parallel_free(struct engine *eng)
{
    struct expert_parallel *xp = eng->expert_parallel;
    if (!xp) return;
    gpt_moe_set_exchange(&eng->model, NULL);
    engine_expert_parallel_forget(eng);
    dm_free(xp->rows_out);
    dm_free(xp->dh);
    dm_free(xp->grads_out);
    dm_free(xp->gathered);
    dm_free(xp->send_counts);
    dm_free(xp->step_rows);
    WORLD_MPI(MPI_Comm_free(&xp->comm));
    WORLD_MPI(MPI_Comm_free(&xp->holders));
    dm_free(xp);
    eng->expert_parallel = NULL;
}

/* A block's time on an expert-parallel stage is its busiest rank's: the
 * forward and backward seconds of this rank's blocks become their maxima
 * over the expert group (polled). */
void engine_expert_parallel_profile(struct engine *eng)
{
    struct expert_parallel *xp = eng->expert_parallel;
    struct gpt *m = &eng->model;
    if (!xp || m->num_blocks == 0) return;
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
    dm_free(mine);
    dm_free(most);
}
