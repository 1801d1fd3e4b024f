/* dynmo ckpt: the run log (per-step metrics, per-layer profiles and layout
 * history in one HDF5 file), the layout history (struct layout_history),
 * the checkpoint (one HDF5 file per checkpoint, logical and per block,
 * written by all ranks at once through parallel HDF5 and resharded on
 * load) and the checkpoint directory's policy (names, keep, `latest`, the
 * resume=auto scan, `next_world`).
 *
 * The run log is written by rank 0 alone, serially, and flushed after
 * every step so that a killed run keeps every step it finished. Its
 * datasets, types, shapes and units are documented in docs/runlog.md; the
 * RUNLOG_* names below are that schema. The run log never calls MPI; the
 * checkpoint's save, load and resume are collective over the communicator
 * they are given, and its offline readers (ckpt_check_file,
 * ckpt_read_info) and ckpt_write_next_world are not. This module decides
 * nothing about training: when to save or resume, and what a failure
 * means to the run, are the caller's. */
#ifndef DYNMO_CKPT_H
#define DYNMO_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>
#include "dynmo/core.h"
#include "dynmo/model.h"

struct dyn_ckpt_states;   /* dynmo/dyn.h */

/* The run log's file name inside a run's out_dir. */
#define RUNLOG_FILE_NAME "runlog.h5"
/* Root attribute "kind" of every dynmo HDF5 file. */
#define RUNLOG_KIND "runlog"
#define CHECKPOINT_KIND "checkpoint"
/* Root attribute "format_version" of a run log. */
#define RUNLOG_FORMAT_VERSION 1

/* The run log schema (docs/runlog.md). The dynamic schemes' datasets
 * (per layer, per block of a scheme, per cell) are their declared signals
 * (dynmo/dyn.h), named by the scheme that declares them. One row per
 * optimizer step: */
#define RUNLOG_STEP_LOSS "/steps/loss"            /* float32 [steps] */
#define RUNLOG_STEP_LR "/steps/lr"                /* float32 [steps] */
#define RUNLOG_STEP_GRAD_NORM "/steps/grad_norm"  /* float32 [steps] */
#define RUNLOG_STEP_MS "/steps/step_ms"           /* float32 [steps] */
#define RUNLOG_STEP_TOKENS_PER_S "/steps/tokens_per_s" /* float32 [steps] */
#define RUNLOG_STEP_PEAK_RSS_MB "/steps/peak_rss_mb"   /* float32 [steps] */
#define RUNLOG_STEP_RANKS "/steps/ranks"          /* int32 [steps] */
/* Per block and step (columns: the model's transformer blocks): */
#define RUNLOG_LAYER_FWD_MS "/layers/fwd_ms"      /* float32 [steps, layers] */
#define RUNLOG_LAYER_BWD_MS "/layers/bwd_ms"      /* float32 [steps, layers] */
#define RUNLOG_LAYER_WGRAD_MS "/layers/wgrad_ms"  /* float32 [steps, layers]: zb only, the
                                                     weight parts' share of bwd_ms */
#define RUNLOG_LAYER_UPDATE_MS "/layers/update_ms" /* float32 [steps, layers]: the block's share
                                                     of the step's end, once a step */
/* Only with balance.units = sublayer: per unit (block j's attention 2j,
 * its MLP 2j + 1), what the balancer takes (step_stats.unit_*): */
#define RUNLOG_UNIT_FWD_MS "/units/fwd_ms"        /* float32 [steps, 2 layers] */
#define RUNLOG_UNIT_BWD_MS "/units/bwd_ms"        /* float32 [steps, 2 layers] */
#define RUNLOG_UNIT_UPDATE_MS "/units/update_ms"  /* float32 [steps, 2 layers] */
#define RUNLOG_UNIT_WGRAD_MS "/units/wgrad_ms"    /* float32 [steps, 2 layers]: zb only */
#define RUNLOG_LAYOUT_HISTORY "/layout/history"  /* int32 [steps, stages]: units per stage
                                                    (blocks, or halves with sublayer) */
#define RUNLOG_LAYOUT_CHUNKS "/layout/chunks"    /* int32 [steps, stages x virtual]: interleaved
                                                    only, units per chunk, chunk c of stage s
                                                    at c stages + s */
