/* The group of one query or key row under a rotation (attention within
 * groups, model.h's group_attention_*; hash-sparse attention's hash),
 * written once for the CPU ops (src/model/group_attention.c) and the
 * plugin's kernels (kernels/hash.cuh, one thread per row): the same
 * projections in the same order, so the same groups, bit for bit
 * (dynmo/shared_fn.h). Nothing is kept per column: the group count
 * (hash.buckets) sizes no array. */
#ifndef DYNMO_ROTATION_GROUP_H
#define DYNMO_ROTATION_GROUP_H

#include "dynmo/shared_fn.h"

/* The kernels' tiles: GROUP_TILE x GROUP_TILE of the group-sorted order. */
enum { GROUP_TILE = 32 };

/* x . R[:, c] for x (hs), R (hs, half) */
DM_SHARED_FN float dm_rotation_projection(const float *x, const float *R, int hs, int half, int c)
{
    float s = 0.0f;
    for (int d = 0; d < hs; d++) s += x[d] * R[(long)d * half + c];
    return s;
}

/* The group of x: the first maximum of [xR ; -xR] in that index order
 * (torch.argmax's tie rule); 0 when half = 0 (one group). */
DM_SHARED_FN int dm_rotation_group(const float *x, const float *R, int hs, int half)
{
    if (half == 0) return 0;
    int best = 0;
    float best_value = dm_rotation_projection(x, R, hs, half, 0);
    for (int c = 1; c < half; c++) {
        float p = dm_rotation_projection(x, R, hs, half, c);
        if (p > best_value) best = c, best_value = p;
    }
    for (int c = 0; c < half; c++) {
        float p = -dm_rotation_projection(x, R, hs, half, c);
        if (p > best_value) best = half + c, best_value = p;
    }
    return best;
}

#endif
