/* Layouts and their costs: input checks, the one definition of a stage's
 * cost and memory (balance.h), the static-uniform baseline, the layouts
 * balance.initial names, and the diff of two layouts into a migration
 * plan. Pure: no I/O, no MPI, no model; bad
 * input is reported through an error value, never by aborting. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "balance_internal.h"

int balance_fail(int status, char *err, size_t errsize, const char *fmt, ...)
{
    if (err && errsize > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errsize, fmt, ap);
        va_end(ap);
    }
    return status;
}

void problem_init(struct balance_problem *p, const struct balance_costs *costs,
                  int stages, int64_t mem_cap)
{
    int n = costs->blocks;
    p->blocks = n;
    p->stages = stages;
    /* One allocation carved in two: (n+1) doubles then (n+1) int64s. */
    char *slab = dm_alloc((size_t)(n + 1) * (sizeof(double) + sizeof(int64_t)));
    p->prefix_cost = (double *)slab;
    p->prefix_mem = (int64_t *)(slab + (size_t)(n + 1) * sizeof(double));
    p->prefix_cost[0] = 0.0;
    p->prefix_mem[0] = 0;
    for (int i = 0; i < n; i++) {
        p->prefix_cost[i + 1] = p->prefix_cost[i] + costs->cost[i];
        p->prefix_mem[i + 1] = p->prefix_mem[i] + costs->mem_bytes[i];
    }
    p->first_cost = costs->first_cost;
    p->last_cost = costs->last_cost;
    p->first_mem = costs->first_mem_bytes;
    p->last_mem = costs->last_mem_bytes;
    p->mem_cap = mem_cap > 0 ? mem_cap : INT64_MAX;
}

void problem_free(struct balance_problem *p)
{
    dm_free(p->prefix_cost);
    p->prefix_cost = NULL;
    p->prefix_mem = NULL;
}

void balance_end_stage_extras(const double *fwd_ms, const double *bwd_ms,
                              const double *update_ms, const int *counts,
                              int stages, int micro_batches,
                              const double busy[2], const double update[2],
                              struct balance_extra *embed,
                              struct balance_extra *head)
{
    double blocks[2] = {0, 0}, updates[2] = {0, 0};
    int first_end = counts[0], last_begin = 0;
    for (int s = 0; s + 1 < stages; s++) last_begin += counts[s];
    for (int i = 0; i < first_end; i++) {
        blocks[0] += fwd_ms[i] + bwd_ms[i];
        updates[0] += update_ms ? update_ms[i] : 0.0;
    }
    for (int i = last_begin; i < last_begin + counts[stages - 1]; i++) {
        blocks[1] += fwd_ms[i] + bwd_ms[i];
        updates[1] += update_ms ? update_ms[i] : 0.0;
    }
    double per_mb[2], once[2];
    for (int k = 0; k < 2; k++) {
        per_mb[k] = (busy[k] - update[k]) / micro_batches - blocks[k];
        once[k] = update[k] - updates[k];
    }
    if (stages == 1) {
        per_mb[0] = per_mb[1] = 0.5 * per_mb[0];
        once[0] = once[1] = 0.5 * once[0];
    }
    struct balance_extra *out[2] = {embed, head};
    for (int k = 0; k < 2; k++) {
        double e = per_mb[k] > 0 ? per_mb[k] : 0.0;
        out[k]->fwd_ms = e / 3;
        out[k]->bwd_ms = 2 * e / 3;
        out[k]->update_ms = once[k] > 0 ? once[k] : 0.0;
    }
}

void balance_chunk_stage_times(const double *fwd_ms, const double *bwd_ms,
                               const double *update_ms, const int *chunks, int stages,
                               int virtual_stages, int micro_batches,
                               const double *stage_compute_ms,
                               const double *stage_update_ms, double *vcompute,
                               double *vupdate)
{
    int V = stages * virtual_stages;
    for (int vs = 0; vs < V; vs++) {
        int s = vs % stages, first = 0;
        double blocks = 0.0, updates = 0.0;
        for (int other = 0; other < V; other++) {
            if (other % stages == s && other != vs)
                for (int u = first; u < first + chunks[other]; u++) {
                    blocks += fwd_ms[u] + bwd_ms[u];
                    updates += update_ms[u];
                }
            first += chunks[other];
        }
        vcompute[vs] = stage_compute_ms[s] - micro_batches * blocks - updates;
        vupdate[vs] = stage_update_ms[s] - updates;
    }
}

