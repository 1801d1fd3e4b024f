/* `dynmo report RUNLOG [RUNLOG...] --out DIR`: one self-contained page,
 * DIR/index.html, with the figures of the runs (as SVG and PNG beside it)
 * and the table of what they did (docs/report.md).
 *
 * This file is the command: its arguments, the order of the work (read
 * and check every input first, then draw, then write) and the output
 * directory, which is written under a temporary name beside DIR and
 * renamed into place, so that DIR is the whole new report, the previous
 * one, or absent, never half of one. A DIR that holds files a report does
 * not write is refused rather than replaced. It must not write anywhere
 * but beside DIR, and it reads run logs only through report_load.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "dynmo/tools.h"
#include "tools/report.h"

#define PATH_BYTES 4096
#define OUT_MAX_BYTES 3800   /* leaves room for the temporary names beside DIR */

struct report_args {
    const char **runlogs;
    int run_count;
    const char *out;
    long from_step;
    int timeline[2];
    int timeline_count;
};

/* The temporary directory being written, removed if the process exits
 * before it is renamed into place (a user error, an internal one). */
static char pending_dir[PATH_BYTES + 256];

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dynmo report RUNLOG [RUNLOG...] --out DIR [--from STEP]\n"
            "                    [--timeline STEP[,STEP]]\n"
            "Writes DIR/index.html, one page that opens from the file system, with the\n"
            "figures of the runs (loss; throughput and bubble; per run the layout over\n"
            "time, the per-block cost heat map and the pipeline timeline of traced\n"
            "steps), each also as DIR/NAME.svg and DIR/NAME.png, and a table of each run:\n"
            "throughput, bubble, imbalance, peak memory, layout changes, the balancer's\n"
            "decisions. With several runs the curves are overlaid and the first run's\n"
            "speedup over each other is stated. RUNLOG is RUN_DIR/runlog.h5 (or a file\n"
            "dynmo simulate writes). docs/report.md says how to read it.\n"
            "  --out DIR        the report's directory (replaced if it holds a report)\n"
            "  --from STEP      first step of the stated means (default 2: the first\n"
            "                   step is warm-up)\n"
            "  --timeline S[,S] the traced steps the timeline draws (default: the steps\n"
            "                   before and after a layout change, or the last traced)\n");
}

static long parse_step(const char *option, const char *text)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < 1 || v > 1000000000L)
        dm_user_error("report: %s '%s' is not a step number (1 or more)", option, text);
    return v;
}

static void parse_timeline(struct report_args *a, const char *text)
{
    char copy[128];
    if (strlen(text) >= sizeof copy)
        dm_user_error("report: --timeline '%s' is too long (at most two steps)", text);
    snprintf(copy, sizeof copy, "%s", text);
    char *save = NULL;
    for (char *part = strtok_r(copy, ",", &save); part; part = strtok_r(NULL, ",", &save)) {
        if (a->timeline_count == 2)
            dm_user_error("report: --timeline '%s' names more than two steps", text);
        a->timeline[a->timeline_count++] = (int)parse_step("--timeline", part);
    }
    if (a->timeline_count == 0) dm_user_error("report: --timeline needs a step");
}

static void parse_args(struct report_args *a, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    a->from_step = 2;
    a->runlogs = dm_alloc((size_t)argc * sizeof *a->runlogs);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            exit(DM_EXIT_OK);
        } else if (!strcmp(arg, "--out") || !strcmp(arg, "--from") ||
                   !strcmp(arg, "--timeline")) {
            if (!has_value) dm_user_error("report: %s needs a value", arg);
            const char *value = argv[++i];
            if (!strcmp(arg, "--out")) a->out = value;
            else if (!strcmp(arg, "--from")) a->from_step = parse_step("--from", value);
            else parse_timeline(a, value);
        } else if (arg[0] == '-' && arg[1]) {
            usage(stderr);
            dm_user_error("report: unknown option '%s'", arg);
        } else {
            a->runlogs[a->run_count++] = arg;
        }
    }
    if (a->run_count == 0) {
        usage(stderr);
        dm_user_error("report: no RUNLOG given (a run log is RUN_DIR/runlog.h5)");
    }
    if (!a->out || !a->out[0]) {
        usage(stderr);
        dm_user_error("report: --out DIR is required (the directory of the report)");
    }
}

