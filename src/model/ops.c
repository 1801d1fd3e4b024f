/* The CPU ops of the GPT, forward and backward, in fp32.
 *
 * Every op splits its work with dm_parallel_for into items whose results
 * do not depend on which thread computes them or how many threads there
 * are. Matmuls are cut into fixed row chunks that depend only on the shape,
 * one single-threaded sgemm call per chunk. Every reduction over rows is
 * either split over columns, each column summed over all rows in row
 * order (bias and embedding gradients), or cut into fixed row parts whose
 * partial sums are then added in part order (weight and layernorm
 * gradients). That keeps losses and gradients bit-identical for any thread
 * count. No op calls MPI; the only allocations are per-call scratch
 * (attention) and grow-only buffers for the partial sums.
 *
 * gcc does not vectorize expf/tanhf without -ffast-math, and does not
 * vectorize a float sum without reassociation, so this file has its own
 * accurate exponential (a few ulp) and sums into explicit lanes.
 *
 * gcc's tuning for this CPU prefers 256-bit vectors; the exp-based loops
 * (GELU, softmax) run 10-25% faster with 512-bit ones where the ISA has
 * them. No result depends on the vector width (see LANES). */
#pragma GCC target("prefer-vector-width=512")

#include <cblas.h>
#include <math.h>
#include <string.h>
#include "dynmo/model.h"
#include "model/exp_lanes.h"
#include "model/internal.h"

/* ---- vectorizable math -------------------------------------------------- */

#define GELU_K 0.7978845608028654f     /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* Independent partial sums; the lanes are added in a fixed order at the
 * end, so the result does not depend on the vector width either. The
 * exponential and the max / exp-and-sum reductions are exp_lanes.h's,
 * shared with group_attention.c. */
#define LANES EXP_LANES

/* 1 / (1 + exp(-z)): accurate to a few ulp for both signs (no
 * cancellation), 0 and 1 at the extremes. */
static inline float sigmoid_accurate(float z)
{
    return 1.0f / (1.0f + exp_lanes(-z));
}

static float sum_floats(const float *x, long n)
{
    float lane[LANES] = {0};
    long i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) lane[k] += x[i + k];
    for (int k = 0; i < n; i++, k++) lane[k] += x[i];
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += lane[k];
    return s;
}

static float dot_floats(const float *a, const float *b, long n)
{
    float lane[LANES] = {0};
    long i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) lane[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) lane[k] += a[i] * b[i];
    float s = 0.0f;
    for (int k = 0; k < LANES; k++) s += lane[k];
    return s;
}

/* ---- matmul ---------------------------------------------------------------
 * Work is cut into chunks of rows that depend only on the shape, one sgemm
 * call per chunk, so the calls (and hence the bits of every output) are the
 * same for any thread count. Bigger calls amortise OpenBLAS's packing
 * (measured single-thread, K = 256: 64 rows ~100 GFLOP/s, 128 ~120,
 * 512 ~145), so chunks are as big as possible while leaving at least
 * MATMUL_MIN_CHUNKS of them to share.
 *
 * The weight gradient dout^T @ inp reduces over the N rows. Splitting it
 * over output channels makes thin sgemm calls (~115 GFLOP/s for 128 of
 * 256 channels); instead the rows are cut into at most MATMUL_K_PARTS
 * fixed parts, each a full-width sgemm (~140 GFLOP/s), whose products are
 * added in part order afterwards: dweight = (((dweight + p0) + p1) + p2)
 * + p3. The parts depend only on N, so this too is thread-count free.
 * The products of parts 1.. live in a grow-only scratch owned by this
 * file (ops run on the calling thread only; dm_parallel_for is not
 * reentrant). */
#define MATMUL_MIN_CHUNKS 4
#define MATMUL_MAX_ROWS 512
#define MATMUL_K_PARTS 4
#define BIAS_COLS 64

static struct grow_buffer dweight_partials;

float *grow_buffer_get(struct grow_buffer *b, size_t floats)
{
    if (floats > b->floats) {
        dm_free(b->data);
        b->data = dm_alloc(floats * sizeof(float));
        b->floats = floats;
    }
    return b->data;
}

static long chunk_rows(long n, long min_chunks, long max_rows)
{
    long chunks = (n + max_rows - 1) / max_rows;
    if (chunks < min_chunks) chunks = min_chunks;
    long rows = (n + chunks - 1) / chunks;
    rows = (rows + 15) & ~15L;
    return rows < 16 ? 16 : rows;
}

/* What runs on a chunk's rows right after its sgemm, while they are still
 * in cache. */
enum matmul_epilogue {
    EPILOGUE_NONE,
    EPILOGUE_GELU,        /* forward: gelu_out = gelu(out) */
    EPILOGUE_GELU_GRAD,   /* backward: dinp *= gelu'(gelu_inp) */
};

struct matmul_args {
    float *out, *dinp, *dweight, *dbias, *partials, *gelu_out;
    const float *inp, *weight, *bias, *dout, *residual, *gelu_inp;
    int N, C, OC;
    enum matmul_epilogue epilogue;
    long rows, dinp_chunks;   /* row chunks of N */
    long k_rows, k_parts;     /* row parts of the weight gradient */
    float beta;               /* 0: overwrite dinp, 1: accumulate */
};

