/* Device-to-device transport of the CUDA backend: an NCCL communicator
 * over a group of the job's ranks, point-to-point transfers issued in
 * groups (activations between stages, migrating blocks, expert
 * parallelism's rows, the tied embedding's halves) and a sum all-reduce
 * (gradients between replicas). The unique id goes from rank 0 to the
 * others through the host's polled broadcast (the bcast_ints it hands
 * comm_init), so the plugin never calls MPI. Every transfer runs on the
 * communicator's own stream after the compute stream's work (an event
 * orders them) and is waited for by polling cudaStreamQuery between the
 * host's wait rounds (its MPI progress, then sched_yield): the host never
 * blocks inside CUDA or NCCL, and a dead peer is the MPI side's to
 * detect. NCCL's sum is deterministic for a fixed rank count and
 * topology; across rank counts its order differs (docs/gpu.md). */
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include "plugin.h"

#define NCCL_CHECK(call)                                                               \
    do {                                                                               \
        ncclResult_t nccl_check_rc = (call);                                           \
        if (nccl_check_rc != ncclSuccess)                                              \
            dm_cuda_fail(__FILE__, __LINE__, #call, ncclGetErrorString(nccl_check_rc)); \
    } while (0)

struct dm_backend_comm {
    ncclComm_t nccl;
    cudaStream_t stream;
    cudaEvent_t ready;     /* the compute stream's work so far */
    int rank, size;
};

static_assert(sizeof(ncclUniqueId) % sizeof(int) == 0, "ncclUniqueId is whole ints");

struct dm_backend_comm *cuda_comm_init(int rank, int size,
                                       void (*bcast_ints)(void *ctx, int *buf, int n), void *ctx)
{
    struct dm_backend_comm *c = (struct dm_backend_comm *)calloc(1, sizeof *c);
    if (!c) dm_cuda_fail(__FILE__, __LINE__, "calloc", "out of memory");
    ncclUniqueId id;
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    bcast_ints(ctx, (int *)&id, (int)(sizeof id / sizeof(int)));
    c->rank = rank;
    c->size = size;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
    /* Non-blocking: the init itself is polled like the transfers. */
    int waited = 0;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&c->nccl, size, id, rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) NCCL_CHECK(rc);
    for (ncclResult_t state = ncclInProgress; state == ncclInProgress;) {
        NCCL_CHECK(ncclCommGetAsyncError(c->nccl, &state));
        if (state == ncclInProgress) dm_cuda_wait_round(!waited++);
        else NCCL_CHECK(state);
    }
    return c;
}

/* The compute stream's work before the transfer; the transfer after it. */
static void begin(struct dm_backend_comm *c)
{
    CUDA_CHECK(cudaEventRecord(c->ready, dm_cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->ready, 0));
}

/* An operation issued on a non-blocking communicator may itself return
 * ncclInProgress; finish waits for the issue as well as the stream. */
static void issued(ncclResult_t rc, const char *call)
{
    if (rc != ncclSuccess && rc != ncclInProgress)
        dm_cuda_fail(__FILE__, __LINE__, call, ncclGetErrorString(rc));
}

/* Polls until the transfers are done, failing on an asynchronous NCCL
 * error: first until NCCL has issued them to the stream (a non-blocking
 * communicator may still be issuing a group when ncclGroupEnd returns;
 * the stream would look idle), then until the stream has run them. */
static void finish(struct dm_backend_comm *c)
{
    int waited = 0;
    for (;;) {
        ncclResult_t state;
        NCCL_CHECK(ncclCommGetAsyncError(c->nccl, &state));
        if (state == ncclSuccess) break;
        if (state != ncclInProgress) NCCL_CHECK(state);
        dm_cuda_wait_round(!waited++);
    }
    for (;;) {
        cudaError_t rc = cudaStreamQuery(c->stream);
        if (rc == cudaSuccess) return;
        if (rc != cudaErrorNotReady) CUDA_CHECK(rc);
        ncclResult_t state;
        NCCL_CHECK(ncclCommGetAsyncError(c->nccl, &state));
        if (state != ncclSuccess && state != ncclInProgress) NCCL_CHECK(state);
        dm_cuda_wait_round(!waited++);
    }
}

/* The transfers as one NCCL group: they progress together, so that two
 * ranks each sending to the other do not wait on each other. */
void cuda_comm_exchange(struct dm_backend_comm *c, const struct dm_comm_op *ops, int n)
{
    begin(c);
    issued(ncclGroupStart(), "ncclGroupStart");
    for (int i = 0; i < n; i++) {
        if (ops[i].recv)
            issued(ncclRecv(ops[i].buf, ops[i].count, ncclFloat32, ops[i].peer, c->nccl, c->stream),
                   "ncclRecv");
        else
            issued(ncclSend(ops[i].buf, ops[i].count, ncclFloat32, ops[i].peer, c->nccl, c->stream),
                   "ncclSend");
    }
    issued(ncclGroupEnd(), "ncclGroupEnd");
    finish(c);
}

void cuda_comm_all_reduce_sum(struct dm_backend_comm *c, float *buf, size_t count)
{
    begin(c);
    issued(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, c->nccl, c->stream),
           "ncclAllReduce");
    finish(c);
}

void cuda_comm_free(struct dm_backend_comm *c)
{
    if (!c) return;
    finish(c);
    NCCL_CHECK(ncclCommDestroy(c->nccl));
    CUDA_CHECK(cudaEventDestroy(c->ready));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    free(c);
}
