/* A block's two halves (balance.units = sublayer, struct block.halves):
 * the attention half then the MLP half, as two stages would run them,
 * against the whole block, bit for bit: the residual stream after
 * attention, the output, the input gradient (also with din aliasing dout),
 * each half's parameter gradients and sum of squares, and one AdamW step
 * that updates only the half a stage holds. No MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "testing.h"

enum { B = 2, T = 24 };
static const struct gpt_shape shape = {.vocab = 40, .max_seq = 32, .layers = 3, .heads = 2,
                                       .channels = 32};

static void fill(float *x, size_t n, uint64_t stream)
{
    for (size_t i = 0; i < n; i++) x[i] = dm_normal(11, stream, i);
}

/* Block `index` alone (no embedding, no head), holding `halves`. */
static void one_block(struct gpt *m, int index, int halves)
{
    gpt_build(m, &shape, index, 1, 0, 0, 5);
    m->blocks[0].halves = halves;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static int all_zero(const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != 0.0f) return 0;
    return 1;
}

static void test_halves(int index)
{
    int C = shape.channels;
    size_t n = (size_t)B * T * C;
    struct gpt whole, attention, mlp;
    one_block(&whole, index, BLOCK_HALVES);
    one_block(&attention, index, BLOCK_HALF_ATTENTION);
    one_block(&mlp, index, BLOCK_HALF_MLP);
    struct block *w = &whole.blocks[0], *a = &attention.blocks[0], *m = &mlp.blocks[0];
    struct block_acts wa, aa, ma;
    block_acts_alloc(&wa, B, T, C, shape.heads);
    block_acts_alloc(&aa, B, T, C, shape.heads);
    block_acts_alloc(&ma, B, T, C, shape.heads);
    struct block_scratch scratch;
    block_scratch_alloc(&scratch, B, T, C, shape.heads);
    float *in = malloc(n * sizeof(float)), *dout = malloc(n * sizeof(float));
    float *out_whole = malloc(n * sizeof(float)), *mid = malloc(n * sizeof(float));
    float *out_half = malloc(n * sizeof(float)), *din_whole = malloc(n * sizeof(float));
    float *dmid = malloc(n * sizeof(float)), *din_half = malloc(n * sizeof(float));
    fill(in, n, 1);
    fill(dout, n, 2);

    block_forward(w, &wa, out_whole, in, B, T);
    block_forward(a, &aa, mid, in, B, T);
    block_forward(m, &ma, out_half, mid, B, T);
    CHECK_MSG(same_bits(mid, wa.res1, n), "block %d: attention half != res1", index);
    CHECK_MSG(same_bits(out_half, out_whole, n), "block %d: halves' output differs", index);

    block_backward(w, &wa, &scratch, din_whole, dout, in, B, T);
    memcpy(dmid, dout, n * sizeof(float));   /* din aliasing dout, as the contract allows */
    block_backward(m, &ma, &scratch, dmid, dmid, mid, B, T);
    block_backward(a, &aa, &scratch, din_half, dmid, in, B, T);
    CHECK_MSG(same_bits(din_half, din_whole, n), "block %d: input gradient differs", index);

    size_t att_at, att_n, mlp_at, mlp_n;
    block_half_range(w, BLOCK_HALF_ATTENTION, &att_at, &att_n);
    block_half_range(w, BLOCK_HALF_MLP, &mlp_at, &mlp_n);
    CHECK(att_at == 0 && mlp_at == att_n && att_n + mlp_n == w->nparams);
    CHECK(att_n == gpt_unit_param_count(&shape, index, BLOCK_HALF_ATTENTION));
    CHECK(mlp_n == gpt_unit_param_count(&shape, index, BLOCK_HALF_MLP));
    CHECK(same_bits(a->grads + att_at, w->grads + att_at, att_n));
    CHECK(same_bits(m->grads + mlp_at, w->grads + mlp_at, mlp_n));
    CHECK(all_zero(a->grads + mlp_at, mlp_n) && all_zero(m->grads + att_at, att_n));
    CHECK(!all_zero(w->grads + att_at, att_n) && !all_zero(w->grads + mlp_at, mlp_n));
    double sa = block_half_grad_sumsq(w, BLOCK_HALF_ATTENTION);
    double sm = block_half_grad_sumsq(w, BLOCK_HALF_MLP);
    CHECK(block_grad_sumsq(a) == sa && block_grad_sumsq(m) == sm && sa > 0 && sm > 0);

    /* One AdamW step: each half updates its own tensors, bit for bit the
     * whole block's, and leaves the other half's parameters alone. */
    float *before = malloc(w->nparams * sizeof(float));
    memcpy(before, a->params, w->nparams * sizeof(float));
    gpt_adamw_update(&whole, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.7f, 1);
    gpt_adamw_update(&attention, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.7f, 1);
    gpt_adamw_update(&mlp, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.7f, 1);
    CHECK(same_bits(a->params + att_at, w->params + att_at, att_n));
    CHECK(same_bits(a->m + att_at, w->m + att_at, att_n));
    CHECK(same_bits(a->v + att_at, w->v + att_at, att_n));
    CHECK(same_bits(m->params + mlp_at, w->params + mlp_at, mlp_n));
    CHECK(same_bits(m->v + mlp_at, w->v + mlp_at, mlp_n));
    CHECK(same_bits(a->params + mlp_at, before + mlp_at, mlp_n));
    CHECK(same_bits(m->params + att_at, before + att_at, att_n));
    CHECK(!same_bits(a->params + att_at, before + att_at, att_n));
    printf("block %d: attention half %zu and MLP half %zu parameters, the whole block's bits\n",
           index, att_n, mlp_n);

    free(before);
    free(in); free(dout); free(out_whole); free(mid); free(out_half);
    free(din_whole); free(dmid); free(din_half);
    block_acts_free(&wa); block_acts_free(&aa); block_acts_free(&ma);
    block_scratch_free(&scratch);
    gpt_free(&whole); gpt_free(&attention); gpt_free(&mlp);
}

static void test_unit_sizes(void)
{
    int C = shape.channels;
    CHECK(gpt_unit_param_count(&shape, 0, BLOCK_HALF_ATTENTION) == 4 * 32 * 32 + 6 * 32);
    CHECK(gpt_unit_param_count(&shape, 0, BLOCK_HALF_MLP) == 8 * 32 * 32 + 7 * 32);
    CHECK(gpt_unit_param_count(&shape, 0, BLOCK_HALVES) == block_param_count(C));
    CHECK(block_half_matrix_weights(C, BLOCK_HALF_ATTENTION) +
              block_half_matrix_weights(C, BLOCK_HALF_MLP) ==
          block_matrix_weights(C));
}

int main(void)
{
    dm_threads_init(2);
    test_unit_sizes();
    test_halves(0);
    test_halves(2);
    dm_threads_shutdown();
    return testing_report("test_sublayer");
}
