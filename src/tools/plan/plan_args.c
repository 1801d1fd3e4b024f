/* The command line of `dynmo plan` (docs/balance.md): the usage text, the
 * options into a struct plan_args, and the processor sharing that
 * --cores or --stage-groups with --group-cores describe. Every bad
 * argument is a user error (exit 2) whose message names the argument.
 * Must not: read input files or run a balancer (plan.c does both). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "tools/args.h"
#include "tools/plan/plan.h"

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
        "  --schedule 1f1b|gpipe|zb|interleaved\n"
        "                        schedule the predictor simulates (default 1f1b;\n"
        "                        zb: ZB-H1, weight gradients half of each backward)\n"
        "  --virtual v           interleaved: chunks per stage (default 2); the\n"
        "                        layouts then have S x v entries, chunk c of stage s\n"
        "                        being entry c S + s; micro-batches a multiple of S\n"
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
        "  --units block|sublayer  what a row of --costs is: a block (the default),\n"
        "                        or a unit of balance.units = sublayer (two rows per\n"
        "                        block: its attention, then its MLP); layouts count\n"
        "                        the rows\n"
        "  --bench               time the balancers on random inputs (docs/PERFORMANCE.md)\n"
        "  --from-run DIR --step N   costs from DIR/runlog.h5 at step N (1-based),\n"
        "                        or their mean over steps A-B (one layout):\n"
        "                        per-block fwd/bwd ms, parameters (nonzero after\n"
        "                        pruning), embed/head from the end stages' extra\n"
        "                        compute; the run's stages, layout and\n"
        "                        micro-batches are the defaults, and so is the\n"
        "                        processor sharing it recorded (root attributes\n"
        "                        stage_groups, group_cores and group_turns) at its\n"
        "                        stage count, and its units (--units block plans\n"
        "                        a sublayer run in whole blocks)\n");
}

/* ---- argument parsing ---------------------------------------------------- */

static long parse_long(const char *arg, const char *text, long min, long max)
{
    return tool_parse_long("", arg, text, min, max);
}

