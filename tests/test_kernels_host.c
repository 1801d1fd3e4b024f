/* The CUDA backend's kernels, run on the host: every kernel's per-thread
 * functions (the .cuh files of kernels/, compiled here by gcc exactly as nvcc compiles
 * them for the device) run over a whole grid, every block and thread in
 * a loop, phase by phase where the kernel has barriers, and are compared
 * with the CPU backend's op (backend_cpu(): src/model/ops.c, optim.c).
 * Where the arithmetic is the same the bits must be the same; where the
 * order of a sum differs (block tree reductions, cuBLAS against OpenBLAS)
 * the largest difference must be at most 1e-5 of the largest magnitude of
 * the CPU's result. Each grid also runs with its threads and blocks in
 * reverse order and must give the same bits (no phase reads what another
 * thread of the same phase writes). The cuBLAS arguments of every product
 * the model runs are translated to column-major (kernels/gemm.cuh) and
 * applied to CBLAS in column-major mode, against a plain row-major
 * reference and against the CPU ops. No GPU is needed; no CUDA either. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "dyn/hash.h"
#include "model/internal.h"
#include "testing.h"
#include "../kernels/adamw.cuh"
#include "../kernels/attention.cuh"
#include "../kernels/elementwise.cuh"
#include "../kernels/encoder.cuh"
#include "../kernels/exit.cuh"
#include "../kernels/gemm.cuh"
#include "../kernels/hash.cuh"
#include "../kernels/layernorm.cuh"
#include "../kernels/matmul.cuh"
#include "../kernels/mod.cuh"
#include "../kernels/moe.cuh"
#include "../kernels/precision.cuh"
#include "../kernels/prune.cuh"
#include "../kernels/reduce.cuh"
#include "../kernels/softmax.cuh"
#include "../kernels/sparse.cuh"

/* ---- the grid harness --------------------------------------------------- */

static int reverse_order;   /* run blocks and threads last to first */

static long order_at(long k, long n)
{
    return reverse_order ? n - 1 - k : k;
}

/* `body` once per thread of a (blocks x threads) launch, the thread as t */
#define FOR_GRID(blocks, threads, body)                                             \
    for (long grid_b = 0; grid_b < (blocks); grid_b++)                              \
        for (int grid_k = 0; grid_k < (threads); grid_k++) {                        \
            struct dm_thread t = dm_thread_at(order_at(grid_b, blocks), blocks,     \
                                              (int)order_at(grid_k, threads), threads); \
            body;                                                                   \
        }

/* `body` once per thread of block `block` (one phase), the thread as t */
#define FOR_BLOCK(block, blocks, threads, body)                                     \
    for (int grid_k = 0; grid_k < (threads); grid_k++) {                            \
        struct dm_thread t = dm_thread_at(block, blocks, (int)order_at(grid_k, threads), \
                                          threads);                                 \
        body;                                                                       \
    }

typedef void (*tree_step_fn)(float *shared, int thread, int stride);

/* A block's tree reduction, level by level (a barrier between levels). */
static void run_tree(float *shared, int threads, tree_step_fn step)
{
    for (int stride = threads / 2; stride > 0; stride /= 2)
        for (int k = 0; k < threads; k++) step(shared, (int)order_at(k, threads), stride);
}

/* ---- data and comparison ------------------------------------------------ */

static uint64_t draw_state = 12345;

