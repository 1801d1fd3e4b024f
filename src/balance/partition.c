/* The exact memory-capped min-max partition, and among its optima the layout
 * that moves the fewest bytes (balance.h, balance_partition).
 *
 * Two phases. (1) The optimum B* is the smallest double B for which the
 * greedy probe packs every block into the stages with each stage's cost
 * <= B and memory <= the cap. Stage cost is monotone under inclusion (the
 * prefix-difference definition in balance.h, with non-negative costs), so
 * the probe is exact and feasibility is monotone in B; we bisect over
 * the ordinals of doubles and snap each bracket end to a value the probe proves (an achieved
 * cost above, the next cost that could change the greedy below), so B* comes
 * out bit-exact in a few dozen O(S log n) probes. (2) Among layouts with
 * every stage cost <= B*, a dynamic program over boundary positions
 * maximises the bytes (then blocks) kept in place. Only positions between
 * the backward and forward greedy packings at B* can be boundaries, and for
 * each stage the kept bytes split the predecessor window into three pieces
 * whose maxima slide monotonically, so the DP is linear in the total width
 * of those ranges.
 *
 * Must not: allocate per probe, print, or accept unchecked input. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "balance_internal.h"

/* ---- phase 1: the greedy probe and the search for B* ------------------- */

/* The largest end in [begin, n] such that stage `stage` owning [begin, end)
 * fits bound (begin itself when not even one block fits). Galloping then
 * bisection: O(log(end - begin)). */
static int extend_right(const struct balance_problem *p, int stage, int begin,
                        double bound)
{
    int n = p->blocks;
    int good = begin, step = 1;
    while (begin + step <= n && problem_stage_fits(p, stage, begin, begin + step, bound)) {
        good = begin + step;
        step *= 2;
    }
    int bad = begin + step <= n ? begin + step : n + 1;
    while (bad - good > 1) {
        int mid = good + (bad - good) / 2;
        if (problem_stage_fits(p, stage, begin, mid, bound)) good = mid;
        else bad = mid;
    }
    return good;
}

/* The smallest begin in [0, end] such that stage owning [begin, end) fits
 * (end itself when not even one block fits). */
static int extend_left(const struct balance_problem *p, int stage, int end,
                       double bound)
{
    int good = end, step = 1;
    while (end - step >= 0 && problem_stage_fits(p, stage, end - step, end, bound)) {
        good = end - step;
        step *= 2;
    }
    int bad = end - step >= 0 ? end - step : -1;
    while (good - bad > 1) {
        int mid = bad + (good - bad) / 2;
        if (problem_stage_fits(p, stage, mid, end, bound)) good = mid;
        else bad = mid;
    }
    return good;
}

struct probe {
    int feasible;
    double achieved;  /* feasible: a layout exists with max cost <= this <= bound */
    double next;      /* infeasible: no bound below this is feasible (> bound) */
};

/* Greedy probe. Stages 0..S-2 each take as many blocks as fit (they never
 * carry the head); the last stage takes, from the right, as many as fit
 * with the head. Feasible iff the last stage can start at some position the
 * first S-1 stages reach, leaving every stage a block (pieces can always be
 * split: splitting never raises a stage's cost or memory). */
static struct probe probe(const struct balance_problem *p, double bound)
{
    int n = p->blocks, S = p->stages;
    struct probe out = {0, 0.0, INFINITY};
    if (S == 1) {
        double c = problem_stage_cost(p, 0, 0, n);
        int mem_ok = problem_stage_mem(p, 0, 0, n) <= p->mem_cap;
        out.feasible = mem_ok && c <= bound;
        out.achieved = c;
        out.next = mem_ok ? c : INFINITY;
        return out;
    }
    double worst = 0.0, next = INFINITY;
    int reach = 0;
    for (int s = 0; s < S - 1 && reach < n; s++) {
        int end = extend_right(p, s, reach, bound);
        if (end == reach) {  /* not even one block fits: stuck */
            if (problem_stage_mem(p, s, reach, reach + 1) <= p->mem_cap)
                next = fmin(next, problem_stage_cost(p, s, reach, reach + 1));
            break;
        }
        worst = fmax(worst, problem_stage_cost(p, s, reach, end));
        if (end < n && problem_stage_mem(p, s, reach, end + 1) <= p->mem_cap)
            next = fmin(next, problem_stage_cost(p, s, reach, end + 1));
        reach = end;
    }
    int last_begin = extend_left(p, S - 1, n, bound);
    if (last_begin > 0 &&
        problem_stage_mem(p, S - 1, last_begin - 1, n) <= p->mem_cap)
        next = fmin(next, problem_stage_cost(p, S - 1, last_begin - 1, n));
    int start = last_begin > S - 1 ? last_begin : S - 1;
    int limit = reach < n - 1 ? reach : n - 1;
    if (last_begin < n && start <= limit) {
        out.feasible = 1;
        out.achieved = fmax(worst, problem_stage_cost(p, S - 1, start, n));
    } else {
        out.next = next;
    }
    return out;
}

