/* `dynmo calibrate --out HW.ini`: measures this machine with dynmo's own
 * ops, through the op table of the configured device (train.device), and
 * writes a hardware file that `dynmo simulate --hardware` reads
 * (docs/simulate.md, "The hardware model"): the block's products over a
 * grid of shapes, forward and backward, as the model calls them (the
 * [gemm] points and backward points), causal attention by direction over a
 * grid of lengths and head sizes (the [attention] points), hash attention
 * likewise (the hash points), the CSR product forward and backward, the
 * layernorm, GELU, residual and AdamW ops (the achieved bandwidths), a
 * tiny op (the per-op overhead), and between ranks 0 and 1 the
 * point-to-point line (a small and a large message) and the all-reduce
 * line. With --busy-peer rank 1 runs the same measurements at the same
 * time (what a core achieves while its neighbour computes, as in a run of
 * one rank a core). Every figure is the median of five timed batches of
 * repetitions, so a neighbour's burst moves it less.
 *
 * Must not: price anything (hardware.c, hardware_ops.c) or write the file
 * anywhere but --out (through a temporary name). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "dynmo/backend.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "dynmo/tools.h"
#include "dynmo/world.h"
#include "tools/args.h"
#include "tools/simulate/hardware.h"
#include "tools/train/train.h"

struct calibrate_args {
    const char *out, *config;
    char **overrides;
    int override_count, quick, threads, busy_peer;
};

static void usage(FILE *f)
{
    fprintf(f,
        "usage: mpiexec -n 2 dynmo calibrate --out HW.ini [--config F] [section.key=value ...]\n"
        "       [--threads N] [--busy-peer] [--quick]\n"
        "Measures this machine with dynmo's own ops (GEMMs of many shapes, attention,\n"
        "hash attention, CSR products, layernorm, GELU, residual, a tiny op) on rank 0\n"
        "and the point-to-point and all-reduce lines between ranks 0 and 1, and writes\n"
        "a hardware file for `dynmo simulate --hardware` (docs/simulate.md).\n"
        "  --out HW.ini   the file to write (replaced whole)\n"
        "  --config F     train.device and train.threads from F (default: the CPU)\n"
        "  --threads N    compute threads of rank 0 (default: the CPUs one rank alone\n"
        "                 would use, as `dynmo bench` on one rank)\n"
        "  --busy-peer    rank 1 runs the same measurements at the same time on its own\n"
        "                 core (ranks computing side by side: --threads 1 for a 2-rank\n"
        "                 run on 2 cores); otherwise rank 1 sleeps while rank 0 measures\n"
        "  --quick        fewer and smaller shapes, shorter timings (a smoke test)\n");
}

static void parse_args(struct calibrate_args *a, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        tool_help(o, usage);
        if (!strcmp(o, "--quick")) { a->quick = 1; continue; }
        if (!strcmp(o, "--busy-peer")) { a->busy_peer = 1; continue; }
        if (o[0] != '-' && strchr(o, '=')) {
            if (!a->overrides) a->overrides = dm_alloc((size_t)argc * sizeof(char *));
            a->overrides[a->override_count++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) dm_user_error("calibrate: %s needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "--out")) a->out = v;
        else if (!strcmp(o, "--config")) a->config = v;
        else if (!strcmp(o, "--threads")) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1024)
                dm_user_error("calibrate: --threads '%s' is not a count in [1, 1024]", v);
            a->threads = (int)n;
        } else {
            usage(stderr);
            dm_user_error("calibrate: unknown option '%s'", o);
        }
    }
    if (!a->out) {
        usage(stderr);
        dm_user_error("calibrate: --out HW.ini is required (the hardware file to write)");
    }
}

/* ---- timing ---------------------------------------------------------------- */

/* A GEMM's parameter sets: as many as make PARAMETER_BYTES together (a
 * stage's blocks' weights are beyond the core's cache by the time a
 * micro-batch comes back to one). */
#define PARAMETER_BYTES (16.0 * 1024 * 1024)

