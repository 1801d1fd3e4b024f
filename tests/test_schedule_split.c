/* The zero-bubble ZB-H1 and interleaved 1F1B schedules: for S = 1..6
 * stages and m = 1..12 micro-batches (interleaved: v = 2, 3 chunks and m a
 * multiple of S), every forward, backward and weight gradient of every
 * (chunk, micro-batch) once, each after the one it needs on its stage, in
 * ascending micro-batch order per chunk; sends and receives pair up in
 * order on every link of virtual stages; an independent execution over
 * FIFO channels finishes. ZB-H1 keeps no more micro-batches alive on any
 * stage than 1F1B does on its first, min(S, m). The predictor, the one
 * simulator of the lists, gives the closed forms for equal costs: ZB-H1
 * (3m + S - 1) F with F = B = W for m >= S (bubble (S - 1)/(3m) of the
 * compute, 1F1B's (S - 1)/m), interleaved m (f + b) + (S - 1)(f + b)/v;
 * all the work on one core; and `dynmo plan`'s check: 16 equal blocks
 * (1 ms forward, 2 ms backward) on 4 stages with 8 micro-batches, zb and
 * interleaved faster than 1F1B's 132 ms. Bad sizes are refused. */
#include <math.h>
#include <string.h>
#include "dynmo/balance.h"
#include "testing.h"

#define MAX_S 6
#define MAX_M 12
#define MAX_V 3
#define UNITS (MAX_M * MAX_V)

/* Position of each op per (chunk, micro-batch) in one stage's list. */
struct unit_index {
    int pos[SCHEDULE_OP_COUNT][UNITS];
    int count[SCHEDULE_OP_COUNT][UNITS];
};

static int structure_errors(const struct schedule *sched)
{
    int S = sched->stages, v = sched->virtual, m = sched->micro_batches, errors = 0;
    int split = schedule_splits_backward(sched->kind);
    static struct unit_index ix;
    for (int s = 0; s < S; s++) {
        memset(&ix, 0, sizeof ix);
        int last_mb[3][MAX_V];   /* per kind and chunk: ascending order */
        memset(last_mb, -1, sizeof last_mb);
        for (int i = sched->offset[s]; i < sched->offset[s + 1]; i++) {
            const struct schedule_instr *in = &sched->instr[i];
            if (in->micro_batch < 0) continue;
            errors += in->micro_batch >= m || in->chunk < 0 || in->chunk >= v;
            int u = in->chunk * m + in->micro_batch;
            ix.pos[in->op][u] = i;
            ix.count[in->op][u]++;
            int kind = in->op == SCHEDULE_FWD ? 0 : in->op == SCHEDULE_BWD ? 1
                     : in->op == SCHEDULE_WGRAD ? 2 : -1;
            if (kind >= 0) {
                errors += in->micro_batch <= last_mb[kind][in->chunk];
                last_mb[kind][in->chunk] = in->micro_batch;
            }
        }
        for (int c = 0; c < v; c++) {
            int vstage = c * S + s, first = vstage == 0, last = vstage == S * v - 1;
            for (int mb = 0; mb < m; mb++) {
                int u = c * m + mb;
                errors += ix.count[SCHEDULE_FWD][u] != 1 || ix.count[SCHEDULE_BWD][u] != 1;
                errors += ix.count[SCHEDULE_WGRAD][u] != split;
                errors += ix.count[SCHEDULE_RECV_ACT][u] != !first;
                errors += ix.count[SCHEDULE_SEND_GRAD][u] != !first;
                errors += ix.count[SCHEDULE_SEND_ACT][u] != !last;
                errors += ix.count[SCHEDULE_RECV_GRAD][u] != !last;
                errors += ix.pos[SCHEDULE_BWD][u] < ix.pos[SCHEDULE_FWD][u];
                if (split) errors += ix.pos[SCHEDULE_WGRAD][u] < ix.pos[SCHEDULE_BWD][u];
                if (!first) errors += ix.pos[SCHEDULE_RECV_ACT][u] > ix.pos[SCHEDULE_FWD][u];
                if (!last) errors += ix.pos[SCHEDULE_RECV_GRAD][u] > ix.pos[SCHEDULE_BWD][u];
            }
        }
        int n = sched->offset[s + 1] - sched->offset[s];
        const struct schedule_instr *end = sched->instr + sched->offset[s + 1];
        errors += n < 2 || end[-2].op != SCHEDULE_REDUCE_GRADS ||
                  end[-1].op != SCHEDULE_OPTIMIZER_STEP;
    }
    return errors;
}

