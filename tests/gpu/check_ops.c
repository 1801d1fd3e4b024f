/* check_ops cpu|cuda: every op of a backend's table (include/dynmo/
 * backend.h) against the CPU backend on the same inputs, through the
 * table's own memory calls (alloc, copies), the way the model will call
 * it. Prints each op's largest difference relative to the largest
 * magnitude of the CPU's result and exits 1 when any exceeds 1e-4 (or
 * when the backend cannot be opened: no plugin, no GPU). `make check-gpu`
 * runs it with cuda; `check_ops cpu` checks the checker (the CPU table
 * against itself: every difference 0). The transport (comm_*) needs
 * several ranks and is not checked here. With --host-read (the host
 * reads a device tensor) or --host-pointer (an op is handed host memory)
 * it checks that the strict emulated device stops the process
 * (tests/t_device_memory.sh). On a device it also checks the products
 * with bf16 and tf32 operands (train.precision) against the CPU's
 * products of operands rounded as kernels/precision.cuh rounds them
 * (bf16 within 1e-4; tf32 within 1e-3, cuBLAS not saying how it rounds). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/core.h"
#include "dynmo/mod_predictor.h"
#include "dynmo/model.h"
#include "dyn/hash.h"
#include "../../kernels/precision.cuh"

static const struct dm_backend *dev, *cpu;
static int failures, checked;
static uint64_t draw_state = 99;

static float draw(void)
{
    draw_state = draw_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(draw_state >> 40) / (double)(1 << 24) * 2.0 - 1.0);
}

static float *host(long n, float scale)
{
    float *x = dm_alloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = scale * draw();
    return x;
}

static void *up(const void *h, size_t bytes)
{
    void *d = dev->alloc(bytes);
    dev->copy_to_device(d, h, bytes);
    return d;
}

/* got (host) against want: the same infinities, then the largest
 * difference relative to the largest finite magnitude, at most tol */