int problem_fits(const struct balance_problem *p, double bound)
{
    return probe(p, bound).feasible;
}

int balance_fits(const struct balance_costs *costs, int stages,
                 int64_t mem_cap, double bound)
{
    struct balance_problem p;
    problem_init(&p, costs, stages, mem_cap);
    int fits = problem_fits(&p, bound);
    problem_free(&p);
    return fits;
}

/* B*: the smallest double bound that the probe accepts. Requires the
 * problem to be feasible at +inf. */
double problem_optimal_bound(const struct balance_problem *p)
{
    int n = p->blocks, S = p->stages;
    struct probe top = probe(p, INFINITY);
    DM_ASSERT(top.feasible);
    double high = top.achieved;
    if (S == 1) return high;
    /* Rigorous lower bounds: stage 0 holds block 0 with the embedding, the
     * last stage block n-1 with the head, and every block is in some stage. */
    double low = fmax(problem_stage_cost(p, 0, 0, 1),
                      problem_stage_cost(p, S - 1, n - 1, n));
    for (int i = 0; i < n; i++)
        low = fmax(low, p->prefix_cost[i + 1] - p->prefix_cost[i]);
    /* The first guess is the perfectly balanced cost (not a proven bound,
     * so it is only probed, never assumed). */
    double guess = ((p->first_cost + p->prefix_cost[n]) + p->last_cost) / S;
    int first = 1;
    while (low < high) {
        /* Bisect the ordinal of the double, not its value: non-negative
         * doubles order like their bit patterns, so this takes at most 64
         * probes whatever the spread of the costs. */
        uint64_t low_bits, high_bits;
        memcpy(&low_bits, &low, sizeof low);
        memcpy(&high_bits, &high, sizeof high);
        uint64_t mid_bits = low_bits + (high_bits - low_bits) / 2;
        double mid;
        memcpy(&mid, &mid_bits, sizeof mid);
        if (first && guess > low && guess < high) mid = guess;
        first = 0;
        struct probe r = probe(p, mid);
        if (r.feasible) {
            high = r.achieved;
        } else {
            DM_ASSERT(r.next > mid && r.next <= high);
            low = r.next;
        }
    }
    return high;
}

/* ---- phase 2: least movement among the optima --------------------------- */

/* What a layout keeps in place: bytes first, then blocks. Ordered
 * lexicographically; the order is compatible with addition. */
struct kept {
    int64_t bytes;
    int64_t blocks;
};

static inline int kept_less(struct kept x, struct kept y)
{
    return x.bytes < y.bytes || (x.bytes == y.bytes && x.blocks < y.blocks);
}

static inline struct kept kept_add(struct kept x, struct kept y)
{
    return (struct kept){x.bytes + y.bytes, x.blocks + y.blocks};
}

#define KEPT_INVALID ((struct kept){-1, 0})

/* A window maximum over increasing positions: positions enter at the back
 * in increasing order and leave at the front; values are kept
 * non-increasing, and an equal value never evicts an earlier position, so
 * the front is the earliest maximiser. */
struct deque {
    int *pos;         /* (capacity) */
    struct kept *val; /* (capacity) */
    int head, tail;
};

static inline void deque_push(struct deque *d, int pos, struct kept val)
{
    while (d->tail > d->head && kept_less(d->val[d->tail - 1], val)) d->tail--;
    d->pos[d->tail] = pos;
    d->val[d->tail] = val;
    d->tail++;
}

static inline void deque_drop_before(struct deque *d, int pos)
{
    while (d->tail > d->head && d->pos[d->head] < pos) d->head++;
}

/* The reference layout's first block of stage s; stages past its end own
 * nothing (their range is [n, n)). */
static int reference_start(const int *ref_start, int reference_stages, int n,
                           int s)
{
    return s <= reference_stages ? ref_start[s] : n;
}

/* The dynamic program's memory, carved for one least_movement call. */
struct movement_dp {
    /* from[offset[j] + b - low[j]]: the chosen start of stage j-1 when it
     * ends at b. Every entry is written before it is read. */
    int *from;                          /* (states) */
    size_t *offset;                     /* (S + 1) */
    struct kept *best_prev, *best_next; /* (widest): by boundary position */
    struct deque pieces[3];
    int *deque_pos;                     /* (3, widest) */
    struct kept *deque_val;             /* (3, widest) */
};

