/* The mixture-of-experts block (docs/moe.md), mixture of experts'
 * extension of the blocks (dynmo/block_ext.h, dynmo/moe.h): a transformer
 * block whose MLP is replaced by E expert MLPs and a linear router. Its
 * attention half is the model's; this file is the other half, its MLP
 * hook forward and backward, in four phases that each read only the
 * previous one's output:
 *
 *   route      router logits (N, E) = ln2 @ router_w^T; scores (softmax
 *              probabilities, or sigmoid scores); each token's top-k experts
 *              (by score, plus the selection bias for the sigmoid router;
 *              ties go to the lower expert index); gate weights (the
 *              chosen score for k = 1, the chosen scores renormalised over
 *              the chosen for k >= 2); each expert's capacity, the pairs
 *              it drops; the balancing losses' values;
 *   dispatch   the kept (token, expert) pairs grouped by expert, each
 *              expert's tokens in ascending order (offset[e] .. offset[e+1]
 *              of the grouped rows), and their inputs gathered into x;
 *   experts    one GEMM pair per expert over its rows only (fc, GELU,
 *              fcproj): the block's cost follows its routing;
 *   combine    out[t] = res1[t] + sum over t's kept pairs, in slot order
 *              (best expert first), of gate x expert output.
 *
 * Every per-token step is a table op (backend.h: moe_route_*,
 * moe_combine_*, routed_dispatch_backward; this file's functions of those
 * names are the CPU's entries): only the assignment of rows (capacity,
 * grouping, the counts per expert) is the host's, from the choice.
 *
 * With expert parallelism the experts phase is the caller's (struct
 * moe_exchange, src/pipe/expert.c, handed to the model as the extension's
 * run-time helper): it sends each expert's rows to its owner and brings
 * the outputs back; route, dispatch and combine stay here. A block then
 * holds only its rank's expert shard (moe_params.shard_first, shard_count):
 * its slab has the shared tensors, the router and those experts,
 * addressed by their global index.
 *
 * Every result is a pure function of the numbers: the top-k and capacity
 * decisions break ties by index, the grouped GEMMs are the ops' thread-
 * count-free matmuls over a fixed row order, and every sum runs in a fixed
 * order, so any layout and any thread count give the same bits. Nothing
 * here calls MPI: the per-expert counts that the bias update sums over the
 * data-parallel replicas come in through the extension's end_step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/moe.h"
#include "dynmo/model.h"

/* ---- its parameters and its blocks ------------------------------------------------ */

const struct moe_params *moe_params_of(const struct gpt_shape *shape)
{
    return gpt_shape_ext_params(shape, &moe_ext_ops);
}

void moe_shape_add(struct gpt_shape *shape, const struct moe_params *params)
{
    DM_ASSERT(params->every > 0);
    gpt_shape_add_ext(shape, &moe_ext_ops, params, sizeof *params);
}

void moe_shape_shard(struct gpt_shape *shape, int P, int rank)
{
    struct gpt_ext *ext = (struct gpt_ext *)gpt_shape_ext(shape, &moe_ext_ops);
    if (P <= 1 || !ext) return;
    struct moe_params *p = (struct moe_params *)ext->params;
    p->shard_count = p->experts / P;
    p->shard_first = (rank % P) * p->shard_count;
}

static int moe_owns(const struct gpt_ext *ext, const struct gpt_shape *shape, int index)
{
    (void)shape;
    return (index + 1) % ((const struct moe_params *)ext->params)->every == 0;
}

int gpt_block_is_moe(const struct gpt_shape *shape, int index)
{
    return gpt_ext_owns(gpt_shape_ext(shape, &moe_ext_ops), shape, index);
}

int gpt_moe_block_count(const struct gpt_shape *shape)
{
    return gpt_ext_block_count(gpt_shape_ext(shape, &moe_ext_ops), shape);
}

int gpt_moe_ordinal(const struct gpt_shape *shape, int index)
{
    return gpt_ext_ordinal(gpt_shape_ext(shape, &moe_ext_ops), shape, index);
}

size_t moe_shared_param_count(int C) { return block_tensor_offset(C, BP_FC_W); }

size_t moe_expert_param_count(int C, int H)
{
    return 2 * (size_t)H * (size_t)C + (size_t)H + (size_t)C;
}

int moe_owned_experts(const struct moe_params *moe)
{
    return moe->shard_count > 0 ? moe->shard_count : moe->experts;
}

/* The floats after the shared tensors: the router and the held experts. */
static size_t moe_ext_floats(int C, const struct moe_params *moe)
{
    return (size_t)moe->experts * (size_t)C +
           (size_t)moe_owned_experts(moe) * moe_expert_param_count(C, moe->hidden);
}

size_t moe_block_param_count(int C, const struct moe_params *moe)
{
    return moe_shared_param_count(C) + moe_ext_floats(C, moe);
}

size_t moe_full_param_count(int C, const struct moe_params *moe)
{
    struct moe_params whole = *moe;
    whole.shard_first = whole.shard_count = 0;
    return moe_block_param_count(C, &whole);
}

static size_t moe_floats(const struct gpt_ext *ext, const struct gpt_shape *shape, int index)
{
    (void)index;
    return moe_ext_floats(shape->channels, (const struct moe_params *)ext->params);
}

/* ---- the state beside the slab ---------------------------------------------------- */

/* params, grads: the extension's floats in the slab, after the shared
 * tensors: the router, then the held experts. */
