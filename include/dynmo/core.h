/* dynmo core: errors and the single fatal path, opening input files,
 * logging, configuration, timing, aligned allocation, durable file writes
 * (mkdir -p, the atomic small-file writer) and the thread pool that every
 * CPU op uses.
 *
 * This module uses nothing else of dynmo and never calls MPI directly: the
 * pipeline module registers an abort hook so that a fatal error on one rank
 * takes the whole job down instead of leaving peers waiting. */
#ifndef DYNMO_CORE_H
#define DYNMO_CORE_H

#include <stddef.h>
#include <stdint.h>

#define DYNMO_VERSION "0.1.0"

/* Exit statuses (DESIGN.md, "Contracts"). */
enum {
    DM_EXIT_OK = 0,
    DM_EXIT_INTERNAL = 1,
    DM_EXIT_USAGE = 2,
    DM_EXIT_REPACK = 3,
    DM_EXIT_SIGNAL = 75,
};

/* ---- errors ---------------------------------------------------------- */

/* Records this process's rank and world size for message prefixes. */
void dm_set_rank(int rank, int world_size);
int dm_rank(void);
int dm_world_size(void);

/* Called by the fatal path with the exit status, before exiting; pipe sets
 * it to MPI_Abort so that no peer is left waiting. */
void dm_set_abort_hook(void (*hook)(int status));
/* Called by dm_user_error before exit(2) on the clean path (all ranks
 * detected the same error): pipe sets it to MPI_Finalize. */
void dm_set_finalize_hook(void (*hook)(void));
/* Asked before a fatal message is printed: 0 when another rank has printed
 * one already, so that a failure many ranks see at once (a full disk) is
 * one message. world sets it (one message per node); without it every
 * rank prints. */
void dm_set_message_gate(int (*gate)(void));

/* A user error that every rank detects identically (bad config, bad
 * arguments): rank 0 prints "dynmo: error: <message>", every rank exits 2
 * without aborting the others. */
__attribute__((noreturn, format(printf, 1, 2)))
void dm_user_error(const char *fmt, ...);

/* A user error that only this rank sees (unreadable file on one rank):
 * prints "[rank N] dynmo: error: <message>" and takes the whole job down
 * with status 2. */
__attribute__((noreturn, format(printf, 1, 2)))
void dm_user_error_local(const char *fmt, ...);

/* An internal failure (a bug, or a library call that failed): prints
 * "[rank N] file:line: message" and takes the whole job down with status 1. */
__attribute__((noreturn, format(printf, 3, 4)))
void dm_internal_error(const char *file, int line, const char *fmt, ...);

#define DM_FATAL(...) dm_internal_error(__FILE__, __LINE__, __VA_ARGS__)

