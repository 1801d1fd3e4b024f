/* Shared by the files of src/balance only: a balancing problem prepared
 * once (prefix sums of cost and memory) so that any stage's cost and memory
 * are O(1), with exactly the summation order that balance.h defines.
 * Nothing outside src/balance includes this. */
#ifndef DYNMO_BALANCE_INTERNAL_H
#define DYNMO_BALANCE_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include "dynmo/balance.h"

struct balance_problem {
    int blocks;                 /* n */
    int stages;                 /* S */
    double *prefix_cost;        /* (n+1) P[k] = P[k-1] + cost[k-1], P[0] = 0 */
    int64_t *prefix_mem;        /* (n+1) same for mem_bytes, exact */
    double first_cost, last_cost;
    int64_t first_mem, last_mem;
    int64_t mem_cap;            /* INT64_MAX when there is no cap */
};

/* Builds the prefix sums (one allocation, freed by problem_free). The costs
 * must have passed balance_check_costs. */
void problem_init(struct balance_problem *p, const struct balance_costs *costs,
                  int stages, int64_t mem_cap);
void problem_free(struct balance_problem *p);

/* The definition in balance.h, evaluated in exactly its order. */
static inline double problem_stage_cost(const struct balance_problem *p,
                                        int stage, int begin, int end)
{
    double c = p->prefix_cost[end] - p->prefix_cost[begin];
    if (stage == 0) c = p->first_cost + c;
    if (stage == p->stages - 1) c = c + p->last_cost;
    return c;
}

static inline int64_t problem_stage_mem(const struct balance_problem *p,
                                        int stage, int begin, int end)
{
    int64_t m = p->prefix_mem[end] - p->prefix_mem[begin];
    if (stage == 0) m += p->first_mem;
    if (stage == p->stages - 1) m += p->last_mem;
    return m;
}

static inline int problem_stage_fits(const struct balance_problem *p,
                                     int stage, int begin, int end,
                                     double bound)
{
    return problem_stage_cost(p, stage, begin, end) <= bound &&
           problem_stage_mem(p, stage, begin, end) <= p->mem_cap;
}

/* Whether some layout on p->stages stages has every stage cost <= bound
 * and fits p->mem_cap: the greedy probe (partition.c). */
int problem_fits(const struct balance_problem *p, double bound);

/* The exact min-max stage cost (phase 1 of the partition). The problem
 * must be feasible at +inf (balance_check_costs passed). */
double problem_optimal_bound(const struct balance_problem *p);

/* Writes a formatted message into err (if not NULL) and returns status. */
__attribute__((format(printf, 4, 5)))
int balance_fail(int status, char *err, size_t errsize, const char *fmt, ...);

/* Copies `current`, or the static-uniform layout when current is NULL, into
 * out (stages entries); checks it. */
int balance_current_or_uniform(const int *current, int stages, int blocks,
                               int *out, char *err, size_t errsize);

/* Every stage of the layout `counts` (checked) within mem_cap (0 = no
 * cap), or BALANCE_INFEASIBLE naming the first stage over it: "stage s of
 * the <whose> layout holds B bytes, more than the capacity of C bytes",
 * then "; <remedy>" when remedy is not NULL. The balancers that only move
 * within the cap (diffusion) or only merge (first-fit), and re-packing,
 * refuse such a start with it. */
int layout_check_cap(const struct balance_costs *costs, const int *counts, int stages,
                     int64_t mem_cap, const char *whose, const char *remedy, char *err,
                     size_t errsize);

/* The exact partition on a prepared problem (balance_partition without the
 * input checks); `reference` is a layout of reference_stages stages. */
int partition_prepared(const struct balance_problem *p, const int *reference,
                       int reference_stages, int *counts,
                       struct balance_result *res);

/* Fills res's max cost, max memory and movement for `counts` vs
 * `reference`. */
void problem_describe(const struct balance_problem *p, const int *counts,
                      const int *reference, int reference_stages,
                      struct balance_result *res);

/* ---- schedules (schedule.c, schedule_zb.c, schedule_interleaved.c) ---- */

/* Append one micro-batch's receive-forward-send (or receive-backward-send)
 * of `chunk` at out[n], without the transfers that the first or last
 * (virtual) stage lacks; return the new count. */
int schedule_emit_forward(struct schedule_instr *out, int n, int mb, int chunk, int first,
                          int last);
int schedule_emit_backward(struct schedule_instr *out, int n, int mb, int chunk, int first,
                           int last);

/* Stage `stage`'s computing and transfer instructions (no REDUCE_GRADS or
 * OPTIMIZER_STEP) of ZB-H1 and of interleaved 1F1B with virtual > 1
 * (balance.h, schedule_stage and schedule_stage_chunks); return the count. */
int schedule_zb_stage(struct schedule_instr *out, int stage, int stages, int micro_batches);
int schedule_interleaved_stage(struct schedule_instr *out, int stage, int stages, int virtual,
                               int micro_batches);

/* ---- local search on the predicted step time (search.c) ---- */

/* balance_predict's step time for a layout and profile already checked
 * (asserts that the prediction succeeds). */
double predicted_ms(const struct balance_profile *profile, int stages,
                    const int *counts, int micro_batches,
                    enum dm_schedule schedule);

/* Improves `counts` (a layout on `stages` stages within mem_cap, 0 = no
 * cap; costs are profile's time costs) in place by moving one boundary by
 * one block at a time, first improvement, while the predicted step time
 * strictly drops and stays above `target`. Gives up at once when the start
 * predicts above give_up_above; spends at most `budget` predictions beyond
 * the start's. Returns the predicted time of the final layout. */
double improve_by_prediction(const struct balance_profile *profile,
                             const struct balance_costs *costs, int stages,
                             int *counts, int64_t mem_cap, int micro_batches,
                             enum dm_schedule schedule, double target,
                             double give_up_above, int budget);

#endif
