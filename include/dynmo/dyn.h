/* dynmo dyn: the dynamic schemes (mixture of experts, hash-sparse
 * attention, mixture of depths, layer freezing, early exit, gradual global
 * magnitude pruning), each one descriptor in the one table of src/dyn/dyn.c
 * (src/dyn/scheme.h; a build or a test may add its own with
 * dyn_register_scheme). What the other modules see of them is this
 * header: the model's shape with the schemes' extensions of the blocks,
 * the config's validation, the schemes' named per-layer signals and how
 * the readers of run logs summarise and draw them, the schemes' parts of a
 * checkpoint, and the hooks around the step of the scheme dyn.kind names
 * (freeze, early_exit, prune), which the pipeline engine calls on every
 * rank:
 *
 *   dyn_before_step   at a step boundary, before any micro-batch: a scheme
 *                     may change the model (prune weights, freeze blocks);
 *   (inside a block)  the scheme's state lives in the blocks' slabs (frozen
 *                     flag, masks, CSR) and in struct gpt (exit control), so
 *                     block_forward / block_backward honour it;
 *   dyn_after_reduce  after the step's gradient reduction, with every
 *                     block's global gradient sum of squares (the same
 *                     numbers on every rank): decisions made here are
 *                     deterministic and identical everywhere;
 *   dyn_before_eval   before a validation pass, after the step's update
 *                     (early exit shares the updated LM head).
 *
 * The schemes that model keys select (mixture of experts, hash attention,
 * mixture of depths) change the blocks themselves through their
 * extension (dynmo/block_ext.h) and have no step hooks. A scheme never
 * looks at the layout or the balancer: those only see the profiled times
 * that its changes produce. Every decision depends only on
 * the config, the seed, the step and the model's numbers, never on timing,
 * so static and balanced runs compute the same bits. */
#ifndef DYNMO_DYN_H
#define DYNMO_DYN_H

#include <mpi.h>
#include "dynmo/core.h"
#include "dynmo/model.h"

struct dyn;

/* What the engine tells a scheme about where it runs. pipeline_comm holds
 * the S stage ranks of this data-parallel replica in stage order (a
 * scheme that needs the whole model, such as global pruning, talks over
 * it; replicas hold identical weights and decide identically). */
struct dyn_env {
    MPI_Comm pipeline_comm;
    int stage, stages;
};

/* The model cfg describes: gpt_shape_from_config's shape with each active
 * scheme's extension of the blocks (in the table's order). */
struct gpt_shape dyn_shape_from_config(const struct dm_config *cfg);

/* The model on the ranks of data-parallel replica `replica` of a stage:
 * dyn_shape_from_config's, with the parameters a scheme splits over the
 * stage's replicas (parallel.ep) split for that replica's rank. */
struct gpt_shape dyn_shape_for_rank(const struct dm_config *cfg, int replica);
/* What the schemes keep for layer's block on its rank beyond its slab, in
 * bytes (activations of train.micro_batches micro-batches of micro_B
 * sequences held at once, parts' sums): train's memory estimate. */
double dyn_block_memory(const struct dm_config *cfg, const struct gpt_shape *shape, int layer,
                        int micro_B);

/* Each scheme's line on shape's model (what inspect prints of a
 * checkpoint), handed to emit one by one. */
void dyn_describe_shape(const struct gpt_shape *shape,
                        void (*emit)(void *ctx, const char *line), void *ctx);

/* The validation pass of a config: config_validate's checks, then every
 * scheme's rules over its keys and its refusals of other schemes, in the
 * table's order (dyn.c), then dyn.kind against the schemes. The first
 * problem is a user error (exit 2) naming the key. Not collective. */
void dyn_config_validate(const struct dm_config *cfg);
/* Whether cfg runs a scheme whose blocks' results depend on which tokens
 * share a micro-batch (tokens compete for room): an evaluation must then
 * run training's micro-batch. */
int dyn_batch_coupled(const struct dm_config *cfg);

/* Builds the scheme dyn.kind names ("none", "freeze", "early_exit",
 * "prune"); user error for an unknown kind (dyn_config_validate checked
 * its values). */
struct dyn *dyn_create(const struct dm_config *cfg, const struct dyn_env *env);
void dyn_destroy(struct dyn *dyn);
const char *dyn_kind_name(const struct dyn *dyn);

