/* The page of `dynmo report`: index.html, one self-contained file (no
 * script, no network: every figure is inline as an SVG data URI and links
 * to its SVG and PNG files beside the page) with the runs' table, the
 * speedups, the figures, the layout changes, the balancer's decisions
 * (predicted against measured step time) and each run's configuration;
 * and the growing byte buffers the report builds its files in.
 *
 * Table cells and statements carry ids (r1-mean-step-ms, speedup-2, ...) so
 * that scripts and tests can read the numbers the page states. It states
 * only what report_load.c computed; it writes no files itself. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "dynmo/core.h"
#include "tools/report/report.h"

void bytes_append(struct bytes *b, const void *data, size_t size)
{
    if (b->size + size + 1 > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 4096;
        while (capacity < b->size + size + 1) capacity *= 2;
        char *grown = dm_alloc_uninit(capacity);
        if (b->size) memcpy(grown, b->data, b->size);
        dm_free(b->data);
        b->data = grown;
        b->capacity = capacity;
    }
    memcpy(b->data + b->size, data, size);
    b->size += size;
    b->data[b->size] = '\0';
}

void bytes_puts(struct bytes *b, const char *text)
{
    bytes_append(b, text, strlen(text));
}

void bytes_printf(struct bytes *b, const char *fmt, ...)
{
    char small[1024];
    DM_ASSERT(fmt != NULL);   /* also keeps -fsanitize=undefined's GCC from warning */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < (int)sizeof small) {
        bytes_append(b, small, (size_t)n);
        return;
    }
    char *large = dm_alloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(large, (size_t)n + 1, fmt, ap);
    va_end(ap);
    bytes_append(b, large, (size_t)n);
    dm_free(large);
}

/* The length of the well-formed UTF-8 sequence at p (1 to 4), or 0 for a
 * byte that starts none (a stray continuation, an overlong form, a
 * surrogate, a code point past U+10FFFF, a sequence cut short). */
static int utf8_length(const unsigned char *p)
{
    if (p[0] < 0x80) return 1;
    int n = p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 ? 2 : 0;
    if (n == 0 || p[0] > 0xF4) return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;   /* also stops at the NUL */
    if ((p[0] == 0xE0 && p[1] < 0xA0) || (p[0] == 0xED && p[1] >= 0xA0) ||
        (p[0] == 0xF0 && p[1] < 0x90) || (p[0] == 0xF4 && p[1] >= 0x90))
        return 0;
    return n;
}

void bytes_html(struct bytes *b, const char *text)
{
    const unsigned char *p = (const unsigned char *)(text ? text : "");
    while (*p) {
        int n = utf8_length(p);
        if (n == 0 || (*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7F) {
            bytes_puts(b, "\xEF\xBF\xBD");   /* U+FFFD: the page stays valid UTF-8 */
            p++;
            continue;
        }
        switch (*p) {
        case '&': bytes_puts(b, "&amp;"); break;
        case '<': bytes_puts(b, "&lt;"); break;
        case '>': bytes_puts(b, "&gt;"); break;
        case '"': bytes_puts(b, "&quot;"); break;
        default: bytes_append(b, p, (size_t)n);
        }
        p += n;
    }
}

void bytes_base64(struct bytes *b, const void *data, size_t size)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *in = data;
    char quad[4];
    for (size_t i = 0; i < size; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        if (i + 1 < size) v |= (unsigned)in[i + 1] << 8;
        if (i + 2 < size) v |= in[i + 2];
        quad[0] = alphabet[(v >> 18) & 63];
        quad[1] = alphabet[(v >> 12) & 63];
        quad[2] = i + 1 < size ? alphabet[(v >> 6) & 63] : '=';
        quad[3] = i + 2 < size ? alphabet[v & 63] : '=';
        bytes_append(b, quad, 4);
    }
}

