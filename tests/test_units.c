/* Units of placement in the balance module (balance.units, dynmo/balance.h):
 * the names, the conversion of layouts between block and sublayer units
 * against a brute force over every layout, balance.initial counting units,
 * the balancers on per-unit costs against the exhaustive optimum, and the
 * controller's per-unit matrix weights. With units = block every answer
 * must be the one the block code gave before (the conversion is the
 * identity, the messages are the blocks' own). */
#include <stdio.h>
#include <string.h>
#include "dynmo/balance.h"
#include "testing.h"

#define MAX_UNITS 16
#define MAX_STAGES 5

static uint64_t rng_state = 0x5eed5eed12345ull;

static int rng_int(int lo, int hi)   /* inclusive */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int)((rng_state >> 33) % (uint64_t)(hi - lo + 1));
}

/* Calls visit(counts, ctx) for every layout of n units on S stages. */
__attribute__((noinline))
static void each_layout(int S, int *counts, int stage, int left,
                        void (*visit)(const int *counts, int S, void *ctx), void *ctx)
{
    if (stage == S - 1) {
        counts[stage] = left;
        visit(counts, S, ctx);
        return;
    }
    for (int c = 1; c <= left - (S - 1 - stage); c++) {
        counts[stage] = c;
        each_layout(S, counts, stage + 1, left - c, visit, ctx);
    }
}

static void test_names(void)
{
    CHECK(balance_units_parse("block") == BALANCE_UNITS_BLOCK);
    CHECK(balance_units_parse("sublayer") == BALANCE_UNITS_SUBLAYER);
    CHECK(balance_units_parse("layer") == -1);
    CHECK(!strcmp(balance_units_name(BALANCE_UNITS_SUBLAYER), "sublayer"));
    CHECK(balance_units_name((enum balance_units)7) == NULL);
    CHECK(balance_units_per_block(BALANCE_UNITS_BLOCK) == 1);
    CHECK(balance_units_per_block(BALANCE_UNITS_SUBLAYER) == 2);
}

/* ---- conversion -------------------------------------------------------------- */

struct convert_case {
    int blocks;
    int checked, mapped, refused;
};

/* The brute force: the block layouts whose every boundary is the unit
 * boundary halved, rounded down or up; the first in the order of
 * boundaries compared from the first (the one the contract names: each
 * boundary as early as it may be). */
struct block_search {
    const int *unit_boundary;   /* (S - 1) */
    int found;
    int best[MAX_STAGES];
};

static void block_visit(const int *counts, int S, void *ctx)
{
    struct block_search *bs = ctx;
    int at = 0;
    for (int s = 0; s + 1 < S; s++) {
        at += counts[s];
        int p = bs->unit_boundary[s];
        if (at != p / 2 && at != (p + 1) / 2) return;
    }
    if (bs->found) {
        int a = 0, b = 0;
        for (int s = 0; s + 1 < S; s++) {
            a += counts[s];
            b += bs->best[s];
            if (a != b) {
                if (a > b) return;
                break;
            }
        }
    }
    bs->found = 1;
    memcpy(bs->best, counts, (size_t)S * sizeof(int));
}

static void convert_visit(const int *units, int S, void *ctx)
{
    struct convert_case *c = ctx;
    int boundary[MAX_STAGES], at = 0, blocks_layout[MAX_STAGES], scratch[MAX_STAGES];
    for (int s = 0; s + 1 < S; s++) boundary[s] = at += units[s];
    struct block_search bs = {.unit_boundary = boundary};
    if (c->blocks >= S) each_layout(S, scratch, 0, c->blocks, block_visit, &bs);
    char err[256] = "";
    int rc = balance_layout_convert(units, BALANCE_UNITS_SUBLAYER, S, c->blocks,
                                    BALANCE_UNITS_BLOCK, blocks_layout, err, sizeof err);
    c->checked++;
    /* the nearest whole blocks: the conversion where it maps, else a
     * layout of the blocks all the same (none for more stages than blocks) */
    int nearest[MAX_STAGES];
    int near_rc = balance_layout_nearest_blocks(units, S, c->blocks, nearest, NULL, 0);
    CHECK(near_rc == (S <= c->blocks ? BALANCE_OK : BALANCE_BAD_INPUT));
    if (near_rc == BALANCE_OK) {
        CHECK(balance_check_layout(nearest, S, c->blocks, NULL, 0) == BALANCE_OK);
        if (rc == BALANCE_OK) CHECK(memcmp(nearest, blocks_layout, (size_t)S * sizeof(int)) == 0);
    }
    if (!bs.found) {
        CHECK_MSG(rc == BALANCE_BAD_INPUT && strstr(err, "cannot map"),
                  "%d blocks, %d stages: mapped a layout no block layout matches", c->blocks, S);
        c->refused++;
        return;
    }
    c->mapped++;
    CHECK_MSG(rc == BALANCE_OK, "%d blocks on %d stages: refused: %s", c->blocks, S, err);
    if (rc != BALANCE_OK) return;
    CHECK(memcmp(blocks_layout, bs.best, (size_t)S * sizeof(int)) == 0);
    /* back to units: an even boundary is where it was */
    int again[MAX_STAGES];
    CHECK(balance_layout_convert(blocks_layout, BALANCE_UNITS_BLOCK, S, c->blocks,
                                 BALANCE_UNITS_SUBLAYER, again, NULL, 0) == BALANCE_OK);
    int a = 0, b = 0;
    for (int s = 0; s + 1 < S; s++) {
        a += units[s];
        b += again[s];
        if (a % 2 == 0) CHECK(a == b);
        else CHECK(b == a - 1 || b == a + 1);
    }
}

