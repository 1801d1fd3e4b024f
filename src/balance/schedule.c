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
