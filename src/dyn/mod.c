/* Mixture of depths (Raposo et al. 2024; model.mod_every, [mod];
 * docs/mod-hash.md), the whole scheme: its config rules and refusals, its
 * extension of the blocks (the scalar router, the two ways of choosing
 * tokens: top-k over a sequence, or a causal MLP predictor trained against
 * the top-k choice, dynmo/mod_predictor.h; the block's forward and
 * backward over the chosen tokens only), its signals and its part of the
 * checkpoint.
 *
 * The chosen tokens of all sequences are packed, each sequence's in
 * ascending position, into one dense (tokens, C) batch: the block's ops
 * run once over it and attention runs per sequence over its own rows
 * (block_forward_packed). Nothing is padded, so the cost follows the
 * tokens the block processed however unevenly the sequences choose. A
 * chosen token leaves the block as x + r (f(x) - x) with f the block and r
 * = w . x; every other token passes through bit for bit. Its per-token ops
 * are the op table's (src/model/depth_ops.c on the CPU). Nothing here
 * calls MPI or reads a layout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/mod_predictor.h"
#include "dynmo/schema.h"
#include "dyn/mod.h"
#include "dyn/scheme.h"

#define SCHEMA_FILE "../../checkpoint_schema/mod.def"
#define SCHEMA_NAME mod_schema
#define SCHEMA_STATIC
#include "dynmo/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
#undef SCHEMA_STATIC
/* mod.def's SCHEMA_VERSION: the /mod format written and read. */
enum { MOD_FORMAT = 2 };
_Static_assert((int)mod_schema_number == (int)MOD_FORMAT, "mod.def's SCHEMA_VERSION is the /mod format");

static int mod_active(const struct dm_config *cfg) { return cfg->mod_every > 0; }

static const char *const mod_keys[] = {"mod.*", NULL};

static void mod_check_on(const struct dm_config *cfg)
{
    char value[32];
    dm_format_shortest(value, sizeof value, cfg->mod_capacity);
    if (!(cfg->mod_capacity > 0.0 && cfg->mod_capacity <= 1.0))
        dm_user_error("model.mod_capacity = %s is outside (0, 1]: it is the fraction of "
                      "a sequence's tokens a mixture-of-depths block processes", value);
    if (cfg->mod_every > cfg->layers)
        dm_user_error("model.mod_every = %d exceeds model.layers = %d: no block would "
                      "be a mixture of depths", cfg->mod_every, cfg->layers);
    if (strcmp(cfg->mod_routing, "topk") != 0 && strcmp(cfg->mod_routing, "causal") != 0)
        dm_user_error("mod.routing = '%s' must be topk or causal", cfg->mod_routing);
    if (cfg->mod_predictor_hidden < 1 || cfg->mod_predictor_hidden > 65536)
        dm_user_error("mod.predictor_hidden = %d is outside 1..65536: it is the hidden "
                      "width of the causal routing's MLP predictor",
                      cfg->mod_predictor_hidden);
    if (config_was_set(cfg, "mod.predictor_hidden") && strcmp(cfg->mod_routing, "causal") != 0)
        dm_user_error("mod.predictor_hidden = %d is set but mod.routing = %s has no "
                      "predictor: set mod.routing = causal, or remove "
                      "mod.predictor_hidden", cfg->mod_predictor_hidden, cfg->mod_routing);
}

/* Its keys. */
static void mod_check(const struct dm_config *cfg)
{
    if (cfg->mod_every == 0 && dyn_keys_set(cfg, mod_keys))
        dm_user_error("[mod] is set (mod.routing = %s, mod.predictor_hidden = %d) but "
                      "model.mod_every = 0 (no mixture-of-depths blocks): set "
                      "model.mod_every, or remove [mod]", cfg->mod_routing,
                      cfg->mod_predictor_hidden);
    if (cfg->mod_every == 0) return;
    mod_check_on(cfg);
}

/* The schemes it does not combine with (dyn_config_validate refuses them). */
static const struct dyn_refusal mod_refuses[] = {
    {"prune", NULL},
    {"early_exit", NULL},
    {NULL, NULL},
};

int mod_capacity_tokens(double capacity, int T)
{
    int k = (int)ceil(capacity * T - 1e-9);
    return k < 1 ? 1 : (k > T ? T : k);
}


