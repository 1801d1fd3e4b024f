/* Expert replication (moe.replicas_max, docs/moe.md): copies of a hot
 * expert on other ranks of its expert-parallel group, each serving the
 * rows of some of the group's ranks (its sources) in place of the
 * expert's own rank. A source's rows of one expert go to one place, so
 * each source's rows still meet the expert as one piece: copies move work,
 * never the arithmetic.
 *
 * The planner sees one load per expert (token-expert pairs a step) and
 * counts each source as routing an equal share of it, 1 / P: the sources
 * are data-parallel shards of one batch. It adds copies one at a time:
 * of the busiest rank's experts, the copy (expert, holder, how many
 * sources) that lowers the busiest rank's load most, the holder's own rows
 * first (they do not cross the wire), until no copy lowers it or
 * copies_max are placed. The expert's own rank always keeps its own rows.
 *
 * Pure functions over arrays: no MPI, no model, no I/O. */
#include <math.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/core.h"

static int popcount64(uint64_t x)
{
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

void balance_copies_loads(const double *loads, const int *order, int E, int ranks,
                          const struct balance_copy *copies, int n, double *rank_load)
{
    int per = E / ranks;
    for (int r = 0; r < ranks; r++) {
        rank_load[r] = 0.0;
        for (int j = 0; j < per; j++) rank_load[r] += loads[order[r * per + j]];
    }
    for (int c = 0; c < n; c++) {
        int owner = 0;
        while (order[owner] != copies[c].item) owner++;
        double moved = loads[copies[c].item] * popcount64(copies[c].sources) / ranks;
        rank_load[owner / per] -= moved;
        rank_load[copies[c].holder] += moved;
    }
}

static double most_of(const double *x, int n)
{
    double most = x[0];
    for (int i = 1; i < n; i++) most = x[i] > most ? x[i] : most;
    return most;
}

double balance_copies_busiest(const double *loads, const int *order, int E, int ranks,
                              const struct balance_copy *copies, int n)
{
    double *rank_load = dm_alloc((size_t)ranks * sizeof(double));
    balance_copies_loads(loads, order, E, ranks, copies, n, rank_load);
    double most = most_of(rank_load, ranks);
    dm_free(rank_load);
    return most;
}

/* The best copy of one of rank p's experts: the (expert, holder, number of
 * sources) that gives the least busiest rank, below `most`. */
struct copy_choice {
    int item, holder, count;
    double most;
};

/* The busiest rank but p and h under rank_load. */
static double most_but(const double *rank_load, int ranks, int p, int h)
{
    double most = 0.0;
    for (int r = 0; r < ranks; r++)
        if (r != p && r != h && rank_load[r] > most) most = rank_load[r];
    return most;
}

static int has_copy(const struct balance_copy *copies, int n, int item, int holder)
{
    for (int c = 0; c < n; c++)
        if (copies[c].item == item && copies[c].holder == holder) return 1;
    return 0;
}

static void best_copy_of(const double *loads, const int *order, int E, int ranks, int p,
                         const uint64_t *taken, const struct balance_copy *copies, int n,
                         const double *rank_load, struct copy_choice *best)
{
    int per = E / ranks;
    for (int j = 0; j < per; j++) {
        int e = order[p * per + j];
        double share = loads[e] / ranks;
        int free = ranks - 1 - popcount64(taken[e]);   /* sources but p's own */
        if (!(share > 0.0) || free <= 0) continue;
        for (int h = 0; h < ranks; h++) {
            if (h == p || has_copy(copies, n, e, h)) continue;
            double others = most_but(rank_load, ranks, p, h);
            for (int k = 1; k <= free; k++) {
                double from = rank_load[p] - k * share, to = rank_load[h] + k * share;
                double most = fmax(others, fmax(from, to));
                if (most < best->most - 1e-9 * fabs(best->most))
                    *best = (struct copy_choice){e, h, k, most};
            }
        }
    }
}

/* count sources of item's rows for a copy on holder: the holder's own
 * first, then the others in rank order, never the owner's nor one another
 * copy serves. */
static uint64_t sources_for(int owner, int holder, int count, uint64_t taken, int ranks)
{
    uint64_t mask = 0;
    if (!(taken >> holder & 1)) {
        mask |= UINT64_C(1) << holder;
        count--;
    }
    for (int s = 0; s < ranks && count > 0; s++) {
        uint64_t bit = UINT64_C(1) << s;
        if (s == owner || s == holder || (taken & bit)) continue;
        mask |= bit;
        count--;
    }
    return mask;
}

int balance_copies_plan(const double *loads, const int *order, int E, int ranks, int copies_max,
                        struct balance_copy *copies)
{
    DM_ASSERT(ranks <= BALANCE_COPY_RANKS_MAX && E % ranks == 0);
    int per = E / ranks, n = 0;
    uint64_t *taken = dm_alloc((size_t)E * sizeof(uint64_t));   /* zero */
    double *rank_load = dm_alloc((size_t)ranks * sizeof(double));
    balance_copies_loads(loads, order, E, ranks, copies, 0, rank_load);
    while (n < copies_max) {
        int p = 0;
        for (int r = 1; r < ranks; r++)
            if (rank_load[r] > rank_load[p]) p = r;
        struct copy_choice best = {-1, -1, 0, rank_load[p]};
        best_copy_of(loads, order, E, ranks, p, taken, copies, n, rank_load, &best);
        if (best.item < 0) break;
        int owner = 0;
        while (order[owner] != best.item) owner++;
        owner /= per;
        uint64_t mask = sources_for(owner, best.holder, best.count, taken[best.item], ranks);
        copies[n++] = (struct balance_copy){best.item, best.holder, mask};
        taken[best.item] |= mask;
        double moved = loads[best.item] * best.count / ranks;
        rank_load[p] -= moved;
        rank_load[best.holder] += moved;
    }
    dm_free(taken);
    dm_free(rank_load);
    return n;
}

void balance_copies_decide(const struct balance_placement_input *in, const int *order,
                           int copies_max, double bytes_per_source,
                           struct balance_copy *copies, struct balance_copies_decision *d)
{
    int E = in->items, P = in->ranks;
    memset(d, 0, sizeof *d);
    int n = balance_copies_plan(in->loads, order, E, P, copies_max, copies);
    d->now_load = balance_copies_busiest(in->loads, order, E, P, copies, 0);
    d->next_load = balance_copies_busiest(in->loads, order, E, P, copies, n);
    d->copies = n;
    /* each step: a copy's weights out to its holder, and each source's
     * gradients back to the owner */
    for (int c = 0; c < n; c++) d->bytes += bytes_per_source * (1 + popcount64(copies[c].sources));
    d->saving_ms = (d->now_load - d->next_load) * in->ms_per_load;
    d->cost_ms = balance_migration_cost_ms(in->moved_bytes, in->moved_ms, in->moves_kept,
                                           d->bytes);
    d->apply = n > 0 && d->saving_ms > 0.0 && d->saving_ms > d->cost_ms;
    if (!d->apply) d->copies = 0;
}

int balance_copies_random(const int *order, int E, int ranks, int copies_max, uint64_t seed,
                          uint64_t step, int block, struct balance_copy *copies)
{
    DM_ASSERT(ranks <= BALANCE_COPY_RANKS_MAX && E % ranks == 0);
    int per = E / ranks, n = 0;
    uint64_t *taken = dm_alloc((size_t)E * sizeof(uint64_t));
    uint64_t stream = 0x636f706965ULL + step, at = (uint64_t)block * 65536;
    for (int c = 0; c < copies_max; c++) {
        int e = (int)(dm_hash64(seed, stream, at++) % (uint64_t)E);
        int owner = 0;
        while (order[owner] != e) owner++;
        owner /= per;
        int h = (int)(dm_hash64(seed, stream, at++) % (uint64_t)ranks);
        if (h == owner || has_copy(copies, n, e, h)) continue;
        uint64_t mask = 0;
        for (int s = 0; s < ranks; s++) {
            uint64_t bit = UINT64_C(1) << s;
            if (s != owner && !(taken[e] & bit) && (dm_hash64(seed, stream, at++) & 1)) mask |= bit;
        }
        if (!mask) continue;
        copies[n++] = (struct balance_copy){e, h, mask};
        taken[e] |= mask;
    }
    dm_free(taken);
    return n;
}
