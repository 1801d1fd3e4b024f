/* Core: the thread pool covers every index exactly once for any thread
 * count and grain; the counter-based RNG is a pure function with sane
 * moments; config overrides and defaults parse, and so does the INI file
 * syntax of docs/config.md; mkdir -p and the atomic small-file writer
 * succeed, replace, and fail with a message naming the path, leaving no
 * temporary behind; a carved family of arrays does not overlap. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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

/* ---- files ----------------------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int is_directory(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void test_make_dirs(const char *root)
{
    char path[600], err[1024], file[600];
    snprintf(path, sizeof path, "%s/a/b//c/", root);
    CHECK_MSG(dm_make_dirs(path, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/a/b/c", root);
    CHECK(is_directory(path));
    CHECK(dm_make_dirs(path, err, sizeof err) == 0);        /* exists already */
    CHECK(dm_make_dirs(path, NULL, 0) == 0);

    /* A regular file in the way: the failing prefix and the reason are named. */
    snprintf(file, sizeof file, "%s/plain", root);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/plain/sub/deeper", root);
    err[0] = '\0';
    errno = 0;
    CHECK(dm_make_dirs(path, err, sizeof err) == -1);
    CHECK(errno == ENOTDIR);
    char want[700];
    snprintf(want, sizeof want, "cannot create directory %s/plain/sub: %s", root,
             strerror(ENOTDIR));
    CHECK_MSG(!strcmp(err, want), "'%s', want '%s'", err, want);
    CHECK(dm_make_dirs(path, NULL, 0) == -1);              /* no message buffer */

    /* The path itself a regular file. */
    err[0] = '\0';
    CHECK(dm_make_dirs(file, err, sizeof err) == -1 && errno == ENOTDIR);
    CHECK_MSG(strstr(err, file) && strstr(err, "not a directory"), "'%s'", err);
    CHECK(dm_make_dirs("", err, sizeof err) == -1);
}

static void test_write_file_atomic(const char *root)
{
    char path[600], tmp[700], err[1024];
    snprintf(path, sizeof path, "%s/small", root);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK_MSG(dm_write_file_atomic(path, "first\n", 6, err, sizeof err) == 0, "%s", err);
    CHECK(testing_file_holds(path, "first\n") && !exists(tmp));
    /* A stale temporary (a writer killed earlier) is replaced, not appended to. */
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("stale stale stale stale", f);
        fclose(f);
    }
    CHECK(dm_write_file_atomic(path, "2\n", 2, err, sizeof err) == 0);
    CHECK(testing_file_holds(path, "2\n") && !exists(tmp));
    CHECK(dm_write_file_atomic(path, "", 0, err, sizeof err) == 0 && testing_file_holds(path, ""));

    /* Under a regular file: nothing can be created; the message names the file. */
    snprintf(path, sizeof path, "%s/plain/x", root);
    err[0] = '\0';
    CHECK(dm_write_file_atomic(path, "x", 1, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, path) && strstr(err, strerror(ENOTDIR)), "'%s'", err);

    /* Over a directory, a FIFO or a device: refused before anything is
     * written, and the thing stays (a rename would have replaced it). */
    snprintf(path, sizeof path, "%s/a", root);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    err[0] = '\0';
    CHECK(dm_write_file_atomic(path, "x", 1, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "not a regular file") && strstr(err, path), "'%s'", err);
    CHECK(!exists(tmp) && is_directory(path));
    snprintf(path, sizeof path, "%s/fifo", root);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(mkfifo(path, 0600) == 0);
    err[0] = '\0';
    CHECK(dm_write_file_atomic(path, "x", 1, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "not a regular file") && strstr(err, path), "'%s'", err);
    struct stat st;
    CHECK(!exists(tmp) && stat(path, &st) == 0 && S_ISFIFO(st.st_mode));
    unlink(path);

    /* A read-only directory stops everyone but root. */
    snprintf(path, sizeof path, "%s/readonly", root);
    CHECK(dm_make_dirs(path, NULL, 0) == 0);
    if (geteuid() == 0) {
        printf("files: running as root, which may write into a read-only directory: "
               "that failing case is not tested here\n");
    } else {
        chmod(path, 0555);
        snprintf(path, sizeof path, "%s/readonly/small", root);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        err[0] = '\0';
        CHECK(dm_write_file_atomic(path, "x", 1, err, sizeof err) == -1);
        CHECK_MSG(strstr(err, path) && strstr(err, strerror(EACCES)), "'%s'", err);
        CHECK(!exists(tmp) && !exists(path));
        snprintf(path, sizeof path, "%s/readonly", root);
        chmod(path, 0755);
    }

    snprintf(path, sizeof path, "%s/missing", root);
    err[0] = '\0';
    CHECK(dm_fsync_path(path, err, sizeof err) == -1 && strstr(err, path));
    CHECK(dm_fsync_path(root, err, sizeof err) == 0);
}

