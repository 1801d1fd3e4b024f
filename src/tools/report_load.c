/* What `dynmo report` and `dynmo trace` read from a run log: the series,
 * the per-block matrices, the layout history, the balancer's decisions and
 * the traced instructions, through the ckpt module's public readers only
 * (runlog_list_datasets, runlog_read_*); and what the page states from
 * them: the layout changes, the means over the steps after the warm-up,
 * the steps the timeline draws.
 *
 * A file whose root attribute "kind" is "simulation" (what `dynmo
 * simulate` will write: a file shaped like a run log) is read the same
 * way. Every dataset may be missing (docs/runlog.md): what is absent is
 * left out of the page, never guessed. It must not write anything, and a
 * problem with the file is a user error naming it (exit 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "tools/report.h"

#define SIMULATION_KIND "simulation"
#define TRACE_COLUMNS 8
#define DECISION_COLUMNS 8

/* ---- traced instructions ------------------------------------------------ */

static const char *const op_labels[SCHEDULE_OP_COUNT] = {
    [SCHEDULE_RECV_ACT] = "receive activation", [SCHEDULE_FWD] = "forward",
    [SCHEDULE_SEND_ACT] = "send activation",    [SCHEDULE_RECV_GRAD] = "receive gradient",
    [SCHEDULE_BWD] = "backward",                [SCHEDULE_SEND_GRAD] = "send gradient",
    [SCHEDULE_REDUCE_GRADS] = "gradient sums",  [SCHEDULE_OPTIMIZER_STEP] = "optimizer",
};

const char *trace_op_label(int op)
{
    return op >= 0 && op < SCHEDULE_OP_COUNT ? op_labels[op] : "?";
}

int trace_op_kind(int op)
{
    switch (op) {
    case SCHEDULE_FWD: return TRACE_KIND_FORWARD;
    case SCHEDULE_BWD: return TRACE_KIND_BACKWARD;
    case SCHEDULE_SEND_ACT: case SCHEDULE_SEND_GRAD: return TRACE_KIND_SEND;
    case SCHEDULE_REDUCE_GRADS: case SCHEDULE_OPTIMIZER_STEP: return TRACE_KIND_UPDATE;
    default: return TRACE_KIND_WAIT;     /* a receive's wall time is its wait */
    }
}

const char *trace_kind_label(int kind)
{
    static const char *const labels[TRACE_KIND_COUNT] = {
        "forward", "backward", "update (gradient sums, optimizer)", "send",
        "wait (receive)"};
    return kind >= 0 && kind < TRACE_KIND_COUNT ? labels[kind] : "?";
}

/* Row r of the file's events into e; -1 with err naming the problem. */
static int trace_row(const float *row, long r, struct trace_event *e, const char *path,
                     char *err, size_t errsize)
{
    for (int c = 0; c < TRACE_COLUMNS; c++)
        if (!isfinite(row[c])) {
            snprintf(err, errsize, "%s: row %ld of /trace/events has a non-finite value "
                     "in column %d", path, r, c);
            return -1;
        }
    e->step = (int)row[0];
    e->rank = (int)row[1];
    e->stage = (int)row[2];
    e->op = (int)row[3];
    e->micro_batch = (int)row[4];
    e->start_ms = row[5];
    e->wall_ms = row[6];
    e->cpu_ms = row[7];
    const char *problem = e->step < 1 ? "a step below 1"
                        : e->rank < 0 || e->stage < 0 ? "a negative rank or stage"
                        : e->op < 0 || e->op >= SCHEDULE_OP_COUNT ? "an op outside 0..7"
                        : e->wall_ms < 0 || e->cpu_ms < 0 ? "a negative duration"
                        : NULL;
    if (problem) {
        snprintf(err, errsize, "%s: row %ld of /trace/events has %s", path, r, problem);
        return -1;
    }
    return 0;
}

