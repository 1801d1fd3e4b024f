/* Sparse blocks: the CSR matrix kernels (forward, backward with a sampled
 * dense-dense product for the weight gradient) and the pruning state of a
 * block (mask, CSR form, their pack format of docs/block-slab.md).
 *
 * The kernels work on the transposed problem so that the inner loop runs
 * over contiguous rows of activations: out^T[o, n] = sum_j v_j x^T[c_j, n].
 * Rows n are cut into fixed tiles of TILE rows, transposed into L1/L2-sized
 * buffers, and every tile's result is computed by one thread in a fixed
 * order (the weight gradient's shares of the tiles are added in tile
 * order), so results never depend on the thread count. The masks of dense
 * pruned blocks are applied to their gradients once a step
 * (gpt_mask_pruned_grads), not in every micro-batch's backward. Nothing
 * here calls MPI or knows about the pruning policy (that is
 * src/dyn/prune.c). */
#include <stdio.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/model.h"
#include "model/internal.h"

enum { TILE = 64 };   /* rows of activations per work item; a multiple of 8 */

/* Eight floats in one vector register (GCC vector extension): a tile row
 * is TILE / 8 of them, kept in registers across a row's nonzeros. */
typedef float vec8 __attribute__((vector_size(32)));
enum { TILE_VECS = TILE / 8 };

/* ---- scratch --------------------------------------------------------------
 * The backward's per-tile shares of the weight gradient live in one buffer
 * that grows to the largest call; ops run on one thread of control at a
 * time (dm_parallel_for is not reentrant), so one buffer is enough. */
static struct grow_buffer scratch;

/* ---- tiles ---------------------------------------------------------------- */

/* Both transposes go by blocks of TILE_COLS columns, one cache line of a
 * row: every line of the row-major side is touched once, and the block's
 * TILE_COLS tile rows stay in L1 meanwhile. (Column by column, the TILE
 * source rows sit 4 KiB apart at 1024 columns, all in one L1 set, and
 * were fetched again for every column.) */
enum { TILE_COLS = 16 };

/* tile[c * TILE + i] = src[(n0 + i) * cols + c] for i < count, zero beyond. */
static void load_tile_transposed(float *tile, const float *src, int n0, int count, int cols)
{
    for (int c0 = 0; c0 < cols; c0 += TILE_COLS) {
        int c1 = c0 + TILE_COLS < cols ? c0 + TILE_COLS : cols;
        for (int i = 0; i < count; i++) {
            const float *row = src + (size_t)(n0 + i) * cols;
            for (int c = c0; c < c1; c++) tile[(size_t)c * TILE + i] = row[c];
        }
        for (int c = c0; c < c1; c++)
            for (int i = count; i < TILE; i++) tile[(size_t)c * TILE + i] = 0.0f;
    }
}

