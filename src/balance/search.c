/* Local search on the predicted step time, shared by re-packing (a short
 * polish of the min-max layout on each candidate stage count) and by
 * partition-time when stages share processors (where the min-max layout is
 * only a start). Pure; must not: check its inputs (the callers have) or
 * leave a layout that breaks the memory cap. */
#include <math.h>
#include "balance_internal.h"

double predicted_ms(const struct balance_profile *profile, int stages,
                    const int *counts, int micro_batches,
                    enum dm_schedule schedule)
{
    struct balance_prediction prediction;
    int rc = balance_predict(profile, stages, counts, micro_batches, schedule,
                             &prediction, NULL, 0);
    DM_ASSERT(rc == BALANCE_OK);
    return prediction.step_ms;
}

/* The min-max layout is the right start, but the schedule's warm-up and
 * drain depend on forward and backward times separately, and stages that
 * share processors slow each other down, so a neighbouring layout can be
 * faster. */
double improve_by_prediction(const struct balance_profile *profile,
                             const struct balance_costs *costs, int stages,
                             int *counts, int64_t mem_cap, int micro_batches,
                             enum dm_schedule schedule, double target,
                             double give_up_above, int budget)
{
    double best = predicted_ms(profile, stages, counts, micro_batches, schedule);
    if (best > give_up_above) return best;
    for (int step = 0; step < budget && best > target; step++) {
        int improved = 0;
        for (int j = 0; j + 1 < stages && !improved; j++) {
            for (int delta = -1; delta <= 1 && !improved; delta += 2) {
                /* boundary between stage j and j+1 moves by delta */
                if (counts[j] + delta < 1 || counts[j + 1] - delta < 1) continue;
                counts[j] += delta;
                counts[j + 1] -= delta;
                int begin = 0, fits = 1;
                for (int s = 0; s < j; s++) begin += counts[s];
                for (int s = j; s <= j + 1 && mem_cap > 0; s++) {
                    fits &= balance_stage_mem(costs, stages, s, begin,
                                              begin + counts[s]) <= mem_cap;
                    begin += counts[s];
                }
                double t = INFINITY;
                if (fits && budget-- > 0)
                    t = predicted_ms(profile, stages, counts, micro_batches,
                                     schedule);
                if (t < best) {
                    best = t;
                    improved = 1;
                } else {
                    counts[j] -= delta;
                    counts[j + 1] += delta;
                }
            }
        }
        if (!improved) break;
    }
    return best;
}
