/* Early exit inside the model (dyn.kind=early_exit; the policy lives in
 * src/dyn/early_exit.c): per-token exit heads, the exit decision, and a
 * transformer block that computes only the tokens still active.
 *
 * exit_layer[n] (per micro-batch, travels with the activation between
 * stages) is the global block after which token n left, or `layers` while
 * it is active; token n is computed by block l iff exit_layer[n] >= l.
 * A block with Na < N active tokens (block_forward_rows):
 *   - ln1 and the K, V projections for all N tokens: exited tokens' copied
 *     states still serve as keys and values of the active ones (CALM's
 *     state propagation); Q for the Na active tokens only;
 *   - attention only for the Na active queries (each against the keys up
 *     to its own position);
 *   - attention projection, ln2 and the MLP on the Na gathered rows;
 *   - out = in for exited tokens (the copy forward), scattered results for
 *     active ones.
 * So the matmul work of a token that left falls from 12C^2 to 2C^2 per
 * block, and to nothing once every token of the micro-batch has left.
 *
 * Exit heads: after block l, from exit.from to layers-2, the shared LM head
 * (final norm + tied wte, read-only here: struct gpt_exit points at a copy)
 * predicts every token active at l. Its loss joins the training loss with
 * CALM's weights proportional to depth:
 *   loss = L_final + lambda * sum_l w_l L_l,  w_l = (l+1) / sum_{j=from}^{layers-1} (j+1)
 * where L_l is the cross-entropy summed over the tokens active at l and
 * divided by all B*T tokens. The gradient of the exit losses flows into
 * the blocks, not into the head's weights (the head is trained by the
 * final loss alone). The confidence is the softmax response (top-1 minus
 * top-2 probability of the exit head) or the saturation (cosine of the
 * hidden state before and after the block); a token exits after block l
 * when exit.allow is set and its confidence is at least the threshold.
 *
 * Every decision is a pure function of the numbers, never of timing or of
 * where the block runs. Nothing here calls MPI. */
#include <math.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/exit_confidence.h"
#include "dynmo/model.h"
#include "model/internal.h"

/* The decisions are the host's (exit_layer, the row lists); the tensors
 * the ops touch are the backend's, and on a device the host reads what it
 * decides from through the staging of struct exit_acts (NULL on the CPU,
 * which reads the tensors in place). */
struct exit_block_state {
    int *rows;          /* (N) active tokens at the block's input, ascending (host) */
    int *rows_device;   /* (N) the same for the ops (rows itself on the CPU) */
    int nactive;
    int head;           /* this block has an exit head in this forward */
    float *hc;          /* (N,C) gathered block outputs of active tokens */
    float *lnf, *mean, *rstd;  /* (N,C),(N),(N) */
    float *probs;       /* (N,V) */
    int *targets;       /* (N) gathered targets */
};

struct exit_acts {
    int N, C, V, num_blocks;
    int *exit_layer;    /* (N) host: travels with the activation between stages */
    float *work, *work2;        /* (N,C) each */
    float *logits;      /* (N,V) */
    float *losses;      /* (N) */
    float *confidence;  /* (N) of a block's active tokens */
    struct exit_block_state *blocks;
    /* host staging on a device: targets (N), losses (N), confidence (N) */
    int *targets_host;
    float *losses_host, *confidence_host;
};

static void exit_blocks_alloc(struct exit_acts *ea, int nb)
{
    const struct dm_backend *ops = backend_current();
    size_t N = (size_t)ea->N, C = (size_t)ea->C, V = (size_t)ea->V;
    ea->blocks = dm_alloc((size_t)(nb ? nb : 1) * sizeof *ea->blocks);
    for (int i = 0; i < nb; i++) {
        struct exit_block_state *b = &ea->blocks[i];
        b->rows = dm_alloc(N * sizeof(int));
        b->rows_device = ops->host_access ? b->rows : ops->alloc(N * sizeof(int));
        b->targets = ops->alloc(N * sizeof(int));
        b->hc = ops->alloc(N * C * sizeof(float));
        b->lnf = ops->alloc(N * C * sizeof(float));
        b->mean = ops->alloc(N * sizeof(float));
        b->rstd = ops->alloc(N * sizeof(float));
        b->probs = ops->alloc(N * V * sizeof(float));
    }
    ea->num_blocks = nb;
}

