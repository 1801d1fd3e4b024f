/* The set-up of `dynmo train` and `dynmo bench` (train.h): the command
 * line and the config, threads per rank, the token files every rank
 * opens and checks, and the initial layout balance.initial names. Each
 * user error is one message and exit status 2 on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/backend.h"
#include "dynmo/balance.h"
#include "dynmo/block_ext.h"
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/world.h"
#include "tools/train/train.h"


void train_parse_args(int argc, char **argv, struct dm_config *cfg, struct train_args *args,
                      int is_bench)
{
    const char *cmd = is_bench ? "bench" : "train";
    config_defaults(cfg);
    args->config_path = NULL;
    args->warmup_steps = 3;
    args->timed_steps = 10;
    args->migration = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) dm_user_error("%s: --config needs a file", cmd);
            if (args->config_path)
                dm_user_error("%s: --config given twice (%s, %s): give one file and "
                              "section.key=value overrides", cmd, args->config_path, argv[i + 1]);
            args->config_path = argv[++i];
        }
    }
    if (!args->config_path)
        dm_user_error("%s: no --config FILE (usage: dynmo %s --config FILE "
                      "[section.key=value ...]%s)", cmd, cmd,
                      is_bench ? " [--warmup N] [--steps N]" : "");
    config_load_file(cfg, args->config_path);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
        } else if (is_bench && (!strcmp(a, "--warmup") || !strcmp(a, "--steps"))) {
            if (i + 1 >= argc) dm_user_error("bench: %s needs a number", a);
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < (a[2] == 'w' ? 0 : 1) || v > 100000)
                dm_user_error("bench: %s = '%s' must be an integer in [%d, 100000]", a,
                              argv[i], a[2] == 'w' ? 0 : 1);
            if (a[2] == 'w') args->warmup_steps = (int)v;
            else args->timed_steps = (int)v;
        } else if (is_bench && !strcmp(a, "--migration")) {
            args->migration = 1;
        } else if (strchr(a, '=') && a[0] != '-') {
            config_apply_override(cfg, a);
        } else {
            dm_user_error("%s: unknown argument '%s' (usage: dynmo %s --config FILE "
                          "[section.key=value ...]%s)", cmd, a, cmd,
                          is_bench ? " [--warmup N] [--steps N]" : "");
        }
    }
    dyn_config_validate(cfg);
}


int train_threads_for_rank(const struct dm_config *cfg)
{
    if (cfg->threads > 0) return cfg->threads;
    return world_cpus_for_rank();   /* what the rank may use, not what the node has */
}

enum balance_units train_units(const struct dm_config *cfg)
{
    return balance_units_parse(cfg->units) == BALANCE_UNITS_SUBLAYER ? BALANCE_UNITS_SUBLAYER
                                                                      : BALANCE_UNITS_BLOCK;
}

int train_unit_count(const struct dm_config *cfg)
{
    return cfg->layers * balance_units_per_block(train_units(cfg));
}

double *train_unit_params(const struct dm_config *cfg, double **matrix)
{
    /* blocks differ in size (a scheme may replace the MLP) */
    struct gpt_shape shape = dyn_shape_from_config(cfg);
    int per_block = balance_units_per_block(train_units(cfg)), n = train_unit_count(cfg);
    double *params = dm_alloc((size_t)n * sizeof(double));
    if (matrix) *matrix = dm_alloc((size_t)n * sizeof(double));
    for (int u = 0; u < n; u++) {
        int half = per_block == 1 ? BLOCK_HALVES : u % 2 ? BLOCK_HALF_MLP : BLOCK_HALF_ATTENTION;
        params[u] = (double)gpt_unit_param_count(&shape, u / per_block, half);
        if (matrix) (*matrix)[u] = (double)block_half_matrix_weights(cfg->channels, half);
    }
    return params;
}

