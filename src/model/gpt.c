/* The model on one rank: a contiguous range of blocks plus, optionally,
 * the embedding (first stage) and the final norm, tied LM head and loss
 * (last stage). Builds, runs forward and backward over them, and copies
 * the whole model to and from the canonical flat order.
 *
 * Nothing here knows about the layout or calls MPI: a pipeline stage hands
 * in the activation it received (acts->residual[0]) and the gradient of its
 * output (dout), and sends on what comes out. */
#include <math.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/model.h"
#include "model/internal.h"

struct gpt_shape gpt_shape_from_config(const struct dm_config *cfg)
{
    int pad = cfg->vocab_pad > 1 ? cfg->vocab_pad : 1;
    struct gpt_shape s = {.vocab = (cfg->vocab + pad - 1) / pad * pad,
                          .vocab_used = cfg->vocab, .max_seq = cfg->max_seq,
                          .layers = cfg->layers, .heads = cfg->heads,
                          .channels = cfg->channels};
    return s;
}

static size_t embed_param_count(const struct gpt_shape *s)
{
    size_t C = (size_t)s->channels;
    return (size_t)s->vocab * C + (size_t)s->max_seq * C + 2 * C;
}

size_t gpt_param_count(const struct gpt_shape *shape)
{
    size_t n = embed_param_count(shape);
    for (int l = 0; l < shape->layers; l++) n += gpt_block_param_count(shape, l);
    return n;
}

void gpt_build(struct gpt *model, const struct gpt_shape *shape, int first_block,
               int num_blocks, int has_embed, int has_head, uint64_t seed)
{
    gpt_build_deferred(model, shape, first_block, num_blocks, has_embed, has_head);
    gpt_init_weights(model, seed);
}

/* The embedding's parameters drawn on the host (in staging when the
 * backend's memory is not the host's), then copied up. */
static void init_embed_weights(struct gpt *model, uint64_t seed)
{
    const struct gpt_shape *shape = &model->shape;
    size_t C = (size_t)shape->channels, n = model->embed_nparams;
    float *staging = backend_staging(n * sizeof(float));
    float *params = backend_write_begin(staging, model->wte);   /* [wte wpe lnf_w lnf_b] */
    float *wpe = params + (model->wpe - model->wte), *lnf_w = params + (model->lnf_w - model->wte);
    /* drawn by index: the used rows are those of the unpadded model */
    init_normal(params, (size_t)shape->vocab * C, seed, GPT_STREAM_WTE, 0.02f);
    size_t used = (size_t)gpt_vocab_used(shape) * C;
    memset(params + used, 0, ((size_t)shape->vocab * C - used) * sizeof(float));
    init_normal(wpe, (size_t)shape->max_seq * C, seed, GPT_STREAM_WPE, 0.02f);
    for (size_t i = 0; i < C; i++) lnf_w[i] = 1.0f;
    backend_write_end(model->wte, params, n * sizeof(float));
    backend_staging_free(staging);
}

void gpt_init_weights(struct gpt *model, uint64_t seed)
{
    const struct gpt_shape *shape = &model->shape;
    for (int i = 0; i < model->num_blocks; i++)
        block_init_weights(&model->blocks[i], shape, seed);
    if (!model->has_embed && !model->has_head) return;
    init_embed_weights(model, seed);
}

/* The blocks' seconds of the last step, the seven arrays of struct gpt
 * (block_fwd_s ... attention_wgrad_s) of count doubles each (at least 1),
 * carved from one allocation that block_fwd_s starts. */
static void block_timings_alloc(struct gpt *model, int count)
{
    double **const timings[] = {&model->block_fwd_s,       &model->block_bwd_s,
                                &model->block_update_s,    &model->attention_fwd_s,
                                &model->attention_bwd_s,   &model->block_wgrad_s,
                                &model->attention_wgrad_s};
    dm_carve_doubles(timings, sizeof timings / sizeof timings[0], (size_t)(count ? count : 1));
}