static void exit_blocks_free(struct exit_acts *ea)
{
    const struct dm_backend *ops = backend_current();
    for (int i = 0; i < ea->num_blocks; i++) {
        struct exit_block_state *b = &ea->blocks[i];
        if (b->rows_device != b->rows) ops->free(b->rows_device);
        dm_free(b->rows);
        void *device[] = {b->targets, b->hc, b->lnf, b->mean, b->rstd, b->probs};
        for (size_t k = 0; k < sizeof device / sizeof device[0]; k++) ops->free(device[k]);
    }
    dm_free(ea->blocks);
    ea->blocks = NULL;
    ea->num_blocks = 0;
}

/* The tensors of ea's exit heads and the host's staging of them. */
static void exit_tensors_alloc(struct exit_acts *ea)
{
    const struct dm_backend *ops = backend_current();
    size_t N = (size_t)ea->N, C = (size_t)ea->C, V = (size_t)ea->V;
    ea->work = ops->alloc(N * C * sizeof(float));
    ea->work2 = ops->alloc(N * C * sizeof(float));
    ea->logits = ops->alloc(N * V * sizeof(float));
    ea->losses = ops->alloc(N * sizeof(float));
    ea->confidence = ops->alloc(N * sizeof(float));
    ea->targets_host = backend_staging(N * sizeof(int));
    ea->losses_host = backend_staging(N * sizeof(float));
    ea->confidence_host = backend_staging(N * sizeof(float));
}

static void exit_tensors_free(struct exit_acts *ea)
{
    const struct dm_backend *ops = backend_current();
    void *device[] = {ea->work, ea->work2, ea->logits, ea->losses, ea->confidence};
    for (size_t k = 0; k < sizeof device / sizeof device[0]; k++) ops->free(device[k]);
    void *staging[] = {ea->targets_host, ea->losses_host, ea->confidence_host};
    for (size_t k = 0; k < sizeof staging / sizeof staging[0]; k++)
        backend_staging_free(staging[k]);
}

static struct exit_acts *exit_acts_get(const struct gpt *model, struct gpt_acts *acts)
{
    struct exit_acts *ea = acts->exit;
    if (!ea) {
        ea = dm_alloc(sizeof *ea);
        ea->N = acts->B * acts->T;
        ea->C = model->shape.channels;
        ea->V = gpt_vocab_used(&model->shape);
        size_t N = (size_t)ea->N;
        ea->exit_layer = dm_alloc(N * sizeof(int));
        for (size_t n = 0; n < N; n++) ea->exit_layer[n] = model->shape.layers;
        exit_tensors_alloc(ea);
        exit_blocks_alloc(ea, model->num_blocks);
        acts->exit = ea;
    }
    if (ea->num_blocks != model->num_blocks) {   /* after a migration */
        exit_blocks_free(ea);
        exit_blocks_alloc(ea, model->num_blocks);
    }
    return ea;
}

int *gpt_exit_layers(const struct gpt *model, struct gpt_acts *acts)
{
    return exit_acts_get(model, acts)->exit_layer;
}

void exit_acts_free(struct gpt_acts *acts)
{
    struct exit_acts *ea = acts->exit;
    if (!ea) return;
    exit_blocks_free(ea);
    dm_free(ea->exit_layer);
    exit_tensors_free(ea);
    dm_free(ea);
    acts->exit = NULL;
}

/* ---- a block over the active rows --------------------------------------------- */

/* The CPU backend's row gathers (include/dynmo/backend.h's rows_gather,
 * rows_scatter; the model calls them through the table). */
void rows_gather(float *dst, const float *src, const int *rows, int n, int C)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * C, src + (size_t)rows[i] * C, (size_t)C * sizeof(float));
}

void rows_scatter(float *dst, const float *src, const int *rows, int n, int C, int add)
{
    for (int i = 0; i < n; i++) {
        float *row = dst + (size_t)rows[i] * C;
        const float *from = src + (size_t)i * C;
        if (add)
            for (int c = 0; c < C; c++) row[c] += from[c];
        else
            memcpy(row, from, (size_t)C * sizeof(float));
    }
}

/* ---- the confidence of the active tokens --------------------------------------- */

/* The CPU backend's confidences (include/dynmo/backend.h's
 * exit_softmax_confidence, exit_saturation_confidence; the model calls
 * them through the table). */
void exit_softmax_confidence(float *conf, const float *probs, int n, int V)
{
    for (int k = 0; k < n; k++) conf[k] = exit_softmax_confidence_of(probs + (size_t)k * V, V);
}

