/* The chart kit of `dynmo report`: colours, panels mapping data to the
 * page (struct chart), axes with round-number ticks, lines, points, heat
 * maps, colour bars and legends, all drawn with cairo, and the rendering
 * of one figure to SVG and PNG in memory. The same drawing calls make both
 * files, so they show the same thing.
 *
 * It knows nothing of run logs or of which figures exist (report_figures.c
 * and report_timeline.c decide that), and it writes no files. Text is
 * cairo's own ("toy") text in DejaVu Sans: the labels are short and Latin. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cairo-svg.h>
#include "dynmo/core.h"
#include "tools/report/report.h"

#define MAX_LINE_POINTS 1000
#define MAX_HEATMAP_COLUMNS 400
#define HEATMAP_SHADES 64
#define MAX_TICKS 32

static struct rgb hex(unsigned v)
{
    return (struct rgb){((v >> 16) & 255) / 255.0, ((v >> 8) & 255) / 255.0, (v & 255) / 255.0};
}

struct rgb palette_color(int i)
{
    static const unsigned colors[] = {0x2f6db5, 0xe07b1f, 0x2e9948, 0xc9303e,
                                      0x7e57c2, 0x8c6239, 0xd16ba5, 0x159a9c};
    int n = (int)(sizeof colors / sizeof colors[0]);
    return hex(colors[((i % n) + n) % n]);
}

struct rgb kind_color(int kind)
{
    static const unsigned colors[TRACE_KIND_COUNT] = {0x3b78c9, 0xec8a2c, 0x3fa35a,
                                                      0x9467bd, 0xc4c4c4};
    return hex(colors[kind >= 0 && kind < TRACE_KIND_COUNT ? kind : TRACE_KIND_WAIT]);
}

/* Light to dark through yellow, orange and red: a cheap cell is pale. */
struct rgb colormap(double t)
{
    static const unsigned anchors[] = {0xfff7d6, 0xfdc663, 0xf2763a, 0xc8283a, 0x6e0d4a,
                                       0x2a0832};
    int n = (int)(sizeof anchors / sizeof anchors[0]) - 1;
    if (!(t > 0)) t = 0;
    if (t > 1) t = 1;
    int i = (int)(t * n);
    if (i >= n) i = n - 1;
    double u = t * n - i;
    struct rgb a = hex(anchors[i]), b = hex(anchors[i + 1]);
    return (struct rgb){a.r + u * (b.r - a.r), a.g + u * (b.g - a.g), a.b + u * (b.b - a.b)};
}

