/* The per-thread arithmetic of the mixture-of-experts kernels (moe.cu):
 * the combine and its backward, and the dispatch's backward, over the
 * routing's arrays (row and gate, (N, k): each pair's grouped row, -1
 * when dropped, and its gate weight). Each thread walks a token's k slots
 * in order, as src/model/moe.c's CPU ops do (the same float sums from the
 * same start, the dot products in double in channel order), so the bits
 * are the CPU's. Kept pairs have distinct rows: no two threads write one
 * element, and nothing is reduced across threads. */
#ifndef DYNMO_KERNELS_MOE_CUH
#define DYNMO_KERNELS_MOE_CUH

#include "common.cuh"

/* one element (token, c) per step: out = res1, then + gate x y[row] over
 * the token's kept slots in order */
DM_HD void moe_combine_forward_thread(struct dm_thread t, float *out, const float *res1,
                                      const float *y, const float *gate, const int *row,
                                      int N, int k, int C)
{
    for (long e = dm_thread_first(t); e < (long)N * C; e += dm_thread_stride(t)) {
        long token = e / C, c = e % C;
        float o = res1[e];
        for (int j = 0; j < k; j++) {
            int r = row[token * k + j];
            if (r < 0) continue;   /* dropped: contributes nothing */
            o += gate[token * k + j] * y[(long)r * C + c];
        }
        out[e] = o;
    }
}

/* one element (pair, c) per step: dy[row] = gate x dout[token] for each
 * kept pair; the rows of dropped pairs are not written */
DM_HD void moe_combine_dy_thread(struct dm_thread t, float *dy, const float *dout,
                                 const float *gate, const int *row, int N, int k, int C)
{
    for (long e = dm_thread_first(t); e < (long)N * k * C; e += dm_thread_stride(t)) {
        long pair = e / C, c = e % C;
        int r = row[pair];
        if (r >= 0) dy[(long)r * C + c] = gate[pair] * dout[(pair / k) * C + c];
    }
}

/* one pair per step: dgate = dout[token] . y[row] in double in channel
 * order, 0 for a dropped pair */
DM_HD void moe_combine_dgate_thread(struct dm_thread t, float *dgate, const float *dout,
                                    const float *y, const int *row, int N, int k, int C)
{
    for (long pair = dm_thread_first(t); pair < (long)N * k; pair += dm_thread_stride(t)) {
        int r = row[pair];
        if (r < 0) {
            dgate[pair] = 0.0f;
            continue;
        }
        const float *d = dout + (pair / k) * C, *yr = y + (long)r * C;
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)d[c] * yr[c];
        dgate[pair] = (float)dot;
    }
}

/* one element (token, c) per step: d_ln2 = the sum of dx[row] over the
 * token's kept slots in order, from 0 */
DM_HD void moe_dispatch_backward_thread(struct dm_thread t, float *d_ln2, const float *dx,
                                        const int *row, int N, int k, int C)
{
    for (long e = dm_thread_first(t); e < (long)N * C; e += dm_thread_stride(t)) {
        long token = e / C, c = e % C;
        float d = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = row[token * k + j];
            if (r < 0) continue;
            d += dx[(long)r * C + c];
        }
        d_ln2[e] = d;
    }
}

#endif
