/* `dynmo plan`: reads per-block costs from a CSV and prints, for each
 * balancing method, the layout it chooses on S stages, its bottleneck, its
 * predicted step time and bubble ratio (docs/balance.md). `--bench` times
 * the balancers instead (plan_bench.c). Stages may share processors
 * (--cores, --stage-groups with --group-cores, or what the run log of
 * --from-run recorded); the predictions and partition-time then account for
 * it. A thin shell over src/balance: the algorithms live there; this file
 * only parses, checks and prints. Bad arguments and bad CSV end with exit
 * status 2 and a message naming the argument, or the file and line. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/model.h"
#include "dynmo/tools.h"
#include "tools/plan_bench.h"

static void usage(FILE *out)
{
    fprintf(out,
        "usage: dynmo plan --costs FILE.csv --stages S [options]\n"
        "       dynmo plan --bench [--repeats R]\n"
        "Lays out per-block costs on S pipeline stages with each balancing\n"
        "method and prints its layout, bottleneck, predicted step time and\n"
        "bubble ratio (docs/balance.md).\n"
        "  --costs FILE.csv      header layer,fwd_ms,bwd_ms,params,mem_bytes; one row\n"
        "                        per block, optional first row 'embed', last row 'head'\n"
        "  --stages S            pipeline stages (at most the number of blocks)\n"
        "  --method M[,M...]     static-uniform, static-params, partition-params,\n"
        "                        partition-time, diffusion-params, diffusion-time,\n"
        "                        repack, repack-first-fit, or all (default)\n"
        "  --mem-cap BYTES       memory per stage (suffix KiB, MiB, GiB allowed;\n"
        "                        0 = no cap, the default)\n"
        "  --micro-batches m     micro-batches per step (default 4 x stages)\n"
        "  --schedule 1f1b|gpipe schedule the predictor simulates (default 1f1b)\n"
        "  --current n1,...,nS   the layout now (default static-uniform): the\n"
        "                        start of diffusion and repack, the reference for\n"
        "                        bytes_moved\n"
        "  --gamma G             diffusion stops when max - min stage cost < G\n"
        "  --epsilon E           repack may slow the step by a factor 1 + E (0.05)\n"
        "  --target-stages K     repack-first-fit stops merging at K stages (1)\n"
        "  --cores N             all stages share N processors (a number > 0);\n"
        "                        predictions and partition-time account for it\n"
        "                        (default: one processor per stage)\n"
        "  --stage-groups G0,...,G(S-1) --group-cores C0,C1,...\n"
        "                        stage s runs in group Gs, and the stages of\n"
        "                        group g share Cg processors (one core count per\n"
        "                        group, numbered from 0)\n"
        "  --sharing fluid|turns how a group's stages share its processors: fluid\n"
        "                        (evenly, as time slicing; the default) or turns\n"
        "                        (one instruction per core at a time, first come\n"
        "                        first served, as dynmo train's ranks with\n"
        "                        parallel.turns = 1; whole core counts)\n"
        "  --bench               time the balancers on random inputs (docs/PERFORMANCE.md)\n"
        "  --from-run DIR --step N   costs from DIR/runlog.h5 at step N (1-based):\n"
        "                        per-block fwd/bwd ms, parameters (nonzero after\n"
        "                        pruning), embed/head from the end stages' extra\n"
        "                        compute; the run's stages, layout and\n"
        "                        micro-batches are the defaults, and so is the\n"
        "                        processor sharing it recorded (root attributes\n"
        "                        stage_groups, group_cores and group_turns) at its\n"
        "                        stage count\n");
}

/* ---- argument parsing ---------------------------------------------------- */

static long parse_long(const char *arg, const char *text, long min, long max)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < min || v > max)
        dm_user_error("%s: '%s' is not a whole number in [%ld, %ld]", arg, text,
                      min, max);
    return v;
}

static double parse_double(const char *arg, const char *text, double min)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || v < min)
        dm_user_error("%s: '%s' is not a number >= %g", arg, text, min);
    return v;
}

static int64_t parse_bytes(const char *arg, const char *text)
{
    static const struct { const char *suffix; int64_t scale; } units[] = {
        {"", 1}, {"KiB", 1ll << 10}, {"MiB", 1ll << 20}, {"GiB", 1ll << 30},
        {"TiB", 1ll << 40}};
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end != text && !errno && v >= 0)
        for (size_t u = 0; u < sizeof units / sizeof units[0]; u++)
            if (!strcmp(end, units[u].suffix) && v <= INT64_MAX / 4 / units[u].scale)
                return v * units[u].scale;
    dm_user_error("%s: '%s' is not a byte count (a whole number >= 0, "
                  "optionally with KiB, MiB, GiB or TiB)", arg, text);
}

/* One entry of a comma-separated list: parses the number at text into
 * *entry, sets *end after it; 0 when it is not a valid entry. */
typedef int (*list_entry_parser)(const char *text, char **end, void *entry);

static int block_count_entry(const char *text, char **end, void *entry)
{
    errno = 0;
    long v = strtol(text, end, 10);
    if (*end == text || errno || v < 1 || v > 1000000000) return 0;
    *(int *)entry = (int)v;
    return 1;
}