/* dst[(n0 + i) * cols + c] = tile[c * TILE + i] (+ bias[c] if given), i < count. */
static void store_tile_transposed(float *dst, const float *tile, const float *bias, int n0,
                                  int count, int cols)
{
    for (int c0 = 0; c0 < cols; c0 += TILE_COLS) {
        int c1 = c0 + TILE_COLS < cols ? c0 + TILE_COLS : cols;
        for (int i = 0; i < count; i++) {
            float *row = dst + (size_t)(n0 + i) * cols;
            if (bias)
                for (int c = c0; c < c1; c++) row[c] = tile[(size_t)c * TILE + i] + bias[c];
            else
                for (int c = c0; c < c1; c++) row[c] = tile[(size_t)c * TILE + i];
        }
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
    float *xt = dm_alloc((size_t)a->C * TILE * sizeof(float));    /* (C, TILE) */
    float *ot = dm_alloc((size_t)a->OC * TILE * sizeof(float));   /* (OC, TILE) */
    for (long tile = begin; tile < end; tile++) {
        int n0 = (int)tile * TILE, count = a->N - n0 < TILE ? a->N - n0 : TILE;
        load_tile_transposed(xt, a->inp, n0, count, a->C);
        for (int o = 0; o < a->OC; o++) {
            vec8 sum[TILE_VECS];
            for (int q = 0; q < TILE_VECS; q++) sum[q] = (vec8){0};
            for (int j = w->row_ptr[o]; j < w->row_ptr[o + 1]; j++) {
                float v = w->values[j];
                const vec8 *x = (const vec8 *)(xt + (size_t)w->col_idx[j] * TILE);
                for (int q = 0; q < TILE_VECS; q++) sum[q] += v * x[q];
            }
            memcpy(ot + (size_t)o * TILE, sum, sizeof sum);
        }
        store_tile_transposed(a->out, ot, a->bias, n0, count, a->OC);
    }
    dm_free(xt);
    dm_free(ot);
}

void sparse_matmul_forward(float *out, const float *inp, const struct csr_matrix *weight,
                           const float *bias, int N, int C, int OC)
{
    DM_ASSERT(weight->rows == OC && weight->cols == C);
    struct sparse_forward_args a = {.out = out, .inp = inp, .bias = bias, .w = weight,
                                    .N = N, .C = C, .OC = OC};
    dm_parallel_for((N + TILE - 1) / TILE, 1, sparse_forward_range, &a);
}

/* ---- backward --------------------------------------------------------------
 * One pass over the tiles of TILE rows does both products: with the tile's
 * dout^T (OC, TILE) and inp^T (C, TILE) in cache, each nonzero (o, c_j)
 * adds v_j dout^T[o, :] to dinp^T[c_j, :] and takes the dot product
 * dout^T[o, :] . inp^T[c_j, :], its weight gradient's share of the tile
 * (the sampled dense-dense product). The shares go to partial[tile, j] and
 * are summed over the tiles in tile order afterwards, so the result does
 * not depend on how the tiles were spread over threads. */

struct sparse_backward_args {
    float *dinp;                  /* (N, C) or NULL */
    float *partial;               /* (tiles, nnz) or NULL: no weight gradient */
    const float *dout, *inp;      /* (N, OC), (N, C) */
    const struct csr_matrix *w;
    int N, C, OC;
};

/* The eight lanes of v added in a fixed order: pairs, then quads, then
 * the two halves. */
static inline float sum_lanes(vec8 v)
{
    float p[8];
    memcpy(p, &v, sizeof p);
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

typedef int ivec8 __attribute__((vector_size(32)));

/* Lane k of the result is sum_lanes(s[k]), the same additions in the same
 * order, eight at once with shuffles instead of eight trips through memory. */
static inline vec8 sum_lanes8(const vec8 s[8])
{
    const ivec8 even = {0, 8, 2, 10, 4, 12, 6, 14}, odd = {1, 9, 3, 11, 5, 13, 7, 15};
    const ivec8 lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const ivec8 lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    vec8 pair[4], quad[2];
    for (int k = 0; k < 4; k++)   /* s[2k][2i] + s[2k][2i+1], s[2k+1][2i] + s[2k+1][2i+1], ... */
        pair[k] = __builtin_shuffle(s[2 * k], s[2 * k + 1], even) +
                  __builtin_shuffle(s[2 * k], s[2 * k + 1], odd);
    for (int k = 0; k < 2; k++)   /* quads of s[4k..4k+3]: low halves, then high halves */
        quad[k] = __builtin_shuffle(pair[2 * k], pair[2 * k + 1], lo2) +
                  __builtin_shuffle(pair[2 * k], pair[2 * k + 1], hi2);
    return __builtin_shuffle(quad[0], quad[1], lo4) + __builtin_shuffle(quad[0], quad[1], hi4);
}

/* dout^T[o, :] . x^T[c, :] over one tile, as eight lanes (two chains). */
static inline vec8 tile_dot(const vec8 *d, const float *xt_row)
{
    const vec8 *x = (const vec8 *)xt_row;
    vec8 s0 = d[0] * x[0], s1 = d[1] * x[1];
    for (int q = 2; q < TILE_VECS; q += 2) {
        s0 += d[q] * x[q];
        s1 += d[q + 1] * x[q + 1];
    }
    return s0 + s1;
}

static void sparse_backward_range(void *arg, long begin, long end)
{
    const struct sparse_backward_args *a = arg;
    const struct csr_matrix *w = a->w;
    float *dt = dm_alloc((size_t)a->OC * TILE * sizeof(float));               /* (OC, TILE) */
    float *xt = a->partial ? dm_alloc((size_t)a->C * TILE * sizeof(float)) : NULL;  /* (C, TILE) */
    float *dxt = a->dinp ? dm_alloc((size_t)a->C * TILE * sizeof(float)) : NULL;    /* (C, TILE) */
    for (long tile = begin; tile < end; tile++) {
        int n0 = (int)tile * TILE, count = a->N - n0 < TILE ? a->N - n0 : TILE;
        load_tile_transposed(dt, a->dout, n0, count, a->OC);
        if (xt) load_tile_transposed(xt, a->inp, n0, count, a->C);
        if (dxt) memset(dxt, 0, (size_t)a->C * TILE * sizeof(float));
        float *part = a->partial ? a->partial + (size_t)tile * w->nnz : NULL;
        for (int o = 0; o < a->OC; o++) {
            vec8 d[TILE_VECS];
            memcpy(d, dt + (size_t)o * TILE, sizeof d);
            int j0 = w->row_ptr[o], j1 = w->row_ptr[o + 1];
            if (part) {
                int j = j0;
                for (; j + 8 <= j1; j += 8) {
                    vec8 sums[8];
                    for (int k = 0; k < 8; k++)
                        sums[k] = tile_dot(d, xt + (size_t)w->col_idx[j + k] * TILE);
                    vec8 total = sum_lanes8(sums);
                    memcpy(part + j, &total, sizeof total);
                }
                for (; j < j1; j++) part[j] = sum_lanes(tile_dot(d, xt + (size_t)w->col_idx[j] * TILE));
            }
            if (dxt)
                for (int j = j0; j < j1; j++) {
                    float v = w->values[j];
                    vec8 *x = (vec8 *)(dxt + (size_t)w->col_idx[j] * TILE);
                    for (int q = 0; q < TILE_VECS; q++) x[q] += v * d[q];
                }
        }
        if (dxt) store_tile_transposed(a->dinp, dxt, NULL, n0, count, a->C);
    }
    dm_free(dt);
    dm_free(xt);
    dm_free(dxt);
}

struct sampled_sum_args {
    float *dweight, *dbias;
    const float *partial, *dout;   /* (tiles, nnz), (N, OC) */
    const struct csr_matrix *w;
    int tiles, N, OC;
};

enum { SUM_ROWS = 16 };   /* output rows per work item of the sums */

/* Rows [begin, end): dweight at their nonzeros += the tiles' shares added
 * in tile order; dbias += dout summed over n in order. */
static void sampled_sum_range(void *arg, long begin, long end)
{
    const struct sampled_sum_args *a = arg;
    const struct csr_matrix *w = a->w;
    size_t C = (size_t)w->cols;
    for (long o0 = begin; o0 < end; o0 += SUM_ROWS) {
        long o1 = o0 + SUM_ROWS < end ? o0 + SUM_ROWS : end;
        if (a->dweight)
            for (long o = o0; o < o1; o++)
                for (int j = w->row_ptr[o]; j < w->row_ptr[o + 1]; j++) {
                    float sum = 0.0f;
                    for (int t = 0; t < a->tiles; t++) sum += a->partial[(size_t)t * w->nnz + j];
                    a->dweight[(size_t)o * C + w->col_idx[j]] += sum;
                }
        if (a->dbias) {
            float sum[SUM_ROWS] = {0};
            for (int n = 0; n < a->N; n++) {
                const float *row = a->dout + (size_t)n * a->OC;
                for (long o = o0; o < o1; o++) sum[o - o0] += row[o];
            }
            for (long o = o0; o < o1; o++) a->dbias[o] += sum[o - o0];
        }
    }
}

void sparse_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const struct csr_matrix *weight, int N, int C,
                            int OC)
{
    DM_ASSERT(weight->rows == OC && weight->cols == C);
    int tiles = (N + TILE - 1) / TILE;
    float *partial = NULL;
    if (dweight && weight->nnz > 0) partial = grow_buffer_get(&scratch, (size_t)tiles * weight->nnz);
    if (dinp || partial) {
        struct sparse_backward_args a = {.dinp = dinp, .partial = partial, .dout = dout,
                                         .inp = inp, .w = weight, .N = N, .C = C, .OC = OC};
        dm_parallel_for(tiles, 1, sparse_backward_range, &a);
    }
    if (!partial && !dbias) return;
    struct sampled_sum_args s = {.dweight = partial ? dweight : NULL, .dbias = dbias,
                                 .partial = partial, .dout = dout, .w = weight, .tiles = tiles,
                                 .N = N, .OC = OC};
    dm_parallel_for(OC, SUM_ROWS, sampled_sum_range, &s);
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

/* The device arrays of sp (nothing on the CPU). */
static void sparse_device_free(struct block_sparse *sp)
{
    if (!sp->on_device) return;
    const struct dm_backend *ops = backend_current();
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        struct csr_matrix *d = &sp->csr_device[m];
        if (d->row_ptr) ops->free(d->row_ptr);
        if (d->col_idx) ops->free(d->col_idx);
        if (d->values) ops->free(d->values);
        if (sp->value_at[m]) ops->free(sp->value_at[m]);
        memset(d, 0, sizeof *d);
        sp->value_at[m] = NULL;
    }
    if (sp->pruned) ops->free(sp->pruned);
    if (sp->zeros) ops->free(sp->zeros);
    sp->pruned = NULL;
    sp->zeros = NULL;
    sp->on_device = 0;
}

/* n ints of host memory in the backend's */
static int *ints_up(const int *host, size_t n)
{
    int *device = backend_current()->alloc((n ? n : 1) * sizeof(int));
    backend_current()->copy_to_device(device, host, n * sizeof(int));
    return device;
}

/* On a device: csr[m]'s arrays copied up, with each value's position in
 * its matrix (for the refresh gather). */
static void csr_device_build(struct block_sparse *sp, int m)
{
    const struct csr_matrix *csr = &sp->csr[m];
    struct csr_matrix *d = &sp->csr_device[m];
    *d = *csr;
    d->row_ptr = ints_up(csr->row_ptr, (size_t)csr->rows + 1);
    d->col_idx = ints_up(csr->col_idx, (size_t)csr->nnz);
    d->values = backend_current()->alloc((size_t)(csr->nnz ? csr->nnz : 1) * sizeof(float));
    int *at = dm_alloc((size_t)(csr->nnz ? csr->nnz : 1) * sizeof(int));
    for (int r = 0; r < csr->rows; r++)
        for (int j = csr->row_ptr[r]; j < csr->row_ptr[r + 1]; j++)
            at[j] = r * csr->cols + csr->col_idx[j];
    sp->value_at[m] = ints_up(at, (size_t)csr->nnz);
    dm_free(at);
}

/* On a device whose memory the host cannot read: the device arrays of
 * blk's mask and CSR form (sparse_device_free first). */
static void sparse_device_build(struct block *blk)
{
    struct block_sparse *sp = blk->sparse;
    sparse_device_free(sp);
    if (backend_current()->host_access) return;
    sp->on_device = 1;
    size_t total = block_matrix_weights(blk->C), npruned = total - (size_t)sp->kept, j = 0;
    int *pruned = dm_alloc((npruned ? npruned : 1) * sizeof(int));
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        int k = block_matrix_tensor(m);
        size_t off = mask_offset(blk->C, m), n = block_tensor_size(blk->C, k);
        size_t base = block_tensor_offset(blk->C, k);
        for (size_t i = 0; i < n; i++)
            if (!sp->mask[off + i]) pruned[j++] = (int)(base + i);
        if (sp->use_csr) csr_device_build(sp, m);
    }
    sp->pruned = ints_up(pruned, npruned);
    sp->zeros = backend_current()->alloc((npruned ? npruned : 1) * sizeof(float));
    dm_free(pruned);
}