void gpt_build_deferred(struct gpt *model, const struct gpt_shape *shape, int first_block,
                        int num_blocks, int has_embed, int has_head)
{
    DM_ASSERT(first_block >= 0 && num_blocks >= 0 &&
              first_block + num_blocks <= shape->layers);
    memset(model, 0, sizeof *model);
    model->shape = *shape;
    model->first_block = first_block;
    model->num_blocks = num_blocks;
    model->has_embed = has_embed;
    model->has_head = has_head;
    model->blocks = dm_alloc((size_t)(num_blocks ? num_blocks : 1) * sizeof(struct block));
    for (int i = 0; i < num_blocks; i++)
        block_alloc_zero(&model->blocks[i], first_block + i, shape);
    block_timings_alloc(model, num_blocks);
    if (!has_embed && !has_head) return;

    /* [wte wpe lnf_w lnf_b] x {params, grads, m, v}, dwte_head */
    size_t C = (size_t)shape->channels, n = embed_param_count(shape);
    size_t VC = (size_t)shape->vocab * C;
    model->embed_nparams = n;
    model->embed_slab = backend_current()->alloc((4 * n + (has_head ? VC : 0)) * sizeof(float));
    float *params = model->embed_slab, *grads = params + n;
    model->embed_m = grads + n;
    model->embed_v = model->embed_m + n;
    size_t wte = 0, wpe = (size_t)shape->vocab * C, lnf = wpe + (size_t)shape->max_seq * C;
    model->wte = params + wte;
    model->wpe = params + wpe;
    model->lnf_w = params + lnf;
    model->lnf_b = params + lnf + C;
    model->dwte = grads + wte;
    model->dwpe = grads + wpe;
    model->dlnf_w = grads + lnf;
    model->dlnf_b = grads + lnf + C;
    if (has_head) model->dwte_head = model->embed_v + n;
}

void gpt_free(struct gpt *model)
{
    for (int i = 0; i < model->num_blocks; i++) block_free(&model->blocks[i]);
    dm_free(model->blocks);
    if (model->embed_slab) backend_current()->free(model->embed_slab);
    dm_free(model->block_fwd_s);   /* and the other timings (block_timings_alloc) */
    memset(model, 0, sizeof *model);
}

float *gpt_embed_host_view(const struct gpt *model, float *staging, int fetch)
{
    if (!staging) return model->embed_slab;
    if (fetch)
        backend_current()->copy_to_host(staging, model->embed_slab,
                                        4 * model->embed_nparams * sizeof(float));
    return staging;
}

void gpt_embed_host_store(struct gpt *model, const float *view)
{
    backend_write_end(model->embed_slab, view, 4 * model->embed_nparams * sizeof(float));
}

float *gpt_host_staging(const struct gpt *model)
{
    size_t floats = model->embed_slab ? 4 * model->embed_nparams : 0;
    for (int i = 0; i < model->num_blocks; i++)
        if (model->blocks[i].slab_floats > floats) floats = model->blocks[i].slab_floats;
    return floats ? backend_staging(floats * sizeof(float)) : NULL;
}

void gpt_replace_blocks(struct gpt *model, struct block *blocks, int first, int count)
{
    DM_ASSERT(first >= 0 && count >= 0 && first + count <= model->shape.layers);
    dm_free(model->blocks);
    dm_free(model->block_fwd_s);   /* and the other timings (block_timings_alloc) */
    model->blocks = blocks;
    model->first_block = first;
    model->num_blocks = count;
    block_timings_alloc(model, count);
    for (int k = 0; k < GPT_EXT_MAX; k++)   /* the adopted blocks get the helpers too */
        if (model->ext_runtime[k].ops)
            gpt_ext_set_runtime(model, model->ext_runtime[k].ops, model->ext_runtime[k].runtime);
}

/* ---- canonical flat order ---------------------------------------------------- */

static void require_whole_model(const struct gpt *model)
{
    DM_ASSERT(model->has_embed && model->has_head && model->first_block == 0 &&
              model->num_blocks == model->shape.layers);
}

/* Copies between the flat vector and either the parameters (which = 0) or
 * the gradients (which = 1) of the model. */
