/* Expert placement (moe.placement = balanced, docs/moe.md): which rank of
 * an expert-parallel group holds which expert of one MoE block, so that
 * the busiest rank's load is as small as it can be, and whether moving
 * there pays. A placement is an order of the E experts: position i holds
 * expert order[i] and belongs to rank i / (E / P); each rank holds E / P
 * experts, in ascending expert order within the rank.
 *
 * Exact (a branch and bound over the partitions of the experts into P
 * equal parts) up to PLACEMENT_EXACT_MAX experts; beyond, longest load
 * first into the least loaded rank with room, then swaps between the
 * busiest rank and any other while one lowers the busier of the two.
 * Of the placements that reach the exact least load, the one that moves
 * the fewest experts from where they are; beyond the exact size, the
 * parts go to the ranks that already hold most of their experts, or the
 * current placement improved by swaps is kept when it is as good.
 *
 * Pure functions over arrays: no MPI, no model, no I/O. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/core.h"

#define PLACEMENT_EXACT_MAX 12
#define PLACEMENT_RELABEL_EXACT_MAX 8

double balance_placement_busiest(const double *loads, const int *order, int E, int ranks)
{
    int per = E / ranks;
    double most = 0.0;
    for (int r = 0; r < ranks; r++) {
        double sum = 0.0;
        for (int j = 0; j < per; j++) sum += loads[order[r * per + j]];
        if (r == 0 || sum > most) most = sum;
    }
    return most;
}

int balance_placement_moves(const int *from, const int *to, int E, int ranks)
{
    int per = E / ranks, moves = 0;
    int *rank_of = dm_alloc((size_t)E * sizeof(int));
    for (int i = 0; i < E; i++) rank_of[from[i]] = i / per;
    for (int i = 0; i < E; i++) moves += rank_of[to[i]] != i / per;
    dm_free(rank_of);
    return moves;
}

void balance_placement_identity(int *order, int E)
{
    for (int i = 0; i < E; i++) order[i] = i;
}

/* Experts by load, heaviest first (ties: the lower index first). */
static const double *sort_loads;
static int by_load(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (sort_loads[x] != sort_loads[y]) return sort_loads[x] > sort_loads[y] ? -1 : 1;
    return x - y;
}

