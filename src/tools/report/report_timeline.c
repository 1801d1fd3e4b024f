/* The pipeline timeline of `dynmo report`: for each step the report chose
 * (report_choose_timeline: one traced step, or the steps before and after
 * a layout change), one row per rank with a box per instruction of
 * /trace/events at its start and wall time, coloured by kind (forward,
 * backward, update, send, wait). The solid part of a box is its CPU time;
 * the pale rest is wall time spent waiting inside it (a collective, or a
 * processor shared with other ranks). Where a rank has no box it was idle:
 * the bubble. Both panels share one time axis so that they compare.
 *
 * It only draws: the events were read and checked by report_load.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "tools/report/report.h"

#define ROW_HEIGHT 26
#define PANEL_HEAD 30
#define PANEL_FOOT 44
#define TOP 66
#define LEFT 72
#define RIGHT 24

int timeline_height(const struct report_run *run)
{
    int ranks = run->trace.max_ranks > 0 ? run->trace.max_ranks : 1;
    return TOP + run->timeline_count * (PANEL_HEAD + ranks * ROW_HEIGHT + PANEL_FOOT);
}

/* The time span of the chosen steps' events, across ranks. */
static void time_span(const struct report_run *run, double *lo, double *hi)
{
    *lo = 0;
    *hi = 1e-3;
    for (long i = 0; i < run->trace.count; i++) {
        const struct trace_event *e = &run->trace.events[i];
        for (int p = 0; p < run->timeline_count; p++)
            if (e->step == run->timeline_steps[p]) {
                *lo = fmin(*lo, e->start_ms);
                *hi = fmax(*hi, e->start_ms + e->wall_ms);
            }
    }
}

static void draw_box(cairo_t *cr, const struct chart *c, const struct trace_event *e)
{
    int kind = trace_op_kind(e->op);
    struct rgb color = kind_color(kind);
    double x0 = chart_x(c, e->start_ms);
    double x_wall = fmax(chart_x(c, e->start_ms + e->wall_ms) - x0, 0.6);
    double cpu = kind == TRACE_KIND_WAIT ? e->wall_ms : fmin(e->cpu_ms, e->wall_ms);
    double x_cpu = fmax(chart_x(c, e->start_ms + cpu) - x0, 0.6);
    double y0 = chart_y(c, e->rank + 0.12), y1 = chart_y(c, e->rank + 0.88);
    cairo_set_source_rgba(cr, color.r, color.g, color.b, 0.35);
    cairo_rectangle(cr, x0, y0, x_wall, y1 - y0);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, color.r, color.g, color.b);
    cairo_rectangle(cr, x0, y0, x_cpu, y1 - y0);
    cairo_fill(cr);
}

/* The events of a traced step: [*first, *end). */
static void step_events(const struct trace *t, int step, long *first, long *end)
{
    *first = *end = 0;
    for (int k = 0; k < t->step_count; k++)
        if (t->steps[k] == step) {
            *first = t->first[k];
            *end = t->first[k + 1];
        }
}

/* The stage a rank ran at a step (from its events), or -1. */
static int stage_of_rank(const struct report_run *run, int step, int rank)
{
    long first, end;
    step_events(&run->trace, step, &first, &end);
    for (long i = first; i < end; i++)
        if (run->trace.events[i].rank == rank) return run->trace.events[i].stage;
    return -1;
}

static void panel_title(cairo_t *cr, const struct report_run *run, const struct chart *c,
                        int p)
{
    int step = run->timeline_steps[p];
    char text[512], layout[256] = "";
    size_t used = 0;
    if (step - 1 < run->layout.rows)
        for (int s = 0; s < run->layout.cols && used < sizeof layout; s++) {
            float v = run->layout.values[(long)(step - 1) * run->layout.cols + s];
            if (v > 0)
                used += (size_t)snprintf(layout + used, sizeof layout - used, "%s%g",
                                         used ? "," : "", (double)v);
        }
    int n = snprintf(text, sizeof text, "step %d", step);
    if (run->timeline_count == 2)
        n += snprintf(text + n, sizeof text - (size_t)n, p == 0 ? " (before the layout change)"
                                                               : " (after the layout change)");
    if (layout[0]) n += snprintf(text + n, sizeof text - (size_t)n, ", layout %s", layout);
    if (step - 1 < run->step_ms.count && isfinite(run->step_ms.values[step - 1]))
        n += snprintf(text + n, sizeof text - (size_t)n, ": %.1f ms",
                      (double)run->step_ms.values[step - 1]);
    if (step - 1 < run->bubble.count && isfinite(run->bubble.values[step - 1]))
        snprintf(text + n, sizeof text - (size_t)n, ", bubble %.1f%%",
                 100.0 * run->bubble.values[step - 1]);
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    draw_text(cr, c->left, c->top - 6, text, 12, 0, 1, 0);
}

void draw_timeline(cairo_t *cr, const struct figure *f)
{
    const struct report_run *run = &f->report->runs[f->run];
    char title[256];
    snprintf(title, sizeof title, "%s: the pipeline, one row per rank (empty: idle, the "
             "bubble)", run->name);
    draw_title(cr, f->width, title);
    const char *labels[TRACE_KIND_COUNT + 1];
    struct rgb colors[TRACE_KIND_COUNT + 1];
    for (int k = 0; k < TRACE_KIND_COUNT; k++) {
        labels[k] = trace_kind_label(k);
        colors[k] = kind_color(k);
    }
    labels[TRACE_KIND_COUNT] = "pale: waiting inside (wall beyond CPU time)";
    colors[TRACE_KIND_COUNT] = (struct rgb){0.85, 0.85, 0.92};
    draw_legend(cr, LEFT, 40, labels, colors, TRACE_KIND_COUNT + 1);

    int ranks = run->trace.max_ranks > 0 ? run->trace.max_ranks : 1;
    double lo, hi;
    time_span(run, &lo, &hi);
    struct chart c = {LEFT, TOP + PANEL_HEAD, f->width - LEFT - RIGHT, ranks * ROW_HEIGHT,
                      lo, hi + 0.02 * (hi - lo), 0, ranks, 1};
    for (int p = 0; p < run->timeline_count; p++) {
        chart_axes(cr, &c, "ms after rank 0 began the step", NULL, TICKS_REAL, TICKS_NONE);
        panel_title(cr, run, &c, p);
        for (int r = 0; r < ranks; r++) {
            char label[32];
            snprintf(label, sizeof label, "rank %d", r);
            cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
            draw_text(cr, c.left - 6, chart_y(&c, r + 0.5), label, 11, 1, 0.75, 0);
            int stage = stage_of_rank(run, run->timeline_steps[p], r);
            snprintf(label, sizeof label, "stage %d", stage);
            if (stage >= 0) draw_text(cr, c.left - 6, chart_y(&c, r + 0.5), label, 9, 1, -0.1, 0);
        }
        long first, end;
        step_events(&run->trace, run->timeline_steps[p], &first, &end);
        for (long i = first; i < end; i++) draw_box(cr, &c, &run->trace.events[i]);
        c.top += PANEL_HEAD + ranks * ROW_HEIGHT + PANEL_FOOT;
    }
}