#define RUNLOG_STEP_BUBBLE "/steps/bubble_ratio"  /* float32 [steps] */
#define RUNLOG_STEP_IMBALANCE "/steps/imbalance"  /* float32 [steps] */
/* Per stage and step (columns: pipeline stages of the run's first world): */
#define RUNLOG_STAGE_BUSY_MS "/stages/busy_ms"    /* float32 [steps, stages] */
#define RUNLOG_STAGE_IDLE_MS "/stages/idle_ms"    /* float32 [steps, stages] */
#define RUNLOG_STAGE_UPDATE_MS "/stages/update_ms" /* float32 [steps, stages]: the step's end,
                                                     part of busy_ms */
/* Only with run.trace_from: one row per instruction of each traced step and
 * rank (step_stats.trace, pipe.h). */
#define RUNLOG_TRACE_EVENTS "/trace/events"       /* float32 [events, 8] */
/* One row per balancing decision: step, predicted ms/step of the current
 * layout, predicted ms/step of the proposal, measured ms of the decision
 * step, applied (0/1), blocks moved, measured ms of the next step, bytes. */
#define RUNLOG_BALANCE_DECISIONS "/balance/decisions" /* float32 [decisions, 8] */
/* One row per validation pass: */
#define RUNLOG_EVAL_STEP "/eval/step"             /* int32 [evals] */
#define RUNLOG_EVAL_LOSS "/eval/loss"             /* float32 [evals] */

/* ---- writing (rank 0 only) ------------------------------------------- */

struct runlog;

/* Creates (truncating) the run log at path and records on the root group
 * the attributes kind = "runlog", format_version, config (the text of
 * config_print), dynmo_version and created (ISO 8601 UTC). Returns a handle
 * the caller closes with runlog_close. A file that cannot be created is
 * dm_user_error_local naming the path and HDF5's reason. Not collective:
 * only rank 0 calls it. */
struct runlog *runlog_create(const char *path, const struct dm_config *cfg);
/* The same with another root attribute kind: "simulation" for `dynmo
 * simulate`'s files, shaped like a run log (docs/simulate.md). */
#define SIMULATION_KIND "simulation"
struct runlog *runlog_create_kind(const char *path, const struct dm_config *cfg,
                                  const char *kind);

/* Records how the stages shared processors (world_stage_sharing) as the
 * root attributes stage_groups (int32, one per stage), group_cores
 * (float64, one per group) and group_turns (int32, one value: 1 when the
 * stages took turns, parallel.turns), which `dynmo plan --from-run`
 * predicts with; groups = 0 (a processor per stage) removes them. shares
 * (non-NULL only when other replicas' ranks took turns on the same CPUs
 * and cores were rounded up to whole ones for the turns): each group's
 * share of its CPUs counting those ranks, as group_shares (float64, one
 * per group), which `dynmo simulate` predicts the run's replicas with.
 * Rank 0 only. */
#define RUNLOG_ATTR_STAGE_GROUPS "stage_groups"
#define RUNLOG_ATTR_GROUP_CORES "group_cores"
#define RUNLOG_ATTR_GROUP_TURNS "group_turns"
#define RUNLOG_ATTR_GROUP_SHARES "group_shares"
void runlog_set_sharing(struct runlog *log, int stages, const int *group, int groups,
                        const double *cores, const double *shares, int turns);

/* Opens an existing run log for appending (a run restarted after a re-pack
 * or a signal continues its log). Each dataset continues after its last
 * row when it is first appended to. A missing file, a file that is not a
 * run log, or a damaged one is dm_user_error_local naming the path. */
struct runlog *runlog_open_append(const char *path);

/* Appends one value to the 1-D series `name` (an absolute path such as
 * "/steps/loss"), creating the dataset (chunked, extendible) and its
 * groups on first use. Rows are indexed by call order. Appending a float
 * to an int dataset, or the reverse, is an internal error. Costs a few
 * microseconds: the dataset handle is cached. */
void runlog_append_scalar(struct runlog *log, const char *name, float value);
void runlog_append_int_scalar(struct runlog *log, const char *name, int value);

/* Appends one row of `ncols` values to the 2-D dataset `name` ([rows, ncols],
 * e.g. "/layers/fwd_ms" as [step, layer]). A row of other width than the
 * dataset's is adapted (runlog_resume_at). The row is copied. */
void runlog_append_row(struct runlog *log, const char *name,
                       const float *row, int ncols);
void runlog_append_int_row(struct runlog *log, const char *name,
                           const int *row, int ncols);