static int ascending(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

struct search {
    const double *loads;
    const int *sorted;      /* experts, heaviest first */
    int E, P, per;
    double *sum;            /* (P) each part's load so far */
    int *fill;              /* (P) experts in each part so far */
    int *part;              /* (E) the part of each sorted expert so far */
    int *best_part;         /* (E) the best complete assignment */
    double best;
};

static void search_from(struct search *s, int k, double most)
{
    if (most >= s->best) return;
    if (k == s->E) {
        s->best = most;
        memcpy(s->best_part, s->part, (size_t)s->E * sizeof(int));
        return;
    }
    double load = s->loads[s->sorted[k]];
    for (int p = 0; p < s->P; p++) {
        if (s->fill[p] == s->per) continue;
        /* what is left to decide depends on a part only through its load
         * and its room: of parts equal in both, an expert tries the first */
        int same = 0;
        for (int q = 0; q < p && !same; q++)
            same = s->fill[q] == s->fill[p] && s->sum[q] == s->sum[p];
        if (same) continue;
        s->sum[p] += load;
        s->fill[p]++;
        s->part[k] = p;
        search_from(s, k + 1, s->sum[p] > most ? s->sum[p] : most);
        s->fill[p]--;
        s->sum[p] -= load;
    }
}

/* Longest load first: each expert, heaviest first, into the least loaded
 * part with room (ties: the lower part). */
static void greedy_parts(const double *loads, const int *sorted, int E, int P, double *sum,
                         int *fill, int *part_of)
{
    int per = E / P;
    for (int p = 0; p < P; p++) {
        sum[p] = 0.0;
        fill[p] = 0;
    }
    for (int k = 0; k < E; k++) {
        int best = -1;
        for (int p = 0; p < P; p++)
            if (fill[p] < per && (best < 0 || sum[p] < sum[best])) best = p;
        part_of[sorted[k]] = best;
        sum[best] += loads[sorted[k]];
        fill[best]++;
    }
}

/* Swaps between the busiest part and another while one lowers the larger
 * of the two parts' loads below the busiest's. */
static void improve_by_swaps(const double *loads, int E, int P, double *sum, int *part_of)
{
    for (int round = 0; round < 4 * E * E; round++) {
        int b = 0;
        for (int p = 1; p < P; p++)
            if (sum[p] > sum[b]) b = p;
        double gain = 0.0;
        int x = -1, y = -1;
        for (int e = 0; e < E; e++) {
            if (part_of[e] != b) continue;
            for (int f = 0; f < E; f++) {
                int q = part_of[f];
                if (q == b || !(loads[e] > loads[f])) continue;
                double delta = loads[e] - loads[f];
                double worse = sum[q] + delta;
                double after = sum[b] - delta > worse ? sum[b] - delta : worse;
                if (sum[b] - after > gain) {
                    gain = sum[b] - after;
                    x = e;
                    y = f;
                }
            }
        }
        if (x < 0) return;
        int q = part_of[y];
        double delta = loads[x] - loads[y];
        sum[b] -= delta;
        sum[q] += delta;
        part_of[x] = q;
        part_of[y] = b;
    }
}

/* The parts given to ranks: rank_of_part[p], a permutation of the ranks
 * that keeps the most experts where current has them (ties: the first
 * found, parts in order). Exact over every permutation for few ranks,
 * else greedy by the largest overlap. */
static void ranks_for_parts(const int *part_of, const int *current, int E, int P,
                            int *rank_of_part)
{
    int per = E / P;
    int *overlap = dm_alloc((size_t)P * P * sizeof(int));   /* [part][rank] */
    for (int i = 0; i < E; i++) overlap[part_of[current[i]] * P + i / per]++;
    if (P <= PLACEMENT_RELABEL_EXACT_MAX) {
        int *perm = dm_alloc((size_t)P * sizeof(int)), *c = dm_alloc((size_t)P * sizeof(int));
        for (int p = 0; p < P; p++) perm[p] = p;
        int best = -1;
        /* Heap's algorithm over the permutations of the ranks */
        for (int i = 0;;) {
            int kept = 0;
            for (int p = 0; p < P; p++) kept += overlap[p * P + perm[p]];
            if (kept > best) {
                best = kept;
                memcpy(rank_of_part, perm, (size_t)P * sizeof(int));
            }
            while (i < P && c[i] >= i) c[i++] = 0;
            if (i >= P) break;
            int j = i % 2 ? c[i] : 0, t = perm[j];
            perm[j] = perm[i];
            perm[i] = t;
            c[i]++;
            i = 0;
        }
        dm_free(perm);
        dm_free(c);
    } else {
        int *taken = dm_alloc((size_t)P * sizeof(int)), *done = dm_alloc((size_t)P * sizeof(int));
        for (int n = 0; n < P; n++) {
            int bp = -1, br = -1;
            for (int p = 0; p < P; p++)
                for (int r = 0; r < P && !done[p]; r++)
                    if (!taken[r] && (bp < 0 || overlap[p * P + r] > overlap[bp * P + br])) {
                        bp = p;
                        br = r;
                    }
            rank_of_part[bp] = br;
            done[bp] = taken[br] = 1;
        }
        dm_free(taken);
        dm_free(done);
    }
    dm_free(overlap);
}

/* The fewest moves from current to a placement whose busiest rank is at
 * most bound: experts heaviest first, each to a rank with room whose load
 * stays within bound, its current rank tried first. */
struct nearest {
    const double *loads;
    const int *sorted, *was;    /* was[e]: e's current rank */
    int E, P, per;
    double bound;
    double *sum;
    int *fill, *rank_of, *best_rank;
    int best_moves;
};

static void nearest_from(struct nearest *s, int k, int moves)
{
    if (moves >= s->best_moves) return;
    if (k == s->E) {
        s->best_moves = moves;
        memcpy(s->best_rank, s->rank_of, (size_t)s->E * sizeof(int));
        return;
    }
    int e = s->sorted[k];
    double load = s->loads[e];
    for (int i = 0; i < s->P; i++) {
        int r = i == 0 ? s->was[e] : i <= s->was[e] ? i - 1 : i;   /* its own rank first */
        if (s->fill[r] == s->per || s->sum[r] + load > s->bound) continue;   /* bound: slack */
        s->sum[r] += load;
        s->fill[r]++;
        s->rank_of[e] = r;
        nearest_from(s, k + 1, moves + (r != s->was[e]));
        s->fill[r]--;
        s->sum[r] -= load;
    }
}

/* order from each expert's rank, each rank's experts ascending. */
static void order_of_ranks(const int *rank_of, int E, int P, int *order)
{
    int per = E / P, *at = dm_alloc((size_t)P * sizeof(int));
    for (int e = 0; e < E; e++) {
        int r = rank_of[e];
        order[r * per + at[r]++] = e;
    }
    dm_free(at);
}

void balance_placement_plan(const double *loads, int E, int ranks, const int *current, int *order)
{
    DM_ASSERT(ranks >= 1 && E % ranks == 0);
    int P = ranks, per = E / P;
    int *sorted = dm_alloc((size_t)E * sizeof(int)), *part_of = dm_alloc((size_t)E * sizeof(int));
    int *was = dm_alloc((size_t)E * sizeof(int)), *rank_of = dm_alloc((size_t)E * sizeof(int));
    double *sum = dm_alloc((size_t)P * sizeof(double));
    int *fill = dm_alloc((size_t)P * sizeof(int));
    for (int e = 0; e < E; e++) sorted[e] = e;
    for (int i = 0; i < E; i++) was[current[i]] = i / per;
    sort_loads = loads;
    qsort(sorted, (size_t)E, sizeof(int), by_load);
    greedy_parts(loads, sorted, E, P, sum, fill, part_of);
    improve_by_swaps(loads, E, P, sum, part_of);
    double bound = sum[0];
    for (int p = 1; p < P; p++)
        if (sum[p] > bound) bound = sum[p];
    if (E <= PLACEMENT_EXACT_MAX && P > 1) {
        /* the least busiest load over the partitions, then the nearest
         * placement to current that reaches it */
        int *part = dm_alloc((size_t)E * sizeof(int)), *best = dm_alloc((size_t)E * sizeof(int));
        struct search s = {.loads = loads, .sorted = sorted, .E = E, .P = P, .per = per,
                           .sum = sum, .fill = fill, .part = part, .best_part = best,
                           .best = bound};
        memset(sum, 0, (size_t)P * sizeof(double));
        memset(fill, 0, (size_t)P * sizeof(int));
        search_from(&s, 0, 0.0);
        if (s.best < bound)
            for (int k = 0; k < E; k++) part_of[sorted[k]] = best[k];
        /* the optimum reached with the fewest moves; the sums run in
         * another order than the search's, so the bound has a relative
         * slack of 1e-12 (loads are averages, not whole counts) */
        struct nearest n = {.loads = loads, .sorted = sorted, .was = was, .E = E, .P = P,
                            .per = per, .bound = s.best + 1e-12 * fabs(s.best), .sum = sum,
                            .fill = fill, .rank_of = part, .best_rank = rank_of,
                            .best_moves = E + 1};
        memset(sum, 0, (size_t)P * sizeof(double));
        memset(fill, 0, (size_t)P * sizeof(int));
        nearest_from(&n, 0, 0);
        if (n.best_moves > E) {   /* not reached within the slack: the partition itself */
            int *rank_of_part = dm_alloc((size_t)P * sizeof(int));
            ranks_for_parts(part_of, current, E, P, rank_of_part);
            for (int e = 0; e < E; e++) rank_of[e] = rank_of_part[part_of[e]];
            dm_free(rank_of_part);
        }
        order_of_ranks(rank_of, E, P, order);
        dm_free(part);
        dm_free(best);
    } else {
        /* longest load first, its parts given to the ranks that hold most
         * of them; or the current placement improved by swaps, when that
         * is as good */
        int *rank_of_part = dm_alloc((size_t)P * sizeof(int));
        ranks_for_parts(part_of, current, E, P, rank_of_part);
        for (int e = 0; e < E; e++) rank_of[e] = rank_of_part[part_of[e]];
        order_of_ranks(rank_of, E, P, order);
        dm_free(rank_of_part);
        memset(sum, 0, (size_t)P * sizeof(double));
        for (int e = 0; e < E; e++) sum[was[e]] += loads[e];
        improve_by_swaps(loads, E, P, sum, was);
        int *near = dm_alloc((size_t)E * sizeof(int));
        order_of_ranks(was, E, P, near);
        if (balance_placement_busiest(loads, near, E, P) <=
            balance_placement_busiest(loads, order, E, P))
            memcpy(order, near, (size_t)E * sizeof(int));
        dm_free(near);
    }
    /* no better than where the experts are (beyond the sums' rounding):
     * stay */
    double now = balance_placement_busiest(loads, current, E, P);
    if (!(balance_placement_busiest(loads, order, E, P) < now - 1e-9 * fabs(now)))
        memcpy(order, current, (size_t)E * sizeof(int));
    dm_free(sorted);
    dm_free(part_of);
    dm_free(was);
    dm_free(rank_of);
    dm_free(sum);
    dm_free(fill);
}

void balance_placement_decide(const struct balance_placement_input *in, int *next,
                              struct balance_placement_decision *d)
{
    int E = in->items, P = in->ranks;
    memset(d, 0, sizeof *d);
    balance_placement_plan(in->loads, E, P, in->current, next);
    d->now_load = balance_placement_busiest(in->loads, in->current, E, P);
    d->next_load = balance_placement_busiest(in->loads, next, E, P);
    d->moves = balance_placement_moves(in->current, next, E, P);
    d->bytes = (double)d->moves * in->bytes_per_item;
    d->saving_ms = (d->now_load - d->next_load) * in->ms_per_load * in->every;
    d->migrate_ms = balance_migration_cost_ms(in->moved_bytes, in->moved_ms, in->moves_kept,
                                              d->bytes);
    d->apply = d->moves > 0 && d->saving_ms > 0.0 && d->saving_ms > d->migrate_ms;
    if (!d->apply) memcpy(next, in->current, (size_t)E * sizeof(int));
}

void balance_placement_random(int *order, int E, int ranks, uint64_t seed, uint64_t step,
                              int block)
{
    int per = E / ranks;
    for (int i = 0; i < E; i++) order[i] = i;
    for (int i = E - 1; i > 0; i--) {
        uint64_t draw = dm_hash64(seed, 0x706c616365ULL + step, (uint64_t)block * 65536 + (uint64_t)i);
        int j = (int)(draw % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int r = 0; r < ranks; r++) {
        qsort(order + r * per, (size_t)per, sizeof(int), ascending);
    }
}
