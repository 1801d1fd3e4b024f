/* The step-time predictor: simulates a pipeline schedule (GPipe or 1F1B) as
 * per-stage instruction lists with zero communication time, from per-stage
 * forward and backward times. The balancers and `dynmo plan` use it to
 * compare layouts and to decide re-packing; the engine can feed it measured
 * stage times. Must not: model communication or memory (that is the
 * engine's to measure), or depend on anything but its arguments. */
#include <math.h>
#include "balance_internal.h"

/* Instructions per stage are coded 0..m-1 for forward k and m..2m-1 for
 * backward k; the simulation is Kahn's topological order over the
 * dependency graph, each instruction starting when its predecessor on the
 * stage and its cross-stage input have finished. */
static void schedule_list(int *list, int stage, int stages, int m,
                          enum dm_schedule schedule)
{
    int pos = 0;
    if (schedule == DM_SCHEDULE_GPIPE) {
        for (int k = 0; k < m; k++) list[pos++] = k;
        for (int k = 0; k < m; k++) list[pos++] = m + k;
        return;
    }
    int warmup = stages - stage - 1 < m ? stages - stage - 1 : m;
    for (int k = 0; k < warmup; k++) list[pos++] = k;
    for (int i = 0; i < m - warmup; i++) {
        list[pos++] = warmup + i;
        list[pos++] = m + i;
    }
    for (int k = m - warmup; k < m; k++) list[pos++] = m + k;
}

#define PREDICT_MAX_INSTRUCTIONS ((long)1 << 26)

int balance_predict_stages(const double *stage_fwd_ms,
                           const double *stage_bwd_ms, int stages,
                           int micro_batches, enum dm_schedule schedule,
                           struct balance_prediction *out,
                           char *err, size_t errsize)
{
    int S = stages, m = micro_batches;
    if (S < 1)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "stages must be at least 1 (got %d)", S);
    if (m < 1)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "micro-batches must be at least 1 (got %d)", m);
    if (schedule != DM_SCHEDULE_1F1B && schedule != DM_SCHEDULE_GPIPE)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "unknown schedule %d", (int)schedule);
    if ((long)S * 2 * m > PREDICT_MAX_INSTRUCTIONS)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%d stages x %d micro-batches is too large to "
                            "simulate", S, m);
    for (int s = 0; s < S; s++) {
        if (!isfinite(stage_fwd_ms[s]) || stage_fwd_ms[s] < 0 ||
            !isfinite(stage_bwd_ms[s]) || stage_bwd_ms[s] < 0)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "stage %d: time (%g fwd, %g bwd) is negative "
                                "or not a number", s, stage_fwd_ms[s],
                                stage_bwd_ms[s]);
    }
    long L = 2L * m, total = (long)S * L;
    int *list = dm_alloc((size_t)total * sizeof(int));      /* (S, 2m) codes */
    int *position = dm_alloc((size_t)total * sizeof(int));  /* (S, 2m) by code */
    int *pending = dm_alloc((size_t)total * sizeof(int));   /* unmet inputs */
    long *ready = dm_alloc((size_t)total * sizeof(long));   /* stack of ids */
    double *earliest = dm_alloc((size_t)total * sizeof(double));
    for (int s = 0; s < S; s++) {
        schedule_list(list + s * L, s, S, m, schedule);
        for (long pos = 0; pos < L; pos++) {
            int code = list[s * L + pos];
            position[s * L + code] = (int)pos;
            int cross = code < m ? s > 0 : s < S - 1;
            pending[s * L + pos] = (pos > 0) + cross;
        }
    }
    long top = 0, done = 0;
    for (long id = 0; id < total; id++)
        if (pending[id] == 0) ready[top++] = id;
    double step = 0.0;
    while (top > 0) {
        long id = ready[--top];
        int s = (int)(id / L);
        long pos = id % L;
        int code = list[id];
        double finish = earliest[id] + (code < m ? stage_fwd_ms[s] : stage_bwd_ms[s]);
        if (finish > step) step = finish;
        done++;
        long successors[2];
        int count = 0;
        if (pos + 1 < L) successors[count++] = id + 1;
        if (code < m && s + 1 < S)
            successors[count++] = (s + 1) * L + position[(s + 1) * L + code];
        if (code >= m && s > 0)
            successors[count++] = (s - 1) * L + position[(s - 1) * L + code];
        for (int i = 0; i < count; i++) {
            long next = successors[i];
            if (finish > earliest[next]) earliest[next] = finish;
            if (--pending[next] == 0) ready[top++] = next;
        }
    }
    DM_ASSERT(done == total);
    double busy = 0.0, widest = -1.0;
    int bottleneck = 0;
    for (int s = 0; s < S; s++) {
        double per_micro_batch = stage_fwd_ms[s] + stage_bwd_ms[s];
        busy += m * per_micro_batch;
        if (per_micro_batch > widest) {
            widest = per_micro_batch;
            bottleneck = s;
        }
    }
    out->step_ms = step;
    out->bubble_ratio = step > 0 ? 1.0 - busy / (S * step) : 0.0;
    if (out->bubble_ratio < 0) out->bubble_ratio = 0.0;  /* rounding only */
    out->bottleneck_stage = bottleneck;
    dm_free(earliest);
    dm_free(ready);
    dm_free(pending);
    dm_free(position);
    dm_free(list);
    return BALANCE_OK;
}

int balance_predict(const struct balance_profile *profile, int stages,
                    const int *counts, int micro_batches,
                    enum dm_schedule schedule, struct balance_prediction *out,
                    char *err, size_t errsize)
{
    int rc = balance_check_layout(counts, stages, profile->blocks, err, errsize);
    if (rc) return rc;
    for (int i = 0; i < profile->blocks; i++)
        if (!(profile->fwd_ms[i] >= 0) || !(profile->bwd_ms[i] >= 0) ||
            !isfinite(profile->fwd_ms[i]) || !isfinite(profile->bwd_ms[i]))
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "block %d: fwd_ms %g or bwd_ms %g is negative "
                                "or not a number", i, profile->fwd_ms[i],
                                profile->bwd_ms[i]);
    struct balance_costs fwd = {
        .blocks = profile->blocks, .cost = profile->fwd_ms,
        .mem_bytes = profile->mem_bytes, .first_cost = profile->embed.fwd_ms,
        .last_cost = profile->head.fwd_ms};
    struct balance_costs bwd = fwd;
    bwd.cost = profile->bwd_ms;
    bwd.first_cost = profile->embed.bwd_ms;
    bwd.last_cost = profile->head.bwd_ms;
    rc = balance_check_costs(&fwd, stages, 0, err, errsize);
    if (rc == BALANCE_OK) rc = balance_check_costs(&bwd, stages, 0, err, errsize);
    if (rc) return rc;
    struct balance_problem pf, pb;
    problem_init(&pf, &fwd, stages, 0);
    problem_init(&pb, &bwd, stages, 0);
    double *times = dm_alloc(2 * (size_t)stages * sizeof(double));
    int begin = 0;
    for (int s = 0; s < stages; s++) {
        int end = begin + counts[s];
        times[s] = problem_stage_cost(&pf, s, begin, end);
        times[stages + s] = problem_stage_cost(&pb, s, begin, end);
        begin = end;
    }
    rc = balance_predict_stages(times, times + stages, stages, micro_batches,
                                schedule, out, err, errsize);
    dm_free(times);
    problem_free(&pb);
    problem_free(&pf);
    return rc;
}