/* One measured op: what `run` does with the buffers. */
struct op {
    const struct dm_backend *be;
    int kind;                    /* enum below */
    int m, n, k;                 /* GEMM m x n x k; elementwise: m rows x n */
    int B, T, C, NH, groups;
    float *x, *y, *z, *w, *v, *s;/* device buffers, large enough */
    int *i1, *i2;
    long tiles;
    /* a GEMM's weight, bias and their gradients, `copies` sets of `set`
     * floats one after the other, used in turn (the at-th), so that each
     * call finds them out of cache as a block of a deep stage does */
    float *parameters;
    size_t set;
    int copies, at;
};

enum { OP_GEMM, OP_GEMM_BACKWARD, OP_ATTENTION_FORWARD, OP_ATTENTION_BACKWARD,
       OP_GROUPED_FORWARD, OP_GROUPED_BACKWARD, OP_SPARSE, OP_LAYERNORM, OP_GELU, OP_RESIDUAL,
       OP_COPY, OP_ADAMW };

static void run_op(struct op *o)
{
    const struct dm_backend *be = o->be;
    switch (o->kind) {
    case OP_GEMM:       /* out z (m, n) = inp x (m, k) W^T + bias (W (n, k), bias (n)) */
    case OP_GEMM_BACKWARD: {   /* from dout z: dinp w (m, k), dweight (n, k), dbias (n) */
        size_t nk = (size_t)o->n * o->k;
        float *weight = o->parameters + (size_t)o->at * o->set, *bias = weight + nk;
        float *dweight = bias + o->n, *dbias = dweight + nk;
        o->at = (o->at + 1) % o->copies;
        if (o->kind == OP_GEMM)
            be->matmul_forward(o->z, o->x, weight, bias, o->m, o->k, o->n);
        else
            be->matmul_backward_overwrite(o->w, dweight, dbias, o->z, o->x, weight, o->m, o->k,
                                          o->n);
        break;
    }
    case OP_ATTENTION_FORWARD:
        be->attention_forward(o->z, o->s, o->x, o->B, o->T, o->C, o->NH);
        break;
    case OP_ATTENTION_BACKWARD:
        be->attention_backward(o->w, o->v, o->y, o->x, o->s, o->B, o->T, o->C, o->NH);
        break;
    case OP_GROUPED_FORWARD:
        o->tiles = be->group_attention_forward(o->z, o->v, o->i1, o->i2, NULL, o->x, o->s,
                                                o->B, o->T, o->C, o->NH, o->groups);
        break;
    case OP_GROUPED_BACKWARD:   /* on the groups and order the forward left */
        be->group_attention_backward(o->w, o->y, o->x, o->z, o->v, o->i1, o->i2, o->B, o->T,
                                      o->C, o->NH);
        break;
    case OP_SPARSE:     /* (m, k) x CSR (n, k) forward and backward */
        be->sparse_matmul_forward(o->z, o->x, o->i1, o->i2, o->y, NULL, o->m, o->k, o->n);
        be->sparse_matmul_backward(o->w, o->v, NULL, o->z, o->x, o->i1, o->i2, o->y,
                                   (int)o->tiles, o->m, o->k, o->n);
        break;
    case OP_LAYERNORM:
        be->layernorm_forward(o->z, o->v, o->w, o->x, o->y, o->s, o->m, o->n);
        break;
    case OP_GELU: be->gelu_forward(o->z, o->x, (long)o->m * o->n); break;
    case OP_RESIDUAL: be->residual_forward(o->z, o->x, o->y, (long)o->m * o->n); break;
    case OP_COPY: be->copy_on_device(o->z, o->x, (size_t)o->m * o->n * sizeof(float)); break;
    case OP_ADAMW:      /* params z, gradients x, moments w and v; a learning rate that
                           keeps the weights where they are */
        be->adamw_update(o->z, o->x, o->w, o->v, (long)o->m * o->n, 1e-9f, 0.9f, 0.95f, 1e-8f,
                         0.1f, 1.0f, 1);
        break;
    }
}

/* Seconds of one op: the median over five batches of repetitions, each
 * batch at least `batch_s` long, after one untimed run. */
static double time_op(struct op *o, double batch_s)
{
    run_op(o);
    o->be->synchronize();
    double t0 = dm_now();
    run_op(o);
    o->be->synchronize();
    double one = fmax(dm_now() - t0, 1e-7);
    long reps = (long)ceil(batch_s / one);
    if (reps < 1) reps = 1;
    if (reps > 100000) reps = 100000;
    double samples[5];
    for (int b = 0; b < 5; b++) {
        t0 = dm_now();
        for (long r = 0; r < reps; r++) run_op(o);
        o->be->synchronize();
        samples[b] = (dm_now() - t0) / reps;
    }
    return dm_median(samples, 5);
}