const struct csr_matrix *block_sparse_csr(const struct block *blk, int m)
{
    const struct block_sparse *sp = blk->sparse;
    return sp->on_device ? &sp->csr_device[m] : &sp->csr[m];
}

void block_sparse_free(struct block *blk)
{
    if (!blk->sparse) return;
    sparse_device_free(blk->sparse);
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
}

int block_matrix_half(int m)
{
    DM_ASSERT(m >= 0 && m < BLOCK_MATRICES);
    return m < 2 ? BLOCK_HALF_ATTENTION : BLOCK_HALF_MLP;
}

int block_owns_matrix(const struct block *blk, int m)
{
    return !block_is_half(blk) || block_matrix_half(m) == blk->halves;
}

void block_half_mask_range(int C, int half, size_t *offset, size_t *count)
{
    DM_ASSERT(half == BLOCK_HALF_ATTENTION || half == BLOCK_HALF_MLP);
    size_t attention = mask_offset(C, 2);
    *offset = half == BLOCK_HALF_MLP ? attention : 0;
    *count = half == BLOCK_HALF_MLP ? block_matrix_weights(C) - attention : attention;
}

/* A half's CSR values (block_is_half) are its own matrices': the other
 * half's weights are another stage's. */
void block_sparse_refresh(struct block *blk)
{
    struct block_sparse *sp = blk->sparse;
    if (!sp || !sp->use_csr) return;
    if (sp->on_device) {   /* values[j] = W[value_at[j]]: a gather of single floats */
        for (int m = 0; m < BLOCK_MATRICES; m++) {
            const struct csr_matrix *d = &sp->csr_device[m];
            if (d->nnz > 0 && block_owns_matrix(blk, m))
                backend_current()->rows_gather(d->values, blk->p[block_matrix_tensor(m)],
                                               sp->value_at[m], d->nnz, 1);
        }
        return;
    }
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        if (!block_owns_matrix(blk, m)) continue;
        const struct csr_matrix *csr = &sp->csr[m];
        const float *w = blk->p[block_matrix_tensor(m)];
        for (int r = 0; r < csr->rows; r++)
            for (int j = csr->row_ptr[r]; j < csr->row_ptr[r + 1]; j++)
                csr->values[j] = w[(size_t)r * csr->cols + csr->col_idx[j]];
    }
}