static void test_files(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char root[512];
    snprintf(root, sizeof root, "%s/dynmo-test-core.XXXXXX", base);
    if (!mkdtemp(root)) {
        CHECK_MSG(0, "mkdtemp %s: %s", root, strerror(errno));
        return;
    }
    test_make_dirs(root);
    test_write_file_atomic(root);
    nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* The file syntax of docs/config.md: long lines, comments, inline comments,
 * indentation, CRLF and a BOM, and overrides after the file. */
static void test_config_file(void)
{
    char dir[] = "/tmp/dynmo-test-core.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256], text[8192], long_path[1024];
    snprintf(path, sizeof path, "%s/c.ini", dir);

    /* A comment of 3000 characters and a path of 1023 (the longest a path
     * key holds): libinih's 200-character line limit took both for syntax
     * errors. */
    char comment[3001];
    memset(comment, 'x', sizeof comment - 1);
    comment[0] = ';';
    comment[sizeof comment - 1] = 0;
    memset(long_path, 'p', sizeof long_path - 1);
    long_path[0] = '/';
    long_path[sizeof long_path - 1] = 0;
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "%s\n[data]\n  %s\ntrain = %s\n", comment, comment, long_path);
    fclose(f);
    struct dm_config cfg;
    config_defaults(&cfg);
    config_load_file(&cfg, path);
    CHECK(strcmp(cfg.train_path, long_path) == 0);

    /* Inline comments after a blank; ';' or '#' inside a value stays. An
     * indented key is a key of its own, not a continuation of the line
     * above (libinih appended it to channels). */
    snprintf(text, sizeof text,
             "\xef\xbb\xbf; a BOM, then CRLF lines\r\n"
             "[model] ; the model\r\n"
             "layers = 3 ; three\r\n"
             "channels = 64\t# a tab before the comment\r\n"
             "    heads = 8\r\n"
             "\t# an indented comment\r\n"
             "[run]\r\n"
             "out_dir = runs/a#b;c\r\n"
             "[ckpt]\r\n"
             "dir =\r\n"
             "resume = none   ;\r\n");
    write_text(path, text);
    config_defaults(&cfg);
    snprintf(cfg.ckpt_dir, sizeof cfg.ckpt_dir, "somewhere");
    config_load_file(&cfg, path);
    CHECK(cfg.layers == 3);
    CHECK(cfg.channels == 64);
    CHECK(cfg.heads == 8);
    CHECK_MSG(strcmp(cfg.out_dir, "runs/a#b;c") == 0, "out_dir '%s'", cfg.out_dir);
    CHECK_MSG(cfg.ckpt_dir[0] == 0, "ckpt.dir '%s'", cfg.ckpt_dir);
    CHECK_MSG(strcmp(cfg.resume, "none") == 0, "ckpt.resume '%s'", cfg.resume);

    /* An override of a key the file sets is no duplicate: it wins, and
     * the later of two overrides wins. */
    config_apply_override(&cfg, "model.layers=5");
    config_apply_override(&cfg, "model.layers=6");
    CHECK(cfg.layers == 6);
    unlink(path);
    rmdir(dir);
}

