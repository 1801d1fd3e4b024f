/* dynmo backend: the table of the model's ops (docs/gpu.md).
 *
 * One struct of function pointers holds every op the model runs, forward
 * and backward, AdamW, and the dynamic schemes' row gathers, with the CPU
 * ops' signatures and contracts (include/dynmo/model.h): outputs first,
 * then inputs, then sizes; backward ops accumulate where the CPU op does.
 * The CPU backend is today's functions. The CUDA backend is a plugin
 * (build/libdynmo_cuda.so, built from kernels/ by `make USE_CUDA=1`)
 * that fills the same table with kernels and cuBLAS; its pointers are
 * device memory obtained from the table's alloc. The emulated device
 * (build/libdynmo_emulate.so, kernels/emulate.c, built by every `make`)
 * is a plugin with the same entry whose ops run the CUDA kernels'
 * per-thread arithmetic on the CPU, for testing; its device memory is an
 * arena the host cannot touch outside the table's entries (strict mode,
 * the default), so a host read of a device tensor traps there. The
 * model calls every op through backend_current() (docs/gpu.md).
 *
 * This header is part of the model module and is also compiled by nvcc
 * for the plugin: plain C, no other dynmo header, no MPI. The plugin
 * reaches MPI only through the callback the caller hands it (comm_init). */
