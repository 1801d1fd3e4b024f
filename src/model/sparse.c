/* Sparse blocks: the CSR matrix kernels (forward, backward with a sampled
 * dense-dense product for the weight gradient) and the pruning state of a
 * block (mask, CSR form, their pack format of docs/block-slab.md).
 *
 * The kernels work on the transposed problem so that the inner loop runs
 * over contiguous rows of activations: out^T[o, n] = sum_j v_j x^T[c_j, n].
 * Rows n are cut into fixed tiles of TILE rows and every tile's result is
 * computed by one thread in a fixed order, so results never depend on the
 * thread count. Nothing here calls MPI or knows about the pruning policy
 * (that is src/dyn/prune.c). */
#include <stdio.h>
#include <string.h>
#include "dynmo/model.h"
#include "model/internal.h"

enum { TILE = 64 };   /* rows of activations per work item; a multiple of 8 */

/* Eight floats in one vector register (GCC vector extension): a tile row
 * is TILE / 8 of them, kept in registers across a row's nonzeros. */
typedef float vec8 __attribute__((vector_size(32)));
enum { TILE_VECS = TILE / 8 };

/* ---- scratch --------------------------------------------------------------
 * The full transposes of the backward's weight gradient live in one buffer
 * that grows to the largest call; ops run on one thread of control at a
 * time (dm_parallel_for is not reentrant), so one buffer is enough. */
static float *scratch;
static size_t scratch_floats;

static float *scratch_get(size_t floats)
{
    if (floats > scratch_floats) {
        dm_free(scratch);
        scratch = dm_alloc(floats * sizeof(float));
        scratch_floats = floats;
    }
    return scratch;
}

/* ---- transposes ------------------------------------------------------------ */

struct transpose_args {
    float *dst;            /* (cols, rows) */
    const float *src;      /* (rows, cols) */
    int rows, cols;
};

/* Sixteen columns at a time: each source cache line is read once. */
static void transpose_range(void *arg, long begin, long end)
{
    const struct transpose_args *a = arg;
    for (long c0 = begin; c0 < end; c0 += 16) {
        long c1 = c0 + 16 < end ? c0 + 16 : end;
        for (int r = 0; r < a->rows; r++) {
            const float *row = a->src + (size_t)r * a->cols;
            for (long c = c0; c < c1; c++) a->dst[(size_t)c * a->rows + r] = row[c];
        }
    }
}

static void parallel_transpose(float *dst, const float *src, int rows, int cols)
{
    struct transpose_args a = {.dst = dst, .src = src, .rows = rows, .cols = cols};
    dm_parallel_for(cols, 16, transpose_range, &a);
}

/* tile[c * TILE + i] = src[(n0 + i) * cols + c] for i < count, zero beyond. */
static void load_tile_transposed(float *tile, const float *src, int n0, int count, int cols)
{
    for (int c = 0; c < cols; c++) {
        float *t = tile + (size_t)c * TILE;
        for (int i = 0; i < count; i++) t[i] = src[(size_t)(n0 + i) * cols + c];
        for (int i = count; i < TILE; i++) t[i] = 0.0f;
    }
}

/* ---- forward -------------------------------------------------------------- */

struct sparse_forward_args {
    float *out;
    const float *inp, *bias;
    const struct csr_matrix *w;
    int N, C, OC;
};

static void sparse_forward_range(void *arg, long begin, long end)
{
    const struct sparse_forward_args *a = arg;
    const struct csr_matrix *w = a->w;
    float *xt = dm_alloc((size_t)a->C * TILE * sizeof(float));   /* (C, TILE) */
    float acc[TILE];
    for (long tile = begin; tile < end; tile++) {
        int n0 = (int)tile * TILE, count = a->N - n0 < TILE ? a->N - n0 : TILE;
        load_tile_transposed(xt, a->inp, n0, count, a->C);
        for (int o = 0; o < a->OC; o++) {
            float b = a->bias ? a->bias[o] : 0.0f;
            vec8 sum[TILE_VECS];
            for (int q = 0; q < TILE_VECS; q++) sum[q] = (vec8){0};
            for (int j = w->row_ptr[o]; j < w->row_ptr[o + 1]; j++) {
                float v = w->values[j];
                const vec8 *x = (const vec8 *)(xt + (size_t)w->col_idx[j] * TILE);
                for (int q = 0; q < TILE_VECS; q++) sum[q] += v * x[q];
            }
            memcpy(acc, sum, sizeof acc);
            for (int i = 0; i < count; i++) a->out[(size_t)(n0 + i) * a->OC + o] = acc[i] + b;
        }
    }
    dm_free(xt);
}