static void *moe_alloc(const struct gpt_ext *ext, const struct gpt_shape *shape,
                       struct block *blk, float *params, float *grads)
{
    (void)shape;
    const struct moe_params *p = (const struct moe_params *)ext->params;
    int C = blk->C, E = p->experts;
    struct block_moe *moe = dm_alloc(sizeof *moe);
    moe->cfg = *p;
    moe->expert_params = moe_expert_param_count(C, p->hidden);
    moe->router_w = params;
    moe->router_g = grads;
    moe->experts_p = moe->router_w + (size_t)E * C;
    moe->experts_g = moe->router_g + (size_t)E * C;
    moe->bias = dm_alloc((size_t)E * sizeof(float));
    moe->order = dm_alloc((size_t)E * sizeof(int));
    for (int e = 0; e < E; e++) moe->order[e] = e;
    moe->copies = dm_alloc((size_t)E * sizeof(int));   /* zero */
    moe->tokens = dm_alloc(4 * (size_t)E * sizeof(int64_t));
    moe->dropped = moe->tokens + E;
    moe->step_tokens = moe->tokens + 2 * E;
    moe->step_dropped = moe->tokens + 3 * E;
    return moe;
}

static void moe_free(void *state)
{
    struct block_moe *moe = state;
    dm_free(moe->bias);
    dm_free(moe->order);
    dm_free(moe->copies);
    dm_free(moe->tokens);
    dm_free(moe);
}

struct block_moe *block_moe_of(const struct block *blk)
{
    return block_ext_state(blk, &moe_ext_ops);
}

int moe_held_expert(const struct block_moe *moe, int j)
{
    return moe->order[moe->cfg.shard_first + j];
}

/* The router N(0, 0.02) on stream (layer, BP_COUNT); expert e's fc_w and
 * fcproj_w continue the dense MLP's streams (layer, BP_FC_W) and (layer,
 * BP_FCPROJ_W) at element e x H x C, so that every expert's initial
 * weights depend on (seed, layer, expert) alone, wherever it is built. */
static void moe_init_weights(void *state, const struct block *blk, const struct gpt_shape *shape,
                             float *params, uint64_t seed)
{
    struct block_moe *moe = state;
    int C = blk->C, E = moe->cfg.experts, H = moe->cfg.hidden, index = blk->index;
    float residual_std = (float)(0.02 / sqrt(2.0 * shape->layers));
    float *router_w = params;
    float *experts_p = params + (moe->experts_p - moe->router_w);
    block_init_normal(router_w, (size_t)E * C, seed, block_tensor_stream(index, BP_COUNT), 0,
                      0.02f);
    size_t HC = (size_t)H * C;
    for (int j = 0; j < moe_owned_experts(&moe->cfg); j++) {
        int e = moe_held_expert(moe, j);   /* held experts only, by their global index */
        float *w1 = experts_p + (size_t)j * moe->expert_params;
        float *w2 = w1 + HC + H;
        block_init_normal(w1, HC, seed, block_tensor_stream(index, BP_FC_W), (size_t)e * HC,
                          0.02f);
        block_init_normal(w2, HC, seed, block_tensor_stream(index, BP_FCPROJ_W), (size_t)e * HC,
                          residual_std);
    }
}

/* ---- pack format of the state (docs/block-slab.md, flag bit 10) ------------------ */

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

static size_t moe_pack_bytes(const void *state)
{
    size_t E = (size_t)((const struct block_moe *)state)->cfg.experts;
    return 8 + pad8(4 * E) + 16 * E + pad8(4 * E);
}

static void moe_pack(const void *state, unsigned char *out)
{
    const struct block_moe *moe = state;
    size_t E = (size_t)moe->cfg.experts;
    int32_t head[2] = {moe->cfg.experts, moe->cfg.shard_first};
    memcpy(out, head, 8);
    memset(out + 8, 0, pad8(4 * E));
    memcpy(out + 8, moe->bias, 4 * E);
    out += 8 + pad8(4 * E);
    memcpy(out, moe->tokens, 8 * E);
    memcpy(out + 8 * E, moe->dropped, 8 * E);
    out += 16 * E;
    memset(out, 0, pad8(4 * E));
    for (size_t e = 0; e < E; e++) {
        int32_t at = moe->order[e];
        memcpy(out + 4 * e, &at, 4);
    }
}

static int moe_unpack(void *state, const struct block *blk, const unsigned char *in,
                      size_t bytes, char *err, size_t errsize)
{
    struct block_moe *moe = state;
    size_t E = (size_t)moe->cfg.experts, expected = moe_pack_bytes(moe);
    int32_t head[2] = {0, 0};
    if (bytes >= 8) memcpy(head, in, 8);
    if (bytes != expected || head[0] != moe->cfg.experts || head[1] != moe->cfg.shard_first) {
        snprintf(err, errsize, "packed block %d: its MoE state is %zu bytes for %d experts "
                 "from expert %d; the model's block has %zu experts from expert %d (%zu bytes)",
                 blk->index, bytes, head[0], head[1], E, moe->cfg.shard_first, expected);
        return -1;
    }
    memcpy(moe->bias, in + 8, 4 * E);
    in += 8 + pad8(4 * E);
    memcpy(moe->tokens, in, 8 * E);
    memcpy(moe->dropped, in + 8 * E, 8 * E);
    in += 16 * E;
    int *order = dm_alloc(E * sizeof(int)), *seen = dm_alloc(E * sizeof(int)), bad = 0;
    for (size_t e = 0; e < E; e++) {
        int32_t at;
        memcpy(&at, in + 4 * e, 4);
        order[e] = at;
        bad |= at < 0 || (size_t)at >= E || seen[at]++;
    }
    dm_free(seen);
    if (bad) {
        dm_free(order);
        snprintf(err, errsize, "packed block %d: its expert placement is no order of its %zu "
                 "experts", blk->index, E);
        return -1;
    }
    memcpy(moe->order, order, E * sizeof(int));
    dm_free(order);
    memset(moe->step_tokens, 0, 16 * E);
    moe->step_aux = moe->step_z = 0.0;
    return 0;
}

/* ---- activations -------------------------------------------------------------------- */

