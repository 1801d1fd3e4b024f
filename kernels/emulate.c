/* The emulated device: the CUDA plugin's table run on the CPU, for testing
 * the whole model on the kernels' own arithmetic without a GPU
 * (train.device = emulate; docs/gpu.md). gcc compiles this file, with the
 * kernels' per-thread functions (the .cuh files), into
 * build/libdynmo_emulate.so, which dynmo loads with dlopen exactly as it
 * loads the CUDA plugin. Each op launches what the matching .cu launcher
 * launches, in the same order and with the same block size
 * (DM_BLOCK_THREADS), every block and thread in a loop and a kernel with
 * barriers phase by phase, as tests/test_kernels_host.c does; the cuBLAS
 * products go through the same column-major translation (gemm.cuh) onto
 * CBLAS, on operands rounded as train.precision says (precision.cuh). Device memory is an arena of this process's address space that
 * the host cannot touch outside the table's entries (strict mode, below):
 * a host read of a device tensor faults and is named. It must not know
 * anything of dynmo beyond include/dynmo/backend.h, nor call MPI. */
#include <cblas.h>
#include <execinfo.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/backend.h"
#include "adamw.cuh"
#include "attention.cuh"
#include "elementwise.cuh"
#include "encoder.cuh"
#include "exit.cuh"
#include "gemm.cuh"
#include "hash.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "mod.cuh"
#include "moe.cuh"
#include "precision.cuh"
#include "prune.cuh"
#include "reduce.cuh"
#include "softmax.cuh"
#include "sparse.cuh"

#define EXPORT __attribute__((visibility("default")))
enum { THREADS = DM_BLOCK_THREADS };

static const struct dm_backend_host *host;

/* ---- the device arena -------------------------------------------------------
 * Device memory is one region of address space reserved at open
 * (DYNMO_EMULATE_ARENA_GIB, default 64; MAP_NORESERVE, so only what is
 * touched costs memory), carved by a first-fit allocator whose
 * bookkeeping lives outside it. In strict mode (the default;
 * DYNMO_EMULATE_STRICT=0 turns it off) the used part is PROT_NONE except
 * while one of the table's entries runs (DEVICE_SCOPE), so the host
 * dereferencing a device pointer faults, and the handler names it. */
struct extent {
    size_t offset, bytes;
    int used;
};

static struct {
    unsigned char *base;
    size_t size, top, opened_top;   /* top: end of the highest extent; opened: made RW */
    struct extent *extents;
    int count, capacity, depth, strict;
    struct sigaction previous;
} arena;

enum { ARENA_ALIGN = 256 };

static size_t page_round(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

static void arena_protect(int open)
{
    if (open && arena.top > arena.opened_top) arena.opened_top = arena.top;
    size_t extent = page_round(arena.opened_top);
    if (extent > 0 && mprotect(arena.base, extent, open ? PROT_READ | PROT_WRITE : PROT_NONE))
        host->fatal(__FILE__, __LINE__, "mprotect", "cannot change the arena's protection");
    if (!open) arena.opened_top = 0;
}

/* Entering and leaving one of the table's entries (nested calls count). */
static int device_enter(void)
{
    if (arena.depth++ == 0 && arena.strict) arena_protect(1);
    return 0;
}

static void device_leave(int *unused)
{
    (void)unused;
    if (--arena.depth == 0 && arena.strict) arena_protect(0);
}

#define DEVICE_SCOPE int device_scope __attribute__((cleanup(device_leave), unused)) = \
    device_enter()

static int in_arena(const void *p);

/* In strict mode every pointer an op takes must be device memory: a host
 * pointer handed to an op is what a GPU kernel could not read. */
static void device_args(const char *op, int n, const void *const *pointers)
{
    for (int i = 0; arena.strict && i < n; i++) {
        if (!pointers[i] || in_arena(pointers[i])) continue;
        char text[256];
        snprintf(text, sizeof text, "pointer argument %d (%p) is host memory, not the device's "
                 "(a device op reads only what the table's alloc returned)", i + 1,
                 pointers[i]);
        host->fatal(__FILE__, __LINE__, op, text);
    }
}

#define DEVICE_ARGS(op, ...)                                                          \
    do {                                                                              \
        const void *device_args_list[] = {__VA_ARGS__};                               \
        device_args(op, (int)(sizeof device_args_list / sizeof device_args_list[0]),  \
                    device_args_list);                                                \
    } while (0)

static void extent_insert(int at, struct extent e)
{
    if (arena.count == arena.capacity) {
        arena.capacity = arena.capacity ? 2 * arena.capacity : 256;
        arena.extents = realloc(arena.extents, (size_t)arena.capacity * sizeof *arena.extents);
        if (!arena.extents) host->fatal(__FILE__, __LINE__, "realloc", "out of memory");
    }
    memmove(arena.extents + at + 1, arena.extents + at,
            (size_t)(arena.count - at) * sizeof *arena.extents);
    arena.extents[at] = e;
    arena.count++;
}

static void extent_remove(int at)
{
    memmove(arena.extents + at, arena.extents + at + 1,
            (size_t)(arena.count - at - 1) * sizeof *arena.extents);
    arena.count--;
}

/* The offset of a free run of `bytes`: the first free extent that fits
 * (split), else the top of the arena. */
static size_t arena_take(size_t bytes)
{
    for (int i = 0; i < arena.count; i++) {
        struct extent *e = &arena.extents[i];
        if (e->used || e->bytes < bytes) continue;
        if (e->bytes > bytes) {
            struct extent rest = {e->offset + bytes, e->bytes - bytes, 0};
            e->bytes = bytes;
            extent_insert(i + 1, rest);
        }
        arena.extents[i].used = 1;
        return arena.extents[i].offset;
    }
    if (bytes > arena.size - arena.top)
        host->fatal(__FILE__, __LINE__, "emulate_alloc", "the emulated device's arena is full "
                    "(raise DYNMO_EMULATE_ARENA_GIB)");
    struct extent e = {arena.top, bytes, 1};
    extent_insert(arena.count, e);
    arena.top += bytes;
    return e.offset;
}

static void *emulate_alloc(size_t bytes)
{
    DEVICE_SCOPE;
    size_t rounded = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    size_t offset = arena_take(rounded ? rounded : ARENA_ALIGN);
    if (arena.strict) arena_protect(1);   /* the top may have grown */
    memset(arena.base + offset, 0, rounded);
    return arena.base + offset;
}

static void emulate_free(void *p)
{
    if (!p) return;
    size_t offset = (size_t)((unsigned char *)p - arena.base);
    int i = 0;
    while (i < arena.count && arena.extents[i].offset != offset) i++;
    if (i == arena.count || !arena.extents[i].used)
        host->fatal(__FILE__, __LINE__, "emulate_free", "not a live device allocation");
    arena.extents[i].used = 0;
    if (i + 1 < arena.count && !arena.extents[i + 1].used) {
        arena.extents[i].bytes += arena.extents[i + 1].bytes;
        extent_remove(i + 1);
    }
    if (i > 0 && !arena.extents[i - 1].used) {
        arena.extents[i - 1].bytes += arena.extents[i].bytes;
        extent_remove(i--);
    }
    if (i == arena.count - 1) {   /* the top extent is free: give it back */
        arena.top = arena.extents[i].offset;
        extent_remove(i);
    }
}

static int in_arena(const void *p)
{
    const unsigned char *c = p;
    return c >= arena.base && c < arena.base + arena.size;
}

/* A fault inside the arena is the host touching device memory: say so,
 * with the backtrace, and abort. Any other fault goes to the handler
 * that was there before (or the default). */
static void arena_fault(int sig, siginfo_t *info, void *context)
{
    (void)context;
    if (in_arena(info->si_addr)) {
        char line[160];
        int n = snprintf(line, sizeof line, "host read of device memory at %p (a device pointer "
                         "dereferenced outside the backend table; train.device = emulate, "
                         "docs/gpu.md)\n", info->si_addr);
        if (write(2, line, (size_t)n) < 0) n = 0;
        void *frames[64];
        backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
        signal(SIGABRT, SIG_DFL);
        abort();
    }
    sigaction(sig, &arena.previous, NULL);   /* the fault repeats under it */
}

/* Reserves the arena and, in strict mode, installs the fault handler.
 * Returns 0, or -1 with the reason. */
static int arena_open(char *err, size_t errsize)
{
    if (arena.base) return 0;
    const char *gib = getenv("DYNMO_EMULATE_ARENA_GIB");
    const char *strict = getenv("DYNMO_EMULATE_STRICT");
    double size_gib = gib && gib[0] ? atof(gib) : 64.0;
    if (!(size_gib > 0.0)) {
        snprintf(err, errsize, "DYNMO_EMULATE_ARENA_GIB='%s' must be a positive size", gib);
        return -1;
    }
    arena.size = page_round((size_t)(size_gib * 1073741824.0));
    void *p = mmap(NULL, arena.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                   0);
    if (p == MAP_FAILED) {
        snprintf(err, errsize, "cannot reserve %.1f GiB of address space for the emulated "
                 "device (set DYNMO_EMULATE_ARENA_GIB lower)", size_gib);
        return -1;
    }
    arena.base = p;
    arena.strict = !(strict && !strcmp(strict, "0"));
    if (!arena.strict) {
        if (mprotect(arena.base, arena.size, PROT_READ | PROT_WRITE) != 0) {
            snprintf(err, errsize, "cannot open the emulated device's arena");
            return -1;
        }
        return 0;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = arena_fault;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &arena.previous);
    return 0;
}

/* Host staging (pinned on CUDA): plain host memory here. */
static void *emulate_alloc_host(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) host->fatal(__FILE__, __LINE__, "calloc", "out of memory");
    return p;
}

