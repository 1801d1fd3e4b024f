/* A dynamic scheme written as a test: "noop" changes nothing in the model
 * and declares one per-layer signal, /noop/mark (block l's value is
 * (l + 1) / 8 at every step), with a generic summary for inspect, a
 * figure for report and a state of simulate's cost model (a token share,
 * noop_share). It is registered from here (dyn_register_scheme), and
 * nothing else in dynmo knows it: the run log, `dynmo inspect`, `dynmo
 * report` and `dynmo simulate` must show it only because the descriptor
 * declares it (docs/architecture.md, "Adding a dynamic scheme").
 *
 * With arguments, this binary is dynmo with the scheme added (prepare,
 * train, inspect, report, simulate); without, it is the test: it runs
 * itself as those commands on a tiny model and checks the dataset's
 * values, the inspect line (text and JSON), the report page's caption,
 * simulate's scenario columns, its fit's states and the state a
 * simulation writes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include "dynmo/ckpt.h"
#include "dynmo/tools.h"
#include "dyn/scheme.h"
#include "testing.h"

/* ---- the scheme ------------------------------------------------------------ */

static int noop_active(const struct dm_config *cfg)
{
    (void)cfg;
    return 1;
}

/* A value the test can predict: (layer + 1) / 8. */
static void read_mark(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    value[0] = 0.125 * (model->blocks[i].index + 1);
}

static const struct dyn_signal noop_signals[] = {
    {.dataset = "/noop/mark",
     .label = "no-op mark",
     .unit = "share",
     .meaning = "a fixed value per block, (layer + 1) / 8: the test's signal",
     .columns = DYN_SIGNAL_LAYERS,
     .combine = DYN_COMBINE_REPLICA0,
     .read = read_mark,
     .summary = DYN_SUMMARY_MEAN,
     .figure_label = "no-op mark",
     .figure_unit = "share",
     .cost = DYN_COST_TOKEN_SHARE,
     .cost_name = "noop_share",
     .cost_dataset = "/noop/share_state",
     .neutral = 1.0f},
};

static const struct dyn_scheme noop_scheme = {
    .name = "noop",
    .active = noop_active,
    DYN_SIGNALS(noop_signals),
};

__attribute__((constructor)) static void register_noop(void)
{
    dyn_register_scheme(&noop_scheme);
}

/* ---- the test ----------------------------------------------------------------- */

enum { LAYERS = 6, STEPS = 4 };

/* Runs this binary with the arguments, its output into out (NULL: the
 * test's own output); returns its exit status. */
static int run_self(const char *args, const char *out)
{
    char command[4096];
    snprintf(command, sizeof command, "/proc/%d/exe %s > %s 2>&1", (int)getpid(), args,
             out ? out : "/dev/stderr");
    int status = system(command);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Whether the file holds text. */
static int file_has(const char *path, const char *text)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, text) != NULL;
}

static void write_config(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny.ini", dir);
    FILE *f = fopen(path, "w");
    if (!f) DM_FATAL("cannot write %s", path);
    fprintf(f, "[model]\nlayers = %d\nchannels = 32\nheads = 2\nmax_seq = 32\n"
            "[train]\nbatch = 8\nseq = 32\nmicro_batches = 4\nsteps = %d\nlr = 3e-3\n"
            "warmup = 1\n[data]\ntrain = %s/data/train.bin\nval = %s/data/val.bin\n"
            "[run]\nout_dir = %s/run\n", LAYERS, STEPS, dir, dir, dir);
    fclose(f);
}

/* The run log's /noop/mark: every step's row is (l + 1) / 8. */
static void check_dataset(const char *dir)
{
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/run/" RUNLOG_FILE_NAME, dir);
    struct runlog_file *f = runlog_open_read(path, err, sizeof err);
    CHECK_MSG(f != NULL, "%s", err);
    if (!f) return;
    float *values = NULL;
    int cols = 0;
    long rows = runlog_file_dataset(f, "/noop/mark")
                    ? runlog_file_matrix(f, "/noop/mark", &values, &cols, err, sizeof err) : -1;
    CHECK_MSG(rows == STEPS && cols == LAYERS, "/noop/mark is [%ld, %d], want [%d, %d]", rows,
              cols, STEPS, LAYERS);
    double worst = 0.0;
    for (long i = 0; rows == STEPS && cols == LAYERS && i < rows * cols; i++)
        worst = fmax(worst, fabs(values[i] - 0.125 * (i % cols + 1)));
    CHECK_MSG(rows == STEPS && worst == 0.0, "/noop/mark differs from (l + 1) / 8 by %g", worst);
    printf("/noop/mark: [%ld, %d], largest difference from (l + 1) / 8: %g\n", rows, cols, worst);
    dm_free(values);
    runlog_close_read(f);
}