static void set_color(cairo_t *cr, struct rgb c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

double chart_x(const struct chart *c, double x)
{
    double span = c->x_max - c->x_min;
    return c->left + (span > 0 ? (x - c->x_min) / span : 0.5) * c->width;
}

double chart_y(const struct chart *c, double y)
{
    double span = c->y_max - c->y_min;
    double u = span > 0 ? (y - c->y_min) / span : 0.5;
    return c->y_down ? c->top + u * c->height : c->top + (1 - u) * c->height;
}

void draw_text(cairo_t *cr, double x, double y, const char *text, double size, double ax,
               double ay, double angle)
{
    cairo_save(cr);
    cairo_select_font_face(cr, FONT_FAMILY, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t te;
    cairo_font_extents_t fe;
    cairo_text_extents(cr, text, &te);
    cairo_font_extents(cr, &fe);
    cairo_translate(cr, x, y);
    cairo_rotate(cr, angle);
    cairo_move_to(cr, -ax * te.x_advance, -ay * (fe.ascent + fe.descent) + fe.ascent);
    cairo_show_text(cr, text);
    cairo_restore(cr);
}

void draw_title(cairo_t *cr, double width, const char *title)
{
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    draw_text(cr, width / 2, 8, title, 15, 0.5, 0, 0);
}

/* Round-number ticks in [lo, hi]: steps of 1, 2 or 5 times a power of ten,
 * about `target` of them; whole numbers only when integer. */
static int nice_ticks(double lo, double hi, int target, int integer, double *ticks,
                      double *step_out)
{
    double raw = (hi - lo) / (target > 1 ? target : 1);
    if (!(raw > 0)) raw = 1;
    double power = pow(10, floor(log10(raw)));
    double step = raw / power < 1.5 ? power : raw / power < 3.5 ? 2 * power
                : raw / power < 7.5 ? 5 * power : 10 * power;
    if (integer && step < 1) step = 1;
    int n = 0;
    for (double t = ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9 && n < MAX_TICKS;
         t += step)
        ticks[n++] = fabs(t) < step * 1e-9 ? 0 : t;
    *step_out = step;
    return n;
}

static void format_tick(char *out, size_t size, double value, double step)
{
    if (step >= 1000 && fabs(value) >= 1000) {   /* 60000 tokens/s reads as 60k */
        snprintf(out, size, "%gk", value / 1000);
        return;
    }
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (decimals > 6) decimals = 6;
    snprintf(out, size, "%.*f", decimals, value);
}

void chart_frame(cairo_t *cr, const struct chart *c)
{
    cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, round(c->left) + 0.5, round(c->top) + 0.5, round(c->width),
                    round(c->height));
    cairo_stroke(cr);
}

void chart_axes(cairo_t *cr, const struct chart *c, const char *x_label, const char *y_label,
                int x_ticks, int y_ticks)
{
    double ticks[MAX_TICKS], step;
    char label[32];
    cairo_set_line_width(cr, 1);
    int n = x_ticks == TICKS_NONE ? 0 : nice_ticks(c->x_min, c->x_max, 8,
                                                   x_ticks == TICKS_INTEGER, ticks, &step);
    for (int i = 0; i < n; i++) {
        double x = round(chart_x(c, ticks[i])) + 0.5;
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, x, c->top);
        cairo_line_to(cr, x, c->top + c->height);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
        format_tick(label, sizeof label, ticks[i], step);
        draw_text(cr, x, c->top + c->height + 4, label, 11, 0.5, 0, 0);
    }
    n = y_ticks == TICKS_NONE ? 0 : nice_ticks(fmin(c->y_min, c->y_max),
                                               fmax(c->y_min, c->y_max), 5,
                                               y_ticks == TICKS_INTEGER, ticks, &step);
    for (int i = 0; i < n; i++) {
        double y = round(chart_y(c, ticks[i])) + 0.5;
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, c->left, y);
        cairo_line_to(cr, c->left + c->width, y);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
        format_tick(label, sizeof label, ticks[i], step);
        draw_text(cr, c->left - 5, y, label, 11, 1, 0.5, 0);
    }
    chart_frame(cr, c);
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    if (x_label) draw_text(cr, c->left + c->width / 2, c->top + c->height + 20, x_label, 12,
                           0.5, 0, 0);
    if (y_label) draw_text(cr, c->left - 58, c->top + c->height / 2, y_label, 12, 0.5, 0,
                           -M_PI / 2);
}

static void clip_to(cairo_t *cr, const struct chart *c)
{
    cairo_save(cr);
    cairo_rectangle(cr, c->left, c->top, c->width, c->height);
    cairo_clip(cr);
}

void chart_line(cairo_t *cr, const struct chart *c, const float *ys, long n, double x0,
                struct rgb color, double line_width, int dashed)
{
    long bin = n > MAX_LINE_POINTS ? (n + MAX_LINE_POINTS - 1) / MAX_LINE_POINTS : 1;
    clip_to(cr, c);
    set_color(cr, color);
    cairo_set_line_width(cr, line_width);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    if (dashed) {
        double dash[] = {6, 4};
        cairo_set_dash(cr, dash, 2, 0);
    }
    int drawing = 0;
    for (long i = 0; i < n; i += bin) {
        double sum = 0;
        long count = 0;
        for (long k = i; k < i + bin && k < n; k++)
            if (isfinite(ys[k])) {
                sum += ys[k];
                count++;
            }
        if (!count) {
            drawing = 0;
            continue;
        }
        double x = chart_x(c, x0 + i + (fmin(bin, n - i) - 1) / 2.0);
        double y = chart_y(c, sum / (double)count);
        if (drawing) cairo_line_to(cr, x, y);
        else cairo_move_to(cr, x, y);
        drawing = 1;
    }
    cairo_stroke(cr);
    cairo_restore(cr);
}