static int group_entry(const char *text, char **end, void *entry)
{
    errno = 0;
    long v = strtol(text, end, 10);
    if (*end == text || errno || v < 0 || v > 1 << 20) return 0;
    *(int *)entry = (int)v;
    return 1;
}

static int cores_entry(const char *text, char **end, void *entry)
{
    errno = 0;
    double v = strtod(text, end);
    if (*end == text || errno || !isfinite(v) || !(v > 0)) return 0;
    *(double *)entry = v;
    return 1;
}

/* "3,3,2" into a dm_alloc'd array of entries of `size` bytes; returns how
 * many. Anything else is a user error naming arg and `what` the list holds. */
static int parse_list(const char *arg, const char *text, const char *what,
                      size_t size, list_entry_parser parse_entry, void **values)
{
    int capacity = 1;
    for (const char *c = text; *c; c++) capacity += *c == ',';
    char *entries = dm_alloc((size_t)capacity * size);
    int count = 0;
    const char *p = text;
    for (;;) {
        char *end;
        if (!parse_entry(p, &end, entries + (size_t)count * size) ||
            (*end && *end != ','))
            dm_user_error("%s: '%s' is not a list of %s separated by commas",
                          arg, text, what);
        count++;
        if (!*end) break;
        p = end + 1;
    }
    *values = entries;
    return count;
}

static int parse_layout(const char *arg, const char *text, int **counts)
{
    return parse_list(arg, text, "block counts >= 1", sizeof(int),
                      block_count_entry, (void **)counts);
}

/* ---- the costs CSV --------------------------------------------------------- */

struct plan_input {
    int blocks;
    double *fwd_ms, *bwd_ms, *params; /* (blocks) */
    double *update_ms;                /* (blocks) or NULL */
    int64_t *mem_bytes;               /* (blocks) */
    int has_embed, has_head;
    struct balance_profile profile;
};

/* update_ms (once a step, balance.h) may be left out; the others may not. */
enum { COL_LAYER, COL_FWD, COL_BWD, COL_PARAMS, COL_MEM, COL_REQUIRED,
       COL_UPDATE = COL_REQUIRED, COL_COUNT };
static const char *const column_names[COL_COUNT] = {
    "layer", "fwd_ms", "bwd_ms", "params", "mem_bytes", "update_ms"};

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1])) s[--len] = 0;
    return s;
}

/* Splits line at commas in place; returns the field count (up to max). */
static int split_fields(char *line, char **fields, int max)
{
    int count = 0;
    for (char *p = line;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (count < max) fields[count] = trim(p);
        count++;
        if (!comma) break;
        p = comma + 1;
    }
    return count;
}

static double csv_number(const char *path, int line, int column, const char *text)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno == ERANGE)
        dm_user_error("%s:%d: column %s: '%s' is not a number", path, line,
                      column_names[column], text);
    if (!isfinite(v))
        dm_user_error("%s:%d: column %s: '%s' is not a finite number", path, line,
                      column_names[column], text);
    if (v < 0)
        dm_user_error("%s:%d: column %s: %s is negative", path, line,
                      column_names[column], text);
    return v;
}

static int64_t csv_bytes(const char *path, int line, const char *text)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno)
        dm_user_error("%s:%d: column mem_bytes: '%s' is not a whole number of "
                      "bytes", path, line, text);
    if (v < 0)
        dm_user_error("%s:%d: column mem_bytes: %s is negative", path, line, text);
    return v;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) dm_user_error("--costs: cannot open '%s': %s", path, dm_errno_text());
    size_t size = 0, capacity = 1 << 16;
    char *text = malloc(capacity);
    if (!text) DM_FATAL("out of memory reading %s", path);
    for (;;) {
        if (size + 1 >= capacity) {
            capacity *= 2;
            text = realloc(text, capacity);
            if (!text) DM_FATAL("out of memory reading %s", path);
        }
        size_t got = fread(text + size, 1, capacity - size - 1, f);
        size += got;
        if (got == 0) break;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) dm_user_error("--costs: cannot read '%s'", path);
    text[size] = 0;
    if (strlen(text) != size)
        dm_user_error("%s: contains a NUL byte; not a CSV file", path);
    return text;
}

