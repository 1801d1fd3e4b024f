/* The device reductions the host needs one number of: the sum of squares
 * of a tensor (the gradient norm, src/pipe/reduce.c). Deterministic: no
 * atomics; each chunk of DM_SUMSQ_CHUNK floats is summed by one thread in
 * eight double lanes, then one thread adds the chunks in order: the order
 * of src/model/gpt.c's sum_squares, so the same bits as the CPU. */
#ifndef DYNMO_KERNELS_REDUCE_CUH
#define DYNMO_KERNELS_REDUCE_CUH

#include "common.cuh"

enum { DM_SUMSQ_CHUNK = 8192 };

DM_HD long dm_sumsq_chunks(long n)
{
    return (n + DM_SUMSQ_CHUNK - 1) / DM_SUMSQ_CHUNK;
}

/* partial[c] = the squares of chunk c of x (n floats), one thread per chunk */
DM_HD void sumsq_chunk_thread(struct dm_thread t, double *partial, const float *x, long n)
{
    long chunks = dm_sumsq_chunks(n);
    for (long c = dm_thread_first(t); c < chunks; c += dm_thread_stride(t)) {
        long i0 = c * DM_SUMSQ_CHUNK;
        long i1 = i0 + DM_SUMSQ_CHUNK < n ? i0 + DM_SUMSQ_CHUNK : n;
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        long i = i0;
        for (; i + 8 <= i1; i += 8)
            for (int k = 0; k < 8; k++) lane[k] += (double)x[i + k] * x[i + k];
        for (int k = 0; i < i1; i++, k++) lane[k] += (double)x[i] * x[i];
        double s = 0.0;
        for (int k = 0; k < 8; k++) s += lane[k];
        partial[c] = s;
    }
}

/* total[0] = partial[0] + partial[1] + ... in order: one thread (thread 0) */
DM_HD void sumsq_total_thread(struct dm_thread t, double *total, const double *partial,
                              long chunks)
{
    if (dm_thread_first(t) != 0) return;
    double s = 0.0;
    for (long c = 0; c < chunks; c++) s += partial[c];
    total[0] = s;
}

#endif