struct moe_acts {
    int N, E, k, H, C;      /* the sizes it has room for */
    int n;                  /* tokens of the last forward */
    /* The host's: what the assignment of rows reads and writes. */
    int *choice;            /* (N, k) chosen experts, best first */
    float *choice_score;    /* (N, k) their scores (on a device copied down only when an
                             * expert over its capacity drops by score) */
    int *row;               /* (N, k) grouped row of the pair, -1: dropped */
    int *selected;          /* (E) pairs that chose each expert (before capacity) */
    int *offset;            /* (E + 1) first grouped row of each expert */
    int *pair;              /* (k N) the pair t k + j of each grouped row */
    double *sums;           /* (E + 1) the balancing losses' sums (route_topk_sums) */
    int capacity;           /* 0: dropless */
    int rows;               /* kept pairs: grouped rows in use */
    float aux, z;           /* this forward's loss values */
    /* The CPU's only: the router's arrays and the grouped rows (NULL on a
     * device, where only the backend's copies below exist). */
    float *logits;          /* (N, E) router logits */
    float *scores;          /* (N, E) softmax probabilities or sigmoid scores */
    float *lse;             /* (N) log-sum-exp of the logits (z-loss) */
    float *gate;            /* (N, k) gate weights (topk_route_token) */
    float *x, *y;           /* (k N, C) expert inputs and outputs, grouped */
    float *h, *a;           /* (k N, H) expert pre-activations and their GELU */
    /* What the ops read and write, in the backend's memory (on the CPU the
     * arrays above themselves). The routing and its backward are the
     * table's (route_topk_forward, _sums, _backward); per forward on a
     * device the choice (N k ints) and the losses' sums (E + 1 doubles)
     * come down, the chosen scores too when a capacity drops by score,
     * and row, the grouped rows' tokens, the counts per expert and the
     * sigmoid router's bias go up; the backward crosses nothing. */
    float *logits_dev, *scores_dev, *lse_dev, *gate_dev, *choice_score_dev, *bias_dev;
    float *x_dev, *y_dev, *h_dev, *a_dev;
    float *dy_dev, *dh_dev, *dx_dev, *dgate_dev, *dlogits_dev, *dgrads_dev;   /* the backward's */
    int *token_dev;         /* (k N) the token of each grouped row (the dispatch's gather) */
    int *row_dev, *choice_dev, *selected_dev;   /* in token_dev's allocation */
    double *sums_dev;
    float *device;          /* the allocation of the floats above (NULL on the CPU) */
    int *token_host;        /* (k N) staging of token_dev (NULL on the CPU) */
};

/* The host's floats: the chosen scores; on the CPU (host) also the
 * router's arrays and the grouped rows (on a device they are the
 * backend's, moe_acts_device). */
static size_t moe_acts_floats(int N, int E, int k, int H, int C, int host)
{
    size_t n = (size_t)N, kn = (size_t)k * N;
    return kn + (host ? 2 * n * E + n + kn + 2 * kn * C + 2 * kn * H : 0);
}

static size_t moe_acts_ints(int N, int E, int k)
{
    return 2 * (size_t)N * k + (size_t)E + (size_t)E + 1 + (size_t)k * N;
}

size_t moe_acts_bytes(const struct gpt_shape *shape, int B, int T)
{
    const struct moe_params *m = moe_params_of(shape);
    if (!m) return 0;
    int N = B * T;
    return sizeof(struct moe_acts) + moe_acts_floats(N, m->experts, m->top_k, m->hidden,
                                                     shape->channels,
                                                     backend_current()->host_access) *
                                         sizeof(float) +
           moe_acts_ints(N, m->experts, m->top_k) * sizeof(int) +
           ((size_t)m->experts + 1) * sizeof(double);
}

static void moe_acts_free(void *acts)
{
    struct moe_acts *ma = acts;
    if (ma->device) {
        backend_current()->free(ma->device);
        backend_current()->free(ma->token_dev);
        backend_current()->free(ma->sums_dev);
    }
    backend_staging_free(ma->token_host);
    dm_free(ma->choice_score);
    dm_free(ma->choice);
    dm_free(ma->sums);
    dm_free(ma);
}

/* The ops' side of ma: its own arrays on the CPU; on a device, the
 * backend's memory for the router's arrays, the routing's gate, row and
 * choice, the grouped rows and the backward's buffers (the experts'
 * gradients: E expert_params floats), and the host's staging of the
 * gather's tokens. */
static void moe_acts_device(struct moe_acts *ma, size_t expert_params)
{
    const struct dm_backend *ops = backend_current();
    size_t n = (size_t)ma->N, kn = (size_t)ma->k * ma->N, C = (size_t)ma->C;
    size_t H = (size_t)ma->H, E = (size_t)ma->E;
    if (ops->host_access) {
        ma->logits_dev = ma->logits, ma->scores_dev = ma->scores, ma->lse_dev = ma->lse;
        ma->gate_dev = ma->gate, ma->choice_score_dev = ma->choice_score;
        ma->choice_dev = ma->choice, ma->row_dev = ma->row, ma->selected_dev = ma->selected;
        ma->sums_dev = ma->sums;
        ma->x_dev = ma->x, ma->y_dev = ma->y, ma->h_dev = ma->h, ma->a_dev = ma->a;
        return;
    }
    size_t floats = 3 * n * E + n + 3 * kn + E + 2 * kn * C + 2 * kn * H + 2 * kn * C +
                    kn * H + E * expert_params;
    float *f = ma->device = ops->alloc(floats * sizeof(float));
    ma->logits_dev = f;        f += n * E;
    ma->scores_dev = f;        f += n * E;
    ma->lse_dev = f;           f += n;
    ma->gate_dev = f;          f += kn;
    ma->choice_score_dev = f;  f += kn;
    ma->bias_dev = f;          f += E;
    ma->x_dev = f;             f += kn * C;
    ma->y_dev = f;             f += kn * C;
    ma->h_dev = f;             f += kn * H;
    ma->a_dev = f;             f += kn * H;
    ma->dy_dev = f;            f += kn * C;
    ma->dx_dev = f;            f += kn * C;
    ma->dh_dev = f;            f += kn * H;
    ma->dgate_dev = f;         f += kn;
    ma->dlogits_dev = f;       f += n * E;
    ma->dgrads_dev = f;
    ma->token_dev = ops->alloc((3 * kn + E) * sizeof(int));
    ma->row_dev = ma->token_dev + kn;
    ma->choice_dev = ma->row_dev + kn;
    ma->selected_dev = ma->choice_dev + kn;
    ma->sums_dev = ops->alloc((E + 1) * sizeof(double));
    ma->token_host = backend_staging(kn * sizeof(int));
}

