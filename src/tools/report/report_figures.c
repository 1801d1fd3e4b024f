/* The figures of `dynmo report` (docs/report.md says how to read each):
 * the loss, the throughput and bubble ratio (every run overlaid), and per
 * run the layout over time with its migrations and the per-block cost heat
 * map beside the scheme's own signal. The timeline of traced steps is
 * report_timeline.c's. Which figures exist follows from what the runs
 * hold: a figure whose data no run has is left out.
 *
 * It draws only what was loaded (report_load.c) and writes no files. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/core.h"
#include "tools/report/report.h"

#define FIGURE_WIDTH 960
#define MARGIN_LEFT 72
#define MARGIN_RIGHT 24
#define MARGIN_TOP 58
#define MARGIN_BOTTOM 46

static const struct report_run *figure_run(const struct figure *f)
{
    return &f->report->runs[f->run];
}

static long longest_run(const struct report *rep)
{
    long steps = 1;
    for (int i = 0; i < rep->run_count; i++)
        if (rep->runs[i].steps > steps) steps = rep->runs[i].steps;
    return steps;
}

/* The finite range of a series over every run, padded by 5%. */
static void series_range(const struct report *rep, size_t offset, double scale, double *lo,
                         double *hi)
{
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int r = 0; r < rep->run_count; r++) {
        const struct series *s = (const struct series *)((const char *)&rep->runs[r] + offset);
        for (long i = 0; i < s->count; i++)
            if (isfinite(s->values[i])) {
                *lo = fmin(*lo, s->values[i] * scale);
                *hi = fmax(*hi, s->values[i] * scale);
            }
    }
    if (!isfinite(*lo)) *lo = 0, *hi = 1;
    double pad = *hi > *lo ? 0.05 * (*hi - *lo) : 0.5;
    *lo -= pad;
    *hi += pad;
}

static void run_legend(cairo_t *cr, const struct report *rep, double y)
{
    const char *labels[16];
    struct rgb colors[16];
    char names[16][160];
    int n = rep->run_count < 16 ? rep->run_count : 16;
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "%s%s", rep->runs[i].name,
                 rep->runs[i].simulated ? " (simulated)" : "");
        labels[i] = names[i];
        colors[i] = palette_color(i);
    }
    draw_legend(cr, MARGIN_LEFT, y, labels, colors, n);
}

static struct chart full_panel(int height, double x_max, double y_min, double y_max)
{
    return (struct chart){MARGIN_LEFT, MARGIN_TOP, FIGURE_WIDTH - MARGIN_LEFT - MARGIN_RIGHT,
                          height - MARGIN_TOP - MARGIN_BOTTOM, 0.5, x_max + 0.5, y_min,
                          y_max, 0};
}

static void draw_loss(cairo_t *cr, const struct figure *f)
{
    const struct report *rep = f->report;
    double lo, hi, vlo, vhi;
    series_range(rep, offsetof(struct report_run, loss), 1, &lo, &hi);
    series_range(rep, offsetof(struct report_run, eval_loss), 1, &vlo, &vhi);
    int any_eval = 0;
    for (int r = 0; r < rep->run_count; r++) any_eval |= rep->runs[r].eval_loss.count > 0;
    if (any_eval) lo = fmin(lo, vlo), hi = fmax(hi, vhi);
    struct chart c = full_panel(f->height, (double)longest_run(rep), lo, hi);
    draw_title(cr, f->width, any_eval ? "Loss over steps (line: training; circles: validation)"
                                      : "Training loss over steps");
    run_legend(cr, rep, 40);
    chart_axes(cr, &c, "step", "loss (nats/token)", TICKS_INTEGER, TICKS_REAL);
    for (int r = 0; r < rep->run_count; r++) {
        const struct report_run *run = &rep->runs[r];
        /* later runs narrower, on top: identical losses still show both */
        chart_line(cr, &c, run->loss.values, run->loss.count, 1, palette_color(r),
                   r == 0 ? 3.2 : 1.4, 0);
        chart_points(cr, &c, run->eval_step.values, run->eval_loss.values,
                     run->eval_loss.count, palette_color(r));
    }
}

