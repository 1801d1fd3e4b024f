/* Helpers shared by the files of src/model and by nothing else. */
#ifndef DYNMO_MODEL_INTERNAL_H
#define DYNMO_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "dynmo/block_ext.h"
#include "dynmo/model.h"

/* Block `index` allocated with its whole slab zero (block_init without the
 * weights). */
void block_alloc_zero(struct block *blk, int index, const struct gpt_shape *shape);

/* out[i] = std * dm_normal(seed, stream, i) for i in [0, n), in parallel;
 * init_normal_at draws elements first .. first + n - 1 of the stream. */
void init_normal(float *out, size_t n, uint64_t seed, uint64_t stream, float std);
void init_normal_at(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t first,
                    float std);

/* dst[0..n) = src[0..n), in parallel. */
void parallel_copy(float *dst, const float *src, long n);

/* dst[0..n) = 0, in parallel. */
void parallel_zero(float *dst, long n);
/* The CPU backend's sum_squares (backend.h): chunks in double, added in order. */
double sum_squares(const float *x, long n);

/* layernorm_backward with dinp = dresidual + (input gradient) rather
 * than +=; dresidual may be dinp (then it is layernorm_backward). */
void layernorm_backward_residual(float *dinp, const float *dresidual, float *dweight,
                                 float *dbias, const float *dout, const float *inp,
                                 const float *weight, const float *mean, const float *rstd,
                                 int N, int C);

/* Attention for a subset of query rows (early exit): rows (ascending
 * indices into B*T) ask, every token answers. q and out are compact
 * (nactive, C); kv is (B*T, 2C), K then V per row; att and scratch are
 * (B,NH,T,T) with compact query rows. Query row i sees keys up to its own
 * position rows[i] % T. The backward writes dq (nactive, C) and dkv
 * (B*T, 2C), keys nobody saw zero. */
void attention_forward_rows(float *out, float *att, const float *q, const float *kv,
                            const int *rows, int nactive, int B, int T, int C, int NH);
void attention_backward_rows(float *dq, float *dkv, float *scratch, const float *dout,
                             const float *q, const float *kv, const float *att,
                             const int *rows, int nactive, int B, int T, int C, int NH);

/* Early exit's row gathers (exit.c), the CPU backend's rows_gather and
 * rows_scatter: dst (n, C) = rows `rows` of src; rows `rows` of dst = src
 * (n, C), or += when add is set. */
void rows_gather(float *dst, const float *src, const int *rows, int n, int C);
void rows_scatter(float *dst, const float *src, const int *rows, int n, int C, int add);

/* Early exit's confidences (exit.c), the CPU backend's entries of the
 * same names: conf[k] = top-1 minus top-2 of probs row k (n, V), or the
 * cosine of rows rows[k] of in and out (C each) in double, 0 when either
 * norm is 0. */
void exit_softmax_confidence(float *conf, const float *probs, int n, int V);
void exit_saturation_confidence(float *conf, const float *in, const float *out,
                                const int *rows, int n, int C);

/* The pruning state of a block (sparse.c): freeing it, the CSR values
 * refreshed from params (block_forward, after every optimizer step), and
 * the pack format of the state (docs/block-slab.md): its flag bits, its
 * size in bytes, writing it, and reading it back after params are in
 * place (returns 0, or -1 with a message in err). */
void block_sparse_free(struct block *blk);
void block_sparse_refresh(struct block *blk);
/* CSR matrix m of a pruned block as the ops take it: the device's arrays
 * on a device, csr[m] on the CPU. */
const struct csr_matrix *block_sparse_csr(const struct block *blk, int m);
/* The CSR of block tensor k (BP_QKV_W, BP_ATTPROJ_W, BP_FC_W or
 * BP_FCPROJ_W) when the block multiplies in CSR, else NULL (dense). */
const struct csr_matrix *block_csr_of(const struct block *blk, int k);
uint64_t block_sparse_flags(const struct block *blk);
size_t block_sparse_pack_bytes(const struct block *blk);
void block_sparse_pack(const struct block *blk, unsigned char *out);
int block_sparse_unpack(struct block *blk, uint64_t flags, const unsigned char *in,
                        size_t bytes, char *err, size_t errsize);

/* The ops of routing tokens to the top k of E scores (routing_ops.c), the
 * CPU backend's entries of the same names (include/dynmo/backend.h says
 * what each computes). */
void routed_combine_forward(float *out, const float *res1, const float *y, const float *gate,
                            const int *row, int N, int k, int C);
void routed_combine_backward(float *dy, float *dgate, const float *dout, const float *y,
                             const float *gate, const int *row, int N, int k, int C);
void routed_dispatch_backward(float *d_ln2, const float *dx, const int *row, int N, int k, int C);
void route_topk_forward(float *scores, float *lse, int *choice, float *choice_score, float *gate,
                        const float *logits, const float *bias, int N, int E, int k, int sigmoid);
void route_topk_sums(double *sums, const float *scores, const float *lse, int N, int E,
                     int sigmoid);
void route_topk_backward(float *dlogits, const float *dgate, const float *logits,
                         const float *scores, const float *lse, const int *choice,
                         const float *gate, const int *selected, int N, int E, int k, int sigmoid,
                         double alpha, double beta);

/* One round's histogram of pruning keys and the masking by the cut
 * (sparse.c), the CPU backend's entries of the same names (backend.h). */
void prune_histogram(long *counts, long *partial, const float *weights, long n,
                     unsigned int base, unsigned long long prefix, int shift);
void prune_mask(unsigned char *mask, float *params, float *grads, float *m, float *v, long n,
                unsigned int base, unsigned long long cut);

#endif