/* The table's allocations, counted: with DYNMO_EMULATE_ALLOC_COUNTS=1 the
 * process prints at exit (or when the plugin is unloaded) how many times the model called alloc and
 * alloc_host (the emulator's own scratch is not counted), so a test can
 * see that a step allocates nothing after the first (cudaMalloc and
 * cudaHostAlloc are slow on a GPU), and how many bytes it copied with
 * copy_to_device and copy_to_host, so a test can see what crosses. */
static long table_allocs, table_host_allocs;
static long long bytes_to_device, bytes_to_host;

static void *emulate_table_alloc(size_t bytes)
{
    table_allocs++;
    return emulate_alloc(bytes);
}

static void *emulate_table_alloc_host(size_t bytes)
{
    table_host_allocs++;
    return emulate_alloc_host(bytes);
}

static int count_allocs;

/* The emulated node's devices (DYNMO_EMULATE_DEVICES, 1..64, default 1):
 * this process takes backend_device_for(its rank on the node, them) as the
 * CUDA plugin does; the table's device and the counts at exit name it. */
static int emulated_device, emulated_devices = 1;

static int pick_emulated_device(const struct dm_backend_host *h, char *err, size_t errsize)
{
    const char *text = getenv("DYNMO_EMULATE_DEVICES");
    if (text) {
        char *end = NULL;
        long n = strtol(text, &end, 10);
        if (!*text || *end || n < 1 || n > 64) {
            snprintf(err, errsize, "DYNMO_EMULATE_DEVICES=%s: want a device count in 1..64",
                     text);
            return -1;
        }
        emulated_devices = (int)n;
    }
    emulated_device = backend_device_for(h->local_rank, emulated_devices);
    return 0;
}

__attribute__((destructor)) static void print_alloc_counts(void)
{
    if (!count_allocs) return;
    fprintf(stderr, "emulate: device %d of %d, local rank %d of %d\n", emulated_device,
            emulated_devices, host ? host->local_rank : 0, host ? host->local_size : 1);
    fprintf(stderr, "emulate: %ld device allocations, %ld host allocations\n", table_allocs,
            table_host_allocs);
    fprintf(stderr, "emulate: %lld bytes copied to the device, %lld bytes copied to the host\n",
            bytes_to_device, bytes_to_host);
}

static void emulate_copy_to_device(void *dst, const void *src, size_t bytes)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("copy_to_device", dst);
    bytes_to_device += (long long)bytes;
    if (bytes) memcpy(dst, src, bytes);
}

static void emulate_copy_to_host(void *dst, const void *src, size_t bytes)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("copy_to_host", src);
    bytes_to_host += (long long)bytes;
    if (bytes) memcpy(dst, src, bytes);
}

static void emulate_copy_on_device(void *dst, const void *src, size_t bytes)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("copy_on_device", dst, src);
    if (bytes) memcpy(dst, src, bytes);
}

static void emulate_zero(void *dst, size_t bytes)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("zero", dst);
    if (bytes) memset(dst, 0, bytes);
}

static void emulate_synchronize(void)
{
}

/* ---- the grid harness ------------------------------------------------------ */

/* the plugin's dm_grid_for: blocks for n items, at least 1, capped */
static long grid_for(long n)
{
    long blocks = (n + THREADS - 1) / THREADS;
    if (blocks < 1) blocks = 1;
    return blocks < 65535 ? blocks : 65535;
}

/* `body` once per thread of a (blocks x THREADS) launch, the thread as t */
#define LAUNCH(blocks, body)                                                        \
    do {                                                                            \
        long launch_blocks = (blocks);                                              \
        for (long launch_b = 0; launch_b < launch_blocks; launch_b++)               \
            for (int launch_k = 0; launch_k < THREADS; launch_k++) {                \
                struct dm_thread t = dm_thread_at(launch_b, launch_blocks, launch_k, THREADS); \
                body;                                                               \
            }                                                                       \
    } while (0)

/* one phase of block `block`: `body` once per thread */
#define PHASE(block, blocks, body)                                                  \
    for (int launch_k = 0; launch_k < THREADS; launch_k++) {                        \
        struct dm_thread t = dm_thread_at(block, blocks, launch_k, THREADS);        \
        body;                                                                       \
    }

typedef void (*tree_step_fn)(float *shared, int thread, int stride);

/* a block's tree reduction, one level at a time (a barrier between levels) */
static void tree(float *shared, tree_step_fn step)
{
    for (int stride = THREADS / 2; stride > 0; stride /= 2)
        for (int k = 0; k < stride; k++) step(shared, k, stride);
}

