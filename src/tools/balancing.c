/* The balancing loop of `dynmo train` (see balancing.h). Decisions are
 * taken on rank 0 from the profile it gathered and broadcast by the
 * engine, so every rank switches to the same layout at the same step
 * boundary. */
#include <stdio.h>
#include <string.h>
#include "dynmo/core.h"
#include "tools/balancing.h"

enum method { METHOD_NONE, METHOD_RANDOM };

struct balancer {
    enum method method;
    int stages, layers, every;
    uint64_t seed;
    int *proposal;
};

struct balancer *balancer_create(const struct dm_config *cfg, int stages)
{
    struct balancer *bal = dm_alloc(sizeof *bal);
    if (!strcmp(cfg->method, "none")) bal->method = METHOD_NONE;
    else if (!strcmp(cfg->method, "random")) bal->method = METHOD_RANDOM;
    else
        dm_user_error("balance.method = '%s' is not a method (valid: none, random)",
                      cfg->method);
    bal->stages = stages;
    bal->layers = cfg->layers;
    bal->every = cfg->every;
    bal->seed = cfg->seed;
    bal->proposal = dm_alloc((size_t)stages * sizeof(int));
    return bal;
}

void balancer_destroy(struct balancer *bal)
{
    dm_free(bal->proposal);
    dm_free(bal);
}

/* A random layout drawn from (seed, step): every stage at least one
 * block. For testing that migration never changes the math. */
static void random_layout(int *counts, int stages, int layers, uint64_t seed, int step)
{
    for (int s = 0; s < stages; s++) counts[s] = 1;
    for (int k = 0; k < layers - stages; k++)
        counts[dm_hash64(seed, 0x6c61796f7574ULL + (uint64_t)step, (uint64_t)k) %
               (uint64_t)stages]++;
}

void balancer_after_step(struct balancer *bal, struct engine *eng, struct runlog *log,
                         const struct step_stats *stats, int step)
{
    (void)log;
    (void)stats;
    if (bal->method == METHOD_NONE || (step + 1) % bal->every != 0) return;
    if (bal->method == METHOD_RANDOM)
        random_layout(bal->proposal, bal->stages, bal->layers, bal->seed, step);
    engine_relayout(eng, bal->proposal);
}