static void gelu_span(float *restrict out, const float *restrict x, long n);
static void gelu_grad_span(float *restrict d, const float *restrict x, long n);

static void matmul_forward_range(void *arg, long begin, long end)
{
    const struct matmul_args *a = arg;
    long OC = a->OC;
    for (long chunk = begin; chunk < end; chunk++) {
        long r0 = chunk * a->rows;
        long rows = a->N - r0 < a->rows ? a->N - r0 : a->rows;
        float *out = a->out + r0 * OC;
        float beta = 1.0f;
        /* out starts as residual + bias (or either), then sgemm adds */
        if (a->residual) {
            const float *res = a->residual + r0 * OC;
            for (long r = 0; r < rows; r++)
                for (long o = 0; o < OC; o++)
                    out[r * OC + o] = res[r * OC + o] + (a->bias ? a->bias[o] : 0.0f);
        } else if (a->bias) {
            for (long r = 0; r < rows; r++)
                memcpy(out + r * OC, a->bias, (size_t)OC * sizeof(float));
        } else {
            beta = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)OC, a->C,
                    1.0f, a->inp + r0 * a->C, a->C, a->weight, a->C, beta, out, (int)OC);
        if (a->epilogue == EPILOGUE_GELU)
            gelu_span(a->gelu_out + r0 * OC, out, rows * OC);
    }
}

static void matmul_forward_impl(struct matmul_args *a)
{
    a->rows = chunk_rows(a->N, MATMUL_MIN_CHUNKS, MATMUL_MAX_ROWS);
    dm_parallel_for((a->N + a->rows - 1) / a->rows, 1, matmul_forward_range, a);
}

void matmul_forward(float *out, const float *inp, const float *weight,
                    const float *bias, int N, int C, int OC)
{
    struct matmul_args a = {.out = out, .inp = inp, .weight = weight, .bias = bias,
                            .N = N, .C = C, .OC = OC};
    matmul_forward_impl(&a);
}

void matmul_forward_residual(float *out, const float *inp, const float *weight,
                             const float *bias, const float *residual, int N, int C, int OC)
{
    struct matmul_args a = {.out = out, .inp = inp, .weight = weight, .bias = bias,
                            .residual = residual, .N = N, .C = C, .OC = OC};
    matmul_forward_impl(&a);
}

void matmul_forward_gelu(float *out, float *gelu_out, const float *inp, const float *weight,
                         const float *bias, int N, int C, int OC)
{
    struct matmul_args a = {.out = out, .gelu_out = gelu_out, .inp = inp, .weight = weight,
                            .bias = bias, .N = N, .C = C, .OC = OC,
                            .epilogue = EPILOGUE_GELU};
    matmul_forward_impl(&a);
}

/* Two kinds of items: dinp row chunks, dinp (=|+=) dout @ weight (then
 * the GELU epilogue), and weight-gradient parts, of which part 0
 * accumulates into dweight and part p > 0 overwrites partials[p-1]. They
 * alternate (chunk 0, part 0, chunk 1, part 1, ...; the surplus of the
 * more numerous kind last) so that every thread's contiguous range gets
 * a share of each: with the reference shapes both are 512-row sgemms, but
 * only the chunks carry an epilogue. */
static void backward_item(const struct matmul_args *a, long item, int *is_dinp, long *index)
{
    long pairs = a->dinp_chunks < a->k_parts ? a->dinp_chunks : a->k_parts;
    if (item < 2 * pairs) {
        *is_dinp = item % 2 == 0;
        *index = item / 2;
    } else {
        *is_dinp = a->dinp_chunks > a->k_parts;
        *index = item - pairs;
    }
}

static void matmul_backward_range(void *arg, long begin, long end)
{
    const struct matmul_args *a = arg;
    long C = a->C, OC = a->OC;
    for (long item = begin; item < end; item++) {
        int is_dinp;
        long index;
        backward_item(a, item, &is_dinp, &index);
        if (is_dinp) {
            long r0 = index * a->rows;
            long rows = a->N - r0 < a->rows ? a->N - r0 : a->rows;
            float *dinp = a->dinp + r0 * C;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)C, (int)OC,
                        1.0f, a->dout + r0 * OC, (int)OC, a->weight, (int)C,
                        a->beta, dinp, (int)C);
            if (a->epilogue == EPILOGUE_GELU_GRAD)
                gelu_grad_span(dinp, a->gelu_inp + r0 * C, rows * C);
        } else {
            long part = index;
            long k0 = part * a->k_rows;
            long rows = a->N - k0 < a->k_rows ? a->N - k0 : a->k_rows;
            float *target = part == 0 ? a->dweight : a->partials + (part - 1) * OC * C;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)rows,
                        1.0f, a->dout + k0 * OC, (int)OC, a->inp + k0 * C, (int)C,
                        part == 0 ? 1.0f : 0.0f, target, (int)C);
        }
    }
}