static void flat_copy(struct gpt *model, float *flat, int which, int to_flat)
{
    require_whole_model(model);
    const struct dm_backend *ops = backend_current();
    size_t C = (size_t)model->shape.channels;
    size_t n_embed = (size_t)(model->shape.vocab + model->shape.max_seq) * C;
    float *embed = which ? model->dwte : model->wte;         /* wte then wpe */
    float *lnf = which ? model->dlnf_w : model->lnf_w;       /* lnf_w then lnf_b */
    float *pos = flat;
    if (to_flat) ops->copy_to_host(pos, embed, n_embed * sizeof(float));
    else ops->copy_to_device(embed, pos, n_embed * sizeof(float));
    pos += n_embed;
    for (int i = 0; i < model->num_blocks; i++) {
        size_t nblock = model->blocks[i].nparams;
        float *b = which ? model->blocks[i].grads : model->blocks[i].params;
        if (to_flat) ops->copy_to_host(pos, b, nblock * sizeof(float));
        else ops->copy_to_device(b, pos, nblock * sizeof(float));
        pos += nblock;
    }
    if (to_flat) ops->copy_to_host(pos, lnf, 2 * C * sizeof(float));
    else ops->copy_to_device(lnf, pos, 2 * C * sizeof(float));
}

void gpt_params_to_flat(const struct gpt *model, float *flat)
{
    flat_copy((struct gpt *)model, flat, 0, 1);
}

void gpt_params_from_flat(struct gpt *model, const float *flat)
{
    flat_copy(model, (float *)flat, 0, 0);
}

void gpt_grads_to_flat(const struct gpt *model, float *flat)
{
    if (model->wte_grads_pending)
        DM_FATAL("gpt_grads_to_flat before gpt_tie_wte_grads");
    flat_copy((struct gpt *)model, flat, 1, 1);
}

/* ---- activations ------------------------------------------------------------- */

/* The head's tensors and the host staging of the inputs and losses. */
static void head_acts_alloc(struct gpt_acts *acts, const struct gpt *model, size_t BT)
{
    const struct dm_backend *ops = backend_current();
    size_t BTC = BT * (size_t)model->shape.channels, BTV = BT * (size_t)gpt_vocab_used(&model->shape);
    acts->tokens = ops->alloc(BT * sizeof(int));
    acts->targets = ops->alloc(BT * sizeof(int));
    acts->tokens_host = backend_staging(BT * sizeof(int));
    acts->targets_host = backend_staging(BT * sizeof(int));
    if (!model->has_head) return;
    acts->lnf = ops->alloc(BTC * sizeof(float));
    acts->lnf_mean = ops->alloc(BT * sizeof(float));
    acts->lnf_rstd = ops->alloc(BT * sizeof(float));
    acts->logits = ops->alloc(BTV * sizeof(float));
    acts->probs = ops->alloc(BTV * sizeof(float));
    acts->losses = ops->alloc(BT * sizeof(float));
    acts->losses_host = backend_staging(BT * sizeof(float));
}

void gpt_acts_alloc(struct gpt_acts *acts, const struct gpt *model, int B, int T)
{
    const struct gpt_shape *s = &model->shape;
    size_t BT = (size_t)B * T, BTC = BT * (size_t)s->channels;
    memset(acts, 0, sizeof *acts);
    acts->B = B;
    acts->T = T;
    int nb = model->num_blocks;
    acts->blocks = dm_alloc((size_t)(nb ? nb : 1) * sizeof(struct block_acts));
    for (int i = 0; i < nb; i++)
        block_acts_alloc(&acts->blocks[i], B, T, s->channels, s->heads);
    acts->residual = backend_current()->alloc((size_t)(nb + 1) * BTC * sizeof(float));
    head_acts_alloc(acts, model, BT);
    acts->num_blocks = nb;
    acts->capacity = nb;
}

void gpt_acts_resize(struct gpt_acts *acts, const struct gpt *model)
{
    const struct gpt_shape *s = &model->shape;
    int nb = model->num_blocks, cap = acts->capacity;
    if (nb > cap) {
        const struct dm_backend *ops = backend_current();
        size_t BTC = (size_t)acts->B * acts->T * (size_t)s->channels;
        struct block_acts *blocks = dm_alloc((size_t)nb * sizeof(struct block_acts));
        for (int i = 0; i < cap; i++) blocks[i] = acts->blocks[i];
        for (int i = cap; i < nb; i++)
            block_acts_alloc(&blocks[i], acts->B, acts->T, s->channels, s->heads);
        dm_free(acts->blocks);
        acts->blocks = blocks;
        ops->free(acts->residual);
        acts->residual = ops->alloc((size_t)(nb + 1) * BTC * sizeof(float));
        acts->capacity = nb;
    }
    acts->num_blocks = nb;
}

