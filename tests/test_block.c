/* test_block: the block slab and what the rest of dynmo relies on it for.
 *
 * - layout: parameter counts and offsets as model.h states them;
 * - initialisation depends only on (seed, layer index): a block built
 *   alone, inside a whole model or inside any stage's range has the same
 *   bits, and the statistics are the stated ones;
 * - block_pack/block_unpack round-trip bit for bit, and every header or
 *   payload mismatch is refused with a message, leaving the block as it was;
 * - determinism: training steps give bit-identical losses, gradients and
 *   parameters run to run and for 1, 2 or 3 threads;
 * - layouts: the model cut into pipeline stages (run one after another,
 *   activations and gradients handed across by hand) gives the same bits
 *   as the whole model, with gradient accumulation over micro-batches and
 *   the tied wte gradient formed by gpt_tie_wte_grads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/model.h"
#include "testing.h"

static void fill_normal(float *x, long n, uint64_t stream, float std)
{
    for (long i = 0; i < n; i++) x[i] = std * dm_normal(99, stream, (uint64_t)i);
}

static int same_floats(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* ---- layout ------------------------------------------------------------------- */

static void test_layout(void)
{
    for (int C = 8; C <= 256; C *= 4) {
        size_t c = (size_t)C;
        CHECK(block_param_count(C) == 12 * c * c + 13 * c);
        size_t off = 0;
        for (int k = 0; k < BP_COUNT; k++) {
            CHECK(block_tensor_offset(C, k) == off);
            off += block_tensor_size(C, k);
        }
        CHECK(off == block_param_count(C));
        CHECK(block_tensor_size(C, BP_QKV_W) == 3 * c * c);
        CHECK(block_tensor_size(C, BP_FCPROJ_W) == 4 * c * c);
    }
    int matrices = 0;
    for (int k = 0; k < BP_COUNT; k++) matrices += block_tensor_is_matrix(k);
    CHECK(matrices == 4);
    CHECK(block_tensor_is_matrix(BP_QKV_W) && block_tensor_is_matrix(BP_FCPROJ_W));
    CHECK(!block_tensor_is_matrix(BP_LN1_W) && !block_tensor_is_matrix(BP_FC_B));
    struct gpt_shape s = {.vocab = 256, .max_seq = 256, .layers = 8, .heads = 4, .channels = 256};
    CHECK(gpt_param_count(&s) == 256 * 256 + 256 * 256 + 8 * block_param_count(256) + 512);
}

/* ---- initialisation --------------------------------------------------------------- */