/* One of the two panels of the throughput figure. */
static void throughput_panel(cairo_t *cr, const struct figure *f, struct chart *c,
                             size_t offset, double scale, const char *y_label)
{
    const struct report *rep = f->report;
    double lo, hi;
    series_range(rep, offset, scale, &lo, &hi);
    (void)lo;   /* rates and shares read best from zero */
    c->y_min = 0;
    c->y_max = hi;
    chart_axes(cr, c, "step", y_label, TICKS_INTEGER, TICKS_REAL);
    for (int r = 0; r < rep->run_count; r++) {
        const struct report_run *run = &rep->runs[r];
        for (int k = 0; k < run->change_count; k++)
            chart_vline(cr, c, run->changes[k].step - 0.5, palette_color(r), 1);
        const struct series *s = (const struct series *)((const char *)run + offset);
        float *scaled = dm_alloc((size_t)(s->count ? s->count : 1) * sizeof *scaled);
        for (long i = 0; i < s->count; i++) scaled[i] = (float)(s->values[i] * scale);
        chart_line(cr, c, scaled, s->count, 1, palette_color(r), 1.6, 0);
        dm_free(scaled);
    }
}

static void draw_throughput(cairo_t *cr, const struct figure *f)
{
    draw_title(cr, f->width, "Throughput and pipeline bubble over steps "
                             "(dashed: a layout change)");
    run_legend(cr, f->report, 40);
    int panel = (f->height - MARGIN_TOP - 2 * MARGIN_BOTTOM) / 2;
    struct chart c = full_panel(f->height, (double)longest_run(f->report), 0, 1);
    c.height = panel;
    throughput_panel(cr, f, &c, offsetof(struct report_run, tokens_per_s), 1, "tokens/s");
    c.top += panel + MARGIN_BOTTOM;
    throughput_panel(cr, f, &c, offsetof(struct report_run, bubble), 100, "bubble (%)");
}

/* The layout row of step i + 1 as blocks per stage (floats of the file). */
static const float *layout_row(const struct report_run *run, long i)
{
    return run->layout.values + i * run->layout.cols;
}

static int rows_equal(const struct report_run *run, long a, long b)
{
    return !memcmp(layout_row(run, a), layout_row(run, b), (size_t)run->layout.cols * 4);
}

/* Bands of equal layout rows [i, end): one rectangle per stage, in
 * blocks (with sublayer units a boundary inside a block sits at its
 * middle). */
static void layout_band(cairo_t *cr, const struct chart *c, const struct report_run *run,
                        long i, long end)
{
    double start = 0;
    for (int s = 0; s < run->layout.cols; s++) {
        double count = layout_row(run, i)[s] / run->units_per_block;
        if (!(count > 0)) continue;
        struct rgb color = palette_color(s);
        cairo_set_source_rgb(cr, color.r, color.g, color.b);
        double x0 = chart_x(c, i + 0.5), x1 = chart_x(c, end + 0.5);
        double y0 = chart_y(c, start - 0.5), y1 = chart_y(c, start + count - 0.5);
        cairo_rectangle(cr, x0, y0, x1 - x0, y1 - y0 - 1);
        cairo_fill(cr);
        char label[48];
        snprintf(label, sizeof label, "stage %d: %g%s", s, (double)layout_row(run, i)[s],
                 run->units_per_block > 1 ? " units" : "");
        if (y1 - y0 > 14 && x1 - x0 > 80) {
            cairo_set_source_rgb(cr, 1, 1, 1);
            draw_text(cr, x0 + 5, (y0 + y1) / 2, label, 11, 0, 0.5, 0);
        }
        start += count;
    }
}