/* An execution independent of the predictor: each link between virtual
 * stages u and u + 1 carries an activation and a gradient FIFO (MPI tags
 * would keep chunks apart); a RECV needs its message at the head. Stages
 * take turns one instruction at a time. peak_alive gets each stage's most
 * micro-batches alive (from FWD until WGRAD under zb, else until BWD).
 * Returns 0, 1 on deadlock, 2 on a mismatched message. */
static int fifo_execute(const struct schedule *sched, int *peak_alive)
{
    enum { CAP = MAX_M + 1, LINKS = MAX_S * MAX_V };
    static int queue[2][LINKS][CAP];
    int head[2][LINKS], tail[2][LINKS], pc[MAX_S], alive[MAX_S];
    int S = sched->stages;
    enum schedule_op release = schedule_splits_backward(sched->kind) ? SCHEDULE_WGRAD
                                                                     : SCHEDULE_BWD;
    memset(head, 0, sizeof head);
    memset(tail, 0, sizeof tail);
    for (int s = 0; s < S; s++) {
        pc[s] = sched->offset[s];
        alive[s] = peak_alive[s] = 0;
    }
    for (;;) {
        int moved = 0, done = 1;
        for (int s = 0; s < S; s++) {
            if (pc[s] == sched->offset[s + 1]) continue;
            done = 0;
            const struct schedule_instr *in = &sched->instr[pc[s]];
            int u = in->chunk * S + s;
            int channel = -1, link = -1, is_recv = 0;
            switch (in->op) {
            case SCHEDULE_SEND_ACT: channel = 0; link = u; break;
            case SCHEDULE_RECV_ACT: channel = 0; link = u - 1; is_recv = 1; break;
            case SCHEDULE_SEND_GRAD: channel = 1; link = u - 1; break;
            case SCHEDULE_RECV_GRAD: channel = 1; link = u; is_recv = 1; break;
            case SCHEDULE_FWD:
                if (++alive[s] > peak_alive[s]) peak_alive[s] = alive[s];
                break;
            default: break;
            }
            if (in->op == release) alive[s]--;
            if (channel >= 0 && is_recv) {
                if (head[channel][link] == tail[channel][link]) continue;
                int mb = queue[channel][link][head[channel][link]++ % CAP];
                if (mb != in->micro_batch) return 2;
            } else if (channel >= 0) {
                queue[channel][link][tail[channel][link]++ % CAP] = in->micro_batch;
            }
            pc[s]++;
            moved = 1;
        }
        if (done) return 0;
        if (!moved) return 1;
    }
}

/* The predictor on equal chunks: f, b (the whole backward) per virtual
 * stage, w zb's part of it; with all stages on one core (fluid and turns)
 * the step is all the work. Returns the dedicated prediction. */
static struct balance_prediction predict_equal(enum dm_schedule kind, int S, int v, int m,
                                               double f, double b, double w)
{
    double fs[MAX_S * MAX_V], bs[MAX_S * MAX_V], ws[MAX_S * MAX_V], one_core = 1;
    int group[MAX_S] = {0};
    for (int u = 0; u < S * v; u++) {
        fs[u] = f;
        bs[u] = b;
        ws[u] = w;
    }
    char err[200] = "";
    struct balance_prediction p, shared;
    CHECK_MSG(balance_predict_chunks(fs, bs, ws, NULL, S, v, m, kind, NULL, &p, err,
                                     sizeof err) == BALANCE_OK, "%s", err);
    for (int turns = 0; turns < 2; turns++) {
        struct balance_sharing one = {S, 1, group, &one_core, turns};
        CHECK_MSG(balance_predict_chunks(fs, bs, ws, NULL, S, v, m, kind, &one, &shared, err,
                                         sizeof err) == BALANCE_OK, "%s", err);
        CHECK_MSG(fabs(shared.step_ms - S * v * m * (f + b)) < 1e-9 * S * v * m,
                  "%s S=%d v=%d m=%d on one core (turns %d): %g ms, all the work is %g",
                  schedule_name(kind), S, v, m, turns, shared.step_ms, S * v * m * (f + b));
    }
    return p;
}