/* Over blocks of BIAS_COLS output channels: adds the parts' products to
 * dweight in part order, and sums the bias gradient column by column
 * over the rows in row order. */
static void matmul_reduce_range(void *arg, long begin, long end)
{
    const struct matmul_args *a = arg;
    long C = a->C, OC = a->OC;
    for (long block = begin; block < end; block++) {
        long o0 = block * BIAS_COLS;
        long cols = OC - o0 < BIAS_COLS ? OC - o0 : BIAS_COLS;
        if (a->dweight && a->k_parts > 1) {
            float *restrict dw = a->dweight + o0 * C;
            for (long p = 1; p < a->k_parts; p++) {
                const float *restrict part = a->partials + (p - 1) * OC * C + o0 * C;
                for (long i = 0; i < cols * C; i++) dw[i] += part[i];
            }
        }
        if (a->dbias) {
            double acc[BIAS_COLS] = {0};
            for (long n = 0; n < a->N; n++) {
                const float *row = a->dout + n * OC + o0;
                for (long j = 0; j < cols; j++) acc[j] += row[j];
            }
            for (long j = 0; j < cols; j++) a->dbias[o0 + j] += (float)acc[j];
        }
    }
}

static void matmul_backward_impl(struct matmul_args *a)
{
    long N = a->N;
    a->rows = chunk_rows(N, MATMUL_MIN_CHUNKS, MATMUL_MAX_ROWS);
    a->dinp_chunks = a->dinp ? (N + a->rows - 1) / a->rows : 0;
    a->k_parts = 0;
    if (a->dweight) {
        a->k_rows = chunk_rows(N, MATMUL_K_PARTS, MATMUL_MAX_ROWS);
        if (a->k_rows * MATMUL_K_PARTS < N)
            a->k_rows = ((N + MATMUL_K_PARTS - 1) / MATMUL_K_PARTS + 15) & ~15L;
        a->k_parts = (N + a->k_rows - 1) / a->k_rows;
        if (a->k_parts > 1)
            a->partials = grow_buffer_get(&dweight_partials,
                                          (size_t)(a->k_parts - 1) * a->OC * a->C);
    }
    dm_parallel_for(a->dinp_chunks + a->k_parts, 1, matmul_backward_range, a);
    if (a->dbias || a->k_parts > 1)
        dm_parallel_for((a->OC + BIAS_COLS - 1) / BIAS_COLS, 1, matmul_reduce_range, a);
}

void matmul_backward(float *dinp, float *dweight, float *dbias,
                     const float *dout, const float *inp, const float *weight,
                     int N, int C, int OC)
{
    struct matmul_args a = {.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = dout,
                            .inp = inp, .weight = weight, .N = N, .C = C, .OC = OC,
                            .beta = 1.0f};
    matmul_backward_impl(&a);
}

/* The same with dinp overwritten instead of accumulated. */
void matmul_backward_overwrite(float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               int N, int C, int OC)
{
    struct matmul_args a = {.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = dout,
                            .inp = inp, .weight = weight, .N = N, .C = C, .OC = OC,
                            .beta = 0.0f};
    matmul_backward_impl(&a);
}

void matmul_backward_gelu(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, const float *gelu_inp,
                          int N, int C, int OC)
{
    struct matmul_args a = {.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = dout,
                            .inp = inp, .weight = weight, .gelu_inp = gelu_inp,
                            .N = N, .C = C, .OC = OC, .beta = 0.0f,
                            .epilogue = EPILOGUE_GELU_GRAD};
    matmul_backward_impl(&a);
}

/* ---- layernorm ------------------------------------------------------------ */

#define LN_EPS 1e-5
/* Columns per item of the parameter-gradient reduction. */
#define LN_COLS 64

struct layernorm_args {
    float *out, *mean, *rstd, *dinp, *dweight, *dbias;
    const float *inp, *weight, *bias, *dout;
    const float *dresidual;   /* dinp = dresidual + ...; NULL: dinp += ... */
    const float *mean_in, *rstd_in;
    int N, C;
};

static void layernorm_forward_range(void *arg, long begin, long end)
{
    const struct layernorm_args *a = arg;
    int C = a->C;
    for (long n = begin; n < end; n++) {
        const float *x = a->inp + n * C;
        float *y = a->out + n * C;
        float m = sum_floats(x, C) / (float)C;
        float lane[LANES] = {0};
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int k = 0; k < LANES; k++) {
                float d = x[i + k] - m;
                lane[k] += d * d;
            }
        for (int k = 0; i < C; i++, k++) {
            float d = x[i] - m;
            lane[k] += d * d;
        }
        double var = 0.0;
        for (int k = 0; k < LANES; k++) var += lane[k];
        var /= C;
        float s = (float)(1.0 / sqrt(var + LN_EPS));
        for (i = 0; i < C; i++) y[i] = (x[i] - m) * s * a->weight[i] + a->bias[i];
        a->mean[n] = m;
        a->rstd[n] = s;
    }
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, const float *bias, int N, int C)
{
    struct layernorm_args a = {.out = out, .mean = mean, .rstd = rstd, .inp = inp,
                               .weight = weight, .bias = bias, .N = N, .C = C};
    dm_parallel_for(N, 4, layernorm_forward_range, &a);
}