static double parse_double(const char *arg, const char *text, double min)
{
    return tool_parse_double("", arg, text, min);
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

/* ---- the methods ------------------------------------------------------------ */

const char *plan_method_name(int method)
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

/* --method M[,M...]; `all` selects every method and, named anywhere,
 * makes none of them explicit (a failure then fails the run only when
 * every method fails). */
static void parse_methods(struct plan_args *a, const char *value)
{
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
}

/* ---- the options ------------------------------------------------------------- */

/* --step N, or A-B (1 <= A <= B): the steps whose mean costs a plan takes. */
static void parse_steps(const char *value, struct plan_steps *steps)
{
    char *end;
    long first = strtol(value, &end, 10), last = first;
    if (end != value && *end == '-') {
        const char *second = end + 1;
        last = strtol(second, &end, 10);
        if (end == second) first = 0;
    }
    if (end == value || *end || first < 1 || last < first || last > 1L << 40)
        dm_user_error("--step: '%s' is not a step N or a range A-B of steps (1 <= A <= B)",
                      value);
    steps->first = first;
    steps->last = last;
}

/* The option arg with its value; 0 when plan has no such option. --current
 * is kept as text until the stage count is known. */
static int parse_option(struct plan_args *a, const char *arg, const char *value,
                        const char **current_text)
{
    if (!strcmp(arg, "--costs")) {
        a->costs_path = value;
    } else if (!strcmp(arg, "--stages")) {
        a->stages = (int)parse_long(arg, value, 1, 1 << 20);
    } else if (!strcmp(arg, "--method")) {
        parse_methods(a, value);
    } else if (!strcmp(arg, "--mem-cap")) {
        a->mem_cap = parse_bytes(arg, value);
    } else if (!strcmp(arg, "--micro-batches")) {
        a->micro_batches = (int)parse_long(arg, value, 1, 1 << 20);
    } else if (!strcmp(arg, "--schedule")) {
        if (!strcmp(value, "1f1b")) a->schedule = DM_SCHEDULE_1F1B;
        else if (!strcmp(value, "gpipe")) a->schedule = DM_SCHEDULE_GPIPE;
        else if (!strcmp(value, "zb")) a->schedule = DM_SCHEDULE_ZB;
        else if (!strcmp(value, "interleaved")) a->schedule = DM_SCHEDULE_INTERLEAVED;
        else dm_user_error("--schedule: '%s' is not 1f1b, gpipe, zb or interleaved", value);
        a->schedule_given = 1;
    } else if (!strcmp(arg, "--virtual")) {
        a->virtual_stages = (int)parse_long(arg, value, 1, 1 << 10);
    } else if (!strcmp(arg, "--current")) {
        *current_text = value;
    } else if (!strcmp(arg, "--gamma")) {
        a->gamma = parse_double(arg, value, 0);
    } else if (!strcmp(arg, "--epsilon")) {
        a->epsilon = parse_double(arg, value, 0);
    } else if (!strcmp(arg, "--target-stages")) {
        a->target_stages = (int)parse_long(arg, value, 1, 1 << 20);
    } else if (!strcmp(arg, "--cores")) {
        char *end;
        if (!cores_entry(value, &end, &a->cores) || *end)
            dm_user_error("--cores: '%s' is not a number of processors > 0", value);
    } else if (!strcmp(arg, "--stage-groups")) {
        a->stage_groups_text = value;
    } else if (!strcmp(arg, "--group-cores")) {
        a->group_cores_text = value;
    } else if (!strcmp(arg, "--sharing")) {
        if (!strcmp(value, "fluid")) a->sharing_model = 0;
        else if (!strcmp(value, "turns")) a->sharing_model = 1;
        else dm_user_error("--sharing: '%s' is not fluid or turns", value);
    } else if (!strcmp(arg, "--units")) {
        a->units = balance_units_parse(value);
        if (a->units < 0) dm_user_error("--units: '%s' is not block or sublayer", value);
        a->units_given = 1;
    } else if (!strcmp(arg, "--from-run")) {
        a->run_dir = value;
    } else if (!strcmp(arg, "--step")) {
        parse_steps(value, &a->run_steps);
    } else if (strcmp(arg, "--repeats") && strcmp(arg, "--seed")) {
        return 0;   /* --repeats and --seed are plan_bench's; parsed there */
    }
    return 1;
}

void plan_check_virtual(struct plan_args *a)
{
    if (a->schedule != DM_SCHEDULE_INTERLEAVED) {
        if (a->virtual_stages)
            dm_user_error("--virtual: only --schedule interleaved has chunks per stage "
                          "(the schedule is %s)", schedule_name(a->schedule));
        return;
    }
    if (!a->virtual_stages) a->virtual_stages = 2;
    if (a->cores > 0 || a->stage_groups_text)
        dm_user_error("--schedule interleaved: processor sharing (--cores, --stage-groups) "
                      "is not modelled for chunks; leave it out");
    if (a->micro_batches % a->stages != 0)
        dm_user_error("--micro-batches: interleaved needs a multiple of the %d stages "
                      "(got %d)", a->stages, a->micro_batches);
    a->stages *= a->virtual_stages;
}

/* What the options say together: the defaults that depend on others, and
 * the combinations that make no sense. */
static void check_args(struct plan_args *a, const char *current_text)
{
    int any = 0;
    for (int m = 0; m < PLAN_METHOD_COUNT; m++) any |= a->selected[m];
    if (!any)
        for (int m = 0; m < PLAN_METHOD_COUNT; m++) a->selected[m] = 1;
    if (a->run_dir && a->costs_path)
        dm_user_error("plan: give --costs or --from-run, not both");
    if (a->run_dir && !a->run_steps.last) dm_user_error("--from-run needs --step N (or A-B)");
    if (a->run_steps.last && !a->run_dir)
        dm_user_error("--step: only --from-run reads steps (of a run log)");
    if (!a->costs_path && !a->run_dir)
        dm_user_error("plan: --costs FILE.csv (or --from-run DIR --step N) is required");
    if (!a->stages && !a->run_dir) dm_user_error("plan: --stages S is required");
    if (a->units_given && a->run_dir && a->units != BALANCE_UNITS_BLOCK)
        dm_user_error("--units sublayer: --from-run reads the run log's own units (--units "
                      "block plans a sublayer run in whole blocks)");
    if (a->cores > 0 && (a->stage_groups_text || a->group_cores_text))
        dm_user_error("--cores: give --cores (one group of all stages) or "
                      "--stage-groups with --group-cores, not both");
    if (!a->stage_groups_text != !a->group_cores_text)
        dm_user_error("%s needs %s too (a group per stage, a core count per group)",
                      a->stage_groups_text ? "--stage-groups" : "--group-cores",
                      a->stage_groups_text ? "--group-cores" : "--stage-groups");
    if (!a->micro_batches && !a->run_dir) a->micro_batches = 4 * a->stages;
    if (!a->run_dir) plan_check_virtual(a);
    if (current_text) {
        if (a->run_dir && !a->stages)
            dm_user_error("--current with --from-run needs --stages");
        int count = parse_layout("--current", current_text, &a->current);
        a->current_count = count;
        if (!a->run_dir && count != a->stages)
            dm_user_error("--current: %d stages, but --stages is %d", count, a->stages);
    }
}

void plan_parse_args(struct plan_args *a, int argc, char **argv, int *bench)
{
    memset(a, 0, sizeof *a);
    a->schedule = DM_SCHEDULE_1F1B;
    a->epsilon = 0.05;
    a->target_stages = 1;
    a->sharing_model = -1;
    const char *current_text = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        tool_help(arg, usage);
        if (!strcmp(arg, "--bench")) {
            *bench = 1;
            continue;
        }
        if (strncmp(arg, "--", 2))
            dm_user_error("plan: unexpected argument '%s' (see dynmo plan --help)", arg);
        if (i + 1 >= argc) dm_user_error("%s: needs a value", arg);
        if (!parse_option(a, arg, argv[++i], &current_text))
            dm_user_error("plan: unknown option '%s' (see dynmo plan --help)", arg);
    }
    if (!*bench) check_args(a, current_text);
}

/* ---- processors from the command line ------------------------------------------ */

/* --stage-groups and --group-cores: a group per stage, a core count per
 * group, every group used. */
static int groups_from_args(struct plan_sharing *ps, const char *groups_text,
                            const char *cores_text, int stages)
{
    int count = parse_list("--stage-groups", groups_text, "group numbers >= 0",
                           sizeof(int), group_entry, (void **)&ps->group);
    if (count != stages)
        dm_user_error("--stage-groups: %d stages, but --stages is %d", count, stages);
    int groups = parse_list("--group-cores", cores_text, "core counts > 0",
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
    return groups;
}

void plan_sharing_from_args(struct plan_sharing *ps, double cores,
                            const char *groups_text, const char *cores_text,
                            int turns, int stages)
{
    int groups = 1;
    if (cores > 0) {
        ps->group = dm_alloc((size_t)stages * sizeof(int));
        ps->cores = dm_alloc(sizeof(double));
        ps->cores[0] = cores;
    } else {
        groups = groups_from_args(ps, groups_text, cores_text, stages);
    }
    ps->sharing = (struct balance_sharing){stages, groups, ps->group, ps->cores, turns};
}
