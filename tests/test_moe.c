/* The mixture-of-experts block (src/model/moe.c, docs/moe.md) on its own:
 *
 *   - finite differences of the block's backward through the router and the
 *     gates, the experts, the capacity drop, the aux loss and the z-loss,
 *     for the softmax and the sigmoid router (the routing is checked to be
 *     the same on both sides of every difference);
 *   - top-1: the gate is the chosen score (Switch Transformer), so the
 *     router's gradient is not zero, and it agrees with finite
 *     differences, for both routers, dropless and with a capacity;
 *   - the aux loss is alpha under uniform routing, and more when the
 *     routing is skewed; ties go to the lower expert index;
 *   - the sigmoid router's bias changes which experts are chosen, never the
 *     gate values, and moves by bias_rate x sign(mean - count);
 *   - capacity: no expert keeps more than ceil(k N factor / E) pairs; the
 *     pairs dropped are the lowest router probabilities (drop=probs), the
 *     latest tokens (drop=position) or the latest in (slot, token) order
 *     (drop=slot, GShard's); a token every expert dropped leaves the
 *     block with its residual exactly; position and slot drop different
 *     pairs where a token's second choice competes with another token's
 *     first;
 *   - the pack of an MoE block round-trips (weights, moments, bias, counts,
 *     placement),
 *     live-migration messages too, and a pack of the wrong kind is refused;
 *   - an MoE block's slab is exactly its shared tensors, router and
 *     experts (no dense MLP), every parameter gets a gradient, and a
 *     migration moves that slab and its state, nothing more;
 *   - forward and backward give the same bits for 1 and 2 threads;
 *   - an expert shard (parallel.ep > 1) holds the whole block's weights
 *     of its experts, its sum of squares adds up to the whole block's,
 *     and its pack is refused by a block of another shard;
 *   - the experts phase handed to an exchange (moe_exchange, the seam of
 *     expert parallelism) that runs each expert on its own copy of its
 *     rows, kept from the forward to the backward by key, and its
 *     gradients into a buffer of its own added afterwards: the same bits
 *     as the local phase.
 *
 * The end-to-end check against PyTorch is tests/test_reference.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "dynmo/moe.h"
#include "testing.h"

enum { B = 2, T = 8, N = B * T, C = 16, NH = 2, E = 4, K = 2, H = 24 };

static struct gpt_shape moe_shape_k(int router, double capacity_factor, int drop, float aux,
                                    float z, int k)
{
    struct gpt_shape s = {.vocab = 32, .max_seq = T, .layers = 2, .heads = NH, .channels = C};
    struct moe_params m = {.every = 1, .experts = E, .top_k = k, .hidden = H, .router = router,
                           .drop = drop, .capacity_factor = (float)capacity_factor,
                           .aux_loss = aux, .z_loss = z, .bias_rate = 0.0f};
    moe_shape_add(&s, &m);
    return s;
}

/* The shape's mixture of experts, to change a test's parameter. */
static struct moe_params *moe_of(struct gpt_shape *s)
{
    return (struct moe_params *)moe_params_of(s);
}

static struct gpt_shape moe_shape(int router, double capacity_factor, int drop, float aux,
                                  float z)
{
    return moe_shape_k(router, capacity_factor, drop, aux, z, K);
}

/* A block whose weights are far from trivial: every parameter N(0, 0.3)
 * around its initial value, the router N(0, 1) so that the experts'
 * scores are well apart. */
static void make_block(struct block *blk, const struct gpt_shape *shape, uint64_t seed)
{
    block_init(blk, 1, shape, seed);
    for (size_t i = 0; i < blk->nparams; i++)
        blk->params[i] += 0.3f * dm_normal(seed + 1, 7, i);
    for (size_t i = 0; i < (size_t)E * C; i++)
        block_moe_of(blk)->router_w[i] = dm_normal(seed + 2, 8, i);
}

struct harness {
    struct block blk;
    struct block_acts acts;
    struct block_scratch scratch;
    float *in, *out, *dout, *din;    /* (N, C) */
};

static void harness_init(struct harness *h, const struct gpt_shape *shape, uint64_t seed)
{
    make_block(&h->blk, shape, seed);
    block_acts_alloc(&h->acts, B, T, C, NH);
    block_scratch_alloc(&h->scratch, B, T, C, NH);
    h->in = malloc(N * C * sizeof(float));
    h->out = malloc(N * C * sizeof(float));
    h->dout = malloc(N * C * sizeof(float));
    h->din = malloc(N * C * sizeof(float));
    for (int i = 0; i < N * C; i++) {
        h->in[i] = dm_normal(seed + 3, 9, (uint64_t)i);
        h->dout[i] = 0.1f * dm_normal(seed + 4, 10, (uint64_t)i);
    }
}

static void harness_free(struct harness *h)
{
    block_free(&h->blk);
    block_acts_free(&h->acts);
    block_scratch_free(&h->scratch);
    free(h->in);
    free(h->out);
    free(h->dout);
    free(h->din);
}

/* F = sum dout . out + aux + z of one forward (the gradient block_backward
 * computes with dout and loss_scale 1). */
static double objective(struct harness *h)
{
    block_forward(&h->blk, &h->acts, h->out, h->in, B, T);
    double f = 0.0;
    for (int i = 0; i < N * C; i++) f += (double)h->dout[i] * h->out[i];
    struct moe_routing r;
    moe_routing_of(&h->acts, &r);
    return f + r.aux + r.z;
}