static void compare_host_within(const char *op, const float *got, const float *want, long n,
                                double tol)
{
    double worst = 0.0, scale = 0.0;
    long inf_differ = 0;
    for (long i = 0; i < n; i++) {
        if (isinf(got[i]) || isinf(want[i])) {
            inf_differ += got[i] != want[i];
            continue;
        }
        double diff = fabs((double)got[i] - want[i]);
        worst = diff > worst || isnan(diff) ? diff : worst;
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    double rel = scale > 0 ? worst / scale : worst;
    int ok = rel <= tol && inf_differ == 0;
    failures += !ok;
    checked++;
    printf("  %-40s %9.2e %s", op, rel, ok ? "ok" : "FAIL");
    printf(ok ? "\n" : " (tol %.0e, infinities alike)\n", tol);
}

static void compare_host(const char *op, const float *got, const float *want, long n)
{
    compare_host_within(op, got, want, n, 1e-4);
}

/* the device result d (n floats) against want, within tol */
static void compare_within(const char *op, const float *d, const float *want, long n, double tol)
{
    float *got = dm_alloc((size_t)n * sizeof(float));
    dev->synchronize();
    dev->copy_to_host(got, d, (size_t)n * sizeof(float));
    compare_host_within(op, got, want, n, tol);
    dm_free(got);
}

static void compare(const char *op, const float *d, const float *want, long n)
{
    compare_within(op, d, want, n, 1e-4);
}

/* the device ints d (n) equal to want */
static void compare_ints(const char *op, const int *d, const int *want, long n)
{
    int *got = dm_alloc((size_t)n * sizeof(int));
    dev->synchronize();
    dev->copy_to_host(got, d, (size_t)n * sizeof(int));
    int same = memcmp(got, want, (size_t)n * sizeof(int)) == 0;
    failures += !same;
    checked++;
    printf("  %-40s %9s %s\n", op, "", same ? "ok (equal)" : "FAIL (differ)");
    dm_free(got);
}

/* a slab through pinned staging: host -> device -> host, bit for bit */
static void check_staging(long n)
{
    float *slab = host(n, 1), *stage = dev->alloc_host((size_t)n * sizeof(float));
    memcpy(stage, slab, (size_t)n * sizeof(float));
    float *D = dev->alloc((size_t)n * sizeof(float));
    dev->copy_to_device(D, stage, (size_t)n * sizeof(float));
    memset(stage, 0, (size_t)n * sizeof(float));
    dev->copy_to_host(stage, D, (size_t)n * sizeof(float));
    int same = memcmp(stage, slab, (size_t)n * sizeof(float)) == 0;
    failures += !same;
    checked++;
    printf("  %-40s %9s %s\n", "staging through alloc_host", "", same ? "ok" : "FAIL (bits differ)");
    dev->free_host(stage), dev->free(D), dm_free(slab);
}

/* the device-side memory ops and the reduction: zero and copy_on_device
 * exact, sum_squares the CPU's bits (n not a multiple of the chunk) */
static void check_memory_ops(long n)
{
    float *x = host(n, 3), *zero = host(n, 0);
    float *X = up(x, n * 4), *Y = dev->alloc(n * 4);
    dev->copy_on_device(Y, X, n * 4);
    compare("copy_on_device", Y, x, n);
    double want = cpu->sum_squares(x, n), got = dev->sum_squares(Y, n);
    int same = memcmp(&want, &got, sizeof want) == 0;
    failures += !same;
    checked++;
    printf("  %-40s %9.2e %s\n", "sum_squares", fabs(got - want) / want,
           same ? "ok (the CPU's bits)" : "FAIL (bits differ)");
    dev->zero(Y, n * 4);
    compare("zero", Y, zero, n);
    dm_free(x), dm_free(zero), dev->free(X), dev->free(Y);
}

static void check_matmul(int N, int C, int OC)
{
    long NC = (long)N * C, NO = (long)N * OC, W = (long)OC * C;
    float *x = host(NC, 1), *w = host(W, 0.1f), *b = host(OC, 1), *res = host(NO, 1);
    float *dy = host(NO, 1), *g = host(NC, 1), *dx = host(NC, 1), *dw = host(W, 1);
    float *db = host(OC, 1), *out = host(NO, 0), *gout = host(NO, 0);
    float *X = up(x, NC * 4), *Wd = up(w, W * 4), *Bd = up(b, OC * 4), *R = up(res, NO * 4);
    float *DY = up(dy, NO * 4), *G = up(g, NC * 4), *DX = up(dx, NC * 4), *DW = up(dw, W * 4);
    float *DB = up(db, OC * 4), *O = up(out, NO * 4), *GO = up(gout, NO * 4);
    cpu->matmul_forward(out, x, w, b, N, C, OC);
    dev->matmul_forward(O, X, Wd, Bd, N, C, OC);
    compare("matmul_forward", O, out, NO);
    cpu->matmul_forward_residual(out, x, w, b, res, N, C, OC);
    dev->matmul_forward_residual(O, X, Wd, Bd, R, N, C, OC);
    compare("matmul_forward_residual", O, out, NO);
    cpu->matmul_forward_gelu(out, gout, x, w, b, N, C, OC);
    dev->matmul_forward_gelu(O, GO, X, Wd, Bd, N, C, OC);
    compare("matmul_forward_gelu gelu_out", GO, gout, NO);
    cpu->matmul_backward(dx, dw, db, dy, x, w, N, C, OC);
    dev->matmul_backward(DX, DW, DB, DY, X, Wd, N, C, OC);
    compare("matmul_backward dinp", DX, dx, NC);
    compare("matmul_backward dweight", DW, dw, W);
    compare("matmul_backward dbias", DB, db, OC);
    cpu->matmul_backward_overwrite(dx, dw, NULL, dy, x, w, N, C, OC);
    dev->matmul_backward_overwrite(DX, DW, NULL, DY, X, Wd, N, C, OC);
    compare("matmul_backward_overwrite dinp", DX, dx, NC);
    cpu->matmul_backward_gelu(dx, NULL, db, dy, x, w, g, N, C, OC);
    dev->matmul_backward_gelu(DX, NULL, DB, DY, X, Wd, G, N, C, OC);
    compare("matmul_backward_gelu dinp", DX, dx, NC);
    float *hs[] = {x, w, b, res, dy, g, dx, dw, db, out, gout};
    float *ds[] = {X, Wd, Bd, R, DY, G, DX, DW, DB, O, GO};
    for (int i = 0; i < 11; i++) dm_free(hs[i]), dev->free(ds[i]);
}

static void check_layernorm(int N, int C)
{
    long NC = (long)N * C;
    float *x = host(NC, 2), *w = host(C, 1), *b = host(C, 1), *dy = host(NC, 1);
    float *out = host(NC, 0), *mean = host(N, 0), *rstd = host(N, 0), *dx = host(NC, 1);
    float *dres = host(NC, 1), *dw = host(C, 1), *db = host(C, 1);
    float *X = up(x, NC * 4), *Wd = up(w, C * 4), *Bd = up(b, C * 4), *DY = up(dy, NC * 4);
    float *O = up(out, NC * 4), *M = up(mean, N * 4), *S = up(rstd, N * 4);
    float *DX = up(dx, NC * 4), *DR = up(dres, NC * 4), *DW = up(dw, C * 4), *DB = up(db, C * 4);
    cpu->layernorm_forward(out, mean, rstd, x, w, b, N, C);
    dev->layernorm_forward(O, M, S, X, Wd, Bd, N, C);
    compare("layernorm_forward", O, out, NC);
    compare("layernorm_forward rstd", S, rstd, N);
    dev->copy_to_device(M, mean, N * 4);     /* the backward from the same statistics */
    dev->copy_to_device(S, rstd, N * 4);
    cpu->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
    dev->layernorm_backward(DX, DW, DB, DY, X, Wd, M, S, N, C);
    compare("layernorm_backward dinp", DX, dx, NC);
    compare("layernorm_backward dweight", DW, dw, C);
    compare("layernorm_backward dbias", DB, db, C);
    cpu->layernorm_backward_residual(dx, dres, dw, NULL, dy, x, w, mean, rstd, N, C);
    dev->layernorm_backward_residual(DX, DR, DW, NULL, DY, X, Wd, M, S, N, C);
    compare("layernorm_backward_residual dinp", DX, dx, NC);
    float *hs[] = {x, w, b, dy, out, mean, rstd, dx, dres, dw, db};
    float *ds[] = {X, Wd, Bd, DY, O, M, S, DX, DR, DW, DB};
    for (int i = 0; i < 11; i++) dm_free(hs[i]), dev->free(ds[i]);
}

static void check_attention(int B, int T, int C, int NH)
{
    long BTC = (long)B * T * C, tt = (long)B * NH * T * T;
    float *qkv = host(3 * BTC, 1), *dy = host(BTC, 1), *out = host(BTC, 0);
    float *att = host(tt, 0), *scratch = host(tt, 0), *dqkv = host(3 * BTC, 0);
    float *Q = up(qkv, 3 * BTC * 4), *DY = up(dy, BTC * 4), *O = up(out, BTC * 4);
    float *A = up(att, tt * 4), *S = up(scratch, tt * 4), *DQ = up(dqkv, 3 * BTC * 4);
    cpu->attention_forward(out, att, qkv, B, T, C, NH);
    dev->attention_forward(O, A, Q, B, T, C, NH);
    compare("attention_forward out", O, out, BTC);
    dev->copy_to_device(A, att, tt * 4);
    cpu->attention_backward(dqkv, scratch, dy, qkv, att, B, T, C, NH);
    dev->attention_backward(DQ, S, DY, Q, A, B, T, C, NH);
    compare("attention_backward dqkv", DQ, dqkv, 3 * BTC);
    float *hs[] = {qkv, dy, out, att, scratch, dqkv}, *ds[] = {Q, DY, O, A, S, DQ};
    for (int i = 0; i < 6; i++) dm_free(hs[i]), dev->free(ds[i]);
}

/* early exit's rows: every third token of the first sequences active */
static void check_attention_rows(int B, int T, int C, int NH)
{
    int *rows = dm_alloc((size_t)B * T * sizeof(int)), n = 0;
    for (int i = 0; i < (B - 1) * T; i++)
        if (i % 3 != 1) rows[n++] = i;
    long BTC = (long)B * T * C, tt = (long)B * NH * T * T, NC = (long)n * C;
    float *q = host(NC, 1), *kv = host(2 * BTC, 1), *dy = host(NC, 1), *out = host(NC, 0);
    float *att = host(tt, 0), *scratch = host(tt, 0), *dq = host(NC, 0), *dkv = host(2 * BTC, 0);
    int *R = up(rows, (size_t)n * 4 + 4);
    float *Q = up(q, NC * 4), *KV = up(kv, 2 * BTC * 4), *DY = up(dy, NC * 4);
    float *O = up(out, NC * 4), *A = up(att, tt * 4), *S = up(scratch, tt * 4);
    float *DQ = up(dq, NC * 4), *DKV = up(dkv, 2 * BTC * 4);
    cpu->attention_forward_rows(out, att, q, kv, rows, n, B, T, C, NH);
    dev->attention_forward_rows(O, A, Q, KV, R, n, B, T, C, NH);
    compare("attention_forward_rows out", O, out, NC);
    cpu->attention_backward_rows(dq, dkv, scratch, dy, q, kv, att, rows, n, B, T, C, NH);
    dev->attention_backward_rows(DQ, DKV, S, DY, Q, KV, A, R, n, B, T, C, NH);
    compare("attention_backward_rows dq", DQ, dq, NC);
    compare("attention_backward_rows dkv", DKV, dkv, 2 * BTC);
    float *hs[] = {q, kv, dy, out, att, scratch, dq, dkv}, *ds[] = {Q, KV, DY, O, A, S, DQ, DKV};
    for (int i = 0; i < 8; i++) dm_free(hs[i]), dev->free(ds[i]);
    dm_free(rows), dev->free(R);
}

static void check_elementwise(long N)
{
    float *x = host(N, 4), *y = host(N, 1), *out = host(N, 0);
    float *X = up(x, N * 4), *Y = up(y, N * 4), *O = up(out, N * 4);
    cpu->gelu_forward(out, x, N);
    dev->gelu_forward(O, X, N);
    compare("gelu_forward", O, out, N);
    cpu->gelu_backward(out, x, y, N);
    dev->gelu_backward(O, X, Y, N);
    compare("gelu_backward", O, out, N);
    cpu->residual_forward(out, x, y, N);
    dev->residual_forward(O, X, Y, N);
    compare("residual_forward", O, out, N);
    float *p = host(N, 0.1f), *g = host(N, 1), *m = host(N, 0), *v = host(N, 0);
    float *P = up(p, N * 4), *G = up(g, N * 4), *Md = up(m, N * 4), *V = up(v, N * 4);
    for (int t = 1; t <= 3; t++) {
        cpu->adamw_update(p, g, m, v, N, 1e-3f * t, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
        dev->adamw_update(P, G, Md, V, N, 1e-3f * t, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
    }
    compare("adamw_update params (3 steps)", P, p, N);
    compare("adamw_update v", V, v, N);
    float *hs[] = {x, y, out, p, g, m, v}, *ds[] = {X, Y, O, P, G, Md, V};
    for (int i = 0; i < 7; i++) dm_free(hs[i]), dev->free(ds[i]);
}

static void check_embedding_loss_rows(int B, int T, int C, int V)
{
    int N = B * T;
    long NC = (long)N * C, NV = (long)N * V;
    int *tok = dm_alloc((size_t)N * sizeof(int)), *rows = dm_alloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) tok[i] = (i * 13 + i / 7) % V, rows[i] = (i * 5) % N;
    int n = N / 5;   /* rows (i*5) % N for i < N/5 are distinct */
    float *wte = host((long)V * C, 1), *wpe = host((long)T * C, 1), *out = host(NC, 0);
    float *dwte = host((long)V * C, 1), *dwpe = host((long)T * C, 1), *dy = host(NC, 1);
    float *logits = host(NV, 5), *probs = host(NV, 0), *loss = host(N, 0), *compact = host(NC, 0);
    int *TOK = up(tok, N * 4), *ROWS = up(rows, N * 4);
    float *WTE = up(wte, V * C * 4L), *WPE = up(wpe, T * C * 4L), *O = up(out, NC * 4);
    float *DWTE = up(dwte, V * C * 4L), *DWPE = up(dwpe, T * C * 4L), *DY = up(dy, NC * 4);
    float *L = up(logits, NV * 4), *P = up(probs, NV * 4), *LS = up(loss, N * 4);
    float *CP = up(compact, NC * 4);
    cpu->encoder_forward(out, tok, wte, wpe, B, T, C);
    dev->encoder_forward(O, TOK, WTE, WPE, B, T, C);
    compare("encoder_forward", O, out, NC);
    cpu->encoder_backward(dwte, dwpe, dy, tok, B, T, C);
    dev->encoder_backward(DWTE, DWPE, DY, TOK, B, T, C);
    compare("encoder_backward dwte", DWTE, dwte, (long)V * C);
    compare("encoder_backward dwpe", DWPE, dwpe, (long)T * C);
    cpu->crossentropy_forward(loss, probs, logits, tok, N, V);
    dev->crossentropy_forward(LS, P, L, TOK, N, V);
    compare("crossentropy_forward losses", LS, loss, N);
    compare("crossentropy_forward probs", P, probs, NV);
    cpu->crossentropy_softmax_backward(probs, probs, tok, 0.25f, N, V);
    dev->crossentropy_softmax_backward(P, P, TOK, 0.25f, N, V);
    compare("crossentropy_softmax_backward", P, probs, NV);
    cpu->rows_gather(compact, dy, rows, n, C);
    dev->rows_gather(CP, DY, ROWS, n, C);
    compare("rows_gather", CP, compact, (long)n * C);
    cpu->rows_scatter(out, compact, rows, n, C, 1);
    dev->rows_scatter(O, CP, ROWS, n, C, 1);
    compare("rows_scatter add", O, out, NC);
    float *hs[] = {wte, wpe, out, dwte, dwpe, dy, logits, probs, loss, compact};
    float *ds[] = {WTE, WPE, O, DWTE, DWPE, DY, L, P, LS, CP};
    for (int i = 0; i < 10; i++) dm_free(hs[i]), dev->free(ds[i]);
    dm_free(tok), dm_free(rows), dev->free(TOK), dev->free(ROWS);
}

/* early exit's confidences of n of the N tokens: the softmax's from
 * probabilities, the saturation's from the rows of in and out */
static void check_exit_confidence(int N, int C, int V)
{
    int n = N / 3, *rows = dm_alloc((size_t)n * sizeof(int));
    for (int k = 0; k < n; k++) rows[k] = (k * 3 + 1) % N;
    long NC = (long)N * C;
    float *probs = host((long)n * V, 1), *in = host(NC, 1), *out = host(NC, 1);
    float *soft = host(n, 0), *sat = host(n, 0);
    for (long i = 0; i < (long)n * V; i++) probs[i] = fabsf(probs[i]);
    int *ROWS = up(rows, n * 4L);
    float *P = up(probs, n * V * 4L), *IN = up(in, NC * 4), *OUT = up(out, NC * 4);
    float *SOFT = up(soft, n * 4L), *SAT = up(sat, n * 4L);
    cpu->exit_softmax_confidence(soft, probs, n, V);
    dev->exit_softmax_confidence(SOFT, P, n, V);
    compare("exit_softmax_confidence", SOFT, soft, n);
    cpu->exit_saturation_confidence(sat, in, out, rows, n, C);
    dev->exit_saturation_confidence(SAT, IN, OUT, ROWS, n, C);
    compare("exit_saturation_confidence", SAT, sat, n);
    float *hs[] = {probs, in, out, soft, sat}, *ds[] = {P, IN, OUT, SOFT, SAT};
    for (int i = 0; i < 5; i++) dm_free(hs[i]), dev->free(ds[i]);
    dm_free(rows), dev->free(ROWS);
}

/* MoE's combine, its backward and the dispatch's backward over a
 * routing of N tokens' k slots: every 7th pair dropped, the kept pairs'
 * rows in reverse order */
static void check_moe(int N, int k, int C)
{
    int P = N * k, R = 0, *row = dm_alloc((size_t)P * sizeof(int));
    for (int p = 0; p < P; p++) R += p % 7 != 5;
    for (int p = 0, r = R; p < P; p++) row[p] = p % 7 == 5 ? -1 : --r;
    long NC = (long)N * C, RC = (long)R * C;
    float *res1 = host(NC, 1), *y = host(RC, 1), *gate = host(P, 1), *dout = host(NC, 1);
    float *dx = host(RC, 1), *out = host(NC, 0), *dy = host(RC, 0), *dgate = host(P, 0);
    float *dln2 = host(NC, 0);
    int *ROW = up(row, P * 4L);
    float *RES1 = up(res1, NC * 4), *Y = up(y, RC * 4), *GATE = up(gate, P * 4L);
    float *DOUT = up(dout, NC * 4), *DX = up(dx, RC * 4), *OUT = up(out, NC * 4);
    float *DY = up(dy, RC * 4), *DGATE = up(dgate, P * 4L), *DLN2 = up(dln2, NC * 4);
    cpu->routed_combine_forward(out, res1, y, gate, row, N, k, C);
    dev->routed_combine_forward(OUT, RES1, Y, GATE, ROW, N, k, C);
    compare("routed_combine_forward", OUT, out, NC);
    cpu->routed_combine_backward(dy, dgate, dout, y, gate, row, N, k, C);
    dev->routed_combine_backward(DY, DGATE, DOUT, Y, GATE, ROW, N, k, C);
    compare("routed_combine_backward dy", DY, dy, RC);
    compare("routed_combine_backward dgate", DGATE, dgate, P);
    cpu->routed_dispatch_backward(dln2, dx, row, N, k, C);
    dev->routed_dispatch_backward(DLN2, DX, ROW, N, k, C);
    compare("routed_dispatch_backward", DLN2, dln2, NC);
    float *hs[] = {res1, y, gate, dout, dx, out, dy, dgate, dln2};
    float *ds[] = {RES1, Y, GATE, DOUT, DX, OUT, DY, DGATE, DLN2};
    for (int i = 0; i < 9; i++) dm_free(hs[i]), dev->free(ds[i]);
    dm_free(row), dev->free(ROW);
}

/* The device's doubles d (n) against want, relative to the largest */
static void compare_doubles(const char *op, const double *d, const double *want, long n)
{
    double *got = dm_alloc((size_t)n * sizeof(double)), worst = 0.0, scale = 0.0;
    dev->synchronize();
    dev->copy_to_host(got, d, (size_t)n * sizeof(double));
    for (long i = 0; i < n; i++) {
        double diff = fabs(got[i] - want[i]);
        worst = diff > worst || isnan(diff) ? diff : worst;
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    double rel = scale > 0 ? worst / scale : worst;
    failures += !(rel <= 1e-4);
    checked++;
    printf("  %-40s %9.2e %s\n", op, rel, rel <= 1e-4 ? "ok" : "FAIL (tol 1e-4)");
    dm_free(got);
}

/* MoE's routing (softmax, or sigmoid with a bias): the forward from the
 * same logits; the sums and the backward from the CPU's forward, so that
 * each op is checked on the same inputs. */
static void check_moe_route(int N, int E, int k, int sigmoid)
{
    long NE = (long)N * E, NK = (long)N * k;
    float *logits = host(NE, 3), *bias = host(E, 0.5f), *dgate = host(NK, 1);
    float *scores = host(NE, 0), *lse = host(N, 0), *cscore = host(NK, 0), *gate = host(NK, 0);
    int *choice = dm_alloc((size_t)NK * sizeof(int)), *selected = dm_alloc((size_t)E * sizeof(int));
    float *LOGITS = up(logits, NE * 4), *BIAS = up(bias, E * 4L), *SCORES = up(scores, NE * 4);
    float *LSE = up(lse, N * 4L), *CSCORE = up(cscore, NK * 4), *GATE = up(gate, NK * 4);
    int *CHOICE = up(choice, NK * 4);
    cpu->route_topk_forward(scores, lse, choice, cscore, gate, logits, bias, N, E, k, sigmoid);
    dev->route_topk_forward(SCORES, LSE, CHOICE, CSCORE, GATE, LOGITS, BIAS, N, E, k, sigmoid);
    const char *what = sigmoid ? "route_topk_forward (sigmoid)" : "route_topk_forward (softmax)";
    char name[64];
    snprintf(name, sizeof name, "%s scores", what);
    compare(name, SCORES, scores, NE);
    snprintf(name, sizeof name, "%s gates", what);
    compare(name, GATE, gate, NK);
    snprintf(name, sizeof name, "%s choice", what);
    compare_ints(name, CHOICE, choice, NK);
    compare("route_topk_forward lse", LSE, lse, N);
    /* the CPU's forward on the device for the ops after it */
    dev->copy_to_device(SCORES, scores, (size_t)NE * 4);
    dev->copy_to_device(LSE, lse, (size_t)N * 4);
    dev->copy_to_device(CHOICE, choice, (size_t)NK * 4);
    dev->copy_to_device(GATE, gate, (size_t)NK * 4);
    double *sums = dm_alloc((size_t)(E + 1) * sizeof(double));
    double *SUMS = dev->alloc((size_t)(E + 1) * sizeof(double));
    cpu->route_topk_sums(sums, scores, lse, N, E, sigmoid);
    dev->route_topk_sums(SUMS, SCORES, LSE, N, E, sigmoid);
    compare_doubles("route_topk_sums", SUMS, sums, E + 1);
    for (int e = 0; e < E; e++) selected[e] = 0;
    for (long p = 0; p < NK; p++) selected[choice[p]]++;
    int *SELECTED = up(selected, E * 4L);
    float *DGATE = up(dgate, NK * 4), *dlogits = host(NE, 0), *DLOGITS = up(dlogits, NE * 4);
    cpu->route_topk_backward(dlogits, dgate, logits, scores, lse, choice, gate, selected, N, E, k,
                            sigmoid, 0.01, 0.001);
    dev->route_topk_backward(DLOGITS, DGATE, LOGITS, SCORES, LSE, CHOICE, GATE, SELECTED, N, E, k,
                            sigmoid, 0.01, 0.001);
    compare(sigmoid ? "route_topk_backward (sigmoid)" : "route_topk_backward (softmax)", DLOGITS,
            dlogits, NE);
    float *hs[] = {logits, bias, dgate, scores, lse, cscore, gate, dlogits};
    float *ds[] = {LOGITS, BIAS, DGATE, SCORES, LSE, CSCORE, GATE, DLOGITS};
    for (int i = 0; i < 8; i++) dm_free(hs[i]), dev->free(ds[i]);
    dm_free(choice), dm_free(selected), dm_free(sums);
    dev->free(CHOICE), dev->free(SELECTED), dev->free(SUMS);
}

/* Pruning: one round's histogram at the first and a last round (over a
 * prefix that some weights share), accumulating onto counts already
 * there, and the masking by a cut inside the weights; the same counts,
 * mask and bits as the CPU's. */
static void check_prune(long n)
{
    unsigned base = 77777;
    float *w = host(n, 1);
    for (long i = 0; i < n; i += 7) w[i] = w[i / 7 * 3];   /* ties */
    long chunks = (n + DM_PRUNE_CHUNK - 1) / DM_PRUNE_CHUNK;
    long counts[DM_PRUNE_BUCKETS], got[DM_PRUNE_BUCKETS];
    float *W = up(w, (size_t)n * 4);
    long *COUNTS = dev->alloc(sizeof counts), *PARTIAL = dev->alloc((size_t)chunks * sizeof counts);
    const int shifts[2] = {56, 0};
    for (int r = 0; r < 2; r++) {
        uint64_t prefix = block_prune_key(w[5], base + 5) & (r ? ~(uint64_t)0 << 8 : 0);
        for (int b = 0; b < DM_PRUNE_BUCKETS; b++) counts[b] = b;
        dev->copy_to_device(COUNTS, counts, sizeof counts);
        cpu->prune_histogram(counts, NULL, w, n, base, prefix, shifts[r]);
        dev->prune_histogram(COUNTS, PARTIAL, W, n, base, prefix, shifts[r]);
        dev->synchronize();
        dev->copy_to_host(got, COUNTS, sizeof got);
        int same = memcmp(got, counts, sizeof got) == 0;
        failures += !same;
        checked++;
        printf("  %-40s %9s %s\n", r ? "prune_histogram (last round)" : "prune_histogram (first round)",
               "", same ? "ok (equal)" : "FAIL (differ)");
    }
    float *slab[4], *SLAB[4];
    for (int k = 0; k < 4; k++) {
        slab[k] = k ? host(n, 1) : w;
        SLAB[k] = up(slab[k], (size_t)n * 4);
    }
    unsigned char *mask = dm_alloc((size_t)n), *mask_got = dm_alloc((size_t)n), *MASK = dev->alloc((size_t)n);
    uint64_t cut = block_prune_key(w[n / 2], base + (unsigned)(n / 2));
    cpu->prune_mask(mask, slab[0], slab[1], slab[2], slab[3], n, base, cut);
    dev->prune_mask(MASK, SLAB[0], SLAB[1], SLAB[2], SLAB[3], n, base, cut);
    const char *names[4] = {"prune_mask params", "prune_mask grads", "prune_mask m", "prune_mask v"};
    for (int k = 0; k < 4; k++) compare_within(names[k], SLAB[k], slab[k], n, 0.0);
    dev->copy_to_host(mask_got, MASK, (size_t)n);
    int same = memcmp(mask_got, mask, (size_t)n) == 0;
    failures += !same;
    checked++;
    printf("  %-40s %9s %s\n", "prune_mask mask", "", same ? "ok (equal)" : "FAIL (differ)");
    for (int k = 0; k < 4; k++) {
        if (k) dm_free(slab[k]);
        dev->free(SLAB[k]);
    }
    dm_free(w), dm_free(mask), dm_free(mask_got);
    dev->free(W), dev->free(COUNTS), dev->free(PARTIAL), dev->free(MASK);
}

static void check_sparse(int N, int C, int OC)
{
    int *row_ptr = dm_alloc((size_t)(OC + 1) * sizeof(int)), nnz = 0;
    int *col_idx = dm_alloc((size_t)OC * C * sizeof(int));
    float *values = dm_alloc((size_t)OC * C * sizeof(float));
    for (int o = 0; o < OC; o++) {
        row_ptr[o] = nnz;
        for (int c = 0; c < C; c++)
            if (draw() > 0.4f) col_idx[nnz] = c, values[nnz++] = draw();
    }
    row_ptr[OC] = nnz;
    long NC = (long)N * C, NO = (long)N * OC, W = (long)OC * C;
    float *x = host(NC, 1), *b = host(OC, 1), *dy = host(NO, 1), *out = host(NO, 0);
    float *dx = host(NC, 0), *dw = host(W, 1), *db = host(OC, 1);
    int *RP = up(row_ptr, (OC + 1) * 4L), *CI = up(col_idx, nnz * 4L + 4);
    float *VA = up(values, nnz * 4L + 4), *X = up(x, NC * 4), *Bd = up(b, OC * 4);
    float *DY = up(dy, NO * 4), *O = up(out, NO * 4), *DX = up(dx, NC * 4);
    float *DW = up(dw, W * 4), *DB = up(db, OC * 4);
    cpu->sparse_matmul_forward(out, x, row_ptr, col_idx, values, b, N, C, OC);
    dev->sparse_matmul_forward(O, X, RP, CI, VA, Bd, N, C, OC);
    compare("sparse_matmul_forward", O, out, NO);
    cpu->sparse_matmul_backward(dx, dw, db, dy, x, row_ptr, col_idx, values, nnz, N, C, OC);
    dev->sparse_matmul_backward(DX, DW, DB, DY, X, RP, CI, VA, nnz, N, C, OC);
    compare("sparse_matmul_backward dinp", DX, dx, NC);
    compare("sparse_matmul_backward dweight", DW, dw, W);
    compare("sparse_matmul_backward dbias", DB, db, OC);
    float *hs[] = {x, b, dy, out, dx, dw, db, values}, *ds[] = {X, Bd, DY, O, DX, DW, DB, VA};
    for (int i = 0; i < 8; i++) dm_free(hs[i]), dev->free(ds[i]);
    dm_free(row_ptr), dm_free(col_idx), dev->free(RP), dev->free(CI);
}

static void check_mod(int B, int T, int C, int k, int H)
{
    int N = B * T;
    float *in = host((long)N * C, 1), *w = host(C, 1), *router = host(N, 0);
    int *chosen = dm_alloc((size_t)N * sizeof(int)), *got = dm_alloc((size_t)N * sizeof(int));
    float *IN = up(in, (size_t)N * C * 4), *Wd = up(w, C * 4), *R = up(router, N * 4);
    int *CH = up(chosen, N * 4);
    cpu->mod_router_forward(router, in, w, N, C);
    dev->mod_router_forward(R, IN, Wd, N, C);
    compare("mod_router_forward", R, router, N);
    dev->copy_to_device(R, router, N * 4);   /* the same values for the choice */
    cpu->mod_select_topk(chosen, router, B, T, k);
    dev->mod_select_topk(CH, R, B, T, k);
    dev->synchronize();
    dev->copy_to_host(got, CH, N * 4);
    int differ = 0;
    for (int i = 0; i < N; i++) differ += got[i] != chosen[i];
    failures += differ != 0;
    checked++;
    printf("  %-40s %9d %s\n", "mod_select_topk (choices differing)", differ,
           differ ? "FAIL (want 0)" : "ok");
    int *target = dm_alloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) target[i] = chosen[i];
    int *TG = up(target, N * 4);
    long P = mod_predictor_params(C, H);   /* the MLP predictor of hidden width H */
    float *pw = host(P, 0.3f), *dw = host(P, 1), *PW = up(pw, P * 4), *DW = up(dw, P * 4);
    float loss = cpu->mod_predictor_forward_backward(dw, 0.5f, chosen, in, pw, target, N, C, H);
    float dloss = dev->mod_predictor_forward_backward(DW, 0.5f, CH, IN, PW, TG, N, C, H);
    compare_host("mod_predictor loss", &dloss, &loss, 1);
    compare("mod_predictor dweight", DW, dw, P);
    compare_ints("mod_predictor chosen", CH, chosen, N);
    dm_free(in), dm_free(w), dm_free(router), dm_free(chosen), dm_free(got), dm_free(target);
    dm_free(dw), dm_free(pw), dev->free(TG), dev->free(DW), dev->free(PW);
    dev->free(IN), dev->free(Wd), dev->free(R), dev->free(CH);
}

/* The block over the chosen tokens: every other row of N packed, the
 * combination forward, the backward's scale and combination */
static void check_mod_combine(int N, int C)
{
    int *rows = dm_alloc((size_t)N * sizeof(int)), n = 0;
    for (int i = 0; i < N; i++)
        if (i % 4 != 1) rows[n++] = i;
    long NC = (long)N * C, nC = (long)n * C;
    float *x = host(nC, 1), *f = host(nC, 1), *router = host(N, 1), *w = host(C, 1);
    float *out = host(NC, 1), *din = host(NC, 1), *g = host(nC, 1), *dw = host(C, 1);
    float *work = host(nC, 0);
    int *ROWS = up(rows, (size_t)N * 4);
    float *X = up(x, nC * 4), *F = up(f, nC * 4), *R = up(router, N * 4), *Wd = up(w, C * 4);
    float *O = up(out, NC * 4), *DIN = up(din, NC * 4), *G = up(g, nC * 4);
    float *DW = up(dw, C * 4), *WORK = up(work, nC * 4);
    cpu->mod_combine_forward(out, x, f, router, rows, n, C);
    dev->mod_combine_forward(O, X, F, R, ROWS, n, C);
    compare("mod_combine_forward", O, out, NC);
    cpu->mod_scale_chosen(work, din, router, rows, n, C);
    dev->mod_scale_chosen(WORK, DIN, R, ROWS, n, C);
    compare("mod_scale_chosen", WORK, work, nC);
    cpu->mod_combine_backward(din, dw, x, f, g, router, w, rows, n, C);
    dev->mod_combine_backward(DIN, DW, X, F, G, R, Wd, ROWS, n, C);
    compare("mod_combine_backward din", DIN, din, NC);
    compare("mod_combine_backward drouter_weight", DW, dw, C);
    float *hs[] = {x, f, router, w, out, din, g, dw, work};
    float *ds[] = {X, F, R, Wd, O, DIN, G, DW, WORK};
    for (int i = 0; i < 9; i++) dm_free(hs[i]), dev->free(ds[i]);
    dm_free(rows), dev->free(ROWS);
}

static void check_hash(int B, int T, int C, int NH, int buckets)
{
    int hs = C / NH;
    long BTC = (long)B * T * C, bhT = (long)B * NH * T, R = (long)NH * hs * (buckets / 2) + 1;
    float *qkv = host(3 * BTC, 1), *dy = host(BTC, 1), *rot = host(R, 0);
    hash_rotation_draw(rot, NH, hs, buckets, 42, 3, 7);
    float *out = host(BTC, 0), *lse = host(bhT, 0), *dqkv = host(3 * BTC, 0);
    int *order = dm_alloc(2 * bhT * sizeof(int)), *bucket = dm_alloc(2 * bhT * sizeof(int));
    float *Q = up(qkv, 3 * BTC * 4), *DY = up(dy, BTC * 4), *RO = up(rot, R * 4);
    float *O = up(out, BTC * 4), *L = up(lse, bhT * 4), *DQ = up(dqkv, 3 * BTC * 4);
    int *OR = up(order, 2 * bhT * 4), *BU = up(bucket, 2 * bhT * 4);
    long alone = 0, dalone = 0;
    long tiles = cpu->group_attention_forward(out, lse, order, bucket, &alone, qkv, rot, B, T, C,
                                              NH, buckets);
    long dtiles = dev->group_attention_forward(O, L, OR, BU, &dalone, Q, RO, B, T, C, NH,
                                               buckets);
    compare_ints("hash buckets", BU, bucket, 2 * bhT);
    compare_ints("hash orders", OR, order, 2 * bhT);
    compare("group_attention_forward out", O, out, BTC);
    compare("group_attention_forward lse", L, lse, bhT);
    cpu->group_attention_backward(dqkv, dy, qkv, out, lse, order, bucket, B, T, C, NH);
    long btiles = dev->group_attention_backward(DQ, DY, Q, O, L, OR, BU, B, T, C, NH);
    compare("group_attention_backward dqkv", DQ, dqkv, 3 * BTC);
    int ok = dtiles == tiles && btiles == tiles;
    failures += !ok;
    checked++;
    printf("  %-40s %9ld %s\n", "hash tiles visited", dtiles, ok ? "ok (the CPU's)" : "FAIL");
    ok = dalone == alone;
    failures += !ok;
    checked++;
    printf("  %-40s %9ld %s\n", "hash queries with their own key alone", dalone,
           ok ? "ok (the CPU's)" : "FAIL");
    float *hs_[] = {qkv, dy, rot, out, lse, dqkv}, *ds[] = {Q, DY, RO, O, L, DQ};
    for (int i = 0; i < 6; i++) dm_free(hs_[i]), dev->free(ds[i]);
    dm_free(order), dm_free(bucket), dev->free(OR), dev->free(BU);
}

/* the device result d differs from the unrounded reference want by more
 * than least, relative to want's largest magnitude */
static void compare_differs(const char *op, const float *d, const float *want, long n,
                            double least)
{
    float *got = dm_alloc((size_t)n * sizeof(float));
    dev->copy_to_host(got, d, (size_t)n * sizeof(float));
    double worst = 0.0, scale = 0.0;
    for (long i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]);
        worst = diff > worst ? diff : worst;
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    double rel = scale > 0 ? worst / scale : worst;
    failures += !(rel > least);
    checked++;
    printf("  %-40s %9.2e %s\n", op, rel, rel > least ? "ok (rounded)" : "FAIL (not rounded?)");
    dm_free(got);
}

/* x's n values rounded as `precision`'s product operands (a new buffer) */
static float *rounded(const float *x, long n, int precision)
{
    float *r = dm_alloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) r[i] = dm_round_operand(x[i], precision);
    return r;
}