void train_check_units(const struct dm_config *cfg)
{
    if (train_units(cfg) != BALANCE_UNITS_SUBLAYER) return;
    struct gpt_shape shape = dyn_shape_from_config(cfg);
    const char *what = NULL;
    /* every dyn.kind splits: freezing is per block (a frozen block's two
     * halves freeze together), early exit's active rows travel with the
     * stream after attention, pruning masks each half's matrices where the
     * half is; saturation compares a block's output with its input, which
     * the stage of a split block's MLP does not hold */
    if (!strcmp(cfg->dyn_kind, "early_exit") && strcmp(cfg->exit_confidence, "softmax"))
        what = "dyn.exit_confidence = saturation";
    /* an extension splits when it stays inside the attention (hash
     * attention) or inside the MLP (MoE) */
    int in_mlp = 0;
    for (int i = 0; !what && i < shape.ext_count; i++) {
        const struct gpt_ext_ops *ops = shape.ext[i].ops;
        if (gpt_ext_fits_mlp_unit(ops)) in_mlp = 1;
        else if (!gpt_ext_fits_units(ops)) what = ops->block_noun;
    }
    if (what)
        dm_user_error("balance.units = sublayer cannot run with %s yet: it runs dense, "
                      "hash-attention and mixture-of-experts blocks, frozen, pruned or "
                      "neither, and early exit by the softmax confidence (docs/balance.md, "
                      "\"Units of placement\"); set balance.units = block", what);
    /* the expert group's exchange does not yet follow an MLP unit */
    if (in_mlp && cfg->ep > 1)
        dm_user_error("balance.units = sublayer with mixture-of-experts blocks needs "
                      "parallel.ep = 1 (parallel.ep = %d): expert parallelism does not split "
                      "blocks yet; set parallel.ep = 1, or balance.units = block", cfg->ep);
    /* a checkpoint records its layouts in whole blocks too */
    if (cfg->ckpt_dir[0] && cfg->pp > cfg->layers)
        dm_user_error("balance.units = sublayer with ckpt.dir needs parallel.pp <= model.layers "
                      "(parallel.pp = %d, model.layers = %d): a checkpoint records its layout "
                      "in whole blocks too, a block per stage; use fewer stages, or no ckpt.dir",
                      cfg->pp, cfg->layers);
}

/* Under interleaved an explicit layout counts chunks, not stages: one
 * message that says so when the count is off. */
static void check_explicit_chunks(const struct dm_config *cfg, int chunks)
{
    if (cfg->virtual_stages < 2 || strncmp(cfg->initial, "explicit:", 9) != 0) return;
    int listed = 1;
    for (const char *c = cfg->initial + 9; *c; c++) listed += *c == ',';
    if (listed != chunks)
        dm_user_error("balance.initial = '%s' lists %d counts but interleaved lays out "
                      "parallel.pp x parallel.virtual = %d x %d = %d chunks (chunk c of "
                      "stage s at position c x pp + s)", cfg->initial, listed, cfg->pp,
                      cfg->virtual_stages, chunks);
}

void train_initial_layout(int *counts, const struct dm_config *cfg, int stages)
{
    check_explicit_chunks(cfg, stages);
    /* DeepSpeed's equal parameters: unit parameter counts, the embedding
     * on the first stage and the final norm on the last. */
    int n = train_unit_count(cfg);
    double *cost = train_unit_params(cfg, NULL);
    int64_t *mem = dm_alloc((size_t)n * sizeof(int64_t));
    for (int u = 0; u < n; u++) mem[u] = (int64_t)(4 * sizeof(float)) * (int64_t)cost[u];
    struct balance_costs params = {
        .blocks = n, .cost = cost, .mem_bytes = mem,
        .first_cost = (double)(cfg->vocab + cfg->max_seq) * cfg->channels,
        .last_cost = 2.0 * cfg->channels,
    };
    char err[512];
    int rc = balance_layout_from_spec(cfg->initial, stages, cfg->layers, train_units(cfg),
                                      &params, counts, err, sizeof err);
    dm_free(cost);
    dm_free(mem);
    if (rc != BALANCE_OK) dm_user_error("%s", err);
}

