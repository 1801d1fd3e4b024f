/* HDF5 discipline shared by the run log and the checkpoint: every HDF5 call
 * goes through a check macro that reports rank, file:line, the call and
 * HDF5's own error text. HDF5's automatic printing to stderr is switched off
 * (dm_h5_init) so that the only message a user sees is ours.
 *
 * Internal to src/ckpt and src/tools; nothing here is part of a file format. */
#ifndef DYNMO_CKPT_H5UTIL_H
#define DYNMO_CKPT_H5UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <hdf5.h>
#include "dynmo/ckpt.h" /* dm_h5_init */

/* Writes a one-line description of the current HDF5 error stack into buf
 * (the API call, its message and the innermost cause), then clears the
 * stack. Writes "no HDF5 error recorded" when the stack is empty. */
void dm_h5_error_text(char *buf, size_t size);

/* The file the next HDF5 calls write (a checkpoint's temporary, the run
 * log), named when the system refuses a write. */
void dm_h5_set_file_context(const char *path);

/* Fatal path for a failed HDF5 call: "<call> failed: <HDF5 text>", status
 * 1; but a write the system refused (no space, a quota, a read-only file
 * system, an I/O error) is "cannot write <file>: <reason>", status 2. */
__attribute__((noreturn))
void dm_h5_fail(const char *file, int line, const char *call);

/* Evaluates an HDF5 call (herr_t, hid_t, htri_t or hssize_t); a negative
 * result is an internal error reported with file:line, the call's text and
 * HDF5's message. Yields the call's value. */
#define DM_H5(call)                                                          \
    __extension__({                                                          \
        __typeof__(call) dm_h5_result = (call);                              \
        if (dm_h5_result < 0) dm_h5_fail(__FILE__, __LINE__, #call);         \
        dm_h5_result;                                                        \
    })

/* For readers that report failures instead of dying: on a negative result,
 * writes "<call> failed: <HDF5 text>" into (err, errsize) and jumps to
 * `label`. Yields the call's value otherwise. */
#define DM_H5_TRY(call, err, errsize, label)                                 \
    __extension__({                                                          \
        __typeof__(call) dm_h5_result = (call);                              \
        if (dm_h5_result < 0) {                                              \
            dm_h5_describe_failure((err), (errsize), #call);                 \
            goto label;                                                      \
        }                                                                    \
        dm_h5_result;                                                        \
    })
void dm_h5_describe_failure(char *err, size_t errsize, const char *call);

/* Opens an existing file read-only for inspection without taking HDF5's
 * file lock, so that a run log that a live job is writing can be read.
 * Returns the file id, or -1 with a message in err naming the path and the
 * problem: missing, not HDF5, truncated, damaged metadata in HDF5's
 * default format (dm_h5_check_metadata, which every run log is checked
 * by), a damaged global heap in its first 4 MiB (dm_h5_check_global_heaps,
 * for the newer format of checkpoints) or otherwise unreadable. */
hid_t dm_h5_open_readonly(const char *path, char *err, size_t errsize);

/* The check HDF5 1.10.8 skips before it reads a string attribute: every
 * global heap collection ("GCOL") in bytes[0..size), the start of a file
 * of file_size bytes, must hold objects that fit in it and end with a
 * free-space object of the size that remains. A damaged one makes HDF5
 * copy past the collection (a crash) or loop forever. Returns 0, or -1
 * with "damaged: ..." naming the collection's byte offset in err. */
int dm_h5_check_global_heaps(const void *bytes, size_t size, uint64_t file_size, char *err,
                             size_t errsize);

/* The metadata a reader of the file at path reaches (h5check.c), walked
 * before HDF5 1.10 reads it: superblock, object headers and their
 * messages, groups, the global heap objects of string attributes, each
 * dataset's chunk index and chunks. Accepts HDF5's default file format as
 * dynmo's run logs are written in it (superblock 0 or 1, version 1 object
 * headers, symbol-table groups; integer, IEEE float and string data;
 * chunked with deflate, shuffle or Fletcher32, contiguous or compact) and
 * requires every dataset's extent to be stored, so that a reader may
 * allocate it. Returns 0; 1 for a file in HDF5's newer format (superblock
 * version 2 or 3, as dynmo's checkpoints are), whose metadata carries
 * checksums HDF5 verifies and which this does not walk; or -1 with
 * "<path>: damaged: <structure> at byte N: <problem>" in err. Never calls
 * HDF5. */
int dm_h5_check_metadata(const char *path, char *err, size_t errsize);
/* 1 when the file at path is an HDF5 file in the newer format (superblock
 * version 2 or 3), else 0. */
int dm_h5_newer_format(const char *path);

/* Writes a scalar variable-length UTF-8 string attribute (h5py reads it as
 * str). Fatal on HDF5 failure. */
void dm_h5_write_string_attr(hid_t loc, const char *name, const char *value);
void dm_h5_write_int_attr(hid_t loc, const char *name, long value);

/* Reads a scalar string attribute (variable or fixed length) or integer
 * attribute (formatted in decimal) into a NUL-terminated dm_alloc'd buffer
 * (*text, dm_free). Returns 0, 1 when the attribute does not exist (*text
 * NULL), or -1 with a message in err. */
int dm_h5_read_attr_text(hid_t loc, const char *name, char **text,
                         char *err, size_t errsize);

/* 1 when every component of the absolute path (e.g. "/steps/loss")
 * exists in file, 0 otherwise (HDF5's error stack is cleared). */
int dm_h5_path_exists(hid_t file, const char *path);

#endif
