/* The CSR products of the CUDA backend (pruned blocks' matrices): own
 * kernels over sparse.cuh, which give src/model/sparse.c's bits; the
 * weight, its indices and the activations are device arrays. */
#include "plugin.h"
#include "sparse.cuh"

__global__ void sparse_forward_kernel(float *out, const float *inp, const int *row_ptr,
                                      const int *col_idx, const float *values, const float *bias,
                                      int N, int C, int OC)
{
    sparse_forward_thread(DM_THREAD_HERE, out, inp, row_ptr, col_idx, values, bias, N, C, OC);
}

__global__ void sparse_dinp_kernel(float *dinp, const float *dout, const int *row_ptr,
                                   const int *col_idx, const float *values, int N, int C, int OC)
{
    sparse_dinp_thread(DM_THREAD_HERE, dinp, dout, row_ptr, col_idx, values, N, C, OC);
}

__global__ void sparse_dweight_kernel(float *dweight, const float *dout, const float *inp,
                                      const int *row_ptr, const int *col_idx, int nnz, int N,
                                      int C, int OC)
{
    sparse_dweight_thread(DM_THREAD_HERE, dweight, dout, inp, row_ptr, col_idx, nnz, N, C, OC);
}

__global__ void sparse_dbias_kernel(float *dbias, const float *dout, int N, int OC)
{
    sparse_dbias_thread(DM_THREAD_HERE, dbias, dout, N, OC);
}

void cuda_sparse_matmul_forward(float *out, const float *inp, const int *row_ptr,
                                const int *col_idx, const float *values, const float *bias,
                                int N, int C, int OC)
{
    sparse_forward_kernel<<<dm_grid_for((long)N * OC, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                            dm_cuda_stream()>>>(out, inp, row_ptr, col_idx, values, bias, N, C,
                                                OC);
    LAUNCH_CHECK(sparse_forward_kernel);
}

void cuda_sparse_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const int *row_ptr, const int *col_idx,
                                 const float *values, int nnz, int N, int C, int OC)
{
    cudaStream_t s = dm_cuda_stream();
    if (dinp) {
        sparse_dinp_kernel<<<dm_grid_for(N, DM_CUDA_THREADS), DM_CUDA_THREADS, 0, s>>>(
            dinp, dout, row_ptr, col_idx, values, N, C, OC);
        LAUNCH_CHECK(sparse_dinp_kernel);
    }
    if (dweight && nnz > 0) {
        sparse_dweight_kernel<<<dm_grid_for(nnz, DM_CUDA_THREADS), DM_CUDA_THREADS, 0, s>>>(
            dweight, dout, inp, row_ptr, col_idx, nnz, N, C, OC);
        LAUNCH_CHECK(sparse_dweight_kernel);
    }
    if (dbias) {
        sparse_dbias_kernel<<<dm_grid_for(OC, DM_CUDA_THREADS), DM_CUDA_THREADS, 0, s>>>(
            dbias, dout, N, OC);
        LAUNCH_CHECK(sparse_dbias_kernel);
    }
}