void gpt_acts_free(struct gpt_acts *acts)
{
    const struct dm_backend *ops = backend_current();
    for (int i = 0; i < acts->capacity; i++) block_acts_free(&acts->blocks[i]);
    dm_free(acts->blocks);
    void *device[] = {acts->residual, acts->tokens, acts->targets, acts->lnf, acts->lnf_mean,
                      acts->lnf_rstd, acts->logits, acts->probs, acts->losses};
    for (size_t i = 0; i < sizeof device / sizeof device[0]; i++)
        if (device[i]) ops->free(device[i]);
    backend_staging_free(acts->tokens_host);
    backend_staging_free(acts->targets_host);
    backend_staging_free(acts->losses_host);
    exit_acts_free(acts);
    memset(acts, 0, sizeof *acts);
}

void gpt_acts_inputs(struct gpt_acts *acts, int **tokens, int **targets)
{
    *tokens = backend_write_begin(acts->tokens_host, acts->tokens);
    *targets = backend_write_begin(acts->targets_host, acts->targets);
}

void gpt_acts_inputs_ready(struct gpt_acts *acts)
{
    size_t bytes = (size_t)acts->B * acts->T * sizeof(int);
    if (acts->tokens_host) backend_write_end(acts->tokens, acts->tokens_host, bytes);
    if (acts->targets_host) backend_write_end(acts->targets, acts->targets_host, bytes);
}

/* ---- forward and backward -------------------------------------------------------- */

/* Block i of a sublayer run (balance.units = sublayer): a block held
 * whole (halves BLOCK_HALVES) runs as its attention half into res1, then
 * its MLP half from res1 (the whole block's bits, block.h), so that each
 * half's time is measured; the attention half's time also goes to
 * attention_fwd_s[i]. */
static void forward_units(struct gpt *model, struct block_acts *a, int i, float *out,
                          const float *in, int B, int T)
{
    struct block *blk = &model->blocks[i];
    double t0 = dm_profile_now();
    if (blk->halves != BLOCK_HALVES) {
        block_forward(blk, a, out, in, B, T);
        if (blk->halves == BLOCK_HALF_ATTENTION) model->attention_fwd_s[i] += dm_profile_now() - t0;
        return;
    }
    blk->halves = BLOCK_HALF_ATTENTION;
    block_forward(blk, a, a->res1, in, B, T);
    model->attention_fwd_s[i] += dm_profile_now() - t0;
    blk->halves = BLOCK_HALF_MLP;
    block_forward(blk, a, out, a->res1, B, T);
    blk->halves = BLOCK_HALVES;
}

/* The backward of forward_units: the MLP half leaves the gradient of res1
 * in the scratch's d_res1, where the attention half takes it. */
/* One half's backward; under zb (w) its input part, the weight part
 * deferred to gpt_backward_weight. */
static void unit_backward(struct block *blk, struct block_acts *a, struct block_scratch *s,
                          struct block_wgrad *w, float *din, const float *dout, const float *in,
                          int B, int T)
{
    if (w) block_backward_input(blk, a, s, w, din, dout, in, B, T);
    else block_backward(blk, a, s, din, dout, in, B, T);
}

static void backward_units(struct gpt *model, struct block_acts *a, struct block_scratch *s,
                           struct block_wgrad *w, int i, float *din, const float *dout,
                           const float *in, int B, int T)
{
    struct block *blk = &model->blocks[i];
    if (blk->halves != BLOCK_HALVES) {
        double t0 = dm_profile_now();
        unit_backward(blk, a, s, w, din, dout, in, B, T);
        if (blk->halves == BLOCK_HALF_ATTENTION) model->attention_bwd_s[i] += dm_profile_now() - t0;
        return;
    }
    blk->halves = BLOCK_HALF_MLP;
    unit_backward(blk, a, s, w, NULL, dout, a->res1, B, T);
    double t0 = dm_profile_now();
    blk->halves = BLOCK_HALF_ATTENTION;
    unit_backward(blk, a, s, w, din, s->d_res1, in, B, T);
    model->attention_bwd_s[i] += dm_profile_now() - t0;
    blk->halves = BLOCK_HALVES;
}

