/* The step-time predictor, the one simulator of the schedules: simulates the
 * instruction lists of schedule_stage (GPipe or 1F1B; its forwards and
 * backwards, in order) with zero communication time, from per-stage forward
 * and backward times and updates at the step's end, with a processor per
 * stage or with stages sharing processors. The balancers and `dynmo plan`
 * use it to compare layouts and to decide re-packing; the engine can feed
 * it measured stage times. Must not: model communication or memory (that
 * is the engine's to measure), keep an order of its own beside
 * schedule_stage's, or depend on anything but its arguments. */
#include <math.h>
#include <string.h>
#include "balance_internal.h"

/* Instructions per stage are coded 0..m-1 for forward k and m..2m-1 for
 * backward k; the simulation is Kahn's topological order over the
 * dependency graph, each instruction starting when its predecessor on the
 * stage and its cross-stage input have finished. A stage's codes are the
 * FWD and BWD instructions of its schedule_stage list, in order; the
 * transfers take no time and the step's end is the simulations' own
 * update. scratch holds SCHEDULE_MAX_INSTRS(m) instructions. */
static void stage_codes(int *codes, struct schedule_instr *scratch, int stage,
                        int stages, int m, enum dm_schedule schedule)
{
    int n = schedule_stage(scratch, schedule, stage, stages, m);
    int pos = 0;
    for (int i = 0; i < n; i++) {
        if (scratch[i].op == SCHEDULE_FWD) codes[pos++] = scratch[i].micro_batch;
        else if (scratch[i].op == SCHEDULE_BWD) codes[pos++] = m + scratch[i].micro_batch;
    }
    DM_ASSERT(pos == 2 * m);
}

#define PREDICT_MAX_INSTRUCTIONS ((long)1 << 26)

/* The checks both simulations start with. */
static int check_stage_times(const double *stage_fwd_ms,
                             const double *stage_bwd_ms,
                             const double *stage_update_ms, int S, int m,
                             enum dm_schedule schedule, char *err,
                             size_t errsize)
{
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
        if (stage_update_ms &&
            (!isfinite(stage_update_ms[s]) || stage_update_ms[s] < 0))
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "stage %d: update time %g is negative or not "
                                "a number", s, stage_update_ms[s]);
    }
    return BALANCE_OK;
}

/* Fills out from the simulated step time: the bubble ratio and the
 * bottleneck (balance.h). */
static void describe_step(struct balance_prediction *out, double step,
                          const double *stage_fwd_ms,
                          const double *stage_bwd_ms,
                          const double *stage_update_ms, int S, int m)
{
    double busy = 0.0, widest = -1.0;
    int bottleneck = 0;
    for (int s = 0; s < S; s++) {
        double per_micro_batch = stage_fwd_ms[s] + stage_bwd_ms[s];
        busy += m * per_micro_batch;
        if (stage_update_ms) busy += stage_update_ms[s];
        if (per_micro_batch > widest) {
            widest = per_micro_batch;
            bottleneck = s;
        }
    }
    out->step_ms = step;
    out->bubble_ratio = step > 0 ? 1.0 - busy / (S * step) : 0.0;
    if (out->bubble_ratio < 0) out->bubble_ratio = 0.0;  /* rounding only */
    out->bottleneck_stage = bottleneck;
}

/* The step time with a processor per stage (inputs checked): Kahn's
 * order over the lists, stage s's first instruction starting no earlier
 * than its update. */
static double dedicated_step(const double *stage_fwd_ms,
                             const double *stage_bwd_ms,
                             const double *stage_update_ms, int S, int m,
                             enum dm_schedule schedule)
{
    long L = 2L * m, total = (long)S * L;
    int *list = dm_alloc((size_t)total * sizeof(int));      /* (S, 2m) codes */
    int *position = dm_alloc((size_t)total * sizeof(int));  /* (S, 2m) by code */
    int *pending = dm_alloc((size_t)total * sizeof(int));   /* unmet inputs */
    long *ready = dm_alloc((size_t)total * sizeof(long));   /* stack of ids */
    double *earliest = dm_alloc((size_t)total * sizeof(double));
    struct schedule_instr *scratch = dm_alloc(SCHEDULE_MAX_INSTRS((size_t)m) *
                                              sizeof *scratch);
    for (int s = 0; s < S; s++) {
        stage_codes(list + s * L, scratch, s, S, m, schedule);
        for (long pos = 0; pos < L; pos++) {
            int code = list[s * L + pos];
            position[s * L + code] = (int)pos;
            int cross = code < m ? s > 0 : s < S - 1;
            pending[s * L + pos] = (pos > 0) + cross;
        }
    }
    if (stage_update_ms)
        for (int s = 0; s < S; s++) earliest[s * L] = stage_update_ms[s];
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
    dm_free(scratch);
    dm_free(earliest);
    dm_free(ready);
    dm_free(pending);
    dm_free(position);
    dm_free(list);
    return step;
}