static int compare_ints(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int trace_load(const char *path, struct trace *t, char *err, size_t errsize)
{
    memset(t, 0, sizeof *t);
    struct runlog_dataset_info *infos = NULL;
    int n = runlog_list_datasets(path, &infos, err, errsize);
    if (n < 0) return -1;
    int present = 0;
    for (int i = 0; i < n; i++) present |= !strcmp(infos[i].name, RUNLOG_TRACE_EVENTS);
    dm_free(infos);
    if (!present) return 1;
    float *rows = NULL;
    int cols = 0;
    long count = runlog_read_matrix(path, RUNLOG_TRACE_EVENTS, &rows, &cols, err, errsize);
    if (count < 0) return -1;
    if (count > 0 && cols != TRACE_COLUMNS) {
        snprintf(err, errsize, "%s: /trace/events has %d columns, expected %d", path, cols,
                 TRACE_COLUMNS);
        dm_free(rows);
        return -1;
    }
    t->events = dm_alloc((size_t)(count ? count : 1) * sizeof *t->events);
    t->steps = dm_alloc((size_t)(count ? count : 1) * sizeof *t->steps);
    for (long r = 0; r < count; r++) {
        struct trace_event *e = &t->events[r];
        if (trace_row(rows + r * TRACE_COLUMNS, r, e, path, err, errsize) < 0) {
            dm_free(rows);
            trace_free(t);
            return -1;
        }
        if (e->rank + 1 > t->ranks) t->ranks = e->rank + 1;
        /* rows come step by step: look further back only when the step changes */
        if ((!t->step_count || t->steps[t->step_count - 1] != e->step) &&
            !trace_has_step(t, e->step))
            t->steps[t->step_count++] = e->step;
        t->count++;
    }
    dm_free(rows);
    qsort(t->steps, (size_t)t->step_count, sizeof *t->steps, compare_ints);
    return 0;
}

void trace_free(struct trace *t)
{
    dm_free(t->events);
    dm_free(t->steps);
    memset(t, 0, sizeof *t);
}

int trace_has_step(const struct trace *t, int step)
{
    for (int i = 0; i < t->step_count; i++)
        if (t->steps[i] == step) return 1;
    return 0;
}

/* ---- datasets ------------------------------------------------------------ */

struct listing {
    struct runlog_dataset_info *infos;
    int count;
};

static const struct runlog_dataset_info *find(const struct listing *l, const char *name)
{
    for (int i = 0; i < l->count; i++)
        if (!strcmp(l->infos[i].name, name)) return &l->infos[i];
    return NULL;
}

static void read_series(const struct report_run *run, const struct listing *l,
                        const char *name, struct series *out)
{
    char err[1024];
    memset(out, 0, sizeof *out);
    const struct runlog_dataset_info *d = find(l, name);
    if (!d) return;
    if (d->rank != 1)
        dm_user_error("report: %s: %s has rank %d, a run log's is 1 (docs/runlog.md)",
                      run->path, name, d->rank);
    out->count = runlog_read_series(run->path, name, &out->values, err, sizeof err);
    if (out->count < 0) dm_user_error("report: %s", err);
}

/* A 2-D dataset; want_cols > 0: it must have that many columns. */
static void read_matrix(const struct report_run *run, const struct listing *l,
                        const char *name, int want_cols, struct matrix *out)
{
    char err[1024];
    memset(out, 0, sizeof *out);
    const struct runlog_dataset_info *d = find(l, name);
    if (!d) return;
    if (d->rank != 2)
        dm_user_error("report: %s: %s has rank %d, a run log's is 2 (docs/runlog.md)",
                      run->path, name, d->rank);
    out->rows = runlog_read_matrix(run->path, name, &out->values, &out->cols, err, sizeof err);
    if (out->rows < 0) dm_user_error("report: %s", err);
    if (want_cols > 0 && out->rows > 0 && out->cols != want_cols)
        dm_user_error("report: %s: %s has %d columns; the run has %d", run->path, name,
                      out->cols, want_cols);
}

void report_config_value(const struct report_run *run, const char *key, char *out,
                         size_t size)
{
    out[0] = '\0';
    size_t key_len = strlen(key);
    for (const char *line = run->config; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > key_len + 3 && !strncmp(line, key, key_len) &&
            !strncmp(line + key_len, " = ", 3)) {
            size_t value_len = len - key_len - 3;
            if (value_len >= size) value_len = size - 1;
            memcpy(out, line + key_len + 3, value_len);
            out[value_len] = '\0';
            return;
        }
        line += len + (end ? 1 : 0);
    }
}