/* A device buffer of n floats, uniform in [-1, 1) from the seed's stream. */
static float *device_floats(const struct dm_backend *be, size_t n, uint64_t stream)
{
    float *host = dm_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) host[i] = 2 * dm_uniform(7, stream, i) - 1;
    float *d = be->alloc(n * sizeof(float));
    be->copy_to_device(d, host, n * sizeof(float));
    dm_free(host);
    return d;
}

static int *device_ints(const struct dm_backend *be, const int *host, size_t n)
{
    int *d = be->alloc((n ? n : 1) * sizeof(int));
    if (n) be->copy_to_device(d, host, n * sizeof(int));
    return d;
}

/* ---- what is measured -------------------------------------------------------- */

/* The GEMM grid: the rows of a micro-batch (or of an expert's share of
 * one), m, from 16 to 4096, times a block's product shapes at a width C
 * (n x k: C x C, 4C x C and C x 4C; qkv's 3C x C lies between), C 64 at
 * every m, 256 and 1024 where m is at least C. A regular grid in log2 so
 * that interpolation between its points, not a shape of any particular
 * config, prices a model. */
static const int grid_rows[] = {16, 64, 256, 1024, 4096};
static const int grid_widths[] = {64, 256, 1024};
static const int quick_shapes[][3] = {
    {64, 64, 64}, {256, 256, 256}, {1024, 96, 32}, {96, 32, 1024},
};

/* Seconds of op o beyond the op overhead (at least half of them). */
static double beyond_overhead(const struct hardware *hw, double s)
{
    double o = hw->op_overhead_us * 1e-6;
    return s - o > s / 2 ? s - o : s / 2;
}

/* One product m x n x k forward (with its bias, as every product of the
 * block has) and backward (input, weight and bias gradients), its
 * parameters out of cache as in a deep stage (PARAMETER_BYTES); its
 * activations stay where the op before left them. */
static void measure_gemm(struct hardware *hw, const struct dm_backend *be, int m, int n, int k,
                         double batch_s)
{
    struct op o = {.be = be, .kind = OP_GEMM, .m = m, .n = n, .k = k};
    o.x = device_floats(be, (size_t)m * k, 1);
    o.z = device_floats(be, (size_t)m * n, 2);
    o.w = be->alloc((size_t)m * k * sizeof(float));
    o.set = 2 * ((size_t)n * k + n);   /* weight, bias, their gradients */
    o.copies = (int)fmax(1, ceil(PARAMETER_BYTES / (4.0 * o.set)));
    o.parameters = device_floats(be, (size_t)o.copies * o.set, 3);
    double forward = time_op(&o, batch_s);
    o.kind = OP_GEMM_BACKWARD;
    double backward = time_op(&o, batch_s);
    double flops = 2.0 * m * n * k;
    double tf = flops / beyond_overhead(hw, forward) / 1e12;
    double tb = 2 * flops / beyond_overhead(hw, backward) / 1e12;
    hw->gemm[hw->gemm_points++] = (struct hw_gemm_point){m, n, k, tf};
    hw->backward[hw->backward_points++] = (struct hw_gemm_point){m, n, k, tb};
    hw->gemm_peak_tflops = fmax(hw->gemm_peak_tflops, fmax(tf, tb));
    dm_log("calibrate: gemm %5d x %5d x %5d: forward %8.3f ms, %.4f TFLOP/s; backward %8.3f "
           "ms, %.4f TFLOP/s\n", m, n, k, forward * 1e3, tf, backward * 1e3, tb);
    float *buffers[] = {o.x, o.z, o.w, o.parameters};
    for (size_t b = 0; b < sizeof buffers / sizeof buffers[0]; b++) be->free(buffers[b]);
}