/* zb's weight part of a block held as halves, the attention half's time
 * apart (as backward_units). */
static void weight_units(struct gpt *model, const struct block_acts *a,
                         const struct block_wgrad *w, int i, const float *in, int B, int T)
{
    struct block *blk = &model->blocks[i];
    int both = blk->halves == BLOCK_HALVES;
    if (both || blk->halves == BLOCK_HALF_MLP) {
        blk->halves = BLOCK_HALF_MLP;
        block_backward_weight(blk, a, w, both ? a->res1 : in, B, T);
    }
    if (both || blk->halves == BLOCK_HALF_ATTENTION) {
        double t0 = dm_profile_now();
        blk->halves = BLOCK_HALF_ATTENTION;
        block_backward_weight(blk, a, w, in, B, T);
        double spent = dm_profile_now() - t0;
        model->attention_bwd_s[i] += spent;
        model->attention_wgrad_s[i] += spent;
    }
    if (both) blk->halves = BLOCK_HALVES;
}

float gpt_forward(struct gpt *model, struct gpt_acts *acts)
{
    const struct dm_backend *ops = backend_current();
    const struct gpt_shape *s = &model->shape;
    int B = acts->B, T = acts->T, C = s->channels, V = gpt_vocab_used(s), N = B * T;
    DM_ASSERT(acts->num_blocks == model->num_blocks && T <= s->max_seq);
    size_t BTC = (size_t)N * C;
    if (model->has_embed)
        ops->encoder_forward(acts->residual, acts->tokens, model->wte, model->wpe, B, T, C);
    if (model->exit) exit_begin_forward(model, acts);
    for (int i = 0; i < model->num_blocks; i++) {
        double t0 = dm_profile_now();
        acts->blocks[i].step = model->step;
        if (model->exit)   /* early exit: active tokens only, exit heads */
            exit_forward_block(model, acts, i, acts->residual + (i + 1) * BTC,
                               acts->residual + i * BTC);
        else if (model->blocks[i].halves)   /* balance.units = sublayer */
            forward_units(model, &acts->blocks[i], i, acts->residual + (i + 1) * BTC,
                          acts->residual + i * BTC, B, T);
        else
            block_forward(&model->blocks[i], &acts->blocks[i], acts->residual + (i + 1) * BTC,
                          acts->residual + i * BTC, B, T);
        model->block_fwd_s[i] += dm_profile_now() - t0;
    }
    if (!model->has_head) return 0.0f;
    ops->layernorm_forward(acts->lnf, acts->lnf_mean, acts->lnf_rstd,
                           acts->residual + model->num_blocks * BTC, model->lnf_w, model->lnf_b,
                           N, C);
    ops->matmul_forward(acts->logits, acts->lnf, model->wte, NULL, N, C, V);
    ops->crossentropy_forward(acts->losses, acts->probs, acts->logits, acts->targets, N, V);
    const float *losses = backend_read(acts->losses_host, acts->losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += losses[n];
    return (float)(sum / N);
}

void gpt_backward(struct gpt *model, struct gpt_acts *acts, struct block_scratch *scratch,
                  float dloss_scale, const float *dout, float *din)
{
    gpt_backward_input(model, acts, scratch, dloss_scale, dout, din, NULL);
}

/* wgrads NULL: gpt_backward. */
void gpt_backward_input(struct gpt *model, struct gpt_acts *acts, struct block_scratch *scratch,
                        float dloss_scale, const float *dout, float *din,
                        struct block_wgrad *wgrads)
{
    const struct dm_backend *ops = backend_current();
    const struct gpt_shape *s = &model->shape;
    int B = acts->B, T = acts->T, C = s->channels, V = gpt_vocab_used(s), N = B * T;
    size_t BTC = (size_t)N * C;
    int nb = model->num_blocks;
    float *d = scratch->d_resid;
    const float *grad = dout;     /* gradient wrt the current block's output */
    if (model->has_head) {
        float *dlogits = acts->logits;
        float *dlnf = scratch->d_ln;
        ops->crossentropy_softmax_backward(dlogits, acts->probs, acts->targets,
                                           dloss_scale / (float)N, N, V);
        ops->matmul_backward_overwrite(dlnf, model->dwte_head, NULL, dlogits, acts->lnf,
                                       model->wte, N, C, V);
        model->wte_grads_pending = 1;
        ops->zero(d, BTC * sizeof(float));
        ops->layernorm_backward(d, model->dlnf_w, model->dlnf_b, dlnf, acts->residual + nb * BTC,
                                model->lnf_w, acts->lnf_mean, acts->lnf_rstd, N, C);
        grad = d;
    }
    DM_ASSERT(grad != NULL);
    for (int i = nb - 1; i >= 0; i--) {
        /* Frozen with everything before it: nothing needs this gradient
         * (din is then left as it is; the previous stage ignores it). */
        if (model->first_block + i < model->frozen_prefix) break;
        float *target = (i == 0 && !model->has_embed) ? din : d;
        double t0 = dm_profile_now();
        acts->blocks[i].loss_scale = dloss_scale;   /* the MoE balancing losses' share */
        if (wgrads) wgrads[i].fused = 1;
        if (model->exit)
            exit_backward_block(model, acts, scratch, i, target, grad,
                                acts->residual + i * BTC, dloss_scale, wgrads ? &wgrads[i] : NULL);
        else if (model->blocks[i].halves)   /* balance.units = sublayer */
            backward_units(model, &acts->blocks[i], scratch, wgrads ? &wgrads[i] : NULL, i,
                           target, grad, acts->residual + i * BTC, B, T);
        else if (wgrads)   /* parallel.schedule = zb */
            block_backward_input(&model->blocks[i], &acts->blocks[i], scratch, &wgrads[i],
                                 target, grad, acts->residual + i * BTC, B, T);
        else
            block_backward(&model->blocks[i], &acts->blocks[i], scratch, target, grad,
                           acts->residual + i * BTC, B, T);
        model->block_bwd_s[i] += dm_profile_now() - t0;
        grad = target;
    }
    if (model->has_embed && model->frozen_prefix == 0)
        ops->encoder_backward(model->dwte, model->dwpe, grad, acts->tokens, B, T, C);
    else if (nb == 0 && din && din != grad)
        ops->copy_on_device(din, grad, BTC * sizeof(float));
}

void gpt_backward_weight(struct gpt *model, struct gpt_acts *acts,
                         const struct block_wgrad *wgrads)
{
    size_t BTC = (size_t)acts->B * acts->T * model->shape.channels;
    for (int i = model->num_blocks - 1; i >= 0; i--) {
        if (model->first_block + i < model->frozen_prefix) break;   /* as gpt_backward_input */
        if (wgrads[i].fused) continue;   /* no weight part: block_wgrad_s stays 0 */
        double t0 = dm_profile_now();
        if (model->exit)
            exit_backward_weight(model, acts, i, &wgrads[i], acts->residual + i * BTC);
        else if (model->blocks[i].halves)   /* balance.units = sublayer */
            weight_units(model, &acts->blocks[i], &wgrads[i], i, acts->residual + i * BTC,
                         acts->B, acts->T);
        else
            block_backward_weight(&model->blocks[i], &acts->blocks[i], &wgrads[i],
                                  acts->residual + i * BTC, acts->B, acts->T);
        double spent = dm_profile_now() - t0;
        model->block_bwd_s[i] += spent;
        model->block_wgrad_s[i] += spent;
    }
}

void gpt_tie_wte_grads(struct gpt *model, const float *other)
{
    if (!model->has_embed && !model->has_head) return;
    const struct dm_backend *ops = backend_current();
    long VC = (long)model->shape.vocab * model->shape.channels;
    /* Always embedding share + head share, in that order (other: device memory). */
    const float *first, *second;
    if (model->has_embed && model->has_head) {
        DM_ASSERT(other == NULL);
        first = model->dwte;
        second = model->dwte_head;
    } else if (model->has_embed) {
        DM_ASSERT(other != NULL);
        first = model->dwte;
        second = other;
    } else {
        DM_ASSERT(other != NULL);
        first = other;
        second = model->dwte_head;
    }
    ops->residual_forward(model->dwte, first, second, VC);
    if (model->has_head) ops->zero(model->dwte_head, (size_t)VC * sizeof(float));
    model->wte_grads_pending = 0;
}

void gpt_charge_update(struct gpt *model, int i, double *t)
{
    double now = dm_profile_now();
    if (model->block_update_s) model->block_update_s[i] += now - *t;   /* NULL: no profile */
    *t = now;
}

void gpt_zero_grads(struct gpt *model)
{
    const struct dm_backend *ops = backend_current();
    double t = dm_profile_now();
    for (int i = 0; i < model->num_blocks; i++) {
        if (model->blocks[i].frozen) continue;
        ops->zero(model->blocks[i].grads, model->blocks[i].nparams * sizeof(float));
        gpt_charge_update(model, i, &t);
    }
    if (model->embed_slab) ops->zero(model->dwte, model->embed_nparams * sizeof(float));
    if (model->dwte_head)
        ops->zero(model->dwte_head,
                  (size_t)model->shape.vocab * model->shape.channels * sizeof(float));
    model->wte_grads_pending = 0;
}

/* ---- gradient norm --------------------------------------------------------------
 * Through the table's sum_squares. The CPU's is this: fixed chunks, each
 * summed in double; chunk sums added in order (kernels/reduce.cuh's too). */
#define SUMSQ_CHUNK 8192

struct sumsq_args {
    const float *x;
    long n;
    double *partial;
};

static void sumsq_range(void *arg, long begin, long end)
{
    const struct sumsq_args *a = arg;
    for (long chunk = begin; chunk < end; chunk++) {
        long i0 = chunk * SUMSQ_CHUNK;
        long i1 = i0 + SUMSQ_CHUNK < a->n ? i0 + SUMSQ_CHUNK : a->n;
        double lane[8] = {0};
        long i = i0;
        for (; i + 8 <= i1; i += 8)
            for (int k = 0; k < 8; k++) lane[k] += (double)a->x[i + k] * a->x[i + k];
        for (int k = 0; i < i1; i++, k++) lane[k] += (double)a->x[i] * a->x[i];
        double s = 0.0;
        for (int k = 0; k < 8; k++) s += lane[k];
        a->partial[chunk] = s;
    }
}

double sum_squares(const float *x, long n)
{
    long chunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (chunks == 0) return 0.0;
    double *partial = dm_alloc((size_t)chunks * sizeof(double));
    struct sumsq_args a = {.x = x, .n = n, .partial = partial};
    dm_parallel_for(chunks, 1, sumsq_range, &a);
    double s = 0.0;
    for (long c = 0; c < chunks; c++) s += partial[c];
    dm_free(partial);
    return s;
}

/* The block's extension that splits its parameters over ranks, or NULL. */
static const struct block_ext_slot *shard_slot(const struct block *blk)
{
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops->grad_sumsq_parts) return &blk->ext[i];
    return NULL;
}

