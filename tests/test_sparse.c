/* test_sparse: the CSR kernels of src/model/sparse.c against the dense
 * masked computation (matmul_forward / matmul_backward_overwrite of ops.c
 * on the same weights with the pruned ones zero, the weight gradient then
 * masked), the pruning state of a block (block_prune, pack/unpack), and
 * the once-a-step mask of dense pruned gradients (gpt_mask_pruned_grads).
 *
 * Tolerance: |sparse - dense| <= 1e-6 K + 1e-4 |dense| per element, K the
 * number of products summed (C for the output, OC for dinp, N for dW; the
 * inputs are N(0,1)): both are fp32 sums of the same products in different
 * orders, so the difference grows with K. The largest absolute difference
 * over K is printed. The kernels must give the same bits on 1
 * and 2 threads.
 *
 * `test_sparse --bench [N [THREADS [C]]]` prints the time of dense and CSR
 * forward and backward against sparsity at a block's matrix sizes (3CxC,
 * CxC, 4CxC, Cx4C; default the reference block, C = 256, N = B*T = 2048
 * rows, 2 threads), then the block's four matrices together: CSR time over
 * dense time at each sparsity (where CSR pays: dyn.csr_sparsity). */
#include <stdlib.h>
#include <string.h>
#include "dynmo/model.h"
#include "model/internal.h"
#include "testing.h"

static float *random_floats(long n, uint64_t stream)
{
    float *x = dm_alloc((size_t)(n ? n : 1) * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = dm_normal(99, stream, (uint64_t)i);
    return x;
}

/* A CSR view of w (OC, C) where mask is 1. */
static void csr_of(struct csr_matrix *csr, const float *w, const unsigned char *mask, int OC, int C)
{
    csr->rows = OC;
    csr->cols = C;
    csr->row_ptr = dm_alloc((size_t)(OC + 1) * sizeof(int));
    long nnz = 0;
    for (long i = 0; i < (long)OC * C; i++) nnz += mask[i];
    csr->nnz = (int)nnz;
    csr->col_idx = dm_alloc((size_t)(nnz + 1) * sizeof(int));
    csr->values = dm_alloc((size_t)(nnz + 1) * sizeof(float));
    int j = 0;
    for (int o = 0; o < OC; o++) {
        csr->row_ptr[o] = j;
        for (int c = 0; c < C; c++)
            if (mask[(size_t)o * C + c]) {
                csr->col_idx[j] = c;
                csr->values[j++] = w[(size_t)o * C + c];
            }
    }
    csr->row_ptr[OC] = j;
}

static void csr_release(struct csr_matrix *csr)
{
    dm_free(csr->row_ptr);
    dm_free(csr->col_idx);
    dm_free(csr->values);
}

static double worst_rel;

static long compare(const float *got, const float *want, long n, int K)
{
    long bad = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > 1e-6 * K + 1e-4 * fabs(want[i])) bad++;
        if (d / K > worst_rel) worst_rel = d / K;
    }
    return bad;
}

struct results {
    float *out, *dinp, *dw, *db;
};

static void run_sparse(struct results *r, const float *x, const float *dout,
                       const struct csr_matrix *csr, const float *bias, int N, int C, int OC)
{
    sparse_matmul_forward(r->out, x, csr, bias, N, C, OC);
    sparse_matmul_backward(r->dinp, r->dw, r->db, dout, x, csr, N, C, OC);
}