/* The backward runs over fixed chunks of LN_ROWS rows (thread-count free):
 * each computes its rows' input gradient and its own partial column sums
 * for the weight and bias gradients, which a second, small pass adds up
 * chunk by chunk in order. One pass over dout and inp instead of two. The
 * partial sums live in a grow-only scratch owned by this file. */
#define LN_ROWS 32

static struct grow_buffer ln_partials;

static void layernorm_backward_range(void *arg, long begin, long end)
{
    const struct layernorm_args *a = arg;
    int C = a->C;
    int want_params = a->dweight || a->dbias;
    for (long chunk = begin; chunk < end; chunk++) {
        long n0 = chunk * LN_ROWS, n1 = n0 + LN_ROWS < a->N ? n0 + LN_ROWS : a->N;
        float *restrict pw = ln_partials.data + chunk * 2 * C, *restrict pb = pw + C;
        if (want_params) memset(pw, 0, 2 * (size_t)C * sizeof(float));
        for (long n = n0; n < n1; n++) {
            const float *restrict x = a->inp + n * C, *restrict dy = a->dout + n * C;
            const float *restrict w = a->weight;
            float m = a->mean_in[n], s = a->rstd_in[n];
            if (want_params)
                for (int i = 0; i < C; i++) {
                    pw[i] += dy[i] * ((x[i] - m) * s);
                    pb[i] += dy[i];
                }
            if (!a->dinp) continue;
            /* dnorm = dy * w; dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) */
            float lane_d[LANES] = {0}, lane_dn[LANES] = {0};
            int i = 0;
            for (; i + LANES <= C; i += LANES)
                for (int k = 0; k < LANES; k++) {
                    float dnorm = dy[i + k] * w[i + k];
                    lane_d[k] += dnorm;
                    lane_dn[k] += dnorm * ((x[i + k] - m) * s);
                }
            for (int k = 0; i < C; i++, k++) {
                float dnorm = dy[i] * w[i];
                lane_d[k] += dnorm;
                lane_dn[k] += dnorm * ((x[i] - m) * s);
            }
            float sum_d = 0.0f, sum_dn = 0.0f;
            for (int k = 0; k < LANES; k++) {
                sum_d += lane_d[k];
                sum_dn += lane_dn[k];
            }
            float mean_d = sum_d / (float)C, mean_dn = sum_dn / (float)C;
            float *dx = a->dinp + n * C;
            const float *base = a->dresidual ? a->dresidual + n * C : dx;
            for (i = 0; i < C; i++) {
                float norm = (x[i] - m) * s;
                dx[i] = base[i] + s * (dy[i] * w[i] - mean_d - norm * mean_dn);
            }
        }
    }
}

/* Over blocks of LN_COLS columns: the chunks' partial sums, in chunk order. */
static void layernorm_reduce_range(void *arg, long begin, long end)
{
    const struct layernorm_args *a = arg;
    int C = a->C;
    long chunks = (a->N + LN_ROWS - 1) / LN_ROWS;
    for (long c0 = begin * LN_COLS; c0 < end * LN_COLS && c0 < C; c0 += LN_COLS) {
        int cols = C - c0 < LN_COLS ? (int)(C - c0) : LN_COLS;
        double acc_w[LN_COLS] = {0}, acc_b[LN_COLS] = {0};
        for (long chunk = 0; chunk < chunks; chunk++) {
            const float *pw = ln_partials.data + chunk * 2 * C + c0, *pb = pw + C;
            for (int j = 0; j < cols; j++) {
                acc_w[j] += pw[j];
                acc_b[j] += pb[j];
            }
        }
        for (int j = 0; j < cols; j++) {
            if (a->dweight) a->dweight[c0 + j] += (float)acc_w[j];
            if (a->dbias) a->dbias[c0 + j] += (float)acc_b[j];
        }
    }
}

/* dinp may be NULL (only parameter gradients wanted); dweight and dbias
 * may be NULL (frozen). */
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int N, int C)
{
    layernorm_backward_residual(dinp, NULL, dweight, dbias, dout, inp, weight, mean, rstd,
                                N, C);
}

/* The same with dinp = dresidual + (input gradient) instead of +=: the
 * residual branch's gradient joins without a separate copy. */
void layernorm_backward_residual(float *dinp, const float *dresidual, float *dweight,
                                 float *dbias, const float *dout, const float *inp,
                                 const float *weight, const float *mean, const float *rstd,
                                 int N, int C)
{
    struct layernorm_args a = {.dinp = dinp, .dresidual = dresidual, .dweight = dweight,
                               .dbias = dbias, .dout = dout, .inp = inp, .weight = weight,
                               .mean_in = mean, .rstd_in = rstd, .N = N, .C = C};
    long chunks = (N + LN_ROWS - 1) / LN_ROWS;
    if (!dinp && !dweight && !dbias) return;
    if (dweight || dbias) {
        grow_buffer_get(&ln_partials, (size_t)chunks * 2 * C);
    }
    dm_parallel_for(chunks, 1, layernorm_backward_range, &a);
    if (dweight || dbias)
        dm_parallel_for((C + LN_COLS - 1) / LN_COLS, 1, layernorm_reduce_range, &a);
}

