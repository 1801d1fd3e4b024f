/* The per-thread arithmetic of the CSR kernels (sparse.cu), for a weight
 * W (OC, C) in compressed sparse rows (row_ptr, col_idx, values) as
 * src/model/sparse.c keeps it. Every output element is summed by one
 * thread in the order the CPU kernel sums it, so the results are the
 * CPU's bits, run to run and against the CPU:
 *   forward   out[n, o] = sum over row o's nonzeros in order, then + bias;
 *   input     dinp[n, :] by one thread per row n, walking every nonzero in
 *             (row, position) order (the CPU's order for each element);
 *   weight    one thread per nonzero j: per tile of DM_SPARSE_TILE rows,
 *             the CPU's eight-lane dot product (two chains of vectors of
 *             eight, the lanes added pairwise), the tiles added in order;
 *   bias      one thread per channel, rows in order, in float.
 * (cuSPARSE's transposed products are not run-to-run deterministic, which
 * is why the input gradient is not a cusparseSpMM.) */
#ifndef DYNMO_KERNELS_SPARSE_CUH
#define DYNMO_KERNELS_SPARSE_CUH

#include "common.cuh"

#define DM_SPARSE_TILE 64   /* sparse.c's TILE: rows per partial of the weight gradient */

/* one element (n, o) per step: out = inp[n, :] . W[o, :] (+ bias[o]) */
DM_HD void sparse_forward_thread(struct dm_thread t, float *out, const float *inp,
                                 const int *row_ptr, const int *col_idx, const float *values,
                                 const float *bias, int N, int C, int OC)
{
    for (long e = dm_thread_first(t); e < (long)N * OC; e += dm_thread_stride(t)) {
        long n = e / OC, o = e % OC;
        const float *x = inp + n * C;
        float sum = 0.0f;
        for (int j = row_ptr[o]; j < row_ptr[o + 1]; j++) sum += values[j] * x[col_idx[j]];
        out[e] = bias ? sum + bias[o] : sum;
    }
}

/* one row n per step: dinp[n, :] = dout[n, :] @ W, overwritten */
DM_HD void sparse_dinp_thread(struct dm_thread t, float *dinp, const float *dout,
                              const int *row_ptr, const int *col_idx, const float *values,
                              int N, int C, int OC)
{
    for (long n = dm_thread_first(t); n < N; n += dm_thread_stride(t)) {
        float *dx = dinp + n * C;
        const float *d = dout + n * OC;
        for (int c = 0; c < C; c++) dx[c] = 0.0f;
        for (int o = 0; o < OC; o++)
            for (int j = row_ptr[o]; j < row_ptr[o + 1]; j++) dx[col_idx[j]] += values[j] * d[o];
    }
}

/* the row of nonzero j: the o with row_ptr[o] <= j < row_ptr[o + 1] */
DM_HD int dm_csr_row_of(const int *row_ptr, int rows, int j)
{
    int lo = 0, hi = rows - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (row_ptr[mid] <= j) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* sum over rows [n0, n0 + 64) of dout[n, o] inp[n, c] as sparse.c's
 * tile_dot and sum_lanes add it (rows past N count as 0 * 0) */
DM_HD float dm_sparse_tile_dot(const float *dout, const float *inp, long n0, int N, int o,
                               int c, int C, int OC)
{
    float lane[8];
    for (int k = 0; k < 8; k++) {
        float chain[2];
        for (int q = 0; q < 8; q++) {
            long n = n0 + q * 8 + k;
            float d = n < N ? dout[n * OC + o] : 0.0f, x = n < N ? inp[n * C + c] : 0.0f;
            if (q < 2) chain[q] = d * x;
            else chain[q % 2] += d * x;
        }
        lane[k] = chain[0] + chain[1];
    }
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* one nonzero j per step: dweight[o, c_j] += dout[:, o] . inp[:, c_j] */
DM_HD void sparse_dweight_thread(struct dm_thread t, float *dweight, const float *dout,
                                 const float *inp, const int *row_ptr, const int *col_idx,
                                 int nnz, int N, int C, int OC)
{
    for (long j = dm_thread_first(t); j < nnz; j += dm_thread_stride(t)) {
        int o = dm_csr_row_of(row_ptr, OC, (int)j), c = col_idx[j];
        float sum = 0.0f;
        for (long n0 = 0; n0 < N; n0 += DM_SPARSE_TILE)
            sum += dm_sparse_tile_dot(dout, inp, n0, N, o, c, C, OC);
        dweight[(long)o * C + c] += sum;
    }
}

/* one channel per step: dbias[o] += sum_n dout[n, o], in float, rows in order */
DM_HD void sparse_dbias_thread(struct dm_thread t, float *dbias, const float *dout, int N,
                               int OC)
{
    for (long o = dm_thread_first(t); o < OC; o += dm_thread_stride(t)) {
        float sum = 0.0f;
        for (long n = 0; n < N; n++) sum += dout[n * OC + o];
        dbias[o] += sum;
    }
}

#endif