void exit_saturation_confidence(float *conf, const float *in, const float *out,
                                const int *rows, int n, int C)
{
    for (int k = 0; k < n; k++) {
        size_t row = (size_t)rows[k] * C;
        conf[k] = exit_saturation_of(in + row, out + row, C);
    }
}

/* In a block with exited tokens, acts->qkv holds K|V of every token
 * ((N,2C), rows as the tokens) followed by Q of the active ones ((Na,C),
 * compact), and the backward's d_qkv the same layout for dK|dV and dQ. The
 * weight W_qkv (3C,C) is Q's C rows then K's and V's, so the two parts are
 * plain matmuls on the first C and the last 2C rows of it.
 *
 * The block in two parts split at the residual stream after attention,
 * which a stage boundary may cut (balance.units = sublayer): the
 * attention part leaves the active rows of that stream in acts->res1
 * (Na,C), the MLP part maps them to the block output's active rows in
 * work; backward, the MLP part leaves their gradient in s->d_res1 (Na,C),
 * from which the attention part computes s->d_ln (N,C). The whole block
 * and its halves run the same parts: the same bits. */
static void attention_rows_forward(struct block *blk, struct block_acts *acts, const float *in,
                                   int B, int T, const int *rows, int Na, float *work)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, NH = blk->NH, N = B * T;
    float *const *p = blk->p;
    float *kv = acts->qkv, *q = acts->qkv + (size_t)N * 2 * C;
    ops->layernorm_forward(acts->ln1, acts->ln1_mean, acts->ln1_rstd, in,
                           p[BP_LN1_W], p[BP_LN1_B], N, C);
    ops->matmul_forward(kv, acts->ln1, p[BP_QKV_W] + (size_t)C * C, p[BP_QKV_B] + C, N, C, 2 * C);
    ops->rows_gather(work, acts->ln1, rows, Na, C);
    ops->matmul_forward(q, work, p[BP_QKV_W], p[BP_QKV_B], Na, C, C);
    ops->attention_forward_rows(acts->atty, acts->att, q, kv, rows, Na, B, T, C, NH);
    ops->matmul_forward(acts->res1, acts->atty, p[BP_ATTPROJ_W], p[BP_ATTPROJ_B], Na, C, C);
    ops->rows_gather(work, in, rows, Na, C);
    ops->residual_forward(acts->res1, acts->res1, work, (long)Na * C);
}

static void mlp_rows_forward(struct block *blk, struct block_acts *acts, int Na, float *work)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C;
    float *const *p = blk->p;
    ops->layernorm_forward(acts->ln2, acts->ln2_mean, acts->ln2_rstd, acts->res1,
                           p[BP_LN2_W], p[BP_LN2_B], Na, C);
    ops->matmul_forward(acts->fch, acts->ln2, p[BP_FC_W], p[BP_FC_B], Na, C, 4 * C);
    ops->gelu_forward(acts->fch_gelu, acts->fch, (long)Na * 4 * C);
    ops->matmul_forward(work, acts->fch_gelu, p[BP_FCPROJ_W], p[BP_FCPROJ_B], Na, 4 * C, C);
    ops->residual_forward(work, work, acts->res1, (long)Na * C);
}

static float *const no_grads[BP_COUNT];

static float *const *rows_grads(const struct block *blk)
{
    return blk->frozen ? no_grads : blk->g;
}

/* Where the rows' backward keeps the output gradients of its weighted
 * ops: the scratch, or with w (the zero-bubble schedule's input part)
 * w's buffers, which the weight part reads later. The same ops on the
 * same values either way. */
struct rows_at {
    float *d_fch, *d_ln2, *d_res1, *d_qkv, *d_ln1;
};

static struct rows_at rows_at(struct block_scratch *s, struct block_wgrad *w)
{
    if (w) return (struct rows_at){w->d_fch, w->d_ln2, w->d_res1, w->d_qkv, w->d_ln1};
    return (struct rows_at){s->d_fch, s->d_ln, s->d_res1, s->d_qkv, s->d_ln};
}

/* dout_c: the output gradient's active rows (Na,C); the weight gradients
 * into g (no_grads: none). */