static void measure_gemms(struct hardware *hw, const struct dm_backend *be, int quick,
                          double batch_s)
{
    if (quick) {
        for (size_t i = 0; i < sizeof quick_shapes / sizeof quick_shapes[0]; i++)
            measure_gemm(hw, be, quick_shapes[i][0], quick_shapes[i][1], quick_shapes[i][2],
                         batch_s);
        return;
    }
    for (size_t r = 0; r < sizeof grid_rows / sizeof grid_rows[0]; r++)
        for (size_t w = 0; w < sizeof grid_widths / sizeof grid_widths[0]; w++) {
            int m = grid_rows[r], C = grid_widths[w];
            if (C > m && C > grid_widths[0]) continue;   /* wide products of few rows */
            measure_gemm(hw, be, m, C, C, batch_s);
            measure_gemm(hw, be, m, 4 * C, C, batch_s);
            measure_gemm(hw, be, m, C, 4 * C, batch_s);
        }
}

/* Causal attention's FLOPs over B sequences of T (hardware_ops.c's count). */
static double causal_flops(int B, int T, int C)
{
    return 2.0 * B * T * ((double)T + 1) * C;
}

/* Causal attention of B x NH heads of hs channels over T tokens: its
 * forward and its backward timed apart, an [attention] point. */
static void measure_attention_point(struct hardware *hw, const struct dm_backend *be, int B,
                                    int T, int hs, double batch_s)
{
    int NH = 4, C = NH * hs;
    struct op o = {.be = be, .kind = OP_ATTENTION_FORWARD, .B = B, .T = T, .C = C, .NH = NH};
    size_t BT = (size_t)B * T, square = (size_t)B * NH * T * T;
    o.x = device_floats(be, BT * 3 * C, 3);
    o.y = device_floats(be, BT * C, 4);
    o.z = be->alloc(BT * C * sizeof(float));
    o.w = be->alloc(BT * 3 * C * sizeof(float));
    o.s = be->alloc(square * sizeof(float));
    o.v = be->alloc(square * sizeof(float));
    double forward = time_op(&o, batch_s);
    o.kind = OP_ATTENTION_BACKWARD;   /* on the probabilities the forward left in s */
    double backward = time_op(&o, batch_s);
    double flops = causal_flops(B, T, C);
    struct hw_attention_point p = {T, hs, flops / beyond_overhead(hw, forward) / 1e12,
                                   2 * flops / beyond_overhead(hw, backward) / 1e12};
    hw->attention[hw->attention_points++] = p;
    dm_log("calibrate: causal attention B %d T %4d %d heads of %3d: forward %.3f ms, %.4f "
           "TFLOP/s; backward %.3f ms, %.4f TFLOP/s\n", B, T, NH, hs, forward * 1e3,
           p.forward_tflops, backward * 1e3, p.backward_tflops);
    float *buffers[] = {o.x, o.y, o.z, o.w, o.s, o.v};
    for (size_t b = 0; b < sizeof buffers / sizeof buffers[0]; b++) be->free(buffers[b]);
}

/* The [attention] points over a grid of lengths and head sizes (regular
 * in log2, as the GEMM grid), and tflops: forward and backward together,
 * 3 x the forward FLOPs over the two's time, the mean over the points. */
static void measure_attention_points(struct hardware *hw, const struct dm_backend *be,
                                     int quick, double batch_s)
{
    static const int lengths[] = {32, 96, 256, 768, 2048}, sizes[] = {16, 48, 128};
    int nl = quick ? 2 : (int)(sizeof lengths / sizeof lengths[0]);
    int ns = quick ? 1 : (int)(sizeof sizes / sizeof sizes[0]);
    double sum = 0;
    for (int l = 0; l < nl; l++)
        for (int h = 0; h < ns; h++) {
            measure_attention_point(hw, be, lengths[l] >= 2048 ? 1 : 2, lengths[l], sizes[h],
                                    batch_s);
            const struct hw_attention_point *p = &hw->attention[hw->attention_points - 1];
            sum += 3 / (1 / p->forward_tflops + 2 / p->backward_tflops);
        }
    hw->attention_tflops = sum / hw->attention_points;
    dm_log("calibrate: causal attention %.4f TFLOP/s forward and backward together (the mean "
           "over %d points)\n", hw->attention_tflops, hw->attention_points);
}

/* Hash attention of B x 4 heads of hs channels over T tokens in 8 groups
 * (hash.buckets' default): its forward and its backward timed apart, each
 * over the FLOPs of the tiles it visits (a share of causal attention's),
 * a hash point. */
