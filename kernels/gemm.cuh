/* Matrix products as cuBLAS sees them (matmul.cu, attention.cu).
 *
 * The model's tensors are row-major; cuBLAS is column-major. A row-major
 * (m, n) matrix is the column-major (n, m) matrix with the same leading
 * dimension, its transpose, so the row-major C = op(A) op(B) is the
 * column-major C^T = op(B)^T op(A)^T: swap A and B, swap m and n, keep
 * each operand's transpose flag (a row-major op(X) read column-major is
 * op(X)^T already). dm_gemm_to_column_major is that translation; the
 * builders below state every product the model runs in row-major terms,
 * as the CPU ops write them. tests/test_kernels_host.c applies the
 * translated arguments to CBLAS in column-major mode and compares with
 * the CPU ops. */
#ifndef DYNMO_KERNELS_GEMM_CUH
#define DYNMO_KERNELS_GEMM_CUH

#include "common.cuh"

enum { DM_NO_TRANS = 0, DM_TRANS = 1 };

/* C = alpha op(A) op(B) + beta C for `batch` products, item i at
 * a + i stride_a, b + i stride_b, c + i stride_c; C (m, n), op(A) (m, k),
 * op(B) (k, n), in the order the struct's `column_major` says. */
struct dm_gemm {
    int column_major;
    int trans_a, trans_b;
    int m, n, k;
    float alpha, beta;
    const float *a;
    int lda;
    long stride_a;
    const float *b;
    int ldb;
    long stride_b;
    float *c;
    int ldc;
    long stride_c;
    int batch;
};

DM_HD struct dm_gemm dm_gemm_row_major(int trans_a, int trans_b, int m, int n, int k,
                                       float alpha, const float *a, int lda, const float *b,
                                       int ldb, float beta, float *c, int ldc)
{
    struct dm_gemm g;
    g.column_major = 0;
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a;
    g.lda = lda;
    g.stride_a = 0;
    g.b = b;
    g.ldb = ldb;
    g.stride_b = 0;
    g.c = c;
    g.ldc = ldc;
    g.stride_c = 0;
    g.batch = 1;
    return g;
}

DM_HD struct dm_gemm dm_gemm_batched(struct dm_gemm g, int batch, long stride_a,
                                     long stride_b, long stride_c)
{
    g.batch = batch;
    g.stride_a = stride_a;
    g.stride_b = stride_b;
    g.stride_c = stride_c;
    return g;
}

DM_HD struct dm_gemm dm_gemm_to_column_major(struct dm_gemm row)
{
    struct dm_gemm col = row;
    col.column_major = 1;
    col.trans_a = row.trans_b;
    col.trans_b = row.trans_a;
    col.m = row.n;
    col.n = row.m;
    col.a = row.b;
    col.lda = row.ldb;
    col.stride_a = row.stride_b;
    col.b = row.a;
    col.ldb = row.lda;
    col.stride_b = row.stride_a;
    return col;
}

/* Floats from the first element of a column-major operand, (rows, cols)
 * stored with leading dimension ld, to one past its last, over `batch`
 * items stride apart: what a copy of the operand must cover (the gaps
 * between columns included, so the copy keeps ld and stride). */
DM_HD long dm_gemm_span(int rows, int cols, int ld, long stride, int batch)
{
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    return (long)(batch - 1) * stride + (long)ld * (cols - 1) + rows;
}

/* The span of A and of B of a column-major product: op(A) (m, k) is
 * stored (k, m) when transposed, op(B) (k, n) stored (n, k). */
DM_HD long dm_gemm_span_a(struct dm_gemm col)
{
    return col.trans_a ? dm_gemm_span(col.k, col.m, col.lda, col.stride_a, col.batch)
                       : dm_gemm_span(col.m, col.k, col.lda, col.stride_a, col.batch);
}

DM_HD long dm_gemm_span_b(struct dm_gemm col)
{
    return col.trans_b ? dm_gemm_span(col.n, col.k, col.ldb, col.stride_b, col.batch)
                       : dm_gemm_span(col.k, col.n, col.ldb, col.stride_b, col.batch);
}

/* ---- the model's products, row-major ------------------------------------ */

