/* Mixture of depths (Raposo et al. 2024) around one transformer block: the
 * scalar router, the two ways of choosing tokens (top-k over a sequence,
 * or a causal predictor trained against the top-k choice), and the block's
 * forward and backward over the chosen tokens only.
 *
 * The chosen tokens of each sequence are gathered, in ascending position,
 * into a dense (B, kmax) batch and run through the ordinary block: causal
 * attention among gathered rows in ascending order is causal attention at
 * the original positions, and a sequence with fewer than kmax chosen
 * tokens is padded at its end with zero rows, which no real token sees
 * (they come later) and whose gradient is zero. The cost therefore follows
 * kmax, the tokens the block processed. A chosen token leaves the block as
 * x + r (f(x) - x) with f the block and r = w . x; every other token passes
 * through bit for bit. Nothing here calls MPI or reads a layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/model.h"
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

float mod_predictor_forward_backward(float *dweight, int *chosen, const float *in,
                                     const float *weight, const int *target, int N, int C)
{
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        const float *x = in + (long)n * C;
        float logit = 0.0f;
        for (int c = 0; c < C; c++) logit += weight[c] * x[c];
        if (chosen) chosen[n] = logit > 0.0f;
        if (!target) continue;
        float y = target[n] ? 1.0f : 0.0f;
        /* BCE with logits, the stable form torch uses */
        float l = (logit > 0.0f ? logit : 0.0f) - logit * y + log1pf(expf(-fabsf(logit)));
        loss += l;
        if (dweight) {
            float p = 1.0f / (1.0f + expf(-logit));
            float g = (p - y) / (float)N;
            for (int c = 0; c < C; c++) dweight[c] += g * x[c];
        }
    }
    return target ? (float)(loss / N) : 0.0f;
}

void mod_acts_alloc(struct mod_acts *m, int B, int T, int C)
{
    memset(m, 0, sizeof *m);
    m->B = B;
    m->T = T;
    m->C = C;
    m->count = dm_alloc((size_t)B * sizeof(int));
    m->pos = dm_alloc((size_t)B * T * sizeof(int));
    m->chosen = dm_alloc((size_t)B * T * sizeof(int));
    m->router = dm_alloc((size_t)B * T * sizeof(float));
    m->gathered_in = dm_alloc((size_t)B * T * C * sizeof(float));
    m->gathered_out = dm_alloc((size_t)B * T * C * sizeof(float));
}

void mod_acts_free(struct mod_acts *m)
{
    dm_free(m->count);
    dm_free(m->pos);
    dm_free(m->chosen);
    dm_free(m->router);
    dm_free(m->gathered_in);
    dm_free(m->gathered_out);
    memset(m, 0, sizeof *m);
}

void mod_block_forward(struct block *blk, struct block_acts *acts, struct mod_acts *m,
                       float *out, const float *in, const float *router_weight,
                       const int *chosen, int B, int T)
{
    int C = blk->C, N = B * T;
    DM_ASSERT(B <= m->B && T <= m->T && C == m->C);
    mod_router_forward(m->router, in, router_weight, N, C);
    if (chosen != m->chosen) memcpy(m->chosen, chosen, (size_t)N * sizeof(int));
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
    if (out != in) parallel_copy(out, in, (long)N * C);
    int K = m->kmax;
    if (K == 0) return;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < K; i++) {
            float *dst = m->gathered_in + ((long)b * K + i) * C;
            if (i < m->count[b])
                memcpy(dst, in + ((long)b * T + m->pos[(long)b * T + i]) * C,
                       (size_t)C * sizeof(float));
            else
                memset(dst, 0, (size_t)C * sizeof(float));
        }
    block_forward(blk, acts, m->gathered_out, m->gathered_in, B, K);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < m->count[b]; i++) {
            long row = (long)b * T + m->pos[(long)b * T + i];
            const float *x = m->gathered_in + ((long)b * K + i) * C;
            const float *f = m->gathered_out + ((long)b * K + i) * C;
            float r = m->router[row];
            float *o = out + row * C;
            for (int c = 0; c < C; c++) o[c] = x[c] + r * (f[c] - x[c]);
        }
}