static char *read_attr(const struct report_run *run, const char *name)
{
    char err[1024];
    char *text = NULL;
    if (runlog_read_root_attr(run->path, name, &text, err, sizeof err) < 0)
        dm_user_error("report: %s", err);
    return text;
}

/* The run's name: the directory of RUN_DIR/runlog.h5, else the file's. */
static void name_run(struct report_run *run)
{
    const char *path = run->path;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!strcmp(base, RUNLOG_FILE_NAME) && slash && slash > path) {
        const char *start = slash;
        while (start > path && start[-1] != '/') start--;
        snprintf(run->name, sizeof run->name, "%.*s", (int)(slash - start), start);
    } else {
        snprintf(run->name, sizeof run->name, "%s", base);
        size_t n = strlen(run->name);
        if (n > 3 && !strcmp(run->name + n - 3, ".h5")) run->name[n - 3] = '\0';
    }
    if (!run->name[0] || !strcmp(run->name, ".")) snprintf(run->name, sizeof run->name, "run");
}

int report_file_kind(const char *command, const char *path)
{
    char kind[64], err[1024];
    if (dm_file_kind(path, kind, sizeof kind, err, sizeof err) != 0)
        dm_user_error("%s: %s", command, err);
    if (!strcmp(kind, SIMULATION_KIND)) return 1;
    if (!strcmp(kind, RUNLOG_KIND)) return 0;
    if (kind[0])
        dm_user_error("%s: %s is a dynmo %s, not a run log (give RUN_DIR/" RUNLOG_FILE_NAME
                      ")", command, path, kind);
    dm_user_error("%s: %s is an HDF5 file but not a dynmo run log (its root group has no "
                  "\"kind\" attribute)", command, path);
}

/* ---- what the page states ----------------------------------------------- */

static long config_long(const struct report_run *run, const char *key)
{
    char text[32];
    report_config_value(run, key, text, sizeof text);
    return atol(text);
}

/* /mod/tokens [steps, MoD blocks] spread over the layers as the share of
 * the step's tokens (train.batch x train.seq) each MoD block processed:
 * block l's column when it is a MoD block ((l + 1) % model.mod_every ==
 * 0), NaN (blank) for a dense one. */
static void load_mod_share(const struct report_run *run, const struct listing *l,
                           struct matrix *out)
{
    struct matrix m;
    memset(out, 0, sizeof *out);
    read_matrix(run, l, RUNLOG_MOD_TOKENS, 0, &m);
    long every = config_long(run, "model.mod_every");
    double tokens = (double)config_long(run, "train.batch") * config_long(run, "train.seq");
    if (!m.values || every < 1 || tokens <= 0 || m.cols != run->layers / every) {
        dm_free(m.values);
        return;
    }
    out->rows = m.rows;
    out->cols = run->layers;
    out->values = dm_alloc((size_t)m.rows * run->layers * sizeof(float));
    for (long r = 0; r < m.rows; r++)
        for (int layer = 0; layer < run->layers; layer++)
            out->values[r * run->layers + layer] =
                (layer + 1) % every == 0
                    ? (float)(m.values[r * m.cols + (layer + 1) / every - 1] / tokens) : NAN;
    dm_free(m.values);
}

/* /hash/tiles as the share of the tiles causal attention would visit in
 * the step: 2 (forward, backward) x batch x heads x nt (nt + 1) / 2, nt
 * the 32-token tiles of a sequence (docs/mod-hash.md). */
