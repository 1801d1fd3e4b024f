/* Interleaved 1F1B (Megatron-LM's virtual pipeline stages) as one stage's
 * instruction list: the stage holds v model chunks, chunk c being virtual
 * stage c S + s, and runs micro-batches through its chunks in groups of S
 * so that each chunk's work is short and the fill and drain shrink by v.
 * Must not: encode time (the predictor prices the list). */
#include "balance_internal.h"

/* The k-th forward (or backward) of the stage: its micro-batch and chunk. */
static void nth_unit(int k, int stages, int virtual, int backward, int *mb, int *chunk)
{
    int group = k % (stages * virtual);
    *chunk = group / stages;
    if (backward) *chunk = virtual - 1 - *chunk;
    *mb = (k / (stages * virtual)) * stages + k % stages;
}

static int emit_unit(struct schedule_instr *out, int n, int k, int stage, int stages,
                     int virtual, int backward)
{
    int mb, chunk;
    nth_unit(k, stages, virtual, backward, &mb, &chunk);
    int vstage = chunk * stages + stage;
    int first = vstage == 0, last = vstage == stages * virtual - 1;
    return backward ? schedule_emit_backward(out, n, mb, chunk, first, last)
                    : schedule_emit_forward(out, n, mb, chunk, first, last);
}

int schedule_interleaved_stage(struct schedule_instr *out, int stage, int stages, int virtual,
                               int micro_batches)
{
    DM_ASSERT(micro_batches % stages == 0);
    int total = micro_batches * virtual;
    /* Megatron's warm-up: the last stage's first backward needs the first
     * micro-batch through all V virtual stages, and stage s's turn comes
     * 2 (S - s - 1) forwards after the last stage's. */
    int warmup = micro_batches == stages ? total : 2 * (stages - stage - 1) + (virtual - 1) * stages;
    if (warmup > total) warmup = total;
    int n = 0;
    for (int k = 0; k < warmup; k++) n = emit_unit(out, n, k, stage, stages, virtual, 0);
    for (int k = 0; k < total - warmup; k++) {
        n = emit_unit(out, n, warmup + k, stage, stages, virtual, 0);
        n = emit_unit(out, n, k, stage, stages, virtual, 1);
    }
    for (int k = total - warmup; k < total; k++) n = emit_unit(out, n, k, stage, stages, virtual, 1);
    return n;
}