static void draw_layout(cairo_t *cr, const struct figure *f)
{
    const struct report_run *run = figure_run(f);
    char title[256];
    snprintf(title, sizeof title, "%s: %s owned by each stage, step by step "
             "(dashed: a layout change, with its step)", run->name,
             run->units_per_block > 1 ? "blocks and half blocks (sublayer units)" : "blocks");
    draw_title(cr, f->width, title);
    struct chart c = full_panel(f->height, (double)longest_run(f->report), -0.5,
                                run->layers - 0.5);
    c.y_down = 1;
    c.x_max = fmax((double)run->layout.rows, 1) + 0.5;
    chart_axes(cr, &c, "step", "block", TICKS_INTEGER, TICKS_INTEGER);
    for (long i = 0; i < run->layout.rows;) {
        long end = i + 1;
        while (end < run->layout.rows && rows_equal(run, i, end)) end++;
        layout_band(cr, &c, run, i, end);
        i = end;
    }
    chart_frame(cr, &c);
    double last_label = -1e9;
    for (int k = 0; k < run->change_count; k++) {
        double step = run->changes[k].step;
        chart_vline(cr, &c, step - 0.5, (struct rgb){0.1, 0.1, 0.1}, 1);
        double x = chart_x(&c, step - 0.5);
        if (x - last_label < 34) continue;
        char label[16];
        snprintf(label, sizeof label, "%d", run->changes[k].step);
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        draw_text(cr, x, c.top - 3, label, 10, 0.5, 1, 0);
        last_label = x;
    }
}

/* fwd + bwd per block and step (either alone where the other is absent). */
static float *block_costs(const struct report_run *run, long *rows)
{
    const struct matrix *a = run->fwd.values ? &run->fwd : &run->bwd;
    const struct matrix *b = run->fwd.values && run->bwd.values ? &run->bwd : NULL;
    *rows = b && b->rows < a->rows ? b->rows : a->rows;
    float *cost = dm_alloc((size_t)(*rows * a->cols + 1) * sizeof *cost);
    for (long i = 0; i < *rows * a->cols; i++)
        cost[i] = a->values[i] + (b ? b->values[i] : 0.0f);
    return cost;
}

/* One heat-map panel with its colour bar to the right. */
static void heat_panel(cairo_t *cr, struct chart *c, const float *values, long rows, int cols,
                       int fixed_range, const char *title, const char *bar_label,
                       const char *y_label)
{
    double lo = 0, hi = 1;
    int clipped = 0;
    if (!fixed_range) value_range(values, rows * cols, &lo, &hi, &clipped);
    c->x_max = fmax((double)rows, 1) + 0.5;
    chart_axes(cr, c, "step", y_label, TICKS_INTEGER, TICKS_INTEGER);
    chart_heatmap(cr, c, values, rows, cols, lo, hi);
    chart_frame(cr, c);
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    draw_text(cr, c->left + c->width / 2, c->top - 6, title, 12, 0.5, 1, 0);
    draw_colorbar(cr, c->left + c->width + 8, c->top, c->height, lo, hi, bar_label, clipped);
}

static void draw_costs(cairo_t *cr, const struct figure *f)
{
    const struct report_run *run = figure_run(f);
    char title[256];
    snprintf(title, sizeof title, "%s: per-block cost over steps%s", run->name,
             run->signal_count ? ", and the scheme's signal beside it" : "");
    draw_title(cr, f->width, title);
    int panels = 1 + (run->signal_count < 2 ? run->signal_count : 2);
    /* room right of each panel for its colour bar and the next panel's ticks */
    const double gap = 112;
    double panel_width = (FIGURE_WIDTH - MARGIN_LEFT) / (double)panels - gap;
    struct chart c = full_panel(f->height, 1, -0.5, run->layers - 0.5);
    c.y_down = 1;
    c.width = panel_width;
    long rows;
    float *cost = block_costs(run, &rows);
    heat_panel(cr, &c, cost, rows, run->layers, 0, "forward + backward (ms per micro-batch)",
               "ms", "block");
    dm_free(cost);
    for (int k = 0; k + 1 < panels; k++) {
        const struct block_signal *s = &run->signals[k];
        c.left += panel_width + gap;
        heat_panel(cr, &c, s->values.values, s->values.rows, s->values.cols, 1, s->label,
                   s->unit, NULL);
    }
}