void mod_acts_alloc(struct mod_acts *m, int B, int T, int C)
{
    const struct dm_backend *ops = backend_current();
    size_t N = (size_t)B * T, rows = N * (size_t)C * sizeof(float);
    memset(m, 0, sizeof *m);
    m->B = B;
    m->T = T;
    m->C = C;
    m->count = dm_alloc((size_t)B * sizeof(int));
    m->pos = dm_alloc(N * sizeof(int));
    m->chosen = ops->alloc(N * sizeof(int));
    m->router = ops->alloc(N * sizeof(float));
    m->rows = ops->alloc(N * sizeof(int));
    m->gathered_in = ops->alloc(rows);
    m->gathered_out = ops->alloc(rows);
    m->chosen_host = backend_staging(N * sizeof(int));
    m->rows_host = backend_staging(N * sizeof(int));
}

void mod_acts_free(struct mod_acts *m)
{
    const struct dm_backend *ops = backend_current();
    dm_free(m->count);
    dm_free(m->pos);
    ops->free(m->chosen);
    ops->free(m->router);
    ops->free(m->rows);
    ops->free(m->gathered_in);
    ops->free(m->gathered_out);
    backend_staging_free(m->chosen_host);
    backend_staging_free(m->rows_host);
    if (m->work) ops->free(m->work);
    memset(m, 0, sizeof *m);
}


/* ---- the block over the chosen tokens (block_forward_packed) -------------------- */

/* start (B + 1) = prefix sums of m->count; the caller frees it */
static int *mod_starts(const struct mod_acts *m, int B)
{
    int *start = dm_alloc((size_t)(B + 1) * sizeof(int));
    for (int b = 0; b < B; b++) start[b + 1] = start[b] + m->count[b];
    return start;
}

/* m->count, m->pos, m->tokens, m->kmax of the choice (B*T, 0/1) */
static void mod_count_chosen(struct mod_acts *m, const int *chosen, int B, int T)
{
    m->kmax = 0;
    m->tokens = 0;
    for (int b = 0; b < B; b++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            if (chosen[(long)b * T + t]) m->pos[(long)b * T + n++] = t;
        m->count[b] = n;
        m->tokens += n;
        if (n > m->kmax) m->kmax = n;
    }
}

/* m->rows (tokens) = the block row of each packed row, sequence b's
 * chosen positions after the earlier sequences', written on the host and
 * copied up (tokens ints) */
static void mod_pack_rows(struct mod_acts *m, int B, int T)
{
    int *rows = backend_write_begin(m->rows_host, m->rows);
    long j = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < m->count[b]; i++) rows[j++] = b * T + m->pos[(long)b * T + i];
    backend_write_end(m->rows, rows, (size_t)m->tokens * sizeof(int));
}

/* Only the choice comes down to the host (its counts and positions) and
 * the packed rows' list goes up; the gather, the block and the
 * combination run on the backend. */
void mod_block_forward(struct block *blk, struct block_acts *acts, struct mod_acts *m,
                       float *out, const float *in, const float *router_weight,
                       const int *chosen, int B, int T)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    DM_ASSERT(B <= m->B && T <= m->T && C == m->C);
    ops->mod_router_forward(m->router, in, router_weight, N, C);
    if (chosen != m->chosen) ops->copy_on_device(m->chosen, chosen, (size_t)N * sizeof(int));
    mod_count_chosen(m, backend_read(m->chosen_host, m->chosen, (size_t)N * sizeof(int)), B, T);
    if (out != in) ops->copy_on_device(out, in, (size_t)N * C * sizeof(float));
    if (m->tokens == 0) return;
    mod_pack_rows(m, B, T);
    int *start = mod_starts(m, B), n = (int)m->tokens;
    ops->rows_gather(m->gathered_in, in, m->rows, n, C);
    block_forward_packed(blk, acts, m->gathered_out, m->gathered_in, start, B);
    ops->mod_combine_forward(out, m->gathered_in, m->gathered_out, m->router, m->rows, n, C);
    dm_free(start);
}

/* On the backend all through, over the forward's packed rows (m->rows). */
void mod_block_backward(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                        struct mod_acts *m, float *din, float *drouter_weight,
                        const float *dout, const float *router_weight, int B, int T,
                        float *work)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    if (din != dout) ops->copy_on_device(din, dout, (size_t)N * C * sizeof(float));
    if (m->tokens == 0) return;
    int *start = mod_starts(m, B), n = (int)m->tokens;
    /* work (tokens, C): the block output's gradient r dout, then, in
     * place, the block input's */
    ops->mod_scale_chosen(work, din, m->router, m->rows, n, C);
    block_backward_packed(blk, acts, s, work, work, m->gathered_in, start, B);
    ops->mod_combine_backward(din, drouter_weight, m->gathered_in, m->gathered_out, work,
                              m->router, router_weight, m->rows, n, C);
    dm_free(start);
}