static float draw_normal(void)
{
    draw_state = draw_state * 6364136223846793005ULL + 1442695040888963407ULL;
    double u1 = ((draw_state >> 11) + 0.5) / 9007199254740992.0;
    draw_state = draw_state * 6364136223846793005ULL + 1442695040888963407ULL;
    double u2 = ((draw_state >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float *filled(long n, float scale)
{
    float *x = dm_alloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = scale * draw_normal();
    return x;
}

static float *copied(const float *x, long n)
{
    float *y = dm_alloc((size_t)n * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

static void check_bits(const char *what, const float *got, const float *want, long n)
{
    long bad = 0;
    for (long i = 0; i < n; i++) bad += memcmp(got + i, want + i, sizeof(float)) != 0;
    CHECK_MSG(bad == 0, "%s: %ld of %ld elements differ from the CPU's bits", what, bad, n);
    printf("  %-44s bit-identical over %ld elements: %s\n", what, n, bad ? "NO" : "yes");
}

/* max |got - want| <= tol * max |want| */
static void check_close(const char *what, const float *got, const float *want, long n,
                        double tol)
{
    double worst = 0.0, scale = 0.0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        worst = d > worst || isnan(d) ? d : worst;
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    double rel = scale > 0 ? worst / scale : worst;
    CHECK_MSG(rel <= tol, "%s: largest difference %.3g of magnitude %.3g (tol %.0e)", what,
              worst, scale, tol);
    printf("  %-44s largest difference %.2e relative (tol %.0e)\n", what, rel, tol);
}

/* The forward-order and reverse-order runs of a grid give the same bits. */
static void check_orders(const char *what, const float *forward, const float *reverse, long n)
{
    long differ = 0;
    for (long i = 0; i < n; i++) differ += memcmp(forward + i, reverse + i, sizeof(float)) != 0;
    CHECK_MSG(differ == 0, "%s: %ld of %ld elements depend on the thread order", what, differ,
              n);
}

/* Two runs of a kernel, forward order into run[0], reverse into run[1],
 * each from a fresh copy of init (n floats). */
struct two_runs {
    float *run[2];
};

static struct two_runs two_copies(const float *init, long n)
{
    struct two_runs r = {{copied(init, n), copied(init, n)}};
    return r;
}

static void two_free(struct two_runs *r)
{
    dm_free(r->run[0]);
    dm_free(r->run[1]);
}

#define FOR_ORDERS(r) for (int r = (reverse_order = 0); r < 2; reverse_order = ++r)

/* ---- element-wise kernels: the CPU's bits -------------------------------- */

static void test_gelu_residual(void)
{
    long N = 5003;
    float *x = filled(N, 3.0f), *dout = filled(N, 1.0f), *other = filled(N, 1.0f);
    x[0] = -100.0f, x[1] = 100.0f, x[2] = 0.0f, x[3] = -9.0f, x[4] = 1e-20f;
    float *want = dm_alloc(N * sizeof(float)), *dwant = copied(dout, N);
    float *sum_want = dm_alloc(N * sizeof(float));
    gelu_forward(want, x, N);
    gelu_backward(dwant, x, dwant, N);
    residual_forward(sum_want, x, other, N);
    struct two_runs out = two_copies(want, N), dinp = two_copies(dout, N);
    struct two_runs sum = two_copies(x, N);
    FOR_ORDERS(r) {
        memset(out.run[r], 0, N * sizeof(float));
        FOR_GRID(3, 64, gelu_forward_thread(t, out.run[r], x, N));
        FOR_GRID(3, 64, gelu_backward_thread(t, dinp.run[r], x, dinp.run[r], N));
        FOR_GRID(5, 32, residual_forward_thread(t, sum.run[r], sum.run[r], other, N));
    }
    check_orders("gelu_forward", out.run[0], out.run[1], N);
    check_orders("gelu_backward", dinp.run[0], dinp.run[1], N);
    check_bits("gelu_forward", out.run[0], want, N);
    check_bits("gelu_backward (in place)", dinp.run[0], dwant, N);
    check_bits("residual_forward (in place)", sum.run[0], sum_want, N);
    two_free(&out), two_free(&dinp), two_free(&sum);
    dm_free(x), dm_free(dout), dm_free(other), dm_free(want), dm_free(dwant);
    dm_free(sum_want);
}

static void test_rows(void)
{
    int N = 37, C = 24, n = 11;
    int rows[11] = {36, 0, 5, 6, 7, 20, 21, 2, 30, 31, 13};
    float *src = filled((long)N * C, 1.0f), *compact = filled((long)n * C, 1.0f);
    float *dst0 = filled((long)N * C, 1.0f);
    const struct dm_backend *cpu = backend_cpu();
    float *gather_want = dm_alloc((size_t)n * C * sizeof(float));
    float *set_want = copied(dst0, (long)N * C), *add_want = copied(dst0, (long)N * C);
    cpu->rows_gather(gather_want, src, rows, n, C);
    cpu->rows_scatter(set_want, compact, rows, n, C, 0);
    cpu->rows_scatter(add_want, compact, rows, n, C, 1);
    struct two_runs gather = two_copies(compact, (long)n * C);
    struct two_runs set = two_copies(dst0, (long)N * C), add = two_copies(dst0, (long)N * C);
    FOR_ORDERS(r) {
        FOR_GRID(2, 32, rows_gather_thread(t, gather.run[r], src, rows, n, C));
        FOR_GRID(2, 32, rows_scatter_thread(t, set.run[r], compact, rows, n, C, 0));
        FOR_GRID(3, 16, rows_scatter_thread(t, add.run[r], compact, rows, n, C, 1));
    }
    check_orders("rows_scatter add", add.run[0], add.run[1], (long)N * C);
    check_bits("rows_gather", gather.run[0], gather_want, (long)n * C);
    check_bits("rows_scatter", set.run[1], set_want, (long)N * C);
    check_bits("rows_scatter add", add.run[0], add_want, (long)N * C);
    two_free(&gather), two_free(&set), two_free(&add);
    dm_free(src), dm_free(compact), dm_free(dst0), dm_free(gather_want);
    dm_free(set_want), dm_free(add_want);
}

/* exit.cu's confidences, one thread per token, against the CPU backend's
 * bit for bit: n of N rows, ties for the top probability, a row of zeros
 * (both tops 0), a token whose input row is 0 (cosine 0); a grid of fewer
 * threads than tokens. */
static void test_exit_confidence(int N, int n, int V, int C)
{
    printf("exit confidence N=%d n=%d V=%d C=%d\n", N, n, V, C);
    float *probs = filled((long)n * V, 1.0f), *in = filled((long)N * C, 1.0f);
    float *out = filled((long)N * C, 0.3f);
    for (long i = 0; i < (long)n * V; i++) probs[i] = fabsf(probs[i]);
    for (long i = 0; i < (long)N * C; i++) out[i] += in[i];
    probs[7] = probs[V - 2] = 9.0f;                 /* row 0: the top twice */
    for (int v = 0; v < V; v++) probs[V + v] = 0.5f, probs[2 * V + v] = 0.0f;
    int *rows = dm_alloc((size_t)n * sizeof(int));
    for (int k = 0; k < n; k++) rows[k] = (k * 7 + 3) % N;   /* distinct: 7 and N coprime */
    memset(in + (size_t)rows[1] * C, 0, (size_t)C * sizeof(float));
    const struct dm_backend *cpu = backend_cpu();
    float *soft_want = dm_alloc((size_t)n * sizeof(float));
    float *sat_want = dm_alloc((size_t)n * sizeof(float));
    cpu->exit_softmax_confidence(soft_want, probs, n, V);
    cpu->exit_saturation_confidence(sat_want, in, out, rows, n, C);
    float *blank = dm_alloc((size_t)n * sizeof(float));
    struct two_runs soft = two_copies(blank, n), sat = two_copies(blank, n);
    FOR_ORDERS(r) {
        FOR_GRID(2, 8, exit_softmax_confidence_thread(t, soft.run[r], probs, n, V));
        FOR_GRID(3, 4, exit_saturation_confidence_thread(t, sat.run[r], in, out, rows, n, C));
    }
    check_orders("exit_softmax_confidence", soft.run[0], soft.run[1], n);
    check_orders("exit_saturation_confidence", sat.run[0], sat.run[1], n);
    check_bits("exit_softmax_confidence", soft.run[1], soft_want, n);
    check_bits("exit_saturation_confidence", sat.run[1], sat_want, n);
    CHECK_MSG(soft_want[0] == 0.0f && soft_want[1] == 0.0f && soft_want[2] == 0.0f &&
                  sat_want[1] == 0.0f,
              "exit confidence: a tie, a row of zeros or a zero input row is not 0");
    two_free(&soft), two_free(&sat);
    dm_free(probs), dm_free(in), dm_free(out), dm_free(rows), dm_free(soft_want);
    dm_free(sat_want), dm_free(blank);
}

/* A routing of N tokens' k slots to grouped rows: every `drop`-th pair
 * dropped (-1), and token 1's slots all dropped; the kept pairs' rows a
 * shuffle of 0 .. rows - 1 (distinct, out of token order, as the
 * experts' grouping makes them). */
static int *moe_routing(int N, int k, int drop, int *rows)
{
    int *row = dm_alloc((size_t)N * k * sizeof(int)), n = 0;
    for (int p = 0; p < N * k; p++) row[p] = p % drop == drop - 1 || p / k == 1 ? -1 : n++;
    int *order = dm_alloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        draw_state = draw_state * 6364136223846793005ULL + 1442695040888963407ULL;
        int j = (int)((draw_state >> 33) % (uint64_t)(i + 1)), swap = order[i];
        order[i] = order[j], order[j] = swap;
    }
    for (int p = 0; p < N * k; p++) row[p] = row[p] < 0 ? -1 : order[row[p]];
    dm_free(order);
    *rows = n;
    return row;
}

/* moe.cu's combine, its backward and the dispatch's backward, one thread
 * per element or pair (grids of fewer threads than items), against the
 * CPU backend's bit for bit: dropped pairs, a token with every slot
 * dropped (out = res1, d_ln2 = 0, dgate = 0), rows out of token order. */
static void test_moe(int N, int k, int C, int drop)
{
    int R;
    int *row = moe_routing(N, k, drop, &R);
    printf("moe combine N=%d k=%d C=%d rows=%d\n", N, k, C, R);
    long NC = (long)N * C, RC = (long)R * C, P = (long)N * k;
    float *res1 = filled(NC, 1.0f), *y = filled(RC, 1.0f), *gate = filled(P, 0.5f);
    float *dout = filled(NC, 1.0f), *dx = filled(RC, 1.0f), *blank = filled(NC + RC + P, 9.0f);
    const struct dm_backend *cpu = backend_cpu();
    float *out_want = copied(blank, NC), *dy_want = copied(blank, RC);
    float *dgate_want = copied(blank, P), *dln2_want = copied(blank, NC);
    cpu->routed_combine_forward(out_want, res1, y, gate, row, N, k, C);
    cpu->routed_combine_backward(dy_want, dgate_want, dout, y, gate, row, N, k, C);
    cpu->routed_dispatch_backward(dln2_want, dx, row, N, k, C);
    struct two_runs out = two_copies(blank, NC), dy = two_copies(blank, RC);
    struct two_runs dgate = two_copies(blank, P), dln2 = two_copies(blank, NC);
    FOR_ORDERS(r) {
        FOR_GRID(3, 32, moe_combine_forward_thread(t, out.run[r], res1, y, gate, row, N, k, C));
        FOR_GRID(2, 64, moe_combine_dy_thread(t, dy.run[r], dout, gate, row, N, k, C));
        FOR_GRID(2, 8, moe_combine_dgate_thread(t, dgate.run[r], dout, y, row, N, k, C));
        FOR_GRID(3, 16, moe_dispatch_backward_thread(t, dln2.run[r], dx, row, N, k, C));
    }
    check_orders("routed_combine_forward", out.run[0], out.run[1], NC);
    check_orders("routed_combine_backward dgate", dgate.run[0], dgate.run[1], P);
    check_bits("routed_combine_forward", out.run[1], out_want, NC);
    check_bits("routed_combine_backward dy", dy.run[0], dy_want, RC);
    check_bits("routed_combine_backward dgate", dgate.run[1], dgate_want, P);
    check_bits("routed_dispatch_backward", dln2.run[0], dln2_want, NC);
    int dropped = drop <= P ? drop - 1 : k;   /* a dropped pair; k: token 1's first */
    CHECK_MSG(memcmp(out_want + C, res1 + C, (size_t)C * sizeof(float)) == 0 &&
                  dln2_want[C] == 0.0f && dgate_want[k] == 0.0f && dgate_want[dropped] == 0.0f,
              "moe: a token whose slots are all dropped is not res1, 0 and 0");
    two_free(&out), two_free(&dy), two_free(&dgate), two_free(&dln2);
    float *hs[] = {res1, y, gate, dout, dx, blank, out_want, dy_want, dgate_want, dln2_want};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) dm_free(hs[i]);
    dm_free(row);
}

/* The CPU's routing of N tokens over E experts (sigmoid: with a bias),
 * and the arrays the kernels' outputs are compared with. */
struct moe_route_case {
    int N, E, k, sigmoid;
    float *logits, *bias, *scores, *lse, *choice_score, *gate, *dgate, *dlogits;
    int *choice, *selected;
    double sums[65];
};

/* Logits N(0, 2), a token of equal logits (every choice a tie, but for
 * the sigmoid router's bias, N(0, 0.1)) and one with two equal best. */
static void moe_route_case_fill(struct moe_route_case *c)
{
    long NE = (long)c->N * c->E, P = (long)c->N * c->k;
    c->logits = filled(NE, 2.0f);
    c->bias = c->sigmoid ? filled(c->E, 0.1f) : NULL;
    for (int e = 0; e < c->E; e++) c->logits[c->E + e] = 0.25f;
    c->logits[2 * c->E + c->E - 1] = c->logits[2 * c->E] = 3.0f;
    c->scores = filled(NE, 9.0f), c->lse = filled(c->N, 9.0f), c->dlogits = filled(NE, 9.0f);
    c->choice_score = filled(P, 9.0f), c->gate = filled(P, 9.0f), c->dgate = filled(P, 1.0f);
    c->choice = dm_alloc((size_t)P * sizeof(int));
    c->selected = dm_alloc((size_t)c->E * sizeof(int));
}

static void moe_route_case_free(struct moe_route_case *c)
{
    float *fs[] = {c->logits, c->bias, c->scores, c->lse, c->choice_score, c->gate, c->dgate,
                   c->dlogits};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) dm_free(fs[i]);
    dm_free(c->choice), dm_free(c->selected);
}

/* moe.cu's routing kernels, one thread per token (the sums per expert),
 * in grids of fewer threads than items, forward and reverse order,
 * against the CPU backend's route_topk_forward / _sums / _backward bit for
 * bit: scores, lse, choice (ties to the lower expert), chosen scores,
 * gates, the losses' sums in double, and the logits' gradient with and
 * without the aux and z-loss terms. */
static void test_moe_route(int N, int E, int k, int sigmoid)
{
    printf("moe route N=%d E=%d k=%d %s\n", N, E, k, sigmoid ? "sigmoid" : "softmax");
    struct moe_route_case c = {.N = N, .E = E, .k = k, .sigmoid = sigmoid}, g[2];
    moe_route_case_fill(&c);
    long NE = (long)N * E, P = (long)N * k;
    const struct dm_backend *cpu = backend_cpu();
    cpu->route_topk_forward(c.scores, c.lse, c.choice, c.choice_score, c.gate, c.logits, c.bias, N,
                           E, k, sigmoid);
    cpu->route_topk_sums(c.sums, c.scores, c.lse, N, E, sigmoid);
    for (long p = 0; p < P; p++) c.selected[c.choice[p]]++;
    FOR_ORDERS(r) {
        g[r] = c;
        g[r].scores = copied(c.dlogits, NE), g[r].lse = copied(c.dlogits, N);
        g[r].choice_score = copied(c.dlogits, P), g[r].gate = copied(c.dlogits, P);
        g[r].choice = dm_alloc((size_t)P * sizeof(int));
        FOR_GRID(2, 8, moe_route_forward_thread(t, g[r].scores, g[r].lse, g[r].choice,
                                                g[r].choice_score, g[r].gate, c.logits, c.bias,
                                                N, E, k, sigmoid));
        memset(g[r].sums, 0xff, sizeof g[r].sums);
        FOR_GRID(1, 2, moe_route_sums_thread(t, g[r].sums, c.scores, c.lse, N, E, sigmoid));
    }
    check_bits("route_topk_forward scores", g[1].scores, c.scores, NE);
    check_bits("route_topk_forward lse", g[0].lse, c.lse, N);
    check_bits("route_topk_forward chosen scores", g[1].choice_score, c.choice_score, P);
    check_bits("route_topk_forward gates", g[0].gate, c.gate, P);
    CHECK_MSG(k > 1 || !memcmp(c.gate, c.choice_score, (size_t)P * sizeof(float)),
              "route_topk_forward: a top-1 gate is not its expert's score");
    CHECK_MSG(!memcmp(g[0].choice, c.choice, (size_t)P * sizeof(int)) &&
                  !memcmp(g[1].choice, c.choice, (size_t)P * sizeof(int)),
              "route_topk_forward: the choices differ from the CPU's");
    CHECK_MSG(sigmoid || (c.choice[k] == 0 && (k < 2 || c.choice[k + 1] == 1)),
              "route_topk_forward: a tie did not go to the lower expert");   /* bias: no tie */
    CHECK_MSG(!memcmp(g[0].sums, c.sums, ((size_t)E + 1) * sizeof(double)) &&
                  !memcmp(g[1].sums, c.sums, ((size_t)E + 1) * sizeof(double)),
              "route_topk_sums: not the CPU's bits");
    printf("  %-44s same choices, sums bit-identical\n", "route_topk_forward, route_topk_sums");
    for (int losses = 0; losses < 2; losses++) {
        double alpha = losses ? 0.3 : 0.0, beta = losses ? 0.01 : 0.0;
        cpu->route_topk_backward(c.dlogits, c.dgate, c.logits, c.scores, c.lse, c.choice, c.gate,
                                c.selected, N, E, k, sigmoid, alpha, beta);
        FOR_ORDERS(r) FOR_GRID(2, 8, moe_route_backward_thread(t, g[r].scores, c.dgate, c.logits,
                                                                c.scores, c.lse, c.choice, c.gate,
                                                                c.selected, N, E, k, sigmoid,
                                                                alpha, beta));
        check_orders("route_topk_backward", g[0].scores, g[1].scores, NE);
        check_bits(losses ? "route_topk_backward (aux and z-loss)" : "route_topk_backward",
                   g[0].scores, c.dlogits, NE);
    }
    for (int r = 0; r < 2; r++) {
        dm_free(g[r].scores), dm_free(g[r].lse), dm_free(g[r].choice_score);
        dm_free(g[r].gate), dm_free(g[r].choice);
    }
    moe_route_case_free(&c);
}

/* Pruning weights with ties (magnitudes k/8, zeros, both signs), over
 * three chunks and a part. */
static float *prune_weights(long n)
{
    float *w = dm_alloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) {
        uint64_t h = dm_hash64(7, 3, (uint64_t)i);
        w[i] = (float)(h % 13) / 8.0f * ((h >> 20) & 1 ? -1.0f : 1.0f);
    }
    return w;
}

/* The keys, one round's histogram (accumulating onto nonzero counts) at
 * several rounds and prefixes, and the masking by a cut, against the CPU
 * backend's prune_histogram and prune_mask: the same counts and bits. */
static void test_prune(void)
{
    const struct dm_backend *cpu = backend_cpu();
    long n = 3 * DM_PRUNE_CHUNK + 123;
    uint32_t base = 1000003;
    float *w = prune_weights(n);
    long key_bad = 0;
    for (long i = 0; i < n; i++)
        key_bad += dm_prune_key(w[i], base + (uint32_t)i) != block_prune_key(w[i], base + (uint32_t)i);
    CHECK_MSG(key_bad == 0, "prune key: %ld of %ld keys differ from block_prune_key", key_bad, n);
    long *partial = dm_alloc((size_t)dm_prune_chunks(n) * DM_PRUNE_BUCKETS * sizeof(long));
    const int shifts[] = {56, 48, 32, 24, 0};
    long bad = 0;
    for (size_t s = 0; s < sizeof shifts / sizeof *shifts; s++) {
        int shift = shifts[s];
        uint64_t prefix = dm_prune_key(w[77], base + 77) & dm_prune_high_mask(shift);
        long want[DM_PRUNE_BUCKETS], got[2][DM_PRUNE_BUCKETS];
        for (int b = 0; b < DM_PRUNE_BUCKETS; b++) want[b] = got[0][b] = got[1][b] = b % 3;
        cpu->prune_histogram(want, NULL, w, n, base, prefix, shift);
        FOR_ORDERS(r) {
            FOR_GRID(2, 2, prune_histogram_chunk_thread(t, partial, w, n, base, prefix, shift));
            FOR_GRID(2, 64, prune_histogram_sum_thread(t, got[r], partial, n));
        }
        for (int b = 0; b < DM_PRUNE_BUCKETS; b++)
            bad += (got[0][b] != want[b]) + (got[1][b] != want[b]);
    }
    CHECK_MSG(bad == 0, "prune_histogram: %ld counts differ from the CPU's", bad);
    printf("  %-44s keys and counts the CPU's: %s\n", "prune_histogram", bad || key_bad ? "NO" : "yes");
    uint64_t cut = dm_prune_key(w[500], base + 500);
    float *slab[2][4];   /* params, grads, m, v: the kernel's, the CPU's */
    unsigned char *mask[2];
    for (int k = 0; k < 4; k++) {
        slab[0][k] = k ? filled(n, 1.0f) : copied(w, n);
        slab[1][k] = copied(slab[0][k], n);
    }
    for (int r = 0; r < 2; r++) mask[r] = dm_alloc((size_t)n);
    cpu->prune_mask(mask[1], slab[1][0], slab[1][1], slab[1][2], slab[1][3], n, base, cut);
    FOR_GRID(3, 32, prune_mask_thread(t, mask[0], slab[0][0], slab[0][1], slab[0][2], slab[0][3],
                                      n, base, cut));
    const char *names[4] = {"prune_mask params", "prune_mask grads", "prune_mask m", "prune_mask v"};
    for (int k = 0; k < 4; k++) check_bits(names[k], slab[0][k], slab[1][k], n);
    CHECK_MSG(memcmp(mask[0], mask[1], (size_t)n) == 0, "prune_mask: the mask differs from the CPU's");
    for (int k = 0; k < 4; k++) dm_free(slab[0][k]), dm_free(slab[1][k]);
    for (int r = 0; r < 2; r++) dm_free(mask[r]);
    dm_free(partial);
    dm_free(w);
}

static void test_adamw(void)
{
    long n = 3001;
    float *p0 = filled(n, 0.1f), *g = filled(n, 1.0f);
    float *p = copied(p0, n), *m = dm_alloc(n * sizeof(float)), *v = dm_alloc(n * sizeof(float));
    float *pk = copied(p0, n), *mk = dm_alloc(n * sizeof(float)), *vk = dm_alloc(n * sizeof(float));
    for (int step = 1; step <= 3; step++) {
        float lr = 3e-3f * step, wd = step == 2 ? 0.0f : 0.1f, scale = step == 3 ? 0.5f : 1.0f;
        adamw_update(p, g, m, v, n, lr, 0.9f, 0.95f, 1e-8f, wd, scale, step);
        struct dm_adamw_constants k = dm_adamw_constants_make(lr, 0.9f, 0.95f, 1e-8f, wd,
                                                              scale, step);
        reverse_order = step == 2;
        FOR_GRID(4, 64, adamw_update_thread(t, pk, g, mk, vk, n, k));
        for (long i = 0; i < n; i++) g[i] = 0.5f * g[i] + 0.1f * draw_normal();
    }
    reverse_order = 0;
    check_bits("adamw_update params (3 steps)", pk, p, n);
    check_bits("adamw_update m", mk, m, n);
    check_bits("adamw_update v", vk, v, n);
    dm_free(p0), dm_free(g), dm_free(p), dm_free(m), dm_free(v);
    dm_free(pk), dm_free(mk), dm_free(vk);
}

static void test_encoder(void)
{
    int B = 3, T = 17, C = 40, V = 23;
    int *tokens = dm_alloc((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7 + i / 5) % V;   /* repeats */
    tokens[4] = tokens[9] = tokens[30] = 3;
    float *wte = filled((long)V * C, 1.0f), *wpe = filled((long)T * C, 1.0f);
    float *dout = filled((long)B * T * C, 1.0f);
    float *want = dm_alloc((size_t)B * T * C * sizeof(float));
    float *dwte_want = filled((long)V * C, 1.0f), *dwpe_want = filled((long)T * C, 1.0f);
    struct two_runs out = two_copies(want, (long)B * T * C);
    struct two_runs dwte = two_copies(dwte_want, (long)V * C);
    struct two_runs dwpe = two_copies(dwpe_want, (long)T * C);
    encoder_forward(want, tokens, wte, wpe, B, T, C);
    encoder_backward(dwte_want, dwpe_want, dout, tokens, B, T, C);
    FOR_ORDERS(r) {
        FOR_GRID(7, 32, encoder_forward_thread(t, out.run[r], tokens, wte, wpe, B, T, C));
        FOR_GRID(2, 16, encoder_backward_thread(t, dwte.run[r], dwpe.run[r], dout, tokens,
                                                B, T, C));
    }
    check_orders("encoder_backward", dwte.run[0], dwte.run[1], (long)V * C);
    check_bits("encoder_forward", out.run[0], want, (long)B * T * C);
    check_bits("encoder_backward dwte", dwte.run[0], dwte_want, (long)V * C);
    check_bits("encoder_backward dwpe", dwpe.run[1], dwpe_want, (long)T * C);
    two_free(&out), two_free(&dwte), two_free(&dwpe);
    dm_free(tokens), dm_free(wte), dm_free(wpe), dm_free(dout), dm_free(want);
    dm_free(dwte_want), dm_free(dwpe_want);
}

/* ---- block-reduction kernels -------------------------------------------- */

/* Threads of a block in the harness: the plugin's DM_BLOCK_THREADS, so
 * that the harness does the device's arithmetic in the device's order,
 * and a smaller block, so that each thread also walks several elements. */
static int block_threads = DM_BLOCK_THREADS;
enum { THREADS = DM_BLOCK_THREADS };   /* room for the shared arrays */

/* layernorm.cu's forward: one block per row, three phases */
static void host_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int N, int C)
{
    float sum[THREADS], var[THREADS];
    for (long k = 0; k < N; k++) {
        long row = order_at(k, N);
        FOR_BLOCK(row, N, block_threads, layernorm_forward_sum_phase(t, sum, inp, C));
        run_tree(sum, block_threads, dm_tree_sum_step);
        FOR_BLOCK(row, N, block_threads, layernorm_forward_var_phase(t, var, sum, inp, C));
        run_tree(var, block_threads, dm_tree_sum_step);
        FOR_BLOCK(row, N, block_threads, layernorm_forward_out_phase(t, out, mean, rstd, sum, var,
                                                               inp, weight, bias, C));
    }
}

/* layernorm.cu's backward: the input gradient by rows, the parameters by columns */
static void host_layernorm_backward(float *dinp, const float *dresidual, float *dweight,
                                    float *dbias, const float *dout, const float *inp,
                                    const float *weight, const float *mean, const float *rstd,
                                    int N, int C)
{
    float sum_d[THREADS], sum_dn[THREADS];
    for (long k = 0; k < N; k++) {
        long row = order_at(k, N);
        FOR_BLOCK(row, N, block_threads, layernorm_backward_sums_phase(t, sum_d, sum_dn, dout, inp,
                                                                 weight, mean, rstd, C));
        run_tree(sum_d, block_threads, dm_tree_sum_step);
        run_tree(sum_dn, block_threads, dm_tree_sum_step);
        FOR_BLOCK(row, N, block_threads, layernorm_backward_dinp_phase(t, dinp, dresidual, sum_d,
                                                                 sum_dn, dout, inp, weight,
                                                                 mean, rstd, C));
    }
    FOR_GRID(2, 16, layernorm_backward_params_thread(t, dweight, dbias, dout, inp, mean, rstd,
                                                     N, C));
}

static void test_layernorm(int N, int C)
{
    printf("layernorm N=%d C=%d\n", N, C);
    long NC = (long)N * C;
    float *x = filled(NC, 2.0f), *w = filled(C, 1.0f), *b = filled(C, 1.0f);
    float *dout = filled(NC, 1.0f), *dres = filled(NC, 1.0f), *dinp0 = filled(NC, 1.0f);
    for (long i = 0; i < NC; i++) x[i] += 0.5f;
    float *out = dm_alloc(NC * 4), *mean = dm_alloc(N * 4), *rstd = dm_alloc(N * 4);
    float *dinp = copied(dinp0, NC), *dw = filled(C, 1.0f), *db = filled(C, 1.0f);
    float *dinp_res = dm_alloc(NC * 4), *dw_res = dm_alloc(C * 4);
    layernorm_forward(out, mean, rstd, x, w, b, N, C);
    float *dw0 = copied(dw, C), *db0 = copied(db, C);
    layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, N, C);
    backend_cpu()->layernorm_backward_residual(dinp_res, dres, dw_res, NULL, dout, x, w, mean,
                                               rstd, N, C);
    struct two_runs gout = two_copies(out, NC), gdinp = two_copies(dinp0, NC);
    struct two_runs gdw = two_copies(dw0, C), gdres = two_copies(dinp_res, NC);
    float *gmean = dm_alloc(N * 4), *grstd = dm_alloc(N * 4), *gdb = copied(db0, C);
    float *gdw_res = dm_alloc(C * 4);
    FOR_ORDERS(r) {
        host_layernorm_forward(gout.run[r], gmean, grstd, x, w, b, N, C);
        host_layernorm_backward(gdinp.run[r], NULL, gdw.run[r], r ? NULL : gdb, dout, x, w,
                                mean, rstd, N, C);
        host_layernorm_backward(gdres.run[r], dres, r ? gdw_res : NULL, NULL, dout, x, w,
                                mean, rstd, N, C);
    }
    check_orders("layernorm_forward", gout.run[0], gout.run[1], NC);
    check_orders("layernorm_backward dinp", gdinp.run[0], gdinp.run[1], NC);
    check_close("layernorm_forward out", gout.run[0], out, NC, 1e-5);
    check_close("layernorm_forward mean", gmean, mean, N, 1e-5);
    check_close("layernorm_forward rstd", grstd, rstd, N, 1e-5);
    check_close("layernorm_backward dinp (+=)", gdinp.run[0], dinp, NC, 1e-5);
    check_close("layernorm_backward_residual dinp", gdres.run[1], dinp_res, NC, 1e-5);
    check_bits("layernorm_backward dweight", gdw.run[1], dw, C);
    check_bits("layernorm_backward dbias", gdb, db, C);
    check_bits("layernorm_backward_residual dweight", gdw_res, dw_res, C);
    two_free(&gout), two_free(&gdinp), two_free(&gdw), two_free(&gdres);
    float *all[] = {x, w, b, dout, dres, dinp0, out, mean, rstd, dinp, dw, db, dinp_res,
                    dw_res, dw0, db0, gmean, grstd, gdb, gdw_res};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dm_free(all[i]);
}