void bytes_free(struct bytes *b)
{
    dm_free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- the page --------------------------------------------------------------- */

static const char style[] =
    "body{font-family:'DejaVu Sans',sans-serif;margin:24px auto;max-width:1000px;"
    "color:#222}\n"
    "table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #ccc;"
    "padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}\n"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
    "figure{margin:18px 0}figcaption{font-size:90%;color:#444}img{max-width:100%;"
    "height:auto;border:1px solid #eee}\n"
    ".speedup{font-size:110%;font-weight:bold}pre{background:#f7f7f7;padding:8px;"
    "font-size:85%}\n";

/* A number cell with an id, "-" when the value is missing. */
static void number_cell(struct bytes *out, int run, const char *id, double value,
                        const char *format)
{
    char text[64] = "-";
    if (isfinite(value)) snprintf(text, sizeof text, format, value);
    bytes_printf(out, "<td class=\"num\" id=\"r%d-%s\">%s</td>", run + 1, id, text);
}

static void text_cell(struct bytes *out, int run, const char *id, const char *text)
{
    bytes_printf(out, "<td id=\"r%d-%s\">", run + 1, id);
    bytes_html(out, text && text[0] ? text : "-");
    bytes_puts(out, "</td>");
}

static void describe_run(const struct report_run *run, const char *what, char *out,
                         size_t size)
{
    char a[64], b[64], c[64];
    out[0] = '\0';
    if (!strcmp(what, "model")) {
        report_config_value(run, "model.channels", a, sizeof a);
        report_config_value(run, "model.heads", b, sizeof b);
        snprintf(out, size, "%d blocks x %s channels, %s heads", run->layers, a[0] ? a : "?",
                 b[0] ? b : "?");
    } else if (!strcmp(what, "world")) {
        report_config_value(run, "parallel.pp", a, sizeof a);
        report_config_value(run, "parallel.dp", b, sizeof b);
        snprintf(out, size, "%s stages x %s replicas, %s, %d micro-batches", a[0] ? a : "?",
                 b[0] ? b : "?", run->schedule[0] ? run->schedule : "?", run->micro_batches);
    } else if (!strcmp(what, "balance")) {
        report_config_value(run, "balance.every", a, sizeof a);
        report_config_value(run, "balance.initial", c, sizeof c);
        if (!run->method[0] || !strcmp(run->method, "none"))
            snprintf(out, size, "none (static %s layout)", c[0] ? c : "");
        else
            snprintf(out, size, "%s every %s steps", run->method, a);
    }
}

/* "3, 7 and 12" of the layout-change steps, or "none". */
static void change_steps(const struct report_run *run, char *out, size_t size)
{
    size_t used = 0;
    snprintf(out, size, "none");
    for (int k = 0; k < run->change_count && used + 16 < size; k++)
        used += (size_t)snprintf(out + used, size - used, "%s%d",
                                 k == 0 ? "" : k + 1 == run->change_count ? " and " : ", ",
                                 run->changes[k].step);
}

static void runs_table_text_rows(struct bytes *out, const struct report *rep)
{
    static const char *const rows[][2] = {
        {"file", "file"}, {"kind", "kind"}, {"written by", "version"}, {"model", "model"},
        {"world", "world"}, {"dynamism", "dyn"}, {"balancer", "balance"},
        {"layout changes at steps", "layout-changes"}, {"traced steps", "traced"}};
    char text[512];
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        bytes_printf(out, "<tr><th>%s</th>", rows[k][0]);
        for (int i = 0; i < rep->run_count; i++) {
            const struct report_run *run = &rep->runs[i];
            const char *id = rows[k][1];
            text[0] = '\0';
            if (!strcmp(id, "file")) snprintf(text, sizeof text, "%s", run->path);
            else if (!strcmp(id, "kind"))
                snprintf(text, sizeof text, run->simulated ? "simulation (dynmo simulate)"
                                                           : "run log (dynmo train)");
            else if (!strcmp(id, "version"))
                snprintf(text, sizeof text, "dynmo %s, %s", run->version ? run->version : "?",
                         run->created ? run->created : "?");
            else if (!strcmp(id, "dyn")) snprintf(text, sizeof text, "%s", run->dyn_kind);
            else if (!strcmp(id, "layout-changes")) change_steps(run, text, sizeof text);
            else if (!strcmp(id, "traced") && run->trace.step_count)
                snprintf(text, sizeof text, "%d to %d", run->trace.steps[0],
                         run->trace.steps[run->trace.step_count - 1]);
            else describe_run(run, id, text, sizeof text);
            text_cell(out, i, id, text);
        }
        bytes_puts(out, "</tr>\n");
    }
}