/* Row i of every dataset but the events' (under /eval, /trace/events,
 * /balance/decisions) is step i + 1. runlog_resume_at makes every such
 * dataset in the file hold `start` rows (cut back, or filled with NaN, 0 or
 * a scheme's count's declared filler: a step this log did not see); one created later
 * starts with filler rows up to the current step. runlog_end_step closes a
 * step: a per-step dataset that got no row gets filler. A row narrower
 * than its dataset (fewer stages after a re-pack) gets filler cells, a
 * wider one (more stages after a resume) widens the dataset, the earlier
 * rows' new cells filler. So every per-step dataset has one row per step
 * of the run, across any resume. */
void runlog_resume_at(struct runlog *log, long start);
void runlog_end_step(struct runlog *log);

/* Rows in dataset `name` so far, or -1 if it does not exist yet. */
long runlog_rows(struct runlog *log, const char *name);

/* Shrinks dataset `name` to `rows` rows (rows <= current), for a run that
 * resumes from a checkpoint older than its log's last step. */
void runlog_truncate(struct runlog *log, const char *name, long rows);

/* Writes everything appended so far to the file (H5Fflush): after it
 * returns, a killed process leaves a readable file with these rows. Call
 * once per step. */
void runlog_flush(struct runlog *log);

/* Flushes, closes every dataset and the file, and frees the handle. */
void runlog_close(struct runlog *log);

/* ---- reading (any process; for tools and tests) ------------------------
 * A run log (or a simulation's file, or any file shaped like one) is read
 * through a struct runlog_file, opened once. runlog_open_read walks the
 * file's HDF5 metadata before HDF5 reads any of it (dm_h5_check_metadata:
 * HDF5 1.10 crashes, loops or allocates without limit on damaged
 * metadata, and a run log has no checksums), opens it read-only without
 * HDF5's file lock (so a live run's log can be read: a read sees the steps
 * flushed so far), checks its root attributes kind ("runlog" or
 * "simulation" when present) and format_version (1 when present), and
 * lists its datasets: those of the schema must have its rank (1 under
 * /steps and /eval, 2 elsewhere), a numeric type and, for /trace/events
 * and /balance/decisions, RUNLOG_EVENT_COLUMNS columns, and none may hold
 * more than RUNLOG_MAX_CELLS cells. Every read checks the name, rank and
 * size against that listing. On any failure (missing file, not HDF5,
 * truncated, damaged, not a run log, no such dataset, wrong rank) a
 * function returns -1 (NULL) and writes one message naming the file and
 * the problem into err. Returned arrays are dm_alloc'd; the caller frees
 * them with dm_free. Integer datasets are converted to float by the float
 * readers, floats to int by the int ones. Not collective; no MPI. */
#define RUNLOG_EVENT_COLUMNS 8              /* /trace/events, /balance/decisions */
#define RUNLOG_MAX_CELLS (1L << 31)         /* cells of one dataset a reader takes */
#define RUNLOG_MAX_ATTR 65536               /* entries of a numeric root attribute */
#define RUNLOG_MAX_LAYERS 65536             /* model.layers' largest value */

/* Starts the HDF5 library with its automatic error printing off.
 * Idempotent; every reader and writer here calls it first, and a program
 * that forks readers (the run-log fuzz harness's fork server) calls it
 * before it forks. */
void dm_h5_init(void);

/* What the listing says of each dataset. */
struct runlog_dataset_info {
    char name[256];     /* absolute path, e.g. "/steps/loss" */
    int is_int;         /* 1: integer, 0: floating point or other */
    int is_number;      /* 1: integer or floating point */
    int element_bytes;  /* 4 for int32 and float32 */
    int rank;           /* 1 or 2 (others are listed with dims[1] = 0) */
    long dims[2];       /* rows, and columns for 2-D */
};

struct runlog_file;
struct runlog_file *runlog_open_read(const char *path, char *err, size_t errsize);
/* Closes the file and frees f. Harmless on NULL. */
void runlog_close_read(struct runlog_file *f);
/* A command's fatal problem with the run log f: closes it and ends with
 * exit 2 and one message, "PREFIX: " and the formatted text. */
__attribute__((noreturn, format(printf, 3, 4)))
void runlog_file_fail(struct runlog_file *f, const char *prefix, const char *fmt, ...);
const char *runlog_file_path(const struct runlog_file *f);
/* The root attribute kind, "" when the file has none. */
const char *runlog_file_kind(const struct runlog_file *f);
/* The datasets, sorted by name (owned by f); returns the count. */
int runlog_file_list(const struct runlog_file *f, const struct runlog_dataset_info **infos);
/* Dataset `name` of the listing, or NULL when the file has none. */
const struct runlog_dataset_info *runlog_file_dataset(const struct runlog_file *f,
                                                      const char *name);
