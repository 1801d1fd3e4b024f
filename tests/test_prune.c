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
 * as prune_global_cut's. Beyond 2^31 weights, without allocating a
 * model: both cuts (and the gather in rounds of a few keys) on synthetic
 * models described by runs of equal-magnitude weights, 11 blocks of C =
 * 4096 and exactly 2^32 - 1 weights, against the k-th key worked out from
 * the runs; and the start-up check against the cuts' limit. Error counts
 * are summed over the ranks; any mismatch fails every rank. */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
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

/* The start-up check and the cuts share PRUNE_MAX_WEIGHTS: the check
 * accepts a model exactly when its prunable weights are at most that (for
 * every width, the most layers it accepts and one more), the issue's
 * model (11 blocks of C = 4096, beyond 2^31 weights) passes it, and every
 * count is exact in 64 bits. The cuts at that limit: test_beyond_int32. */
static void test_limits(void)
{
    char err[320];
    long issue = prune_model_weights(11, 4096);
    CHECK(issue == 2214592512L && issue > INT32_MAX);
    CHECK_MSG(prune_check_model(11, 4096, err, sizeof err) == 0, "%s", err);
    CHECK(prune_keep_count(issue, 0.9) == 221459251L);
    CHECK(prune_keep_count(issue, 0.0) == issue);
    CHECK(prune_check_model(22, 4096, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "4429185024 prunable weights") && strstr(err, "4294967295"), "%s", err);
    long disagree = 0;
    for (int C = 1; C <= 1 << 16; C += C < 64 ? 1 : 97) {
        long per_block = prune_model_weights(1, C), most = PRUNE_MAX_WEIGHTS / per_block;
        for (long layers = most > 1 ? most - 1 : 1; layers <= most + 1 && layers <= 4096; layers++) {
            int fits = prune_model_weights((int)layers, C) <= PRUNE_MAX_WEIGHTS;
            disagree += fits != (prune_check_model((int)layers, C, err, sizeof err) == 0);
            disagree += fits != (layers <= most);
        }
    }
    CHECK_MSG(disagree == 0, "%ld (layers, channels) where the check and the limit disagree",
              disagree);
    printf("limits: 11 x 12 x 4096^2 = %ld prunable weights accepted; the check and the "
           "cuts' limit (%ld) agree\n", issue, PRUNE_MAX_WEIGHTS);
}

/* ---- a synthetic model beyond 2^31 weights --------------------------------
 * The cuts see a model only through its keys (prune_global_cut: a rank's
 * candidates; prune_radix_cut: histograms), so a model far larger than
 * memory can be described by runs of weights of one magnitude each: a
 * run's keys are one contiguous range of integers (|w| bits above, 2^32 -
 * 1 minus the global index below, the index rising as the key falls), so
 * its histogram, its largest and smallest keys and the whole model's k-th
 * key are arithmetic on a few numbers. */

struct weight_run {
    long first, count;    /* global indices [first, first + count) */
    uint32_t magnitude;   /* the bits of |w| */
    int owner;            /* the rank that holds the run */
};

struct synthetic_model {
    struct weight_run runs[64];
    int n;
    long total;
};

static uint64_t run_key(const struct weight_run *r, long i)   /* i-th weight of the run */
{
    return ((uint64_t)r->magnitude << 32) | (uint64_t)(0xffffffffu - (uint32_t)(r->first + i));
}

static void add_run(struct synthetic_model *m, long count, float magnitude, int owner)
{
    struct weight_run *r = &m->runs[m->n++];
    memcpy(&r->magnitude, &magnitude, sizeof r->magnitude);
    r->first = m->total;
    r->count = count;
    r->owner = owner;
    m->total += count;
}

/* The runs by descending keys: larger magnitude first, then lower index. */
static int by_key_descending(const void *a, const void *b)
{
    const struct weight_run *x = a, *y = b;
    if (x->magnitude != y->magnitude) return x->magnitude > y->magnitude ? -1 : 1;
    return (x->first > y->first) - (x->first < y->first);
}