static void load_hash_share(const struct report_run *run, const struct listing *l,
                            struct matrix *out)
{
    read_matrix(run, l, RUNLOG_HASH_TILES, run->layers, out);
    long nt = (config_long(run, "train.seq") + 31) / 32;
    double all = 2.0 * (double)config_long(run, "train.batch") *
                 (double)config_long(run, "model.heads") * (double)(nt * (nt + 1) / 2);
    if (!out->values || all <= 0) return;
    for (long i = 0; i < out->rows * out->cols; i++) out->values[i] = (float)(out->values[i] / all);
}

/* The scheme's own signal beside the cost heat map: what the file has. */
static void load_signals(struct report_run *run, const struct listing *l)
{
    struct matrix m;
    load_hash_share(run, l, &m);
    if (m.values)
        run->signals[run->signal_count++] =
            (struct block_signal){"hash tiles visited (of causal)", "share", m};
    load_mod_share(run, l, &m);
    if (m.values)
        run->signals[run->signal_count++] =
            (struct block_signal){"MoD tokens processed", "share", m};
    read_matrix(run, l, RUNLOG_LAYER_ACTIVE, run->layers, &m);
    if (m.values)
        run->signals[run->signal_count++] = (struct block_signal){"active tokens", "share", m};
    read_matrix(run, l, RUNLOG_LAYER_SPARSITY, run->layers, &m);
    if (m.values)
        run->signals[run->signal_count++] = (struct block_signal){"sparsity", "share", m};
    /* A frozen block does no update at the step's end: update_ms is 0. */
    if (!strcmp(run->dyn_kind, "freeze")) {
        read_matrix(run, l, RUNLOG_LAYER_UPDATE_MS, run->layers, &m);
        if (m.values) {
            for (long i = 0; i < m.rows * m.cols; i++)
                if (isfinite(m.values[i])) m.values[i] = m.values[i] == 0.0f;
            run->signals[run->signal_count++] = (struct block_signal){"frozen", "1 = frozen", m};
        }
    }
}

static int layout_row_empty(const struct report_run *run, long row)
{
    const float *r = run->layout.values + row * run->layout.cols;
    for (int s = 0; s < run->layout.cols; s++)
        if (r[s] != 0.0f) return 0;
    return 1;
}

/* Checks each recorded layout (rows of zeros are filler) and lists the
 * steps at which it changed. */
static void find_layout_changes(struct report_run *run)
{
    const struct matrix *m = &run->layout;
    run->changes = dm_alloc((size_t)(m->rows ? m->rows : 1) * sizeof *run->changes);
    long previous = -1;
    for (long i = 0; i < m->rows; i++) {
        if (layout_row_empty(run, i)) continue;
        long sum = 0;
        for (int s = 0; s < m->cols; s++) {
            float v = m->values[i * m->cols + s];
            if (!(v >= 0) || v != floorf(v))
                dm_user_error("report: %s: row %ld of /layout/history has %g blocks on "
                              "stage %d", run->path, i, (double)v, s);
            sum += (long)v;
        }
        if (run->layers > 0 && sum != run->layers)
            dm_user_error("report: %s: row %ld of /layout/history places %ld blocks; the "
                          "run has %d", run->path, i, sum, run->layers);
        if (run->layers == 0) run->layers = (int)sum;
        if (previous >= 0 && memcmp(m->values + previous * m->cols, m->values + i * m->cols,
                                    (size_t)m->cols * sizeof *m->values))
            run->changes[run->change_count++] =
                (struct layout_change){(int)(i + 1), (int)previous, (int)i};
        previous = i;
    }
}

double report_mean_step_ms(const struct report_run *run, long from, long to)
{
    double sum = 0;
    long n = 0;
    for (long i = from - 1; i < to && i < run->step_ms.count; i++)
        if (i >= 0 && isfinite(run->step_ms.values[i])) {
            sum += run->step_ms.values[i];
            n++;
        }
    return n ? sum / (double)n : NAN;
}

