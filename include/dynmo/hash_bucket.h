/* Hash attention's bucket of one query or key row, written once for the
 * CPU ops (src/model/bucket_attention.c) and the plugin's kernels
 * (kernels/hash.cuh, one thread per row): the same projections in the same
 * order, so the same buckets, bit for bit (dynmo/shared_fn.h). Nothing is
 * kept per column: the bucket count (hash.buckets) sizes no array. */
#ifndef DYNMO_HASH_BUCKET_H
#define DYNMO_HASH_BUCKET_H

#include "dynmo/shared_fn.h"

/* The kernels' tiles: HASH_TILE x HASH_TILE of the bucket-sorted order. */
enum { HASH_TILE = 32 };

/* x . R[:, c] for x (hs), R (hs, half) */
DM_SHARED_FN float dm_hash_projection(const float *x, const float *R, int hs, int half, int c)
{
    float s = 0.0f;
    for (int d = 0; d < hs; d++) s += x[d] * R[(long)d * half + c];
    return s;
}

/* The bucket of x: the first maximum of [xR ; -xR] in that index order
 * (torch.argmax's tie rule); 0 when half = 0 (one bucket). */
DM_SHARED_FN int dm_hash_bucket(const float *x, const float *R, int hs, int half)
{
    if (half == 0) return 0;
    int best = 0;
    float best_value = dm_hash_projection(x, R, hs, half, 0);
    for (int c = 1; c < half; c++) {
        float p = dm_hash_projection(x, R, hs, half, c);
        if (p > best_value) best = c, best_value = p;
    }
    for (int c = 0; c < half; c++) {
        float p = -dm_hash_projection(x, R, hs, half, c);
        if (p > best_value) best = half + c, best_value = p;
    }
    return best;
}

#endif