int balance_predict_stages(const double *stage_fwd_ms,
                           const double *stage_bwd_ms, int stages,
                           int micro_batches, enum dm_schedule schedule,
                           struct balance_prediction *out,
                           char *err, size_t errsize)
{
    int rc = check_stage_times(stage_fwd_ms, stage_bwd_ms, NULL, stages,
                               micro_batches, schedule, err, errsize);
    if (rc) return rc;
    double step = dedicated_step(stage_fwd_ms, stage_bwd_ms, NULL, stages,
                                 micro_batches, schedule);
    describe_step(out, step, stage_fwd_ms, stage_bwd_ms, NULL, stages,
                  micro_batches);
    return BALANCE_OK;
}

int balance_check_sharing(const struct balance_sharing *sharing, char *err,
                          size_t errsize)
{
    if (sharing->stages < 1 || sharing->groups < 1)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "sharing: %d stages in %d groups; both must be at "
                            "least 1", sharing->stages, sharing->groups);
    if (!sharing->group || !sharing->cores)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "sharing: the %s array is missing",
                            sharing->group ? "cores" : "group");
    for (int g = 0; g < sharing->groups; g++)
        if (!isfinite(sharing->cores[g]) || !(sharing->cores[g] > 0))
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "sharing: group %d has %g cores; needs a "
                                "finite number > 0", g, sharing->cores[g]);
    if (sharing->turns)
        for (int g = 0; g < sharing->groups; g++)
            if (sharing->cores[g] != floor(sharing->cores[g]) || sharing->cores[g] > 1e6)
                return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                    "sharing: group %d has %g cores; stages that take "
                                    "turns need a whole number of cores (at most 1e6)",
                                    g, sharing->cores[g]);
    for (int s = 0; s < sharing->stages; s++)
        if (sharing->group[s] < 0 || sharing->group[s] >= sharing->groups)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "sharing: stage %d is in group %d, outside "
                                "0..%d", s, sharing->group[s],
                                sharing->groups - 1);
    return BALANCE_OK;
}

int balance_sharing_oversubscribed(const struct balance_sharing *sharing, int stages)
{
    if (!sharing || sharing->stages != stages) return 0;
    int *members = dm_alloc((size_t)sharing->groups * sizeof(int));
    for (int s = 0; s < stages; s++) members[sharing->group[s]]++;
    int over = 0;
    for (int g = 0; g < sharing->groups; g++)
        over |= members[g] > sharing->cores[g];
    dm_free(members);
    return over;
}

/* The state of both shared simulations (fluid and turns): each stage's
 * position in its list and the work of the instruction there. */
struct fluid {
    int S, m;
    long L;                 /* 2m instructions per stage */
    const double *fwd, *bwd, *update;  /* update may be NULL */
    const struct balance_sharing *sharing;
    int *list;              /* (S, 2m) codes, stage_codes' */
    char *done;             /* (S, 2m) by code */
    long *position;         /* (S) index of the current instruction; L = finished,
                               -1 = the update before the list */
    double *remaining;      /* (S) work left of it, ms at rate 1 */
    double *size;           /* (S) its whole work */
    int *computing;         /* (S) fluid: whether its input is ready; turns: 0 idle,
                               TURN_QUEUED or TURN_RUNNING */
    int *members;           /* (groups) computing stages per group; turns: free cores */
    double *rate;           /* (groups) */
    /* turns only */
    int *queue;             /* (S) stages waiting for a core, in the order they asked */
    int queued;
    double *end;            /* (S) when its running instruction ends */
};