/* softmax.cu's cross-entropy forward: one block per row */
static void host_crossentropy_forward(float *losses, float *probs, const float *logits,
                                      const int *targets, int N, int V)
{
    float most[THREADS], sum[THREADS];
    for (long k = 0; k < N; k++) {
        long n = order_at(k, N);
        const float *row = logits + n * V;
        float *p = probs + n * V;
        FOR_BLOCK(n, N, block_threads, softmax_max_phase(t, most, row, V));
        run_tree(most, block_threads, dm_tree_max_step);
        FOR_BLOCK(n, N, block_threads, softmax_exp_phase(t, sum, most, p, row, V));
        run_tree(sum, block_threads, dm_tree_sum_step);
        FOR_BLOCK(n, N, block_threads, softmax_normalize_phase(t, p, sum, V, V));
        FOR_BLOCK(n, N, block_threads, crossentropy_loss_phase(t, losses, most, sum, logits,
                                                         targets, V));
    }
}

static void test_crossentropy(int N, int V)
{
    printf("crossentropy N=%d V=%d\n", N, V);
    float *logits = filled((long)N * V, 4.0f);
    int *targets = dm_alloc(N * sizeof(int));
    for (int n = 0; n < N; n++) targets[n] = (n * 31 + 7) % V;
    logits[5] = 80.0f;   /* a dominant logit */
    float *losses = dm_alloc(N * 4), *probs = dm_alloc((size_t)N * V * 4);
    float *dlogits = dm_alloc((size_t)N * V * 4);
    crossentropy_forward(losses, probs, logits, targets, N, V);
    crossentropy_softmax_backward(dlogits, probs, targets, 0.125f, N, V);
    struct two_runs gprobs = two_copies(probs, (long)N * V), gdl = two_copies(probs, (long)N * V);
    float *glosses = dm_alloc(N * 4);
    FOR_ORDERS(r) {
        host_crossentropy_forward(glosses, gprobs.run[r], logits, targets, N, V);
        FOR_GRID(3, 32, crossentropy_backward_thread(t, gdl.run[r], gdl.run[r], targets,
                                                     0.125f, N, V));
    }
    check_orders("crossentropy_forward probs", gprobs.run[0], gprobs.run[1], (long)N * V);
    check_close("crossentropy_forward probs", gprobs.run[0], probs, (long)N * V, 1e-5);
    check_close("crossentropy_forward losses", glosses, losses, N, 1e-5);
    check_bits("crossentropy_softmax_backward (in place)", gdl.run[0], dlogits, (long)N * V);
    two_free(&gprobs), two_free(&gdl);
    dm_free(logits), dm_free(targets), dm_free(losses), dm_free(probs), dm_free(dlogits);
    dm_free(glosses);
}