static void read_costs(struct plan_input *in, const char *path)
{
    char *text = read_file(path);
    memset(in, 0, sizeof *in);
    int capacity = 0, header_found = 0, header_fields = 0, head_line = 0;
    int column_of[COL_COUNT];
    char *fields[64];
    char *line = text;
    for (int line_no = 1; line; line_no++) {
        char *newline = strchr(line, '\n');
        if (newline) *newline = 0;
        char *next = newline ? newline + 1 : NULL;
        char *content = trim(line);
        line = next;
        if (!*content || *content == '#') continue;
        int count = split_fields(content, fields, 64);
        if (!header_found) {
            header_found = 1;
            header_fields = count;
            if (count > 64)
                dm_user_error("%s:%d: more than 64 columns", path, line_no);
            for (int c = 0; c < COL_COUNT; c++) {
                column_of[c] = -1;
                for (int f = 0; f < count; f++) {
                    if (strcmp(fields[f], column_names[c])) continue;
                    if (column_of[c] >= 0)
                        dm_user_error("%s:%d: column '%s' appears twice", path,
                                      line_no, column_names[c]);
                    column_of[c] = f;
                }
                if (column_of[c] < 0 && c < COL_REQUIRED)
                    dm_user_error("%s:%d: missing column '%s' (the header needs "
                                  "layer,fwd_ms,bwd_ms,params,mem_bytes)", path,
                                  line_no, column_names[c]);
            }
            continue;
        }
        if (count != header_fields)
            dm_user_error("%s:%d: %d fields, but the header has %d", path, line_no,
                          count, header_fields);
        if (head_line)
            dm_user_error("%s:%d: a row after 'head' (line %d); the head must be "
                          "the last row", path, line_no, head_line);
        const char *name = fields[column_of[COL_LAYER]];
        double fwd = csv_number(path, line_no, COL_FWD, fields[column_of[COL_FWD]]);
        double bwd = csv_number(path, line_no, COL_BWD, fields[column_of[COL_BWD]]);
        double params = csv_number(path, line_no, COL_PARAMS, fields[column_of[COL_PARAMS]]);
        int64_t mem = csv_bytes(path, line_no, fields[column_of[COL_MEM]]);
        double update = column_of[COL_UPDATE] < 0 ? 0.0
            : csv_number(path, line_no, COL_UPDATE, fields[column_of[COL_UPDATE]]);
        struct balance_extra extra = {fwd, bwd, params, mem, update};
        if (!strcmp(name, "embed")) {
            if (in->blocks > 0 || in->has_embed)
                dm_user_error("%s:%d: 'embed' must be the first row", path, line_no);
            in->has_embed = 1;
            in->profile.embed = extra;
            continue;
        }
        if (!strcmp(name, "head")) {
            head_line = line_no;
            in->has_head = 1;
            in->profile.head = extra;
            continue;
        }
        if (in->blocks == capacity) {
            capacity = capacity ? 2 * capacity : 64;
            if (capacity > 10000000)
                dm_user_error("%s:%d: more than 10,000,000 blocks", path, line_no);
            in->fwd_ms = realloc(in->fwd_ms, (size_t)capacity * sizeof(double));
            in->bwd_ms = realloc(in->bwd_ms, (size_t)capacity * sizeof(double));
            in->params = realloc(in->params, (size_t)capacity * sizeof(double));
            in->mem_bytes = realloc(in->mem_bytes, (size_t)capacity * sizeof(int64_t));
            in->update_ms = realloc(in->update_ms, (size_t)capacity * sizeof(double));
            if (!in->fwd_ms || !in->bwd_ms || !in->params || !in->mem_bytes ||
                !in->update_ms)
                DM_FATAL("out of memory reading %s", path);
        }
        in->update_ms[in->blocks] = update;
        in->fwd_ms[in->blocks] = fwd;
        in->bwd_ms[in->blocks] = bwd;
        in->params[in->blocks] = params;
        in->mem_bytes[in->blocks] = mem;
        in->blocks++;
    }
    free(text);
    if (!header_found) dm_user_error("%s: empty; expected a CSV header", path);
    if (in->blocks == 0) dm_user_error("%s: no block rows", path);
    in->profile.blocks = in->blocks;
    in->profile.fwd_ms = in->fwd_ms;
    in->profile.bwd_ms = in->bwd_ms;
    in->profile.params = in->params;
    in->profile.mem_bytes = in->mem_bytes;
    if (column_of[COL_UPDATE] >= 0) in->profile.update_ms = in->update_ms;
}

/* ---- costs from a run log ---------------------------------------------------
 * One step's profile: /layers/fwd_ms and /layers/bwd_ms (per micro-batch),
 * parameters per block from model.channels (nonzero ones when the log has
 * /layers/sparsity), slab bytes of a dense block, and the embedding and
 * head as the first and last stage's compute per micro-batch beyond their
 * blocks (/stages/busy_ms), a third forward, two thirds backward. Where
 * the log has /layers/update_ms and /stages/update_ms for every step, the
 * blocks' updates come from the first, the stages' update time leaves their
 * per-micro-batch compute, and the embedding's and head's updates are the
 * first and last stage's update beyond their blocks'. The run's layout,
 * stage count and micro-batches become the defaults. */

static long config_value(const char *text, const char *key, long fallback)
{
    size_t n = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, key, n) && p[n] == ' ') return strtol(strchr(p, '=') + 1, NULL, 10);
    return fallback;
}

