/* The CUDA plugin's entry (include/dynmo/backend.h): finds a device,
 * creates the plugin's stream and cuBLAS handle, and fills the backend
 * table with the kernels of this directory. Memory is device memory;
 * copies go through the stream and are waited for by polling. It must
 * not call MPI (the NCCL set-up gets the host's broadcast) and must not
 * exit on its own: a failed call goes to the host's fatal path. */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include "plugin.h"

static const struct dm_backend_host *host;
static cudaStream_t stream;
static cublasHandle_t cublas;
static float *scratch[SCRATCH_SLOTS];
static size_t scratch_floats[SCRATCH_SLOTS];

void dm_cuda_fail(const char *file, int line, const char *call, const char *text)
{
    if (host) host->fatal(file, line, call, text);
    fprintf(stderr, "%s:%d: internal error: %s: %s\n", file, line, call, text);
    abort();
}

cudaStream_t dm_cuda_stream(void)
{
    return stream;
}

cublasHandle_t dm_cuda_cublas(void)
{
    return cublas;
}

int dm_cuda_precision(void)
{
    return host ? host->precision : DM_PRECISION_FP32;
}

void dm_cuda_wait_round(int first)
{
    if (host && host->wait_round) host->wait_round(first);
    else sched_yield();
}

void dm_cuda_stream_wait(cudaStream_t s)
{
    for (;;) {
        cudaError_t rc = cudaStreamQuery(s);
        if (rc == cudaSuccess) return;
        if (rc != cudaErrorNotReady) CUDA_CHECK(rc);
        sched_yield();
    }
}

float *dm_cuda_scratch(int slot, size_t floats)
{
    if (floats > scratch_floats[slot]) {
        dm_cuda_stream_wait(stream);   /* the old buffer may still be read */
        CUDA_CHECK(cudaFree(scratch[slot]));
        CUDA_CHECK(cudaMalloc(&scratch[slot], floats * sizeof(float)));
        scratch_floats[slot] = floats;
    }
    return scratch[slot];
}

static void *device_alloc(size_t bytes)
{
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
    return p;
}

static void device_free(void *p)
{
    dm_cuda_stream_wait(stream);
    CUDA_CHECK(cudaFree(p));
}

static void *pinned_alloc(size_t bytes)
{
    void *p = NULL;
    CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
    memset(p, 0, bytes);
    return p;
}

static void pinned_free(void *p)
{
    dm_cuda_stream_wait(stream);   /* no copy may still read or write it */
    CUDA_CHECK(cudaFreeHost(p));
}

static void copy_to_device(void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    dm_cuda_stream_wait(stream);
}

static void copy_to_host(void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    dm_cuda_stream_wait(stream);
}

static void synchronize(void)
{
    dm_cuda_stream_wait(stream);
}