/* Sizes and allocates dp for the ranges [low[j], high[j]]; 0 (nothing
 * allocated) when some range is empty. */
static int movement_dp_alloc(struct movement_dp *dp, int S, const int *low,
                             const int *high)
{
    size_t states = 0;
    int widest = 1;
    for (int j = 0; j <= S; j++) {
        if (low[j] > high[j]) return 0;
        int width = high[j] - low[j] + 1;
        states += (size_t)width;
        if (width > widest) widest = width;
    }
    dp->from = malloc(states * sizeof(int));
    if (!dp->from) DM_FATAL("out of memory (%zu boundary states)", states);
    dp->offset = dm_alloc((size_t)(S + 1) * sizeof(size_t));
    for (int j = 1; j <= S; j++)
        dp->offset[j] = dp->offset[j - 1] + (size_t)(high[j - 1] - low[j - 1] + 1);
    dp->best_prev = dm_alloc((size_t)widest * sizeof(struct kept));
    dp->best_next = dm_alloc((size_t)widest * sizeof(struct kept));
    dp->deque_pos = dm_alloc(3 * (size_t)widest * sizeof(int));
    dp->deque_val = dm_alloc(3 * (size_t)widest * sizeof(struct kept));
    for (int k = 0; k < 3; k++) {
        dp->pieces[k].pos = dp->deque_pos + (size_t)k * (size_t)widest;
        dp->pieces[k].val = dp->deque_val + (size_t)k * (size_t)widest;
    }
    dp->best_prev[0] = (struct kept){0, 0};
    return 1;
}

static void movement_dp_free(struct movement_dp *dp)
{
    dm_free(dp->deque_val);
    dm_free(dp->deque_pos);
    dm_free(dp->best_next);
    dm_free(dp->best_prev);
    dm_free(dp->offset);
    free(dp->from);
}

/* Enters the predecessors a = *next_push..last_pred (boundary-j positions
 * from low_j) into the deque of their piece against the reference's stage
 * [s, e); a predecessor no layout reaches is left out. */
static void push_predecessors(struct movement_dp *dp, const int64_t *pm, int low_j,
                              int *next_push, int last_pred, int s, int e)
{
    for (; *next_push <= last_pred; (*next_push)++) {
        int a = *next_push;
        struct kept f = dp->best_prev[a - low_j];
        if (f.bytes < 0) continue;
        if (a <= s) {
            deque_push(&dp->pieces[0], a, f);
        } else if (a < e) {
            struct kept shifted = {f.bytes - pm[a], f.blocks - a};
            deque_push(&dp->pieces[1], a, shifted);
        } else {
            deque_push(&dp->pieces[2], a, f);
        }
    }
}

/* The best of the three pieces' fronts for a stage ending at b (b_in =
 * min(b, e)) and starting at first_fit or later: the most kept, then the
 * earliest start, in *best_from (-1 and KEPT_INVALID when none fits). */
static struct kept best_predecessor(struct movement_dp *dp, const int64_t *pm,
                                    int first_fit, int b_in, int s, int *best_from)
{
    struct kept best = KEPT_INVALID;
    *best_from = -1;
    for (int k = 0; k < 3; k++) {
        deque_drop_before(&dp->pieces[k], first_fit);
        if (dp->pieces[k].tail == dp->pieces[k].head) continue;
        int a = dp->pieces[k].pos[dp->pieces[k].head];
        struct kept v = dp->pieces[k].val[dp->pieces[k].head];
        if (k == 0 && b_in > s)
            v = kept_add(v, (struct kept){pm[b_in] - pm[s], b_in - s});
        else if (k == 1)
            v = kept_add(v, (struct kept){pm[b_in], b_in});
        if (*best_from < 0 || kept_less(best, v) ||
            (!kept_less(v, best) && a < *best_from)) {
            best = v;
            *best_from = a;
        }
    }
    return best;
}

/* One step of the program: from the best kept for every end of stage j-1
 * (dp->best_prev), the best for every end of stage j (then swapped into
 * best_prev), and each end's chosen start in dp->from. */