static void mlp_rows_backward(struct block *blk, struct block_acts *acts, struct rows_at at,
                              const float *dout_c, int Na, float *const *g)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C;
    float *const *p = blk->p;
    ops->matmul_backward_overwrite(at.d_fch, g[BP_FCPROJ_W], g[BP_FCPROJ_B], dout_c,
                                   acts->fch_gelu, p[BP_FCPROJ_W], Na, 4 * C, C);
    ops->gelu_backward(at.d_fch, acts->fch, at.d_fch, (long)Na * 4 * C);
    ops->matmul_backward_overwrite(at.d_ln2, g[BP_FC_W], g[BP_FC_B], at.d_fch, acts->ln2,
                                   p[BP_FC_W], Na, C, 4 * C);
    ops->layernorm_backward_residual(at.d_res1, dout_c, g[BP_LN2_W], g[BP_LN2_B], at.d_ln2,
                                     acts->res1, p[BP_LN2_W], acts->ln2_mean, acts->ln2_rstd,
                                     Na, C);
}

/* From at.d_res1 to at.d_ln1; then din from dres (N,C: the residual
 * gradient, the block output's for exited tokens, d_res1 for active
 * ones). */
static void attention_rows_backward(struct block *blk, struct block_acts *acts,
                                    struct block_scratch *s, struct rows_at at, float *din,
                                    const float *dres, const float *in, int B, int T,
                                    const int *rows, int Na, float *const *g)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, NH = blk->NH, N = B * T;
    float *const *p = blk->p;
    ops->matmul_backward_overwrite(s->d_atty, g[BP_ATTPROJ_W], g[BP_ATTPROJ_B], at.d_res1,
                                   acts->atty, p[BP_ATTPROJ_W], Na, C, C);
    const float *kv = acts->qkv, *q = acts->qkv + (size_t)N * 2 * C;
    float *dkv = at.d_qkv, *dq = at.d_qkv + (size_t)N * 2 * C;
    ops->attention_backward_rows(dq, dkv, s->d_att, s->d_atty, q, kv, acts->att, rows, Na, B, T, C,
                                 NH);
    /* K and V from every token, Q from the active ones; the scratch's
     * d_fch (N,4C) is free by now and holds the gathered ln1 rows and
     * their gradient. */
    float *gw = g[BP_QKV_W], *gb = g[BP_QKV_B];
    ops->matmul_backward_overwrite(at.d_ln1, gw ? gw + (size_t)C * C : NULL, gb ? gb + C : NULL,
                                   dkv, acts->ln1, p[BP_QKV_W] + (size_t)C * C, N, C, 2 * C);
    float *ln1_c = s->d_fch, *dln1_c = s->d_fch + (size_t)Na * C;
    ops->rows_gather(ln1_c, acts->ln1, rows, Na, C);
    ops->matmul_backward_overwrite(dln1_c, gw, gb, dq, ln1_c, p[BP_QKV_W], Na, C, C);
    ops->rows_scatter(at.d_ln1, dln1_c, rows, Na, C, 1);
    ops->layernorm_backward_residual(din, dres, g[BP_LN1_W], g[BP_LN1_B], at.d_ln1, in,
                                     p[BP_LN1_W], acts->ln1_mean, acts->ln1_rstd, N, C);
}

void block_forward_rows(struct block *blk, struct block_acts *acts, float *out, const float *in,
                        int B, int T, const int *rows, int nactive, float *work)
{
    const struct dm_backend *ops = backend_current();
    DM_ASSERT(blk->ext_count == 0);   /* dyn_config_validate: no early exit with extensions */
    ops->copy_on_device(out, in, (size_t)B * T * blk->C * sizeof(float));   /* exited: copied */
    if (nactive == 0) return;
    attention_rows_forward(blk, acts, in, B, T, rows, nactive, work);
    mlp_rows_forward(blk, acts, nactive, work);
    ops->rows_scatter(out, work, rows, nactive, blk->C, 0);
}

/* block_backward_rows, or with w its input part (the weight gradients
 * left to rows_backward_weight; the output gradient's rows kept in
 * w->dout). */
static void rows_backward(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                          float *din, const float *dout, const float *in, int B, int T,
                          const int *rows, int Na, float *work, struct block_wgrad *w)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    struct rows_at at = rows_at(s, w);
    float *const *g = w ? no_grads : rows_grads(blk);
    float *dout_c = w ? w->dout : work;        /* (Na,C); work then the full residual gradient */
    ops->rows_gather(dout_c, dout, rows, Na, C);
    mlp_rows_backward(blk, acts, at, dout_c, Na, g);
    /* Residual gradient: dout for exited tokens, d_res1 for active ones
     * (written after the MLP part has read dout_c: the attention part
     * reads no work but dres). */
    float *dres = work;
    ops->copy_on_device(dres, dout, (size_t)N * C * sizeof(float));
    ops->rows_scatter(dres, at.d_res1, rows, Na, C, 0);
    attention_rows_backward(blk, acts, s, at, din, dres, in, B, T, rows, Na, g);
}

