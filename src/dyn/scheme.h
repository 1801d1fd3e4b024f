/* The descriptor of one dynamic scheme: everything dynmo knows about a
 * scheme is what its descriptor declares, and every descriptor is in the
 * one table of dyn.c (docs/architecture.md, "Adding a dynamic scheme").
 *
 * A descriptor declares its config keys and their rules, its extension of
 * the blocks (the model's hook interface, dynmo/block_ext.h), its hooks
 * around the step, its named per-layer signals (dynmo/dyn.h) and its part
 * of the checkpoint. Any of them may be absent. Only src/dyn includes this
 * header; the other modules see the schemes through dynmo/dyn.h. */
#ifndef DYNMO_DYN_SCHEME_H
#define DYNMO_DYN_SCHEME_H

#include <mpi.h>
#include <stdarg.h>
#include "dynmo/block_ext.h"
#include "dynmo/dyn.h"
#include "dynmo/world.h"

struct gpt_ext_ops;
struct gpt_ext;

/* A scheme's part of the checkpoint (dyn.h, "the schemes' parts of a
 * checkpoint"). Its fragment's /model attributes are "model keys" when
 * model_keys is set: a file has every such scheme's model keys as soon as
 * one of them is in its model (an off scheme writes its neutral values);
 * its other lines (its own) are in a file only when it is. */
enum { DYN_CKPT_RAW_BYTES = 256, DYN_SCHEMES_LIMIT = 16 };
struct dyn_ckpt_part {
    const struct ckpt_schema *schema;   /* checkpoint_schema/<scheme>.def, or NULL */
    int model_keys;
    /* Schema versions of its own (NULL-terminated, the one it writes
     * first; NULL: none): a file of such a version is the scheme's, every
     * line in the version's schema, and its rows, the blocks' own, come
     * from rows (base set). versions_text: how the message about an
     * unknown version names them. owns_attr: which of the version's
     * attributes are the scheme's (stored through store). */
    const struct ckpt_schema *const *versions;
    const char *versions_text;
    int (*owns_attr)(const char *object, const char *name);
    /* Whether the scheme is in shape's model; in a file's (from what rd
     * sees, the model keys' presence aside; NULL: only through them). */
    int (*in_shape)(const struct gpt_shape *shape);
    int (*in_file)(const struct dyn_ckpt_reader *rd);
    /* Before the attributes: a format of its own lines this dynmo does not
     * read is a problem (reported, -1). NULL: none. */
    int (*check_format)(const struct dyn_ckpt_reader *rd);
    /* Its attributes (model keys, own ones when in shape). */
    void (*write_attrs)(const struct gpt_shape *shape, const struct dyn_ckpt_writer *w);
    /* A file's values of its attributes into raw (DYN_CKPT_RAW_BYTES,
     * zeroed first), then checked and put into shape: 0, or -1 after
     * reporting. */
    void (*store)(void *raw, const char *object, const char *name, long long value,
                  const char *text);
    int (*check)(const void *raw, struct gpt_shape *shape, const struct dyn_ckpt_reader *rd);
    /* Its dimensions (NULL-terminated) and their values for shape. */
    const char *const *dims;
    long (*dim)(const struct gpt_shape *shape, const char *name);
    /* The rows of its datasets that hold blk's floats in a file of
     * `version` (dyn_ckpt_block_rows); with a version of its own, every
     * row of the block. writes_sharded: dyn_ckpt_writes_sharded's rule. */
    int (*rows)(const struct gpt_shape *shape, long version, const struct block *blk,
                struct dyn_ckpt_rows *out, int max);
    int (*writes_sharded)(const struct gpt_shape *shape, int dp_rank);
    /* Its blocks' state beyond their slabs: written per block, read whole
     * (checked; a blob it owns, NULL: none), applied to a loaded block,
     * freed. */
    void (*write_state)(const struct gpt_shape *shape, const struct block *blk,
                        const struct dyn_ckpt_state_writer *w);
    int (*read_state)(const struct gpt_shape *shape, const struct dyn_ckpt_reader *rd,
                      void **state);
    void (*apply_state)(const void *state, const struct gpt_shape *shape, struct block *blk);
    void (*free_state)(void *state);
    /* Its resume rule over the two models (either may lack it). */
    int (*compare)(const struct gpt_shape *file, const struct gpt_shape *run, char *err,
                   size_t errsize);
};