/* The routing of the last forward, to compare two forwards (k <= K;
 * unused slots stay zero). */
struct routing_copy {
    int choice[N * K], row[N * K];
};

static void copy_routing(struct harness *h, struct routing_copy *c)
{
    struct moe_routing r;
    moe_routing_of(&h->acts, &r);
    DM_ASSERT(r.k <= K);
    memset(c, 0, sizeof *c);
    memcpy(c->choice, r.choice, (size_t)N * r.k * sizeof(int));
    memcpy(c->row, r.row, (size_t)N * r.k * sizeof(int));
}

/* Analytic gradients (block_backward into zeroed grads, din) against
 * central differences at `count` elements of the parameters (from
 * `offset`, every `stride`-th) and of the input. Returns the relative
 * error norm |fd - an| / |an| over all of them. */
static double fd_check(const char *name, struct harness *h, size_t offset, size_t count,
                       size_t stride, int check_input)
{
    memset(h->blk.grads, 0, h->blk.nparams * sizeof(float));
    double f0 = objective(h);
    (void)f0;
    struct routing_copy base, plus, minus;
    copy_routing(h, &base);
    block_backward(&h->blk, &h->acts, &h->scratch, h->din, h->dout, h->in, B, T);
    double err2 = 0.0, norm2 = 0.0;
    int routing_changed = 0;
    const float eps = 2e-3f;
    for (size_t s = 0; s < count + (check_input ? 24 : 0); s++) {
        float *x;
        double analytic;
        if (s < count) {
            size_t i = offset + s * stride;
            DM_ASSERT(i < h->blk.nparams);
            x = &h->blk.params[i];
            analytic = h->blk.grads[i];
        } else {
            size_t i = (s - count) * 7 % (N * C);
            x = &h->in[i];
            analytic = h->din[i];
        }
        float keep = *x;
        *x = keep + eps;
        double fp = objective(h);
        copy_routing(h, &plus);
        *x = keep - eps;
        double fm = objective(h);
        copy_routing(h, &minus);
        *x = keep;
        routing_changed += memcmp(&plus, &base, sizeof base) || memcmp(&minus, &base, sizeof base);
        double fd = (fp - fm) / (2.0 * eps);
        err2 += (fd - analytic) * (fd - analytic);
        norm2 += analytic * analytic;
    }
    double rel = sqrt(err2 / (norm2 > 0 ? norm2 : 1.0));
    printf("finite differences %-34s relative error %.2e over %zu values (|grad| %.3g)\n", name,
           rel, count + (check_input ? 24 : 0), sqrt(norm2));
    CHECK_MSG(routing_changed == 0, "%s: %d perturbations changed the routing", name,
              routing_changed);
    CHECK_MSG(norm2 > 1e-12, "%s: the gradient is zero, nothing was checked", name);
    objective(h);   /* leave acts as the unperturbed forward made them */
    return rel;
}

static size_t router_offset(void) { return moe_shared_param_count(C); }
static size_t experts_offset(void) { return moe_shared_param_count(C) + (size_t)E * C; }

static void test_finite_differences(void)
{
    const double tol = 5e-3;
    for (int router = 0; router < 2; router++) {
        const char *kind = router ? "sigmoid" : "softmax";
        char name[96];
        struct harness h;
        /* router and gates, and the experts, dropless, no balancing losses */
        struct gpt_shape s = moe_shape(router, 0.0, MOE_DROP_PROBS, 0.0f, 0.0f);
        harness_init(&h, &s, 11);
        snprintf(name, sizeof name, "%s: router and gates", kind);
        CHECK(fd_check(name, &h, router_offset(), E * C, 1, 1) < tol);
        snprintf(name, sizeof name, "%s: experts", kind);
        CHECK(fd_check(name, &h, experts_offset(), 60, 37, 0) < tol);
        snprintf(name, sizeof name, "%s: ln2", kind);
        CHECK(fd_check(name, &h, block_tensor_offset(C, BP_LN2_W), 2 * C, 1, 0) < tol);
        harness_free(&h);

        /* capacity drop: a third of the fair share, dropping by position */
        s = moe_shape(router, 0.34, MOE_DROP_POSITION, 0.0f, 0.0f);
        harness_init(&h, &s, 12);
        objective(&h);
        struct moe_routing r;
        moe_routing_of(&h.acts, &r);
        int dropped = 0;
        for (int p = 0; p < N * K; p++) dropped += r.row[p] < 0;
        snprintf(name, sizeof name, "%s: capacity drop (%d of %d dropped)", kind, dropped, N * K);
        CHECK_MSG(dropped > 0, "the capacity test drops nothing");
        CHECK(fd_check(name, &h, router_offset(), E * C, 1, 1) < tol);
        snprintf(name, sizeof name, "%s: experts with drops", kind);
        CHECK(fd_check(name, &h, experts_offset(), 60, 37, 0) < tol);
        harness_free(&h);

        /* the aux loss alone (dout = 0), then the z-loss alone */
        s = moe_shape(router, 0.0, MOE_DROP_PROBS, 1.0f, 0.0f);
        harness_init(&h, &s, 13);
        memset(h.dout, 0, N * C * sizeof(float));
        snprintf(name, sizeof name, "%s: aux loss", kind);
        CHECK(fd_check(name, &h, router_offset(), E * C, 1, 1) < tol);
        harness_free(&h);
        s = moe_shape(router, 0.0, MOE_DROP_PROBS, 0.0f, 1.0f);
        harness_init(&h, &s, 14);
        memset(h.dout, 0, N * C * sizeof(float));
        snprintf(name, sizeof name, "%s: z-loss", kind);
        CHECK(fd_check(name, &h, router_offset(), E * C, 1, 1) < tol);
        harness_free(&h);

        /* everything at once, with a capacity */
        s = moe_shape(router, 0.6, MOE_DROP_POSITION, 0.5f, 0.1f);
        harness_init(&h, &s, 15);
        snprintf(name, sizeof name, "%s: all together", kind);
        CHECK(fd_check(name, &h, router_offset(), E * C, 1, 1) < tol);
        harness_free(&h);
    }
}