void block_backward_rows(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                         float *din, const float *dout, const float *in, int B, int T,
                         const int *rows, int nactive, float *work)
{
    if (nactive == 0) {
        if (din && din != dout)
            backend_current()->copy_on_device(din, dout, (size_t)B * T * blk->C * sizeof(float));
        return;
    }
    rows_backward(blk, acts, s, din, dout, in, B, T, rows, nactive, work, NULL);
}

/* The weight part of rows_backward with w: each weighted op once more for
 * its weight gradients, from what the input part kept (the ln1 rows
 * gathered again into w->dout, free by then). */
static void rows_backward_weight(struct block *blk, const struct block_acts *acts,
                                 const struct block_wgrad *w, const float *in, int B, int T,
                                 const int *rows, int Na)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    float *const *g = blk->g;
    ops->matmul_backward(NULL, g[BP_FCPROJ_W], g[BP_FCPROJ_B], w->dout, acts->fch_gelu, NULL, Na,
                         4 * C, C);
    ops->matmul_backward(NULL, g[BP_FC_W], g[BP_FC_B], w->d_fch, acts->ln2, NULL, Na, C, 4 * C);
    ops->layernorm_backward_residual(NULL, NULL, g[BP_LN2_W], g[BP_LN2_B], w->d_ln2, acts->res1,
                                     NULL, acts->ln2_mean, acts->ln2_rstd, Na, C);
    ops->matmul_backward(NULL, g[BP_ATTPROJ_W], g[BP_ATTPROJ_B], w->d_res1, acts->atty, NULL, Na,
                         C, C);
    const float *dkv = w->d_qkv, *dq = w->d_qkv + (size_t)N * 2 * C;
    ops->matmul_backward(NULL, g[BP_QKV_W] + (size_t)C * C, g[BP_QKV_B] + C, dkv, acts->ln1, NULL,
                         N, C, 2 * C);
    float *ln1_c = w->dout;
    ops->rows_gather(ln1_c, acts->ln1, rows, Na, C);
    ops->matmul_backward(NULL, g[BP_QKV_W], g[BP_QKV_B], dq, ln1_c, NULL, Na, C, C);
    ops->layernorm_backward_residual(NULL, NULL, g[BP_LN1_W], g[BP_LN1_B], w->d_ln1, in, NULL,
                                     acts->ln1_mean, acts->ln1_rstd, N, C);
}

/* ---- one half of a block with exited tokens (balance.units = sublayer) ----------
 * The attention half maps the block input to the residual stream after
 * attention (exited tokens copied, active ones their res1 rows), the MLP
 * half that stream to the block output, taking its active rows back as
 * acts->res1; backward, the gradient of that stream (the block output's
 * for exited tokens, d_res1 for active ones). Which tokens are active
 * both halves read from exit_layer, which travels with the stream. */

static void attention_half_forward_rows(struct block *blk, struct block_acts *acts, float *out,
                                        const float *in, int B, int T, const int *rows, int Na,
                                        float *work)
{
    const struct dm_backend *ops = backend_current();
    ops->copy_on_device(out, in, (size_t)B * T * blk->C * sizeof(float));
    if (Na == 0) return;
    attention_rows_forward(blk, acts, in, B, T, rows, Na, work);
    ops->rows_scatter(out, acts->res1, rows, Na, blk->C, 0);
}

static void mlp_half_forward_rows(struct block *blk, struct block_acts *acts, float *out,
                                  const float *in, int B, int T, const int *rows, int Na,
                                  float *work)
{
    const struct dm_backend *ops = backend_current();
    ops->copy_on_device(out, in, (size_t)B * T * blk->C * sizeof(float));
    if (Na == 0) return;
    ops->rows_gather(acts->res1, in, rows, Na, blk->C);
    mlp_rows_forward(blk, acts, Na, work);
    ops->rows_scatter(out, work, rows, Na, blk->C, 0);
}

/* din may alias dout: dout's rows are gathered before din is written. */
static void mlp_half_backward_rows(struct block *blk, struct block_acts *acts,
                                   struct block_scratch *s, float *din, const float *dout, int B,
                                   int T, const int *rows, int Na, float *work)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C;
    if (Na > 0) {
        ops->rows_gather(work, dout, rows, Na, C);
        mlp_rows_backward(blk, acts, rows_at(s, NULL), work, Na, rows_grads(blk));
    }
    if (!din) return;
    if (din != dout) ops->copy_on_device(din, dout, (size_t)B * T * C * sizeof(float));
    if (Na > 0) ops->rows_scatter(din, s->d_res1, rows, Na, C, 0);
}

