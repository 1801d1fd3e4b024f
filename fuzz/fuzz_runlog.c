/* libFuzzer harness of every reader of a run log. The input is a run log's
 * bytes; the harness writes them to DIR/runlog.h5 in one temporary
 * directory (in $TMPDIR, default /dev/shm when it exists, else /tmp), so
 * that the readers' own open and checks run on a file, then
 *  - in this process, where coverage guides the fuzzer: runlog_open_read
 *    and, when the file opens, every listed dataset through the reader of
 *    its rank (whole, and its first and last rows), the root attributes,
 *    runlog_file_config, runlog_file_layouts, trace_load and
 *    report_run_try_load (all that `dynmo report` reads);
 *  - in one child process, one after the other, the readers that end a
 *    bad file with exit 2 through dm_user_error: `inspect --json`, `trace`
 *    (to a file in DIR), simulate's sim_run_read and plan --from-run's
 *    plan_read_run. Each must return or end with status 2 (the child's
 *    exit hooks jump to the next reader then): never a signal, a sanitizer
 *    report or an internal error (status 1), and the child must end within
 *    60 s and 2 GiB resident (its stderr is shown when it fails). One fork
 *    for the four: a fork of this process costs tens of milliseconds.
 *
 * It checks the readers' contract besides: a failure's message names the
 * file, nothing allocated is left behind (LeakSanitizer), no HDF5 object
 * is left open. */
#include <errno.h>
#include <hdf5.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "dynmo/ckpt.h"
#include "dynmo/tools.h"
#include "tools/plan/plan.h"
#include "tools/report/report.h"
#include "tools/simulate/simulate.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHILD_SECONDS 60
#define CHILD_RSS_BYTES (2L << 30)

static char dir[1024], path[1200], trace_out[1200], child_err[1200];

__attribute__((noreturn)) static void broken(const char *what)
{
    fprintf(stderr, "fuzz_runlog: %s\n", what);
    abort();
}

static void remove_temporary(void)
{
    unlink(path);
    unlink(trace_out);
    unlink(child_err);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/dynmo-fuzz-runlog.XXXXXX", tmp);
    if (!mkdtemp(dir)) broken("cannot create the temporary directory");
    snprintf(path, sizeof path, "%s/" RUNLOG_FILE_NAME, dir);
    snprintf(trace_out, sizeof trace_out, "%s/trace.json", dir);
    snprintf(child_err, sizeof child_err, "%s/child.err", dir);
    atexit(remove_temporary);
    return 0;
}

static void write_input(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        broken("cannot write the temporary run log");
}

/* A failure's message must name the file. */
static void check_failure(const char *err)
{
    if (!strstr(err, path)) {
        fprintf(stderr, "fuzz_runlog: message without the file's name: %s\n", err);
        abort();
    }
}

/* ---- in this process ------------------------------------------------------ */

static void read_dataset(struct runlog_file *f, const struct runlog_dataset_info *d)
{
    char err[1400];
    if (d->rank == 1) {
        float *values = NULL;
        int *ints = NULL;
        if (runlog_file_series(f, d->name, &values, err, sizeof err) < 0) check_failure(err);
        if (runlog_file_int_series(f, d->name, &ints, err, sizeof err) < 0) check_failure(err);
        dm_free(values);
        dm_free(ints);
    } else if (d->rank == 2) {
        float *values = NULL;
        int *ints = NULL, cols = 0;
        if (runlog_file_matrix(f, d->name, &values, &cols, err, sizeof err) < 0)
            check_failure(err);
        if (runlog_file_int_matrix(f, d->name, &ints, &cols, err, sizeof err) < 0)
            check_failure(err);
        if (d->dims[0] > 0 && d->dims[1] > 0 && d->dims[1] <= 1 << 16) {
            float *row = dm_alloc((size_t)d->dims[1] * sizeof *row);
            if (runlog_file_row(f, d->name, 0, row, (int)d->dims[1], err, sizeof err) < 0 ||
                runlog_file_row(f, d->name, -1, row, (int)d->dims[1], err, sizeof err) < 0)
                check_failure(err);
            dm_free(row);
        }
        dm_free(values);
        dm_free(ints);
    }
}