/* Internal invariant; never used to validate input. */
#define DM_ASSERT(cond)                                                      \
    do {                                                                     \
        if (!(cond)) dm_internal_error(__FILE__, __LINE__,                   \
                                       "assertion failed: %s", #cond);       \
    } while (0)

/* Wraps a libc/POSIX call that returns -1 (or NULL via DM_CHECK_PTR) and
 * sets errno. */
#define DM_CHECK_SYS(call)                                                   \
    do {                                                                     \
        if ((call) == -1) dm_internal_error(__FILE__, __LINE__,              \
                                            "%s: %s", #call, dm_errno_text());\
    } while (0)
const char *dm_errno_text(void);

/* ---- input files --------------------------------------------------------- */

/* Opens path read-only if it is a regular file, without blocking (a FIFO or
 * a device is never opened). Returns the descriptor, which the caller
 * closes; or -1 with *kind NULL and errno set (missing, unreadable), or -1
 * with *kind naming what path is instead ("a directory", "a FIFO", ...). */
int dm_open_regular(const char *path, const char **kind);

/* ---- logging --------------------------------------------------------- */

/* printf to stdout on rank 0 only, flushed. */
__attribute__((format(printf, 1, 2))) void dm_log(const char *fmt, ...);
/* printf to stderr from any rank, prefixed "[rank N] ". */
__attribute__((format(printf, 1, 2))) void dm_warn(const char *fmt, ...);

/* ---- time and memory -------------------------------------------------- */

double dm_now(void);              /* monotonic seconds */
/* The clock that profiles compute (block and stage times): dm_now's, or,
 * after dm_profile_cpu_time(1), this thread's CPU time, which stays the
 * work's own cost when ranks time-share processors (a stage that waits for
 * a CPU would otherwise be charged for its neighbour's work). */
void dm_profile_cpu_time(int on);
int dm_profile_is_cpu_time(void);
double dm_profile_now(void);
size_t dm_peak_rss_bytes(void);   /* peak resident set of this process */
/* The median of v[0..n) (the mean of the middle two for even n), sorting v
 * in place; 0 for n <= 0. */
double dm_median(double *v, long n);

/* 64-byte aligned, zero-filled; fatal on failure. Free with dm_free. */
void *dm_alloc(size_t bytes);
/* The same without zero-filling, for memory that is written before it is
 * read (a migrating block's slab); free with dm_free. */
void *dm_alloc_uninit(size_t bytes);
void dm_free(void *p);
/* A family of arrays carved out of one allocation (STYLE.md): *arrays[k],
 * k < count, points at its own n zeroed doubles (floats), each 64-byte
 * aligned. The first is the allocation's start: dm_free(*arrays[0])
 * frees them all. */
void dm_carve_doubles(double **const arrays[], int count, size_t n);
void dm_carve_floats(float **const arrays[], int count, size_t n);
/* Room for one more item in an array that grows by doubling: items (a
 * dm_alloc'd array, or NULL, of count items of size bytes) while count <
 * *capacity; else a new array of twice the capacity (initial when it was
 * 0) holding the count items, zero past them, and items freed.
 * Returns the array to use. */
void *dm_grow(void *items, size_t size, long count, long *capacity, long initial);

/* ---- files -------------------------------------------------------------
 * Durable writes for files that other programs and later jobs read. Not
 * collective, no MPI: the caller chooses the rank that calls them. Each
 * returns 0, or -1 with a message naming the path and the system's reason
 * in err (err may be NULL, errsize 0); the caller decides what a failure
 * means (a user error, a warning). */

/* snprintf into an optional message buffer (err may be NULL, errsize 0):
 * long texts are cut, never overflow; errno is left as it was. */
__attribute__((format(printf, 3, 4)))
void dm_set_message(char *err, size_t errsize, const char *fmt, ...);

/* mkdir -p: creates path and every missing parent directory (mode 0777
 * less the umask). An existing directory is success; a path that exists
 * and is not a directory, or a parent that cannot be created (a regular
 * file in the way, no permission) is -1 with "cannot create directory
 * <the failing prefix>: <reason>" in err and errno set. */
int dm_make_dirs(const char *path, char *err, size_t errsize);

/* Start-up's undo list: every directory dm_make_dirs creates, and each
 * file named to dm_startup_created_file, until dm_startup_done. A fatal
 * error before then (dm_user_error, an internal error) calls
 * dm_startup_undo, which removes those files and those of the directories
 * that are empty, newest first (retrying for a second a directory of ours
 * that another rank of the job is still emptying): a command refused at start-up leaves
 * nothing behind, and nothing it did not create is touched. */
void dm_startup_created_file(const char *path);
void dm_startup_undo(void);
void dm_startup_done(void);

/* Replaces the file at path with the `bytes` bytes at data, atomically
 * and durably: writes path.tmp in the same directory (truncating a stale
 * one), fsyncs it, renames it over path, then fsyncs the directory. A
 * reader sees the old file or the whole new one, never a part. Every
 * failure is -1, the directory fsync included (the new file is then in
 * place but a crash may still lose it); before the rename the temporary
 * is removed. Two writers of the same path at once are the caller's bug.
 * A path that exists and is not a regular file (after symlinks: a
 * directory, a device such as /dev/null, a FIFO) is refused, -1, and
 * left as it is. The caller keeps ownership of data. */
int dm_write_file_atomic(const char *path, const void *data, size_t bytes, char *err,
                         size_t errsize);

/* write(2) until every byte is out (EINTR retried). Returns 0, or -1 with
 * errno set. */
int dm_write_all(int fd, const void *data, size_t bytes);

/* Whether files can be created in the directory dir: creates, writes and
 * removes a probe file (the only sure test: a read-only mount or a full
 * file system can pass access(2)). Returns 0, or -1 with the system's
 * reason in err. */
int dm_probe_writable(const char *dir, char *err, size_t errsize);

/* fsync of the file or directory at path (opened read-only and closed
 * again): what makes a renamed file, or a file written by other processes,
 * durable. */
int dm_fsync_path(const char *path, char *err, size_t errsize);

/* ---- thread pool -------------------------------------------------------
 * One persistent pool per process. BLAS always runs single-threaded inside
 * it (so OpenBLAS threads never fight ours); every op splits its work with
 * dm_parallel_for. Work items must be independent and each item's result
 * must not depend on which thread computes it: that keeps results
 * bit-identical for any thread count. */

/* Starts the pool with n threads (n >= 1; the caller is thread 0) and sets
 * BLAS to one thread. Call once, before any op. */
void dm_threads_init(int n);
int dm_threads_count(void);
void dm_threads_shutdown(void);

/* Calls fn(arg, begin, end) over a partition of [0, n) into at most
 * dm_threads_count() contiguous ranges, each a multiple of grain (except the
 * last). Returns when all ranges are done. Not reentrant. */
typedef void (*dm_range_fn)(void *arg, long begin, long end);
void dm_parallel_for(long n, long grain, dm_range_fn fn, void *arg);

/* ---- configuration ----------------------------------------------------- */

/* The pipeline schedules (dynmo/balance.h, docs/pipeline.md): 1F1B, GPipe,
 * zero-bubble ZB-H1 (backward split into input and weight gradients) and
 * interleaved 1F1B (virtual stages). */
enum dm_schedule {
    DM_SCHEDULE_1F1B = 0,
    DM_SCHEDULE_GPIPE = 1,
    DM_SCHEDULE_ZB = 2,
    DM_SCHEDULE_INTERLEAVED = 3,
};
/* The most keys config.c's table may hold (struct dm_config.key_set). */
#define CONFIG_MAX_KEYS 128

struct dm_config {
    /* [model] */
    int vocab;          /* tokens in the vocabulary (256: byte level) */
    int vocab_pad;      /* the embedding's rows padded to a multiple of this (1: none) */
    int max_seq;        /* positions in the learned position embedding */
    int layers;         /* transformer blocks */
    int heads;          /* attention heads; must divide channels */
    int channels;       /* model width C */
    int moe_every;      /* 0: no MoE; block l is a mixture of experts when (l+1) % moe_every == 0 */
    int experts;        /* E expert MLPs in an MoE block */
    int top_k;          /* k experts per token */
    int expert_hidden;  /* hidden width of an expert (0: 4 x channels) */
    int mod_every;      /* 0: no mixture of depths; block l is one when (l+1) % mod_every == 0 */
    double mod_capacity;/* fraction of a sequence's tokens a MoD block processes, in (0, 1] */
    char attention[16]; /* "dense" or "hash" (hash-sparse attention, docs/mod-hash.md) */
    /* [train] */
    int batch;          /* sequences per optimizer step (global) */
    int seq;            /* tokens per sequence, <= max_seq */
    int micro_batches;  /* gradient-accumulation micro-batches; divides batch */
    int steps;          /* optimizer steps in the run */
    double lr;          /* peak learning rate */
    double min_lr_ratio;/* cosine floor as a fraction of lr */
    int warmup;         /* linear warm-up steps */
    double weight_decay;/* AdamW decoupled decay on matrices and embeddings */
    double beta1, beta2, eps;
    double grad_clip;   /* global gradient-norm clip; 0 disables */
    uint64_t seed;      /* weights, data order, everything random */
    int eval_every;     /* steps between validation losses; 0 disables */
    int eval_batches;   /* batches in one validation pass */
    int threads;        /* threads per rank; 0 = cores / ranks on the node */
    char device[16];    /* "cpu" or "cuda" (the plugin, docs/gpu.md) */
    char precision[16]; /* "fp32", "tf32" or "bf16": a device's product operands */
    /* [data] */
    char train_path[1024];
    char val_path[1024];
    int eot;            /* end-of-text token between documents; -1: none */
    /* [run] */
    char out_dir[1024];
    int log_every;      /* steps between progress lines */
    int trace_from;     /* first step (1-based) whose instructions are traced; 0 = none */
    int trace_steps;    /* steps traced from trace_from */
    /* [parallel] */
    int pp, dp;         /* pipeline stages S, data-parallel replicas D */
    int ep;             /* expert-parallel degree (divides dp and model.experts) */
    int turns;          /* 1: ranks that outnumber their CPUs take turns computing */
    char schedule[32];  /* "1f1b", "gpipe", "zb" or "interleaved" */
    int virtual_stages; /* interleaved: model chunks per rank v (1 otherwise) */
    /* [balance] */
    char initial[1024]; /* "uniform", "params" or "explicit:n1,n2,..." */
    char method[32];    /* balancer run every balance.every steps ("none": static) */
    int every;          /* steps between balancing decisions */
    char cost[32];      /* "time" (profiled EMA) or "params" */
    char units[16];     /* units of placement: "block", or "sublayer" (a block's attention
                           and its MLP apart) */
    double min_gain;    /* skip a re-layout whose predicted saving (ms over the next
                           interval) is below min_gain x the measured migration cost */
    double min_improvement; /* ... or whose predicted step time is not at least this
                               fraction below the current layout's */
    /* [ckpt] */
    char ckpt_dir[1024];/* "" = no checkpoints */
    int ckpt_every;     /* steps between checkpoints; 0 = only on signal / re-pack / end */
    char resume[1024];  /* "auto", "none" or a checkpoint path */
    int keep;           /* complete checkpoints kept */
    int allow_new_data; /* 1: resume on training data other than the checkpoint's */
    /* [dyn] */
    char dyn_kind[32];  /* "none", "freeze", "early_exit", "prune" */
    int freeze_window;      /* steps of gradient-norm history per comparison */
    double freeze_threshold;/* freeze when the relative change is below this */
    int freeze_every;       /* steps between freeze checks */
    int freeze_max;         /* most blocks that may freeze (-1: layers - 1) */
    int freeze_per_check;   /* most blocks that freeze at one check */
    int exit_from;          /* first block after which tokens may exit */
    double exit_threshold;  /* confidence a token needs to exit */
    char exit_confidence[16]; /* "softmax" or "saturation" */
    double exit_loss_weight;/* scale of the exit heads' losses (0: none) */
    int exit_warmup;        /* steps before any token may exit */
    int prune_start;        /* first pruning step t0 (0-based: before step t0 runs) */
    int prune_every;        /* steps between pruning steps (dt) */
    int prune_steps;        /* n: pruning happens at t0, t0 + dt, ..., t0 + n dt */
    double sparsity_initial;/* s_i, the sparsity at t0 */
    double sparsity_final;  /* s_f, the sparsity from t0 + n dt on */
    double csr_sparsity;    /* a block's matrices go to CSR from this sparsity on */
    /* [moe] (docs/moe.md) */
    char moe_router[16];    /* "softmax" or "sigmoid" (scores with a selection bias) */
    double capacity_factor; /* 0: dropless; else capacity ceil(k T / E x factor) */
    char moe_drop[16];      /* which pairs a full expert keeps: "probs" (highest scores),
                               "position" (by token, then slot) or "slot" (by slot, then
                               token: GShard's) */
    double aux_loss;        /* alpha of the Switch/GShard balancing loss */
    double z_loss;          /* beta of the router z-loss */
    double bias_rate;       /* gamma of the auxiliary-loss-free bias update (sigmoid router) */
    char moe_placement[16]; /* which expert-parallel rank holds which expert: "static"
                               (rank r: r E / ep ..), "balanced" (moved to even the ranks'
                               loads at each balancing decision) or "random" (a test aid) */
    int replicas_max;       /* extra copies of hot experts per MoE block (0: none) */
    /* [mod], [hash] (docs/mod-hash.md) */
    char mod_routing[16];   /* "topk" (fixed cost) or "causal" (the predictor decides) */
    int mod_predictor_hidden; /* causal routing: the predictor MLP's hidden width */
    int hash_buckets;       /* nb: 1, or even */
    /* [repack] */
    int repack_enable;
    int repack_every;   /* steps between re-pack decisions */
    double repack_epsilon; /* allowed predicted slow-down of the smaller world */
    int repack_min_ranks;
    /* Which keys a file or an override gave (config_was_set), by their
     * place in config.c's table. */
    unsigned char key_set[CONFIG_MAX_KEYS];
};

/* Whether "section.key" was given by a file or an override (not left at
 * its default); "section.*": any key of that section. An unknown key is
 * an internal error. */
int config_was_set(const struct dm_config *cfg, const char *key);

/* The value of "section.key" as config_print writes it, into out; "" and
 * 0 when a file or an override did not give it (an older run log's config
 * without that key), else 1. An unknown key is an internal error. */
int config_value_text(const struct dm_config *cfg, const char *key, char *out, size_t size);

/* The schedule named by cfg->schedule. */
enum dm_schedule config_schedule(const struct dm_config *cfg);

/* Fills defaults (the reference model of configs/ref.ini). */
void config_defaults(struct dm_config *cfg);

/* Reads an INI file into cfg (on top of what is there). User errors (file
 * unreadable, syntax, unknown section or key, bad value) end with
 * dm_user_error naming file, line and key. */
void config_load_file(struct dm_config *cfg, const char *path);
/* The shortest form of x that reads back as x (10, not 1e+01; 1.0000001,
 * not 1 as %g prints it): what a message names when it names a value. */
void dm_format_shortest(char *buf, size_t size, double x);

/* What config_load_file does with the file's contents: parses the INI text
 * text[0..len) (not NUL-terminated, never read past, never changed) into
 * cfg, on top of what is there; name is what messages call it (the path).
 * Returns 0, or -1 with config_load_file's message ("name:line: problem")
 * in err, cfg then partly set. Never exits or prints (a fuzzer calls it). */
int config_parse_text(struct dm_config *cfg, const char *text, size_t len, const char *name,
                      char *err, size_t errsize);

/* Sets one key from its text as a config line or an override would (its
 * type and range checked). Returns 0, or -1 with the message naming the
 * key ("train.batch = 0 is out of range [1, 1048576] (sequences per
 * step)") in err; never exits. */
int config_set(struct dm_config *cfg, const char *section, const char *key, const char *value,
               char *err, size_t errsize);

/* Applies one "section.key=value" override; same errors as config_load_file. */
void config_apply_override(struct dm_config *cfg, const char *assignment);

/* Cross-field checks (heads divide channels, seq <= max_seq,
 * micro_batches divides batch, ...): dm_user_error on the first problem. */
void config_validate(const struct dm_config *cfg);

/* Writes every key as "section.key = value" lines (for logs and the run log). */
void config_print(const struct dm_config *cfg, char *buf, size_t bufsize);

/* The reverse of config_print: sets each "section.key = value" line of
 * text (NUL-terminated, not changed) into cfg with config_set, on top of
 * what is there. Returns 0, or -1 in err with "line N of NAME is not
 * ..." or "NAME: " and config_set's message (name: what the text is,
 * "its configuration"); never exits. */
int config_parse_printed(struct dm_config *cfg, const char *text, const char *name, char *err,
                         size_t errsize);

/* ---- random numbers ----------------------------------------------------
 * Counter-based so that any rank can draw the same numbers for the same
 * (seed, stream, index) without having drawn anything before: a block's
 * initial weights do not depend on which rank builds it. */
uint64_t dm_hash64(uint64_t seed, uint64_t stream, uint64_t index);
float dm_uniform(uint64_t seed, uint64_t stream, uint64_t index);   /* [0,1) */
float dm_normal(uint64_t seed, uint64_t stream, uint64_t index);    /* N(0,1) */

#endif