static void fill_ops(struct dm_backend *t)
{
    t->matmul_forward = cuda_matmul_forward;
    t->matmul_forward_residual = cuda_matmul_forward_residual;
    t->matmul_forward_gelu = cuda_matmul_forward_gelu;
    t->matmul_backward = cuda_matmul_backward;
    t->matmul_backward_overwrite = cuda_matmul_backward_overwrite;
    t->matmul_backward_gelu = cuda_matmul_backward_gelu;
    t->layernorm_forward = cuda_layernorm_forward;
    t->layernorm_backward = cuda_layernorm_backward;
    t->layernorm_backward_residual = cuda_layernorm_backward_residual;
    t->attention_forward = cuda_attention_forward;
    t->attention_backward = cuda_attention_backward;
    t->attention_forward_rows = cuda_attention_forward_rows;
    t->attention_backward_rows = cuda_attention_backward_rows;
    t->group_attention_forward = cuda_hash_attention_forward;
    t->group_attention_backward = cuda_hash_attention_backward;
    t->gelu_forward = cuda_gelu_forward;
    t->gelu_backward = cuda_gelu_backward;
    t->residual_forward = cuda_residual_forward;
    t->encoder_forward = cuda_encoder_forward;
    t->encoder_backward = cuda_encoder_backward;
    t->crossentropy_forward = cuda_crossentropy_forward;
    t->crossentropy_softmax_backward = cuda_crossentropy_softmax_backward;
    t->exit_softmax_confidence = cuda_exit_softmax_confidence;
    t->exit_saturation_confidence = cuda_exit_saturation_confidence;
    t->routed_combine_forward = cuda_moe_combine_forward;
    t->routed_combine_backward = cuda_moe_combine_backward;
    t->routed_dispatch_backward = cuda_moe_dispatch_backward;
    t->route_topk_forward = cuda_moe_route_forward;
    t->route_topk_sums = cuda_moe_route_sums;
    t->route_topk_backward = cuda_moe_route_backward;
    t->prune_histogram = cuda_prune_histogram;
    t->prune_mask = cuda_prune_mask;
    t->adamw_update = cuda_adamw_update;
    t->sparse_matmul_forward = cuda_sparse_matmul_forward;
    t->sparse_matmul_backward = cuda_sparse_matmul_backward;
    t->mod_router_forward = cuda_mod_router_forward;
    t->mod_select_topk = cuda_mod_select_topk;
    t->mod_predictor_forward_backward = cuda_mod_predictor_forward_backward;
    t->mod_combine_forward = cuda_mod_combine_forward;
    t->mod_scale_chosen = cuda_mod_scale_chosen;
    t->mod_combine_backward = cuda_mod_combine_backward;
    t->rows_gather = cuda_rows_gather;
    t->rows_scatter = cuda_rows_scatter;
    t->zero = cuda_zero;
    t->copy_on_device = cuda_copy_on_device;
    t->sum_squares = cuda_sum_squares;
    t->comm_init = cuda_comm_init;
    t->comm_exchange = cuda_comm_exchange;
    t->comm_all_reduce_sum = cuda_comm_all_reduce_sum;
    t->comm_free = cuda_comm_free;
}

/* A device for this process: backend_device_for(its rank on the node,
 * the devices it sees), so that the ranks of a node each take their own
 * GPU while there are enough (where the launcher shows each only its own,
 * CUDA_VISIBLE_DEVICES or --gpus-per-task, that is device 0); its name
 * and its UUID (id). Returns 0, or -1 with the reason. */
static int pick_device(const struct dm_backend_host *caller, char *name, size_t size, char *id,
                       size_t idsize, char *err, size_t errsize)
{
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        snprintf(err, errsize, "no CUDA device (%s); run on a GPU node or use train.device = cpu",
                 rc != cudaSuccess ? cudaGetErrorString(rc) : "cudaGetDeviceCount found none");
        return -1;
    }
    int dev = backend_device_for(caller->local_rank, count);
    struct cudaDeviceProp prop;
    if (cudaSetDevice(dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        snprintf(err, errsize, "CUDA device %d cannot be opened (%s)", dev,
                 cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    int at = snprintf(id, idsize, "GPU-");
    for (int b = 0; b < 16 && at + 2 < (int)idsize; b++)
        at += snprintf(id + at, idsize - (size_t)at, "%02x", (unsigned char)prop.uuid.bytes[b]);
    snprintf(name, size, "CUDA device %d of %d: %.48s, compute %d.%d, %.0f GiB%s", dev, count,
             prop.name, prop.major, prop.minor, prop.totalGlobalMem / 1073741824.0,
             caller->local_size > count ? ", shared with other ranks" : "");
    return 0;
}

extern "C" __attribute__((visibility("default"))) int dynmo_cuda_backend_open(
    struct dm_backend *table, const struct dm_backend_host *caller, char *err, size_t errsize)
{
    char device[128], id[64];
    if (pick_device(caller, device, sizeof device, id, sizeof id, err, errsize) != 0) return -1;
    host = caller;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cublas));
    CUBLAS_CHECK(cublasSetStream(cublas, stream));
    /* no TF32 behind our back: each product's compute type says what it
     * uses (matmul.cu, train.precision) */
    CUBLAS_CHECK(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));
    memset(table, 0, sizeof *table);
    table->abi = DM_BACKEND_ABI;
    table->name = "cuda";
    snprintf(table->device, sizeof table->device, "%s", device);
    snprintf(table->device_id, sizeof table->device_id, "%s", id);
    table->host_access = 0;   /* device memory: the host stages every read and write */
    table->alloc = device_alloc;
    table->free = device_free;
    table->copy_to_device = copy_to_device;
    table->copy_to_host = copy_to_host;
    table->synchronize = synchronize;
    table->alloc_host = pinned_alloc;
    table->free_host = pinned_free;
    fill_ops(table);
    return 0;
}