static void read_run(struct plan_input *in, const char *dir, long step, int **layout,
                     int *stages, int *micro_batches)
{
    char path[1200], err[512];
    snprintf(path, sizeof path, "%s/" RUNLOG_FILE_NAME, dir);
    char *config = NULL;
    if (runlog_read_root_attr(path, "config", &config, err, sizeof err) != 0)
        dm_user_error("--from-run: %s", err);
    int C = (int)config_value(config, "model.channels", 0);
    int L = (int)config_value(config, "model.layers", 0);
    *micro_batches = (int)config_value(config, "train.micro_batches", 1);
    free(config);
    if (C <= 0 || L <= 0) dm_user_error("--from-run: %s has no model config", path);
    float *rows = NULL;
    int ncols = 0;
    long nsteps = runlog_read_matrix(path, RUNLOG_LAYER_FWD_MS, &rows, &ncols, err, sizeof err);
    if (nsteps < 0) dm_user_error("--from-run: %s", err);
    free(rows);
    rows = NULL;
    /* updates only from a log that has them for every step (a resumed log of
     * an older dynmo starts them late) */
    int with_update = runlog_read_matrix(path, RUNLOG_LAYER_UPDATE_MS, &rows, &ncols, err,
                                         sizeof err) == nsteps;
    free(rows);
    if (step < 1 || step > nsteps)
        dm_user_error("--step %ld: %s has steps 1..%ld", step, path, nsteps);
    memset(in, 0, sizeof *in);
    in->blocks = L;
    in->fwd_ms = dm_alloc((size_t)L * sizeof(double));
    in->bwd_ms = dm_alloc((size_t)L * sizeof(double));
    in->params = dm_alloc((size_t)L * sizeof(double));
    in->mem_bytes = dm_alloc((size_t)L * sizeof(int64_t));
    float *fwd = dm_alloc((size_t)L * sizeof(float)), *bwd = dm_alloc((size_t)L * sizeof(float));
    float *sparsity = dm_alloc((size_t)L * sizeof(float));
    float *update = dm_alloc((size_t)L * sizeof(float));
    if (runlog_read_row(path, RUNLOG_LAYER_FWD_MS, step - 1, fwd, L, err, sizeof err) ||
        runlog_read_row(path, RUNLOG_LAYER_BWD_MS, step - 1, bwd, L, err, sizeof err))
        dm_user_error("--from-run: %s", err);
    if (runlog_read_row(path, "/layers/sparsity", step - 1, sparsity, L, err, sizeof err))
        memset(sparsity, 0, (size_t)L * sizeof(float));
    if (with_update &&
        runlog_read_row(path, RUNLOG_LAYER_UPDATE_MS, step - 1, update, L, err, sizeof err))
        dm_user_error("--from-run: %s", err);
    double dense = (double)block_param_count(C);
    for (int l = 0; l < L; l++) {
        in->fwd_ms[l] = fwd[l];
        in->bwd_ms[l] = bwd[l];
        in->params[l] = floor(dense * (1.0 - sparsity[l]) + 0.5);
        in->mem_bytes[l] = (int64_t)(16 * dense);
    }
    int *history = NULL, width = 0;
    if (runlog_read_int_matrix(path, RUNLOG_LAYOUT_HISTORY, &history, &width, err, sizeof err) < step)
        dm_user_error("--from-run: %s has no layout for step %ld", path, step);
    int S = 0;
    while (S < width && history[(step - 1) * width + S] > 0) S++;
    *stages = S;
    *layout = dm_alloc((size_t)S * sizeof(int));
    memcpy(*layout, history + (step - 1) * width, (size_t)S * sizeof(int));
    free(history);
    float *busy = dm_alloc((size_t)width * sizeof(float));
    float *stage_update = dm_alloc((size_t)width * sizeof(float));
    if (runlog_read_row(path, RUNLOG_STAGE_BUSY_MS, step - 1, busy, width, err, sizeof err))
        dm_user_error("--from-run: %s", err);
    if (with_update && runlog_read_row(path, RUNLOG_STAGE_UPDATE_MS, step - 1, stage_update,
                                       width, err, sizeof err))
        dm_user_error("--from-run: %s", err);
    in->update_ms = dm_alloc((size_t)L * sizeof(double));   /* zeros without updates */
    for (int l = 0; l < L; l++) in->update_ms[l] = update[l];
    double ends_busy[2] = {busy[0], busy[S - 1]};
    double ends_update[2] = {stage_update[0], stage_update[S - 1]};
    balance_end_stage_extras(in->fwd_ms, in->bwd_ms, in->update_ms, *layout, S, *micro_batches,
                             ends_busy, ends_update, &in->profile.embed, &in->profile.head);
    if (with_update) in->profile.update_ms = in->update_ms;
    in->has_embed = in->has_head = 1;
    in->profile.blocks = L;
    in->profile.fwd_ms = in->fwd_ms;
    in->profile.bwd_ms = in->bwd_ms;
    in->profile.params = in->params;
    in->profile.mem_bytes = in->mem_bytes;
    dm_free(fwd);
    dm_free(bwd);
    dm_free(sparsity);
    dm_free(update);
    dm_free(busy);
    dm_free(stage_update);
}

/* ---- processors: which stages share them ----------------------------------- */

/* The sharing every prediction uses; its arrays are owned here. */
struct plan_sharing {
    int *group;                 /* (sharing.stages) or NULL: one processor per stage */
    double *cores;              /* (sharing.groups) */
    struct balance_sharing sharing;
    int from_run;               /* taken from the run log */
    char note[200];             /* why the run's sharing is not used, or "" */
};

/* The sharing the run recorded (root attributes stage_groups and
 * group_cores of DIR's run log), used when plan lays out the run's stage
 * count; otherwise a note says why not. Bad attributes are user errors. */
