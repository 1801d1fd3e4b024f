/* The checkpoint directory (ckpt_dir.c) as the HDF5 writer sees it, and the
 * one loader entry that the directory's resume scan calls back into
 * (ckpt_load.c). The split: ckpt_dir.c names files, lists, prepares,
 * publishes, prunes and chooses what resume=auto loads, never touching
 * HDF5; checkpoint.c writes and ckpt_load.c reads the files, never
 * choosing a name or scanning a directory.
 *
 * Internal to src/ckpt. Functions that touch the directory are called by
 * one rank (rank 0 of the save's communicator) and are not collective;
 * they return 0, or -1 with a message naming the file and the reason. */
#ifndef DYNMO_CKPT_DIR_H
#define DYNMO_CKPT_DIR_H

#include <stddef.h>
#include <mpi.h>
#include "dynmo/ckpt.h"

/* "<dir>/ckpt-<step>.h5.tmp": where checkpoint `step` is written before it
 * is published. */
void ckpt_tmp_path(char *buf, size_t size, const char *dir, long step);

/* 1 when path names a temporary (ends in ".tmp"): never loaded. */
int ckpt_is_temporary_name(const char *path);

/* The step of a file name (no directory) "ckpt-<digits>.h5" (tmp = 0) or
 * "ckpt-<digits>.h5.tmp" (tmp = 1); -1 for any other name. */
long ckpt_dir_parse_name(const char *name, int tmp);

/* The steps of the complete checkpoints (tmp = 0) or of the temporaries
 * (tmp = 1) in dir, newest first, into a dm_alloc'd *steps (the caller
 * frees it; NULL when dir cannot be read). Returns the count, or -1 when
 * dir cannot be read. */
int ckpt_dir_list_steps(const char *dir, int tmp, long **steps);

/* Before a save of checkpoint `step`: creates dir if needed (mkdir -p),
 * checks that it is writable, and removes a stale ckpt-<step>.h5.tmp. */
int ckpt_dir_prepare(const char *dir, long step, char *err, size_t errsize);

/* After every rank has written and closed ckpt-<step>.h5.tmp: fsyncs it,
 * renames it to ckpt-<step>.h5, fsyncs dir, replaces `latest` to name it
 * (the completion marker, dm_write_file_atomic), and only then prunes to
 * `keep` (ckpt_dir_prune). A failure before `latest` moved leaves the
 * previous complete checkpoint the one that `latest` names. */
int ckpt_dir_publish(const char *dir, int keep, long step, char *err, size_t errsize);

/* After `latest` names `newest`: keeps it and the newest keep - 1 complete
 * checkpoints before it (keep <= 0: all), deletes older ones and every
 * stale .tmp. Checkpoints after `newest` (left by a run this one did not
 * continue from) are left alone. A file that cannot be deleted loses
 * nothing: a warning, never an error. */
void ckpt_dir_prune(const char *dir, int keep, long newest);

/* How a load ended, for the resume scan: the file is unusable (fall back
 * to an older one), or it holds another model (a configuration mistake
 * that resume=auto must not paper over). */
enum ckpt_load_outcome {
    CKPT_LOAD_OK = 0,
    CKPT_LOAD_BAD_FILE = 1,
    CKPT_LOAD_MODEL_MISMATCH = 2,
};

/* ckpt_load_try's work with the outcome kept apart (ckpt_load.c):
 * collective over comm, the same outcome and message on every rank; meta
 * is filled on success and left zeroed otherwise. */
enum ckpt_load_outcome ckpt_load_agreed(const char *path, struct gpt *model,
                                        struct ckpt_meta *meta, MPI_Comm comm, char *err,
                                        size_t errsize);

#endif