int gpt_block_shard_units(const struct gpt_shape *shape, int index)
{
    int n = 0;
    for (int i = 0; i < shape->ext_count; i++) {
        const struct gpt_ext *ext = &shape->ext[i];
        if (ext->ops->shard_units && gpt_ext_owns(ext, shape, index))
            n += ext->ops->shard_units(ext, shape, index);
    }
    return n;
}

int block_held_parts(const struct block *blk)
{
    const struct block_ext_slot *x = shard_slot(blk);
    return x ? x->ops->held_parts(x->state) : 0;
}

int block_held_part(const struct block *blk, int j)
{
    const struct block_ext_slot *x = shard_slot(blk);
    DM_ASSERT(x && j >= 0 && j < x->ops->held_parts(x->state));
    return x->ops->held_part(x->state, j);
}

size_t block_replicated_floats(const struct block *blk)
{
    const struct block_ext_slot *x = shard_slot(blk);
    return x ? x->ops->replicated_floats(blk, x->state) : blk->nparams;
}

double block_grad_sumsq_parts(const struct block *blk, double *parts)
{
    const struct block_ext_slot *x = shard_slot(blk);
    if (x) return x->ops->grad_sumsq_parts(blk, x->state, parts);
    return block_grad_sumsq(blk);
}

double block_grad_sumsq(const struct block *blk)
{
    if (blk->frozen) return 0.0;
    if (block_is_half(blk)) return block_half_grad_sumsq(blk, blk->halves);
    const struct block_ext_slot *x = shard_slot(blk);
    if (!x) return backend_current()->sum_squares(blk->grads, (long)blk->nparams);
    int parts = x->ops->held_parts(x->state);
    double *held = dm_alloc((size_t)(parts ? parts : 1) * sizeof(double));
    double s = x->ops->grad_sumsq_parts(blk, x->state, held);
    for (int j = 0; j < parts; j++) s += held[j];   /* in slot order: part order when all */
    dm_free(held);
    return s;
}