/* Top-1 (Switch Transformer): the gate is the chosen expert's score
 * itself, not 1 (renormalised over one expert), so the language-model
 * loss reaches the router. For both routers (the sigmoid's gate is its
 * raw score): the gate bits, a router gradient that is not zero and
 * agrees with central differences (dropless and with a capacity), and
 * the input's gradient through the gate. */
static void test_top1(void)
{
    const double tol = 5e-3;
    for (int router = 0; router < 2; router++) {
        const char *kind = router ? "sigmoid" : "softmax";
        char name[96];
        for (int capacity = 0; capacity < 2; capacity++) {
            struct gpt_shape s = moe_shape_k(router, capacity ? 0.5 : 0.0, MOE_DROP_PROBS,
                                             0.0f, 0.0f, 1);
            struct harness h;
            harness_init(&h, &s, 16 + capacity);
            objective(&h);
            struct moe_routing r;
            moe_routing_of(&h.acts, &r);
            int gate_is_score = 1, dropped = 0;
            for (int t = 0; t < N; t++) {
                gate_is_score &= r.gate[t] == r.scores[t * E + r.choice[t]];
                dropped += r.row[t] < 0;
            }
            printf("top-1 (%s, capacity factor %g, %d of %d tokens dropped): the gate is the "
                   "chosen score: %s\n", kind, capacity ? 0.5 : 0.0, dropped, N,
                   gate_is_score ? "yes" : "NO");
            CHECK_MSG(gate_is_score, "top-1 (%s): a gate is not its expert's score", kind);
            CHECK_MSG(!capacity || dropped > 0, "the top-1 capacity test drops nothing");
            /* the router alone first: its gradient must not be zero */
            snprintf(name, sizeof name, "%s top-1%s: router", kind, capacity ? " capacity" : "");
            CHECK(fd_check(name, &h, router_offset(), E * C, 1, 0) < tol);
            snprintf(name, sizeof name, "%s top-1%s: router and input", kind,
                     capacity ? " capacity" : "");
            CHECK(fd_check(name, &h, router_offset(), E * C, 1, 1) < tol);
            snprintf(name, sizeof name, "%s top-1%s: experts", kind, capacity ? " capacity" : "");
            CHECK(fd_check(name, &h, experts_offset(), 60, 37, 0) < tol);
            harness_free(&h);
        }
    }
}

/* With a zero router every score is equal: P is uniform and the aux loss
 * is exactly alpha; every token chooses experts 0 and 1 (ties to the lower
 * index). A router that prefers one expert costs more. */
static void test_aux_uniform(void)
{
    for (int router = 0; router < 2; router++) {
        struct gpt_shape s = moe_shape(router, 0.0, MOE_DROP_PROBS, 0.25f, 0.0f);
        struct harness h;
        harness_init(&h, &s, 21);
        memset(block_moe_of(&h.blk)->router_w, 0, (size_t)E * C * sizeof(float));
        objective(&h);
        struct moe_routing r;
        moe_routing_of(&h.acts, &r);
        printf("uniform routing (%s): aux %.9g, alpha %.9g\n", router ? "sigmoid" : "softmax",
               r.aux, 0.25);
        CHECK_NEAR(r.aux, 0.25, 1e-6);
        int lower = 1;
        for (int t = 0; t < N; t++) lower &= r.choice[t * K] == 0 && r.choice[t * K + 1] == 1;
        CHECK_MSG(lower, "ties do not go to the lower expert index");
        /* skewed: expert 2's row of the router follows the tokens' mean */
        for (int c = 0; c < C; c++) block_moe_of(&h.blk)->router_w[2 * C + c] = 3.0f;
        objective(&h);
        moe_routing_of(&h.acts, &r);
        printf("skewed routing (%s): aux %.6g > alpha\n", router ? "sigmoid" : "softmax", r.aux);
        CHECK(r.aux > 0.25 * 1.01);
        harness_free(&h);
    }
}

