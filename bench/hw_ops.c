/* bench/hw_ops.c: the hardware model's ops against the model's own, op by
 * op, for one dense block (docs/simulate.md, "The hardware model"). Each
 * op of block_forward and block_backward (and the block's AdamW update,
 * tensor by tensor as gpt_adamw_update runs it) is called as the block
 * calls it, in the block's order, each timed by itself; a round is the
 * whole sequence, and each op's figure is its median over the rounds, so
 * a neighbour's burst falls on every op alike. Beside each: the op's price
 * on the hardware file (hardware_ops.c) and the ratio measured/predicted.
 * The whole block_forward and block_backward are timed too, in the same
 * rounds after the ops, so the ops' sum can be checked against the
 * block's; and, measured only, the fc product without its bias and GELU,
 * GELU alone, fcproj without its residual, and fc's backward split into
 * its input and its weight gradient, to show what each part costs.
 * On a loaded machine only the ratios between lines are worth reading.
 * Built by `make build/bench/hw_ops`.
 * Last, a stage: `depth` more blocks, each with its own weights and
 * activations, forward one after the other and backward in reverse, as a
 * pipeline stage runs them: its time a block against the one block
 * repeated shows what operands that are no longer in cache cost.
 * Usage: hw_ops HW.ini B T C NH [threads] [rounds] [depth] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "tools/simulate/hardware.h"

#define OPS_MAX 40

struct timed {
    const char *name;
    double *t;
};

static struct timed ops[OPS_MAX];
static int op_count, rounds, round_at;

/* The time since the last mark, as op `name`'s sample of this round. */
static double mark_clock;
static void mark(const char *name)
{
    backend_current()->synchronize();
    double now = dm_now();
    int i = 0;
    while (i < op_count && strcmp(ops[i].name, name)) i++;
    if (i == op_count) {
        DM_ASSERT(op_count < OPS_MAX);
        ops[i] = (struct timed){name, dm_alloc((size_t)rounds * sizeof(double))};
        op_count++;
    }
    ops[i].t[round_at] = now - mark_clock;
    mark_clock = dm_now();
}

static void start(void)
{
    backend_current()->synchronize();
    mark_clock = dm_now();
}

static double measured_ms(const char *name)
{
    for (int i = 0; i < op_count; i++)
        if (!strcmp(ops[i].name, name)) return 1e3 * dm_median(ops[i].t, rounds);
    return 0;
}

/* Predicted ms of the pass's ops whose names start with prefix. */
static double predicted_ms(const struct hw_pass *p, const char *prefix)
{
    double ms = 0;
    for (int i = 0; i < p->count; i++)
        if (!strncmp(p->op[i].name, prefix, strlen(prefix)) &&
            (p->op[i].name[strlen(prefix)] == 0 || p->op[i].name[strlen(prefix)] == ' '))
            ms += p->op[i].ms;
    return ms;
}

