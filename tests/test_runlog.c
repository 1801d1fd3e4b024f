/* The run log: series and rows read back bit-exact after close, a long run
 * stays cheap per step, reopening continues each dataset, a killed writer
 * leaves every flushed step, and damaged or foreign files are reported
 * (by the readers with a message, by `dynmo inspect` with exit status 2);
 * the reader's checks of the listing, the config and the layouts. */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <hdf5.h>
#include "dynmo/ckpt.h"
#include "dynmo/tools.h"
#include "testing.h"

static char dir[256];

static void path_in_dir(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", dir, name);
}

/* Values that catch any conversion on the way: signed zero, NaN payloads,
 * infinities, denormals and ordinary numbers with all mantissa bits used. */
static float tricky_float(long i)
{
    uint32_t bits;
    switch (i % 7) {
    case 0: bits = 0x80000000u; break;                  /* -0.0 */
    case 1: bits = 0x7fc01234u; break;                  /* NaN with payload */
    case 2: bits = 0xff800000u; break;                  /* -inf */
    case 3: bits = 0x00000001u + (uint32_t)i; break;    /* denormal */
    default: bits = 0x3f800000u ^ (uint32_t)(i * 2654435761u >> 9); break;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Ints with the sign bit and high bits set. */
static int tricky_int(long step, int column)
{
    uint32_t bits = (uint32_t)(step * 1000003 - column * 7919) ^ ((uint32_t)column << 30);
    int value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Runs fn(arg) in a child with stdout and stderr sent to files; returns the
 * child's exit status, or 128 + signal. */
static int run_in_child(void (*fn)(void *), void *arg, const char *out_path,
                        const char *err_path)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        dup2(err, 2);
        fn(arg);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

static int file_contains(const char *path, const char *needle)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static void test_write_read_exact(void)
{
    char path[512], err[1024];
    path_in_dir(path, sizeof path, "exact.h5");
    struct dm_config cfg;
    config_defaults(&cfg);
    struct runlog *log = runlog_create(path, &cfg);
    enum { STEPS = 300, COLS = 13, ICOLS = 5 };
    for (long step = 0; step < STEPS; step++) {
        float row[COLS];
        int irow[ICOLS];
        for (int j = 0; j < COLS; j++) row[j] = tricky_float(step * COLS + j);
        for (int j = 0; j < ICOLS; j++) irow[j] = tricky_int(step, j);
        runlog_append_scalar(log, "/steps/loss", tricky_float(step));
        runlog_append_int_scalar(log, "/steps/ranks", (int)step - 150);
        runlog_append_row(log, "/layers/fwd_ms", row, COLS);
        runlog_append_int_row(log, "/layout/stage_of_layer", irow, ICOLS);
        if (step % 50 == 49) runlog_append_scalar(log, "/eval/loss", (float)step);
        runlog_flush(log);
    }
    CHECK(runlog_rows(log, "/steps/loss") == STEPS);
    CHECK(runlog_rows(log, "/eval/loss") == STEPS / 50);
    CHECK(runlog_rows(log, "/no/such") == -1);
    runlog_close(log);

    float *series = NULL;
    long n = runlog_read_series(path, "/steps/loss", &series, err, sizeof err);
    CHECK_MSG(n == STEPS, "read %ld rows: %s", n, err);
    int mismatches = 0;
    for (long i = 0; i < n && i < STEPS; i++) {
        float want = tricky_float(i);
        if (memcmp(&series[i], &want, sizeof want)) mismatches++;
    }
    CHECK_MSG(mismatches == 0, "%d of %d scalars differ in their bits", mismatches, STEPS);
    dm_free(series);

    float *matrix = NULL;
    int ncols = 0;
    n = runlog_read_matrix(path, "/layers/fwd_ms", &matrix, &ncols, err, sizeof err);
    CHECK_MSG(n == STEPS && ncols == COLS, "read %ld x %d: %s", n, ncols, err);
    mismatches = 0;
    for (long i = 0; i < (long)STEPS * COLS && n == STEPS && ncols == COLS; i++) {
        float want = tricky_float(i);
        if (memcmp(&matrix[i], &want, sizeof want)) mismatches++;
    }
    CHECK_MSG(mismatches == 0, "%d matrix values differ in their bits", mismatches);
    dm_free(matrix);

    int *imatrix = NULL;
    n = runlog_read_int_matrix(path, "/layout/stage_of_layer", &imatrix, &ncols, err,
                               sizeof err);
    CHECK_MSG(n == STEPS && ncols == ICOLS, "read %ld x %d: %s", n, ncols, err);
    mismatches = 0;
    for (long step = 0; step < n && n == STEPS && ncols == ICOLS; step++)
        for (int j = 0; j < ICOLS; j++)
            if (imatrix[step * ICOLS + j] != tricky_int(step, j))
                mismatches++;
    CHECK_MSG(mismatches == 0, "%d int values differ", mismatches);
    dm_free(imatrix);

    /* One row, from the front and from the back. */
    float row[COLS];
    CHECK(runlog_read_row(path, "/layers/fwd_ms", 7, row, COLS, err, sizeof err) == 0);
    CHECK(memcmp(&row[2], &(float){tricky_float(7 * COLS + 2)}, sizeof(float)) == 0);
    CHECK(runlog_read_row(path, "/layers/fwd_ms", -1, row, COLS, err, sizeof err) == 0);
    CHECK(memcmp(&row[0], &(float){tricky_float((STEPS - 1) * COLS)}, sizeof(float)) == 0);
    CHECK(runlog_read_row(path, "/layers/fwd_ms", STEPS, row, COLS, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "out of range") != NULL, "err: %s", err);
    CHECK(runlog_read_row(path, "/layers/fwd_ms", 0, row, COLS - 1, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "columns") != NULL, "err: %s", err);

    /* Int series read through the float reader convert. */
    n = runlog_read_series(path, "/steps/ranks", &series, err, sizeof err);
    CHECK(n == STEPS && series[0] == -150.0f && series[STEPS - 1] == 149.0f);
    dm_free(series);

    /* Wrong rank and missing datasets are reported, not fatal. */
    CHECK(runlog_read_series(path, "/layers/fwd_ms", &series, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "rank 2, expected 1") != NULL, "err: %s", err);
    CHECK(runlog_read_series(path, "/steps/nothing", &series, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "has no dataset /steps/nothing") != NULL, "err: %s", err);
    CHECK(series == NULL);

    /* Root attributes. */
    char *text = NULL;
    char want_config[1 << 16];
    config_print(&cfg, want_config, sizeof want_config);
    CHECK(runlog_read_root_attr(path, "config", &text, err, sizeof err) == 0);
    CHECK(text && strcmp(text, want_config) == 0);
    dm_free(text);
    CHECK(runlog_read_root_attr(path, "dynmo_version", &text, err, sizeof err) == 0);
    CHECK(text && strcmp(text, DYNMO_VERSION) == 0);
    dm_free(text);
    CHECK(runlog_read_root_attr(path, "created", &text, err, sizeof err) == 0);
    CHECK_MSG(text && strlen(text) == 20 && text[10] == 'T' && text[19] == 'Z', "created %s",
              text ? text : "(null)");
    dm_free(text);
    CHECK(runlog_read_root_attr(path, "format_version", &text, err, sizeof err) == 0);
    CHECK(text && atoi(text) == RUNLOG_FORMAT_VERSION);
    dm_free(text);
    CHECK(runlog_read_root_attr(path, "absent", &text, err, sizeof err) == 1 && !text);
    char kind[32];
    CHECK(dm_file_kind(path, kind, sizeof kind, err, sizeof err) == 0 &&
          strcmp(kind, RUNLOG_KIND) == 0);

    struct runlog_dataset_info *infos = NULL;
    int count = runlog_list_datasets(path, &infos, err, sizeof err);
    CHECK_MSG(count == 5, "%d datasets: %s", count, err);
    if (count == 5) {
        CHECK(strcmp(infos[0].name, "/eval/loss") == 0 && infos[0].dims[0] == STEPS / 50);
        CHECK(strcmp(infos[1].name, "/layers/fwd_ms") == 0 && infos[1].rank == 2 &&
              infos[1].dims[0] == STEPS && infos[1].dims[1] == COLS && !infos[1].is_int);
        CHECK(strcmp(infos[2].name, "/layout/stage_of_layer") == 0 && infos[2].is_int &&
              infos[2].element_bytes == 4);
        CHECK(strcmp(infos[3].name, "/steps/loss") == 0 && infos[3].rank == 1);
        CHECK(strcmp(infos[4].name, "/steps/ranks") == 0 && infos[4].is_int);
    }
    dm_free(infos);
}

/* A long run with the trainer's load: ten series a step (eight scalars and
 * two rows of 48 layers) and a flush per step. */
static void test_many_steps(void)
{
    char path[512], err[1024];
    path_in_dir(path, sizeof path, "many.h5");
    struct dm_config cfg;
    config_defaults(&cfg);
    struct runlog *log = runlog_create(path, &cfg);
    enum { STEPS = 20000, LAYERS = 48 };
    static const char *names[8] = {"/steps/loss", "/steps/lr", "/steps/grad_norm",
                                   "/steps/step_ms", "/steps/tokens_per_s",
                                   "/steps/peak_rss_mb", "/stages/a", "/stages/b"};
    float row[LAYERS];
    double append_s = 0, flush_s = 0;
    for (long step = 0; step < STEPS; step++) {
        double t0 = dm_now();
        for (int k = 0; k < 8; k++) runlog_append_scalar(log, names[k], (float)(step * 8 + k));
        for (int j = 0; j < LAYERS; j++) row[j] = (float)(step + j);
        runlog_append_row(log, "/layers/fwd_ms", row, LAYERS);
        runlog_append_row(log, "/layers/bwd_ms", row, LAYERS);
        double t1 = dm_now();
        runlog_flush(log);
        double t2 = dm_now();
        append_s += t1 - t0;
        flush_s += t2 - t1;
    }
    runlog_close(log);
    double append_ms = append_s * 1e3 / STEPS, flush_ms = flush_s * 1e3 / STEPS;
    printf("many steps: %d steps x 10 series: append %.4f ms/step, flush %.4f ms/step\n",
           STEPS, append_ms, flush_ms);
    CHECK_MSG(append_ms < 0.5, "appending 10 series costs %.4f ms per step", append_ms);
    CHECK_MSG(append_ms + flush_ms < 5.0, "append + flush cost %.4f ms per step",
              append_ms + flush_ms);

    float *values = NULL;
    int bad = 0;
    for (int k = 0; k < 8; k++) {
        long n = runlog_read_series(path, names[k], &values, err, sizeof err);
        CHECK_MSG(n == STEPS, "%s: %ld rows: %s", names[k], n, err);
        for (long i = 0; i < n; i++) bad += values[i] != (float)(i * 8 + k);
        dm_free(values);
    }
    int ncols = 0;
    long n = runlog_read_matrix(path, "/layers/bwd_ms", &values, &ncols, err, sizeof err);
    CHECK(n == STEPS && ncols == LAYERS);
    for (long i = 0; i < n; i++)
        for (int j = 0; j < ncols; j++) bad += values[i * ncols + j] != (float)(i + j);
    dm_free(values);
    CHECK_MSG(bad == 0, "%d values differ", bad);
}

static void test_reopen(void)
{
    char path[512], err[1024];
    path_in_dir(path, sizeof path, "reopen.h5");
    struct dm_config cfg;
    config_defaults(&cfg);
    struct runlog *log = runlog_create(path, &cfg);
    int stages[4] = {0, 0, 1, 1};
    for (int step = 0; step < 10; step++) {
        runlog_append_scalar(log, "/steps/loss", (float)step);
        runlog_append_int_row(log, "/layout/stage_of_layer", stages, 4);
    }
    runlog_close(log);

    /* A restart continues each dataset after its last row; a restart from a
     * checkpoint at step 8 first cuts the log back to 8 rows. */
    log = runlog_open_append(path);
    CHECK(runlog_rows(log, "/steps/loss") == 10);
    CHECK(runlog_rows(log, "/layout/stage_of_layer") == 10);
    runlog_truncate(log, "/steps/loss", 8);
    runlog_truncate(log, "/layout/stage_of_layer", 8);
    CHECK(runlog_rows(log, "/steps/loss") == 8);
    stages[3] = 2;
    for (int step = 8; step < 15; step++) {
        runlog_append_scalar(log, "/steps/loss", (float)step + 0.5f);
        runlog_append_int_row(log, "/layout/stage_of_layer", stages, 4);
    }
    runlog_append_scalar(log, "/eval/loss", 1.25f);
    CHECK(runlog_rows(log, "/steps/loss") == 15);
    runlog_close(log);

    float *values = NULL;
    long n = runlog_read_series(path, "/steps/loss", &values, err, sizeof err);
    CHECK_MSG(n == 15, "%ld rows: %s", n, err);
    int bad = 0;
    for (long i = 0; i < n; i++) bad += values[i] != (i < 8 ? (float)i : (float)i + 0.5f);
    CHECK_MSG(bad == 0, "%d values differ after reopening", bad);
    dm_free(values);
    int *rows = NULL, ncols = 0;
    n = runlog_read_int_matrix(path, "/layout/stage_of_layer", &rows, &ncols, err, sizeof err);
    CHECK(n == 15 && ncols == 4 && rows[7 * 4 + 3] == 1 && rows[8 * 4 + 3] == 2);
    dm_free(rows);
    /* The root attributes survive the reopen untouched. */
    char *text = NULL;
    CHECK(runlog_read_root_attr(path, "kind", &text, err, sizeof err) == 0 && text &&
          strcmp(text, RUNLOG_KIND) == 0);
    dm_free(text);
}

/* One row per step across resumes (runlog_resume_at, runlog_end_step):
 * a dataset a segment does not write gets filler rows, one created late
 * starts with filler, a wider row widens its dataset, a narrower one gets
 * filler cells; the events (/eval) are not steps. */
static void test_rows_are_steps(void)
{
    char path[512], err[1024];
    path_in_dir(path, sizeof path, "steps.h5");
    struct dm_config cfg;
    config_defaults(&cfg);
    struct runlog *log = runlog_create(path, &cfg);
    runlog_resume_at(log, 2);   /* a run resumed at step 2 in a new directory */
    float two[2] = {1, 2}, three[3] = {3, 4, 5};
    int counts[2] = {7, 8};
    for (int step = 2; step < 5; step++) {
        runlog_append_scalar(log, "/steps/loss", (float)step);
        runlog_append_row(log, "/stages/busy_ms", two, 2);
        if (step == 3) runlog_append_int_row(log, "/moe/tokens", counts, 2);
        runlog_end_step(log);
    }
    runlog_append_scalar(log, "/eval/loss", 0.5f);
    runlog_close(log);
    log = runlog_open_append(path);
    runlog_resume_at(log, 4);   /* resumed from step 4 on three stages */
    runlog_append_scalar(log, "/steps/loss", 4.5f);
    runlog_append_row(log, "/stages/busy_ms", three, 3);
    runlog_end_step(log);
    runlog_append_scalar(log, "/steps/loss", 5.5f);
    runlog_append_row(log, "/stages/busy_ms", two, 2);
    runlog_end_step(log);
    CHECK(runlog_rows(log, "/eval/loss") == 1);
    runlog_close(log);

    float *values = NULL;
    int ncols = 0;
    long n = runlog_read_series(path, "/steps/loss", &values, err, sizeof err);
    CHECK_MSG(n == 6 && isnan(values[0]) && isnan(values[1]) && values[3] == 3.0f &&
              values[4] == 4.5f && values[5] == 5.5f, "/steps/loss: %ld rows", n);
    dm_free(values);
    n = runlog_read_matrix(path, "/stages/busy_ms", &values, &ncols, err, sizeof err);
    CHECK_MSG(n == 6 && ncols == 3, "/stages/busy_ms: %ld x %d", n, ncols);
    if (n == 6 && ncols == 3) {
        CHECK(isnan(values[0]) && isnan(values[1 * 3 + 1]));              /* before the resume */
        CHECK(values[2 * 3] == 1 && values[2 * 3 + 1] == 2 && isnan(values[2 * 3 + 2]));
        CHECK(values[4 * 3] == 3 && values[4 * 3 + 2] == 5);              /* widened */
        CHECK(values[5 * 3 + 1] == 2 && isnan(values[5 * 3 + 2]));        /* narrower row */
    }
    dm_free(values);
    int *ints = NULL;
    n = runlog_read_int_matrix(path, "/moe/tokens", &ints, &ncols, err, sizeof err);
    CHECK_MSG(n == 6 && ncols == 2, "%s: %ld x %d", "/moe/tokens", n, ncols);
    if (n == 6 && ncols == 2)
        CHECK(ints[0] == -1 && ints[2 * 2] == -1 && ints[3 * 2] == 7 && ints[3 * 2 + 1] == 8 &&
              ints[5 * 2] == -1);   /* written at step 4 only: -1 everywhere else */
    dm_free(ints);
}

struct killed_run {
    const char *path;
    int steps;
};

static void write_then_die(void *arg)
{
    struct killed_run *run = arg;
    struct dm_config cfg;
    config_defaults(&cfg);
    struct runlog *log = runlog_create(run->path, &cfg);
    float row[6] = {1, 2, 3, 4, 5, 6};
    for (int step = 0; step < run->steps; step++) {
        runlog_append_scalar(log, "/steps/loss", (float)step);
        runlog_append_row(log, "/layers/fwd_ms", row, 6);
        runlog_flush(log);
    }
    /* Unflushed rows after the last flush may or may not survive. */
    runlog_append_scalar(log, "/steps/loss", -1.0f);
    kill(getpid(), SIGKILL);
}

static void test_killed_writer_keeps_flushed_steps(void)
{
    char path[512], out[512], errf[512], err[1024];
    path_in_dir(path, sizeof path, "killed.h5");
    path_in_dir(out, sizeof out, "killed.out");
    path_in_dir(errf, sizeof errf, "killed.err");
    struct killed_run run = {path, 37};
    int status = run_in_child(write_then_die, &run, out, errf);
    CHECK_MSG(status == 128 + SIGKILL, "child status %d", status);
    float *values = NULL;
    long n = runlog_read_series(path, "/steps/loss", &values, err, sizeof err);
    CHECK_MSG(n == 37, "a run killed after 37 flushed steps reads back %ld rows: %s", n, err);
    for (long i = 0; i < n && i < 37; i++) CHECK(values[i] == (float)i);
    dm_free(values);
    float row[6];
    CHECK_MSG(runlog_read_row(path, "/layers/fwd_ms", 36, row, 6, err, sizeof err) == 0,
              "%s", err);
    CHECK(row[5] == 6.0f);
}

/* A run still writing its log: the writer holds HDF5's file lock, and a
 * reader must still see every flushed step. */
static void test_reading_a_live_log(void)
{
    char path[512], err[1024];
    path_in_dir(path, sizeof path, "live.h5");
    int ready[2], finish[2];
    DM_CHECK_SYS(pipe(ready));
    DM_CHECK_SYS(pipe(finish));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct dm_config cfg;
        config_defaults(&cfg);
        struct runlog *log = runlog_create(path, &cfg);
        for (int step = 0; step < 5; step++) {
            runlog_append_scalar(log, "/steps/loss", (float)step);
            runlog_flush(log);
        }
        char byte = 1;
        if (write(ready[1], &byte, 1) != 1) _exit(3);
        if (read(finish[0], &byte, 1) != 1) _exit(3);
        runlog_close(log);
        _exit(0);
    }
    char byte = 0;
    CHECK(read(ready[0], &byte, 1) == 1);
    float *values = NULL;
    long n = runlog_read_series(path, "/steps/loss", &values, err, sizeof err);
    CHECK_MSG(n == 5, "live log: %ld rows: %s", n, err);
    CHECK(n == 5 && values[4] == 4.0f);
    dm_free(values);
    CHECK(write(finish[1], &byte, 1) == 1);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(ready[0]);
    close(ready[1]);
    close(finish[0]);
    close(finish[1]);
}

static void copy_prefix(const char *from, const char *to, long bytes)
{
    FILE *in = fopen(from, "rb");
    FILE *out = fopen(to, "wb");
    DM_ASSERT(in && out);
    char buf[4096];
    long left = bytes;
    while (left > 0) {
        size_t want = left < (long)sizeof buf ? (size_t)left : sizeof buf;
        size_t got = fread(buf, 1, want, in);
        if (got == 0) break;
        fwrite(buf, 1, got, out);
        left -= (long)got;
    }
    fclose(in);
    fclose(out);
}

static long file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    return size;
}

struct inspect_args {
    int argc;
    char *argv[4];
};

static void call_inspect(void *arg)
{
    struct inspect_args *a = arg;
    exit(cmd_inspect(a->argc, a->argv));
}

static int inspect(const char *out, const char *errf, const char *file, int json)
{
    struct inspect_args a = {json ? 3 : 2, {"inspect", (char *)file, "--json", NULL}};
    return run_in_child(call_inspect, &a, out, errf);
}

static void test_damaged_and_foreign_files(void)
{
    char good[512], cut[512], text[512], plain[512], missing[512], out[512], errf[512];
    char err[1024];
    path_in_dir(good, sizeof good, "exact.h5");
    path_in_dir(cut, sizeof cut, "truncated.h5");
    path_in_dir(text, sizeof text, "text.h5");
    path_in_dir(plain, sizeof plain, "plain.h5");
    path_in_dir(missing, sizeof missing, "missing.h5");
    path_in_dir(out, sizeof out, "inspect.out");
    path_in_dir(errf, sizeof errf, "inspect.err");

    long size = file_size(good);
    CHECK(size > 4096);
    copy_prefix(good, cut, size / 2);
    float *values = NULL;
    CHECK(runlog_read_series(cut, "/steps/loss", &values, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, cut) && strstr(err, "truncated: the file has"), "err: %s", err);
    printf("truncated file: %s\n", err);
    char kind[32];
    CHECK(dm_file_kind(cut, kind, sizeof kind, err, sizeof err) == -1);

    FILE *f = fopen(text, "w");
    fputs("step,loss\n1,5.5\n", f);
    fclose(f);
    CHECK(runlog_read_series(text, "/steps/loss", &values, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "not an HDF5 file") != NULL, "err: %s", err);
    CHECK(runlog_read_series(missing, "/steps/loss", &values, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "No such file") != NULL, "err: %s", err);

    /* An HDF5 file that is not ours: an empty file with no kind attribute. */
    hid_t h5 = H5Fcreate(plain, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(h5 >= 0);
    H5Fclose(h5);
    CHECK(dm_file_kind(plain, kind, sizeof kind, err, sizeof err) == 0 && kind[0] == 0);

    int status = inspect(out, errf, good, 0);
    CHECK_MSG(status == 0, "inspect of a good run log: status %d", status);
    CHECK(file_contains(out, "steps: 300"));
    CHECK(file_contains(out, "/layers/fwd_ms"));
    CHECK(file_contains(out, "[300, 13]"));
    CHECK(file_contains(out, "model.")); /* the config text */
    status = inspect(out, errf, good, 1);
    CHECK_MSG(status == 0, "inspect --json: status %d", status);
    CHECK(file_contains(out, "\"steps\": 300"));
    char command[1200];
    snprintf(command, sizeof command,
             "/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
             "assert d[\"steps\"]==300 and d[\"datasets\"][1][\"shape\"]==[300,13]' %s", out);
    if (access("/usr/bin/python3", X_OK) == 0)
        CHECK_MSG(system(command) == 0, "inspect --json is not the expected JSON");

    const char *bad_files[4] = {cut, text, plain, missing};
    const char *expect[4] = {"truncated", "not an HDF5 file", "not a dynmo run log",
                             "No such file"};
    for (int i = 0; i < 4; i++) {
        status = inspect(out, errf, bad_files[i], i % 2);
        CHECK_MSG(status == 2, "inspect %s: status %d", bad_files[i], status);
        CHECK_MSG(file_contains(errf, bad_files[i]) && file_contains(errf, expect[i]),
                  "inspect %s: stderr lacks the file name or \"%s\"", bad_files[i],
                  expect[i]);
    }
}

static void append_float_to_int(void *arg)
{
    struct runlog *log = runlog_create((const char *)arg, &(struct dm_config){0});
    runlog_append_int_scalar(log, "/steps/ranks", 4);
    runlog_append_scalar(log, "/steps/ranks", 4.0f);
}

static void dataset_over_group(void *arg)
{
    struct runlog *log = runlog_create((const char *)arg, &(struct dm_config){0});
    runlog_append_scalar(log, "/steps/loss", 1.0f);
    runlog_close(log);
    log = runlog_open_append((const char *)arg);
    runlog_append_scalar(log, "/steps", 1.0f);  /* /steps is a group */
}

static void create_in_missing_dir(void *arg)
{
    (void)arg;
    runlog_create("/nonexistent-dir/runlog.h5", &(struct dm_config){0});
}

static void test_misuse_is_reported(void)
{
    char path[512], out[512], errf[512];
    path_in_dir(path, sizeof path, "misuse.h5");
    path_in_dir(out, sizeof out, "misuse.out");
    path_in_dir(errf, sizeof errf, "misuse.err");
    int status = run_in_child(append_float_to_int, path, out, errf);
    CHECK_MSG(status == 1, "float into an int dataset: status %d", status);
    CHECK(file_contains(errf, "runlog.c:") && file_contains(errf, "/steps/ranks"));

    /* A failing HDF5 call names itself and carries HDF5's own text. */
    status = run_in_child(dataset_over_group, path, out, errf);
    CHECK_MSG(status == 1, "dataset over a group: status %d", status);
    CHECK(file_contains(errf, "H5Dopen2") && file_contains(errf, "internal error"));
    CHECK(file_contains(errf, "[rank 0]"));
    CHECK(!file_contains(errf, "HDF5-DIAG")); /* HDF5's own printing is off */

    status = run_in_child(create_in_missing_dir, NULL, out, errf);
    CHECK_MSG(status == 2, "unwritable path: status %d", status);
    CHECK(file_contains(errf, "/nonexistent-dir/runlog.h5"));
    CHECK(!file_contains(errf, "HDF5-DIAG"));
}

/* A log of `rows` layout rows of width 2 (model.layers = 6 from cfg). */
static void write_layouts(const char *path, const struct dm_config *cfg, const int *rows,
                          int count)
{
    struct runlog *log = runlog_create(path, cfg);
    for (int r = 0; r < count; r++) runlog_append_int_row(log, "/layout/history", rows + 2 * r, 2);
    runlog_close(log);
}

/* runlog_file_layouts: each row a layout of model.layers blocks or filler;
 * a lie is -1 naming the row, its step, the stage and the count. */
static void test_layouts_are_checked(void)
{
    char path[512], err[1024];
    path_in_dir(path, sizeof path, "layouts.h5");
    struct dm_config cfg;
    config_defaults(&cfg);
    cfg.layers = 6;
    static const struct { int rows[6]; const char *want; } cases[] = {
        {{3, 3, 0, 0, 2, 4}, NULL},   /* a filler row between two layouts */
        {{3, 3, 1000000, 0, 3, 3}, "row 1 (step 2) places 1000000 blocks on stage 0"},
        {{3, 3, 7, -1, 3, 3}, "row 1 (step 2) places 7 blocks on stage 0"},
        {{3, 3, 8, -2, 3, 3}, "row 1 (step 2) places 8 blocks on stage 0"},
        {{3, 3, 3, 3, 3, -1}, "row 2 (step 3) places -1 blocks on stage 1"},
        {{3, 3, 3, 2, 3, 3}, "row 1 (step 2) places 5 blocks in all, but the model has 6"},
        {{0, 6, 3, 3, 3, 3}, "row 0 (step 1) places 6 blocks on stage 1 after an empty stage 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        write_layouts(path, &cfg, cases[k].rows, 3);
        struct runlog_file *f = runlog_open_read(path, err, sizeof err);
        CHECK_MSG(f != NULL, "%s", err);
        if (!f) continue;
        struct runlog_layouts l;
        int status = runlog_file_layouts(f, 6, &l, err, sizeof err);
        if (!cases[k].want) {
            CHECK_MSG(status == 0 && l.rows == 3 && l.width == 2 && l.stages[0] == 2 &&
                      l.stages[1] == 0 && l.stages[2] == 2, "case %zu: %s", k, err);
            runlog_layouts_free(&l);
        } else {
            CHECK_MSG(status == -1 && strstr(err, cases[k].want) && strstr(err, path),
                      "case %zu: status %d, message: %s", k, status, err);
        }
        runlog_close_read(f);
    }
}

/* runlog_file_config: each key through the config's own parser, then the
 * relation readers divide by. */
static void test_config_is_checked(void)
{
    char path[512], err[1024];
    path_in_dir(path, sizeof path, "config.h5");
    static const struct { const char *text; const char *want; } cases[] = {
        {"model.layers = 6\nparallel.pp = 2\n", NULL},
        {"model.layers = 99999\n", "model.layers = 99999 is out of range"},
        {"model.layers = 6\nmodel.moe_every = 2\nmodel.experts = 8\nparallel.ep = 9\n",
         "parallel.ep = 9 does not divide model.experts = 8"},
        {"model.layers = 6\ntrain.micro_batches = 0\n", "train.micro_batches = 0 is out of range"},
        {"model.layers 6\n", "line 1 of its configuration (root attribute config) is not"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        CHECK(file >= 0);
        hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
        H5Tset_size(type, H5T_VARIABLE);
        hid_t attr = H5Acreate2(file, "config", type, space, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(attr, type, &cases[k].text);
        H5Aclose(attr);
        H5Sclose(space);
        H5Tclose(type);
        H5Fclose(file);
        struct runlog_file *f = runlog_open_read(path, err, sizeof err);
        CHECK_MSG(f != NULL, "%s", err);
        if (!f) continue;
        struct dm_config cfg;
        int status = runlog_file_config(f, &cfg, err, sizeof err);
        if (!cases[k].want)
            CHECK_MSG(status == 0 && cfg.layers == 6 && cfg.pp == 2, "case %zu: %s", k, err);
        else
            CHECK_MSG(status == -1 && strstr(err, cases[k].want), "case %zu: %d, %s", k,
                      status, err);
        runlog_close_read(f);
    }
}

/* The listing: a dataset of the schema with another rank, or non-numbers,
 * or /trace/events of other than 8 columns, refuses the file; one outside
 * the schema is listed whatever it is. */
static void test_listing_is_checked(void)
{
    char path[512], err[1024];
    path_in_dir(path, sizeof path, "listing.h5");
    struct dm_config cfg;
    config_defaults(&cfg);
    float row[3] = {1, 2, 3};
    struct runlog *log = runlog_create(path, &cfg);
    runlog_append_row(log, "/steps/loss", row, 3);
    runlog_close(log);
    CHECK(runlog_open_read(path, err, sizeof err) == NULL &&
          strstr(err, "/steps/loss is numbers of rank 2; a run log's is numbers of rank 1"));
    log = runlog_create(path, &cfg);
    runlog_append_row(log, RUNLOG_TRACE_EVENTS, row, 3);
    runlog_close(log);
    CHECK(runlog_open_read(path, err, sizeof err) == NULL &&
          strstr(err, "/trace/events has 3 columns, a run log's has 8"));
    log = runlog_create(path, &cfg);
    runlog_append_row(log, "/mine/wide", row, 3);
    runlog_append_scalar(log, "/mine/series", 1.0f);
    runlog_close(log);
    struct runlog_file *f = runlog_open_read(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (f) {
        CHECK(runlog_file_dataset(f, "/mine/wide") && !runlog_file_dataset(f, "/mine/none"));
        float *values = NULL;
        CHECK(runlog_file_series(f, "/mine/wide", &values, err, sizeof err) == -1 &&
              strstr(err, "has rank 2, expected 1") && !values);
        runlog_close_read(f);
    }
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dynmo-test-runlog.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_write_read_exact();
    test_many_steps();
    test_reopen();
    test_rows_are_steps();
    test_killed_writer_keeps_flushed_steps();
    test_reading_a_live_log();
    test_damaged_and_foreign_files();
    test_misuse_is_reported();
    test_layouts_are_checked();
    test_config_is_checked();
    test_listing_is_checked();
    int failed = testing_failures;
    if (!failed) {
        char command[512];
        snprintf(command, sizeof command, "rm -rf '%s'", dir);
        if (system(command) != 0) fprintf(stderr, "could not remove %s\n", dir);
    } else {
        fprintf(stderr, "files kept in %s\n", dir);
    }
    return testing_report("test_runlog");
}