/* ---- the block extension ---------------------------------------------------------
 * A MoD block's floats, after the dense block's tensors: router_w (C),
 * then, with causal routing, the predictor: pred_w1 (H, C), pred_b1 (H),
 * pred_w2 (H), pred_b2 (1) (dynmo/mod_predictor.h's layout). */

const struct mod_params *mod_params_of(const struct gpt_shape *shape)
{
    return gpt_shape_ext_params(shape, &mod_ext_ops);
}

void mod_shape_add(struct gpt_shape *shape, const struct mod_params *params)
{
    DM_ASSERT(params->every > 0);
    gpt_shape_add_ext(shape, &mod_ext_ops, params, sizeof *params);
}

static int mod_owns(const struct gpt_ext *ext, const struct gpt_shape *shape, int index)
{
    (void)shape;
    const struct mod_params *p = (const struct mod_params *)ext->params;
    return (index + 1) % p->every == 0;
}

int gpt_block_is_mod(const struct gpt_shape *shape, int index)
{
    return gpt_ext_owns(gpt_shape_ext(shape, &mod_ext_ops), shape, index);
}

int gpt_mod_block_count(const struct gpt_shape *shape)
{
    return gpt_ext_block_count(gpt_shape_ext(shape, &mod_ext_ops), shape);
}

static size_t mod_floats(const struct gpt_ext *ext, const struct gpt_shape *shape, int index)
{
    (void)index;
    const struct mod_params *p = (const struct mod_params *)ext->params;
    size_t C = (size_t)shape->channels;
    if (p->routing != MOD_ROUTING_CAUSAL) return C;
    return C + (size_t)mod_predictor_params(shape->channels, p->predictor_hidden);
}

size_t mod_extra_param_count(const struct gpt_shape *shape, int index)
{
    if (!gpt_block_is_mod(shape, index)) return 0;
    return mod_floats(gpt_shape_ext(shape, &mod_ext_ops), shape, index);
}

static void *mod_alloc(const struct gpt_ext *ext, const struct gpt_shape *shape,
                       struct block *blk, float *params, float *grads)
{
    (void)shape;
    const struct mod_params *p = (const struct mod_params *)ext->params;
    struct block_mod *mod = dm_alloc(sizeof *mod);
    mod->routing = p->routing;
    mod->capacity = p->capacity;
    mod->hidden = mod->routing == MOD_ROUTING_CAUSAL ? p->predictor_hidden : 0;
    mod->C = blk->C;
    DM_ASSERT(mod->routing != MOD_ROUTING_CAUSAL || mod->hidden >= 1);
    mod->router_w = params;
    mod->router_g = grads;
    if (mod->routing == MOD_ROUTING_CAUSAL) {
        mod->pred_w = mod->router_w + blk->C;
        mod->pred_g = mod->router_g + blk->C;
    }
    return mod;
}

static void mod_free(void *state)
{
    dm_free(state);
}

/* The router and the predictor's two matrices N(0, 0.02), the
 * predictor's biases 0: router_w on stream (layer, BP_COUNT), pred_w1 on
 * (layer, BP_COUNT + 1), pred_w2 on (layer, BP_COUNT + 2). The logit
 * starts near 0, so the predictor starts near half of the tokens. */
static void mod_init_weights(void *state, const struct block *blk, const struct gpt_shape *shape,
                             float *params, uint64_t seed)
{
    (void)shape;
    const struct block_mod *mod = state;
    size_t C = (size_t)blk->C, H = (size_t)mod->hidden;
    float *router_w = params;
    block_init_normal(router_w, C, seed, block_tensor_stream(blk->index, BP_COUNT), 0, 0.02f);
    if (!mod->pred_w) return;
    float *w1 = router_w + C, *w2 = w1 + H * C + H;
    block_init_normal(w1, H * C, seed, block_tensor_stream(blk->index, BP_COUNT + 1), 0, 0.02f);
    memset(w1 + H * C, 0, H * sizeof(float));
    block_init_normal(w2, H, seed, block_tensor_stream(blk->index, BP_COUNT + 2), 0, 0.02f);
    w2[H] = 0.0f;
}

