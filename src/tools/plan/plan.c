/* `dynmo plan`: lays out per-block costs (a CSV, or one step of a run log
 * with --from-run) on S stages with each balancing method and prints the
 * layout it chooses, its bottleneck, its predicted step time and bubble
 * ratio and what it would move (docs/balance.md). `--bench` times the
 * balancers instead (plan_bench.c). Stages may share processors (--cores,
 * --stage-groups with --group-cores, or what the run log recorded); the
 * predictions and partition-time then account for it. This file is the
 * command and its printing; plan_args.c reads the command line,
 * plan_costs.c the CSV, plan_runlog.c the run log.
 *
 * Must not: decide a layout itself (the algorithms live in src/balance and
 * training calls the same code), or go on past bad input: bad arguments
 * and bad CSV end with exit status 2 and a message naming the argument,
 * or the file and line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/tools.h"
#include "tools/plan/plan.h"

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

static void print_layout(const char *label, const int *counts, int stages)
{
    printf("%s: ", label);
    for (int s = 0; s < stages; s++) printf("%s%d", s ? "," : "", counts[s]);
    printf("\n");
}

/* With sublayer units: the blocks whose attention and MLP sit on two
 * stages (a boundary after an odd number of units). */
static void print_split_blocks(const int *counts, int stages)
{
    printf("split_blocks:");
    int unit = 0, any = 0;
    for (int s = 0; s + 1 < stages; s++) {
        unit += counts[s];
        if (unit % 2 == 0) continue;
        printf("%s%d", any ? "," : " ", unit / 2);
        any = 1;
    }
    printf("%s\n", any ? "" : " none");
}

/* ---- running and printing the methods ------------------------------------- */

/* Method's layout of the input into counts, on *stages stages (the
 * re-packers may choose fewer than --stages). Returns 0, or the balance
 * status with err filled. */
static int propose_layout(const struct plan_input *in, const struct plan_args *a,
                          int method, const int *reference, int *counts,
                          int *stages, struct balance_result *res, char *err,
                          size_t errsize)
{
    int S = a->stages, n = in->blocks, rc;
    *stages = S;
    if (method < BALANCE_METHOD_COUNT) {
        struct balance_options options = {
            .mem_cap = a->mem_cap, .gamma = a->gamma, .max_rounds = 0,
            .micro_batches = a->micro_batches, .schedule = a->schedule};
        rc = balance_propose(method, &in->profile, S, a->current, &options, counts,
                             res, err, errsize);
    } else if (a->virtual_stages) {
        rc = BALANCE_BAD_INPUT;
        snprintf(err, errsize, "%s re-packs whole stages; not with the interleaved "
                 "schedule's chunks", plan_method_name(method));
    } else if (method == PLAN_REPACK) {
        rc = balance_repack(&in->profile, reference, S, a->mem_cap, a->micro_batches,
                            a->schedule, a->epsilon, counts, res, err, errsize);
        *stages = res->stages;
    } else {
        double *cost = dm_alloc((size_t)n * sizeof(double));
        struct balance_costs costs;
        balance_costs_from_profile(&costs, &in->profile, BALANCE_COST_TIME, cost);
        rc = balance_repack_first_fit(&costs, reference, S, a->mem_cap,
                                      a->target_stages, counts, stages, err, errsize);
        dm_free(cost);
    }
    return rc;
}

/* What a method's block prints about its layout. */
struct layout_report {
    double max_ms, max_params;
    int64_t max_mem;
    struct balance_prediction prediction;
    int moved_blocks;              /* the head's move not counted */
    int64_t moved_bytes;
};

static void measure_layout(const struct plan_input *in, const struct plan_args *a,
                           const int *reference, const int *counts, int stages,
                           struct layout_report *r)
{
    int S = a->stages, n = in->blocks;
    char err[512];
    double *cost = dm_alloc((size_t)n * sizeof(double));
    struct balance_costs time_costs, param_costs;
    balance_costs_from_profile(&time_costs, &in->profile, BALANCE_COST_TIME, cost);
    balance_layout_max(&time_costs, stages, counts, &r->max_ms, &r->max_mem);
    balance_costs_from_profile(&param_costs, &in->profile, BALANCE_COST_PARAMS, cost);
    balance_layout_max(&param_costs, stages, counts, &r->max_params, NULL);
    dm_free(cost);
    int rc = balance_predict(&in->profile, stages, counts, a->micro_batches, a->schedule,
                             &r->prediction, err, sizeof err);
    DM_ASSERT(rc == BALANCE_OK);
    struct balance_move *moves = dm_alloc((size_t)(n + 1) * sizeof *moves);
    int move_count;
    rc = balance_migration_plan(in->mem_bytes, n, in->profile.head.mem_bytes,
                                reference, S, counts, stages, moves, &move_count,
                                &r->moved_bytes, err, sizeof err);
    DM_ASSERT(rc == BALANCE_OK);
    r->moved_blocks = move_count;
    if (move_count > 0 && moves[move_count - 1].block == BALANCE_HEAD_BLOCK)
        r->moved_blocks--;
    dm_free(moves);
}