static void test_kernels_case(int N, int C, int OC, double sparsity)
{
    static uint64_t stream = 1;
    float *w = random_floats((long)OC * C, stream++);
    float *x = random_floats((long)N * C, stream++);
    float *dout = random_floats((long)N * OC, stream++);
    float *bias = random_floats(OC, stream++);
    unsigned char *mask = dm_alloc((size_t)OC * C);
    for (long i = 0; i < (long)OC * C; i++) {
        mask[i] = dm_uniform(7, stream, (uint64_t)i) >= sparsity;
        if ((i / C) % 5 == 3) mask[i] = 0;       /* some rows empty */
        if (!mask[i]) w[i] = 0.0f;
    }
    stream++;
    struct csr_matrix csr;
    csr_of(&csr, w, mask, OC, C);
    /* dense masked reference */
    struct results want = {dm_alloc((size_t)N * OC * 4), dm_alloc((size_t)N * C * 4),
                           dm_alloc((size_t)OC * C * 4), dm_alloc((size_t)OC * 4)};
    matmul_forward(want.out, x, w, bias, N, C, OC);
    matmul_backward_overwrite(want.dinp, want.dw, want.db, dout, x, w, N, C, OC);
    for (long i = 0; i < (long)OC * C; i++)
        if (!mask[i]) want.dw[i] = 0.0f;
    struct results got = {dm_alloc((size_t)N * OC * 4), dm_alloc((size_t)N * C * 4),
                          dm_alloc((size_t)OC * C * 4), dm_alloc((size_t)OC * 4)};
    dm_threads_init(2);
    run_sparse(&got, x, dout, &csr, bias, N, C, OC);
    worst_rel = 0;
    long bad = compare(got.out, want.out, (long)N * OC, C) +
               compare(got.dinp, want.dinp, (long)N * C, OC) +
               compare(got.dw, want.dw, (long)OC * C, N) + compare(got.db, want.db, OC, N);
    CHECK_MSG(bad == 0, "N %d C %d OC %d sparsity %.2f: %ld elements outside tolerance", N, C, OC,
              sparsity, bad);
    printf("N %4d C %4d OC %4d sparsity %.2f: largest |diff| / K = %.2e\n", N,
           C, OC, sparsity, worst_rel);
    long untouched = 0;
    for (long i = 0; i < (long)OC * C; i++) untouched += !mask[i] && got.dw[i] != 0.0f;
    CHECK_MSG(untouched == 0, "%ld pruned weights received a gradient", untouched);
    /* one thread: the same bits */
    struct results one = {dm_alloc((size_t)N * OC * 4), dm_alloc((size_t)N * C * 4),
                          dm_alloc((size_t)OC * C * 4), dm_alloc((size_t)OC * 4)};
    dm_threads_init(1);
    run_sparse(&one, x, dout, &csr, bias, N, C, OC);
    CHECK(!memcmp(one.out, got.out, (size_t)N * OC * 4));
    CHECK(!memcmp(one.dinp, got.dinp, (size_t)N * C * 4));
    CHECK(!memcmp(one.dw, got.dw, (size_t)OC * C * 4));
    CHECK(!memcmp(one.db, got.db, (size_t)OC * 4));
    struct results *all[3] = {&want, &got, &one};
    for (int i = 0; i < 3; i++) {
        dm_free(all[i]->out);
        dm_free(all[i]->dinp);
        dm_free(all[i]->dw);
        dm_free(all[i]->db);
    }
    csr_release(&csr);
    dm_free(w);
    dm_free(x);
    dm_free(dout);
    dm_free(bias);
    dm_free(mask);
}

/* block_prune zeroes what it prunes everywhere, and the pack carries the
 * mask and the CSR form to an identical block; a bad mask is refused. */