/* ---- the output directory ---------------------------------------------------- */

/* Splits DIR (trailing slashes dropped) into its parent and last name. */
static void split_out(const char *out, char *parent, char *base)
{
    char path[PATH_BYTES];
    if (strlen(out) > OUT_MAX_BYTES) dm_user_error("report: --out '%s' is too long", out);
    snprintf(path, sizeof path, "%s", out);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
    char *slash = strrchr(path, '/');
    snprintf(base, PATH_BYTES, "%s", slash ? slash + 1 : path);
    if (!slash) snprintf(parent, PATH_BYTES, ".");
    else if (slash == path) snprintf(parent, PATH_BYTES, "/");
    else snprintf(parent, PATH_BYTES, "%.*s", (int)(slash - path), path);
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, ".."))
        dm_user_error("report: --out '%s' must name a directory to create or replace, "
                      "not . or .. or /", out);
}

static int is_report_file(const char *name)
{
    size_t n = strlen(name);
    return !strcmp(name, "index.html") || (n > 4 && (!strcmp(name + n - 4, ".svg") ||
                                                     !strcmp(name + n - 4, ".png")));
}

/* Whether DIR exists; a DIR that is not a directory, or holds anything a
 * report does not write, is a user error. */
static int check_existing_out(const char *out)
{
    struct stat st;
    if (stat(out, &st) != 0) {
        if (errno == ENOENT) return 0;
        dm_user_error("report: cannot write the report to %s: %s", out, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        dm_user_error("report: --out %s exists and is not a directory", out);
    DIR *dir = opendir(out);
    if (!dir) dm_user_error("report: cannot read the directory %s: %s", out, strerror(errno));
    for (struct dirent *e; (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[PATH_BYTES];
        snprintf(path, sizeof path, "%s/%s", out, e->d_name);
        if (!is_report_file(e->d_name) || lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            char name[256];
            snprintf(name, sizeof name, "%s", e->d_name);   /* closedir frees e */
            closedir(dir);
            dm_user_error("report: --out %s holds %s, which a report does not write: choose "
                          "another directory, or empty this one", out, name);
        }
    }
    closedir(dir);
    return 1;
}

/* Removes a directory of plain files (ours: a report, or one being written). */
static void remove_flat_dir(const char *path)
{
    DIR *dir = opendir(path);
    if (dir) {
        for (struct dirent *e; (e = readdir(dir));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char file[PATH_BYTES];
            snprintf(file, sizeof file, "%s/%s", path, e->d_name);
            unlink(file);
        }
        closedir(dir);
    }
    rmdir(path);
}

static void remove_pending(void)
{
    if (pending_dir[0]) remove_flat_dir(pending_dir);
    pending_dir[0] = '\0';
}

static void write_file(const char *dir, const char *name, const void *data, size_t size,
                       const char *out)
{
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
    const char *p = data;
    size_t left = size;
    while (fd >= 0 && left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        p += n;
        left -= (size_t)n;
    }
    int saved = errno;
    int ok = fd >= 0 && left == 0 && fsync(fd) == 0;
    if (!ok) saved = errno;
    if (fd >= 0 && close(fd) != 0 && ok) ok = 0, saved = errno;
    if (!ok)
        dm_user_error("report: cannot write the report to %s: writing %s: %s", out, name,
                      strerror(saved ? saved : EIO));
}

/* Writes every file into a new directory beside DIR and renames it to DIR
 * (the previous report, if any, is renamed away first and removed after). */
static void write_report(const struct report *rep, const struct bytes *html, const char *out)
{
    char parent[PATH_BYTES], base[PATH_BYTES], tmp[PATH_BYTES + 256], old[PATH_BYTES + 256];
    split_out(out, parent, base);
    int existed = check_existing_out(out);
    snprintf(tmp, sizeof tmp, "%.3800s/.%.200s.tmp-XXXXXX", parent, base);
    if (!mkdtemp(tmp))
        dm_user_error("report: cannot write the report to %s: cannot create a directory in "
                      "%s: %s", out, parent, strerror(errno));
    snprintf(pending_dir, sizeof pending_dir, "%s", tmp);
    atexit(remove_pending);
    mode_t mask = umask(0);   /* mkdtemp made it 0700; a report is as readable as a mkdir */
    umask(mask);
    if (chmod(tmp, 0777 & ~mask) != 0)
        dm_user_error("report: cannot write the report to %s: chmod %s: %s", out, tmp,
                      strerror(errno));
    for (int i = 0; i < rep->figure_count; i++) {
        const struct figure *f = &rep->figures[i];
        char name[96];
        snprintf(name, sizeof name, "%s.svg", f->name);
        write_file(tmp, name, f->svg.data, f->svg.size, out);
        snprintf(name, sizeof name, "%s.png", f->name);
        write_file(tmp, name, f->png.data, f->png.size, out);
    }
    write_file(tmp, "index.html", html->data, html->size, out);   /* last: the page */
    char err[1024];
    if (dm_fsync_path(tmp, err, sizeof err) != 0) dm_user_error("report: %s", err);
    old[0] = '\0';
    if (existed) {
        snprintf(old, sizeof old, "%.3800s/.%.200s.old-XXXXXX", parent, base);
        if (!mkdtemp(old) || rename(out, old) != 0)
            dm_user_error("report: cannot replace %s: %s", out, strerror(errno));
    }
    if (rename(tmp, out) != 0) {
        int saved = errno;
        if (existed) rename(old, out);
        dm_user_error("report: cannot rename %s to %s: %s", tmp, out, strerror(saved));
    }
    pending_dir[0] = '\0';
    if (existed) remove_flat_dir(old);
    dm_fsync_path(parent, NULL, 0);
}

/* Two runs of the same name (a/x/runlog.h5 and b/x/runlog.h5) become "x"
 * and "x (2)": the legend and the table must tell them apart. */
static void distinct_names(struct report *rep)
{
    for (int i = 1; i < rep->run_count; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(rep->runs[i].name, rep->runs[j].name)) {
                char name[sizeof rep->runs[i].name];
                snprintf(name, sizeof name, "%.100s (%d)", rep->runs[i].name, i + 1);
                memcpy(rep->runs[i].name, name, sizeof name);
                break;
            }
}

int cmd_report(int argc, char **argv)
{
    double start = dm_now();
    struct report_args args;
    parse_args(&args, argc, argv);
    char parent[PATH_BYTES], base[PATH_BYTES];
    split_out(args.out, parent, base);
    struct stat st;
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
        dm_user_error("report: cannot write the report to %s: %s is not a directory (create "
                      "it first)", args.out, parent);
    check_existing_out(args.out);

    struct report rep = {.run_count = args.run_count, .from_step = args.from_step};
    rep.runs = dm_alloc((size_t)args.run_count * sizeof *rep.runs);
    for (int i = 0; i < args.run_count; i++) {
        report_run_load(&rep.runs[i], args.runlogs[i], args.from_step);
        report_choose_timeline(&rep.runs[i], args.timeline, args.timeline_count);
    }
    distinct_names(&rep);
    report_make_figures(&rep);
    struct bytes html = {0};
    report_write_html(&rep, &html);
    write_report(&rep, &html, args.out);
    printf("report: %s/index.html (%d figures, each as SVG and PNG; %d run%s) in %.2f s\n",
           args.out, rep.figure_count, rep.run_count, rep.run_count == 1 ? "" : "s",
           dm_now() - start);
    bytes_free(&html);
    report_free_figures(&rep);
    for (int i = 0; i < rep.run_count; i++) report_run_free(&rep.runs[i]);
    dm_free(rep.runs);
    dm_free(args.runlogs);
    return DM_EXIT_OK;
}