void balance_costs_from_profile(struct balance_costs *costs,
                                const struct balance_profile *profile,
                                enum balance_cost_kind kind, double *cost)
{
    int n = profile->blocks;
    int time = kind == BALANCE_COST_TIME;
    for (int i = 0; i < n; i++)
        cost[i] = time ? profile->fwd_ms[i] + profile->bwd_ms[i]
                       : profile->params[i];
    costs->blocks = n;
    costs->cost = cost;
    costs->mem_bytes = profile->mem_bytes;
    costs->first_cost = time ? profile->embed.fwd_ms + profile->embed.bwd_ms
                             : profile->embed.params;
    costs->last_cost = time ? profile->head.fwd_ms + profile->head.bwd_ms
                            : profile->head.params;
    costs->first_mem_bytes = profile->embed.mem_bytes;
    costs->last_mem_bytes = profile->head.mem_bytes;
}

/* Total memory may not come near int64 overflow: stage sums add extras. */
#define MEM_TOTAL_LIMIT ((int64_t)1 << 61)

static int check_value(const char *what, int index, double cost,
                       int64_t mem, char *err, size_t errsize)
{
    char name[48];
    if (index >= 0) snprintf(name, sizeof name, "block %d", index);
    else snprintf(name, sizeof name, "%s", what);
    if (!isfinite(cost))
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%s: cost %g is not a finite number", name, cost);
    if (cost < 0)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%s: cost %g is negative", name, cost);
    if (mem < 0)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%s: mem_bytes %lld is negative", name,
                            (long long)mem);
    if (mem > MEM_TOTAL_LIMIT)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%s: mem_bytes %lld is beyond 2^61", name,
                            (long long)mem);
    return BALANCE_OK;
}

/* Every value, and the running totals of costs and memory (they must stay
 * finite and away from int64 overflow); *total is every block's memory
 * with the extras'. */
static int check_values(const struct balance_costs *costs, int64_t *total,
                        char *err, size_t errsize)
{
    int rc = check_value("embedding", -1, costs->first_cost,
                         costs->first_mem_bytes, err, errsize);
    if (rc) return rc;
    rc = check_value("head", -1, costs->last_cost, costs->last_mem_bytes,
                     err, errsize);
    if (rc) return rc;
    *total = costs->first_mem_bytes + costs->last_mem_bytes;
    double total_cost = costs->first_cost + costs->last_cost;
    for (int i = 0; i < costs->blocks; i++) {
        rc = check_value(NULL, i, costs->cost[i], costs->mem_bytes[i], err,
                         errsize);
        if (rc) return rc;
        /* Stage costs are differences of running sums: they must stay finite. */
        total_cost += costs->cost[i];
        if (!isfinite(total_cost))
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "block %d: the running total of costs overflows "
                                "a double", i);
        *total += costs->mem_bytes[i];
        if (*total > MEM_TOTAL_LIMIT)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "block %d: total mem_bytes so far is beyond "
                                "2^61", i);
    }
    return BALANCE_OK;
}

/* Under a cap (> 0) on more than one stage: every block, and each end
 * stage's block with its extra, fits a stage. */
static int check_pieces_fit(const struct balance_costs *costs, int stages,
                            int64_t mem_cap, char *err, size_t errsize)
{
    int n = costs->blocks;
    long long cap = (long long)mem_cap;
    for (int i = 0; i < n; i++)
        if (costs->mem_bytes[i] > mem_cap)
            return balance_fail(BALANCE_INFEASIBLE, err, errsize,
                                "block %d needs %lld bytes, more than the "
                                "stage capacity of %lld bytes", i,
                                (long long)costs->mem_bytes[i], cap);
    int64_t first = costs->first_mem_bytes + costs->mem_bytes[0];
    if (first > mem_cap)
        return balance_fail(BALANCE_INFEASIBLE, err, errsize,
                            "stage 0 needs %lld bytes for the embedding and "
                            "block 0, more than the stage capacity of %lld "
                            "bytes", (long long)first, cap);
    int64_t last = costs->last_mem_bytes + costs->mem_bytes[n - 1];
    if (last > mem_cap)
        return balance_fail(BALANCE_INFEASIBLE, err, errsize,
                            "stage %d (the last) needs %lld bytes for block "
                            "%d and the head, more than the stage capacity "
                            "of %lld bytes", stages - 1, (long long)last,
                            n - 1, cap);
    return BALANCE_OK;
}