/* Loads stage s's instruction at its position. */
static void fluid_load(struct fluid *f, int s)
{
    if (f->position[s] >= f->L) return;
    if (f->position[s] < 0) {
        f->size[s] = f->update[s];
    } else {
        int code = f->list[s * f->L + f->position[s]];
        f->size[s] = code < f->m ? f->fwd[s] : f->bwd[s];
    }
    f->remaining[s] = f->size[s];
}

/* Whether stage s's current instruction has its cross-stage input:
 * forward k after forward k upstream, backward k after backward k
 * downstream; its predecessor on the stage is done by construction. */
static int fluid_input_ready(const struct fluid *f, int s)
{
    if (f->position[s] >= f->L) return 0;
    if (f->position[s] < 0) return 1;
    int code = f->list[s * f->L + f->position[s]];
    if (code < f->m) return s == 0 || f->done[(s - 1) * f->L + code];
    return s == f->S - 1 || f->done[(s + 1) * f->L + code];
}

/* Marks stage s's instruction done and loads its next one. */
static void sim_finish(struct fluid *f, int s)
{
    if (f->position[s] >= 0) f->done[s * f->L + f->list[s * f->L + f->position[s]]] = 1;
    f->position[s]++;
    fluid_load(f, s);
}

/* Sets up either simulation at the start of the step; returns the number
 * of instructions to run (updates included). */
static long sim_init(struct fluid *f, const double *stage_fwd_ms, const double *stage_bwd_ms,
                     const double *stage_update_ms, int S, int m,
                     enum dm_schedule schedule, const struct balance_sharing *sharing)
{
    *f = (struct fluid){.S = S, .m = m, .L = 2L * m, .fwd = stage_fwd_ms,
                        .bwd = stage_bwd_ms, .update = stage_update_ms,
                        .sharing = sharing};
    long total = (long)S * f->L;
    f->list = dm_alloc((size_t)total * sizeof(int));
    f->done = dm_alloc((size_t)total);
    f->position = dm_alloc((size_t)S * sizeof(long));
    f->remaining = dm_alloc((size_t)S * sizeof(double));
    f->size = dm_alloc((size_t)S * sizeof(double));
    f->computing = dm_alloc((size_t)S * sizeof(int));
    f->members = dm_alloc((size_t)sharing->groups * sizeof(int));
    f->rate = dm_alloc((size_t)sharing->groups * sizeof(double));
    f->queue = dm_alloc((size_t)S * sizeof(int));
    f->end = dm_alloc((size_t)S * sizeof(double));
    long left = total;
    struct schedule_instr *scratch = dm_alloc(SCHEDULE_MAX_INSTRS((size_t)m) *
                                              sizeof *scratch);
    for (int s = 0; s < S; s++) {
        stage_codes(f->list + s * f->L, scratch, s, S, m, schedule);
        if (stage_update_ms && stage_update_ms[s] > 0) {
            f->position[s] = -1;
            left++;
        }
        fluid_load(f, s);
    }
    dm_free(scratch);
    return left;
}

static void sim_free(struct fluid *f)
{
    dm_free(f->end);
    dm_free(f->queue);
    dm_free(f->rate);
    dm_free(f->members);
    dm_free(f->computing);
    dm_free(f->size);
    dm_free(f->remaining);
    dm_free(f->position);
    dm_free(f->done);
    dm_free(f->list);
}

/* One event: the computing stages share their groups' cores until the
 * first instruction completes; every instruction then within a rounding of
 * completion completes too. Returns the time advanced and the number of
 * instructions completed (>= 1) in *completed. */
static double fluid_event(struct fluid *f, long *completed)
{
    const struct balance_sharing *sh = f->sharing;
    memset(f->members, 0, (size_t)sh->groups * sizeof(int));
    for (int s = 0; s < f->S; s++) {
        f->computing[s] = fluid_input_ready(f, s);
        f->members[sh->group[s]] += f->computing[s];
    }
    for (int g = 0; g < sh->groups; g++)
        f->rate[g] = f->members[g] > 0 ? fmin(1.0, sh->cores[g] / f->members[g]) : 1.0;
    double dt = INFINITY;
    int first = -1;
    for (int s = 0; s < f->S; s++) {
        if (!f->computing[s]) continue;
        double t = f->remaining[s] / f->rate[sh->group[s]];
        if (t < dt) dt = t, first = s;
    }
    DM_ASSERT(first >= 0);  /* the schedules cannot deadlock */
    *completed = 0;
    for (int s = 0; s < f->S; s++) {
        if (!f->computing[s]) continue;
        f->remaining[s] = s == first ? 0.0 : f->remaining[s] - f->rate[sh->group[s]] * dt;
        if (f->remaining[s] > 1e-12 * f->size[s]) continue;
        sim_finish(f, s);
        (*completed)++;
    }
    return dt;
}