static void sharing_from_run(struct plan_sharing *ps, const char *dir,
                             int run_stages, int stages)
{
    char path[1200], err[768];
    snprintf(path, sizeof path, "%s/" RUNLOG_FILE_NAME, dir);
    int *group = NULL;
    double *cores = NULL;
    long group_count = runlog_read_root_ints(path, RUNLOG_ATTR_STAGE_GROUPS, &group, err,
                                             sizeof err);
    if (group_count < 0) dm_user_error("--from-run: %s", err);
    long core_count = runlog_read_root_doubles(path, RUNLOG_ATTR_GROUP_CORES, &cores, err,
                                               sizeof err);
    if (core_count < 0) dm_user_error("--from-run: %s", err);
    int *turns = NULL;   /* absent in logs from before parallel.turns: fluid */
    long turns_count = runlog_read_root_ints(path, RUNLOG_ATTR_GROUP_TURNS, &turns, err,
                                             sizeof err);
    if (turns_count < 0) dm_user_error("--from-run: %s", err);
    if (turns_count > 1 || (turns_count == 1 && turns[0] != 0 && turns[0] != 1))
        dm_user_error("--from-run: %s: the attribute %s must be one value, 0 or 1", path,
                      RUNLOG_ATTR_GROUP_TURNS);
    int took_turns = turns_count == 1 && turns[0] == 1;
    dm_free(turns);
    if (!group_count && !core_count) return;
    if (!group_count || !core_count)
        dm_user_error("--from-run: %s has the attribute %s but not %s (both or neither)",
                      path, group_count ? RUNLOG_ATTR_STAGE_GROUPS : RUNLOG_ATTR_GROUP_CORES,
                      group_count ? RUNLOG_ATTR_GROUP_CORES : RUNLOG_ATTR_STAGE_GROUPS);
    if (group_count != run_stages)
        dm_user_error("--from-run: %s: stage_groups has %ld entries but the run "
                      "has %d stages", path, group_count, run_stages);
    struct balance_sharing sharing = {run_stages, (int)core_count, group, cores, took_turns};
    if (balance_check_sharing(&sharing, err, sizeof err))
        dm_user_error("--from-run: %s: stage_groups and group_cores: %s", path, err);
    if (stages != run_stages) {
        snprintf(ps->note, sizeof ps->note, "the run's %d stages shared "
                 "processors, but --stages is %d", run_stages, stages);
        dm_free(group);
        dm_free(cores);
        return;
    }
    ps->group = group;
    ps->cores = cores;
    ps->sharing = sharing;
    ps->from_run = 1;
}

/* The sharing given by --cores, or by --stage-groups and --group-cores,
 * for `stages` stages. Bad values are user errors naming the option. */
static void sharing_from_args(struct plan_sharing *ps, double cores,
                              const char *groups_text, const char *cores_text,
                              int turns, int stages)
{
    int groups = 1;
    if (cores > 0) {
        ps->group = dm_alloc((size_t)stages * sizeof(int));
        ps->cores = dm_alloc(sizeof(double));
        ps->cores[0] = cores;
    } else {
        int count = parse_list("--stage-groups", groups_text, "group numbers >= 0",
                               sizeof(int), group_entry, (void **)&ps->group);
        if (count != stages)
            dm_user_error("--stage-groups: %d stages, but --stages is %d", count,
                          stages);
        groups = parse_list("--group-cores", cores_text, "core counts > 0",
                            sizeof(double), cores_entry, (void **)&ps->cores);
        int highest = 0;
        for (int s = 0; s < stages; s++) {
            if (ps->group[s] >= groups)
                dm_user_error("--stage-groups: stage %d is in group %d, but "
                              "--group-cores gives %d groups (0..%d)", s,
                              ps->group[s], groups, groups - 1);
            if (ps->group[s] > highest) highest = ps->group[s];
        }
        if (highest + 1 < groups)
            dm_user_error("--group-cores: %d core counts, but --stage-groups "
                          "uses groups 0..%d only (one count per group)", groups,
                          highest);
    }
    ps->sharing = (struct balance_sharing){stages, groups, ps->group, ps->cores, turns};
}

/* "processors: ..." under the input lines. */
static void print_sharing(const struct plan_sharing *ps, int stages)
{
    const struct balance_sharing *sh = &ps->sharing;
    if (!ps->group) {
        printf("processors: one per stage%s%s%s\n", ps->note[0] ? " (" : "",
               ps->note, ps->note[0] ? ")" : "");
        return;
    }
    printf("processors: stages share them: groups ");
    for (int s = 0; s < sh->stages; s++) printf("%s%d", s ? "," : "", sh->group[s]);
    printf(" with ");
    for (int g = 0; g < sh->groups; g++) printf("%s%g", g ? "," : "", sh->cores[g]);
    printf(" cores%s%s%s\n", sh->turns ? ", taking turns" : "",
           ps->from_run ? " (from the run log)" : "",
           balance_sharing_oversubscribed(sh, stages) ? ""
               : " (no group has more stages than cores: as one per stage)");
}

static void free_input(struct plan_input *in)
{
    free(in->fwd_ms);
    free(in->bwd_ms);
    free(in->update_ms);
    free(in->params);
    free(in->mem_bytes);
}

/* ---- running and printing the methods ------------------------------------- */