/* Every piece fits somewhere; do they fit in `stages` stages? If not,
 * name the stage count that would do (feasibility grows with stages and
 * holds at n stages, one block each, by check_pieces_fit). */
static int check_stages_fit(const struct balance_costs *costs, int stages,
                            int64_t mem_cap, char *err, size_t errsize)
{
    struct balance_problem p;
    problem_init(&p, costs, stages, mem_cap);
    int rc = BALANCE_OK;
    if (!problem_fits(&p, INFINITY)) {
        int lo = stages + 1, hi = costs->blocks;
        while (lo < hi) {
            p.stages = lo + (hi - lo) / 2;
            if (problem_fits(&p, INFINITY)) hi = p.stages;
            else lo = p.stages + 1;
        }
        rc = balance_fail(BALANCE_INFEASIBLE, err, errsize,
                          "the blocks need at least %d stages of %lld bytes "
                          "each; %d given", lo, (long long)mem_cap, stages);
    }
    problem_free(&p);
    return rc;
}

int balance_check_costs(const struct balance_costs *costs, int stages,
                        int64_t mem_cap, char *err, size_t errsize)
{
    int n = costs->blocks;
    if (stages < 1)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "stages must be at least 1 (got %d)", stages);
    if (n < 1 || !costs->cost || !costs->mem_bytes)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "no blocks to lay out");
    if (n < stages)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%d blocks cannot fill %d stages: every stage "
                            "needs at least one block", n, stages);
    if (mem_cap < 0)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "mem_cap %lld is negative (0 means no cap)",
                            (long long)mem_cap);
    int64_t total;
    int rc = check_values(costs, &total, err, errsize);
    if (rc) return rc;
    if (mem_cap == 0) return BALANCE_OK;
    if (stages == 1) {
        if (total > mem_cap)
            return balance_fail(BALANCE_INFEASIBLE, err, errsize,
                                "stage 0 needs %lld bytes (every block, the "
                                "embedding and the head), more than the "
                                "capacity of %lld bytes", (long long)total,
                                (long long)mem_cap);
        return BALANCE_OK;
    }
    rc = check_pieces_fit(costs, stages, mem_cap, err, errsize);
    if (rc) return rc;
    return check_stages_fit(costs, stages, mem_cap, err, errsize);
}

int balance_check_layout(const int *counts, int stages, int blocks,
                         char *err, size_t errsize)
{
    if (stages < 1 || !counts)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "a layout needs at least one stage (got %d)",
                            stages);
    long long sum = 0;
    for (int s = 0; s < stages; s++) {
        if (counts[s] < 1)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "layout stage %d has %d blocks; every stage "
                                "needs at least one", s, counts[s]);
        sum += counts[s];
    }
    if (sum != blocks)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "layout covers %lld blocks but there are %d",
                            sum, blocks);
    return BALANCE_OK;
}

double balance_stage_cost(const struct balance_costs *costs, int stages,
                          int stage, int begin, int end)
{
    /* The same running sum as problem_init, stopped at end. */
    double prefix = 0.0, prefix_begin = 0.0;
    for (int i = 0; i < end; i++) {
        if (i == begin) prefix_begin = prefix;
        prefix = prefix + costs->cost[i];
    }
    if (begin == end) prefix_begin = prefix;
    double c = prefix - prefix_begin;
    if (stage == 0) c = costs->first_cost + c;
    if (stage == stages - 1) c = c + costs->last_cost;
    return c;
}

int64_t balance_stage_mem(const struct balance_costs *costs, int stages,
                          int stage, int begin, int end)
{
    int64_t m = 0;
    for (int i = begin; i < end; i++) m += costs->mem_bytes[i];
    if (stage == 0) m += costs->first_mem_bytes;
    if (stage == stages - 1) m += costs->last_mem_bytes;
    return m;
}