/* The hooks take the rank's models together: models[0..count) are its
 * chunks in chunk order (parallel.schedule = interleaved: v of them, the
 * blocks of virtual stages stage, S + stage, ...; otherwise one), each at
 * a place of its own for the call. */

/* Collective over pipeline_comm (once, whatever count): before step
 * `step` (0-based) runs. */
void dyn_before_step(struct dyn *dyn, struct gpt *const *models, int count, int step);
void dyn_before_eval(struct dyn *dyn, struct gpt *const *models, int count);

/* Not collective: after the gradient reduction of step `step`, with
 * block_sumsq[l] the global sum of squared gradients of block l
 * (layers entries, identical on every rank). */
void dyn_after_reduce(struct dyn *dyn, struct gpt *const *models, int count, int step,
                      const double *block_sumsq);

/* One line for the step's progress output ("frozen 3/32", "sparsity
 * 52.0%", "exited 41%"), or an empty string. */
void dyn_describe(const struct dyn *dyn, struct gpt *const *models, int count, char *buf,
                  size_t size);

/* The scheme's own state across steps (freezing's gradient-norm window),
 * the same on every rank, for checkpoints: dyn_state_size doubles (0 when
 * the scheme keeps none: its state is all in the slabs), written by
 * dyn_state_save. dyn_state_restore takes what a checkpoint of the same
 * dyn.kind held: 0, or -1 with a reason in err when it does not fit this
 * run (the caller then starts the scheme's state afresh, as a checkpoint
 * without it does). Call restore before the first dyn_before_step. */
long dyn_state_size(const struct dyn *dyn);
void dyn_state_save(const struct dyn *dyn, double *out);
int dyn_state_restore(struct dyn *dyn, const double *in, long n, char *err, size_t errsize);

/* ---- signals -------------------------------------------------------------
 * What a scheme measures per layer, step by step, declared as a named list
 * by its descriptor: the engine gathers every active scheme's signals into
 * the step's profile (pipe/stats.c), the run log writes each as the
 * dataset it names, and inspect and report read them by walking the list
 * (docs/runlog.md has the datasets), and simulate's cost model reads the
 * states that signals declare a cost role for. None of them names a
 * scheme. */

/* What inspect prints of a signal's dataset. */
enum dyn_signal_summary {
    DYN_SUMMARY_NONE = 0,   /* nothing beyond the listing of datasets */
    DYN_SUMMARY_MEAN = 1,   /* its mean over the steps and columns (NaN rows left out) and
                               the column with the largest mean over the steps */
};

/* What a signal's value means for its block's cost: the state that
 * `dynmo simulate`'s cost model fits the block's times to
 * (docs/simulate.md). Each role has its features in the fit; a scenario
 * file's columns and a simulation's state datasets are the declaring
 * signals' names (dyn_signal.cost_name, cost_dataset). */
enum dyn_cost_role {
    DYN_COST_NONE = 0,       /* not a state of the cost */
    DYN_COST_TOKEN_SHARE,    /* share of the tokens reaching the block that it computes (the
                                rest left the model), in [0, 1]: features a, a^2 */
    DYN_COST_SPARSITY,       /* pruned share of its matrices, in [0, 1]: CSR past
                                dyn.csr_sparsity, and its density there */
    DYN_COST_FROZEN,         /* 1: no weight gradient and no update (a prefix of blocks):
                                the fit's second class */
    DYN_COST_TILE_SHARE,     /* attention tiles visited, as a share of the most any block of
                                the run visited: feature t */
    DYN_COST_ROUTED_SHARE,   /* share of the micro-batch's tokens routed through the block,
                                in [0, 1]: features d, d^2 */
    DYN_COST_BUSIEST_RANK,   /* its busiest expert rank's load over the mean rank's, in [0,
                                DYN_COST_BUSIEST_MAX] (0: a block without experts):
                                feature g, and the expert exchange's rows */
    DYN_COST_ROLES,
};
/* The largest busiest-rank load: at most ep times the mean, and ep is at
 * most the experts. */
#define DYN_COST_BUSIEST_MAX 1024.0

struct dyn_log_reader;

/* A routed MLP: each token through `choices` of `units` MLPs of hidden
 * width `hidden`, `units_per_rank` of them on one rank (what `dynmo
 * simulate --hardware` prices for the busiest-rank role). */
struct dyn_routed_mlp {
    double units, hidden, choices, units_per_rank;
};

