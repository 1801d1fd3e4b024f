/* Time, aligned allocation and resident-memory measurement, and the median
 * the benchmarks and fits take of timings. An allocation the system
 * refuses ends the run with status 2 and one message. */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "dynmo/core.h"

static double clock_seconds(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dm_now(void) { return clock_seconds(CLOCK_MONOTONIC); }

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dm_median(double *v, long n)
{
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static clockid_t profile_clock = CLOCK_MONOTONIC;

void dm_profile_cpu_time(int on)
{
    profile_clock = on ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
}

int dm_profile_is_cpu_time(void) { return profile_clock != CLOCK_MONOTONIC; }

double dm_profile_now(void) { return clock_seconds(profile_clock); }

size_t dm_peak_rss_bytes(void)
{
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
    return (size_t)usage.ru_maxrss * 1024;   /* Linux reports KiB */
}

/* Memory the system refused is a resource failure the user fixes (more
 * ranks, a smaller model or batch), not a bug: status 2, one message. */
static __attribute__((noreturn)) void out_of_memory(size_t bytes)
{
    dm_user_error_local("out of memory: cannot allocate %.1f MiB more (resident now %.0f MiB); "
                        "the model or batch is too large for this node's memory: use more "
                        "pipeline stages (parallel.pp), fewer ranks per node, or a smaller "
                        "model or batch", (double)bytes / 1048576.0,
                        (double)dm_peak_rss_bytes() / 1048576.0);
}

void *dm_alloc(size_t bytes)
{
    if (bytes == 0) bytes = 64;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded);
    if (!p) out_of_memory(bytes);
    memset(p, 0, rounded);
    return p;
}

void *dm_alloc_uninit(size_t bytes)
{
    if (bytes == 0) bytes = 64;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded);
    if (!p) out_of_memory(bytes);
    return p;
}

void dm_free(void *p) { free(p); }

/* One carved array's room: whole 64-byte lines, so that the next starts aligned. */
static size_t carved_stride(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

void dm_carve_doubles(double **const arrays[], int count, size_t n)
{
    size_t stride = carved_stride(n * sizeof(double));
    char *base = dm_alloc((size_t)count * stride);
    for (int k = 0; k < count; k++) *arrays[k] = (double *)(base + (size_t)k * stride);
}

void dm_carve_floats(float **const arrays[], int count, size_t n)
{
    size_t stride = carved_stride(n * sizeof(float));
    char *base = dm_alloc((size_t)count * stride);
    for (int k = 0; k < count; k++) *arrays[k] = (float *)(base + (size_t)k * stride);
}

void *dm_grow(void *items, size_t size, long count, long *capacity, long initial)
{
    DM_ASSERT(count >= 0 && count <= *capacity && initial > 0);
    if (count < *capacity) return items;
    long grown_capacity = *capacity ? 2 * *capacity : initial;
    void *grown = dm_alloc((size_t)grown_capacity * size);
    if (count) memcpy(grown, items, (size_t)count * size);
    dm_free(items);
    *capacity = grown_capacity;
    return grown;
}
