/* Mixture of depths (Raposo et al. 2024) around one transformer block: the
 * scalar router, the two ways of choosing tokens (top-k over a sequence,
 * or a causal MLP predictor trained against the top-k choice,
 * dynmo/mod_predictor.h), and the block's forward and backward over the
 * chosen tokens only.
 *
 * The chosen tokens of all sequences are packed, each sequence's in
 * ascending position, into one dense (tokens, C) batch: the row-wise ops
 * run once over it and attention runs per sequence over its own rows
 * (causal among them in ascending order is causal at their original
 * positions). Nothing is padded, so the cost follows the tokens the block
 * processed however unevenly the sequences choose. A chosen token leaves
 * the block as x + r (f(x) - x) with f the block and r = w . x; every
 * other token passes through bit for bit. Nothing here calls MPI or reads
 * a layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/mod_predictor.h"
#include "dynmo/model.h"
#include "model/hash_segments.h"
#include "model/internal.h"

void mod_router_forward(float *router, const float *in, const float *weight, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = in + (long)n * C;
        float s = 0.0f;
        for (int c = 0; c < C; c++) s += weight[c] * x[c];
        router[n] = s;
    }
}

struct ranked {
    float value;
    int pos;
};

/* larger value first; equal values: lower position first (a total order,
 * so qsort's instability does not matter) */
static int ranked_compare(const void *pa, const void *pb)
{
    const struct ranked *a = pa, *b = pb;
    if (a->value != b->value) return a->value > b->value ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

void mod_select_topk(int *chosen, const float *router, int B, int T, int k)
{
    DM_ASSERT(k >= 0 && k <= T);
    struct ranked *r = dm_alloc((size_t)T * sizeof *r);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            r[t].value = router[(long)b * T + t];
            r[t].pos = t;
            chosen[(long)b * T + t] = 0;
        }
        qsort(r, (size_t)T, sizeof *r, ranked_compare);
        for (int i = 0; i < k; i++) chosen[(long)b * T + r[i].pos] = 1;
    }
    dm_free(r);
}

int mod_capacity_tokens(double capacity, int T)
{
    int k = (int)ceil(capacity * T - 1e-9);
    return k < 1 ? 1 : (k > T ? T : k);
}

/* Token by token in order; each weight's gradient summed over the tokens
 * in order from zero (the terms of dynmo/mod_predictor.h, in loops that
 * give each weight the same terms in the same order as
 * mod_predictor_term), then scaled into dweight. */
float mod_predictor_forward_backward(float *dweight, float scale, int *chosen, const float *in,
                                     const float *weight, const int *target, int N, int C, int H)
{
    long P = mod_predictor_params(C, H), HC = (long)H * C;
    float *a = dm_alloc((size_t)H * sizeof(float));
    float *sum = dweight && target ? dm_alloc((size_t)P * sizeof(float)) : NULL;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        const float *x = in + (long)n * C;
        float logit = mod_predictor_logit(a, x, weight, C, H);
        if (chosen) chosen[n] = logit > 0.0f;
        if (!target) continue;
        loss += mod_predictor_bce(logit, target[n]);
        if (!sum) continue;
        float g = mod_predictor_dlogit(logit, target[n], N);
        for (int j = 0; j < H; j++) {
            float dh = mod_predictor_dhidden(g, a, weight, j, C, H);
            float *row = sum + (long)j * C;
            for (int c = 0; c < C; c++) row[c] += dh * x[c];
            sum[HC + j] += dh;
            sum[HC + H + j] += g * (a[j] > 0.0f ? a[j] : 0.0f);
        }
        sum[P - 1] += g;
    }
    if (sum)
        for (long e = 0; e < P; e++) dweight[e] += scale * sum[e];
    dm_free(sum);
    dm_free(a);
    return target ? (float)(loss / N) : 0.0f;
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

/* ---- the block over the chosen tokens -------------------------------------
 * The chosen rows of all sequences are packed into one (tokens, C) batch,
 * sequence b's at rows [start[b], start[b+1]) in ascending position. The
 * row-wise ops (layernorms, the four matrix products with bias, residual
 * and GELU) run once over all of them, as block_forward does over B x T
 * rows; attention runs per sequence over its own rows (causal among them
 * in ascending order is causal at their original positions). A MoD block
 * is never pruned nor a mixture of experts (refused by the configuration),
 * so these dense ops are exactly the block's. */

