/* The checkpoint file as the schema describes it (checkpoint_schema/v1.def,
 * or a scheme's own version; the extension
 * dyn.def for a scheme's own state, ckpt_dyn.c; the schemes' fragments,
 * dyn_ckpt_* of dynmo/dyn.h):
 * the compiled-in schema tables, the structural validation of an open
 * file, and the serial readers of its metadata and rows. Shared by the
 * collective writer (checkpoint.c), the loader and the offline checker
 * (ckpt_load.c).
 *
 * Internal to src/ckpt. Nothing here calls MPI or writes a file. */
#ifndef DYNMO_CKPT_FILE_H
#define DYNMO_CKPT_FILE_H

#include <stdarg.h>
#include <hdf5.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "dynmo/schema.h"

/* Version 1, the base version of every model whose schemes own none. */
extern const struct ckpt_schema ckpt_schema_v1;
/* The schema of that version (1, or a scheme's own), or NULL for one this
 * dynmo does not read. */
const struct ckpt_schema *ckpt_schema_of_version(long version);
/* The schema a checkpoint of this model is written in. */
const struct ckpt_schema *ckpt_schema_for(const struct gpt_shape *shape);
/* Dataset `name` of a schema, or NULL. */
const struct schema_dataset *ckpt_schema_dataset(const struct ckpt_schema *schema,
                                                 const char *name);

const char *schema_type_name(enum schema_type type);
/* The HDF5 file type written for a dataset or attribute of this type. */
hid_t schema_file_type(enum schema_type type);
/* Bytes of one element (8 for a string: a pointer). */
size_t schema_type_size(enum schema_type type);

/* Values of the named dimensions of one file. */
struct ckpt_dims {
    long layers, block_params, vocab, max_seq, channels, pp, dp, history;
    /* the dimensions the schemes' fragments name (dyn_ckpt_dims), once
     * the model is known */
    int scheme_dims;
    const char *scheme_dim_names[DYN_CKPT_PARTS_MAX];
    long scheme_dim_values[DYN_CKPT_PARTS_MAX];
    long dyn_state;          /* extension dyn.def: /dyn/state's length; -1 without /dyn */
    long units_per_block;    /* extension units.def: 2 with /units (dimension units =
                                2 x layers), 0 without */
};
/* The dimensions of a model's checkpoint (pp, dp and history are the
 * caller's). */
void ckpt_dims_of_shape(struct ckpt_dims *dims, const struct gpt_shape *shape);
/* The value of dimension `name`, or -1 (unknown name, or not yet known). */
long ckpt_dim(const struct ckpt_dims *dims, const char *name);
/* Rank (1 or 2) and extents of a schema dataset under dims; -1 if a
 * dimension is unknown. A dataset whose first extent is 0 is not in a
 * file (v3.def: HDF5 cannot chunk an empty fixed-size dataset). */
int ckpt_dataset_extent(const struct schema_dataset *d, const struct ckpt_dims *dims,
                        hsize_t extent[2]);
/* Whether a file of these dimensions holds dataset d: every dataset but
 * one whose first extent is 0. */
int ckpt_dataset_present(const struct schema_dataset *d, const struct ckpt_dims *dims);

/* Where problems go: the first one is kept as text, each one is also
 * handed to report (may be NULL), and the count grows. Messages are
 * prefixed "checkpoint <path>: ". */
struct ckpt_problems {
    const char *path;
    int count;
    char first[1024];
    void (*report)(void *ctx, const char *problem);
    void *ctx;
};
__attribute__((format(printf, 2, 3)))
void ckpt_problem(struct ckpt_problems *problems, const char *fmt, ...);

/* What the structural check learned about a file. */
struct ckpt_header {
    struct ckpt_dims dims;
    struct gpt_shape shape;     /* its ints set once the attributes are in range, with
                                   the schemes the file holds (dyn_ckpt_file_check) */
    long heads;                 /* /model heads as stored (shape.heads once checked) */
    long schema_version;
    const struct ckpt_schema *schema;   /* of schema_version, once known */
    long world_pp, world_dp, world_size;
    long step, optimizer_steps, lr_schedule_step;
    long batch;                 /* train.batch of the config text; -1 unknown */
    uint64_t seed, train_checksum;
    char dynmo_version[32];
    char created[32];
    char *config_text;          /* dm_alloc'd */
    struct dyn_ckpt_file *schemes;   /* what the file holds of the schemes' fragments */
    char dyn_kind[32];          /* /dyn attribute kind (extension dyn.def), or "" */
};
void ckpt_header_free(struct ckpt_header *header);

/* Opens path read-only (serial driver, no file lock) and checks it against
 * the schema: root and group attributes (types and required values, kind
 * and schema version first: a file of another schema version is reported
 * as that and nothing more), groups, and every dataset's type, shape,
 * chunking and Fletcher32 filter; model attributes for sanity (heads
 * divide channels, block_params = 12C^2 + 13C); the /training positions
 * as dynmo writes them (step = optimizer_steps = lr_schedule_step, each
 * within an int, as train.steps is); train.batch in the config text; and
 * a file named ckpt-<N>.h5 must hold step N. Reports every problem it
 * finds; returns the open file (the caller closes it) or -1 when it could
 * not be opened. *header is filled as far as the file allows. */
hid_t ckpt_open_checked(const char *path, struct ckpt_problems *problems,
                        struct ckpt_header *header);