static void runs_table(struct bytes *out, const struct report *rep)
{
    bytes_puts(out, "<h2>Runs</h2>\n<table class=\"runs\">\n<tr><th></th>");
    for (int i = 0; i < rep->run_count; i++) {
        bytes_printf(out, "<th id=\"r%d-name\">", i + 1);
        bytes_html(out, rep->runs[i].name);
        bytes_puts(out, "</th>");
    }
    bytes_puts(out, "</tr>\n");
    runs_table_text_rows(out, rep);
    bytes_puts(out, "<tr><th>steps</th>");
    for (int i = 0; i < rep->run_count; i++)
        number_cell(out, i, "steps", (double)rep->runs[i].steps, "%.0f");
    static const struct { const char *label, *id, *format; size_t offset; double scale; } rows[] = {
        {"loss, first step", "loss-first", "%.4f", offsetof(struct run_stats, first_loss), 1},
        {"loss, last step", "loss-last", "%.4f", offsetof(struct run_stats, last_loss), 1},
        {"validation loss, last", "val-loss", "%.4f", offsetof(struct run_stats, last_val_loss), 1},
        {"mean step time", "mean-step-ms", "%.2f ms", offsetof(struct run_stats, mean_step_ms), 1},
        {"throughput", "throughput", "%.0f tokens/s", offsetof(struct run_stats, throughput), 1},
        {"bubble ratio, mean", "bubble", "%.1f%%", offsetof(struct run_stats, bubble), 100},
        {"imbalance, mean", "imbalance", "%.3f", offsetof(struct run_stats, imbalance), 1},
        {"peak memory (rank 0)", "peak-mb", "%.0f MiB", offsetof(struct run_stats, peak_mb), 1},
    };
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        bytes_printf(out, "</tr>\n<tr><th>%s", rows[k].label);
        if (k >= 3 && k <= 6) bytes_puts(out, "<sup>*</sup>");
        bytes_puts(out, "</th>");
        for (int i = 0; i < rep->run_count; i++) {
            double v = *(const double *)((const char *)&rep->runs[i].stats + rows[k].offset);
            number_cell(out, i, rows[k].id, v * rows[k].scale, rows[k].format);
        }
    }
    bytes_puts(out, "</tr>\n</table>\n<p><sup>*</sup> over steps ");
    for (int i = 0; i < rep->run_count; i++) {
        bytes_printf(out, "%s<span id=\"r%d-range\">%ld to %ld</span> (", i ? ", " : "",
                     i + 1, rep->runs[i].stats.from, rep->runs[i].stats.to);
        bytes_html(out, rep->runs[i].name);
        bytes_puts(out, ")");
    }
    bytes_printf(out, ": the steps before step %ld are warm-up (--from).</p>\n", rep->from_step);
}

void report_speedup_text(const struct report *rep, int i, char *out, size_t size)
{
    const struct report_run *a = &rep->runs[0], *b = &rep->runs[i];
    long to = a->steps < b->steps ? a->steps : b->steps;
    long from = rep->from_step <= to ? rep->from_step : to;
    double ms_a = report_mean_step_ms(a, from, to), ms_b = report_mean_step_ms(b, from, to);
    out[0] = '\0';
    if (!(ms_a > 0) || !(ms_b > 0)) return;
    snprintf(out, size, "%s runs %.2fx as fast as %s: %.2f ms against %.2f ms a step over "
             "steps %ld to %ld.", a->name, ms_b / ms_a, b->name, ms_a, ms_b, from, to);
}

static void speedups(struct bytes *out, const struct report *rep)
{
    char text[768];
    for (int i = 1; i < rep->run_count; i++) {
        report_speedup_text(rep, i, text, sizeof text);
        if (!text[0]) continue;
        bytes_printf(out, "<p class=\"speedup\" id=\"speedup-%d\">", i + 1);
        bytes_html(out, text);
        bytes_puts(out, "</p>\n");
    }
}

static void figure_html(struct bytes *out, const struct figure *f)
{
    bytes_printf(out, "<figure id=\"fig-%s\"><img src=\"data:image/svg+xml;base64,", f->name);
    bytes_base64(out, f->svg.data, f->svg.size);
    bytes_printf(out, "\" width=\"%d\" height=\"%d\" alt=\"", f->width, f->height);
    bytes_html(out, f->alt);
    bytes_puts(out, "\">\n<figcaption>");
    bytes_html(out, f->caption);
    bytes_printf(out, " <a href=\"%s.svg\">SVG</a> <a href=\"%s.png\">PNG</a></figcaption>"
                 "</figure>\n", f->name, f->name);
}

static void layout_text(const struct report_run *run, int row, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int s = 0; s < run->layout.cols && used < size; s++) {
        float v = run->layout.values[(long)row * run->layout.cols + s];
        if (v > 0) used += (size_t)snprintf(out + used, size - used, "%s%g", used ? "," : "",
                                            (double)v);
    }
}

/* The decision row of step `step`, or NULL. */
static const float *decision_at(const struct report_run *run, int step)
{
    for (long d = 0; d < run->decisions.rows; d++)
        if ((int)run->decisions.values[d * 8] == step) return run->decisions.values + d * 8;
    return NULL;
}

