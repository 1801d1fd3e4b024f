/* The schemes' summaries of a run log for inspect (dyn_summarise_log):
 * each registered scheme's own (its summarise_log), or the generic
 * summary its signals declare (DYN_SUMMARY_MEAN: the mean over the steps
 * and columns, and the column with the largest mean), and the schemes'
 * rules over a stored config that the readers compute with; and what
 * every scheme's reading of a log shares: a dataset of the expected size
 * (dyn_log_floats, dyn_log_ints) and a problem's message (dyn_log_problem,
 * dyn_send_problem, which dyn_ckpt_problem uses too). It reads through the
 * caller's reader only. Must not: name a scheme. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/dyn.h"
#include "dyn/scheme.h"

void dyn_send_problem(void (*send)(void *ctx, const char *text), void *ctx, const char *fmt,
                      va_list ap)
{
    char text[1400];
    vsnprintf(text, sizeof text, fmt, ap);
    send(ctx, text);
}

void dyn_log_problem(const struct dyn_log_reader *rd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dyn_send_problem(rd->fail, rd->ctx, fmt, ap);
    va_end(ap);
    DM_FATAL("the log reader's fail returned");
}

/* dyn_log_floats and dyn_log_ints: a float or an int dataset. */
static void *log_matrix(const struct dyn_log_reader *rd, const char *dataset, long rows,
                        int cols, int is_int)
{
    float *floats = NULL;
    int *ints = NULL, got_cols = 0;
    long got = is_int ? rd->ints(rd->ctx, dataset, &ints, &got_cols)
                      : rd->floats(rd->ctx, dataset, &floats, &got_cols);
    void *values = is_int ? (void *)ints : (void *)floats;
    if (got < rows || got_cols != cols) {
        dm_free(values);
        dyn_log_problem(rd, "%s: %s has %ld rows of %d, expected %ld of %d", rd->path, dataset,
                        got, got_cols, rows, cols);
    }
    return values;
}

float *dyn_log_floats(const struct dyn_log_reader *rd, const char *dataset, long rows, int cols)
{
    return log_matrix(rd, dataset, rows, cols, 0);
}

int *dyn_log_ints(const struct dyn_log_reader *rd, const char *dataset, long rows, int cols)
{
    return log_matrix(rd, dataset, rows, cols, 1);
}

/* What the generic summary found in one dataset. */
struct column_means {
    double mean, largest;   /* mean over steps and columns; the largest column's mean */
    int largest_column, columns;
    long steps;             /* rows with a value in the largest column */
};

/* A dataset's values as floats (an int one: its filler rows as NaN). */
static long read_values(const struct dyn_log_reader *rd, const struct dyn_signal *signal,
                        float **values, int *cols)
{
    if (!signal->is_int) return rd->floats(rd->ctx, signal->dataset, values, cols);
    int *ints = NULL;
    long rows = rd->ints(rd->ctx, signal->dataset, &ints, cols);
    *values = dm_alloc((size_t)(rows * *cols > 0 ? rows * *cols : 1) * sizeof(float));
    for (long i = 0; i < rows * *cols; i++)
        (*values)[i] = ints[i] == signal->filler ? NAN : (float)ints[i];
    dm_free(ints);
    return rows;
}

/* Each column's mean over its rows with a value, their mean, and the
 * largest; 0 when no column has a value. */
static int column_means(const float *values, long rows, int cols, struct column_means *out)
{
    double total = 0.0;
    int counted = 0;
    memset(out, 0, sizeof *out);
    for (int c = 0; c < cols; c++) {
        double sum = 0.0;
        long n = 0;
        for (long r = 0; r < rows; r++)
            if (!isnan(values[r * cols + c])) {
                sum += values[r * cols + c];
                n++;
            }
        if (n == 0) continue;
        total += sum / (double)n;
        if (counted++ == 0 || sum / (double)n > out->largest) {
            out->largest = sum / (double)n;
            out->largest_column = c;
            out->steps = n;
        }
    }
    out->columns = cols;
    out->mean = counted ? total / counted : 0.0;
    return counted > 0;
}

/* The layer of column c of signal's row under shape (a cell's: its
 * block's). */
static int column_layer(const struct dyn_signal *signal, const struct gpt_shape *shape, int c)
{
    int block = c / dyn_signal_cells(signal, shape);
    for (int l = 0; l < shape->layers; l++)
        if (dyn_signal_layer(signal, shape, l) && block-- == 0) return l;
    return -1;
}

static const char *base_name(const char *dataset)
{
    const char *slash = strrchr(dataset, '/');
    return slash ? slash + 1 : dataset;
}

static void summarise_signal(const struct dyn_scheme *scheme, const struct dyn_signal *signal,
                             const struct dyn_log_reader *rd, const struct dyn_summary_writer *w,
                             int *opened)
{
    float *values = NULL;
    int cols = 0;
    long rows = read_values(rd, signal, &values, &cols);
    struct column_means m;
    if (rows <= 0 || cols <= 0 || !column_means(values, rows, cols, &m)) {
        dm_free(values);
        return;
    }
    dm_free(values);
    struct gpt_shape shape = dyn_shape_from_config(rd->cfg);
    int layer = column_layer(signal, &shape, m.largest_column);
    char line[512];
    snprintf(line, sizeof line, "%s: %s (%s, %s): mean %.6g over %ld steps and %d columns; "
             "block %d the largest, %.6g", scheme->name, signal->label, signal->dataset,
             signal->unit, m.mean, m.steps, m.columns, layer, m.largest);
    w->line(w->ctx, line);
    if (!*opened) w->open(w->ctx, scheme->name);
    *opened = 1;
    w->open(w->ctx, base_name(signal->dataset));
    w->number(w->ctx, "mean", m.mean);
    w->number(w->ctx, "largest", m.largest);
    w->integer(w->ctx, "largest_block", layer);
    w->integer(w->ctx, "steps", m.steps);
    w->close(w->ctx);
}

void dyn_summarise_log(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w)
{
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_scheme *scheme = dyn_scheme_at(i);
        if (scheme->summarise_log) {
            scheme->summarise_log(rd, w);
            continue;
        }
        int opened = 0;
        for (int k = 0; k < scheme->signal_count; k++) {
            const struct dyn_signal *signal = &scheme->signals[k];
            if (signal->summary == DYN_SUMMARY_MEAN && rd->has(rd->ctx, signal->dataset))
                summarise_signal(scheme, signal, rd, w, &opened);
        }
        if (opened) w->close(w->ctx);
    }
}

int dyn_check_log_config(const struct dm_config *cfg, char *problem, size_t size)
{
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_scheme *scheme = dyn_scheme_at(i);
        if (scheme->check_log_config && scheme->check_log_config(cfg, problem, size) != 0)
            return -1;
    }
    return 0;
}
