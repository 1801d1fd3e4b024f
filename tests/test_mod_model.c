/* Mixture of depths inside the model (src/model/mod.c, gpt.c; docs/mod-hash.md):
 * a whole tiny GPT whose second and fourth blocks are MoD blocks.
 *
 *   - tokens a MoD block did not choose leave it bit for bit as they came
 *     in (the residual stream after the block against the one before);
 *     top-k chooses exactly ceil(capacity x T) per sequence, the causal
 *     predictor a varying number;
 *   - finite differences of the whole model's loss with the routing fixed
 *     (block_mod_force_choice): the routers, a MoD block's and a dense
 *     block's weights, the embeddings;
 *   - finite differences of the MLP predictor's BCE (the quantity it is
 *     trained on, against the top-k choice on the stop-gradient block
 *     input) with respect to every one of its weights (W1, b1, w2, b2)
 *     against its gradient divided by the loss scale;
 *   - a MoD block's pack round-trips (router and predictor included) and
 *     is refused by a model whose layer is not a MoD block, or whose
 *     predictor has another hidden width;
 *   - the predictor's tensors in block_tensor_at: the matrices decayed,
 *     the biases not.
 *
 * The whole model against PyTorch is tests/test_reference.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "dynmo/mod_predictor.h"
#include "dynmo/model.h"
#include "dyn/mod.h"
#include "testing.h"

enum { B = 2, T = 16, N = B * T, C = 16, NH = 2, L = 4, V = 32, H = 8 };
enum { PRED = H * C + 2 * H + 1 };   /* the predictor's weights */

static struct gpt_shape mod_shape(int routing, double capacity)
{
    struct gpt_shape s = {.vocab = V, .max_seq = T, .layers = L, .heads = NH, .channels = C};
    struct mod_params mod = {.every = 2, .routing = routing, .capacity = capacity,
                             .predictor_hidden = routing == MOD_ROUTING_CAUSAL ? H : 0};
    mod_shape_add(&s, &mod);
    return s;
}

struct harness {
    struct gpt model;
    struct gpt_acts acts;
    struct block_scratch scratch;
};

static int compare_floats(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Weights far from their initial values (every block parameter moved by
 * N(0, 0.2), routers N(0, 1)), so that the router values are O(1); the
 * predictors' matrices N(0, 1), b1 0, and b2 minus the median logit of
 * the block's tokens (block by block, each after a forward through the
 * ones before), so that the predictor chooses about half of them. */
static void harness_init(struct harness *h, int routing, double capacity, uint64_t seed)
{
    struct gpt_shape s = mod_shape(routing, capacity);
    gpt_build(&h->model, &s, 0, L, 1, 1, seed);
    for (int i = 0; i < L; i++) {
        struct block *blk = &h->model.blocks[i];
        for (size_t j = 0; j < blk->nparams; j++)
            blk->params[j] += 0.2f * dm_normal(seed + 1, (uint64_t)i, j);
        struct block_mod *mod = block_mod_of(blk);
        if (mod)
            for (int c = 0; c < C; c++) mod->router_w[c] = dm_normal(seed + 2, i, c);
        if (mod && mod->pred_w)
            for (int e = 0; e < PRED; e++) {
                int bias = e >= H * C && (e < H * C + H || e == PRED - 1);
                mod->pred_w[e] = bias ? 0.0f : dm_normal(seed + 5, i, e);
            }
    }
    gpt_acts_alloc(&h->acts, &h->model, B, T);
    block_scratch_alloc(&h->scratch, B, T, C, NH);
    for (int n = 0; n < N; n++) {
        h->acts.tokens[n] = (int)(dm_hash64(seed, 3, (uint64_t)n) % V);
        h->acts.targets[n] = (int)(dm_hash64(seed, 4, (uint64_t)n) % V);
    }
    for (int i = 0; i < L; i++) {
        struct block_mod *m = block_mod_of(&h->model.blocks[i]);
        if (!m || !m->pred_w) continue;
        gpt_forward(&h->model, &h->acts);
        float logits[N], a[H];
        for (int n = 0; n < N; n++)
            logits[n] = mod_predictor_logit(a, h->acts.residual + ((size_t)i * N + n) * C,
                                            m->pred_w, C, H);
        qsort(logits, N, sizeof(float), compare_floats);
        m->pred_w[PRED - 1] = -0.5f * (logits[N / 2 - 1] + logits[N / 2]);
    }
}

static void harness_free(struct harness *h)
{
    block_scratch_free(&h->scratch);
    gpt_acts_free(&h->acts);
    gpt_free(&h->model);
}

static double loss_and_grads(struct harness *h)
{
    gpt_zero_grads(&h->model);
    double loss = gpt_forward(&h->model, &h->acts);
    gpt_backward(&h->model, &h->acts, &h->scratch, 1.0f, NULL, NULL);
    gpt_tie_wte_grads(&h->model, NULL);
    return loss;
}

