/* What import-hf, export-hf and eval share: their argument checks and the
 * one place a checkpoint file is published under a name of the user's
 * choosing. Private to src/tools/weights. */
#ifndef DYNMO_TOOLS_WEIGHTS_H
#define DYNMO_TOOLS_WEIGHTS_H

#include "dynmo/ckpt.h"

/* An argument of import-hf or export-hf that is no option of theirs: their
 * one positional argument, into *slot; a user error (naming `tool`, then
 * its usage) when it looks like an option or *slot is taken already. */
void weights_positional(const char *tool, const char *usage, const char *arg,
                        const char **slot);

/* Checks that `out` can become a new file: it does not exist (a user's
 * file is never replaced), its directory exists and is one, and it does
 * not end in .tmp (dynmo's name for an incomplete checkpoint). dm_user_error
 * otherwise, naming `tool` and the path. */
void weights_check_new_file(const char *tool, const char *out);

/* Saves the whole model (one rank holds everything; comm of size 1) as a
 * step-0 checkpoint with meta, then publishes it at `out`: the checkpoint
 * is written by ckpt_save into a new directory beside out, linked to out
 * (which must still not exist: link never replaces), and the directory
 * removed; the parent directory is fsynced. A failure at any point leaves
 * nothing behind (the directory is removed at exit) and is dm_user_error
 * naming the path. */
void weights_save_checkpoint(const char *tool, const char *out, const struct gpt *model,
                             struct ckpt_meta *meta);

/* Loads checkpoint `path` into *model, built whole on this one rank for
 * the model the file holds (its dense shape: a model with a scheme's
 * blocks is refused by the caller from meta first). meta is the file's
 * (ckpt_read_info); free it with ckpt_meta_free. dm_user_error on any
 * problem. Collective over MPI_COMM_WORLD of size 1. */
void weights_load_checkpoint(const char *path, struct gpt *model, struct ckpt_meta *meta);

/* Why a checkpoint's model cannot be used as a dense GPT-2, or NULL: its
 * blocks carry a scheme (mixture of experts or of depths, hash
 * attention), or weights_not_evaluable's reasons. */
const char *weights_not_dense(const struct ckpt_meta *meta, char *buf, size_t size);

/* Why eval does not compute a checkpoint's model, or NULL: some blocks
 * are pruned, or it was trained with early exit. The text goes in buf. */
const char *weights_not_evaluable(const struct ckpt_meta *meta, char *buf, size_t size);

#endif