/* The mask in matrix-weight order runs over the four matrices one after
 * the other; a range of it is cut at the matrix boundaries. Branch-free
 * (a select per weight, vectorized): at 50% sparsity a branch on the mask
 * mispredicts half the time. */
struct mask_grads_args {
    float *g[BLOCK_MATRICES];         /* the matrices' gradients */
    size_t end[BLOCK_MATRICES];       /* cumulative sizes in mask order */
    const unsigned char *mask;        /* (12C^2) */
};

static void mask_grads_range(void *arg, long begin, long end)
{
    const struct mask_grads_args *a = arg;
    size_t start = 0;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        size_t lo = (size_t)begin > start ? (size_t)begin : start;
        size_t hi = (size_t)end < a->end[m] ? (size_t)end : a->end[m];
        float *restrict g = a->g[m];
        const unsigned char *restrict mask = a->mask + start;
        for (size_t i = lo; i < hi; i++) g[i - start] = mask[i - start] ? g[i - start] : 0.0f;
        start = a->end[m];
    }
}

void gpt_mask_pruned_grads(struct gpt *model)
{
    double clock = dm_profile_now();
    for (int b = 0; b < model->num_blocks; b++) {
        struct block *blk = &model->blocks[b];
        /* CSR blocks never compute a pruned weight's gradient; frozen
         * blocks compute none. */
        if (!blk->sparse || blk->sparse->use_csr || blk->frozen) continue;
        if (blk->sparse->on_device) {   /* zeros scattered to the pruned gradients */
            long npruned = (long)block_matrix_weights(blk->C) - blk->sparse->kept;
            if (npruned > 0)
                backend_current()->rows_scatter(blk->grads, blk->sparse->zeros,
                                                blk->sparse->pruned, (int)npruned, 1, 0);
            gpt_charge_update(model, b, &clock);
            continue;
        }
        struct mask_grads_args a = {.mask = blk->sparse->mask};
        size_t total = 0;
        for (int m = 0; m < BLOCK_MATRICES; m++) {
            int k = block_matrix_tensor(m);
            a.g[m] = blk->g[k];
            total += block_tensor_size(blk->C, k);
            a.end[m] = total;
        }
        dm_parallel_for((long)total, 16384, mask_grads_range, &a);
        gpt_charge_update(model, b, &clock);
    }
}