static void test_pass_through(int routing, const char *name)
{
    struct harness h;
    harness_init(&h, routing, 0.25, 21);
    gpt_forward(&h.model, &h.acts);
    int same = 1, moved = 0, counts_ok = 1;
    long chosen_total = 0;
    for (int i = 1; i < L; i += 2) {
        const struct mod_acts *m = block_mod_acts(&h.acts.blocks[i]);
        const float *in = h.acts.residual + (size_t)i * N * C, *out = in + (size_t)N * C;
        for (int n = 0; n < N; n++) {
            int differs = memcmp(in + (size_t)n * C, out + (size_t)n * C, C * sizeof(float)) != 0;
            if (!m->chosen[n]) same &= !differs;
            else moved += differs;
            chosen_total += m->chosen[n];
        }
        for (int b = 0; b < B; b++)
            if (routing == MOD_ROUTING_TOPK && m->count[b] != 4) counts_ok = 0;
    }
    printf("MoD in the model, %s: %ld of %d token-blocks chosen; the others bit for bit "
           "unchanged: %s\n", name, chosen_total, 2 * N, same ? "yes" : "NO");
    CHECK(same);
    CHECK(moved > 0);
    CHECK(counts_ok);
    CHECK(chosen_total > 0 && chosen_total < 2 * N);
    harness_free(&h);
}

/* The loss as the sum in double of the tokens' float losses (less
 * rounding than gpt_forward's float mean; the same up to the factor N). */
static double loss_sum(struct harness *h)
{
    gpt_forward(&h->model, &h->acts);
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += h->acts.losses[n];
    return sum / N;
}

static double central(struct harness *h, float *x, float eps)
{
    float keep = *x;
    *x = keep + eps;
    double fp = loss_sum(h);
    *x = keep - eps;
    double fm = loss_sum(h);
    *x = keep;
    return (fp - fm) / (2.0 * (double)eps);
}

/* Richardson's extrapolation of central differences at steps 4e-3 and
 * 2e-3 (the eps^2 term cancels: the weights are far from trivial, so the
 * loss curves) at `count` parameters, every `stride`-th from p, against
 * the analytic gradient g. Returns the relative error norm. */
static double fd_params(struct harness *h, const char *name, float *p, const float *g,
                        size_t count, size_t stride)
{
    double err2 = 0.0, norm2 = 0.0;
    for (size_t s = 0; s < count; s++) {
        float *x = p + s * stride;
        double fd = (4.0 * central(h, x, 2e-3f) - central(h, x, 4e-3f)) / 3.0;
        double an = g[s * stride];
        err2 += (fd - an) * (fd - an);
        norm2 += an * an;
    }
    double rel = sqrt(err2 / (norm2 > 0 ? norm2 : 1.0));
    printf("finite differences, fixed routing, %-28s relative error %.2e over %zu values "
           "(|grad| %.3g)\n", name, rel, count, sqrt(norm2));
    CHECK_MSG(norm2 > 1e-12, "%s: zero gradient, nothing checked", name);
    return rel;
}

/* The loss is a float: the differences resolve a gradient entry to about
 * 1e-4 absolute, so the tensors whose entries are large (the embeddings,
 * whose gradient runs back through both MoD blocks: the router's dr w,
 * the (1 - r) pass and the block's input gradient) are held to 2e-3, the
 * MoD block's own (smaller entries) to 2e-2; a wrong term is O(1). The
 * block's attention weights, whose entries are smaller still, are checked
 * at op level (test_hash_mod). */
static void test_finite_differences(void)
{
    struct harness h;
    harness_init(&h, MOD_ROUTING_CAUSAL, 0.25, 32);
    gpt_forward(&h.model, &h.acts);   /* the predictor's choice, then fixed */
    static int forced[2][N];
    for (int j = 0; j < 2; j++) {
        memcpy(forced[j], block_mod_acts(&h.acts.blocks[2 * j + 1])->chosen, sizeof forced[j]);
        block_mod_force_choice(&h.model.blocks[2 * j + 1], forced[j]);
    }
    loss_and_grads(&h);
    struct block *mod = &h.model.blocks[1], *last = &h.model.blocks[3];
    size_t fc = block_tensor_offset(C, BP_FC_W), fcproj = block_tensor_offset(C, BP_FCPROJ_W);
    CHECK(fd_params(&h, "router of block 1", block_mod_of(mod)->router_w, block_mod_of(mod)->router_g, C, 1) <
          2e-2);
    CHECK(fd_params(&h, "router of block 3", block_mod_of(last)->router_w, block_mod_of(last)->router_g, C, 1) <
          2e-2);
    CHECK(fd_params(&h, "MoD block 1 fc_w", mod->params + fc, mod->grads + fc, 40, 17) < 2e-2);
    CHECK(fd_params(&h, "MoD block 3 fcproj_w", last->params + fcproj, last->grads + fcproj,
                    40, 19) < 2e-2);
    CHECK(fd_params(&h, "MoD block 1 ln1_w", mod->params, mod->grads, C, 1) < 2e-2);
    CHECK(fd_params(&h, "wte", h.model.wte, h.model.dwte, 60, 7) < 2e-3);
    CHECK(fd_params(&h, "wpe", h.model.wpe, h.model.dwpe, 50, 5) < 2e-3);
    harness_free(&h);
}

