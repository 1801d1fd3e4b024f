/* Pipeline schedules as per-stage instruction lists (GPipe and 1F1B here,
 * ZB-H1 in schedule_zb.c, interleaved 1F1B in schedule_interleaved.c): the
 * one definition of each schedule. The engine executes a stage's list; the
 * predictor (predict.c) simulates the same lists. Must not: call MPI, touch
 * the model or do I/O, or encode anything about time (that is the
 * predictor's). */
#include <string.h>
#include "balance_internal.h"

static const char *const op_names[SCHEDULE_OP_COUNT] = {
    [SCHEDULE_RECV_ACT] = "RECV_ACT",   [SCHEDULE_FWD] = "FWD",
    [SCHEDULE_SEND_ACT] = "SEND_ACT",   [SCHEDULE_RECV_GRAD] = "RECV_GRAD",
    [SCHEDULE_BWD] = "BWD",             [SCHEDULE_SEND_GRAD] = "SEND_GRAD",
    [SCHEDULE_REDUCE_GRADS] = "REDUCE_GRADS",
    [SCHEDULE_OPTIMIZER_STEP] = "OPTIMIZER_STEP", [SCHEDULE_WGRAD] = "WGRAD",
};

const char *schedule_op_name(enum schedule_op op)
{
    return ((int)op >= 0 && op < SCHEDULE_OP_COUNT) ? op_names[op] : "?";
}

const char *schedule_name(enum dm_schedule kind)
{
    switch (kind) {
    case DM_SCHEDULE_1F1B: return "1f1b";
    case DM_SCHEDULE_GPIPE: return "gpipe";
    case DM_SCHEDULE_ZB: return "zb";
    case DM_SCHEDULE_INTERLEAVED: return "interleaved";
    }
    return "?";
}

int schedule_splits_backward(enum dm_schedule kind)
{
    return kind == DM_SCHEDULE_ZB;
}

/* Appends the receive-forward-send triple (or backward triple) of one
 * micro-batch, leaving out the transfers that do not exist at the ends of
 * the pipeline. */
int schedule_emit_forward(struct schedule_instr *out, int n, int mb, int chunk, int first,
                          int last)
{
    if (!first) out[n++] = (struct schedule_instr){SCHEDULE_RECV_ACT, mb, chunk};
    out[n++] = (struct schedule_instr){SCHEDULE_FWD, mb, chunk};
    if (!last) out[n++] = (struct schedule_instr){SCHEDULE_SEND_ACT, mb, chunk};
    return n;
}

int schedule_emit_backward(struct schedule_instr *out, int n, int mb, int chunk, int first,
                           int last)
{
    if (!last) out[n++] = (struct schedule_instr){SCHEDULE_RECV_GRAD, mb, chunk};
    out[n++] = (struct schedule_instr){SCHEDULE_BWD, mb, chunk};
    if (!first) out[n++] = (struct schedule_instr){SCHEDULE_SEND_GRAD, mb, chunk};
    return n;
}

int schedule_stage_chunks(struct schedule_instr *out, enum dm_schedule kind, int stage,
                          int stages, int virtual, int micro_batches)
{
    DM_ASSERT(stages >= 1 && micro_batches >= 1 && stage >= 0 && stage < stages);
    DM_ASSERT(virtual >= 1 && (virtual == 1 || kind == DM_SCHEDULE_INTERLEAVED));
    int first = stage == 0, last = stage == stages - 1;
    int m = micro_batches;
    int n = 0;
    if (kind == DM_SCHEDULE_GPIPE) {
        for (int mb = 0; mb < m; mb++) n = schedule_emit_forward(out, n, mb, 0, first, last);
        for (int mb = 0; mb < m; mb++) n = schedule_emit_backward(out, n, mb, 0, first, last);
    } else if (kind == DM_SCHEDULE_ZB) {
        n = schedule_zb_stage(out, stage, stages, m);
    } else if (kind == DM_SCHEDULE_INTERLEAVED && virtual > 1) {
        n = schedule_interleaved_stage(out, stage, stages, virtual, m);
    } else {
        DM_ASSERT(kind == DM_SCHEDULE_1F1B || kind == DM_SCHEDULE_INTERLEAVED);
        /* Stage s runs ahead by S-s-1 forwards so that, in the steady
         * state, the gradient of micro-batch j comes back from the next
         * stage just as this stage finishes forward j + warmup. */
        int warmup = stages - stage - 1;
        if (warmup > m) warmup = m;
        for (int mb = 0; mb < warmup; mb++) n = schedule_emit_forward(out, n, mb, 0, first, last);
        for (int j = 0; j < m - warmup; j++) {
            n = schedule_emit_forward(out, n, warmup + j, 0, first, last);
            n = schedule_emit_backward(out, n, j, 0, first, last);
        }
        for (int mb = m - warmup; mb < m; mb++)
            n = schedule_emit_backward(out, n, mb, 0, first, last);
    }
    out[n++] = (struct schedule_instr){SCHEDULE_REDUCE_GRADS, -1, 0};
    out[n++] = (struct schedule_instr){SCHEDULE_OPTIMIZER_STEP, -1, 0};
    DM_ASSERT(n <= SCHEDULE_MAX_INSTRS(m * virtual));
    return n;
}

int schedule_stage(struct schedule_instr *out, enum dm_schedule kind, int stage,
                   int stages, int micro_batches)
{
    return schedule_stage_chunks(out, kind, stage, stages, 1, micro_batches);
}

void schedule_build_chunks(struct schedule *sched, enum dm_schedule kind, int stages,
                           int virtual, int micro_batches)
{
    DM_ASSERT(stages >= 1 && micro_batches >= 1 && virtual >= 1);
    sched->kind = kind;
    sched->stages = stages;
    sched->virtual = virtual;
    sched->micro_batches = micro_batches;
    sched->offset = dm_alloc((size_t)(stages + 1) * sizeof *sched->offset);
    size_t capacity = (size_t)stages * SCHEDULE_MAX_INSTRS((size_t)micro_batches * virtual);
    sched->instr = dm_alloc(capacity * sizeof *sched->instr);
    int n = 0;
    for (int s = 0; s < stages; s++) {
        sched->offset[s] = n;
        n += schedule_stage_chunks(sched->instr + n, kind, s, stages, virtual, micro_batches);
    }
    sched->offset[stages] = n;
}

void schedule_build(struct schedule *sched, enum dm_schedule kind, int stages,
                    int micro_batches)
{
    schedule_build_chunks(sched, kind, stages, 1, micro_batches);
}

void schedule_free(struct schedule *sched)
{
    dm_free(sched->offset);
    dm_free(sched->instr);
    memset(sched, 0, sizeof *sched);
}

int schedule_list_peak(const struct schedule_instr *list, int n, enum dm_schedule kind)
{
    enum schedule_op release = schedule_splits_backward(kind) ? SCHEDULE_WGRAD : SCHEDULE_BWD;
    int alive = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        if (list[i].op == SCHEDULE_FWD && ++alive > peak) peak = alive;
        if (list[i].op == release) alive--;
    }
    return peak;
}

int schedule_peak_activations(const struct schedule *sched, int stage)
{
    DM_ASSERT(stage >= 0 && stage < sched->stages);
    return schedule_list_peak(sched->instr + sched->offset[stage],
                              sched->offset[stage + 1] - sched->offset[stage], sched->kind);
}