static int mod_tensor_count(const void *state)
{
    return ((const struct block_mod *)state)->pred_w ? 5 : 1;
}

/* The router and the predictor's matrices act like a linear layer's
 * weights and take weight decay (as the MoE router does); the
 * predictor's biases do not. */
static int mod_tensor_at(const void *state, int k, size_t *offset, size_t *size)
{
    const struct block_mod *mod = state;
    DM_ASSERT(k >= 0 && k < mod_tensor_count(state));
    size_t C = (size_t)mod->C, H = (size_t)mod->hidden;
    const size_t sizes[5] = {C, H * C, H, H, 1};   /* router_w, pred_w1, b1, w2, b2 */
    *offset = 0;
    for (int i = 0; i < k; i++) *offset += sizes[i];
    *size = sizes[k];
    return k == 0 || k == 1 || k == 3;
}

/* ---- its hooks: the whole block ---------------------------------------------------- */

static void mod_acts_release(void *acts)
{
    struct mod_acts *m = acts;
    backend_current()->free(m->target);
    mod_acts_free(m);
    dm_free(m);
}

struct mod_acts *block_mod_acts(struct block_acts *acts)
{
    return *block_ext_acts(acts, &mod_ext_ops);
}

struct block_mod *block_mod_of(const struct block *blk)
{
    return block_ext_state(blk, &mod_ext_ops);
}

void block_mod_force_choice(struct block *blk, const int *chosen)
{
    struct block_mod *mod = block_mod_of(blk);
    DM_ASSERT(mod);
    mod->forced = chosen;
}

static struct mod_acts *mod_acts_of(struct block_acts *acts, int C)
{
    struct mod_acts **slot = (struct mod_acts **)block_ext_acts(acts, &mod_ext_ops);
    if (!*slot) {
        struct mod_acts *m = dm_alloc(sizeof *m);
        mod_acts_alloc(m, acts->B, acts->T, C);
        m->target = backend_current()->alloc((size_t)acts->B * acts->T * sizeof(int));
        *slot = m;
    }
    return *slot;
}

/* The router, the choice (top-k, or the causal predictor on the block
 * input), then the block over the chosen tokens; counts the tokens. out
 * and in (B,T,C) must not alias. */
static void mod_forward_hook(struct block *blk, void *state, struct block_acts *acts, float *out,
                             const float *in, int B, int T)
{
    struct block_mod *mod = state;
    int C = blk->C, N = B * T;
    struct mod_acts *m = mod_acts_of(acts, C);
    const struct dm_backend *ops = backend_current();
    ops->mod_router_forward(m->router, in, mod->router_w, N, C);
    ops->mod_select_topk(m->target, m->router, B, T, mod_capacity_tokens(mod->capacity, T));
    const int *chosen = m->target;
    if (mod->forced) {
        chosen = mod->forced;
    } else if (mod->routing == MOD_ROUTING_CAUSAL) {
        mod->bce += ops->mod_predictor_forward_backward(NULL, 0.0f, m->chosen, in, mod->pred_w,
                                                        m->target, N, C, mod->hidden);
        mod->bce_forwards++;
        chosen = m->chosen;
    }
    mod_block_forward(blk, acts, m, out, in, mod->router_w, chosen, B, T);
    mod->tokens += (double)m->tokens;
}

/* The predictor's gradient: mean BCE over the micro-batch's tokens against
 * the top-k choice, times the loss scale (it is trained as a loss term),
 * added to its gradient where the slab lives. */
static void predictor_backward(struct block_mod *mod, const struct mod_acts *m,
                               const float *in, int N, int C, float loss_scale)
{
    backend_current()->mod_predictor_forward_backward(mod->pred_g, loss_scale, NULL, in,
                                                      mod->pred_w, m->target, N, C,
                                                      mod->hidden);
}

/* block_backward's contract: the block over the chosen tokens, the
 * router's gradient and, with causal routing, the predictor's BCE gradient
 * against the top-k choice on the stop-gradient input, scaled by
 * acts->loss_scale (as the loss). A frozen block computes neither. */
