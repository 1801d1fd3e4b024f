/* The checkpoint loader: ckpt_load with reshard (each rank reads the rows
 * of the blocks it owns under its own layout, whatever world wrote the
 * file), and the offline readers (ckpt_read_info, ckpt_check_file).
 *
 * Every rank opens the file on its own, read-only and serially (no
 * MPI-IO), checks it against the schema (ckpt_file.c) and reads its part;
 * then the ranks agree on one outcome and one message (a polled
 * reduction), so a file that fails on one rank fails on all and no rank
 * waits in a collective another skipped. Which file to load is the
 * caller's or, for resume=auto, ckpt_dir.c's: this file loads the one
 * path it is given and never scans a directory or falls back. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <hdf5_hl.h>
#include "dynmo/backend.h"
#include "dynmo/ckpt.h"
#include "dynmo/world.h"
#include "ckpt/ckpt_dir.h"
#include "ckpt/ckpt_file.h"
#include "ckpt/h5util.h"

#define MESSAGE_BYTES 1024

void ckpt_meta_free(struct ckpt_meta *meta)
{
    if (!meta->allocated) {
        DM_ASSERT(!meta->data_cursor && !meta->layout && !meta->sparsity && !meta->dyn_state &&
                  !meta->unit_layout);
        memset(meta, 0, sizeof *meta);
        return;
    }
    dm_free(meta->config_text);
    dm_free(meta->data_cursor);
    dm_free(meta->layout);
    layout_history_free(&meta->history);
    dm_free(meta->unit_layout);
    layout_history_free(&meta->unit_history);
    dm_free(meta->frozen);
    dm_free(meta->sparsity);
    dyn_ckpt_states_free(meta->scheme_states);
    dm_free(meta->dyn_state);
    memset(meta, 0, sizeof *meta);
}

/* The embedding slab, [wte wpe lnf_w lnf_b] for params, m and v, which
 * the first stage (embedding) and the last (head, tied wte) both hold:
 * read whole. Returns 0, or -1 after reporting. */
static int read_embedding_slab(hid_t file, float *slab, const struct gpt *model,
                               struct ckpt_problems *problems)
{
    size_t C = (size_t)model->shape.channels, n = model->embed_nparams;
    size_t wpe = (size_t)model->shape.vocab * C;
    size_t lnf = wpe + (size_t)model->shape.max_seq * C;
    float *bases[3] = {slab, slab + 2 * n, slab + 3 * n};   /* params, m, v */
    const char *kinds[3] = {"params", "adam_m", "adam_v"};
    for (int k = 0; k < 3; k++) {
        char name[4][64];
        snprintf(name[0], sizeof name[0], "/embedding/%s/wte", kinds[k]);
        snprintf(name[1], sizeof name[1], "/embedding/%s/wpe", kinds[k]);
        snprintf(name[2], sizeof name[2], "/head/%s/lnf_w", kinds[k]);
        snprintf(name[3], sizeof name[3], "/head/%s/lnf_b", kinds[k]);
        if (ckpt_read_floats(file, name[0], -1, 0, bases[k], problems) ||
            ckpt_read_floats(file, name[1], -1, 0, bases[k] + wpe, problems) ||
            ckpt_read_floats(file, name[2], -1, 0, bases[k] + lnf, problems) ||
            ckpt_read_floats(file, name[3], -1, 0, bases[k] + lnf + C, problems))
            return -1;
    }
    memset(slab + n, 0, n * sizeof(float));   /* grads */
    return 0;
}

/* The embedding slab read into the load's host staging on a device (the
 * slab itself when staging is NULL), then copied up. */
static int load_embedding_slab(hid_t file, struct gpt *model, float *staging,
                               struct ckpt_problems *problems)
{
    float *slab = gpt_embed_host_view(model, staging, 0);
    int status = read_embedding_slab(file, slab, model, problems);
    if (status == 0) gpt_embed_host_store(model, slab);
    return status;
}

/* Version 1: the block whole, its /blocks row. */
static int read_block_row(hid_t file, struct block *blk, struct ckpt_problems *problems)
{
    size_t n = block_param_count(blk->C);
    return ckpt_read_floats(file, "/blocks/params", blk->index, n, blk->params, problems) ||
           ckpt_read_floats(file, "/blocks/adam_m", blk->index, n, blk->m, problems) ||
           ckpt_read_floats(file, "/blocks/adam_v", blk->index, n, blk->v, problems);
}

/* One stored row of floats floats (stored floats in the file, the rest
 * padding read and dropped) into out. */