/* ckpt_open_checked's checks on a file the caller opened read-only (a file
 * image in memory, for the fuzzer): fills *header as far as the file
 * allows and reports every problem. Returns -1 when it stopped early (not
 * a checkpoint, another schema version), 0 when it checked everything;
 * problems->count says whether the file passed. Never closes file. */
int ckpt_check_structure(hid_t file, struct ckpt_problems *problems,
                         struct ckpt_header *header);

/* Reads the small datasets (cursors, layout, history, frozen, sparsity,
 * and /dyn where the file has it) of a file that passed ckpt_open_checked
 * into meta (allocating its arrays) and copies the header's scalars;
 * checks their values (layout sums to the layers, history well formed and
 * ending with the layout, each cursor in [0, step x batch + batch], frozen
 * 0/1, sparsity in [0, 1], the scheme's state by its rules). Returns 0,
 * or -1 after reporting. */
int ckpt_read_meta_from(hid_t file, const struct ckpt_header *header,
                        struct ckpt_meta *meta, struct ckpt_problems *problems);

/* Reads `count` elements of row `row` of the 2-D float dataset `name`
 * (count = its columns) or, with row < 0, the whole 1- or 2-D float
 * dataset into out. A failed read (a Fletcher32 mismatch among them) is
 * reported as corrupt data naming the dataset and row. Returns 0 or -1. */
int ckpt_read_floats(hid_t file, const char *name, long row, size_t count, float *out,
                     struct ckpt_problems *problems);

/* Reads every chunk of every schema dataset (a bounded buffer at a time)
 * so that each Fletcher32 checksum is verified. Returns the problems found. */
int ckpt_read_all(hid_t file, const struct ckpt_header *header,
                  struct ckpt_problems *problems);

/* Checks the model a checkpoint holds against the one being loaded; on a
 * difference writes "model.<key> is X in the checkpoint but Y in this run"
 * (the first differing key) into err and returns -1. */
int ckpt_compare_shape(const struct gpt_shape *file_shape,
                       const struct gpt_shape *run_shape, char *err, size_t errsize);

/* Reads the whole schema dataset `name` of a checked file (its extent
 * from the header's dims) as memory_type into out. Returns 0, or -1 after
 * reporting. */
int ckpt_read_dataset(hid_t file, const struct ckpt_header *header, const char *name,
                      hid_t memory_type, void *out, struct ckpt_problems *problems);

/* ---- the extensions: lines appended to a version's schema ------------- */

/* base with part's groups, attributes and datasets appended (its version
 * is base's): the schema of a file that holds an extension (dyn.def,
 * units.def). base may be extended already; the result lives as long as
 * the process and is the same pointer for the same two. ckpt_dyn.c. */
const struct ckpt_schema *ckpt_schema_append(const struct ckpt_schema *base,
                                             const struct ckpt_schema *part);

/* ---- the extension dyn.def (ckpt_dyn.c): a scheme's own state --------- */

/* base with the lines of checkpoint_schema/dyn.def appended (the group
 * /dyn, its attribute kind, the dataset /dyn/state): the schema of a file
 * that holds a scheme's state. Any base, itself extended or not; the
 * result lives as long as the process. */
const struct ckpt_schema *ckpt_schema_with_dyn(const struct ckpt_schema *base);
/* For the structural check, once the version's schema is known: when the
 * file has /dyn, extends header->schema with dyn.def and sets
 * header->dims.dyn_state from /dyn/state's extent (1 .. DYN_STATE_MAX,
 * reported otherwise). Returns the schema to check against. */
const struct ckpt_schema *ckpt_dyn_extend(hid_t file, struct ckpt_header *header,
                                          struct ckpt_problems *problems);
/* Reads /dyn (kind and state) of a file that has it into meta and checks
 * the values by the scheme's rules (dyn_state_check). Returns 0, or -1
 * after reporting. */
int ckpt_dyn_read(hid_t file, const struct ckpt_header *header, struct ckpt_meta *meta,
                  struct ckpt_problems *problems);
/* The writer's part: /dyn's attribute kind, into the skeleton. */
void ckpt_dyn_write_attributes(hid_t file, const struct ckpt_meta *meta);

/* ---- the extension units.def (ckpt_units.c): a sublayer run's units ---- */

/* base with checkpoint_schema/units.def appended (the group /units, its
 * attribute kind = "sublayer", /units/per_stage and
 * /units/history_per_stage): the schema of a sublayer run's file. */
const struct ckpt_schema *ckpt_schema_with_units(const struct ckpt_schema *base);
/* For the structural check: when the file has /units, extends
 * header->schema with units.def and sets header->dims.units_per_block.
 * Returns the schema to check against. */
const struct ckpt_schema *ckpt_units_extend(hid_t file, struct ckpt_header *header);
/* Reads /units of a file that has it into meta->unit_layout and
 * meta->unit_history (after the /layout arrays: the history's steps and
 * stages are /layout's) and checks them: layouts of the units, the
 * history ending with the current one, and /layout's entries the nearest
 * whole blocks to them (balance_layout_nearest_blocks). Returns 0, or -1
 * after reporting. */
int ckpt_units_read(hid_t file, const struct ckpt_header *header, struct ckpt_meta *meta,
                    struct ckpt_problems *problems);
/* The writer's part: /units' attribute kind, into the skeleton. */
void ckpt_units_write_attributes(hid_t file);

/* Fletcher-32 exactly as HDF5's H5Z_FILTER_FLETCHER32 filter computes it
 * over `bytes` bytes (fletcher32.c gives the definition); the filter
 * stores it little-endian after the chunk. */
uint32_t ckpt_fletcher32(const void *data, size_t bytes);

#endif