static void mod_backward_hook(struct block *blk, void *state, struct block_acts *acts,
                              struct block_scratch *scratch, float *din, const float *dout,
                              const float *in, int B, int T)
{
    static struct grow_buffer work;   /* (B*T*C) the gathered gradient, then din if NULL */
    struct block_mod *mod = state;
    int C = blk->C, N = B * T;
    struct mod_acts *m = block_mod_acts(acts);
    DM_ASSERT(m != NULL);
    size_t btc = (size_t)N * C;
    float *w;
    if (backend_current()->host_access) {
        w = grow_buffer_get(&work, din ? btc : 2 * btc);
    } else {   /* device memory, one buffer per block's activations */
        size_t most = (size_t)m->B * m->T * m->C;
        if (!m->work) m->work = backend_current()->alloc(2 * most * sizeof(float));
        w = m->work;
    }
    float *d = din ? din : w + btc;
    mod_block_backward(blk, acts, scratch, m, d, blk->frozen ? NULL : mod->router_g, dout,
                       mod->router_w, B, T, w);
    if (mod->pred_w && !blk->frozen && !mod->forced)
        predictor_backward(mod, m, in, N, C, acts->loss_scale);
}

const struct gpt_ext_ops mod_ext_ops = {
    .name = "mod",
    .block_noun = "a mixture of depths",
    .owned_text = "is one",
    .not_owned_text = "is not",
    .pack_flag = MOD_PACK_FLAG,
    .owns = mod_owns,
    .floats = mod_floats,
    .alloc = mod_alloc,
    .free = mod_free,
    .init_weights = mod_init_weights,
    .tensor_count = mod_tensor_count,
    .tensor_at = mod_tensor_at,
    .block_forward = mod_forward_hook,
    .block_backward = mod_backward_hook,
    .acts_free = mod_acts_release,
};

static void mod_describe_shape(const struct gpt_shape *shape, char *buf, size_t size)
{
    const struct mod_params *p = mod_params_of(shape);
    if (p && p->routing == MOD_ROUTING_CAUSAL)
        snprintf(buf, size, "mixture of depths: every %d blocks (%d MoD blocks), capacity %g, "
                 "causal routing by an MLP predictor of hidden width %d", p->every,
                 gpt_mod_block_count(shape), p->capacity, p->predictor_hidden);
    else if (p)
        snprintf(buf, size, "mixture of depths: every %d blocks (%d MoD blocks), capacity %g, "
                 "top-k routing", p->every, gpt_mod_block_count(shape), p->capacity);
}

static void mod_add_to_shape(const struct dm_config *cfg, struct gpt_shape *shape)
{
    struct mod_params p = {.every = cfg->mod_every, .capacity = cfg->mod_capacity,
                           .routing = strcmp(cfg->mod_routing, "causal") ? MOD_ROUTING_TOPK
                                                                         : MOD_ROUTING_CAUSAL};
    if (p.routing == MOD_ROUTING_CAUSAL) p.predictor_hidden = cfg->mod_predictor_hidden;
    mod_shape_add(shape, &p);
}

/* ---- signals --------------------------------------------------------------------- */

static int mod_scheme_owns(const struct gpt_shape *shape, int layer)
{
    return gpt_block_is_mod(shape, layer);
}
static int mod_causal(const struct dm_config *cfg) { return !strcmp(cfg->mod_routing, "causal"); }

/* The tokens the block's forwards processed since the last read, then zero. */
static void read_tokens(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    struct block_mod *mod = block_mod_of(&model->blocks[i]);
    value[0] = mod->tokens;
    mod->tokens = 0.0;
}

/* The predictor's mean BCE over the forwards since the last read, then zero. */
static void read_bce(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    struct block_mod *mod = block_mod_of(&model->blocks[i]);
    value[0] = mod->bce_forwards ? mod->bce / (double)mod->bce_forwards : 0.0;
    mod->bce = 0.0;
    mod->bce_forwards = 0;
}

/* A step's tokens of each MoD block as the share of the step's tokens
 * (train.batch x train.seq), at the block's layer. */
static void tokens_share(const struct dm_config *cfg, const struct gpt_shape *shape,
                         const float *row, float *layers)
{
    double tokens = (double)cfg->batch * cfg->seq;
    for (int l = 0, j = 0; l < shape->layers; l++)
        if (gpt_block_is_mod(shape, l)) layers[l] = (float)(row[j++] / tokens);
}

/* The cost model's state of each MoD block: its share of the step's
 * tokens (/mod/tokens counts them over the micro-batches and replicas,
 * against batch x seq; a validation pass counts into the next step, so
 * the share is capped at 1), the other blocks 1. */