/* ---- cuBLAS arguments, applied to CBLAS ---------------------------------- */

/* What the plugin hands cublasGemmStridedBatchedEx, done by CBLAS. */
static void cblas_column_major(struct dm_gemm g)
{
    CHECK(g.column_major);
    for (int i = 0; i < g.batch; i++)
        cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                    g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, g.alpha,
                    g.a + i * g.stride_a, g.lda, g.b + i * g.stride_b, g.ldb, g.beta,
                    g.c + i * g.stride_c, g.ldc);
}

/* The row-major product the struct states, element by element in double. */
static void reference_row_major(struct dm_gemm g)
{
    CHECK(!g.column_major);
    for (int item = 0; item < g.batch; item++) {
        const float *A = g.a + item * g.stride_a, *Bm = g.b + item * g.stride_b;
        float *Cm = g.c + item * g.stride_c;
        for (int i = 0; i < g.m; i++)
            for (int j = 0; j < g.n; j++) {
                double s = 0.0;
                for (int p = 0; p < g.k; p++)
                    s += (double)(g.trans_a ? A[(long)p * g.lda + i] : A[(long)i * g.lda + p]) *
                         (g.trans_b ? Bm[(long)j * g.ldb + p] : Bm[(long)p * g.ldb + j]);
                float *c = Cm + (long)i * g.ldc + j;
                *c = (float)(g.alpha * s + (g.beta != 0.0f ? g.beta * *c : 0.0));
            }
    }
}

/* A product of the model: operands with room for their strides, the
 * row-major statement against its column-major translation on CBLAS. */
static void check_product(const char *what, struct dm_gemm (*build)(float *c, const float *a,
                                                                     const float *b, int m,
                                                                     int n, int k),
                          long a_floats, long b_floats, long c_floats, int m, int n, int k)
{
    float *a = filled(a_floats, 1.0f), *b = filled(b_floats, 1.0f);
    float *c0 = filled(c_floats, 1.0f), *want = copied(c0, c_floats), *got = copied(c0, c_floats);
    reference_row_major(build(want, a, b, m, n, k));
    cblas_column_major(dm_gemm_to_column_major(build(got, a, b, m, n, k)));
    check_close(what, got, want, c_floats, 1e-5);
    dm_free(a), dm_free(b), dm_free(c0), dm_free(want), dm_free(got);
}

/* The builders with one signature: (m, n, k) carry (N, C, OC) or (items, T, hs). */
static struct dm_gemm forward_acc(float *c, const float *a, const float *b, int N, int C, int OC)
{
    return dm_gemm_matmul_forward(c, a, b, N, C, OC, 1.0f);
}
static struct dm_gemm dinp_set(float *c, const float *a, const float *b, int N, int C, int OC)
{
    return dm_gemm_matmul_dinp(c, a, b, N, C, OC, 0.0f);
}
static struct dm_gemm dweight(float *c, const float *a, const float *b, int N, int C, int OC)
{
    return dm_gemm_matmul_dweight(c, a, b, N, C, OC);
}
static struct dm_gemm scores(float *c, const float *a, const float *b, int items, int T, int hs)
{
    return dm_gemm_attention_scores(c, a, b, items, T, hs, 0.25f);
}
static struct dm_gemm values(float *c, const float *a, const float *b, int items, int T, int hs)
{
    return dm_gemm_attention_values(c, a, b, items, T, hs);
}
static struct dm_gemm dprobs(float *c, const float *a, const float *b, int items, int T, int hs)
{
    return dm_gemm_attention_dprobs(c, a, b, items, T, hs);
}
static struct dm_gemm dq(float *c, const float *a, const float *b, int items, int T, int hs)
{
    return dm_gemm_attention_dq(c, a, b, items, T, hs);
}
static struct dm_gemm dk(float *c, const float *a, const float *b, int items, int T, int hs)
{
    return dm_gemm_attention_dk(c, a, b, items, T, hs);
}
static struct dm_gemm dv(float *c, const float *a, const float *b, int items, int T, int hs)
{
    return dm_gemm_attention_dv(c, a, b, items, T, hs);
}

/* Every product of a model of width C, NH heads, B x T tokens, vocab V
 * and expert width H: the four linear layers, the tied head and an
 * expert's two (forward, input and weight gradients each), and the six
 * strided-batched products of attention. */
