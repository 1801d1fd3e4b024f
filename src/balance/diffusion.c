/* The paper's decentralised diffusion balancer (DynMo section 3.3): stages
 * talk only to neighbours, in rounds, and hand boundary blocks from the
 * heavier to the lighter of a pair while that lowers the pair's maximum.
 * Written as it would run distributed (each pair decides from its own two
 * stages only) so that a round here is a communication round there.
 * Must not: look at any stage but the pair's, or break the memory cap. */
#include <math.h>
#include <string.h>
#include "balance_internal.h"

#define DIFFUSION_ROUND_LIMIT 1000000

/* One pair (s, s+1) sharing boundary start[s+1]: moves blocks one at a time
 * towards the lighter stage while the pair's maximum strictly drops, the
 * receiver fits the cap and the giver keeps a block. Returns blocks moved. */
static int balance_pair(const struct balance_problem *p, int *start, int s)
{
    int left = start[s], mid = start[s + 1], right = start[s + 2];
    int moved = 0;
    for (;;) {
        double cost_left = problem_stage_cost(p, s, left, mid);
        double cost_right = problem_stage_cost(p, s + 1, mid, right);
        double pair_max = fmax(cost_left, cost_right);
        int to = cost_left > cost_right ? mid - 1 : mid + 1;
        if (to <= left || to >= right) break;  /* the giver keeps a block */
        double new_left = problem_stage_cost(p, s, left, to);
        double new_right = problem_stage_cost(p, s + 1, to, right);
        if (!(fmax(new_left, new_right) < pair_max)) break;
        int64_t receiver = to < mid ? problem_stage_mem(p, s + 1, to, right)
                                    : problem_stage_mem(p, s, left, to);
        if (receiver > p->mem_cap) break;
        mid = to;
        moved++;
    }
    start[s + 1] = mid;
    return moved;
}

/* Whether the most and least costly stages differ by less than gamma. */
static int within_gamma(const struct balance_problem *p, const int *start,
                        int stages, double gamma)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int s = 0; s < stages; s++) {
        double c = problem_stage_cost(p, s, start[s], start[s + 1]);
        lo = fmin(lo, c);
        hi = fmax(hi, c);
    }
    return hi - lo < gamma;
}

/* Rounds of pairs, even pairs then odd, until two rounds in a row move
 * nothing, the stages are within gamma (> 0), or limit rounds have run
 * (then *converged is 0). Returns the last round that moved a block. */
static int diffuse(const struct balance_problem *p, int *start, int stages,
                   double gamma, int limit, int *converged)
{
    int round = 0, last_moving_round = 0, idle_in_a_row = 0;
    *converged = 1;
    while (idle_in_a_row < 2) {
        if (gamma > 0 && within_gamma(p, start, stages, gamma)) break;
        if (round == limit) {
            *converged = 0;
            break;
        }
        int moved = 0;
        for (int s = round % 2; s + 1 < stages; s += 2)
            moved += balance_pair(p, start, s);
        round++;
        if (moved) {
            last_moving_round = round;
            idle_in_a_row = 0;
        } else {
            idle_in_a_row++;
        }
    }
    return last_moving_round;
}

int balance_diffusion(const struct balance_costs *costs, int stages,
                      int64_t mem_cap, const int *current, double gamma,
                      int max_rounds, int *counts, struct balance_result *res,
                      char *err, size_t errsize)
{
    int rc = balance_check_costs(costs, stages, mem_cap, err, errsize);
    if (rc) return rc;
    if (isnan(gamma))
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "gamma is not a number");
    int n = costs->blocks;
    int *start = dm_alloc((size_t)(stages + 1) * sizeof(int));
    rc = balance_current_or_uniform(current, stages, n, counts, err, errsize);
    if (rc) {
        dm_free(start);
        return rc;
    }
    /* every stage of the start must fit the cap: diffusion never breaks
     * it, so it cannot start beyond it */
    rc = layout_check_cap(costs, counts, stages, mem_cap, "starting",
                          "diffusion only moves within the cap (use a partition method)",
                          err, errsize);
    for (int s = 0; s < stages; s++) start[s + 1] = start[s] + counts[s];
    struct balance_problem p;
    problem_init(&p, costs, stages, mem_cap);
    if (rc == BALANCE_OK) {
        int limit = max_rounds > 0 ? max_rounds : DIFFUSION_ROUND_LIMIT;
        int converged;
        int rounds = diffuse(&p, start, stages, gamma, limit, &converged);
        for (int s = 0; s < stages; s++) counts[s] = start[s + 1] - start[s];
        if (res) {
            int *reference = dm_alloc((size_t)stages * sizeof(int));
            balance_current_or_uniform(current, stages, n, reference, NULL, 0);
            problem_describe(&p, counts, reference, stages, res);
            res->rounds = rounds;
            res->converged = converged;
            dm_free(reference);
        }
    }
    problem_free(&p);
    dm_free(start);
    return rc;
}
