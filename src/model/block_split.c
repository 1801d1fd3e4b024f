/* The transformer block's backward in two parts, for the zero-bubble
 * schedule: the input part (B) computes the gradient the previous block or
 * stage waits for and keeps the output gradients of the block's weighted
 * ops; the weight part (W) accumulates the weight gradients from them.
 * Each op is called as block.c's dense backward calls it, once for its
 * input gradient and once for its weight gradients, so the two parts add
 * up to block_backward bit for bit (test_block_split); a pruned block's
 * CSR products split the same way (their input and weight outputs are
 * computed apart). Must not: change
 * an op's arguments or order from block.c's dense backward, or run the
 * weight part of a frozen block. */
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/block_ext.h"
#include "dynmo/model.h"
#include "model/internal.h"

void block_wgrad_alloc(struct block_wgrad *w, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    memset(w, 0, sizeof *w);
    w->mem = backend_current()->alloc(11 * n * sizeof(float));
    w->dout = w->mem;
    w->d_fch = w->dout + n;
    w->d_ln2 = w->d_fch + 4 * n;
    w->d_res1 = w->d_ln2 + n;
    w->d_qkv = w->d_res1 + n;
    w->d_ln1 = w->d_qkv + 3 * n;
}

void block_wgrad_free(struct block_wgrad *w)
{
    backend_current()->free(w->mem);
    memset(w, 0, sizeof *w);
}

/* Whether an extension's hook replaces the block's backward (mixture of
 * depths), or the MLP's of a half: then the backward runs whole in the
 * input part. An attention core of its own (hash attention) has no
 * weights: it runs in the input part in the dense core's place, and the
 * weight part stays deferred. */
static int backward_replaced(const struct block *blk)
{
    for (int i = 0; i < blk->ext_count; i++) {
        const struct gpt_ext_ops *ops = blk->ext[i].ops;
        if (ops->block_backward || (ops->mlp_backward && block_is_half(blk))) return 1;
    }
    return 0;
}

/* The extension whose MLP replaces the dense one (mixture of experts), or
 * NULL. */
static const struct block_ext_slot *mlp_extension(const struct block *blk)
{
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops->mlp_backward) return &blk->ext[i];
    return NULL;
}

/* An extension's MLP backward, whole (its weights' gradients and its
 * exchange included), then ln2's with its weights, as block.c's dense
 * backward runs them: d_res1 from dout. */
static void extension_mlp_input(struct block *blk, const struct block_ext_slot *x,
                                struct block_acts *acts, struct block_scratch *s,
                                struct block_wgrad *w, const float *dout, int N)
{
    int C = blk->C;
    float *lnw = blk->frozen ? NULL : blk->g[BP_LN2_W], *lnb = blk->frozen ? NULL : blk->g[BP_LN2_B];
    x->ops->mlp_backward(blk, x->state, acts, s->d_ln, dout, N);
    backend_current()->layernorm_backward_residual(w->d_res1, dout, lnw, lnb, s->d_ln,
                                                   acts->res1, blk->p[BP_LN2_W],
                                                   acts->ln2_mean, acts->ln2_rstd, N, C);
}

/* The attention core's input gradient: dqkv from datty, through an
 * extension's core when one replaces it (block.c's attention_core_backward
 * over the whole batch). */
static void core_backward(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                          float *dqkv, int B, int T)
{
    for (int i = 0; i < blk->ext_count; i++) {
        const struct gpt_ext_ops *ops = blk->ext[i].ops;
        if (ops->attention_backward) {
            ops->attention_backward(blk, blk->ext[i].state, acts, dqkv, s->d_atty, NULL, B, T);
            return;
        }
    }
    backend_current()->attention_backward(dqkv, s->d_att, s->d_atty, acts->qkv, acts->att, B, T,
                                          blk->C, blk->NH);
}

/* The input gradient of product k (dinp from dout; through GELU's
 * derivative at gelu_inp when given), dense or in CSR. */
static void input_product(const struct block *blk, int k, float *dinp, const float *dout,
                          const float *inp, int N, int C, int OC, const float *gelu_inp)
{
    const struct dm_backend *ops = backend_current();
    const struct csr_matrix *w = block_csr_of(blk, k);
    if (w) {
        ops->sparse_matmul_backward(dinp, NULL, NULL, dout, inp, w->row_ptr, w->col_idx,
                                    w->values, w->nnz, N, C, OC);
        if (gelu_inp) ops->gelu_backward(dinp, gelu_inp, dinp, (long)N * C);
    } else if (gelu_inp) {
        ops->matmul_backward_gelu(dinp, NULL, NULL, dout, inp, blk->p[k], gelu_inp, N, C, OC);
    } else {
        ops->matmul_backward_overwrite(dinp, NULL, NULL, dout, inp, blk->p[k], N, C, OC);
    }
}

/* The weight and bias gradients of product k, dense or in CSR. */
static void weight_product(const struct block *blk, int k, const float *dout, const float *inp,
                           int N, int C, int OC)
{
    const struct dm_backend *ops = backend_current();
    const struct csr_matrix *w = block_csr_of(blk, k);
    float *const *g = blk->g;
    if (w)
        ops->sparse_matmul_backward(NULL, g[k], g[k + 1], dout, inp, w->row_ptr, w->col_idx,
                                    w->values, w->nnz, N, C, OC);
    else
        ops->matmul_backward(NULL, g[k], g[k + 1], dout, inp, NULL, N, C, OC);
}