/* Rows of the longest /steps/ series: the steps the log holds. */
long runlog_file_steps(const struct runlog_file *f);

/* A 1-D dataset: *values gets the rows; returns the count. */
long runlog_file_series(struct runlog_file *f, const char *name, float **values, char *err,
                        size_t errsize);
long runlog_file_int_series(struct runlog_file *f, const char *name, int **values, char *err,
                            size_t errsize);
/* A 2-D dataset, row-major (rows, *ncols); returns the number of rows. */
long runlog_file_matrix(struct runlog_file *f, const char *name, float **values, int *ncols,
                        char *err, size_t errsize);
long runlog_file_int_matrix(struct runlog_file *f, const char *name, int **values, int *ncols,
                            char *err, size_t errsize);
/* One row of a 2-D dataset into out (ncols floats; ncols must match the
 * dataset). Row is 0-based; negative counts from the end (-1: last row).
 * Returns 0, or -1 (also when the row is out of range). */
int runlog_file_row(struct runlog_file *f, const char *name, long row, float *out, int ncols,
                    char *err, size_t errsize);
/* The root attribute `name` (e.g. "config"; an integer one such as
 * "format_version" comes back in decimal) into a dm_alloc'd string.
 * Returns 0, 1 when the attribute is absent (*text NULL), or -1. */
int runlog_file_attr(struct runlog_file *f, const char *name, char **text, char *err,
                     size_t errsize);
/* A numeric root attribute list of at most RUNLOG_MAX_ATTR entries
 * (stage_groups, group_cores) into a dm_alloc'd *values: integers only for
 * the first, integers or floats converted for the second. Returns the
 * entry count, 0 when the attribute is absent, or -1. */
long runlog_file_attr_ints(struct runlog_file *f, const char *name, int **values, char *err,
                           size_t errsize);
long runlog_file_attr_doubles(struct runlog_file *f, const char *name, double **values,
                              char *err, size_t errsize);
/* The run's configuration: the defaults, then each "section.key = value"
 * line of the root attribute config through config_set (each key's own
 * type and range), then the schemes' relations the readers divide by
 * (dyn_check_log_config).
 * Returns 0, 1 when the file has no config (*cfg the defaults), or -1 with
 * the line or key in err. */
int runlog_file_config(struct runlog_file *f, struct dm_config *cfg, char *err,
                       size_t errsize);

/* /layout/history, checked row by row: a filler row (all 0: a step the log
 * does not hold) or the blocks of stages 0..S-1, each 1 to `layers`, then
 * zeros, summing to `layers` (model.layers; with layers <= 0, the first
 * layout's total). */
struct runlog_layouts {
    int *counts;        /* (rows, width) blocks per stage */
    int *stages;        /* (rows) stages of each row; 0 for a filler row */
    long rows;
    int width;          /* the most stages of any segment */
    int layers;         /* what every layout sums to */
};
/* Returns 0, 1 when the file has no /layout/history (*out empty), or -1
 * with err naming the row, its step, the stage and the count. */
int runlog_file_layouts(struct runlog_file *f, int layers, struct runlog_layouts *out,
                        char *err, size_t errsize);
void runlog_layouts_free(struct runlog_layouts *l);

/* One-call readers by path: open, read, close (as the runlog_file_*). */
long runlog_read_series(const char *path, const char *name, float **values,
                        char *err, size_t errsize);
long runlog_read_matrix(const char *path, const char *name, float **values,
                        int *ncols, char *err, size_t errsize);
long runlog_read_int_matrix(const char *path, const char *name, int **values,
                            int *ncols, char *err, size_t errsize);
int runlog_read_row(const char *path, const char *name, long row,
                    float *out, int ncols, char *err, size_t errsize);
/* Lists every dataset in the file, sorted by name, into a dm_alloc'd array.
 * Returns the count. */
int runlog_list_datasets(const char *path, struct runlog_dataset_info **infos,
                         char *err, size_t errsize);
int runlog_read_root_attr(const char *path, const char *attr, char **text,
                          char *err, size_t errsize);

/* The root attribute "kind" of a dynmo HDF5 file ("runlog", "checkpoint")
 * into kind, or "" when the file is HDF5 but has no such attribute; the
 * file is checked as dm_h5_open_readonly checks it first. Returns 0, or
 * -1 when the file is missing, not HDF5 or damaged. */