static void measure_hash_point(struct hardware *hw, const struct dm_backend *be, int B, int T,
                               int hs, double batch_s)
{
    int NH = 4, C = NH * hs, groups = 8;
    struct op o = {.be = be, .kind = OP_GROUPED_FORWARD, .B = B, .T = T, .C = C, .NH = NH,
                   .groups = groups};
    size_t BT = (size_t)B * T;
    o.x = device_floats(be, BT * 3 * C, 3);
    o.y = device_floats(be, BT * C, 4);
    o.z = be->alloc(BT * C * sizeof(float));
    o.w = be->alloc(BT * 3 * C * sizeof(float));
    /* a rotation of N(0,1) draws: the groups are as even as hash
     * attention's, whose columns are also normalised */
    size_t n = (size_t)NH * hs * groups / 2;
    float *rotation = dm_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) rotation[i] = dm_normal(11, 0, i);
    o.s = be->alloc(n * sizeof(float));
    be->copy_to_device(o.s, rotation, n * sizeof(float));
    dm_free(rotation);
    o.v = be->alloc(BT * NH * sizeof(float));
    o.i1 = be->alloc(BT * NH * 2 * sizeof(int));
    o.i2 = be->alloc(BT * NH * 2 * sizeof(int));
    double forward = time_op(&o, batch_s);
    o.kind = OP_GROUPED_BACKWARD;
    double backward = time_op(&o, batch_s);
    long nt = (T + 31) / 32;
    double share = fmin(1.0, (double)o.tiles / ((double)B * NH * nt * (nt + 1) / 2));
    double flops = share * causal_flops(B, T, C);
    struct hw_attention_point p = {T, hs, flops / beyond_overhead(hw, forward) / 1e12,
                                   2 * flops / beyond_overhead(hw, backward) / 1e12};
    hw->hash[hw->hash_points++] = p;
    dm_log("calibrate: hash attention B %d T %4d %d heads of %3d, %.3f of the tiles: forward "
           "%.3f ms, %.4f TFLOP/s; backward %.3f ms, %.4f TFLOP/s\n", B, T, NH, hs, share,
           forward * 1e3, p.forward_tflops, backward * 1e3, p.backward_tflops);
    float *buffers[] = {o.x, o.y, o.z, o.w, o.s, o.v};
    for (size_t b = 0; b < sizeof buffers / sizeof buffers[0]; b++) be->free(buffers[b]);
    be->free(o.i1);
    be->free(o.i2);
}

/* The hash points over T of 96, 384 and 1536 and head sizes of 16 and 48,
 * and hash_tflops: forward and backward together over the mean of the
 * points. */
static void measure_hash_points(struct hardware *hw, const struct dm_backend *be, int quick,
                                double batch_s)
{
    static const int lengths[] = {96, 384, 1536}, sizes[] = {16, 48};
    int nl = quick ? 1 : (int)(sizeof lengths / sizeof lengths[0]);
    int ns = quick ? 1 : (int)(sizeof sizes / sizeof sizes[0]);
    double sum = 0;
    for (int l = 0; l < nl; l++)
        for (int h = 0; h < ns; h++) {
            measure_hash_point(hw, be, 2, lengths[l], sizes[h], batch_s);
            const struct hw_attention_point *p = &hw->hash[hw->hash_points - 1];
            sum += 3 / (1 / p->forward_tflops + 2 / p->backward_tflops);
        }
    hw->group_attention_tflops = sum / hw->hash_points;
}

/* The CSR product of 90% sparse weights, forward and backward: 6 x rows x
 * nonzeros over the time. */