void balance_layout_max(const struct balance_costs *costs, int stages,
                        const int *counts, double *max_cost,
                        int64_t *max_mem_bytes)
{
    struct balance_problem p;
    problem_init(&p, costs, stages, 0);
    double worst = 0.0;
    int64_t worst_mem = 0;
    int begin = 0;
    for (int s = 0; s < stages; s++) {
        int end = begin + counts[s];
        double c = problem_stage_cost(&p, s, begin, end);
        int64_t m = problem_stage_mem(&p, s, begin, end);
        if (s == 0 || c > worst) worst = c;
        if (m > worst_mem) worst_mem = m;
        begin = end;
    }
    problem_free(&p);
    if (max_cost) *max_cost = worst;
    if (max_mem_bytes) *max_mem_bytes = worst_mem;
}

void problem_describe(const struct balance_problem *p, const int *counts,
                      const int *reference, int reference_stages,
                      struct balance_result *res)
{
    if (!res) return;
    double worst = 0.0;
    int64_t worst_mem = 0, moved_bytes = 0;
    int moved_blocks = 0;
    int begin = 0;
    int ref_stage = 0, ref_end = reference ? reference[0] : p->blocks;
    for (int s = 0; s < p->stages; s++) {
        int end = begin + counts[s];
        double c = problem_stage_cost(p, s, begin, end);
        int64_t m = problem_stage_mem(p, s, begin, end);
        if (s == 0 || c > worst) worst = c;
        if (m > worst_mem) worst_mem = m;
        for (int i = begin; i < end; i++) {
            while (reference && i >= ref_end && ref_stage < reference_stages - 1)
                ref_end += reference[++ref_stage];
            if (reference && ref_stage != s) {
                moved_bytes += p->prefix_mem[i + 1] - p->prefix_mem[i];
                moved_blocks++;
            }
        }
        begin = end;
    }
    res->max_stage_cost = worst;
    res->max_stage_mem_bytes = worst_mem;
    res->bytes_moved = moved_bytes;
    res->blocks_moved = moved_blocks;
    res->stages = p->stages;
}

int balance_static_uniform(int blocks, int stages, int *counts,
                           char *err, size_t errsize)
{
    if (stages < 1)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "stages must be at least 1 (got %d)", stages);
    if (blocks < stages)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%d blocks cannot fill %d stages: every stage "
                            "needs at least one block", blocks, stages);
    int per_stage = blocks / stages, remainder = blocks % stages;
    for (int s = 0; s < stages; s++)
        counts[s] = per_stage + (s < remainder ? 1 : 0);
    return BALANCE_OK;
}

int balance_current_or_uniform(const int *current, int stages, int blocks,
                               int *out, char *err, size_t errsize)
{
    if (!current) return balance_static_uniform(blocks, stages, out, err, errsize);
    int rc = balance_check_layout(current, stages, blocks, err, errsize);
    if (rc) return rc;
    memcpy(out, current, (size_t)stages * sizeof *out);
    return BALANCE_OK;
}

int layout_check_cap(const struct balance_costs *costs, const int *counts, int stages,
                     int64_t mem_cap, const char *whose, const char *remedy, char *err,
                     size_t errsize)
{
    if (mem_cap <= 0) return BALANCE_OK;
    int begin = 0;
    for (int s = 0; s < stages; s++) {
        int64_t mem = balance_stage_mem(costs, stages, s, begin, begin + counts[s]);
        if (mem > mem_cap)
            return balance_fail(BALANCE_INFEASIBLE, err, errsize,
                                "stage %d of the %s layout holds %lld bytes, more than the "
                                "capacity of %lld bytes%s%s", s, whose, (long long)mem,
                                (long long)mem_cap, remedy ? "; " : "", remedy ? remedy : "");
        begin += counts[s];
    }
    return BALANCE_OK;
}

