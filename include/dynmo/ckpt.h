/* dynmo ckpt: the run log (per-step metrics, per-layer profiles and layout
 * history in one HDF5 file) and, in a later issue, sharded checkpoints.
 *
 * The run log is written by rank 0 alone, serially, and flushed after
 * every step so that a killed run keeps every step it finished. */
#ifndef DYNMO_CKPT_H
#define DYNMO_CKPT_H

#include <stddef.h>
#include "dynmo/core.h"

struct runlog;

/* Creates (truncating) the run log at path and records the configuration
 * text (config_print) as the attribute /config on the root group, plus
 * the attributes dynmo_version and created (ISO time). A file that cannot
 * be created is dm_user_error_local naming the path. */
struct runlog *runlog_create(const char *path, const struct dm_config *cfg);

/* Appends one float value to the 1-D float32 series at `name`
 * (e.g. "/steps/loss"), creating the dataset (chunked, extendible) and
 * its groups on first use. Rows are indexed by call order. */
void runlog_append_scalar(struct runlog *log, const char *name, float value);

/* Appends one row of `ncols` floats to the 2-D float32 dataset `name`
 * ([rows, ncols], e.g. "/layers/fwd_ms" as [step, layer]). ncols must stay
 * the same for a dataset. */
void runlog_append_row(struct runlog *log, const char *name,
                       const float *row, int ncols);

/* Same for int32 rows (e.g. "/layout/history" as [step, stage]). */
void runlog_append_int_row(struct runlog *log, const char *name,
                           const int *row, int ncols);

/* Flushes everything written so far to disk (H5Fflush). */
void runlog_flush(struct runlog *log);
void runlog_close(struct runlog *log);

/* Reads a 1-D float series of a closed run log into a malloc'd array;
 * returns the count, or -1 with err set. For tests and tools. */
long runlog_read_series(const char *path, const char *name, float **values,
                        char *err, size_t errsize);

#endif