static void test_products(int B, int T, int C, int NH, int V, int H)
{
    printf("products B=%d T=%d C=%d NH=%d V=%d H=%d\n", B, T, C, NH, V, H);
    int N = B * T, items = B * NH, hs = C / NH;
    int layer[][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, V}, {C, H}, {H, C}};
    for (size_t i = 0; i < sizeof layer / sizeof *layer; i++) {
        int in = layer[i][0], out = layer[i][1];
        char what[96];
        snprintf(what, sizeof what, "gemm forward (%d,%d)x(%d,%d)^T", N, in, out, in);
        check_product(what, forward_acc, (long)N * in, (long)out * in, (long)N * out, N, in, out);
        snprintf(what, sizeof what, "gemm dinp (%d,%d)x(%d,%d)", N, out, out, in);
        check_product(what, dinp_set, (long)N * out, (long)out * in, (long)N * in, N, in, out);
        snprintf(what, sizeof what, "gemm dweight (%d,%d)^Tx(%d,%d)", N, out, N, in);
        check_product(what, dweight, (long)N * out, (long)N * in, (long)out * in, N, in, out);
    }
    long qkv = (long)items * T * hs, tt = (long)items * T * T;
    check_product("attention scores q k^T (batched)", scores, qkv, qkv, tt, items, T, hs);
    check_product("attention att v (batched)", values, tt, qkv, qkv, items, T, hs);
    check_product("attention dy v^T (batched)", dprobs, qkv, qkv, tt, items, T, hs);
    check_product("attention dscores k (batched)", dq, tt, qkv, qkv, items, T, hs);
    check_product("attention dscores^T q (batched)", dk, tt, qkv, qkv, items, T, hs);
    check_product("attention att^T dy (batched)", dv, tt, qkv, qkv, items, T, hs);
}

/* ---- whole ops as the plugin composes them ------------------------------- */

/* matmul.cu's forward: the output's start, the product, the GELU epilogue */
static void host_matmul_forward(float *out, float *gelu_out, const float *inp,
                                const float *weight, const float *bias, const float *residual,
                                int N, int C, int OC)
{
    if (bias || residual)
        FOR_GRID(3, 64, matmul_init_thread(t, out, bias, residual, N, OC));
    float beta = bias || residual ? 1.0f : 0.0f;
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_matmul_forward(out, inp, weight, N, C,
                                                                      OC, beta)));
    if (gelu_out) FOR_GRID(3, 64, gelu_forward_thread(t, gelu_out, out, (long)N * OC));
}

/* matmul.cu's backward: dinp (+= or =, then * gelu'), dweight +=, dbias += */
static void host_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                                 const float *inp, const float *weight, const float *gelu_inp,
                                 float beta, int N, int C, int OC)
{
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_matmul_dinp(dinp, dout, weight, N, C,
                                                                   OC, beta)));
    if (gelu_inp)
        FOR_GRID(3, 64, gelu_backward_thread(t, dinp, gelu_inp, dinp, (long)N * C));
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_matmul_dweight(dw, dout, inp, N, C, OC)));
    FOR_GRID(2, 16, matmul_dbias_thread(t, db, dout, N, OC));
}

static void test_matmul(int N, int C, int OC)
{
    printf("matmul N=%d C=%d OC=%d\n", N, C, OC);
    long NC = (long)N * C, NO = (long)N * OC, OCC = (long)OC * C;
    float *inp = filled(NC, 1.0f), *w = filled(OCC, 0.2f), *b = filled(OC, 1.0f);
    float *res = filled(NO, 1.0f), *dout = filled(NO, 1.0f), *gin = filled(NC, 1.0f);
    float *want = dm_alloc(NO * 4), *got = dm_alloc(NO * 4);
    float *gwant = dm_alloc(NO * 4), *ggot = dm_alloc(NO * 4);
    matmul_forward_gelu(want, gwant, inp, w, b, N, C, OC);
    host_matmul_forward(got, ggot, inp, w, b, NULL, N, C, OC);
    check_close("matmul_forward_gelu out", got, want, NO, 1e-5);
    check_close("matmul_forward_gelu gelu_out", ggot, gwant, NO, 1e-5);
    matmul_forward_residual(want, inp, w, b, res, N, C, OC);
    host_matmul_forward(got, NULL, inp, w, b, res, N, C, OC);
    check_close("matmul_forward_residual", got, want, NO, 1e-5);
    matmul_forward(want, inp, w, NULL, N, C, OC);
    host_matmul_forward(got, NULL, inp, w, NULL, NULL, N, C, OC);
    check_close("matmul_forward (no bias)", got, want, NO, 1e-5);
    float *dinp0 = filled(NC, 1.0f), *dw0 = filled(OCC, 1.0f), *db0 = filled(OC, 1.0f);
    float *dinp = copied(dinp0, NC), *dw = copied(dw0, OCC), *db = copied(db0, OC);
    float *gdinp = copied(dinp0, NC), *gdw = copied(dw0, OCC), *gdb = copied(db0, OC);
    matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    host_matmul_backward(gdinp, gdw, gdb, dout, inp, w, NULL, 1.0f, N, C, OC);
    check_close("matmul_backward dinp (+=)", gdinp, dinp, NC, 1e-5);
    check_close("matmul_backward dweight (+=)", gdw, dw, OCC, 1e-5);
    check_bits("matmul_backward dbias (+=)", gdb, db, OC);
    matmul_backward_gelu(dinp, dw, db, dout, inp, w, gin, N, C, OC);
    host_matmul_backward(gdinp, gdw, gdb, dout, inp, w, gin, 0.0f, N, C, OC);
    check_close("matmul_backward_gelu dinp", gdinp, dinp, NC, 1e-5);
    check_close("matmul_backward_gelu dweight", gdw, dw, OCC, 1e-5);
    float *all[] = {inp, w, b, res, dout, gin, want, got, gwant, ggot, dinp0, dw0, db0, dinp,
                    dw, db, gdinp, gdw, gdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dm_free(all[i]);
}

/* attention.cu's tensors: the heads (B NH T hs each) and two full-length rows (B T C) */
struct heads {
    float *q, *k, *v, *y, *dy, *dq, *dk, *dv, *qfull, *full;
};

static struct heads heads_alloc(int B, int T, int C)
{
    long per = (long)B * T * C;
    float *base = dm_alloc((size_t)10 * per * sizeof(float));
    struct heads h = {base, base + per, base + 2 * per, base + 3 * per, base + 4 * per,
                      base + 5 * per, base + 6 * per, base + 7 * per, base + 8 * per,
                      base + 9 * per};
    return h;
}

/* attention.cu's heads_forward: scores, causal softmax by rows, values */
static void host_heads_forward(const struct heads *h, float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, items = B * NH;
    long rows = (long)items * T;
    float scale = (float)(1.0 / sqrt((double)hs)), most[THREADS], sum[THREADS];
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_attention_scores(att, h->q, h->k, items,
                                                                        T, hs, scale)));
    for (long k = 0; k < rows; k++) {
        long r = order_at(k, rows);
        float *row = att + r * T;
        int valid = (int)(r % T) + 1;
        FOR_BLOCK(r, rows, block_threads, softmax_max_phase(t, most, row, valid));
        run_tree(most, block_threads, dm_tree_max_step);
        FOR_BLOCK(r, rows, block_threads, softmax_exp_phase(t, sum, most, row, row, valid));
        run_tree(sum, block_threads, dm_tree_sum_step);
        FOR_BLOCK(r, rows, block_threads, softmax_normalize_phase(t, row, sum, valid, T));
    }
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_attention_values(h->y, att, h->v, items,
                                                                        T, hs)));
}

/* attention.cu's heads_backward */
static void host_heads_backward(const struct heads *h, float *scores, const float *att, int B,
                                int T, int C, int NH)
{
    int hs = C / NH, items = B * NH;
    long rows = (long)items * T;
    float scale = (float)(1.0 / sqrt((double)hs)), dot[THREADS];
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_attention_dprobs(scores, h->dy, h->v,
                                                                        items, T, hs)));
    for (long k = 0; k < rows; k++) {
        long r = order_at(k, rows);
        FOR_BLOCK(r, rows, block_threads, attention_softmax_backward_dot_phase(t, dot, att, scores, T));
        run_tree(dot, block_threads, dm_tree_sum_step);
        FOR_BLOCK(r, rows, block_threads, attention_softmax_backward_phase(t, scores, dot, att, scale,
                                                                     T));
    }
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_attention_dq(h->dq, scores, h->k, items,
                                                                    T, hs)));
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_attention_dk(h->dk, scores, h->q, items,
                                                                    T, hs)));
    cblas_column_major(dm_gemm_to_column_major(dm_gemm_attention_dv(h->dv, att, h->dy, items,
                                                                    T, hs)));
}

/* attention.cu's cuda_attention_forward and _backward */
static void host_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                   int C, int NH, const struct heads *h)
{
    FOR_GRID(5, 32, attention_permute_thread(t, h->q, h->k, h->v, qkv, 3 * C, qkv + C,
                                             qkv + 2 * C, 3 * C, B, T, C, NH));
    host_heads_forward(h, att, B, T, C, NH);
    FOR_GRID(5, 32, attention_unpermute_thread(t, out, h->y, B, T, C, NH));
}

static void host_attention_backward(float *dqkv, float *scores, const float *dout,
                                    const float *qkv, const float *att, int B, int T, int C,
                                    int NH, const struct heads *h)
{
    FOR_GRID(5, 32, attention_permute_thread(t, h->q, h->k, h->v, qkv, 3 * C, qkv + C,
                                             qkv + 2 * C, 3 * C, B, T, C, NH));
    FOR_GRID(5, 32, attention_split_heads_thread(t, h->dy, dout, B, T, C, NH));
    host_heads_backward(h, scores, att, B, T, C, NH);
    FOR_GRID(5, 32, attention_gradient_thread(t, dqkv, 3 * C, dqkv + C, dqkv + 2 * C, 3 * C,
                                              h->dq, h->dk, h->dv, B, T, C, NH));
}

static void test_attention(int B, int T, int C, int NH)
{
    printf("attention B=%d T=%d C=%d NH=%d\n", B, T, C, NH);
    long BTC = (long)B * T * C, tt = (long)B * NH * T * T;
    float *qkv = filled(3 * BTC, 1.0f), *dout = filled(BTC, 1.0f);
    float *out = dm_alloc(BTC * 4), *att = dm_alloc(tt * 4), *dqkv = dm_alloc(3 * BTC * 4);
    float *scratch = dm_alloc(tt * 4);
    attention_forward(out, att, qkv, B, T, C, NH);
    attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    struct heads work = heads_alloc(B, T, C);
    struct two_runs gout = two_copies(out, BTC), gatt = two_copies(att, tt);
    struct two_runs gd = two_copies(dqkv, 3 * BTC);
    FOR_ORDERS(r) {
        memset(gatt.run[r], 0x7f, tt * 4);   /* every element written: no leftovers */
        host_attention_forward(gout.run[r], gatt.run[r], qkv, B, T, C, NH, &work);
        host_attention_backward(gd.run[r], scratch, dout, qkv, att, B, T, C, NH, &work);
    }
    check_orders("attention_forward att", gatt.run[0], gatt.run[1], tt);
    check_orders("attention_backward dqkv", gd.run[0], gd.run[1], 3 * BTC);
    check_close("attention_forward out", gout.run[0], out, BTC, 1e-5);
    check_close("attention_forward att", gatt.run[1], att, tt, 1e-5);
    check_close("attention_backward dqkv", gd.run[0], dqkv, 3 * BTC, 1e-5);
    two_free(&gout), two_free(&gatt), two_free(&gd);
    dm_free(qkv), dm_free(dout), dm_free(out), dm_free(att), dm_free(dqkv);
    dm_free(scratch), dm_free(work.q);
}