enum { PLAN_REPACK = BALANCE_METHOD_COUNT, PLAN_REPACK_FIRST_FIT, PLAN_METHOD_COUNT };

static const char *plan_method_name(int method)
{
    if (method == PLAN_REPACK) return "repack";
    if (method == PLAN_REPACK_FIRST_FIT) return "repack-first-fit";
    return balance_method_name(method);
}

static int plan_method_parse(const char *name)
{
    for (int m = 0; m < PLAN_METHOD_COUNT; m++)
        if (!strcmp(name, plan_method_name(m))) return m;
    return -1;
}

struct plan_args {
    const char *costs_path;
    const char *run_dir;              /* --from-run */
    long run_step;                    /* --step, 1-based */
    int stages;
    int selected[PLAN_METHOD_COUNT];
    int explicit_methods;
    int64_t mem_cap;
    int micro_batches;
    enum dm_schedule schedule;
    int *current;      /* (stages) or NULL */
    double cores;                     /* --cores, 0 = not given */
    const char *stage_groups_text;    /* --stage-groups */
    const char *group_cores_text;     /* --group-cores */
    int sharing_model;                /* --sharing: -1 not given, 0 fluid, 1 turns */
    double gamma;
    double epsilon;
    int target_stages; /* repack-first-fit */
};

static void print_layout(const char *label, const int *counts, int stages)
{
    printf("%s: ", label);
    for (int s = 0; s < stages; s++) printf("%s%d", s ? "," : "", counts[s]);
    printf("\n");
}

/* Prints one method's block; returns 0, or the balance status on failure
 * (after printing the error line). */
static int run_method(const struct plan_input *in, const struct plan_args *a,
                      int method, const int *reference)
{
    int S = a->stages, n = in->blocks;
    int *counts = dm_alloc((size_t)S * sizeof(int));
    struct balance_result res;
    memset(&res, 0, sizeof res);
    char err[512] = "";
    int rc, stages = S;
    printf("method: %s\n", plan_method_name(method));
    if (method < BALANCE_METHOD_COUNT) {
        struct balance_options options = {
            .mem_cap = a->mem_cap, .gamma = a->gamma, .max_rounds = 0,
            .micro_batches = a->micro_batches, .schedule = a->schedule};
        rc = balance_propose(method, &in->profile, S, a->current, &options, counts,
                             &res, err, sizeof err);
    } else if (method == PLAN_REPACK) {
        rc = balance_repack(&in->profile, reference, S, a->mem_cap, a->micro_batches,
                            a->schedule, a->epsilon, counts, &res, err, sizeof err);
        stages = res.stages;
    } else {
        double *cost = dm_alloc((size_t)n * sizeof(double));
        struct balance_costs costs;
        balance_costs_from_profile(&costs, &in->profile, BALANCE_COST_TIME, cost);
        rc = balance_repack_first_fit(&costs, reference, S, a->mem_cap,
                                      a->target_stages, counts, &stages, err,
                                      sizeof err);
        dm_free(cost);
    }
    if (rc) {
        printf("error: %s\n\n", err);
        dm_free(counts);
        return rc;
    }
    double *cost = dm_alloc((size_t)n * sizeof(double));
    struct balance_costs time_costs, param_costs;
    balance_costs_from_profile(&time_costs, &in->profile, BALANCE_COST_TIME, cost);
    double max_ms, max_params;
    int64_t max_mem;
    balance_layout_max(&time_costs, stages, counts, &max_ms, &max_mem);
    balance_costs_from_profile(&param_costs, &in->profile, BALANCE_COST_PARAMS, cost);
    balance_layout_max(&param_costs, stages, counts, &max_params, NULL);
    dm_free(cost);
    struct balance_prediction prediction;
    rc = balance_predict(&in->profile, stages, counts, a->micro_batches, a->schedule,
                         &prediction, err, sizeof err);
    DM_ASSERT(rc == BALANCE_OK);
    struct balance_move *moves = dm_alloc((size_t)(n + 1) * sizeof *moves);
    int move_count;
    int64_t moved_bytes;
    rc = balance_migration_plan(in->mem_bytes, n, in->profile.head.mem_bytes,
                                reference, S, counts, stages, moves, &move_count,
                                &moved_bytes, err, sizeof err);
    DM_ASSERT(rc == BALANCE_OK);
    int moved_blocks = move_count;
    if (move_count > 0 && moves[move_count - 1].block == BALANCE_HEAD_BLOCK)
        moved_blocks--;
    dm_free(moves);

    if (stages != S) printf("stages: %d\n", stages);
    if (stages != S && in->profile.sharing)
        printf("processors: one per stage (the sharing is for %d stages)\n", S);
    print_layout("layout", counts, stages);
    printf("max_stage_ms: %.3f\n", max_ms);
    printf("max_stage_params: %.0f\n", max_params);
    printf("max_stage_mem_bytes: %lld%s\n", (long long)max_mem,
           a->mem_cap > 0 && max_mem > a->mem_cap ? " (over --mem-cap)" : "");
    printf("step_ms: %.3f\n", prediction.step_ms);
    printf("bubble_ratio: %.4f\n", prediction.bubble_ratio);
    printf("blocks_moved: %d\n", moved_blocks);
    printf("bytes_moved: %lld\n", (long long)moved_bytes);
    if (method == BALANCE_DIFFUSION_PARAMS || method == BALANCE_DIFFUSION_TIME)
        printf("rounds: %d\n", res.rounds);
    printf("\n");
    dm_free(counts);
    return 0;
}