/* The device's products with train.precision's operands against the CPU's
 * fp32 products of operands rounded the same way (products of such
 * operands are exact in fp32: only the order of the sums differs). bf16
 * within 1e-4: the plugin rounds to nearest even as this reference does.
 * tf32 within 1e-3: cuBLAS does not say how TF32 rounds (truncation would
 * move each operand by up to one TF32 ulp, 2^-10). The device's forward
 * product must differ from the fp32 product of the unrounded operands by
 * more than `applied`: the rounding took place. */
static void check_precision(int precision, double tol, double applied, int N, int C, int OC)
{
    const char *name = backend_precision_name((enum dm_precision)precision);
    long NC = (long)N * C, NO = (long)N * OC, W = (long)OC * C;
    float *x = host(NC, 1), *w = host(W, 0.1f), *b = host(OC, 1), *dy = host(NO, 1);
    float *rx = rounded(x, NC, precision), *rw = rounded(w, W, precision);
    float *rdy = rounded(dy, NO, precision), *out = host(NO, 0), *dx = host(NC, 0);
    float *dw = host(W, 0), *X = up(x, NC * 4), *Wd = up(w, W * 4), *Bd = up(b, OC * 4);
    float *DY = up(dy, NO * 4), *O = up(out, NO * 4), *DX = up(dx, NC * 4), *DW = up(dw, W * 4);
    backend_set_precision((enum dm_precision)precision);
    dev->matmul_forward(O, X, Wd, Bd, N, C, OC);
    dev->matmul_backward_overwrite(DX, DW, NULL, DY, X, Wd, N, C, OC);
    dev->synchronize();
    backend_set_precision(DM_PRECISION_FP32);
    char op[64];
    cpu->matmul_forward(out, x, w, b, N, C, OC);
    snprintf(op, sizeof op, "matmul_forward %s vs fp32 (> %.0e)", name, applied);
    compare_differs(op, O, out, NO, applied);
    cpu->matmul_forward(out, rx, rw, b, N, C, OC);
    snprintf(op, sizeof op, "matmul_forward, %s operands", name);
    compare_within(op, O, out, NO, tol);
    cpu->matmul_backward_overwrite(dx, dw, NULL, rdy, rx, rw, N, C, OC);
    snprintf(op, sizeof op, "matmul_backward dinp, %s operands", name);
    compare_within(op, DX, dx, NC, tol);
    snprintf(op, sizeof op, "matmul_backward dweight, %s operands", name);
    compare_within(op, DW, dw, W, tol);
    float *hs_[] = {x, w, b, dy, rx, rw, rdy, out, dx, dw}, *ds[] = {X, Wd, Bd, DY, O, DX, DW};
    for (int i = 0; i < 10; i++) dm_free(hs_[i]);
    for (int i = 0; i < 7; i++) dev->free(ds[i]);
}