/* The block's MoE activations with room for N tokens (allocated once per
 * micro-batch slot and kept; a migration may hand the slot another MoE
 * block of other sizes). */
static struct moe_acts *moe_acts_get(struct block_acts *acts, const struct block_moe *moe, int N,
                                     int C)
{
    struct moe_acts **slot = (struct moe_acts **)block_ext_acts(acts, &moe_ext_ops);
    struct moe_acts *ma = *slot;
    int E = moe->cfg.experts, k = moe->cfg.top_k, H = moe->cfg.hidden;
    if (ma && ma->N >= N && ma->E == E && ma->k == k && ma->H == H && ma->C == C) return ma;
    if (ma) moe_acts_free(ma);
    ma = dm_alloc(sizeof *ma);
    ma->N = N;
    ma->E = E;
    ma->k = k;
    ma->H = H;
    ma->C = C;
    size_t n = (size_t)N, kn = (size_t)k * N;
    int host = backend_current()->host_access;
    float *f = dm_alloc(moe_acts_floats(N, E, k, H, C, host) * sizeof(float));
    ma->choice_score = f;      f += kn;
    if (host) {
        ma->logits = f;        f += n * E;
        ma->scores = f;        f += n * E;
        ma->lse = f;           f += n;
        ma->gate = f;          f += kn;
        ma->x = f;             f += kn * C;
        ma->y = f;             f += kn * C;
        ma->h = f;             f += kn * H;
        ma->a = f;
    }
    int *i = dm_alloc(moe_acts_ints(N, E, k) * sizeof(int));
    ma->choice = i;            i += kn;
    ma->row = i;               i += kn;
    ma->selected = i;          i += E;
    ma->offset = i;            i += E + 1;
    ma->pair = i;
    ma->sums = dm_alloc(((size_t)E + 1) * sizeof(double));
    moe_acts_device(ma, moe->expert_params);
    *slot = ma;
    return ma;
}

/* On a device the scores and gates are the backend's: NULL here. */
void moe_routing_of(struct block_acts *acts, struct moe_routing *r)
{
    const struct moe_acts *ma = *block_ext_acts(acts, &moe_ext_ops);
    DM_ASSERT(ma != NULL);
    memset(r, 0, sizeof *r);
    r->N = ma->n;
    r->E = ma->E;
    r->k = ma->k;
    r->capacity = ma->capacity;
    r->choice = ma->choice;
    r->gate = ma->gate;
    r->scores = ma->scores;
    r->aux = ma->aux;
    r->z = ma->z;
    r->row = ma->row;
    r->offset = ma->offset;
}

/* ---- phase 1: route ------------------------------------------------------------------- */

/* Each expert's pairs before capacity, and the capacity; returns whether
 * the assignment reads the chosen scores (an expert over its capacity
 * drops by score). */
static int count_selected(const struct block_moe *moe, struct moe_acts *ma, int N)
{
    int E = ma->E, k = ma->k, over = 0;
    memset(ma->selected, 0, (size_t)E * sizeof(int));
    for (long p = 0; p < (long)N * k; p++) ma->selected[ma->choice[p]]++;
    double factor = (double)moe->cfg.capacity_factor;
    ma->capacity = factor > 0.0 ? (int)ceil((double)k * N * factor / E) : 0;
    for (int e = 0; e < E; e++) over |= ma->capacity > 0 && ma->selected[e] > ma->capacity;
    return over && moe->cfg.drop == MOE_DROP_PROBS;
}

struct pair_key {
    float score;
    int token, slot, pair;
};

/* Highest score first, then the earlier token. */
static int by_score(const void *x, const void *y)
{
    const struct pair_key *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return a->token - b->token;
}

static int by_token(const void *x, const void *y)
{
    const struct pair_key *a = x, *b = y;
    return a->token - b->token;
}

/* The earlier slot first (every token's first choice before any second
 * choice), then the earlier token. */
static int by_slot(const void *x, const void *y)
{
    const struct pair_key *a = x, *b = y;
    if (a->slot != b->slot) return a->slot - b->slot;
    return a->token - b->token;
}

/* The grouped rows (after count_selected): each expert's pairs in token
 * order; an expert over its capacity keeps `capacity` of them (the
 * highest scores with moe.drop = probs; the earliest tokens with
 * position, which is (token, slot) order, a token choosing an expert at
 * most once; the earliest in (slot, token) order with slot, GShard's)
 * and drops the rest; the kept ones become its rows, in token order. */