static float *tokens_of_log(const struct dyn_log_reader *rd, const struct gpt_shape *shape,
                            long rows)
{
    int L = shape->layers, blocks = 0;
    for (int l = 0; l < L; l++) blocks += gpt_block_is_mod(shape, l);
    if (!blocks || !rd->has(rd->ctx, "/mod/tokens")) return NULL;
    float *tokens = dyn_log_floats(rd, "/mod/tokens", rows, blocks);
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    double per_step = (double)rd->cfg->batch * rd->cfg->seq;
    for (long i = 0; i < rows * L; i++) m[i] = 1.0f;
    for (long r = 0; r < rows; r++)
        for (int l = 0, j = 0; l < L; l++)
            if (gpt_block_is_mod(shape, l))
                m[r * L + l] = (float)fmin(1.0, tokens[r * blocks + j++] / per_step);
    dm_free(tokens);
    return m;
}

/* A MoD block routes its capacity's share of the tokens. */
static float tokens_of_config(const struct dm_config *cfg, int step)
{
    (void)step;
    return (float)cfg->mod_capacity;
}

static const struct dyn_signal mod_signals[] = {
    {.dataset = "/mod/tokens",
     .label = "MoD tokens processed",
     .unit = "tokens",
     .meaning = "tokens the block computed in the step, over micro-batches and replicas",
     .columns = DYN_SIGNAL_BLOCKS,
     .combine = DYN_COMBINE_SUM,
     .read = read_tokens,
     .figure_label = "MoD tokens processed",
     .figure_unit = "share",
     .to_layers = tokens_share,
     .cost = DYN_COST_ROUTED_SHARE,
     .cost_name = "mod_tokens",
     .cost_dataset = "/layers/mod_tokens_share",
     .neutral = 1.0f,
     .cost_of_log = tokens_of_log,
     .cost_of_config = tokens_of_config},
    {.dataset = "/mod/predictor_bce",
     .label = "predictor BCE",
     .unit = "nats",
     .meaning = "the causal predictor's binary cross-entropy against the top-k choice",
     .columns = DYN_SIGNAL_BLOCKS,
     .combine = DYN_COMBINE_REPLICA_MEAN,
     .written = mod_causal,
     .read = read_bce},
};

/* The MoD blocks' share of the tokens that reached them. */
static void mod_step_note(const struct dm_config *cfg, const struct dyn_signal_row *rows,
                          int count, double tokens, char *buf, size_t size)
{
    (void)cfg;
    const struct dyn_signal_row *row = dyn_signal_row_of(rows, count, &mod_signals[0]);
    if (!row) return;
    double sum = 0.0;
    for (int j = 0; j < row->columns; j++) sum += row->values[j];
    double share = row->columns > 0 && tokens > 0 ? sum / (row->columns * tokens) : 0.0;
    snprintf(buf, size, "MoD %.1f%% tokens", 100.0 * share);
}

/* ---- the checkpoint (checkpoint_schema/mod.def) ------------------------------------ */

static int mod_in_shape(const struct gpt_shape *shape) { return mod_params_of(shape) != NULL; }

static int mod_in_file(const struct dyn_ckpt_reader *rd)
{
    return rd->int_attr(rd->ctx, "/model", "mod_every", 0) > 0;
}

/* A /mod in another format is refused, naming it. */
static int mod_check_format(const struct dyn_ckpt_reader *rd)
{
    if (!rd->has(rd->ctx, "/mod", NULL)) return 0;   /* reported with its group */
    long long format = rd->int_attr(rd->ctx, "/mod", "format", 1);
    if (format == MOD_FORMAT) return 0;
    dyn_ckpt_problem(rd, "its mixture-of-depths rows (/mod) are in format %lld%s; this dynmo "
                     "reads /mod format %d only (the router, then the causal routing's MLP "
                     "predictor of mod.predictor_hidden units; checkpoint_schema/mod.def): "
                     "resume with the dynmo that wrote it, or start a new run in another "
                     "ckpt.dir", format, format == 1 ? " (no attribute format: written before "
                                                      "format 2, with a linear causal "
                                                      "predictor)" : "", MOD_FORMAT);
    return -1;
}