/* The bias selects; the gates come from the unbiased scores. */
static void test_bias_selects_only(void)
{
    struct gpt_shape s = moe_shape(MOE_ROUTER_SIGMOID, 0.0, MOE_DROP_PROBS, 0.0f, 0.0f);
    struct harness h;
    harness_init(&h, &s, 31);
    struct moe_routing r;
    objective(&h);
    moe_routing_of(&h.acts, &r);
    float scores[N * E], gates[N * K];
    int choice[N * K];
    memcpy(scores, r.scores, sizeof scores);
    memcpy(gates, r.gate, sizeof gates);
    memcpy(choice, r.choice, sizeof choice);
    /* the same bias for every expert: the same choice, the same gate bits */
    for (int e = 0; e < E; e++) block_moe_of(&h.blk)->bias[e] = 0.375f;
    objective(&h);
    moe_routing_of(&h.acts, &r);
    CHECK(!memcmp(choice, r.choice, sizeof choice));
    CHECK_MSG(!memcmp(gates, r.gate, sizeof gates), "a uniform bias changed the gate values");
    CHECK(!memcmp(scores, r.scores, sizeof scores));
    /* a bias that puts expert 3 first for every token: the choice changes,
     * the gates are still the unbiased scores renormalised */
    for (int e = 0; e < E; e++) block_moe_of(&h.blk)->bias[e] = e == 3 ? 10.0f : 0.0f;
    objective(&h);
    moe_routing_of(&h.acts, &r);
    CHECK_MSG(!memcmp(scores, r.scores, sizeof scores), "the bias changed the scores");
    int first3 = 1, changed = 0, gates_ok = 1;
    for (int t = 0; t < N; t++) {
        first3 &= r.choice[t * K] == 3;
        changed += r.choice[t * K] != choice[t * K] || r.choice[t * K + 1] != choice[t * K + 1];
        double sum = 0.0;
        for (int j = 0; j < K; j++) sum += scores[t * E + r.choice[t * K + j]];
        for (int j = 0; j < K; j++)
            gates_ok &= fabs(r.gate[t * K + j] - scores[t * E + r.choice[t * K + j]] / sum) <= 1e-7;
    }
    printf("bias: expert 3 chosen first by every token (%d tokens' choices changed); gates are "
           "the unbiased scores renormalised: %s\n", changed, gates_ok ? "yes" : "NO");
    CHECK(first3 && changed > 0 && gates_ok);
    harness_free(&h);

    /* the update: b_i += rate x sign(mean - count_i), the sigmoid router only */
    moe_of(&s)->bias_rate = 0.5f;
    struct block blk;
    block_init(&blk, 0, &s, 1);
    double counts[E] = {10, 30, 20, 20};   /* mean 20 */
    block_moe_update_bias(&blk, counts);
    CHECK(block_moe_of(&blk)->bias[0] == 0.5f && block_moe_of(&blk)->bias[1] == -0.5f && block_moe_of(&blk)->bias[2] == 0.0f &&
          block_moe_of(&blk)->bias[3] == 0.0f);
    block_free(&blk);
    moe_of(&s)->router = MOE_ROUTER_SOFTMAX;
    block_init(&blk, 0, &s, 1);
    block_moe_update_bias(&blk, counts);
    CHECK(block_moe_of(&blk)->bias[0] == 0.0f && block_moe_of(&blk)->bias[1] == 0.0f);
    block_free(&blk);
}

/* Capacity: the kept pairs of each expert, which ones drop, and the
 * residual of a token that every expert dropped. */
static const char *const drop_names[] = {"probs", "position", "slot"};

static void test_capacity(void)
{
    for (int drop = 0; drop < 3; drop++) {
        struct gpt_shape s = moe_shape(MOE_ROUTER_SOFTMAX, 0.3, drop, 0.0f, 0.0f);
        struct harness h;
        harness_init(&h, &s, 41);
        /* most tokens prefer experts 0 and 1 */
        for (int c = 0; c < C; c++) {
            block_moe_of(&h.blk)->router_w[0 * C + c] += 0.5f;
            block_moe_of(&h.blk)->router_w[1 * C + c] += 0.4f;
        }
        objective(&h);
        struct moe_routing r;
        moe_routing_of(&h.acts, &r);
        int capacity = (int)ceil((double)K * N * 0.3 / E);
        CHECK(r.capacity == capacity);
        int ok_order = 1, all_dropped = 0, exact = 1, over = 0;
        for (int e = 0; e < E; e++) {
            int kept = r.offset[e + 1] - r.offset[e], chosen = 0;
            over |= kept > capacity;
            float min_kept = INFINITY, max_dropped = -INFINITY;
            int last_kept = -1, first_dropped = N;
            int last_kept_slot = -1, first_dropped_slot = N * K;   /* j N + t */
            for (int t = 0; t < N; t++)
                for (int j = 0; j < K; j++) {
                    if (r.choice[t * K + j] != e) continue;
                    chosen++;
                    float p = r.scores[t * E + e];
                    if (r.row[t * K + j] >= 0) {
                        min_kept = fminf(min_kept, p);
                        last_kept = t;
                        if (j * N + t > last_kept_slot) last_kept_slot = j * N + t;
                    } else {
                        max_dropped = fmaxf(max_dropped, p);
                        if (t < first_dropped) first_dropped = t;
                        if (j * N + t < first_dropped_slot) first_dropped_slot = j * N + t;
                    }
                }
            CHECK(kept == (chosen < capacity ? chosen : capacity));
            if (drop == MOE_DROP_PROBS) ok_order &= max_dropped <= min_kept;
            else if (drop == MOE_DROP_POSITION)
                ok_order &= first_dropped > last_kept || first_dropped == N;
            else ok_order &= first_dropped_slot > last_kept_slot;
        }
        for (int t = 0; t < N; t++) {
            int kept = 0;
            for (int j = 0; j < K; j++) kept += r.row[t * K + j] >= 0;
            if (kept) continue;
            all_dropped++;
            exact &= !memcmp(h.out + t * C, h.acts.res1 + t * C, C * sizeof(float));
        }
        printf("capacity %d (drop=%s): no expert over it: %s; the right pairs dropped: %s; %d "
               "tokens dropped by every expert keep their residual exactly: %s\n", capacity,
               drop_names[drop], over ? "NO" : "yes", ok_order ? "yes" : "NO",
               all_dropped, exact ? "yes" : "NO");
        CHECK(!over && ok_order && exact);
        CHECK_MSG(all_dropped > 0, "no token was dropped by every expert: the test is empty");
        harness_free(&h);
    }
}