/* The columns of a signal's row. */
enum dyn_signal_columns {
    DYN_SIGNAL_LAYERS = 0,   /* one per layer of the model */
    DYN_SIGNAL_BLOCKS = 1,   /* one per block of the scheme, in layer order */
    DYN_SIGNAL_CELLS = 2,    /* cells (dyn_signal.cells) per block of the scheme, block-major */
};

/* How the step's value of a column combines every rank's (value, weight). */
enum dyn_signal_combine {
    DYN_COMBINE_SUM = 0,         /* the sum over every rank: counts over micro-batches and
                                    replicas */
    DYN_COMBINE_REPLICA0 = 1,    /* replica 0's: a block's state, the same on every replica
                                    (or already summed over them) */
    DYN_COMBINE_REPLICA_MEAN = 2,/* the mean over the replicas of each replica's value */
    DYN_COMBINE_RATIO = 3,       /* the values' sum over the weights' sum, every rank (0
                                    without weight) */
    DYN_COMBINE_PER_FORWARD = 4, /* replica 0's over the step's forwards (micro-batches x
                                    replicas) */
    DYN_COMBINE_BUSIEST = 5,     /* over the ranks with a weight: the largest value over
                                    their mean (0 when all are 0) */
};

struct dyn_signal {
    const char *dataset;    /* the run log's dataset, "/mod/tokens" */
    const char *label;      /* its name in tables and figures */
    const char *unit;       /* what one value counts: "tokens", "share", "tiles" */
    const char *meaning;    /* one line: what it says about the block */
    enum dyn_signal_columns columns;
    enum dyn_signal_combine combine;
    int is_int;             /* an int32 dataset; float32 otherwise */
    int filler;             /* an int dataset's value for a step not measured (floats: NaN) */
    /* Whether a run of cfg writes it (NULL: whenever its scheme runs). */
    int (*written)(const struct dm_config *cfg);
    /* DYN_SIGNAL_CELLS: the cells of each block. */
    int (*cells)(const struct gpt_shape *shape);
    /* This rank's value of block i of model, cell by cell, and a weight
     * (RATIO, BUSIEST); a count since the last read is zeroed. NULL: the
     * signal is derived by readers from another dataset, not gathered. */
    void (*read)(struct gpt *model, int i, double *value, double *weight);
    /* How inspect summarises the dataset in a run log when its scheme
     * has no summarise_log of its own (DYN_SUMMARY_NONE: only listed). */
    enum dyn_signal_summary summary;
    /* report's heat map of it beside the cost map (label NULL: none): the
     * label and unit of the figure, whether a log of cfg has it (NULL:
     * whenever the dataset is there), and one step's row of the dataset
     * `source` (NULL: its own) as one value per layer of shape, a block
     * the scheme does not own left as it is (NaN, blank). NULL
     * to_layers: the row is one value per layer already. */
    const char *figure_label, *figure_unit, *source;
    int (*figure_of)(const struct dm_config *cfg);
    void (*to_layers)(const struct dm_config *cfg, const struct gpt_shape *shape,
                      const float *row, float *layers);
    /* Its part in simulate's cost model (DYN_COST_NONE: none): the role,
     * the state's name (a scenario's column, "active"), the dataset a
     * simulation writes the state to (one value per layer), and the
     * value of a block that the scheme leaves as it is (a layer it does
     * not own, a run without the scheme). cost_of_log: the state of every
     * layer of shape at each of the first `rows` steps of the log rd reads,
     * (rows, layers) floats the caller dm_frees, a layer the scheme does
     * not own neutral; NULL when the log has none. NULL cost_of_log: the
     * signal's own dataset, its columns spread onto the scheme's blocks. */
    enum dyn_cost_role cost;
    const char *cost_name, *cost_dataset;
    float neutral;
    float *(*cost_of_log)(const struct dyn_log_reader *rd, const struct gpt_shape *shape,
                          long rows);
    /* The state of one of its blocks at 0-based step `step` of a run of
     * cfg, from the config alone (what `dynmo simulate --hardware` prices
     * when it has no run); NULL: neutral. */
    float (*cost_of_config)(const struct dm_config *cfg, int step);
    /* What a state of 1 stands for in the op its role prices over
     * sequences of `tokens` tokens (the tile-share role: the share of
     * causal attention's tiles its attention visits); NULL: 1. */
    double (*cost_scale)(const struct dm_config *cfg, int tokens);
    /* The busiest-rank role: the routed MLP its scheme's blocks run in
     * place of the dense one (struct dyn_routed_mlp), from the config. */
    void (*cost_routed_mlp)(const struct dm_config *cfg, struct dyn_routed_mlp *out);
};

