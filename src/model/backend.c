/* The backend table (include/dynmo/backend.h): the CPU backend, which is
 * the model's own ops, and the loading of the CUDA plugin when
 * train.device = cuda (or of the emulated device, the same kernels run on
 * the CPU, when train.device = emulate: a plugin built from
 * kernels/emulate.c by gcc). The CPU build never needs CUDA: the plugin is
 * found at run time with dlopen, and everything this file knows of it is
 * the table and the one entry symbol. It must not call MPI (the model
 * never does) nor decide anything for other ranks: the caller agrees on
 * the outcome (src/tools/train_setup.c). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/backend.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "model/internal.h"

static void *cpu_alloc(size_t bytes)
{
    return dm_alloc(bytes);
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

static void cpu_synchronize(void)
{
}

/* parallel_zero and parallel_copy on whole floats, as the model called them */
static void cpu_zero(void *dst, size_t bytes)
{
    if (bytes % sizeof(float) == 0) parallel_zero(dst, (long)(bytes / sizeof(float)));
    else memset(dst, 0, bytes);
}

static void cpu_copy_on_device(void *dst, const void *src, size_t bytes)
{
    if (bytes % sizeof(float) == 0) parallel_copy(dst, src, (long)(bytes / sizeof(float)));
    else memcpy(dst, src, bytes);
}

/* The CSR arrays as the struct the CPU kernels take (they only read it). */
static struct csr_matrix csr_view(const int *row_ptr, const int *col_idx, const float *values,
                                  int rows, int cols)
{
    struct csr_matrix w = {.rows = rows, .cols = cols, .nnz = row_ptr[rows],
                           .row_ptr = (int *)row_ptr, .col_idx = (int *)col_idx,
                           .values = (float *)values};
    return w;
}

static void cpu_sparse_forward(float *out, const float *inp, const int *row_ptr,
                               const int *col_idx, const float *values, const float *bias, int N,
                               int C, int OC)
{
    struct csr_matrix w = csr_view(row_ptr, col_idx, values, OC, C);
    sparse_matmul_forward(out, inp, &w, bias, N, C, OC);
}

static void cpu_sparse_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const int *row_ptr, const int *col_idx,
                                const float *values, int nnz, int N, int C, int OC)
{
    struct csr_matrix w = csr_view(row_ptr, col_idx, values, OC, C);
    DM_ASSERT(w.nnz == nnz);
    sparse_matmul_backward(dinp, dweight, dbias, dout, inp, &w, N, C, OC);
}

static const struct dm_backend cpu_table = {
    .abi = DM_BACKEND_ABI,
    .name = "cpu",
    .device = "the CPU (OpenBLAS, dm_parallel_for)",
    .host_access = 1,
    .alloc = cpu_alloc,
    .free = dm_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_synchronize,
    .zero = cpu_zero,
    .copy_on_device = cpu_copy_on_device,
    .alloc_host = cpu_alloc,
    .free_host = dm_free,
    .matmul_forward = matmul_forward,
    .matmul_forward_residual = matmul_forward_residual,
    .matmul_forward_gelu = matmul_forward_gelu,
    .matmul_backward = matmul_backward,
    .matmul_backward_overwrite = matmul_backward_overwrite,
    .matmul_backward_gelu = matmul_backward_gelu,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .layernorm_backward_residual = layernorm_backward_residual,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .attention_forward_rows = attention_forward_rows,
    .attention_backward_rows = attention_backward_rows,
    .group_attention_forward = group_attention_forward,
    .group_attention_backward = group_attention_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .residual_forward = residual_forward,
    .encoder_forward = encoder_forward,
    .encoder_backward = encoder_backward,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_softmax_backward = crossentropy_softmax_backward,
    .exit_softmax_confidence = exit_softmax_confidence,
    .exit_saturation_confidence = exit_saturation_confidence,
    .routed_combine_forward = routed_combine_forward,
    .routed_combine_backward = routed_combine_backward,
    .routed_dispatch_backward = routed_dispatch_backward,
    .route_topk_forward = route_topk_forward,
    .route_topk_sums = route_topk_sums,
    .route_topk_backward = route_topk_backward,
    .adamw_update = adamw_update,
    .sparse_matmul_forward = cpu_sparse_forward,
    .sparse_matmul_backward = cpu_sparse_backward,
    .mod_router_forward = mod_router_forward,
    .mod_select_topk = mod_select_topk,
    .mod_predictor_forward_backward = mod_predictor_forward_backward,
    .mod_combine_forward = mod_combine_forward,
    .mod_scale_chosen = mod_scale_chosen,
    .mod_combine_backward = mod_combine_backward,
    .rows_gather = rows_gather,
    .rows_scatter = rows_scatter,
    .prune_histogram = prune_histogram,
    .prune_mask = prune_mask,
    .sum_squares = sum_squares,
};

static const struct dm_backend *current = &cpu_table;
static struct dm_backend plugin_table;

const struct dm_backend *backend_cpu(void)
{
    return &cpu_table;
}

const struct dm_backend *backend_current(void)
{
    return current;
}

void *backend_staging(size_t bytes)
{
    return current->host_access ? NULL : current->alloc_host(bytes);
}