/* ---- attention --------------------------------------------------------------
 * Per (batch, head) pair, in query-row blocks of ATT_BLOCK: block [r0, r1)
 * only meets keys up to its last query's position, so the masked upper
 * triangle beyond the block is never computed. Inside a block the masked
 * entries are stored as exact zeros, which the backward relies on.
 *
 * The head's Q, K, V (and dO) are first copied out of their strided rows
 * into contiguous per-thread buffers, K (and V in backward) transposed, so
 * that every product is a plain NN or TN sgemm on contiguous operands: for
 * these small shapes OpenBLAS's kernels are much faster that way (measured,
 * one thread, per layer of the reference model: Q K^T 2.5 ms strided NT,
 * 1.4 ms contiguous NN). Outputs are written in place with their strides.
 *
 * The same code serves a subset of query rows (early exit: only the tokens
 * still active ask, every token answers as key and value): the queries of
 * batch b are rows [start[b], start[b+1]) of a compact Q, at positions
 * pos[i] in the sequence; query i sees keys [0, pos[i]]. With every row
 * active (start[b] = b*T, pos[i] = i - b*T) the calls are exactly those of
 * the full attention. att and the scratch keep compact rows, T apart. */
#define ATT_BLOCK 32

/* Columns [0, the return) of a query block whose last query sees keys
 * [0, kb) are stored: up to the next ATT_BLOCK boundary (at most nk), so
 * that the backward's key blocks, which read every query row at or after
 * their first key, read zeros rather than old values. With every row
 * active kb is already on a boundary or nk. */
static inline int attention_cols(int kb, int nk)
{
    int up = (kb + ATT_BLOCK - 1) / ATT_BLOCK * ATT_BLOCK;
    return up < nk ? up : nk;
}

struct attention_args {
    float *out, *att, *dq, *dk, *dv, *scratch;
    const float *q, *k, *v, *dout, *att_in;
    int ldq, ldkv;          /* row strides of q / dq and of k, v / dk, dv */
    const int *start, *pos; /* NULL: every row (start b*T, pos identity) */
    int B, T, C, NH;
};

static void attention_rows_of(const struct attention_args *a, long b, int *s, int *e)
{
    *s = a->start ? a->start[b] : (int)b * a->T;
    *e = a->start ? a->start[b + 1] : (int)(b + 1) * a->T;
}

/* position in the sequence of compact query row i (batch starting at s) */
static inline int attention_pos(const struct attention_args *a, int s, int i)
{
    return a->pos ? a->pos[s + i] : i;
}

/* dst (rows, cols) = src (rows, cols; leading dimension ld) */
static void copy_rows(float *restrict dst, const float *restrict src, int rows, int cols, int ld)
{
    for (int r = 0; r < rows; r++)
        memcpy(dst + (long)r * cols, src + (long)r * ld, (size_t)cols * sizeof(float));
}

/* dst (cols, rows) = src (rows, cols; leading dimension ld) transposed, in
 * tiles so that both sides stay in cache lines. */
static void copy_transposed(float *restrict dst, const float *restrict src, int rows, int cols,
                            int ld)
{
    enum { TILE = 16 };
    for (int r0 = 0; r0 < rows; r0 += TILE) {
        int r1 = r0 + TILE < rows ? r0 + TILE : rows;
        for (int c0 = 0; c0 < cols; c0 += TILE) {
            int c1 = c0 + TILE < cols ? c0 + TILE : cols;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++) dst[(long)c * rows + r] = src[(long)r * ld + c];
        }
    }
}

/* dst[r * ld + 0..cols) = 0 for rows [0, rows) */
static void zero_rows(float *dst, int rows, int cols, int ld)
{
    for (int r = 0; r < rows; r++) memset(dst + (long)r * ld, 0, (size_t)cols * sizeof(float));
}