static void test_block_state(void)
{
    struct gpt_shape shape = {.vocab = 64, .max_seq = 16, .layers = 3, .heads = 2, .channels = 16};
    struct block blk;
    block_init(&blk, 1, &shape, 5);
    size_t nw = block_matrix_weights(16);
    unsigned char *keep = dm_alloc(nw);
    for (size_t i = 0; i < nw; i++) keep[i] = dm_uniform(3, 3, i) < 0.2;
    for (size_t i = 0; i < blk.nparams; i++) blk.m[i] = blk.v[i] = 1.0f;
    for (int csr = 0; csr < 2; csr++) {
        block_prune(&blk, keep, csr ? 0.5 : 2.0);
        CHECK(blk.sparse && blk.sparse->use_csr == csr);
        CHECK_NEAR(block_matrix_sparsity(&blk), 1.0 - (double)blk.sparse->kept / nw, 1e-12);
        size_t zeros = 0, i = 0;
        for (int m = 0; m < BLOCK_MATRICES; m++) {
            int k = block_matrix_tensor(m);
            for (size_t e = 0; e < block_tensor_size(16, k); e++, i++)
                if (!keep[i])
                    zeros += blk.p[k][e] == 0 && blk.m[block_tensor_offset(16, k) + e] == 0;
        }
        CHECK(zeros == nw - (size_t)blk.sparse->kept);
        size_t bytes = block_pack_size(&blk);
        unsigned char *buf = dm_alloc(bytes);
        block_pack(&blk, buf);
        struct block copy = {0};
        char err[256] = "";
        CHECK_MSG(block_unpack(&copy, buf, bytes, &shape, err, sizeof err) == 0, "%s", err);
        CHECK(copy.sparse && copy.sparse->use_csr == csr &&
              !memcmp(copy.sparse->mask, blk.sparse->mask, nw));
        CHECK(!memcmp(copy.params, blk.params, blk.nparams * 4));
        if (csr)
            for (int m = 0; m < BLOCK_MATRICES; m++) {
                CHECK(copy.sparse->csr[m].nnz == blk.sparse->csr[m].nnz);
                CHECK(!memcmp(copy.sparse->csr[m].values, blk.sparse->csr[m].values,
                              (size_t)blk.sparse->csr[m].nnz * 4));
            }
        block_free(&copy);
        /* A mask byte of 2 with a valid checksum is refused by name. */
        struct block again = {0};
        buf[64 + 3 * blk.nparams * 4] = 2;
        CHECK(block_unpack(&again, buf, bytes, &shape, err, sizeof err) != 0);  /* checksum */
        dm_free(buf);
    }
    /* Rebuilding from zeros (a checkpoint load) gives the same mask. */
    struct block fresh = {0};
    block_init(&fresh, 1, &shape, 5);
    memcpy(fresh.params, blk.params, blk.nparams * 4);
    block_prune(&fresh, NULL, 2.0);
    CHECK(!memcmp(fresh.sparse->mask, blk.sparse->mask, nw));
    block_free(&fresh);
    block_free(&blk);
    dm_free(keep);
}

/* gpt_mask_pruned_grads zeroes exactly the pruned weights' gradients of a
 * dense pruned block (every other gradient keeps its bits) and leaves CSR
 * and unpruned blocks alone. */
static void test_mask_pruned_grads(void)
{
    struct gpt_shape shape = {.vocab = 64, .max_seq = 16, .layers = 3, .heads = 2, .channels = 16};
    struct block blocks[3];
    size_t nw = block_matrix_weights(16);
    unsigned char *keep = dm_alloc(nw);
    for (size_t i = 0; i < nw; i++) keep[i] = dm_uniform(4, 4, i) < 0.5;
    for (int b = 0; b < 3; b++) {
        block_init(&blocks[b], b, &shape, 5);
        if (b < 2) block_prune(&blocks[b], keep, b == 0 ? 2.0 : 0.4);   /* dense, CSR */
        for (size_t i = 0; i < blocks[b].nparams; i++) blocks[b].grads[i] = dm_normal(6, b, i);
    }
    float *before = dm_alloc(blocks[0].nparams * 4 * 3);
    for (int b = 0; b < 3; b++)
        memcpy(before + b * blocks[0].nparams, blocks[b].grads, blocks[b].nparams * 4);
    struct gpt model = {.shape = shape, .num_blocks = 3, .blocks = blocks};
    dm_threads_init(2);
    gpt_mask_pruned_grads(&model);
    dm_threads_init(1);
    long wrong = 0;
    for (int b = 0; b < 3; b++) {
        const float *was = before + b * blocks[0].nparams;
        unsigned char *expect_zero = dm_alloc(blocks[b].nparams);
        memset(expect_zero, 0, blocks[b].nparams);
        size_t i = 0;
        if (b == 0)
            for (int m = 0; m < BLOCK_MATRICES; m++) {
                int k = block_matrix_tensor(m);
                size_t off = block_tensor_offset(16, k);
                for (size_t e = 0; e < block_tensor_size(16, k); e++, i++)
                    expect_zero[off + e] = !keep[i];
            }
        for (size_t e = 0; e < blocks[b].nparams; e++) {
            float want = expect_zero[e] ? 0.0f : was[e];
            wrong += memcmp(&blocks[b].grads[e], &want, 4) != 0;
        }
        dm_free(expect_zero);
    }
    CHECK_MSG(wrong == 0, "%ld gradients wrong after gpt_mask_pruned_grads", wrong);
    for (int b = 0; b < 3; b++) block_free(&blocks[b]);
    dm_free(before);
    dm_free(keep);
}