struct figure *report_add_figure(struct report *rep, const char *name, int run, int width,
                                 int height, figure_draw_fn draw)
{
    rep->figures = dm_grow(rep->figures, sizeof *rep->figures, rep->figure_count,
                           &rep->figure_capacity, 8);
    struct figure *f = &rep->figures[rep->figure_count++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->run = run;
    f->width = width;
    f->height = height;
    f->draw = draw;
    f->report = rep;
    return f;
}

static int block_axis_height(const struct report_run *run)
{
    int h = 10 * run->layers;
    return MARGIN_TOP + MARGIN_BOTTOM + (h < 160 ? 160 : h > 480 ? 480 : h);
}

static void add_run_figures(struct report *rep, int r)
{
    const struct report_run *run = &rep->runs[r];
    char name[64];
    struct figure *f;
    if (run->layout.rows > 0 && run->layers > 0) {
        snprintf(name, sizeof name, "layout-%d", r + 1);
        f = report_add_figure(rep, name, r, FIGURE_WIDTH, block_axis_height(run), draw_layout);
        snprintf(f->caption, sizeof f->caption, "%s: which blocks each stage owned at each "
                 "step (one colour per stage); a dashed line marks a layout change, labelled "
                 "with the first step of the new layout (%d change%s).", run->name,
                 run->change_count, run->change_count == 1 ? "" : "s");
        snprintf(f->alt, sizeof f->alt, "layout over steps of %s", run->name);
    }
    if ((run->fwd.values || run->bwd.values) && run->layers > 0) {
        snprintf(name, sizeof name, "cost-%d", r + 1);
        f = report_add_figure(rep, name, r, FIGURE_WIDTH, block_axis_height(run), draw_costs);
        snprintf(f->caption, sizeof f->caption, "%s: forward + backward time of each block "
                 "per micro-batch at each step (darker is slower; the scale stops at the "
                 "99th percentile)%s%s.", run->name, run->signal_count ? "; beside it: " : "",
                 run->signal_count ? run->signals[0].label : "");
        snprintf(f->alt, sizeof f->alt, "per-block cost heat map of %s", run->name);
    }
    if (run->timeline_count > 0) {
        snprintf(name, sizeof name, "timeline-%d", r + 1);
        f = report_add_figure(rep, name, r, FIGURE_WIDTH, timeline_height(run), draw_timeline);
        if (run->timeline_count == 2)
            snprintf(f->caption, sizeof f->caption, "%s: the pipeline of traced step %d "
                     "(before the layout change) and step %d (after it), one row per rank.",
                     run->name, run->timeline_steps[0], run->timeline_steps[1]);
        else
            snprintf(f->caption, sizeof f->caption, "%s: the pipeline of traced step %d, one "
                     "row per rank.", run->name, run->timeline_steps[0]);
        snprintf(f->alt, sizeof f->alt, "pipeline timeline of %s", run->name);
    }
}

void report_make_figures(struct report *rep)
{
    int loss = 0, throughput = 0;
    for (int r = 0; r < rep->run_count; r++) {
        loss |= rep->runs[r].loss.count > 0;
        throughput |= rep->runs[r].tokens_per_s.count > 0 || rep->runs[r].bubble.count > 0;
    }
    struct figure *f;
    if (loss) {
        f = report_add_figure(rep, "loss", -1, FIGURE_WIDTH, 340, draw_loss);
        snprintf(f->caption, sizeof f->caption, "Training loss at every step%s.",
                 rep->run_count > 1 ? ", every run overlaid" : "");
        snprintf(f->alt, sizeof f->alt, "loss over steps");
    }
    if (throughput) {
        f = report_add_figure(rep, "throughput", -1, FIGURE_WIDTH, 500, draw_throughput);
        snprintf(f->caption, sizeof f->caption, "Tokens per second and the bubble ratio "
                 "(the share of the step the ranks spent not computing) at every step.");
        snprintf(f->alt, sizeof f->alt, "throughput and bubble ratio over steps");
    }
    for (int r = 0; r < rep->run_count; r++) add_run_figures(rep, r);
    for (int i = 0; i < rep->figure_count; i++) figure_render(&rep->figures[i]);
}

void report_free_figures(struct report *rep)
{
    for (int i = 0; i < rep->figure_count; i++) {
        bytes_free(&rep->figures[i].svg);
        bytes_free(&rep->figures[i].png);
    }
    dm_free(rep->figures);
    rep->figures = NULL;
    rep->figure_count = 0;
    rep->figure_capacity = 0;
}
