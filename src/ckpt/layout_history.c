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

/* Room for `capacity` entries, keeping the ones there. */
static void reserve(struct layout_history *h, int capacity)
{
    if (capacity <= h->capacity) return;
    size_t n = (size_t)capacity, width = (size_t)h->layers;
    long *step = dm_alloc(n * sizeof(long));
    int *stages = dm_alloc(n * sizeof(int));
    int *layout = dm_alloc(n * width * sizeof(int));
    if (h->count) {
        memcpy(step, h->step, (size_t)h->count * sizeof(long));
        memcpy(stages, h->stages, (size_t)h->count * sizeof(int));
        memcpy(layout, h->layout, (size_t)h->count * width * sizeof(int));
    }
    dm_free(h->step);
    dm_free(h->stages);
    dm_free(h->layout);
    h->step = step;
    h->stages = stages;
    h->layout = layout;
    h->capacity = capacity;
}

void layout_history_alloc(struct layout_history *h, int layers, int count)
{
    DM_ASSERT(count >= 0);
    layout_history_free(h);
    layout_history_init(h, layers);
    reserve(h, count);
    h->count = count;
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
    if (h->count == h->capacity) reserve(h, h->capacity ? 2 * h->capacity : 16);
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
