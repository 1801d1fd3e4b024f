/* Matrix products on the CUDA backend: every row-major product of
 * gemm.cuh goes to cuBLAS through dm_gemm_to_column_major (one
 * cublasGemmEx, or cublasGemmStridedBatchedEx for a batch) with the
 * operands train.precision names (dm_cuda_precision): fp32
 * (CUBLAS_COMPUTE_32F: no TF32), tf32 (CUBLAS_COMPUTE_32F_FAST_TF32 on the
 * fp32 operands), or bf16 (both operands converted into the plugin's
 * scratch, rounded to nearest even by precision.cuh, then CUDA_R_16BF
 * inputs with CUBLAS_COMPUTE_32F). The output is fp32 in every case. The
 * linear layers' ops start the output at residual + bias as the CPU does,
 * then add the product; the bias gradient is one thread per channel in
 * the CPU's order (matmul.cuh). */
#include "elementwise.cuh"
#include "matmul.cuh"
#include "plugin.h"
#include "precision.cuh"

static cublasOperation_t op_of(int trans)
{
    return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

__global__ void precision_to_bf16_kernel(uint16_t *out, const float *in, long n)
{
    precision_to_bf16_thread(DM_THREAD_HERE, out, in, n);
}

/* The n floats at x (an operand's span, gemm.cuh) as bf16 in scratch
 * `slot`, which only grows: reused by every product, never freed per
 * call. The stream orders the conversion after the previous product that
 * read the slot. */
static const void *bf16_copy(int slot, const float *x, long n)
{
    uint16_t *out = (uint16_t *)dm_cuda_scratch(slot, (size_t)(n + 1) / 2);
    if (n > 0) {
        precision_to_bf16_kernel<<<dm_grid_for(n, DM_CUDA_THREADS), DM_CUDA_THREADS, 0,
                                   dm_cuda_stream()>>>(out, x, n);
        LAUNCH_CHECK(precision_to_bf16_kernel);
    }
    return out;
}

void dm_cuda_gemm(struct dm_gemm row_major)
{
    struct dm_gemm g = dm_gemm_to_column_major(row_major);
    if (g.m == 0 || g.n == 0) return;
    int precision = dm_cuda_precision();
    cublasComputeType_t compute =
        precision == DM_PRECISION_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t in_type = CUDA_R_32F;
    const void *a = g.a, *b = g.b;
    if (precision == DM_PRECISION_BF16) {
        a = bf16_copy(SCRATCH_GEMM_A, g.a, dm_gemm_span_a(g));
        b = bf16_copy(SCRATCH_GEMM_B, g.b, dm_gemm_span_b(g));
        in_type = CUDA_R_16BF;
    }
    if (g.batch == 1)
        CUBLAS_CHECK(cublasGemmEx(dm_cuda_cublas(), op_of(g.trans_a), op_of(g.trans_b), g.m, g.n,
                                  g.k, &g.alpha, a, in_type, g.lda, b, in_type, g.ldb, &g.beta,
                                  g.c, CUDA_R_32F, g.ldc, compute, CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            dm_cuda_cublas(), op_of(g.trans_a), op_of(g.trans_b), g.m, g.n, g.k, &g.alpha, a,
            in_type, g.lda, g.stride_a, b, in_type, g.ldb, g.stride_b, &g.beta, g.c, CUDA_R_32F,
            g.ldc, g.stride_c, g.batch, compute, CUBLAS_GEMM_DEFAULT));
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