void chart_points(cairo_t *cr, const struct chart *c, const float *xs, const float *ys,
                  long n, struct rgb color)
{
    clip_to(cr, c);
    for (long i = 0; i < n; i++) {
        if (!isfinite(xs[i]) || !isfinite(ys[i])) continue;
        cairo_arc(cr, chart_x(c, xs[i]), chart_y(c, ys[i]), 3.5, 0, 2 * M_PI);
        cairo_set_source_rgb(cr, 1, 1, 1);
        cairo_fill_preserve(cr);
        set_color(cr, color);
        cairo_set_line_width(cr, 1.5);
        cairo_stroke(cr);
    }
    cairo_restore(cr);
}

void chart_vline(cairo_t *cr, const struct chart *c, double x, struct rgb color, int dashed)
{
    clip_to(cr, c);
    set_color(cr, color);
    cairo_set_line_width(cr, 1.5);
    if (dashed) {
        double dash[] = {4, 3};
        cairo_set_dash(cr, dash, 2, 0);
    }
    cairo_move_to(cr, chart_x(c, x), c->top);
    cairo_line_to(cr, chart_x(c, x), c->top + c->height);
    cairo_stroke(cr);
    cairo_restore(cr);
}

void draw_legend(cairo_t *cr, double x, double y, const char *const *labels,
                 const struct rgb *colors, int n)
{
    cairo_save(cr);
    cairo_select_font_face(cr, FONT_FAMILY, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 11);
    for (int i = 0; i < n; i++) {
        cairo_text_extents_t te;
        cairo_text_extents(cr, labels[i], &te);
        set_color(cr, colors[i]);
        cairo_rectangle(cr, x, y - 5, 14, 10);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
        draw_text(cr, x + 18, y, labels[i], 11, 0, 0.5, 0);
        x += 18 + te.x_advance + 16;
    }
    cairo_restore(cr);
}

/* The shade (0 .. HEATMAP_SHADES - 1) of each cell of the binned grid
 * (bins x cols), -1 where no value is finite. */
static int *heatmap_shades(const float *values, long rows, int cols, long bin, long bins,
                           double lo, double hi)
{
    double span = hi > lo ? hi - lo : 1;
    int *shade = dm_alloc((size_t)(bins * cols) * sizeof *shade);
    for (long b = 0; b < bins; b++)
        for (int j = 0; j < cols; j++) {
            double sum = 0;
            long count = 0;
            for (long k = b * bin; k < (b + 1) * bin && k < rows; k++)
                if (isfinite(values[k * cols + j])) {
                    sum += values[k * cols + j];
                    count++;
                }
            double t = count ? (sum / (double)count - lo) / span : 0;
            t = t < 0 ? 0 : t > 1 ? 1 : t;
            shade[b * cols + j] = count ? (int)lround(t * (HEATMAP_SHADES - 1)) : -1;
        }
    return shade;
}

void chart_heatmap(cairo_t *cr, const struct chart *c, const float *values, long rows,
                   int cols, double lo, double hi)
{
    long bin = rows > MAX_HEATMAP_COLUMNS ? (rows + MAX_HEATMAP_COLUMNS - 1) /
                                            MAX_HEATMAP_COLUMNS : 1;
    long bins = (rows + bin - 1) / bin;
    int *shade = heatmap_shades(values, rows, cols, bin, bins, lo, hi);
    clip_to(cr, c);
    /* One path per shade, one rectangle per run of equal cells along a
     * block's row: an SVG of a few elements rather than one per cell.
     * Cells meet on whole pixels, so no seam shows between them. */
    for (int level = 0; level < HEATMAP_SHADES; level++) {
        int any = 0;
        for (int j = 0; j < cols; j++) {
            double y0 = round(chart_y(c, j - 0.5)), y1 = round(chart_y(c, j + 0.5));
            for (long b = 0; b < bins; b++) {
                if (shade[b * cols + j] != level) continue;
                long end = b + 1;
                while (end < bins && shade[end * cols + j] == level) end++;
                double x0 = round(chart_x(c, b * bin + 0.5));
                double x1 = round(chart_x(c, (end < bins ? end * bin : rows) + 0.5));
                cairo_rectangle(cr, x0, fmin(y0, y1), x1 - x0, fabs(y1 - y0));
                any = 1;
                b = end - 1;
            }
        }
        if (!any) continue;
        set_color(cr, colormap(level / (double)(HEATMAP_SHADES - 1)));
        cairo_fill(cr);
    }
    cairo_restore(cr);
    dm_free(shade);
}