/* Every scheme runs on every device (docs/gpu.md): a device whose memory
 * the host cannot read (CUDA, the strict emulated device) stages what the
 * host and MPI need. Only opening the backend can fail. The products'
 * operand precision (train.precision) goes to the plugin here. */
void train_open_backend(const struct dm_config *cfg)
{
    /* before the first op; config_validate refused anything but fp32 on the CPU */
    enum dm_precision precision = backend_precision_from_name(cfg->precision);
    backend_set_precision(precision);
    char problem[WORLD_MESSAGE_BYTES] = "";
    int bad = backend_open(cfg->device, world_local_rank(), world_local_size(), problem,
                           sizeof problem) != 0;
    char agreed[WORLD_MESSAGE_BYTES];
    if (world_agree(bad, problem, MPI_COMM_WORLD, agreed, sizeof agreed))
        dm_user_error("%s", agreed);
    if (strcmp(cfg->device, "cpu") != 0) {
        dm_log("device: %s (rank 0; %d ranks on its node)\n", backend_current()->device,
               world_local_size());
        dm_log("precision: matrix products with %s operands, fp32 outputs (train.precision)\n",
               backend_precision_name(precision));
    }
}

void train_open_data(struct train_data *d, const struct dm_config *cfg)
{
    d->have_val = cfg->eval_every > 0;
    char problem[WORLD_MESSAGE_BYTES] = "";
    int bad = token_file_try_open(&d->train_file, cfg->train_path, (uint32_t)cfg->vocab,
                                  cfg->eot, (uint64_t)cfg->seq + 1, problem,
                                  sizeof problem) != 0;
    if (!bad && d->have_val)
        bad = token_file_try_open(&d->val_file, cfg->val_path, (uint32_t)cfg->vocab, cfg->eot,
                                  (uint64_t)cfg->seq + 1, problem, sizeof problem) != 0;
    char agreed[WORLD_MESSAGE_BYTES];
    if (world_agree(bad, problem, MPI_COMM_WORLD, agreed, sizeof agreed))
        dm_user_error("%s", agreed);
    loader_init(&d->train, &d->train_file, cfg->seq, cfg->seed);
    if (d->have_val) loader_init(&d->val, &d->val_file, cfg->seq, cfg->seed);
}

void train_close_data(struct train_data *d)
{
    loader_free(&d->train);
    token_file_close(&d->train_file);
    if (d->have_val) {
        loader_free(&d->val);
        token_file_close(&d->val_file);
    }
}

/* What one checkpoint of this run takes on disk, about: parameters and
 * both Adam moments in float32, pruning masks a byte a weight, and room
 * for the file's own structure. */
static uint64_t checkpoint_bytes(const struct dm_config *cfg)
{
    struct gpt_shape shape = dyn_shape_from_config(cfg);
    uint64_t params = (uint64_t)gpt_param_count(&shape);
    uint64_t bytes = params * 3 * sizeof(float) + ((uint64_t)1 << 20);
    if (!strcmp(cfg->dyn_kind, "prune")) bytes += params;
    return bytes;
}

/* This rank's view of the paths the run writes; 0 or -1 with a message. A
 * run log already in run.out_dir is continued or replaced, so it must be
 * one: a file of another kind there is not the run's to touch. */