/* The plugin's scratch: floats that only grow, one buffer per slot. */
enum {
    SCRATCH_ATTENTION, SCRATCH_HASH_TILES, SCRATCH_HASH_DELTA, SCRATCH_MOD, SCRATCH_REDUCE,
    SCRATCH_GEMM_A, SCRATCH_GEMM_B, SCRATCH_SLOTS
};

static float *scratch(int slot, size_t floats)
{
    static float *buf[SCRATCH_SLOTS];
    static size_t have[SCRATCH_SLOTS];
    if (floats > have[slot]) {
        emulate_free(buf[slot]);
        buf[slot] = emulate_alloc(floats * sizeof(float));
        have[slot] = floats;
    }
    return buf[slot];
}

/* The n floats at x (an operand's span, gemm.cuh) rounded as `precision`'s
 * operands into scratch `slot`: what the GPU's tensor cores would take
 * (bf16 the bits matmul.cu's conversion kernel writes; TF32 an
 * approximation, cuBLAS does not say how it rounds). */
static const float *rounded_copy(int slot, const float *x, long n, int precision)
{
    float *out = scratch(slot, (size_t)n);
    LAUNCH(grid_for(n), precision_round_thread(t, out, x, n, precision));
    return out;
}

/* What matmul.cu's dm_cuda_gemm hands cuBLAS, done by CBLAS column-major,
 * on rounded copies of both operands when train.precision is not fp32
 * (their products are exact in fp32, so CBLAS's fp32 arithmetic stands
 * for the tensor cores' fp32 accumulation, up to the order of the sum). */
static void gemm(struct dm_gemm row_major)
{
    struct dm_gemm g = dm_gemm_to_column_major(row_major);
    if (g.m == 0 || g.n == 0) return;
    int precision = host ? host->precision : DM_PRECISION_FP32;
    if (precision != DM_PRECISION_FP32) {
        g.a = rounded_copy(SCRATCH_GEMM_A, g.a, dm_gemm_span_a(g), precision);
        g.b = rounded_copy(SCRATCH_GEMM_B, g.b, dm_gemm_span_b(g), precision);
    }
    for (int i = 0; i < g.batch; i++)
        cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                    g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, g.alpha,
                    g.a + i * g.stride_a, g.lda, g.b + i * g.stride_b, g.ldb, g.beta,
                    g.c + i * g.stride_c, g.ldc);
}

/* ---- element-wise, embedding, optimizer (elementwise.cu, encoder.cu, adamw.cu) ---- */

static void emulate_gelu_forward(float *out, const float *inp, long N)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("gelu_forward", out, inp);
    LAUNCH(grid_for(N), gelu_forward_thread(t, out, inp, N));
}

static void emulate_gelu_backward(float *dinp, const float *inp, const float *dout, long N)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("gelu_backward", dinp, inp, dout);
    LAUNCH(grid_for(N), gelu_backward_thread(t, dinp, inp, dout, N));
}

static void emulate_residual_forward(float *out, const float *a, const float *b, long N)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("residual_forward", out, a, b);
    LAUNCH(grid_for(N), residual_forward_thread(t, out, a, b, N));
}

static void emulate_rows_gather(float *dst, const float *src, const int *rows, int n, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("rows_gather", dst, src, rows);
    LAUNCH(grid_for((long)n * C), rows_gather_thread(t, dst, src, rows, n, C));
}

static void emulate_rows_scatter(float *dst, const float *src, const int *rows, int n, int C,
                                 int add)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("rows_scatter", dst, src, rows);
    LAUNCH(grid_for((long)n * C), rows_scatter_thread(t, dst, src, rows, n, C, add));
}

static void emulate_encoder_forward(float *out, const int *tokens, const float *wte,
                                    const float *wpe, int B, int T, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("encoder_forward", out, tokens, wte, wpe);
    LAUNCH(grid_for((long)B * T * C), encoder_forward_thread(t, out, tokens, wte, wpe, B, T, C));
}

static void emulate_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                     const int *tokens, int B, int T, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("encoder_backward", dwte, dwpe, dout, tokens);
    LAUNCH(grid_for(C), encoder_backward_thread(t, dwte, dwpe, dout, tokens, B, T, C));
}

static void emulate_adamw_update(float *params, const float *grads, float *m, float *v, long n,
                                 float lr, float beta1, float beta2, float eps,
                                 float weight_decay, float grad_scale, int step)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("adamw_update", params, grads, m, v);
    struct dm_adamw_constants k = dm_adamw_constants_make(lr, beta1, beta2, eps, weight_decay,
                                                          grad_scale, step);
    LAUNCH(grid_for(n), adamw_update_thread(t, params, grads, m, v, n, k));
}

/* ---- matrix products (matmul.cu) ------------------------------------------- */

static void matmul_forward_any(float *out, float *gelu_out, const float *inp,
                               const float *weight, const float *bias, const float *residual,
                               int N, int C, int OC)
{
    long n = (long)N * OC;
    if (bias || residual) LAUNCH(grid_for(n), matmul_init_thread(t, out, bias, residual, N, OC));
    gemm(dm_gemm_matmul_forward(out, inp, weight, N, C, OC, bias || residual ? 1.0f : 0.0f));
    if (gelu_out) LAUNCH(grid_for(n), gelu_forward_thread(t, gelu_out, out, n));
}

static void matmul_backward_any(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *gelu_inp,
                                float beta, int N, int C, int OC)
{
    if (dinp) {
        gemm(dm_gemm_matmul_dinp(dinp, dout, weight, N, C, OC, beta));
        long n = (long)N * C;
        if (gelu_inp) LAUNCH(grid_for(n), gelu_backward_thread(t, dinp, gelu_inp, dinp, n));
    }
    if (dweight) gemm(dm_gemm_matmul_dweight(dweight, dout, inp, N, C, OC));
    if (dbias) LAUNCH(grid_for(OC), matmul_dbias_thread(t, dbias, dout, N, OC));
}

static void emulate_matmul_forward(float *out, const float *inp, const float *weight,
                                   const float *bias, int N, int C, int OC)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("matmul_forward", out, inp, weight, bias);
    matmul_forward_any(out, NULL, inp, weight, bias, NULL, N, C, OC);
}

static void emulate_matmul_forward_residual(float *out, const float *inp, const float *weight,
                                            const float *bias, const float *residual, int N,
                                            int C, int OC)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("matmul_forward_residual", out, inp, weight, bias, residual);
    matmul_forward_any(out, NULL, inp, weight, bias, residual, N, C, OC);
}

static void emulate_matmul_forward_gelu(float *out, float *gelu_out, const float *inp,
                                        const float *weight, const float *bias, int N, int C,
                                        int OC)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("matmul_forward_gelu", out, gelu_out, inp, weight, bias);
    matmul_forward_any(out, gelu_out, inp, weight, bias, NULL, N, C, OC);
}