/* A combination a scheme refuses: the other scheme (its name) and why,
 * or NULL. */
struct dyn_refusal {
    const char *scheme;
    const char *why;
};

/* A descriptor's signals: a static array of struct dyn_signal and its
 * length, counted by the compiler. */
#define DYN_SIGNALS(array) \
    .signals = (array), .signal_count = (int)(sizeof(array) / sizeof((array)[0]))

struct dyn_scheme {
    const char *name;       /* its name: messages, the signals' owner */
    /* The dyn.kind value that selects it (freezing, early exit, pruning;
     * at most one such scheme runs), or NULL for a scheme that the model
     * keys select (active). */
    const char *kind;
    int (*active)(const struct dm_config *cfg);
    /* Its keys, "section.key" or "section.*", NULL-terminated: what
     * config_was_set asks about for it (config.c keeps their table and
     * defaults). */
    const char *const *keys;
    /* Its rules over its keys and its refusals of other schemes: a user
     * error (exit 2) naming the key, run by dyn_config_validate for every
     * scheme in table order, active or not (a scheme refuses its keys
     * when it is off). */
    void (*check)(const struct dm_config *cfg);
    /* Whether its blocks under cfg couple the tokens of a micro-batch
     * (dyn_batch_coupled); NULL: they do not. */
    int (*couples_batch)(const struct dm_config *cfg);
    /* The schemes it does not combine with (ended by an entry without a
     * scheme): dyn_config_validate refuses (exit 2) a config that runs it
     * and one of them, right after its check, naming both schemes' keys
     * (switch_key below). */
    const struct dyn_refusal *refuses;
    /* What it is called and how a user turns it off, for that message:
     * its key and the key's value that runs none of it ("model.mod_every",
     * "0"; a dyn.kind scheme: NULL, NULL, for dyn.kind and none). NULL
     * title: its name. */
    const char *title;
    const char *switch_key;
    const char *switch_off;

    /* Its extension of the blocks, or NULL, and how a config's parameters
     * of it go into a model's shape (called when the scheme is active;
     * dyn_shape_from_config). */
    const struct gpt_ext_ops *ext;
    void (*add_to_shape)(const struct dm_config *cfg, struct gpt_shape *shape);
    /* Its parameters on the ranks of replica `replica` of a stage, when it
     * splits them (expert parallelism), and what one of its blocks keeps
     * on its rank beyond its slab, in bytes (activations of the
     * micro-batches held at once, the parts' sums), for layer's block of
     * micro-batches of micro_B sequences. NULL: nothing. */
    void (*shard)(const struct dm_config *cfg, struct gpt_shape *shape, int replica);
    double (*block_memory)(const struct dm_config *cfg, const struct gpt_shape *shape, int layer,
                           int micro_B);
    /* One line on what it makes of shape's model ("mixture of depths: every
     * 2 blocks ..."), or none (buf left empty): inspect's. */
    void (*describe_shape)(const struct gpt_shape *shape, char *buf, size_t size);

    /* Whether layer `layer` of shape is one of its blocks (the columns of
     * its per-block signals); NULL: every layer. */
    int (*owns)(const struct gpt_shape *shape, int layer);
    /* Its signals (dyn.h) and its note on a step from their rows (NULL:
     * none), e.g. "MoD 25.0% tokens". */
    const struct dyn_signal *signals;
    int signal_count;           /* DYN_SIGNALS(array) sets both */
    void (*step_note)(const struct dm_config *cfg, const struct dyn_signal_row *rows, int count,
                      double tokens, char *buf, size_t size);
    /* Its summary of a run log's datasets for inspect (NULL: the generic
     * summary of the signals that declare one), and its rules over a
     * stored config that the readers of logs compute with (NULL: none):
     * 0, or -1 with the problem (dyn_check_log_config). */
    void (*summarise_log)(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w);
    int (*check_log_config)(const struct dm_config *cfg, char *problem, size_t size);

