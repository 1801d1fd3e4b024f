/* Pipeline schedules: for S = 1..6 stages and m = 1..12 micro-batches, GPipe
 * and 1F1B lists do every forward and backward once, in a legal order, with
 * sends and receives that pair up in the same order on both sides; an
 * independent execution over FIFO channels finishes without deadlock (and
 * reports one for lists that cannot finish); 1F1B keeps at most S-s
 * micro-batches' activations on stage s, GPipe m. The predictor, the one
 * simulator of these lists, finishes every one of them with a processor per
 * stage, under processor sharing and taking turns, and reproduces the
 * closed-form step time of a uniform pipeline, (m + S - 1)(f + b), its
 * bubble (S - 1)/(m + S - 1), GPipe's 2(S-1)c more with a latency c per
 * message, and hand-worked imbalanced pipelines where 1F1B beats GPipe.
 *
 * The zero-bubble ZB-H1 and interleaved 1F1B schedules: for S = 1..6
 * stages and m = 1..12 micro-batches (interleaved: v = 2, 3 chunks and m a
 * multiple of S), every forward, backward and weight gradient of every
 * (chunk, micro-batch) once, each after the one it needs on its stage, in
 * ascending micro-batch order per chunk; the FIFO execution over every
 * link of virtual stages finishes. ZB-H1 keeps no more micro-batches alive
 * on any stage than 1F1B does on its first, min(S, m). The predictor gives
 * the closed forms for equal costs: ZB-H1 (3m + S - 1) F with F = B = W
 * for m >= S (bubble (S - 1)/(3m) of the compute, 1F1B's (S - 1)/m),
 * interleaved m (f + b) + (S - 1)(f + b)/v; all the work on one core; and
 * `dynmo plan`'s check: 16 equal blocks (1 ms forward, 2 ms backward) on 4
 * stages with 8 micro-batches, zb and interleaved faster than 1F1B's 132
 * ms. Bad sizes are refused. */
#include <string.h>
#include "dynmo/balance.h"
#include "testing.h"

#define MAX_S 6
#define MAX_M 12
#define MAX_V 3
#define UNITS (MAX_M * MAX_V)

static const char *kind_name(enum dm_schedule kind)
{
    return kind == DM_SCHEDULE_GPIPE ? "gpipe" : "1f1b";
}

/* Positions of each op for each micro-batch in one stage's list, -1 if
 * absent; counts catch duplicates. */
struct stage_index {
    int pos[SCHEDULE_OP_COUNT][MAX_M];
    int count[SCHEDULE_OP_COUNT][MAX_M];
};

static void index_stage(struct stage_index *ix, const struct schedule_instr *list, int n)
{
    memset(ix->count, 0, sizeof ix->count);
    for (int op = 0; op < SCHEDULE_OP_COUNT; op++)
        for (int mb = 0; mb < MAX_M; mb++) ix->pos[op][mb] = -1;
    for (int i = 0; i < n; i++) {
        int mb = list[i].micro_batch;
        if (mb < 0 || mb >= MAX_M) continue;
        ix->pos[list[i].op][mb] = i;
        ix->count[list[i].op][mb]++;
    }
}

static int structure_errors(const struct schedule *sched)
{
    int S = sched->stages, m = sched->micro_batches, errors = 0;
    struct stage_index ix;
    for (int s = 0; s < S; s++) {
        const struct schedule_instr *list = sched->instr + sched->offset[s];
        int n = sched->offset[s + 1] - sched->offset[s];
        int first = s == 0, last = s == S - 1;
        index_stage(&ix, list, n);
        for (int mb = 0; mb < m; mb++) {
            errors += ix.count[SCHEDULE_FWD][mb] != 1;
            errors += ix.count[SCHEDULE_BWD][mb] != 1;
            errors += ix.count[SCHEDULE_RECV_ACT][mb] != !first;
            errors += ix.count[SCHEDULE_SEND_GRAD][mb] != !first;
            errors += ix.count[SCHEDULE_SEND_ACT][mb] != !last;
            errors += ix.count[SCHEDULE_RECV_GRAD][mb] != !last;
            errors += ix.pos[SCHEDULE_BWD][mb] < ix.pos[SCHEDULE_FWD][mb];
            if (!first) {
                errors += ix.pos[SCHEDULE_RECV_ACT][mb] > ix.pos[SCHEDULE_FWD][mb];
                errors += ix.pos[SCHEDULE_SEND_GRAD][mb] < ix.pos[SCHEDULE_BWD][mb];
            }
            if (!last) {
                errors += ix.pos[SCHEDULE_SEND_ACT][mb] < ix.pos[SCHEDULE_FWD][mb];
                errors += ix.pos[SCHEDULE_RECV_GRAD][mb] > ix.pos[SCHEDULE_BWD][mb];
            }
        }
        /* Nothing but the per-mb instructions and the two closing ones. */
        int expected = m * (2 + 2 * !first + 2 * !last) + 2;
        errors += n != expected;
        errors += n < 2 || list[n - 2].op != SCHEDULE_REDUCE_GRADS ||
                  list[n - 1].op != SCHEDULE_OPTIMIZER_STEP;
        for (int i = 0; i < n - 2; i++)
            errors += list[i].micro_batch < 0 || list[i].micro_batch >= m ||
                      list[i].op == SCHEDULE_REDUCE_GRADS || list[i].op == SCHEDULE_OPTIMIZER_STEP;
    }
    return errors;
}