static void emulate_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, int N, int C, int OC)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("matmul_backward", dinp, dweight, dbias, dout, inp, weight);
    matmul_backward_any(dinp, dweight, dbias, dout, inp, weight, NULL, 1.0f, N, C, OC);
}

static void emulate_matmul_backward_overwrite(float *dinp, float *dweight, float *dbias,
                                              const float *dout, const float *inp,
                                              const float *weight, int N, int C, int OC)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("matmul_backward_overwrite", dinp, dweight, dbias, dout, inp, weight);
    matmul_backward_any(dinp, dweight, dbias, dout, inp, weight, NULL, 0.0f, N, C, OC);
}

static void emulate_matmul_backward_gelu(float *dinp, float *dweight, float *dbias,
                                         const float *dout, const float *inp,
                                         const float *weight, const float *gelu_inp, int N,
                                         int C, int OC)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("matmul_backward_gelu", dinp, dweight, dbias, dout, inp, weight, gelu_inp);
    matmul_backward_any(dinp, dweight, dbias, dout, inp, weight, gelu_inp, 0.0f, N, C, OC);
}

/* ---- layernorm and the loss (layernorm.cu, softmax.cu): a block per row ------ */

static void emulate_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                      const float *weight, const float *bias, int N, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("layernorm_forward", out, mean, rstd, inp, weight, bias);
    float sum[THREADS], var[THREADS];
    for (long row = 0; row < N; row++) {
        PHASE(row, N, layernorm_forward_sum_phase(t, sum, inp, C));
        tree(sum, dm_tree_sum_step);
        PHASE(row, N, layernorm_forward_var_phase(t, var, sum, inp, C));
        tree(var, dm_tree_sum_step);
        PHASE(row, N, layernorm_forward_out_phase(t, out, mean, rstd, sum, var, inp, weight,
                                                  bias, C));
    }
}

static void emulate_layernorm_backward_residual(float *dinp, const float *dresidual,
                                                float *dweight, float *dbias, const float *dout,
                                                const float *inp, const float *weight,
                                                const float *mean, const float *rstd, int N,
                                                int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("layernorm_backward_residual", dinp, dresidual, dweight, dbias, dout, inp,
                weight, mean, rstd);
    float sum_d[THREADS], sum_dn[THREADS];
    for (long row = 0; dinp && row < N; row++) {
        PHASE(row, N, layernorm_backward_sums_phase(t, sum_d, sum_dn, dout, inp, weight, mean,
                                                    rstd, C));
        tree(sum_d, dm_tree_sum_step);
        tree(sum_dn, dm_tree_sum_step);
        PHASE(row, N, layernorm_backward_dinp_phase(t, dinp, dresidual, sum_d, sum_dn, dout, inp,
                                                    weight, mean, rstd, C));
    }
    if (N > 0 && (dweight || dbias))
        LAUNCH(grid_for(C), layernorm_backward_params_thread(t, dweight, dbias, dout, inp, mean,
                                                             rstd, N, C));
}

static void emulate_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                       const float *dout, const float *inp, const float *weight,
                                       const float *mean, const float *rstd, int N, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("layernorm_backward", dinp, dweight, dbias, dout, inp, weight, mean, rstd);
    emulate_layernorm_backward_residual(dinp, NULL, dweight, dbias, dout, inp, weight, mean,
                                        rstd, N, C);
}

static void emulate_crossentropy_forward(float *losses, float *probs, const float *logits,
                                         const int *targets, int N, int V)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("crossentropy_forward", losses, probs, logits, targets);
    float most[THREADS], sum[THREADS];
    for (long n = 0; n < N; n++) {
        const float *row = logits + n * V;
        float *p = probs + n * V;
        PHASE(n, N, softmax_max_phase(t, most, row, V));
        tree(most, dm_tree_max_step);
        PHASE(n, N, softmax_exp_phase(t, sum, most, p, row, V));
        tree(sum, dm_tree_sum_step);
        PHASE(n, N, softmax_normalize_phase(t, p, sum, V, V));
        PHASE(n, N, crossentropy_loss_phase(t, losses, most, sum, logits, targets, V));
    }
}

static void emulate_crossentropy_softmax_backward(float *dlogits, const float *probs,
                                                  const int *targets, float dloss_scale, int N,
                                                  int V)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("crossentropy_softmax_backward", dlogits, probs, targets);
    LAUNCH(grid_for((long)N * V), crossentropy_backward_thread(t, dlogits, probs, targets,
                                                               dloss_scale, N, V));
}

/* ---- early exit's confidence (exit.cu): a thread per token ------------------- */

static void emulate_exit_softmax_confidence(float *conf, const float *probs, int n, int V)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("exit_softmax_confidence", conf, probs);
    LAUNCH(grid_for(n), exit_softmax_confidence_thread(t, conf, probs, n, V));
}

static void emulate_exit_saturation_confidence(float *conf, const float *in, const float *out,
                                               const int *rows, int n, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("exit_saturation_confidence", conf, in, out, rows);
    LAUNCH(grid_for(n), exit_saturation_confidence_thread(t, conf, in, out, rows, n, C));
}

/* ---- mixture of experts (moe.cu): a thread per element or pair ------------- */

static void emulate_moe_combine_forward(float *out, const float *res1, const float *y,
                                        const float *gate, const int *row, int N, int k, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("routed_combine_forward", out, res1, y, gate, row);
    LAUNCH(grid_for((long)N * C),
           moe_combine_forward_thread(t, out, res1, y, gate, row, N, k, C));
}

static void emulate_moe_combine_backward(float *dy, float *dgate, const float *dout,
                                         const float *y, const float *gate, const int *row,
                                         int N, int k, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("routed_combine_backward", dy, dgate, dout, y, gate, row);
    LAUNCH(grid_for((long)N * k * C), moe_combine_dy_thread(t, dy, dout, gate, row, N, k, C));
    LAUNCH(grid_for((long)N * k), moe_combine_dgate_thread(t, dgate, dout, y, row, N, k, C));
}

static void emulate_moe_dispatch_backward(float *d_ln2, const float *dx, const int *row, int N,
                                          int k, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("routed_dispatch_backward", d_ln2, dx, row);
    LAUNCH(grid_for((long)N * C), moe_dispatch_backward_thread(t, d_ln2, dx, row, N, k, C));
}

/* MoE's routing: a thread per token (per output for the sums) */
static void emulate_moe_route_forward(float *scores, float *lse, int *choice, float *choice_score,
                                      float *gate, const float *logits, const float *bias, int N,
                                      int E, int k, int sigmoid)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("route_topk_forward", scores, lse, choice, choice_score, gate, logits, bias);
    LAUNCH(grid_for(N), moe_route_forward_thread(t, scores, lse, choice, choice_score, gate,
                                                 logits, bias, N, E, k, sigmoid));
}

static void emulate_moe_route_sums(double *sums, const float *scores, const float *lse, int N,
                                   int E, int sigmoid)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("route_topk_sums", sums, scores, lse);
    LAUNCH(grid_for((long)E + 1), moe_route_sums_thread(t, sums, scores, lse, N, E, sigmoid));
}