void sparse_matmul_forward(float *out, const float *inp, const struct csr_matrix *weight,
                           const float *bias, int N, int C, int OC)
{
    DM_ASSERT(weight->rows == OC && weight->cols == C);
    struct sparse_forward_args a = {.out = out, .inp = inp, .bias = bias, .w = weight,
                                    .N = N, .C = C, .OC = OC};
    dm_parallel_for((N + TILE - 1) / TILE, 1, sparse_forward_range, &a);
}

/* ---- backward -------------------------------------------------------------- */

/* dinp = dout @ W, tile by tile: dx^T[c_j, :] += v_j dout^T[o, :]. */
static void sparse_dinp_range(void *arg, long begin, long end)
{
    const struct sparse_forward_args *a = arg;   /* out = dinp, inp = dout */
    const struct csr_matrix *w = a->w;
    float *dt = dm_alloc((size_t)a->OC * TILE * sizeof(float));  /* (OC, TILE) */
    float *xt = dm_alloc((size_t)a->C * TILE * sizeof(float));   /* (C, TILE) */
    for (long tile = begin; tile < end; tile++) {
        int n0 = (int)tile * TILE, count = a->N - n0 < TILE ? a->N - n0 : TILE;
        load_tile_transposed(dt, a->inp, n0, count, a->OC);
        memset(xt, 0, (size_t)a->C * TILE * sizeof(float));
        for (int o = 0; o < a->OC; o++) {
            vec8 d[TILE_VECS];
            memcpy(d, dt + (size_t)o * TILE, sizeof d);
            for (int j = w->row_ptr[o]; j < w->row_ptr[o + 1]; j++) {
                float v = w->values[j];
                vec8 *x = (vec8 *)(xt + (size_t)w->col_idx[j] * TILE);
                for (int q = 0; q < TILE_VECS; q++) x[q] += v * d[q];
            }
        }
        for (int i = 0; i < count; i++) {
            float *row = a->out + (size_t)(n0 + i) * a->C;
            for (int c = 0; c < a->C; c++) row[c] = xt[(size_t)c * TILE + i];
        }
    }
    dm_free(dt);
    dm_free(xt);
}

/* 32 independent partial sums in four vector registers (so that the adds
 * do not wait on each other), added in a fixed order at the end. */
static float dot(const float *a, const float *b, int n)
{
    vec8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, x[4], y[4];
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        memcpy(x, a + i, sizeof x);
        memcpy(y, b + i, sizeof y);
        s0 += x[0] * y[0];
        s1 += x[1] * y[1];
        s2 += x[2] * y[2];
        s3 += x[3] * y[3];
    }
    vec8 s = (s0 + s1) + (s2 + s3);
    float part[8];
    memcpy(part, &s, sizeof part);
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return (((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]))) + tail;
}

struct sampled_args {
    float *dweight, *dbias;
    const float *doutT, *inpT;   /* (OC, N), (C, N) */
    const struct csr_matrix *w;
    int N, C;
};

static void sampled_range(void *arg, long begin, long end)
{
    const struct sampled_args *a = arg;
    const struct csr_matrix *w = a->w;
    for (long o = begin; o < end; o++) {
        const float *d = a->doutT + (size_t)o * a->N;
        if (a->dweight)
            for (int j = w->row_ptr[o]; j < w->row_ptr[o + 1]; j++) {
                int c = w->col_idx[j];
                a->dweight[(size_t)o * a->C + c] += dot(d, a->inpT + (size_t)c * a->N, a->N);
            }
        if (a->dbias) {
            float sum = 0.0f;
            for (int n = 0; n < a->N; n++) sum += d[n];
            a->dbias[o] += sum;
        }
    }
}

void sparse_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const struct csr_matrix *weight, int N, int C,
                            int OC)
{
    DM_ASSERT(weight->rows == OC && weight->cols == C);
    if (dinp) {
        struct sparse_forward_args a = {.out = dinp, .inp = dout, .w = weight,
                                        .N = N, .C = C, .OC = OC};
        dm_parallel_for((N + TILE - 1) / TILE, 1, sparse_dinp_range, &a);
    }
    if (!dweight && !dbias) return;
    float *doutT = scratch_get((size_t)N * (OC + C));
    float *inpT = doutT + (size_t)N * OC;
    parallel_transpose(doutT, dout, N, OC);
    if (dweight) parallel_transpose(inpT, inp, N, C);
    struct sampled_args s = {.dweight = dweight, .dbias = dbias, .doutT = doutT, .inpT = inpT,
                             .w = weight, .N = N, .C = C};
    dm_parallel_for(OC, 4, sampled_range, &s);
}

/* ---- the pruning state of a block ------------------------------------------ */

int block_matrix_tensor(int m)
{
    static const int tensors[BLOCK_MATRICES] = {BP_QKV_W, BP_ATTPROJ_W, BP_FC_W, BP_FCPROJ_W};
    DM_ASSERT(m >= 0 && m < BLOCK_MATRICES);
    return tensors[m];
}