double gpt_embed_grad_sumsq(const struct gpt *model)
{
    if (!model->has_embed) return 0.0;
    long C = model->shape.channels;
    return backend_current()->sum_squares(model->dwte,
                                          (long)(model->shape.vocab + model->shape.max_seq) * C);
}

double gpt_head_grad_sumsq(const struct gpt *model)
{
    if (!model->has_head) return 0.0;
    return backend_current()->sum_squares(model->dlnf_w, 2L * model->shape.channels);
}

double gpt_grad_sumsq(const struct gpt *model)
{
    if (model->wte_grads_pending)
        DM_FATAL("gpt_grad_sumsq before gpt_tie_wte_grads: the head's share of the tied "
                 "wte gradient is not in dwte yet");
    double s = gpt_embed_grad_sumsq(model);
    for (int i = 0; i < model->num_blocks; i++) s += block_grad_sumsq(&model->blocks[i]);
    return s + gpt_head_grad_sumsq(model);
}

/* ---- the extensions' places in a model (block_ext.h) -------------------------------- */

void gpt_ext_set_runtime(struct gpt *model, const struct gpt_ext_ops *ops, const void *runtime)
{
    int k = 0;
    while (k < GPT_EXT_MAX && model->ext_runtime[k].ops && model->ext_runtime[k].ops != ops) k++;
    DM_ASSERT(k < GPT_EXT_MAX);
    model->ext_runtime[k].ops = ops;
    model->ext_runtime[k].runtime = runtime;
    for (int i = 0; i < model->num_blocks; i++) {
        struct block *blk = &model->blocks[i];
        for (int j = 0; j < blk->ext_count; j++)
            if (blk->ext[j].ops == ops && ops->set_runtime)
                ops->set_runtime(blk->ext[j].state, runtime);
    }
}

