/* The balancing loop of `dynmo train`: every balance.every steps it turns
 * the profiled per-layer costs into a layout with one of src/balance's
 * pure functions and hands it to the engine. Internal to src/tools. */
#ifndef DYNMO_TOOLS_BALANCING_H
#define DYNMO_TOOLS_BALANCING_H

#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/pipe.h"

struct balancer;

/* Validates balance.method (user error naming the valid methods). */
struct balancer *balancer_create(const struct dm_config *cfg, int stages);
void balancer_destroy(struct balancer *bal);
/* Stages share processors (world_stage_sharing's answer; groups = 0: a
 * processor per stage), taking turns when turns is 1 (world_take_turns;
 * cores whole): every prediction and partition-time decision uses it.
 * group and cores stay the caller's and must outlive bal. */
void balancer_set_sharing(struct balancer *bal, int groups, const int *group,
                          const double *cores, int turns);

/* Collective: after step `step` (0-based) has been logged. On a decision
 * step, rank 0 decides from the step's profile, logs the decision in the
 * run log (log is NULL on other ranks) and every rank switches layout. */
void balancer_after_step(struct balancer *bal, struct engine *eng, struct runlog *log,
                         const struct step_stats *stats, int step);

/* Rank 0: the re-pack planner (balance_repack) on the profiled costs:
 * the fewest stages whose predicted step time stays within
 * (1 + repack.epsilon) of the current layout's, but no fewer than
 * min_stages (then the exact time partition on min_stages). Returns the new stage
 * count (== current when nothing smaller qualifies) with its layout in
 * counts (stages entries available). */
int balancer_repack_plan(struct balancer *bal, const struct step_stats *stats,
                         double epsilon, int min_stages, int *counts);

#endif
