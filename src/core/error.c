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

static __attribute__((noreturn)) void die(int status)
{
    fflush(stdout);
    fflush(stderr);
    if (abort_hook) abort_hook(status);
    exit(status);
}

void dm_user_error(const char *fmt, ...)
{
    if (this_rank == 0 && may_print()) {
        va_list ap;
        va_start(ap, fmt);
        fflush(stdout);
        fputs("dynmo: error: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    fflush(stdout);
    fflush(stderr);
    if (finalize_hook) finalize_hook();
    exit(DM_EXIT_USAGE);
}

void dm_user_error_local(const char *fmt, ...)
{
    fflush(stdout);
    if (may_print()) {
        va_list ap;
        va_start(ap, fmt);
        if (this_world > 1) fprintf(stderr, "[rank %d] ", this_rank);
        fputs("dynmo: error: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    die(DM_EXIT_USAGE);
}

void dm_internal_error(const char *file, int line, const char *fmt, ...)
{
    fflush(stdout);
    if (may_print()) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "[rank %d] %s:%d: internal error: ", this_rank, file, line);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    die(DM_EXIT_INTERNAL);
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
