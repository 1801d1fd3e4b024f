/* What the files of the CUDA plugin share and nothing else includes: the
 * checks of every CUDA, cuBLAS and NCCL call, the plugin's stream, cuBLAS
 * handle, device scratch and the host's product precision (plugin.cu),
 * the one product entry (matmul.cu) and the ops the table holds, each
 * defined in its kernel file. C++
 * (nvcc); the ops have the CPU ops' signatures and take device pointers. */
#ifndef DYNMO_KERNELS_PLUGIN_H
#define DYNMO_KERNELS_PLUGIN_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include "dynmo/backend.h"
#include "gemm.cuh"

/* Reports "[rank N] file:line: call: text" through the host's fatal path
 * (dynmo's, handed over at open); does not return. */
[[noreturn]] void dm_cuda_fail(const char *file, int line, const char *call, const char *text);

#define CUDA_CHECK(call)                                                               \
    do {                                                                               \
        cudaError_t cuda_check_rc = (call);                                            \
        if (cuda_check_rc != cudaSuccess)                                              \
            dm_cuda_fail(__FILE__, __LINE__, #call, cudaGetErrorString(cuda_check_rc)); \
    } while (0)

#define CUBLAS_CHECK(call)                                                             \
    do {                                                                               \
        cublasStatus_t cublas_check_rc = (call);                                       \
        if (cublas_check_rc != CUBLAS_STATUS_SUCCESS)                                  \
            dm_cuda_fail(__FILE__, __LINE__, #call, cublasGetStatusString(cublas_check_rc)); \
    } while (0)

/* After every launch: a bad configuration shows here, not at the next sync. */
#define LAUNCH_CHECK(kernel)                                                           \
    do {                                                                               \
        cudaError_t launch_check_rc = cudaGetLastError();                              \
        if (launch_check_rc != cudaSuccess)                                            \
            dm_cuda_fail(__FILE__, __LINE__, #kernel, cudaGetErrorString(launch_check_rc)); \
    } while (0)

enum { DM_CUDA_THREADS = DM_BLOCK_THREADS };   /* threads per block of every kernel */

cudaStream_t dm_cuda_stream(void);
cublasHandle_t dm_cuda_cublas(void);
/* Device floats that only grow to the largest request, one buffer per slot. */
enum { SCRATCH_ATTENTION, SCRATCH_HASH_TILES, SCRATCH_HASH_DELTA, SCRATCH_MOD, SCRATCH_REDUCE,
       SCRATCH_GEMM_A, SCRATCH_GEMM_B, SCRATCH_SLOTS };
float *dm_cuda_scratch(int slot, size_t floats);
/* Waits for the stream by polling (cudaStreamQuery, sched_yield between polls). */
void dm_cuda_stream_wait(cudaStream_t stream);

/* The products' operand precision (enum dm_precision) the host set
 * (struct dm_backend_host); fp32 before open. */
int dm_cuda_precision(void);

/* A row-major product (gemm.cuh) on cuBLAS, through the column-major
 * translation, with dm_cuda_precision()'s operands. */
void dm_cuda_gemm(struct dm_gemm row_major);

/* ---- the ops of the table ---------------------------------------------------- */
void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC);
void cuda_matmul_forward_residual(float *out, const float *inp, const float *weight,
                                  const float *bias, const float *residual, int N, int C, int OC);
void cuda_matmul_forward_gelu(float *out, float *gelu_out, const float *inp, const float *weight,
                              const float *bias, int N, int C, int OC);
void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC);
void cuda_matmul_backward_overwrite(float *dinp, float *dweight, float *dbias,
                                    const float *dout, const float *inp, const float *weight,
                                    int N, int C, int OC);
void cuda_matmul_backward_gelu(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *gelu_inp,
                               int N, int C, int OC);
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C);
void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);
void cuda_layernorm_backward_residual(float *dinp, const float *dresidual, float *dweight,
                                      float *dbias, const float *dout, const float *inp,
                                      const float *weight, const float *mean, const float *rstd,
                                      int N, int C);
void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH);
void cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH);
void cuda_attention_forward_rows(float *out, float *att, const float *q, const float *kv,
                                 const int *rows, int nactive, int B, int T, int C, int NH);
void cuda_attention_backward_rows(float *dq, float *dkv, float *scratch, const float *dout,
                                  const float *q, const float *kv, const float *att,
                                  const int *rows, int nactive, int B, int T, int C, int NH);