static int read_row(hid_t file, const char *name, long row, size_t floats, size_t stored,
                    float *out, struct ckpt_problems *problems)
{
    if (stored <= floats) return ckpt_read_floats(file, name, row, floats, out, problems);
    float *padded = dm_alloc(stored * sizeof(float));
    int status = ckpt_read_floats(file, name, row, stored, padded, problems);
    if (status == 0) memcpy(out, padded, floats * sizeof(float));
    dm_free(padded);
    return status;
}

/* A block's rows (dyn_ckpt_block_rows: the schemes', the sharded ones
 * being this block's own parts, and its /blocks row unless a scheme's
 * version holds its tensors). Returns 0, or -1 after reporting. */
static int read_block_rows(hid_t file, const struct ckpt_header *header,
                           const struct gpt *model, struct block *blk,
                           struct ckpt_problems *problems)
{
    struct dyn_ckpt_rows rows[DYN_CKPT_ROWS_MAX];
    int base, n = dyn_ckpt_block_rows(&model->shape, header->schema_version, blk, rows,
                                      DYN_CKPT_ROWS_MAX, &base);
    if (!base && read_block_row(file, blk, problems)) return -1;
    float *bases[3] = {blk->params, blk->m, blk->v};
    const char *kinds[3] = {"params", "adam_m", "adam_v"};
    for (int r = 0; r < n; r++)
        for (int k = 0; k < 3; k++) {
            char name[96];
            snprintf(name, sizeof name, "%s/%s", rows[r].group, kinds[k]);
            for (long i = 0; i < rows[r].count; i++)
                if (read_row(file, name, rows[r].row + i, rows[r].floats, rows[r].stored,
                             bases[k] + rows[r].offset + (size_t)i * rows[r].floats, problems))
                    return -1;
        }
    return 0;
}

/* A block's rows into its slab (into the load's host staging on a device,
 * then copied up; the slab itself when staging is NULL); its gradients
 * zero. Returns 0, or -1 after reporting. */
static int load_block(hid_t file, const struct ckpt_header *header,
                      const struct ckpt_meta *meta, const struct gpt *model, struct block *blk,
                      float *staging, struct ckpt_problems *problems)
{
    /* the schemes' states first: which rows a block reads may depend on
     * them (an MoE block's kept placement names the experts it holds) */
    dyn_ckpt_apply_states(meta->scheme_states, &model->shape, blk);
    struct block view = block_host_view(blk, staging, 0);
    int status = read_block_rows(file, header, model, &view, problems);
    if (status == 0) {
        memset(view.grads, 0, view.nparams * sizeof(float));
        block_host_view_store(blk, &view);
    }
    return status ? -1 : 0;
}

/* Every slab of this rank, its blocks' and the embedding's, through one
 * host staging buffer (a device's slabs copied up one after another; none
 * on the CPU). Returns 0, or -1 after reporting. */
static int load_slabs(hid_t file, const struct ckpt_header *header,
                      const struct ckpt_meta *meta, struct gpt *model,
                      struct ckpt_problems *problems)
{
    float *staging = gpt_host_staging(model);
    int status = 0;
    for (int i = 0; i < model->num_blocks && status == 0; i++) {
        struct block *blk = &model->blocks[i];
        DM_ASSERT(blk->index == model->first_block + i &&
                  blk->nparams == gpt_block_param_count(&model->shape, blk->index));
        status = load_block(file, header, meta, model, blk, staging, problems);
        if (status == 0) blk->frozen = meta->frozen ? meta->frozen[blk->index] : 0;
    }
    if (status == 0 && model->embed_slab)
        status = load_embedding_slab(file, model, staging, problems);
    backend_staging_free(staging);
    return status;
}

/* This rank's part of a load; no communication. */
static enum ckpt_load_outcome load_local(const char *path, struct gpt *model,
                                    struct ckpt_meta *meta, char *err, size_t errsize)
{
    memset(meta, 0, sizeof *meta);
    if (ckpt_is_temporary_name(path)) {
        dm_set_message(err, errsize, "checkpoint %s: incomplete: a .tmp file is a checkpoint "
                 "still being written or abandoned by a killed writer, and is never "
                 "loaded (its completion marker is missing)", path);
        return CKPT_LOAD_BAD_FILE;
    }
    struct ckpt_problems problems = {.path = path};
    struct ckpt_header header;
    enum ckpt_load_outcome outcome = CKPT_LOAD_BAD_FILE;
    hid_t file = ckpt_open_checked(path, &problems, &header);
    if (problems.count) goto done;
    char reason[768];
    if (ckpt_compare_shape(&header.shape, &model->shape, reason, sizeof reason) != 0) {
        dm_set_message(err, errsize, "checkpoint %s: %s", path, reason);
        outcome = CKPT_LOAD_MODEL_MISMATCH;
        goto close;
    }
    if (ckpt_read_meta_from(file, &header, meta, &problems) != 0) goto done;
    if (load_slabs(file, &header, meta, model, &problems) != 0) goto done;
    outcome = CKPT_LOAD_OK;
done:
    if (outcome != CKPT_LOAD_OK && problems.count)
        dm_set_message(err, errsize, "%s", problems.first);
close:
    if (file >= 0) H5Fclose(file);
    ckpt_header_free(&header);
    if (outcome != CKPT_LOAD_OK) ckpt_meta_free(meta);
    return outcome;
}