static void print_report(const struct plan_input *in, const struct plan_args *a,
                         int method, const int *counts, int stages,
                         const struct balance_result *res,
                         const struct layout_report *r)
{
    int S = a->stages;
    if (stages != S) printf("stages: %d\n", stages);
    if (stages != S && in->profile.sharing)
        printf("processors: one per stage (the sharing is for %d stages)\n", S);
    print_layout("layout", counts, stages);
    printf("max_stage_ms: %.3f\n", r->max_ms);
    printf("max_stage_params: %.0f\n", r->max_params);
    printf("max_stage_mem_bytes: %lld%s\n", (long long)r->max_mem,
           a->mem_cap > 0 && r->max_mem > a->mem_cap ? " (over --mem-cap)" : "");
    printf("step_ms: %.3f\n", r->prediction.step_ms);
    printf("bubble_ratio: %.4f\n", r->prediction.bubble_ratio);
    if (a->units == BALANCE_UNITS_SUBLAYER) print_split_blocks(counts, stages);
    printf("%s_moved: %d\n", a->units == BALANCE_UNITS_SUBLAYER ? "units" : "blocks",
           r->moved_blocks);
    printf("bytes_moved: %lld\n", (long long)r->moved_bytes);
    if (method == BALANCE_DIFFUSION_PARAMS || method == BALANCE_DIFFUSION_TIME)
        printf("rounds: %d\n", res->rounds);
    printf("\n");
}

/* Prints one method's block and sets *step_ms to its predicted step;
 * returns 0, or the balance status on failure (after printing the error
 * line, which err, errsize bytes, then holds). */
static int run_method(const struct plan_input *in, const struct plan_args *a,
                      int method, const int *reference, double *step_ms, char *err,
                      size_t errsize)
{
    int *counts = dm_alloc((size_t)a->stages * sizeof(int));
    struct balance_result res;
    memset(&res, 0, sizeof res);
    err[0] = 0;
    int stages;
    printf("method: %s\n", plan_method_name(method));
    int rc = propose_layout(in, a, method, reference, counts, &stages, &res, err, errsize);
    if (rc) {
        printf("error: %s\n\n", err);
    } else {
        struct layout_report report;
        measure_layout(in, a, reference, counts, stages, &report);
        print_report(in, a, method, counts, stages, &res, &report);
        *step_ms = report.prediction.step_ms;
    }
    dm_free(counts);
    return rc;
}

/* ---- the command -------------------------------------------------------------- */

/* The input, from the run log or the CSV; a run's stages, micro-batches,
 * layout and (without a sharing on the command line) processor sharing
 * become the defaults. a->costs_path then names the run's step, in
 * source. */