enum { TURN_QUEUED = 1, TURN_RUNNING = 2 };

/* Turns: queues every idle stage whose input is ready, `first` (the stage
 * that just finished, which asks again at once) before the others in stage
 * order. An instruction of no work needs no core: it finishes at once,
 * which may ready others. Returns the instructions finished. */
static long turns_queue(struct fluid *f, int first)
{
    long finished = 0;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = -1; i < f->S; i++) {
            int s = i < 0 ? first : i;
            if (s < 0 || (i >= 0 && s == first)) continue;
            if (f->computing[s] || !fluid_input_ready(f, s)) continue;
            if (f->size[s] > 0) {
                f->computing[s] = TURN_QUEUED;
                f->queue[f->queued++] = s;
                continue;
            }
            sim_finish(f, s);
            finished++;
            changed = 1;
        }
    }
    return finished;
}

/* Turns from the start of the step: the stages of each group take turns on
 * its cores (core counts whole): an instruction whose input is ready waits
 * for a free core of its group, waiting instructions start in the order
 * they became ready, and each runs alone at rate 1 until it ends. Returns
 * the step time. */
static double turns_run(struct fluid *f, long left)
{
    const struct balance_sharing *sharing = f->sharing;
    for (int g = 0; g < sharing->groups; g++) f->members[g] = (int)sharing->cores[g];
    double now = 0.0;
    int last = -1;
    for (;;) {
        left -= turns_queue(f, last);
        int kept = 0;   /* start whom a free core of its group allows, in order */
        for (int q = 0; q < f->queued; q++) {
            int s = f->queue[q], g = sharing->group[s];
            if (f->members[g] > 0) {
                f->members[g]--;
                f->end[s] = now + f->size[s];
                f->computing[s] = TURN_RUNNING;
            } else {
                f->queue[kept++] = s;
            }
        }
        f->queued = kept;
        if (left == 0) break;
        last = -1;
        for (int s = 0; s < f->S; s++)
            if (f->computing[s] == TURN_RUNNING && (last < 0 || f->end[s] < f->end[last]))
                last = s;
        DM_ASSERT(last >= 0);   /* the schedules cannot deadlock */
        now = f->end[last];
        f->computing[last] = 0;
        f->members[sharing->group[last]]++;
        sim_finish(f, last);
        left--;
    }
    return now;
}

/* The step time under processor sharing (inputs checked): fluid, or turns. */
static double shared_step(const double *stage_fwd_ms, const double *stage_bwd_ms,
                          const double *stage_update_ms, int S, int m,
                          enum dm_schedule schedule,
                          const struct balance_sharing *sharing)
{
    struct fluid f;
    long left = sim_init(&f, stage_fwd_ms, stage_bwd_ms, stage_update_ms, S, m, schedule,
                         sharing);
    double now = 0.0;
    if (sharing->turns) {
        now = turns_run(&f, left);
    } else {
        while (left > 0) {
            long completed;
            now += fluid_event(&f, &completed);
            left -= completed;
        }
    }
    sim_free(&f);
    return now;
}

int balance_predict_shared(const double *stage_fwd_ms,
                           const double *stage_bwd_ms,
                           const double *stage_update_ms, int stages,
                           int micro_batches, enum dm_schedule schedule,
                           const struct balance_sharing *sharing,
                           struct balance_prediction *out,
                           char *err, size_t errsize)
{
    int rc = sharing ? balance_check_sharing(sharing, err, errsize) : BALANCE_OK;
    if (rc) return rc;
    rc = check_stage_times(stage_fwd_ms, stage_bwd_ms, stage_update_ms, stages,
                           micro_batches, schedule, err, errsize);
    if (rc) return rc;
    double step = balance_sharing_oversubscribed(sharing, stages)
        ? shared_step(stage_fwd_ms, stage_bwd_ms, stage_update_ms, stages,
                      micro_batches, schedule, sharing)
        : dedicated_step(stage_fwd_ms, stage_bwd_ms, stage_update_ms, stages,
                         micro_batches, schedule);
    describe_step(out, step, stage_fwd_ms, stage_bwd_ms, stage_update_ms, stages,
                  micro_batches);
    return BALANCE_OK;
}