static void check_lists(enum dm_schedule kind, int S, int v, int m)
{
    struct schedule sched;
    schedule_build_chunks(&sched, kind, S, v, m);
    const char *name = schedule_name(kind);
    int errors = structure_errors(&sched);
    CHECK_MSG(errors == 0, "%s S=%d v=%d m=%d: %d structure errors", name, S, v, m, errors);
    int peak[MAX_S];
    int result = fifo_execute(&sched, peak);
    CHECK_MSG(result == 0, "%s S=%d v=%d m=%d: execution %s", name, S, v, m,
              result == 1 ? "deadlocks" : "receives the wrong micro-batch");
    for (int s = 0; s < S; s++) {
        CHECK(schedule_peak_activations(&sched, s) == peak[s]);
        if (kind == DM_SCHEDULE_ZB)
            CHECK_MSG(peak[s] <= (S < m ? S : m), "zb S=%d m=%d stage %d: %d micro-batches "
                      "alive, 1F1B's first stage holds %d", S, m, s, peak[s], S < m ? S : m);
    }
    schedule_free(&sched);
}

static void test_zb(void)
{
    int cases = 0;
    double worst = 0;
    for (int S = 1; S <= MAX_S; S++) {
        for (int m = 1; m <= MAX_M; m++) {
            check_lists(DM_SCHEDULE_ZB, S, 1, m);
            /* F = B = W = 1: BWD 1 of a backward of 2. */
            struct balance_prediction zb = predict_equal(DM_SCHEDULE_ZB, S, 1, m, 1, 2, 1);
            struct balance_prediction one = predict_equal(DM_SCHEDULE_1F1B, S, 1, m, 1, 2, 1);
            CHECK_NEAR(one.step_ms, 3.0 * (m + S - 1), 1e-9);
            CHECK_MSG(zb.step_ms <= one.step_ms + 1e-9, "zb S=%d m=%d: %g ms, 1F1B %g", S,
                      m, zb.step_ms, one.step_ms);
            if (m >= S) {
                /* bubble (S - 1)/(3m) of the compute, against 1F1B's (S - 1)/m */
                CHECK_NEAR(zb.step_ms, 3.0 * m + S - 1, 1e-9);
                CHECK_NEAR((zb.step_ms - 3.0 * m) / (3.0 * m), (S - 1) / (3.0 * m), 1e-12);
                CHECK_NEAR((one.step_ms - 3.0 * m) / (3.0 * m), (S - 1) / (double)m, 1e-12);
                if (fabs(zb.step_ms - (3.0 * m + S - 1)) > worst)
                    worst = fabs(zb.step_ms - (3.0 * m + S - 1));
            }
            cases++;
        }
    }
    /* A list of one stage: forward, backward, weight gradient per micro-batch. */
    struct schedule_instr list[SCHEDULE_MAX_INSTRS(2)];
    int n = schedule_stage(list, DM_SCHEDULE_ZB, 0, 1, 2);
    CHECK(n == 8 && list[0].op == SCHEDULE_FWD && list[1].op == SCHEDULE_BWD &&
          list[2].op == SCHEDULE_WGRAD && list[5].op == SCHEDULE_WGRAD);
    CHECK(strcmp(schedule_op_name(SCHEDULE_WGRAD), "WGRAD") == 0);
    printf("zb: %d (S, m) cases; largest error against (3m + S - 1) F: %.3g\n", cases, worst);
}

static void test_interleaved(void)
{
    int cases = 0;
    for (int S = 1; S <= 4; S++) {
        for (int v = 2; v <= MAX_V; v++) {
            for (int m = S; m <= MAX_M; m += S) {
                check_lists(DM_SCHEDULE_INTERLEAVED, S, v, m);
                /* a stage's f = 1, b = 2 split over its v chunks */
                struct balance_prediction p =
                    predict_equal(DM_SCHEDULE_INTERLEAVED, S, v, m, 1.0 / v, 2.0 / v, 0);
                double want = 3.0 * m + 3.0 * (S - 1) / v;
                CHECK_MSG(fabs(p.step_ms - want) < 1e-9, "interleaved S=%d v=%d m=%d: %g "
                          "ms, expected m (f + b) + (S - 1)(f + b)/v = %g", S, v, m,
                          p.step_ms, want);
                cases++;
            }
        }
    }
    /* One chunk is 1F1B's list. */
    struct schedule a, b;
    schedule_build_chunks(&a, DM_SCHEDULE_INTERLEAVED, 3, 1, 5);
    schedule_build(&b, DM_SCHEDULE_1F1B, 3, 5);
    CHECK(a.offset[3] == b.offset[3] &&
          memcmp(a.instr, b.instr, (size_t)a.offset[3] * sizeof *a.instr) == 0);
    schedule_free(&a);
    schedule_free(&b);
    printf("interleaved: %d (S, v, m) cases\n", cases);
}

