/* test_ops: every op of model.h, forward and backward, a whole block and
 * the whole model, against naive double-precision references written here
 * from the definitions (not from ops.c).
 *
 * Forward: the fp32 op against the double reference.
 * Backward: the fp32 analytic gradient of L = sum(R * f(x)), R random,
 * against double-precision central differences of the double reference
 * (h = 1e-5 * max(1, |x|); truncation and rounding error of the difference
 * are below 1e-8, so the difference measures the fp32 op alone).
 * Tolerances (per element: |got - want| <= atol + rtol * |want|) are stated
 * at each check; every check prints the largest absolute and relative
 * differences it saw. DYNMO_OP_TIMING=1 also prints per-op times at the
 * reference shapes (B 8, T 256, C 256, NH 4). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/model.h"
#include "testing.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t next_stream = 1000;

static float *new_floats(long n) { return dm_alloc((size_t)(n ? n : 1) * sizeof(float)); }
static double *new_doubles(long n) { return dm_alloc((size_t)(n ? n : 1) * sizeof(double)); }

static void fill_normal(float *x, long n, float mean, float std)
{
    uint64_t stream = next_stream++;
    for (long i = 0; i < n; i++) x[i] = mean + std * dm_normal(42, stream, (uint64_t)i);
}

static float *random_floats(long n, float mean, float std)
{
    float *x = new_floats(n);
    fill_normal(x, n, mean, std);
    return x;
}

static double *to_doubles(const float *x, long n)
{
    double *d = new_doubles(n);
    for (long i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* Checks |got - want| <= atol + rtol * |want| for every element and
 * prints the largest differences (relative ones over elements with
 * |want| >= 1e-3 max|want|, where a relative difference means something). */
static void compare(const char *what, const float *got, const double *want, long n,
                    double atol, double rtol)
{
    double max_want = 0.0, max_abs = 0.0, max_rel = 0.0;
    for (long i = 0; i < n; i++) max_want = fmax(max_want, fabs(want[i]));
    long bad = 0, first_bad = -1;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= atol + rtol * fabs(want[i]))) {
            if (first_bad < 0) first_bad = i;
            bad++;
        }
        max_abs = fmax(max_abs, d);
        if (fabs(want[i]) >= 1e-3 * max_want && want[i] != 0.0)
            max_rel = fmax(max_rel, d / fabs(want[i]));
    }
    printf("  %-44s n=%-6ld max|want| %.2e  max abs diff %.2e  max rel diff %.2e"
           "  (atol %.0e, rtol %.0e)\n", what, n, max_want, max_abs, max_rel, atol, rtol);
    CHECK_MSG(bad == 0, "%s: %ld of %ld elements out of tolerance; first [%ld] got %.9g want %.9g",
              what, bad, n, first_bad, first_bad >= 0 ? got[first_bad] : 0.0,
              first_bad >= 0 ? want[first_bad] : 0.0);
}

static void check_bitwise(const char *what, const float *a, const float *b, long n)
{
    CHECK_MSG(memcmp(a, b, (size_t)n * sizeof(float)) == 0, "%s: results differ", what);
}

/* Central differences of loss(ctx) wrt x[0..n) (every stride-th element),
 * compared with the analytic gradient analytic[0..n) plus base (the
 * value the gradient buffer held before an accumulating backward; NULL
 * for 0). */
typedef double (*loss_fn)(void *ctx);

static void fd_check(const char *what, loss_fn loss, void *ctx, double *x, long n, long stride,
                     const float *analytic, const float *base, double atol, double rtol)
{
    long m = (n + stride - 1) / stride;
    float *got = new_floats(m);
    double *want = new_doubles(m);
    for (long k = 0, i = 0; i < n; i += stride, k++) {
        double old = x[i], h = 1e-5 * fmax(1.0, fabs(old));
        x[i] = old + h;
        double lp = loss(ctx);
        x[i] = old - h;
        double lm = loss(ctx);
        x[i] = old;
        want[k] = (lp - lm) / (2 * h) + (base ? base[i] : 0.0);
        got[k] = analytic[i];
    }
    compare(what, got, want, m, atol, rtol);
    dm_free(got);
    dm_free(want);
}

static double dot(const double *a, const double *b, long n)
{
    double s = 0.0;
    for (long i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- double-precision references -------------------------------------------- */

static void ref_matmul(double *out, const double *inp, const double *w, const double *b,
                       int N, int C, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int c = 0; c < C; c++) s += inp[(long)n * C + c] * w[(long)o * C + c];
            out[(long)n * OC + o] = s;
        }
}

static void ref_layernorm(double *out, double *mean, double *rstd, const double *inp,
                          const double *w, const double *b, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *x = inp + (long)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++) out[(long)n * C + c] = (x[c] - m) * s * w[c] + b[c];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = s;
    }
}

static void ref_attention(double *out, double *att, const double *qkv, int B, int T, int C,
                          int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *row = new_doubles(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((long)b * T + i) * 3 * C + h * hs;
                double mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((long)b * T + j) * 3 * C + C + h * hs;
                    double s = 0.0;
                    for (int d = 0; d < hs; d++) s += q[d] * k[d];
                    row[j] = s * scale;
                    mx = fmax(mx, row[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) {
                    row[j] = exp(row[j] - mx);
                    sum += row[j];
                }
                double *o = out + ((long)b * T + i) * C + h * hs;
                for (int d = 0; d < hs; d++) o[d] = 0.0;
                for (int j = 0; j <= i; j++) {
                    double p = row[j] / sum;
                    if (att) att[(((long)b * NH + h) * T + i) * T + j] = p;
                    const double *v = qkv + ((long)b * T + j) * 3 * C + 2 * C + h * hs;
                    for (int d = 0; d < hs; d++) o[d] += p * v[d];
                }
            }
    dm_free(row);
}

/* 0.5 x (1 + tanh(u)), written as x / (1 + exp(-2u)) (the same function)
 * so that double precision keeps its relative accuracy in the negative
 * tail, where 1 + tanh(u) cancels. */
static double ref_gelu1(double x)
{
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}

static void ref_gelu(double *out, const double *inp, long n)
{
    for (long i = 0; i < n; i++) out[i] = ref_gelu1(inp[i]);
}

static void ref_encoder(double *out, const int *tokens, const double *wte, const double *wpe,
                        int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((long)b * T + t) * C + c] =
                    wte[(long)tokens[b * T + t] * C + c] + wpe[(long)t * C + c];
}