/* start (B + 1) = prefix sums of m->count; the caller frees it */
static int *mod_starts(const struct mod_acts *m, int B)
{
    int *start = dm_alloc((size_t)(B + 1) * sizeof(int));
    for (int b = 0; b < B; b++) start[b + 1] = start[b] + m->count[b];
    return start;
}

static void packed_attention_forward(struct block *blk, struct block_acts *acts,
                                     const int *start, int B)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, NH = blk->NH;
    if (blk->hash_buckets) {
        hash_block_attention_forward_segments(blk, acts, start, B);
        return;
    }
    long att = 0;   /* sequence b's (NH, n, n) after the earlier ones' */
    for (int b = 0; b < B; b++) {
        int n = start[b + 1] - start[b];
        if (n == 0) continue;
        ops->attention_forward(acts->atty + (long)start[b] * C, acts->att + att,
                               acts->qkv + 3L * start[b] * C, 1, n, C, NH);
        att += (long)NH * n * n;
    }
}

static void packed_attention_backward(struct block *blk, struct block_acts *acts,
                                      struct block_scratch *s, const int *start, int B)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, NH = blk->NH;
    if (blk->hash_buckets) {
        hash_block_attention_backward_segments(blk, acts, s->d_qkv, s->d_atty, start, B);
        return;
    }
    long att = 0;
    for (int b = 0; b < B; b++) {
        int n = start[b + 1] - start[b];
        if (n == 0) continue;
        ops->attention_backward(s->d_qkv + 3L * start[b] * C, s->d_att + att,
                                s->d_atty + (long)start[b] * C, acts->qkv + 3L * start[b] * C,
                                acts->att + att, 1, n, C, NH);
        att += (long)NH * n * n;
    }
}

/* out (tokens, C) = the block on the packed rows in (tokens, C) */
static void packed_block_forward(struct block *blk, struct block_acts *acts, float *out,
                                 const float *in, const int *start, int B)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = start[B];
    float *const *p = blk->p;
    DM_ASSERT(!blk->moe && !blk->sparse && N <= acts->B * acts->T);
    ops->layernorm_forward(acts->ln1, acts->ln1_mean, acts->ln1_rstd, in, p[BP_LN1_W], p[BP_LN1_B],
                           N, C);
    ops->matmul_forward(acts->qkv, acts->ln1, p[BP_QKV_W], p[BP_QKV_B], N, C, 3 * C);
    packed_attention_forward(blk, acts, start, B);
    ops->matmul_forward_residual(acts->res1, acts->atty, p[BP_ATTPROJ_W], p[BP_ATTPROJ_B], in, N, C,
                                 C);
    ops->layernorm_forward(acts->ln2, acts->ln2_mean, acts->ln2_rstd, acts->res1, p[BP_LN2_W],
                           p[BP_LN2_B], N, C);
    ops->matmul_forward_gelu(acts->fch, acts->fch_gelu, acts->ln2, p[BP_FC_W], p[BP_FC_B], N, C,
                             4 * C);
    ops->matmul_forward_residual(out, acts->fch_gelu, p[BP_FCPROJ_W], p[BP_FCPROJ_B], acts->res1, N,
                                 4 * C, C);
}

/* din (tokens, C) overwritten from dout (may alias din, as in
 * block_backward: dout is not read after din is written); the weight
 * gradients accumulate unless the block is frozen. */
