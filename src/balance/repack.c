/* Re-packing (DynMo section 3.4): the fewest stages that keep the predicted
 * step time within (1 + epsilon) of the current one under the memory cap,
 * and the paper's Algorithm 2 (first-fit pairwise merging) as the baseline
 * it must never lose to. Pure: the engine turns the answer into a
 * checkpoint and a restart on a smaller world.
 * Must not: return a layout predicted slower than that bound or over the
 * cap (the current layout is the answer when nothing smaller keeps it; a
 * current layout over the cap is refused, by both), or do I/O or MPI. */
#include <math.h>
#include <string.h>
#include "balance_internal.h"

int balance_repack_first_fit(const struct balance_costs *costs,
                             const int *current, int current_stages,
                             int64_t mem_cap, int target_stages, int *counts,
                             int *out_stages, char *err, size_t errsize)
{
    int S = current_stages;
    int rc = balance_check_layout(current, S, costs->blocks, err, errsize);
    if (rc) return rc;
    if (target_stages < 1)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "target stages must be at least 1 (got %d)",
                            target_stages);
    if (mem_cap < 0)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "mem_cap %lld is negative (0 means no cap)",
                            (long long)mem_cap);
    /* Merging never splits a stage: a stage over the cap would stay over it. */
    rc = layout_check_cap(costs, current, S, mem_cap, "starting",
                          "first-fit merging cannot split it (use repack, which "
                          "re-partitions)", err, errsize);
    if (rc) return rc;
    int64_t *mem = dm_alloc((size_t)S * sizeof(int64_t));
    int *merged = dm_alloc((size_t)S * sizeof(int));
    int begin = 0;
    for (int s = 0; s < S; s++) {
        mem[s] = balance_stage_mem(costs, S, s, begin, begin + current[s]);
        merged[s] = current[s];
        begin += current[s];
    }
    /* Each stage, in order, merges into the next active one (its right
     * neighbour once the ones in between are gone) when both fit in one.
     * The paper's loop tries every later stage; only the neighbour keeps
     * stages contiguous. */
    int active = S;
    for (int src = 0; src < S - 1 && active > target_stages; src++) {
        int dst = src + 1;
        if (mem_cap > 0 && mem[src] + mem[dst] > mem_cap) continue;
        merged[dst] += merged[src];
        mem[dst] += mem[src];
        merged[src] = 0;
        active--;
    }
    int k = 0;
    for (int s = 0; s < S; s++)
        if (merged[s] > 0) counts[k++] = merged[s];
    *out_stages = k;
    dm_free(merged);
    dm_free(mem);
    return BALANCE_OK;
}

/* What the search for fewer stages works from. */
struct repack_search {
    const struct balance_profile *profile;
    const struct balance_costs *costs;  /* the profile's time costs */
    const int *current;                 /* (current_stages) */
    int current_stages;
    int64_t mem_cap;
    int micro_batches;
    enum dm_schedule schedule;
    double bound;                       /* the step time to keep within */
};

/* The fewest stages not ruled out. No layout on k stages can beat m times
 * its best bottleneck (the bottleneck stage alone runs m forwards and m
 * backwards), and that bound only falls as k grows: skip, by bisection,
 * every k it rules out (the factor absorbs rounding between f + b per block
 * and per stage). Stage counts whose memory cannot fit are ruled out too. */
static int fewest_viable_stages(const struct repack_search *r)
{
    int lo = 1, hi = r->current_stages;
    while (lo < hi) {
        int k = lo + (hi - lo) / 2;
        int viable = balance_check_costs(r->costs, k, r->mem_cap, NULL, 0) == BALANCE_OK;
        if (viable) {
            struct balance_problem p;
            problem_init(&p, r->costs, k, r->mem_cap);
            viable = r->micro_batches * problem_optimal_bound(&p) * (1 - 1e-9) <= r->bound;
            problem_free(&p);
        }
        if (viable) hi = k;
        else lo = k + 1;
    }
    return lo;
}

/* A layout on k stages predicted within the bound, into candidate: the
 * exact partition polished by prediction, else first-fit merging. Returns
 * 1 when one is found. */
static int layout_within(const struct repack_search *r, int k, int *candidate)
{
    if (balance_check_costs(r->costs, k, r->mem_cap, NULL, 0) == BALANCE_OK) {
        struct balance_problem p;
        problem_init(&p, r->costs, k, r->mem_cap);
        struct balance_result ignored;
        partition_prepared(&p, r->current, r->current_stages, candidate, &ignored);
        problem_free(&p);
        /* The polish corrects warm-up and drain effects, worth a few
         * percent at most: not tried further from the bound than that,
         * and within a budget of predictions (each O(stages x
         * micro-batches)) of about two sweeps. */
        if (improve_by_prediction(r->profile, r->costs, k, candidate, r->mem_cap,
                                  r->micro_batches, r->schedule, r->bound,
                                  r->bound * 1.03, 4 * k + 32) <= r->bound)
            return 1;
    }
    int merged_stages = 0;
    return balance_repack_first_fit(r->costs, r->current, r->current_stages, r->mem_cap, k,
                                    candidate, &merged_stages, NULL, 0) == BALANCE_OK &&
           merged_stages == k &&
           predicted_ms(r->profile, k, candidate, r->micro_batches, r->schedule) <= r->bound;
}

int balance_repack(const struct balance_profile *profile,
                   const int *current, int current_stages, int64_t mem_cap,
                   int micro_batches, enum dm_schedule schedule,
                   double epsilon, int *counts, struct balance_result *res,
                   char *err, size_t errsize)
{
    int n = profile->blocks, S = current_stages;
    if (!isfinite(epsilon) || epsilon < 0)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "epsilon %g must be a finite number >= 0", epsilon);
    int rc = balance_check_layout(current, S, n, err, errsize);
    if (rc) return rc;
    double *cost = dm_alloc((size_t)n * sizeof(double));
    struct balance_costs costs;
    balance_costs_from_profile(&costs, profile, BALANCE_COST_TIME, cost);
    rc = balance_check_costs(&costs, S, mem_cap, err, errsize);
    struct balance_prediction now;
    if (rc == BALANCE_OK)
        rc = balance_predict(profile, S, current, micro_batches, schedule,
                             &now, err, errsize);
    if (rc == BALANCE_OK)
        rc = layout_check_cap(&costs, current, S, mem_cap, "current", NULL, err, errsize);
    if (rc) {
        dm_free(cost);
        return rc;
    }
    struct repack_search search = {profile, &costs, current, S, mem_cap,
                                   micro_batches, schedule,
                                   now.step_ms * (1.0 + epsilon)};
    int *candidate = dm_alloc((size_t)S * sizeof(int));
    int chosen = S;
    memcpy(counts, current, (size_t)S * sizeof *counts);
    for (int k = fewest_viable_stages(&search); k < S; k++)
        if (layout_within(&search, k, candidate)) {
            chosen = k;
            break;
        }
    if (chosen < S) memcpy(counts, candidate, (size_t)chosen * sizeof *counts);
    if (res) {
        struct balance_problem p;
        problem_init(&p, &costs, chosen, mem_cap);
        problem_describe(&p, counts, current, S, res);
        problem_free(&p);
        res->rounds = 0;
        res->converged = 1;
    }
    dm_free(candidate);
    dm_free(cost);
    return BALANCE_OK;
}
