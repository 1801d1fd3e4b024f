/* Expert parallelism (parallel.ep = P > 1, docs/moe.md): the experts phase
 * of this stage's MoE blocks, run over the P ranks of the stage's expert
 * group (replicas q P .. q P + P - 1 of the stage). Expert e belongs to
 * group rank e / (E / P). The model hands over each micro-batch's rows
 * grouped by expert (moe_exchange); this file sends every owner its
 * experts' rows (MPI_Ialltoallv), runs the owned experts over each
 * source's rows separately, sends the outputs back, and in the backward
 * does the same for the output gradients, returning to each source the
 * input gradients and the expert gradients of its own rows. A source adds
 * them to its slab as the local phase does (moe.c), so every parallel.ep
 * gives the same bits. Every wait polls (world_wait).
 *
 * Must not: decide which experts a rank owns beyond e / (E / P), or sum
 * anything in an order that depends on timing. */
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

struct expert_parallel {
    struct moe_exchange exchange;
    MPI_Comm comm;
    int P, rank;
    double *wait_s;
    struct ep_entry *entries;
    int nentries;
    /* scratch, grow-only */
    float *rows_out, *dh, *grads_out, *grads_in;
    size_t rows_out_n, dh_n, grads_out_n, grads_in_n;
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
    int at = 0;
    for (int p = 0; p < P; p++) {
        int rows = offset[(p + 1) * per] - offset[p * per];
        int from = 0;
        for (int j = 0; j < per; j++) from += en->counts[p * per + j];
        mine[p] = rows * width;
        mine_d[p] = offset[p * per] * width;
        theirs[p] = from * width;
        theirs_d[p] = at;
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
        grads = grow(&xp->grads_out, &xp->grads_out_n, (size_t)E * Pe);
        memset(grads, 0, (size_t)E * Pe * sizeof(float));
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
    /* Source s gets the gradients of its own rows for every expert, in
     * expert order, and adds them as the local phase does. */
    float *back = grow(&xp->grads_in, &xp->grads_in_n, (size_t)E * Pe);
    MPI_Request req;
    WORLD_MPI(MPI_Ialltoall(grads, (int)(per * Pe), MPI_FLOAT, back, (int)(per * Pe), MPI_FLOAT,
                            xp->comm, &req));
    *xp->wait_s += world_wait(&req);
    for (size_t i = 0; i < (size_t)E * Pe; i++) moe->experts_g[i] += back[i];
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
    int groups = g->replicas / P;
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, g->stage * groups + g->replica / P, xp->rank,
                             &xp->comm));
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
    if (g->rank == 0)
        dm_log("expert parallelism: %d experts per MoE block over %d ranks of each stage's "
               "replicas, %d each\n", eng->shape.moe.experts, P, eng->shape.moe.experts / P);
}

void engine_expert_parallel_free(struct engine *eng)
{
    struct expert_parallel *xp = eng->expert_parallel;
    if (!xp) return;
    gpt_moe_set_exchange(&eng->model, NULL);
    for (int i = 0; i < xp->nentries; i++) {
        dm_free(xp->entries[i].counts);
        dm_free(xp->entries[i].x);
        dm_free(xp->entries[i].h);
        dm_free(xp->entries[i].a);
    }
    dm_free(xp->entries);
    dm_free(xp->rows_out);
    dm_free(xp->dh);
    dm_free(xp->grads_out);
    dm_free(xp->grads_in);
    dm_free(xp->send_counts);
    WORLD_MPI(MPI_Comm_free(&xp->comm));
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