static void movement_dp_stage(struct movement_dp *dp, const struct balance_problem *p,
                              double bound, const int *low, const int *high,
                              const int *ref_start, int reference_stages, int j)
{
    /* Stage j takes [a, b), a a boundary-j position, b a boundary-(j+1)
     * one. It keeps in place the part of [a, b) inside the reference's
     * stage j, [s, e). Split a by where it lies against [s, e):
     *   a <= s:     kept = [s, min(b,e))      independent of a
     *   s < a < e:  kept = [a, min(b,e))      = K(min(b,e)) - K(a)
     *   a >= e:     kept = nothing
     * Each piece's best predecessor is a sliding-window maximum. */
    int n = p->blocks;
    int s = reference_start(ref_start, reference_stages, n, j);
    int e = reference_start(ref_start, reference_stages, n, j + 1);
    if (s > e) s = e;
    for (int k = 0; k < 3; k++) dp->pieces[k].head = dp->pieces[k].tail = 0;
    int first_fit = low[j], next_push = low[j];
    for (int b = low[j + 1]; b <= high[j + 1]; b++) {
        int last_pred = high[j] < b - 1 ? high[j] : b - 1;
        while (first_fit <= last_pred && !problem_stage_fits(p, j, first_fit, b, bound))
            first_fit++;
        push_predecessors(dp, p->prefix_mem, low[j], &next_push, last_pred, s, e);
        int b_in = b < e ? b : e;
        int best_from;
        struct kept best = best_predecessor(dp, p->prefix_mem, first_fit, b_in, s,
                                            &best_from);
        dp->best_next[b - low[j + 1]] = best;
        dp->from[dp->offset[j + 1] + (size_t)(b - low[j + 1])] = best_from;
    }
    struct kept *swap = dp->best_prev;
    dp->best_prev = dp->best_next;
    dp->best_next = swap;
}

/* The least-movement layout among those with every stage within bound and
 * every boundary j inside [low[j], high[j]] (low[0] = high[0] = 0,
 * low[S] = high[S] = n). Returns 1 and fills counts and *kept, or 0 when no
 * such layout exists. Ties: the earliest last boundary, then the one before
 * it, and so on (each predecessor is the earliest maximiser). */
static int least_movement(const struct balance_problem *p, double bound,
                          const int *low, const int *high, const int *ref_start,
                          int reference_stages, int *counts, struct kept *kept)
{
    int n = p->blocks, S = p->stages;
    struct movement_dp dp;
    if (!movement_dp_alloc(&dp, S, low, high)) return 0;
    for (int j = 0; j < S; j++)
        movement_dp_stage(&dp, p, bound, low, high, ref_start, reference_stages, j);
    int found = dp.best_prev[0].bytes >= 0;
    if (found) {
        *kept = dp.best_prev[0];
        int end = n;
        for (int j = S; j >= 1; j--) {
            int start = dp.from[dp.offset[j] + (size_t)(end - low[j])];
            DM_ASSERT(start >= 0 && start < end);
            counts[j - 1] = end - start;
            end = start;
        }
        DM_ASSERT(end == 0);
    }
    movement_dp_free(&dp);
    return found;
}

/* Whether the reference layout (on S stages) keeps every stage within
 * bound. */
static int reference_within(const struct balance_problem *p, const int *reference,
                            double bound)
{
    int begin = 0, ok = 1;
    for (int s = 0; s < p->stages && ok; s++) {
        ok = problem_stage_fits(p, s, begin, begin + reference[s], bound);
        begin += reference[s];
    }
    return ok;
}

/* Boundary j (first block of stage j) of any layout within bound lies in
 * [low[j], high[j]]: no further right than j greedy stages reach, no
 * further left than the backward greedy, and leaving a block per stage. */
static void boundary_ranges(const struct balance_problem *p, double bound, int *low,
                            int *high)
{
    int n = p->blocks, S = p->stages;
    low[0] = high[0] = 0;
    low[S] = high[S] = n;
    int reach = 0;
    for (int j = 1; j < S; j++) {
        reach = extend_right(p, j - 1, reach, bound);
        high[j] = reach < n - (S - j) ? reach : n - (S - j);
    }
    int begin = n;
    for (int j = S - 1; j >= 1; j--) {
        begin = extend_left(p, j, begin, bound);
        low[j] = begin > j ? begin : j;
    }
    for (int j = 0; j <= S; j++) DM_ASSERT(low[j] <= high[j]);
}

/* The ranges cut to radius around the reference's boundaries into
 * window_low and window_high; *cheapest_outside is the least any layout
 * with a boundary outside the windows moves (the d + 1 blocks next to the
 * reference's boundary). Returns 1 when the windows are the whole ranges. */