/* Block layouts to units and back are the identity; units = block is a copy. */
static void round_trip_visit(const int *blocks, int S, void *ctx)
{
    int n = *(const int *)ctx, units[MAX_STAGES], back[MAX_STAGES], same[MAX_STAGES];
    CHECK(balance_layout_convert(blocks, BALANCE_UNITS_BLOCK, S, n, BALANCE_UNITS_SUBLAYER,
                                 units, NULL, 0) == BALANCE_OK);
    for (int s = 0; s < S; s++) CHECK(units[s] == 2 * blocks[s]);
    CHECK(balance_layout_convert(units, BALANCE_UNITS_SUBLAYER, S, n, BALANCE_UNITS_BLOCK, back,
                                 NULL, 0) == BALANCE_OK);
    CHECK(memcmp(back, blocks, (size_t)S * sizeof(int)) == 0);
    CHECK(balance_layout_convert(blocks, BALANCE_UNITS_BLOCK, S, n, BALANCE_UNITS_BLOCK, same,
                                 NULL, 0) == BALANCE_OK);
    CHECK(memcmp(same, blocks, (size_t)S * sizeof(int)) == 0);
}

static void test_convert(void)
{
    int counts[MAX_STAGES], total_mapped = 0, total_refused = 0;
    for (int n = 1; n <= 6; n++)
        for (int S = 1; S <= MAX_STAGES && S <= 2 * n; S++) {
            struct convert_case c = {.blocks = n};
            each_layout(S, counts, 0, 2 * n, convert_visit, &c);
            total_mapped += c.mapped;
            total_refused += c.refused;
            if (S <= n) each_layout(S, counts, 0, n, round_trip_visit, &n);
        }
    printf("conversion: %d sublayer layouts mapped to blocks, %d refused (brute force "
           "agrees)\n", total_mapped, total_refused);
    CHECK(total_mapped > 100 && total_refused > 10);

    /* the example, and a message that names the layout */
    int units[3] = {3, 4, 3}, blocks[3];
    char err[256];
    CHECK(balance_layout_convert(units, BALANCE_UNITS_SUBLAYER, 3, 5, BALANCE_UNITS_BLOCK,
                                 blocks, err, sizeof err) == BALANCE_OK);
    CHECK(blocks[0] == 1 && blocks[1] == 2 && blocks[2] == 2);
    int tight[3] = {1, 2, 1};
    CHECK(balance_layout_convert(tight, BALANCE_UNITS_SUBLAYER, 3, 2, BALANCE_UNITS_BLOCK,
                                 blocks, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "1,2,1") && strstr(err, "cannot map"), "%s", err);
    int bad[2] = {3, 4};
    CHECK(balance_layout_convert(bad, BALANCE_UNITS_SUBLAYER, 2, 4, BALANCE_UNITS_BLOCK,
                                 blocks, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "8 sublayer units"), "%s", err);
    /* a stage of one half: the nearest whole blocks move the boundary on */
    int halves[3] = {1, 1, 8};
    CHECK(balance_layout_nearest_blocks(halves, 3, 5, blocks, err, sizeof err) == BALANCE_OK);
    CHECK(blocks[0] == 1 && blocks[1] == 1 && blocks[2] == 3);
    CHECK(balance_layout_nearest_blocks(tight, 3, 2, blocks, err, sizeof err) ==
          BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "3 stages cannot each hold one of 2 whole blocks"), "%s", err);
}

/* ---- balance.initial --------------------------------------------------------- */