/* A random CSR weight (OC, C) keeping about `keep` of the entries, with
 * empty rows; arrays from dm_alloc, in *w. */
static void random_csr(struct csr_matrix *w, int OC, int C, double keep)
{
    w->rows = OC, w->cols = C;
    w->row_ptr = dm_alloc((size_t)(OC + 1) * sizeof(int));
    w->col_idx = dm_alloc((size_t)OC * C * sizeof(int) + 4);
    w->values = dm_alloc((size_t)OC * C * sizeof(float) + 4);
    int nnz = 0;
    for (int o = 0; o < OC; o++) {
        w->row_ptr[o] = nnz;
        for (int c = 0; c < C && o % 7 != 3; c++)
            if (fabsf(draw_normal()) < keep * 1.6f) {
                w->col_idx[nnz] = c;
                w->values[nnz++] = draw_normal();
            }
    }
    w->row_ptr[OC] = w->nnz = nnz;
}

static void test_sparse(int N, int C, int OC, double keep)
{
    struct csr_matrix w;
    random_csr(&w, OC, C, keep);
    printf("sparse N=%d C=%d OC=%d nnz=%d\n", N, C, OC, w.nnz);
    long NC = (long)N * C, NO = (long)N * OC;
    float *x = filled(NC, 1.0f), *b = filled(OC, 1.0f), *dy = filled(NO, 1.0f);
    float *out = dm_alloc(NO * 4), *dx = filled(NC, 1.0f), *dw = filled((long)OC * C, 1.0f);
    float *db = filled(OC, 1.0f);
    struct two_runs gout = two_copies(out, NO), gdx = two_copies(dx, NC);
    struct two_runs gdw = two_copies(dw, (long)OC * C), gdb = two_copies(db, OC);
    sparse_matmul_forward(out, x, &w, b, N, C, OC);
    sparse_matmul_backward(dx, dw, db, dy, x, &w, N, C, OC);
    FOR_ORDERS(r) {
        FOR_GRID(3, 32, sparse_forward_thread(t, gout.run[r], x, w.row_ptr, w.col_idx, w.values,
                                              b, N, C, OC));
        FOR_GRID(2, 16, sparse_dinp_thread(t, gdx.run[r], dy, w.row_ptr, w.col_idx, w.values, N,
                                           C, OC));
        FOR_GRID(3, 16, sparse_dweight_thread(t, gdw.run[r], dy, x, w.row_ptr, w.col_idx, w.nnz,
                                              N, C, OC));
        FOR_GRID(2, 8, sparse_dbias_thread(t, gdb.run[r], dy, N, OC));
    }
    check_orders("sparse dweight", gdw.run[0], gdw.run[1], (long)OC * C);
    check_bits("sparse_matmul_forward", gout.run[0], out, NO);
    check_bits("sparse_matmul_backward dinp", gdx.run[1], dx, NC);
    check_bits("sparse_matmul_backward dweight", gdw.run[0], dw, (long)OC * C);
    check_bits("sparse_matmul_backward dbias", gdb.run[0], db, OC);
    two_free(&gout), two_free(&gdx), two_free(&gdw), two_free(&gdb);
    dm_free(x), dm_free(b), dm_free(dy), dm_free(out), dm_free(dx), dm_free(dw), dm_free(db);
    dm_free(w.row_ptr), dm_free(w.col_idx), dm_free(w.values);
}

static void test_mod(int B, int T, int C, int k)
{
    printf("mixture of depths B=%d T=%d C=%d k=%d\n", B, T, C, k);
    float *in = filled((long)B * T * C, 1.0f), *w = filled(C, 1.0f);
    float *router = dm_alloc((size_t)B * T * 4), *grouter = dm_alloc((size_t)B * T * 4);
    int *chosen = dm_alloc((size_t)B * T * sizeof(int)), *gchosen[2];
    mod_router_forward(router, in, w, B * T, C);
    FOR_GRID(3, 16, mod_router_thread(t, grouter, in, w, B * T, C));
    check_bits("mod_router_forward", grouter, router, (long)B * T);
    for (int i = 0; i < T; i += 3) router[i] = router[T - 1 - i / 2];   /* ties */
    router[B * T - 1] = router[B * T - 2];
    mod_select_topk(chosen, router, B, T, k);
    FOR_ORDERS(r) {
        gchosen[r] = dm_alloc((size_t)B * T * sizeof(int));
        FOR_GRID(2, 32, mod_select_topk_thread(t, gchosen[r], router, B, T, k));
    }
    long differ = 0, picked = 0;
    for (long i = 0; i < (long)B * T; i++) {
        differ += gchosen[0][i] != chosen[i] || gchosen[1][i] != chosen[i];
        picked += gchosen[0][i];
    }
    CHECK_MSG(differ == 0, "mod_select_topk: %ld choices differ from the CPU's", differ);
    CHECK_MSG(picked == (long)B * k, "mod_select_topk chose %ld tokens, want %d", picked, B * k);
    printf("  %-44s same choices (%ld tokens): %s\n", "mod_select_topk", picked,
           differ ? "NO" : "yes");
    dm_free(in), dm_free(w), dm_free(router), dm_free(grouter), dm_free(chosen);
    dm_free(gchosen[0]), dm_free(gchosen[1]);
}

/* The block over the chosen tokens: n packed rows of N, some sequences'
 * rows, the combination forward, the backward's scale and its three
 * kernels (dr, din, the router weight's gradient), against the CPU ops */
static void test_mod_combine(int N, int C)
{
    int *rows = dm_alloc((size_t)N * sizeof(int)), n = 0;
    for (int i = 0; i < N; i++)
        if ((i * 7 + i / 5) % 3 != 1) rows[n++] = i;
    printf("mixture of depths combination N=%d C=%d tokens=%d\n", N, C, n);
    long NC = (long)N * C, nC = (long)n * C;
    float *x = filled(nC, 1.0f), *f = filled(nC, 1.0f), *router = filled(N, 0.5f);
    float *w = filled(C, 0.5f), *in = filled(NC, 1.0f), *dout = filled(NC, 1.0f);
    float *g = filled(nC, 1.0f), *dw0 = filled(C, 1.0f), *dr = dm_alloc((size_t)n * 4 + 4);
    float *out = copied(in, NC), *din = copied(dout, NC), *dw = copied(dw0, C);
    float *work = dm_alloc((size_t)nC * 4 + 4);
    mod_combine_forward(out, x, f, router, rows, n, C);
    mod_scale_chosen(work, dout, router, rows, n, C);
    mod_combine_backward(din, dw, x, f, g, router, w, rows, n, C);
    struct two_runs gout = two_copies(in, NC), gwork = two_copies(work, nC);
    struct two_runs gdin = two_copies(dout, NC), gdw = two_copies(dw0, C);
    FOR_ORDERS(r) {
        FOR_GRID(3, 32, mod_combine_forward_thread(t, gout.run[r], x, f, router, rows, n, C));
        FOR_GRID(2, 32, mod_scale_chosen_thread(t, gwork.run[r], dout, router, rows, n, C));
        FOR_GRID(2, 16, mod_combine_dr_thread(t, dr, gdin.run[r], x, f, rows, n, C));
        FOR_GRID(3, 32, mod_combine_din_thread(t, gdin.run[r], dr, g, router, w, rows, n, C));
        FOR_GRID(2, 8, mod_dweight_thread(t, gdw.run[r], dr, x, n, C));
    }
    check_orders("mod_combine_backward dweight", gdw.run[0], gdw.run[1], C);
    check_bits("mod_combine_forward", gout.run[1], out, NC);
    check_bits("mod_scale_chosen", gwork.run[0], work, nC);
    check_bits("mod_combine_backward din", gdin.run[1], din, NC);
    check_bits("mod_combine_backward dweight", gdw.run[0], dw, C);
    two_free(&gout), two_free(&gwork), two_free(&gdin), two_free(&gdw);
    float *all[] = {x, f, router, w, in, dout, g, dw0, dr, out, din, dw, work};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dm_free(all[i]);
    dm_free(rows);
}

/* attention.cu's rows forms: compact queries scattered into a zeroed
 * full-length Q, the dense path, the active rows gathered back */
static void host_attention_rows_forward(float *out, float *att, const float *q, const float *kv,
                                        const int *rows, int n, int B, int T, int C, int NH,
                                        const struct heads *h)
{
    memset(h->qfull, 0, (size_t)B * T * C * sizeof(float));
    FOR_GRID(3, 32, rows_scatter_thread(t, h->qfull, q, rows, n, C, 0));
    FOR_GRID(5, 32, attention_permute_thread(t, h->q, h->k, h->v, h->qfull, C, kv, kv + C, 2 * C,
                                             B, T, C, NH));
    host_heads_forward(h, att, B, T, C, NH);
    FOR_GRID(5, 32, attention_unpermute_thread(t, h->full, h->y, B, T, C, NH));
    FOR_GRID(3, 32, rows_gather_thread(t, out, h->full, rows, n, C));
}

static void host_attention_rows_backward(float *dq, float *dkv, float *scores, const float *dout,
                                         const float *q, const float *kv, const float *att,
                                         const int *rows, int n, int B, int T, int C, int NH,
                                         const struct heads *h)
{
    memset(h->qfull, 0, (size_t)B * T * C * sizeof(float));
    FOR_GRID(3, 32, rows_scatter_thread(t, h->qfull, q, rows, n, C, 0));
    FOR_GRID(5, 32, attention_permute_thread(t, h->q, h->k, h->v, h->qfull, C, kv, kv + C, 2 * C,
                                             B, T, C, NH));
    memset(h->full, 0, (size_t)B * T * C * sizeof(float));
    FOR_GRID(3, 32, rows_scatter_thread(t, h->full, dout, rows, n, C, 0));
    FOR_GRID(5, 32, attention_split_heads_thread(t, h->dy, h->full, B, T, C, NH));
    host_heads_backward(h, scores, att, B, T, C, NH);
    FOR_GRID(5, 32, attention_gradient_thread(t, h->qfull, C, dkv, dkv + C, 2 * C, h->dq, h->dk,
                                              h->dv, B, T, C, NH));
    FOR_GRID(3, 32, rows_gather_thread(t, dq, h->qfull, rows, n, C));
}

