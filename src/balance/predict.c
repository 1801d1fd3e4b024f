/* The step-time predictor, the one simulator of the schedules: simulates the
 * instruction lists of schedule_stage_chunks (GPipe, 1F1B, ZB-H1,
 * interleaved 1F1B; their forwards, backwards and weight gradients, in
 * order) with zero communication time, from per-(virtual-)stage forward,
 * backward and weight-gradient times and updates at the step's end, with a
 * processor per stage or with stages sharing processors. The balancers and
 * `dynmo plan` use it to compare layouts and to decide re-packing; the
 * engine can feed it measured stage times. Must not: model communication
 * or memory (that is the engine's to measure), keep an order of its own
 * beside schedule_stage_chunks', or depend on anything but its arguments. */
#include <math.h>
#include <string.h>
#include "balance_internal.h"

/* The lists as the simulations read them. A stage's computing
 * instructions are coded kind x (v m) + chunk x m + micro-batch, kind 0 a
 * forward, 1 a backward (BWD), 2 a weight gradient (WGRAD, zb only); for
 * GPipe and 1F1B that is k for forward k and m + k for backward k. Each
 * instruction starts when its predecessor on the stage and its cross-stage
 * input have finished: forward k of virtual stage u after forward k of
 * u - 1, backward k after backward k of u + 1 (virtual stage u = chunk x S
 * + stage; the last stage's chunk c feeds the first stage's chunk c + 1);
 * a weight gradient needs only its own stage's backward, before it in the
 * list. Transfers take no time. Times are per virtual stage: f, b (the
 * backward: BWD under zb, else the whole backward) and w (zb's WGRAD). */
struct sim_lists {
    int S, v, m, kinds;     /* kinds: 3 with weight gradients, else 2 */
    long L;                 /* kinds v m instructions per stage */
    int *list;              /* (S, L) codes in list order */
    const double *f, *b, *w;   /* (S v) */
};

/* Fills sl->list from schedule_stage_chunks. */
static void lists_build(struct sim_lists *sl, enum dm_schedule schedule)
{
    int vm = sl->v * sl->m;
    sl->kinds = schedule_splits_backward(schedule) ? 3 : 2;
    sl->L = (long)sl->kinds * vm;
    sl->list = dm_alloc((size_t)sl->S * (size_t)sl->L * sizeof(int));
    struct schedule_instr *scratch = dm_alloc(SCHEDULE_MAX_INSTRS((size_t)vm) *
                                              sizeof *scratch);
    for (int s = 0; s < sl->S; s++) {
        int n = schedule_stage_chunks(scratch, schedule, s, sl->S, sl->v, sl->m);
        long pos = 0;
        for (int i = 0; i < n; i++) {
            int kind = scratch[i].op == SCHEDULE_FWD ? 0 : scratch[i].op == SCHEDULE_BWD ? 1
                     : scratch[i].op == SCHEDULE_WGRAD ? 2 : -1;
            if (kind < 0) continue;
            sl->list[s * sl->L + pos++] = kind * vm + scratch[i].chunk * sl->m +
                                          scratch[i].micro_batch;
        }
        DM_ASSERT(pos == sl->L);
    }
    dm_free(scratch);
}

static int code_kind(const struct sim_lists *sl, int code)
{
    return code / (sl->v * sl->m);
}

/* The virtual stage of stage s's instruction `code`. */
static int code_vstage(const struct sim_lists *sl, int s, int code)
{
    return (code % (sl->v * sl->m)) / sl->m * sl->S + s;
}

static double code_cost(const struct sim_lists *sl, int s, int code)
{
    int u = code_vstage(sl, s, code), kind = code_kind(sl, code);
    return kind == 0 ? sl->f[u] : kind == 1 ? sl->b[u] : sl->w[u];
}

/* The instruction on virtual stage u that feeds (direction -1) or is fed by
 * (+1) stage s's `code`: its stage in *stage, its code returned; -1 when
 * there is none (a weight gradient, or the pipeline's end). */
static int code_neighbour(const struct sim_lists *sl, int s, int code, int direction,
                          int *stage)
{
    int kind = code_kind(sl, code);
    if (kind == 2) return -1;
    int step = kind == 0 ? direction : -direction;   /* backwards flow the other way */
    int u = code_vstage(sl, s, code) + step;
    if (u < 0 || u >= sl->S * sl->v) return -1;
    *stage = u % sl->S;
    return kind * sl->v * sl->m + (u / sl->S) * sl->m + code % sl->m;
}

#define PREDICT_MAX_INSTRUCTIONS ((long)1 << 26)

