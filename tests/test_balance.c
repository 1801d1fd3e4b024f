/* Tests for src/balance against independent references: every exact
 * partition is compared with brute force over all layouts on a large random
 * family (blocks <= 12, stages <= 5, ties, integer and float costs, with and
 * without memory caps); the least-movement tie-break likewise; diffusion is
 * checked for convergence, memory safety at every round and local
 * optimality; repack for capacity, its time bound and never losing to
 * Algorithm 2; the predictor against closed forms and a separate
 * longest-path relaxation; the shared-processor predictor against the
 * dedicated one, the total work on one core, hand-worked cases and a
 * fixed-tick reference; partition-time under sharing against brute force
 * over all layouts; every bad input for an error value that names the
 * culprit. Prints the largest differences seen. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "testing.h"

/* ---- a small deterministic generator ------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int rng_int(int lo, int hi) /* inclusive */
{
    return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

static double rng_unit(void) { return (rng_next() >> 11) * 0x1.0p-53; }

/* ---- brute force over all layouts ----------------------------------------- */

#define MAX_BLOCKS 64   /* buffers */
#define FAMILY_BLOCKS 12 /* the exhaustive random family */
#define MAX_STAGES 5

/* Calls visit(counts) for every layout of n blocks on S stages. Not
 * inlined: unrolled into its callers it makes -Warray-bounds see stage
 * indices past S. */
__attribute__((noinline))
static void each_layout(int n, int S, int *counts, int stage, int left,
                        void (*visit)(const int *counts, void *ctx), void *ctx)
{
    if (stage == S - 1) {
        counts[stage] = left;
        visit(counts, ctx);
        return;
    }
    for (int c = 1; c <= left - (S - 1 - stage); c++) {
        counts[stage] = c;
        each_layout(n, S, counts, stage + 1, left - c, visit, ctx);
    }
}

/* Owner stage of each block. */
static void owners(const int *counts, int S, int *owner)
{
    int i = 0;
    for (int s = 0; s < S; s++)
        for (int k = 0; k < counts[s]; k++) owner[i++] = s;
}

struct brute {
    const struct balance_costs *costs;
    int stages;
    int64_t cap;
    const int *reference;
    int reference_stages;
    /* results */
    int feasible;
    double best_cost;
    int64_t best_moved_bytes;
    int best_moved_blocks;
    int best[MAX_STAGES];
    int pass;  /* 0: find the optimum cost; 1: the tie-break */
};

static int layout_max(const struct balance_costs *c, int S, const int *counts,
                      int64_t cap, double *max_cost)
{
    int begin = 0, fits = 1;
    double worst = 0;
    for (int s = 0; s < S; s++) {
        double cost = balance_stage_cost(c, S, s, begin, begin + counts[s]);
        if (s == 0 || cost > worst) worst = cost;
        if (cap > 0 && balance_stage_mem(c, S, s, begin, begin + counts[s]) > cap)
            fits = 0;
        begin += counts[s];
    }
    *max_cost = worst;
    return fits;
}

/* Colex order: compare boundaries from the last one back. */
static int colex_less(const int *a, const int *b, int S)
{
    int ea = 0, eb = 0;
    int ba[MAX_STAGES + 1], bb[MAX_STAGES + 1];
    for (int s = 0; s < S; s++) {
        ba[s] = ea;
        bb[s] = eb;
        ea += a[s];
        eb += b[s];
    }
    for (int s = S - 1; s >= 1; s--)
        if (ba[s] != bb[s]) return ba[s] < bb[s];
    return 0;
}

static void brute_visit(const int *counts, void *ctx)
{
    struct brute *b = ctx;
    double cost;
    if (!layout_max(b->costs, b->stages, counts, b->cap, &cost)) return;
    if (b->pass == 0) {
        if (!b->feasible || cost < b->best_cost) b->best_cost = cost;
        b->feasible = 1;
        return;
    }
    if (cost != b->best_cost) return;
    int n = b->costs->blocks;
    int mine[MAX_BLOCKS], theirs[MAX_BLOCKS];
    owners(counts, b->stages, mine);
    owners(b->reference, b->reference_stages, theirs);
    int64_t bytes = 0;
    int blocks = 0;
    for (int i = 0; i < n; i++)
        if (mine[i] != theirs[i]) {
            bytes += b->costs->mem_bytes[i];
            blocks++;
        }
    int better = b->best_moved_blocks < 0 || bytes < b->best_moved_bytes ||
                 (bytes == b->best_moved_bytes && blocks < b->best_moved_blocks) ||
                 (bytes == b->best_moved_bytes && blocks == b->best_moved_blocks &&
                  colex_less(counts, b->best, b->stages));
    if (better) {
        b->best_moved_bytes = bytes;
        b->best_moved_blocks = blocks;
        memcpy(b->best, counts, (size_t)b->stages * sizeof(int));
    }
}

static void brute_force(struct brute *b)
{
    int counts[MAX_STAGES];
    b->feasible = 0;
    b->best_moved_blocks = -1;
    b->pass = 0;
    each_layout(b->costs->blocks, b->stages, counts, 0, b->costs->blocks,
                brute_visit, b);
    if (!b->feasible) return;
    b->pass = 1;
    each_layout(b->costs->blocks, b->stages, counts, 0, b->costs->blocks,
                brute_visit, b);
}

/* ---- random instances --------------------------------------------------- */

struct instance {
    int n;
    double cost[64];
    int64_t mem[64];
    struct balance_costs costs;
};

/* kind 0: small integers (many ties); 1: floats; 2: floats from a few
 * values (ties in float); 3: some zero costs; 4: costs spread over 600
 * decades and subnormals. Extras sometimes zero. */
static void random_instance(struct instance *in, int n, int kind)
{
    in->n = n;
    double palette[3] = {0.1 + rng_unit(), 0.3 * rng_unit(), 1.7 * rng_unit()};
    for (int i = 0; i < n; i++) {
        switch (kind) {
        case 0: in->cost[i] = rng_int(0, 4); break;
        case 1: in->cost[i] = rng_unit() * 10; break;
        case 2: in->cost[i] = palette[rng_int(0, 2)]; break;
        case 3: in->cost[i] = rng_int(0, 2) ? 0.0 : rng_unit(); break;
        default: /* 600 decades and subnormals: the search must stay exact */
            in->cost[i] = rng_int(0, 3) ? pow(10.0, rng_int(-300, 300))
                                        : rng_int(0, 9) * 0x1p-1074;
            break;
        }
        in->mem[i] = rng_int(0, 3) ? rng_int(1, 10) : 0;
    }
    in->costs = (struct balance_costs){
        .blocks = n, .cost = in->cost, .mem_bytes = in->mem,
        .first_cost = rng_int(0, 2) ? (kind == 0 ? rng_int(0, 5) : rng_unit() * 5) : 0,
        .last_cost = rng_int(0, 2) ? (kind == 0 ? rng_int(0, 5) : rng_unit() * 5) : 0,
        .first_mem_bytes = rng_int(0, 4), .last_mem_bytes = rng_int(0, 4)};
}

static void random_layout(int n, int S, int *counts)
{
    /* each of the n-1 gaps is a cut with the right probability, S-1 cuts */
    int need = S - 1, gaps = n - 1, size = 1, s = 0;
    for (int g = 0; g < gaps; g++) {
        if ((int)(rng_next() % (uint64_t)(gaps - g)) < need) {
            counts[s++] = size;
            size = 1;
            need--;
        } else {
            size++;
        }
    }
    counts[s] = size;
}

static int64_t random_cap(const struct instance *in)
{
    if (rng_int(0, 2) == 0) return 0;
    int64_t total = in->costs.first_mem_bytes + in->costs.last_mem_bytes;
    for (int i = 0; i < in->n; i++) total += in->mem[i];
    return rng_int(1, (int)total + 1);
}

/* ---- partition vs brute force ------------------------------------------- */

static void test_partition_brute_force(void)
{
    int instances = 0, infeasible = 0, with_cap = 0, ties = 0, mismatches = 0;
    for (int trial = 0; trial < 30000; trial++) {
        struct instance in;
        int n = rng_int(1, FAMILY_BLOCKS);
        random_instance(&in, n, trial % 5);
        int S = rng_int(1, n < MAX_STAGES ? n : MAX_STAGES);
        int64_t cap = random_cap(&in);
        int reference[MAX_STAGES], reference_stages = S;
        int use_current = rng_int(0, 3) != 0;
        if (use_current) {
            reference_stages = rng_int(1, n < MAX_STAGES ? n : MAX_STAGES);
            random_layout(n, reference_stages, reference);
        } else {
            balance_static_uniform(n, S, reference, NULL, 0);
        }
        struct brute b = {.costs = &in.costs, .stages = S, .cap = cap,
                          .reference = reference,
                          .reference_stages = reference_stages};
        brute_force(&b);
        int counts[MAX_STAGES];
        struct balance_result res;
        char err[256] = "";
        int rc = balance_partition(&in.costs, S, cap,
                                   use_current ? reference : NULL,
                                   reference_stages, counts, &res, err,
                                   sizeof err);
        instances++;
        with_cap += cap > 0;
        if (!b.feasible) {
            infeasible++;
            CHECK_MSG(rc == BALANCE_INFEASIBLE, "trial %d: rc %d, want infeasible", trial, rc);
            CHECK_MSG(strstr(err, "block") || strstr(err, "stage"),
                      "trial %d: message names nothing: %s", trial, err);
            continue;
        }
        CHECK_MSG(rc == BALANCE_OK, "trial %d: rc %d (%s)", trial, rc, err);
        if (rc != BALANCE_OK) continue;
        int same = memcmp(counts, b.best, (size_t)S * sizeof(int)) == 0;
        if (!same || res.max_stage_cost != b.best_cost ||
            res.bytes_moved != b.best_moved_bytes) {
            mismatches++;
            if (mismatches < 10) {
                fprintf(stderr, "trial %d n=%d S=%d cap=%lld: got", trial, n, S,
                        (long long)cap);
                for (int s = 0; s < S; s++) fprintf(stderr, " %d", counts[s]);
                fprintf(stderr, " (max %.17g, moved %lld) want", res.max_stage_cost,
                        (long long)res.bytes_moved);
                for (int s = 0; s < S; s++) fprintf(stderr, " %d", b.best[s]);
                fprintf(stderr, " (max %.17g, moved %lld)\n", b.best_cost,
                        (long long)b.best_moved_bytes);
            }
        }
        CHECK(balance_fits(&in.costs, S, cap, b.best_cost));
        if (b.best_cost > 0)
            CHECK(!balance_fits(&in.costs, S, cap, nextafter(b.best_cost, -1.0)));
        /* More than one optimal layout: the tie-break mattered. */
        double c2;
        int alt[MAX_STAGES];
        balance_static_uniform(n, S, alt, NULL, 0);
        if (layout_max(&in.costs, S, alt, cap, &c2) && c2 == b.best_cost &&
            memcmp(alt, b.best, (size_t)S * sizeof(int)) != 0)
            ties++;
    }
    CHECK_MSG(mismatches == 0, "%d of %d instances differ from brute force",
              mismatches, instances);
    printf("partition vs brute force: %d instances (%d capped, %d infeasible, "
           ">= %d with tied optima), %d mismatches\n", instances, with_cap,
           infeasible, ties, mismatches);
}

/* Medium instances (20-48 blocks, up to 4 stages) against brute force,
 * where the least-movement pass first searches windows around the current
 * boundaries: a bottleneck far above the mean (a heavy head or embedding)
 * leaves wide slack, so the windows must grow or be proven sufficient. */
static void test_partition_windows(void)
{
    int mismatches = 0, runs = 0;
    for (int trial = 0; trial < 300; trial++) {
        struct instance in;
        int n = rng_int(20, 48);
        random_instance(&in, n, trial % 4);
        if (trial % 3 == 0) in.costs.last_cost = rng_int(5, 60);
        if (trial % 3 == 1) in.costs.first_cost = rng_int(5, 60);
        int S = rng_int(2, 4);
        int64_t cap = trial % 2 ? 0 : random_cap(&in);
        int reference[MAX_STAGES];
        random_layout(n, S, reference);
        struct brute b = {.costs = &in.costs, .stages = S, .cap = cap,
                          .reference = reference, .reference_stages = S};
        brute_force(&b);
        int counts[MAX_STAGES];
        struct balance_result res;
        int rc = balance_partition(&in.costs, S, cap, reference, S, counts, &res,
                                   NULL, 0);
        if (!b.feasible) {
            CHECK(rc == BALANCE_INFEASIBLE);
            continue;
        }
        runs++;
        if (rc != BALANCE_OK || memcmp(counts, b.best, (size_t)S * sizeof(int)) ||
            res.max_stage_cost != b.best_cost || res.bytes_moved != b.best_moved_bytes)
            mismatches++;
    }
    CHECK_MSG(mismatches == 0, "%d of %d medium instances differ from brute force",
              mismatches, runs);
    printf("partition vs brute force, 20-48 blocks: %d instances, %d mismatches\n",
           runs, mismatches);
}

/* Larger instances: the returned cost is feasible and the next smaller
 * double is not (the probe certifies optimality without brute force). */
static void test_partition_large(void)
{
    static double cost[3000];
    static int64_t mem[3000];
    for (int trial = 0; trial < 40; trial++) {
        int n = rng_int(50, 3000), S = rng_int(2, 100);
        if (S > n) S = n;
        for (int i = 0; i < n; i++) {
            cost[i] = trial % 2 ? rng_int(1, 100) : rng_unit() * 3;
            mem[i] = rng_int(1, 1000);
        }
        struct balance_costs c = {.blocks = n, .cost = cost, .mem_bytes = mem,
                                  .first_cost = 2, .last_cost = 5,
                                  .first_mem_bytes = 100, .last_mem_bytes = 500};
        int64_t cap = trial % 3 == 0 ? 0 : 600 + (int64_t)(1000.0 * n / S) * 2;
        int counts[100], current[100];
        random_layout(n, S, current);
        struct balance_result res;
        char err[256];
        int rc = balance_partition(&c, S, cap, current, S, counts, &res, err, sizeof err);
        if (rc != BALANCE_OK) {
            CHECK_MSG(rc == BALANCE_INFEASIBLE, "%s", err);
            continue;
        }
        CHECK(balance_check_layout(counts, S, n, NULL, 0) == BALANCE_OK);
        double max_cost;
        int64_t max_mem;
        balance_layout_max(&c, S, counts, &max_cost, &max_mem);
        CHECK(max_cost == res.max_stage_cost);
        CHECK(cap == 0 || max_mem <= cap);
        CHECK(balance_fits(&c, S, cap, max_cost));
        CHECK(!balance_fits(&c, S, cap, nextafter(max_cost, -1.0)));
        /* deterministic */
        int again[100];
        struct balance_result res2;
        balance_partition(&c, S, cap, current, S, again, &res2, NULL, 0);
        CHECK(memcmp(again, counts, (size_t)S * sizeof(int)) == 0);
        /* an optimal current layout is kept as it is */
        balance_partition(&c, S, cap, counts, S, again, &res2, NULL, 0);
        CHECK(memcmp(again, counts, (size_t)S * sizeof(int)) == 0 && res2.bytes_moved == 0);
        /* diffusion never beats the exact optimum */
        struct balance_result dres;
        if (balance_diffusion(&c, S, cap, counts, 0, 0, again, &dres, NULL, 0) == 0)
            CHECK(dres.max_stage_cost >= res.max_stage_cost);
    }
    printf("large partitions: optimality certified by the probe on 40 instances\n");
}

/* ---- static baselines, layout helpers, migration plan ---------------------- */

static void test_static_and_plan(void)
{
    int counts[8];
    CHECK(balance_static_uniform(10, 4, counts, NULL, 0) == BALANCE_OK);
    CHECK(counts[0] == 3 && counts[1] == 3 && counts[2] == 2 && counts[3] == 2);
    CHECK(balance_static_uniform(8, 4, counts, NULL, 0) == BALANCE_OK);
    CHECK(counts[0] == 2 && counts[3] == 2);
    char err[256] = "";
    CHECK(balance_static_uniform(3, 4, counts, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK(strstr(err, "3 blocks") && strstr(err, "4 stages"));

    int64_t mem[6] = {10, 20, 30, 40, 50, 60};
    int from[3] = {2, 2, 2}, to[3] = {1, 3, 2}, to2[2] = {3, 3};
    struct balance_move moves[MAX_BLOCKS + 1];
    int count;
    int64_t bytes;
    CHECK(balance_migration_plan(mem, 6, 99, from, 3, to, 3, moves, &count,
                                 &bytes, NULL, 0) == BALANCE_OK);
    CHECK(count == 1 && moves[0].block == 1 && moves[0].src_stage == 0 &&
          moves[0].dst_stage == 1 && bytes == 20);
    CHECK(balance_migration_plan(mem, 6, 99, from, 3, to2, 2, moves, &count,
                                 &bytes, NULL, 0) == BALANCE_OK);
    /* block 2: 1->0, block 3: 1->1 stays, head 2->1 */
    CHECK(count == 4);
    CHECK(moves[0].block == 2 && moves[0].src_stage == 1 && moves[0].dst_stage == 0);
    CHECK(moves[1].block == 4 && moves[1].src_stage == 2 && moves[1].dst_stage == 1);
    CHECK(moves[3].block == BALANCE_HEAD_BLOCK && moves[3].bytes == 99);
    CHECK(bytes == 30 + 50 + 60 + 99);
    int bad[3] = {2, 0, 4};
    CHECK(balance_migration_plan(mem, 6, 0, bad, 3, to, 3, moves, &count, &bytes,
                                 err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK(strstr(err, "stage 1"));

    /* Random round trips: applying the moves to `from` gives `to`. */
    for (int trial = 0; trial < 2000; trial++) {
        int n = rng_int(1, FAMILY_BLOCKS), S1 = rng_int(1, n < 5 ? n : 5), S2 = rng_int(1, n < 5 ? n : 5);
        int a[5], b[5], oa[12], ob[12];
        int64_t m[12];
        for (int i = 0; i < n; i++) m[i] = rng_int(0, 9);
        random_layout(n, S1, a);
        random_layout(n, S2, b);
        owners(a, S1, oa);
        owners(b, S2, ob);
        CHECK(balance_migration_plan(m, n, 5, a, S1, b, S2, moves, &count, &bytes,
                                     NULL, 0) == BALANCE_OK);
        int64_t sum = 0;
        for (int k = 0; k < count; k++) {
            if (moves[k].block == BALANCE_HEAD_BLOCK) {
                sum += 5;
                continue;
            }
            CHECK(oa[moves[k].block] == moves[k].src_stage);
            oa[moves[k].block] = moves[k].dst_stage;
            sum += m[moves[k].block];
        }
        CHECK(memcmp(oa, ob, (size_t)n * sizeof(int)) == 0);
        CHECK(sum == bytes);
    }
}

/* ---- bad input --------------------------------------------------------------- */

static void test_bad_input(void)
{
    double cost[4] = {1, 2, NAN, 1};
    int64_t mem[4] = {1, 1, 1, 1};
    struct balance_costs c = {.blocks = 4, .cost = cost, .mem_bytes = mem};
    int counts[8];
    char err[256] = "";
    struct balance_result res;
    CHECK(balance_partition(&c, 2, 0, NULL, 0, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "block 2") && strstr(err, "not a finite"), "%s", err);
    cost[2] = -1;
    CHECK(balance_diffusion(&c, 2, 0, NULL, 0, 0, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "block 2") && strstr(err, "negative"), "%s", err);
    cost[2] = INFINITY;
    CHECK(balance_partition(&c, 2, 0, NULL, 0, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    cost[2] = 1.5e308;
    cost[3] = 1.5e308;
    CHECK(balance_partition(&c, 2, 0, NULL, 0, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "block 3") && strstr(err, "overflows"), "%s", err);
    cost[2] = cost[3] = 1;
    CHECK(balance_partition(&c, 5, 0, NULL, 0, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "4 blocks cannot fill 5 stages"), "%s", err);
    CHECK(balance_partition(&c, 0, 0, NULL, 0, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    mem[1] = 50;
    CHECK(balance_partition(&c, 2, 10, NULL, 0, counts, &res, err, sizeof err) == BALANCE_INFEASIBLE);
    CHECK_MSG(strstr(err, "block 1 needs 50 bytes"), "%s", err);
    mem[1] = -3;
    CHECK(balance_partition(&c, 2, 10, NULL, 0, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "block 1") && strstr(err, "negative"), "%s", err);
    mem[1] = 1;
    c.first_mem_bytes = 10;
    CHECK(balance_partition(&c, 2, 10, NULL, 0, counts, &res, err, sizeof err) == BALANCE_INFEASIBLE);
    CHECK_MSG(strstr(err, "stage 0") && strstr(err, "embedding"), "%s", err);
    c.first_mem_bytes = 0;
    c.last_cost = NAN;
    CHECK(balance_partition(&c, 2, 0, NULL, 0, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "head"), "%s", err);
    c.last_cost = 0;
    /* every block fits a stage, but 4 blocks of 1 byte need 2 stages of 2 */
    CHECK(balance_partition(&c, 1, 2, NULL, 0, counts, &res, err, sizeof err) == BALANCE_INFEASIBLE);
    CHECK_MSG(strstr(err, "stage 0"), "%s", err);
    int current_bad[2] = {3, 2};
    CHECK(balance_partition(&c, 2, 0, current_bad, 2, counts, &res, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "5 blocks but there are 4"), "%s", err);
    double cost8[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int64_t mem8[8] = {3, 3, 3, 3, 3, 3, 3, 3};
    struct balance_costs c8 = {.blocks = 8, .cost = cost8, .mem_bytes = mem8};
    CHECK(balance_partition(&c8, 2, 6, NULL, 0, counts, &res, err, sizeof err) == BALANCE_INFEASIBLE);
    CHECK_MSG(strstr(err, "at least 4 stages"), "%s", err);
    /* diffusion refuses a start that breaks the cap */
    int start[2] = {6, 2};
    CHECK(balance_diffusion(&c8, 2, 12, start, 0, 0, counts, &res, err, sizeof err) == BALANCE_INFEASIBLE);
    CHECK_MSG(strstr(err, "stage 0"), "%s", err);
    /* predictor */
    double f[2] = {1, -1}, b[2] = {1, 1};
    struct balance_prediction pr;
    CHECK(balance_predict_stages(f, b, 2, 4, DM_SCHEDULE_1F1B, &pr, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "stage 1"), "%s", err);
    f[1] = 1;
    CHECK(balance_predict_stages(f, b, 2, 0, DM_SCHEDULE_1F1B, &pr, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "micro-batches"), "%s", err);
    CHECK(balance_method_parse("partition-time") == BALANCE_PARTITION_TIME);
    CHECK(balance_method_parse("nope") == -1);
    CHECK(balance_method_name(BALANCE_METHOD_COUNT) == NULL);
}

/* ---- diffusion ----------------------------------------------------------------- */

static int fits_layout(const struct balance_costs *c, int S, const int *counts, int64_t cap)
{
    double ignored;
    return layout_max(c, S, counts, cap, &ignored);
}

static void test_diffusion(void)
{
    int runs = 0, total_rounds = 0, max_rounds_seen = 0;
    double worst_ratio = 1.0;
    for (int trial = 0; trial < 3000; trial++) {
        struct instance in;
        int n = rng_int(2, 40);
        random_instance(&in, n, trial % 4);
        int S = rng_int(1, n < 8 ? n : 8);
        int64_t cap = random_cap(&in);
        int start[8];
        int found = 0;
        for (int tries = 0; tries < 50 && !found; tries++) {
            random_layout(n, S, start);
            found = cap == 0 || fits_layout(&in.costs, S, start, cap);
        }
        if (!found) continue;
        double gamma = trial % 5 == 0 ? rng_unit() : 0;
        int counts[8];
        struct balance_result res;
        char err[256];
        int rc = balance_diffusion(&in.costs, S, cap, start, gamma, 0, counts, &res, err, sizeof err);
        CHECK_MSG(rc == BALANCE_OK, "%s", err);
        if (rc) continue;
        runs++;
        total_rounds += res.rounds;
        if (res.rounds > max_rounds_seen) max_rounds_seen = res.rounds;
        CHECK(res.converged);
        CHECK(balance_check_layout(counts, S, n, NULL, 0) == BALANCE_OK);
        CHECK(cap == 0 || res.max_stage_mem_bytes <= cap);
        double start_max;
        layout_max(&in.costs, S, start, 0, &start_max);
        CHECK(res.max_stage_cost <= start_max);
        /* every intermediate round respects memory */
        for (int r = 1; r <= res.rounds; r++) {
            int mid[8];
            struct balance_result mres;
            balance_diffusion(&in.costs, S, cap, start, gamma, r, mid, &mres, NULL, 0);
            CHECK(cap == 0 || mres.max_stage_mem_bytes <= cap);
        }
        /* converged: no pair can lower its maximum by one boundary block
         * within memory (unless gamma stopped it) */
        double lo = INFINITY, hi = -INFINITY;
        int begin[9];
        begin[0] = 0;
        for (int s = 0; s < S; s++) begin[s + 1] = begin[s] + counts[s];
        for (int s = 0; s < S; s++) {
            double c = balance_stage_cost(&in.costs, S, s, begin[s], begin[s + 1]);
            lo = fmin(lo, c);
            hi = fmax(hi, c);
        }
        if (!(gamma > 0 && hi - lo < gamma)) {
            for (int s = 0; s + 1 < S; s++) {
                double l = balance_stage_cost(&in.costs, S, s, begin[s], begin[s + 1]);
                double r = balance_stage_cost(&in.costs, S, s + 1, begin[s + 1], begin[s + 2]);
                int to = l > r ? begin[s + 1] - 1 : begin[s + 1] + 1;
                if (to <= begin[s] || to >= begin[s + 2]) continue;
                double nl = balance_stage_cost(&in.costs, S, s, begin[s], to);
                double nr = balance_stage_cost(&in.costs, S, s + 1, to, begin[s + 2]);
                int64_t recv = to < begin[s + 1]
                                   ? balance_stage_mem(&in.costs, S, s + 1, to, begin[s + 2])
                                   : balance_stage_mem(&in.costs, S, s, begin[s], to);
                CHECK_MSG(!(fmax(nl, nr) < fmax(l, r)) || (cap > 0 && recv > cap),
                          "trial %d: pair %d could still improve", trial, s);
            }
        }
        /* deterministic */
        int again[8];
        balance_diffusion(&in.costs, S, cap, start, gamma, 0, again, NULL, NULL, 0);
        CHECK(memcmp(again, counts, (size_t)S * sizeof(int)) == 0);
        struct balance_result opt;
        int best[8];
        if (balance_partition(&in.costs, S, cap, NULL, 0, best, &opt, NULL, 0) == 0 &&
            opt.max_stage_cost > 0)
            worst_ratio = fmax(worst_ratio, res.max_stage_cost / opt.max_stage_cost);
    }
    printf("diffusion: %d runs converged, %.2f rounds on average, at most %d; "
           "worst max-stage cost %.3fx the exact optimum\n", runs,
           runs ? (double)total_rounds / runs : 0.0, max_rounds_seen, worst_ratio);
}

/* ---- predictor ---------------------------------------------------------------- */

enum { REF_MAX_STAGES = 6, REF_MAX_MICRO = 8 };

/* The schedule lists written out again, for the references below: entry
 * c >= 0 is forward c, c < 0 backward -1 - c. */
static void reference_lists(int list[][2 * REF_MAX_MICRO], int S, int m, int gpipe)
{
    for (int s = 0; s < S; s++) {
        int k = 0;
        if (gpipe) {
            for (int i = 0; i < m; i++) list[s][k++] = i;
            for (int i = 0; i < m; i++) list[s][k++] = -1 - i;
        } else {
            int w = S - 1 - s;
            if (w > m) w = m;
            int nf = 0, nb = 0;
            while (nf < w) list[s][k++] = nf++;
            while (nf < m) {
                list[s][k++] = nf++;
                list[s][k++] = -1 - nb++;
            }
            while (nb < m) list[s][k++] = -1 - nb++;
        }
    }
}

/* An independent reference: longest-path relaxation to a fixed point over
 * the same dependency rules. */
static double reference_step(const double *f, const double *b, int S, int m, int gpipe)
{
    enum { MAXS = REF_MAX_STAGES, MAXM = REF_MAX_MICRO };
    int list[MAXS][2 * MAXM];
    reference_lists(list, S, m, gpipe);
    double fin_f[MAXS][MAXM] = {{0}}, fin_b[MAXS][MAXM] = {{0}};
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = 0; s < S; s++) {
            double t = 0;
            for (int k = 0; k < 2 * m; k++) {
                int c = list[s][k];
                double start = t, fin;
                if (c >= 0) {
                    if (s > 0) start = fmax(start, fin_f[s - 1][c]);
                    fin = start + f[s];
                    if (fin != fin_f[s][c]) changed = 1, fin_f[s][c] = fin;
                } else {
                    int i = -1 - c;
                    if (s < S - 1) start = fmax(start, fin_b[s + 1][i]);
                    fin = start + b[s];
                    if (fin != fin_b[s][i]) changed = 1, fin_b[s][i] = fin;
                }
                t = fin;
            }
        }
    }
    double step = 0;
    for (int s = 0; s < S; s++)
        for (int i = 0; i < m; i++) step = fmax(step, fmax(fin_f[s][i], fin_b[s][i]));
    return step;
}

static void test_predictor(void)
{
    struct balance_prediction pr;
    double f[64], b[64];
    for (int S = 1; S <= 16; S++)
        for (int m = 1; m <= 20; m++)
            for (int gpipe = 0; gpipe <= 1; gpipe++) {
                for (int s = 0; s < S; s++) f[s] = 1.0, b[s] = 2.0;
                balance_predict_stages(f, b, S, m, gpipe ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B,
                                       &pr, NULL, 0);
                CHECK_NEAR(pr.step_ms, (m + S - 1) * 3.0, 1e-9);
                CHECK_NEAR(pr.bubble_ratio, (S - 1.0) / (m + S - 1.0), 1e-12);
            }
    double worst = 0;
    for (int trial = 0; trial < 3000; trial++) {
        int S = rng_int(1, 6), m = rng_int(1, 8), gpipe = rng_int(0, 1);
        for (int s = 0; s < S; s++) {
            f[s] = rng_int(0, 1) ? rng_int(0, 5) : rng_unit() * 4;
            b[s] = rng_int(0, 1) ? rng_int(0, 9) : rng_unit() * 8;
        }
        balance_predict_stages(f, b, S, m, gpipe ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B,
                               &pr, NULL, 0);
        double want = reference_step(f, b, S, m, gpipe);
        worst = fmax(worst, fabs(pr.step_ms - want));
        CHECK_NEAR(pr.step_ms, want, 1e-9);
        CHECK(pr.bubble_ratio >= 0 && pr.bubble_ratio < 1);
    }
    printf("predictor vs relaxation reference: 3000 random pipelines, largest "
           "difference %.3g ms\n", worst);
}

/* ---- repack ------------------------------------------------------------------- */

struct profile_instance {
    double fwd[MAX_BLOCKS], bwd[MAX_BLOCKS], params[MAX_BLOCKS];
    int64_t mem[MAX_BLOCKS];
    struct balance_profile profile;
};

static void random_profile(struct profile_instance *pi, int n)
{
    for (int i = 0; i < n; i++) {
        pi->fwd[i] = rng_int(0, 1) ? rng_int(0, 4) : rng_unit() * 3;
        pi->bwd[i] = rng_int(0, 1) ? 2 * pi->fwd[i] : rng_unit() * 6;
        pi->params[i] = rng_int(1, 100);
        pi->mem[i] = rng_int(1, 10);
    }
    pi->profile = (struct balance_profile){
        .blocks = n, .fwd_ms = pi->fwd, .bwd_ms = pi->bwd, .params = pi->params,
        .mem_bytes = pi->mem,
        .embed = {rng_unit(), rng_unit(), 50, rng_int(0, 5)},
        .head = {rng_unit() * 2, rng_unit() * 4, 50, rng_int(0, 5)}};
}

static void test_repack(void)
{
    int runs = 0, fewer = 0, beat_first_fit = 0, optimal = 0;
    for (int trial = 0; trial < 3000; trial++) {
        struct profile_instance pi;
        int n = rng_int(1, FAMILY_BLOCKS);
        random_profile(&pi, n);
        int S = rng_int(1, n < MAX_STAGES ? n : MAX_STAGES);
        int m = rng_int(1, 8);
        enum dm_schedule schedule = rng_int(0, 1) ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        double epsilon = (double[]){0, 0.05, 0.25, 1.0}[rng_int(0, 3)];
        int current[MAX_STAGES];
        random_layout(n, S, current);
        double cost[MAX_BLOCKS];
        struct balance_costs costs;
        balance_costs_from_profile(&costs, &pi.profile, BALANCE_COST_TIME, cost);
        int64_t cap = 0;
        if (rng_int(0, 1)) {
            int64_t worst;
            balance_layout_max(&costs, S, current, NULL, &worst);
            cap = worst + rng_int(0, 20);
        }
        int counts[MAX_STAGES];
        struct balance_result res;
        char err[256];
        int rc = balance_repack(&pi.profile, current, S, cap, m, schedule, epsilon,
                                counts, &res, err, sizeof err);
        CHECK_MSG(rc == BALANCE_OK, "%s", err);
        if (rc) continue;
        runs++;
        int k = res.stages;
        CHECK(k >= 1 && k <= S);
        CHECK(balance_check_layout(counts, k, n, NULL, 0) == BALANCE_OK);
        int64_t max_mem;
        balance_layout_max(&costs, k, counts, NULL, &max_mem);
        CHECK(cap == 0 || max_mem <= cap);
        struct balance_prediction now, then;
        balance_predict(&pi.profile, S, current, m, schedule, &now, NULL, 0);
        balance_predict(&pi.profile, k, counts, m, schedule, &then, NULL, 0);
        double bound = now.step_ms * (1 + epsilon);
        CHECK_MSG(then.step_ms <= bound, "trial %d: %.17g > bound %.17g", trial,
                  then.step_ms, bound);
        fewer += k < S;
        /* never worse than Algorithm 2 at any target */
        for (int target = 1; target <= S; target++) {
            int merged[MAX_STAGES], merged_stages;
            CHECK(balance_repack_first_fit(&costs, current, S, cap, target, merged,
                                           &merged_stages, NULL, 0) == BALANCE_OK);
            int64_t mm;
            balance_layout_max(&costs, merged_stages, merged, NULL, &mm);
            CHECK(cap == 0 || mm <= cap);
            struct balance_prediction p2;
            balance_predict(&pi.profile, merged_stages, merged, m, schedule, &p2, NULL, 0);
            if (p2.step_ms <= bound) {
                CHECK_MSG(k <= merged_stages, "trial %d: repack %d stages, "
                          "first-fit %d", trial, k, merged_stages);
                beat_first_fit += k < merged_stages;
            }
        }
        /* brute force: the fewest stages any layout needs */
        int best_k = S;
        for (int kk = 1; kk < S && best_k == S; kk++) {
            int layout[MAX_STAGES];
            /* enumerate compositions of n into kk parts */
            int cuts[MAX_STAGES] = {0};
            for (int i = 0; i < kk - 1; i++) cuts[i] = i + 1;
            for (;;) {
                int prev = 0;
                for (int i = 0; i < kk - 1; i++) layout[i] = cuts[i] - prev, prev = cuts[i];
                layout[kk - 1] = n - prev;
                int64_t lm;
                balance_layout_max(&costs, kk, layout, NULL, &lm);
                struct balance_prediction p3;
                if ((cap == 0 || lm <= cap) &&
                    balance_predict(&pi.profile, kk, layout, m, schedule, &p3, NULL, 0) == 0 &&
                    p3.step_ms <= bound) {
                    best_k = kk;
                    break;
                }
                int i = kk - 2;
                while (i >= 0 && cuts[i] == n - (kk - 1 - i)) i--;
                if (i < 0) break;
                cuts[i]++;
                for (int j = i + 1; j < kk - 1; j++) cuts[j] = cuts[j - 1] + 1;
            }
        }
        CHECK(k >= best_k);
        optimal += k == best_k;
    }
    printf("repack: %d runs, %d re-packed onto fewer stages, %d strictly fewer "
           "than some Algorithm-2 result, %d at the brute-force minimum\n", runs,
           fewer, beat_first_fit, optimal);
}

/* Algorithm 2 only merges stages, so a start with a stage over the cap
 * cannot become a layout within it: refused (as diffusion refuses it),
 * naming the stage, whether or not other stages could merge. */
static void test_first_fit_over_cap(void)
{
    int failures_before = testing_failures;
    double cost[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int64_t mem[8] = {3, 3, 3, 3, 3, 3, 3, 3};
    struct balance_costs c = {.blocks = 8, .cost = cost, .mem_bytes = mem};
    const struct {
        int stages, start[4], over, bytes;
    } cases[] = {
        {2, {6, 2}, 0, 18},        /* nothing can merge */
        {2, {2, 6}, 1, 18},
        {4, {1, 1, 5, 1}, 2, 15},  /* stages 0 and 1 could merge (6 bytes) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int counts[4] = {0}, stages = -1;
        char err[256] = "", want[64];
        int rc = balance_repack_first_fit(&c, cases[i].start, cases[i].stages, 12, 1, counts,
                                          &stages, err, sizeof err);
        snprintf(want, sizeof want, "stage %d of the starting layout holds %d bytes",
                 cases[i].over, cases[i].bytes);
        CHECK_MSG(rc == BALANCE_INFEASIBLE, "case %zu: rc %d, %d stages, want infeasible",
                  i, rc, stages);
        CHECK_MSG(strstr(err, want) && strstr(err, "capacity of 12 bytes"), "case %zu: %s",
                  i, err);
    }
    /* within the cap it merges as before: 1,1,4,2 on a cap of 12 -> 2,4,2 */
    int start[4] = {1, 1, 4, 2}, counts[4], stages;
    char err[256] = "";
    int rc = balance_repack_first_fit(&c, start, 4, 12, 1, counts, &stages, err, sizeof err);
    CHECK_MSG(rc == BALANCE_OK && stages == 3 && counts[0] == 2 && counts[1] == 4 &&
              counts[2] == 2, "rc %d (%s), %d stages", rc, err, stages);
    printf("repack-first-fit: a start over the cap is refused: %s\n",
           testing_failures > failures_before ? "NO" : "yes");
}

static void test_propose(void)
{
    struct profile_instance pi;
    random_profile(&pi, 10);
    struct balance_options options = {.mem_cap = 0, .gamma = 0, .max_rounds = 0};
    for (int method = 0; method < BALANCE_METHOD_COUNT; method++) {
        int counts[4], again[4];
        struct balance_result res;
        char err[256];
        int rc = balance_propose(method, &pi.profile, 4, NULL, &options, counts, &res,
                                 err, sizeof err);
        CHECK_MSG(rc == BALANCE_OK, "%s: %s", balance_method_name(method), err);
        CHECK(balance_check_layout(counts, 4, 10, NULL, 0) == BALANCE_OK);
        balance_propose(method, &pi.profile, 4, counts, &options, again, &res, NULL, 0);
        if (method != BALANCE_STATIC_UNIFORM && method != BALANCE_STATIC_PARAMS)
            CHECK_MSG(memcmp(counts, again, sizeof counts) == 0 && res.bytes_moved == 0,
                      "%s is not idempotent", balance_method_name(method));
    }
}

/* ---- processor sharing ------------------------------------------------------- */

/* A second, independent reference for the shared predictor: time advances
 * in ticks of dt; in a tick each stage whose next instruction has its input
 * does dt x min(1, cores / computing stages of its group) of work, and an
 * instruction whose work is done completes at the end of the tick, so each
 * completion comes at most about a tick late. */
static double ticked_step(const double *f, const double *b, const double *up, int S, int m,
                          int gpipe, const int *group, const double *cores, double dt)
{
    enum { MAXS = REF_MAX_STAGES, MAXM = REF_MAX_MICRO };
    int list[MAXS][2 * MAXM], pos[MAXS] = {0};
    char done_f[MAXS][MAXM] = {{0}}, done_b[MAXS][MAXM] = {{0}};
    double left[MAXS], update_left[MAXS];
    reference_lists(list, S, m, gpipe);
    int remaining = 2 * m * S;
    for (int s = 0; s < S; s++) {
        left[s] = list[s][0] >= 0 ? f[s] : b[s];
        update_left[s] = up ? up[s] : 0.0;   /* before the list, always ready */
        remaining += update_left[s] > 0;
    }
    double now = 0;
    for (; remaining > 0; now += dt) {
        int ready[MAXS], members[MAXS] = {0};
        for (int s = 0; s < S; s++) {
            int c = pos[s] < 2 * m ? list[s][pos[s]] : 0;
            ready[s] = update_left[s] > 0 ||
                       (pos[s] < 2 * m &&
                        (c >= 0 ? s == 0 || done_f[s - 1][c]
                                : s == S - 1 || done_b[s + 1][-1 - c]));
            members[group[s]] += ready[s];
        }
        for (int s = 0; s < S; s++) {
            if (!ready[s]) continue;
            double rate = fmin(1.0, cores[group[s]] / members[group[s]]);
            if (update_left[s] > 0) {
                update_left[s] -= dt * rate;
                if (update_left[s] <= 1e-12) update_left[s] = 0, remaining--;
                continue;
            }
            left[s] -= dt * rate;
            if (left[s] > 1e-12) continue;
            int c = list[s][pos[s]];
            if (c >= 0) done_f[s][c] = 1;
            else done_b[s][-1 - c] = 1;
            remaining--;
            if (++pos[s] < 2 * m) left[s] = list[s][pos[s]] >= 0 ? f[s] : b[s];
        }
    }
    return now;
}

static void random_stage_times(double *f, double *b, int S)
{
    for (int s = 0; s < S; s++) {
        f[s] = rng_int(0, 1) ? rng_int(0, 5) : rng_unit() * 4;
        b[s] = rng_int(0, 1) ? rng_int(0, 9) : rng_unit() * 8;
    }
}

static int same_prediction(const struct balance_prediction *a,
                           const struct balance_prediction *b)
{
    return memcmp(&a->step_ms, &b->step_ms, sizeof a->step_ms) == 0 &&
           memcmp(&a->bubble_ratio, &b->bubble_ratio, sizeof a->bubble_ratio) == 0 &&
           a->bottleneck_stage == b->bottleneck_stage;
}

/* (a) sharing that oversubscribes nothing is the dedicated predictor bit for
 * bit; m = 1 (one stage computes at a time) with every stage on one core
 * runs the fluid simulation and must agree with it too. */
static void test_sharing_dedicated(void)
{
    double f[8], b[8], worst = 0;
    for (int trial = 0; trial < 1000; trial++) {
        int S = rng_int(1, 6), m = rng_int(1, 8);
        enum dm_schedule schedule = rng_int(0, 1) ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        random_stage_times(f, b, S);
        struct balance_prediction want, got;
        CHECK(balance_predict_stages(f, b, S, m, schedule, &want, NULL, 0) == BALANCE_OK);
        int own[8], one[8] = {0};
        double unit[8], many[1] = {S + rng_unit()}, single[1] = {1.0};
        for (int s = 0; s < 8; s++) own[s] = s, unit[s] = 1.0;
        struct balance_sharing variants[] = {
            {S, S, own, unit, 0},          /* a core per stage, each its own group */
            {S, 1, one, many, 0},          /* one group with a core for everyone */
            {S + 1, 1, one, single, 0},    /* another stage count: ignored */
        };
        for (int v = 0; v < 3; v++) {
            CHECK(balance_predict_shared(f, b, NULL, S, m, schedule, &variants[v], &got,
                                         NULL, 0) == BALANCE_OK);
            CHECK_MSG(same_prediction(&got, &want), "trial %d variant %d: %.17g vs %.17g",
                      trial, v, got.step_ms, want.step_ms);
        }
        CHECK(balance_predict_shared(f, b, NULL, S, m, schedule, NULL, &got, NULL, 0) == BALANCE_OK);
        CHECK(same_prediction(&got, &want));
        struct balance_sharing serial = {S, 1, one, single, 0};
        CHECK(balance_predict_shared(f, b, NULL, S, 1, schedule, &serial, &got, NULL, 0) == BALANCE_OK);
        balance_predict_stages(f, b, S, 1, schedule, &want, NULL, 0);
        CHECK_NEAR(got.step_ms, want.step_ms, 1e-9 * want.step_ms);
        worst = fmax(worst, fabs(got.step_ms - want.step_ms));
    }
    printf("sharing without oversubscription: 1000 x 4 predictions bit-identical to "
           "dedicated; m = 1 on one core: largest difference %.3g ms\n", worst);
}

static double check_shared_bounds(int turns)
{
    double f[8], b[8], u[8], unit[8], worst = 0;
    int zero[8] = {0}, own[8];
    for (int s = 0; s < 8; s++) own[s] = s, unit[s] = 1.0;
    for (int trial = 0; trial < 2000; trial++) {
        int S = trial % 2 ? 4 : rng_int(1, 8), m = rng_int(1, 16);
        enum dm_schedule schedule = rng_int(0, 1) ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        random_stage_times(f, b, S);
        double total = 0;
        for (int s = 0; s < S; s++) {
            u[s] = rng_int(0, 1) ? rng_unit() * 2 : 0;
            total += m * (f[s] + b[s]) + u[s];
        }
        struct balance_prediction dedicated, got;
        CHECK(balance_predict_shared(f, b, u, S, m, schedule, NULL, &dedicated, NULL, 0) ==
              BALANCE_OK);
        double cores = trial % 2 ? 2.0 : 1.0;
        struct balance_sharing sh = {S, 1, zero, &cores, turns};
        CHECK(balance_predict_shared(f, b, u, S, m, schedule, &sh, &got, NULL, 0) == BALANCE_OK);
        double tol = 1e-9 * (total > 1 ? total : 1);
        if (cores == 1.0) {
            CHECK_NEAR(got.step_ms, total, tol);
            worst = fmax(worst, fabs(got.step_ms - total) / (total > 0 ? total : 1));
        } else {
            CHECK_MSG(got.step_ms >= total / 2 - tol && got.step_ms >= dedicated.step_ms - tol &&
                      got.step_ms <= total + tol,
                      "trial %d (turns %d): shared %.17g, total %.17g, dedicated %.17g", trial,
                      turns, got.step_ms, total, dedicated.step_ms);
        }
        CHECK(got.bubble_ratio >= 0 && got.bubble_ratio < 1);
        CHECK(got.bottleneck_stage == dedicated.bottleneck_stage);
        struct balance_sharing each = {S, S, own, unit, turns};   /* a core each */
        CHECK(balance_predict_shared(f, b, u, S, m, schedule, &each, &got, NULL, 0) ==
              BALANCE_OK);
        CHECK(same_prediction(&got, &dedicated));
    }
    return worst;
}

/* (b) one core for all: the core never idles while work is left, so the step
 * is all the work. (d) S = 4 on 2 cores: at least half the work and at least
 * the dedicated step, at most all the work. Both schedules, with updates. */
static void test_sharing_bounds(void)
{
    printf("sharing one core: 1000 pipelines, step = total work to %.3g relative\n",
           check_shared_bounds(0));
}

/* (c) cases worked out by hand. */
static void test_sharing_by_hand(void)
{
    struct balance_prediction pr;
    int zero[2] = {0, 0};
    double one = 1.0, one_and_half = 1.5;
    struct balance_sharing single = {2, 1, zero, &one, 0}, wider = {2, 1, zero, &one_and_half, 0};
    /* m = 1: F0 on stage 0, F0 on 1, B0 on 1, B0 on 0 one after the other */
    double f[2] = {1.5, 2.25}, b[2] = {0.5, 3.0};
    for (int gpipe = 0; gpipe <= 1; gpipe++) {
        enum dm_schedule schedule = gpipe ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        balance_predict_shared(f, b, NULL, 2, 1, schedule, &single, &pr, NULL, 0);
        CHECK_NEAR(pr.step_ms, 1.5 + 2.25 + 3.0 + 0.5, 1e-12);
    }
    /* S = 2, m = 2, f = b = 1. Dedicated, or 2 cores: (m + S - 1)(f + b) =
     * 6. One core: all the work, 8. 1.5 cores (GPipe): F0 on stage 0 alone
     * [0, 1]; F1 on 0 and F0 on 1 at 0.75 each [1, 7/3]; F1 on 1 alone
     * [7/3, 10/3]; B0 on 1 alone [10/3, 13/3]; B1 on 1 and B0 on 0 at 0.75
     * [13/3, 17/3]; B1 on 0 alone [17/3, 20/3]. 1F1B: F0 on 0 [0, 1]; F1 on
     * 0 and F0 on 1 [1, 7/3]; B0 on 1 [7/3, 10/3]; B0 on 0 and F1 on 1
     * [10/3, 14/3]; B1 on 1 [14/3, 17/3]; B1 on 0 [17/3, 20/3]. */
    double unit[2] = {1, 1};
    for (int gpipe = 0; gpipe <= 1; gpipe++) {
        enum dm_schedule schedule = gpipe ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        balance_predict_stages(unit, unit, 2, 2, schedule, &pr, NULL, 0);
        CHECK_NEAR(pr.step_ms, 6.0, 1e-12);
        balance_predict_shared(unit, unit, NULL, 2, 2, schedule, &single, &pr, NULL, 0);
        CHECK_NEAR(pr.step_ms, 8.0, 1e-12);
        CHECK_NEAR(pr.bubble_ratio, 1.0 - 8.0 / 16.0, 1e-12);
        balance_predict_shared(unit, unit, NULL, 2, 2, schedule, &wider, &pr, NULL, 0);
        CHECK_NEAR(pr.step_ms, 20.0 / 3.0, 1e-12);
        double two_cores = 2.0;
        struct balance_sharing enough = {2, 1, zero, &two_cores, 0};
        balance_predict_shared(unit, unit, NULL, 2, 2, schedule, &enough, &pr, NULL, 0);
        CHECK_NEAR(pr.step_ms, 6.0, 1e-12);
    }
    /* Two groups of one core, {0, 1} and {2, 3}, GPipe, m = 1 and f = b = 1:
     * never two stages of a group at once, so dedicated: (1 + 3) x 2 = 8. */
    int pairs[4] = {0, 0, 1, 1};
    double cores[2] = {1, 1}, four[4] = {1, 1, 1, 1};
    struct balance_sharing paired = {4, 2, pairs, cores, 0};
    balance_predict_shared(four, four, NULL, 4, 1, DM_SCHEDULE_GPIPE, &paired, &pr, NULL, 0);
    CHECK_NEAR(pr.step_ms, 8.0, 1e-12);
    /* (d) one group of 2 cores for 4 equal stages, m = 8: at least half the
     * work, 4 x 8 x 2 / 2 = 32, and the dedicated (8 + 3) x 2 = 22. */
    double two = 2.0;
    int all[4] = {0, 0, 0, 0};
    struct balance_sharing half = {4, 1, all, &two, 0};
    balance_predict_shared(four, four, NULL, 4, 8, DM_SCHEDULE_1F1B, &half, &pr, NULL, 0);
    CHECK_MSG(pr.step_ms >= 32.0 - 1e-9, "4 stages on 2 cores: %.17g", pr.step_ms);
}

/* Turns (stages taking turns on their group's cores, first come first
 * served): cases worked by hand, then properties on random pipelines. */
static void test_turns(void)
{
    struct balance_prediction pr;
    char err[256];
    /* S = 3, m = 2, 1F1B, f = b = 1; stages 0 and 2 take turns on one core,
     * stage 1 has its own. Lists: stage 0 F0 F1 B0 B1, stage 1 F0 F1 B0 B1,
     * stage 2 F0 B0 F1 B1. F0 on 0 [0,1]; F1 on 0 and F0 on 1 [1,2]; F1 on
     * 1 and F0 on 2 [2,3]; B0 on 2 [3,4]; then F1 on 2 (it asks first, having
     * just finished) [4,5] while B0 on 1 runs [4,5]; B0 on 0 became ready at
     * 5 before F1 on 2 finished and asked for B1 on 2, so B0 on 0 [5,6], B1
     * on 2 [6,7]; B1 on 1 [7,8]; B1 on 0 [8,9]. 9, where fluid sharing or the
     * other order would give 8 (the dedicated step). */
    int groups3[3] = {0, 1, 0};
    double cores3[2] = {1, 1}, ones[3] = {1, 1, 1};
    struct balance_sharing turns3 = {3, 2, groups3, cores3, 1};
    CHECK(balance_predict_shared(ones, ones, NULL, 3, 2, DM_SCHEDULE_1F1B, &turns3, &pr,
                                 err, sizeof err) == BALANCE_OK);
    CHECK_NEAR(pr.step_ms, 9.0, 1e-12);
    CHECK_NEAR(pr.bubble_ratio, 1.0 - 12.0 / 27.0, 1e-12);
    balance_predict_stages(ones, ones, 3, 2, DM_SCHEDULE_1F1B, &pr, NULL, 0);
    CHECK_NEAR(pr.step_ms, 8.0, 1e-12);
    /* The same with an update of 0.5 on stage 2: F0 on 0 asks first (stage
     * order) [0,1]; the update then runs [1,1.5] while F1 on 0 waits behind
     * it, and every later instruction runs 0.5 later: 9.5. */
    double update3[3] = {0, 0, 0.5};
    CHECK(balance_predict_shared(ones, ones, update3, 3, 2, DM_SCHEDULE_1F1B, &turns3, &pr,
                                 NULL, 0) == BALANCE_OK);
    CHECK_NEAR(pr.step_ms, 9.5, 1e-12);
    /* A backward of no work (a frozen stage) needs no core and finishes as
     * its input arrives: with b0 = 0, as above up to 5, when B0 on 0 finishes
     * at once and B1 on 2 takes the core [5,6]; B1 on 1 [6,7]; B1 on 0 at 7. */
    double b_frozen[3] = {0, 1, 1};
    CHECK(balance_predict_shared(ones, b_frozen, NULL, 3, 2, DM_SCHEDULE_1F1B, &turns3, &pr,
                                 NULL, 0) == BALANCE_OK);
    CHECK_NEAR(pr.step_ms, 7.0, 1e-12);
    /* Cores must be whole: 1.5 is refused, naming the group. */
    double half[2] = {1, 1.5};
    struct balance_sharing fractional = {3, 2, groups3, half, 1};
    CHECK(balance_predict_shared(ones, ones, NULL, 3, 2, DM_SCHEDULE_1F1B, &fractional, &pr,
                                 err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "group 1") && strstr(err, "whole"), "message: %s", err);

    /* Random pipelines, as for even sharing: one core for all gives all the
     * work, 2 cores for 4 stages lie between the dedicated step (and half
     * the work) and all the work, a core per stage is the dedicated
     * predictor bit for bit. */
    double worst = check_shared_bounds(1);
    printf("turns: worked cases (9, 9.5, 7 ms); one core: 1000 pipelines, step = total "
           "work to %.3g relative; 2 cores within bounds; a core each = dedicated\n", worst);
}

/* The fluid simulation against the ticked reference on random groups. */
static void test_sharing_reference(void)
{
    double f[8], b[8], worst = 0;
    const double dt = 1.0 / 1024;
    for (int trial = 0; trial < 300; trial++) {
        int S = rng_int(2, 4), m = rng_int(1, 4), gpipe = rng_int(0, 1);
        random_stage_times(f, b, S);
        int groups = rng_int(1, S), group[8];
        double cores[8];
        for (int s = 0; s < S; s++) group[s] = s < groups ? s : rng_int(0, groups - 1);
        for (int g = 0; g < groups; g++)
            cores[g] = (double[]){0.5, 1, 1.5, 2, 0.25 + 2 * rng_unit()}[rng_int(0, 4)];
        struct balance_sharing sh = {S, groups, group, cores, 0};
        struct balance_prediction pr;
        CHECK(balance_predict_shared(f, b, NULL, S, m, gpipe ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B,
                                     &sh, &pr, NULL, 0) == BALANCE_OK);
        double want = ticked_step(f, b, NULL, S, m, gpipe, group, cores, dt);
        double tolerance = 2 * (2 * S * m) * dt * 4;  /* a tick per completion, at rate >= 1/4 */
        CHECK_MSG(fabs(pr.step_ms - want) <= tolerance, "trial %d: %.9g vs ticked %.9g",
                  trial, pr.step_ms, want);
        worst = fmax(worst, fabs(pr.step_ms - want));
    }
    printf("shared predictor vs ticked reference (dt %.3g ms): 300 pipelines, largest "
           "difference %.3g ms\n", dt, worst);
}

/* (e) bad sharing: BALANCE_BAD_INPUT naming the entry, from the predictor
 * and from every balancer through the profile. */
static void test_sharing_bad_input(void)
{
    double f[3] = {1, 1, 1}, b[3] = {2, 2, 2};
    int good[3] = {0, 0, 1}, low[3] = {0, -1, 1}, high[3] = {0, 2, 1};
    double cores[2] = {1, 1}, zero[2] = {1, 0}, nan_cores[2] = {NAN, 1};
    double inf_cores[2] = {1, INFINITY}, negative[2] = {-1, 1};
    struct { struct balance_sharing sharing; const char *needle; } cases[] = {
        {{3, 0, good, cores, 0}, "0 groups"},
        {{0, 2, good, cores, 0}, "0 stages"},
        {{3, 2, low, cores, 0}, "stage 1 is in group -1"},
        {{3, 2, high, cores, 0}, "stage 1 is in group 2, outside 0..1"},
        {{3, 2, good, zero, 0}, "group 1 has 0 cores"},
        {{3, 2, good, nan_cores, 0}, "group 0 has nan cores"},
        {{3, 2, good, inf_cores, 0}, "group 1 has inf cores"},
        {{3, 2, good, negative, 0}, "group 0 has -1 cores"},
        {{3, 2, NULL, cores, 0}, "group array is missing"},
        {{3, 2, good, NULL, 0}, "cores array is missing"},
        {{4, 2, high, cores, 0}, "stage 1 is in group 2"},  /* checked on any stage count */
    };
    struct profile_instance pi;
    random_profile(&pi, 6);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        struct balance_prediction pr;
        int rc = balance_predict_shared(f, b, NULL, 3, 4, DM_SCHEDULE_1F1B, &cases[i].sharing,
                                        &pr, err, sizeof err);
        CHECK_MSG(rc == BALANCE_BAD_INPUT && strstr(err, cases[i].needle),
                  "case %zu: rc %d, '%s'", i, rc, err);
        pi.profile.sharing = &cases[i].sharing;
        int counts[3] = {2, 2, 2};
        rc = balance_predict(&pi.profile, 3, counts, 4, DM_SCHEDULE_1F1B, &pr, err, sizeof err);
        CHECK_MSG(rc == BALANCE_BAD_INPUT && strstr(err, cases[i].needle),
                  "case %zu: balance_predict rc %d, '%s'", i, rc, err);
        for (int method = 0; method < BALANCE_METHOD_COUNT; method++) {
            rc = balance_propose(method, &pi.profile, 3, NULL, NULL, counts, NULL, err,
                                 sizeof err);
            CHECK_MSG(rc == BALANCE_BAD_INPUT && strstr(err, cases[i].needle),
                      "case %zu %s: rc %d, '%s'", i, balance_method_name(method), rc, err);
        }
    }
}

static double shared_ms(const struct balance_profile *profile, int S, const int *counts,
                        int m, enum dm_schedule schedule)
{
    struct balance_prediction pr;
    int rc = balance_predict(profile, S, counts, m, schedule, &pr, NULL, 0);
    CHECK(rc == BALANCE_OK);
    return pr.step_ms;
}

/* The fastest layout under the profile's sharing, by brute force. */
struct shared_brute {
    const struct balance_profile *profile;
    const struct balance_costs *costs;
    int stages, micro_batches;
    enum dm_schedule schedule;
    int64_t cap;
    double best;
};

static void shared_brute_visit(const int *counts, void *ctx)
{
    struct shared_brute *sb = ctx;
    double ignored;
    if (!layout_max(sb->costs, sb->stages, counts, sb->cap, &ignored)) return;
    double t = shared_ms(sb->profile, sb->stages, counts, sb->micro_batches, sb->schedule);
    if (t < sb->best) sb->best = t;
}

static double shared_optimum(const struct balance_profile *profile,
                             const struct balance_costs *costs, int S, int m,
                             enum dm_schedule schedule, int64_t cap)
{
    struct shared_brute sb = {profile, costs, S, m, schedule, cap, INFINITY};
    int counts[MAX_BLOCKS];
    each_layout(costs->blocks, S, counts, 0, costs->blocks, shared_brute_visit, &sb);
    return sb.best;
}

/* res describes counts against current. */
static void check_result(const struct balance_costs *costs, int S, const int *counts,
                         const int *current, const struct balance_result *res)
{
    int mine[MAX_BLOCKS], theirs[MAX_BLOCKS], blocks = 0;
    int64_t bytes = 0;
    owners(counts, S, mine);
    owners(current, S, theirs);
    for (int i = 0; i < costs->blocks; i++)
        if (mine[i] != theirs[i]) blocks++, bytes += costs->mem_bytes[i];
    double max_cost;
    int64_t max_mem;
    balance_layout_max(costs, S, counts, &max_cost, &max_mem);
    CHECK_MSG(res->blocks_moved == blocks && res->bytes_moved == bytes &&
              res->max_stage_cost == max_cost && res->max_stage_mem_bytes == max_mem &&
              res->stages == S,
              "res: %d blocks %lld bytes max %g, want %d %lld %g", res->blocks_moved,
              (long long)res->bytes_moved, res->max_stage_cost, blocks, (long long)bytes,
              max_cost);
}

/* (f) partition-time under sharing: never slower than the min-max layout
 * under the shared prediction, res describes the returned layout, and how
 * far it lands from the brute-force optimum. Without oversubscription it is
 * the min-max partition. */
static void test_propose_shared(void)
{
    int runs = 0, dedicated = 0, faster = 0, optimal = 0, within = 0;
    double worst = 1.0, worst_min_max = 1.0;
    for (int trial = 0; trial < 800; trial++) {
        struct profile_instance pi;
        int n = rng_int(2, 10);
        random_profile(&pi, n);
        int S = rng_int(2, n < 4 ? n : 4), m = rng_int(1, 6);
        enum dm_schedule schedule = rng_int(0, 1) ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        int groups = rng_int(1, S - 1), group[MAX_STAGES];
        double cores[MAX_STAGES];
        for (int s = 0; s < S; s++) group[s] = s < groups ? s : rng_int(0, groups - 1);
        for (int g = 0; g < groups; g++)
            cores[g] = (double[]){0.5, 1, 1.5, 2, 4}[rng_int(0, 4)];
        struct balance_sharing sh = {S, groups, group, cores, 0};
        pi.profile.sharing = &sh;
        double cost[MAX_BLOCKS];
        struct balance_costs costs;
        balance_costs_from_profile(&costs, &pi.profile, BALANCE_COST_TIME, cost);
        int current[MAX_STAGES], counts[MAX_STAGES], min_max[MAX_STAGES];
        random_layout(n, S, current);
        int64_t cap = 0;
        if (rng_int(0, 2) == 0) balance_layout_max(&costs, S, current, NULL, &cap);
        struct balance_options options = {.mem_cap = cap, .micro_batches = m,
                                          .schedule = schedule};
        struct balance_result res;
        char err[256];
        int rc = balance_propose(BALANCE_PARTITION_TIME, &pi.profile, S, current,
                                 &options, counts, &res, err, sizeof err);
        CHECK_MSG(rc == BALANCE_OK, "trial %d: %s", trial, err);
        if (rc) continue;
        balance_partition(&costs, S, cap, current, S, min_max, NULL, NULL, 0);
        CHECK(balance_check_layout(counts, S, n, NULL, 0) == BALANCE_OK);
        check_result(&costs, S, counts, current, &res);
        CHECK(cap == 0 || res.max_stage_mem_bytes <= cap);
        double t = shared_ms(&pi.profile, S, counts, m, schedule);
        double t_min_max = shared_ms(&pi.profile, S, min_max, m, schedule);
        CHECK_MSG(t <= t_min_max, "trial %d: %.17g > min-max %.17g", trial, t, t_min_max);
        if (!balance_sharing_oversubscribed(&sh, S)) {
            CHECK(memcmp(counts, min_max, (size_t)S * sizeof(int)) == 0);
            dedicated++;
            continue;
        }
        runs++;
        faster += t < t_min_max;
        double best = shared_optimum(&pi.profile, &costs, S, m, schedule, cap);
        CHECK(t >= best);
        optimal += t <= best;
        within += t <= best * 1.02;
        worst = fmax(worst, t / best);
        worst_min_max = fmax(worst_min_max, t_min_max / best);
    }
    printf("partition-time under sharing: %d oversubscribed runs (and %d not, kept "
           "min-max): %d faster than min-max, %d at the brute-force optimum, %d within "
           "2%%, worst %.4fx the optimum (min-max alone: worst %.4fx)\n", runs, dedicated,
           faster, optimal, within, worst, worst_min_max);
    /* A regression guard on the measured quality (the generator is
     * deterministic): one-block moves can stall on a plateau, but rarely. */
    CHECK_MSG(10 * within >= 9 * runs, "only %d of %d within 2%% of the optimum", within,
              runs);
}

/* The constructed case: 4 stages in two pairs of one core each, 32 blocks,
 * the last 8 ten times as expensive. Min-max balances stages; under sharing
 * what counts is balancing the pairs. */
static void test_propose_shared_constructed(void)
{
    struct profile_instance pi;
    for (int i = 0; i < 32; i++) {
        pi.fwd[i] = i < 24 ? 1 : 10;
        pi.bwd[i] = 2 * pi.fwd[i];
        pi.params[i] = 100;
        pi.mem[i] = 1;
    }
    int group[4] = {0, 0, 1, 1};
    double cores[2] = {1, 1};
    struct balance_sharing sh = {4, 2, group, cores, 0};
    pi.profile = (struct balance_profile){
        .blocks = 32, .fwd_ms = pi.fwd, .bwd_ms = pi.bwd, .params = pi.params,
        .mem_bytes = pi.mem, .sharing = &sh};
    double cost[MAX_BLOCKS];
    struct balance_costs costs;
    balance_costs_from_profile(&costs, &pi.profile, BALANCE_COST_TIME, cost);
    for (int gpipe = 0; gpipe <= 1; gpipe++) {
        enum dm_schedule schedule = gpipe ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        int m = 8, counts[4], min_max[4], again[4];
        struct balance_options options = {.micro_batches = m, .schedule = schedule};
        struct balance_result res;
        CHECK(balance_propose(BALANCE_PARTITION_TIME, &pi.profile, 4, NULL, &options,
                              counts, &res, NULL, 0) == BALANCE_OK);
        balance_partition(&costs, 4, 0, NULL, 0, min_max, NULL, NULL, 0);
        double t = shared_ms(&pi.profile, 4, counts, m, schedule);
        double t_min_max = shared_ms(&pi.profile, 4, min_max, m, schedule);
        double best = shared_optimum(&pi.profile, &costs, 4, m, schedule, 0);
        CHECK_MSG(t < t_min_max, "%s: %.17g, min-max %.17g", gpipe ? "gpipe" : "1f1b",
                  t, t_min_max);
        CHECK_MSG(t <= best * 1.02, "%s: %.17g, optimum %.17g", gpipe ? "gpipe" : "1f1b",
                  t, best);
        int uniform[4] = {8, 8, 8, 8};
        check_result(&costs, 4, counts, uniform, &res);
        /* from its own answer it stays put */
        CHECK(balance_propose(BALANCE_PARTITION_TIME, &pi.profile, 4, counts, &options,
                              again, &res, NULL, 0) == BALANCE_OK);
        CHECK(memcmp(again, counts, sizeof counts) == 0 && res.blocks_moved == 0);
        printf("constructed (%s, m = %d): min-max %d,%d,%d,%d predicts %.1f ms shared; "
               "partition-time %d,%d,%d,%d %.1f ms; brute-force optimum %.1f ms\n",
               gpipe ? "gpipe" : "1f1b", m, min_max[0], min_max[1], min_max[2],
               min_max[3], t_min_max, counts[0], counts[1], counts[2], counts[3], t, best);
    }
}

/* ---- the update at a step's end (balance_predict_shared's stage_update_ms) ---- */

/* Worked by hand: 2 stages, m = 1, f = 1, b = 2 (lists F0 B0 on both). */
static void test_update_by_hand(void)
{
    double f[2] = {1, 1}, b[2] = {2, 2};
    struct balance_prediction pr;
    /* Stage 0's update delays everything: F0 3..4, stage 1 4..7, B0 7..9. */
    double first[2] = {3, 0};
    CHECK(balance_predict_shared(f, b, first, 2, 1, DM_SCHEDULE_1F1B, NULL, &pr, NULL, 0) ==
          BALANCE_OK);
    CHECK_NEAR(pr.step_ms, 9.0, 1e-12);
    CHECK_NEAR(pr.bubble_ratio, 1.0 - 9.0 / 18.0, 1e-12);   /* busy 3 + 3 + 3 of 2 x 9 */
    /* Stage 1's update hides behind the fill but for 2 ms: F0 starts at 3
     * instead of 1, so 6 + 2 = 8. */
    double last[2] = {0, 3};
    CHECK(balance_predict_shared(f, b, last, 2, 1, DM_SCHEDULE_1F1B, NULL, &pr, NULL, 0) ==
          BALANCE_OK);
    CHECK_NEAR(pr.step_ms, 8.0, 1e-12);
    /* An update shorter than the fill costs nothing: F0 on stage 1 waits
     * until 1 anyway. */
    double hidden[2] = {0, 0.75};
    CHECK(balance_predict_shared(f, b, hidden, 2, 1, DM_SCHEDULE_1F1B, NULL, &pr, NULL, 0) ==
          BALANCE_OK);
    CHECK_NEAR(pr.step_ms, 6.0, 1e-12);
    /* Both stages on one core: stage 0's F0 and stage 1's update share it
     * at rate 1/2 until F0 ends at 2 (2 of the update left), the update
     * then runs alone until 4; F0 4..5 and B0 5..7 on stage 1, B0 7..9 on
     * stage 0. The core never idles: the sum of the work, 9. */
    int one[2] = {0, 0};
    double core = 1;
    struct balance_sharing shared = {2, 1, one, &core, 0};
    CHECK(balance_predict_shared(f, b, last, 2, 1, DM_SCHEDULE_1F1B, &shared, &pr, NULL, 0) ==
          BALANCE_OK);
    CHECK_NEAR(pr.step_ms, 9.0, 1e-12);
    /* Through a profile: the embedding's update lands on stage 0, the head's
     * on the last, a block's on its stage. 4 blocks of f = 1, b = 2 on 2
     * stages of 2, m = 1: stage times 2 / 4 each; updates 1 (block 0) + 2
     * (embed) on stage 0 delay the whole step by 3. */
    double bf[4] = {1, 1, 1, 1}, bb[4] = {2, 2, 2, 2}, bp[4] = {1, 1, 1, 1};
    double bu[4] = {1, 0, 0, 0.5};
    int64_t bm[4] = {1, 1, 1, 1};
    struct balance_profile profile = {
        .blocks = 4, .fwd_ms = bf, .bwd_ms = bb, .params = bp, .mem_bytes = bm,
        .embed = {.update_ms = 2}, .head = {.update_ms = 0.25}, .update_ms = bu};
    int counts[2] = {2, 2};
    CHECK(balance_predict(&profile, 2, counts, 1, DM_SCHEDULE_1F1B, &pr, NULL, 0) ==
          BALANCE_OK);
    /* stage 1's 0.75 hides behind stage 0's 3 + 2 of forward */
    CHECK_NEAR(pr.step_ms, 3.0 + 2 + 2 + 4 + 4, 1e-12);
}

/* Updates against the ticked reference, shared and dedicated (a group of
 * one core per stage), and zeros or NULL: the same bits as no update. */
static void test_update_reference(void)
{
    double f[8], b[8], u[8], zeros[8] = {0}, worst = 0;
    const double dt = 1.0 / 1024;
    for (int trial = 0; trial < 300; trial++) {
        int S = rng_int(2, 4), m = rng_int(1, 4), gpipe = rng_int(0, 1);
        enum dm_schedule schedule = gpipe ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        random_stage_times(f, b, S);
        for (int s = 0; s < S; s++) u[s] = rng_int(0, 2) ? rng_unit() * 6 : 0.0;
        int groups = rng_int(1, S), group[8], own[8];
        double cores[8], ones[8];
        for (int s = 0; s < S; s++) {
            group[s] = s < groups ? s : rng_int(0, groups - 1);
            own[s] = s;
            ones[s] = 1;
        }
        for (int g = 0; g < groups; g++) cores[g] = (double[]){0.5, 1, 1.5, 2}[rng_int(0, 3)];
        struct balance_sharing sh = {S, groups, group, cores, 0};
        struct balance_prediction pr, dedicated, none, zero;
        CHECK(balance_predict_shared(f, b, u, S, m, schedule, &sh, &pr, NULL, 0) == BALANCE_OK);
        double want = ticked_step(f, b, u, S, m, gpipe, group, cores, dt);
        double tolerance = 2 * (2 * S * m + S) * dt * 4;
        CHECK_MSG(fabs(pr.step_ms - want) <= tolerance, "trial %d: %.9g vs ticked %.9g",
                  trial, pr.step_ms, want);
        worst = fmax(worst, fabs(pr.step_ms - want));
        CHECK(balance_predict_shared(f, b, u, S, m, schedule, NULL, &dedicated, NULL, 0) ==
              BALANCE_OK);
        want = ticked_step(f, b, u, S, m, gpipe, own, ones, dt);
        CHECK_MSG(fabs(dedicated.step_ms - want) <= 2 * (2 * S * m + S) * dt,
                  "trial %d dedicated: %.9g vs ticked %.9g", trial, dedicated.step_ms, want);
        /* an update never makes a step shorter, and costs at most its longest */
        CHECK(balance_predict_shared(f, b, NULL, S, m, schedule, NULL, &none, NULL, 0) ==
              BALANCE_OK);
        double longest = 0;
        for (int s = 0; s < S; s++) longest = fmax(longest, u[s]);
        CHECK_MSG(dedicated.step_ms >= none.step_ms - 1e-9 &&
                  dedicated.step_ms <= none.step_ms + longest + 1e-9,
                  "trial %d: %.17g, without updates %.17g, longest %.17g", trial,
                  dedicated.step_ms, none.step_ms, longest);
        /* zero updates are no updates, bit for bit, shared or not */
        CHECK(balance_predict_shared(f, b, zeros, S, m, schedule, NULL, &zero, NULL, 0) ==
              BALANCE_OK);
        CHECK(same_prediction(&zero, &none));
        CHECK(balance_predict_shared(f, b, zeros, S, m, schedule, &sh, &zero, NULL, 0) ==
              BALANCE_OK);
        CHECK(balance_predict_shared(f, b, NULL, S, m, schedule, &sh, &none, NULL, 0) ==
              BALANCE_OK);
        CHECK(same_prediction(&zero, &none));
    }
    printf("predictor with updates vs ticked reference: 300 pipelines, largest difference "
           "%.3g ms\n", worst);
}

/* Bad update times: BALANCE_BAD_INPUT naming the stage or block. */
static void test_update_bad_input(void)
{
    double f[2] = {1, 1}, b[2] = {2, 2};
    double negative[2] = {0, -1}, nan[2] = {NAN, 0}, inf[2] = {0, INFINITY};
    const double *bad[3] = {negative, nan, inf};
    const char *needle[3] = {"stage 1: update time -1", "stage 0: update time nan",
                             "stage 1: update time inf"};
    for (int i = 0; i < 3; i++) {
        char err[256] = "";
        struct balance_prediction pr;
        int rc = balance_predict_shared(f, b, bad[i], 2, 2, DM_SCHEDULE_1F1B, NULL, &pr, err,
                                        sizeof err);
        CHECK_MSG(rc == BALANCE_BAD_INPUT && strstr(err, needle[i]), "case %d: %d '%s'", i, rc,
                  err);
    }
    struct profile_instance pi;
    random_profile(&pi, 4);
    double u[4] = {0, 1, NAN, 0};
    pi.profile.update_ms = u;
    int counts[2] = {2, 2};
    char err[256] = "";
    struct balance_prediction pr;
    int rc = balance_predict(&pi.profile, 2, counts, 2, DM_SCHEDULE_1F1B, &pr, err, sizeof err);
    CHECK_MSG(rc == BALANCE_BAD_INPUT && strstr(err, "block 2"), "profile: %d '%s'", rc, err);
    rc = balance_propose(BALANCE_PARTITION_TIME, &pi.profile, 2, NULL, NULL, counts, NULL, err,
                         sizeof err);
    CHECK_MSG(rc == BALANCE_BAD_INPUT, "propose: %d '%s'", rc, err);
    u[2] = 0;
    pi.profile.head.update_ms = -2;
    rc = balance_predict(&pi.profile, 2, counts, 2, DM_SCHEDULE_1F1B, &pr, err, sizeof err);
    CHECK_MSG(rc == BALANCE_BAD_INPUT, "head update: %d '%s'", rc, err);
}

/* partition-time with updates (one processor per stage): never slower than
 * the min-max layout, against the brute-force optimum of the prediction. */
static void test_update_propose(void)
{
    int runs = 0, faster = 0, optimal = 0, within = 0;
    double worst = 1.0;
    for (int trial = 0; trial < 600; trial++) {
        struct profile_instance pi;
        int n = rng_int(2, 10);
        random_profile(&pi, n);
        double u[MAX_BLOCKS];
        for (int i = 0; i < n; i++) u[i] = rng_int(0, 1) ? rng_unit() * 8 : 0.0;
        pi.profile.update_ms = u;
        pi.profile.embed.update_ms = rng_unit();
        pi.profile.head.update_ms = rng_unit() * 3;
        int S = rng_int(2, n < 4 ? n : 4), m = rng_int(1, 6);
        enum dm_schedule schedule = rng_int(0, 1) ? DM_SCHEDULE_GPIPE : DM_SCHEDULE_1F1B;
        double cost[MAX_BLOCKS];
        struct balance_costs costs;
        balance_costs_from_profile(&costs, &pi.profile, BALANCE_COST_TIME, cost);
        int current[MAX_STAGES], counts[MAX_STAGES], min_max[MAX_STAGES];
        random_layout(n, S, current);
        struct balance_options options = {.micro_batches = m, .schedule = schedule};
        struct balance_result res;
        char err[256];
        int rc = balance_propose(BALANCE_PARTITION_TIME, &pi.profile, S, current, &options,
                                 counts, &res, err, sizeof err);
        CHECK_MSG(rc == BALANCE_OK, "trial %d: %s", trial, err);
        if (rc) continue;
        balance_partition(&costs, S, 0, current, S, min_max, NULL, NULL, 0);
        check_result(&costs, S, counts, current, &res);
        double t = shared_ms(&pi.profile, S, counts, m, schedule);
        double t_min_max = shared_ms(&pi.profile, S, min_max, m, schedule);
        CHECK_MSG(t <= t_min_max, "trial %d: %.17g > min-max %.17g", trial, t, t_min_max);
        double best = shared_optimum(&pi.profile, &costs, S, m, schedule, 0);
        CHECK(t >= best);
        runs++;
        faster += t < t_min_max;
        optimal += t <= best;
        within += t <= best * 1.02;
        worst = fmax(worst, t / best);
    }
    printf("partition-time with updates: %d runs, %d faster than min-max, %d at the "
           "brute-force optimum, %d within 2%%, worst %.4fx\n", runs, faster, optimal, within,
           worst);
    CHECK_MSG(10 * within >= 9 * runs, "only %d of %d within 2%% of the optimum", within, runs);
    CHECK_MSG(faster > 0, "updates never changed the layout in %d runs", runs);
}

/* The end stages' extras from a measured step, by hand: 4 blocks of fwd 1,
 * bwd 2, update 0.5 on 2 stages of 2, m = 4. */
static void test_end_stage_extras(void)
{
    double f[4] = {1, 1, 1, 1}, b[4] = {2, 2, 2, 2}, u[4] = {0.5, 0.5, 0.5, 0.5};
    int counts[2] = {2, 2};
    /* first: (40 - 4) / 4 - 6 = 3 per micro-batch, 4 - 1 = 3 once; last:
     * (24.5 - 0.5) / 4 - 6 = 0, and 0.5 - 1 < 0 clamps to 0 */
    double busy[2] = {40, 24.5}, update[2] = {4, 0.5};
    struct balance_extra embed = {.params = 7}, head;
    balance_end_stage_extras(f, b, u, counts, 2, 4, busy, update, &embed, &head);
    CHECK_NEAR(embed.fwd_ms, 1.0, 1e-12);
    CHECK_NEAR(embed.bwd_ms, 2.0, 1e-12);
    CHECK_NEAR(embed.update_ms, 3.0, 1e-12);
    CHECK(embed.params == 7);                       /* left alone */
    CHECK(head.fwd_ms == 0 && head.bwd_ms == 0 && head.update_ms == 0);
    /* one stage: both ends share (60 - 4) / 4 - 12 = 2 and 4 - 2 = 2 */
    int one[1] = {4};
    double busy1[2] = {60, 60}, update1[2] = {4, 4};
    balance_end_stage_extras(f, b, u, one, 1, 4, busy1, update1, &embed, &head);
    CHECK_NEAR(embed.fwd_ms + embed.bwd_ms, 0.5 * ((60 - 4) / 4.0 - 12), 1e-12);
    CHECK_NEAR(head.update_ms, 1.0, 1e-12);
    balance_end_stage_extras(f, b, NULL, counts, 2, 4, busy, update, &embed, &head);
    CHECK_NEAR(embed.update_ms, 4.0, 1e-12);        /* no block updates */
}

/* The migration cost line, by hand. */
static void test_migration_cost(void)
{
    double b[4] = {1, 3, 2, 2}, ms[4] = {10, 14, 30, 10};
    CHECK(balance_migration_cost_ms(b, ms, 0, 5) == 0.0);
    CHECK_NEAR(balance_migration_cost_ms(b, ms, 1, 7), 10.0, 1e-12);    /* one: its time */
    CHECK_NEAR(balance_migration_cost_ms(b, ms, 2, 5), 18.0, 1e-12);    /* 8 + 2 x 5 */
    CHECK_NEAR(balance_migration_cost_ms(b + 2, ms + 2, 2, 9), 20.0, 1e-12);  /* one size */
    double falling[2] = {20, 10};                                        /* slope < 0 */
    CHECK_NEAR(balance_migration_cost_ms(b, falling, 2, 100), 15.0, 1e-12);
    double steep[2] = {1, 5};            /* line 1 -> 1, 3 -> 5: 2 x - 1, intercept < 0 */
    CHECK_NEAR(balance_migration_cost_ms(b, steep, 2, 10), (1 + 15) / 10.0 * 10, 1e-12);
}

int main(void)
{
    test_static_and_plan();
    test_bad_input();
    test_partition_brute_force();
    test_partition_windows();
    test_partition_large();
    test_diffusion();
    test_predictor();
    test_repack();
    test_first_fit_over_cap();
    test_propose();
    test_sharing_dedicated();
    test_sharing_bounds();
    test_sharing_by_hand();
    test_sharing_reference();
    test_turns();
    test_sharing_bad_input();
    test_propose_shared();
    test_propose_shared_constructed();
    test_update_by_hand();
    test_update_reference();
    test_update_bad_input();
    test_update_propose();
    test_migration_cost();
    test_end_stage_extras();
    return testing_report("test_balance");
}
