/* Expert placement (src/balance/placement.c): the planned placement
 * against every permutation of the experts (brute force) for E <= 8, the
 * heuristic on larger E against a lower bound, the relabelling that moves
 * few experts, and the rule that a move is taken only when its saving
 * beats its cost; expert copies (src/balance/replicate.c): the first
 * planned copy against every single copy (brute force), more copies never
 * raising the busiest load, every plan's and random draw's copies within
 * the rules (a holder other than the owner, sources other than the owner,
 * each source of an expert served once). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "testing.h"

/* Every permutation of the E experts (Heap's algorithm): the least
 * busiest-rank load. Half the instances' loads are thirds of counts, as
 * the engine's averages over steps are. */
static double brute_force(const double *loads, int E, int P)
{
    int order[16], c[16] = {0};
    for (int i = 0; i < E; i++) order[i] = i;
    double best = balance_placement_busiest(loads, order, E, P);
    for (int i = 0; i < E;) {
        if (c[i] < i) {
            int j = i % 2 ? c[i] : 0, t = order[j];
            order[j] = order[i];
            order[i] = t;
            double b = balance_placement_busiest(loads, order, E, P);
            if (b < best) best = b;
            c[i]++;
            i = 0;
        } else {
            c[i++] = 0;
        }
    }
    return best;
}

