/* The trainer's checkpoint policy (train.h): which checkpoint a run
 * resumes from and what it checks there, what a checkpoint of the running
 * job holds (the model through the engine, the data cursors, the layout
 * history, the scheme's own state), and the history itself: the layout
 * each step range ran on.
 *
 * HDF5 writing and reading, the directory (names, latest, keep) and
 * atomicity are src/ckpt's; the engine only lends its model. */
#include <stdio.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"
#include "tools/train/train.h"

int train_may_resume(const struct dm_config *cfg)
{
    if (!strcmp(cfg->resume, "none")) return 0;
    return strcmp(cfg->resume, "auto") != 0 || cfg->ckpt_dir[0] != '\0';
}

void train_save(struct engine *eng, const struct dm_config *cfg, uint64_t train_checksum,
                const struct layout_history *history, long steps_done, char *path_out,
                size_t path_out_size)
{
    const struct pipe_grid *g = engine_grid(eng);
    int S = g->stages, D = g->replicas, L = cfg->layers;
    char config_text[16384];
    config_print(cfg, config_text, sizeof config_text);
    long *cursor = dm_alloc((size_t)D * sizeof(long));
    long replica_samples = (long)cfg->micro_batches * (cfg->batch / (D * cfg->micro_batches));
    for (int r = 0; r < D; r++) cursor[r] = steps_done * cfg->batch + (long)r * replica_samples;
    struct ckpt_meta meta = {
        .step = steps_done,
        .optimizer_steps = steps_done,
        .lr_schedule_step = steps_done,
        .seed = cfg->seed,
        .train_checksum = train_checksum,
        .config_text = config_text,
        .pp = S,
        .dp = D,
        .data_cursor = cursor,
        .layout = (int *)engine_layout(eng),
        .history = *history,   /* borrowed: save only reads it */
    };
    if (train_units(cfg) == BALANCE_UNITS_SUBLAYER) {
        /* the layout and history in units; a block split over two stages
         * is written whole by its attention's holder */
        meta.unit_layout = meta.layout;
        meta.unit_history = *history;
        engine_gather_split_blocks(eng);
    }
    int chunks = cfg->virtual_stages;   /* interleaved: a model per chunk */
    struct gpt *models = dm_alloc((size_t)chunks * sizeof *models);
    engine_chunk_models(eng, models);   /* after the gather: the blocks saved */
    int *frozen = dm_alloc((size_t)L * sizeof(int));   /* own blocks' entries only */
    for (int c = 0; c < chunks; c++)
        for (int i = 0; i < models[c].num_blocks; i++)
            frozen[models[c].first_block + i] = models[c].blocks[i].frozen != 0;
    meta.frozen = frozen;
    /* The scheme's own state (freezing's window), the same on every rank. */
    struct dyn *dyn = engine_dyn(eng);
    meta.dyn_state_count = dyn_state_size(dyn);
    if (meta.dyn_state_count > 0) {
        snprintf(meta.dyn_kind, sizeof meta.dyn_kind, "%s", dyn_kind_name(dyn));
        meta.dyn_state = dm_alloc((size_t)meta.dyn_state_count * sizeof(double));
        dyn_state_save(dyn, meta.dyn_state);
    }
    char err[1024];
    if (ckpt_save_chunks(cfg->ckpt_dir, cfg->keep, models, chunks, &meta, g->stage, g->replica,
                         MPI_COMM_WORLD, path_out, path_out_size, err, sizeof err) != 0)
        dm_user_error("%s", err);
    dm_free(models);
    dm_free(cursor);
    dm_free(frozen);
    dm_free(meta.dyn_state);
}

/* The scheme's own state from the checkpoint, when it holds one of this
 * run's dyn.kind (every rank alike: meta is the same everywhere). One that
 * does not fit (another window) is not an error: the scheme starts its
 * state again from this step, and rank 0 says so. */
static void restore_dyn_state(struct engine *eng, const struct ckpt_meta *meta,
                              const char *path)
{
    struct dyn *dyn = engine_dyn(eng);
    if (meta->dyn_state_count == 0) {   /* none saved: an older file, or another kind's */
        if (dyn_state_size(dyn) > 0)
            dm_log("resume: %s holds no dyn.kind = %s state (written without it): the "
                   "scheme's state starts again from this step\n", path, dyn_kind_name(dyn));
        return;
    }
    if (strcmp(meta->dyn_kind, dyn_kind_name(dyn)) != 0) {
        dm_log("resume: %s holds the state of dyn.kind = %s; this run has dyn.kind = %s, "
               "so it is not used\n", path, meta->dyn_kind, dyn_kind_name(dyn));
        return;
    }
    char reason[512];
    if (dyn_state_restore(dyn, meta->dyn_state, meta->dyn_state_count, reason,
                          sizeof reason) != 0)
        dm_log("resume: the dyn.kind = %s state of %s does not fit this run: %s\n",
               meta->dyn_kind, path, reason);
}