int dm_file_kind(const char *path, char *kind, size_t kindsize,
                 char *err, size_t errsize);

/* ---- layout history -----------------------------------------------------
 * Which layout (blocks per stage) held from which step: the one type the
 * engine keeps while it trains, the checkpoint saves and loads (struct
 * ckpt_meta's history) and the tools print. An entry is added only when
 * the layout changes. Rows are `layers` wide so that entries of worlds
 * with different stage counts fit one array. Not collective, no I/O.
 *
 * The struct owns its arrays (dm_alloc'd) once pushed to or allocated;
 * a struct assignment borrows them: read such a copy, never push to it or
 * free it. */
struct layout_history {
    int count;          /* entries */
    int layers;         /* row width: the model's transformer blocks */
    long *step;         /* (count) step from which entry k held; non-decreasing */
    int *stages;        /* (count) pipeline stages of entry k */
    int *layout;        /* (count, layers) blocks per stage of entry k, zero
                           past stages[k] */
    long capacity;      /* entries the arrays have room for */
};

/* An empty history of rows `layers` wide (no allocation). */
void layout_history_init(struct layout_history *h, int layers);

/* Frees the arrays and zeroes h. Harmless on a zeroed or empty one. */
void layout_history_free(struct layout_history *h);

/* Appends (step, layout of `stages` stages) unless the last entry already
 * holds exactly that layout. Returns 1 when it appended, 0 when the layout
 * was unchanged. The layout must be valid (stages in [1, layers], each
 * count >= 1, summing to layers) and step must not precede the last
 * entry's: anything else is an internal error (a caller's bug). The
 * layout is copied. */
int layout_history_push(struct layout_history *h, long step, const int *layout, int stages);

/* Entry k's row (layers ints, blocks per stage then zeros); k in [0, count). */
const int *layout_history_entry(const struct layout_history *h, int k);

/* The index of the entry that held at `step`: the last one whose step is
 * <= step, or -1 when step comes before the first entry. */
int layout_history_at(const struct layout_history *h, long step);

/* dst becomes an owning copy of src (dst's arrays are freed first; dst
 * must be zeroed or owning). */
void layout_history_copy(struct layout_history *dst, const struct layout_history *src);

/* For readers that fill the arrays themselves (the checkpoint loader):
 * frees h and gives it `count` zeroed entries of rows `layers` wide. */
void layout_history_alloc(struct layout_history *h, int layers, int count);

/* Whether a history read from outside (a file) is well formed: each entry
 * a layout of `layers` blocks on 1..layers stages, zero-padded, and steps
 * non-decreasing. Returns 0, or -1 with the first problem in err. */
int layout_history_check(const struct layout_history *h, char *err, size_t errsize);

/* ---- checkpoints --------------------------------------------------------
 * The format is checkpoint_schema/README.md (prose) and
 * checkpoint_schema/v1.def, or the version a scheme owns for its models
 * (mixture of experts': v3.def, and v2.def, what an older dynmo wrote, is
 * still read), with the lines of the schemes' fragments (the
 * machine-readable lines that the writer, the loader and `dynmo
 * check-ckpt` all follow; dyn_ckpt_* of dynmo/dyn.h); docs/checkpoints.md
 * shows it with h5dump and h5py and explains atomicity and resume.
 *
 * A checkpoint directory holds complete checkpoints ckpt-<step>.h5, at most
 * one ckpt-<step>.h5.tmp being written, `latest`, a one-line text file
 * naming the newest complete checkpoint (the completion marker), and after
 * a re-pack `next_world`. A .tmp file is never loaded. The HDF5 files are
 * written by src/ckpt/checkpoint.c and read by src/ckpt/ckpt_load.c; the
 * directory around them (names, keep, latest, the resume scan,
 * next_world) is src/ckpt/ckpt_dir.c's, which never calls HDF5. */
#define CHECKPOINT_SCHEMA_VERSION 1   /* the base version: a model whose schemes own none */
#define CHECKPOINT_LATEST_NAME "latest"

/* Everything a checkpoint holds besides the model's tensors.
 *
 * On save the caller fills the fields marked (save); every rank passes the
 * same values, except frozen, of which only the entries of the rank's own
 * blocks are read. On load every field is filled and the arrays are
 * dm_alloc'd; ckpt_meta_free releases them. */