static void emulate_moe_route_backward(float *dlogits, const float *dgate, const float *logits,
                                       const float *scores, const float *lse, const int *choice,
                                       const float *gate, const int *selected, int N, int E,
                                       int k, int sigmoid, double alpha, double beta)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("route_topk_backward", dlogits, dgate, logits, scores, lse, choice, gate,
                selected);
    LAUNCH(grid_for(N), moe_route_backward_thread(t, dlogits, dgate, logits, scores, lse, choice,
                                                  gate, selected, N, E, k, sigmoid, alpha,
                                                  beta));
}

/* Pruning: a thread per chunk then per bucket (the histogram), per
 * weight (the mask) */
static void emulate_prune_histogram(long *counts, long *partial, const float *weights, long n,
                                    unsigned int base, unsigned long long prefix, int shift)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("prune_histogram", counts, partial, weights);
    if (n == 0) return;
    LAUNCH(grid_for(dm_prune_chunks(n)),
           prune_histogram_chunk_thread(t, partial, weights, n, base, prefix, shift));
    LAUNCH(grid_for(DM_PRUNE_BUCKETS), prune_histogram_sum_thread(t, counts, partial, n));
}

static void emulate_prune_mask(unsigned char *mask, float *params, float *grads, float *m,
                               float *v, long n, unsigned int base, unsigned long long cut)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("prune_mask", mask, params, grads, m, v);
    LAUNCH(grid_for(n), prune_mask_thread(t, mask, params, grads, m, v, n, base, cut));
}

/* ---- attention (attention.cu) ---------------------------------------------- */

/* the heads (B NH T hs each) and two full-length rows (B T C) in scratch */
struct heads {
    float *q, *k, *v, *y, *dy, *dq, *dk, *dv, *qfull, *full;
};

static struct heads heads_scratch(int B, int T, int C)
{
    long per = (long)B * T * C;
    float *base = scratch(SCRATCH_ATTENTION, (size_t)10 * per);
    struct heads h = {base, base + per, base + 2 * per, base + 3 * per, base + 4 * per,
                      base + 5 * per, base + 6 * per, base + 7 * per, base + 8 * per,
                      base + 9 * per};
    return h;
}

static void heads_forward(const struct heads *h, float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, items = B * NH;
    long rows = (long)items * T;
    float scale = (float)(1.0 / sqrt((double)hs)), most[THREADS], sum[THREADS];
    gemm(dm_gemm_attention_scores(att, h->q, h->k, items, T, hs, scale));
    for (long r = 0; r < rows; r++) {
        float *row = att + r * T;
        int valid = (int)(r % T) + 1;
        PHASE(r, rows, softmax_max_phase(t, most, row, valid));
        tree(most, dm_tree_max_step);
        PHASE(r, rows, softmax_exp_phase(t, sum, most, row, row, valid));
        tree(sum, dm_tree_sum_step);
        PHASE(r, rows, softmax_normalize_phase(t, row, sum, valid, T));
    }
    gemm(dm_gemm_attention_values(h->y, att, h->v, items, T, hs));
}

static void heads_backward(const struct heads *h, float *scores, const float *att, int B, int T,
                           int C, int NH)
{
    int hs = C / NH, items = B * NH;
    long rows = (long)items * T;
    float scale = (float)(1.0 / sqrt((double)hs)), dot[THREADS];
    gemm(dm_gemm_attention_dprobs(scores, h->dy, h->v, items, T, hs));
    for (long r = 0; r < rows; r++) {
        PHASE(r, rows, attention_softmax_backward_dot_phase(t, dot, att, scores, T));
        tree(dot, dm_tree_sum_step);
        PHASE(r, rows, attention_softmax_backward_phase(t, scores, dot, att, scale, T));
    }
    gemm(dm_gemm_attention_dq(h->dq, scores, h->k, items, T, hs));
    gemm(dm_gemm_attention_dk(h->dk, scores, h->q, items, T, hs));
    gemm(dm_gemm_attention_dv(h->dv, att, h->dy, items, T, hs));
}

static void permute(const struct heads *h, const float *qsrc, int ldq, const float *ksrc,
                    const float *vsrc, int ldkv, int B, int T, int C, int NH)
{
    LAUNCH(grid_for((long)B * T * C), attention_permute_thread(t, h->q, h->k, h->v, qsrc, ldq,
                                                               ksrc, vsrc, ldkv, B, T, C, NH));
}

/* dst (B T, C) = src (n, C) at rows, every other row zero */
static void scatter_full(float *dst, const float *src, const int *rows, int n, int B, int T,
                         int C)
{
    memset(dst, 0, (size_t)B * T * C * sizeof(float));
    if (n > 0) emulate_rows_scatter(dst, src, rows, n, C, 0);
}

static void emulate_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                      int C, int NH)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("attention_forward", out, att, qkv);
    struct heads h = heads_scratch(B, T, C);
    permute(&h, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, B, T, C, NH);
    heads_forward(&h, att, B, T, C, NH);
    LAUNCH(grid_for((long)B * T * C), attention_unpermute_thread(t, out, h.y, B, T, C, NH));
}

static void emulate_attention_backward(float *dqkv, float *scores, const float *dout,
                                       const float *qkv, const float *att, int B, int T, int C,
                                       int NH)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("attention_backward", dqkv, scores, dout, qkv, att);
    struct heads h = heads_scratch(B, T, C);
    long n = (long)B * T * C;
    permute(&h, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, B, T, C, NH);
    LAUNCH(grid_for(n), attention_split_heads_thread(t, h.dy, dout, B, T, C, NH));
    heads_backward(&h, scores, att, B, T, C, NH);
    LAUNCH(grid_for(n), attention_gradient_thread(t, dqkv, 3 * C, dqkv + C, dqkv + 2 * C, 3 * C,
                                                  h.dq, h.dk, h.dv, B, T, C, NH));
}

static void emulate_attention_forward_rows(float *out, float *att, const float *q,
                                           const float *kv, const int *rows, int nactive, int B,
                                           int T, int C, int NH)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("attention_forward_rows", out, att, q, kv, rows);
    struct heads h = heads_scratch(B, T, C);
    scatter_full(h.qfull, q, rows, nactive, B, T, C);
    permute(&h, h.qfull, C, kv, kv + C, 2 * C, B, T, C, NH);
    heads_forward(&h, att, B, T, C, NH);
    LAUNCH(grid_for((long)B * T * C), attention_unpermute_thread(t, h.full, h.y, B, T, C, NH));
    if (nactive > 0) emulate_rows_gather(out, h.full, rows, nactive, C);
}

static void emulate_attention_backward_rows(float *dq, float *dkv, float *scores,
                                            const float *dout, const float *q, const float *kv,
                                            const float *att, const int *rows, int nactive,
                                            int B, int T, int C, int NH)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("attention_backward_rows", dq, dkv, scores, dout, q, kv, att, rows);
    struct heads h = heads_scratch(B, T, C);
    long n = (long)B * T * C;
    scatter_full(h.qfull, q, rows, nactive, B, T, C);
    permute(&h, h.qfull, C, kv, kv + C, 2 * C, B, T, C, NH);
    scatter_full(h.full, dout, rows, nactive, B, T, C);
    LAUNCH(grid_for(n), attention_split_heads_thread(t, h.dy, h.full, B, T, C, NH));
    heads_backward(&h, scores, att, B, T, C, NH);
    LAUNCH(grid_for(n), attention_gradient_thread(t, h.qfull, C, dkv, dkv + C, 2 * C, h.dq, h.dk,
                                                  h.dv, B, T, C, NH));
    if (nactive > 0) emulate_rows_gather(dq, h.qfull, rows, nactive, C);
}

