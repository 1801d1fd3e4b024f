/* The checkpoint schema extension units.def: the unit layout of a run of
 * balance.units = sublayer (a block's attention and its MLP as separate
 * units of placement) as the group /units, its attribute kind and two
 * int32 datasets, the current units per stage and the history in units.
 * A file has it only when a sublayer run wrote it; every other file is its
 * version's schema alone, what it was before this extension.
 *
 * Here: the extension's lines compiled in and appended to a file's schema
 * (so the writer, the structural check and the full read treat /units like
 * every other entry), the reader of /units into struct ckpt_meta with its
 * checks, and the writer's attribute. The blocks' rows of such a file are
 * every checkpoint's; which layout a resumed run takes is the caller's.
 * No MPI. */
#include <stdio.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "ckpt/ckpt_file.h"
#include "ckpt/h5util.h"

#define SCHEMA_FILE "../../checkpoint_schema/units.def"
#define SCHEMA_NAME units_part
#define SCHEMA_STATIC
#include "dynmo/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
#undef SCHEMA_STATIC

/* Units per block of a sublayer run (dynmo/balance.h). */
#define UNITS_PER_BLOCK 2

const struct ckpt_schema *ckpt_schema_with_units(const struct ckpt_schema *base)
{
    return ckpt_schema_append(base, &units_part);
}

const struct ckpt_schema *ckpt_units_extend(hid_t file, struct ckpt_header *header)
{
    if (!dm_h5_path_exists(file, "/units")) return header->schema;
    header->schema = ckpt_schema_with_units(header->schema);
    header->dims.units_per_block = UNITS_PER_BLOCK;
    return header->schema;
}

/* The checks of what ckpt_units_read read: each entry a layout of the
 * units, the last the current one, and /layout's entry k the nearest
 * whole blocks to entry k. */
static void check_units(const struct ckpt_meta *meta, long units, struct ckpt_problems *problems)
{
    char why[256];
    long layers = units / UNITS_PER_BLOCK;
    if (balance_check_layout(meta->unit_layout, meta->pp, (int)units, why, sizeof why) !=
        BALANCE_OK) {
        ckpt_problem(problems, "/units/per_stage is not a layout of %ld units on %d stages: %s",
                     units, meta->pp, why);
        return;
    }
    const struct layout_history *h = &meta->unit_history;
    if (layout_history_check(h, why, sizeof why) != 0) {
        ckpt_problem(problems, "/units/history_per_stage: %s", why);
        return;
    }
    int *blocks = dm_alloc((size_t)layers * sizeof(int));
    for (int k = 0; k < h->count; k++) {
        const int *entry = layout_history_entry(h, k), *stored =
            layout_history_entry(&meta->history, k);
        int rc = balance_layout_nearest_blocks(entry, h->stages[k], (int)layers, blocks, why,
                                               sizeof why);
        if (rc != BALANCE_OK) {
            ckpt_problem(problems, "/units/history_per_stage entry %d: %s", k, why);
            break;
        }
        if (memcmp(blocks, stored, (size_t)h->stages[k] * sizeof(int)) != 0) {
            ckpt_problem(problems, "/layout/history_blocks_per_stage entry %d is not the "
                         "whole-block layout nearest /units/history_per_stage entry %d", k, k);
            break;
        }
    }
    dm_free(blocks);
    if (problems->count) return;
    const int *last = layout_history_entry(h, h->count - 1);
    if (memcmp(last, meta->unit_layout, (size_t)meta->pp * sizeof(int)) != 0)
        ckpt_problem(problems, "the unit layout history does not end with the current unit "
                     "layout /units/per_stage");
}

int ckpt_units_read(hid_t file, const struct ckpt_header *header, struct ckpt_meta *meta,
                    struct ckpt_problems *problems)
{
    const struct ckpt_dims *d = &header->dims;
    DM_ASSERT(d->units_per_block == UNITS_PER_BLOCK && meta->history.count == d->history);
    long units = d->units_per_block * d->layers;
    int before = problems->count;
    meta->unit_layout = dm_alloc((size_t)d->pp * sizeof(int));
    layout_history_alloc(&meta->unit_history, (int)units, (int)d->history);
    if (ckpt_read_dataset(file, header, "/units/per_stage", H5T_NATIVE_INT, meta->unit_layout,
                          problems) ||
        ckpt_read_dataset(file, header, "/units/history_per_stage", H5T_NATIVE_INT,
                          meta->unit_history.layout, problems))
        return -1;
    memcpy(meta->unit_history.step, meta->history.step, (size_t)d->history * sizeof(long));
    memcpy(meta->unit_history.stages, meta->history.stages, (size_t)d->history * sizeof(int));
    check_units(meta, units, problems);
    return problems->count == before ? 0 : -1;
}

void ckpt_units_write_attributes(hid_t file)
{
    hid_t group = DM_H5(H5Gopen2(file, "/units", H5P_DEFAULT));
    dm_h5_write_string_attr(group, "kind", "sublayer");
    DM_H5(H5Gclose(group));
}