static void assign_rows(const struct block_moe *moe, struct moe_acts *ma, int N)
{
    int E = ma->E, k = ma->k;
    /* pairs grouped by expert, each group in (token, slot) order */
    struct pair_key *keys = dm_alloc((size_t)N * k * sizeof *keys);
    int *start = ma->offset;   /* borrowed as the groups' fill positions */
    start[0] = 0;
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + ma->selected[e];
    int *fill = dm_alloc((size_t)E * sizeof(int));
    memcpy(fill, start, (size_t)E * sizeof(int));
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int p = t * k + j, e = ma->choice[p];
            struct pair_key key = {ma->choice_score[p], t, j, p};
            keys[fill[e]++] = key;
        }
    int rows = 0;
    int *kept_count = fill;
    for (int e = 0; e < E; e++) {
        struct pair_key *group = keys + start[e];
        int n = ma->selected[e], keep = n;
        if (ma->capacity > 0 && n > ma->capacity) {
            keep = ma->capacity;
            if (moe->cfg.drop != MOE_DROP_POSITION) {
                qsort(group, (size_t)n, sizeof *group,
                      moe->cfg.drop == MOE_DROP_PROBS ? by_score : by_slot);
                qsort(group, (size_t)keep, sizeof *group, by_token);
            }
        }
        for (int i = keep; i < n; i++) ma->row[group[i].pair] = -1;
        kept_count[e] = keep;
        rows += keep;
    }
    /* the grouped rows: expert by expert, kept pairs in token order */
    int r = 0;
    for (int e = 0; e < E; e++) {
        const struct pair_key *group = keys + start[e];
        start[e] = r;
        for (int i = 0; i < kept_count[e]; i++, r++) {
            ma->pair[r] = group[i].pair;
            ma->row[group[i].pair] = r;
        }
    }
    start[E] = r;
    DM_ASSERT(r == rows);
    ma->rows = rows;
    dm_free(fill);
    dm_free(keys);
}

/* The balancing losses' values from the sums (route_topk_sums): aux =
 * alpha E sum_i f_i P_i, f_i the share of the k N pairs that chose
 * expert i (before capacity), P_i the mean over tokens of its normalised
 * score (the softmax probability, or the sigmoid score over the token's
 * score sum); z = beta mean_t lse_t^2. */
static void balance_losses(const struct block_moe *moe, struct moe_acts *ma, int N)
{
    int E = ma->E, k = ma->k;
    double aux = 0.0, z = 0.0;
    if (moe->cfg.aux_loss > 0.0f) {
        for (int e = 0; e < E; e++)
            aux += ((double)ma->selected[e] / ((double)k * N)) * (ma->sums[e] / N);
        aux *= (double)moe->cfg.aux_loss * E;
    }
    if (moe->cfg.z_loss > 0.0f) {
        z = ma->sums[E];
        z *= (double)moe->cfg.z_loss / N;
    }
    ma->aux = (float)aux;
    ma->z = (float)z;
}

/* The router's product and the table's routing; on a device only the
 * choice comes down (and the chosen scores when an expert drops by
 * score, the losses' E + 1 sums when there are losses), for the host's
 * assignment of rows. */
static void moe_route(struct block *blk, struct block_moe *moe, struct moe_acts *ma,
                      const float *ln2, int N)
{
    const struct dm_backend *ops = backend_current();
    int E = ma->E, k = ma->k, sigmoid = moe->cfg.router == MOE_ROUTER_SIGMOID;
    size_t pairs = (size_t)N * k;
    ops->matmul_forward(ma->logits_dev, ln2, moe->router_w, NULL, N, blk->C, E);
    const float *bias = sigmoid ? moe->bias : NULL;
    if (sigmoid && ma->device) {
        ops->copy_to_device(ma->bias_dev, moe->bias, (size_t)E * sizeof(float));
        bias = ma->bias_dev;
    }
    ops->route_topk_forward(ma->scores_dev, ma->lse_dev, ma->choice_dev, ma->choice_score_dev,
                           ma->gate_dev, ma->logits_dev, bias, N, E, k, sigmoid);
    if (ma->device) ops->copy_to_host(ma->choice, ma->choice_dev, pairs * sizeof(int));
    if (count_selected(moe, ma, N) && ma->device)
        ops->copy_to_host(ma->choice_score, ma->choice_score_dev, pairs * sizeof(float));
    assign_rows(moe, ma, N);
    if (moe->cfg.aux_loss > 0.0f || moe->cfg.z_loss > 0.0f) {
        ops->route_topk_sums(ma->sums_dev, ma->scores_dev, ma->lse_dev, N, E, sigmoid);
        if (ma->device)
            ops->copy_to_host(ma->sums, ma->sums_dev, ((size_t)E + 1) * sizeof(double));
    }
    balance_losses(moe, ma, N);
}

/* ---- phase 2: dispatch ---------------------------------------------------------------- */

struct gather_args {
    float *dst;
    const float *src;
    const int *pair;
    int k, C;
};

static void gather_range(void *arg, long begin, long end)
{
    const struct gather_args *a = arg;
    for (long r = begin; r < end; r++)
        memcpy(a->dst + r * a->C, a->src + (size_t)(a->pair[r] / a->k) * a->C,
               (size_t)a->C * sizeof(float));
}

/* On a device the host's assignment goes up (each pair's row, for the
 * combine and the backward, the grouped rows' tokens, and the pairs per
 * expert, for the aux loss's gradient; the gates are the device's
 * already) and the table's gather copies the rows (the same bits). */
static void moe_dispatch(struct moe_acts *ma, const float *ln2, int N)
{
    if (ma->device) {
        const struct dm_backend *ops = backend_current();
        size_t pairs = (size_t)N * ma->k;
        int *token = ma->token_host;
        for (int r = 0; r < ma->rows; r++) token[r] = ma->pair[r] / ma->k;
        ops->copy_to_device(ma->token_dev, token, (size_t)ma->rows * sizeof(int));
        ops->copy_to_device(ma->row_dev, ma->row, pairs * sizeof(int));
        ops->copy_to_device(ma->selected_dev, ma->selected, (size_t)ma->E * sizeof(int));
        if (ma->rows > 0) ops->rows_gather(ma->x_dev, ln2, ma->token_dev, ma->rows, ma->C);
        return;
    }
    struct gather_args a = {.dst = ma->x, .src = ln2, .pair = ma->pair, .k = ma->k, .C = ma->C};
    dm_parallel_for(ma->rows, 16, gather_range, &a);
}

