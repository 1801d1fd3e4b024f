/* Time, aligned allocation and resident-memory measurement. */
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

void *dm_alloc(size_t bytes)
{
    if (bytes == 0) bytes = 64;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded);
    if (!p) DM_FATAL("out of memory allocating %zu bytes", bytes);
    memset(p, 0, rounded);
    return p;
}

void *dm_alloc_uninit(size_t bytes)
{
    if (bytes == 0) bytes = 64;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded);
    if (!p) DM_FATAL("out of memory allocating %zu bytes", bytes);
    return p;
}

void dm_free(void *p) { free(p); }