/* The checks every simulation starts with: f, b, w (w NULL or zb's weight
 * gradients, at most b) per virtual stage, updates per stage. */
static int check_stage_times(const double *f, const double *b, const double *w,
                             const double *stage_update_ms, int S, int v, int m,
                             enum dm_schedule schedule, char *err, size_t errsize)
{
    if (S < 1)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "stages must be at least 1 (got %d)", S);
    if (m < 1)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "micro-batches must be at least 1 (got %d)", m);
    if (schedule != DM_SCHEDULE_1F1B && schedule != DM_SCHEDULE_GPIPE &&
        schedule != DM_SCHEDULE_ZB && schedule != DM_SCHEDULE_INTERLEAVED)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "unknown schedule %d", (int)schedule);
    if (v < 1 || (v > 1 && schedule != DM_SCHEDULE_INTERLEAVED))
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%d chunks per stage: only the interleaved schedule has "
                            "more than one", v);
    if (v > 1 && m % S != 0)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "interleaved: %d micro-batches is not a multiple of the %d "
                            "stages", m, S);
    if ((double)S * v * (schedule_splits_backward(schedule) ? 3 : 2) * m >
        (double)PREDICT_MAX_INSTRUCTIONS)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "%d stages x %d micro-batches is too large to "
                            "simulate", S, m);
    for (int u = 0; u < S * v; u++) {
        const char *what = v > 1 ? "virtual stage" : "stage";
        if (!isfinite(f[u]) || f[u] < 0 || !isfinite(b[u]) || b[u] < 0)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "%s %d: time (%g fwd, %g bwd) is negative "
                                "or not a number", what, u, f[u], b[u]);
        if (w && (!isfinite(w[u]) || w[u] < 0 || w[u] > b[u]))
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "%s %d: weight-gradient time %g is negative, not a "
                                "number or more than the backward's %g", what, u, w[u],
                                b[u]);
    }
    for (int s = 0; stage_update_ms && s < S; s++)
        if (!isfinite(stage_update_ms[s]) || stage_update_ms[s] < 0)
            return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                                "stage %d: update time %g is negative or not "
                                "a number", s, stage_update_ms[s]);
    return BALANCE_OK;
}

/* Fills out from the simulated step time: the bubble ratio and the
 * bottleneck (balance.h); f and b per virtual stage, b the whole backward. */
