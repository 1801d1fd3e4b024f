/* The single fatal path and the two kinds of failure (STYLE.md, PETSc):
 * user errors end with status 2 and a message naming the problem; internal
 * failures end with status 1 and file:line. Hooks let the pipeline module
 * turn a local failure into MPI_Abort so no peer waits on a dead rank;
 * core itself never calls MPI. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "dynmo/core.h"

static int this_rank = 0;
static int this_world = 1;
static void (*abort_hook)(int status);
static void (*finalize_hook)(void);
static int (*message_gate)(void);

void dm_set_rank(int rank, int world_size)
{
    this_rank = rank;
    this_world = world_size;
}
int dm_rank(void) { return this_rank; }
int dm_world_size(void) { return this_world; }
void dm_set_abort_hook(void (*hook)(int status)) { abort_hook = hook; }
void dm_set_finalize_hook(void (*hook)(void)) { finalize_hook = hook; }
void dm_set_message_gate(int (*gate)(void)) { message_gate = gate; }

/* Whether this rank prints its fatal message (the first on its node). */
static int may_print(void)
{
    return !message_gate || message_gate();
}

const char *dm_errno_text(void) { return strerror(errno); }

/* Prints prefix, the formatted message and a newline to stderr with one
 * write(2), so that messages of several processes never interleave. */
static void print_message(const char *prefix, const char *fmt, va_list ap)
{
    char text[4096];
    int n = snprintf(text, sizeof text, "%s", prefix);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof text) {
        int m = vsnprintf(text + n, sizeof text - (size_t)n, fmt, ap);
        if (m > 0) n += m;
    }
    if ((size_t)n > sizeof text - 2) n = (int)sizeof text - 2;
    text[n++] = '\n';
    fflush(stdout);
    for (size_t done = 0; done < (size_t)n;) {
        ssize_t w = write(STDERR_FILENO, text + done, (size_t)n - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
}

/* The end of a fatal path. A rank that printed takes the job down (the
 * abort hook). One that stayed silent because another rank of its node
 * printed waits a while for that rank's abort to end it, so that the job
 * ends with one message and one abort; then it aborts itself. */
static __attribute__((noreturn)) void die(int status, int printed)
{
    fflush(stdout);
    fflush(stderr);
    dm_startup_undo();
    struct timespec pause = {0, 100000000L};
    if (!printed && abort_hook)
        for (int i = 0; i < 100; i++) nanosleep(&pause, NULL);
    /* The launcher forwards a rank's stderr through a pipe and tears the
     * job down at an abort, sometimes before it has read the message
     * (seen under load with 0.1 s): give it half a second. */
    if (printed && abort_hook && this_world > 1)
        for (int i = 0; i < 5; i++) nanosleep(&pause, NULL);
    if (abort_hook) abort_hook(status);
    exit(status);
}

void dm_user_error(const char *fmt, ...)
{
    if (this_rank == 0 && may_print()) {
        va_list ap;
        va_start(ap, fmt);
        print_message("dynmo: error: ", fmt, ap);
        va_end(ap);
    }
    fflush(stdout);
    fflush(stderr);
    dm_startup_undo();
    if (finalize_hook) finalize_hook();
    exit(DM_EXIT_USAGE);
}

void dm_user_error_local(const char *fmt, ...)
{
    int printed = may_print();
    if (printed) {
        char prefix[64] = "dynmo: error: ";
        if (this_world > 1) snprintf(prefix, sizeof prefix, "[rank %d] dynmo: error: ", this_rank);
        va_list ap;
        va_start(ap, fmt);
        print_message(prefix, fmt, ap);
        va_end(ap);
    }
    die(DM_EXIT_USAGE, printed);
}

void dm_internal_error(const char *file, int line, const char *fmt, ...)
{
    int printed = may_print();
    if (printed) {
        char prefix[512];
        snprintf(prefix, sizeof prefix, "[rank %d] %s:%d: internal error: ", this_rank, file, line);
        va_list ap;
        va_start(ap, fmt);
        print_message(prefix, fmt, ap);
        va_end(ap);
    }
    die(DM_EXIT_INTERNAL, printed);
}

void dm_log(const char *fmt, ...)
{
    if (this_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void dm_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[rank %d] ", this_rank);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}