/* The j-th largest key (1-based) of the whole model: from a sorted copy. */
static uint64_t kth_largest(const struct synthetic_model *m, long j)
{
    struct weight_run sorted[64];
    memcpy(sorted, m->runs, (size_t)m->n * sizeof *sorted);
    qsort(sorted, (size_t)m->n, sizeof *sorted, by_key_descending);
    for (int r = 0; r < m->n; r++) {
        if (j <= sorted[r].count) return run_key(&sorted[r], j - 1);
        j -= sorted[r].count;
    }
    DM_FATAL("kth_largest: j beyond the model");
}

/* The cut both cut functions return, by their contract: the keep-th
 * largest key minus 1 when no more are kept than pruned, else the
 * (keep + 1)-th largest (the largest pruned). */
static uint64_t expected_cut(const struct synthetic_model *m, long keep)
{
    if (keep == 0) return UINT64_MAX;
    if (keep == m->total) return 0;
    return keep <= m->total - keep ? kth_largest(m, keep) - 1 : kth_largest(m, keep + 1);
}

struct synthetic_share {
    const struct synthetic_model *model;
    int rank;
};

/* prune_histogram_fn over this rank's runs: each run's key range meets each
 * bucket's key range in an interval. */
static void synthetic_histogram(long *counts, void *ctx, uint64_t prefix, int shift)
{
    const struct synthetic_share *sh = ctx;
    uint64_t width = (uint64_t)1 << shift;
    for (int r = 0; r < sh->model->n; r++) {
        const struct weight_run *run = &sh->model->runs[r];
        if (run->owner != sh->rank || run->count == 0) continue;
        uint64_t lo = run_key(run, run->count - 1), hi = run_key(run, 0);
        for (uint64_t v = 0; v < 256; v++) {
            uint64_t begin = prefix | (v << shift), end = begin + (width - 1);
            uint64_t a = lo > begin ? lo : begin, b = hi < end ? hi : end;
            if (a <= b) counts[v] += (long)(b - a + 1);
        }
    }
}

/* This rank's largest (top) or smallest `want` keys, or all it holds if
 * fewer: what prune_global_cut's local selection leaves for the gather. */
static long synthetic_candidates(const struct synthetic_model *m, int rank, int top, long want,
                                 uint64_t *out)
{
    struct weight_run sorted[64];
    memcpy(sorted, m->runs, (size_t)m->n * sizeof *sorted);
    qsort(sorted, (size_t)m->n, sizeof *sorted, by_key_descending);
    long got = 0;
    for (int k = 0; k < m->n && got < want; k++) {
        const struct weight_run *r = &sorted[top ? k : m->n - 1 - k];
        if (r->owner != rank) continue;
        for (long i = 0; i < r->count && got < want; i++)
            out[got++] = run_key(r, top ? i : r->count - 1 - i);
    }
    return got;
}

/* Both cuts on a synthetic model against expected_cut, for keep counts at
 * both ends and around the middle (prune_global_cut only where the
 * candidates are few: its gather holds min(keep, total - keep) keys a
 * rank). Returns this rank's mismatches. */
