/* `dynmo check-ckpt FILE... [--quick]`: the offline checker of our own
 * checkpoint files (Redis's redis-check-rdb). It validates each file against
 * the compiled-in schema of its version (checkpoint_schema/v1.def, or a
 * scheme's own version, with the schemes' fragments): groups, attributes and
 * their values, datasets with type, shape, chunking and checksum filter,
 * the completion attribute, the consistency of layout, history, cursors
 * and per-block state, and, unless --quick, every chunk's Fletcher32
 * checksum by reading the whole file. It prints every problem it finds and
 * never writes; it needs no MPI. Exit 0: every file is a valid checkpoint;
 * 2: a problem (the last line names the file and the first problem). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "dynmo/tools.h"
#include "tools/args.h"

static void usage(FILE *out)
{
    char versions[256];   /* the schemes' own */
    dyn_ckpt_versions_text(versions, sizeof versions);
    fprintf(out,
            "usage: dynmo check-ckpt FILE... [--quick]\n"
            "Validates dynmo checkpoints (ckpt-<step>.h5) against checkpoint schema version "
            "%d\n(a dense model)%s: groups,\nattributes, datasets (type, shape, chunking, "
            "Fletcher32 filter), the completion\nattribute, layout, history, cursors and "
            "per-block state, and every chunk's\nchecksum (by reading the whole file).\n"
            "  --quick   skip reading the data (structure and metadata only)\n"
            "Prints each problem; exit status 0 when every file is valid, 2 otherwise.\n",
            CHECKPOINT_SCHEMA_VERSION, versions);
}

/* Prints each problem and keeps the first one of the run for the summary. */
struct report {
    char *first;
    size_t first_size;
};

static void print_problem(void *ctx, const char *problem)
{
    struct report *report = ctx;
    printf("  problem: %s\n", problem);
    if (report->first[0] == '\0') snprintf(report->first, report->first_size, "%s", problem);
}

/* Returns the number of problems in one file and prints its verdict. */
static int check_one(const char *path, int read_data, struct report *report)
{
    printf("%s:\n", path);
    fflush(stdout);
    int problems = ckpt_check_file(path, read_data, print_problem, report);
    if (problems == 0) {
        struct ckpt_meta meta;
        char err[1024];
        if (ckpt_read_info(path, &meta, err, sizeof err) == 0) {
            struct stat st;
            double bytes = stat(path, &st) == 0 ? (double)st.st_size : 0;
            int small = bytes < 1e6;
            printf("  ok: schema version %d, step %ld, %d layers of %d channels, written by "
                   "a %d x %d world, %.1f %s%s\n", meta.schema_version, meta.step,
                   meta.shape.layers, meta.shape.channels, meta.pp, meta.dp,
                   small ? bytes / 1e3 : bytes / 1e6, small ? "kB" : "MB",
                   read_data ? ", every checksum verified" : " (--quick: data not read)");
            ckpt_meta_free(&meta);
        }
    }
    fflush(stdout);
    return problems;
}

int cmd_check_ckpt(int argc, char **argv)
{
    int read_data = 1, files = 0;
    for (int i = 1; i < argc; i++) {
        tool_help(argv[i], usage);
        if (!strcmp(argv[i], "--quick")) {
            read_data = 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            usage(stderr);
            dm_user_error("check-ckpt: unknown option '%s'", argv[i]);
        } else {
            files++;
        }
    }
    if (!files) {
        usage(stderr);
        dm_user_error("check-ckpt: missing FILE (a checkpoint such as CKPT_DIR/ckpt-100.h5)");
    }
    int bad_files = 0, total = 0;
    char first[1024] = "";
    struct report report = {first, sizeof first};
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1]) continue;
        int problems = check_one(argv[i], read_data, &report);
        total += problems;
        bad_files += problems > 0;
    }
    if (bad_files)
        dm_user_error("check-ckpt: %d problem%s in %d of %d file%s; the first: %s", total,
                      total == 1 ? "" : "s", bad_files, files, files == 1 ? "" : "s", first);
    return DM_EXIT_OK;
}