/* ---- hash-sparse attention (hash.cu) --------------------------------------- */

/* hash.cu's count_tiles: the tiles, and with alone the queries with
 * their own key alone, summed on the host in row order */
static long count_tiles(long *alone, const int *order, const int *bucket, int B, int NH, int T)
{
    long rows = (T + DM_HASH_TILE - 1) / DM_HASH_TILE, n = (long)B * NH * rows, total = 0;
    long *tiles = (long *)scratch(SCRATCH_HASH_TILES,
                                  2 * (size_t)n * sizeof(long) / sizeof(float));
    LAUNCH(grid_for(n), hash_tiles_thread(t, tiles, alone ? tiles + n : NULL, order, bucket, B,
                                          NH, T));
    for (long i = 0; i < n; i++) total += tiles[i];
    if (alone) {
        *alone = 0;
        for (long i = n; i < 2 * n; i++) *alone += tiles[i];
    }
    return total;
}

static long emulate_hash_attention_forward(float *out, float *lse, int *order, int *bucket,
                                           long *alone, const float *qkv, const float *rotation, int B, int T,
                                           int C, int NH, int buckets)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("group_attention_forward", out, lse, order, bucket, qkv, rotation);
    long sides = (long)B * NH * 2 * T, queries = (long)B * NH * T;
    LAUNCH(grid_for(sides), hash_bucket_thread(t, bucket, qkv, buckets > 1 ? rotation : NULL, B,
                                               T, C, NH, buckets));
    LAUNCH(grid_for(sides), hash_order_thread(t, order, bucket, B, NH, T));
    LAUNCH(grid_for(queries), hash_forward_thread(t, out, lse, order, bucket, qkv, B, T, C, NH));
    return count_tiles(alone, order, bucket, B, NH, T);
}

static long emulate_hash_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                            const float *out, const float *lse, const int *order,
                                            const int *bucket, int B, int T, int C, int NH)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("group_attention_backward", dqkv, dout, qkv, out, lse, order, bucket);
    long queries = (long)B * NH * T;
    float *delta = scratch(SCRATCH_HASH_DELTA, (size_t)queries);
    LAUNCH(grid_for(queries), hash_delta_thread(t, delta, dout, out, B, T, C, NH));
    LAUNCH(grid_for(queries), hash_dq_thread(t, dqkv, dout, qkv, lse, delta, order, bucket, B, T,
                                             C, NH));
    LAUNCH(grid_for(queries), hash_dkv_thread(t, dqkv, dout, qkv, lse, delta, order, bucket, B,
                                              T, C, NH));
    return count_tiles(NULL, order, bucket, B, NH, T);
}

/* ---- pruned matrices (sparse.cu) and mixture of depths (mod.cu) ------------- */

static void emulate_sparse_forward(float *out, const float *inp, const int *row_ptr,
                                   const int *col_idx, const float *values, const float *bias,
                                   int N, int C, int OC)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("sparse_forward", out, inp, row_ptr, col_idx, values, bias);
    LAUNCH(grid_for((long)N * OC), sparse_forward_thread(t, out, inp, row_ptr, col_idx, values,
                                                         bias, N, C, OC));
}

static void emulate_sparse_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const int *row_ptr, const int *col_idx,
                                    const float *values, int nnz, int N, int C, int OC)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("sparse_backward", dinp, dweight, dbias, dout, inp, row_ptr, col_idx, values);
    if (dinp)
        LAUNCH(grid_for(N), sparse_dinp_thread(t, dinp, dout, row_ptr, col_idx, values, N, C,
                                               OC));
    if (dweight && nnz > 0)
        LAUNCH(grid_for(nnz), sparse_dweight_thread(t, dweight, dout, inp, row_ptr, col_idx, nnz,
                                                    N, C, OC));
    if (dbias) LAUNCH(grid_for(OC), sparse_dbias_thread(t, dbias, dout, N, OC));
}

static void emulate_mod_router_forward(float *router, const float *in, const float *weight,
                                       int N, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("mod_router_forward", router, in, weight);
    LAUNCH(grid_for(N), mod_router_thread(t, router, in, weight, N, C));
}

static void emulate_mod_select_topk(int *chosen, const float *router, int B, int T, int k)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("mod_select_topk", chosen, router);
    LAUNCH(grid_for((long)B * T), mod_select_topk_thread(t, chosen, router, B, T, k));
}

/* the loss summed on the host in token order, in double (mod.cu's mean_loss) */
static float emulate_mod_predictor(float *dweight, float scale, int *chosen, const float *in,
                                   const float *weight, const int *target, int N, int C, int H)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("mod_predictor", dweight, chosen, in, weight, target);
    float *loss = scratch(SCRATCH_MOD, (2 + (size_t)H) * N + 2), *grad = loss + N + 1;
    float *hidden = grad + N + 1;
    LAUNCH(grid_for(N), mod_predictor_thread(t, loss, grad, hidden, chosen, in, weight, target,
                                             N, C, H));
    if (!target) return 0.0f;
    if (dweight)
        LAUNCH(grid_for(mod_predictor_params(C, H)),
               mod_predictor_dweight_thread(t, dweight, scale, grad, hidden, in, weight, N, C, H));
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += loss[n];
    return (float)(sum / N);
}

static void emulate_mod_combine_forward(float *out, const float *gathered_in,
                                        const float *gathered_out, const float *router,
                                        const int *rows, int n, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("mod_combine_forward", out, gathered_in, gathered_out, router, rows);
    if (n == 0) return;
    LAUNCH(grid_for((long)n * C), mod_combine_forward_thread(t, out, gathered_in, gathered_out,
                                                             router, rows, n, C));
}

static void emulate_mod_scale_chosen(float *work, const float *din, const float *router,
                                     const int *rows, int n, int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("mod_scale_chosen", work, din, router, rows);
    if (n == 0) return;
    LAUNCH(grid_for((long)n * C), mod_scale_chosen_thread(t, work, din, router, rows, n, C));
}

/* mod.cu's three kernels: dr per token in the scratch, din, the weight gradient */
static void emulate_mod_combine_backward(float *din, float *drouter_weight,
                                         const float *gathered_in, const float *gathered_out,
                                         const float *work, const float *router,
                                         const float *router_weight, const int *rows, int n,
                                         int C)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("mod_combine_backward", din, drouter_weight, gathered_in, gathered_out, work,
                router, router_weight, rows);
    if (n == 0) return;
    float *dr = scratch(SCRATCH_MOD, (size_t)n);
    LAUNCH(grid_for(n), mod_combine_dr_thread(t, dr, din, gathered_in, gathered_out, rows, n, C));
    LAUNCH(grid_for((long)n * C), mod_combine_din_thread(t, din, dr, work, router, router_weight,
                                                         rows, n, C));
    if (drouter_weight)
        LAUNCH(grid_for(C), mod_dweight_thread(t, drouter_weight, dr, gathered_in, n, C));
}