#ifndef DYNMO_BACKEND_H
#define DYNMO_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raised whenever struct dm_backend changes: a plugin built against
 * another layout is refused, never called. Raised too when an op's
 * arithmetic changes under the same layout, so that a plugin left over
 * from an older build is refused rather than computing the old thing
 * (14: MoE's top-1 gate is the chosen score, no longer 1; 15: hash
 * attention's own key, the MoD predictor an MLP). */
#define DM_BACKEND_ABI 15

/* The symbol the plugin exports. Fills *table and returns 0, or returns -1
 * with one message in err ("no CUDA device: ..."). host->fatal is what the
 * plugin calls when a CUDA, cuBLAS or NCCL call fails (it does not return). */
#define DM_BACKEND_PLUGIN_ENTRY "dynmo_cuda_backend_open"

struct dm_backend_host {
    void (*fatal)(const char *file, int line, const char *call, const char *text);
    /* This process among the job's processes on its node (0..local_size-1)
     * and their count: the CUDA plugin takes device
     * backend_device_for(local_rank, devices it sees). */
    int local_rank, local_size;
    /* One round of a wait that polls inside the plugin (a transfer, the
     * transport's set-up; first set on a wait's first round): the host's
     * MPI progress, then the CPU given up. A rank spinning on a transfer
     * without MPI progress would starve the non-blocking MPI operations it
     * posted before (a statistics gather) that another rank waits on, and
     * the job would hang. NULL: the plugin yields the CPU itself. Set
     * after open through backend_set_wait_round. */
    void (*wait_round)(int first);
    /* The operands of every cuBLAS product (enum dm_precision, from
     * train.precision): the plugin reads it at each product, so it may be
     * set before or after open (backend_set_precision). Its arrival
     * raised DM_BACKEND_ABI too: a plugin built before it would not read
     * it and would multiply in fp32 unasked. */
    int precision;
};

/* train.precision: what the tensor cores of a device get as the operands
 * of a matrix product; outputs, accumulation and everything else stay
 * fp32. The CPU backend has only fp32. */
enum dm_precision { DM_PRECISION_FP32 = 0, DM_PRECISION_TF32 = 1, DM_PRECISION_BF16 = 2 };

/* The device of the local_rank-th process of a node that sees `devices`
 * devices: each process its own while there are enough (one process per
 * GPU, as launchers usually place them), round-robin beyond; device 0
 * when a launcher shows each process only its own (CUDA_VISIBLE_DEVICES,
 * Slurm's --gpus-per-task). */
static inline int backend_device_for(int local_rank, int devices)
{
    return devices > 0 && local_rank >= 0 ? local_rank % devices : 0;
}

/* The radix select of pruning: buckets per round (8 bits of the 64-bit
 * key) and the weights one thread of the histogram counts. */
#define DM_PRUNE_BUCKETS 256
#define DM_PRUNE_CHUNK 4096

struct dm_backend;
typedef int (*dm_backend_open_fn)(struct dm_backend *table, const struct dm_backend_host *host,
                                  char *err, size_t errsize);

/* A point-to-point and all-reduce world among some ranks' devices (NCCL
 * on CUDA; shared memory between the processes of a node on the emulated
 * device; NULL entries on the CPU, where src/pipe uses MPI). Made by
 * comm_init on every rank of a group at once: rank and size within the
 * group, bcast_ints(ctx, buf, n) the caller's polled broadcast from the
 * group's rank 0 (src/pipe/device_comm.c's over an MPI communicator).
 * Every call returns when the transfer is complete, polling with
 * sched_yield between polls: the host never blocks inside CUDA. */
struct dm_backend_comm;

/* One transfer of comm_exchange: count floats of device memory sent to
 * group rank peer (recv = 0; buf is only read) or received from it
 * (recv = 1). */
struct dm_comm_op {
    float *buf;
    size_t count;
    int peer, recv;
};

struct dm_backend_comm;

struct dm_backend {
    int abi;                      /* DM_BACKEND_ABI */
    const char *name;             /* "cpu" or "cuda" */
    char device[128];             /* what it runs on, in words */
    /* Which device, for telling whether two ranks of a node share one
     * ("GPU-" and the device's UUID on CUDA; "" on the CPU). */
    char device_id[64];
    /* 1 when the host may dereference what alloc returns (the CPU; the
     * emulated device with DYNMO_EMULATE_STRICT=0): the model's host
     * staging is then skipped (backend_read, backend_write). 0 on CUDA and
     * on the strict emulated device, whose arena traps every host access. */
    int host_access;

    /* Memory: where the tensors the ops take live. */
    void *(*alloc)(size_t bytes);                 /* zero-filled; fatal on failure */
    void (*free)(void *p);
    void (*copy_to_device)(void *dst, const void *src, size_t bytes);
    void (*copy_to_host)(void *dst, const void *src, size_t bytes);
    void (*synchronize)(void);                    /* every op issued so far is done */
    /* Device memory set to zero, and copied between two device buffers
     * that do not overlap (the CPU's parallel_zero, parallel_copy). */
    void (*zero)(void *dst, size_t bytes);
    void (*copy_on_device)(void *dst, const void *src, size_t bytes);
    /* Host memory for staging (migration, checkpoints, MPI when ranks share
     * a GPU): pinned on CUDA, so copies to and from it run at full speed. */
    void *(*alloc_host)(size_t bytes);            /* zero-filled; fatal on failure */
    void (*free_host)(void *p);

    /* Matrix products (model.h's matmul_*). */
    void (*matmul_forward)(float *out, const float *inp, const float *weight,
                           const float *bias, int N, int C, int OC);
    void (*matmul_forward_residual)(float *out, const float *inp, const float *weight,
                                    const float *bias, const float *residual,
                                    int N, int C, int OC);
    void (*matmul_forward_gelu)(float *out, float *gelu_out, const float *inp,
                                const float *weight, const float *bias, int N, int C, int OC);
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC);
    void (*matmul_backward_overwrite)(float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp,
                                      const float *weight, int N, int C, int OC);
    void (*matmul_backward_gelu)(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *gelu_inp,
                                 int N, int C, int OC);

    /* Layernorm (model.h; backward_residual is src/model/internal.h's). */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);
    void (*layernorm_backward_residual)(float *dinp, const float *dresidual, float *dweight,
                                        float *dbias, const float *dout, const float *inp,
                                        const float *weight, const float *mean,
                                        const float *rstd, int N, int C);

    /* Causal attention core, GELU, residual, embedding, loss. */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    void (*attention_backward)(float *dqkv, float *scratch, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C,
                               int NH);
    /* Early exit's attention over active query rows (src/model/internal.h's
     * attention_forward_rows, _backward_rows): q, out, dq compact (nactive,
     * C), kv, dkv (B T, 2C). att and scratch are (B, NH, T, T) in the
     * backend's own layout: only the same backend's backward reads them. */
    void (*attention_forward_rows)(float *out, float *att, const float *q, const float *kv,
                                   const int *rows, int nactive, int B, int T, int C, int NH);
    void (*attention_backward_rows)(float *dq, float *dkv, float *scratch, const float *dout,
                                    const float *q, const float *kv, const float *att,
                                    const int *rows, int nactive, int B, int T, int C, int NH);
    /* Attention within groups of sorted tokens (model.h's
     * group_attention_forward, _backward; hash-sparse attention's kernel):
     * lse, order and group as there; the rotation (drawn on the host) in
     * the backend's memory; every query attends to its own key too, and
     * *alone (on the host; may be NULL) counts the queries that attend to
     * it alone. Return the tiles visited. */
    long (*group_attention_forward)(float *out, float *lse, int *order, int *group, long *alone,
                                    const float *qkv, const float *rotation, int B, int T, int C,
                                    int NH, int groups);
    long (*group_attention_backward)(float *dqkv, const float *dout, const float *qkv,
                                     const float *out, const float *lse, const int *order,
                                     const int *group, int B, int T, int C, int NH);
    void (*gelu_forward)(float *out, const float *inp, long N);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, long N);
    void (*residual_forward)(float *out, const float *a, const float *b, long N);
    void (*encoder_forward)(float *out, const int *tokens, const float *wte,
                            const float *wpe, int B, int T, int C);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *tokens,
                             int B, int T, int C);
    void (*crossentropy_forward)(float *losses, float *probs, const float *logits,
                                 const int *targets, int N, int V);
    void (*crossentropy_softmax_backward)(float *dlogits, const float *probs,
                                          const int *targets, float dloss_scale, int N,
                                          int V);
    /* Early exit's confidence of each active token (src/model/exit.c),
     * n floats into conf, one thread per token on a device (the CPU's
     * bits): softmax, the top-1 minus the top-2 probability of row k of
     * probs (n, V); saturation, the cosine of rows rows[k] of in and out
     * (C each), summed in double in channel order, 0 when either norm is
     * 0. */
    void (*exit_softmax_confidence)(float *conf, const float *probs, int n, int V);
    void (*exit_saturation_confidence)(float *conf, const float *in, const float *out,
                                       const int *rows, int n, int C);
    /* Mixture of experts (src/model/moe.c), over the routing's row and
     * gate (N, k): each pair's grouped row of y, dy and dx (-1: dropped)
     * and its gate weight. combine: out[t] = res1[t] + gate x y[row]
     * over t's kept slots in order. combine backward: dy[row] = gate x
     * dout[t] for each kept pair (the other rows untouched), dgate =
     * dout[t] . y[row] in double in channel order (0 when dropped).
     * dispatch backward: d_ln2[t] = the sum of dx[row] over t's kept
     * slots in order (overwritten). One thread per element or pair on a
     * device, the CPU's bits. */
    void (*routed_combine_forward)(float *out, const float *res1, const float *y,
                                const float *gate, const int *row, int N, int k, int C);
    void (*routed_combine_backward)(float *dy, float *dgate, const float *dout, const float *y,
                                 const float *gate, const int *row, int N, int k, int C);
    void (*routed_dispatch_backward)(float *d_ln2, const float *dx, const int *row, int N, int k,
                                  int C);
    /* MoE's routing from the router's logits (N, E), one thread per token
     * on a device (the CPU's arithmetic and order; exp and log in double):
     * scores (N, E) (softmax probabilities, or sigmoid scores when sigmoid
     * is set), lse (N) the logits' log-sum-exp, choice (N, k) the top-k
     * experts best first by score (+ bias[e], (E), for the sigmoid router;
     * bias is unread, and may be NULL, for softmax; ties to the lower
     * index), choice_score (N, k) their scores, gate (N, k): for k = 1
     * the chosen score itself, for k >= 2 the chosen scores renormalised
     * over the chosen (1/k when they sum to 0). route sums:
     * sums (E + 1 doubles) = per expert the sum over the tokens in order
     * of its normalised score (the softmax probability, or the sigmoid
     * score over the token's score sum), then the sum of lse^2 (one
     * thread per output on a device). route backward: dlogits (N, E,
     * overwritten) from dgate (N, k) through the gates and the scores'
     * Jacobian, plus the aux loss's gradient when alpha > 0 (alpha x E x
     * selected[e] / (k N) / N per expert in the scores; selected (E): the
     * pairs that chose each expert before capacity) and the z-loss's when
     * beta > 0 (beta 2 lse softmax / N); one thread per token. */
    void (*route_topk_forward)(float *scores, float *lse, int *choice, float *choice_score,
                              float *gate, const float *logits, const float *bias, int N, int E,
                              int k, int sigmoid);
    void (*route_topk_sums)(double *sums, const float *scores, const float *lse, int N, int E,
                           int sigmoid);
    void (*route_topk_backward)(float *dlogits, const float *dgate, const float *logits,
                               const float *scores, const float *lse, const int *choice,
                               const float *gate, const int *selected, int N, int E, int k,
                               int sigmoid, double alpha, double beta);

    /* The optimizer (model.h's adamw_update). */
    void (*adamw_update)(float *params, const float *grads, float *m, float *v, long n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int t);

    /* Pruned matrices in CSR (model.h's sparse_matmul_*): the weight (OC, C)
     * as its arrays row_ptr (OC + 1), col_idx and values (nnz), in the
     * backend's memory; dinp is overwritten, dweight (dense) and dbias
     * accumulate; any of the three may be NULL. */
    void (*sparse_matmul_forward)(float *out, const float *inp, const int *row_ptr,
                                  const int *col_idx, const float *values, const float *bias,
                                  int N, int C, int OC);
    void (*sparse_matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const int *row_ptr, const int *col_idx,
                                   const float *values, int nnz, int N, int C, int OC);

    /* Mixture of depths (model.h's mod_router_forward, mod_select_topk,
     * mod_predictor_forward_backward):
     * the router r = w . x per token, the k tokens of each sequence with
     * the largest r (ties: the lower position). */
    void (*mod_router_forward)(float *router, const float *in, const float *weight, int N,
                               int C);
    void (*mod_select_topk)(int *chosen, const float *router, int B, int T, int k);
    /* The causal predictor, an MLP of hidden width H (dynmo/mod_predictor.h):
     * chosen (may be NULL), and with target the mean loss returned (on the
     * host) and, when dweight is not NULL, scale times its gradient (each
     * weight's summed over the tokens in order) added to dweight. One
     * thread per token, then one per weight on a device (the CPU's bits). */
    float (*mod_predictor_forward_backward)(float *dweight, float scale, int *chosen,
                                            const float *in, const float *weight,
                                            const int *target, int N, int C, int H);
    /* The block over the chosen tokens (model.h's mod_combine_forward,
     * mod_scale_chosen, mod_combine_backward), on the n packed rows whose
     * block rows are `rows` (distinct): out's rows = x + r (f - x); work
     * = r din's rows; din's rows and the router weight's gradient
     * (accumulated; may be NULL) from the combination, the gradient
     * summed over the tokens in order (no atomics: the CPU's bits). */
    void (*mod_combine_forward)(float *out, const float *gathered_in, const float *gathered_out,
                                const float *router, const int *rows, int n, int C);
    void (*mod_scale_chosen)(float *work, const float *din, const float *router, const int *rows,
                             int n, int C);
    void (*mod_combine_backward)(float *din, float *drouter_weight, const float *gathered_in,
                                 const float *gathered_out, const float *work,
                                 const float *router, const float *router_weight,
                                 const int *rows, int n, int C);

    /* The dynamic schemes' gathers (early exit's active rows, mixture of
     * depths' chosen tokens, MoE's dispatch): dst (n, C) = rows `rows` of
     * src; rows `rows` of dst = src (n, C), or += when add is set. rows
     * are distinct (every destination row is written by one source row). */
    void (*rows_gather)(float *dst, const float *src, const int *rows, int n, int C);
    void (*rows_scatter)(float *dst, const float *src, const int *rows, int n, int C, int add);

    /* Gradual magnitude pruning (src/dyn/prune.c) of one matrix of n
     * weights whose global indices start at base, over the keys of
     * block_prune_key (|w| bits << 32 | ~index). histogram: counts
     * (DM_PRUNE_BUCKETS) += how many keys equal prefix on the bits above
     * shift + 8, by their bits shift .. shift + 7 (one round of the radix
     * select); partial is scratch of dm_prune_chunks(n) (kernels/
     * prune.cuh: n / DM_PRUNE_CHUNK rounded up, at least 1) x
     * DM_PRUNE_BUCKETS longs (unread on the CPU; may be NULL there). mask:
     * mask[i] = key > cut, and where 0 params, grads, m and v of weight i
     * are set to zero. One thread per chunk, per bucket, per weight on a
     * device: no atomics, the CPU's counts and bits. */
    void (*prune_histogram)(long *counts, long *partial, const float *weights, long n,
                            unsigned int base, unsigned long long prefix, int shift);
    void (*prune_mask)(unsigned char *mask, float *params, float *grads, float *m, float *v,
                       long n, unsigned int base, unsigned long long cut);

    /* The sum of the squares of x (n floats, device memory), in double,
     * returned on the host: chunks of 8192 floats each summed in eight
     * lanes, the chunks added in order (src/model/gpt.c's order; no
     * atomics, so the same bits every run and on every backend). */
    double (*sum_squares)(const float *x, long n);

    /* Device-to-device transport (NULL on the CPU). comm_all_reduce_sum
     * sums in place over the group: NCCL's ring order on CUDA (the same
     * bits on every rank and run for a fixed group; for 2 ranks those of
     * a + b), group-rank order on the emulated device. */
    struct dm_backend_comm *(*comm_init)(int rank, int size,
                                         void (*bcast_ints)(void *ctx, int *buf, int n),
                                         void *ctx);
    /* comm_exchange: the n transfers at once (one NCCL group), returning
     * when every one is complete. A send completes only once its peer has
     * taken it, so the ranks' calls must pair up as a whole: whatever one
     * rank sends in a call, its peer receives in a call that can proceed
     * alongside it. Between two ranks the transfers of one direction pair
     * in the order they are issued, within a call and across calls. */
    void (*comm_exchange)(struct dm_backend_comm *comm, const struct dm_comm_op *ops, int n);
    void (*comm_all_reduce_sum)(struct dm_backend_comm *comm, float *buf, size_t count);
    void (*comm_free)(struct dm_backend_comm *comm);
};