/* The signals a run of cfg gathers and writes: every active scheme's, in
 * the table's order, as pointers into out (at most max; returns the count). */
int dyn_signals(const struct dm_config *cfg, const struct dyn_signal **out, int max);
/* Every registered scheme's signals, in the table's order, active or not,
 * gathered or derived (the readers': what a log may hold); as dyn_signals. */
int dyn_signals_all(const struct dyn_signal **out, int max);
/* The first registered signal (dyn_signals_all's order) of cost role
 * `role`, or NULL. */
const struct dyn_signal *dyn_signal_of_cost(enum dyn_cost_role role);
/* The sparsity gradual pruning holds at 0-based step `step` of a run of
 * cfg, from its schedule alone (0 before the first pruning step): the
 * state `dynmo simulate --hardware` prices a pruned block at. */
double prune_sparsity_in_force(const struct dm_config *cfg, int step);
/* Whether a run of cfg runs the scheme that declared signal. */
int dyn_signal_active(const struct dyn_signal *signal, const struct dm_config *cfg);
/* The declaration of run-log dataset `name`, any registered scheme's, or NULL. */
const struct dyn_signal *dyn_signal_of_dataset(const char *name);
/* Whether layer `layer` is one of the blocks of the scheme that declared
 * signal (a DYN_SIGNAL_LAYERS signal: every layer), and the columns of its
 * row for shape: layers, the scheme's blocks, or those times the cells. */
int dyn_signal_layer(const struct dyn_signal *signal, const struct gpt_shape *shape, int layer);
int dyn_signal_width(const struct dyn_signal *signal, const struct gpt_shape *shape);
/* Whether the scheme that declared signal lives wholly in a block's MLP
 * unit (gpt_ext_fits_mlp_unit: MoE): with balance.units = sublayer the
 * stage of a split block's attention has none of its values. */
int dyn_signal_in_mlp_unit(const struct dyn_signal *signal);
int dyn_signal_cells(const struct dyn_signal *signal, const struct gpt_shape *shape);

/* A signal's step, combined (struct step_stats, dynmo/pipe.h). */
struct dyn_signal_row {
    const struct dyn_signal *signal;
    int columns;
    double *values;    /* (columns) */
};
/* Each active scheme's note on the step from its rows ("MoD 25.0% tokens"),
 * handed to emit one by one (tokens: the step's tokens). */
void dyn_step_notes(const struct dm_config *cfg, const struct dyn_signal_row *rows, int count,
                    double tokens, void (*emit)(void *ctx, const char *note), void *ctx);

/* ---- a run log's signals, read back (inspect, report) -------------------
 * The readers of run logs (src/tools) hand the schemes a reader of the
 * file and a writer of a summary; each scheme summarises its own datasets
 * (its summarise_log, or the generic summary its signals declare), so
 * inspect names no scheme. */

/* The run log: its stored config (the defaults where it has none), and
 * its datasets. floats / ints return a whole dataset's rows (1-D: cols
 * 1); a dataset that cannot be read is reported by the reader itself
 * (they do not return). fail reports a problem with the file's contents
 * (text names the file) and does not return. */
struct dyn_log_reader {
    void *ctx;
    const struct dm_config *cfg;
    const char *path;
    int (*has)(void *ctx, const char *dataset);
    long (*floats)(void *ctx, const char *dataset, float **values, int *cols);
    long (*ints)(void *ctx, const char *dataset, int **values, int *cols);
    void (*fail)(void *ctx, const char *text);
};

/* A summary: text lines (the text output) and the same as nested JSON
 * objects and lists (the JSON output); the writer keeps both and prints
 * one. open: an object under key in the open object, or (key NULL) the
 * next of the open list; close ends the last opened. A non-finite number
 * is JSON's null. */
struct dyn_summary_writer {
    void *ctx;
    void (*line)(void *ctx, const char *text);
    void (*open)(void *ctx, const char *key);
    void (*open_list)(void *ctx, const char *key);
    void (*close)(void *ctx);
    void (*number)(void *ctx, const char *key, double value);
    void (*integer)(void *ctx, const char *key, long long value);
};