static void row(const char *what, double measured, double predicted)
{
    printf("  %-24s %9.4f ms  predicted %9.4f  measured/predicted %.2f\n", what, measured,
           predicted, predicted > 0 ? measured / predicted : 0);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: hw_ops HW.ini B T C NH [threads] [rounds]\n");
        return 2;
    }
    int B = atoi(argv[2]), T = atoi(argv[3]), C = atoi(argv[4]), NH = atoi(argv[5]);
    int threads = argc > 6 ? atoi(argv[6]) : 1;
    rounds = argc > 7 ? atoi(argv[7]) : 30;
    int depth = argc > 8 ? atoi(argv[8]) : 8;
    struct hardware hw;
    hardware_load(&hw, argv[1]);
    dm_threads_init(threads);
    struct hw_model model = {.hw = &hw, .sequences = B};
    config_defaults(&model.cfg);
    model.cfg.channels = C;
    model.cfg.heads = NH;
    model.cfg.seq = T;
    struct hw_block_state dense = {.active = 1, .tokens = 1, .tiles = 1};
    struct hw_pass fwd, bwd, upd;
    hw_block_forward(&fwd, &model, &dense);
    hw_block_backward(&bwd, &model, &dense);
    hw_block_update(&upd, &model, &dense);

    struct gpt_shape shape = {.vocab = 256, .max_seq = T, .layers = 2, .heads = NH, .channels = C};
    struct block blk;
    struct block_acts a;
    struct block_scratch s;
    block_init(&blk, 0, &shape, 1337);
    block_acts_alloc(&a, B, T, C, NH);
    block_scratch_alloc(&s, B, T, C, NH);
    int N = B * T;
    size_t n = (size_t)N * C;
    float *in = dm_alloc(n * sizeof(float)), *out = dm_alloc(n * sizeof(float));
    float *dout = dm_alloc(n * sizeof(float)), *din = dm_alloc(n * sizeof(float));
    float *plain = dm_alloc((size_t)N * 4 * C * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        in[i] = dm_normal(1, 1, i);
        dout[i] = 1e-3f * dm_normal(1, 2, i);
    }
    const struct dm_backend *be = backend_current();
    float *const *p = blk.p, *const *g = blk.g;
    struct block *stage = dm_alloc((size_t)depth * sizeof *stage);
    struct block_acts *stage_acts = dm_alloc((size_t)depth * sizeof *stage_acts);
    float *stage_x = dm_alloc((size_t)(depth + 1) * n * sizeof(float));
    memcpy(stage_x, in, n * sizeof(float));
    for (int j = 0; j < depth; j++) {
        block_init(&stage[j], j, &shape, 1337 + (uint64_t)j);
        block_acts_alloc(&stage_acts[j], B, T, C, NH);
    }
    for (int r = -1; r < rounds; r++) {
        round_at = r < 0 ? 0 : r;   /* round -1 warms up into sample 0 */
        start();
        be->layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, in, p[BP_LN1_W], p[BP_LN1_B], N, C);
        mark("ln1");
        be->matmul_forward(a.qkv, a.ln1, p[BP_QKV_W], p[BP_QKV_B], N, C, 3 * C);
        mark("qkv");
        be->attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
        mark("attention");
        be->matmul_forward_residual(a.res1, a.atty, p[BP_ATTPROJ_W], p[BP_ATTPROJ_B], in, N, C,
                                    C);
        mark("proj");
        be->layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res1, p[BP_LN2_W], p[BP_LN2_B],
                              N, C);
        mark("ln2");
        be->matmul_forward_gelu(a.fch, a.fch_gelu, a.ln2, p[BP_FC_W], p[BP_FC_B], N, C, 4 * C);
        mark("fc");
        be->matmul_forward_residual(out, a.fch_gelu, p[BP_FCPROJ_W], p[BP_FCPROJ_B], a.res1, N,
                                    4 * C, C);
        mark("fcproj");
        be->matmul_backward_gelu(s.d_fch, g[BP_FCPROJ_W], g[BP_FCPROJ_B], dout, a.fch_gelu,
                                 p[BP_FCPROJ_W], a.fch, N, 4 * C, C);
        mark("fcproj backward");
        be->matmul_backward_overwrite(s.d_ln, g[BP_FC_W], g[BP_FC_B], s.d_fch, a.ln2, p[BP_FC_W],
                                      N, C, 4 * C);
        mark("fc backward");
        be->layernorm_backward_residual(s.d_res1, dout, g[BP_LN2_W], g[BP_LN2_B], s.d_ln, a.res1,
                                        p[BP_LN2_W], a.ln2_mean, a.ln2_rstd, N, C);
        mark("ln2 backward");
        be->matmul_backward_overwrite(s.d_atty, g[BP_ATTPROJ_W], g[BP_ATTPROJ_B], s.d_res1,
                                      a.atty, p[BP_ATTPROJ_W], N, C, C);
        mark("proj backward");
        be->attention_backward(s.d_qkv, s.d_att, s.d_atty, a.qkv, a.att, B, T, C, NH);
        mark("attention backward");
        be->matmul_backward_overwrite(s.d_ln, g[BP_QKV_W], g[BP_QKV_B], s.d_qkv, a.ln1,
                                      p[BP_QKV_W], N, C, 3 * C);
        mark("qkv backward");
        be->layernorm_backward_residual(din, s.d_res1, g[BP_LN1_W], g[BP_LN1_B], s.d_ln, in,
                                        p[BP_LN1_W], a.ln1_mean, a.ln1_rstd, N, C);
        mark("ln1 backward");
        start();
        block_forward(&blk, &a, out, in, B, T);
        mark("block forward");
        for (int j = 0; j < depth; j++)
            block_forward(&stage[j], &stage_acts[j], stage_x + (size_t)(j + 1) * n,
                          stage_x + (size_t)j * n, B, T);
        mark("stage forward");
        for (int j = depth - 1; j >= 0; j--)
            block_backward(&stage[j], &stage_acts[j], &s, din, j == depth - 1 ? dout : din,
                           stage_x + (size_t)j * n, B, T);
        mark("stage backward");
        block_backward(&blk, &a, &s, din, dout, in, B, T);
        mark("block backward");
        for (int k = 0; k < BP_COUNT; k++) {
            size_t off, size;
            block_tensor_at(&blk, k, &off, &size);
            be->adamw_update(blk.params + off, blk.grads + off, blk.m + off, blk.v + off,
                             (long)size, 1e-9f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1);
        }
        mark("adamw (12 tensors)");
        be->adamw_update(blk.params, blk.grads, blk.m, blk.v, (long)blk.nparams, 1e-9f, 0.9f,
                         0.95f, 1e-8f, 0.0f, 1.0f, 1);
        mark("adamw (one call)");
        /* what the epilogues cost: the same products without them, GELU alone */
        be->matmul_forward(plain, a.ln2, p[BP_FC_W], NULL, N, C, 4 * C);
        mark("fc without bias, gelu");
        be->gelu_forward(a.fch_gelu, a.fch, (long)N * 4 * C);
        mark("gelu alone");
        be->matmul_forward(plain, a.fch_gelu, p[BP_FCPROJ_W], NULL, N, 4 * C, C);
        mark("fcproj without residual");
        be->matmul_backward_overwrite(s.d_ln, NULL, NULL, s.d_fch, a.ln2, p[BP_FC_W], N, C, 4 * C);
        mark("fc backward dinp only");
        be->matmul_backward_overwrite(NULL, g[BP_FC_W], NULL, s.d_fch, a.ln2, p[BP_FC_W], N, C,
                                      4 * C);
        mark("fc backward dweight only");
    }
    printf("hw_ops: B %d T %d C %d NH %d, %d thread(s), %d rounds (medians) on %s\n", B, T, C,
           NH, threads, rounds, hw.name);
    const char *forward[] = {"ln1", "qkv", "attention", "proj", "ln2", "fc", "fcproj"};
    const char *backward[] = {"fcproj", "fc", "ln2", "proj", "attention", "qkv", "ln1"};
    double fsum = 0, bsum = 0;
    printf("forward:\n");
    for (int i = 0; i < 7; i++) {
        double m = measured_ms(forward[i]);
        fsum += m;
        row(forward[i], m, predicted_ms(&fwd, forward[i]));
    }
    row("sum of the ops", fsum, fwd.ms);
    row("block_forward", measured_ms("block forward"), fwd.ms);
    printf("backward:\n");
    for (int i = 0; i < 7; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s backward", backward[i]);
        double m = measured_ms(name);
        bsum += m;
        /* "fc backward", or "fc dinp" and "fc dweight" on a file without backward points */
        row(name, m, predicted_ms(&bwd, backward[i]));
    }
    row("sum of the ops", bsum, bwd.ms);
    row("block_backward", measured_ms("block backward"), bwd.ms);
    if (depth > 0) {
        printf("a stage of %d blocks, a block:\n", depth);
        row("forward", measured_ms("stage forward") / depth, fwd.ms);
        row("backward", measured_ms("stage backward") / depth, bwd.ms);
    }
    printf("update:\n");
    row("adamw (12 tensors)", measured_ms("adamw (12 tensors)"), predicted_ms(&upd, "adamw"));
    row("adamw (one call)", measured_ms("adamw (one call)"), predicted_ms(&upd, "adamw"));
    printf("epilogues and directions (measured only):\n");
    const char *probes[] = {"fc without bias, gelu", "gelu alone", "fcproj without residual",
                            "fc backward dinp only", "fc backward dweight only"};
    for (int i = 0; i < 5; i++) printf("  %-24s %9.4f ms\n", probes[i], measured_ms(probes[i]));
    block_free(&blk);
    block_acts_free(&a);
    block_scratch_free(&s);
    dm_threads_shutdown();
    return 0;
}