/* The mask from keep (or, NULL, from the nonzero weights), and the pruned
 * weights, their gradients and moments zeroed, on blk's host view;
 * returns the weights kept. */
static long prune_view(struct block *view, unsigned char *mask, const unsigned char *keep)
{
    long kept = 0;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        int k = block_matrix_tensor(m);
        size_t off = mask_offset(view->C, m), n = block_tensor_size(view->C, k);
        size_t base = block_tensor_offset(view->C, k);
        for (size_t i = 0; i < n; i++) {
            unsigned char on = keep ? (keep[off + i] != 0) : (view->p[k][i] != 0.0f);
            mask[off + i] = on;
            kept += on;
            if (!on) {
                view->params[base + i] = 0.0f;
                view->grads[base + i] = 0.0f;
                view->m[base + i] = 0.0f;
                view->v[base + i] = 0.0f;
            }
        }
    }
    return kept;
}

/* blk's pruning state, made on first use (the mask's memory with it) */
static struct block_sparse *sparse_state(struct block *blk)
{
    if (!blk->sparse) {
        blk->sparse = dm_alloc(sizeof *blk->sparse);
        blk->sparse->mask = dm_alloc(block_matrix_weights(blk->C));
    }
    return blk->sparse;
}

/* The CSR form (at csr_sparsity and above) and the device arrays of the
 * mask and kept count just set. */
