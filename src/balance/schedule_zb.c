/* The zero-bubble schedule ZB-H1 (Qi et al., ICLR 2024) as one stage's
 * instruction list: 1F1B's forwards and input-gradient backwards, each
 * backward's weight gradient (WGRAD) placed where 1F1B leaves the stage
 * idle. Must not: encode time (the predictor prices the list) or keep more
 * micro-batches alive than 1F1B's first stage does. */
#include "balance_internal.h"

static int emit_wgrad(struct schedule_instr *out, int n, int mb)
{
    out[n++] = (struct schedule_instr){SCHEDULE_WGRAD, mb, 0};
    return n;
}

int schedule_zb_stage(struct schedule_instr *out, int stage, int stages, int micro_batches)
{
    int first = stage == 0, last = stage == stages - 1;
    int m = micro_batches;
    /* 1F1B's warm-up, then forward and backward alternately. The first
     * `stage` weight gradients wait: stage s's backward k is ready about
     * 2(S - s - 1) slots after its forward, so a stage near the end would
     * idle before its backwards come back while one near the start idles
     * at the end; holding s weight gradients back keeps the stage busy at
     * the start (each held one runs a backward later) and fills the end
     * with them, and holds at most s more micro-batches than 1F1B's
     * S - s, so min(S, m). */
    int warmup = stages - stage - 1;
    if (warmup > m) warmup = m;
    int n = 0, forwards = 0, wgrads = 0;
    for (; forwards < warmup; forwards++)
        n = schedule_emit_forward(out, n, forwards, 0, first, last);
    for (int backwards = 0; backwards < m;) {
        if (forwards < m) n = schedule_emit_forward(out, n, forwards++, 0, first, last);
        n = schedule_emit_backward(out, n, backwards++, 0, first, last);
        if (backwards - wgrads > stage) n = emit_wgrad(out, n, wgrads++);
    }
    while (wgrads < m) n = emit_wgrad(out, n, wgrads++);
    return n;
}