static void describe_step(struct balance_prediction *out, double step, const double *f,
                          const double *b, const double *stage_update_ms, int S, int v,
                          int m)
{
    double busy = 0.0, widest = -1.0;
    int bottleneck = 0;
    for (int s = 0; s < S; s++) {
        double per_micro_batch = f[s] + b[s];
        for (int c = 1; c < v; c++) per_micro_batch += f[c * S + s] + b[c * S + s];
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
static double dedicated_step(const struct sim_lists *sl, const double *stage_update_ms)
{
    int S = sl->S;
    long L = sl->L, total = (long)S * L;
    int *position = dm_alloc((size_t)total * sizeof(int));  /* (S, L) by code */
    int *pending = dm_alloc((size_t)total * sizeof(int));   /* unmet inputs */
    long *ready = dm_alloc((size_t)total * sizeof(long));   /* stack of ids */
    double *earliest = dm_alloc((size_t)total * sizeof(double));
    for (int s = 0; s < S; s++) {
        for (long pos = 0; pos < L; pos++) {
            int code = sl->list[s * L + pos], other;
            position[s * L + code] = (int)pos;
            int cross = code_neighbour(sl, s, code, -1, &other) >= 0;
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
        int code = sl->list[id];
        double finish = earliest[id] + code_cost(sl, s, code);
        if (finish > step) step = finish;
        done++;
        long successors[2];
        int count = 0, next_stage;
        if (pos + 1 < L) successors[count++] = id + 1;
        int next_code = code_neighbour(sl, s, code, +1, &next_stage);
        if (next_code >= 0)
            successors[count++] = next_stage * L + position[next_stage * L + next_code];
        for (int i = 0; i < count; i++) {
            long next = successors[i];
            if (finish > earliest[next]) earliest[next] = finish;
            if (--pending[next] == 0) ready[top++] = next;
        }
    }
    DM_ASSERT(done == total);
    dm_free(earliest);
    dm_free(ready);
    dm_free(pending);
    dm_free(position);
    return step;
}

int balance_predict_stages(const double *stage_fwd_ms,
                           const double *stage_bwd_ms, int stages,
                           int micro_batches, enum dm_schedule schedule,
                           struct balance_prediction *out,
                           char *err, size_t errsize)
{
    return balance_predict_chunks(stage_fwd_ms, stage_bwd_ms, NULL, NULL, stages, 1,
                                  micro_batches, schedule, NULL, out, err, errsize);
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
    const struct sim_lists *sl;
    int S;
    long L;                 /* instructions per stage */
    const double *update;   /* (S) may be NULL */
    const struct balance_sharing *sharing;
    const int *list;        /* (S, L) codes, sl's */
    char *done;             /* (S, L) by code */
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
    if (f->position[s] < 0)
        f->size[s] = f->update[s];
    else
        f->size[s] = code_cost(f->sl, s, f->list[s * f->L + f->position[s]]);
    f->remaining[s] = f->size[s];
}

/* Whether stage s's current instruction has its cross-stage input:
 * forward k after forward k upstream, backward k after backward k
 * downstream; its predecessor on the stage is done by construction. */
static int fluid_input_ready(const struct fluid *f, int s)
{
    if (f->position[s] >= f->L) return 0;
    if (f->position[s] < 0) return 1;
    int other, code = code_neighbour(f->sl, s, f->list[s * f->L + f->position[s]], -1, &other);
    return code < 0 || f->done[other * f->L + code];
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
static long sim_init(struct fluid *f, const struct sim_lists *sl,
                     const double *stage_update_ms, const struct balance_sharing *sharing)
{
    int S = sl->S;
    *f = (struct fluid){.sl = sl, .S = S, .L = sl->L, .update = stage_update_ms,
                        .sharing = sharing, .list = sl->list};
    long total = (long)S * f->L;
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
    for (int s = 0; s < S; s++) {
        if (stage_update_ms && stage_update_ms[s] > 0) {
            f->position[s] = -1;
            left++;
        }
        fluid_load(f, s);
    }
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
static double shared_step(const struct sim_lists *sl, const double *stage_update_ms,
                          const struct balance_sharing *sharing)
{
    struct fluid f;
    long left = sim_init(&f, sl, stage_update_ms, sharing);
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

int balance_predict_chunks(const double *fwd_ms, const double *bwd_ms,
                           const double *wgrad_ms, const double *stage_update_ms,
                           int stages, int virtual, int micro_batches,
                           enum dm_schedule schedule, const struct balance_sharing *sharing,
                           struct balance_prediction *out, char *err, size_t errsize)
{
    int rc = sharing ? balance_check_sharing(sharing, err, errsize) : BALANCE_OK;
    if (rc) return rc;
    int split = schedule_splits_backward(schedule);
    rc = check_stage_times(fwd_ms, bwd_ms, split ? wgrad_ms : NULL, stage_update_ms, stages,
                           virtual, micro_batches, schedule, err, errsize);
    if (rc) return rc;
    int V = stages * virtual;
    double *split_times = NULL;    /* zb: (2, V) the BWD and WGRAD parts */
    struct sim_lists sl = {.S = stages, .v = virtual, .m = micro_batches, .f = fwd_ms,
                           .b = bwd_ms};
    if (split) {
        split_times = dm_alloc(2 * (size_t)V * sizeof(double));
        for (int u = 0; u < V; u++) {
            double w = wgrad_ms ? wgrad_ms[u] : 0.5 * bwd_ms[u];
            split_times[u] = bwd_ms[u] - w;
            split_times[V + u] = w;
        }
        sl.b = split_times;
        sl.w = split_times + V;
    }
    lists_build(&sl, schedule);
    double step = balance_sharing_oversubscribed(sharing, stages)
        ? shared_step(&sl, stage_update_ms, sharing)
        : dedicated_step(&sl, stage_update_ms);
    describe_step(out, step, fwd_ms, bwd_ms, stage_update_ms, stages, virtual, micro_batches);
    dm_free(sl.list);
    dm_free(split_times);
    return BALANCE_OK;
}

int balance_predict_shared(const double *stage_fwd_ms,
                           const double *stage_bwd_ms,
                           const double *stage_update_ms, int stages,
                           int micro_batches, enum dm_schedule schedule,
                           const struct balance_sharing *sharing,
                           struct balance_prediction *out,
                           char *err, size_t errsize)
{
    return balance_predict_chunks(stage_fwd_ms, stage_bwd_ms, NULL, stage_update_ms, stages,
                                  1, micro_batches, schedule, sharing, out, err, errsize);
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

/* The profile's forward, backward, update and (zb) weight-gradient times
 * as cost lists over its blocks (upd->cost NULL when the blocks have no
 * update; the weight gradients: profile->wgrad_ms, else half of each
 * backward, into wgrad (blocks) when it is not NULL); returns whether
 * anything has an update. */
static int profile_time_lists(const struct balance_profile *profile,
                              struct balance_costs *fwd, struct balance_costs *bwd,
                              struct balance_costs *upd, struct balance_costs *wgd,
                              double *wgrad)
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
    if (wgrad) {
        for (int i = 0; i < profile->blocks; i++)
            wgrad[i] = profile->wgrad_ms ? profile->wgrad_ms[i] : 0.5 * profile->bwd_ms[i];
        *wgd = *bwd;
        wgd->cost = wgrad;
        wgd->first_cost = 0.5 * profile->embed.bwd_ms;
        wgd->last_cost = 0.5 * profile->head.bwd_ms;
    }
    return profile->update_ms || profile->embed.update_ms != 0 ||
           profile->head.update_ms != 0;
}

/* Each (virtual) stage's forward, backward, update (upd not NULL) and
 * weight-gradient (wgd not NULL) time of the layout counts, into times:
 * (4, stages). */
static void layout_stage_times(const struct balance_costs *fwd,
                               const struct balance_costs *bwd,
                               const struct balance_costs *upd,
                               const struct balance_costs *wgd, int stages,
                               const int *counts, double *times)
{
    struct balance_problem pf, pb, pu, pw;
    problem_init(&pf, fwd, stages, 0);
    problem_init(&pb, bwd, stages, 0);
    if (upd) problem_init(&pu, upd, stages, 0);
    if (wgd) problem_init(&pw, wgd, stages, 0);
    int begin = 0;
    for (int s = 0; s < stages; s++) {
        int end = begin + counts[s];
        times[s] = problem_stage_cost(&pf, s, begin, end);
        times[stages + s] = problem_stage_cost(&pb, s, begin, end);
        if (upd) times[2 * stages + s] = problem_stage_cost(&pu, s, begin, end);
        if (wgd) times[3 * stages + s] = problem_stage_cost(&pw, s, begin, end);
        begin = end;
    }
    if (wgd) problem_free(&pw);
    if (upd) problem_free(&pu);
    problem_free(&pb);
    problem_free(&pf);
}

int balance_predict(const struct balance_profile *profile, int stages,
                    const int *counts, int micro_batches,
                    enum dm_schedule schedule, struct balance_prediction *out,
                    char *err, size_t errsize)
{
    int v = profile->virtual_stages > 1 ? profile->virtual_stages : 1;
    if (stages % v != 0)
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "a layout of %d chunks is no whole number of stages of %d "
                            "chunks", stages, v);
    int rc = balance_check_layout(counts, stages, profile->blocks, err, errsize);
    if (rc == BALANCE_OK) rc = check_block_times(profile, err, errsize);
    if (rc) return rc;
    int split = schedule_splits_backward(schedule);
    struct balance_costs fwd, bwd, upd, wgd;
    double *wgrad = split ? dm_alloc((size_t)profile->blocks * sizeof(double)) : NULL;
    int with_update = profile_time_lists(profile, &fwd, &bwd, &upd, &wgd, wgrad);
    double *zeros = NULL;   /* the blocks' updates when only the extras have one */
    if (with_update && !upd.cost)
        upd.cost = zeros = dm_alloc((size_t)profile->blocks * sizeof(double));
    rc = balance_check_costs(&fwd, stages, 0, err, errsize);
    if (rc == BALANCE_OK) rc = balance_check_costs(&bwd, stages, 0, err, errsize);
    if (rc == BALANCE_OK && with_update)
        rc = balance_check_costs(&upd, stages, 0, err, errsize);
    if (rc == BALANCE_OK && split) rc = balance_check_costs(&wgd, stages, 0, err, errsize);
    if (rc) {
        dm_free(zeros);
        dm_free(wgrad);
        return rc;
    }
    double *times = dm_alloc(4 * (size_t)stages * sizeof(double));
    layout_stage_times(&fwd, &bwd, with_update ? &upd : NULL, split ? &wgd : NULL, stages,
                       counts, times);
    int ranks = stages / v;
    for (int s = 0; split && s < stages; s++)   /* sums of parts may round above the whole */
        if (times[3 * stages + s] > times[stages + s]) times[3 * stages + s] = times[stages + s];
    double *update = with_update ? times + 2 * stages : NULL;
    if (update)   /* a rank's update: its chunks', in chunk order */
        for (int s = 0; s < ranks; s++)
            for (int c = 1; c < v; c++) update[s] += update[c * ranks + s];
    rc = balance_predict_chunks(times, times + stages, split ? times + 3 * stages : NULL,
                                update, ranks, v, micro_batches, schedule,
                                profile->sharing, out, err, errsize);
    dm_free(times);
    dm_free(zeros);
    dm_free(wgrad);
    return rc;
}