/* The MLP part's input gradient: from the block's output gradient dout
 * to the gradient of the residual stream after attention, d_res1, with
 * res1 that stream (the whole block's acts->res1, an MLP half's input). */
static void mlp_input(struct block *blk, struct block_acts *acts, struct block_wgrad *w,
                      float *d_res1, const float *dout, const float *res1, int N)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C;
    float *const *p = blk->p;
    /* din may alias dout: the weight part reads its own copy */
    if (!blk->frozen) ops->copy_on_device(w->dout, dout, (size_t)N * C * sizeof(float));
    input_product(blk, BP_FCPROJ_W, w->d_fch, dout, acts->fch_gelu, N, 4 * C, C, acts->fch);
    input_product(blk, BP_FC_W, w->d_ln2, w->d_fch, acts->ln2, N, C, 4 * C, NULL);
    ops->layernorm_backward_residual(d_res1, dout, NULL, NULL, w->d_ln2, res1, p[BP_LN2_W],
                                     acts->ln2_mean, acts->ln2_rstd, N, C);
}

/* The attention part's input gradient: from w->d_res1 to din. */
static void attention_input(struct block *blk, struct block_acts *acts,
                            struct block_scratch *s, struct block_wgrad *w, float *din,
                            const float *in, int B, int T)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    float *const *p = blk->p;
    input_product(blk, BP_ATTPROJ_W, s->d_atty, w->d_res1, acts->atty, N, C, C, NULL);
    core_backward(blk, acts, s, w->d_qkv, B, T);
    input_product(blk, BP_QKV_W, w->d_ln1, w->d_qkv, acts->ln1, N, C, 3 * C, NULL);
    ops->layernorm_backward_residual(din, w->d_res1, NULL, NULL, w->d_ln1, in, p[BP_LN1_W],
                                     acts->ln1_mean, acts->ln1_rstd, N, C);
}

/* A half (balance.units = sublayer, blk->halves one half) as block.c's
 * half_backward: the MLP half leaves d_res1 in the scratch's d_res1 and
 * copies it to din when there is one; the attention half takes dout as
 * d_res1 (which may be the scratch's, where an MLP half left it). */
static void half_input(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                       struct block_wgrad *w, float *din, const float *dout, const float *in,
                       int B, int T)
{
    const struct dm_backend *ops = backend_current();
    size_t bytes = (size_t)B * T * blk->C * sizeof(float);
    if (blk->halves == BLOCK_HALF_MLP) {
        mlp_input(blk, acts, w, s->d_res1, dout, in, B * T);
        if (din) ops->copy_on_device(din, s->d_res1, bytes);
        return;
    }
    ops->copy_on_device(w->d_res1, dout, bytes);
    attention_input(blk, acts, s, w, din, in, B, T);
}

void block_backward_input(struct block *blk, struct block_acts *acts,
                          struct block_scratch *s, struct block_wgrad *w, float *din,
                          const float *dout, const float *in, int B, int T)
{
    w->fused = backward_replaced(blk);
    w->mlp_fused = 0;
    if (w->fused) {
        block_backward(blk, acts, s, din, dout, in, B, T);
        return;
    }
    if (block_is_half(blk)) {
        half_input(blk, acts, s, w, din, dout, in, B, T);
        return;
    }
    const struct block_ext_slot *x = mlp_extension(blk);
    w->mlp_fused = x != NULL;
    if (x) extension_mlp_input(blk, x, acts, s, w, dout, B * T);
    else mlp_input(blk, acts, w, w->d_res1, dout, acts->res1, B * T);
    attention_input(blk, acts, s, w, din, in, B, T);
}

/* The weight parts: the MLP's (res1 the stream after attention) and the
 * attention's. */
static void mlp_weight(struct block *blk, const struct block_acts *acts,
                       const struct block_wgrad *w, const float *res1, int N)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C;
    float *const *g = blk->g;
    weight_product(blk, BP_FCPROJ_W, w->dout, acts->fch_gelu, N, 4 * C, C);
    weight_product(blk, BP_FC_W, w->d_fch, acts->ln2, N, C, 4 * C);
    ops->layernorm_backward_residual(NULL, NULL, g[BP_LN2_W], g[BP_LN2_B], w->d_ln2, res1,
                                     NULL, acts->ln2_mean, acts->ln2_rstd, N, C);
}

static void attention_weight(struct block *blk, const struct block_acts *acts,
                             const struct block_wgrad *w, const float *in, int N)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C;
    float *const *g = blk->g;
    weight_product(blk, BP_ATTPROJ_W, w->d_res1, acts->atty, N, C, C);
    weight_product(blk, BP_QKV_W, w->d_qkv, acts->ln1, N, C, 3 * C);
    ops->layernorm_backward_residual(NULL, NULL, g[BP_LN1_W], g[BP_LN1_B], w->d_ln1, in, NULL,
                                     acts->ln1_mean, acts->ln1_rstd, N, C);
}

void block_backward_weight(struct block *blk, const struct block_acts *acts,
                           const struct block_wgrad *w, const float *in, int B, int T)
{
    if (w->fused || blk->frozen) return;
    int N = B * T;
    if (blk->halves == BLOCK_HALF_MLP) {   /* in: the stream after attention */
        mlp_weight(blk, acts, w, in, N);
        return;
    }
    if (blk->halves != BLOCK_HALF_ATTENTION && !w->mlp_fused)
        mlp_weight(blk, acts, w, acts->res1, N);
    attention_weight(blk, acts, w, in, N);
}