static double measure_sparse(const struct dm_backend *be, int quick, double batch_s)
{
    int m = quick ? 256 : 2048, k = 128, n = 512;
    int *row_ptr = dm_alloc(((size_t)n + 1) * sizeof(int));
    int *col = dm_alloc((size_t)n * k * sizeof(int));
    int nnz = 0;
    for (int r = 0; r < n; r++) {
        row_ptr[r] = nnz;
        for (int c = 0; c < k; c++)
            if (dm_hash64(5, (uint64_t)r, (uint64_t)c) % 10 == 0) col[nnz++] = c;
    }
    row_ptr[n] = nnz;
    struct op o = {.be = be, .kind = OP_SPARSE, .m = m, .n = n, .k = k, .tiles = nnz};
    o.i1 = device_ints(be, row_ptr, (size_t)n + 1);
    o.i2 = device_ints(be, col, (size_t)nnz);
    o.x = device_floats(be, (size_t)m * k, 5);
    o.y = device_floats(be, (size_t)(nnz ? nnz : 1), 6);
    o.z = device_floats(be, (size_t)m * n, 7);
    o.w = be->alloc((size_t)m * k * sizeof(float));
    o.v = be->alloc((size_t)n * k * sizeof(float));   /* the dense weight gradient */
    double s = time_op(&o, batch_s);
    double tflops = 6.0 * m * nnz / s / 1e12;
    dm_log("calibrate: CSR product %d x %d x %d at 90%% sparsity: %.3f ms forward + backward, "
           "%.4f TFLOP/s on the nonzeros\n", m, n, k, s * 1e3, tflops);
    float *buffers[] = {o.x, o.y, o.z, o.w, o.v};
    for (size_t b = 0; b < sizeof buffers / sizeof buffers[0]; b++) be->free(buffers[b]);
    be->free(o.i1);
    be->free(o.i2);
    dm_free(row_ptr);
    dm_free(col);
    return tflops;
}

/* The elementwise and normalisation ops' bandwidth (the median of
 * layernorm, GELU and residual; hardware_ops.c's bytes), GELU's, the
 * layernorm's and AdamW's own, a copy's (the peak), and a tiny op's time
 * (the overhead). */
static void measure_memory(struct hardware *hw, const struct dm_backend *be, int quick,
                           double batch_s)
{
    /* 4 MB an array: the size of a block's activations and AdamW state at the
     * configs' widths, beyond the core's caches but not a whole-memory stream */
    int rows = quick ? 1024 : 4096, C = 256;
    size_t n = (size_t)rows * C;
    struct op o = {.be = be, .m = rows, .n = C};
    o.x = device_floats(be, n, 8);
    o.y = device_floats(be, n, 9);
    o.s = device_floats(be, (size_t)C, 10);
    o.z = be->alloc(n * sizeof(float));
    o.v = be->alloc(n * sizeof(float));   /* a layernorm's mean and rstd; AdamW's moments */
    o.w = be->alloc(n * sizeof(float));
    const int kinds[4] = {OP_LAYERNORM, OP_GELU, OP_RESIDUAL, OP_COPY};
    const char *names[4] = {"layernorm", "gelu", "residual", "copy"};
    const double bytes_per[4] = {2 * 4.0, 2 * 4.0, 3 * 4.0, 2 * 4.0};   /* per element */
    double rate[4];
    for (int i = 0; i < 4; i++) {
        o.kind = kinds[i];
        double s = time_op(&o, batch_s);
        rate[i] = bytes_per[i] * n / s / 1e9;
        dm_log("calibrate: %-9s %d x %d: %.3f ms, %.2f GB/s\n", names[i], rows, C, s * 1e3,
               rate[i]);
    }
    double ops[3] = {rate[0], rate[1], rate[2]};
    hw->bandwidth_gbs = dm_median(ops, 3);
    hw->layernorm_gbs = rate[0];
    hw->gelu_gbs = rate[1];
    /* AdamW over as many parameters as the arrays hold: 28 bytes each */
    o.kind = OP_ADAMW;
    double adamw = time_op(&o, batch_s);
    hw->adamw_gbs = 28.0 * n / adamw / 1e9;
    dm_log("calibrate: adamw     %zu parameters: %.3f ms, %.2f GB/s\n", n, adamw * 1e3,
           hw->adamw_gbs);
    hw->peak_bandwidth_gbs = fmax(fmax(fmax(rate[0], rate[1]), fmax(rate[2], rate[3])),
                                  hw->adamw_gbs);
    /* The overhead: a 16-float op's time, or a small layernorm's beyond its
     * bytes when that is more (an op the thread pool spreads over its
     * threads pays their start and join, the tiny one runs inline). */
    o.kind = OP_RESIDUAL;
    o.m = 1;
    o.n = 16;
    double tiny = time_op(&o, batch_s);
    o.kind = OP_LAYERNORM;
    o.m = 64;
    o.n = 64;
    double small = time_op(&o, batch_s) - 2 * 4.0 * 64 * 64 / (hw->bandwidth_gbs * 1e9);
    hw->op_overhead_us = fmax(tiny, small) * 1e6;
    dm_log("calibrate: a 16-float op %.2f us, a 64 x 64 layernorm beyond its bytes %.2f us: "
           "%.2f us per op\n", tiny * 1e6, small * 1e6, hw->op_overhead_us);
    float *buffers[] = {o.x, o.y, o.s, o.z, o.v, o.w};
    for (size_t b = 0; b < sizeof buffers / sizeof buffers[0]; b++) be->free(buffers[b]);
}

