/* The layout history: which layout (blocks per stage) held from which
 * step. One type for everyone who keeps it: the engine while it trains,
 * the checkpoint's meta when it is saved and loaded, the tools that show
 * it. An entry is appended only when the layout changes, so a history is
 * short (one entry per re-layout or re-pack).
 *
 * Plain arrays and no I/O: the checkpoint writer and reader move the
 * arrays to and from HDF5, this file never calls HDF5 or MPI. Validation
 * of untrusted input (a file) returns a message; the push's invariants are
 * assertions, because a caller that pushes a bad layout has a bug. */
#include <stdio.h>
#include <string.h>
#include "dynmo/ckpt.h"

void layout_history_init(struct layout_history *h, int layers)
{
    DM_ASSERT(layers >= 0);
    memset(h, 0, sizeof *h);
    h->layers = layers;
}

void layout_history_free(struct layout_history *h)
{
    dm_free(h->step);
    dm_free(h->stages);
    dm_free(h->layout);
    memset(h, 0, sizeof *h);
}

void layout_history_alloc(struct layout_history *h, int layers, int count)
{
    DM_ASSERT(count >= 0);
    layout_history_free(h);
    layout_history_init(h, layers);
    if (count == 0) return;
    h->step = dm_alloc((size_t)count * sizeof(long));
    h->stages = dm_alloc((size_t)count * sizeof(int));
    h->layout = dm_alloc((size_t)count * (size_t)layers * sizeof(int));
    h->capacity = h->count = count;
}

int layout_history_push(struct layout_history *h, long step, const int *layout, int stages)
{
    DM_ASSERT(stages >= 1 && stages <= h->layers);
    int sum = 0;
    for (int s = 0; s < stages; s++) {
        DM_ASSERT(layout[s] >= 1);
        sum += layout[s];
    }
    DM_ASSERT(sum == h->layers);
    if (h->count > 0) {
        int last = h->count - 1;
        DM_ASSERT(step >= h->step[last]);
        if (h->stages[last] == stages &&
            !memcmp(layout_history_entry(h, last), layout, (size_t)stages * sizeof(int)))
            return 0;
    }
    long capacity = h->capacity;   /* the three arrays grow together */
    h->step = dm_grow(h->step, sizeof(long), h->count, &capacity, 16);
    capacity = h->capacity;
    h->stages = dm_grow(h->stages, sizeof(int), h->count, &capacity, 16);
    h->layout = dm_grow(h->layout, (size_t)h->layers * sizeof(int), h->count, &h->capacity, 16);
    int *row = h->layout + (size_t)h->count * (size_t)h->layers;
    memset(row, 0, (size_t)h->layers * sizeof(int));
    memcpy(row, layout, (size_t)stages * sizeof(int));
    h->step[h->count] = step;
    h->stages[h->count] = stages;
    h->count++;
    return 1;
}

const int *layout_history_entry(const struct layout_history *h, int k)
{
    DM_ASSERT(k >= 0 && k < h->count);
    return h->layout + (size_t)k * (size_t)h->layers;
}

int layout_history_at(const struct layout_history *h, long step)
{
    int found = -1;
    for (int k = 0; k < h->count && h->step[k] <= step; k++) found = k;
    return found;
}

void layout_history_copy(struct layout_history *dst, const struct layout_history *src)
{
    layout_history_alloc(dst, src->layers, src->count);
    if (!src->count) return;
    memcpy(dst->step, src->step, (size_t)src->count * sizeof(long));
    memcpy(dst->stages, src->stages, (size_t)src->count * sizeof(int));
    memcpy(dst->layout, src->layout,
           (size_t)src->count * (size_t)src->layers * sizeof(int));
}

int layout_history_check(const struct layout_history *h, char *err, size_t errsize)
{
    int layers = h->layers;
    for (int k = 0; k < h->count; k++) {
        /* A long sum: a file's entries may be as large as an int allows. */
        int stages = h->stages[k], ok = stages >= 1 && stages <= layers;
        long sum = 0;
        const int *row = h->layout + (size_t)k * (size_t)layers;
        for (int s = 0; ok && s < layers; s++) {
            ok = s < stages ? row[s] >= 1 : row[s] == 0;
            sum += row[s];
        }
        if (!ok || sum != layers) {
            snprintf(err, errsize, "layout history entry %d (%d stages) is not a layout of "
                     "%d blocks padded with zeros", k, stages, layers);
            return -1;
        }
        if (k > 0 && h->step[k] < h->step[k - 1]) {
            snprintf(err, errsize, "the layout history's step decreases at entry %d (%ld "
                     "after %ld)", k, h->step[k], h->step[k - 1]);
            return -1;
        }
    }
    return 0;
}