/* A placement: every expert once, each rank's experts ascending. */
static int valid(const int *order, int E, int P)
{
    int seen[64] = {0}, per = E / P;
    for (int i = 0; i < E; i++) {
        if (order[i] < 0 || order[i] >= E || seen[order[i]]++) return 0;
        if (i % per && order[i] < order[i - 1]) return 0;
    }
    return 1;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Skewed made-up loads: a few hot experts, ties among the rest. */
static void draw_loads(double *loads, int E, uint64_t *s)
{
    for (int e = 0; e < E; e++) {
        uint64_t r = lcg(s);
        loads[e] = (double)(r % 7 == 0 ? 500 + r % 1000 : r % 100);
    }
}

static void check_brute_force(void)
{
    uint64_t seed = 12345;
    int cases = 0, worse = 0;
    double gap = 0.0;
    for (int E = 2; E <= 8; E++)
        for (int P = 2; P <= E; P++) {
            if (E % P) continue;
            for (int trial = 0; trial < 30; trial++) {
                double loads[8];
                int current[8], order[8];
                draw_loads(loads, E, &seed);
                if (trial % 2)   /* averages over steps: not whole counts */
                    for (int e = 0; e < E; e++) loads[e] /= 3.0;
                balance_placement_identity(current, E);
                balance_placement_plan(loads, E, P, current, order);
                CHECK(valid(order, E, P));
                double want = brute_force(loads, E, P);
                double got = balance_placement_busiest(loads, order, E, P);
                if (got > want * (1 + 1e-12)) worse++;   /* sums in another order */
                if (got - want > gap) gap = got - want;
                cases++;
            }
        }
    printf("placement: %d instances with E <= 8, %d not optimal (largest excess %g)\n", cases,
           worse, gap);
    CHECK(worse == 0);
}

/* E = 64 over 8 ranks: the heuristic within one expert's load of the
 * lower bound max(mean rank load, the heaviest expert), and never worse
 * than where the experts were. */
static void check_large(void)
{
    uint64_t seed = 777;
    double most_over = 0.0;
    for (int trial = 0; trial < 20; trial++) {
        enum { E = 64, P = 8 };
        double loads[E], total = 0.0, heaviest = 0.0, lightest_hot = 1e300;
        int current[E], order[E];
        draw_loads(loads, E, &seed);
        for (int e = 0; e < E; e++) {
            total += loads[e];
            if (loads[e] > heaviest) heaviest = loads[e];
            if (loads[e] < lightest_hot) lightest_hot = loads[e];
        }
        balance_placement_random(current, E, P, 5, (uint64_t)trial, 0);
        CHECK(valid(current, E, P));
        balance_placement_plan(loads, E, P, current, order);
        CHECK(valid(order, E, P));
        double bound = total / P > heaviest ? total / P : heaviest;
        double got = balance_placement_busiest(loads, order, E, P);
        CHECK(got <= balance_placement_busiest(loads, current, E, P));
        CHECK_MSG(got <= bound + heaviest, "busiest %g, bound %g", got, bound);
        if (got / bound > most_over) most_over = got / bound;
    }
    printf("placement: E = 64 over 8 ranks, busiest at most %.4fx the lower bound\n", most_over);
}

/* Balanced loads stay; the plan keeps experts on ranks that already hold
 * them (relabelling), so a single hot-cold swap moves two experts. */
static void check_moves(void)
{
    double even[8] = {10, 10, 10, 10, 10, 10, 10, 10};
    int current[8], order[8];
    balance_placement_identity(current, 8);
    balance_placement_plan(even, 8, 4, current, order);
    CHECK(memcmp(order, current, sizeof order) == 0);
    /* so do ranks evenly loaded with thirds (no count a whole number) */
    double thirds[8] = {1 / 3.0, 2 / 3.0, 1 / 3.0, 2 / 3.0, 2 / 3.0, 1 / 3.0, 2 / 3.0, 1 / 3.0};
    balance_placement_plan(thirds, 8, 4, current, order);
    CHECK(memcmp(order, current, sizeof order) == 0);
    /* experts 0 and 1 hot on rank 0: one of them must leave */
    double hot[8] = {100, 100, 1, 1, 1, 1, 1, 1};
    balance_placement_plan(hot, 8, 4, current, order);
    CHECK(balance_placement_busiest(hot, order, 8, 4) == 101.0);
    CHECK_MSG(balance_placement_moves(current, order, 8, 4) == 2, "%d moves",
              balance_placement_moves(current, order, 8, 4));
}

/* The rule: taken only when the saving over the interval beats the
 * predicted cost of the moves. */
static void check_decide(void)
{
    double loads[4] = {90, 80, 10, 20};
    int current[4] = {0, 1, 2, 3}, next[4];
    double bytes[2] = {1e6, 2e6}, ms[2] = {10, 20};   /* 10 ms per MB */
    struct balance_placement_input in = {.loads = loads, .current = current, .items = 4,
                                         .ranks = 2, .ms_per_load = 0.01, .every = 10,
                                         .bytes_per_item = 1e6, .moved_bytes = bytes,
                                         .moved_ms = ms, .moves_kept = 2};
    struct balance_placement_decision d;
    balance_placement_decide(&in, next, &d);
    /* 170 -> 100 per step, two moves: saving 0.01 x 70 x 10 = 7 ms < 20 ms */
    CHECK(d.now_load == 170.0 && d.next_load == 100.0 && d.moves == 2);
    CHECK_NEAR(d.saving_ms, 7.0, 1e-9);
    CHECK_NEAR(d.migrate_ms, 20.0, 1e-9);
    CHECK(!d.apply && memcmp(next, current, sizeof next) == 0);
    in.every = 100;   /* 70 ms saved against 20 */
    balance_placement_decide(&in, next, &d);
    CHECK(d.apply && balance_placement_busiest(loads, next, 4, 2) == 100.0);
    /* already balanced: nothing to take */
    double flat[4] = {5, 5, 5, 5};
    in.loads = flat;
    balance_placement_decide(&in, next, &d);
    CHECK(!d.apply && d.moves == 0);
}


/* Copies obey the rules: an item and holder in range, the holder not the
 * item's rank, sources within the group, never the owner, never twice for
 * one item, never none; one copy per (item, holder). */
static int copies_valid(const struct balance_copy *copies, int n, const int *order, int E, int P)
{
    uint64_t taken[16] = {0};
    for (int c = 0; c < n; c++) {
        const struct balance_copy *k = &copies[c];
        if (k->item < 0 || k->item >= E || k->holder < 0 || k->holder >= P) return 0;
        int owner = 0;
        while (order[owner] != k->item) owner++;
        owner /= E / P;
        if (k->holder == owner || !k->sources || (k->sources >> P) || (k->sources >> owner & 1))
            return 0;
        if (taken[k->item] & k->sources) return 0;
        taken[k->item] |= k->sources;
        for (int b = 0; b < c; b++)
            if (copies[b].item == k->item && copies[b].holder == k->holder) return 0;
    }
    return 1;
}

/* The least busiest load one copy can give: every item, holder and set of
 * sources. */
static double best_single_copy(const double *loads, const int *order, int E, int P)
{
    double best = balance_copies_busiest(loads, order, E, P, NULL, 0);
    for (int i = 0; i < E; i++)
        for (int h = 0; h < P; h++) {
            int owner = i / (E / P);
            if (h == owner) continue;
            for (uint64_t mask = 1; mask < (UINT64_C(1) << P); mask++) {
                if (mask >> owner & 1) continue;
                struct balance_copy one = {order[i], h, mask};
                double b = balance_copies_busiest(loads, order, E, P, &one, 1);
                if (b < best) best = b;
            }
        }
    return best;
}

static void check_copies(void)
{
    uint64_t seed = 11;
    int worse = 0, invalid = 0;
    for (int trial = 0; trial < 300; trial++) {
        int P = 2 + trial % 3, E = P * (1 + trial % 4);
        double loads[16];
        int order[16];
        draw_loads(loads, E, &seed);
        balance_placement_plan(loads, E, P, (int[16]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                      13, 14, 15}, order);
        struct balance_copy one[1], many[8];
        int n1 = balance_copies_plan(loads, order, E, P, 1, one);
        double got1 = balance_copies_busiest(loads, order, E, P, one, n1);
        double want1 = best_single_copy(loads, order, E, P);
        worse += got1 > want1 + 1e-9 * want1;
        int n = balance_copies_plan(loads, order, E, P, 8, many);
        double got = balance_copies_busiest(loads, order, E, P, many, n);
        worse += got > got1 + 1e-9 * got1;
        invalid += !copies_valid(one, n1, order, E, P) || !copies_valid(many, n, order, E, P);
        n = balance_copies_random(order, E, P, 8, 5, (uint64_t)trial, 3, many);
        invalid += n < 0 || n > 8 || !copies_valid(many, n, order, E, P);
    }
    CHECK(worse == 0);
    CHECK(invalid == 0);
    /* one hot expert on 2 ranks: a copy on the other rank takes the other
     * rank's own rows, half the load: 100 + 10 | 10 -> 60 | 60 */
    double hot[4] = {100, 10, 5, 5};
    int identity[4] = {0, 1, 2, 3};
    struct balance_copy c[2];
    int n = balance_copies_plan(hot, identity, 4, 2, 2, c);
    CHECK(n == 1 && c[0].item == 0 && c[0].holder == 1 && c[0].sources == 2);
    CHECK(balance_copies_busiest(hot, identity, 4, 2, c, n) == 60.0);
    /* the rule: kept when the step's saving beats carrying the copies */
    struct balance_placement_input in = {.loads = hot, .current = identity, .items = 4,
                                         .ranks = 2, .ms_per_load = 0.01, .every = 4};
    struct balance_copies_decision d;
    balance_copies_decide(&in, identity, 2, 4000.0, c, &d);
    CHECK(d.apply && d.copies == 1 && d.now_load == 110.0 && d.next_load == 60.0);
    double bytes[1] = {8000.0}, ms[1] = {1.0};   /* 1 ms per 8000 bytes: 1 ms a step > 0.5 */
    in.moved_bytes = bytes;
    in.moved_ms = ms;
    in.moves_kept = 1;
    balance_copies_decide(&in, identity, 2, 4000.0, c, &d);
    CHECK(!d.apply && d.copies == 0 && d.cost_ms > d.saving_ms);
}

int main(void)
{
    check_brute_force();
    check_large();
    check_moves();
    check_decide();
    check_copies();
    return testing_report("test_placement");
}
