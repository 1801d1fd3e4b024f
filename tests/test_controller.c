/* The balancing controller (src/balance/controller.c) without MPI or a
 * model: measured steps are made up, and what it proposes, predicts,
 * applies or skips, and the decision rows it finishes, are checked against
 * what its contract says. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/balance.h"
#include "testing.h"

#define BLOCKS 8
#define STAGES 2

/* One made-up step: block b costs cost[b] forward and twice that
 * backward per micro-batch; the stages' compute is what the layout gives
 * (m = 4 micro-batches, no extras), so the end-stage extras are zero. */
struct fake_step {
    double fwd[BLOCKS], bwd[BLOCKS], update[BLOCKS], mem[BLOCKS], sparsity[BLOCKS];
    double stage_compute[STAGES], stage_update[STAGES];
    int layout[STAGES];
    struct balance_observation obs;
};

static void fake_step(struct fake_step *f, const double *cost, const int *layout, double step_ms)
{
    memset(f, 0, sizeof *f);
    for (int b = 0, s = 0, left = layout[0]; b < BLOCKS; b++) {
        while (left == 0) left = layout[++s];
        f->fwd[b] = cost[b];
        f->bwd[b] = 2 * cost[b];
        f->mem[b] = 1e6;
        f->stage_compute[s] += 4 * 3 * cost[b];
        left--;
    }
    memcpy(f->layout, layout, sizeof f->layout);
    struct balance_observation obs = {
        .fwd_ms = f->fwd, .bwd_ms = f->bwd, .update_ms = f->update, .mem_bytes = f->mem,
        .sparsity = f->sparsity, .stage_compute_ms = f->stage_compute,
        .stage_update_ms = f->stage_update, .layout = f->layout, .step_ms = step_ms,
    };
    f->obs = obs;
}

static struct balance_controller_config config(const char *method, int every)
{
    struct balance_controller_config c = {
        .method = method, .cost = "time", .stages = STAGES, .blocks = BLOCKS, .every = every,
        .micro_batches = 4, .schedule = DM_SCHEDULE_1F1B, .seed = 7, .min_gain = 1.0,
        .min_improvement = 0.02, .block_params = 1000, .block_matrix_weights = 800,
    };
    return c;
}

static void test_bad_method(void)
{
    char err[512] = "";
    struct balance_controller_config c = config("fastest", 1);
    CHECK(balance_controller_create(&c, err, sizeof err) == NULL);
    CHECK_MSG(strstr(err, "balance.method = 'fastest'") && strstr(err, "partition-time"),
              "%s", err);
    CHECK(balance_controller_valid_method("partition", "time", err, sizeof err) == BALANCE_OK);
    CHECK(balance_controller_valid_method("diffusion-params", "time", err, sizeof err) ==
          BALANCE_OK);
    CHECK(balance_controller_valid_method("partition", "bytes", err, sizeof err) != BALANCE_OK);
}

/* balance.method = none never decides; random draws valid layouts from
 * (seed, step) only, on every `every`-th step. */
static void test_none_and_random(void)
{
    char err[256];
    double cost[BLOCKS] = {1, 1, 1, 1, 1, 1, 1, 1};
    int even[STAGES] = {4, 4};
    struct fake_step f;
    fake_step(&f, cost, even, 50);
    struct balance_controller_config c = config("none", 1);
    struct balance_controller *none = balance_controller_create(&c, err, sizeof err);
    CHECK(none && !balance_controller_active(none));
    CHECK(!balance_controller_is_decision_step(none, 0));
    balance_controller_destroy(none);

    c = config("random", 3);
    struct balance_controller *a = balance_controller_create(&c, err, sizeof err);
    struct balance_controller *b = balance_controller_create(&c, err, sizeof err);
    int changed = 0;
    for (int step = 0; step < 12; step++) {
        float row[BALANCE_DECISION_COLUMNS];
        CHECK(balance_controller_observe(a, &f.obs, row) == 0);   /* random logs no rows */
        balance_controller_observe(b, &f.obs, row);
        int pa[STAGES], pb[STAGES];
        struct balance_decision da, db;
        CHECK(balance_controller_decide(a, &f.obs, step, pa, &da, err, sizeof err) == BALANCE_OK);
        balance_controller_decide(b, &f.obs, step, pb, &db, err, sizeof err);
        CHECK(!memcmp(pa, pb, sizeof pa));
        CHECK(pa[0] >= 1 && pa[1] >= 1 && pa[0] + pa[1] == BLOCKS);
        CHECK(balance_controller_is_decision_step(a, step) == ((step + 1) % 3 == 0));
        if (!balance_controller_is_decision_step(a, step)) {
            CHECK(!memcmp(pa, even, sizeof pa) && !da.apply && da.method == NULL);
        } else {
            CHECK(da.apply == (memcmp(pa, even, sizeof pa) != 0));
            changed += da.apply;
        }
    }
    CHECK_MSG(changed > 0, "random never moved a block in 4 decisions");
    balance_controller_destroy(a);
    balance_controller_destroy(b);
}

/* partition-time on a skewed profile: the expensive blocks sit on stage
 * 0, so the proposal moves blocks to stage 1, is predicted faster, and is
 * applied; its row is finished by the next observation with the measured
 * step time. */
