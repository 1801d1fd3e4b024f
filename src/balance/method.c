/* Balancing methods by name, and the one entry point the pipeline engine
 * and `dynmo plan` call at a balancing decision (balance_propose): each
 * method's costs (time or parameters) handed to its balancer, and
 * partition-time's search on the predicted step when the min-max partition
 * can miss it. Must not: do I/O, talk MPI or keep state between calls
 * (pure, like the rest of src/balance), or give a method a second
 * implementation beside partition.c's and diffusion.c's. */
#include <math.h>
#include <string.h>
#include "balance_internal.h"

static const char *const method_names[BALANCE_METHOD_COUNT] = {
    [BALANCE_STATIC_UNIFORM] = "static-uniform",
    [BALANCE_STATIC_PARAMS] = "static-params",
    [BALANCE_PARTITION_PARAMS] = "partition-params",
    [BALANCE_PARTITION_TIME] = "partition-time",
    [BALANCE_DIFFUSION_PARAMS] = "diffusion-params",
    [BALANCE_DIFFUSION_TIME] = "diffusion-time",
};

const char *balance_method_name(enum balance_method method)
{
    if ((int)method < 0 || method >= BALANCE_METHOD_COUNT) return NULL;
    return method_names[method];
}

int balance_method_parse(const char *name)
{
    for (int m = 0; m < BALANCE_METHOD_COUNT; m++)
        if (strcmp(name, method_names[m]) == 0) return m;
    return -1;
}

/* Predictions each start of partition_by_prediction may spend on its local
 * search: a few sweeps of a few dozen stages, and at most about
 * SEARCH_INSTRUCTIONS simulated instructions (2 S m a prediction), so that
 * a decision stays within tens of milliseconds on large pipelines (1,000
 * blocks on 64 stages, m = 256: 240 ms with 256 predictions a start, 60 ms
 * with the cap). */
#define SHARED_SEARCH_BUDGET 256
#define SEARCH_INSTRUCTIONS 2e6

static int search_budget(int stages, int micro_batches)
{
    double affordable = SEARCH_INSTRUCTIONS / (2.0 * stages * micro_batches);
    return affordable < SHARED_SEARCH_BUDGET ? (int)affordable : SHARED_SEARCH_BUDGET;
}

/* Whether the min-max partition of fwd + bwd can miss the fastest layout
 * by more than the schedule's shape: stages share processors, or blocks
 * have an update at the step's end, which the per-micro-batch costs do not
 * hold. */
static int prediction_decides(const struct balance_profile *profile, int stages)
{
    if (balance_sharing_oversubscribed(profile->sharing, stages)) return 1;
    if (profile->embed.update_ms != 0 || profile->head.update_ms != 0) return 1;
    for (int i = 0; profile->update_ms && i < profile->blocks; i++)
        if (profile->update_ms[i] != 0) return 1;
    return 0;
}

/* partition-time when prediction_decides (balance.h): the min-max
 * partition, static-uniform and current, each polished by local search on
 * the predicted step time; the fastest wins, then the one moving the
 * fewest blocks from current, then the earlier start. */
static int partition_by_prediction(const struct balance_profile *profile,
                                   const struct balance_costs *costs, int stages,
                                   const int *current,
                                   const struct balance_options *options,
                                   int *counts, struct balance_result *res,
                                   char *err, size_t errsize)
{
    int rc = balance_partition(costs, stages, options->mem_cap, current, stages,
                               counts, res, err, errsize);
    if (rc) return rc;
    int m = options->micro_batches > 0 ? options->micro_batches : 4 * stages;
    int budget = search_budget(stages, m);
    /* The costs passed as sums; the predictor also needs fwd_ms and bwd_ms
     * each valid, and the schedule known: its errors are the caller's. */
    struct balance_prediction start_prediction;
    rc = balance_predict(profile, stages, counts, m, options->schedule,
                         &start_prediction, err, errsize);
    if (rc) return rc;
    int n = costs->blocks;
    int *reference = dm_alloc((size_t)stages * sizeof(int));
    int *start = dm_alloc((size_t)stages * sizeof(int));
    balance_current_or_uniform(current, stages, n, reference, NULL, 0);
    struct balance_problem p;
    problem_init(&p, costs, stages, options->mem_cap);
    struct balance_result best_res, start_res;
    double best = improve_by_prediction(profile, costs, stages, counts,
                                        options->mem_cap, m, options->schedule,
                                        0.0, INFINITY, budget);
    problem_describe(&p, counts, reference, stages, &best_res);
    for (int other = 0; other < (current ? 2 : 1); other++) {
        if (other == 0) balance_static_uniform(n, stages, start, NULL, 0);
        else memcpy(start, current, (size_t)stages * sizeof(int));
        int64_t max_mem;
        balance_layout_max(costs, stages, start, NULL, &max_mem);
        if (options->mem_cap > 0 && max_mem > options->mem_cap) continue;
        double t = improve_by_prediction(profile, costs, stages, start,
                                         options->mem_cap, m, options->schedule,
                                         0.0, INFINITY, budget);
        problem_describe(&p, start, reference, stages, &start_res);
        if (t < best || (t == best && start_res.blocks_moved < best_res.blocks_moved)) {
            best = t;
            best_res = start_res;
            memcpy(counts, start, (size_t)stages * sizeof(int));
        }
    }
    if (res) {
        *res = best_res;
        res->rounds = 0;
        res->converged = 1;
    }
    problem_free(&p);
    dm_free(start);
    dm_free(reference);
    return BALANCE_OK;
}

