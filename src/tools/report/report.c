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
#include "tools/args.h"
#include "tools/out_dir.h"
#include "tools/report/report.h"

#define PATH_BYTES 4096

struct report_args {
    const char **runlogs;
    int run_count;
    const char *out;
    long from_step;
    int timeline[2];
    int timeline_count;
};

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
        tool_help(arg, usage);
        if (!strcmp(arg, "--out") || !strcmp(arg, "--from") ||
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

#define REPORT_OUT_DIR(args) {.tool = "report", .what = "the report", .writer = "dynmo report", \
                              .inputs = (const char *const *)(args).runlogs, \
                              .input_count = (args).run_count}

static void write_file(const char *dir, const char *name, const void *data, size_t size,
                       const char *out)
{
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
    int ok = fd >= 0 && dm_write_all(fd, data, size) == 0 && fsync(fd) == 0;
    int saved = ok ? 0 : errno;
    if (fd >= 0 && close(fd) != 0 && ok) ok = 0, saved = errno;
    if (!ok)
        dm_user_error("report: cannot write the report to %s: writing %s: %s", out, name,
                      strerror(saved ? saved : EIO));
}

/* Writes every file into a new directory beside DIR and renames it to DIR
 * (the previous report, if any, is renamed away first and removed after). */
static void write_report(const struct report *rep, const struct bytes *html,
                         const struct report_args *args)
{
    const char *out = args->out;
    struct out_dir o = REPORT_OUT_DIR(*args);
    out_dir_begin(&o, out);
    for (int i = 0; i < rep->figure_count; i++) {
        const struct figure *f = &rep->figures[i];
        char name[96];
        snprintf(name, sizeof name, "%s.svg", f->name);
        write_file(o.tmp, name, f->svg.data, f->svg.size, out);
        snprintf(name, sizeof name, "%s.png", f->name);
        write_file(o.tmp, name, f->png.data, f->png.size, out);
    }
    write_file(o.tmp, "index.html", html->data, html->size, out);   /* last: the page */
    out_dir_commit(&o);
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
    struct out_dir early = REPORT_OUT_DIR(args);
    out_dir_check(&early, args.out);   /* before the work: a bad --out fails at once */

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
    write_report(&rep, &html, &args);
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