struct ckpt_meta {
    long step;              /* (save) optimizer steps completed: the run
                               resumes with step index `step` (0-based) */
    long optimizer_steps;   /* (save) AdamW updates applied: the next one
                               uses bias correction t = optimizer_steps + 1 */
    long lr_schedule_step;  /* (save) the next step's learning rate is
                               lr_at_step(cfg, lr_schedule_step) */
    uint64_t seed;          /* (save) the run's seed. The RNG is counter-based
                               (dm_hash64(seed, stream, index)): seed and
                               step are its whole state */
    uint64_t train_checksum;/* (save) token_file.checksum of the training
                               data, 0 when not recorded */
    char *config_text;      /* (save) config_print text, or NULL */
    int pp, dp;             /* (save) the world: stages x replicas */
    long *data_cursor;      /* (save) (dp) next global sample index of each
                               data-parallel replica */
    int *layout;            /* (save) (pp) blocks per stage, the current layout */
    struct layout_history history; /* (save) the layout history so far (may be
                               empty, or a struct copy of the caller's own:
                               save only reads it); its layers must be the
                               model's. Load: ends with the current layout */
    int *unit_layout;       /* (pp) a run of balance.units = sublayer: units per
                               stage (block j's attention 2j, its MLP 2j + 1), the
                               current layout, saved as /units (checkpoint_schema/
                               units.def); NULL: whole blocks. Save: then layout
                               and history are ignored and written as the nearest
                               whole blocks to these (balance_layout_nearest_blocks,
                               which needs pp <= layers), and a block whose halves
                               two stages hold is written by its attention's holder,
                               whose slab must hold the MLP's floats too
                               (engine_gather_split_blocks). Load: NULL when the
                               file has no /units */
    struct layout_history unit_history; /* with unit_layout: the history in units
                               (rows 2 x layers wide), as history (save: may be
                               empty, borrowed). Load: the same steps and stages
                               as history, ending with unit_layout */
    int *frozen;            /* (layers) 1 = block frozen. Save: OR'ed with each
                               block's own frozen flag; may be NULL. Load: the
                               file's flags (each loaded block's flag is set) */
    float *sparsity;        /* (layers) fraction of exactly-zero weights in the
                               block's matrices (pruned weights are zero),
                               computed by save; load only */
    char dyn_kind[32];      /* (save) dyn.kind of the scheme whose own state
                               follows; load: "" when the file has no /dyn */
    double *dyn_state;      /* (save) (dyn_state_count) that scheme's state
                               across steps (dyn_state_save), the same on every
                               rank, saved as /dyn/state (checkpoint_schema/
                               dyn.def); NULL with count 0: the scheme keeps
                               none, and the file has no /dyn. Load: checked by
                               the scheme's rules (dyn_state_check) */
    long dyn_state_count;
    /* Filled by load and ckpt_read_info only: */
    struct gpt_shape shape; /* the model the checkpoint holds, with its schemes'
                               extensions (dyn_ckpt_file_check) */
    struct dyn_ckpt_states *scheme_states; /* the schemes' blocks' state beyond the slabs
                               (mixture of experts: the selection bias and the last
                               step's counts; dyn_ckpt_read_states), or NULL; each
                               loaded block gets its own already */
    int schema_version;
    char dynmo_version[32]; /* of the writer */
    char created[32];       /* ISO 8601 UTC */
    int allocated;          /* 1: the arrays above belong to this struct */
};

/* Frees the arrays of a meta filled by load or ckpt_read_info and zeroes
 * it. Harmless on a zeroed struct; an internal error on a caller-filled
 * (save) meta. Not collective. */
void ckpt_meta_free(struct ckpt_meta *meta);