int balance_migration_plan(const int64_t *mem_bytes, int blocks,
                           int64_t head_mem_bytes, const int *from,
                           int from_stages, const int *to, int to_stages,
                           struct balance_move *moves, int *move_count,
                           int64_t *total_bytes, char *err, size_t errsize)
{
    int rc = balance_check_layout(from, from_stages, blocks, err, errsize);
    if (rc) return rc;
    rc = balance_check_layout(to, to_stages, blocks, err, errsize);
    if (rc) return rc;
    int count = 0;
    int64_t bytes = 0;
    int from_stage = 0, from_end = from[0];
    int to_stage = 0, to_end = to[0];
    for (int i = 0; i < blocks; i++) {
        while (i >= from_end) from_end += from[++from_stage];
        while (i >= to_end) to_end += to[++to_stage];
        if (from_stage != to_stage) {
            moves[count++] = (struct balance_move){
                .block = i, .src_stage = from_stage, .dst_stage = to_stage,
                .bytes = mem_bytes[i]};
            bytes += mem_bytes[i];
        }
    }
    if (from_stages != to_stages) {
        moves[count++] = (struct balance_move){
            .block = BALANCE_HEAD_BLOCK, .src_stage = from_stages - 1,
            .dst_stage = to_stages - 1, .bytes = head_mem_bytes};
        bytes += head_mem_bytes;
    }
    if (move_count) *move_count = count;
    if (total_bytes) *total_bytes = bytes;
    return BALANCE_OK;
}

double balance_migration_cost_ms(const double *bytes, const double *ms, int n,
                                 double at_bytes)
{
    if (n <= 0) return 0.0;
    double mx = 0, my = 0;
    for (int i = 0; i < n; i++) {
        mx += bytes[i];
        my += ms[i];
    }
    mx /= n;
    my /= n;
    double sxx = 0, sxy = 0, xx = 0, xy = 0;
    for (int i = 0; i < n; i++) {
        sxx += (bytes[i] - mx) * (bytes[i] - mx);
        sxy += (bytes[i] - mx) * (ms[i] - my);
        xx += bytes[i] * bytes[i];
        xy += bytes[i] * ms[i];
    }
    double slope = sxx > 0 ? sxy / sxx : 0.0, intercept = my - slope * mx;
    if (slope < 0) {
        slope = 0;
        intercept = my;
    }
    if (intercept < 0) {
        intercept = 0;
        slope = xy / xx;
    }
    return intercept + slope * at_bytes;
}

void layout_format(char *buf, size_t size, const int *counts, int stages)
{
    size_t used = 0;
    buf[0] = 0;
    for (int s = 0; s < stages; s++)
        used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s%d",
                                 s ? "," : "", counts[s]);
}

/* ---- units of placement ---------------------------------------------------- */

static const char *const units_names[] = {"block", "sublayer"};

const char *balance_units_name(enum balance_units units)
{
    return (int)units >= 0 && (int)units < 2 ? units_names[units] : NULL;
}

int balance_units_parse(const char *name)
{
    for (int u = 0; u < 2; u++)
        if (!strcmp(name, units_names[u])) return u;
    return -1;
}

int balance_units_per_block(enum balance_units units)
{
    return units == BALANCE_UNITS_SUBLAYER ? 2 : 1;
}

/* Sublayer boundaries to block boundaries: boundary s (the first unit of
 * stage s + 1) at an even unit stays, at an odd one (inside block j) it
 * goes before j, or after j when the stage before would have no block.
 * Taking the smallest allowed boundary each time leaves the most room to
 * the stages after, so when this fails no choice maps. */
static int sublayer_to_blocks(const int *from, int stages, int blocks, int *to, char *err,
                              size_t errsize)
{
    int unit = 0, previous = 0;
    for (int s = 0; s + 1 < stages; s++) {
        unit += from[s];
        int boundary = unit / 2;
        if (boundary <= previous && unit % 2) boundary = unit / 2 + 1;
        if (boundary <= previous || boundary > blocks - (stages - 1 - s)) {
            char text[256];
            layout_format(text, sizeof text, from, stages);
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "the sublayer layout %s cannot map to whole blocks: stage %d "
                                "would hold no block of the %d", text,
                                boundary <= previous ? s : s + 1, blocks);
        }
        to[s] = boundary - previous;
        previous = boundary;
    }
    to[stages - 1] = blocks - previous;   /* >= 1: the last boundary left it room */
    return BALANCE_OK;
}

int balance_layout_convert(const int *from, enum balance_units from_units, int stages,
                           int blocks, enum balance_units to_units, int *to, char *err,
                           size_t errsize)
{
    char why[256];
    int from_count = blocks * balance_units_per_block(from_units);
    if (balance_check_layout(from, stages, from_count, why, sizeof why) != BALANCE_OK)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize, "a layout of %d %s units: %s",
                            from_count, balance_units_name(from_units), why);
    if (from_units == to_units) {
        memcpy(to, from, (size_t)stages * sizeof(int));
        return BALANCE_OK;
    }
    if (to_units == BALANCE_UNITS_SUBLAYER) {
        for (int s = 0; s < stages; s++) to[s] = 2 * from[s];
        return BALANCE_OK;
    }
    return sublayer_to_blocks(from, stages, blocks, to, err, errsize);
}