static void load_input(struct plan_input *in, struct plan_args *a,
                       struct plan_sharing *sharing, int sharing_given,
                       char *source, size_t source_size)
{
    if (!a->run_dir) {
        char err[1400];
        if (plan_read_costs(a->costs_path, in, err, sizeof err))
            dm_user_error("%s", err);
        return;
    }
    struct plan_run run;
    plan_read_run(in, a->run_dir, &a->run_steps, a->units_given, &run);
    a->units = run.units;
    if (!a->schedule_given) {   /* the run's schedule, and its chunks */
        a->schedule = run.schedule;
        if (!a->virtual_stages && run.chunk_layout) a->virtual_stages = run.virtual_stages;
    }
    if (!a->stages) a->stages = run.stages;
    if (!a->micro_batches) a->micro_batches = run.micro_batches;
    plan_check_virtual(a);   /* a->stages now counts chunks under interleaved */
    if (!sharing_given)
        plan_sharing_from_run(sharing, a->run_dir, run.stages,
                              a->virtual_stages ? a->stages / a->virtual_stages : a->stages);
    if (sharing->group && a->schedule == DM_SCHEDULE_INTERLEAVED) {   /* left out, said */
        dm_free(sharing->group);
        dm_free(sharing->cores);
        memset(sharing, 0, sizeof *sharing);
        snprintf(sharing->note, sizeof sharing->note, "the run's stages shared processors, "
                 "which interleaved's prediction leaves out");
    }
    /* the run's layout is the reference where it has the planned count */
    int *own = run.chunk_layout && a->stages == run.stages * run.virtual_stages
                   ? run.chunk_layout : a->stages == run.stages ? run.layout : NULL;
    if (a->current && a->current_count != a->stages)
        dm_user_error("--current: %d entries, but the plan has %d %s", a->current_count,
                      a->stages, a->virtual_stages ? "chunks (stages x virtual)" : "stages");
    if (!a->current) a->current = own;
    if (a->current != run.layout) dm_free(run.layout);
    if (a->current != run.chunk_layout) dm_free(run.chunk_layout);
    if (a->run_steps.first == a->run_steps.last)
        snprintf(source, source_size, "%s step %ld", a->run_dir, a->run_steps.last);
    else
        snprintf(source, source_size, "%s steps %ld-%ld (their mean)", a->run_dir,
                 a->run_steps.first, a->run_steps.last);
    a->costs_path = source;
}

/* The sharing every prediction uses: the command line's, else the run's
 * (with --sharing's model), else a processor per stage. */
static void set_up_sharing(struct plan_input *in, const struct plan_args *a,
                           struct plan_sharing *sharing, int sharing_given)
{
    if (sharing_given)
        plan_sharing_from_args(sharing, a->cores, a->stage_groups_text,
                               a->group_cores_text, a->sharing_model == 1, a->stages);
    else if (sharing->group && a->sharing_model >= 0)   /* the run's groups, another model */
        sharing->sharing.turns = a->sharing_model;
    if (a->sharing_model >= 0 && !sharing->group)
        dm_user_error("--sharing: no stages share processors here; give --cores or "
                      "--stage-groups with --group-cores%s", a->run_dir ? " (or a run "
                      "whose stages shared them, at its stage count)" : "");
    if (sharing->group) {
        char err[512];
        /* the groups were checked where they were read; turns need whole cores */
        if (balance_check_sharing(&sharing->sharing, err, sizeof err))
            dm_user_error("--sharing turns: %s", err);
        in->profile.sharing = &sharing->sharing;
    }
}

/* The layout now (--current, the run's, or static-uniform): the start of
 * diffusion and repack, the reference for what moves. dm_alloc'd. */
static int *reference_layout(const struct plan_input *in, const struct plan_args *a)
{
    int S = a->stages, n = in->blocks;
    int *reference = dm_alloc((size_t)S * sizeof(int));
    if (a->current) {
        long sum = 0;
        for (int s = 0; s < S; s++) sum += a->current[s];
        if (sum != n)
            dm_user_error("--current: the layout covers %ld %s but %s has %d", sum,
                          a->units == BALANCE_UNITS_SUBLAYER ? "units" : "blocks",
                          a->costs_path, n);
        memcpy(reference, a->current, (size_t)S * sizeof(int));
    } else {
        balance_static_uniform(n, S, reference, NULL, 0);
    }
    return reference;
}

/* The input as a whole must fit the cap; method-specific trouble (such as
 * a starting layout over the cap) is reported in that method's block. */
static void check_fits(const struct plan_input *in, const struct plan_args *a)
{
    char err[512];
    double *cost = dm_alloc((size_t)in->blocks * sizeof(double));
    struct balance_costs costs;
    balance_costs_from_profile(&costs, &in->profile, BALANCE_COST_TIME, cost);
    if (balance_check_costs(&costs, a->stages, a->mem_cap, err, sizeof err))
        dm_user_error("%s: %s", a->costs_path, err);
    dm_free(cost);
}