/* ---- the device reductions (reduce.cu) ---------------------------------------- */

/* ---- the transport: shared memory between the processes of a node ----------------- */

/* What NCCL is to the CUDA plugin, for a group of processes on one node:
 * the group's rank 0 creates a shared-memory segment and hands its pid and
 * number to the others through the caller's broadcast; the segment holds
 * a barrier, one slot of EMU_COMM_PIECE floats per rank for the
 * all-reduce and one channel per ordered pair of ranks for the
 * point-to-point transfers. An all-reduce goes piece by piece: each rank
 * copies its piece into its slot, the group meets, each rank sums the
 * slots in group-rank order into its own buffer, the group meets again
 * (the slots are free). A transfer goes through its channel's one piece
 * of EMU_CHANNEL_PIECE floats: the sender puts a piece when the last was
 * taken, the receiver takes it. A send is complete only when its peer
 * has taken its last piece (a rendezvous, as NCCL's send is for large
 * messages), so an order of calls that could deadlock on NCCL deadlocks
 * here too. An exchange's transfers progress together, each pair's in
 * order. Every wait polls, between the host's wait rounds (its MPI
 * progress, then sched_yield), as dynmo's own waits do. */
#define EMU_COMM_PIECE (1L << 18)
#define EMU_CHANNEL_PIECE (1L << 14)
#define EMU_COMM_RANKS 256

/* The channel from rank a to rank b: the pieces a has put and b has taken. */
struct emu_channel {
    _Atomic long put, taken;
};

struct emu_comm_segment {
    _Atomic int arrived, generation;
    float slots[];   /* size all-reduce slots, then size x size channel pieces */
};

struct dm_backend_comm {
    struct emu_comm_segment *seg;
    struct emu_channel *channels;   /* size x size, [from size + to] */
    size_t bytes;
    int rank, size;
};

static float *emu_channel_piece(struct dm_backend_comm *c, int from, int to)
{
    size_t at = (size_t)c->size * EMU_COMM_PIECE + ((size_t)from * c->size + to) * EMU_CHANNEL_PIECE;
    return c->seg->slots + at;
}

/* One round of a transfer's wait: the host's (its MPI progress), else
 * sched_yield. */
static void emu_wait_round(int first)
{
    if (host->wait_round) host->wait_round(first);
    else sched_yield();
}

static void emu_comm_barrier(struct dm_backend_comm *c)
{
    int generation = atomic_load(&c->seg->generation);
    if (atomic_fetch_add(&c->seg->arrived, 1) == c->size - 1) {
        atomic_store(&c->seg->arrived, 0);
        atomic_fetch_add(&c->seg->generation, 1);
        return;
    }
    for (int first = 1; atomic_load(&c->seg->generation) == generation; first = 0)
        emu_wait_round(first);
}

static struct dm_backend_comm *emulate_comm_init(int rank, int size,
                                                 void (*bcast_ints)(void *ctx, int *buf, int n),
                                                 void *ctx)
{
    static int made;
    if (size > EMU_COMM_RANKS)
        host->fatal(__FILE__, __LINE__, "comm_init", "more ranks than the emulated transport has");
    struct dm_backend_comm *c = calloc(1, sizeof *c);
    if (!c) host->fatal(__FILE__, __LINE__, "calloc", "out of memory");
    c->rank = rank;
    c->size = size;
    size_t floats = (size_t)size * EMU_COMM_PIECE + (size_t)size * size * EMU_CHANNEL_PIECE;
    size_t channels = (size_t)size * size * sizeof(struct emu_channel);
    c->bytes = sizeof(struct emu_comm_segment) + floats * sizeof(float) + channels;
    int which[2] = {(int)getpid(), made++};
    bcast_ints(ctx, which, 2);
    char name[64];
    snprintf(name, sizeof name, "/dynmo-emulate-comm-%d-%d", which[0], which[1]);
    int fd = rank == 0 ? shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600) : -1;
    if (rank == 0 && (fd < 0 || ftruncate(fd, (off_t)c->bytes) != 0))
        host->fatal(__FILE__, __LINE__, "shm_open", "cannot make the transport's segment");
    int ok = rank == 0 ? 1 : 0;
    bcast_ints(ctx, &ok, 1);   /* the segment exists before the others open it */
    if (rank != 0) fd = shm_open(name, O_RDWR, 0600);
    void *at = fd >= 0 ? mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                       : MAP_FAILED;
    if (at == MAP_FAILED)
        host->fatal(__FILE__, __LINE__, "shm_open",
                    "the emulated transport needs every rank of a group on one node");
    close(fd);
    c->seg = at;
    c->channels = (struct emu_channel *)(c->seg->slots + floats);
    emu_comm_barrier(c);
    if (rank == 0) shm_unlink(name);
    return c;
}

static void emulate_comm_all_reduce_sum(struct dm_backend_comm *c, float *buf, size_t count)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("comm_all_reduce_sum", buf);
    for (size_t at = 0; at < count; at += EMU_COMM_PIECE) {
        size_t len = count - at < EMU_COMM_PIECE ? count - at : EMU_COMM_PIECE;
        memcpy(c->seg->slots + (size_t)c->rank * EMU_COMM_PIECE, buf + at, len * sizeof(float));
        emu_comm_barrier(c);
        for (size_t i = 0; i < len; i++) {
            float sum = c->seg->slots[i];
            for (int r = 1; r < c->size; r++) sum += c->seg->slots[(size_t)r * EMU_COMM_PIECE + i];
            buf[at + i] = sum;
        }
        emu_comm_barrier(c);
    }
}

/* One transfer's progress: pieces moved so far of its total. */
struct emu_transfer {
    const struct dm_comm_op *op;
    long done, pieces;
};

/* Moves the next piece of t if its channel lets it; returns 1 if it did. */
static int emu_transfer_step(struct dm_backend_comm *c, struct emu_transfer *t)
{
    const struct dm_comm_op *op = t->op;
    int from = op->recv ? op->peer : c->rank, to = op->recv ? c->rank : op->peer;
    struct emu_channel *ch = &c->channels[(size_t)from * c->size + to];
    float *piece = emu_channel_piece(c, from, to);
    size_t at = (size_t)t->done * EMU_CHANNEL_PIECE;
    size_t len = op->count - at < EMU_CHANNEL_PIECE ? op->count - at : EMU_CHANNEL_PIECE;
    long put = atomic_load(&ch->put), taken = atomic_load(&ch->taken);
    if (op->recv) {
        if (put == taken) return 0;
        memcpy(op->buf + at, piece, len * sizeof(float));
        atomic_fetch_add(&ch->taken, 1);
    } else {
        if (put != taken) return 0;
        memcpy(piece, op->buf + at, len * sizeof(float));
        atomic_fetch_add(&ch->put, 1);
    }
    t->done++;
    return 1;
}