static int radius_windows(const struct balance_problem *p, int radius, const int *low,
                          const int *high, const int *ref_start, int *window_low,
                          int *window_high, struct kept *cheapest_outside)
{
    int n = p->blocks, S = p->stages;
    int full = 1;
    *cheapest_outside = (struct kept){INT64_MAX, 0};
    for (int j = 0; j <= S; j++) {
        int r = j < S ? ref_start[j] : n;
        window_low[j] = low[j];
        window_high[j] = high[j];
        if (j == 0 || j == S || radius >= n) continue;
        if (r - radius > low[j]) {
            window_low[j] = r - radius;
            int64_t run = p->prefix_mem[r] - p->prefix_mem[r - radius - 1];
            if (run < cheapest_outside->bytes) cheapest_outside->bytes = run;
            full = 0;
        }
        if (r + radius < high[j]) {
            window_high[j] = r + radius;
            int64_t run = p->prefix_mem[r + radius + 1] - p->prefix_mem[r];
            if (run < cheapest_outside->bytes) cheapest_outside->bytes = run;
            full = 0;
        }
    }
    cheapest_outside->blocks = radius + 1;
    return full;
}

int partition_prepared(const struct balance_problem *p, const int *reference,
                       int reference_stages, int *counts,
                       struct balance_result *res)
{
    int n = p->blocks, S = p->stages;
    if (S == 1) {
        counts[0] = n;
        problem_describe(p, counts, reference, reference_stages, res);
        return BALANCE_OK;
    }
    double bound = problem_optimal_bound(p);

    /* The reference layout itself, when optimal, is the unique layout that
     * moves nothing. */
    if (reference_stages == S && reference_within(p, reference, bound)) {
        memcpy(counts, reference, (size_t)S * sizeof *counts);
        problem_describe(p, counts, reference, reference_stages, res);
        return BALANCE_OK;
    }

    int *ref_start = dm_alloc((size_t)(reference_stages + 1) * sizeof(int));
    int *low = dm_alloc(4 * (size_t)(S + 1) * sizeof(int));
    int *high = low + (S + 1);
    int *window_low = high + (S + 1), *window_high = window_low + (S + 1);
    for (int s = 0; s < reference_stages; s++)
        ref_start[s + 1] = ref_start[s] + reference[s];
    boundary_ranges(p, bound, low, high);

    /* When the bound leaves much slack the ranges are wide, yet the least
     * movement usually keeps boundaries near the reference's. Solve inside
     * windows of radius d around the reference boundaries first: a layout
     * with a boundary further than d from the reference's moves at least
     * the d + 1 blocks next to it, so when the windowed optimum moves
     * strictly less than the cheapest such run, it is the global answer
     * (ties included: every global optimum lies inside). Otherwise double d;
     * once the windows cover the ranges the answer is exact by itself. */
    struct kept kept;
    int found = 0;
    int radius = reference_stages == S ? 8 : n;
    for (;; radius = radius < n ? 2 * radius : n) {
        struct kept cheapest_outside;
        int full = radius_windows(p, radius, low, high, ref_start, window_low,
                                  window_high, &cheapest_outside);
        found = least_movement(p, bound, window_low, window_high, ref_start,
                               reference_stages, counts, &kept);
        if (full) break;
        if (found) {
            struct kept moved = {p->prefix_mem[n] - kept.bytes, n - kept.blocks};
            if (kept_less(moved, cheapest_outside)) break;
        }
    }
    DM_ASSERT(found);
    dm_free(low);
    dm_free(ref_start);
    problem_describe(p, counts, reference, reference_stages, res);
    DM_ASSERT(!res || res->max_stage_cost == bound);
    return BALANCE_OK;
}

int balance_partition(const struct balance_costs *costs, int stages,
                      int64_t mem_cap, const int *current, int current_stages,
                      int *counts, struct balance_result *res,
                      char *err, size_t errsize)
{
    int rc = balance_check_costs(costs, stages, mem_cap, err, errsize);
    if (rc) return rc;
    int reference_stages = current ? current_stages : stages;
    int *reference = dm_alloc((size_t)(reference_stages > 0 ? reference_stages : 1) * sizeof(int));
    rc = balance_current_or_uniform(current, reference_stages, costs->blocks,
                                    reference, err, errsize);
    if (rc == BALANCE_OK) {
        struct balance_problem p;
        problem_init(&p, costs, stages, mem_cap);
        struct balance_result local;
        rc = partition_prepared(&p, reference, reference_stages, counts,
                                res ? res : &local);
        problem_free(&p);
        if (res) res->rounds = 0, res->converged = 1;
    }
    dm_free(reference);
    return rc;
}