void backend_staging_free(void *staging)
{
    if (staging) current->free_host(staging);
}

const void *backend_read(void *staging, const void *src, size_t bytes)
{
    if (!staging) return src;
    current->copy_to_host(staging, src, bytes);
    return staging;
}

void *backend_write_begin(void *staging, void *dst)
{
    return staging ? staging : dst;
}

void backend_write_end(void *dst, const void *host, size_t bytes)
{
    if (host != dst) current->copy_to_device(dst, host, bytes);
}

/* $env when set, else `file` beside the running binary */
static int plugin_path_for(const char *env_name, const char *file, char *out, size_t size)
{
    const char *env = getenv(env_name);
    out[0] = 0;
    if (env && env[0]) {
        dm_set_message(out, size, "%s", env);
        return 0;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) slash[1] = 0;
    dm_set_message(out, size, "%s%s", slash ? exe : "", file);
    return 0;
}

int backend_plugin_path(char *out, size_t size)
{
    return plugin_path_for("DYNMO_CUDA_PLUGIN", "libdynmo_cuda.so", out, size);
}

static void plugin_fatal(const char *file, int line, const char *call, const char *text)
{
    dm_internal_error(file, line, "%s: %s", call, text);
}

/* dlopen the plugin at path and ask it for its table; device names it
 * in messages, build how to build it. */
static int open_plugin(const char *device, const char *build, const char *path,
                       const struct dm_backend_host *host, char *err, size_t errsize)
{
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        dm_set_message(err, errsize, "train.device = %s: cannot load the %s plugin %s "
                       "(%s); build it with %s (docs/gpu.md)", device,
                       strcmp(device, "cuda") ? "emulated-device" : "CUDA", path, dlerror(),
                       build);
        return -1;
    }
    dm_backend_open_fn entry;
    *(void **)&entry = dlsym(handle, DM_BACKEND_PLUGIN_ENTRY);
    if (!entry) {
        dm_set_message(err, errsize, "train.device = %s: %s is not a dynmo CUDA plugin "
                       "(no symbol %s)", device, path, DM_BACKEND_PLUGIN_ENTRY);
        dlclose(handle);
        return -1;
    }
    struct dm_backend table;
    memset(&table, 0, sizeof table);
    char problem[512] = "";
    int rc = entry(&table, host, problem, sizeof problem);
    if (rc == 0 && table.abi != DM_BACKEND_ABI)
        dm_set_message(problem, sizeof problem, "it was built for backend table %d, this "
                       "dynmo has %d: rebuild it with %s", table.abi, DM_BACKEND_ABI, build);
    if (rc != 0 || table.abi != DM_BACKEND_ABI) {
        dm_set_message(err, errsize, "train.device = %s: %s: %s", device, path, problem);
        dlclose(handle);   /* a plugin that refused holds nothing */
        return -1;
    }
    plugin_table = table;
    current = &plugin_table;
    return 0;
}

/* What every plugin is handed at open and keeps (its pointer): this
 * process's place on its node, the host's wait round once set, and the
 * products' operand precision. */
static struct dm_backend_host host = {.fatal = plugin_fatal};

void backend_set_wait_round(void (*wait_round)(int first))
{
    host.wait_round = wait_round;
}

void backend_set_precision(enum dm_precision precision)
{
    host.precision = (int)precision;
}

static const char *const precision_names[] = {"fp32", "tf32", "bf16"};

enum dm_precision backend_precision_from_name(const char *name)
{
    for (size_t p = 0; p < sizeof precision_names / sizeof *precision_names; p++)
        if (!strcmp(name, precision_names[p])) return (enum dm_precision)p;
    return DM_PRECISION_FP32;
}

const char *backend_precision_name(enum dm_precision precision)
{
    return precision_names[precision];
}

int backend_open(const char *device, int local_rank, int local_size, char *err,
                 size_t errsize)
{
    /* the plugin keeps the pointer for its fatal path: static */
    host.local_rank = local_rank;
    host.local_size = local_size;
    if (!strcmp(device, "cpu")) {
        current = &cpu_table;
        return 0;
    }
    char path[4096];
    if (!strcmp(device, "emulate")) {
        if (plugin_path_for("DYNMO_EMULATE_PLUGIN", "libdynmo_emulate.so", path, sizeof path)) {
            dm_set_message(err, errsize, "train.device = emulate: cannot name the plugin (no "
                           "DYNMO_EMULATE_PLUGIN and /proc/self/exe unreadable)");
            return -1;
        }
        return open_plugin(device, "`make`", path, &host, err, errsize);
    }
    if (strcmp(device, "cuda") != 0) {
        dm_set_message(err, errsize, "train.device = '%s' must be cpu, cuda or emulate", device);
        return -1;
    }
    if (backend_plugin_path(path, sizeof path) != 0) {
        dm_set_message(err, errsize, "train.device = cuda: cannot name the CUDA plugin "
                       "(no DYNMO_CUDA_PLUGIN and /proc/self/exe unreadable); set "
                       "DYNMO_CUDA_PLUGIN to build/libdynmo_cuda.so");
        return -1;
    }
    return open_plugin(device, "`make USE_CUDA=1` or name it in DYNMO_CUDA_PLUGIN", path, &host,
                       err, errsize);
}