static void ref_crossentropy(double *losses, double *probs, const double *logits,
                             const int *targets, int N, int V)
{
    for (int n = 0; n < N; n++) {
        const double *l = logits + (long)n * V;
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) mx = fmax(mx, l[v]);
        for (int v = 0; v < V; v++) sum += exp(l[v] - mx);
        losses[n] = log(sum) - (l[targets[n]] - mx);
        if (probs)
            for (int v = 0; v < V; v++) probs[(long)n * V + v] = exp(l[v] - mx) / sum;
    }
}

/* One block, parameters in block order (model.h). */
static void ref_block(double *out, const double *in, const double *params, int B, int T,
                      int C, int NH)
{
    long N = (long)B * T;
    const double *p[BP_COUNT];
    for (int k = 0; k < BP_COUNT; k++) p[k] = params + block_tensor_offset(C, k);
    double *ln = new_doubles(N * C), *qkv = new_doubles(N * 3 * C),
           *atty = new_doubles(N * C), *res1 = new_doubles(N * C),
           *fch = new_doubles(N * 4 * C), *gl = new_doubles(N * 4 * C);
    ref_layernorm(ln, NULL, NULL, in, p[BP_LN1_W], p[BP_LN1_B], (int)N, C);
    ref_matmul(qkv, ln, p[BP_QKV_W], p[BP_QKV_B], (int)N, C, 3 * C);
    ref_attention(atty, NULL, qkv, B, T, C, NH);
    ref_matmul(res1, atty, p[BP_ATTPROJ_W], p[BP_ATTPROJ_B], (int)N, C, C);
    for (long i = 0; i < N * C; i++) res1[i] += in[i];
    ref_layernorm(ln, NULL, NULL, res1, p[BP_LN2_W], p[BP_LN2_B], (int)N, C);
    ref_matmul(fch, ln, p[BP_FC_W], p[BP_FC_B], (int)N, C, 4 * C);
    ref_gelu(gl, fch, N * 4 * C);
    ref_matmul(out, gl, p[BP_FCPROJ_W], p[BP_FCPROJ_B], (int)N, 4 * C, C);
    for (long i = 0; i < N * C; i++) out[i] += res1[i];
    dm_free(ln); dm_free(qkv); dm_free(atty); dm_free(res1); dm_free(fch); dm_free(gl);
}

/* The whole model's mean loss from flat parameters (canonical order);
 * logits (B,T,V) optional. */
static double ref_gpt(double *logits_out, const double *flat, const struct gpt_shape *s,
                      const int *tokens, const int *targets, int B, int T)
{
    int C = s->channels, V = s->vocab;
    long N = (long)B * T;
    const double *wte = flat, *wpe = wte + (long)V * C;
    const double *blocks = wpe + (long)s->max_seq * C;
    const double *lnf = blocks + (long)s->layers * block_param_count(C);
    double *x = new_doubles(N * C), *y = new_doubles(N * C), *logits = new_doubles(N * V),
           *losses = new_doubles(N);
    ref_encoder(x, tokens, wte, wpe, B, T, C);
    for (int l = 0; l < s->layers; l++) {
        ref_block(y, x, blocks + (long)l * block_param_count(C), B, T, C, s->heads);
        double *t = x; x = y; y = t;
    }
    ref_layernorm(y, NULL, NULL, x, lnf, lnf + C, (int)N, C);
    ref_matmul(logits, y, wte, NULL, (int)N, C, V);
    ref_crossentropy(losses, NULL, logits, targets, (int)N, V);
    double loss = 0.0;
    for (long n = 0; n < N; n++) loss += losses[n];
    if (logits_out) memcpy(logits_out, logits, (size_t)(N * V) * sizeof(double));
    dm_free(x); dm_free(y); dm_free(logits); dm_free(losses);
    return loss / N;
}

/* ---- matmul ------------------------------------------------------------------ */

struct matmul_ctx {
    double *inp, *w, *b, *R, *out;
    int N, C, OC;
};

