/* What `dynmo report` and `dynmo trace` read from a run log: the series,
 * the per-block matrices, the layout history, the balancer's decisions and
 * the traced instructions, through the ckpt module's checked reader
 * (struct runlog_file: the file's HDF5 metadata walked before HDF5 reads
 * it, every dataset's rank and size checked); and what the page states
 * from them: the layout changes, the means over the steps after the
 * warm-up, the steps the timeline draws.
 *
 * Every value used as a count, an index or a width is checked against the
 * file's own shape and configuration before it is used: per-block columns
 * are model.layers, or a scheme's signal's width (dyn_signal_width), each layout
 * places model.layers units (blocks; halves too with balance.units =
 * sublayer), a decision's or an evaluation's step is one
 * of the log's, a traced row's step, rank, stage and micro-batch are ones
 * its run had (trace_load).
 *
 * A file whose root attribute "kind" is "simulation" (what `dynmo
 * simulate` writes: a file shaped like a run log) is read the same way.
 * Every dataset may be missing (docs/runlog.md): what is absent is left
 * out of the page, never guessed. It must not write anything, and a
 * problem with the file is one message naming it (exit 2). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "tools/report/report.h"

#define TRACE_COLUMNS RUNLOG_EVENT_COLUMNS
#define DECISION_COLUMNS RUNLOG_EVENT_COLUMNS

/* ---- traced instructions ------------------------------------------------ */

static const char *const op_labels[SCHEDULE_OP_COUNT] = {
    [SCHEDULE_RECV_ACT] = "receive activation", [SCHEDULE_FWD] = "forward",
    [SCHEDULE_SEND_ACT] = "send activation",    [SCHEDULE_RECV_GRAD] = "receive gradient",
    [SCHEDULE_BWD] = "backward",                [SCHEDULE_SEND_GRAD] = "send gradient",
    [SCHEDULE_REDUCE_GRADS] = "gradient sums",  [SCHEDULE_OPTIMIZER_STEP] = "optimizer",
    [SCHEDULE_WGRAD] = "weight gradient",
};

const char *trace_op_label(int op)
{
    return op >= 0 && op < SCHEDULE_OP_COUNT ? op_labels[op] : "?";
}