/* Early exit: a subset of query rows (the last sequence has none active). */
static void test_attention_rows(int B, int T, int C, int NH)
{
    int *rows = dm_alloc((size_t)B * T * sizeof(int)), n = 0;
    for (int i = 0; i < (B - 1) * T; i++)
        if ((i * 7 + i / T) % 3 != 0) rows[n++] = i;
    printf("attention rows B=%d T=%d C=%d NH=%d active=%d\n", B, T, C, NH, n);
    long BTC = (long)B * T * C, tt = (long)B * NH * T * T;
    float *q = filled((long)n * C, 1.0f), *kv = filled(2 * BTC, 1.0f);
    float *dout = filled((long)n * C, 1.0f), *out = dm_alloc((size_t)n * C * 4 + 4);
    float *att = dm_alloc(tt * 4), *scratch = dm_alloc(tt * 4);
    float *dq = dm_alloc((size_t)n * C * 4 + 4), *dkv = dm_alloc(2 * BTC * 4);
    attention_forward_rows(out, att, q, kv, rows, n, B, T, C, NH);
    attention_backward_rows(dq, dkv, scratch, dout, q, kv, att, rows, n, B, T, C, NH);
    struct heads h = heads_alloc(B, T, C);
    float *gout = dm_alloc((size_t)n * C * 4 + 4), *gatt = dm_alloc(tt * 4);
    float *gdq = dm_alloc((size_t)n * C * 4 + 4), *gdkv = filled(2 * BTC, 1.0f);
    host_attention_rows_forward(gout, gatt, q, kv, rows, n, B, T, C, NH, &h);
    host_attention_rows_backward(gdq, gdkv, scratch, dout, q, kv, gatt, rows, n, B, T, C, NH, &h);
    check_close("attention_forward_rows out", gout, out, (long)n * C, 1e-5);
    check_close("attention_backward_rows dq", gdq, dq, (long)n * C, 1e-5);
    check_close("attention_backward_rows dkv (unseen keys 0)", gdkv, dkv, 2 * BTC, 1e-5);
    float *all[] = {q, kv, dout, out, att, scratch, dq, dkv, gout, gatt, gdq, gdkv, h.q};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dm_free(all[i]);
    dm_free(rows);
}

/* hash.cu's forward: buckets, orders, tiles, attention; returns the
 * tiles, *alone the queries with their own key alone */
static long host_hash_forward(float *out, float *lse, int *order, int *bucket, long *alone,
                              const float *qkv, const float *rotation, int B, int T, int C,
                              int NH, int buckets)
{
    long rows = (T + DM_HASH_TILE - 1) / DM_HASH_TILE, total = 0, n = (long)B * NH * rows;
    long *tiles = dm_alloc(2 * (size_t)n * sizeof(long));
    FOR_GRID(4, 32, hash_bucket_thread(t, bucket, qkv, rotation, B, T, C, NH, buckets));
    FOR_GRID(4, 32, hash_order_thread(t, order, bucket, B, NH, T));
    FOR_GRID(2, 8, hash_tiles_thread(t, tiles, tiles + n, order, bucket, B, NH, T));
    *alone = 0;
    for (long i = 0; i < n; i++) total += tiles[i], *alone += tiles[n + i];
    FOR_GRID(3, 32, hash_forward_thread(t, out, lse, order, bucket, qkv, B, T, C, NH));
    dm_free(tiles);
    return total;
}

static void host_hash_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, const int *order, const int *bucket, int B,
                               int T, int C, int NH)
{
    float *delta = dm_alloc((size_t)B * NH * T * sizeof(float));
    FOR_GRID(3, 32, hash_delta_thread(t, delta, dout, out, B, T, C, NH));
    FOR_GRID(3, 32, hash_dq_thread(t, dqkv, dout, qkv, lse, delta, order, bucket, B, T, C, NH));
    FOR_GRID(3, 32, hash_dkv_thread(t, dqkv, dout, qkv, lse, delta, order, bucket, B, T, C, NH));
    dm_free(delta);
}

/* every query has a key (its own at least): lse finite on both sides,
 * within tol */
static void check_lse(const float *got, const float *want, long n)
{
    long infinite = 0;
    for (long i = 0; i < n; i++) infinite += !isfinite(got[i]) || !isfinite(want[i]);
    CHECK_MSG(infinite == 0, "hash lse: %ld queries without a key", infinite);
    check_close("group_attention_forward lse", got, want, n, 1e-5);
}

static void test_hash(int B, int T, int C, int NH, int buckets)
{
    int hs = C / NH;
    long BTC = (long)B * T * C, bhT = (long)B * NH * T;
    float *qkv = filled(3 * BTC, 1.0f), *dout = filled(BTC, 1.0f);
    float *rotation = dm_alloc(((size_t)NH * hs * (buckets / 2) + 1) * sizeof(float));
    hash_rotation_draw(rotation, NH, hs, buckets, 42, 3, 7);
    float *out = dm_alloc(BTC * 4), *lse = dm_alloc(bhT * 4), *dqkv = dm_alloc(3 * BTC * 4);
    int *order = dm_alloc(2 * bhT * sizeof(int)), *bucket = dm_alloc(2 * bhT * sizeof(int));
    long alone = 0, galone = 0;
    long tiles = group_attention_forward(out, lse, order, bucket, &alone, qkv, rotation, B, T, C,
                                         NH, buckets);
    long btiles = group_attention_backward(dqkv, dout, qkv, out, lse, order, bucket, B, T, C, NH);
    float *gout = filled(BTC, 1.0f), *glse = dm_alloc(bhT * 4), *gd = filled(3 * BTC, 1.0f);
    int *gorder = dm_alloc(2 * bhT * sizeof(int)), *gbucket = dm_alloc(2 * bhT * sizeof(int));
    long gtiles = host_hash_forward(gout, glse, gorder, gbucket, &galone, qkv, rotation, B, T, C,
                                    NH, buckets);
    host_hash_backward(gd, dout, qkv, gout, glse, gorder, gbucket, B, T, C, NH);
    printf("hash attention B=%d T=%d C=%d NH=%d buckets=%d: tiles %ld (CPU %ld, backward %ld); "
           "queries with their own key alone %ld (CPU %ld)\n", B, T, C, NH, buckets, gtiles,
           tiles, btiles, galone, alone);
    CHECK(gtiles == tiles && btiles == tiles && galone == alone);
    CHECK_MSG(!memcmp(gbucket, bucket, 2 * bhT * sizeof(int)), "hash buckets differ");
    CHECK_MSG(!memcmp(gorder, order, 2 * bhT * sizeof(int)), "hash orders differ");
    check_close("group_attention_forward out", gout, out, BTC, 1e-5);
    check_lse(glse, lse, bhT);
    check_close("group_attention_backward dqkv", gd, dqkv, 3 * BTC, 1e-5);
    float *all[] = {qkv, dout, rotation, out, lse, dqkv, gout, glse, gd};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dm_free(all[i]);
    dm_free(order), dm_free(bucket), dm_free(gorder), dm_free(gbucket);
}

/* mod.cu's causal predictor, the MLP of hidden width H: per token, then
 * the gradient per weight, the loss summed in token order in double */
static void test_mod_predictor(int N, int C, int H)
{
    long P = mod_predictor_params(C, H);
    float *in = filled((long)N * C, 1.0f), *w = filled(P, 0.5f), *dw = filled(P, 1.0f);
    int *target = dm_alloc((size_t)N * sizeof(int)), *chosen = dm_alloc((size_t)N * sizeof(int));
    int *gchosen = dm_alloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++) target[n] = (n * 5) % 3 == 0;
    float *gdw = copied(dw, P), *loss = dm_alloc((size_t)N * 4), *grad = dm_alloc((size_t)N * 4);
    float *hidden = dm_alloc((size_t)N * H * 4);
    float want = mod_predictor_forward_backward(dw, 0.75f, chosen, in, w, target, N, C, H);
    FOR_GRID(2, 16, mod_predictor_thread(t, loss, grad, hidden, gchosen, in, w, target, N, C, H));
    FOR_GRID(2, 8, mod_predictor_dweight_thread(t, gdw, 0.75f, grad, hidden, in, w, N, C, H));
    double sum = 0.0;
    long active = 0;
    for (int n = 0; n < N; n++) sum += loss[n];
    for (long i = 0; i < (long)N * H; i++) active += hidden[i] > 0.0f;
    float got = (float)(sum / N);
    printf("mixture of depths predictor N=%d C=%d H=%d: loss %.9g (CPU %.9g); %.0f%% of the "
           "hidden units active\n", N, C, H, got, want, 100.0 * active / ((double)N * H));
    CHECK_MSG(!memcmp(&got, &want, sizeof got), "mod predictor loss %.9g, CPU %.9g", got, want);
    CHECK_MSG(!memcmp(gchosen, chosen, (size_t)N * sizeof(int)), "mod predictor choices differ");
    check_bits("mod_predictor_forward_backward dweight", gdw, dw, P);
    dm_free(in), dm_free(w), dm_free(dw), dm_free(target), dm_free(chosen), dm_free(gchosen);
    dm_free(gdw), dm_free(loss), dm_free(grad), dm_free(hidden);
}

/* The gradient norm's sum of squares: chunks (one thread each) then
 * their in-order total, against the CPU backend's sum_squares, bit for
 * bit (n a few chunks and a ragged tail; one chunk; empty). */
static void test_sum_squares(long n)
{
    float *x = filled(n, 2.0f);
    long chunks = dm_sumsq_chunks(n);
    double *partial = dm_alloc((size_t)(chunks + 1) * sizeof(double));
    FOR_GRID(2, 4, sumsq_chunk_thread(t, partial, x, n));
    FOR_GRID(1, 8, sumsq_total_thread(t, partial + chunks, partial, chunks));
    double want = sum_squares(x, n), got = chunks ? partial[chunks] : 0.0;
    printf("sum of squares n=%ld (%ld chunks): %.17g (CPU %.17g)\n", n, chunks, got, want);
    CHECK_MSG(!memcmp(&got, &want, sizeof got), "sum_squares n=%ld: %.17g, CPU %.17g", n, got,
              want);
    dm_free(x), dm_free(partial);
}

/* ---- product operand precision (precision.cuh) ------------------------------- */