/* The CPU table: today's ops (src/model/ops.c, optim.c, exit.c's row
 * gathers, ...), host memory. */
const struct dm_backend *backend_cpu(void);

/* Host staging over backend_current()'s memory, for code that reads or
 * writes device tensors on the host (the loss, checkpoints, migration,
 * MPI). On a backend with host_access every call is a pass-through and
 * nothing is copied (the CPU's speed and bits do not change).
 * backend_staging: a host buffer of bytes (alloc_host), or NULL when the
 * host reads the backend's memory itself; free it with
 * backend_staging_free (NULL is fine).
 * backend_read: a host pointer holding the bytes at device src: src
 * itself when staging is NULL, else staging after a copy down.
 * backend_write_begin: where the host writes what is meant for device dst
 * (dst itself when staging is NULL); backend_write_end then copies it up
 * (nothing when host == dst). */
void *backend_staging(size_t bytes);
void backend_staging_free(void *staging);
const void *backend_read(void *staging, const void *src, size_t bytes);
void *backend_write_begin(void *staging, void *dst);
void backend_write_end(void *dst, const void *host, size_t bytes);

/* The table the model routes through: the CPU's until backend_open
 * selects another. Not thread-safe; set once at start-up. */
const struct dm_backend *backend_current(void);

/* Selects the backend train.device names: "cpu"; "cuda", which loads
 * the plugin (backend_plugin_path) with dlopen and asks it for its table;
 * or "emulate", which loads the emulated device the same way
 * ($DYNMO_EMULATE_PLUGIN, else libdynmo_emulate.so beside the binary).
 * Returns 0, or -1 with one message in err naming the problem and the fix
 * (no plugin, not a dynmo plugin, built for another table, no CUDA
 * device); the CPU backend then stays current. local_rank and
 * local_size place this process on its node (struct dm_backend_host):
 * 0 and 1 for a lone process. Not collective. */
int backend_open(const char *device, int local_rank, int local_size, char *err,
                 size_t errsize);

/* Installs the host's wait_round (struct dm_backend_host) for every
 * backend opened, before or after: the layer that owns MPI hands it in. */
void backend_set_wait_round(void (*wait_round)(int first));

/* Sets the operand precision (enum dm_precision) of every matrix product
 * a plugin runs from now on, for every backend opened, before or after.
 * The CPU backend ignores it: the caller refuses anything but fp32 there
 * (config_validate). */
void backend_set_precision(enum dm_precision precision);

/* "fp32", "tf32" or "bf16"; DM_PRECISION_FP32 for a name that is none
 * of them (config_validate has refused it before). */
enum dm_precision backend_precision_from_name(const char *name);
const char *backend_precision_name(enum dm_precision precision);

/* Where the plugin is looked for: $DYNMO_CUDA_PLUGIN when set, else
 * libdynmo_cuda.so beside the running binary. Returns 0, or -1 when
 * neither can be named (out then holds ""). */
int backend_plugin_path(char *out, size_t size);

#ifdef __cplusplus
}
#endif
#endif