/* The micro-batch sequence of `op` in stage s's list. */
static int op_sequence(const struct schedule *sched, int s, enum schedule_op op, int *seq)
{
    int n = 0;
    for (int i = sched->offset[s]; i < sched->offset[s + 1]; i++)
        if (sched->instr[i].op == op) seq[n++] = sched->instr[i].micro_batch;
    return n;
}

static int pairing_errors(const struct schedule *sched)
{
    int errors = 0, a[MAX_M * 2], b[MAX_M * 2];
    for (int s = 0; s + 1 < sched->stages; s++) {
        int na = op_sequence(sched, s, SCHEDULE_SEND_ACT, a);
        int nb = op_sequence(sched, s + 1, SCHEDULE_RECV_ACT, b);
        errors += na != nb || memcmp(a, b, (size_t)na * sizeof *a) != 0;
        na = op_sequence(sched, s + 1, SCHEDULE_SEND_GRAD, a);
        nb = op_sequence(sched, s, SCHEDULE_RECV_GRAD, b);
        errors += na != nb || memcmp(a, b, (size_t)na * sizeof *a) != 0;
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

/* The predictor on equal stages (f = b = 1): with a processor per stage the
 * closed form, 2(m + S - 1); with all stages on one core, under processor
 * sharing and taking turns, all the work, 2 S m, as a core never idles while
 * the lists can go on (a deadlock would stop the predictor on an
 * assertion). Returns the number of wrong predictions. */
static int predictor_finish_errors(enum dm_schedule kind, int S, int m)
{
    double ones[MAX_S] = {1, 1, 1, 1, 1, 1}, one_core = 1;
    int group[MAX_S] = {0};
    int errors = 0;
    char err[160];
    struct balance_prediction p;
    errors += balance_predict_stages(ones, ones, S, m, kind, &p, err, sizeof err) != BALANCE_OK;
    errors += p.step_ms != 2.0 * (m + S - 1);
    for (int turns = 0; turns < 2; turns++) {
        struct balance_sharing one = {S, 1, group, &one_core, turns};
        errors += balance_predict_shared(ones, ones, NULL, S, m, kind, &one, &p, err,
                                         sizeof err) != BALANCE_OK;
        errors += fabs(p.step_ms - 2.0 * S * m) > 1e-9 * S * m;
    }
    return errors;
}

static void test_all_shapes(void)
{
    int cases = 0;
    for (int kind = 0; kind < 2; kind++) {
        for (int S = 1; S <= MAX_S; S++) {
            for (int m = 1; m <= MAX_M; m++) {
                struct schedule sched;
                schedule_build(&sched, (enum dm_schedule)kind, S, m);
                const char *name = kind_name((enum dm_schedule)kind);
                int errors = structure_errors(&sched);
                CHECK_MSG(errors == 0, "%s S=%d m=%d: %d structure errors", name, S, m, errors);
                errors = pairing_errors(&sched);
                CHECK_MSG(errors == 0, "%s S=%d m=%d: sends and receives do not pair in "
                          "order (%d boundaries)", name, S, m, errors);
                int peak[MAX_S];
                int result = fifo_execute(&sched, peak);
                CHECK_MSG(result == 0, "%s S=%d m=%d: execution %s", name, S, m,
                          result == 1 ? "deadlocks" : "receives the wrong micro-batch");
                for (int s = 0; s < S; s++) {
                    int want = kind == DM_SCHEDULE_GPIPE ? m : (S - s < m ? S - s : m);
                    CHECK_MSG(peak[s] == want, "%s S=%d m=%d stage %d: %d activations "
                              "alive at once, expected %d", name, S, m, s, peak[s], want);
                    CHECK(schedule_peak_activations(&sched, s) == want);
                    /* schedule_stage gives the same list as schedule_build. */
                    struct schedule_instr list[SCHEDULE_MAX_INSTRS(MAX_M)];
                    int n = schedule_stage(list, (enum dm_schedule)kind, s, S, m);
                    CHECK(n == sched.offset[s + 1] - sched.offset[s] &&
                          memcmp(list, sched.instr + sched.offset[s],
                                 (size_t)n * sizeof *list) == 0);
                }
                /* The predictor, which simulates the lists of schedule_stage
                 * (the same as schedule_build's, above), finishes them. */
                errors = predictor_finish_errors((enum dm_schedule)kind, S, m);
                CHECK_MSG(errors == 0, "%s S=%d m=%d: %d predictions wrong", name, S, m,
                          errors);
                schedule_free(&sched);
                cases++;
            }
        }
    }
    printf("shapes: %d (schedule, S, m) cases checked\n", cases);
}

/* Predicts stage times f, b (and updates u, may be NULL) with a processor
 * per stage; the prediction goes to *p. */
static void predict(const double *f, const double *b, const double *u, int S, int m,
                    enum dm_schedule kind, struct balance_prediction *p)
{
    char err[160] = "";
    int rc = balance_predict_shared(f, b, u, S, m, kind, NULL, p, err, sizeof err);
    CHECK_MSG(rc == BALANCE_OK, "%s", err);
}

/* A uniform pipeline has the textbook step time (m + S - 1)(f + b) with
 * both schedules, and bubble (S - 1)/(m + S - 1); with an update u on every
 * stage (the predictor's steady state starts each list u into the step)
 * the step is u longer and every stage busy m(f + b) + u. A per-message
 * latency c adds 2(S-1)c to GPipe: the predictor has no communication, so
 * a relay stage that takes c per forward and per backward stands for each
 * link (as c <= f, b, no message waits for the one before it). */
static void test_predicted_times(void)
{
    double fwd[2 * MAX_S], bwd[2 * MAX_S], update[MAX_S];
    double largest_error = 0;
    for (int kind = 0; kind < 2; kind++) {
        for (int S = 1; S <= MAX_S; S++) {
            for (int m = 1; m <= MAX_M; m++) {
                const double f = 1.5, b = 3.25, c = 0.125, u = 0.75;
                for (int s = 0; s < S; s++) {
                    fwd[s] = f;
                    bwd[s] = b;
                    update[s] = u;
                }
                struct balance_prediction p;
                predict(fwd, bwd, NULL, S, m, (enum dm_schedule)kind, &p);
                double want = (m + S - 1) * (f + b);
                CHECK_NEAR(p.step_ms, want, 1e-9);
                CHECK_NEAR(p.bubble_ratio, (double)(S - 1) / (m + S - 1), 1e-12);
                if (fabs(p.step_ms - want) > largest_error) largest_error = fabs(p.step_ms - want);
                struct balance_prediction stages_only;
                char err[160];
                CHECK(balance_predict_stages(fwd, bwd, S, m, (enum dm_schedule)kind,
                                             &stages_only, err, sizeof err) == BALANCE_OK);
                CHECK(stages_only.step_ms == p.step_ms &&
                      stages_only.bubble_ratio == p.bubble_ratio);
                predict(fwd, bwd, update, S, m, (enum dm_schedule)kind, &p);
                CHECK_NEAR(p.step_ms, u + want, 1e-9);
                CHECK_NEAR(p.bubble_ratio, 1 - (m * (f + b) + u) / (u + want), 1e-12);
                if (kind == DM_SCHEDULE_GPIPE) {
                    int relayed = 2 * S - 1;
                    for (int s = 0; s < relayed; s++) {
                        fwd[s] = s % 2 ? c : f;
                        bwd[s] = s % 2 ? c : b;
                    }
                    predict(fwd, bwd, NULL, relayed, m, DM_SCHEDULE_GPIPE, &p);
                    CHECK_NEAR(p.step_ms, want + 2 * (S - 1) * c, 1e-9);
                }
            }
        }
    }
    printf("uniform pipelines: largest step-time error %.3g ms\n", largest_error);

    /* An imbalanced pipeline is paced by its slowest stage: three stages
     * with the middle one three times slower, 8 micro-batches, an update of
     * 0.5 ms on each. 1F1B: stage 1 waits for stage 0's update and first
     * forward (1.5 ms), then computes its 72 ms without a gap; stage 0's
     * last backward (2 ms) follows. Idle: 51 + 3 + 51 ms. */
    double f3[3] = {1, 3, 1}, b3[3] = {2, 6, 2}, u3[3] = {0.5, 0.5, 0.5};
    struct balance_prediction p;
    predict(f3, b3, u3, 3, 8, DM_SCHEDULE_1F1B, &p);
    CHECK_NEAR(p.step_ms, 1.5 + 8 * 9 + 2, 1e-9);
    CHECK_NEAR(p.bubble_ratio * 3 * p.step_ms, 51 + 3 + 51, 1e-9);
    CHECK(p.bottleneck_stage == 1);
    printf("imbalanced 1F1B (3 stages, 8 micro-batches): step %.2f ms, bubble %.4f\n",
           p.step_ms, p.bubble_ratio);
    /* GPipe: stage 2 runs its first backward only after all its forwards
     * (26.5 ms), so stage 1 starts its backwards at 28.5 rather than at
     * 25.5, after its own forwards: 3 ms later than 1F1B. */
    predict(f3, b3, u3, 3, 8, DM_SCHEDULE_GPIPE, &p);
    CHECK_NEAR(p.step_ms, 28.5 + 8 * 6 + 2, 1e-9);
    CHECK_NEAR(p.bubble_ratio * 3 * p.step_ms, 3 * 78.5 - (24.5 + 72.5 + 24.5), 1e-9);
    printf("imbalanced GPipe (3 stages, 8 micro-batches): step %.2f ms, bubble %.4f\n",
           p.step_ms, p.bubble_ratio);

    /* One stage: no transfers, no bubble. */
    double one_f = 1, one_b = 2, one_u = 2;
    predict(&one_f, &one_b, &one_u, 1, 4, DM_SCHEDULE_1F1B, &p);
    CHECK_NEAR(p.step_ms, 4 * 3 + 2, 1e-12);
    CHECK_NEAR(p.bubble_ratio, 0, 1e-12);
}

/* Lists that wait for a gradient before sending the activation it needs. */
static void test_deadlock_is_detected(void)
{
    struct schedule_instr stage0[] = {
        {SCHEDULE_FWD, 0, 0}, {SCHEDULE_RECV_GRAD, 0, 0}, {SCHEDULE_SEND_ACT, 0, 0},
        {SCHEDULE_BWD, 0, 0},
        {SCHEDULE_REDUCE_GRADS, -1, 0}, {SCHEDULE_OPTIMIZER_STEP, -1, 0},
    };
    struct schedule_instr stage1[] = {
        {SCHEDULE_RECV_ACT, 0, 0}, {SCHEDULE_FWD, 0, 0}, {SCHEDULE_BWD, 0, 0},
        {SCHEDULE_SEND_GRAD, 0, 0},
        {SCHEDULE_REDUCE_GRADS, -1, 0}, {SCHEDULE_OPTIMIZER_STEP, -1, 0},
    };
    struct schedule_instr instr[12];
    memcpy(instr, stage0, sizeof stage0);
    memcpy(instr + 6, stage1, sizeof stage1);
    int offset[3] = {0, 6, 12};
    struct schedule sched = {DM_SCHEDULE_1F1B, 2, 1, offset, instr, 1};
    int peak[MAX_S];
    CHECK(fifo_execute(&sched, peak) == 1);
    CHECK(strcmp(schedule_op_name(SCHEDULE_RECV_GRAD), "RECV_GRAD") == 0);
}

/* ---- ZB-H1 and interleaved 1F1B ---- */

/* Position of each op per (chunk, micro-batch) in one stage's list. */
struct unit_index {
    int pos[SCHEDULE_OP_COUNT][UNITS];
    int count[SCHEDULE_OP_COUNT][UNITS];
};

static int chunk_structure_errors(const struct schedule *sched)
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
    int errors = chunk_structure_errors(&sched);
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
    test_all_shapes();
    test_predicted_times();
    test_deadlock_is_detected();
    test_zb();
    test_interleaved();
    test_plan_check();
    test_bad_sizes();
    return testing_report("test_schedule");
}