/* An independent rounding: the two neighbours of x that keep the top bits
 * (toward zero and away from it), the nearer in double, a tie to the one
 * with an even last kept bit; past the largest finite value the upper
 * neighbour is 2^128, an infinity. Finite x only. */
static uint32_t reference_round(uint32_t bits, int dropped)
{
    uint32_t low = bits & ~((1u << dropped) - 1u), high = low + (1u << dropped);
    float x = dm_bits_float(bits);
    double to_low = fabs((double)x - (double)dm_bits_float(low));
    double high_value = (high & 0x7fffffffu) == 0x7f800000u
                            ? copysign(ldexp(1.0, 128), (double)x)
                            : (double)dm_bits_float(high);
    double to_high = fabs(high_value - (double)x);
    if (to_low != to_high) return to_low < to_high ? low : high;
    return (low >> dropped) & 1u ? high : low;
}

/* bits in, bf16 bits out and TF32 (as fp32 bits) out */
static void check_rounding(uint32_t in, uint16_t bf16, uint32_t tf32)
{
    float x = dm_bits_float(in);
    CHECK_MSG(dm_bf16_from_float(x) == bf16, "bf16 of %08x: %04x, want %04x", (unsigned)in,
              (unsigned)dm_bf16_from_float(x), (unsigned)bf16);
    uint32_t got = dm_float_bits(dm_round_tf32(x));
    CHECK_MSG(got == tf32, "tf32 of %08x: %08x, want %08x", (unsigned)in, (unsigned)got,
              (unsigned)tf32);
    CHECK(dm_float_bits(dm_round_bf16(x)) == (uint32_t)bf16 << 16);
}

static void test_precision_rounding(void)
{
    check_rounding(0x3f800000u, 0x3f80, 0x3f800000u);   /* 1 */
    check_rounding(0x3f808000u, 0x3f80, 0x3f808000u);   /* bf16 tie, to even: down */
    check_rounding(0x3f818000u, 0x3f82, 0x3f818000u);   /* bf16 tie, to even: up */
    check_rounding(0x3f808001u, 0x3f81, 0x3f808000u);   /* past the tie */
    check_rounding(0x3f807fffu, 0x3f80, 0x3f808000u);   /* short of it */
    check_rounding(0x3f801000u, 0x3f80, 0x3f800000u);   /* TF32 tie, to even: down */
    check_rounding(0x3f803000u, 0x3f80, 0x3f804000u);   /* TF32 tie, to even: up */
    check_rounding(0xbf808001u, 0xbf81, 0xbf808000u);   /* negative */
    check_rounding(0x7f7fffffu, 0x7f80, 0x7f800000u);   /* largest fp32: infinity */
    check_rounding(0xff7fffffu, 0xff80, 0xff800000u);
    check_rounding(0x7f7f7fffu, 0x7f7f, 0x7f7f8000u);   /* largest bf16 stays */
    check_rounding(0x7f7f8000u, 0x7f80, 0x7f7f8000u);   /* its tie rounds to even: infinity */
    check_rounding(0x7f7fe000u, 0x7f80, 0x7f7fe000u);   /* largest TF32 stays */
    check_rounding(0x00000001u, 0x0000, 0x00000000u);   /* smallest subnormal: 0 */
    check_rounding(0x00008000u, 0x0000, 0x00008000u);   /* subnormal ties */
    check_rounding(0x00018000u, 0x0002, 0x00018000u);
    check_rounding(0x00003000u, 0x0000, 0x00004000u);
    check_rounding(0x00008001u, 0x0001, 0x00008000u);
    check_rounding(0x807fffffu, 0x8080, 0x80800000u);   /* into the smallest normal */
    check_rounding(0x00000000u, 0x0000, 0x00000000u);
    check_rounding(0x80000000u, 0x8000, 0x80000000u);   /* -0 */
    check_rounding(0x7f800000u, 0x7f80, 0x7f800000u);   /* infinities stay */
    check_rounding(0xff800000u, 0xff80, 0xff800000u);
    check_rounding(0x7fc00000u, 0x7fc0, 0x7fc00000u);   /* NaNs stay NaNs, quiet, signed */
    check_rounding(0x7f800001u, 0x7fc0, 0x7fc00000u);
    check_rounding(0xff800001u, 0xffc0, 0xffc00000u);
    check_rounding(0x7fbfffffu, 0x7fff, 0x7fffe000u);
    long mismatches = 0;
    uint64_t state = 77;
    for (long i = 0; i < 2000000; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t bits = (uint32_t)(state >> 32);
        if ((bits & 0x7f800000u) == 0x7f800000u) continue;
        mismatches += dm_float_bits(dm_round_bf16(dm_bits_float(bits))) !=
                      reference_round(bits, DM_BF16_DROPPED_BITS);
        mismatches += dm_float_bits(dm_round_tf32(dm_bits_float(bits))) !=
                      reference_round(bits, DM_TF32_DROPPED_BITS);
    }
    CHECK_MSG(mismatches == 0, "%ld random values round unlike the reference", mismatches);
    printf("precision: bf16 and TF32 rounding, %s\n",
           mismatches ? "FAILED" : "the listed cases and 2e6 random values as the reference");
}

/* the conversion kernel and the emulator's rounding over a grid: every
 * element as the per-element function gives it */
static void test_precision_grid(long n)
{
    float *x = dm_alloc((size_t)n * sizeof(float)), *r = dm_alloc((size_t)n * sizeof(float));
    uint16_t *h = dm_alloc((size_t)n * sizeof(uint16_t));
    for (long i = 0; i < n; i++) x[i] = draw_normal() * 100.0f;
    long blocks = 3, bad = 0;
    for (int precision = DM_PRECISION_FP32; precision <= DM_PRECISION_BF16; precision++) {
        FOR_GRID(blocks, DM_BLOCK_THREADS, precision_round_thread(t, r, x, n, precision));
        for (long i = 0; i < n; i++) bad += r[i] != dm_round_operand(x[i], precision);
        for (long i = 0; i < n && precision == DM_PRECISION_FP32; i++) bad += r[i] != x[i];
    }
    FOR_GRID(blocks, DM_BLOCK_THREADS, precision_to_bf16_thread(t, h, x, n));
    for (long i = 0; i < n; i++) bad += h[i] != dm_bf16_from_float(x[i]);
    CHECK_MSG(bad == 0, "precision grid: %ld elements differ", bad);
    dm_free(x), dm_free(r), dm_free(h);
}

/* what a rounded copy of each operand covers: every float the product reads */
static void test_gemm_spans(void)
{
    struct dm_gemm f = dm_gemm_to_column_major(dm_gemm_matmul_forward(NULL, NULL, NULL, 5, 7, 3, 0));
    CHECK(dm_gemm_span_a(f) == 3 * 7 && dm_gemm_span_b(f) == 5 * 7);
    struct dm_gemm w = dm_gemm_to_column_major(dm_gemm_matmul_dweight(NULL, NULL, NULL, 5, 7, 3));
    CHECK(dm_gemm_span_a(w) == 5 * 7 && dm_gemm_span_b(w) == 5 * 3);
    struct dm_gemm s = dm_gemm_to_column_major(dm_gemm_attention_scores(NULL, NULL, NULL, 4, 9,
                                                                        6, 1.0f));
    CHECK(dm_gemm_span_a(s) == 4 * 9 * 6 && dm_gemm_span_b(s) == 4 * 9 * 6);
    struct dm_gemm v = dm_gemm_to_column_major(dm_gemm_attention_dv(NULL, NULL, NULL, 4, 9, 6));
    CHECK(dm_gemm_span_a(v) == 4 * 9 * 6 && dm_gemm_span_b(v) == 4 * 9 * 9);
    CHECK(dm_gemm_span(0, 5, 8, 40, 2) == 0);
    CHECK(dm_gemm_span(3, 5, 8, 100, 2) == 100 + 8 * 4 + 3);   /* gaps between columns */
}

int main(void)
{
    dm_threads_init(1);
    test_precision_rounding();
    test_precision_grid(3000);
    test_gemm_spans();
    test_gelu_residual();
    test_rows();
    test_exit_confidence(37, 23, 256, 48);
    test_exit_confidence(64, 64, 77, 32);   /* every token active */
    test_moe(37, 2, 48, 5);
    test_moe(20, 3, 24, 1000);              /* nothing dropped but token 1 */
    test_moe(16, 1, 100, 4);                /* k = 1 */
    test_moe_route(45, 8, 2, 0);
    test_moe_route(37, 4, 2, 1);            /* sigmoid with a bias */
    test_moe_route(20, 6, 1, 0);            /* k = 1: the gate is the probability */
    test_moe_route(21, 5, 1, 1);            /* k = 1, sigmoid: the gate is the score */
    test_moe_route(16, 64, 3, 1);           /* many experts */
    test_prune();
    test_adamw();
    test_encoder();
    for (int k = 0; k < 2; k++) {
        block_threads = k ? 32 : DM_BLOCK_THREADS;
        printf("blocks of %d threads\n", block_threads);
        test_layernorm(45, 64);
        test_layernorm(7, 100);       /* C not a multiple of the block */
        test_layernorm(3, 600);       /* more channels than threads */
        test_crossentropy(19, 256);
        test_crossentropy(5, 77);
        test_attention(1, 45, 24, 3); /* T not a multiple of ATT_BLOCK */
    }
    test_matmul(96, 64, 192);
    test_matmul(33, 40, 24);
    test_products(2, 32, 64, 4, 256, 96);
    test_products(1, 17, 24, 3, 50, 40);
    test_attention(2, 32, 64, 4);
    test_attention_rows(3, 40, 48, 4);
    test_attention_rows(2, 33, 24, 2);
    test_hash(2, 100, 32, 2, 8);    /* T not a multiple of GROUP_TILE */
    test_hash(1, 64, 24, 3, 2);
    test_hash(2, 40, 16, 2, 1);     /* one bucket: causal attention */
    test_hash(1, 70, 32, 4, 32);    /* many buckets: own keys alone */
    test_sparse(150, 48, 72, 0.3);  /* N not a multiple of the tile */
    test_sparse(40, 32, 96, 0.9);
    test_sparse(64, 24, 16, 0.0);   /* every row empty: nothing kept */
    test_mod(3, 40, 32, 13);
    test_mod(2, 17, 8, 17);         /* k = T: every token */
    test_mod_combine(120, 48);
    test_mod_combine(37, 300);      /* more channels than threads */
    test_mod_predictor(150, 48, 16);
    test_mod_predictor(37, 24, 1);
    test_sum_squares(5 * DM_SUMSQ_CHUNK + 1234);
    test_sum_squares(100);
    test_sum_squares(0);
    return testing_report("test_kernels_host");
}