static void parse_args(struct plan_args *a, int argc, char **argv, int *bench)
{
    memset(a, 0, sizeof *a);
    a->schedule = DM_SCHEDULE_1F1B;
    a->epsilon = 0.05;
    a->target_stages = 1;
    a->sharing_model = -1;
    const char *current_text = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            exit(DM_EXIT_OK);
        }
        if (!strcmp(arg, "--bench")) {
            *bench = 1;
            continue;
        }
        if (strncmp(arg, "--", 2))
            dm_user_error("plan: unexpected argument '%s' (see dynmo plan --help)", arg);
        if (i + 1 >= argc) dm_user_error("%s: needs a value", arg);
        const char *value = argv[++i];
        if (!strcmp(arg, "--costs")) {
            a->costs_path = value;
        } else if (!strcmp(arg, "--stages")) {
            a->stages = (int)parse_long(arg, value, 1, 1 << 20);
        } else if (!strcmp(arg, "--method")) {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", value);
            a->explicit_methods = 1;
            for (char *name = strtok(buf, ","); name; name = strtok(NULL, ",")) {
                if (!strcmp(name, "all")) {
                    for (int m = 0; m < PLAN_METHOD_COUNT; m++) a->selected[m] = 1;
                    a->explicit_methods = 0;
                    continue;
                }
                int m = plan_method_parse(name);
                if (m < 0)
                    dm_user_error("--method: unknown method '%s' (static-uniform, "
                                  "static-params, partition-params, partition-time, "
                                  "diffusion-params, diffusion-time, repack, "
                                  "repack-first-fit, all)", name);
                a->selected[m] = 1;
            }
        } else if (!strcmp(arg, "--mem-cap")) {
            a->mem_cap = parse_bytes(arg, value);
        } else if (!strcmp(arg, "--micro-batches")) {
            a->micro_batches = (int)parse_long(arg, value, 1, 1 << 20);
        } else if (!strcmp(arg, "--schedule")) {
            if (!strcmp(value, "1f1b")) a->schedule = DM_SCHEDULE_1F1B;
            else if (!strcmp(value, "gpipe")) a->schedule = DM_SCHEDULE_GPIPE;
            else dm_user_error("--schedule: '%s' is not 1f1b or gpipe", value);
        } else if (!strcmp(arg, "--current")) {
            current_text = value;
        } else if (!strcmp(arg, "--gamma")) {
            a->gamma = parse_double(arg, value, 0);
        } else if (!strcmp(arg, "--epsilon")) {
            a->epsilon = parse_double(arg, value, 0);
        } else if (!strcmp(arg, "--target-stages")) {
            a->target_stages = (int)parse_long(arg, value, 1, 1 << 20);
        } else if (!strcmp(arg, "--cores")) {
            char *end;
            if (!cores_entry(value, &end, &a->cores) || *end)
                dm_user_error("--cores: '%s' is not a number of processors > 0",
                              value);
        } else if (!strcmp(arg, "--stage-groups")) {
            a->stage_groups_text = value;
        } else if (!strcmp(arg, "--group-cores")) {
            a->group_cores_text = value;
        } else if (!strcmp(arg, "--sharing")) {
            if (!strcmp(value, "fluid")) a->sharing_model = 0;
            else if (!strcmp(value, "turns")) a->sharing_model = 1;
            else dm_user_error("--sharing: '%s' is not fluid or turns", value);
        } else if (!strcmp(arg, "--from-run")) {
            a->run_dir = value;
        } else if (!strcmp(arg, "--step")) {
            a->run_step = parse_long(arg, value, 1, 1L << 40);
        } else if (!strcmp(arg, "--repeats") || !strcmp(arg, "--seed")) {
            /* plan_bench's; parsed there */
        } else {
            dm_user_error("plan: unknown option '%s' (see dynmo plan --help)", arg);
        }
    }
    if (*bench) return;
    int any = 0;
    for (int m = 0; m < PLAN_METHOD_COUNT; m++) any |= a->selected[m];
    if (!any)
        for (int m = 0; m < PLAN_METHOD_COUNT; m++) a->selected[m] = 1;
    if (a->run_dir && a->costs_path)
        dm_user_error("plan: give --costs or --from-run, not both");
    if (a->run_dir && !a->run_step) dm_user_error("--from-run needs --step N");
    if (!a->costs_path && !a->run_dir)
        dm_user_error("plan: --costs FILE.csv (or --from-run DIR --step N) is required");
    if (!a->stages && !a->run_dir) dm_user_error("plan: --stages S is required");
    if (a->cores > 0 && (a->stage_groups_text || a->group_cores_text))
        dm_user_error("--cores: give --cores (one group of all stages) or "
                      "--stage-groups with --group-cores, not both");
    if (!a->stage_groups_text != !a->group_cores_text)
        dm_user_error("%s needs %s too (a group per stage, a core count per group)",
                      a->stage_groups_text ? "--stage-groups" : "--group-cores",
                      a->stage_groups_text ? "--group-cores" : "--stage-groups");
    if (!a->micro_batches && !a->run_dir) a->micro_batches = 4 * a->stages;
    if (current_text) {
        if (a->run_dir && !a->stages)
            dm_user_error("--current with --from-run needs --stages");
        int count = parse_layout("--current", current_text, &a->current);
        if (count != a->stages)
            dm_user_error("--current: %d stages, but --stages is %d", count, a->stages);
    }
}