size_t block_matrix_weights(int C) { return 12 * (size_t)C * (size_t)C; }

/* Rows and columns of matrix slot m (as torch.nn.Linear: (out, in)). */
static void matrix_shape(int C, int m, int *rows, int *cols)
{
    static const int r[BLOCK_MATRICES] = {3, 1, 4, 1}, c[BLOCK_MATRICES] = {1, 1, 1, 4};
    *rows = r[m] * C;
    *cols = c[m] * C;
}

/* Offset of matrix slot m inside the mask (matrix-weight order). */
static size_t mask_offset(int C, int m)
{
    size_t off = 0;
    for (int i = 0; i < m; i++) off += block_tensor_size(C, block_matrix_tensor(i));
    return off;
}

static void csr_free(struct csr_matrix *csr)
{
    dm_free(csr->row_ptr);
    dm_free(csr->col_idx);
    dm_free(csr->values);
    memset(csr, 0, sizeof *csr);
}

static void csr_from_mask(struct csr_matrix *csr, const unsigned char *mask, int rows, int cols)
{
    csr_free(csr);
    csr->rows = rows;
    csr->cols = cols;
    csr->row_ptr = dm_alloc((size_t)(rows + 1) * sizeof(int));
    long nnz = 0;
    for (size_t i = 0; i < (size_t)rows * cols; i++) nnz += mask[i];
    csr->nnz = (int)nnz;
    csr->col_idx = dm_alloc((size_t)(nnz ? nnz : 1) * sizeof(int));
    csr->values = dm_alloc((size_t)(nnz ? nnz : 1) * sizeof(float));
    int j = 0;
    for (int r = 0; r < rows; r++) {
        csr->row_ptr[r] = j;
        for (int c = 0; c < cols; c++)
            if (mask[(size_t)r * cols + c]) csr->col_idx[j++] = c;
    }
    csr->row_ptr[rows] = j;
}

void block_sparse_free(struct block *blk)
{
    if (!blk->sparse) return;
    for (int m = 0; m < BLOCK_MATRICES; m++) csr_free(&blk->sparse->csr[m]);
    dm_free(blk->sparse->mask);
    dm_free(blk->sparse);
    blk->sparse = NULL;
}

static void build_csr(struct block *blk)
{
    struct block_sparse *sp = blk->sparse;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        int rows, cols;
        matrix_shape(blk->C, m, &rows, &cols);
        csr_from_mask(&sp->csr[m], sp->mask + mask_offset(blk->C, m), rows, cols);
    }
    sp->use_csr = 1;
    block_sparse_refresh(blk);
}

void block_sparse_refresh(struct block *blk)
{
    struct block_sparse *sp = blk->sparse;
    if (!sp || !sp->use_csr) return;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        const struct csr_matrix *csr = &sp->csr[m];
        const float *w = blk->p[block_matrix_tensor(m)];
        for (int r = 0; r < csr->rows; r++)
            for (int j = csr->row_ptr[r]; j < csr->row_ptr[r + 1]; j++)
                csr->values[j] = w[(size_t)r * csr->cols + csr->col_idx[j]];
    }
}

struct mask_grads_args {
    float *g;
    const unsigned char *mask;
};

static void mask_grads_range(void *arg, long begin, long end)
{
    const struct mask_grads_args *a = arg;
    for (long i = begin; i < end; i++)
        if (!a->mask[i]) a->g[i] = 0.0f;
}

void block_sparse_mask_grads(struct block *blk, int k)
{
    const struct block_sparse *sp = blk->sparse;
    if (!sp) return;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        if (block_matrix_tensor(m) != k) continue;
        struct mask_grads_args a = {.g = blk->g[k], .mask = sp->mask + mask_offset(blk->C, m)};
        dm_parallel_for((long)block_tensor_size(blk->C, k), 4096, mask_grads_range, &a);
    }
}

void block_prune(struct block *blk, const unsigned char *keep, double csr_sparsity)
{
    size_t total = block_matrix_weights(blk->C);
    if (!blk->sparse) {
        blk->sparse = dm_alloc(sizeof *blk->sparse);
        blk->sparse->mask = dm_alloc(total);
    }
    struct block_sparse *sp = blk->sparse;
    long kept = 0;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        int k = block_matrix_tensor(m);
        size_t off = mask_offset(blk->C, m), n = block_tensor_size(blk->C, k);
        size_t base = block_tensor_offset(blk->C, k);
        for (size_t i = 0; i < n; i++) {
            unsigned char on = keep ? (keep[off + i] != 0) : (blk->p[k][i] != 0.0f);
            sp->mask[off + i] = on;
            kept += on;
            if (!on) {
                blk->params[base + i] = 0.0f;
                blk->grads[base + i] = 0.0f;
                blk->m[base + i] = 0.0f;
                blk->v[base + i] = 0.0f;
            }
        }
    }
    sp->kept = kept;
    for (int m = 0; m < BLOCK_MATRICES; m++) csr_free(&sp->csr[m]);
    sp->use_csr = 0;
    if (block_matrix_sparsity(blk) >= csr_sparsity) build_csr(blk);
}