/* ---- the links (ranks 0 and 1) ------------------------------------------------ */

/* Seconds of an all-reduce of `count` floats over the world, polled: the
 * median of five batches. */
static double allreduce_seconds(int count, int reps)
{
    float *in = dm_alloc((size_t)count * sizeof(float));
    float *out = dm_alloc((size_t)count * sizeof(float));
    double samples[5];
    for (int b = -1; b < 5; b++) {   /* b = -1 warms up */
        double t0 = dm_now();
        for (int r = 0; r < reps; r++) {
            MPI_Request req;
            WORLD_MPI(MPI_Iallreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req));
            world_wait(&req);
        }
        if (b >= 0) samples[b] = (dm_now() - t0) / reps;
    }
    dm_free(in);
    dm_free(out);
    double mine = dm_median(samples, 5), seconds = 0;
    MPI_Request req;
    WORLD_MPI(MPI_Iallreduce(&mine, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req));
    world_wait(&req);
    return seconds;
}

/* The point-to-point line from a small and a large message (each a send
 * and a one-int acknowledgement, world_transfer_rate), and the all-reduce
 * line from a small and a large all-reduce at their bus bandwidth
 * (2 (n-1)/n of the bytes). */
static void measure_links(struct hardware *hw, int quick)
{
    size_t small = 8, large = quick ? (1u << 20) : (16u << 20);
    int reps = quick ? 20 : 100;
    double t_small = small / world_transfer_rate(small, reps * 10);
    double t_large = large / world_transfer_rate(large, reps / 5 > 2 ? reps / 5 : 2);
    /* a large message barely slower than a small one (a loaded machine's
     * noise): its bytes over its whole time */
    double beta_s = t_large > 2 * t_small ? t_large - t_small : t_large;
    struct hw_link p2p = {t_small / 2 * 1e6, (double)large / beta_s / 1e9};
    int count_small = 2, count_large = (int)(large / sizeof(float));
    double a_small = allreduce_seconds(count_small, reps * 10);
    double a_large = allreduce_seconds(count_large, reps / 5 > 2 ? reps / 5 : 2);
    double n = dm_world_size(), bus = 2 * (n - 1) / n;
    double allreduce_s = a_large > 2 * a_small ? a_large - a_small : a_large;
    struct hw_link collective = {a_small * 1e6, bus * count_large * 4.0 / allreduce_s / 1e9};
    if (dm_rank() == 0)
        dm_log("calibrate: point-to-point %.2f us + bytes / %.2f GB/s; all-reduce %.2f us + "
               "bytes / %.2f GB/s (bus)\n", p2p.latency_us, p2p.bandwidth_gbs,
               collective.latency_us, collective.bandwidth_gbs);
    /* One node: the lines between nodes are the same measurement. */
    hw->p2p_intra = hw->p2p_inter = p2p;
    hw->collective_intra = hw->collective_inter = collective;
    hw->ranks_per_node = world_local_size();
}

/* ---- the command ---------------------------------------------------------------- */

/* world_max_int with a sleeping wait: while rank 0 measures its ops, rank 1
 * waits here, and a rank that polls with sched_yield keeps one of 2 cores
 * busy, taking it from rank 0's second thread (the thread pool's joins then
 * wait for a scheduler tick: a 64 x 64 layernorm measured 0.5 ms instead of
 * 2 us, and two threads' GEMMs ran at one thread's rate). */
static int max_status_sleeping(int status)
{
    int largest = status, done = 0;
    MPI_Request req;
    WORLD_MPI(MPI_Iallreduce(&status, &largest, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req));
    for (;;) {
        WORLD_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done) return largest;
        struct timespec pause = {0, 1000000L};
        nanosleep(&pause, NULL);
    }
}

