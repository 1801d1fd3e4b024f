/* Pipeline schedules as per-stage instruction lists (GPipe and 1F1B): the
 * one definition of each schedule. The engine executes a stage's list; the
 * predictor (predict.c) simulates the same lists. Must not: call MPI, touch
 * the model or do I/O, or encode anything about time (that is the
 * predictor's). */
#include <string.h>
#include "dynmo/balance.h"

static const char *const op_names[SCHEDULE_OP_COUNT] = {
    [SCHEDULE_RECV_ACT] = "RECV_ACT",   [SCHEDULE_FWD] = "FWD",
    [SCHEDULE_SEND_ACT] = "SEND_ACT",   [SCHEDULE_RECV_GRAD] = "RECV_GRAD",
    [SCHEDULE_BWD] = "BWD",             [SCHEDULE_SEND_GRAD] = "SEND_GRAD",
    [SCHEDULE_REDUCE_GRADS] = "REDUCE_GRADS",
    [SCHEDULE_OPTIMIZER_STEP] = "OPTIMIZER_STEP",
};

const char *schedule_op_name(enum schedule_op op)
{
    return ((int)op >= 0 && op < SCHEDULE_OP_COUNT) ? op_names[op] : "?";
}

/* Appends the receive-forward-send triple (or backward triple) of one
 * micro-batch, leaving out the transfers that do not exist at the ends of
 * the pipeline. */
static int emit_forward(struct schedule_instr *out, int n, int mb, int first, int last)
{
    if (!first) out[n++] = (struct schedule_instr){SCHEDULE_RECV_ACT, mb};
    out[n++] = (struct schedule_instr){SCHEDULE_FWD, mb};
    if (!last) out[n++] = (struct schedule_instr){SCHEDULE_SEND_ACT, mb};
    return n;
}

static int emit_backward(struct schedule_instr *out, int n, int mb, int first, int last)
{
    if (!last) out[n++] = (struct schedule_instr){SCHEDULE_RECV_GRAD, mb};
    out[n++] = (struct schedule_instr){SCHEDULE_BWD, mb};
    if (!first) out[n++] = (struct schedule_instr){SCHEDULE_SEND_GRAD, mb};
    return n;
}

int schedule_stage(struct schedule_instr *out, enum dm_schedule kind, int stage,
                   int stages, int micro_batches)
{
    DM_ASSERT(stages >= 1 && micro_batches >= 1 && stage >= 0 && stage < stages);
    DM_ASSERT(kind == DM_SCHEDULE_1F1B || kind == DM_SCHEDULE_GPIPE);
    int first = stage == 0, last = stage == stages - 1;
    int m = micro_batches;
    int n = 0;
    if (kind == DM_SCHEDULE_GPIPE) {
        for (int mb = 0; mb < m; mb++) n = emit_forward(out, n, mb, first, last);
        for (int mb = 0; mb < m; mb++) n = emit_backward(out, n, mb, first, last);
    } else {
        /* Stage s runs ahead by S-s-1 forwards so that, in the steady
         * state, the gradient of micro-batch j comes back from the next
         * stage just as this stage finishes forward j + warmup. */
        int warmup = stages - stage - 1;
        if (warmup > m) warmup = m;
        for (int mb = 0; mb < warmup; mb++) n = emit_forward(out, n, mb, first, last);
        for (int j = 0; j < m - warmup; j++) {
            n = emit_forward(out, n, warmup + j, first, last);
            n = emit_backward(out, n, j, first, last);
        }
        for (int mb = m - warmup; mb < m; mb++) n = emit_backward(out, n, mb, first, last);
    }
    out[n++] = (struct schedule_instr){SCHEDULE_REDUCE_GRADS, -1};
    out[n++] = (struct schedule_instr){SCHEDULE_OPTIMIZER_STEP, -1};
    DM_ASSERT(n <= SCHEDULE_MAX_INSTRS(m));
    return n;
}

void schedule_build(struct schedule *sched, enum dm_schedule kind, int stages,
                    int micro_batches)
{
    DM_ASSERT(stages >= 1 && micro_batches >= 1);
    sched->kind = kind;
    sched->stages = stages;
    sched->micro_batches = micro_batches;
    sched->offset = dm_alloc((size_t)(stages + 1) * sizeof *sched->offset);
    size_t capacity = (size_t)stages * SCHEDULE_MAX_INSTRS(micro_batches);
    sched->instr = dm_alloc(capacity * sizeof *sched->instr);
    int n = 0;
    for (int s = 0; s < stages; s++) {
        sched->offset[s] = n;
        n += schedule_stage(sched->instr + n, kind, s, stages, micro_batches);
    }
    sched->offset[stages] = n;
}