/* Under interleaved, chunks 1.. of the model from the checkpoint chunk 0
 * was loaded from (each load reads its own blocks, any layout). */
static void load_other_chunks(struct engine *eng, const struct dm_config *cfg,
                              const char *path)
{
    for (int c = 1; c < cfg->virtual_stages; c++) {
        struct ckpt_meta again;
        memset(&again, 0, sizeof again);
        ckpt_load(path, engine_chunk_model(eng, c), &again, MPI_COMM_WORLD);
        ckpt_meta_free(&again);
    }
    engine_chunk_model(eng, 0);
}

/* Loads the checkpoint cfg names, if any, into meta and the model (every
 * chunk); returns 1 when one was loaded. */
static int load_named_checkpoint(struct engine *eng, const struct dm_config *cfg,
                                 struct ckpt_meta *meta, char *path, size_t path_size)
{
    if (!train_may_resume(cfg)) return 0;
    struct gpt *first = engine_chunk_model(eng, 0);
    if (!strcmp(cfg->resume, "auto")) {
        if (!ckpt_resume_auto(cfg->ckpt_dir, first, meta, MPI_COMM_WORLD, path, path_size))
            return 0;
    } else {
        snprintf(path, path_size, "%s", cfg->resume);
        ckpt_load(path, first, meta, MPI_COMM_WORLD);
    }
    load_other_chunks(eng, cfg, path);
    return 1;
}

long train_resume(struct engine *eng, const struct dm_config *cfg, uint64_t train_checksum,
                  struct layout_history *history)
{
    struct ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    char path[1200];
    if (!load_named_checkpoint(eng, cfg, &meta, path, sizeof path)) {
        if (train_may_resume(cfg)) engine_init_weights(eng);   /* engine_create deferred them */
        return 0;
    }
    if (meta.seed != cfg->seed)
        dm_user_error("checkpoint %s was written with train.seed = %llu but this run has %llu: "
                      "resuming would change the data order", path,
                      (unsigned long long)meta.seed, (unsigned long long)cfg->seed);
    if (meta.train_checksum && meta.train_checksum != train_checksum && !cfg->allow_new_data)
        dm_user_error("checkpoint %s was written training on data with checksum %016llx, but "
                      "%s has %016llx: resuming would continue on other data (set "
                      "ckpt.allow_new_data=1 to continue on a new corpus on purpose)", path,
                      (unsigned long long)meta.train_checksum, cfg->train_path,
                      (unsigned long long)train_checksum);
    if (meta.step > cfg->steps)
        dm_user_error("checkpoint %s is at step %ld, beyond train.steps = %d", path, meta.step,
                      cfg->steps);
    /* The history carries over when it has this world's stage count, in
     * this run's units: a checkpoint of whole blocks doubles each count
     * for sublayer units; a sublayer run's (its history in units, /units)
     * keeps them, or maps to whole blocks where every entry maps. */
    int S = engine_grid(eng)->stages;
    layout_history_free(history);
    layout_history_init(history, train_unit_count(cfg));
    int *entry = dm_alloc((size_t)S * sizeof(int));
    const struct layout_history *stored = meta.unit_layout ? &meta.unit_history : &meta.history;
    enum balance_units stored_units = meta.unit_layout ? BALANCE_UNITS_SUBLAYER
                                                       : BALANCE_UNITS_BLOCK;
    for (int k = 0; k < stored->count; k++) {
        if (stored->stages[k] != S) continue;
        char err[512];
        if (balance_layout_convert(layout_history_entry(stored, k), stored_units, S,
                                   cfg->layers, train_units(cfg), entry, err,
                                   sizeof err) != BALANCE_OK)
            dm_user_error("checkpoint %s: layout history entry %d (from step %ld): %s; resume "
                          "it with balance.units = sublayer, or on another parallel.pp (only "
                          "a history of this stage count carries over)", path, k,
                          stored->step[k], err);
        layout_history_push(history, stored->step[k], entry, S);
    }
    dm_free(entry);
    layout_history_push(history, meta.step, engine_layout(eng), S);
    restore_dyn_state(eng, &meta, path);
    long step = meta.step;
    char layout[256];
    layout_format(layout, sizeof layout, engine_layout(eng), S);
    dm_log("resumed from %s at step %ld (written by %d x %d ranks, layout now %s)\n", path,
           step, meta.pp, meta.dp, layout);
    ckpt_meta_free(&meta);
    return step;
}