static void sparse_rebuild(struct block *blk, double csr_sparsity)
{
    struct block_sparse *sp = blk->sparse;
    size_t offset, count;
    block_half_mask_range(blk->C, BLOCK_HALF_ATTENTION, &offset, &count);
    sp->kept_attention = 0;
    for (size_t i = offset; i < offset + count; i++) sp->kept_attention += sp->mask[i];
    for (int m = 0; m < BLOCK_MATRICES; m++) csr_free(&sp->csr[m]);
    sp->use_csr = 0;
    if (block_matrix_sparsity(blk) >= csr_sparsity) build_csr(blk);
    sparse_device_build(blk);
    block_sparse_refresh(blk);
}

/* On a device the slab comes down for the pruning and goes back up (the
 * slab itself on the CPU). */
void block_prune(struct block *blk, const unsigned char *keep, double csr_sparsity)
{
    struct block_sparse *sp = sparse_state(blk);
    float *staging = backend_staging(blk->slab_floats * sizeof(float));
    struct block view = block_host_view(blk, staging, 1);
    sp->kept = prune_view(&view, sp->mask, keep);
    block_host_view_store(blk, &view);
    backend_staging_free(staging);
    sparse_rebuild(blk, csr_sparsity);
}

/* The table's prune_mask over each matrix, in the slab where it lives;
 * only the mask comes down. */