void schedule_free(struct schedule *sched)
{
    dm_free(sched->offset);
    dm_free(sched->instr);
    memset(sched, 0, sizeof *sched);
}

int schedule_peak_activations(const struct schedule *sched, int stage)
{
    DM_ASSERT(stage >= 0 && stage < sched->stages);
    int alive = 0, peak = 0;
    for (int i = sched->offset[stage]; i < sched->offset[stage + 1]; i++) {
        if (sched->instr[i].op == SCHEDULE_FWD && ++alive > peak) peak = alive;
        if (sched->instr[i].op == SCHEDULE_BWD) alive--;
    }
    return peak;
}

int schedule_simulate(const struct schedule *sched, const double *fwd_ms,
                      const double *bwd_ms, const double *update_ms, double send_ms,
                      struct schedule_timing *timing)
{
    int S = sched->stages, m = sched->micro_batches;
    /* Send times of the messages crossing boundary b (between stages b and
     * b+1), per micro-batch; negative until sent. */
    size_t crossings = (size_t)(S > 1 ? S - 1 : 1) * (size_t)m;
    double *act_sent = dm_alloc(crossings * sizeof *act_sent);   /* (S-1, m) */
    double *grad_sent = dm_alloc(crossings * sizeof *grad_sent); /* (S-1, m) */
    for (size_t i = 0; i < crossings; i++) act_sent[i] = grad_sent[i] = -1.0;
    int *pc = dm_alloc((size_t)S * sizeof *pc);           /* (S) next instruction */
    double *clock = dm_alloc((size_t)S * sizeof *clock);  /* (S) */
    double *busy = dm_alloc((size_t)S * sizeof *busy);    /* (S) */
    for (int s = 0; s < S; s++) pc[s] = sched->offset[s];

    /* Sweep the stages, running each until it blocks on a receive whose
     * message is not sent yet. A sent message's time is final, so the
     * result does not depend on the sweep order; a sweep without progress
     * while lists remain is a deadlock. */
    int progress = 1, remaining = 1;
    while (progress && remaining) {
        progress = 0;
        remaining = 0;
        for (int s = 0; s < S; s++) {
            for (; pc[s] < sched->offset[s + 1]; pc[s]++) {
                const struct schedule_instr *in = &sched->instr[pc[s]];
                int mb = in->micro_batch;
                if (in->op != SCHEDULE_REDUCE_GRADS && in->op != SCHEDULE_OPTIMIZER_STEP)
                    DM_ASSERT(mb >= 0 && mb < m);
                double *arrival = NULL;
                if (in->op == SCHEDULE_RECV_ACT) {
                    DM_ASSERT(s > 0);
                    arrival = &act_sent[(size_t)(s - 1) * m + mb];
                } else if (in->op == SCHEDULE_RECV_GRAD) {
                    DM_ASSERT(s < S - 1);
                    arrival = &grad_sent[(size_t)s * m + mb];
                }
                if (arrival) {
                    if (*arrival < 0) break;   /* blocked */
                    double at = *arrival + send_ms;
                    if (at > clock[s]) clock[s] = at;
                    continue;
                }
                switch (in->op) {
                case SCHEDULE_FWD:
                    clock[s] += fwd_ms[s];
                    busy[s] += fwd_ms[s];
                    break;
                case SCHEDULE_BWD:
                    clock[s] += bwd_ms[s];
                    busy[s] += bwd_ms[s];
                    break;
                case SCHEDULE_SEND_ACT:
                    DM_ASSERT(s < S - 1);
                    act_sent[(size_t)s * m + mb] = clock[s];
                    break;
                case SCHEDULE_SEND_GRAD:
                    DM_ASSERT(s > 0);
                    grad_sent[(size_t)(s - 1) * m + mb] = clock[s];
                    break;
                case SCHEDULE_OPTIMIZER_STEP:
                    if (update_ms) {
                        clock[s] += update_ms[s];
                        busy[s] += update_ms[s];
                    }
                    break;
                default:
                    break;
                }
                progress = 1;
            }
            if (pc[s] < sched->offset[s + 1]) remaining = 1;
        }
    }

    int status = remaining ? -1 : 0;
    double step = 0;
    for (int s = 0; s < S; s++)
        if (clock[s] > step) step = clock[s];
    double idle_sum = 0;
    for (int s = 0; s < S; s++) {
        double idle = step - busy[s];
        idle_sum += idle;
        if (timing->busy_ms) timing->busy_ms[s] = busy[s];
        if (timing->idle_ms) timing->idle_ms[s] = idle;
    }
    timing->step_ms = step;
    timing->bubble_fraction = step > 0 ? idle_sum / ((double)S * step) : 0.0;
    dm_free(act_sent);
    dm_free(grad_sent);
    dm_free(pc);
    dm_free(clock);
    dm_free(busy);
    return status;
}