/* dout is the residual gradient already; din may alias it (it is copied
 * into work first). */
static void attention_half_backward_rows(struct block *blk, struct block_acts *acts,
                                         struct block_scratch *s, float *din, const float *dout,
                                         const float *in, int B, int T, const int *rows, int Na,
                                         float *work)
{
    const struct dm_backend *ops = backend_current();
    size_t bytes = (size_t)B * T * blk->C * sizeof(float);
    if (Na == 0) {
        if (din && din != dout) ops->copy_on_device(din, dout, bytes);
        return;
    }
    ops->rows_gather(s->d_res1, dout, rows, Na, blk->C);
    ops->copy_on_device(work, dout, bytes);
    attention_rows_backward(blk, acts, s, rows_at(s, NULL), din, work, in, B, T, rows, Na,
                            rows_grads(blk));
}

/* One half (blk->halves) of block i: every token active, the dense half
 * (block_forward); else the rows' half. */
static void half_forward(struct block *blk, struct block_acts *a, float *out, const float *in,
                         int B, int T, const int *rows, int Na, float *work)
{
    if (Na == B * T) block_forward(blk, a, out, in, B, T);
    else if (blk->halves == BLOCK_HALF_ATTENTION)
        attention_half_forward_rows(blk, a, out, in, B, T, rows, Na, work);
    else
        mlp_half_forward_rows(blk, a, out, in, B, T, rows, Na, work);
}

static void half_backward(struct block *blk, struct block_acts *a, struct block_scratch *s,
                          float *din, const float *dout, const float *in, int B, int T,
                          const int *rows, int Na, float *work)
{
    if (Na == B * T) block_backward(blk, a, s, din, dout, in, B, T);
    else if (blk->halves == BLOCK_HALF_ATTENTION)
        attention_half_backward_rows(blk, a, s, din, dout, in, B, T, rows, Na, work);
    else
        mlp_half_backward_rows(blk, a, s, din, dout, B, T, rows, Na, work);
}

/* Block i of a sublayer run: a half as it is, or a block held whole as
 * its attention half then its MLP half, each timed (gpt.c's
 * forward_units). Between them the stream after attention: a->res1 with
 * every token active (as gpt.c), else the exit scratch work2 (res1 holds
 * the active rows). */
static void units_forward(struct gpt *model, struct gpt_acts *acts, struct exit_acts *ea, int i,
                          float *out, const float *in, const int *rows, int Na)
{
    struct block *blk = &model->blocks[i];
    struct block_acts *a = &acts->blocks[i];
    int B = acts->B, T = acts->T;
    double t0 = dm_profile_now();
    if (blk->halves != BLOCK_HALVES) {
        half_forward(blk, a, out, in, B, T, rows, Na, ea->work);
        if (blk->halves == BLOCK_HALF_ATTENTION) model->attention_fwd_s[i] += dm_profile_now() - t0;
        return;
    }
    float *stream = Na == B * T ? a->res1 : ea->work2;
    blk->halves = BLOCK_HALF_ATTENTION;
    half_forward(blk, a, stream, in, B, T, rows, Na, ea->work);
    model->attention_fwd_s[i] += dm_profile_now() - t0;
    blk->halves = BLOCK_HALF_MLP;
    half_forward(blk, a, out, stream, B, T, rows, Na, ea->work);
    blk->halves = BLOCK_HALVES;
}

/* The backward of units_forward: the stream's gradient between the
 * halves in the scratch's d_res1 with every token active (as gpt.c),
 * else in work2 (free once the exit head's gradient is added). */
static void units_backward(struct gpt *model, struct gpt_acts *acts, struct exit_acts *ea,
                           struct block_scratch *s, int i, float *din, const float *dout,
                           const float *in, const int *rows, int Na)
{
    struct block *blk = &model->blocks[i];
    struct block_acts *a = &acts->blocks[i];
    int B = acts->B, T = acts->T, all = Na == B * T;
    if (blk->halves != BLOCK_HALVES) {
        double t0 = dm_profile_now();
        half_backward(blk, a, s, din, dout, in, B, T, rows, Na, ea->work);
        if (blk->halves == BLOCK_HALF_ATTENTION) model->attention_bwd_s[i] += dm_profile_now() - t0;
        return;
    }
    blk->halves = BLOCK_HALF_MLP;
    half_backward(blk, a, s, all ? NULL : ea->work2, dout, all ? a->res1 : NULL, B, T, rows, Na,
                  ea->work);
    double t0 = dm_profile_now();
    blk->halves = BLOCK_HALF_ATTENTION;
    half_backward(blk, a, s, din, all ? s->d_res1 : ea->work2, in, B, T, rows, Na, ea->work);
    model->attention_bwd_s[i] += dm_profile_now() - t0;
    blk->halves = BLOCK_HALVES;
}