/* ---- phase 3: the experts ------------------------------------------------------------- */

/* One expert's tensors (its parameters, or their gradients) from p:
 * w1 (H, C), b1 (H), w2 (C, H), b2 (C). */
struct expert_tensors {
    float *w1, *b1, *w2, *b2;
};

static struct expert_tensors expert_tensors_at(float *p, int C, int H)
{
    struct expert_tensors t = {.w1 = p, .b1 = p + (size_t)H * C};
    t.w2 = t.b1 + H;
    t.b2 = t.w2 + (size_t)C * H;
    return t;
}

const float *moe_expert_weights(const struct block *blk, int e)
{
    const struct block_moe *moe = block_moe_of(blk);
    int owned = moe_owned_experts(&moe->cfg), j = 0;
    while (j < owned && moe_held_expert(moe, j) != e) j++;
    DM_ASSERT(j < owned);   /* a held expert */
    return moe->experts_p + (size_t)j * moe->expert_params;
}

void moe_expert_forward(const struct block *blk, const float *w, const float *x, int n, float *h,
                        float *a, float *y)
{
    const struct block_moe *moe = block_moe_of(blk);
    if (n == 0) return;
    struct expert_tensors p = expert_tensors_at((float *)w, blk->C, moe->cfg.hidden);
    const struct dm_backend *ops = backend_current();
    ops->matmul_forward_gelu(h, a, x, p.w1, p.b1, n, blk->C, moe->cfg.hidden);
    ops->matmul_forward(y, a, p.w2, p.b2, n, moe->cfg.hidden, blk->C);
}

static void moe_experts_forward(struct block *blk, const struct block_moe *moe,
                                struct moe_acts *ma, const void *key)
{
    if (moe->exchange) {
        moe->exchange->experts_forward(moe->exchange->ctx, blk, key, ma->offset, ma->x_dev,
                                       ma->y_dev);
        return;
    }
    int C = blk->C, H = ma->H;
    for (int e = 0; e < ma->E; e++) {
        int r0 = ma->offset[e], n = ma->offset[e + 1] - r0;
        moe_expert_forward(blk, moe_expert_weights(blk, e), ma->x_dev + (size_t)r0 * C, n,
                           ma->h_dev + (size_t)r0 * H, ma->a_dev + (size_t)r0 * H,
                           ma->y_dev + (size_t)r0 * C);
    }
}

static void moe_set_runtime(void *state, const void *runtime)
{
    ((struct block_moe *)state)->exchange = runtime;
}

/* ---- phase 4: combine ----------------------------------------------------------------- */

/* The MLP hook: out = res1 + MoE(ln2) (acts->ln2, acts->res1). */
static void moe_forward(struct block *blk, void *state, struct block_acts *acts, float *out,
                        int N)
{
    struct block_moe *moe = state;
    struct moe_acts *ma = moe_acts_get(acts, moe, N, blk->C);
    ma->n = N;
    moe_route(blk, moe, ma, acts->ln2, N);
    moe_dispatch(ma, acts->ln2, N);
    moe_experts_forward(blk, moe, ma, acts);
    backend_current()->routed_combine_forward(out, acts->res1, ma->y_dev, ma->gate_dev, ma->row_dev,
                                           N, ma->k, ma->C);
    for (int e = 0; e < ma->E; e++) {
        moe->step_tokens[e] += ma->selected[e];
        moe->step_dropped[e] += ma->selected[e] - (ma->offset[e + 1] - ma->offset[e]);
    }
    moe->step_aux += ma->aux;
    moe->step_z += ma->z;
}

/* ---- backward ------------------------------------------------------------------------- */

/* Scratch of the backward, shared by every MoE block (ops run on one
 * thread of control at a time): grow-only. */
static struct grow_buffer back_dy, back_dh, back_dx, back_dgate, back_dlogits, back_dgrads;

void moe_expert_backward(const struct block *blk, const float *w, float *grads, const float *dy,
                         const float *x, const float *h, const float *a, int n, float *dh,
                         float *dx)
{
    const struct block_moe *moe = block_moe_of(blk);
    int C = blk->C, H = moe->cfg.hidden;
    if (n == 0) return;
    struct expert_tensors p = expert_tensors_at((float *)w, C, H);
    struct expert_tensors g = grads ? expert_tensors_at(grads, C, H) : (struct expert_tensors){0};
    const struct dm_backend *ops = backend_current();
    ops->matmul_backward_gelu(dh, g.w2, g.b2, dy, a, p.w2, h, n, H, C);
    ops->matmul_backward_overwrite(dx, g.w1, g.b1, dh, x, p.w1, n, C, H);
}

static void moe_experts_backward(struct block *blk, struct block_moe *moe, struct moe_acts *ma,
                                 const void *key, const float *dy, float *dh, float *dx)
{
    if (moe->exchange) {
        moe->exchange->experts_backward(moe->exchange->ctx, blk, key, ma->offset, dy, dx);
        return;
    }
    /* Each micro-batch's expert gradients are formed from zero and then
     * added to the slab, as an expert-parallel owner forms them for the
     * rank whose rows they are (src/pipe/expert.c): the same bits for
     * every parallel.ep. */
    int C = blk->C, H = ma->H;
    size_t P = moe->expert_params;
    const struct dm_backend *ops = backend_current();
    size_t bytes = (size_t)ma->E * P * sizeof(float);
    float *grads = NULL;
    if (!blk->frozen) {
        grads = ma->device ? ma->dgrads_dev : grow_buffer_get(&back_dgrads, (size_t)ma->E * P);
        if (ma->device) ops->zero(grads, bytes);
        else memset(grads, 0, bytes);
    }
    for (int e = 0; e < ma->E; e++) {
        int r0 = ma->offset[e], n = ma->offset[e + 1] - r0;
        moe_expert_backward(blk, moe_expert_weights(blk, e), grads ? grads + (size_t)e * P : NULL,
                            dy + (size_t)r0 * C, ma->x_dev + (size_t)r0 * C,
                            ma->h_dev + (size_t)r0 * H, ma->a_dev + (size_t)r0 * H, n,
                            dh + (size_t)r0 * H, dx + (size_t)r0 * C);
    }
    if (grads && ma->device)   /* the same sums, element by element */
        ops->residual_forward(moe->experts_g, moe->experts_g, grads, (long)ma->E * (long)P);
    else if (grads)
        for (size_t i = 0; i < (size_t)ma->E * P; i++) moe->experts_g[i] += grads[i];
}