static int check_block_times(const struct balance_profile *profile, char *err,
                             size_t errsize)
{
    for (int i = 0; i < profile->blocks; i++)
        if (!(profile->fwd_ms[i] >= 0) || !(profile->bwd_ms[i] >= 0) ||
            !isfinite(profile->fwd_ms[i]) || !isfinite(profile->bwd_ms[i]))
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "block %d: fwd_ms %g or bwd_ms %g is negative "
                                "or not a number", i, profile->fwd_ms[i],
                                profile->bwd_ms[i]);
    return BALANCE_OK;
}

/* The profile's forward, backward and update times as three cost lists
 * over its blocks (upd->cost NULL when the blocks have no update);
 * returns whether anything has an update. */
static int profile_time_lists(const struct balance_profile *profile,
                              struct balance_costs *fwd, struct balance_costs *bwd,
                              struct balance_costs *upd)
{
    *fwd = (struct balance_costs){
        .blocks = profile->blocks, .cost = profile->fwd_ms,
        .mem_bytes = profile->mem_bytes, .first_cost = profile->embed.fwd_ms,
        .last_cost = profile->head.fwd_ms};
    *bwd = *fwd;
    bwd->cost = profile->bwd_ms;
    bwd->first_cost = profile->embed.bwd_ms;
    bwd->last_cost = profile->head.bwd_ms;
    *upd = *fwd;
    upd->cost = profile->update_ms;
    upd->first_cost = profile->embed.update_ms;
    upd->last_cost = profile->head.update_ms;
    return profile->update_ms || profile->embed.update_ms != 0 ||
           profile->head.update_ms != 0;
}

/* Each stage's forward, backward and (upd not NULL) update time of the
 * layout counts, into times: (3, stages). */
static void layout_stage_times(const struct balance_costs *fwd,
                               const struct balance_costs *bwd,
                               const struct balance_costs *upd, int stages,
                               const int *counts, double *times)
{
    struct balance_problem pf, pb, pu;
    problem_init(&pf, fwd, stages, 0);
    problem_init(&pb, bwd, stages, 0);
    if (upd) problem_init(&pu, upd, stages, 0);
    int begin = 0;
    for (int s = 0; s < stages; s++) {
        int end = begin + counts[s];
        times[s] = problem_stage_cost(&pf, s, begin, end);
        times[stages + s] = problem_stage_cost(&pb, s, begin, end);
        if (upd) times[2 * stages + s] = problem_stage_cost(&pu, s, begin, end);
        begin = end;
    }
    if (upd) problem_free(&pu);
    problem_free(&pb);
    problem_free(&pf);
}

int balance_predict(const struct balance_profile *profile, int stages,
                    const int *counts, int micro_batches,
                    enum dm_schedule schedule, struct balance_prediction *out,
                    char *err, size_t errsize)
{
    int rc = balance_check_layout(counts, stages, profile->blocks, err, errsize);
    if (rc == BALANCE_OK) rc = check_block_times(profile, err, errsize);
    if (rc) return rc;
    struct balance_costs fwd, bwd, upd;
    int with_update = profile_time_lists(profile, &fwd, &bwd, &upd);
    double *zeros = NULL;   /* the blocks' updates when only the extras have one */
    if (with_update && !upd.cost)
        upd.cost = zeros = dm_alloc((size_t)profile->blocks * sizeof(double));
    rc = balance_check_costs(&fwd, stages, 0, err, errsize);
    if (rc == BALANCE_OK) rc = balance_check_costs(&bwd, stages, 0, err, errsize);
    if (rc == BALANCE_OK && with_update)
        rc = balance_check_costs(&upd, stages, 0, err, errsize);
    if (rc) {
        dm_free(zeros);
        return rc;
    }
    double *times = dm_alloc(3 * (size_t)stages * sizeof(double));
    layout_stage_times(&fwd, &bwd, with_update ? &upd : NULL, stages, counts, times);
    rc = balance_predict_shared(times, times + stages,
                                with_update ? times + 2 * stages : NULL, stages,
                                micro_batches, schedule, profile->sharing, out,
                                err, errsize);
    dm_free(times);
    dm_free(zeros);
    return rc;
}