enum ckpt_load_outcome ckpt_load_agreed(const char *path, struct gpt *model,
                                        struct ckpt_meta *meta, MPI_Comm comm, char *err,
                                        size_t errsize)
{
    dm_h5_init();
    char message[MESSAGE_BYTES] = "";
    enum ckpt_load_outcome outcome = load_local(path, model, meta, message, sizeof message);
    enum ckpt_load_outcome agreed = world_agree((int)outcome, message, comm, err, errsize);
    if (agreed != CKPT_LOAD_OK && outcome == CKPT_LOAD_OK) ckpt_meta_free(meta);
    return agreed;
}

int ckpt_load_try(const char *path, struct gpt *model, struct ckpt_meta *meta,
                  MPI_Comm comm, char *err, size_t errsize)
{
    return ckpt_load_agreed(path, model, meta, comm, err, errsize) == CKPT_LOAD_OK ? 0 : -1;
}

void ckpt_load(const char *path, struct gpt *model, struct ckpt_meta *meta, MPI_Comm comm)
{
    char err[MESSAGE_BYTES];
    if (ckpt_load_try(path, model, meta, comm, err, sizeof err) != 0)
        dm_user_error("%s", err);
}

/* ---- offline readers ------------------------------------------------------------------ */

int ckpt_read_info(const char *path, struct ckpt_meta *meta, char *err, size_t errsize)
{
    dm_h5_init();
    memset(meta, 0, sizeof *meta);
    struct ckpt_problems problems = {.path = path};
    struct ckpt_header header;
    hid_t file = ckpt_open_checked(path, &problems, &header);
    if (!problems.count) ckpt_read_meta_from(file, &header, meta, &problems);
    if (file >= 0) H5Fclose(file);
    ckpt_header_free(&header);
    if (problems.count) {
        ckpt_meta_free(meta);
        dm_set_message(err, errsize, "%s", problems.first);
        return -1;
    }
    return 0;
}

/* What ckpt_check_file checks once the structure passed: the metadata's
 * values and, with read_data, every chunk. */
static void check_contents(hid_t file, const struct ckpt_header *header, int read_data,
                           struct ckpt_problems *problems)
{
    struct ckpt_meta meta;
    ckpt_read_meta_from(file, header, &meta, problems);
    ckpt_meta_free(&meta);
    if (read_data) ckpt_read_all(file, header, problems);
}

int ckpt_check_file(const char *path, int read_data,
                    void (*report)(void *ctx, const char *problem), void *ctx)
{
    dm_h5_init();
    struct ckpt_problems problems = {.path = path, .report = report, .ctx = ctx};
    struct ckpt_header header;
    hid_t file = ckpt_open_checked(path, &problems, &header);
    if (file >= 0 && !problems.count) check_contents(file, &header, read_data, &problems);
    if (file >= 0) H5Fclose(file);
    ckpt_header_free(&header);
    return problems.count;
}

int ckpt_check_image(const void *image, size_t size, const char *name, int read_data,
                     void (*report)(void *ctx, const char *problem), void *ctx)
{
    dm_h5_init();
    struct ckpt_problems problems = {.path = name, .report = report, .ctx = ctx};
    char reason[512];
    if (dm_h5_check_global_heaps(image, size, size, reason, sizeof reason) != 0) {
        ckpt_problem(&problems, "%s", reason);
        return problems.count;
    }
    /* H5LTopen_file_image copies the image (flags 0) and opens it read-only. */
    hid_t file = size > 0 ? H5LTopen_file_image((void *)image, size, 0) : -1;
    if (file < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        ckpt_problem(&problems, "not an HDF5 file, or a damaged one: %s", text);
        return problems.count;
    }
    struct ckpt_header header;
    if (ckpt_check_structure(file, &problems, &header) == 0 && !problems.count)
        check_contents(file, &header, read_data, &problems);
    H5Fclose(file);
    ckpt_header_free(&header);
    return problems.count;
}