int balance_layout_nearest_blocks(const int *from, int stages, int blocks, int *to, char *err,
                                  size_t errsize)
{
    char why[256];
    if (balance_check_layout(from, stages, 2 * blocks, why, sizeof why) != BALANCE_OK)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize, "a layout of %d sublayer units: %s",
                            2 * blocks, why);
    if (stages > blocks)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%d stages cannot each hold one of %d whole blocks", stages, blocks);
    /* sublayer_to_blocks' boundary (the block's start, or its end when
     * that empties the stage before), then held between the boundary
     * before and the room the stages after need. */
    int unit = 0, previous = 0;
    for (int s = 0; s + 1 < stages; s++) {
        unit += from[s];
        int boundary = unit / 2;
        if (boundary <= previous) boundary = previous + 1;
        if (boundary > blocks - (stages - 1 - s)) boundary = blocks - (stages - 1 - s);
        to[s] = boundary - previous;
        previous = boundary;
    }
    to[stages - 1] = blocks - previous;
    return BALANCE_OK;
}

/* "explicit:n1,n2,...": every count an integer in [1, units], as many
 * as stages, summing to the units (per_block of each of `blocks`). */
static int explicit_layout(const char *spec, int stages, int blocks, int per_block,
                           int *counts, char *err, size_t errsize)
{
    const char *p = spec + strlen("explicit:");
    const char *unit = per_block == 1 ? "blocks" : "units";
    int units = blocks * per_block, n = 0;
    char limit[96];
    if (per_block == 1)
        snprintf(limit, sizeof limit, "model.layers = %d", blocks);
    else
        snprintf(limit, sizeof limit, "the %d units of model.layers = %d with balance.units = "
                 "sublayer", units, blocks);
    long sum = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ','))
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "balance.initial = '%s': expected explicit:n1,n2,... with "
                                "integers", spec);
        if (v < 1)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "balance.initial = '%s': stage %d has %ld %s; every "
                                "stage needs at least one", spec, n, v, unit);
        if (errno == ERANGE || v > units)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "balance.initial = '%s': stage %d has %.*s %s, more than "
                                "%s", spec, n, (int)(end - p), p, unit, limit);
        if (n < stages) counts[n] = (int)v;
        n++;
        sum += v;
        p = *end ? end + 1 : end;
    }
    if (n != stages)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "balance.initial = '%s' lists %d stages but parallel.pp = %d", spec,
                            n, stages);
    if (sum != units)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "balance.initial = '%s' covers %ld %s but %s", spec, sum, unit,
                            limit);
    return BALANCE_OK;
}

int balance_layout_from_spec(const char *spec, int stages, int blocks, enum balance_units units,
                             const struct balance_costs *params, int *counts, char *err,
                             size_t errsize)
{
    char why[256];
    int per_block = balance_units_per_block(units), count = blocks * per_block;
    if (stages > count) {
        if (per_block == 1)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "parallel.pp = %d exceeds model.layers = %d: every stage needs "
                                "a block", stages, blocks);
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "parallel.pp = %d exceeds the %d units of model.layers = %d with "
                            "balance.units = sublayer: every stage needs a unit", stages, count,
                            blocks);
    }
    if (!strcmp(spec, "uniform")) {
        if (balance_static_uniform(count, stages, counts, why, sizeof why) != BALANCE_OK)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize, "balance.initial = uniform: %s",
                                why);
        return BALANCE_OK;
    }
    if (!strcmp(spec, "params")) {
        struct balance_result res;
        if (balance_partition(params, stages, 0, NULL, 0, counts, &res, why, sizeof why) !=
            BALANCE_OK)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize, "balance.initial = params: %s",
                                why);
        return BALANCE_OK;
    }
    if (!strncmp(spec, "explicit:", strlen("explicit:")))
        return explicit_layout(spec, stages, blocks, per_block, counts, err, errsize);
    return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                        "balance.initial = '%s' must be uniform, params or explicit:n1,n2,...",
                        spec);
}