int trace_op_kind(int op)
{
    switch (op) {
    case SCHEDULE_FWD: return TRACE_KIND_FORWARD;
    case SCHEDULE_BWD: case SCHEDULE_WGRAD: return TRACE_KIND_BACKWARD;
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

/* A cell of /trace/events that must be a whole number in [lo, hi] (as a
 * float: a larger one is not converted). */
static int whole_in(float v, double lo, double hi)
{
    return v >= lo && v <= hi && v == floorf(v);
}

/* What a traced row is checked against: the run's own shape. */
struct trace_shape {
    long steps;             /* rows of the per-step series; 0: unknown */
    int *ranks;             /* (ranks_rows) /steps/ranks, or NULL */
    long ranks_rows;
    struct runlog_layouts layouts;  /* rows 0 when absent */
    int have_config, dp, micro_batches;
};

static void trace_shape_free(struct trace_shape *s)
{
    dm_free(s->ranks);
    runlog_layouts_free(&s->layouts);
}

static int read_trace_shape(struct runlog_file *f, struct trace_shape *s, char *err,
                            size_t errsize)
{
    memset(s, 0, sizeof *s);
    s->steps = runlog_file_steps(f);
    struct dm_config cfg;
    int status = runlog_file_config(f, &cfg, err, errsize);
    if (status < 0) return -1;
    s->have_config = status == 0;
    /* a layout counts units: blocks, or halves with balance.units = sublayer */
    int units = cfg.layers * balance_units_per_block(balance_units_parse(cfg.units));
    s->dp = cfg.dp;
    s->micro_batches = cfg.micro_batches;
    if (runlog_file_dataset(f, RUNLOG_STEP_RANKS)) {
        s->ranks_rows = runlog_file_int_series(f, RUNLOG_STEP_RANKS, &s->ranks, err, errsize);
        if (s->ranks_rows < 0) return -1;
    }
    return runlog_file_layouts(f, s->have_config ? units : 0, &s->layouts, err, errsize) < 0
               ? -1 : 0;
}

/* Row r of the file's events into e, each cell checked as far as the row
 * alone tells; -1 with err naming the row and the problem. */
static int trace_row(const float *row, long r, const struct trace_shape *shape,
                     struct trace_event *e, const char *path, char *err, size_t errsize)
{
    for (int c = 0; c < TRACE_COLUMNS; c++)
        if (!isfinite(row[c])) {
            dm_set_message(err, errsize, "%s: row %ld of /trace/events has a non-finite value "
                           "in column %d", path, r, c);
            return -1;
        }
    double last_step = shape->steps > 0 ? (double)shape->steps : (double)INT_MAX;
    const char *problem =
        !whole_in(row[0], 1, last_step) ? "a step that is not one of the log's"
        : !whole_in(row[1], 0, INT_MAX - 1) || !whole_in(row[2], 0, INT_MAX - 1)
            ? "a rank or stage that is not a whole number >= 0"
        : !whole_in(row[3], 0, SCHEDULE_OP_COUNT - 1) ? "an op outside 0..8"
        : !whole_in(row[4], -1, shape->have_config ? shape->micro_batches - 1 : INT_MAX - 1)
            ? "a micro-batch outside -1..train.micro_batches - 1"
        : row[6] < 0 || row[7] < 0 ? "a negative duration"
        : NULL;
    if (problem) {
        dm_set_message(err, errsize, "%s: row %ld of /trace/events (step %g, rank %g) has %s",
                       path, r, (double)row[0], (double)row[1], problem);
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
    int end_of_step = e->op == SCHEDULE_REDUCE_GRADS || e->op == SCHEDULE_OPTIMIZER_STEP;
    if (end_of_step != (e->micro_batch == -1)) {
        dm_set_message(err, errsize, "%s: row %ld of /trace/events has op %d with micro-batch "
                       "%d (-1 is the step's end, ops 6 and 7, only)", path, r, e->op,
                       e->micro_batch);
        return -1;
    }
    return 0;
}

/* The ranks and stages of the traced step k's rows [first, end): the
 * ranks of its world (/steps/ranks, or its layout's stages x parallel.dp,
 * or the largest rank + 1) each present, none beyond; stages below its
 * stage count. seen: scratch of at least end - first bytes. */
static int check_step_ranks(struct trace *t, int k, long first, long end,
                            const struct trace_shape *shape, unsigned char *seen,
                            const char *path, char *err, size_t errsize)
{
    int step = t->steps[k], most = 0;
    long row = step - 1;
    int stages = row < shape->layouts.rows ? shape->layouts.stages[row] : 0;
    long ranks = row < shape->ranks_rows && shape->ranks[row] > 0 ? shape->ranks[row]
               : stages > 0 && shape->have_config ? (long)stages * shape->dp : 0;
    const char *source = row < shape->ranks_rows && shape->ranks[row] > 0 ? "/steps/ranks"
                       : ranks ? "its layout's stages x parallel.dp" : NULL;
    for (long i = first; i < end; i++) {
        if (t->events[i].rank > most) most = t->events[i].rank;
        if (stages > 0 && t->events[i].stage >= stages) {
            dm_set_message(err, errsize, "%s: row %ld of /trace/events has stage %d; step %d "
                           "ran on %d stages (/layout/history)", path, i, t->events[i].stage,
                           step, stages);
            return -1;
        }
    }
    if (!ranks) ranks = (long)most + 1;
    if (most >= ranks) {
        long i = first;
        while (t->events[i].rank < ranks) i++;
        dm_set_message(err, errsize, "%s: row %ld of /trace/events has rank %d; step %d ran on "
                       "%ld ranks (%s)", path, i, t->events[i].rank, step, ranks, source);
        return -1;
    }
    /* Every rank of the world traces the step: at least one row each. */
    if (ranks > end - first) {
        dm_set_message(err, errsize, "%s: /trace/events has %ld rows of step %d, which ran on "
                       "%ld ranks%s%s%s (each traces at least its optimizer step)", path,
                       end - first, step, ranks, source ? " (" : "", source ? source : "",
                       source ? ")" : "");
        return -1;
    }
    memset(seen, 0, (size_t)ranks);
    for (long i = first; i < end; i++) seen[t->events[i].rank] = 1;
    for (long rank = 0; rank < ranks; rank++)
        if (!seen[rank]) {
            dm_set_message(err, errsize, "%s: /trace/events has no row of rank %ld at step %d, "
                           "which ran on %ld ranks (each traces at least its optimizer step)",
                           path, rank, step, ranks);
            return -1;
        }
    t->ranks[k] = (int)ranks;
    if (ranks > t->max_ranks) t->max_ranks = (int)ranks;
    return 0;
}

int trace_load(struct runlog_file *f, struct trace *t, char *err, size_t errsize)
{
    memset(t, 0, sizeof *t);
    if (!runlog_file_dataset(f, RUNLOG_TRACE_EVENTS)) return 1;
    const char *path = runlog_file_path(f);
    struct trace_shape shape;
    float *rows = NULL;
    int cols = 0, status = -1;
    unsigned char *seen = NULL;
    if (read_trace_shape(f, &shape, err, errsize) != 0) goto done;
    long count = runlog_file_matrix(f, RUNLOG_TRACE_EVENTS, &rows, &cols, err, errsize);
    if (count < 0) goto done;
    size_t slots = (size_t)(count ? count : 1);
    t->events = dm_alloc(slots * sizeof *t->events);
    t->steps = dm_alloc(slots * sizeof *t->steps);
    t->ranks = dm_alloc(slots * sizeof *t->ranks);
    t->first = dm_alloc((slots + 1) * sizeof *t->first);
    seen = dm_alloc(slots);
    for (long r = 0; r < count; r++) {
        struct trace_event *e = &t->events[r];
        if (trace_row(rows + r * TRACE_COLUMNS, r, &shape, e, path, err, errsize) < 0)
            goto done;
        if (t->step_count && e->step < t->steps[t->step_count - 1]) {
            dm_set_message(err, errsize, "%s: row %ld of /trace/events has step %d after step %d "
                           "(rows come step by step)", path, r, e->step,
                           t->steps[t->step_count - 1]);
            goto done;
        }
        if (!t->step_count || e->step != t->steps[t->step_count - 1]) {
            t->first[t->step_count] = r;
            t->steps[t->step_count++] = e->step;
        }
        t->count++;
    }
    t->first[t->step_count] = count;
    for (int k = 0; k < t->step_count; k++)
        if (check_step_ranks(t, k, t->first[k], t->first[k + 1], &shape, seen, path, err,
                             errsize) != 0)
            goto done;
    status = 0;
done:
    dm_free(rows);
    dm_free(seen);
    trace_shape_free(&shape);
    if (status != 0) trace_free(t);
    return status;
}

void trace_free(struct trace *t)
{
    dm_free(t->events);
    dm_free(t->steps);
    dm_free(t->ranks);
    dm_free(t->first);
    memset(t, 0, sizeof *t);
}

int trace_has_step(const struct trace *t, int step)
{
    for (int i = 0; i < t->step_count; i++)
        if (t->steps[i] == step) return 1;
    return 0;
}

/* ---- datasets ------------------------------------------------------------ */

/* One load: the file, its configuration, where a problem goes. */
struct run_reading {
    struct report_run *run;
    struct runlog_file *f;
    struct dm_config cfg;       /* the defaults where the file has no config */
    int have_config;
    char *err;
    size_t errsize;
};

static int read_series(struct run_reading *ld, const char *name, struct series *out)
{
    memset(out, 0, sizeof *out);
    if (!runlog_file_dataset(ld->f, name)) return 0;
    out->count = runlog_file_series(ld->f, name, &out->values, ld->err, ld->errsize);
    return out->count < 0 ? -1 : 0;
}

/* A 2-D dataset; want_cols > 0: it must have that many columns. */
static int read_matrix(struct run_reading *ld, const char *name, int want_cols, struct matrix *out)
{
    memset(out, 0, sizeof *out);
    if (!runlog_file_dataset(ld->f, name)) return 0;
    out->rows = runlog_file_matrix(ld->f, name, &out->values, &out->cols, ld->err, ld->errsize);
    if (out->rows < 0) return -1;
    if (want_cols > 0 && out->cols != want_cols) {
        dm_set_message(ld->err, ld->errsize, "%s: %s has %d columns; the run has %d", ld->run->path,
                       name, out->cols, want_cols);
        return -1;
    }
    return 0;
}

void report_config_value(const struct report_run *run, const char *key, char *out,
                         size_t size)
{
    if (run->have_config) config_value_text(&run->cfg, key, out, size);
    else out[0] = '\0';
}

static int read_attr(struct run_reading *ld, const char *name, char **text)
{
    return runlog_file_attr(ld->f, name, text, ld->err, ld->errsize) < 0 ? -1 : 0;
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

/* Whether the run's config attribute has the key at all. */
static int config_has(const struct report_run *run, const char *key)
{
    return run->have_config && config_was_set(&run->cfg, key);
}

/* A scheme's signal as one value per layer and step (the signal's
 * to_layers over each row of its dataset, or of the dataset it is derived
 * from; a block the scheme does not own blank, NaN); values NULL when the
 * log has none. */
static int load_signal(struct run_reading *ld, const struct dyn_signal *signal,
                       const struct gpt_shape *shape, struct matrix *out)
{
    struct report_run *run = ld->run;
    const char *name = signal->source ? signal->source : signal->dataset;
    int width = signal->source ? run->layers : dyn_signal_width(signal, shape);
    memset(out, 0, sizeof *out);
    if (!runlog_file_dataset(ld->f, name)) return 0;
    if (signal->columns != DYN_SIGNAL_LAYERS && !dyn_signal_active(signal, &ld->cfg)) {
        dm_set_message(ld->err, ld->errsize, "%s has %s but its config does not run the "
                       "scheme that writes it (no blocks of it)", run->path, name);
        return -1;
    }
    struct matrix m;
    if (read_matrix(ld, name, width, &m) != 0) return -1;
    if (!signal->to_layers) {
        *out = m;
        return 0;
    }
    out->rows = m.rows;
    out->cols = run->layers;
    out->values = dm_alloc((size_t)(m.rows ? m.rows : 1) * run->layers * sizeof(float));
    for (long i = 0; i < m.rows * run->layers; i++) out->values[i] = NAN;
    for (long r = 0; r < m.rows; r++)
        signal->to_layers(&ld->cfg, shape, m.values + r * m.cols, out->values + r * run->layers);
    dm_free(m.values);
    return 0;
}

/* The schemes' signals beside the cost heat map: each declared figure
 * the file has, in the schemes' table order. */
static int load_signals(struct run_reading *ld)
{
    struct report_run *run = ld->run;
    const struct dyn_signal *signals[DYN_SIGNALS_MAX];
    int count = dyn_signals_all(signals, DYN_SIGNALS_MAX);
    /* the blocks the datasets have: the config's, or where it has no
     * model.layers, what the per-block datasets say */
    struct gpt_shape shape = dyn_shape_from_config(&ld->cfg);
    shape.layers = run->layers;
    for (int k = 0; k < count; k++) {
        const struct dyn_signal *signal = signals[k];
        if (!signal->figure_label || (signal->figure_of && !signal->figure_of(&ld->cfg)))
            continue;
        struct matrix m;
        if (load_signal(ld, signal, &shape, &m) != 0) return -1;
        if (!m.values) continue;
        if (run->signal_count == REPORT_MAX_SIGNALS) {
            dm_free(m.values);
            continue;
        }
        run->signals[run->signal_count++] =
            (struct block_signal){signal->figure_label, signal->figure_unit, m};
    }
    return 0;
}

static int layout_row_empty(const struct report_run *run, long row)
{
    const float *r = run->layout.values + row * run->layout.cols;
    for (int s = 0; s < run->layout.cols; s++)
        if (r[s] != 0.0f) return 0;
    return 1;
}

/* The recorded layouts, each a layout of the run's blocks
 * (runlog_file_layouts; rows of zeros are filler), and the steps at which
 * they changed. */
static int load_layouts(struct run_reading *ld)
{
    struct report_run *run = ld->run;
    struct runlog_layouts l;
    int per = run->units_per_block;
    int status = runlog_file_layouts(ld->f, run->layers * per, &l, ld->err, ld->errsize);
    if (status < 0) return -1;
    struct matrix *m = &run->layout;
    m->rows = l.rows;
    m->cols = l.width;
    m->values = status == 0 ? dm_alloc((size_t)(l.rows ? l.rows : 1) * (size_t)l.width *
                                       sizeof(float)) : NULL;
    for (long i = 0; i < l.rows * l.width; i++) m->values[i] = (float)l.counts[i];
    if (run->layers == 0) run->layers = l.layers > 0 ? l.layers / per : 0;
    run->stages = l.width;
    runlog_layouts_free(&l);
    run->changes = dm_alloc((size_t)(m->rows ? m->rows : 1) * sizeof *run->changes);
    long previous = -1;
    for (long i = 0; i < m->rows; i++) {
        if (layout_row_empty(run, i)) continue;
        if (previous >= 0 && memcmp(m->values + previous * m->cols, m->values + i * m->cols,
                                    (size_t)m->cols * sizeof *m->values))
            run->changes[run->change_count++] =
                (struct layout_change){(int)(i + 1), (int)previous, (int)i};
        previous = i;
    }
    return 0;
}

/* The balancer's decisions: each row's step one of the log's. */
static int load_decisions(struct run_reading *ld)
{
    struct report_run *run = ld->run;
    if (read_matrix(ld, RUNLOG_BALANCE_DECISIONS, DECISION_COLUMNS, &run->decisions) != 0)
        return -1;
    for (long d = 0; d < run->decisions.rows; d++) {
        float step = run->decisions.values[d * DECISION_COLUMNS];
        if (!(step >= 1 && step <= (float)run->steps && step == floorf(step))) {
            dm_set_message(ld->err, ld->errsize, "%s: row %ld of %s is a decision at step %g, "
                           "not one of the log's steps 1..%ld", run->path, d,
                           RUNLOG_BALANCE_DECISIONS, (double)step, run->steps);
            return -1;
        }
    }
    return 0;
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

static void load_config_fields(struct run_reading *ld)
{
    struct report_run *run = ld->run;
    report_config_value(run, "dyn.kind", run->dyn_kind, sizeof run->dyn_kind);
    report_config_value(run, "balance.method", run->method, sizeof run->method);
    report_config_value(run, "parallel.schedule", run->schedule, sizeof run->schedule);
    run->micro_batches = config_has(run, "train.micro_batches") ? ld->cfg.micro_batches : 0;
}

static int load_series(struct run_reading *ld)
{
    struct report_run *run = ld->run;
    struct { const char *name; struct series *s; } series[] = {
        {RUNLOG_STEP_LOSS, &run->loss},         {RUNLOG_STEP_MS, &run->step_ms},
        {RUNLOG_STEP_TOKENS_PER_S, &run->tokens_per_s},
        {RUNLOG_STEP_BUBBLE, &run->bubble},     {RUNLOG_STEP_IMBALANCE, &run->imbalance},
        {RUNLOG_STEP_PEAK_RSS_MB, &run->peak_mb},
        {RUNLOG_EVAL_STEP, &run->eval_step},    {RUNLOG_EVAL_LOSS, &run->eval_loss},
    };
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++) {
        if (read_series(ld, series[i].name, series[i].s) != 0) return -1;
        if (!strncmp(series[i].name, "/steps/", 7) && series[i].s->count > run->steps)
            run->steps = series[i].s->count;
    }
    if (run->eval_step.count != run->eval_loss.count) {
        dm_set_message(ld->err, ld->errsize, "%s: /eval/step has %ld rows but /eval/loss %ld",
                       run->path, run->eval_step.count, run->eval_loss.count);
        return -1;
    }
    for (long i = 0; i < run->eval_step.count; i++) {
        float step = run->eval_step.values[i];
        if (!(step >= 1 && step <= (float)run->steps && step == floorf(step))) {
            dm_set_message(ld->err, ld->errsize, "%s: row %ld of /eval/step is step %g, not one "
                           "of the log's steps 1..%ld", run->path, i, (double)step, run->steps);
            return -1;
        }
    }
    return 0;
}

/* The blocks: per-block columns are model.layers where the config says it,
 * else the forward times' width. */
static int load_blocks(struct run_reading *ld)
{
    struct report_run *run = ld->run;
    run->layers = config_has(run, "model.layers") ? ld->cfg.layers : 0;
    run->units_per_block = balance_units_per_block(balance_units_parse(ld->cfg.units));
    if (read_matrix(ld, RUNLOG_LAYER_FWD_MS, run->layers, &run->fwd) != 0) return -1;
    if (!run->layers) run->layers = run->fwd.cols;
    if (read_matrix(ld, RUNLOG_LAYER_BWD_MS, run->layers, &run->bwd) != 0) return -1;
    if (!run->layers) run->layers = run->bwd.cols;
    return 0;
}

static int load_run(struct run_reading *ld, long from_step)
{
    struct report_run *run = ld->run;
    if (!runlog_file_kind(ld->f)[0]) {
        dm_set_message(ld->err, ld->errsize, "%s is an HDF5 file but not a dynmo run log (its "
                       "root group has no \"kind\" attribute)", run->path);
        return -1;
    }
    run->simulated = !strcmp(runlog_file_kind(ld->f), SIMULATION_KIND);
    if (read_attr(ld, "config", &run->config) || read_attr(ld, "dynmo_version", &run->version) ||
        read_attr(ld, "created", &run->created))
        return -1;
    int status = runlog_file_config(ld->f, &ld->cfg, ld->err, ld->errsize);
    if (status < 0) return -1;
    ld->have_config = status == 0;
    run->cfg = ld->cfg;
    run->have_config = ld->have_config;
    if (load_series(ld) != 0) return -1;
    if (run->steps == 0) {
        dm_set_message(ld->err, ld->errsize, "%s has no steps yet (no rows in /steps/loss or "
                       "/steps/step_ms)", run->path);
        return -1;
    }
    if (load_blocks(ld) != 0) return -1;
    load_config_fields(ld);
    if (load_layouts(ld) != 0 || load_decisions(ld) != 0 || load_signals(ld) != 0) return -1;
    if (trace_load(ld->f, &run->trace, ld->err, ld->errsize) < 0) return -1;
    compute_stats(run, from_step);
    return 0;
}

int report_run_try_load(struct report_run *run, const char *path, long from_step, char *err,
                        size_t errsize)
{
    memset(run, 0, sizeof *run);
    run->path = path;
    name_run(run);
    struct run_reading ld = {.run = run, .err = err, .errsize = errsize};
    ld.f = runlog_open_read(path, err, errsize);
    int status = ld.f ? load_run(&ld, from_step) : -1;
    runlog_close_read(ld.f);
    if (status != 0) report_run_free(run);
    return status;
}

void report_run_load(struct report_run *run, const char *path, long from_step)
{
    char err[1200];
    report_file_kind("report", path);
    if (report_run_try_load(run, path, from_step, err, sizeof err) != 0)
        dm_user_error("report: %s", err);
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
