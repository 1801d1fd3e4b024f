/* The dynmo binary: dispatches a subcommand to its cmd_* function. */
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/core.h"
#include "dynmo/tools.h"

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct subcommand subcommands[] = {
    {"prepare", cmd_prepare, "turn text files into a token dataset"},
    {"train", cmd_train, "train a GPT (one rank, or a pipeline under mpiexec/srun)"},
    {"bench", cmd_bench, "time training steps of a config (ms/step, tok/s, GFLOP/s, RSS)"},
    {"plan", cmd_plan, "partition per-layer costs over pipeline stages"},
    {"inspect", cmd_inspect, "summarise a run log (or checkpoint)"},
    {"report", cmd_report, "draw run logs as one HTML page of figures and tables"},
    {"simulate", cmd_simulate, "simulate whole runs at any scale from a run's measured costs"},
    {"calibrate", cmd_calibrate, "measure this machine's ops and links into a hardware file"},
    {"trace", cmd_trace, "export traced steps as Chrome trace events (Perfetto)"},
    {"check-ckpt", cmd_check_ckpt, "validate checkpoint files against the schema"},
    {"import-hf", cmd_import_hf, "a Hugging Face GPT-2 directory as a dynmo checkpoint"},
    {"export-hf", cmd_export_hf, "a dense checkpoint as a Hugging Face GPT-2 directory"},
    {"eval", cmd_eval, "a checkpoint's mean next-token loss over a token stream"},
};
#define NSUB (sizeof subcommands / sizeof subcommands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: dynmo <command> [arguments]   (dynmo %s)\n\ncommands:\n", DYNMO_VERSION);
    for (size_t i = 0; i < NSUB; i++)
        fprintf(out, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(out, "\n`dynmo <command> --help` describes a command.\n");
}

int main(int argc, char **argv)
{
    /* Keep freed memory in the heap instead of returning it to the kernel:
     * a migration frees and allocates block slabs and activation buffers of
     * the same sizes, and fresh pages would cost a page fault each. */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    if (argc < 2) {
        usage(stderr);
        return DM_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return DM_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dynmo %s\n", DYNMO_VERSION);
        return DM_EXIT_OK;
    }
    for (size_t i = 0; i < NSUB; i++)
        if (!strcmp(argv[1], subcommands[i].name)) return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "dynmo: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return DM_EXIT_USAGE;
}