/* Writes checkpoint DIR/ckpt-<meta->step>.h5. Collective over comm, whose
 * size must be meta->pp * meta->dp; this rank is pipeline stage `stage`
 * and data-parallel replica `dp_rank`, and model holds exactly that
 * stage's blocks under meta->layout (the embedding on stage 0, the head on
 * stage pp-1). All ranks create the file and every dataset together
 * (parallel HDF5 over MPI-IO); then, independently, replica 0 of each
 * stage writes its blocks' rows (params, Adam m and v), stage 0's
 * replica 0 the embedding, the last stage's replica 0 the head, and rank
 * 0 of comm the small datasets (cursors, layout, history, and the frozen
 * flags and sparsity gathered from the stages). Each chunk is written
 * whole (H5Dwrite_chunk) with its Fletcher32 checksum computed as HDF5's
 * filter does, so every HDF5 reader verifies it. The layout history
 * written is meta's, with
 * (step, layout) appended when its last entry differs from the current
 * layout, so it is never empty. Gradients are not saved.
 *
 * Atomic: the file is written as ckpt-<step>.h5.tmp, flushed, closed,
 * fsynced (rank 0), renamed, and the directory fsynced; then DIR/latest
 * is replaced (written to latest.tmp, fsynced, renamed, directory
 * fsynced) to name it. Only then are older complete checkpoints beyond
 * the newest `keep` (keep <= 0: keep all) and stale .tmp files deleted, so
 * the previous complete checkpoint survives any crash before that point.
 * DIR is created if missing.
 *
 * Returns 0 on every rank, or -1 on every rank with the same message in
 * err (naming the file or directory and the reason: cannot create the
 * directory, cannot rename, fsync failed); the caller decides whether that
 * is fatal (dm_user_error(err)). A failure inside HDF5 while the file is
 * open (a full disk, say) cannot be agreed on without risking a hang in
 * HDF5's collective calls, so it takes the fatal path (all ranks abort,
 * status 1), leaving only the .tmp. Inconsistent meta across ranks is an
 * internal error. path_out (may be NULL) receives the complete file's path.
 * All waits of our own are non-blocking collectives polled with MPI_Test
 * and sched_yield; HDF5's collective calls block inside MPI-IO. */
int ckpt_save(const char *dir, int keep, const struct gpt *model,
              const struct ckpt_meta *meta, int stage, int dp_rank, MPI_Comm comm,
              char *path_out, size_t path_out_size, char *err, size_t errsize);

/* ckpt_save of a stage that holds its blocks in `chunks` models (models[0
 * .. chunks-1], interleaved 1F1B's chunks: each a contiguous range, the
 * embedding in chunk 0 of stage 0, the head in the last chunk of the last
 * stage); meta->layout counts a stage's blocks over all its chunks. The
 * file is the same as a save of those blocks by one model a stage would
 * write. ckpt_save is this with one chunk. Collective over comm. */
int ckpt_save_chunks(const char *dir, int keep, const struct gpt *models, int chunks,
                     const struct ckpt_meta *meta, int stage, int dp_rank, MPI_Comm comm,
                     char *path_out, size_t path_out_size, char *err, size_t errsize);

/* Loads checkpoint `path` into a model built for ANY world: each rank reads
 * the rows of the blocks it holds (model->first_block ..), and the
 * embedding and head tensors (params, m, v) if it holds the embedding or
 * the head, whatever world and layout wrote the file; gradients are
 * zeroed and each loaded block's frozen flag is set from the file. meta is
 * filled on every rank (free with ckpt_meta_free). State that belongs to
 * a scheme rather than to a block is the caller's to restore from meta:
 * the scheme's own state from meta->dyn_state (dyn_state_restore, when
 * meta->dyn_kind is the run's), gpt.frozen_prefix from meta->frozen, and
 * prune masks with block_prune(blk, NULL, ...) for blocks whose meta->sparsity is > 0
 * (pruned weights are saved as exact zeros).
 * Collective over comm (any size); every rank opens the file on its own
 * read-only (no MPI-IO), so a failure on one rank cannot hang the others.
 *
 * Validates: the file exists, is HDF5 and not truncated; kind and schema
 * version; the completion attribute; every group, attribute and dataset of
 * the schema with its type and shape; the model config against
 * model->shape (the message names the differing key: "model.channels is
 * 64 in the checkpoint but 128 in this run"); the layout and cursors; and
 * the Fletcher32 checksum of every chunk it reads (a flipped byte is
 * reported as a corrupt file naming the dataset). A name ending in .tmp is
 * refused as incomplete.
 *
 * Returns 0 on every rank, or -1 on every rank with the same message in
 * err, "checkpoint <path>: <problem>" (the lowest failing rank's message;
 * ranks agree through a polled non-blocking reduction and broadcast). On
 * failure the model's tensors may be partly overwritten and meta is left
 * zeroed. */
int ckpt_load_try(const char *path, struct gpt *model, struct ckpt_meta *meta,
                  MPI_Comm comm, char *err, size_t errsize);

/* ckpt_load_try, and on failure dm_user_error with its message: every rank
 * exits with status 2, rank 0 prints. Collective. */
void ckpt_load(const char *path, struct gpt *model, struct ckpt_meta *meta,
               MPI_Comm comm);