static void test_initial(void)
{
    int counts[4];
    char err[512];
    CHECK(balance_layout_from_spec("explicit:3,4,3", 3, 5, BALANCE_UNITS_SUBLAYER, NULL,
                                   counts, err, sizeof err) == BALANCE_OK);
    CHECK(counts[0] == 3 && counts[1] == 4 && counts[2] == 3);
    CHECK(balance_layout_from_spec("explicit:3,4,4", 3, 5, BALANCE_UNITS_SUBLAYER, NULL,
                                   counts, err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "covers 11 units") && strstr(err, "the 10 units of model.layers = 5"),
              "%s", err);
    CHECK(balance_layout_from_spec("explicit:3,2", 2, 5, BALANCE_UNITS_BLOCK, NULL, counts, err,
                                   sizeof err) == BALANCE_OK);
    CHECK(balance_layout_from_spec("explicit:3,4,3", 3, 5, BALANCE_UNITS_BLOCK, NULL, counts,
                                   err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "covers 10 blocks but model.layers = 5"), "%s", err);
    CHECK(balance_layout_from_spec("explicit:11,1", 2, 5, BALANCE_UNITS_SUBLAYER, NULL, counts,
                                   err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "stage 0 has 11 units"), "%s", err);
    CHECK(balance_layout_from_spec("uniform", 3, 5, BALANCE_UNITS_SUBLAYER, NULL, counts, err,
                                   sizeof err) == BALANCE_OK);
    CHECK(counts[0] == 4 && counts[1] == 3 && counts[2] == 3);
    CHECK(balance_layout_from_spec("uniform", 4, 3, BALANCE_UNITS_SUBLAYER, NULL, counts, err,
                                   sizeof err) == BALANCE_OK);
    CHECK(balance_layout_from_spec("uniform", 7, 3, BALANCE_UNITS_SUBLAYER, NULL, counts, err,
                                   sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "parallel.pp = 7 exceeds the 6 units"), "%s", err);
    CHECK(balance_layout_from_spec("uniform", 4, 3, BALANCE_UNITS_BLOCK, NULL, counts, err,
                                   sizeof err) == BALANCE_BAD_INPUT);
    CHECK_MSG(strstr(err, "parallel.pp = 4 exceeds model.layers = 3"), "%s", err);
}

/* ---- the balancers on units ------------------------------------------------------ */

struct optimum {
    const struct balance_costs *costs;
    int64_t cap;
    int found;
    double best;
};

static void optimum_visit(const int *counts, int S, void *ctx)
{
    struct optimum *o = ctx;
    int begin = 0;
    double worst = 0;
    for (int s = 0; s < S; s++) {
        double c = balance_stage_cost(o->costs, S, s, begin, begin + counts[s]);
        if (o->cap > 0 && balance_stage_mem(o->costs, S, s, begin, begin + counts[s]) > o->cap)
            return;
        if (c > worst) worst = c;
        begin += counts[s];
    }
    if (!o->found || worst < o->best) o->best = worst;
    o->found = 1;
}

/* Random blocks split into an attention and an MLP unit, integer costs
 * (exact sums): the partition over units is the exhaustive optimum over
 * unit layouts (under a memory cap too) and never worse than the
 * exhaustive optimum over whole blocks (often better: the point of the
 * units). Diffusion from the uniform layout lands on a valid layout no
 * worse than its start. */
static void test_balancers(void)
{
    int better = 0, instances = 0;
    for (int trial = 0; trial < 300; trial++) {
        int blocks = rng_int(1, 6), S = rng_int(1, MAX_STAGES);
        if (S > 2 * blocks) S = 2 * blocks;
        int n = 2 * blocks;
        double unit_cost[MAX_UNITS], block_cost[MAX_UNITS / 2];
        int64_t unit_mem[MAX_UNITS], block_mem[MAX_UNITS / 2];
        for (int b = 0; b < blocks; b++) {
            unit_cost[2 * b] = rng_int(1, 20);
            unit_cost[2 * b + 1] = rng_int(1, 40);
            unit_mem[2 * b] = rng_int(1, 4) * 100;
            unit_mem[2 * b + 1] = rng_int(1, 8) * 100;
            block_cost[b] = unit_cost[2 * b] + unit_cost[2 * b + 1];
            block_mem[b] = unit_mem[2 * b] + unit_mem[2 * b + 1];
        }
        double first = rng_int(0, 10), last = rng_int(0, 10);
        struct balance_costs units = {.blocks = n, .cost = unit_cost, .mem_bytes = unit_mem,
                                      .first_cost = first, .last_cost = last};
        struct balance_costs whole = {.blocks = blocks, .cost = block_cost,
                                      .mem_bytes = block_mem, .first_cost = first,
                                      .last_cost = last};
        int64_t total = 0;
        for (int u = 0; u < n; u++) total += unit_mem[u];
        int64_t cap = trial % 3 == 0 ? total / S + 800 : 0;
        int counts[MAX_STAGES], scratch[MAX_STAGES];
        struct balance_result res;
        char err[256];
        struct optimum o = {.costs = &units, .cap = cap};
        each_layout(S, scratch, 0, n, optimum_visit, &o);
        int rc = balance_partition(&units, S, cap, NULL, 0, counts, &res, err, sizeof err);
        if (!o.found) {
            CHECK(rc == BALANCE_INFEASIBLE);
            continue;
        }
        instances++;
        CHECK_MSG(rc == BALANCE_OK && res.max_stage_cost == o.best,
                  "trial %d: partition %g, optimum %g (%s)", trial, res.max_stage_cost, o.best,
                  err);
        if (S <= blocks) {
            struct optimum ob = {.costs = &whole, .cap = cap};
            each_layout(S, scratch, 0, blocks, optimum_visit, &ob);
            if (ob.found) {
                CHECK(o.best <= ob.best);
                better += o.best < ob.best;
            }
        }
        if (cap == 0) {
            int start[MAX_STAGES];
            balance_static_uniform(n, S, start, NULL, 0);
            double start_max, end_max;
            balance_layout_max(&units, S, start, &start_max, NULL);
            CHECK(balance_diffusion(&units, S, 0, start, 0.0, 0, counts, &res, err,
                                    sizeof err) == BALANCE_OK);
            CHECK(balance_check_layout(counts, S, n, err, sizeof err) == BALANCE_OK);
            balance_layout_max(&units, S, counts, &end_max, NULL);
            CHECK(end_max <= start_max && end_max >= o.best);
        }
    }
    printf("balancers on units: %d instances at the exhaustive optimum; %d of them below the "
           "whole-block optimum\n", instances, better);
    CHECK(better > 0);
}