long cuda_hash_attention_forward(float *out, float *lse, int *order, int *bucket, long *alone,
                                 const float *qkv, const float *rotation, int B, int T, int C,
                                 int NH, int buckets);
long cuda_hash_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, const int *order,
                                  const int *bucket, int B, int T, int C, int NH);
void cuda_gelu_forward(float *out, const float *inp, long N);
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, long N);
void cuda_residual_forward(float *out, const float *a, const float *b, long N);
void cuda_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                          int B, int T, int C);
void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                           int B, int T, int C);
void cuda_crossentropy_forward(float *losses, float *probs, const float *logits,
                               const int *targets, int N, int V);
void cuda_crossentropy_softmax_backward(float *dlogits, const float *probs, const int *targets,
                                        float dloss_scale, int N, int V);
void cuda_exit_softmax_confidence(float *conf, const float *probs, int n, int V);
void cuda_exit_saturation_confidence(float *conf, const float *in, const float *out,
                                     const int *rows, int n, int C);
void cuda_moe_combine_forward(float *out, const float *res1, const float *y, const float *gate,
                              const int *row, int N, int k, int C);
void cuda_moe_combine_backward(float *dy, float *dgate, const float *dout, const float *y,
                               const float *gate, const int *row, int N, int k, int C);
void cuda_moe_dispatch_backward(float *d_ln2, const float *dx, const int *row, int N, int k,
                                int C);
void cuda_moe_route_forward(float *scores, float *lse, int *choice, float *choice_score,
                            float *gate, const float *logits, const float *bias, int N, int E,
                            int k, int sigmoid);
void cuda_moe_route_sums(double *sums, const float *scores, const float *lse, int N, int E,
                         int sigmoid);
void cuda_moe_route_backward(float *dlogits, const float *dgate, const float *logits,
                             const float *scores, const float *lse, const int *choice,
                             const float *gate, const int *selected, int N, int E, int k,
                             int sigmoid, double alpha, double beta);
void cuda_prune_histogram(long *counts, long *partial, const float *weights, long n,
                          unsigned int base, unsigned long long prefix, int shift);
void cuda_prune_mask(unsigned char *mask, float *params, float *grads, float *m, float *v, long n,
                     unsigned int base, unsigned long long cut);
void cuda_adamw_update(float *params, const float *grads, float *m, float *v, long n, float lr,
                       float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t);
void cuda_sparse_matmul_forward(float *out, const float *inp, const int *row_ptr,
                                const int *col_idx, const float *values, const float *bias,
                                int N, int C, int OC);
void cuda_sparse_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const int *row_ptr, const int *col_idx,
                                 const float *values, int nnz, int N, int C, int OC);
void cuda_mod_router_forward(float *router, const float *in, const float *weight, int N, int C);
void cuda_mod_select_topk(int *chosen, const float *router, int B, int T, int k);
float cuda_mod_predictor_forward_backward(float *dweight, float scale, int *chosen,
                                          const float *in, const float *weight,
                                          const int *target, int N, int C, int H);
void cuda_mod_combine_forward(float *out, const float *gathered_in, const float *gathered_out,
                              const float *router, const int *rows, int n, int C);
void cuda_mod_scale_chosen(float *work, const float *din, const float *router, const int *rows,
                           int n, int C);
void cuda_mod_combine_backward(float *din, float *drouter_weight, const float *gathered_in,
                               const float *gathered_out, const float *work, const float *router,
                               const float *router_weight, const int *rows, int n, int C);
void cuda_rows_gather(float *dst, const float *src, const int *rows, int n, int C);
void cuda_rows_scatter(float *dst, const float *src, const int *rows, int n, int C, int add);
double cuda_sum_squares(const float *x, long n);
void cuda_zero(void *dst, size_t bytes);
void cuda_copy_on_device(void *dst, const void *src, size_t bytes);

/* One round of a transfer's wait: the host's (struct dm_backend_host's
 * wait_round: its MPI progress), else sched_yield. */
void dm_cuda_wait_round(int first);
struct dm_backend_comm *cuda_comm_init(int rank, int size,
                                       void (*bcast_ints)(void *ctx, int *buf, int n), void *ctx);
void cuda_comm_exchange(struct dm_backend_comm *comm, const struct dm_comm_op *ops, int n);
void cuda_comm_all_reduce_sum(struct dm_backend_comm *comm, float *buf, size_t count);
void cuda_comm_free(struct dm_backend_comm *comm);

#endif