int cmd_plan(int argc, char **argv)
{
    struct plan_args a;
    int bench = 0;
    parse_args(&a, argc, argv, &bench);
    if (bench) return plan_bench(argc, argv);

    struct plan_input in;
    struct plan_sharing sharing;
    memset(&sharing, 0, sizeof sharing);
    int sharing_given = a.cores > 0 || a.stage_groups_text;
    char source[1300];
    if (a.run_dir) {
        int *run_layout = NULL, run_stages = 0, run_mb = 0;
        read_run(&in, a.run_dir, a.run_step, &run_layout, &run_stages, &run_mb);
        if (!a.stages) a.stages = run_stages;
        if (!sharing_given) sharing_from_run(&sharing, a.run_dir, run_stages, a.stages);
        if (!a.micro_batches) a.micro_batches = run_mb;
        if (!a.current && a.stages == run_stages) a.current = run_layout;
        else dm_free(run_layout);
        snprintf(source, sizeof source, "%s step %ld", a.run_dir, a.run_step);
        a.costs_path = source;
    } else {
        read_costs(&in, a.costs_path);
    }
    int n = in.blocks, S = a.stages;
    if (n < S)
        dm_user_error("--stages: %d stages but %s has only %d blocks; every stage "
                      "needs at least one", S, a.costs_path, n);
    if (sharing_given)
        sharing_from_args(&sharing, a.cores, a.stage_groups_text,
                          a.group_cores_text, a.sharing_model == 1, S);
    else if (sharing.group && a.sharing_model >= 0)   /* the run's groups, another model */
        sharing.sharing.turns = a.sharing_model;
    if (a.sharing_model >= 0 && !sharing.group)
        dm_user_error("--sharing: no stages share processors here; give --cores or "
                      "--stage-groups with --group-cores%s", a.run_dir ? " (or a run "
                      "whose stages shared them, at its stage count)" : "");
    char err[512];
    if (sharing.group) {
        /* the groups were checked where they were read; turns need whole cores */
        if (balance_check_sharing(&sharing.sharing, err, sizeof err))
            dm_user_error("--sharing turns: %s", err);
        in.profile.sharing = &sharing.sharing;
    }
    int *reference = dm_alloc((size_t)S * sizeof(int));
    if (a.current) {
        long sum = 0;
        for (int s = 0; s < S; s++) sum += a.current[s];
        if (sum != n)
            dm_user_error("--current: the layout covers %ld blocks but %s has %d",
                          sum, a.costs_path, n);
        memcpy(reference, a.current, (size_t)S * sizeof(int));
    } else {
        balance_static_uniform(n, S, reference, NULL, 0);
    }
    /* The input as a whole must fit the cap; method-specific trouble (such as
     * a starting layout over the cap) is reported in that method's block. */
    double *cost = dm_alloc((size_t)n * sizeof(double));
    struct balance_costs costs;
    balance_costs_from_profile(&costs, &in.profile, BALANCE_COST_TIME, cost);
    if (balance_check_costs(&costs, S, a.mem_cap, err, sizeof err))
        dm_user_error("%s: %s", a.costs_path, err);
    dm_free(cost);

    printf("costs: %s (%d blocks%s%s)\n", a.costs_path, n,
           in.has_embed ? ", embed" : "", in.has_head ? ", head" : "");
    if (in.profile.update_ms) {   /* the step's end, once a step */
        double blocks = 0;
        for (int i = 0; i < n; i++) blocks += in.profile.update_ms[i];
        printf("update_ms: blocks %.3f  embed %.3f  head %.3f (once a step)\n", blocks,
               in.profile.embed.update_ms, in.profile.head.update_ms);
    }
    printf("stages: %d  micro_batches: %d  schedule: %s  mem_cap: ", S,
           a.micro_batches, a.schedule == DM_SCHEDULE_GPIPE ? "gpipe" : "1f1b");
    if (a.mem_cap > 0) printf("%lld\n", (long long)a.mem_cap);
    else printf("none\n");
    print_sharing(&sharing, S);
    print_layout("reference", reference, S);
    printf("\n");

    int failures = 0, last_failure = 0, ran = 0;
    for (int m = 0; m < PLAN_METHOD_COUNT; m++) {
        if (!a.selected[m]) continue;
        ran++;
        int rc = run_method(&in, &a, m, reference);
        if (rc) {
            failures++;
            last_failure = m;
        }
    }
    fflush(stdout);
    dm_free(reference);
    dm_free(a.current);
    dm_free(sharing.group);
    dm_free(sharing.cores);
    free_input(&in);
    if (failures && (a.explicit_methods || failures == ran))
        dm_user_error("plan: method %s failed (see its error line above)",
                      plan_method_name(last_failure));
    return DM_EXIT_OK;
}