static void attention_forward_range(void *arg, long begin, long end)
{
    const struct attention_args *a = arg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    float *work = dm_alloc((size_t)3 * T * hs * sizeof(float));
    for (long item = begin; item < end; item++) {
        long b = item / NH, h = item % NH;
        int s, e;
        attention_rows_of(a, b, &s, &e);
        int nq = e - s;
        if (nq == 0) continue;
        int nk = attention_pos(a, s, nq - 1) + 1;   /* keys anyone here sees */
        float *qc = work, *kt = qc + (long)nq * hs, *vc = kt + (long)nk * hs;
        copy_rows(qc, a->q + (long)s * a->ldq + h * hs, nq, hs, a->ldq);
        copy_transposed(kt, a->k + b * T * a->ldkv + h * hs, nk, hs, a->ldkv);
        copy_rows(vc, a->v + b * T * a->ldkv + h * hs, nk, hs, a->ldkv);
        float *P = a->att + item * (long)T * T;
        float *o = a->out + (long)s * C + h * hs;
        for (int r0 = 0; r0 < nq; r0 += ATT_BLOCK) {
            int r1 = r0 + ATT_BLOCK < nq ? r0 + ATT_BLOCK : nq;
            int kb = attention_pos(a, s, r1 - 1) + 1;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, kb, hs,
                        scale, qc + (long)r0 * hs, hs, kt, nk, 0.0f, P + (long)r0 * T, T);
            for (int i = r0; i < r1; i++) {
                float *row = P + (long)i * T;
                int valid = attention_pos(a, s, i) + 1;
                float mx = max_lanes(row, valid);
                float sum = exp_shifted_lanes(row, valid, mx);
                float inv = 1.0f / sum;
                for (int j = 0; j < valid; j++) row[j] *= inv;
                for (int j = valid; j < attention_cols(kb, nk); j++) row[j] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, kb,
                        1.0f, P + (long)r0 * T, T, vc, hs, 0.0f, o + (long)r0 * C, C);
        }
    }
    dm_free(work);
}

void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    struct attention_args a = {.out = out, .att = att, .q = qkv, .k = qkv + C,
                               .v = qkv + 2 * C, .ldq = 3 * C, .ldkv = 3 * C,
                               .B = B, .T = T, .C = C, .NH = NH};
    dm_parallel_for((long)B * NH, 1, attention_forward_range, &a);
}

/* dV = P^T dO and dK = dS^T Q for one (batch, head) over its nk keys,
 * from its nq compact query rows starting at s. Key block [c0, c1) is only
 * seen by the queries at positions >= c0, compact rows [first, nq), whose
 * P and dS hold zeros up to c1 beyond each row's own keys
 * (attention_cols). */
static void attention_backward_kv(const struct attention_args *a, int s, int nq, int nk,
                                  const float *P, const float *dS, const float *dOc,
                                  const float *qc, float *dk, float *dv)
{
    int T = a->T, hs = a->C / a->NH, first = 0;
    for (int c0 = 0; c0 < nk; c0 += ATT_BLOCK) {
        int c1 = c0 + ATT_BLOCK < nk ? c0 + ATT_BLOCK : nk;
        while (attention_pos(a, s, first) < c0) first++;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, nq - first,
                    1.0f, P + (long)first * T + c0, T, dOc + (long)first * hs, hs,
                    0.0f, dv + (long)c0 * a->ldkv, a->ldkv);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, nq - first,
                    1.0f, dS + (long)first * T + c0, T, qc + (long)first * hs, hs,
                    0.0f, dk + (long)c0 * a->ldkv, a->ldkv);
    }
}