/* ---- the model's hooks ------------------------------------------------------------ */

void exit_begin_forward(struct gpt *model, struct gpt_acts *acts)
{
    struct exit_acts *ea = exit_acts_get(model, acts);
    if (model->has_embed)
        for (int n = 0; n < ea->N; n++)
            ea->exit_layer[n] = model->exit->forced ? model->exit->forced[n] : model->shape.layers;
}

static float exit_weight(const struct gpt *model, int layer)
{
    int L = model->shape.layers;
    double total = 0.0;
    for (int j = model->exit->from; j < L; j++) total += j + 1;
    return (float)(model->exit->loss_weight * (layer + 1) / total);
}

static int has_exit_head(const struct gpt *model, int layer)
{
    const struct gpt_exit *x = model->exit;
    int L = model->shape.layers;
    if (layer < x->from || layer >= L - 1) return 0;
    return x->loss_weight > 0.0f || x->confidence == GPT_EXIT_SOFTMAX;
}

/* Block i's exit head over its active rows: the gathered targets go up,
 * the losses come down and their weighted sum joins exit_loss_sum. */
static void exit_head_forward(struct gpt *model, struct gpt_acts *acts, struct exit_acts *ea,
                              struct exit_block_state *st, int layer, const float *out)
{
    const struct dm_backend *ops = backend_current();
    const struct gpt_exit *x = model->exit;
    int N = acts->B * acts->T, C = ea->C, V = ea->V, Na = st->nactive;
    ops->rows_gather(st->hc, out, st->rows_device, Na, C);
    const int *targets = acts->targets_host ? acts->targets_host : acts->targets;
    int *gathered = backend_write_begin(ea->targets_host, st->targets);
    for (int k = 0; k < Na; k++) gathered[k] = targets[st->rows[k]];
    backend_write_end(st->targets, gathered, (size_t)Na * sizeof(int));
    ops->layernorm_forward(st->lnf, st->mean, st->rstd, st->hc, x->lnf_w, x->lnf_b, Na, C);
    ops->matmul_forward(ea->logits, st->lnf, x->wte, NULL, Na, C, V);
    ops->crossentropy_forward(ea->losses, st->probs, ea->logits, st->targets, Na, V);
    const float *losses = backend_read(ea->losses_host, ea->losses, (size_t)Na * sizeof(float));
    double sum = 0.0;
    for (int k = 0; k < Na; k++) sum += losses[k];
    model->exit->exit_loss_sum += exit_weight(model, layer) * sum / N;
}

/* Which of block i's active tokens leave after it: the backend computes
 * their confidence from the exit head's probabilities or the block's
 * input and output rows, and only those Na floats come down. */
static void exit_decide(const struct gpt_exit *x, struct exit_acts *ea,
                        const struct exit_block_state *st, int layer, const float *out,
                        const float *in)
{
    const struct dm_backend *ops = backend_current();
    int Na = st->nactive;
    if (Na == 0) return;
    if (x->confidence == GPT_EXIT_SOFTMAX)
        ops->exit_softmax_confidence(ea->confidence, st->probs, Na, ea->V);
    else
        ops->exit_saturation_confidence(ea->confidence, in, out, st->rows_device, Na, ea->C);
    const float *confidence =
        backend_read(ea->confidence_host, ea->confidence, (size_t)Na * sizeof(float));
    for (int k = 0; k < Na; k++)
        if (confidence[k] >= x->threshold) ea->exit_layer[st->rows[k]] = layer;
}