static double series_mean(const struct series *s, long from, long to)
{
    double sum = 0;
    long n = 0;
    for (long i = from - 1; i < to && i < s->count; i++)
        if (i >= 0 && isfinite(s->values[i])) {
            sum += s->values[i];
            n++;
        }
    return n ? sum / (double)n : NAN;
}

static double last_finite(const struct series *s, int first)
{
    for (long k = 0; k < s->count; k++) {
        float v = s->values[first ? k : s->count - 1 - k];
        if (isfinite(v)) return v;
    }
    return NAN;
}

static void compute_stats(struct report_run *run, long from_step)
{
    struct run_stats *st = &run->stats;
    st->to = run->steps;
    st->from = from_step <= run->steps ? from_step : run->steps;
    st->mean_step_ms = report_mean_step_ms(run, st->from, st->to);
    double tokens = 0, ms = 0;   /* throughput: the tokens over the time they took */
    for (long i = st->from - 1; i < st->to && i < run->tokens_per_s.count &&
                                i < run->step_ms.count; i++) {
        double t = run->tokens_per_s.values[i], m = run->step_ms.values[i];
        if (isfinite(t) && isfinite(m)) {
            tokens += t * m / 1e3;
            ms += m;
        }
    }
    st->throughput = ms > 0 ? tokens / (ms / 1e3) : NAN;
    st->bubble = series_mean(&run->bubble, st->from, st->to);
    st->imbalance = series_mean(&run->imbalance, st->from, st->to);
    st->peak_mb = NAN;
    for (long i = 0; i < run->peak_mb.count; i++)
        if (isfinite(run->peak_mb.values[i]) &&
            (isnan(st->peak_mb) || run->peak_mb.values[i] > st->peak_mb))
            st->peak_mb = run->peak_mb.values[i];
    st->first_loss = last_finite(&run->loss, 1);
    st->last_loss = last_finite(&run->loss, 0);
    st->last_val_loss = last_finite(&run->eval_loss, 0);
}

static void load_config_fields(struct report_run *run)
{
    char text[64];
    report_config_value(run, "dyn.kind", run->dyn_kind, sizeof run->dyn_kind);
    report_config_value(run, "balance.method", run->method, sizeof run->method);
    report_config_value(run, "parallel.schedule", run->schedule, sizeof run->schedule);
    report_config_value(run, "train.micro_batches", text, sizeof text);
    run->micro_batches = atoi(text);
    if (run->layers == 0) {
        report_config_value(run, "model.layers", text, sizeof text);
        run->layers = atoi(text) > 0 ? atoi(text) : 0;
    }
}

static void load_series(struct report_run *run, const struct listing *l)
{
    struct { const char *name; struct series *s; } series[] = {
        {RUNLOG_STEP_LOSS, &run->loss},         {RUNLOG_STEP_MS, &run->step_ms},
        {RUNLOG_STEP_TOKENS_PER_S, &run->tokens_per_s},
        {RUNLOG_STEP_BUBBLE, &run->bubble},     {RUNLOG_STEP_IMBALANCE, &run->imbalance},
        {RUNLOG_STEP_PEAK_RSS_MB, &run->peak_mb},
        {RUNLOG_EVAL_STEP, &run->eval_step},    {RUNLOG_EVAL_LOSS, &run->eval_loss},
    };
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++) {
        read_series(run, l, series[i].name, series[i].s);
        if (!strncmp(series[i].name, "/steps/", 7) && series[i].s->count > run->steps)
            run->steps = series[i].s->count;
    }
    if (run->eval_step.count != run->eval_loss.count)
        dm_user_error("report: %s: /eval/step has %ld rows but /eval/loss %ld", run->path,
                      run->eval_step.count, run->eval_loss.count);
}

