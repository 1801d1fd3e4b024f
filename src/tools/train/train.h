/* The pieces of `dynmo train` and `dynmo bench` (src/tools/train*.c,
 * bench.c), private to src/tools: the trainer orchestrates world, pipe,
 * balance and ckpt; each piece here carries numbers between them and
 * decides nothing the modules below decide. */
#ifndef DYNMO_TOOLS_TRAIN_H
#define DYNMO_TOOLS_TRAIN_H

#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"

/* ---- set-up (train_setup.c) ------------------------------------------------ */

struct train_args {
    const char *config_path;
    int warmup_steps, timed_steps;   /* bench only */
    int migration;                   /* bench --migration */
};

/* The command line of train (is_bench 0) or bench: --config FILE, then
 * section.key=value overrides; the config is validated. User errors exit 2. */
void train_parse_args(int argc, char **argv, struct dm_config *cfg, struct train_args *args,
                      int is_bench);
/* parallel.threads, or the node's cores shared among its ranks. */
int train_threads_for_rank(const struct dm_config *cfg);
/* Collective: selects the backend train.device names on every rank
 * (backend_open; cuda loads the plugin). A problem on any rank (no
 * plugin, no GPU) is one message and status 2 on all. Every scheme runs
 * on every device (docs/gpu.md). */
void train_open_backend(const struct dm_config *cfg);
/* The layout balance.initial names (balance_layout_from_spec with the
 * units' parameter counts), in units; user error naming the key. */
void train_initial_layout(int *counts, const struct dm_config *cfg, int stages);
/* What balance.units = sublayer runs so far: a dense model (no scheme
 * but freezing and early exit by the softmax confidence, no extension of the blocks but those that stay inside
 * the attention: hash attention), balanced by any balance.method,
 * writing and resuming checkpoints (with ckpt.dir, parallel.pp <=
 * model.layers: the file's /layout needs a block per stage) and
 * re-packing. Anything else is a user error naming what cannot split
 * yet. */
void train_check_units(const struct dm_config *cfg);
/* balance.units of cfg, and the units of its model.layers blocks. */
enum balance_units train_units(const struct dm_config *cfg);
int train_unit_count(const struct dm_config *cfg);
/* Each unit's parameters (dm_alloc'd, train_unit_count entries; the
 * caller frees) and, when matrix is not NULL, its prunable matrix
 * weights (likewise). */
double *train_unit_params(const struct dm_config *cfg, double **matrix);

/* Collective, before the first step: every path the run will write is
 * usable on every rank (run.out_dir created and writable; ckpt.dir
 * created, writable, its `latest` a file, room for a checkpoint by an
 * estimate). A problem on any rank is one message and status 2 on all. */
void train_check_paths(const struct dm_config *cfg);

/* Collective (the same answer on every rank): user error when the busiest
 * stage of `layout` would need more memory than this node has per rank,
 * by an estimate of weights, optimizer state and activations, before any
 * of it is allocated. */
void train_check_memory(const struct dm_config *cfg, const int *layout, int stages);

/* The token files and their loaders. */
struct train_data {
    struct token_file train_file, val_file;
    struct loader train, val;
    int have_val;                   /* train.eval_every > 0 */
};
/* Collective: every rank opens and checks the token files; a problem on
 * any rank is one message and status 2 on all. */
void train_open_data(struct train_data *d, const struct dm_config *cfg);
void train_close_data(struct train_data *d);

/* ---- the run log and the report (train_log.c), rank 0 ------------------- */

/* Opens <run.out_dir>/runlog.h5, creating the directory: a new log, or,
 * on a restart at step `start`, the old one with every per-step dataset
 * cut back to it. *width: per-stage columns (the first world's stages). */
struct runlog *train_open_runlog(const char *path, const struct dm_config *cfg, long start,
                                 int stages, int *width);
/* One step's run-log rows and, every run.log_every steps, its line. */
void train_log_step(struct runlog *log, const struct dm_config *cfg, int step,
                    const struct step_stats *st, double tokens_per_step, double mean_ms,
                    int stages, int width);

/* The end-of-run table: per stage, compute max / min over the logged
 * steps and their ratio, mean wait and bubble (STYLE.md: the max/min
 * ratio is the product). */
struct stage_totals {
    double *compute_max, *compute_min, *wait_sum, *compute_sum;
    double step_sum;
    int steps;
};
void stage_totals_init(struct stage_totals *t, int stages);
void stage_totals_add(struct stage_totals *t, const struct step_stats *st, int stages);
void stage_totals_print(const struct stage_totals *t, int stages);
void stage_totals_free(struct stage_totals *t);

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

/* ---- checkpoints (train_ckpt.c) ------------------------------------------- */

/* Whether cfg may load a checkpoint (ckpt.resume a path, or auto with a
 * ckpt.dir): engine_create then defers the weights to train_resume. */
int train_may_resume(const struct dm_config *cfg);

/* Collective: resumes per ckpt.resume ("none"; "auto": the newest complete
 * checkpoint of ckpt.dir, if any; or a path), resharding onto the engine's
 * layout; checks the seed and the step against cfg (user errors); replaces
 * *history with the checkpoint's entries of this stage count and the
 * current layout (struct layout_history, ckpt.h). When nothing is loaded, initialises the weights the
 * engine deferred. The training file's checksum must be the one the
 * checkpoint recorded (user error naming both, unless
 * ckpt.allow_new_data = 1; a checkpoint that recorded none, 0, passes).
 * Returns the steps the checkpoint had done (the first
 * step to run), 0 for a fresh start. */
long train_resume(struct engine *eng, const struct dm_config *cfg, uint64_t train_checksum,
                  struct layout_history *history);

/* Collective: writes checkpoint <ckpt.dir>/ckpt-<steps_done>.h5 of the
 * running job, with the training file's checksum, (ckpt_save: atomic, keeps ckpt.keep); user error on failure.
 * The path goes to path_out. */
void train_save(struct engine *eng, const struct dm_config *cfg, uint64_t train_checksum,
                const struct layout_history *history, long steps_done, char *path_out,
                size_t path_out_size);

#endif
