/* The per-thread arithmetic of the pruning kernels (prune.cu): the key of
 * a matrix weight, the histogram of one round of the distributed radix
 * select (src/dyn/prune.c) and the masking of a matrix by the cut.
 *
 * The key is src/model/sparse.c's block_prune_key: the bits of |w| above,
 * 0xffffffff minus the weight's global index below, so that a larger key
 * is kept first and ties go to the lower index. The histogram counts, of
 * the keys whose bits above shift + 8 equal the prefix's, how many fall
 * in each value of bits shift .. shift + 7 (DM_PRUNE_BUCKETS). It is two
 * launches without atomics: one thread per chunk of DM_PRUNE_CHUNK
 * weights writes its own row of partial counts, then one thread per
 * bucket adds the rows in chunk order to counts. Integers: the same
 * counts whatever the order. The mask is one thread per weight. */
#ifndef DYNMO_KERNELS_PRUNE_CUH
#define DYNMO_KERNELS_PRUNE_CUH

#include "common.cuh"
#include "dynmo/backend.h"

DM_HD uint64_t dm_prune_key(float weight, uint32_t global_index)
{
    union { float f; uint32_t u; } bits;
    bits.f = weight;
    return ((uint64_t)(bits.u & 0x7fffffffu) << 32) | (uint64_t)(0xffffffffu - global_index);
}

/* the bits above shift + 8 that a key must share with the prefix */
DM_HD uint64_t dm_prune_high_mask(int shift)
{
    return shift + 8 >= 64 ? 0 : ~(uint64_t)0 << (shift + 8);
}

/* Chunks of the partial counts for n weights. */
DM_HD long dm_prune_chunks(long n)
{
    return n > 0 ? (n + DM_PRUNE_CHUNK - 1) / DM_PRUNE_CHUNK : 1;
}

/* one chunk per step: partial[chunk] (DM_PRUNE_BUCKETS) = the chunk's counts */
DM_HD void prune_histogram_chunk_thread(struct dm_thread t, long *partial, const float *weights,
                                        long n, uint32_t base, uint64_t prefix, int shift)
{
    uint64_t high = dm_prune_high_mask(shift);
    for (long c = dm_thread_first(t); c < dm_prune_chunks(n); c += dm_thread_stride(t)) {
        long *row = partial + c * DM_PRUNE_BUCKETS;
        for (int b = 0; b < DM_PRUNE_BUCKETS; b++) row[b] = 0;
        long end = (c + 1) * DM_PRUNE_CHUNK < n ? (c + 1) * DM_PRUNE_CHUNK : n;
        for (long i = c * DM_PRUNE_CHUNK; i < end; i++) {
            uint64_t key = dm_prune_key(weights[i], base + (uint32_t)i);
            if ((key & high) == prefix) row[(key >> shift) & (DM_PRUNE_BUCKETS - 1)]++;
        }
    }
}

/* one bucket per step: counts[b] += the chunks' partial counts in order */
DM_HD void prune_histogram_sum_thread(struct dm_thread t, long *counts, const long *partial,
                                      long n)
{
    for (long b = dm_thread_first(t); b < DM_PRUNE_BUCKETS; b += dm_thread_stride(t)) {
        long sum = counts[b];
        for (long c = 0; c < dm_prune_chunks(n); c++) sum += partial[c * DM_PRUNE_BUCKETS + b];
        counts[b] = sum;
    }
}

/* one weight per step: mask = key > cut; a pruned weight's param, grad
 * and moments become zero */
DM_HD void prune_mask_thread(struct dm_thread t, unsigned char *mask, float *params,
                             float *grads, float *m, float *v, long n, uint32_t base,
                             uint64_t cut)
{
    for (long i = dm_thread_first(t); i < n; i += dm_thread_stride(t)) {
        unsigned char on = dm_prune_key(params[i], base + (uint32_t)i) > cut;
        mask[i] = on;
        if (!on) {
            params[i] = 0.0f;
            grads[i] = 0.0f;
            m[i] = 0.0f;
            v[i] = 0.0f;
        }
    }
}

#endif