    /* Its part of the checkpoint, or NULL. */
    const struct dyn_ckpt_part *ckpt;

    /* Hooks around the step (dyn.h): create returns the scheme's state
     * (collective over env->pipeline_comm where the scheme talks MPI);
     * the others take the rank's models[0..count), its chunks under
     * interleaved (dyn_before_step), and act on all of them in one call. */
    void *(*create)(const struct dm_config *cfg, const struct dyn_env *env);
    void (*destroy)(void *state, struct gpt *model);
    void (*before_step)(void *state, struct gpt *const *models, int count, int step);
    void (*after_reduce)(void *state, struct gpt *const *models, int count, int step,
                         const double *block_sumsq);
    void (*describe)(const void *state, struct gpt *const *models, int count, char *buf,
                     size_t size);
    /* Optional: before a validation pass, between steps (after the
     * update), collective as before_step. */
    void (*before_eval)(void *state, struct gpt *const *models, int count);
    /* Optional (NULL: the scheme keeps no state across steps beyond the
     * slabs): the scheme's own state as doubles, for checkpoints.
     * state_size is the count; save writes that many; restore gets what a
     * checkpoint held and returns 0, or -1 with err set when it does not
     * fit this run (another window, another depth). */
    long (*state_size)(const void *state);
    void (*state_save)(const void *state, double *out);
    int (*state_restore)(void *state, const double *in, long n, char *err, size_t errsize);
    /* With state_size: dyn_state_check's rules for this scheme's state. */
    int (*state_check)(const double *in, long n, int layers, char *err, size_t errsize);
};

/* The table (dyn.c): the built-in schemes, then those registered with
 * dyn_register_scheme. */
int dyn_scheme_count(void);
const struct dyn_scheme *dyn_scheme_at(int i);
/* Adds a scheme to the table (a test's, or a build's own), before the
 * config is read; its name must be new. Not thread-safe: call it at
 * start-up (a constructor). */
void dyn_register_scheme(const struct dyn_scheme *scheme);
/* Whether cfg runs the scheme: dyn.kind names it, or its active says so. */
int dyn_scheme_active(const struct dyn_scheme *scheme, const struct dm_config *cfg);
/* A reader's problem, formatted (vsnprintf), to its callback: the one
 * text buffer of dyn_ckpt_problem and dyn_log_problem. */
void dyn_send_problem(void (*send)(void *ctx, const char *text), void *ctx, const char *fmt,
                      va_list ap);
/* A problem with a checkpoint, formatted, to rd->problem. */
__attribute__((format(printf, 2, 3)))
void dyn_ckpt_problem(const struct dyn_ckpt_reader *rd, const char *fmt, ...);
/* A problem with a run log's contents, formatted, to rd->fail (which does
 * not return). */
__attribute__((noreturn, format(printf, 2, 3)))
void dyn_log_problem(const struct dyn_log_reader *rd, const char *fmt, ...);
/* The first `rows` rows of a run log's float (int) dataset, which must
 * have at least that many rows of `cols` columns (else dyn_log_problem);
 * the caller dm_frees them. */
float *dyn_log_floats(const struct dyn_log_reader *rd, const char *dataset, long rows, int cols);
int *dyn_log_ints(const struct dyn_log_reader *rd, const char *dataset, long rows, int cols);
/* The rows a block of a scheme keeps after its dense (or shared) floats:
 * one row of group's datasets, the ordinal-th, its floats from offset. */
int dyn_ckpt_one_row(struct dyn_ckpt_rows *out, int max, const char *group, long ordinal,
                     size_t offset, size_t floats);

/* The row of signal among rows, or NULL (a scheme's step_note). */
const struct dyn_signal_row *dyn_signal_row_of(const struct dyn_signal_row *rows, int count,
                                               const struct dyn_signal *signal);
/* Whether any of keys (NULL-terminated, as in struct dyn_scheme) was set. */
int dyn_keys_set(const struct dm_config *cfg, const char *const *keys);

#endif