/* `ckpt.resume=auto`: loads the checkpoint that DIR/latest names. If
 * latest is missing, names a missing file, or that file fails to load
 * (corrupt, truncated, incomplete, wrong schema), it falls back to the
 * newest other complete ckpt-<step>.h5 in DIR that loads, and rank 0 says
 * so on stdout (what was wrong, which file it uses instead). .tmp files
 * are never considered. Returns 1 when a checkpoint was loaded (its path
 * in loaded_path, may be NULL), 0 when DIR holds no complete checkpoint
 * (a fresh start; incomplete .tmp files are mentioned). When complete
 * checkpoints exist but none loads, or one was written for a different
 * model, dm_user_error names each file and its problem (status 2):
 * a model mismatch is a configuration mistake, never a reason to fall
 * back. Collective over comm. */
int ckpt_resume_auto(const char *dir, struct gpt *model, struct ckpt_meta *meta,
                     MPI_Comm comm, char *loaded_path, size_t loaded_path_size);

/* The path of checkpoint `step` in dir: "<dir>/ckpt-<step>.h5". */
void ckpt_path(char *buf, size_t size, const char *dir, long step);

/* ---- the next world of a job chain (docs/jobs.md) ----------------------- */

/* File name of the next world's description inside the checkpoint directory. */
#define CHECKPOINT_NEXT_WORLD_NAME "next_world"

/* Writes DIR/next_world, the description the job scripts (jobscripts/)
 * read after dynmo exits with the re-pack status: the next world has pp x
 * dp ranks with `layout` (pp blocks-per-stage counts, each >= 1) and
 * resumes from checkpoint `step` (ckpt-<step>.h5 in DIR). The format is
 * docs/jobs.md's, key = value lines:
 *
 *     # written by dynmo <version> on re-pack: the next world of this job chain
 *     ranks = <pp * dp>
 *     pp = <pp>
 *     dp = <dp>
 *     layout = <n1,n2,...>
 *     step = <step>
 *     checkpoint = ckpt-<step>.h5
 *
 * written atomically (dm_write_file_atomic: a reader sees the whole file
 * or none). Call it after the checkpoint it names is complete (ckpt_save
 * returned 0). Not collective: one rank calls it. Returns 0, or -1 with a
 * message naming the file and the reason in err; invalid arguments are an
 * internal error. */
int ckpt_write_next_world(const char *dir, int pp, int dp, const int *layout, long step,
                          char *err, size_t errsize);

/* At start-up, before the first step, by every rank: whether DIR can take
 * the run's checkpoints. Creates it if needed (mkdir -p), and checks that
 * it is a directory, that a file can be created in it (a probe, removed;
 * a read-only mount fails here although access(2) may pass), that
 * DIR/latest, if present, is a regular file, and that the file system has
 * at least need_bytes free (the caller's estimate of one checkpoint).
 * Returns 0, or -1 with a message naming the key, the path and the
 * problem. Not collective. */
int ckpt_dir_check_usable(const char *dir, uint64_t need_bytes, char *err, size_t errsize);

/* ---- offline readers (any process; not collective, no MPI) ------------- */

/* Reads a checkpoint's metadata (everything but the tensors) into meta
 * (free with ckpt_meta_free), validating the file's structure as load
 * does but without a model to compare against and without reading the
 * tensors. Returns 0, or -1 with "checkpoint <path>: <problem>" in err. */
int ckpt_read_info(const char *path, struct ckpt_meta *meta, char *err, size_t errsize);

/* Validates a file against the schema: groups, attributes and their
 * values, datasets with type, shape, chunking and the Fletcher32 filter,
 * the completion attribute, the consistency of layout, history, cursors
 * and per-block state, and, if read_data, every chunk's checksum (reading
 * the whole file once, a bounded buffer at a time). Calls report(ctx, text)
 * once per problem found (it keeps going after a problem where it can)
 * and returns the number of problems, 0 for a valid checkpoint. */
int ckpt_check_file(const char *path, int read_data,
                    void (*report)(void *ctx, const char *problem), void *ctx);

/* ckpt_check_file on a file held in memory: image[0..size) as an HDF5
 * file image (never changed, never read past; a copy is opened). `name`
 * is what the problems call it. The same checks and the same messages,
 * with "not an HDF5 file" for an image HDF5 cannot open. For the fuzzer
 * and its regression replays; not collective, no MPI. */
int ckpt_check_image(const void *image, size_t size, const char *name, int read_data,
                     void (*report)(void *ctx, const char *problem), void *ctx);

#endif