void mod_block_backward(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                        struct mod_acts *m, float *din, float *drouter_weight,
                        const float *dout, const float *router_weight, int B, int T,
                        float *work)
{
    int C = blk->C, N = B * T, K = m->kmax;
    if (din != dout) parallel_copy(din, dout, (long)N * C);
    if (K == 0) return;
    /* work (B*K, C): the block output's gradient r dout (zero on padding),
     * then, in place, the block input's */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < K; i++) {
            float *g = work + ((long)b * K + i) * C;
            if (i >= m->count[b]) {
                memset(g, 0, (size_t)C * sizeof(float));
                continue;
            }
            long row = (long)b * T + m->pos[(long)b * T + i];
            float r = m->router[row];
            const float *d = din + row * C;
            for (int c = 0; c < C; c++) g[c] = r * d[c];
        }
    block_backward(blk, acts, s, work, work, m->gathered_in, B, K);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < m->count[b]; i++) {
            long row = (long)b * T + m->pos[(long)b * T + i];
            const float *x = m->gathered_in + ((long)b * K + i) * C;
            const float *f = m->gathered_out + ((long)b * K + i) * C;
            const float *g = work + ((long)b * K + i) * C;
            float r = m->router[row];
            float *d = din + row * C;
            float dr = 0.0f;
            for (int c = 0; c < C; c++) dr += d[c] * (f[c] - x[c]);
            for (int c = 0; c < C; c++)
                d[c] = (1.0f - r) * d[c] + g[c] + dr * router_weight[c];
            if (drouter_weight && !blk->frozen)
                for (int c = 0; c < C; c++) drouter_weight[c] += dr * x[c];
        }
}

/* ---- mixture of depths in the model ---------------------------------------------
 * A MoD block's slab: the dense block's tensors, then router_w (C), then,
 * with causal routing, pred_w (C). */

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
    return (size_t)shape->channels * (shape->mod.routing == MOD_ROUTING_CAUSAL ? 2 : 1);
}

void block_mod_alloc(struct block *blk, const struct gpt_shape *shape)
{
    struct block_mod *mod = dm_alloc(sizeof *mod);
    size_t dense = block_param_count(blk->C);
    mod->routing = shape->mod.routing;
    mod->capacity = shape->mod.capacity;
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

void block_mod_init_weights(struct block *blk, uint64_t seed)
{
    size_t C = (size_t)blk->C;
    init_normal(blk->mod->router_w, C, seed, block_tensor_stream(blk->index, BP_COUNT), 0.02f);
    if (blk->mod->pred_w)
        init_normal(blk->mod->pred_w, C, seed, block_tensor_stream(blk->index, BP_COUNT + 1),
                    0.02f);
}

int block_mod_tensor_count(const struct block *blk)
{
    return blk->mod ? (blk->mod->pred_w ? 2 : 1) : 0;
}

/* Router and predictor are vectors that act like a linear layer's weights:
 * they take weight decay (as the MoE router does). */
int block_mod_tensor_at(const struct block *blk, int k, size_t *offset, size_t *size)
{
    DM_ASSERT(blk->mod && k >= BP_COUNT && k < BP_COUNT + block_mod_tensor_count(blk));
    *offset = block_param_count(blk->C) + (size_t)(k - BP_COUNT) * (size_t)blk->C;
    *size = (size_t)blk->C;
    return 1;
}

void block_mod_acts_free(struct mod_acts *m)
{
    if (!m) return;
    dm_free(m->target);
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
        acts->mod->target = dm_alloc((size_t)acts->B * acts->T * sizeof(int));
    }
    return acts->mod;
}

void block_mod_forward(struct block *blk, struct block_acts *acts, float *out,
                       const float *in, int B, int T)
{
    struct block_mod *mod = blk->mod;
    int C = blk->C, N = B * T;
    struct mod_acts *m = mod_acts_of(acts, C);
    mod_router_forward(m->router, in, mod->router_w, N, C);
    mod_select_topk(m->target, m->router, B, T, mod_capacity_tokens(mod->capacity, T));
    const int *chosen = m->target;
    if (mod->forced) {
        chosen = mod->forced;
    } else if (mod->routing == MOD_ROUTING_CAUSAL) {
        mod->bce += mod_predictor_forward_backward(NULL, m->chosen, in, mod->pred_w,
                                                   m->target, N, C);
        chosen = m->chosen;
    }
    mod_block_forward(blk, acts, m, out, in, mod->router_w, chosen, B, T);
    mod->tokens += (double)m->tokens;
}

/* The predictor's gradient: mean BCE over the micro-batch's tokens against
 * the top-k choice, times the loss scale (it is trained as a loss term). */
static void predictor_backward(struct block_mod *mod, const struct mod_acts *m,
                               const float *in, int N, int C, float loss_scale)
{
    float *dw = dm_alloc((size_t)C * sizeof(float));
    mod_predictor_forward_backward(dw, NULL, in, mod->pred_w, m->target, N, C);
    for (int c = 0; c < C; c++) mod->pred_g[c] += loss_scale * dw[c];
    dm_free(dw);
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
    float *w = grow_buffer_get(&work, din ? btc : 2 * btc);
    float *d = din ? din : w + btc;
    mod_block_backward(blk, acts, scratch, m, d, blk->frozen ? NULL : mod->router_g, dout,
                       mod->router_w, B, T, w);
    if (mod->pred_w && !blk->frozen && !mod->forced)
        predictor_backward(mod, m, in, N, C, acts->loss_scale);
}