static void check_tools(const char *dir)
{
    char args[2048], out[1024];
    snprintf(args, sizeof args, "inspect %s/run/" RUNLOG_FILE_NAME, dir);
    snprintf(out, sizeof out, "%s/inspect.out", dir);
    CHECK(run_self(args, out) == 0);
    const char *line = "noop: no-op mark (/noop/mark, share): mean 0.4375 over 4 steps and 6 "
                       "columns; block 5 the largest, 0.75";
    CHECK_MSG(file_has(out, line), "inspect's output (%s) lacks \"%s\"", out, line);
    CHECK_MSG(file_has(out, "/noop/mark                   float32  [4, 6]"),
              "inspect does not list /noop/mark");
    snprintf(args, sizeof args, "inspect %s/run/" RUNLOG_FILE_NAME " --json", dir);
    snprintf(out, sizeof out, "%s/inspect.json", dir);
    CHECK(run_self(args, out) == 0);
    const char *json = "\"noop\": { \"mark\": { \"mean\": 0.4375, \"largest\": 0.75, "
                       "\"largest_block\": 5, \"steps\": 4 } }";
    CHECK_MSG(file_has(out, json), "inspect --json (%s) lacks %s", out, json);
    snprintf(args, sizeof args, "report %s/run/" RUNLOG_FILE_NAME " --out %s/report", dir, dir);
    snprintf(out, sizeof out, "%s/report.out", dir);
    CHECK(run_self(args, out) == 0);
    snprintf(out, sizeof out, "%s/report/index.html", dir);
    CHECK_MSG(file_has(out, "beside it: no-op mark."), "the report's page (%s) does not name "
              "the signal's figure", out);
}

/* simulate: the state is a scenario column, the fit uses it (it varies
 * from block to block), and a simulation writes it where declared. */
static void check_simulate(const char *dir)
{
    char args[2048], out[1024], path[1024], err[1024];
    snprintf(out, sizeof out, "%s/simulate-help.out", dir);
    CHECK(run_self("simulate --help", out) == 0);
    CHECK_MSG(file_has(out, "noop_share"), "simulate --help (%s) does not offer the state "
              "noop_share as a scenario column", out);
    snprintf(args, sizeof args, "simulate --from-run %s/run --validate", dir);
    snprintf(out, sizeof out, "%s/simulate.out", dir);
    CHECK(run_self(args, out) == 0);
    CHECK_MSG(file_has(out, "states: noop_share"), "simulate's fit (%s) does not use noop_share",
              out);
    snprintf(path, sizeof path, "%s/scenario.csv", dir);
    FILE *f = fopen(path, "w");
    if (!f) DM_FATAL("cannot write %s", path);
    fprintf(f, "step,block,noop_share\n");
    for (int l = 0; l < LAYERS; l++) fprintf(f, "1,%d,%g\n", l, l == 0 ? 0.5 : 1.0);
    fclose(f);
    snprintf(args, sizeof args, "simulate --from-run %s/run --scenario %s --out %s/sim", dir, path,
             dir);
    snprintf(out, sizeof out, "%s/simulate-scenario.out", dir);
    CHECK(run_self(args, out) == 0);
    snprintf(path, sizeof path, "%s/sim/static-uniform.h5", dir);
    struct runlog_file *sim = runlog_open_read(path, err, sizeof err);
    CHECK_MSG(sim != NULL, "%s", err);
    if (!sim) return;
    float *values = NULL;
    int cols = 0;
    long rows = runlog_file_dataset(sim, "/noop/share_state")
                    ? runlog_file_matrix(sim, "/noop/share_state", &values, &cols, err, sizeof err)
                    : -1;
    CHECK_MSG(rows == 1 && cols == LAYERS && values[0] == 0.5f,
              "the simulation's /noop/share_state is [%ld, %d], block 0 %g; want [1, %d], 0.5",
              rows, cols, rows > 0 && cols > 0 ? (double)values[0] : NAN, LAYERS);
    printf("simulate: noop_share a scenario column, in the fit, written to /noop/share_state\n");
    dm_free(values);
    runlog_close_read(sim);
}

static int run_test(void)
{
    char dir[] = "/tmp/dynmo-noop-XXXXXX", args[2048], out[1024];
    if (!mkdtemp(dir)) DM_FATAL("mkdtemp failed");
    snprintf(args, sizeof args, "prepare --out %s/data /usr/share/common-licenses/GPL-3", dir);
    CHECK(run_self(args, "/dev/null") == 0);
    write_config(dir);
    snprintf(args, sizeof args, "train --config %s/tiny.ini", dir);
    snprintf(out, sizeof out, "%s/train.out", dir);
    int trained = run_self(args, out) == 0;
    CHECK_MSG(trained, "training with the no-op scheme failed (%s)", out);
    if (trained) {
        check_dataset(dir);
        check_tools(dir);
        check_simulate(dir);
    }
    if (testing_failures == 0) {
        snprintf(args, sizeof args, "rm -rf %s", dir);
        if (system(args) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    return testing_report("test_noop_scheme");
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = {{"prepare", cmd_prepare}, {"train", cmd_train}, {"inspect", cmd_inspect},
                    {"report", cmd_report}, {"simulate", cmd_simulate}};
    if (argc < 2) return run_test();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "test_noop_scheme: unknown command %s\n", argv[1]);
    return 2;
}