/* ---- the controller's per-unit matrix weights ---------------------------------------- */

/* partition-params prices a unit by its parameters less its pruned
 * matrix weights: each unit's own (4C^2 attention, 8C^2 MLP here), not
 * the block's. The proposal must be balance_propose's on those params. */
static void test_controller_matrix(void)
{
    enum { N = 6, S = 2 };
    double sizes[N] = {400, 800, 400, 800, 400, 800};
    double matrix[N] = {300, 600, 300, 600, 300, 600};
    double sparsity[N] = {0, 0.9, 0, 0.9, 0, 0};
    double fwd[N] = {1, 1, 1, 1, 1, 1}, bwd[N] = {2, 2, 2, 2, 2, 2}, update[N] = {0};
    double mem[N] = {1, 1, 1, 1, 1, 1}, compute[S] = {36, 36}, stage_update[S] = {0};
    int layout[S] = {3, 3};
    struct balance_controller_config c = {
        .method = "partition", .cost = "params", .stages = S, .blocks = N, .every = 1,
        .micro_batches = 4, .schedule = DM_SCHEDULE_1F1B, .seed = 1, .min_gain = 0,
        .min_improvement = 0, .block_params = 1200, .block_matrix_weights = 900,
        .block_param_counts = sizes, .unit_matrix_weights = matrix,
    };
    char err[256];
    struct balance_controller *ctl = balance_controller_create(&c, err, sizeof err);
    CHECK(ctl != NULL);
    if (!ctl) return;
    struct balance_observation obs = {
        .fwd_ms = fwd, .bwd_ms = bwd, .update_ms = update, .mem_bytes = mem,
        .sparsity = sparsity, .stage_compute_ms = compute, .stage_update_ms = stage_update,
        .layout = layout, .step_ms = 100,
    };
    float row[BALANCE_DECISION_COLUMNS];
    balance_controller_observe(ctl, &obs, row);
    int next[S], want[S];
    struct balance_decision d;
    CHECK(balance_controller_decide(ctl, &obs, 0, next, &d, err, sizeof err) == BALANCE_OK);
    double params[N];
    for (int u = 0; u < N; u++) params[u] = sizes[u] - sparsity[u] * matrix[u];
    int64_t mem_bytes[N] = {1, 1, 1, 1, 1, 1};
    struct balance_profile profile = {.blocks = N, .fwd_ms = fwd, .bwd_ms = bwd,
                                      .params = params, .mem_bytes = mem_bytes};
    struct balance_options options = {.micro_batches = 4, .schedule = DM_SCHEDULE_1F1B};
    struct balance_result res;
    CHECK(balance_propose(BALANCE_PARTITION_PARAMS, &profile, S, layout, &options, want, &res,
                          err, sizeof err) == BALANCE_OK);
    CHECK_MSG(next[0] == want[0] && next[1] == want[1], "controller %d,%d, expected %d,%d",
              next[0], next[1], want[0], want[1]);
    /* params 400,260,400,260,400,800: the optimum 4,2 (1320 vs 1200) */
    CHECK(want[0] == 4 && want[1] == 2);
    balance_controller_destroy(ctl);
}

int main(void)
{
    test_names();
    test_convert();
    test_initial();
    test_balancers();
    test_controller_matrix();
    return testing_report("test_units");
}