static double matmul_loss(void *arg)
{
    struct matmul_ctx *c = arg;
    ref_matmul(c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
    return dot(c->out, c->R, (long)c->N * c->OC);
}

static void test_matmul(int N, int C, int OC, long stride)
{
    printf("matmul N=%d C=%d OC=%d\n", N, C, OC);
    long nin = (long)N * C, nw = (long)OC * C, nout = (long)N * OC;
    float *inp = random_floats(nin, 0, 1), *w = random_floats(nw, 0, 0.5f),
          *b = random_floats(OC, 0, 1), *R = random_floats(nout, 0, 1);
    struct matmul_ctx c = {to_doubles(inp, nin), to_doubles(w, nw), to_doubles(b, OC),
                           to_doubles(R, nout), new_doubles(nout), N, C, OC};
    float *out = new_floats(nout);
    /* forward: error ~ C * 6e-8 relative to sum |terms| */
    matmul_forward(out, inp, w, b, N, C, OC);
    ref_matmul(c.out, c.inp, c.w, c.b, N, C, OC);
    compare("forward (bias)", out, c.out, nout, 1e-5, 1e-5);
    matmul_forward(out, inp, w, NULL, N, C, OC);
    ref_matmul(c.out, c.inp, c.w, NULL, N, C, OC);
    compare("forward (no bias)", out, c.out, nout, 1e-5, 1e-5);

    /* backward accumulates onto what the buffers held */
    float *dinp = random_floats(nin, 0, 1), *dw = random_floats(nw, 0, 1),
          *db = random_floats(OC, 0, 1);
    float *dinp0 = new_floats(nin), *dw0 = new_floats(nw), *db0 = new_floats(OC);
    memcpy(dinp0, dinp, nin * sizeof(float));
    memcpy(dw0, dw, nw * sizeof(float));
    memcpy(db0, db, OC * sizeof(float));
    matmul_backward(dinp, dw, db, R, inp, w, N, C, OC);
    /* gradients are sums of up to max(N, OC) products of O(1) terms */
    fd_check("d inp (accumulated)", matmul_loss, &c, c.inp, nin, stride, dinp, dinp0, 3e-5, 1e-5);
    fd_check("d weight (accumulated)", matmul_loss, &c, c.w, nw, stride, dw, dw0, 3e-5, 1e-5);
    fd_check("d bias (accumulated)", matmul_loss, &c, c.b, OC, 1, db, db0, 3e-5, 1e-5);

    /* partial requests give the same bits; overwrite ignores old dinp */
    float *dinp2 = random_floats(nin, 0, 1), *dw2 = new_floats(nw), *db2 = new_floats(OC);
    memcpy(dw2, dw0, nw * sizeof(float));
    memcpy(db2, db0, OC * sizeof(float));
    matmul_backward(NULL, dw2, db2, R, inp, w, N, C, OC);
    check_bitwise("dweight without dinp", dw2, dw, nw);
    check_bitwise("dbias without dinp", db2, db, OC);
    memcpy(dw2, dw0, nw * sizeof(float));
    matmul_backward(NULL, dw2, NULL, R, inp, w, N, C, OC);
    check_bitwise("dweight without dbias", dw2, dw, nw);
    matmul_backward_overwrite(dinp2, NULL, NULL, R, inp, w, N, C, OC);
    fd_check("d inp (overwrite)", matmul_loss, &c, c.inp, nin, stride, dinp2, NULL, 3e-5, 1e-5);

    dm_free(inp); dm_free(w); dm_free(b); dm_free(R); dm_free(out);
    dm_free(dinp); dm_free(dw); dm_free(db); dm_free(dinp0); dm_free(dw0); dm_free(db0);
    dm_free(dinp2); dm_free(dw2); dm_free(db2);
    dm_free(c.inp); dm_free(c.w); dm_free(c.b); dm_free(c.R); dm_free(c.out);
}

/* The fused forms used by the block: residual and GELU in the matmul. */
struct fused_ctx {
    double *h, *w, *b, *R, *g, *out;
    int N, C, OC;
};

/* L = sum(R * (gelu(h) @ w^T + b)) */
static double fused_gelu_loss(void *arg)
{
    struct fused_ctx *c = arg;
    ref_gelu(c->g, c->h, (long)c->N * c->C);
    ref_matmul(c->out, c->g, c->w, c->b, c->N, c->C, c->OC);
    return dot(c->out, c->R, (long)c->N * c->OC);
}

static void test_matmul_fused(int N, int C, int OC, long stride)
{
    printf("matmul fused forms N=%d C=%d OC=%d\n", N, C, OC);
    long nin = (long)N * C, nw = (long)OC * C, nout = (long)N * OC;
    float *inp = random_floats(nin, 0, 1), *w = random_floats(nw, 0, 0.5f),
          *b = random_floats(OC, 0, 1), *res = random_floats(nout, 0, 1),
          *out = new_floats(nout), *gout = new_floats(nout);
    double *dinp_ = to_doubles(inp, nin), *dw = to_doubles(w, nw), *db = to_doubles(b, OC),
           *want = new_doubles(nout), *gwant = new_doubles(nout);
    ref_matmul(want, dinp_, dw, db, N, C, OC);
    for (long i = 0; i < nout; i++) want[i] += res[i];
    matmul_forward_residual(out, inp, w, b, res, N, C, OC);
    compare("forward + residual", out, want, nout, 1e-5, 1e-5);
    memcpy(gout, res, nout * sizeof(float));
    matmul_forward_residual(gout, inp, w, b, gout, N, C, OC);
    check_bitwise("forward + residual in place", gout, out, nout);

    ref_matmul(want, dinp_, dw, db, N, C, OC);
    ref_gelu(gwant, want, nout);
    matmul_forward_gelu(out, gout, inp, w, b, N, C, OC);
    compare("forward + gelu: out", out, want, nout, 1e-5, 1e-5);
    compare("forward + gelu: gelu(out)", gout, gwant, nout, 1e-5, 1e-5);

    /* backward through gelu: h -> gelu(h) -> matmul */
    float *h = inp, *gh = new_floats(nin), *R = random_floats(nout, 0, 1),
          *dh = random_floats(nin, 0, 1), *dwt = new_floats(nw), *dbias = new_floats(OC);
    gelu_forward(gh, h, nin);
    struct fused_ctx c = {to_doubles(h, nin), to_doubles(w, nw), to_doubles(b, OC),
                          to_doubles(R, nout), new_doubles(nin), new_doubles(nout), N, C, OC};
    matmul_backward_gelu(dh, dwt, dbias, R, gh, w, h, N, C, OC);
    fd_check("backward through gelu: d h (overwritten)", fused_gelu_loss, &c, c.h, nin, stride,
             dh, NULL, 3e-5, 1e-5);
    fd_check("backward through gelu: d weight", fused_gelu_loss, &c, c.w, nw, stride, dwt, NULL,
             3e-5, 1e-5);
    fd_check("backward through gelu: d bias", fused_gelu_loss, &c, c.b, OC, 1, dbias, NULL,
             3e-5, 1e-5);
    dm_free(inp); dm_free(w); dm_free(b); dm_free(res); dm_free(out); dm_free(gout);
    dm_free(dinp_); dm_free(dw); dm_free(db); dm_free(want); dm_free(gwant); dm_free(gh);
    dm_free(R); dm_free(dh); dm_free(dwt); dm_free(dbias);
    dm_free(c.h); dm_free(c.w); dm_free(c.b); dm_free(c.R); dm_free(c.g); dm_free(c.out);
}

/* ---- layernorm ---------------------------------------------------------------- */

struct layernorm_ctx {
    double *inp, *w, *b, *R, *out;
    int N, C;
};

static double layernorm_loss(void *arg)
{
    struct layernorm_ctx *c = arg;
    ref_layernorm(c->out, NULL, NULL, c->inp, c->w, c->b, c->N, c->C);
    return dot(c->out, c->R, (long)c->N * c->C);
}

static void test_layernorm(int N, int C)
{
    printf("layernorm N=%d C=%d\n", N, C);
    long n = (long)N * C;
    /* a large mean and a spread of scales, as in a residual stream */
    float *inp = random_floats(n, 3.0f, 2.0f), *w = random_floats(C, 1.0f, 0.3f),
          *b = random_floats(C, 0, 0.3f), *R = random_floats(n, 0, 1);
    struct layernorm_ctx c = {to_doubles(inp, n), to_doubles(w, C), to_doubles(b, C),
                              to_doubles(R, n), new_doubles(n), N, C};
    float *out = new_floats(n), *mean = new_floats(N), *rstd = new_floats(N);
    double *rmean = new_doubles(N), *rrstd = new_doubles(N);
    layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    ref_layernorm(c.out, rmean, rrstd, c.inp, c.w, c.b, N, C);
    compare("forward out", out, c.out, n, 2e-6, 2e-6);
    compare("forward mean", mean, rmean, N, 1e-6, 1e-6);
    compare("forward rstd", rstd, rrstd, N, 1e-6, 1e-6);

    float *dinp = random_floats(n, 0, 1), *dw = random_floats(C, 0, 1), *db = random_floats(C, 0, 1);
    float *dinp0 = new_floats(n), *dw0 = new_floats(C), *db0 = new_floats(C);
    memcpy(dinp0, dinp, n * sizeof(float));
    memcpy(dw0, dw, C * sizeof(float));
    memcpy(db0, db, C * sizeof(float));
    layernorm_backward(dinp, dw, db, R, inp, w, mean, rstd, N, C);
    fd_check("d inp (accumulated)", layernorm_loss, &c, c.inp, n, 1, dinp, dinp0, 2e-5, 1e-5);
    fd_check("d weight (accumulated)", layernorm_loss, &c, c.w, C, 1, dw, dw0, 2e-5, 1e-5);
    fd_check("d bias (accumulated)", layernorm_loss, &c, c.b, C, 1, db, db0, 2e-5, 1e-5);
    float *dw2 = new_floats(C), *db2 = new_floats(C);
    memcpy(dw2, dw0, C * sizeof(float));
    memcpy(db2, db0, C * sizeof(float));
    layernorm_backward(NULL, dw2, db2, R, inp, w, mean, rstd, N, C);
    check_bitwise("layernorm dweight without dinp", dw2, dw, C);
    check_bitwise("layernorm dbias without dinp", db2, db, C);

    dm_free(inp); dm_free(w); dm_free(b); dm_free(R); dm_free(out); dm_free(mean);
    dm_free(rstd); dm_free(rmean); dm_free(rrstd); dm_free(dinp); dm_free(dw); dm_free(db);
    dm_free(dinp0); dm_free(dw0); dm_free(db0); dm_free(dw2); dm_free(db2);
    dm_free(c.inp); dm_free(c.w); dm_free(c.b); dm_free(c.R); dm_free(c.out);
}

/* ---- attention ------------------------------------------------------------------ */

struct attention_ctx {
    double *qkv, *R, *out;
    int B, T, C, NH;
};

static double attention_loss(void *arg)
{
    struct attention_ctx *c = arg;
    ref_attention(c->out, NULL, c->qkv, c->B, c->T, c->C, c->NH);
    return dot(c->out, c->R, (long)c->B * c->T * c->C);
}

static void test_attention(int B, int T, int C, int NH, long stride)
{
    printf("attention B=%d T=%d C=%d NH=%d\n", B, T, C, NH);
    long nqkv = (long)B * T * 3 * C, nout = (long)B * T * C, natt = (long)B * NH * T * T;
    float *qkv = random_floats(nqkv, 0, 1), *R = random_floats(nout, 0, 1);
    struct attention_ctx c = {to_doubles(qkv, nqkv), to_doubles(R, nout), new_doubles(nout),
                              B, T, C, NH};
    float *out = new_floats(nout), *att = new_floats(natt);
    double *ratt = new_doubles(natt);
    attention_forward(out, att, qkv, B, T, C, NH);
    ref_attention(c.out, ratt, c.qkv, B, T, C, NH);
    compare("forward out", out, c.out, nout, 2e-6, 2e-6);
    /* the causal (lower) triangle of the probabilities */
    long nlow = (long)B * NH * T * (T + 1) / 2, k = 0;
    float *low = new_floats(nlow);
    double *rlow = new_doubles(nlow);
    for (long bh = 0; bh < (long)B * NH; bh++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j <= i; j++, k++) {
                low[k] = att[(bh * T + i) * T + j];
                rlow[k] = ratt[(bh * T + i) * T + j];
            }
    compare("forward probabilities (j <= i)", low, rlow, nlow, 1e-6, 2e-6);

    float *dqkv = random_floats(nqkv, 0, 1), *scratch = random_floats(natt, 0, 1);
    attention_backward(dqkv, scratch, R, qkv, att, B, T, C, NH);
    fd_check("d qkv (overwritten)", attention_loss, &c, c.qkv, nqkv, stride, dqkv, NULL,
             2e-5, 1e-5);
    dm_free(qkv); dm_free(R); dm_free(out); dm_free(att); dm_free(ratt); dm_free(low);
    dm_free(rlow); dm_free(dqkv); dm_free(scratch);
    dm_free(c.qkv); dm_free(c.R); dm_free(c.out);
}

/* ---- GELU, residual -------------------------------------------------------------- */

static void test_gelu(void)
{
    printf("gelu\n");
    /* a grid over [-12, 12] (both tails, where exp saturates) and N(0, 2) */
    long ngrid = 2401, n = ngrid + 3000;
    float *x = new_floats(n);
    for (long i = 0; i < ngrid; i++) x[i] = -12.0f + 0.01f * (float)i;
    fill_normal(x + ngrid, n - ngrid, 0, 2.0f);
    float *y = new_floats(n), *R = random_floats(n, 0, 1), *dx = new_floats(n);
    double *want = new_doubles(n), *dwant = new_doubles(n);
    gelu_forward(y, x, n);
    for (long i = 0; i < n; i++) want[i] = ref_gelu1(x[i]);
    /* a few ulp relative where it matters; in the negative tail the fp32
     * rounding of u alone costs |2u| ulp relative, so there the bound is
     * 1e-9 absolute (gelu(-4) = -7e-5, gelu(-8) = -1e-22) */
    compare("forward", y, want, n, 1e-9, 1e-6);
    gelu_backward(dx, x, R, n);
    for (long i = 0; i < n; i++) {
        double h = 1e-5 * fmax(1.0, fabs((double)x[i]));
        dwant[i] = R[i] * (ref_gelu1((double)x[i] + h) - ref_gelu1((double)x[i] - h)) / (2 * h);
    }
    compare("backward (central differences)", dx, dwant, n, 1e-7, 1e-5);
    float *d2 = new_floats(n);
    memcpy(d2, R, n * sizeof(float));
    gelu_backward(d2, x, d2, n);
    check_bitwise("gelu backward in place", d2, dx, n);

    printf("residual\n");
    float *a = random_floats(n, 0, 1), *r = new_floats(n);
    residual_forward(r, a, x, n);
    for (long i = 0; i < n; i++) want[i] = (double)a[i] + x[i];
    compare("forward", r, want, n, 0, 6e-8);
    residual_forward(a, a, x, n);
    check_bitwise("residual in place", a, r, n);
    dm_free(x); dm_free(y); dm_free(R); dm_free(dx); dm_free(want); dm_free(dwant);
    dm_free(d2); dm_free(a); dm_free(r);
}

/* ---- embedding ------------------------------------------------------------------- */

struct encoder_ctx {
    double *wte, *wpe, *R, *out;
    const int *tokens;
    int B, T, C;
};

static double encoder_loss(void *arg)
{
    struct encoder_ctx *c = arg;
    ref_encoder(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->R, (long)c->B * c->T * c->C);
}

static void test_encoder(void)
{
    int B = 3, T = 5, C = 7, V = 4, max_seq = 6;
    printf("encoder B=%d T=%d C=%d V=%d (tokens repeat)\n", B, T, C, V);
    int tokens[15];
    for (int i = 0; i < B * T; i++) tokens[i] = (int)(dm_hash64(5, 6, (uint64_t)i) % V);
    long nout = (long)B * T * C;
    float *wte = random_floats((long)V * C, 0, 1), *wpe = random_floats((long)max_seq * C, 0, 1),
          *R = random_floats(nout, 0, 1), *out = new_floats(nout);
    struct encoder_ctx c = {to_doubles(wte, (long)V * C), to_doubles(wpe, (long)max_seq * C),
                            to_doubles(R, nout), new_doubles(nout), tokens, B, T, C};
    encoder_forward(out, tokens, wte, wpe, B, T, C);
    ref_encoder(c.out, tokens, c.wte, c.wpe, B, T, C);
    compare("forward", out, c.out, nout, 0, 6e-8);
    float *dwte = random_floats((long)V * C, 0, 1), *dwpe = random_floats((long)max_seq * C, 0, 1);
    double *dwte0 = to_doubles(dwte, (long)V * C), *dwpe0 = to_doubles(dwpe, (long)max_seq * C);
    float *f0 = new_floats((long)max_seq * C);
    encoder_backward(dwte, dwpe, R, tokens, B, T, C);
    for (long i = 0; i < (long)V * C; i++) f0[i] = (float)dwte0[i];
    fd_check("d wte (accumulated)", encoder_loss, &c, c.wte, (long)V * C, 1, dwte, f0, 1e-6, 1e-6);
    for (long i = 0; i < (long)max_seq * C; i++) f0[i] = (float)dwpe0[i];
    fd_check("d wpe (accumulated; rows >= T untouched)", encoder_loss, &c, c.wpe,
             (long)max_seq * C, 1, dwpe, f0, 1e-6, 1e-6);
    dm_free(wte); dm_free(wpe); dm_free(R); dm_free(out); dm_free(dwte); dm_free(dwpe);
    dm_free(dwte0); dm_free(dwpe0); dm_free(f0);
    dm_free(c.wte); dm_free(c.wpe); dm_free(c.R); dm_free(c.out);
}

/* ---- cross-entropy ----------------------------------------------------------------- */

struct crossentropy_ctx {
    double *logits, *losses;
    const int *targets;
    double scale;
    int N, V;
};

static double crossentropy_loss(void *arg)
{
    struct crossentropy_ctx *c = arg;
    ref_crossentropy(c->losses, NULL, c->logits, c->targets, c->N, c->V);
    double s = 0.0;
    for (int n = 0; n < c->N; n++) s += c->losses[n];
    return c->scale * s;
}

static void test_crossentropy(void)
{
    int N = 7, V = 11;
    printf("crossentropy N=%d V=%d\n", N, V);
    long n = (long)N * V;
    float *logits = random_floats(n, 0, 3.0f);
    /* one row far from zero, one with a dominant logit */
    for (int v = 0; v < V; v++) logits[5 * V + v] += 80.0f;
    logits[6 * V + 2] = 40.0f;
    int targets[7];
    for (int i = 0; i < N; i++) targets[i] = (int)(dm_hash64(8, 9, (uint64_t)i) % V);
    float *losses = new_floats(N), *probs = new_floats(n), *dlogits = new_floats(n);
    struct crossentropy_ctx c = {to_doubles(logits, n), new_doubles(N), targets, 0.37, N, V};
    double *rprobs = new_doubles(n);
    crossentropy_forward(losses, probs, logits, targets, N, V);
    ref_crossentropy(c.losses, rprobs, c.logits, targets, N, V);
    compare("forward losses", losses, c.losses, N, 1e-6, 1e-6);
    compare("forward probabilities", probs, rprobs, n, 1e-30, 2e-6);
    crossentropy_softmax_backward(dlogits, probs, targets, (float)c.scale, N, V);
    fd_check("d logits (scale 0.37)", crossentropy_loss, &c, c.logits, n, 1, dlogits, NULL,
             1e-6, 1e-5);
    float *alias = new_floats(n);
    memcpy(alias, logits, n * sizeof(float));
    crossentropy_softmax_backward(alias, probs, targets, (float)c.scale, N, V);
    check_bitwise("crossentropy backward into the logits", alias, dlogits, n);
    dm_free(logits); dm_free(losses); dm_free(probs); dm_free(dlogits); dm_free(rprobs);
    dm_free(alias); dm_free(c.logits); dm_free(c.losses);
}

/* ---- AdamW and the schedule ---------------------------------------------------------- */

static void test_adamw(void)
{
    printf("adamw (torch.optim.AdamW arithmetic, 6 steps)\n");
    long n = 500;
    float *p = random_floats(n, 0, 1), *m = new_floats(n), *v = new_floats(n);
    double *rp = to_doubles(p, n), *rm = new_doubles(n), *rv = new_doubles(n);
    double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    for (int t = 1; t <= 6; t++) {
        float *g = random_floats(n, 0, (float)t);
        adamw_update(p, g, m, v, n, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd,
                     (float)gs, t);
        double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        for (long i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            rp[i] *= 1 - lr * wd;
            rm[i] = b1 * rm[i] + (1 - b1) * gi;
            rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
            rp[i] -= lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
        }
        dm_free(g);
    }
    compare("params", p, rp, n, 1e-6, 1e-6);
    compare("m", m, rm, n, 1e-6, 1e-6);
    compare("v", v, rv, n, 1e-6, 1e-6);
    dm_free(p); dm_free(m); dm_free(v); dm_free(rp); dm_free(rm); dm_free(rv);

    printf("lr_at_step\n");
    struct dm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.lr = 1e-3;
    cfg.min_lr_ratio = 0.1;
    cfg.warmup = 3;
    cfg.steps = 10;
    CHECK_NEAR(lr_at_step(&cfg, 0), 1e-3 / 3, 1e-15);
    CHECK_NEAR(lr_at_step(&cfg, 2), 1e-3, 1e-15);
    CHECK_NEAR(lr_at_step(&cfg, 3), 1e-3, 1e-15);
    CHECK_NEAR(lr_at_step(&cfg, 9), 1e-4 + 0.5 * (1 + cos(M_PI * 6 / 7)) * 9e-4, 1e-15);
    cfg.warmup = 0;
    cfg.steps = 1;
    CHECK_NEAR(lr_at_step(&cfg, 0), 1e-3, 1e-15);
}

/* ---- a whole block and the whole model --------------------------------------------------- */

struct block_ctx {
    double *params, *in, *R, *out;
    int B, T, C, NH;
};

static double block_loss(void *arg)
{
    struct block_ctx *c = arg;
    ref_block(c->out, c->in, c->params, c->B, c->T, c->C, c->NH);
    return dot(c->out, c->R, (long)c->B * c->T * c->C);
}

/* Random parameters everywhere (no trivial ones or zeros to hide a bug). */
static void randomise_block(struct block *blk)
{
    for (int k = 0; k < BP_COUNT; k++) {
        long n = (long)block_tensor_size(blk->C, k);
        if (k == BP_LN1_W || k == BP_LN2_W) fill_normal(blk->p[k], n, 1.0f, 0.2f);
        else fill_normal(blk->p[k], n, 0, 0.3f);
    }
}

static void test_block_gradients(int B, int T, int C, int NH, long stride)
{
    printf("block B=%d T=%d C=%d NH=%d\n", B, T, C, NH);
    struct gpt_shape shape = {.vocab = 8, .max_seq = T, .layers = 2, .heads = NH, .channels = C};
    struct block blk;
    block_init(&blk, 1, &shape, 3);
    randomise_block(&blk);
    long n = (long)B * T * C, np = (long)blk.nparams;
    float *in = random_floats(n, 0, 1), *out = new_floats(n), *R = random_floats(n, 0, 1),
          *din = new_floats(n);
    struct block_ctx c = {to_doubles(blk.params, np), to_doubles(in, n), to_doubles(R, n),
                          new_doubles(n), B, T, C, NH};
    struct block_acts acts;
    struct block_scratch scratch;
    block_acts_alloc(&acts, B, T, C, NH);
    block_scratch_alloc(&scratch, B, T, C, NH);
    block_forward(&blk, &acts, out, in, B, T);
    ref_block(c.out, c.in, c.params, B, T, C, NH);
    compare("forward", out, c.out, n, 1e-5, 1e-5);
    block_backward(&blk, &acts, &scratch, din, R, in, B, T);
    fd_check("d input", block_loss, &c, c.in, n, stride, din, NULL, 5e-5, 1e-4);
    static const char *names[BP_COUNT] = {
        "d ln1_w", "d ln1_b", "d qkv_w", "d qkv_b", "d attproj_w", "d attproj_b",
        "d ln2_w", "d ln2_b", "d fc_w", "d fc_b", "d fcproj_w", "d fcproj_b"};
    for (int k = 0; k < BP_COUNT; k++) {
        size_t off = block_tensor_offset(C, k);
        fd_check(names[k], block_loss, &c, c.params + off, (long)block_tensor_size(C, k),
                 stride, blk.g[k], NULL, 5e-5, 1e-4);
    }
    /* din may alias dout; gradients accumulate */
    float *grads1 = new_floats(np), *alias = new_floats(n);
    memcpy(grads1, blk.grads, np * sizeof(float));
    memcpy(alias, R, n * sizeof(float));
    block_backward(&blk, &acts, &scratch, alias, alias, in, B, T);
    check_bitwise("block backward with din aliasing dout", alias, din, n);
    /* accumulation: twice the gradients, up to the rounding of the sums */
    double max_grad = 0.0;
    for (long i = 0; i < np; i++) max_grad = fmax(max_grad, fabs(grads1[i]));
    long mismatched = 0;
    for (long i = 0; i < np; i++)
        mismatched += fabs(blk.grads[i] - 2.0 * grads1[i]) > 1e-6 * max_grad;
    CHECK_MSG(mismatched == 0, "second backward does not double the gradients (%ld)", mismatched);
    block_acts_free(&acts);
    block_scratch_free(&scratch);
    block_free(&blk);
    dm_free(in); dm_free(out); dm_free(R); dm_free(din); dm_free(grads1); dm_free(alias);
    dm_free(c.params); dm_free(c.in); dm_free(c.R); dm_free(c.out);
}

struct model_ctx {
    double *flat;
    const struct gpt_shape *shape;
    const int *tokens, *targets;
    int B, T;
};

static double model_loss(void *arg)
{
    struct model_ctx *c = arg;
    return ref_gpt(NULL, c->flat, c->shape, c->tokens, c->targets, c->B, c->T);
}

static void test_model_gradients(void)
{
    struct gpt_shape shape = {.vocab = 11, .max_seq = 9, .layers = 2, .heads = 2, .channels = 8};
    int B = 2, T = 7, N = B * T, V = shape.vocab;
    printf("whole model V=%d max_seq=%d L=%d NH=%d C=%d B=%d T=%d\n", shape.vocab,
           shape.max_seq, shape.layers, shape.heads, shape.channels, B, T);
    struct gpt model;
    gpt_build(&model, &shape, 0, shape.layers, 1, 1, 11);
    long P = (long)gpt_param_count(&shape);
    float *flat = new_floats(P), *grads = new_floats(P);
    /* random everything, layernorm weights near 1 */
    fill_normal(flat, P, 0, 0.3f);
    gpt_params_from_flat(&model, flat);
    for (int i = 0; i < shape.channels; i++) {
        for (int l = 0; l < shape.layers; l++) {
            model.blocks[l].p[BP_LN1_W][i] += 1.0f;
            model.blocks[l].p[BP_LN2_W][i] += 1.0f;
        }
        model.lnf_w[i] += 1.0f;
    }
    gpt_params_to_flat(&model, flat);
    struct gpt_acts acts;
    struct block_scratch scratch;
    gpt_acts_alloc(&acts, &model, B, T);
    block_scratch_alloc(&scratch, B, T, shape.channels, shape.heads);
    for (int i = 0; i < N; i++) {
        acts.tokens[i] = (int)(dm_hash64(1, 2, (uint64_t)i) % V);
        acts.targets[i] = (int)(dm_hash64(1, 3, (uint64_t)i) % V);
    }
    struct model_ctx c = {to_doubles(flat, P), &shape, acts.tokens, acts.targets, B, T};
    double *rlogits = new_doubles((long)N * V);
    float loss = gpt_forward(&model, &acts);
    double rloss = ref_gpt(rlogits, c.flat, &shape, acts.tokens, acts.targets, B, T);
    float loss_f = loss;
    compare("loss", &loss_f, &rloss, 1, 0, 1e-6);
    compare("logits", acts.logits, rlogits, (long)N * V, 1e-5, 1e-5);
    float dloss_scale = 0.5f;
    gpt_backward(&model, &acts, &scratch, dloss_scale, NULL, NULL);
    gpt_tie_wte_grads(&model, NULL);
    gpt_grads_to_flat(&model, grads);
    for (long i = 0; i < P; i++) grads[i] /= dloss_scale;   /* exact: a power of two */
    fd_check("d all parameters (canonical order)", model_loss, &c, c.flat, P, 1, grads, NULL,
             1e-5, 1e-4);
    gpt_grads_to_flat(&model, grads);
    double sumsq = 0.0;
    for (long i = 0; i < P; i++) sumsq += (double)grads[i] * grads[i];
    CHECK_NEAR(gpt_grad_sumsq(&model), sumsq, 1e-12 * sumsq);
    gpt_acts_free(&acts);
    block_scratch_free(&scratch);
    gpt_free(&model);
    dm_free(flat); dm_free(grads); dm_free(rlogits); dm_free(c.flat);
}

/* ---- timing at the reference shapes (prints only) ---------------------------------------- */

#define TIME_OP(name, gflop, stmt)                                                       \
    do {                                                                                 \
        double best = 1e9;                                                               \
        for (int rep = 0; rep < 5; rep++) {                                              \
            double t0 = dm_now();                                                        \
            stmt;                                                                        \
            best = fmin(best, dm_now() - t0);                                            \
        }                                                                                \
        printf("  %-30s %8.3f ms %7.1f GFLOP/s\n", name, best * 1e3, (gflop) / best);    \
    } while (0)

static void time_ops(void)
{
    int B = 8, T = 256, C = 256, NH = 4, N = B * T;
    long big = (long)N * 4 * C;
    printf("op timing, B=%d T=%d C=%d NH=%d, %d threads\n", B, T, C, NH, dm_threads_count());
    float *x = random_floats(big, 0, 1), *y = random_floats(big, 0, 1),
          *d = random_floats(big, 0, 1), *w = random_floats(4L * C * C, 0, 0.02f),
          *dw = new_floats(4L * C * C), *b = new_floats(4 * C), *db = new_floats(4 * C),
          *qkv = random_floats((long)N * 3 * C, 0, 1),
          *att = new_floats((long)B * NH * T * T), *scr = new_floats((long)B * NH * T * T),
          *mean = new_floats(N), *rstd = new_floats(N), *m = new_floats(4L * C * C),
          *v = new_floats(4L * C * C);
    int *targets = dm_alloc((size_t)N * sizeof(int));
    double g = 1e-9;
    TIME_OP("matmul fwd qkv", g * 2.0 * N * C * 3 * C, matmul_forward(y, x, w, b, N, C, 3 * C));
    TIME_OP("matmul bwd qkv", g * 4.0 * N * C * 3 * C,
            matmul_backward(d, dw, db, y, x, w, N, C, 3 * C));
    TIME_OP("matmul fwd fcproj", g * 2.0 * N * C * 4 * C,
            matmul_forward(y, x, w, b, N, 4 * C, C));
    TIME_OP("matmul bwd fcproj", g * 4.0 * N * C * 4 * C,
            matmul_backward(d, dw, db, y, x, w, N, 4 * C, C));
    TIME_OP("matmul fwd fc + gelu", g * 2.0 * N * C * 4 * C,
            matmul_forward_gelu(y, d, x, w, b, N, C, 4 * C));
    TIME_OP("matmul bwd fcproj + gelu", g * 4.0 * N * C * 4 * C,
            matmul_backward_gelu(d, dw, db, y, x, w, y, N, 4 * C, C));
    double att_gflop = g * 2.0 * 2 * B * NH * (double)T * (T + 1) / 2 * (C / NH);
    TIME_OP("attention fwd (causal flops)", att_gflop, attention_forward(y, att, qkv, B, T, C, NH));
    TIME_OP("attention bwd (causal flops)", 2 * att_gflop,
            attention_backward(d, scr, y, qkv, att, B, T, C, NH));
    TIME_OP("layernorm fwd", 0, layernorm_forward(y, mean, rstd, x, w, b, N, C));
    TIME_OP("layernorm bwd", 0, layernorm_backward(d, dw, db, y, x, w, mean, rstd, N, C));
    TIME_OP("gelu fwd", 0, gelu_forward(y, x, big));
    TIME_OP("gelu bwd", 0, gelu_backward(d, x, y, big));
    TIME_OP("residual", 0, residual_forward(y, y, x, (long)N * C));
    TIME_OP("crossentropy fwd V=256", 0, crossentropy_forward(mean, y, x, targets, N, 256));
    TIME_OP("adamw 4C^2", 0, adamw_update(w, dw, m, v, 4L * C * C, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                          0.1f, 1.0f, 1));
    dm_free(x); dm_free(y); dm_free(d); dm_free(w); dm_free(dw); dm_free(b); dm_free(db);
    dm_free(qkv); dm_free(att); dm_free(scr); dm_free(mean); dm_free(rstd); dm_free(m);
    dm_free(v); dm_free(targets);
}

int main(void)
{
    dm_threads_init(2);
    test_matmul(37, 13, 21, 1);
    test_matmul(600, 24, 40, 7);       /* several row chunks and weight-gradient parts */
    test_matmul(2100, 8, 12, 31);      /* more row chunks than weight-gradient parts */
    test_matmul_fused(37, 13, 21, 1);
    test_matmul_fused(600, 24, 40, 7);
    test_layernorm(9, 37);
    test_layernorm(5, 64);
    test_layernorm(100, 48);          /* several 32-row chunks of the backward */
    test_attention(2, 67, 8, 2, 1);     /* crosses one 64-row attention block */
    test_attention(1, 130, 12, 3, 5);   /* three blocks, a partial last one */
    test_gelu();
    test_encoder();
    test_crossentropy();
    test_adamw();
    test_block_gradients(2, 5, 8, 2, 1);
    test_block_gradients(1, 70, 8, 2, 3);
    test_model_gradients();
    const char *timing = getenv("DYNMO_OP_TIMING");
    if (timing && strcmp(timing, "0") != 0) time_ops();
    dm_threads_shutdown();
    return testing_report("test_ops");
}
