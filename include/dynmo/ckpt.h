/* dynmo ckpt: the run log (per-step metrics, per-layer profiles and layout
 * history in one HDF5 file) and, in a later issue, sharded checkpoints.
 *
 * The run log is written by rank 0 alone, serially, and flushed after
 * every step so that a killed run keeps every step it finished. Its
 * datasets, types, shapes and units are documented in docs/runlog.md; the
 * RUNLOG_* names below are that schema. Nothing here calls MPI. */
#ifndef DYNMO_CKPT_H
#define DYNMO_CKPT_H

#include <stddef.h>
#include "dynmo/core.h"

/* The run log's file name inside a run's out_dir. */
#define RUNLOG_FILE_NAME "runlog.h5"
/* Root attribute "kind" of every dynmo HDF5 file. */
#define RUNLOG_KIND "runlog"
#define CHECKPOINT_KIND "checkpoint"
/* Root attribute "format_version" of a run log. */
#define RUNLOG_FORMAT_VERSION 1

/* The run log schema (docs/runlog.md). One row per optimizer step: */
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
#define RUNLOG_LAYER_STAGE "/layout/stage_of_layer" /* int32 [steps, layers] */
/* Per stage and step (columns: pipeline stages of the run's first world): */
#define RUNLOG_STAGE_BUSY_MS "/stages/busy_ms"    /* float32 [steps, stages] */
#define RUNLOG_STAGE_IDLE_MS "/stages/idle_ms"    /* float32 [steps, stages] */
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
 * e.g. "/layers/fwd_ms" as [step, layer]). ncols must stay the same for a
 * dataset (internal error otherwise). The row is copied. */
void runlog_append_row(struct runlog *log, const char *name,
                       const float *row, int ncols);
void runlog_append_int_row(struct runlog *log, const char *name,
                           const int *row, int ncols);

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

/* ---- reading (any process; for tests and tools) -----------------------
 * Each reader opens the file read-only without HDF5's file lock (so a live
 * run's log can be read), reads, and closes it. On failure (missing file,
 * not HDF5, truncated, no such dataset, wrong rank) they return -1 and write
 * a message naming the file and the problem into err. Returned arrays are
 * dm_alloc'd; the caller frees them with dm_free. Integer datasets are
 * converted to float by the float readers, floats to int by the int ones. */

/* A 1-D dataset: *values gets the rows; returns the count. */
long runlog_read_series(const char *path, const char *name, float **values,
                        char *err, size_t errsize);

/* A 2-D dataset, row-major (rows, *ncols); returns the number of rows. */
long runlog_read_matrix(const char *path, const char *name, float **values,
                        int *ncols, char *err, size_t errsize);
long runlog_read_int_matrix(const char *path, const char *name, int **values,
                            int *ncols, char *err, size_t errsize);

/* One row of a 2-D dataset into out (ncols floats; ncols must match the
 * dataset). Row is 0-based; negative counts from the end (-1: last row).
 * Returns 0, or -1 (also when the row is out of range). This is what
 * `dynmo plan --from-run` uses to read /layers/fwd_ms at one step. */
int runlog_read_row(const char *path, const char *name, long row,
                    float *out, int ncols, char *err, size_t errsize);

/* What runlog_list_datasets reports for each dataset. */
struct runlog_dataset_info {
    char name[256];     /* absolute path, e.g. "/steps/loss" */
    int is_int;         /* 1: integer, 0: floating point */
    int element_bytes;  /* 4 for int32 and float32 */
    int rank;           /* 1 or 2 (others are listed with dims[1] = 0) */
    long dims[2];       /* rows, and columns for 2-D */
};

/* Lists every dataset in the file, sorted by name, into a dm_alloc'd array.
 * Returns the count. */
int runlog_list_datasets(const char *path, struct runlog_dataset_info **infos,
                         char *err, size_t errsize);

/* Reads the root attribute `attr` (e.g. "config"; an integer one such as
 * "format_version" comes back in decimal) into a dm_alloc'd string.
 * Returns 0, 1 when the attribute is absent (*text NULL), or -1. */
int runlog_read_root_attr(const char *path, const char *attr, char **text,
                          char *err, size_t errsize);

/* The root attribute "kind" of a dynmo HDF5 file ("runlog", "checkpoint")
 * into kind, or "" when the file is HDF5 but has no such attribute.
 * Returns 0, or -1 when the file is missing, not HDF5 or damaged. */
int dm_file_kind(const char *path, char *kind, size_t kindsize,
                 char *err, size_t errsize);

#endif