static void test_partition_applies(void)
{
    char err[256];
    double cost[BLOCKS] = {4, 4, 4, 4, 1, 1, 1, 1};
    int even[STAGES] = {4, 4};
    struct fake_step f;
    fake_step(&f, cost, even, 70);
    struct balance_controller_config c = config("partition", 2);
    struct balance_controller *ctl = balance_controller_create(&c, err, sizeof err);
    float row[BALANCE_DECISION_COLUMNS];
    int proposal[STAGES];
    struct balance_decision d;
    CHECK(balance_controller_observe(ctl, &f.obs, row) == 0);
    CHECK(balance_controller_decide(ctl, &f.obs, 0, proposal, &d, err, sizeof err) == BALANCE_OK);
    CHECK(d.method == NULL && !d.apply);
    CHECK(balance_controller_observe(ctl, &f.obs, row) == 0);
    CHECK(balance_controller_decide(ctl, &f.obs, 1, proposal, &d, err, sizeof err) == BALANCE_OK);
    CHECK_MSG(d.method && !strcmp(d.method, "partition-time"), "%s", d.method ? d.method : "-");
    CHECK(d.changed && d.enough && d.apply);
    CHECK_MSG(proposal[0] < 4 && proposal[0] + proposal[1] == BLOCKS, "%d,%d", proposal[0],
              proposal[1]);
    CHECK(d.next_ms < d.now_ms);
    CHECK_NEAR(d.saving_ms, (d.now_ms - d.next_ms) * 2, 1e-9);
    CHECK(d.every == 2);
    CHECK_NEAR(d.migrate_ms, 0.0, 0.0);   /* no migration measured yet */
    /* The next step finishes the decision row. */
    struct fake_step after;
    fake_step(&after, cost, proposal, 55);
    after.obs.migrated_blocks = 2;
    after.obs.migrated_bytes = 2e6;
    after.obs.migrate_ms = 9;
    CHECK(balance_controller_observe(ctl, &after.obs, row) == 1);
    CHECK(row[0] == 2.0f && row[4] == 1.0f && row[3] == 70.0f && row[6] == 55.0f);
    CHECK_NEAR(row[1], d.now_ms, 1e-3 * d.now_ms);
    CHECK_NEAR(row[2], d.next_ms, 1e-3 * d.next_ms);
    CHECK(balance_controller_observe(ctl, &after.obs, row) == 0);   /* rows are finished once */
    balance_controller_destroy(ctl);
}

/* The gates: a proposal predicted less than min_improvement faster is
 * skipped, and so is one whose saving does not pay for the migration the
 * controller has measured. */
static void test_gates(void)
{
    char err[256];
    double cost[BLOCKS] = {4, 4, 4, 4, 1, 1, 1, 1};
    int even[STAGES] = {4, 4};
    struct fake_step f;
    fake_step(&f, cost, even, 70);
    float row[BALANCE_DECISION_COLUMNS];
    int proposal[STAGES];
    struct balance_decision d;

    struct balance_controller_config c = config("partition-time", 1);
    c.min_improvement = 0.9;
    struct balance_controller *ctl = balance_controller_create(&c, err, sizeof err);
    balance_controller_observe(ctl, &f.obs, row);
    CHECK(balance_controller_decide(ctl, &f.obs, 0, proposal, &d, err, sizeof err) == BALANCE_OK);
    CHECK(d.changed && !d.enough && !d.apply);
    balance_controller_destroy(ctl);

    c = config("partition-time", 1);
    ctl = balance_controller_create(&c, err, sizeof err);
    f.obs.migrated_blocks = 1;      /* a migration that cost a minute */
    f.obs.migrated_bytes = 1e6;
    f.obs.migrate_ms = 60000;
    balance_controller_observe(ctl, &f.obs, row);
    CHECK(balance_controller_decide(ctl, &f.obs, 0, proposal, &d, err, sizeof err) == BALANCE_OK);
    CHECK(d.changed && d.enough && !d.apply);
    CHECK_MSG(d.migrate_ms > d.saving_ms, "migration %g ms, saving %g ms", d.migrate_ms,
              d.saving_ms);
    balance_controller_destroy(ctl);
}

/* Re-pack on a profile so cheap that one stage keeps the step time within
 * a generous epsilon, and min_stages holding it at two. */
static void test_repack(void)
{
    char err[256];
    double cost[BLOCKS] = {1, 1, 1, 1, 1, 1, 1, 1};
    int even[STAGES] = {4, 4};
    struct fake_step f;
    fake_step(&f, cost, even, 30);
    struct balance_controller_config c = config("none", 1);
    struct balance_controller *ctl = balance_controller_create(&c, err, sizeof err);
    int counts[STAGES];
    CHECK(balance_controller_repack(ctl, &f.obs, 5.0, 1, counts, err, sizeof err) == 1);
    CHECK(counts[0] == BLOCKS && err[0] == 0);
    CHECK(balance_controller_repack(ctl, &f.obs, 5.0, 2, counts, err, sizeof err) == 2);
    CHECK(counts[0] + counts[1] == BLOCKS);
    CHECK(balance_controller_repack(ctl, &f.obs, 0.0, 1, counts, err, sizeof err) == 2);
    balance_controller_destroy(ctl);
}

int main(void)
{
    test_bad_method();
    test_none_and_random();
    test_partition_applies();
    test_gates();
    test_repack();
    return testing_report("test_controller");
}