/* The two capacity orders by position: moe.drop = position places pairs
 * by (token, slot), a token's pairs together; slot by (slot, token), every
 * token's first choice before any second choice (GShard). Two tokens, two
 * experts, top-2, capacity 1: token 0 prefers expert 0, token 1 expert 1,
 * and each takes the other as its second choice. By position token 0
 * takes both experts and token 1 is dropped whole; by slot each token
 * keeps its first choice and both second choices drop. Then the same on
 * the harness's 16 tokens of 4 experts: the orders drop different pairs. */
static void test_capacity_orders(void)
{
    int choice[4] = {0, 1, 1, 0};    /* (token, slot) */
    int kept[2][4];
    for (int order = 0; order < 2; order++) {
        int drop = order ? MOE_DROP_SLOT : MOE_DROP_POSITION;
        struct gpt_shape s = moe_shape(MOE_ROUTER_SOFTMAX, 0.5, drop, 0.0f, 0.0f);
        moe_of(&s)->experts = 2;
        struct block blk;
        block_init(&blk, 1, &s, 3);
        struct block_acts acts;
        block_acts_alloc(&acts, 1, 2, C, NH);
        float in[2 * C], out[2 * C];
        for (int i = 0; i < 2 * C; i++) in[i] = dm_normal(5, 6, (uint64_t)i);
        /* router weights from successive seeds until the routing is the
         * one wanted */
        int found = 0;
        for (uint64_t seed = 0; seed < 200 && !found; seed++) {
            for (int i = 0; i < 2 * C; i++) block_moe_of(&blk)->router_w[i] = dm_normal(seed, 8, i);
            block_forward(&blk, &acts, out, in, 1, 2);
            struct moe_routing r;
            moe_routing_of(&acts, &r);
            found = !memcmp(r.choice, choice, sizeof choice);
        }
        CHECK_MSG(found, "no router found that routes token 0 to 0, 1 and token 1 to 1, 0");
        struct moe_routing r;
        moe_routing_of(&acts, &r);
        CHECK(r.capacity == 1);
        for (int p = 0; p < 4; p++) kept[order][p] = r.row[p] >= 0;
        block_acts_free(&acts);
        block_free(&blk);
    }
    int want_position[4] = {1, 1, 0, 0}, want_slot[4] = {1, 0, 1, 0};
    printf("capacity 1, token 0 -> experts 0, 1 and token 1 -> 1, 0: kept (t0 s0, t0 s1, t1 s0, "
           "t1 s1) by position %d %d %d %d, by slot %d %d %d %d\n", kept[0][0], kept[0][1],
           kept[0][2], kept[0][3], kept[1][0], kept[1][1], kept[1][2], kept[1][3]);
    CHECK_MSG(!memcmp(kept[0], want_position, sizeof want_position),
              "drop=position: token 0 should keep both experts and token 1 none");
    CHECK_MSG(!memcmp(kept[1], want_slot, sizeof want_slot),
              "drop=slot: each token should keep its first choice only");

    int rows[2][N * K], differ = 0, dropped[2] = {0, 0};
    for (int order = 0; order < 2; order++) {
        struct gpt_shape s = moe_shape(MOE_ROUTER_SOFTMAX, 0.3,
                                       order ? MOE_DROP_SLOT : MOE_DROP_POSITION, 0.0f, 0.0f);
        struct harness h;
        harness_init(&h, &s, 42);
        objective(&h);
        struct moe_routing r;
        moe_routing_of(&h.acts, &r);
        for (int p = 0; p < N * K; p++) {
            rows[order][p] = r.row[p] >= 0;
            dropped[order] += r.row[p] < 0;
        }
        harness_free(&h);
    }
    for (int p = 0; p < N * K; p++) differ += rows[0][p] != rows[1][p];
    printf("capacity %d of %d tokens x top-%d: %d pairs dropped by position, %d by slot, %d pairs "
           "kept by one order and dropped by the other\n", (int)ceil(K * N * 0.3 / E), N, K,
           dropped[0], dropped[1], differ);
    CHECK(dropped[0] == dropped[1]);
    CHECK_MSG(differ > 0, "position and slot dropped the same pairs: the test is empty");
}