double block_matrix_sparsity(const struct block *blk)
{
    if (!blk->sparse) return 0.0;
    double total = (double)block_matrix_weights(blk->C);
    return (total - (double)blk->sparse->kept) / total;
}

/* ---- pack format of the dynamic state (docs/block-slab.md) -------------------- */

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

uint64_t block_sparse_flags(const struct block *blk)
{
    if (!blk->sparse) return 0;
    return BLOCK_FLAG_MASKED | (blk->sparse->use_csr ? BLOCK_FLAG_CSR : 0);
}

static size_t csr_index_bytes(int C, long kept)
{
    size_t rows = 0;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        int r, c;
        matrix_shape(C, m, &r, &c);
        rows += (size_t)r + 1;
    }
    return pad8((rows + (size_t)kept) * sizeof(int32_t));
}

size_t block_sparse_pack_bytes(const struct block *blk)
{
    if (!blk->sparse) return 0;
    size_t bytes = pad8(block_matrix_weights(blk->C));
    if (blk->sparse->use_csr) bytes += csr_index_bytes(blk->C, blk->sparse->kept);
    return bytes;
}

void block_sparse_pack(const struct block *blk, unsigned char *out)
{
    const struct block_sparse *sp = blk->sparse;
    if (!sp) return;
    size_t n = block_matrix_weights(blk->C);
    memcpy(out, sp->mask, n);
    memset(out + n, 0, pad8(n) - n);
    out += pad8(n);
    if (!sp->use_csr) return;
    size_t used = 0;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        const struct csr_matrix *csr = &sp->csr[m];
        memcpy(out + used, csr->row_ptr, (size_t)(csr->rows + 1) * sizeof(int32_t));
        used += (size_t)(csr->rows + 1) * sizeof(int32_t);
        memcpy(out + used, csr->col_idx, (size_t)csr->nnz * sizeof(int32_t));
        used += (size_t)csr->nnz * sizeof(int32_t);
    }
    memset(out + used, 0, pad8(used) - used);
}

int block_sparse_unpack(struct block *blk, uint64_t flags, const unsigned char *in,
                        size_t bytes, char *err, size_t errsize)
{
    block_sparse_free(blk);
    if (!(flags & BLOCK_FLAG_MASKED)) {
        if (flags & BLOCK_FLAG_CSR) {
            snprintf(err, errsize, "packed block %d has the CSR flag without a mask", blk->index);
            return -1;
        }
        return 0;
    }
    size_t n = block_matrix_weights(blk->C);
    if (bytes < pad8(n)) {
        snprintf(err, errsize, "packed block %d: its mask needs %zu bytes, the pack has %zu",
                 blk->index, pad8(n), bytes);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (in[i] > 1) {
            snprintf(err, errsize, "packed block %d: mask byte %zu is %u (must be 0 or 1)",
                     blk->index, i, in[i]);
            return -1;
        }
    /* The mask is the truth; block_prune re-zeroes what it prunes (already
     * zero in a well-formed pack) and rebuilds the CSR form. */
    block_prune(blk, in, (flags & BLOCK_FLAG_CSR) ? -1.0 : 2.0);
    const struct block_sparse *sp = blk->sparse;
    size_t expected = pad8(n) + ((flags & BLOCK_FLAG_CSR) ? csr_index_bytes(blk->C, sp->kept) : 0);
    if (bytes != expected) {
        snprintf(err, errsize, "packed block %d has %zu bytes of dynamic state, expected %zu",
                 blk->index, bytes, expected);
        block_sparse_free(blk);
        return -1;
    }
    if (flags & BLOCK_FLAG_CSR) {
        const unsigned char *p = in + pad8(n);
        for (int m = 0; m < BLOCK_MATRICES; m++) {
            const struct csr_matrix *csr = &sp->csr[m];
            size_t rb = (size_t)(csr->rows + 1) * sizeof(int32_t), cb = (size_t)csr->nnz * sizeof(int32_t);
            if (memcmp(p, csr->row_ptr, rb) != 0 || memcmp(p + rb, csr->col_idx, cb) != 0) {
                snprintf(err, errsize, "packed block %d: the CSR indices of matrix %d do not "
                         "match its mask", blk->index, m);
                block_sparse_free(blk);
                return -1;
            }
            p += rb + cb;
        }
    }
    return 0;
}