/* A send whose pieces are all put is complete once the last is taken. */
static int emu_transfer_complete(struct dm_backend_comm *c, const struct emu_transfer *t)
{
    if (t->done < t->pieces) return 0;
    if (t->op->recv) return 1;
    struct emu_channel *ch = &c->channels[(size_t)c->rank * c->size + t->op->peer];
    return atomic_load(&ch->taken) == atomic_load(&ch->put);
}

static void emulate_comm_exchange(struct dm_backend_comm *c, const struct dm_comm_op *ops, int n)
{
    DEVICE_SCOPE;
    struct emu_transfer *t = calloc((size_t)(n > 0 ? n : 1), sizeof *t);
    if (!t) host->fatal(__FILE__, __LINE__, "calloc", "out of memory");
    for (int i = 0; i < n; i++) {
        DEVICE_ARGS("comm_exchange", ops[i].buf);
        if (ops[i].peer < 0 || ops[i].peer >= c->size || ops[i].peer == c->rank)
            host->fatal(__FILE__, __LINE__, "comm_exchange", "a transfer's peer is not another rank");
        t[i].op = &ops[i];
        t[i].pieces = (long)((ops[i].count + EMU_CHANNEL_PIECE - 1) / EMU_CHANNEL_PIECE);
    }
    for (int open = n, waited = 0; open > 0;) {
        int moved = 0;
        open = 0;
        for (int i = 0; i < n; i++) {
            if (emu_transfer_complete(c, &t[i])) continue;
            open++;
            /* a pair's transfers of one direction go in order: only the
             * first incomplete one of each moves */
            int first = 1;
            for (int j = 0; j < i && first; j++)
                first = ops[j].peer != ops[i].peer || ops[j].recv != ops[i].recv ||
                        emu_transfer_complete(c, &t[j]);
            if (first && t[i].done < t[i].pieces) moved |= emu_transfer_step(c, &t[i]);
        }
        if (open && !moved) emu_wait_round(!waited++);
    }
    free(t);
}

static void emulate_comm_free(struct dm_backend_comm *c)
{
    if (!c) return;
    munmap(c->seg, c->bytes);
    free(c);
}

static double emulate_sum_squares(const float *x, long n)
{
    DEVICE_SCOPE;
    DEVICE_ARGS("sum_squares", x);
    long chunks = dm_sumsq_chunks(n);
    if (chunks == 0) return 0.0;
    double *partial = (double *)scratch(SCRATCH_REDUCE, 2 * (size_t)(chunks + 1));
    LAUNCH(grid_for(chunks), sumsq_chunk_thread(t, partial, x, n));
    LAUNCH(1, sumsq_total_thread(t, partial + chunks, partial, chunks));
    return partial[chunks];   /* the plugin's one double copied down */
}

/* ---- the table --------------------------------------------------------------- */

static const struct dm_backend emulate_table = {
    .abi = DM_BACKEND_ABI,
    .name = "emulate",
    .alloc = emulate_table_alloc,
    .free = emulate_free,
    .copy_to_device = emulate_copy_to_device,
    .copy_to_host = emulate_copy_to_host,
    .synchronize = emulate_synchronize,
    .zero = emulate_zero,
    .copy_on_device = emulate_copy_on_device,
    .alloc_host = emulate_table_alloc_host,
    .free_host = free,
    .matmul_forward = emulate_matmul_forward,
    .matmul_forward_residual = emulate_matmul_forward_residual,
    .matmul_forward_gelu = emulate_matmul_forward_gelu,
    .matmul_backward = emulate_matmul_backward,
    .matmul_backward_overwrite = emulate_matmul_backward_overwrite,
    .matmul_backward_gelu = emulate_matmul_backward_gelu,
    .layernorm_forward = emulate_layernorm_forward,
    .layernorm_backward = emulate_layernorm_backward,
    .layernorm_backward_residual = emulate_layernorm_backward_residual,
    .attention_forward = emulate_attention_forward,
    .attention_backward = emulate_attention_backward,
    .attention_forward_rows = emulate_attention_forward_rows,
    .attention_backward_rows = emulate_attention_backward_rows,
    .group_attention_forward = emulate_hash_attention_forward,
    .group_attention_backward = emulate_hash_attention_backward,
    .gelu_forward = emulate_gelu_forward,
    .gelu_backward = emulate_gelu_backward,
    .residual_forward = emulate_residual_forward,
    .encoder_forward = emulate_encoder_forward,
    .encoder_backward = emulate_encoder_backward,
    .crossentropy_forward = emulate_crossentropy_forward,
    .crossentropy_softmax_backward = emulate_crossentropy_softmax_backward,
    .exit_softmax_confidence = emulate_exit_softmax_confidence,
    .exit_saturation_confidence = emulate_exit_saturation_confidence,
    .routed_combine_forward = emulate_moe_combine_forward,
    .routed_combine_backward = emulate_moe_combine_backward,
    .routed_dispatch_backward = emulate_moe_dispatch_backward,
    .route_topk_forward = emulate_moe_route_forward,
    .route_topk_sums = emulate_moe_route_sums,
    .route_topk_backward = emulate_moe_route_backward,
    .prune_histogram = emulate_prune_histogram,
    .prune_mask = emulate_prune_mask,
    .adamw_update = emulate_adamw_update,
    .sparse_matmul_forward = emulate_sparse_forward,
    .sparse_matmul_backward = emulate_sparse_backward,
    .mod_router_forward = emulate_mod_router_forward,
    .mod_select_topk = emulate_mod_select_topk,
    .mod_predictor_forward_backward = emulate_mod_predictor,
    .mod_combine_forward = emulate_mod_combine_forward,
    .mod_scale_chosen = emulate_mod_scale_chosen,
    .mod_combine_backward = emulate_mod_combine_backward,
    .rows_gather = emulate_rows_gather,
    .rows_scatter = emulate_rows_scatter,
    .sum_squares = emulate_sum_squares,
    .comm_init = emulate_comm_init,
    .comm_exchange = emulate_comm_exchange,
    .comm_all_reduce_sum = emulate_comm_all_reduce_sum,
    .comm_free = emulate_comm_free,
};

/* The plugin entry, as the CUDA plugin's: reserves the arena and fills
 * the table; fails only when the arena cannot be reserved. */
EXPORT int dynmo_cuda_backend_open(struct dm_backend *table, const struct dm_backend_host *h,
                                   char *err, size_t errsize)
{
    host = h;
    if (pick_emulated_device(h, err, errsize) != 0) return -1;
    if (arena_open(err, errsize) != 0) return -1;
    const char *counts = getenv("DYNMO_EMULATE_ALLOC_COUNTS");
    count_allocs = counts && !strcmp(counts, "1");
    *table = emulate_table;
    table->host_access = !arena.strict;
    snprintf(table->device_id, sizeof table->device_id, "emulated-%d", emulated_device);
    snprintf(table->device, sizeof table->device, "emulated device %d of %d (the CUDA kernels "
             "on the CPU%s; testing only)", emulated_device, emulated_devices,
             arena.strict ? ", a trapping arena" : "");
    return 0;
}