void report_run_load(struct report_run *run, const char *path, long from_step)
{
    char err[1024];
    memset(run, 0, sizeof *run);
    run->path = path;
    run->simulated = report_file_kind("report", path);
    name_run(run);
    run->config = read_attr(run, "config");
    run->version = read_attr(run, "dynmo_version");
    run->created = read_attr(run, "created");
    struct listing l;
    l.count = runlog_list_datasets(path, &l.infos, err, sizeof err);
    if (l.count < 0) dm_user_error("report: %s", err);
    load_series(run, &l);
    if (run->steps == 0)
        dm_user_error("report: %s has no steps yet (no rows in /steps/loss or "
                      "/steps/step_ms)", path);
    read_matrix(run, &l, RUNLOG_LAYER_FWD_MS, 0, &run->fwd);
    run->layers = run->fwd.cols;
    read_matrix(run, &l, RUNLOG_LAYER_BWD_MS, run->layers, &run->bwd);
    if (!run->layers) run->layers = run->bwd.cols;
    load_config_fields(run);
    read_matrix(run, &l, RUNLOG_LAYOUT_HISTORY, 0, &run->layout);
    run->stages = run->layout.cols;
    read_matrix(run, &l, RUNLOG_BALANCE_DECISIONS, DECISION_COLUMNS, &run->decisions);
    find_layout_changes(run);
    load_signals(run, &l);
    dm_free(l.infos);
    if (trace_load(path, &run->trace, err, sizeof err) < 0) dm_user_error("report: %s", err);
    compute_stats(run, from_step);
}

void report_run_free(struct report_run *run)
{
    struct series *series[] = {&run->loss, &run->step_ms, &run->tokens_per_s, &run->bubble,
                               &run->imbalance, &run->peak_mb, &run->eval_step,
                               &run->eval_loss};
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++) dm_free(series[i]->values);
    dm_free(run->fwd.values);
    dm_free(run->bwd.values);
    dm_free(run->layout.values);
    dm_free(run->decisions.values);
    for (int i = 0; i < run->signal_count; i++) dm_free(run->signals[i].values.values);
    dm_free(run->changes);
    trace_free(&run->trace);
    dm_free(run->config);
    dm_free(run->version);
    dm_free(run->created);
    memset(run, 0, sizeof *run);
}

/* The layout row of step (1-based), or -1 when the file has none. */
static long layout_row_of(const struct report_run *run, int step)
{
    long row = step - 1;
    return row >= 0 && row < run->layout.rows && !layout_row_empty(run, row) ? row : -1;
}

static int same_layout(const struct report_run *run, int step_a, int step_b)
{
    long a = layout_row_of(run, step_a), b = layout_row_of(run, step_b);
    if (a < 0 || b < 0) return 1;
    return !memcmp(run->layout.values + a * run->layout.cols,
                   run->layout.values + b * run->layout.cols,
                   (size_t)run->layout.cols * sizeof(float));
}

void report_choose_timeline(struct report_run *run, const int *wanted, int count)
{
    const struct trace *t = &run->trace;
    run->timeline_count = 0;
    if (count > 0) {
        if (t->step_count == 0)
            dm_user_error("report: --timeline: %s has no traced steps (/trace/events is "
                          "missing: train with run.trace_from=N run.trace_steps=K)", run->path);
        for (int i = 0; i < count; i++) {
            if (!trace_has_step(t, wanted[i]))
                dm_user_error("report: --timeline: %s did not trace step %d (it traced "
                              "steps %d to %d)", run->path, wanted[i], t->steps[0],
                              t->steps[t->step_count - 1]);
            run->timeline_steps[run->timeline_count++] = wanted[i];
        }
        return;
    }
    if (t->step_count == 0) return;
    for (int i = 1; i < t->step_count; i++)
        if (!same_layout(run, t->steps[i - 1], t->steps[i])) {
            run->timeline_steps[0] = t->steps[i - 1];
            run->timeline_steps[1] = t->steps[i];
            run->timeline_count = 2;
            return;
        }
    run->timeline_steps[0] = t->steps[t->step_count - 1];
    run->timeline_count = 1;
}