/* The check through balance_predict, as `dynmo plan` calls it. */
static void test_plan_check(void)
{
    double fwd[16], bwd[16], params[16];
    int64_t mem[16];
    for (int i = 0; i < 16; i++) {
        fwd[i] = 1;
        bwd[i] = 2;
        params[i] = 100;
        mem[i] = 1000;
    }
    struct balance_profile profile = {.blocks = 16, .fwd_ms = fwd, .bwd_ms = bwd,
                                      .params = params, .mem_bytes = mem};
    int four[4] = {4, 4, 4, 4}, eight[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    struct balance_prediction one, zb, inter;
    char err[200] = "";
    CHECK(balance_predict(&profile, 4, four, 8, DM_SCHEDULE_1F1B, &one, err, sizeof err) == 0);
    CHECK(balance_predict(&profile, 4, four, 8, DM_SCHEDULE_ZB, &zb, err, sizeof err) == 0);
    profile.virtual_stages = 2;
    CHECK_MSG(balance_predict(&profile, 8, eight, 8, DM_SCHEDULE_INTERLEAVED, &inter, err,
                              sizeof err) == 0, "%s", err);
    CHECK_NEAR(one.step_ms, 132, 1e-9);
    CHECK_NEAR(zb.step_ms, 108, 1e-9);    /* F = B = W = 4: (3 x 8 + 3) x 4 */
    CHECK_NEAR(inter.step_ms, 114, 1e-9); /* 96 + 3 x 12 / 2 */
    CHECK(inter.bottleneck_stage == 0);
    printf("16 equal blocks, 4 stages, m = 8: 1f1b %.1f ms, zb %.1f ms, interleaved %.1f ms\n",
           one.step_ms, zb.step_ms, inter.step_ms);
    /* measured weight gradients: a third of each backward */
    double wgrad[16];
    for (int i = 0; i < 16; i++) wgrad[i] = 2.0 / 3;
    profile.virtual_stages = 0;
    profile.wgrad_ms = wgrad;
    struct balance_prediction third;
    CHECK(balance_predict(&profile, 4, four, 8, DM_SCHEDULE_ZB, &third, err, sizeof err) == 0);
    CHECK(third.step_ms > zb.step_ms && third.step_ms < one.step_ms);
}

static void test_bad_sizes(void)
{
    double f[8] = {1, 1, 1, 1, 1, 1, 1, 1}, b[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    double w[8] = {3, 1, 1, 1, 1, 1, 1, 1};
    struct balance_prediction p;
    char err[200];
    CHECK(balance_predict_chunks(f, b, NULL, NULL, 4, 2, 6, DM_SCHEDULE_INTERLEAVED, NULL, &p,
                                 err, sizeof err) == BALANCE_BAD_INPUT);
    CHECK(strstr(err, "multiple") != NULL);
    CHECK(balance_predict_chunks(f, b, NULL, NULL, 4, 2, 8, DM_SCHEDULE_ZB, NULL, &p, err,
                                 sizeof err) == BALANCE_BAD_INPUT);
    CHECK(balance_predict_chunks(f, b, w, NULL, 4, 1, 8, DM_SCHEDULE_ZB, NULL, &p, err,
                                 sizeof err) == BALANCE_BAD_INPUT);
    CHECK(strstr(err, "weight-gradient") != NULL);
    int seven[1] = {16};
    double fwd[16] = {0}, bwd[16] = {0};
    struct balance_profile profile = {.blocks = 16, .fwd_ms = fwd, .bwd_ms = bwd,
                                      .virtual_stages = 2};
    CHECK(balance_predict(&profile, 1, seven, 2, DM_SCHEDULE_INTERLEAVED, &p, err,
                          sizeof err) == BALANCE_BAD_INPUT);
}

int main(void)
{
    test_zb();
    test_interleaved();
    test_plan_check();
    test_bad_sizes();
    return testing_report("test_schedule_split");
}