/* ---- once a step ---------------------------------------------------------------------- */

void gpt_begin_step(struct gpt *model)
{
    for (int i = 0; i < model->num_blocks; i++) {
        struct block *blk = &model->blocks[i];
        for (int j = 0; j < blk->ext_count; j++)
            if (blk->ext[j].ops->begin_step) blk->ext[j].ops->begin_step(blk->ext[j].state);
    }
}

int gpt_step_values(const struct gpt *model, double *values)
{
    int n = 0;
    for (int i = 0; i < model->num_blocks; i++) {
        const struct block *blk = &model->blocks[i];
        for (int j = 0; j < blk->ext_count; j++)
            if (blk->ext[j].ops->step_values)
                n += blk->ext[j].ops->step_values(blk->ext[j].state, values ? values + n : NULL);
    }
    return n;
}

void gpt_end_step(struct gpt *model, const double *values)
{
    int n = 0;
    for (int i = 0; i < model->num_blocks; i++) {
        struct block *blk = &model->blocks[i];
        for (int j = 0; j < blk->ext_count; j++) {
            const struct gpt_ext_ops *ops = blk->ext[j].ops;
            if (!ops->step_values) continue;
            ops->end_step(blk, blk->ext[j].state, values + n);
            n += ops->step_values(blk->ext[j].state, NULL);
        }
    }
}