void draw_colorbar(cairo_t *cr, double left, double top, double height, double lo, double hi,
                   const char *label, int clipped)
{
    cairo_pattern_t *gradient = cairo_pattern_create_linear(0, top + height, 0, top);
    for (int i = 0; i <= 10; i++) {
        struct rgb c = colormap(i / 10.0);
        cairo_pattern_add_color_stop_rgb(gradient, i / 10.0, c.r, c.g, c.b);
    }
    cairo_rectangle(cr, left, top, 14, height);
    cairo_set_source(cr, gradient);
    cairo_fill(cr);
    cairo_pattern_destroy(gradient);
    char text[48];
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    snprintf(text, sizeof text, "%s%.3g", clipped ? ">= " : "", hi);
    draw_text(cr, left + 18, top, text, 10, 0, 0.3, 0);
    snprintf(text, sizeof text, "%.3g", lo);
    draw_text(cr, left + 18, top + height, text, 10, 0, 0.7, 0);
    draw_text(cr, left + 30, top + height / 2, label, 11, 0.5, 0, M_PI / 2);
}

static int compare_floats(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void value_range(const float *values, long n, double *lo, double *hi, int *clipped)
{
    float *finite = dm_alloc((size_t)(n > 0 ? n : 1) * sizeof *finite);
    long m = 0;
    for (long i = 0; i < n; i++)
        if (isfinite(values[i])) finite[m++] = values[i];
    *clipped = 0;
    if (m == 0) {
        *lo = 0;
        *hi = 1;
    } else {
        qsort(finite, (size_t)m, sizeof *finite, compare_floats);
        *lo = finite[0];
        *hi = finite[(long)floor(0.99 * (double)(m - 1))];
        *clipped = *hi < finite[m - 1];
        if (!(*hi > *lo)) {
            *hi = finite[m - 1];
            *clipped = 0;
        }
    }
    dm_free(finite);
}

/* ---- rendering ------------------------------------------------------------ */

static cairo_status_t append_stream(void *closure, const unsigned char *data,
                                    unsigned int length)
{
    bytes_append(closure, data, length);
    return CAIRO_STATUS_SUCCESS;
}

static void draw_on(cairo_surface_t *surface, const struct figure *f)
{
    cairo_t *cr = cairo_create(surface);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    f->draw(cr, f);
    if (cairo_status(cr) != CAIRO_STATUS_SUCCESS)
        DM_FATAL("cairo: drawing figure %s: %s", f->name,
                 cairo_status_to_string(cairo_status(cr)));
    cairo_destroy(cr);
}

void figure_render(struct figure *f)
{
    cairo_surface_t *svg = cairo_svg_surface_create_for_stream(append_stream, &f->svg,
                                                               f->width, f->height);
    cairo_svg_surface_set_document_unit(svg, CAIRO_SVG_UNIT_PX);
    draw_on(svg, f);
    cairo_surface_finish(svg);
    if (cairo_surface_status(svg) != CAIRO_STATUS_SUCCESS)
        DM_FATAL("cairo: SVG of figure %s: %s", f->name,
                 cairo_status_to_string(cairo_surface_status(svg)));
    cairo_surface_destroy(svg);

    cairo_surface_t *image = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, f->width,
                                                        f->height);
    draw_on(image, f);
    cairo_status_t status = cairo_surface_write_to_png_stream(image, append_stream, &f->png);
    if (status != CAIRO_STATUS_SUCCESS)
        DM_FATAL("cairo: PNG of figure %s: %s", f->name, cairo_status_to_string(status));
    cairo_surface_destroy(image);
}
