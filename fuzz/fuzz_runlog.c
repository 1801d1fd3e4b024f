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
 *    60 s and 2 GiB resident (its stderr is shown when it fails).
 *
 * The children come from a fork server: a process forked once, in
 * LLVMFuzzerInitialize, before libFuzzer has read its corpus, with the
 * HDF5 library started. Per input that opens as a run log, this process
 * asks it over a pipe for a child; it forks one, watches its time and
 * resident memory, and answers how it ended. A fork of this process
 * itself (hundreds of MB resident once the corpus is loaded) cost more
 * than the four readers: copying its page tables, then copy-on-write
 * faults in both processes.
 *
 * It checks the readers' contract besides: a failure's message names the
 * file, nothing allocated is left behind (LeakSanitizer), no HDF5 object
 * is left open. */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
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

static void start_server(void);
static void stop_server(void);

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
    start_server();
    atexit(remove_temporary);
    atexit(stop_server);
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

/* Returns whether the file opened as a run log. */
static int read_in_process(void)
{
    char err[1400];
    struct runlog_file *f = runlog_open_read(path, err, sizeof err);
    if (!f) {
        check_failure(err);
        return 0;
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
    return 1;
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
    struct plan_run run;
    struct plan_steps first = {1, 1};
    plan_read_run(&in, dir, &first, 0, &run);
    struct plan_sharing sharing;
    memset(&sharing, 0, sizeof sharing);
    plan_sharing_from_run(&sharing, dir, run.stages, run.stages);
}

/* The resident bytes of a process, from its /proc/PID/statm (open as
 * statm; read again at each call); 0 when it cannot be read. */
static long resident_bytes(int statm)
{
    char text[256];
    ssize_t n = statm >= 0 ? pread(statm, text, sizeof text - 1, 0) : -1;
    if (n <= 0) return 0;
    text[n] = 0;
    char *end;
    strtol(text, &end, 10);
    long resident = strtol(end, NULL, 10);
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

/* How a child ended: its wait status (-1: the fork server could not fork
 * or wait), and whether it was killed for a limit (CHILD_ENDED when it
 * ended by itself). */
enum child_end { CHILD_ENDED, CHILD_TOO_LONG, CHILD_TOO_LARGE };
struct child_result {
    int status;
    int end;   /* enum child_end */
};

/* The child: runs the readers on the file and exits 0. */
__attribute__((noreturn)) static void run_readers(void)
{
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

/* Forks a child that runs the readers and waits for it, killing it past
 * CHILD_SECONDS or CHILD_RSS_BYTES resident. It waits on a pidfd, so
 * that it wakes as the child ends, and looks at the limits every 5 ms. */
static struct child_result run_child(int requests, int replies)
{
    struct child_result r = {0, CHILD_ENDED};
    pid_t pid = fork();
    if (pid < 0) {
        r.status = -1;
        return r;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* ends with the fork server */
        close(requests);
        close(replies);
        run_readers();
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/statm", (int)pid);
    int statm = open(name, O_RDONLY);
    struct timespec pause = {0, 2000000L}, start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pid_t done = waitpid(pid, &r.status, WNOHANG);
        if (done == pid) break;
        if (done < 0 && errno != EINTR) {
            r.status = -1;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        r.end = now.tv_sec - start.tv_sec > CHILD_SECONDS ? CHILD_TOO_LONG
              : resident_bytes(statm) > CHILD_RSS_BYTES ? CHILD_TOO_LARGE
              : CHILD_ENDED;
        if (r.end != CHILD_ENDED) {
            kill(pid, SIGKILL);
            waitpid(pid, &r.status, 0);
            break;
        }
        if (pidfd >= 0) {
            struct pollfd ended = {pidfd, POLLIN, 0};
            poll(&ended, 1, 5);
        } else {
            nanosleep(&pause, NULL);
        }
    }
    if (pidfd >= 0) close(pidfd);
    if (statm >= 0) close(statm);
    return r;
}

/* The fork server's end of the pipes: one request byte per child, one
 * child_result per answer, until this process closes its end. */
static int server_requests = -1, server_replies = -1;
static pid_t server_pid;

__attribute__((noreturn)) static void serve(int requests, int replies)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dm_h5_init();
    for (;;) {
        char byte;
        ssize_t n = read(requests, &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n != 1) _exit(0);
        struct child_result r = run_child(requests, replies);
        if (write(replies, &r, sizeof r) != (ssize_t)sizeof r) _exit(0);
    }
}

static void start_server(void)
{
    int to_server[2], from_server[2];
    if (pipe(to_server) != 0 || pipe(from_server) != 0)
        broken("cannot create the fork server's pipes");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) broken("cannot fork the fork server");
    if (pid == 0) {
        close(to_server[1]);
        close(from_server[0]);
        serve(to_server[0], from_server[1]);
    }
    close(to_server[0]);
    close(from_server[1]);
    server_requests = to_server[1];
    server_replies = from_server[0];
    server_pid = pid;
}

/* At exit: the fork server ends when its request pipe closes. */
static void stop_server(void)
{
    close(server_requests);
    close(server_replies);
    int status;
    while (waitpid(server_pid, &status, 0) < 0 && errno == EINTR) {
    }
}

/* Has the fork server run the readers on the file, and checks how the
 * child ended. */
static void check_child(void)
{
    struct child_result r;
    char byte = 'r';
    ssize_t n;
    do n = write(server_requests, &byte, 1);
    while (n < 0 && errno == EINTR);
    if (n != 1) broken("the fork server is gone");
    size_t got = 0;
    while (got < sizeof r) {
        n = read(server_replies, (char *)&r + got, sizeof r - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) broken("the fork server is gone");
        got += (size_t)n;
    }
    if (r.status == -1) broken("the fork server cannot fork or wait");
    if (r.end != CHILD_ENDED) {
        show_child_stderr();
        fprintf(stderr, "fuzz_runlog: the readers' child %s\n",
                r.end == CHILD_TOO_LONG ? "ran past 60 s" : "grew past 2 GiB resident");
        abort();
    }
    if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) return;
    show_child_stderr();
    fprintf(stderr, "fuzz_runlog: the readers' child (the last reader it names above) ended "
            "with %s %d\n", WIFSIGNALED(r.status) ? "signal" : "status",
            WIFSIGNALED(r.status) ? WTERMSIG(r.status) : WEXITSTATUS(r.status));
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) LLVMFuzzerInitialize(NULL, NULL);
    write_input(data, size);
    int opened = read_in_process();
    ssize_t open_objects = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open_objects != 0) {
        fprintf(stderr, "fuzz_runlog: %zd HDF5 objects left open after the readers\n",
                open_objects);
        abort();
    }
    /* Every command stops at the same open, runlog_open_read of the same
     * bytes, which failed in this process above. */
    if (!opened) return 0;
    check_child();
    return 0;
}