static int check_paths(const struct dm_config *cfg, char *problem, size_t size)
{
    char reason[300];   /* the messages cut the path, never overflow */
    char log[1200], kind[32] = "";
    snprintf(log, sizeof log, "%s/" RUNLOG_FILE_NAME, cfg->out_dir);
    if (access(log, F_OK) == 0) {
        int readable = dm_file_kind(log, kind, sizeof kind, reason, sizeof reason) == 0;
        if (!readable || strcmp(kind, RUNLOG_KIND) != 0) {
            char what[64];
            snprintf(what, sizeof what, "%s", !readable ? "not HDF5 or damaged"
                                              : kind[0] ? "a dynmo file of another kind"
                                                        : "an HDF5 file dynmo did not write");
            if (readable && kind[0]) snprintf(what, sizeof what, "a dynmo %.30s", kind);
            snprintf(problem, size, "run.out_dir = %.500s holds %s, which is not a dynmo run "
                     "log (%s): choose another run.out_dir, or move that file", cfg->out_dir,
                     RUNLOG_FILE_NAME, what);
            return -1;
        }
    }
    if (dm_make_dirs(cfg->out_dir, reason, sizeof reason) != 0) {
        snprintf(problem, size, "run.out_dir = %.600s cannot be used: %s", cfg->out_dir, reason);
        return -1;
    }
    if (dm_probe_writable(cfg->out_dir, reason, sizeof reason) != 0) {
        snprintf(problem, size, "run.out_dir = %.600s is not writable: %s", cfg->out_dir, reason);
        return -1;
    }
    if (cfg->ckpt_dir[0] &&
        ckpt_dir_check_usable(cfg->ckpt_dir, checkpoint_bytes(cfg), problem, size) != 0)
        return -1;
    return 0;
}

void train_check_paths(const struct dm_config *cfg)
{
    char problem[WORLD_MESSAGE_BYTES] = "", agreed[WORLD_MESSAGE_BYTES];
    int bad = check_paths(cfg, problem, sizeof problem) != 0;
    if (world_agree(bad, problem, MPI_COMM_WORLD, agreed, sizeof agreed))
        dm_user_error("%s", agreed);
}

/* What the busiest stage of `layout` keeps resident on one rank, about:
 * each block's parameters, gradients and both Adam moments (blocks differ
 * in size with the schemes' extensions; with parallel.ep > 1 a block whose
 * parts a scheme splits holds its rank's), the activations of the
 * micro-batches it holds at once (all of them, as GPipe does: an upper
 * bound for 1F1B), what the schemes keep beside a block on its rank
 * (dyn_block_memory: their activations, the parts' sums), and the
 * embedding and head with their own moments. */
static double stage_bytes(const struct dm_config *cfg, const int *layout, int stages)
{
    struct gpt_shape shape = dyn_shape_for_rank(cfg, 0);
    int micro_B = cfg->batch / (cfg->dp * cfg->micro_batches);
    double acts = (double)block_acts_bytes(micro_B, cfg->seq, cfg->channels, cfg->heads);
    double ends = 16.0 * (double)(shape.vocab + shape.max_seq) * shape.channels +
                  3.0 * 4.0 * (double)micro_B * cfg->seq * shape.vocab * cfg->micro_batches;
    double busiest = 0.0;
    int per = balance_units_per_block(train_units(cfg));
    for (int s = 0, first = 0; s < stages; first += layout[s++]) {
        double bytes = 0.0;
        for (int u = first; u < first + layout[s]; u++) {   /* a unit: a block or a half */
            int b = u / per, half = per == 1 ? BLOCK_HALVES : u % 2 ? BLOCK_HALF_MLP
                                                                  : BLOCK_HALF_ATTENTION;
            bytes += 16.0 * (double)gpt_unit_param_count(&shape, b, half) +
                     (dyn_block_memory(cfg, &shape, b, micro_B) +
                      (double)cfg->micro_batches * acts) / per;
        }
        busiest = bytes > busiest ? bytes : busiest;
    }
    return busiest + ends;
}

void train_check_memory(const struct dm_config *cfg, const int *layout, int stages)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return;
    int local = world_local_size() > 0 ? world_local_size() : 1;
    double per_rank = (double)pages * (double)page / local;
    double need = stage_bytes(cfg, layout, stages);
    if (need > per_rank)
        dm_user_error("this model needs about %.1f GiB on its busiest rank (weights, gradients "
                      "and Adam moments, activations of %d micro-batches) but the node's %.1f "
                      "GiB of memory shared by its %d ranks leaves %.1f GiB each: use more "
                      "stages (parallel.pp), fewer ranks per node, or a smaller model, batch "
                      "or sequence", need / 1073741824.0, cfg->micro_batches,
                      (double)pages * (double)page / 1073741824.0, local,
                      per_rank / 1073741824.0);
}