/* Packs of an MoE block: round trip, migration messages, refusals. */
static void test_pack(void)
{
    struct gpt_shape s = moe_shape(MOE_ROUTER_SIGMOID, 1.0, MOE_DROP_PROBS, 0.01f, 0.001f);
    s.layers = 4;
    moe_of(&s)->every = 2;   /* blocks 1 and 3 are MoE, 0 and 2 dense */
    CHECK(!gpt_block_is_moe(&s, 0) && gpt_block_is_moe(&s, 1) && gpt_block_is_moe(&s, 3));
    CHECK(gpt_moe_block_count(&s) == 2 && gpt_moe_ordinal(&s, 3) == 1 &&
          gpt_moe_ordinal(&s, 2) == -1);
    CHECK(gpt_block_param_count(&s, 1) ==
          4 * C * C + 8 * C + E * C + (size_t)E * (2 * H * C + H + C));
    CHECK(gpt_block_param_count(&s, 2) == block_param_count(C));
    struct block blk;
    block_init(&blk, 3, &s, 5);
    CHECK(block_moe_of(&blk) && blk.nparams == gpt_block_param_count(&s, 3));
    for (size_t i = 0; i < blk.nparams; i++) {
        blk.m[i] = dm_normal(1, 2, i);
        blk.v[i] = fabsf(dm_normal(1, 3, i));
    }
    for (int e = 0; e < E; e++) {
        block_moe_of(&blk)->bias[e] = 0.125f * (float)(e - 1);
        block_moe_of(&blk)->tokens[e] = 100 + e;
        block_moe_of(&blk)->dropped[e] = e;
        block_moe_of(&blk)->order[e] = E - 1 - e;   /* a moved placement travels too */
    }
    size_t bytes = block_pack_size(&blk);
    unsigned char *buf = malloc(bytes), *again = malloc(bytes);
    block_pack(&blk, buf);
    struct block copy = {0};
    char err[256];
    CHECK_MSG(block_unpack(&copy, buf, bytes, &s, err, sizeof err) == 0, "%s", err);
    CHECK(block_moe_of(&copy) && copy.nparams == blk.nparams &&
          !memcmp(copy.params, blk.params, blk.nparams * 4) &&
          !memcmp(copy.m, blk.m, blk.nparams * 4) && !memcmp(copy.v, blk.v, blk.nparams * 4) &&
          !memcmp(block_moe_of(&copy)->bias, block_moe_of(&blk)->bias, E * 4) &&
          !memcmp(block_moe_of(&copy)->tokens, block_moe_of(&blk)->tokens, E * 8) &&
          !memcmp(block_moe_of(&copy)->dropped, block_moe_of(&blk)->dropped, E * 8) &&
          !memcmp(block_moe_of(&copy)->order, block_moe_of(&blk)->order, E * sizeof(int)));
    block_pack(&copy, again);
    CHECK_MSG(!memcmp(buf, again, bytes), "pack(unpack(pack(b))) != pack(b)");
    block_free(&copy);
    /* the same pack where the model's layer 3 is dense: refused, named */
    struct gpt_shape other = s;
    moe_of(&other)->every = 3;   /* layer 3 is dense there, layer 2 MoE */
    struct block wrong = {0};
    CHECK(block_unpack(&wrong, buf, bytes, &other, err, sizeof err) != 0);
    printf("an MoE pack where the model's layer is dense: %s\n", err);
    CHECK(strstr(err, "packed block 3") != NULL);
    /* a flipped byte in the bias is caught by the checksum */
    unsigned char *bad = malloc(bytes);
    memcpy(bad, buf, bytes);
    bad[bytes - 4 * E - 16 * E - 9] ^= 1;   /* before the counts and the placement (E = 4) */
    CHECK(block_unpack(&wrong, bad, bytes, &s, err, sizeof err) != 0);
    free(bad);
    /* migration: header and state as one message, the slab straight */
    size_t meta_bytes = block_meta_size(&blk);
    unsigned char *meta = malloc(meta_bytes);
    block_pack_meta(&blk, meta);
    struct block moved;
    block_prepare_receive(&moved, 3, &s);
    memcpy(moved.params, blk.params, blk.nparams * 4);
    memcpy(moved.m, blk.m, 2 * blk.nparams * 4);
    CHECK_MSG(block_unpack_meta_begin(&moved, meta, meta_bytes, &s, err, sizeof err) == 0 &&
                  block_unpack_meta_end(&moved, meta, meta_bytes, err, sizeof err) == 0,
              "%s", err);
    CHECK(!memcmp(block_moe_of(&moved)->bias, block_moe_of(&blk)->bias, E * 4) &&
          !memcmp(block_moe_of(&moved)->tokens, block_moe_of(&blk)->tokens, E * 8) &&
          !memcmp(block_moe_of(&moved)->order, block_moe_of(&blk)->order, E * sizeof(int)));
    block_pack(&moved, again);
    CHECK_MSG(!memcmp(buf, again, bytes), "a migrated MoE block packs differently");
    block_free(&moved);
    free(meta);
    free(buf);
    free(again);
    block_free(&blk);
}

/* An MoE block holds what it computes with and nothing else: its tensors
 * (the eight shared ones, the router, each expert's four) tile its slab
 * exactly, with no dense fc or fcproj among them; one forward and backward
 * give every one of its parameters a gradient; and what a migration moves
 * (the header and MoE state, then params, m and v straight from the slab)
 * is that slab, so an MoE block costs 3 x 4 bytes per parameter it uses. */