static void packed_block_backward(struct block *blk, struct block_acts *acts,
                                  struct block_scratch *s, float *din, const float *dout,
                                  const float *in, const int *start, int B)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = start[B];
    float *const *p = blk->p;
    static float *const no_grads[BP_COUNT];
    float *const *g = blk->frozen ? no_grads : blk->g;
    ops->matmul_backward_gelu(s->d_fch, g[BP_FCPROJ_W], g[BP_FCPROJ_B], dout, acts->fch_gelu,
                              p[BP_FCPROJ_W], acts->fch, N, 4 * C, C);
    ops->matmul_backward_overwrite(s->d_ln, g[BP_FC_W], g[BP_FC_B], s->d_fch, acts->ln2, p[BP_FC_W],
                                   N, C, 4 * C);
    ops->layernorm_backward_residual(s->d_res1, dout, g[BP_LN2_W], g[BP_LN2_B], s->d_ln, acts->res1,
                                     p[BP_LN2_W], acts->ln2_mean, acts->ln2_rstd, N, C);
    ops->matmul_backward_overwrite(s->d_atty, g[BP_ATTPROJ_W], g[BP_ATTPROJ_B], s->d_res1,
                                   acts->atty, p[BP_ATTPROJ_W], N, C, C);
    packed_attention_backward(blk, acts, s, start, B);
    ops->matmul_backward_overwrite(s->d_ln, g[BP_QKV_W], g[BP_QKV_B], s->d_qkv, acts->ln1,
                                   p[BP_QKV_W], N, C, 3 * C);
    ops->layernorm_backward_residual(din, s->d_res1, g[BP_LN1_W], g[BP_LN1_B], s->d_ln, in,
                                     p[BP_LN1_W], acts->ln1_mean, acts->ln1_rstd, N, C);
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

void mod_combine_forward(float *out, const float *gathered_in, const float *gathered_out,
                         const float *router, const int *rows, int n, int C)
{
    for (int j = 0; j < n; j++) {
        long row = rows[j];
        const float *x = gathered_in + (long)j * C, *f = gathered_out + (long)j * C;
        float r = router[row];
        float *o = out + row * C;
        for (int c = 0; c < C; c++) o[c] = x[c] + r * (f[c] - x[c]);
    }
}

void mod_scale_chosen(float *work, const float *din, const float *router, const int *rows, int n,
                      int C)
{
    for (int j = 0; j < n; j++) {
        long row = rows[j];
        float r = router[row];
        const float *d = din + row * C;
        float *g = work + (long)j * C;
        for (int c = 0; c < C; c++) g[c] = r * d[c];
    }
}

void mod_combine_backward(float *din, float *drouter_weight, const float *gathered_in,
                          const float *gathered_out, const float *work, const float *router,
                          const float *router_weight, const int *rows, int n, int C)
{
    for (int j = 0; j < n; j++) {
        long row = rows[j];
        const float *x = gathered_in + (long)j * C, *f = gathered_out + (long)j * C;
        const float *g = work + (long)j * C;
        float r = router[row];
        float *d = din + row * C;
        float dr = 0.0f;
        for (int c = 0; c < C; c++) dr += d[c] * (f[c] - x[c]);
        for (int c = 0; c < C; c++) d[c] = (1.0f - r) * d[c] + g[c] + dr * router_weight[c];
        if (drouter_weight)
            for (int c = 0; c < C; c++) drouter_weight[c] += dr * x[c];
    }
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
    packed_block_forward(blk, acts, m->gathered_out, m->gathered_in, start, B);
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
    packed_block_backward(blk, acts, s, work, work, m->gathered_in, start, B);
    ops->mod_combine_backward(din, drouter_weight, m->gathered_in, m->gathered_out, work,
                              m->router, router_weight, m->rows, n, C);
    dm_free(start);
}

/* ---- mixture of depths in the model ---------------------------------------------
 * A MoD block's slab: the dense block's tensors, then router_w (C), then,
 * with causal routing, the predictor: pred_w1 (H, C), pred_b1 (H),
 * pred_w2 (H), pred_b2 (1) (dynmo/mod_predictor.h's layout). */

int gpt_block_is_mod(const struct gpt_shape *shape, int index)
{
    return shape->mod.every > 0 && (index + 1) % shape->mod.every == 0;
}

int gpt_mod_block_count(const struct gpt_shape *shape)
{
    return shape->mod.every > 0 ? shape->layers / shape->mod.every : 0;
}

int gpt_mod_ordinal(const struct gpt_shape *shape, int index)
{
    return gpt_block_is_mod(shape, index) ? (index + 1) / shape->mod.every - 1 : -1;
}

size_t mod_extra_param_count(const struct gpt_shape *shape, int index)
{
    if (!gpt_block_is_mod(shape, index)) return 0;
    size_t C = (size_t)shape->channels;
    if (shape->mod.routing != MOD_ROUTING_CAUSAL) return C;
    return C + (size_t)mod_predictor_params(shape->channels, shape->mod.predictor_hidden);
}