void block_prune_cut(struct block *blk, uint64_t cut, unsigned char *mask_device,
                     double csr_sparsity)
{
    const struct dm_backend *ops = backend_current();
    struct block_sparse *sp = sparse_state(blk);
    size_t total = block_matrix_weights(blk->C);
    uint32_t base = (uint32_t)((size_t)blk->index * total);
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        int k = block_matrix_tensor(m);
        size_t off = mask_offset(blk->C, m), at = block_tensor_offset(blk->C, k);
        ops->prune_mask(mask_device + off, blk->params + at, blk->grads + at, blk->m + at,
                        blk->v + at, (long)block_tensor_size(blk->C, k), base + (uint32_t)off,
                        cut);
    }
    ops->copy_to_host(sp->mask, mask_device, total);
    long kept = 0;
    for (size_t i = 0; i < total; i++) kept += sp->mask[i];
    sp->kept = kept;
    sparse_rebuild(blk, csr_sparsity);
}

void block_prune_join_mask(struct block *blk, int half, const unsigned char *part,
                           double csr_sparsity)
{
    struct block_sparse *sp = blk->sparse;
    DM_ASSERT(sp);
    size_t offset, count, total = block_matrix_weights(blk->C);
    block_half_mask_range(blk->C, half, &offset, &count);
    memcpy(sp->mask + offset, part, count);
    long kept = 0;
    for (size_t i = 0; i < total; i++) kept += sp->mask[i];
    sp->kept = kept;
    sparse_rebuild(blk, csr_sparsity);
}

uint64_t block_prune_key(float weight, uint32_t global_index)
{
    uint32_t bits;
    memcpy(&bits, &weight, sizeof bits);
    bits &= 0x7fffffffu;   /* |w|: for non-negative floats the bits order as the values */
    return ((uint64_t)bits << 32) | (uint64_t)(0xffffffffu - global_index);
}

/* bits above shift + 8 that a key shares with the round's prefix */
static uint64_t high_mask(int shift)
{
    return shift + 8 >= 64 ? 0 : ~(uint64_t)0 << (shift + 8);
}

void prune_histogram(long *counts, long *partial, const float *weights, long n,
                     unsigned int base, unsigned long long prefix, int shift)
{
    (void)partial;
    uint64_t high = high_mask(shift);
    for (long i = 0; i < n; i++) {
        uint64_t key = block_prune_key(weights[i], base + (uint32_t)i);
        if ((key & high) == prefix) counts[(key >> shift) & (DM_PRUNE_BUCKETS - 1)]++;
    }
}

void prune_mask(unsigned char *mask, float *params, float *grads, float *m, float *v, long n,
                unsigned int base, unsigned long long cut)
{
    for (long i = 0; i < n; i++) {
        mask[i] = block_prune_key(params[i], base + (uint32_t)i) > cut;
        if (!mask[i]) params[i] = grads[i] = m[i] = v[i] = 0.0f;
    }
}

double block_matrix_sparsity(const struct block *blk)
{
    if (!blk->sparse) return 0.0;
    double total = (double)block_matrix_weights(blk->C);
    return (total - (double)blk->sparse->kept) / total;
}

double block_half_sparsity(const struct block *blk, int half)
{
    if (!blk->sparse || (half != BLOCK_HALF_ATTENTION && half != BLOCK_HALF_MLP))
        return block_matrix_sparsity(blk);
    size_t offset, count;
    block_half_mask_range(blk->C, half, &offset, &count);
    long kept = half == BLOCK_HALF_ATTENTION ? blk->sparse->kept_attention
                                             : blk->sparse->kept - blk->sparse->kept_attention;
    return ((double)count - (double)kept) / (double)count;
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