static void test_slab_holds_what_it_computes(void)
{
    struct gpt_shape s = moe_shape(MOE_ROUTER_SOFTMAX, 0.0, MOE_DROP_PROBS, 0.01f, 0.001f);
    struct harness h;
    harness_init(&h, &s, 61);
    struct block *blk = &h.blk;
    size_t shared = block_tensor_offset(C, BP_FC_W), experts = (size_t)E * (2 * H * C + H + C);
    size_t at = 0;
    int tiled = 1;
    for (int k = 0; k < block_tensor_count(blk); k++) {
        size_t offset, size;
        block_tensor_at(blk, k, &offset, &size);
        tiled &= offset == at;
        at += size;
    }
    CHECK_MSG(tiled && at == blk->nparams, "the tensors do not tile the slab (%zu of %zu)", at,
              blk->nparams);
    CHECK(blk->nparams == shared + (size_t)E * C + experts);
    CHECK(block_tensor_count(blk) == BP_FC_W + 1 + 4 * E);
    memset(blk->grads, 0, blk->nparams * sizeof(float));
    block_forward(blk, &h.acts, h.out, h.in, B, T);
    block_backward(blk, &h.acts, &h.scratch, h.din, h.dout, h.in, B, T);
    size_t unused = 0;
    for (size_t i = 0; i < blk->nparams; i++) unused += blk->grads[i] == 0.0f;
    /* the header, the MoE state (docs/block-slab.md: 8 + 4 E bytes padded
     * to 8, + 16 E, + the placement's 4 E padded to 8), then params, m, v */
    size_t moved = block_meta_size(blk) + 3 * blk->nparams * sizeof(float);
    printf("an MoE block of C %d, E %d, H %d: %zu parameters (shared %zu, router %d, experts "
           "%zu; a dense block has %zu), %zu without a gradient after one step; a migration "
           "moves %zu bytes, its pack is %zu\n", C, E, H, blk->nparams, shared, E * C, experts,
           block_param_count(C), unused, moved, block_pack_size(blk));
    CHECK_MSG(unused == 0, "%zu of the block's parameters got no gradient", unused);
    CHECK(moved == block_pack_size(blk) &&
          moved == 64 + (8 + 16 + 16 * E + 16) + 12 * (shared + (size_t)E * C + experts));
    harness_free(&h);
}

/* Forward and backward bits for 1 and 2 threads. */
static void run_bits(float *out, float *din, float *grads, size_t nparams)
{
    struct gpt_shape s = moe_shape(MOE_ROUTER_SOFTMAX, 0.6, MOE_DROP_PROBS, 0.1f, 0.01f);
    struct harness h;
    harness_init(&h, &s, 51);
    memset(h.blk.grads, 0, h.blk.nparams * sizeof(float));
    block_forward(&h.blk, &h.acts, h.out, h.in, B, T);
    block_backward(&h.blk, &h.acts, &h.scratch, h.din, h.dout, h.in, B, T);
    DM_ASSERT(h.blk.nparams == nparams);
    memcpy(out, h.out, N * C * sizeof(float));
    memcpy(din, h.din, N * C * sizeof(float));
    memcpy(grads, h.blk.grads, nparams * sizeof(float));
    harness_free(&h);
}

static void test_thread_count(void)
{
    struct gpt_shape s = moe_shape(MOE_ROUTER_SOFTMAX, 0.6, MOE_DROP_PROBS, 0.1f, 0.01f);
    size_t P = gpt_block_param_count(&s, 1);
    float *out[2], *din[2], *grads[2];
    for (int k = 0; k < 2; k++) {
        out[k] = malloc(N * C * sizeof(float));
        din[k] = malloc(N * C * sizeof(float));
        grads[k] = malloc(P * sizeof(float));
        dm_threads_shutdown();
        dm_threads_init(k + 1);
        run_bits(out[k], din[k], grads[k], P);
    }
    int same = !memcmp(out[0], out[1], N * C * 4) && !memcmp(din[0], din[1], N * C * 4) &&
               !memcmp(grads[0], grads[1], P * 4);
    printf("MoE block forward and backward on 1 and 2 threads: %s\n",
           same ? "the same bits" : "DIFFERENT");
    CHECK(same);
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(din[k]);
        free(grads[k]);
    }
}

/* A loopback exchange, as an expert-parallel owner runs it: each expert's
 * rows copied out, run with moe_expert_forward into buffers of its own
 * kept by key until the backward, whose expert gradients go to a buffer of
 * the exchange's (zeroed, then added into the slab: 0 + g is g). */
struct loopback {
    const void *key;
    float *x, *h, *a;            /* (rows, C|H) kept from the forward */
    float *grads;                /* (E, expert_params) */
    int calls;
};

static void loopback_forward(void *ctx, struct block *blk, const void *key, const int *offset,
                             const float *x, float *y)
{
    struct loopback *lb = ctx;
    int rows = offset[E];
    lb->key = key;
    lb->x = realloc(lb->x, (size_t)(rows + 1) * C * sizeof(float));
    lb->h = realloc(lb->h, (size_t)(rows + 1) * H * sizeof(float));
    lb->a = realloc(lb->a, (size_t)(rows + 1) * H * sizeof(float));
    memcpy(lb->x, x, (size_t)rows * C * sizeof(float));
    for (int e = 0; e < E; e++) {
        int r0 = offset[e], n = offset[e + 1] - r0;
        moe_expert_forward(blk, moe_expert_weights(blk, e), lb->x + (size_t)r0 * C, n,
                           lb->h + (size_t)r0 * H, lb->a + (size_t)r0 * H, y + (size_t)r0 * C);
    }
    lb->calls++;
}

static void loopback_backward(void *ctx, struct block *blk, const void *key, const int *offset,
                              const float *dy, float *dx)
{
    struct loopback *lb = ctx;
    CHECK(key == lb->key);
    size_t P = block_moe_of(blk)->expert_params;
    lb->grads = calloc((size_t)E * P, sizeof(float));
    float *dh = malloc((size_t)(offset[E] + 1) * H * sizeof(float));
    for (int e = 0; e < E; e++) {
        int r0 = offset[e], n = offset[e + 1] - r0;
        moe_expert_backward(blk, moe_expert_weights(blk, e), lb->grads + (size_t)e * P,
                            dy + (size_t)r0 * C, lb->x + (size_t)r0 * C, lb->h + (size_t)r0 * H,
                            lb->a + (size_t)r0 * H, n, dh + (size_t)r0 * H, dx + (size_t)r0 * C);
    }
    for (size_t i = 0; i < (size_t)E * P; i++) block_moe_of(blk)->experts_g[i] += lb->grads[i];
    free(dh);
    free(lb->grads);
    lb->calls++;
}