/* The lines describing the input, above the methods' blocks. */
static void print_input(const struct plan_input *in, const struct plan_args *a,
                        const struct plan_sharing *sharing, const int *reference)
{
    int n = in->blocks, S = a->stages;
    if (a->units == BALANCE_UNITS_SUBLAYER)
        printf("costs: %s (%d sublayer units of %d blocks%s%s)\n", a->costs_path, n, n / 2,
               in->has_embed ? ", embed" : "", in->has_head ? ", head" : "");
    else
        printf("costs: %s (%d blocks%s%s)\n", a->costs_path, n,
               in->has_embed ? ", embed" : "", in->has_head ? ", head" : "");
    if (in->profile.update_ms) {   /* the step's end, once a step */
        double blocks = 0;
        for (int i = 0; i < n; i++) blocks += in->profile.update_ms[i];
        printf("update_ms: blocks %.3f  embed %.3f  head %.3f (once a step)\n", blocks,
               in->profile.embed.update_ms, in->profile.head.update_ms);
    }
    if (a->virtual_stages)
        printf("stages: %d x %d chunks  micro_batches: %d  schedule: %s  mem_cap: ",
               S / a->virtual_stages, a->virtual_stages, a->micro_batches,
               schedule_name(a->schedule));
    else
        printf("stages: %d  micro_batches: %d  schedule: %s  mem_cap: ", S,
               a->micro_batches, schedule_name(a->schedule));
    if (a->mem_cap > 0) printf("%lld\n", (long long)a->mem_cap);
    else printf("none\n");
    print_sharing(sharing, S);
    print_layout("reference", reference, S);
    printf("\n");
}

/* The layout bound, when a static method and partition-time ran: the
 * best static layout's predicted step over the optimal partition's, what
 * a perfect balancer could buy (0: the method did not run or failed). */
static void print_bound(const double *step_ms)
{
    int best = step_ms[BALANCE_STATIC_UNIFORM] > 0 ? BALANCE_STATIC_UNIFORM : -1;
    if (step_ms[BALANCE_STATIC_PARAMS] > 0 &&
        (best < 0 || step_ms[BALANCE_STATIC_PARAMS] < step_ms[best]))
        best = BALANCE_STATIC_PARAMS;
    double optimal = step_ms[BALANCE_PARTITION_TIME];
    if (best < 0 || !(optimal > 0)) return;
    printf("bound: %.3fx (best static %s %.3f ms / partition-time %.3f ms)\n",
           step_ms[best] / optimal, plan_method_name(best), step_ms[best], optimal);
}

int cmd_plan(int argc, char **argv)
{
    struct plan_args a;
    int bench = 0;
    plan_parse_args(&a, argc, argv, &bench);
    if (bench) return plan_bench(argc, argv);

    struct plan_input in;
    struct plan_sharing sharing;
    memset(&sharing, 0, sizeof sharing);
    int sharing_given = a.cores > 0 || a.stage_groups_text;
    char source[1300];
    load_input(&in, &a, &sharing, sharing_given, source, sizeof source);
    const char *unit = a.units == BALANCE_UNITS_SUBLAYER ? "units" : "blocks";
    if (a.units == BALANCE_UNITS_SUBLAYER && in.blocks % 2)
        dm_user_error("--units sublayer: %s has %d unit rows, but a block is two units "
                      "(its attention, then its MLP): an even count", a.costs_path,
                      in.blocks);
    if (in.blocks < a.stages && a.virtual_stages)
        dm_user_error("--virtual: %d stages x %d chunks but %s has only %d %s; every "
                      "chunk needs at least one", a.stages / a.virtual_stages,
                      a.virtual_stages, a.costs_path, in.blocks, unit);
    if (in.blocks < a.stages)
        dm_user_error("--stages: %d stages but %s has only %d %s; every stage "
                      "needs at least one", a.stages, a.costs_path, in.blocks, unit);
    in.profile.virtual_stages = a.virtual_stages;
    set_up_sharing(&in, &a, &sharing, sharing_given);
    int *reference = reference_layout(&in, &a);
    check_fits(&in, &a);
    print_input(&in, &a, &sharing, reference);

    int failures = 0, last_failure = 0, ran = 0;
    char err[512], last_err[512] = "";
    double step_ms[PLAN_METHOD_COUNT];
    for (int m = 0; m < PLAN_METHOD_COUNT; m++) {
        step_ms[m] = 0.0;
        if (!a.selected[m]) continue;
        ran++;
        if (run_method(&in, &a, m, reference, &step_ms[m], err, sizeof err)) {
            failures++;
            last_failure = m;
            memcpy(last_err, err, sizeof last_err);
        }
    }
    print_bound(step_ms);
    fflush(stdout);
    dm_free(reference);
    dm_free(a.current);
    dm_free(sharing.group);
    dm_free(sharing.cores);
    plan_input_free(&in);
    if (failures && (a.explicit_methods || failures == ran))
        dm_user_error("plan: method %s failed: %s", plan_method_name(last_failure),
                      last_err);
    return DM_EXIT_OK;
}