static double tensor_std(const float *x, size_t n, double *mean_out)
{
    double mean = 0.0, var = 0.0;
    for (size_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    *mean_out = mean;
    return sqrt(var / (double)n);
}

static void test_init(void)
{
    struct gpt_shape s = {.vocab = 50, .max_seq = 40, .layers = 6, .heads = 4, .channels = 64};
    struct block a, b, c;
    block_init(&a, 3, &s, 7);
    block_init(&b, 3, &s, 7);
    CHECK(a.index == 3 && a.C == 64 && a.NH == 4 && a.nparams == block_param_count(64));
    CHECK(same_floats(a.params, b.params, a.nparams));
    size_t zeros = 0;
    for (size_t i = 0; i < 3 * a.nparams; i++) zeros += a.grads[i] == 0.0f;
    CHECK_MSG(zeros == 3 * a.nparams, "grads, m and v start at zero");

    /* the same layer inside a whole model and inside a stage's range */
    struct gpt whole, stage;
    gpt_build(&whole, &s, 0, s.layers, 1, 1, 7);
    gpt_build(&stage, &s, 2, 3, 0, 0, 7);
    CHECK(same_floats(whole.blocks[3].params, a.params, a.nparams));
    CHECK(stage.blocks[1].index == 3);
    CHECK(same_floats(stage.blocks[1].params, a.params, a.nparams));
    CHECK(stage.embed_slab == NULL && stage.wte == NULL);

    /* the embedding is the same on the first and on the last stage */
    struct gpt first, last;
    gpt_build(&first, &s, 0, 1, 1, 0, 7);
    gpt_build(&last, &s, 5, 1, 0, 1, 7);
    size_t VC = (size_t)s.vocab * s.channels;
    CHECK(same_floats(first.wte, whole.wte, VC));
    CHECK(same_floats(last.wte, whole.wte, VC));
    CHECK(same_floats(first.wpe, whole.wpe, (size_t)s.max_seq * s.channels));
    CHECK(last.dwte_head != NULL && first.dwte_head == NULL);

    /* other seed or other layer: other weights */
    block_init(&c, 3, &s, 8);
    CHECK(!same_floats(c.p[BP_QKV_W], a.p[BP_QKV_W], block_tensor_size(64, BP_QKV_W)));
    block_free(&c);
    block_init(&c, 4, &s, 7);
    CHECK(!same_floats(c.p[BP_QKV_W], a.p[BP_QKV_W], block_tensor_size(64, BP_QKV_W)));
    CHECK(!same_floats(c.p[BP_FC_W], a.p[BP_FC_W], block_tensor_size(64, BP_FC_W)));

    /* the stated distributions (std within 5%, mean within 4 standard errors) */
    double mean, std;
    for (int k = 0; k < BP_COUNT; k++) {
        size_t n = block_tensor_size(64, k);
        std = tensor_std(a.p[k], n, &mean);
        if (block_tensor_is_matrix(k)) {
            double want = (k == BP_ATTPROJ_W || k == BP_FCPROJ_W) ? 0.02 / sqrt(2.0 * s.layers)
                                                                  : 0.02;
            CHECK_MSG(fabs(std / want - 1) < 0.05, "tensor %d std %.5f, want %.5f", k, std, want);
            CHECK_MSG(fabs(mean) < 4 * want / sqrt((double)n), "tensor %d mean %.2e", k, mean);
        } else {
            float want = (k == BP_LN1_W || k == BP_LN2_W) ? 1.0f : 0.0f;
            size_t ok = 0;
            for (size_t i = 0; i < n; i++) ok += a.p[k][i] == want;
            CHECK_MSG(ok == n, "tensor %d is not all %g", k, want);
        }
    }
    std = tensor_std(whole.wte, VC, &mean);
    CHECK_MSG(fabs(std / 0.02 - 1) < 0.05, "wte std %.5f", std);
    std = tensor_std(whole.wpe, (size_t)s.max_seq * s.channels, &mean);
    CHECK_MSG(fabs(std / 0.02 - 1) < 0.05, "wpe std %.5f", std);
    for (int i = 0; i < s.channels; i++) {
        CHECK(whole.lnf_w[i] == 1.0f);
        CHECK(whole.lnf_b[i] == 0.0f);
    }
    block_free(&a); block_free(&b); block_free(&c);
    gpt_free(&whole); gpt_free(&stage); gpt_free(&first); gpt_free(&last);
}

/* ---- pack and unpack ------------------------------------------------------------------- */

static int unpack_fails(struct block *blk, const void *buf, size_t bytes,
                        const struct gpt_shape *s, const char *must_mention)
{
    char err[256] = "";
    int rc = block_unpack(blk, buf, bytes, s, err, sizeof err);
    printf("  refused as expected: %s\n", err);
    return rc == -1 && strstr(err, must_mention) != NULL;
}

static void test_pack(void)
{
    struct gpt_shape s = {.vocab = 16, .max_seq = 16, .layers = 4, .heads = 2, .channels = 24};
    struct block blk;
    block_init(&blk, 2, &s, 1);
    fill_normal(blk.params, (long)blk.nparams, 1, 1.0f);
    fill_normal(blk.m, (long)blk.nparams, 2, 1.0f);
    fill_normal(blk.v, (long)blk.nparams, 3, 1.0f);
    fill_normal(blk.grads, (long)blk.nparams, 4, 1.0f);
    size_t bytes = block_pack_size(&blk);
    CHECK(bytes == 64 + 3 * blk.nparams * sizeof(float));
    unsigned char *buf = malloc(bytes), *buf2 = malloc(bytes), *bad = malloc(bytes + 8);
    block_pack(&blk, buf);
    CHECK(memcmp(buf, "DMBLOCK1", 8) == 0);
    block_pack(&blk, buf2);
    CHECK_MSG(memcmp(buf, buf2, bytes) == 0, "packing twice gives the same bytes");

    /* into a zeroed struct: allocated as the layer the header names */
    struct block copy = {0};
    char err[256] = "";
    CHECK(block_unpack(&copy, buf, bytes, &s, err, sizeof err) == 0);
    CHECK(copy.index == 2 && copy.C == 24 && copy.NH == 2 && copy.nparams == blk.nparams);
    CHECK(same_floats(copy.params, blk.params, blk.nparams));
    CHECK(same_floats(copy.m, blk.m, blk.nparams));
    CHECK(same_floats(copy.v, blk.v, blk.nparams));
    size_t zeros = 0;
    for (size_t i = 0; i < copy.nparams; i++) zeros += copy.grads[i] == 0.0f;
    CHECK(zeros == copy.nparams);
    CHECK(copy.p[BP_FC_W] == copy.params + block_tensor_offset(24, BP_FC_W));
    block_pack(&copy, buf2);
    CHECK_MSG(memcmp(buf, buf2, bytes) == 0, "pack(unpack(pack(b))) == pack(b)");

    /* into an allocated block of the same layer: replaced */
    struct block same;
    block_init(&same, 2, &s, 5);
    CHECK(block_unpack(&same, buf, bytes, &s, err, sizeof err) == 0);
    CHECK(same_floats(same.params, blk.params, blk.nparams));
    CHECK(same_floats(same.v, blk.v, blk.nparams));

    /* refusals, each leaving the target untouched */
    struct block layer1, other;
    block_init(&layer1, 1, &s, 5);
    CHECK(unpack_fails(&layer1, buf, bytes, &s, "expected layer 1"));
    block_init(&other, 2, &s, 5);
    float *before = malloc(other.slab_floats * sizeof(float));
    memcpy(before, other.slab, other.slab_floats * sizeof(float));
    struct gpt_shape wider = s, more_heads = s, shallower = s;
    wider.channels = 32;
    more_heads.heads = 4;
    shallower.layers = 2;
    CHECK(unpack_fails(&other, buf, bytes, &wider, "channels"));
    CHECK(unpack_fails(&other, buf, bytes, &more_heads, "heads"));
    CHECK(unpack_fails(&other, buf, bytes, &shallower, "outside"));
    CHECK(unpack_fails(&other, buf, bytes - 1, &s, "bytes"));
    memcpy(bad, buf, bytes);
    memset(bad + bytes, 0, 8);
    CHECK(unpack_fails(&other, bad, bytes + 4, &s, "bytes"));
    CHECK(unpack_fails(&other, buf, 10, &s, "header"));
    memcpy(bad, buf, bytes);
    bad[0] = 'X';
    CHECK(unpack_fails(&other, bad, bytes, &s, "magic"));
    memcpy(bad, buf, bytes);
    bad[8] = 32;                              /* header_bytes */
    CHECK(unpack_fails(&other, bad, bytes, &s, "version"));
    memcpy(bad, buf, bytes);
    bad[32 + 7] = 0x80;                       /* flags: bit 63, not defined */
    CHECK(unpack_fails(&other, bad, bytes, &s, "flags"));
    memcpy(bad, buf, bytes);
    bad[64 + 1000] ^= 0x10;                   /* one bit of the parameters */
    CHECK(unpack_fails(&other, bad, bytes, &s, "checksum"));
    memcpy(bad, buf, bytes);
    bad[bytes - 1] ^= 0x01;                   /* one bit of the last v */
    CHECK(unpack_fails(&other, bad, bytes, &s, "checksum"));
    CHECK_MSG(memcmp(before, other.slab, other.slab_floats * sizeof(float)) == 0,
              "a refused unpack changed the block");
    struct block fresh = {0};
    memcpy(bad, buf, bytes);
    bad[12] = 9;                              /* layer index 9 of 4 */
    CHECK(unpack_fails(&fresh, bad, bytes, &s, "outside"));
    CHECK(fresh.slab == NULL);

    free(buf); free(buf2); free(bad); free(before);
    block_free(&blk); block_free(&copy); block_free(&same); block_free(&other);
    block_free(&layer1);
}

/* ---- determinism across runs and thread counts -------------------------------------------- */

static const struct gpt_shape det_shape = {.vocab = 64, .max_seq = 96, .layers = 2,
                                           .heads = 4, .channels = 64};
enum { DET_B = 3, DET_T = 80, DET_STEPS = 3 };

struct run_result {
    float losses[DET_STEPS];
    double sumsq[DET_STEPS];
    float *grads, *params;       /* after the last step's backward / update */
};

static void set_batch(int *tokens, int *targets, int n, int step, int vocab)
{
    for (int i = 0; i < n; i++) {
        tokens[i] = (int)(dm_hash64(3, (uint64_t)step, (uint64_t)i) % (uint64_t)vocab);
        targets[i] = (int)(dm_hash64(4, (uint64_t)step, (uint64_t)i) % (uint64_t)vocab);
    }
}

static void train_run(int threads, struct run_result *r)
{
    dm_threads_shutdown();
    dm_threads_init(threads);
    struct gpt model;
    gpt_build(&model, &det_shape, 0, det_shape.layers, 1, 1, 5);
    struct gpt_acts acts;
    struct block_scratch scratch;
    gpt_acts_alloc(&acts, &model, DET_B, DET_T);
    block_scratch_alloc(&scratch, DET_B, DET_T, det_shape.channels, det_shape.heads);
    size_t P = gpt_param_count(&det_shape);
    r->grads = malloc(P * sizeof(float));
    r->params = malloc(P * sizeof(float));
    for (int step = 0; step < DET_STEPS; step++) {
        set_batch(acts.tokens, acts.targets, DET_B * DET_T, 0, det_shape.vocab);
        r->losses[step] = gpt_forward(&model, &acts);
        gpt_backward(&model, &acts, &scratch, 1.0f, NULL, NULL);
        gpt_tie_wte_grads(&model, NULL);
        r->sumsq[step] = gpt_grad_sumsq(&model);
        gpt_grads_to_flat(&model, r->grads);
        gpt_adamw_update(&model, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.7f, step + 1);
        gpt_zero_grads(&model);
    }
    gpt_params_to_flat(&model, r->params);
    gpt_acts_free(&acts);
    block_scratch_free(&scratch);
    gpt_free(&model);
}

static int same_run(const struct run_result *a, const struct run_result *b)
{
    size_t P = gpt_param_count(&det_shape);
    return memcmp(a->losses, b->losses, sizeof a->losses) == 0 &&
           memcmp(a->sumsq, b->sumsq, sizeof a->sumsq) == 0 &&
           same_floats(a->grads, b->grads, P) && same_floats(a->params, b->params, P);
}

static void test_determinism(void)
{
    struct run_result two, again, one, three;
    train_run(2, &two);
    train_run(2, &again);
    train_run(1, &one);
    train_run(3, &three);
    printf("determinism: losses %.7f %.7f %.7f\n", two.losses[0], two.losses[1], two.losses[2]);
    CHECK_MSG(two.losses[2] < two.losses[0], "the loss goes down on a repeated batch");
    CHECK_MSG(same_run(&two, &again), "two runs with 2 threads differ");
    CHECK_MSG(same_run(&two, &one), "1 thread and 2 threads differ");
    CHECK_MSG(same_run(&two, &three), "3 threads and 2 threads differ");
    struct run_result *all[] = {&two, &again, &one, &three};
    for (int i = 0; i < 4; i++) {
        free(all[i]->grads);
        free(all[i]->params);
    }
    dm_threads_shutdown();
    dm_threads_init(2);
}

/* ---- pipeline layouts against the whole model ----------------------------------------------- */

enum { PIPE_MICRO = 2, PIPE_B = 2, PIPE_T = 70, MAX_STAGES = 4 };

struct stage {
    struct gpt model;
    struct gpt_acts acts;
};

/* Runs one accumulation step (PIPE_MICRO micro-batches) through the stages
 * [bounds[s], bounds[s+1]) and checks every result against `whole`,
 * which has run the same step. */
static void check_layout(const struct gpt *whole, const float *whole_losses, const int *bounds,
                         int nstages, struct block_scratch *scratch)
{
    const struct gpt_shape *s = &whole->shape;
    long BTC = (long)PIPE_B * PIPE_T * s->channels, VC = (long)s->vocab * s->channels;
    struct stage st[MAX_STAGES];
    printf("layout:");
    for (int i = 0; i < nstages; i++) {
        gpt_build(&st[i].model, s, bounds[i], bounds[i + 1] - bounds[i], i == 0,
                  i == nstages - 1, 5);
        gpt_acts_alloc(&st[i].acts, &st[i].model, PIPE_B, PIPE_T);
        printf(" [%d,%d)%s%s", bounds[i], bounds[i + 1], i == 0 ? "+embed" : "",
               i == nstages - 1 ? "+head" : "");
    }
    printf("\n");
    float *grad_in = malloc(BTC * sizeof(float)), *grad_out = malloc(BTC * sizeof(float));
    int same_losses = 1;
    for (int mb = 0; mb < PIPE_MICRO; mb++) {
        struct gpt_acts *first = &st[0].acts, *last = &st[nstages - 1].acts;
        set_batch(first->tokens, last->targets, PIPE_B * PIPE_T, mb, s->vocab);
        float loss = 0.0f;
        for (int i = 0; i < nstages; i++) {
            if (i > 0)
                memcpy(st[i].acts.residual,
                       st[i - 1].acts.residual + st[i - 1].model.num_blocks * BTC,
                       BTC * sizeof(float));
            loss = gpt_forward(&st[i].model, &st[i].acts);
        }
        same_losses &= memcmp(&loss, &whole_losses[mb], sizeof loss) == 0;
        for (int i = nstages - 1; i >= 0; i--) {
            gpt_backward(&st[i].model, &st[i].acts, scratch, 1.0f / PIPE_MICRO,
                         i == nstages - 1 ? NULL : grad_in, i == 0 ? NULL : grad_out);
            float *t = grad_in; grad_in = grad_out; grad_out = t;
        }
    }
    CHECK_MSG(same_losses, "micro-batch losses differ from the whole model's");

    /* the tied gradient: each end sends its share to the other */
    struct gpt *a = &st[0].model, *z = &st[nstages - 1].model;
    float *embed_share = malloc(VC * sizeof(float)), *head_share = malloc(VC * sizeof(float));
    memcpy(embed_share, a->dwte, VC * sizeof(float));
    memcpy(head_share, z->dwte_head, VC * sizeof(float));
    gpt_tie_wte_grads(a, head_share);
    gpt_tie_wte_grads(z, embed_share);
    CHECK_MSG(same_floats(a->dwte, whole->dwte, VC), "first stage's dwte differs");
    CHECK_MSG(same_floats(z->dwte, whole->dwte, VC), "last stage's dwte differs");
    CHECK(same_floats(a->dwpe, whole->dwpe, (size_t)s->max_seq * s->channels));
    CHECK(same_floats(z->dlnf_w, whole->dlnf_w, 2 * (size_t)s->channels));
    double sumsq = gpt_embed_grad_sumsq(a);
    for (int i = 0; i < nstages; i++) {
        for (int k = 0; k < st[i].model.num_blocks; k++) {
            const struct block *blk = &st[i].model.blocks[k];
            CHECK_MSG(same_floats(blk->grads, whole->blocks[blk->index].grads, blk->nparams),
                      "layer %d gradients differ", blk->index);
            sumsq += block_grad_sumsq(blk);
        }
    }
    sumsq += gpt_head_grad_sumsq(z);
    double whole_sumsq = gpt_grad_sumsq(whole);
    CHECK_MSG(memcmp(&sumsq, &whole_sumsq, sizeof sumsq) == 0,
              "per-layer sums of squares in canonical order differ: %.17g vs %.17g",
              sumsq, whole_sumsq);

    /* one update (whole has had the same): the same parameters everywhere */
    for (int i = 0; i < nstages; i++) {
        gpt_adamw_update(&st[i].model, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5f, 1);
        for (int k = 0; k < st[i].model.num_blocks; k++) {
            const struct block *blk = &st[i].model.blocks[k];
            CHECK_MSG(same_floats(blk->params, whole->blocks[blk->index].params, blk->nparams),
                      "layer %d parameters differ after the update", blk->index);
        }
    }
    CHECK(same_floats(a->wte, whole->wte, VC));
    CHECK(same_floats(z->wte, whole->wte, VC));
    CHECK(same_floats(a->wpe, whole->wpe, (size_t)s->max_seq * s->channels));
    CHECK(same_floats(z->lnf_w, whole->lnf_w, 2 * (size_t)s->channels));
    free(embed_share); free(head_share); free(grad_in); free(grad_out);
    for (int i = 0; i < nstages; i++) {
        gpt_acts_free(&st[i].acts);
        gpt_free(&st[i].model);
    }
}

static void test_layouts(void)
{
    struct gpt_shape s = {.vocab = 40, .max_seq = 80, .layers = 3, .heads = 2, .channels = 32};
    struct gpt whole;
    gpt_build(&whole, &s, 0, s.layers, 1, 1, 5);
    struct gpt_acts acts;
    struct block_scratch scratch;
    gpt_acts_alloc(&acts, &whole, PIPE_B, PIPE_T);
    block_scratch_alloc(&scratch, PIPE_B, PIPE_T, s.channels, s.heads);
    float losses[PIPE_MICRO];
    for (int mb = 0; mb < PIPE_MICRO; mb++) {
        set_batch(acts.tokens, acts.targets, PIPE_B * PIPE_T, mb, s.vocab);
        losses[mb] = gpt_forward(&whole, &acts);
        gpt_backward(&whole, &acts, &scratch, 1.0f / PIPE_MICRO, NULL, NULL);
    }
    gpt_tie_wte_grads(&whole, NULL);
    gpt_adamw_update(&whole, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5f, 1);
    int two[] = {0, 1, 3}, three[] = {0, 1, 2, 3}, head_alone[] = {0, 3, 3},
        embed_alone[] = {0, 0, 2, 3};
    check_layout(&whole, losses, two, 2, &scratch);
    check_layout(&whole, losses, three, 3, &scratch);
    check_layout(&whole, losses, head_alone, 2, &scratch);
    check_layout(&whole, losses, embed_alone, 3, &scratch);
    gpt_acts_free(&acts);
    block_scratch_free(&scratch);
    gpt_free(&whole);
}

int main(void)
{
    dm_threads_init(2);
    test_layout();
    test_init();
    test_pack();
    test_determinism();
    test_layouts();
    dm_threads_shutdown();
    return testing_report("test_block");
}
