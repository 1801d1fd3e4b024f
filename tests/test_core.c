/* Core: the thread pool covers every index exactly once for any thread
 * count and grain; the counter-based RNG is a pure function with sane
 * moments; config overrides and defaults parse. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "testing.h"

static int *hits;
static void mark(void *arg, long begin, long end)
{
    (void)arg;
    for (long i = begin; i < end; i++) __atomic_add_fetch(&hits[i], 1, __ATOMIC_RELAXED);
}

static void test_parallel_for(void)
{
    long sizes[] = {1, 2, 3, 7, 64, 1000, 4097};
    long grains[] = {1, 3, 16, 5000};
    for (int threads = 1; threads <= 4; threads++) {
        dm_threads_init(threads);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) {
                hits = calloc((size_t)sizes[s], sizeof *hits);
                for (int rep = 0; rep < 3; rep++) dm_parallel_for(sizes[s], grains[g], mark, NULL);
                int bad = 0;
                for (long i = 0; i < sizes[s]; i++) bad += hits[i] != 3;
                CHECK_MSG(bad == 0, "threads %d n %ld grain %ld: %d indices not hit 3 times",
                          threads, sizes[s], grains[g], bad);
                free(hits);
            }
        dm_threads_shutdown();
    }
}

static void test_random(void)
{
    CHECK(dm_hash64(1, 2, 3) == dm_hash64(1, 2, 3));
    CHECK(dm_hash64(1, 2, 3) != dm_hash64(1, 2, 4));
    CHECK(dm_hash64(1, 2, 3) != dm_hash64(2, 2, 3));
    double sum = 0, sumsq = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = dm_normal(42, 7, (uint64_t)i);
        sum += x;
        sumsq += x * x;
    }
    double mean = sum / n, var = sumsq / n - mean * mean;
    CHECK_NEAR(mean, 0.0, 0.01);
    CHECK_NEAR(var, 1.0, 0.02);
    double usum = 0;
    for (int i = 0; i < n; i++) {
        float u = dm_uniform(3, 0, (uint64_t)i);
        CHECK(u >= 0.0f && u < 1.0f);
        usum += u;
    }
    CHECK_NEAR(usum / n, 0.5, 0.005);
}

static void test_config(void)
{
    struct dm_config cfg;
    config_defaults(&cfg);
    CHECK(cfg.layers == 8 && cfg.channels == 256 && cfg.heads == 4);
    config_apply_override(&cfg, "model.layers=3");
    config_apply_override(&cfg, "train.lr=0.5");
    config_apply_override(&cfg, "run.out_dir=/tmp/x y");
    config_apply_override(&cfg, "train.seed=18446744073709551615");
    CHECK(cfg.layers == 3);
    CHECK(cfg.lr == 0.5);
    CHECK(!strcmp(cfg.out_dir, "/tmp/x y"));
    CHECK(cfg.seed == UINT64_MAX);
    char text[8192];
    config_print(&cfg, text, sizeof text);
    CHECK(strstr(text, "model.layers = 3\n") != NULL);
    CHECK(strstr(text, "train.lr = 0.5\n") != NULL);
    config_validate(&cfg);
}

int main(void)
{
    test_parallel_for();
    test_random();
    test_config();
    return testing_report("test_core");
}