static void mod_write_attrs(const struct gpt_shape *shape, const struct dyn_ckpt_writer *w)
{
    static const struct mod_params none;
    const struct mod_params *mod = mod_params_of(shape) ? mod_params_of(shape) : &none;
    char capacity[40];
    snprintf(capacity, sizeof capacity, "%.17g", mod->every > 0 ? mod->capacity : 0.0);
    w->int_attr(w->ctx, "/model", "mod_every", mod->every);
    w->string_attr(w->ctx, "/model", "mod_capacity", capacity);
    w->string_attr(w->ctx, "/model", "mod_routing",
                   mod->every == 0 ? "" : mod->routing == MOD_ROUTING_CAUSAL ? "causal" : "topk");
    if (mod->every == 0) return;
    w->int_attr(w->ctx, "/mod", "format", MOD_FORMAT);
    w->int_attr(w->ctx, "/mod", "predictor_hidden", mod->predictor_hidden);
}

/* What a file says. */
struct mod_file {
    long long every, hidden;
    double capacity;
    int routing, routing_ok;
};

static void mod_store(void *raw, const char *object, const char *name, long long value,
                      const char *text)
{
    (void)object;
    struct mod_file *f = raw;
    if (!strcmp(name, "mod_every")) {
        f->every = value;
    } else if (!strcmp(name, "predictor_hidden")) {
        f->hidden = value;
    } else if (!strcmp(name, "mod_routing")) {
        f->routing = !strcmp(text, "causal") ? MOD_ROUTING_CAUSAL : MOD_ROUTING_TOPK;
        f->routing_ok = !strcmp(text, "causal") || !strcmp(text, "topk") || !text[0];
    } else if (!strcmp(name, "mod_capacity")) {
        char *end = NULL;
        f->capacity = strtod(text, &end);
        if (!text[0] || *end) f->capacity = NAN;
    }
}

static int mod_file_check(const void *raw, struct gpt_shape *shape,
                          const struct dyn_ckpt_reader *rd)
{
    const struct mod_file *f = raw;
    struct mod_params m = {.every = (int)f->every, .routing = f->routing, .capacity = f->capacity,
                        .predictor_hidden = (int)f->hidden};
    if (f->every < 0 || f->every > shape->layers ||
        (f->every > 0 && (!(f->capacity > 0.0 && f->capacity <= 1.0) || !f->routing_ok))) {
        dyn_ckpt_problem(rd, "/model: mixture-of-depths keys out of range (mod_every %d for %d "
                         "layers, mod_capacity %g, mod_routing valid %d)", m.every,
                         shape->layers, f->capacity, f->routing_ok);
        return -1;
    }
    if (m.every == 0) return 0;   /* no MoD blocks: the shape has none */
    int causal = m.every > 0 && m.routing == MOD_ROUTING_CAUSAL;
    if (m.every > 0 && (causal ? m.predictor_hidden < 1 || m.predictor_hidden > 65536
                               : m.predictor_hidden != 0)) {
        dyn_ckpt_problem(rd, "/mod: predictor_hidden %d with %s routing (expected 1 .. 65536 "
                         "with causal, 0 with topk)", m.predictor_hidden,
                         causal ? "causal" : "topk");
        return -1;
    }
    mod_shape_add(shape, &m);
    return 0;
}

static const char *const mod_dims[] = {"mod_layers", "mod_params", NULL};

static long mod_dim(const struct gpt_shape *shape, const char *name)
{
    if (!strcmp(name, "mod_layers")) return gpt_mod_block_count(shape);
    return (long)mod_extra_param_count(shape, mod_params_of(shape)->every - 1);
}

/* A MoD block's router and predictor, the floats after the dense
 * tensors: row j of /mod for the j-th MoD block. */
static int mod_rows(const struct gpt_shape *shape, long version, const struct block *blk,
                    struct dyn_ckpt_rows *out, int max)
{
    (void)version;
    if (!gpt_block_is_mod(shape, blk->index)) return 0;
    size_t dense = block_param_count(blk->C);
    return dyn_ckpt_one_row(out, max, "/mod", gpt_ext_ordinal(gpt_shape_ext(shape, &mod_ext_ops), shape, blk->index), dense,
                            blk->nparams - dense);
}