/* The parser on text in memory (what the fuzzer calls): no NUL after the
 * text, a message instead of an exit, and the same message a file gets. */
static void test_config_text(void)
{
    struct dm_config cfg;
    config_defaults(&cfg);
    char err[4096] = "";
    /* "[model]\nlayers = 3" with no terminating NUL: the "9" after it is
     * not the parser's to read. */
    const char text[] = "[model]\nlayers = 39";
    CHECK(config_parse_text(&cfg, text, sizeof text - 2, "mem.ini", err, sizeof err) == 0);
    CHECK_MSG(cfg.layers == 3, "layers %d", cfg.layers);
    CHECK(config_parse_text(&cfg, "", 0, "mem.ini", err, sizeof err) == 0);

    config_defaults(&cfg);
    const char bad[] = "[model]\nlayers = 3\nlayers = 4\n";
    CHECK(config_parse_text(&cfg, bad, sizeof bad - 1, "mem.ini", err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "mem.ini:3: duplicate key model.layers: also set at mem.ini:2"),
              "'%s'", err);
    const char nul[] = "[model]\nlay\0ers = 3\n";
    CHECK(config_parse_text(&cfg, nul, sizeof nul - 1, "mem.ini", err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "mem.ini:2: a NUL byte in the line"), "'%s'", err);
    const char range[] = "[train]\nbatch = 0";
    CHECK(config_parse_text(&cfg, range, sizeof range - 1, "mem.ini", err, sizeof err) == -1);
    CHECK_MSG(!strcmp(err, "mem.ini:2: train.batch = 0 is out of range [1, 1048576] (sequences "
                      "per step)"), "'%s'", err);
    CHECK(config_set(&cfg, "train", "batch", "64", err, sizeof err) == 0 && cfg.batch == 64);
    CHECK(config_set(&cfg, "train", "batch", "6x", err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "train.batch = '6x' is not an integer"), "'%s'", err);
}

/* dm_median: odd and even counts, sorting in place, nothing for none. */
static void test_median(void)
{
    double odd[5] = {5, 1, 4, 2, 3}, even[4] = {10, -2, 7, 3}, one[1] = {9};
    CHECK(dm_median(odd, 5) == 3.0 && odd[0] == 1 && odd[4] == 5);
    CHECK(dm_median(even, 4) == 5.0 && even[0] == -2 && even[3] == 10);
    CHECK(dm_median(one, 1) == 9.0 && dm_median(one, 0) == 0.0);
}

/* dm_carve_doubles, dm_carve_floats: each array its own n zeroed values,
 * 64-byte aligned, none overlapping the next; the first is the start. */
static void test_carve(void)
{
    double *a = NULL, *b = NULL, *c = NULL;
    double **const doubles[] = {&a, &b, &c};
    dm_carve_doubles(doubles, 3, 5);
    CHECK(a && b > a && c > b && b - a >= 5 && c - b >= 5);
    CHECK(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 64 == 0);
    for (int i = 0; i < 5; i++) CHECK(a[i] == 0.0 && b[i] == 0.0 && c[i] == 0.0);
    for (int i = 0; i < 5; i++) a[i] = b[i] = c[i] = i + 1;
    CHECK(a[4] == 5.0 && b[0] == 1.0 && c[4] == 5.0);
    dm_free(a);
    float *x = NULL, *y = NULL;
    float **const floats[] = {&x, &y};
    dm_carve_floats(floats, 2, 17);
    CHECK(y - x >= 17 && ((uintptr_t)x | (uintptr_t)y) % 64 == 0 && y[16] == 0.0f);
    dm_free(x);
}

int main(void)
{
    test_parallel_for();
    test_random();
    test_config();
    test_files();
    test_config_file();
    test_config_text();
    test_median();
    test_carve();
    return testing_report("test_core");
}