static void bench(int N, int C0)
{
    const int shapes[4][2] = {{3 * C0, C0}, {C0, C0}, {4 * C0, C0}, {C0, 4 * C0}};  /* OC, C */
    enum { SPARSITIES = 9, REPS = 5 };
    const double sparsities[SPARSITIES] = {0.0, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95};
    double block_dense = 0.0, block_csr[SPARSITIES] = {0};
    printf("# N %d, C %d, %d threads; ms per call (best of %d): forward, backward "
           "(dinp + dW + db)\n", N, C0, dm_threads_count(), REPS);
    printf("%-10s %8s %10s %10s %10s %10s\n", "OCxC", "sparsity", "dense_fwd", "dense_bwd",
           "csr_fwd", "csr_bwd");
    for (int s = 0; s < 4; s++) {
        int OC = shapes[s][0], C = shapes[s][1];
        float *w = random_floats((long)OC * C, 500 + s), *x = random_floats((long)N * C, 600);
        float *dout = random_floats((long)N * OC, 700), *bias = random_floats(OC, 800);
        float *out = dm_alloc((size_t)N * OC * 4), *dinp = dm_alloc((size_t)N * C * 4);
        float *dw = dm_alloc((size_t)OC * C * 4), *db = dm_alloc((size_t)OC * 4);
        unsigned char *mask = dm_alloc((size_t)OC * C);
        double dense[2] = {1e9, 1e9};
        for (int rep = 0; rep < REPS; rep++) {
            double t0 = dm_now();
            matmul_forward(out, x, w, bias, N, C, OC);
            double t1 = dm_now();
            matmul_backward_overwrite(dinp, dw, db, dout, x, w, N, C, OC);
            double t2 = dm_now();
            dense[0] = fmin(dense[0], t1 - t0);
            dense[1] = fmin(dense[1], t2 - t1);
        }
        block_dense += dense[0] + dense[1];
        for (int k = 0; k < SPARSITIES; k++) {
            for (long i = 0; i < (long)OC * C; i++)
                mask[i] = dm_uniform(9, 9, (uint64_t)i) >= sparsities[k];
            struct csr_matrix csr;
            csr_of(&csr, w, mask, OC, C);
            double sp[2] = {1e9, 1e9};
            for (int rep = 0; rep < REPS; rep++) {
                double t0 = dm_now();
                sparse_matmul_forward(out, x, &csr, bias, N, C, OC);
                double t1 = dm_now();
                sparse_matmul_backward(dinp, dw, db, dout, x, &csr, N, C, OC);
                double t2 = dm_now();
                sp[0] = fmin(sp[0], t1 - t0);
                sp[1] = fmin(sp[1], t2 - t1);
            }
            block_csr[k] += sp[0] + sp[1];
            char name[32];
            snprintf(name, sizeof name, "%dx%d", OC, C);
            printf("%-10s %8.2f %10.3f %10.3f %10.3f %10.3f\n", name, sparsities[k],
                   dense[0] * 1e3, dense[1] * 1e3, sp[0] * 1e3, sp[1] * 1e3);
            csr_release(&csr);
        }
        dm_free(w); dm_free(x); dm_free(dout); dm_free(bias);
        dm_free(out); dm_free(dinp); dm_free(dw); dm_free(db); dm_free(mask);
    }
    /* The four matrices of one block, forward + backward: where CSR pays. */
    printf("# block (4 matrices) fwd+bwd: dense %.3f ms\n", block_dense * 1e3);
    for (int k = 0; k < SPARSITIES; k++)
        printf("# sparsity %.2f: csr %.3f ms, csr / dense %.2f\n", sparsities[k],
               block_csr[k] * 1e3, block_csr[k] / block_dense);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        dm_threads_init(argc > 3 ? atoi(argv[3]) : 2);
        bench(argc > 2 ? atoi(argv[2]) : 2048, argc > 4 ? atoi(argv[4]) : 256);
        return 0;
    }
    dm_threads_init(1);
    test_block_state();
    test_mask_pruned_grads();
    const double sparsities[] = {0.0, 0.5, 0.9, 0.99, 1.0};
    for (size_t k = 0; k < sizeof sparsities / sizeof *sparsities; k++) {
        test_kernels_case(130, 48, 144, sparsities[k]);     /* N not a multiple of the tile */
        test_kernels_case(64, 64, 16, sparsities[k]);
    }
    test_kernels_case(2048, 256, 768, 0.9);
    test_kernels_case(200, 1024, 256, 0.7);
    return testing_report("test_sparse");
}