static long check_synthetic(MPI_Comm comm, const struct synthetic_model *m, const char *name)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    long T = m->total, errors = 0;
    const long keeps[] = {0, 1, 2, 999, T / 3, T / 2 - 1, T / 2, T / 2 + 1, T - 999, T - 1, T};
    enum { FEW = 1000 };
    uint64_t *candidates = malloc(FEW * sizeof(uint64_t));
    struct synthetic_share share = {m, rank};
    for (size_t k = 0; k < sizeof keeps / sizeof *keeps; k++) {
        long keep = keeps[k];
        uint64_t want = expected_cut(m, keep);
        uint64_t radix = prune_radix_cut(comm, synthetic_histogram, &share, keep, T);
        if (radix != want) {
            errors++;
            printf("  %s keep %ld: radix cut %016llx, expected %016llx\n", name, keep,
                   (unsigned long long)radix, (unsigned long long)want);
        }
        long side = keep <= T - keep ? keep : T - keep;
        if (side > FEW) continue;
        long n = synthetic_candidates(m, rank, keep <= T - keep, side, candidates);
        /* the gather in one round, then in rounds of 7 and of 1 key in all */
        uint64_t cuts[3] = {prune_gather_cut(comm, candidates, n, keep, T, INT_MAX),
                            prune_gather_cut(comm, candidates, n, keep, T, 7),
                            prune_gather_cut(comm, candidates, n, keep, T, 1)};
        for (int c = 0; c < 3; c++)
            if (cuts[c] != want) {
                errors++;
                printf("  %s keep %ld: gather cut (round %d) %016llx, expected %016llx\n",
                       name, keep, c, (unsigned long long)cuts[c], (unsigned long long)want);
            }
        uint64_t global = prune_global_cut(comm, candidates, n, keep, T);
        if (global != want) {
            errors++;
            printf("  %s keep %ld: global cut %016llx, expected %016llx\n", name, keep,
                   (unsigned long long)global, (unsigned long long)want);
        }
    }
    free(candidates);
    return errors;
}

/* A model of 11 blocks of C = 4096 (12 C^2 = 201,326,592 matrix weights a
 * block, 2,214,592,512 in all: beyond 2^31), its four matrices each of one
 * magnitude drawn from five (ties across blocks, and pruned zeros); and a
 * model of exactly 2^32 - 1 weights, the most pruning takes. Blocks (runs)
 * are spread unevenly, the last rank holds none when there are several. */
static void test_beyond_int32(MPI_Comm comm)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int holders = size > 1 ? size - 1 : 1;
    const float magnitudes[5] = {0.0f, 0.01f, 0.02f, 0.02f, 0.05f};
    struct synthetic_model gpt = {.n = 0};
    const long C = 4096, per_matrix[4] = {3 * C * C, C * C, 4 * C * C, 4 * C * C};
    for (int b = 0; b < 11; b++)
        for (int q = 0; q < 4; q++)
            add_run(&gpt, per_matrix[q], magnitudes[dm_hash64(5, (uint64_t)b, (uint64_t)q) % 5],
                    holders * b * b / 121);
    CHECK(gpt.total == 2214592512L && gpt.total > INT32_MAX);
    struct synthetic_model widest = {.n = 0};
    add_run(&widest, 2147483648L, 0.5f, 0);
    add_run(&widest, 2147483641L, 0.25f, holders - 1);
    add_run(&widest, 5, 0.5f, 0);
    add_run(&widest, 1, 0.0f, holders - 1);   /* index 2^32 - 2: the key 0x1 */
    CHECK(widest.total == 4294967295L);
    long errors = check_synthetic(comm, &gpt, "11 x 12 x 4096^2") +
                  check_synthetic(comm, &widest, "2^32 - 1 weights"), sum = 0;
    MPI_Allreduce(&errors, &sum, 1, MPI_LONG, MPI_SUM, comm);
    CHECK_MSG(sum == 0, "synthetic models beyond 2^31 weights: %ld cuts differ", sum);
    if (rank == 0)
        printf("cuts beyond 2^31 weights (synthetic, nothing allocated): %ld mismatches\n", sum);
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
    test_limits();
    test_global_cut(MPI_COMM_WORLD);
    test_beyond_int32(MPI_COMM_WORLD);
    int failed = testing_failures, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    char name[64];
    snprintf(name, sizeof name, "test_prune (%d ranks)", size);
    int rc = rank == 0 ? testing_report(name) : 0;
    MPI_Finalize();
    return any ? 1 : rc;
}