/* The logits' gradient (the table's route_topk_backward, where the
 * routing's arrays are), then the router's product. */
static void route_backward(struct block *blk, struct block_moe *moe, struct block_acts *acts,
                           struct moe_acts *ma, float *d_ln2, float *dlogits, const float *dgate,
                           int N)
{
    const struct dm_backend *ops = backend_current();
    const struct moe_params *cfg = &moe->cfg;
    double alpha = (double)cfg->aux_loss * acts->loss_scale;
    double beta = (double)cfg->z_loss * acts->loss_scale;
    ops->route_topk_backward(dlogits, dgate, ma->logits_dev, ma->scores_dev, ma->lse_dev,
                            ma->choice_dev, ma->gate_dev, ma->selected_dev, N, ma->E, ma->k,
                            cfg->router == MOE_ROUTER_SIGMOID, alpha, beta);
    ops->matmul_backward(d_ln2, blk->frozen ? NULL : moe->router_g, NULL, dlogits, acts->ln2,
                         moe->router_w, N, blk->C, ma->E);
}

/* The four phases backwards, each reading only the next one's output,
 * every one on the table: the combine's and the dispatch's over the
 * routing's row and gate, the route's over its arrays; on a device
 * nothing crosses. */
static void moe_backward(struct block *blk, void *state, struct block_acts *acts, float *d_ln2,
                         const float *dout, int N)
{
    const struct dm_backend *ops = backend_current();
    struct block_moe *moe = state;
    struct moe_acts *ma = *block_ext_acts(acts, &moe_ext_ops);
    DM_ASSERT(ma != NULL && ma->n == N);
    int C = blk->C, H = ma->H, E = ma->E, k = ma->k;
    float *dy = ma->dy_dev, *dh = ma->dh_dev, *dx = ma->dx_dev, *dgate = ma->dgate_dev;
    float *dlogits = ma->dlogits_dev;
    if (!ma->device) {
        size_t rows = (size_t)(ma->rows ? ma->rows : 1);
        dy = grow_buffer_get(&back_dy, rows * C);
        dh = grow_buffer_get(&back_dh, rows * H);
        dx = grow_buffer_get(&back_dx, rows * C);
        dgate = grow_buffer_get(&back_dgate, (size_t)N * k);
        dlogits = grow_buffer_get(&back_dlogits, (size_t)N * E);
    }
    ops->routed_combine_backward(dy, dgate, dout, ma->y_dev, ma->gate_dev, ma->row_dev, N, k, C);
    moe_experts_backward(blk, moe, ma, acts, dy, dh, dx);
    ops->routed_dispatch_backward(d_ln2, dx, ma->row_dev, N, k, C);
    route_backward(blk, moe, acts, ma, d_ln2, dlogits, dgate, N);
}

/* ---- once a step (the extension's step hooks) -------------------------------------------
 * Once a step, around its micro-batches: begin_step zeroes the block's
 * step counts and loss values; each forward counts into them; the caller
 * sums the step values over the data-parallel replicas (the model never
 * calls MPI; the pipeline engine does it after the gradient reduction)
 * and hands the sums to end_step, which keeps them as the block's
 * last-step counts and moves a sigmoid router's bias by bias_rate x
 * sign(mean count - count_i) (DeepSeek-V3's auxiliary-loss-free
 * balancing). The same sums on every replica give the same bias
 * everywhere. A block's values: routed token-expert pairs per expert (E),
 * dropped ones (E), the aux loss and the z-loss summed over the forwards. */
#define MOE_STEP_VALUES(E) (2 * (E) + 2)

static void moe_begin_step(void *state)
{
    struct block_moe *moe = state;
    memset(moe->step_tokens, 0, 2 * (size_t)moe->cfg.experts * sizeof(int64_t));
    moe->step_aux = moe->step_z = 0.0;
}

static int moe_step_values(const void *state, double *v)
{
    const struct block_moe *moe = state;
    int E = moe->cfg.experts;
    if (v) {
        for (int e = 0; e < E; e++) {
            v[e] = (double)moe->step_tokens[e];
            v[E + e] = (double)moe->step_dropped[e];
        }
        v[2 * E] = moe->step_aux;
        v[2 * E + 1] = moe->step_z;
    }
    return MOE_STEP_VALUES(E);
}

static void moe_end_step(struct block *blk, void *state, const double *v)
{
    struct block_moe *moe = state;
    int E = moe->cfg.experts;
    for (int e = 0; e < E; e++) {
        moe->tokens[e] = (int64_t)v[e];
        moe->dropped[e] = (int64_t)v[E + e];
    }
    moe->aux = v[2 * E];
    moe->z = v[2 * E + 1];
    block_moe_update_bias(blk, v);
}

double gpt_moe_balance_loss(const struct gpt *model)
{
    double sum = 0.0;
    for (int i = 0; i < model->num_blocks; i++) {
        const struct block_moe *moe = block_moe_of(&model->blocks[i]);
        if (moe) sum += moe->step_aux + moe->step_z;
    }
    return sum;
}