/* check_ops emulate --host-read: the host reads a device tensor, which
 * the strict emulated device must stop (tests/t_device_memory.sh expects
 * the process to die naming a host read of device memory). */
static int host_read(void)
{
    float *D = dev->alloc(64 * sizeof(float));
    printf("check_ops: reading device memory at %p on the host\n", (void *)D);
    fflush(stdout);
    volatile float x = D[3];
    printf("check_ops: the host read %g from device memory: nothing trapped it\n", x);
    return 1;
}

/* check_ops emulate --host-pointer: an op handed host memory, which the
 * strict emulated device must refuse (a GPU kernel could not read it). */
static int host_pointer(void)
{
    float *x = host(64, 1), *out = host(64, 0);
    printf("check_ops: gelu_forward on host memory %p\n", (void *)x);
    fflush(stdout);
    dev->gelu_forward(out, x, 64);
    printf("check_ops: the op ran on host memory: nothing refused it\n");
    return 1;
}

int main(int argc, char **argv)
{
    int read_test = argc == 3 && !strcmp(argv[2], "--host-read");
    int pointer_test = argc == 3 && !strcmp(argv[2], "--host-pointer");
    if ((argc != 2 && !read_test && !pointer_test) ||
        (strcmp(argv[1], "cpu") && strcmp(argv[1], "cuda") && strcmp(argv[1], "emulate"))) {
        fprintf(stderr, "usage: check_ops cpu|cuda|emulate [--host-read | --host-pointer]\n");
        return 2;
    }
    dm_threads_init(0);
    char err[1024];
    if (backend_open(argv[1], 0, 1, err, sizeof err) != 0) {
        fprintf(stderr, "check_ops: FAILED: %s\n", err);
        return 1;
    }
    dev = backend_current();
    cpu = backend_cpu();
    if (read_test) return host_read();
    if (pointer_test) return host_pointer();
    printf("check_ops: %s (%s) against the CPU backend\n", dev->name, dev->device);
    check_staging(1 << 20);
    check_memory_ops(100003);
    check_matmul(256, 128, 384);
    check_matmul(100, 96, 40);
    check_layernorm(300, 128);
    check_attention(2, 64, 128, 4);
    check_attention(1, 45, 24, 3);
    check_attention_rows(3, 64, 128, 4);
    check_hash(2, 256, 128, 4, 8);
    check_elementwise(100003);
    check_embedding_loss_rows(4, 64, 96, 256);
    check_exit_confidence(256, 96, 256);
    check_moe(256, 2, 96);
    check_moe_route(256, 16, 2, 0);
    check_moe_route(200, 8, 3, 1);
    check_moe_route(256, 16, 1, 0);   /* top-1: the gate is the chosen score */
    check_moe_route(200, 8, 1, 1);
    check_prune(3 * DM_PRUNE_CHUNK + 1001);
    check_sparse(200, 64, 192);
    check_mod(4, 128, 96, 16, 32);
    check_mod_combine(512, 96);
    if (strcmp(dev->name, "cpu") != 0) {   /* the CPU multiplies in fp32 only */
        check_precision(DM_PRECISION_BF16, 1e-4, 1e-4, 256, 128, 384);
        check_precision(DM_PRECISION_TF32, 1e-3, 1e-6, 100, 96, 40);
    }
    printf("check_ops: %d of %d checks failed\n", failures, checked);
    return failures ? 1 : 0;
}
