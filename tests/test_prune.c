/* test_prune: the pruning schedule of Zhu & Gupta and the distributed
 * global top-k of Algorithm 1 (src/dyn/prune.c).
 *
 * Runs on any number of ranks (tests/run.sh runs it alone, t_prune.sh
 * with 3 and 4 ranks). Every rank draws the same whole set of weights,
 * full of ties (magnitudes k/8, and zeros), holds an uneven contiguous
 * share of it (rank r gets a share proportional to (r+1)^2; the last
 * rank gets none when there are several), and the kept set that
 * prune_global_cut gives must equal what one process picks by sorting
 * everything by (|w| descending, global index ascending), and the radix
 * select's cut (prune_radix_cut, the device's) must be the same uint64
 * as prune_global_cut's. Error counts
 * are summed over the ranks; any mismatch fails every rank. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include "dyn/prune.h"
#include "dynmo/model.h"
#include "testing.h"

struct ranked {
    float magnitude;
    long index;
};

static int by_rank(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    if (x->magnitude != y->magnitude) return x->magnitude > y->magnitude ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static void test_schedule(void)
{
    struct dm_config cfg;
    config_defaults(&cfg);
    cfg.prune_start = 3000;
    cfg.prune_every = 1000;
    cfg.prune_steps = 4;
    cfg.sparsity_initial = 0.0;
    cfg.sparsity_final = 0.9;
    /* The paper's run: 52%, 79%, 89%, 90% after the pruning steps. */
    CHECK_NEAR(prune_schedule_at(&cfg, 3000), 0.0, 1e-12);
    CHECK_NEAR(prune_schedule_at(&cfg, 4000), 0.9 * (1 - 0.75 * 0.75 * 0.75), 1e-12);
    CHECK_NEAR(prune_schedule_at(&cfg, 5000), 0.7875, 1e-12);
    CHECK_NEAR(prune_schedule_at(&cfg, 6000), 0.9 * (1 - 0.25 * 0.25 * 0.25), 1e-12);
    CHECK_NEAR(prune_schedule_at(&cfg, 7000), 0.9, 1e-12);
    CHECK(prune_schedule_at(&cfg, 3500) < 0);
    CHECK(prune_schedule_at(&cfg, 8000) < 0);
    CHECK(prune_schedule_at(&cfg, 2999) < 0);
    CHECK_NEAR(prune_sparsity_in_force(&cfg, 2999), 0.0, 0);
    CHECK_NEAR(prune_sparsity_in_force(&cfg, 5500), 0.7875, 1e-12);
    CHECK_NEAR(prune_sparsity_in_force(&cfg, 100000), 0.9, 1e-12);
}

/* prune_radix_cut's histogram over this rank's keys on the host */
struct host_keys {
    const uint64_t *keys;
    long n;
};

static void host_histogram(long *counts, void *ctx, uint64_t prefix, int shift)
{
    const struct host_keys *hk = ctx;
    uint64_t high = shift + 8 >= 64 ? 0 : ~(uint64_t)0 << (shift + 8);
    for (long i = 0; i < hk->n; i++)
        if ((hk->keys[i] & high) == prefix) counts[(hk->keys[i] >> shift) & 255]++;
}

/* Returns this rank's mismatches for one (total, keep). */
static long check_cut(MPI_Comm comm, long total, long keep, uint64_t seed)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    float *w = malloc((size_t)total * sizeof(float));
    for (long i = 0; i < total; i++) {
        uint64_t h = dm_hash64(seed, 7, (uint64_t)i);
        float magnitude = (float)(h % 17) / 8.0f;           /* many ties, zeros included */
        w[i] = (h >> 20) & 1 ? -magnitude : magnitude;
    }
    /* One process's answer. */
    struct ranked *all = malloc((size_t)total * sizeof *all);
    for (long i = 0; i < total; i++) all[i] = (struct ranked){fabsf(w[i]), i};
    qsort(all, (size_t)total, sizeof *all, by_rank);
    unsigned char *want = calloc((size_t)total, 1);
    for (long i = 0; i < keep; i++) want[all[i].index] = 1;
    /* Uneven shares; the last rank holds nothing when there are several. */
    int holders = size > 1 ? size - 1 : 1;
    long weight_sum = 0;
    for (int r = 0; r < holders; r++) weight_sum += (long)(r + 1) * (r + 1);
    long begin = 0, end = 0;
    for (int r = 0; r <= rank && r < holders; r++) {
        begin = end;
        end = r == holders - 1 ? total : end + total * (r + 1) * (r + 1) / weight_sum;
    }
    if (rank >= holders) begin = end = total;
    long n = end - begin;
    uint64_t *keys = malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    long errors = 0;
    for (long i = 0; i < n; i++) keys[i] = prune_key(w[begin + i], (uint32_t)(begin + i));
    struct host_keys hk = {keys, n};
    uint64_t radix = prune_radix_cut(comm, host_histogram, &hk, keep, total);
    uint64_t cut = prune_global_cut(comm, keys, n, keep, total);
    errors += radix != cut;   /* the radix select's cut: the same uint64 */
    long kept_here = 0;
    for (long i = begin; i < end; i++) {
        int kept = prune_key(w[i], (uint32_t)i) > cut;
        kept_here += kept;
        errors += kept != want[i];
    }
    long kept_all = 0;
    MPI_Allreduce(&kept_here, &kept_all, 1, MPI_LONG, MPI_SUM, comm);
    if (kept_all != keep) errors++;
    free(w);
    free(all);
    free(want);
    free(keys);
    return errors;
}

static void test_global_cut(MPI_Comm comm)
{
    const long totals[] = {1, 7, 1000, 100003};
    long worst = 0;
    for (size_t t = 0; t < sizeof totals / sizeof *totals; t++) {
        long total = totals[t];
        long keeps[] = {0, 1, total / 10, total / 2, total / 2 + 1, total - total / 10,
                        total - 1, total};
        for (size_t k = 0; k < sizeof keeps / sizeof *keeps; k++) {
            if (keeps[k] < 0 || keeps[k] > total) continue;
            long errors = check_cut(comm, total, keeps[k], 42 + t), sum = 0;
            MPI_Allreduce(&errors, &sum, 1, MPI_LONG, MPI_SUM, comm);
            CHECK_MSG(sum == 0, "total %ld keep %ld: %ld weights differ from one process's choice",
                      total, keeps[k], sum);
            if (sum > worst) worst = sum;
        }
    }
    int rank;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) printf("global top-k: largest mismatch count over all cases: %ld\n", worst);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dm_set_rank(rank, size);
    dm_threads_init(1);
    test_schedule();
    test_global_cut(MPI_COMM_WORLD);
    int failed = testing_failures, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    char name[64];
    snprintf(name, sizeof name, "test_prune (%d ranks)", size);
    int rc = rank == 0 ? testing_report(name) : 0;
    MPI_Finalize();
    return any ? 1 : rc;
}