static int mod_compare(const struct gpt_shape *file, const struct gpt_shape *run, char *err,
                       size_t errsize)
{
    static const struct mod_params none;
    const struct mod_params *f = mod_params_of(file) ? mod_params_of(file) : &none;
    const struct mod_params *r = mod_params_of(run) ? mod_params_of(run) : &none;
    static const char *routing[] = {"topk", "causal"};
    if (f->every == r->every && (f->every == 0 || (f->capacity == r->capacity &&
                                                   f->routing == r->routing &&
                                                   f->predictor_hidden == r->predictor_hidden)))
        return 0;
    snprintf(err, errsize, "written for a different model: mixture of depths is "
             "model.mod_every %d, model.mod_capacity %g, mod.routing %s, "
             "mod.predictor_hidden %d in the checkpoint but %d, %g, %s, %d in this run (use "
             "the checkpoint's model config, or start a new run in another ckpt.dir)",
             f->every, f->capacity, f->every ? routing[f->routing] : "-",
             f->predictor_hidden, r->every, r->capacity,
             r->every ? routing[r->routing] : "-", r->predictor_hidden);
    return -1;
}

static const struct dyn_ckpt_part mod_ckpt = {
    .schema = &mod_schema,
    .model_keys = 1,
    .in_shape = mod_in_shape,
    .in_file = mod_in_file,
    .check_format = mod_check_format,
    .write_attrs = mod_write_attrs,
    .store = mod_store,
    .check = mod_file_check,
    .dims = mod_dims,
    .dim = mod_dim,
    .rows = mod_rows,
    .compare = mod_compare,
};

/* ---- in a run log (inspect) ------------------------------------------------------ */

/* The MoD blocks' mean tokens per step over rows [first, last) of
 * /mod/tokens (NaN rows, steps the log does not hold, left out). */
static double mod_mean_tokens(const float *tokens, int blocks, long first, long last)
{
    double sum = 0.0;
    long n = 0;
    for (long r = first; r < last; r++)
        for (int j = 0; j < blocks; j++) {
            float v = tokens[r * blocks + j];
            if (isnan(v)) continue;
            sum += v;
            n++;
        }
    return n ? sum / (double)n : NAN;
}

/* /mod/tokens (column j: the j-th MoD block, as many columns as the
 * config's MoD blocks): the tokens processed per block over the first
 * and the last tenth of the steps, against the tokens that reach one. */
static void mod_summarise_log(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w)
{
    if (!rd->has(rd->ctx, "/mod/tokens")) return;
    struct gpt_shape shape = dyn_shape_from_config(rd->cfg);
    int blocks = gpt_mod_block_count(&shape), ncols = 0;
    float *tokens = NULL;
    long rows = rd->floats(rd->ctx, "/mod/tokens", &tokens, &ncols);
    char line[512];
    if (!blocks || ncols != blocks) {
        snprintf(line, sizeof line, "%s: /mod/tokens has %d columns; model.layers %d and "
                 "model.mod_every %d give %d MoD blocks", rd->path, ncols, rd->cfg->layers,
                 rd->cfg->mod_every, blocks);
        rd->fail(rd->ctx, line);
    }
    double reached = (double)rd->cfg->batch * (double)rd->cfg->seq;
    long tenth = rows / 10 > 0 ? rows / 10 : 1;
    double first = rows > 0 ? mod_mean_tokens(tokens, ncols, 0, tenth) : NAN;
    double last = rows > 0 ? mod_mean_tokens(tokens, ncols, rows - tenth, rows) : NAN;
    dm_free(tokens);
    if (rows <= 0) return;
    snprintf(line, sizeof line, "mixture of depths: %d MoD blocks (every %d), tokens processed "
             "per block and step of %.0f: %.0f (%.1f%%) over the first %ld steps, %.0f (%.1f%%) "
             "over the last %ld", ncols, rd->cfg->mod_every, reached, first,
             100.0 * first / reached, tenth, last, 100.0 * last / reached, tenth);
    w->line(w->ctx, line);
    w->open(w->ctx, "mod");
    w->integer(w->ctx, "blocks", ncols);
    w->number(w->ctx, "tokens_reaching_per_step", reached);
    w->number(w->ctx, "tokens_first_tenth", first);
    w->number(w->ctx, "tokens_last_tenth", last);
    w->close(w->ctx);
}

const struct dyn_scheme dyn_scheme_mod = {
    .ckpt = &mod_ckpt,
    .ext = &mod_ext_ops,
    .add_to_shape = mod_add_to_shape,
    .describe_shape = mod_describe_shape,
    .name = "mod",
    .active = mod_active,
    .keys = mod_keys,
    .check = mod_check,
    .title = "mixture of depths",
    .switch_key = "model.mod_every",
    .switch_off = "0",
    .refuses = mod_refuses,
    .owns = mod_scheme_owns,
    DYN_SIGNALS(mod_signals),
    .step_note = mod_step_note,
    .summarise_log = mod_summarise_log,
};
