/* Re-packing (DynMo section 3.4): the fewest stages that keep the predicted
 * step time within (1 + epsilon) of the current one under the memory cap,
 * and the paper's Algorithm 2 (first-fit pairwise merging) as the baseline
 * it must never lose to. Pure: the engine turns the answer into a
 * checkpoint and a restart on a smaller world. */
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

/* Predicts a layout's step time; the layout and profile are already checked. */
static double predicted_ms(const struct balance_profile *profile, int stages,
                           const int *counts, int micro_batches,
                           enum dm_schedule schedule)
{
    struct balance_prediction prediction;
    int rc = balance_predict(profile, stages, counts, micro_batches, schedule,
                             &prediction, NULL, 0);
    DM_ASSERT(rc == BALANCE_OK);
    return prediction.step_ms;
}

/* Local search on the predicted time itself: the min-max layout is the
 * right start, but the schedule's warm-up and drain depend on forward and
 * backward times separately, so a neighbouring layout can be faster. Moves
 * one boundary by one block at a time, keeping every stage within mem_cap,
 * while the predicted step time strictly drops. Returns the final time. */
static double improve_by_prediction(const struct balance_profile *profile,
                                    const struct balance_costs *costs,
                                    int stages, int *counts, int64_t mem_cap,
                                    int micro_batches, enum dm_schedule schedule,
                                    double target)
{
    double best = predicted_ms(profile, stages, counts, micro_batches, schedule);
    /* It corrects warm-up and drain effects, worth a few percent at most:
     * not tried further from the target than that, and within a budget of
     * predictions (each O(stages x micro-batches)) of about two sweeps. */
    if (best > target * 1.03) return best;
    int budget = 4 * stages + 32;
    for (int step = 0; step < budget && best > target; step++) {
        int improved = 0;
        for (int j = 0; j + 1 < stages && !improved; j++) {
            for (int delta = -1; delta <= 1 && !improved; delta += 2) {
                /* boundary between stage j and j+1 moves by delta */
                if (counts[j] + delta < 1 || counts[j + 1] - delta < 1) continue;
                counts[j] += delta;
                counts[j + 1] -= delta;
                int begin = 0, fits = 1;
                for (int s = 0; s < j; s++) begin += counts[s];
                for (int s = j; s <= j + 1 && mem_cap > 0; s++) {
                    fits &= balance_stage_mem(costs, stages, s, begin,
                                              begin + counts[s]) <= mem_cap;
                    begin += counts[s];
                }
                double t = INFINITY;
                if (fits && budget-- > 0)
                    t = predicted_ms(profile, stages, counts, micro_batches,
                                     schedule);
                if (t < best) {
                    best = t;
                    improved = 1;
                } else {
                    counts[j] -= delta;
                    counts[j + 1] += delta;
                }
            }
        }
        if (!improved) break;
    }
    return best;
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
    int begin = 0;
    for (int s = 0; rc == BALANCE_OK && s < S; s++) {
        int64_t mem = balance_stage_mem(&costs, S, s, begin, begin + current[s]);
        if (mem_cap > 0 && mem > mem_cap)
            rc = balance_fail(BALANCE_INFEASIBLE, err, errsize,
                              "stage %d of the current layout holds %lld "
                              "bytes, more than the capacity of %lld bytes",
                              s, (long long)mem, (long long)mem_cap);
        begin += current[s];
    }
    if (rc) {
        dm_free(cost);
        return rc;
    }
    double bound = now.step_ms * (1.0 + epsilon);
    int *candidate = dm_alloc((size_t)S * sizeof(int));
    int chosen = S;
    memcpy(counts, current, (size_t)S * sizeof *counts);
    /* No layout on k stages can beat m times its best bottleneck (the
     * bottleneck stage alone runs m forwards and m backwards), and that
     * bound only falls as k grows: skip, by bisection, every k it rules
     * out (the factor absorbs rounding between f + b per block and per
     * stage). Stage counts whose memory cannot fit are ruled out too. */
    int lo = 1, hi = S;
    while (lo < hi) {
        int k = lo + (hi - lo) / 2;
        int viable = balance_check_costs(&costs, k, mem_cap, NULL, 0) == BALANCE_OK;
        if (viable) {
            struct balance_problem p;
            problem_init(&p, &costs, k, mem_cap);
            viable = micro_batches * problem_optimal_bound(&p) * (1 - 1e-9) <= bound;
            problem_free(&p);
        }
        if (viable) hi = k;
        else lo = k + 1;
    }
    for (int k = lo; k < S; k++) {
        if (balance_check_costs(&costs, k, mem_cap, NULL, 0) == BALANCE_OK) {
            struct balance_problem p;
            problem_init(&p, &costs, k, mem_cap);
            struct balance_result ignored;
            partition_prepared(&p, current, S, candidate, &ignored);
            problem_free(&p);
            if (improve_by_prediction(profile, &costs, k, candidate, mem_cap,
                                      micro_batches, schedule, bound) <= bound) {
                chosen = k;
                break;
            }
        }
        int merged_stages = 0;
        balance_repack_first_fit(&costs, current, S, mem_cap, k, candidate,
                                 &merged_stages, NULL, 0);
        if (merged_stages == k &&
            predicted_ms(profile, k, candidate, micro_batches, schedule) <= bound) {
            chosen = k;
            break;
        }
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