void exit_forward_block(struct gpt *model, struct gpt_acts *acts, int i, float *out,
                        const float *in)
{
    struct gpt_exit *x = model->exit;
    struct exit_acts *ea = exit_acts_get(model, acts);
    struct exit_block_state *st = &ea->blocks[i];
    int B = acts->B, T = acts->T, N = B * T;
    int layer = model->first_block + i, L = model->shape.layers;
    struct block *blk = &model->blocks[i];
    st->nactive = 0;
    for (int n = 0; n < N; n++)
        if (ea->exit_layer[n] >= layer) st->rows[st->nactive++] = n;
    int Na = st->nactive;
    backend_write_end(st->rows_device, st->rows, (size_t)Na * sizeof(int));
    if (blk->halves)   /* balance.units = sublayer */
        units_forward(model, acts, ea, i, out, in, st->rows_device, Na);
    else if (Na == N)
        block_forward(blk, &acts->blocks[i], out, in, B, T);
    else
        block_forward_rows(blk, &acts->blocks[i], out, in, B, T, st->rows_device, Na, ea->work);
    /* A block's counts, exit head and decision are its end's: the stage
     * of its MLP when another holds its attention. */
    st->head = 0;
    if (blk->halves == BLOCK_HALF_ATTENTION) return;
    x->token_blocks += N;
    x->token_blocks_skipped += N - Na;
    if (x->layer_tokens) {
        x->layer_tokens[layer] += N;
        x->layer_computed[layer] += Na;
    }
    st->head = Na > 0 && has_exit_head(model, layer);
    int decide = x->allow && !x->forced && layer >= x->from && layer < L - 1;
    if (st->head) exit_head_forward(model, acts, ea, st, layer, out);
    if (decide) exit_decide(x, ea, st, layer, out, in);
}

void exit_backward_block(struct gpt *model, struct gpt_acts *acts, struct block_scratch *s,
                         int i, float *din, const float *dout, const float *in,
                         float dloss_scale, struct block_wgrad *w)
{
    const struct dm_backend *ops = backend_current();
    const struct gpt_exit *x = model->exit;
    struct exit_acts *ea = exit_acts_get(model, acts);
    struct exit_block_state *st = &ea->blocks[i];
    int B = acts->B, T = acts->T, N = B * T, C = ea->C, V = ea->V, Na = st->nactive;
    int layer = model->first_block + i;
    const float *grad = dout;
    if (st->head && x->loss_weight > 0.0f) {
        /* d(lambda w_l L_l)/d h for the active rows, added to dout. */
        float *dlogits = ea->logits, *dlnf = ea->work, *dh = ea->work2;
        ops->crossentropy_softmax_backward(dlogits, st->probs, st->targets,
                                           exit_weight(model, layer) * dloss_scale / (float)N,
                                           Na, V);
        ops->matmul_backward_overwrite(dlnf, NULL, NULL, dlogits, st->lnf, x->wte, Na, C, V);
        ops->zero(dh, (size_t)Na * C * sizeof(float));
        ops->layernorm_backward(dh, NULL, NULL, dlnf, st->hc, x->lnf_w, st->mean, st->rstd, Na, C);
        /* The sum goes where the block's input gradient will go (the
         * block backward allows din to alias dout). */
        float *sum = din ? din : (float *)dout;
        if (sum != dout) ops->copy_on_device(sum, dout, (size_t)N * C * sizeof(float));
        ops->rows_scatter(sum, dh, st->rows_device, Na, C, 1);
        grad = sum;
    }
    struct block *blk = &model->blocks[i];
    if (w) w->fused = 1;
    if (blk->halves)   /* balance.units = sublayer */
        units_backward(model, acts, ea, s, i, din, grad, in, st->rows_device, Na);
    else if (Na == N && w)
        block_backward_input(blk, &acts->blocks[i], s, w, din, grad, in, B, T);
    else if (Na == N)
        block_backward(blk, &acts->blocks[i], s, din, grad, in, B, T);
    else if (w && Na > 0 && !blk->frozen) {   /* the weight part deferred */
        w->fused = 0;
        rows_backward(blk, &acts->blocks[i], s, din, grad, in, B, T, st->rows_device, Na,
                      ea->work, w);
    } else
        block_backward_rows(blk, &acts->blocks[i], s, din, grad, in, B, T, st->rows_device, Na,
                            ea->work);
}

void exit_backward_weight(struct gpt *model, struct gpt_acts *acts, int i,
                          const struct block_wgrad *w, const float *in)
{
    struct exit_acts *ea = exit_acts_get(model, acts);
    const struct exit_block_state *st = &ea->blocks[i];
    struct block *blk = &model->blocks[i];
    if (w->fused || blk->frozen) return;
    if (st->nactive == acts->B * acts->T)
        block_backward_weight(blk, &acts->blocks[i], w, in, acts->B, acts->T);
    else
        rows_backward_weight(blk, &acts->blocks[i], w, in, acts->B, acts->T, st->rows_device,
                             st->nactive);
}