/* The predictor: d(sum of the MoD blocks' mean BCE)/dw = pred_g / loss
 * scale, for every weight of both MoD blocks' MLPs. */
static void test_predictor_gradient(void)
{
    struct harness h;
    harness_init(&h, MOD_ROUTING_CAUSAL, 0.25, 41);
    const float scale = 0.5f;
    gpt_zero_grads(&h.model);
    gpt_forward(&h.model, &h.acts);
    gpt_backward(&h.model, &h.acts, &h.scratch, scale, NULL, NULL);
    gpt_tie_wte_grads(&h.model, NULL);
    const float eps = 2e-3f;
    double err2 = 0.0, norm2 = 0.0;
    double worst[4] = {0};   /* W1, b1, w2, b2: the largest |fd - grad| */
    for (int i = 1; i < L; i += 2) {
        struct block_mod *m = block_mod_of(&h.model.blocks[i]);
        CHECK(m->hidden == H);
        for (int e = 0; e < PRED; e++) {
            float keep = m->pred_w[e];
            double f[2];
            for (int side = 0; side < 2; side++) {
                m->pred_w[e] = keep + (side ? -eps : eps);
                m->bce = 0.0;
                gpt_forward(&h.model, &h.acts);
                f[side] = m->bce;
            }
            m->pred_w[e] = keep;
            double fd = (f[0] - f[1]) / (2.0 * eps), an = m->pred_g[e] / scale;
            int part = e < H * C ? 0 : e < H * C + H ? 1 : e < H * C + 2 * H ? 2 : 3;
            worst[part] = fmax(worst[part], fabs(fd - an));
            err2 += (fd - an) * (fd - an);
            norm2 += an * an;
        }
    }
    double rel = sqrt(err2 / norm2);
    printf("finite differences, the MLP predictors' BCE (hidden %d): relative error %.2e over "
           "%d weights (|grad| %.3g; largest |diff| W1 %.2g, b1 %.2g, w2 %.2g, b2 %.2g)\n", H,
           rel, 2 * PRED, sqrt(norm2), worst[0], worst[1], worst[2], worst[3]);
    CHECK(norm2 > 1e-12);
    CHECK(rel < 5e-3);
    harness_free(&h);
}

static void test_pack(void)
{
    struct gpt_shape s = mod_shape(MOD_ROUTING_CAUSAL, 0.5), dense = s;
    dense.ext_count = 0;
    struct block blk, back = {0}, other = {0};
    block_init(&blk, 1, &s, 5);
    for (size_t j = 0; j < blk.nparams; j++) blk.m[j] = 0.1f * (float)j;
    size_t bytes = block_pack_size(&blk);
    void *buf = malloc(bytes);
    block_pack(&blk, buf);
    char err[256] = "";
    CHECK(block_unpack(&back, buf, bytes, &s, err, sizeof err) == 0);
    CHECK(block_mod_of(&back) && block_mod_of(&back)->pred_w && block_mod_of(&back)->hidden == H &&
          back.nparams == blk.nparams && back.nparams == block_param_count(C) + C + PRED);
    CHECK(memcmp(back.params, blk.params, blk.nparams * sizeof(float)) == 0);
    CHECK(memcmp(back.m, blk.m, blk.nparams * sizeof(float)) == 0);
    CHECK(block_unpack(&other, buf, bytes, &dense, err, sizeof err) != 0);
    printf("MoD block pack: %zu bytes round-trip; a dense model's layer 1 refuses it: %s\n",
           bytes, err);
    struct gpt_shape wider = s;
    ((struct mod_params *)wider.ext[0].params)->predictor_hidden = 2 * H;
    struct block third = {0};
    CHECK(block_unpack(&third, buf, bytes, &wider, err, sizeof err) != 0);
    printf("  a model whose predictor is %d wide refuses it: %s\n", 2 * H, err);
    /* the tensors after the dense ones: router, W1, b1, w2, b2 */
    const size_t want_size[5] = {C, H * C, H, H, 1};
    const int want_matrix[5] = {1, 1, 0, 1, 0};
    size_t offset, size, at = block_param_count(C);
    CHECK(block_tensor_count(&blk) == BP_COUNT + 5);
    for (int k = 0; k < 5; k++) {
        int matrix = block_tensor_at(&blk, BP_COUNT + k, &offset, &size);
        CHECK_MSG(offset == at && size == want_size[k] && matrix == want_matrix[k],
                  "MoD tensor %d: offset %zu size %zu matrix %d", k, offset, size, matrix);
        at += size;
    }
    CHECK(at == blk.nparams);
    free(buf);
    block_free(&blk);
    block_free(&back);
}

int main(void)
{
    dm_threads_init(1);
    test_pass_through(MOD_ROUTING_TOPK, "top-k 0.25");
    test_pass_through(MOD_ROUTING_CAUSAL, "causal predictor");
    test_finite_differences();
    test_predictor_gradient();
    test_pack();
    return testing_report("test_mod_model");
}
