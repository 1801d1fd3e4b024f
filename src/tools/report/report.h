/* The report and trace tools' private header: what `dynmo report` loads from
 * a run log (struct report_run), the traced instructions that both `dynmo
 * report` (the timeline figure) and `dynmo trace` (the Chrome trace) read
 * (struct trace), the figures as cairo drawings rendered to SVG and PNG,
 * and the page that holds them.
 *
 * Split by job: report_load.c reads a run log through the ckpt module's
 * public readers and derives the numbers the page states; report_draw.c is
 * the chart kit over cairo (axes, lines, heat maps, boxes) and rendering;
 * report_figures.c and report_timeline.c draw each figure; report_html.c
 * writes the page; report.c is the command (arguments, the output
 * directory written beside DIR and renamed into place); trace.c is `dynmo
 * trace`. None of these writes a run log or calls MPI. */
#ifndef DYNMO_TOOLS_REPORT_H
#define DYNMO_TOOLS_REPORT_H

#include <stddef.h>
#include <cairo.h>
#include "dynmo/ckpt.h"

/* ---- growing byte buffers (report_html.c) ------------------------------ */

struct bytes {
    char *data;         /* dm_alloc'd, always NUL-terminated; NULL when empty */
    size_t size;        /* bytes used, the NUL excluded */
    size_t capacity;
};
void bytes_append(struct bytes *b, const void *data, size_t size);
void bytes_puts(struct bytes *b, const char *text);
__attribute__((format(printf, 2, 3))) void bytes_printf(struct bytes *b, const char *fmt, ...);
/* Appends text with &, <, >, " escaped for HTML. */
void bytes_html(struct bytes *b, const char *text);   /* escaped; invalid UTF-8 and control bytes become U+FFFD */
void bytes_base64(struct bytes *b, const void *data, size_t size);
void bytes_free(struct bytes *b);

/* ---- traced instructions (report_load.c) ------------------------------- */

/* One row of /trace/events (docs/pipeline.md, "Tracing steps"). */
struct trace_event {
    int step;           /* optimizer step, from 1 */
    int rank, stage;
    int op;             /* enum schedule_op */
    int micro_batch;    /* -1 for the step's end (ops 6 and 7) */
    double start_ms;    /* after rank 0's start of the step */
    double wall_ms, cpu_ms;
};

struct trace {
    struct trace_event *events; /* (count) in the file's order: by step */
    long count;
    int *steps;         /* (step_count) the traced steps, ascending */
    long *first;        /* (step_count + 1) events of steps[k]: [first[k], first[k + 1]) */
    int *ranks;         /* (step_count) ranks of the world that ran steps[k] */
    int step_count;
    int max_ranks;      /* the most ranks of any traced step */
};

/* Reads /trace/events of an open run log into t (free with trace_free),
 * every row checked against the file's own shape: finite values, steps
 * whole numbers from 1 to the steps the log holds, in order (the writer
 * appends them step by step); each step's rank numbers exactly 0..R-1
 * with R its world's ranks (/steps/ranks, else its layout's stages times
 * parallel.dp, else the largest rank + 1); stages below the step's stage
 * count; ops 0..8; micro-batches -1 for the step's end (ops 6 and 7), else
 * below train.micro_batches; durations >= 0. Returns 1 when the file has
 * no such dataset (t left empty), 0 when it was read, or -1 with a message
 * naming the file, the row and the problem in err. */
int trace_load(struct runlog_file *f, struct trace *t, char *err, size_t errsize);
void trace_free(struct trace *t);
/* Whether step is one of t's traced steps. */
int trace_has_step(const struct trace *t, int step);
/* The short name of an op as the figures and the Chrome trace show it
 * ("forward", "receive activation", ...), and its kind for colouring:
 * TRACE_KIND_*. */
const char *trace_op_label(int op);
enum { TRACE_KIND_FORWARD, TRACE_KIND_BACKWARD, TRACE_KIND_UPDATE, TRACE_KIND_SEND,
       TRACE_KIND_WAIT, TRACE_KIND_COUNT };
int trace_op_kind(int op);
const char *trace_kind_label(int kind);

/* ---- a run, loaded (report_load.c) ------------------------------------- */

struct series {
    float *values;      /* (count) dm_alloc'd; NULL when the dataset is absent */
    long count;
};

