/* The trainer's checkpoint policy (train.h): which checkpoint a run
 * resumes from and what it checks there, what a checkpoint of the running
 * job holds (the model through the engine, the data cursors, the layout
 * history), and the history itself: the layout each step range ran on.
 *
 * HDF5 writing and reading, the directory (names, latest, keep) and
 * atomicity are src/ckpt's; the engine only lends its model. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"
#include "tools/train.h"

void layout_history_init(struct layout_history *h, int stages)
{
    memset(h, 0, sizeof *h);
    h->stages = stages;
}

void layout_history_free(struct layout_history *h)
{
    dm_free(h->step);
    dm_free(h->layout);
    memset(h, 0, sizeof *h);
}

void layout_history_push(struct layout_history *h, long step, const int *layout)
{
    int S = h->stages;
    if (h->count > 0 && !memcmp(h->layout + (size_t)(h->count - 1) * S, layout,
                                (size_t)S * sizeof(int)))
        return;
    if (h->count == h->cap) {
        int cap = h->cap ? 2 * h->cap : 16;
        long *steps = dm_alloc((size_t)cap * sizeof(long));
        int *layouts = dm_alloc((size_t)cap * S * sizeof(int));
        if (h->count) {
            memcpy(steps, h->step, (size_t)h->count * sizeof(long));
            memcpy(layouts, h->layout, (size_t)h->count * S * sizeof(int));
        }
        dm_free(h->step);
        dm_free(h->layout);
        h->step = steps;
        h->layout = layouts;
        h->cap = cap;
    }
    h->step[h->count] = step;
    memcpy(h->layout + (size_t)h->count * S, layout, (size_t)S * sizeof(int));
    h->count++;
}

int train_may_resume(const struct dm_config *cfg)
{
    if (!strcmp(cfg->resume, "none")) return 0;
    return strcmp(cfg->resume, "auto") != 0 || cfg->ckpt_dir[0] != '\0';
}

void train_save(struct engine *eng, const struct dm_config *cfg,
                const struct layout_history *history, long steps_done, char *path_out,
                size_t path_out_size)
{
    const struct pipe_grid *g = engine_grid(eng);
    struct gpt *model = engine_model(eng);
    int S = g->stages, D = g->replicas, L = cfg->layers;
    char config_text[16384];
    config_print(cfg, config_text, sizeof config_text);
    long *cursor = dm_alloc((size_t)D * sizeof(long));
    long replica_samples = (long)cfg->micro_batches * (cfg->batch / (D * cfg->micro_batches));
    for (int r = 0; r < D; r++) cursor[r] = steps_done * cfg->batch + (long)r * replica_samples;
    int *history_stages = dm_alloc((size_t)history->count * sizeof(int));
    int *history_layout = dm_alloc((size_t)history->count * L * sizeof(int));
    for (int k = 0; k < history->count; k++) {
        history_stages[k] = S;
        memcpy(history_layout + (size_t)k * L, history->layout + (size_t)k * S,
               (size_t)S * sizeof(int));
    }
    struct ckpt_meta meta = {
        .step = steps_done,
        .optimizer_steps = steps_done,
        .lr_schedule_step = steps_done,
        .seed = cfg->seed,
        .config_text = config_text,
        .pp = S,
        .dp = D,
        .data_cursor = cursor,
        .layout = (int *)engine_layout(eng),
        .history_count = history->count,
        .history_step = history->step,
        .history_stages = history_stages,
        .history_layout = history_layout,
    };
    int *frozen = dm_alloc((size_t)L * sizeof(int));   /* own blocks' entries only */
    for (int i = 0; i < model->num_blocks; i++)
        frozen[model->first_block + i] = model->blocks[i].frozen != 0;
    meta.frozen = frozen;
    char err[1024];
    if (ckpt_save(cfg->ckpt_dir, cfg->keep, model, &meta, g->stage, g->replica, MPI_COMM_WORLD,
                  path_out, path_out_size, err, sizeof err) != 0)
        dm_user_error("%s", err);
    dm_free(cursor);
    dm_free(frozen);
    dm_free(history_stages);
    dm_free(history_layout);
}

/* Loads the checkpoint cfg names, if any, into meta and the model;
 * returns 1 when one was loaded. */
static int load_named_checkpoint(struct engine *eng, const struct dm_config *cfg,
                                 struct ckpt_meta *meta, char *path, size_t path_size)
{
    if (!train_may_resume(cfg)) return 0;
    if (!strcmp(cfg->resume, "auto"))
        return ckpt_resume_auto(cfg->ckpt_dir, engine_model(eng), meta, MPI_COMM_WORLD, path,
                                path_size);
    snprintf(path, path_size, "%s", cfg->resume);
    ckpt_load(path, engine_model(eng), meta, MPI_COMM_WORLD);
    return 1;
}

long train_resume(struct engine *eng, const struct dm_config *cfg,
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
    if (meta.step > cfg->steps)
        dm_user_error("checkpoint %s is at step %ld, beyond train.steps = %d", path, meta.step,
                      cfg->steps);
    /* The history carries over when it has this world's stage count. */
    int S = engine_grid(eng)->stages;
    layout_history_free(history);
    layout_history_init(history, S);
    for (int k = 0; k < meta.history_count; k++)
        if (meta.history_stages[k] == S)
            layout_history_push(history, meta.history_step[k],
                                meta.history_layout + (size_t)k * cfg->layers);
    layout_history_push(history, meta.step, engine_layout(eng));
    long step = meta.step;
    char layout[256];
    layout_format(layout, sizeof layout, engine_layout(eng), S);
    dm_log("resumed from %s at step %ld (written by %d x %d ranks, layout now %s)\n", path,
           step, meta.pp, meta.dp, layout);
    ckpt_meta_free(&meta);
    return step;
}

/* Rank 0: <ckpt.dir>/next_world (docs/jobs.md), written to a temporary
 * name, fsynced and renamed, after the checkpoint it names is complete. */
void train_write_next_world(const char *dir, int pp, int dp, const int *layout, long step,
                             const char *ckpt_path)
{
    char tmp[1200], final[1200], text[2048], layout_text[512];
    snprintf(tmp, sizeof tmp, "%s/next_world.tmp", dir);
    snprintf(final, sizeof final, "%s/next_world", dir);
    layout_format(layout_text, sizeof layout_text, layout, pp);
    const char *base = strrchr(ckpt_path, '/');
    base = base ? base + 1 : ckpt_path;
    int n = snprintf(text, sizeof text,
                     "# written by dynmo %s on re-pack: the next world of this job chain\n"
                     "ranks = %d\npp = %d\ndp = %d\nlayout = %s\nstep = %ld\ncheckpoint = %s\n",
                     DYNMO_VERSION, pp * dp, pp, dp, layout_text, step, base);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) dm_user_error_local("cannot write %s: %s", tmp, dm_errno_text());
    if (write(fd, text, (size_t)n) != n || fsync(fd) != 0)
        dm_user_error_local("cannot write %s: %s", tmp, dm_errno_text());
    close(fd);
    if (rename(tmp, final) != 0)
        dm_user_error_local("cannot rename %s: %s", tmp, dm_errno_text());
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