/* matmul_forward: out (N, OC) = inp (N, C) @ weight (OC, C)^T + beta out */
DM_HD struct dm_gemm dm_gemm_matmul_forward(float *out, const float *inp, const float *weight,
                                            int N, int C, int OC, float beta)
{
    return dm_gemm_row_major(DM_NO_TRANS, DM_TRANS, N, OC, C, 1.0f, inp, C, weight, C, beta,
                             out, OC);
}

/* matmul_backward, input: dinp (N, C) = dout (N, OC) @ weight (OC, C) + beta dinp */
DM_HD struct dm_gemm dm_gemm_matmul_dinp(float *dinp, const float *dout, const float *weight,
                                         int N, int C, int OC, float beta)
{
    return dm_gemm_row_major(DM_NO_TRANS, DM_NO_TRANS, N, C, OC, 1.0f, dout, OC, weight, C,
                             beta, dinp, C);
}

/* matmul_backward, weight: dweight (OC, C) += dout (N, OC)^T @ inp (N, C) */
DM_HD struct dm_gemm dm_gemm_matmul_dweight(float *dweight, const float *dout,
                                            const float *inp, int N, int C, int OC)
{
    return dm_gemm_row_major(DM_TRANS, DM_NO_TRANS, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                             dweight, C);
}

/* Attention over (B NH) items of q, k, v, dy: (T, hs) each, contiguous
 * (attention.cu permutes them out of qkv); att, scores: (T, T) each. */

/* att = scale q k^T */
DM_HD struct dm_gemm dm_gemm_attention_scores(float *att, const float *q, const float *k,
                                              int items, int T, int hs, float scale)
{
    struct dm_gemm g = dm_gemm_row_major(DM_NO_TRANS, DM_TRANS, T, T, hs, scale, q, hs, k, hs,
                                         0.0f, att, T);
    return dm_gemm_batched(g, items, (long)T * hs, (long)T * hs, (long)T * T);
}

/* y = att v */
DM_HD struct dm_gemm dm_gemm_attention_values(float *y, const float *att, const float *v,
                                              int items, int T, int hs)
{
    struct dm_gemm g = dm_gemm_row_major(DM_NO_TRANS, DM_NO_TRANS, T, hs, T, 1.0f, att, T, v,
                                         hs, 0.0f, y, hs);
    return dm_gemm_batched(g, items, (long)T * T, (long)T * hs, (long)T * hs);
}

/* dscores = dy v^T (then the softmax backward makes it d(q k^T)) */
DM_HD struct dm_gemm dm_gemm_attention_dprobs(float *dscores, const float *dy, const float *v,
                                              int items, int T, int hs)
{
    struct dm_gemm g = dm_gemm_row_major(DM_NO_TRANS, DM_TRANS, T, T, hs, 1.0f, dy, hs, v, hs,
                                         0.0f, dscores, T);
    return dm_gemm_batched(g, items, (long)T * hs, (long)T * hs, (long)T * T);
}

/* dq = dscores k */
DM_HD struct dm_gemm dm_gemm_attention_dq(float *dq, const float *dscores, const float *k,
                                          int items, int T, int hs)
{
    struct dm_gemm g = dm_gemm_row_major(DM_NO_TRANS, DM_NO_TRANS, T, hs, T, 1.0f, dscores, T,
                                         k, hs, 0.0f, dq, hs);
    return dm_gemm_batched(g, items, (long)T * T, (long)T * hs, (long)T * hs);
}

/* dk = dscores^T q */
DM_HD struct dm_gemm dm_gemm_attention_dk(float *dk, const float *dscores, const float *q,
                                          int items, int T, int hs)
{
    struct dm_gemm g = dm_gemm_row_major(DM_TRANS, DM_NO_TRANS, T, hs, T, 1.0f, dscores, T, q,
                                         hs, 0.0f, dk, hs);
    return dm_gemm_batched(g, items, (long)T * T, (long)T * hs, (long)T * hs);
}

/* dv = att^T dy */
DM_HD struct dm_gemm dm_gemm_attention_dv(float *dv, const float *att, const float *dy,
                                          int items, int T, int hs)
{
    struct dm_gemm g = dm_gemm_row_major(DM_TRANS, DM_NO_TRANS, T, hs, T, 1.0f, att, T, dy, hs,
                                         0.0f, dv, hs);
    return dm_gemm_batched(g, items, (long)T * T, (long)T * hs, (long)T * hs);
}

#endif