static void attention_backward_range(void *arg, long begin, long end)
{
    const struct attention_args *a = arg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    float scale = (float)(1.0 / sqrt((double)hs));
    float *work = dm_alloc((size_t)4 * T * hs * sizeof(float));
    for (long item = begin; item < end; item++) {
        long b = item / NH, h = item % NH;
        int s, e;
        attention_rows_of(a, b, &s, &e);
        int nq = e - s;
        float *dk = a->dk + b * T * a->ldkv + h * hs, *dv = a->dv + b * T * a->ldkv + h * hs;
        int nk = nq ? attention_pos(a, s, nq - 1) + 1 : 0;
        /* keys no query of this batch sees get no gradient */
        zero_rows(dk + (long)nk * a->ldkv, T - nk, hs, a->ldkv);
        zero_rows(dv + (long)nk * a->ldkv, T - nk, hs, a->ldkv);
        if (nq == 0) continue;
        float *qc = work, *kc = qc + (long)nq * hs, *vt = kc + (long)nk * hs;
        float *dOc = vt + (long)nk * hs;
        copy_rows(qc, a->q + (long)s * a->ldq + h * hs, nq, hs, a->ldq);
        copy_rows(kc, a->k + b * T * a->ldkv + h * hs, nk, hs, a->ldkv);
        copy_transposed(vt, a->v + b * T * a->ldkv + h * hs, nk, hs, a->ldkv);
        copy_rows(dOc, a->dout + (long)s * C + h * hs, nq, hs, C);
        float *dq = a->dq + (long)s * a->ldq + h * hs;
        const float *P = a->att_in + item * (long)T * T;
        float *dS = a->scratch + item * (long)T * T;
        for (int r0 = 0; r0 < nq; r0 += ATT_BLOCK) {
            int r1 = r0 + ATT_BLOCK < nq ? r0 + ATT_BLOCK : nq;
            int kb = attention_pos(a, s, r1 - 1) + 1;
            /* dP = dO V^T, then dS = scale * P * (dP - sum_j P dP), in place */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, kb, hs,
                        1.0f, dOc + (long)r0 * hs, hs, vt, nk, 0.0f, dS + (long)r0 * T, T);
            for (int i = r0; i < r1; i++) {
                const float *p = P + (long)i * T;
                float *d = dS + (long)i * T;
                int valid = attention_pos(a, s, i) + 1;
                float sum = dot_floats(p, d, valid);
                for (int j = 0; j < valid; j++) d[j] = scale * (p[j] * (d[j] - sum));
                for (int j = valid; j < attention_cols(kb, nk); j++) d[j] = 0.0f;
            }
            /* dQ[r0:r1] = dS[r0:r1, 0:kb] K[0:kb] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, kb,
                        1.0f, dS + (long)r0 * T, T, kc, hs, 0.0f, dq + (long)r0 * a->ldq,
                        a->ldq);
        }
        attention_backward_kv(a, s, nq, nk, P, dS, dOc, qc, dk, dv);
    }
    dm_free(work);
}

void attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH)
{
    struct attention_args a = {.dq = dqkv, .dk = dqkv + C, .dv = dqkv + 2 * C,
                               .scratch = scratch, .dout = dout, .q = qkv, .k = qkv + C,
                               .v = qkv + 2 * C, .att_in = att, .ldq = 3 * C, .ldkv = 3 * C,
                               .B = B, .T = T, .C = C, .NH = NH};
    dm_parallel_for((long)B * NH, 1, attention_backward_range, &a);
}

/* start (B+1) and pos (nactive) of ascending token indices rows. */
static void attention_rows_index(int *start, int *pos, const int *rows, int nactive, int B,
                                 int T)
{
    int i = 0;
    for (int b = 0; b <= B; b++) {
        while (i < nactive && rows[i] < b * T) i++;
        start[b] = i;
    }
    for (i = 0; i < nactive; i++) pos[i] = rows[i] % T;
}

void attention_forward_rows(float *out, float *att, const float *q, const float *kv,
                            const int *rows, int nactive, int B, int T, int C, int NH)
{
    int *start = dm_alloc((size_t)(B + 1 + nactive) * sizeof(int)), *pos = start + B + 1;
    attention_rows_index(start, pos, rows, nactive, B, T);
    struct attention_args a = {.out = out, .att = att, .q = q, .k = kv, .v = kv + C,
                               .ldq = C, .ldkv = 2 * C, .start = start, .pos = pos,
                               .B = B, .T = T, .C = C, .NH = NH};
    dm_parallel_for((long)B * NH, 1, attention_forward_range, &a);
    dm_free(start);
}

void attention_backward_rows(float *dq, float *dkv, float *scratch, const float *dout,
                             const float *q, const float *kv, const float *att,
                             const int *rows, int nactive, int B, int T, int C, int NH)
{
    int *start = dm_alloc((size_t)(B + 1 + nactive) * sizeof(int)), *pos = start + B + 1;
    attention_rows_index(start, pos, rows, nactive, B, T);
    struct attention_args a = {.dq = dq, .dk = dkv, .dv = dkv + C, .scratch = scratch,
                               .dout = dout, .q = q, .k = kv, .v = kv + C, .att_in = att,
                               .ldq = C, .ldkv = 2 * C, .start = start, .pos = pos,
                               .B = B, .T = T, .C = C, .NH = NH};
    dm_parallel_for((long)B * NH, 1, attention_backward_range, &a);
    dm_free(start);
}

/* ---- elementwise -------------------------------------------------------------- */

#define ELEM_GRAIN 4096

struct elementwise_args {
    float *out;
    const float *a, *b, *c;
};

/* gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed
 * as x * sigmoid(2u) (the same function: 1 + tanh(u) = 2 sigmoid(2u)),
 * which keeps its relative accuracy in the far negative tail. */
static inline float gelu_value(float x)
{
    float u = GELU_K * (x + GELU_C * x * x * x);
    return x * sigmoid_accurate(2.0f * u);
}

/* d/dx [x s(2u)] = s + 2 x s (1 - s) du/dx, s = sigmoid(2u) = 1 / (1 + e),
 * e = exp(-2u), and 1 - s = e s without cancellation. */
static inline float gelu_grad(float x)
{
    float u = GELU_K * (x + GELU_C * x * x * x);
    float e_neg = exp_lanes(-2.0f * u);
    float s = 1.0f / (1.0f + e_neg);
    float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    return s + 2.0f * x * s * (e_neg * s) * du;
}

static void gelu_span(float *restrict out, const float *restrict x, long n)
{
    for (long i = 0; i < n; i++) out[i] = gelu_value(x[i]);
}

/* d *= gelu'(x), in place */
static void gelu_grad_span(float *restrict d, const float *restrict x, long n)
{
    for (long i = 0; i < n; i++) d[i] = gelu_grad(x[i]) * d[i];
}

static void gelu_forward_range(void *arg, long begin, long end)
{
    const struct elementwise_args *e = arg;
    gelu_span(e->out + begin, e->a + begin, end - begin);
}

void gelu_forward(float *out, const float *inp, long N)
{
    struct elementwise_args e = {.out = out, .a = inp};
    dm_parallel_for(N, ELEM_GRAIN, gelu_forward_range, &e);
}

static void gelu_backward_range(void *arg, long begin, long end)
{
    const struct elementwise_args *e = arg;
    if (e->out != e->b) memcpy(e->out + begin, e->b + begin, (size_t)(end - begin) * sizeof(float));
    gelu_grad_span(e->out + begin, e->a + begin, end - begin);
}

/* dinp may be dout (not otherwise overlap it). */
void gelu_backward(float *dinp, const float *inp, const float *dout, long N)
{
    struct elementwise_args e = {.out = dinp, .a = inp, .b = dout};
    dm_parallel_for(N, ELEM_GRAIN, gelu_backward_range, &e);
}

static void residual_forward_range(void *arg, long begin, long end)
{
    const struct elementwise_args *e = arg;
    if (e->out == e->a || e->out == e->b) {
        float *restrict out = e->out;
        const float *restrict other = e->out == e->a ? e->b : e->a;
        for (long i = begin; i < end; i++) out[i] += other[i];
    } else {
        float *restrict out = e->out;
        const float *restrict a = e->a, *restrict b = e->b;
        for (long i = begin; i < end; i++) out[i] = a[i] + b[i];
    }
}

/* out may be a or b (not otherwise overlap them). */
void residual_forward(float *out, const float *a, const float *b, long N)
{
    struct elementwise_args e = {.out = out, .a = a, .b = b};
    dm_parallel_for(N, ELEM_GRAIN, residual_forward_range, &e);
}

/* ---- embedding ------------------------------------------------------------------ */

struct encoder_args {
    float *out, *dwte, *dwpe;
    const float *wte, *wpe, *dout;
    const int *tokens;
    int B, T, C;
};

static void encoder_forward_range(void *arg, long begin, long end)
{
    const struct encoder_args *a = arg;
    int C = a->C;
    for (long n = begin; n < end; n++) {
        const float *te = a->wte + (long)a->tokens[n] * C;
        const float *pe = a->wpe + (n % a->T) * C;
        float *o = a->out + n * C;
        for (int i = 0; i < C; i++) o[i] = te[i] + pe[i];
    }
}

void encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                     int B, int T, int C)
{
    struct encoder_args a = {.out = out, .tokens = tokens, .wte = wte, .wpe = wpe,
                             .B = B, .T = T, .C = C};
    dm_parallel_for((long)B * T, 16, encoder_forward_range, &a);
}

/* Split over columns: the tokens of the batch may repeat, so each column
 * of dwte is accumulated by one thread, over tokens in order. */
static void encoder_backward_range(void *arg, long begin, long end)
{
    const struct encoder_args *a = arg;
    int C = a->C;
    long N = (long)a->B * a->T;
    long c0 = begin, cols = end - begin;
    for (long n = 0; n < N; n++) {
        const float *d = a->dout + n * C + c0;
        float *te = a->dwte + (long)a->tokens[n] * C + c0;
        float *pe = a->dwpe + (n % a->T) * C + c0;
        for (long j = 0; j < cols; j++) {
            te[j] += d[j];
            pe[j] += d[j];
        }
    }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                      int B, int T, int C)
{
    struct encoder_args a = {.dwte = dwte, .dwpe = dwpe, .dout = dout, .tokens = tokens,
                             .B = B, .T = T, .C = C};
    dm_parallel_for(C, 16, encoder_backward_range, &a);
}

/* ---- softmax cross-entropy ---------------------------------------------------------- */

struct crossentropy_args {
    float *losses, *probs, *dlogits;
    const float *logits, *probs_in;
    const int *targets;
    float scale;
    int N, V;
};

static void crossentropy_forward_range(void *arg, long begin, long end)
{
    const struct crossentropy_args *a = arg;
    int V = a->V;
    for (long n = begin; n < end; n++) {
        const float *l = a->logits + n * V;
        float *p = a->probs + n * V;
        float mx = max_lanes(l, V);
        memcpy(p, l, (size_t)V * sizeof(float));
        float sum = exp_shifted_lanes(p, V, mx);
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++) p[i] *= inv;
        int t = a->targets[n];
        a->losses[n] = (float)(log((double)sum) - (double)(l[t] - mx));
    }
}

void crossentropy_forward(float *losses, float *probs, const float *logits,
                          const int *targets, int N, int V)
{
    struct crossentropy_args a = {.losses = losses, .probs = probs, .logits = logits,
                                  .targets = targets, .N = N, .V = V};
    dm_parallel_for(N, 4, crossentropy_forward_range, &a);
}

static void crossentropy_backward_range(void *arg, long begin, long end)
{
    const struct crossentropy_args *a = arg;
    int V = a->V;
    for (long n = begin; n < end; n++) {
        const float *p = a->probs_in + n * V;
        float *d = a->dlogits + n * V;
        int t = a->targets[n];
        float pt = p[t];
        for (int i = 0; i < V; i++) d[i] = p[i] * a->scale;
        d[t] = (pt - 1.0f) * a->scale;
    }
}

void crossentropy_softmax_backward(float *dlogits, const float *probs, const int *targets,
                                   float dloss_scale, int N, int V)
{
    struct crossentropy_args a = {.dlogits = dlogits, .probs_in = probs, .targets = targets,
                                  .scale = dloss_scale, .N = N, .V = V};
    dm_parallel_for(N, 4, crossentropy_backward_range, &a);
}