int cmd_calibrate(int argc, char **argv)
{
    struct calibrate_args a;
    for (int i = 1; i < argc; i++) tool_help(argv[i], usage);   /* before MPI starts */
    world_init(&argc, &argv);
    parse_args(&a, argc, argv);
    if (dm_world_size() != 2)
        dm_user_error("calibrate: measures the links between two ranks: run it under "
                      "mpiexec -n 2 (this job has %d)", dm_world_size());
    struct dm_config cfg;
    config_defaults(&cfg);
    if (a.config) config_load_file(&cfg, a.config);
    for (int i = 0; i < a.override_count; i++) config_apply_override(&cfg, a.overrides[i]);
    struct hardware hw;
    memset(&hw, 0, sizeof hw);
    train_open_backend(&cfg);   /* collective: every rank agrees the device opened */
    measure_links(&hw, a.quick);
    int status = DM_EXIT_OK;
    int threads = a.threads ? a.threads : cfg.threads ? cfg.threads
                : world_cpus_for_rank() * world_local_size();
    if (dm_rank() == 0 || a.busy_peer) {
        /* rank 1 with --busy-peer: the same measurements into a copy
         * nobody reads, so that rank 0's run beside a computing core */
        dm_threads_init(threads);
        const struct dm_backend *be = backend_current();
        double batch_s = a.quick ? 0.002 : 0.04;
        measure_memory(&hw, be, a.quick, batch_s);
        measure_gemms(&hw, be, a.quick, batch_s);
        measure_attention_points(&hw, be, a.quick, batch_s);
        measure_hash_points(&hw, be, a.quick, batch_s);
        hw.sparse_tflops = measure_sparse(be, a.quick, batch_s);
    }
    if (dm_rank() == 0) {
        for (int p = 0; p < hw.attention_points; p++)
            hw.gemm_peak_tflops = fmax(hw.gemm_peak_tflops, fmax(hw.attention[p].forward_tflops,
                                                                 hw.attention[p].backward_tflops));
        for (int p = 0; p < hw.hash_points; p++)
            hw.gemm_peak_tflops = fmax(hw.gemm_peak_tflops, fmax(hw.hash[p].forward_tflops,
                                                                 hw.hash[p].backward_tflops));
        if (hw.attention_tflops > hw.gemm_peak_tflops) hw.gemm_peak_tflops = hw.attention_tflops;
        if (hw.group_attention_tflops > hw.gemm_peak_tflops)
            hw.gemm_peak_tflops = hw.group_attention_tflops;
        if (hw.sparse_tflops > hw.gemm_peak_tflops) hw.gemm_peak_tflops = hw.sparse_tflops;
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
        hw.memory_gb = pages > 0 && page > 0 ? (double)pages * page / 1e9 : 1;
        hw.bytes_per_element = 4;
        snprintf(hw.name, sizeof hw.name, "%s calibrated by dynmo %s (%d threads%s%s)",
                 cfg.device, DYNMO_VERSION, threads, a.busy_peer ? ", beside a busy peer" : "",
                 a.quick ? ", quick" : "");
        char comment[1024], err[1024];
        snprintf(comment, sizeof comment,
                 "Written by `dynmo calibrate` (docs/simulate.md, \"The hardware model\"):\n"
                 "every figure measured on this machine with dynmo's own ops on rank 0\n"
                 "(train.device = %s, %d threads) and between ranks 0 and 1 (one node:\n"
                 "the lines between nodes repeat those within); peak_tflops and\n"
                 "peak_bandwidth_gbs are the best measured, memory_gb the host's memory%s.",
                 cfg.device, threads,
                 strcmp(cfg.device, "cpu") ? "\n(set it to the device's: the op table does not "
                 "report it)" : "");
        if (hardware_write(&hw, a.out, comment, err, sizeof err) != 0) {
            fprintf(stderr, "dynmo: error: calibrate: %s\n", err);
            status = DM_EXIT_USAGE;
        } else {
            dm_log("calibrate: wrote %s\n", a.out);
        }
    }
    if (dm_rank() == 0 || a.busy_peer) dm_threads_shutdown();
    /* rank 1 sleeps here while rank 0 measures (or writes, with --busy-peer) */
    status = max_status_sleeping(status);
    dm_free(a.overrides);
    world_finalize(status);
    return status;
}
