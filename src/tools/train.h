/* The pieces of `dynmo train` and `dynmo bench` (src/tools/train*.c,
 * bench.c), private to src/tools: the trainer orchestrates world, pipe,
 * balance and ckpt; each piece here carries numbers between them and
 * decides nothing the modules below decide. */
#ifndef DYNMO_TOOLS_TRAIN_H
#define DYNMO_TOOLS_TRAIN_H

#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/pipe.h"

/* ---- balancing (train_balance.c) ------------------------------------------ */

struct train_balancer;

/* A controller for balance.method (user error naming the valid methods). */
struct train_balancer *train_balancer_create(const struct dm_config *cfg, int stages);
void train_balancer_destroy(struct train_balancer *tb);

/* Collective, once at start-up: how the stages share processors (more
 * ranks than CPUs). When they do, profiles become thread CPU time, ranks
 * may take turns computing (parallel.turns), the controller predicts with
 * the sharing, rank 0 says so and records it in the run log (log is NULL
 * on other ranks). */
void train_balancer_share_processors(struct train_balancer *tb, const struct dm_config *cfg,
                                     int threads, struct runlog *log);

/* Collective: after step `step` (0-based) has been logged. Rank 0 folds
 * the step into the controller, logs a finished decision row and, on a
 * decision step, decides; then every rank switches to rank 0's layout at
 * this step boundary (engine_relayout). */
void train_balancer_after_step(struct train_balancer *tb, struct engine *eng,
                               struct runlog *log, const struct step_stats *st, int step);

/* Rank 0: the re-pack plan (balance_controller_repack) on the profile;
 * returns the stage count and its layout in counts. */
int train_balancer_repack(struct train_balancer *tb, const struct step_stats *st, double epsilon,
                          int min_stages, int *counts);

#endif