static void read_in_process(void)
{
    char err[1400];
    struct runlog_file *f = runlog_open_read(path, err, sizeof err);
    if (!f) {
        check_failure(err);
        return;
    }
    const struct runlog_dataset_info *infos;
    int count = runlog_file_list(f, &infos);
    for (int i = 0; i < count; i++) read_dataset(f, &infos[i]);
    static const char *const texts[] = {"kind", "config", "format_version", "dynmo_version",
                                        "created"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        char *text = NULL;
        if (runlog_file_attr(f, texts[i], &text, err, sizeof err) < 0) check_failure(err);
        dm_free(text);
    }
    int *ints = NULL;
    double *doubles = NULL;
    if (runlog_file_attr_ints(f, RUNLOG_ATTR_STAGE_GROUPS, &ints, err, sizeof err) < 0)
        check_failure(err);
    dm_free(ints);
    ints = NULL;
    if (runlog_file_attr_ints(f, RUNLOG_ATTR_GROUP_TURNS, &ints, err, sizeof err) < 0)
        check_failure(err);
    dm_free(ints);
    if (runlog_file_attr_doubles(f, RUNLOG_ATTR_GROUP_CORES, &doubles, err, sizeof err) < 0)
        check_failure(err);
    dm_free(doubles);
    struct dm_config cfg;
    int status = runlog_file_config(f, &cfg, err, sizeof err);
    if (status < 0) check_failure(err);
    struct runlog_layouts layouts;
    if (runlog_file_layouts(f, status == 0 ? cfg.layers : 0, &layouts, err, sizeof err) < 0)
        check_failure(err);
    runlog_layouts_free(&layouts);
    struct trace t;
    if (trace_load(f, &t, err, sizeof err) < 0) check_failure(err);
    trace_free(&t);
    runlog_close_read(f);
    struct report_run run;
    if (report_run_try_load(&run, path, 2, err, sizeof err) == 0) report_run_free(&run);
    else check_failure(err);
}

/* ---- in a child ------------------------------------------------------------------ */

/* Where a reader that ended the process with exit 2 resumes, in the child. */
static sigjmp_buf next_reader;

static void reader_refused(void) { siglongjmp(next_reader, 1); }

static void reader_died(int status)
{
    if (status == DM_EXIT_USAGE) siglongjmp(next_reader, 1);
    _exit(status);
}

static void child_inspect(void)
{
    char *argv[] = {"inspect", path, "--json", NULL};
    cmd_inspect(3, argv);
}

static void child_trace(void)
{
    unlink(trace_out);
    char *argv[] = {"trace", path, "--out", trace_out, NULL};
    cmd_trace(4, argv);
}

static void child_simulate(void)
{
    struct sim_run run;
    sim_run_read(&run, dir, 0);
    sim_run_free(&run);
}

static void child_plan(void)
{
    struct plan_input in;
    int *layout = NULL, stages = 0, micro_batches = 0, units = 0;
    plan_read_run(&in, dir, 1, &layout, &stages, &micro_batches, &units);
    struct plan_sharing sharing;
    memset(&sharing, 0, sizeof sharing);
    plan_sharing_from_run(&sharing, dir, stages, stages);
}

static long resident_bytes(pid_t pid)
{
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/statm", (int)pid);
    FILE *f = fopen(name, "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * sysconf(_SC_PAGESIZE);
}

static void show_child_stderr(void)
{
    FILE *f = fopen(child_err, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
    if (f) fclose(f);
}

static const struct {
    const char *name;
    void (*read)(void);
} readers[] = {{"inspect --json", child_inspect}, {"trace", child_trace},
               {"simulate's reader", child_simulate}, {"plan --from-run's reader", child_plan}};

/* Runs the readers in a child and checks how it ended. */
static void run_child(void)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) broken("fork failed");
    if (pid == 0) {
        FILE *out = freopen("/dev/null", "w", stdout), *err = freopen(child_err, "w", stderr);
        if (!out || !err) _exit(97);
        dm_set_finalize_hook(reader_refused);
        dm_set_abort_hook(reader_died);
        for (size_t k = 0; k < sizeof readers / sizeof *readers; k++) {
            fprintf(stderr, "fuzz_runlog: %s\n", readers[k].name);
            fflush(stderr);
            if (sigsetjmp(next_reader, 1) == 0) readers[k].read();
        }
        fflush(stdout);
        _exit(0);
    }
    struct timespec pause = {0, 2000000L}, start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int status = 0;
    for (;;) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) break;
        if (done < 0 && errno != EINTR) broken("waitpid failed");
        clock_gettime(CLOCK_MONOTONIC, &now);
        const char *why = now.tv_sec - start.tv_sec > CHILD_SECONDS ? "ran past 60 s"
                        : resident_bytes(pid) > CHILD_RSS_BYTES ? "grew past 2 GiB resident"
                        : NULL;
        if (why) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            show_child_stderr();
            fprintf(stderr, "fuzz_runlog: the readers' child %s\n", why);
            abort();
        }
        nanosleep(&pause, NULL);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    show_child_stderr();
    fprintf(stderr, "fuzz_runlog: the readers' child (the last reader it names above) ended "
            "with %s %d\n", WIFSIGNALED(status) ? "signal" : "status",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) LLVMFuzzerInitialize(NULL, NULL);
    write_input(data, size);
    read_in_process();
    ssize_t open_objects = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open_objects != 0) {
        fprintf(stderr, "fuzz_runlog: %zd HDF5 objects left open after the readers\n",
                open_objects);
        abort();
    }
    char err[1400];
    struct runlog_file *f = runlog_open_read(path, err, sizeof err);
    if (!f) return 0;   /* every command stops at the same open, in this process above */
    runlog_close_read(f);
    run_child();
    return 0;
}