struct matrix {
    float *values;      /* (rows, cols) row-major; NULL when absent */
    long rows;
    int cols;
};

/* A layout change: the layout that held from `step` on differs from the
 * one of the step before. */
struct layout_change {
    int step;
    int before, after;  /* rows of layout (step - 2 and step - 1 in the file) */
};

/* The numbers the page states for a run, over steps [from, to]. */
struct run_stats {
    long from, to;      /* 1-based, inclusive; to < from: no such steps */
    double mean_step_ms, throughput, bubble, imbalance, peak_mb; /* NAN if absent */
    double first_loss, last_loss, last_val_loss;
};

/* One scheme signal per block and step beside the cost heat map: each
 * declared figure (dyn_signal.figure_label) whose dataset the log has, in
 * the schemes' table order. */
struct block_signal {
    const char *label;  /* "active tokens", ... */
    const char *unit;
    struct matrix values;
};
#define REPORT_MAX_SIGNALS 4

struct report_run {
    const char *path;
    char name[128];     /* the run directory's name, or the file's */
    int simulated;      /* kind "simulation": dynmo simulate's output */
    char *config, *version, *created; /* root attributes; NULL if absent */
    struct dm_config cfg; /* the config attribute parsed (runlog_file_config) */
    int have_config;      /* the log has one */
    char dyn_kind[32], method[32], schedule[32];
    int layers, stages, micro_batches; /* from the datasets' widths and config */
    int units_per_block; /* balance.units: 1 (block), or 2 (sublayer: the layouts
                            count a block's attention and MLP apart) */
    long steps;         /* rows of the longest /steps/ series */
    struct series loss, step_ms, tokens_per_s, bubble, imbalance, peak_mb;
    struct series eval_step, eval_loss;
    struct matrix fwd, bwd, layout, decisions;
    struct block_signal signals[REPORT_MAX_SIGNALS];
    int signal_count;
    struct layout_change *changes;
    int change_count;
    struct trace trace;
    int timeline_steps[2];  /* the steps the timeline draws; 0: none */
    int timeline_count;
    struct run_stats stats;
};

/* 1 when path is a simulation (root attribute kind "simulation"), 0 when
 * it is a run log ("runlog"); anything else (missing, not HDF5, damaged, a
 * checkpoint) is a user error of `command`. */
int report_file_kind(const char *command, const char *path);
/* Loads the run log (or simulation file) at path, every dataset checked
 * against the file's shape and configuration (runlog_open_read,
 * runlog_file_config, runlog_file_layouts, trace_load; the per-block
 * datasets' columns are model.layers, or a scheme's signal's width, a
 * decision's step is one of the log's). Returns 0, or -1
 * with one message naming the file and the problem in err (run left
 * empty). from_step: the first step of the stated means (steps before it
 * are warm-up). */
int report_run_try_load(struct report_run *run, const char *path, long from_step, char *err,
                        size_t errsize);
/* report_run_try_load; a problem is a user error (exit 2). */
void report_run_load(struct report_run *run, const char *path, long from_step);
void report_run_free(struct report_run *run);
/* A config value of the run's "config" attribute, as written ("" when
 * absent): config_value_text on the parsed config. */
void report_config_value(const struct report_run *run, const char *key, char *out,
                         size_t size);
/* Mean step time of steps [from, to] (1-based; NaN rows left out), or NAN. */
double report_mean_step_ms(const struct report_run *run, long from, long to);
/* Picks the timeline's steps: `wanted` (count 0..2) when given, which must
 * be traced (a user error otherwise); else the last traced step before the
 * first layout change among the traced steps and the first after it, or
 * the last traced step. None when the run has no trace. */
void report_choose_timeline(struct report_run *run, const int *wanted, int count);

/* ---- chart kit (report_draw.c) ----------------------------------------- */

struct rgb { double r, g, b; };
struct rgb palette_color(int i);       /* the run and stage colours */
struct rgb kind_color(int kind);       /* TRACE_KIND_* */
struct rgb colormap(double t);         /* t in [0, 1], light to dark */

/* A panel: the data range [x_min, x_max] x [y_min, y_max] drawn into the
 * device rectangle (left, top, width, height). y_down: y_min at the top
 * (block and rank axes). */
