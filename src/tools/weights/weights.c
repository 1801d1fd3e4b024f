/* The argument checks and the checkpoint publishing that import-hf,
 * export-hf and eval share (weights.h). It must not know any file format
 * but dynmo's checkpoint, and that only through dynmo/ckpt.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "tools/weights/weights.h"

static char pending_dir[4400];

/* The temporary directory of a publish that did not finish: removed at
 * exit with what ckpt_save left in it (its checkpoint, latest, a .tmp). */
static void remove_pending(void)
{
    if (!pending_dir[0]) return;
    const char *names[] = {"ckpt-0.h5", "ckpt-0.h5.tmp", "latest", "latest.tmp"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char file[4500];
        snprintf(file, sizeof file, "%s/%s", pending_dir, names[i]);
        unlink(file);
    }
    rmdir(pending_dir);
    pending_dir[0] = '\0';
}

/* The directory part of path ("." when it has none). */
static void parent_of(const char *path, char *parent, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(parent, size, ".");
    else if (slash == path) snprintf(parent, size, "/");
    else snprintf(parent, size, "%.*s", (int)(slash - path), path);
}

void weights_positional(const char *tool, const char *usage, const char *arg,
                        const char **slot)
{
    if (arg[0] == '-' || *slot) dm_user_error("%s: unexpected argument '%s'\n%s", tool, arg, usage);
    *slot = arg;
}

void weights_check_new_file(const char *tool, const char *out)
{
    size_t n = strlen(out);
    if (n == 0 || n > 4000 || out[n - 1] == '/')
        dm_user_error("%s: --out '%s' must name a file to create", tool, out);
    if (n >= 4 && !strcmp(out + n - 4, ".tmp"))
        dm_user_error("%s: --out %s ends in .tmp, which dynmo takes for an incomplete "
                      "checkpoint; choose another name", tool, out);
    struct stat st;
    if (lstat(out, &st) == 0)
        dm_user_error("%s: %s exists; dynmo never replaces a file (remove it, or choose "
                      "another --out)", tool, out);
    char parent[4096];
    parent_of(out, parent, sizeof parent);
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
        dm_user_error("%s: --out %s: its directory %s %s", tool, out, parent,
                      errno == ENOENT ? "does not exist" : "is not a directory");
}

void weights_save_checkpoint(const char *tool, const char *out, const struct gpt *model,
                             struct ckpt_meta *meta)
{
    char parent[4096], err[2048], saved[4400];
    parent_of(out, parent, sizeof parent);
    snprintf(pending_dir, sizeof pending_dir, "%s/.dynmo-%s-XXXXXX", parent, tool);
    if (!mkdtemp(pending_dir)) {
        snprintf(err, sizeof err, "%s", dm_errno_text());
        pending_dir[0] = '\0';
        dm_user_error("%s: cannot write beside %s: %s", tool, out, err);
    }
    atexit(remove_pending);
    if (ckpt_save(pending_dir, 0, model, meta, 0, 0, MPI_COMM_WORLD, saved, sizeof saved, err,
                  sizeof err))
        dm_user_error("%s: %s", tool, err);
    if (link(saved, out) != 0) {
        snprintf(err, sizeof err, "%s", dm_errno_text());
        dm_user_error("%s: cannot create %s: %s", tool, out, err);
    }
    remove_pending();
    if (dm_fsync_path(parent, err, sizeof err)) dm_user_error("%s: %s", tool, err);
}

void weights_load_checkpoint(const char *path, struct gpt *model, struct ckpt_meta *meta)
{
    struct ckpt_meta loaded;
    gpt_build_deferred(model, &meta->shape, 0, meta->shape.layers, 1, 1);
    ckpt_load(path, model, &loaded, MPI_COMM_WORLD);
    ckpt_meta_free(&loaded);
}

/* The schemes' lines on a model, joined with "; " (dyn_describe_shape). */
struct joined {
    char *buf;
    size_t size, used;
};

static void join_line(void *ctx, const char *line)
{
    struct joined *j = ctx;
    if (j->used >= j->size) return;
    int n = snprintf(j->buf + j->used, j->size - j->used, "%s%s", j->used ? "; " : "", line);
    if (n > 0) j->used += (size_t)n;
}

const char *weights_not_evaluable(const struct ckpt_meta *meta, char *buf, size_t size)
{
    for (int l = 0; l < meta->shape.layers; l++)
        if (meta->sparsity && meta->sparsity[l] > 0) {
            snprintf(buf, size, "it is pruned (layer %d: %.3g of its weights are zero; "
                     "a GPT-2 has no mask)", l, (double)meta->sparsity[l]);
            return buf;
        }
    if (meta->config_text && strstr(meta->config_text, "dyn.kind = prune\n")) {
        snprintf(buf, size, "it was trained with pruning (dyn.kind = prune): its weights are "
                 "masked, and a GPT-2 has no mask");
        return buf;
    }
    if (meta->config_text && strstr(meta->config_text, "dyn.kind = early_exit\n")) {
        snprintf(buf, size, "it was trained with early exit (dyn.kind = early_exit), whose "
                 "exits a GPT-2 does not have");
        return buf;
    }
    return NULL;
}

const char *weights_not_dense(const struct ckpt_meta *meta, char *buf, size_t size)
{
    if (meta->shape.ext_count > 0) {
        char schemes[400] = "";
        struct joined j = {schemes, sizeof schemes, 0};
        dyn_describe_shape(&meta->shape, join_line, &j);
        snprintf(buf, size, "its blocks are not all dense GPT-2 blocks (%s)",
                 schemes[0] ? schemes : "a scheme extends them");
        return buf;
    }
    return weights_not_evaluable(meta, buf, size);
}