static void changes_table(struct bytes *out, const struct report_run *run, int r)
{
    char before[256], after[256];
    bytes_printf(out, "<table class=\"changes\" id=\"r%d-changes\"><tr><th>from step</th>"
                 "<th>layout before</th><th>layout after</th><th>balancer decision</th></tr>\n",
                 r + 1);
    for (int k = 0; k < run->change_count; k++) {
        const struct layout_change *c = &run->changes[k];
        layout_text(run, c->before, before, sizeof before);
        layout_text(run, c->after, after, sizeof after);
        bytes_printf(out, "<tr class=\"layout-change\" data-step=\"%d\"><td class=\"num\">%d"
                     "</td><td>%s</td><td>%s</td><td>", c->step, c->step, before, after);
        const float *d = decision_at(run, c->step - 1);
        if (d && d[4] != 0)
            bytes_printf(out, "at step %d: predicted %.2f ms/step (from %.2f), measured "
                         "%.2f ms the step after", c->step - 1, (double)d[2], (double)d[1],
                         (double)d[6]);
        else
            bytes_printf(out, "%s", run->decisions.rows ? "none logged" : "-");
        bytes_puts(out, "</td></tr>\n");
    }
    bytes_puts(out, "</table>\n");
}

static void decisions_table(struct bytes *out, const struct report_run *run, int r)
{
    bytes_printf(out, "<table class=\"decisions\" id=\"r%d-decisions\"><tr><th>step</th>"
                 "<th>predicted, current layout (ms/step)</th><th>predicted, proposal</th>"
                 "<th>measured at the decision</th><th>applied</th><th>blocks moved</th>"
                 "<th>MB moved</th><th>measured the step after</th>"
                 "<th>measured against predicted</th></tr>\n", r + 1);
    for (long k = 0; k < run->decisions.rows; k++) {
        const float *d = run->decisions.values + k * 8;
        double predicted = d[4] != 0 ? d[2] : d[1];
        double error = 100.0 * (d[6] - predicted) / predicted;
        bytes_printf(out, "<tr class=\"decision\" data-step=\"%.0f\"><td class=\"num\">%.0f"
                     "</td><td class=\"num\">%.2f</td><td class=\"num\">%.2f</td>"
                     "<td class=\"num\">%.2f</td><td>%s</td><td class=\"num\">%.0f</td>"
                     "<td class=\"num\">%.2f</td><td class=\"num\">%.2f</td>", (double)d[0],
                     (double)d[0], (double)d[1], (double)d[2], (double)d[3],
                     d[4] != 0 ? "yes" : "no", (double)d[5], (double)d[7] / 1e6, (double)d[6]);
        if (isfinite(error)) bytes_printf(out, "<td class=\"num\">%+.1f%%</td></tr>\n", error);
        else bytes_puts(out, "<td class=\"num\">-</td></tr>\n");
    }
    bytes_puts(out, "</table>\n");
}

static void run_section(struct bytes *out, const struct report *rep, int r)
{
    const struct report_run *run = &rep->runs[r];
    bytes_printf(out, "<h2 id=\"run-%d\">", r + 1);
    bytes_html(out, run->name);
    bytes_puts(out, "</h2>\n");
    for (int i = 0; i < rep->figure_count; i++)
        if (rep->figures[i].run == r) figure_html(out, &rep->figures[i]);
    if (run->trace.step_count == 0)
        bytes_puts(out, "<p>No traced steps, so no pipeline timeline: train with "
                        "<code>run.trace_from=N run.trace_steps=K</code> to see one.</p>\n");
    bytes_printf(out, "<h3>Layout changes (%d)</h3>\n", run->change_count);
    if (run->change_count) changes_table(out, run, r);
    bytes_printf(out, "<h3>Balancer decisions (%ld)</h3>\n", run->decisions.rows);
    if (run->decisions.rows) decisions_table(out, run, r);
    else bytes_puts(out, "<p>None logged (/balance/decisions is absent or empty).</p>\n");
    bytes_puts(out, "<details><summary>configuration</summary><pre>");
    bytes_html(out, run->config ? run->config : "(no config attribute)");
    bytes_puts(out, "</pre></details>\n");
}

void report_write_html(const struct report *rep, struct bytes *out)
{
    char now[64];
    time_t t = time(NULL);
    struct tm utc;
    gmtime_r(&t, &utc);
    strftime(now, sizeof now, "%Y-%m-%d %H:%M UTC", &utc);
    bytes_puts(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                    "<title>dynmo report: ");
    for (int i = 0; i < rep->run_count; i++) {
        if (i) bytes_puts(out, ", ");
        bytes_html(out, rep->runs[i].name);
    }
    bytes_printf(out, "</title>\n<style>\n%s</style></head>\n<body>\n<h1>dynmo report</h1>\n"
                 "<p>Written by dynmo %s on %s from %d run log%s (docs/report.md says how to "
                 "read it).</p>\n", style, DYNMO_VERSION, now, rep->run_count,
                 rep->run_count == 1 ? "" : "s");
    runs_table(out, rep);
    speedups(out, rep);
    for (int i = 0; i < rep->figure_count; i++)
        if (rep->figures[i].run < 0) figure_html(out, &rep->figures[i]);
    for (int r = 0; r < rep->run_count; r++) run_section(out, rep, r);
    bytes_puts(out, "</body></html>\n");
}