/* Every registered scheme's summary of the log, in the table's order:
 * its summarise_log, else the generic summary of each of its signals that
 * declares one (DYN_SUMMARY_MEAN) and whose dataset the log has. A scheme
 * without datasets in the log writes nothing. */
void dyn_summarise_log(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w);

/* What the readers of a stored config compute with beyond each key's own
 * range (a scheme's relations they divide or index by: parallel.ep
 * divides model.experts): 0, or -1 with the problem in problem. */
int dyn_check_log_config(const struct dm_config *cfg, char *problem, size_t size);

/* The most signals all schemes of a run declare. */
#define DYN_SIGNALS_MAX 32

/* ---- the schemes' parts of a checkpoint ------------------------------------
 * A scheme that keeps something in a checkpoint declares its fragment of
 * the schema (checkpoint_schema/<scheme>.def: its /model attributes, its
 * groups, attributes and datasets), writes its attributes, reads them back
 * into a shape, checks them, names its dimensions, says which rows of its
 * datasets hold which floats of a block, and says whether a checkpoint's
 * model may resume as the run's (its resume rule). The checkpoint module
 * (src/ckpt) does the HDF5 and calls these; it names no scheme. */

struct block;
struct ckpt_schema;

/* The checkpoint's side of a write: attributes into the skeleton. */
struct dyn_ckpt_writer {
    void *ctx;
    void (*int_attr)(void *ctx, const char *object, const char *name, long long value);
    void (*string_attr)(void *ctx, const char *object, const char *name, const char *text);
};

/* The checkpoint's side of a read: what the file has, an integer
 * attribute (fallback when absent or unreadable), a problem
 * (ckpt_problem's format, "checkpoint PATH: " added), and a whole dataset
 * of the file's schema as float32 or int64 values (0, or -1 after
 * reporting; NULL where no dataset may be read yet). */
struct dyn_ckpt_reader {
    void *ctx;
    int (*has)(void *ctx, const char *object, const char *attr);   /* attr NULL: the object */
    long long (*int_attr)(void *ctx, const char *object, const char *name, long long fallback);
    void (*problem)(void *ctx, const char *text);
    int (*dataset)(void *ctx, const char *name, int int64, void *out);
};

/* The checkpoint's side of a write of a block's non-slab state: rows row
 * .. row + count - 1 of dataset name from values (float32 or int64 as the
 * dataset is). */
struct dyn_ckpt_state_writer {
    void *ctx;
    void (*rows)(void *ctx, const char *name, long row, long count, const void *values);
};

/* Rows of a scheme's datasets that hold a block's floats: datasets
 * group/params, group/adam_m, group/adam_v; rows row .. row + count - 1,
 * each `floats` floats from offset `offset` of the block's params (of m,
 * v alike), one after another. sharded: the rows are written by each rank
 * that holds them, not by replica 0 alone. */
struct dyn_ckpt_rows {
    const char *group;
    long row, count;
    size_t offset, floats;
    int sharded;
    size_t stored;      /* floats of a stored row when more than floats (the rest
                           padding, read and dropped); 0: floats */
};
/* A block's rows: a few, plus an MoE block's held experts in runs of
 * consecutive experts (one run each where moe.placement moved them: at
 * most 256 held experts). The schemes' dimensions: at most 12. */
enum { DYN_CKPT_ROWS_MAX = 4 + 256, DYN_CKPT_PARTS_MAX = 12 };

/* A scheme may own schema versions of its own (checkpoint_schema/vN.def:
 * a model whose blocks hold other rows): dyn_ckpt_version is the version
 * a checkpoint of shape is written in when a present scheme owns one (0:
 * the base version, the checkpoint module's); dyn_ckpt_version_schema the
 * lines of version `version` when a scheme owns it, else NULL; and
 * dyn_ckpt_versions_text the versions the schemes own, as the message
 * about an unknown version lists them (", 3 (with ...) and 2 (...)"). */
int dyn_ckpt_version(const struct gpt_shape *shape);
const struct ckpt_schema *dyn_ckpt_version_schema(long version);
void dyn_ckpt_versions_text(char *buf, size_t size);

/* Writing. The fragments a checkpoint of shape holds, in the table's
 * order (the model-keys lines first, then each scheme's own): the
 * schema is base followed by them (dyn_ckpt_schema, built once per
 * combination, lives as long as the process). */