struct chart {
    double left, top, width, height;
    double x_min, x_max, y_min, y_max;
    int y_down;
};
double chart_x(const struct chart *c, double x);
double chart_y(const struct chart *c, double y);

#define FONT_FAMILY "DejaVu Sans"
/* Text at (x, y) aligned by ax, ay in [0, 1] (0: left/top, 0.5: centre),
 * rotated by angle radians about (x, y). */
void draw_text(cairo_t *cr, double x, double y, const char *text, double size,
               double ax, double ay, double angle);
void draw_title(cairo_t *cr, double width, const char *title);
/* Frame, grid and ticks: TICKS_INTEGER puts them on whole numbers only
 * (steps, blocks), TICKS_NONE leaves the axis bare (rank rows label
 * themselves). */
enum { TICKS_NONE, TICKS_REAL, TICKS_INTEGER };
void chart_axes(cairo_t *cr, const struct chart *c, const char *x_label,
                const char *y_label, int x_ticks, int y_ticks);
/* The frame alone, to draw again over data that covers it. */
void chart_frame(cairo_t *cr, const struct chart *c);
/* The series ys[i] at x = x0 + i, for i in [0, n); NaN breaks the line.
 * More than 1,000 points are drawn as the means of 1,000 equal bins. */
void chart_line(cairo_t *cr, const struct chart *c, const float *ys, long n, double x0,
                struct rgb color, double line_width, int dashed);
void chart_points(cairo_t *cr, const struct chart *c, const float *xs, const float *ys,
                  long n, struct rgb color);
void chart_vline(cairo_t *cr, const struct chart *c, double x, struct rgb color,
                 int dashed);
void draw_legend(cairo_t *cr, double x, double y, const char *const *labels,
                 const struct rgb *colors, int n);
/* Cell (i, j) of values (rows, cols) at x = i + 1 (a step), y = j (a
 * block), coloured by (v - lo) / (hi - lo) in one of 64 shades; NaN cells
 * are left blank. More than 400 rows are drawn as the means of 400 equal
 * bins. */
void chart_heatmap(cairo_t *cr, const struct chart *c, const float *values, long rows,
                   int cols, double lo, double hi);
/* A vertical colour bar for [lo, hi]; clipped: values above hi exist. */
void draw_colorbar(cairo_t *cr, double left, double top, double height, double lo,
                   double hi, const char *label, int clipped);
/* The 0th and 99th percentile of the finite values (lo = hi when all are
 * equal; 0, 1 when none is finite). */
void value_range(const float *values, long n, double *lo, double *hi, int *clipped);

/* ---- figures (report_figures.c, report_timeline.c) --------------------- */

struct report;
struct figure;
typedef void (*figure_draw_fn)(cairo_t *cr, const struct figure *f);

struct figure {
    char name[64];      /* file stem: NAME.svg and NAME.png */
    char caption[512];  /* what it shows, for the page */
    char alt[256];
    int width, height;  /* CSS pixels (PNG pixels) */
    figure_draw_fn draw;
    const struct report *report;
    int run;            /* the run it draws, or -1 for all */
    struct bytes svg, png;
};

struct report {
    struct report_run *runs;
    int run_count;
    long from_step;
    struct figure *figures;
    int figure_count;
    long figure_capacity;
};

/* Adds every figure the runs support (loss; throughput and bubble; and per
 * run the layout, the block costs with the scheme's signal, the timeline
 * of traced steps) and renders each to SVG and PNG in memory. */
void report_make_figures(struct report *rep);
struct figure *report_add_figure(struct report *rep, const char *name, int run,
                                 int width, int height, figure_draw_fn draw);
void draw_timeline(cairo_t *cr, const struct figure *f);
int timeline_height(const struct report_run *run);
/* Renders f to f->svg and f->png; cairo failures are internal errors. */
void figure_render(struct figure *f);
void report_free_figures(struct report *rep);

/* ---- the page (report_html.c) ------------------------------------------ */

/* Writes index.html: the runs' table, the speedups, every figure inline
 * (SVG as a data URI, linked to its SVG and PNG files), the layout
 * changes, the balancer's decisions and each run's configuration. */
void report_write_html(const struct report *rep, struct bytes *out);
/* The speedup sentence of run i > 0 against run 0 (the page's and the
 * demo's wording), or "" when either lacks step times. */
void report_speedup_text(const struct report *rep, int i, char *out, size_t size);

#endif