void block_mod_alloc(struct block *blk, const struct gpt_shape *shape)
{
    struct block_mod *mod = dm_alloc(sizeof *mod);
    size_t dense = block_param_count(blk->C);
    mod->routing = shape->mod.routing;
    mod->capacity = shape->mod.capacity;
    mod->hidden = mod->routing == MOD_ROUTING_CAUSAL ? shape->mod.predictor_hidden : 0;
    DM_ASSERT(mod->routing != MOD_ROUTING_CAUSAL || mod->hidden >= 1);
    mod->router_w = blk->params + dense;
    mod->router_g = blk->grads + dense;
    if (mod->routing == MOD_ROUTING_CAUSAL) {
        mod->pred_w = mod->router_w + blk->C;
        mod->pred_g = mod->router_g + blk->C;
    }
    blk->mod = mod;
}

void block_mod_free(struct block *blk)
{
    dm_free(blk->mod);
    blk->mod = NULL;
}

/* The router and the predictor's two matrices N(0, 0.02), the
 * predictor's biases 0: router_w on stream (layer, BP_COUNT), pred_w1 on
 * (layer, BP_COUNT + 1), pred_w2 on (layer, BP_COUNT + 2). The logit
 * starts near 0, so the predictor starts near half of the tokens. */
void block_mod_init_weights(struct block *blk, float *params, uint64_t seed)
{
    size_t C = (size_t)blk->C, H = (size_t)blk->mod->hidden;
    float *router_w = params + (blk->mod->router_w - blk->params);
    init_normal(router_w, C, seed, block_tensor_stream(blk->index, BP_COUNT), 0.02f);
    if (!blk->mod->pred_w) return;
    float *w1 = router_w + C, *w2 = w1 + H * C + H;
    init_normal(w1, H * C, seed, block_tensor_stream(blk->index, BP_COUNT + 1), 0.02f);
    memset(w1 + H * C, 0, H * sizeof(float));
    init_normal(w2, H, seed, block_tensor_stream(blk->index, BP_COUNT + 2), 0.02f);
    w2[H] = 0.0f;
}

int block_mod_tensor_count(const struct block *blk)
{
    return blk->mod ? (blk->mod->pred_w ? 5 : 1) : 0;
}

/* The router and the predictor's matrices act like a linear layer's
 * weights and take weight decay (as the MoE router does); the
 * predictor's biases do not. */
int block_mod_tensor_at(const struct block *blk, int k, size_t *offset, size_t *size)
{
    DM_ASSERT(blk->mod && k >= BP_COUNT && k < BP_COUNT + block_mod_tensor_count(blk));
    size_t C = (size_t)blk->C, H = (size_t)blk->mod->hidden;
    const size_t sizes[5] = {C, H * C, H, H, 1};   /* router_w, pred_w1, b1, w2, b2 */
    *offset = block_param_count(blk->C);
    for (int i = 0; i < k - BP_COUNT; i++) *offset += sizes[i];
    *size = sizes[k - BP_COUNT];
    return k == BP_COUNT || k == BP_COUNT + 1 || k == BP_COUNT + 3;
}

void block_mod_acts_free(struct mod_acts *m)
{
    if (!m) return;
    backend_current()->free(m->target);
    mod_acts_free(m);
    dm_free(m);
}

void block_mod_force_choice(struct block *blk, const int *chosen)
{
    DM_ASSERT(blk->mod);
    blk->mod->forced = chosen;
}

static struct mod_acts *mod_acts_of(struct block_acts *acts, int C)
{
    if (!acts->mod) {
        acts->mod = dm_alloc(sizeof *acts->mod);
        mod_acts_alloc(acts->mod, acts->B, acts->T, C);
        acts->mod->target = backend_current()->alloc((size_t)acts->B * acts->T * sizeof(int));
    }
    return acts->mod;
}

void block_mod_forward(struct block *blk, struct block_acts *acts, float *out,
                       const float *in, int B, int T)
{
    struct block_mod *mod = blk->mod;
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

void block_mod_backward(struct block *blk, struct block_acts *acts,
                        struct block_scratch *scratch, float *din, const float *dout,
                        const float *in, int B, int T)
{
    static struct grow_buffer work;   /* (B*T*C) the gathered gradient, then din if NULL */
    struct block_mod *mod = blk->mod;
    int C = blk->C, N = B * T;
    struct mod_acts *m = acts->mod;
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