/* static-uniform: the same number of blocks on every stage, whatever they
 * cost; its movement is reported against current. */
static int propose_static_uniform(const struct balance_costs *costs, int stages,
                                  const int *current, int *counts,
                                  struct balance_result *res, char *err,
                                  size_t errsize)
{
    int n = costs->blocks;
    int rc = balance_check_costs(costs, stages, 0, err, errsize);
    if (rc == BALANCE_OK)
        rc = balance_static_uniform(n, stages, counts, err, errsize);
    if (rc == BALANCE_OK) {
        int *reference = dm_alloc((size_t)stages * sizeof(int));
        rc = balance_current_or_uniform(current, stages, n, reference, err,
                                        errsize);
        if (rc == BALANCE_OK) {
            struct balance_problem p;
            problem_init(&p, costs, stages, 0);
            problem_describe(&p, counts, reference, stages, res);
            problem_free(&p);
            res->rounds = 0;
            res->converged = 1;
        }
        dm_free(reference);
    }
    return rc;
}

/* static-params: computed once from the initial model, blind to memory and
 * to where blocks are; movement is still reported against current. */
static int propose_static_params(const struct balance_costs *costs, int stages,
                                 const int *current, int *counts,
                                 struct balance_result *res, char *err,
                                 size_t errsize)
{
    int rc = balance_partition(costs, stages, 0, NULL, 0, counts, res, err,
                               errsize);
    if (rc == BALANCE_OK && current) {
        rc = balance_check_layout(current, stages, costs->blocks, err, errsize);
        if (rc == BALANCE_OK) {
            struct balance_problem p;
            problem_init(&p, costs, stages, 0);
            problem_describe(&p, counts, current, stages, res);
            problem_free(&p);
        }
    }
    return rc;
}

int balance_propose(enum balance_method method,
                    const struct balance_profile *profile, int stages,
                    const int *current, const struct balance_options *options,
                    int *counts, struct balance_result *res,
                    char *err, size_t errsize)
{
    if (!balance_method_name(method))
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "unknown balancing method %d", (int)method);
    struct balance_options none = {0, 0.0, 0, 0, DM_SCHEDULE_1F1B};
    if (!options) options = &none;
    if (profile->sharing) {
        int rc = balance_check_sharing(profile->sharing, err, errsize);
        if (rc) return rc;
    }
    int n = profile->blocks;
    enum balance_cost_kind kind =
        method == BALANCE_STATIC_UNIFORM || method == BALANCE_PARTITION_TIME ||
        method == BALANCE_DIFFUSION_TIME ? BALANCE_COST_TIME : BALANCE_COST_PARAMS;
    double *cost = dm_alloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    struct balance_costs costs;
    balance_costs_from_profile(&costs, profile, kind, cost);
    struct balance_result local;
    if (!res) res = &local;
    int rc;
    switch (method) {
    case BALANCE_STATIC_UNIFORM:
        rc = propose_static_uniform(&costs, stages, current, counts, res, err,
                                    errsize);
        break;
    case BALANCE_STATIC_PARAMS:
        rc = propose_static_params(&costs, stages, current, counts, res, err,
                                   errsize);
        break;
    case BALANCE_PARTITION_PARAMS:
    case BALANCE_PARTITION_TIME:
        if (method == BALANCE_PARTITION_TIME && prediction_decides(profile, stages))
            rc = partition_by_prediction(profile, &costs, stages, current, options,
                                         counts, res, err, errsize);
        else
            rc = balance_partition(&costs, stages, options->mem_cap, current,
                                   stages, counts, res, err, errsize);
        break;
    default:
        rc = balance_diffusion(&costs, stages, options->mem_cap, current,
                               options->gamma, options->max_rounds, counts,
                               res, err, errsize);
        break;
    }
    dm_free(cost);
    return rc;
}