const struct ckpt_schema *dyn_ckpt_schema(const struct ckpt_schema *base,
                                          const struct gpt_shape *shape);
/* Every present scheme's attributes. */
void dyn_ckpt_write_attrs(const struct gpt_shape *shape, const struct dyn_ckpt_writer *w);
/* The dimensions the schemes present in shape name (mod_layers ...) and
 * their values: returns how many (at most max). */
int dyn_ckpt_dims(const struct gpt_shape *shape, const char **names, long *values, int max);
/* Whether `name` is a dimension a scheme declares (its datasets' rows are
 * written and read one row at a time). */
int dyn_ckpt_is_dim(const char *name);
/* The rows that hold block blk's scheme floats under shape in a file of
 * schema version `version`; returns how many (at most max). *base: 1
 * when the rows hold the block's own tensors too (a scheme's version),
 * else 0 (the checkpoint's /blocks row holds them). */
int dyn_ckpt_block_rows(const struct gpt_shape *shape, long version, const struct block *blk,
                        struct dyn_ckpt_rows *out, int max, int *base);
/* Whether replica dp_rank of a stage writes the sharded rows of its
 * blocks (it holds parts no other replica of its group holds). */
int dyn_ckpt_writes_sharded(const struct gpt_shape *shape, int dp_rank);
/* A block's state beyond its slab into its rows (replica 0 of its stage). */
void dyn_ckpt_write_state(const struct gpt_shape *shape, const struct block *blk,
                          const struct dyn_ckpt_state_writer *w);
/* Reading the schemes' states of a checked file (rd can read datasets):
 * their values, checked by each scheme's rules (NULL after reporting, or
 * when no present scheme keeps one: *states then NULL too); applied to a
 * loaded block; freed. */
struct dyn_ckpt_states;
int dyn_ckpt_read_states(const struct gpt_shape *shape, const struct dyn_ckpt_reader *rd,
                         struct dyn_ckpt_states **states);
void dyn_ckpt_apply_states(const struct dyn_ckpt_states *states, const struct gpt_shape *shape,
                           struct block *blk);
void dyn_ckpt_states_free(struct dyn_ckpt_states *states);
/* The resume rule: 0 when a checkpoint of file's model may resume as the
 * run's, else -1 with the first scheme's reason in err. */
int dyn_ckpt_compare(const struct gpt_shape *file, const struct gpt_shape *run, char *err,
                     size_t errsize);

/* Reading a file's structure. dyn_ckpt_file_open: which fragments the file
 * has (from what rd sees), after each present scheme's format check;
 * NULL after a problem (reported). The schema to check the file against
 * is base and the fragments; each attribute of a fragment read goes to
 * dyn_ckpt_file_store; dyn_ckpt_file_check then checks the values and
 * puts the schemes into shape (its dense dimensions set), 0 or -1 after
 * reporting. */
struct dyn_ckpt_file;
struct dyn_ckpt_file *dyn_ckpt_file_open(const struct dyn_ckpt_reader *rd, long version);
const struct ckpt_schema *dyn_ckpt_file_schema(const struct dyn_ckpt_file *f,
                                               const struct ckpt_schema *base);
/* Whether (object, name) is one of the file's fragments' attributes. */
int dyn_ckpt_file_owns(const struct dyn_ckpt_file *f, const char *object, const char *name);
void dyn_ckpt_file_store(struct dyn_ckpt_file *f, const char *object, const char *name,
                         long long value, const char *text);
int dyn_ckpt_file_check(struct dyn_ckpt_file *f, struct gpt_shape *shape,
                        const struct dyn_ckpt_reader *rd);
void dyn_ckpt_file_free(struct dyn_ckpt_file *f);

/* The most doubles a scheme's state may hold (dyn_create refuses a
 * configuration whose state would exceed it; a checkpoint whose state does
 * is no file dynmo wrote). */
#define DYN_STATE_MAX (1L << 27)

/* Offline, without a run (the checkpoint checker's): whether state[0..n)
 * is a state that scheme `kind` can have saved for a model of `layers`
 * blocks, by the scheme's own rules (freezing: its header, its length, a
 * count of steps, finite non-negative norms). Returns 0, or -1 with the
 * reason in err (also for a kind that keeps no state). Not collective. */
int dyn_state_check(const char *kind, const double *state, long n, int layers, char *err,
                    size_t errsize);

#endif