void block_moe_update_bias(struct block *blk, const double *tokens)
{
    struct block_moe *moe = block_moe_of(blk);
    if (!moe || moe->cfg.router != MOE_ROUTER_SIGMOID || !(moe->cfg.bias_rate > 0.0f)) return;
    int E = moe->cfg.experts;
    double mean = 0.0;
    for (int e = 0; e < E; e++) mean += tokens[e];
    mean /= E;
    for (int e = 0; e < E; e++) {
        double gap = mean - tokens[e];
        float sign = gap > 0.0 ? 1.0f : gap < 0.0 ? -1.0f : 0.0f;
        moe->bias[e] += moe->cfg.bias_rate * sign;
    }
}

/* ---- parameters split over ranks (expert parallelism) --------------------------------- */

/* Every replica of a stage holds the shared tensors and the router; the
 * experts, when split over an expert group, only their holders. */
static size_t moe_replicated_floats(const struct block *blk, const void *state)
{
    const struct block_moe *moe = state;
    if (moe->cfg.shard_count == 0) return blk->nparams;
    return moe_shared_param_count(blk->C) + (size_t)moe->cfg.experts * (size_t)blk->C;
}

static int moe_shard_units(const struct gpt_ext *ext, const struct gpt_shape *shape, int index)
{
    (void)shape;
    (void)index;
    return ((const struct moe_params *)ext->params)->experts;
}

static int moe_held_part(const void *state, int j)
{
    return moe_held_expert(state, j);
}

static int moe_held_parts(const void *state)
{
    return moe_owned_experts(&((const struct block_moe *)state)->cfg);
}

/* The shared tensors' and router's sum of squares (returned) and each held
 * expert's in slot order (parts[j] for the j-th held expert), so that
 * the owners of an expert-parallel stage's experts can each contribute
 * their own experts' terms and the sum is the same bits as one rank
 * holding them all. With balance.units = sublayer (blk->halves set) the
 * attention half's floats and the MLP half's shared ones (ln2, the
 * router) are summed apart and added, each half's where it is (an
 * attention half's experts count 0), so that a block split over two
 * stages gives the bits of one held whole. */
static double moe_grad_sumsq_parts(const struct block *blk, const void *state, double *parts)
{
    const struct dm_backend *ops = backend_current();
    const struct block_moe *moe = state;
    int owned = moe_owned_experts(&moe->cfg), mlp = blk->halves != BLOCK_HALF_ATTENTION;
    for (int j = 0; j < owned; j++)
        parts[j] = blk->frozen || !mlp
                       ? 0.0
                       : ops->sum_squares(moe->experts_g + (size_t)j * moe->expert_params,
                                          (long)moe->expert_params);
    if (blk->frozen) return 0.0;
    size_t shared = moe_shared_param_count(blk->C) + (size_t)moe->cfg.experts * (size_t)blk->C;
    if (!blk->halves) return ops->sum_squares(blk->grads, (long)shared);
    size_t offset, attention;
    block_half_range(blk, BLOCK_HALF_ATTENTION, &offset, &attention);
    double sum = 0.0;
    if (blk->halves != BLOCK_HALF_MLP) sum += ops->sum_squares(blk->grads, (long)attention);
    if (mlp) sum += ops->sum_squares(blk->grads + attention, (long)(shared - attention));
    return sum;
}

/* ---- its tensors ----------------------------------------------------------------------- */

static int moe_tensor_count(const void *state)
{
    return 1 + 4 * moe_owned_experts(&((const struct block_moe *)state)->cfg);
}

/* The router (a matrix), then per held expert fc_w fc_b fcproj_w fcproj_b;
 * offsets from the extension's floats (after the shared tensors). */
static int moe_tensor_at(const void *state, int k, size_t *offset, size_t *size)
{
    const struct block_moe *moe = state;
    size_t E = (size_t)moe->cfg.experts, H = (size_t)moe->cfg.hidden;
    size_t c = (size_t)(moe->experts_p - moe->router_w) / E;   /* C */
    if (k == 0) {
        *offset = 0;
        *size = E * c;
        return 1;
    }
    int e = (k - 1) / 4, part = (k - 1) % 4;
    size_t at = E * c + (size_t)e * moe->expert_params;
    static const int matrix[4] = {1, 0, 1, 0};   /* fc_w fc_b fcproj_w fcproj_b */
    size_t sizes[4] = {H * c, H, c * H, c};
    for (int i = 0; i < part; i++) at += sizes[i];
    *offset = at;
    *size = sizes[part];
    return matrix[part];
}

const struct gpt_ext_ops moe_ext_ops = {
    .name = "moe",
    .block_noun = "a mixture of experts",
    .owned_text = "is one (and is never pruned)",
    .not_owned_text = "is dense",
    .pack_flag = MOE_PACK_FLAG,
    .replaces_mlp = 1,
    .never_pruned = 1,
    .owns = moe_owns,
    .floats = moe_floats,
    .alloc = moe_alloc,
    .free = moe_free,
    .init_weights = moe_init_weights,
    .tensor_count = moe_tensor_count,
    .tensor_at = moe_tensor_at,
    .pack_bytes = moe_pack_bytes,
    .pack = moe_pack,
    .unpack = moe_unpack,
    .mlp_forward = moe_forward,
    .mlp_backward = moe_backward,
    .acts_free = moe_acts_free,
    .begin_step = moe_begin_step,
    .step_values = moe_step_values,
    .end_step = moe_end_step,
    .replicated_floats = moe_replicated_floats,
    .shard_units = moe_shard_units,
    .held_part = moe_held_part,
    .held_parts = moe_held_parts,
    .grad_sumsq_parts = moe_grad_sumsq_parts,
    .set_runtime = moe_set_runtime,
};
