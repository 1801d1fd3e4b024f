/* Matrix products on the CUDA backend: every row-major product of
 * gemm.cuh goes to cuBLAS through dm_gemm_to_column_major (one
 * cublasGemmEx, or cublasGemmStridedBatchedEx for a batch), in fp32
 * (CUBLAS_COMPUTE_32F: no TF32). The linear layers' ops start the output
 * at residual + bias as the CPU does, then add the product; the bias
 * gradient is one thread per channel in the CPU's order (matmul.cuh). */
#include "elementwise.cuh"
#include "matmul.cuh"
#include "plugin.h"

static cublasOperation_t op_of(int trans)
{
    return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

void dm_cuda_gemm(struct dm_gemm row_major)
{
    struct dm_gemm g = dm_gemm_to_column_major(row_major);
    if (g.m == 0 || g.n == 0) return;
    if (g.batch == 1)
        CUBLAS_CHECK(cublasGemmEx(dm_cuda_cublas(), op_of(g.trans_a), op_of(g.trans_b), g.m, g.n,
                                  g.k, &g.alpha, g.a, CUDA_R_32F, g.lda, g.b, CUDA_R_32F, g.ldb,
                                  &g.beta, g.c, CUDA_R_32F, g.ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            dm_cuda_cublas(), op_of(g.trans_a), op_of(g.trans_b), g.m, g.n, g.k, &g.alpha, g.a,
            CUDA_R_32F, g.lda, g.stride_a, g.b, CUDA_R_32F, g.ldb, g.stride_b, &g.beta, g.c,
            CUDA_R_32F, g.ldc, g.stride_c, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

__global__ void matmul_init_kernel(float *out, const float *bias, const float *residual, int N,
                                   int OC)
{
    matmul_init_thread(DM_THREAD_HERE, out, bias, residual, N, OC);
}

__global__ void matmul_dbias_kernel(float *dbias, const float *dout, int N, int OC)
{
    matmul_dbias_thread(DM_THREAD_HERE, dbias, dout, N, OC);
}

__global__ void matmul_gelu_kernel(float *gelu_out, const float *out, long n)
{
    gelu_forward_thread(DM_THREAD_HERE, gelu_out, out, n);
}

__global__ void matmul_gelu_grad_kernel(float *dinp, const float *gelu_inp, long n)
{
    gelu_backward_thread(DM_THREAD_HERE, dinp, gelu_inp, dinp, n);
}

static void forward(float *out, float *gelu_out, const float *inp, const float *weight,
                    const float *bias, const float *residual, int N, int C, int OC)
{
    cudaStream_t s = dm_cuda_stream();
    long n = (long)N * OC;
    if (bias || residual) {
        matmul_init_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0, s>>>(
            out, bias, residual, N, OC);
        LAUNCH_CHECK(matmul_init_kernel);
    }
    dm_cuda_gemm(dm_gemm_matmul_forward(out, inp, weight, N, C, OC, bias || residual ? 1.0f : 0.0f));
    if (gelu_out) {
        matmul_gelu_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0, s>>>(gelu_out,
                                                                                   out, n);
        LAUNCH_CHECK(matmul_gelu_kernel);
    }
}

/* dinp (= or += by beta, then * gelu'(gelu_inp) when given), dweight +=, dbias += */
static void backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, const float *gelu_inp, float beta,
                     int N, int C, int OC)
{
    cudaStream_t s = dm_cuda_stream();
    if (dinp) {
        dm_cuda_gemm(dm_gemm_matmul_dinp(dinp, dout, weight, N, C, OC, beta));
        if (gelu_inp) {
            long n = (long)N * C;
            matmul_gelu_grad_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0, s>>>(
                dinp, gelu_inp, n);
            LAUNCH_CHECK(matmul_gelu_grad_kernel);
        }
    }
    if (dweight) dm_cuda_gemm(dm_gemm_matmul_dweight(dweight, dout, inp, N, C, OC));
    if (dbias) {
        matmul_dbias_kernel<<<dm_grid_for(OC, DM_CUDA_THREADS), DM_CUDA_THREADS, 0, s>>>(
            dbias, dout, N, OC);
        LAUNCH_CHECK(matmul_dbias_kernel);
    }
}

void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC)
{
    forward(out, NULL, inp, weight, bias, NULL, N, C, OC);
}

void cuda_matmul_forward_residual(float *out, const float *inp, const float *weight,
                                  const float *bias, const float *residual, int N, int C, int OC)
{
    forward(out, NULL, inp, weight, bias, residual, N, C, OC);
}

void cuda_matmul_forward_gelu(float *out, float *gelu_out, const float *inp, const float *weight,
                              const float *bias, int N, int C, int OC)
{
    forward(out, gelu_out, inp, weight, bias, NULL, N, C, OC);
}

void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC)
{
    backward(dinp, dweight, dbias, dout, inp, weight, NULL, 1.0f, N, C, OC);
}

void cuda_matmul_backward_overwrite(float *dinp, float *dweight, float *dbias,
                                    const float *dout, const float *inp, const float *weight,
                                    int N, int C, int OC)
{
    backward(dinp, dweight, dbias, dout, inp, weight, NULL, 0.0f, N, C, OC);
}

void cuda_matmul_backward_gelu(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *gelu_inp,
                               int N, int C, int OC)
{
    backward(dinp, dweight, dbias, dout, inp, weight, gelu_inp, 0.0f, N, C, OC);
}