static void test_exchange_seam(void)
{
    struct gpt_shape s = moe_shape(MOE_ROUTER_SOFTMAX, 0.6, MOE_DROP_PROBS, 0.1f, 0.01f);
    size_t P = gpt_block_param_count(&s, 1);
    float *out = malloc(N * C * sizeof(float)), *din = malloc(N * C * sizeof(float));
    float *grads = malloc(P * sizeof(float));
    run_bits(out, din, grads, P);

    struct loopback lb = {0};
    struct moe_exchange ex = {.ctx = &lb, .experts_forward = loopback_forward,
                              .experts_backward = loopback_backward};
    struct harness h;
    harness_init(&h, &s, 51);
    block_moe_of(&h.blk)->exchange = &ex;
    memset(h.blk.grads, 0, h.blk.nparams * sizeof(float));
    block_forward(&h.blk, &h.acts, h.out, h.in, B, T);
    block_backward(&h.blk, &h.acts, &h.scratch, h.din, h.dout, h.in, B, T);
    int same = lb.calls == 2 && !memcmp(out, h.out, N * C * 4) &&
               !memcmp(din, h.din, N * C * 4) && !memcmp(grads, h.blk.grads, P * 4);
    printf("MoE block with its experts phase run by a loopback exchange: %s\n",
           same ? "the same bits" : "DIFFERENT");
    CHECK(same);
    block_moe_of(&h.blk)->exchange = NULL;
    harness_free(&h);
    free(lb.x);
    free(lb.h);
    free(lb.a);
    free(out);
    free(din);
    free(grads);
}

/* An expert shard (parallel.ep > 1): a block that holds experts 2 and 3
 * of 4 has the shared tensors, the router and those two experts only,
 * with exactly the weights the whole block has there; its tensors list
 * the held experts; its pack names its first expert, and a pack of
 * another shard (or the whole block) is refused. */
static void test_shard(void)
{
    struct gpt_shape whole = moe_shape(MOE_ROUTER_SOFTMAX, 0.0, MOE_DROP_PROBS, 0.0f, 0.0f);
    struct gpt_shape half = whole, other = whole;
    moe_of(&half)->shard_first = 2;
    moe_of(&half)->shard_count = 2;
    moe_of(&other)->shard_count = 2;   /* experts 0 and 1 */
    struct block full, shard;
    block_init(&full, 1, &whole, 9);
    block_init(&shard, 1, &half, 9);
    size_t Pe = moe_expert_param_count(C, H), head = experts_offset();
    CHECK(moe_owned_experts(moe_of(&half)) == 2 && moe_owned_experts(moe_of(&whole)) == E);
    CHECK(shard.nparams == head + 2 * Pe && full.nparams == head + E * Pe);
    CHECK(moe_full_param_count(C, moe_of(&half)) == full.nparams);
    CHECK_MSG(!memcmp(shard.params, full.params, head * 4) &&
              !memcmp(shard.params + head, full.params + head + 2 * Pe, 2 * Pe * 4),
              "a shard's weights are not the whole block's weights of its experts");
    CHECK(block_tensor_count(&shard) == BP_FC_W + 1 + 2 * 4);
    size_t off, size;
    block_tensor_at(&shard, block_tensor_count(&shard) - 1, &off, &size);
    CHECK(off + size == shard.nparams);
    for (size_t i = 0; i < shard.nparams; i++) shard.grads[i] = 0.5f;
    for (size_t i = 0; i < full.nparams; i++) full.grads[i] = i < head + 2 * Pe ? 0.0f : 0.5f;
    for (size_t i = 0; i < head; i++) full.grads[i] = 0.5f;
    double parts[2];
    double shared = block_grad_sumsq_parts(&shard, parts);
    CHECK(shared == 0.25 * (double)head && parts[0] == 0.25 * (double)Pe && parts[1] == parts[0]);
    CHECK(block_grad_sumsq(&shard) == block_grad_sumsq(&full));
    size_t bytes = block_pack_size(&shard);
    unsigned char *buf = malloc(bytes);
    block_pack(&shard, buf);
    struct block copy;
    char err[256];
    CHECK_MSG(block_unpack(&copy, buf, bytes, &half, err, sizeof err) == 0, "%s", err);
    CHECK(!memcmp(copy.params, shard.params, shard.nparams * 4));
    block_free(&copy);
    CHECK(block_unpack(&copy, buf, bytes, &other, err, sizeof err) != 0);
    CHECK(strstr(err, "from expert 2") != NULL);
    CHECK(block_unpack(&copy, buf, bytes, &whole, err, sizeof err) != 0);
    printf("expert shard: %zu of %zu floats, the whole block's weights of experts 2-3\n",
           shard.nparams, full.nparams);
    free(buf);
    block_free(&full);
    block_free(&shard);
}

int main(void)
{
    dm_threads_init(2);
    test_finite_differences();
    test_top1();
    test_aux_uniform();
    test_bias_selects_only();
    test_capacity();
    test_capacity_orders();
    test_pack();
    test_slab_holds_what_it_computes();
    test_thread_count();
    test_exchange_seam();
    test_shard();
    dm_threads_shutdown();
    return testing_report("test_moe");
}
