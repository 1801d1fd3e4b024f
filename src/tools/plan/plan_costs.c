/* The cost CSV of `dynmo plan --costs` (docs/balance.md): per-block forward
 * and backward time, parameters, memory and, optionally, the update at the
 * step's end, with optional embedding and head rows. Turns text into a
 * struct plan_input, or into a one-line message naming the file, the line
 * and the problem; plan.c makes that a user error (exit 2).
 *
 * Must not: exit or print (a fuzzer calls plan_parse_costs directly), read
 * past the caller's buffer (it is not NUL-terminated), or keep anything
 * allocated when it fails. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "tools/plan/plan.h"

/* update_ms (once a step, balance.h) may be left out; the others may not. */
enum { COL_LAYER, COL_FWD, COL_BWD, COL_PARAMS, COL_MEM, COL_REQUIRED,
       COL_UPDATE = COL_REQUIRED, COL_COUNT };
static const char *const column_names[COL_COUNT] = {
    "layer", "fwd_ms", "bwd_ms", "params", "mem_bytes", "update_ms"};

#define MAX_COLUMNS 64
#define MAX_BLOCKS 10000000

/* Where the parse stands; messages go to err. */
struct costs_reader {
    const char *name;
    long line;                     /* 1-based, of the line being read */
    long header_fields;            /* 0 until the header is read */
    int column_of[COL_COUNT];      /* field index, or -1 (update_ms only) */
    long head_line;                /* the 'head' row's line, or 0 */
    int capacity;                  /* blocks the arrays hold */
    char *err;
    size_t errsize;
};

__attribute__((format(printf, 2, 3)))
static int reader_fail(const struct costs_reader *r, const char *fmt, ...)
{
    if (r->err && r->errsize > 0) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(r->err, r->errsize, fmt, args);
        va_end(args);
    }
    return -1;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1])) s[--len] = 0;
    return s;
}

/* Splits line at commas in place; returns the field count (the first max
 * of them stored). */
static long split_fields(char *line, char **fields, long max)
{
    long count = 0;
    for (char *p = line;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (count < max) fields[count] = trim(p);
        count++;
        if (!comma) break;
        p = comma + 1;
    }
    return count;
}

static int csv_number(const struct costs_reader *r, int column, const char *text,
                      double *value)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno == ERANGE)
        return reader_fail(r, "%s:%ld: column %s: '%s' is not a number", r->name,
                           r->line, column_names[column], text);
    if (!isfinite(v))
        return reader_fail(r, "%s:%ld: column %s: '%s' is not a finite number",
                           r->name, r->line, column_names[column], text);
    if (v < 0)
        return reader_fail(r, "%s:%ld: column %s: %s is negative", r->name, r->line,
                           column_names[column], text);
    *value = v;
    return 0;
}

static int csv_bytes(const struct costs_reader *r, const char *text, int64_t *value)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno)
        return reader_fail(r, "%s:%ld: column mem_bytes: '%s' is not a whole number "
                           "of bytes", r->name, r->line, text);
    if (v < 0)
        return reader_fail(r, "%s:%ld: column mem_bytes: %s is negative", r->name,
                           r->line, text);
    *value = v;
    return 0;
}

/* The header: where each column is. */
static int read_header(struct costs_reader *r, char **fields, long count)
{
    if (count > MAX_COLUMNS)
        return reader_fail(r, "%s:%ld: more than %d columns", r->name, r->line,
                           MAX_COLUMNS);
    r->header_fields = count;
    for (int c = 0; c < COL_COUNT; c++) {
        r->column_of[c] = -1;
        for (int f = 0; f < count; f++) {
            if (strcmp(fields[f], column_names[c])) continue;
            if (r->column_of[c] >= 0)
                return reader_fail(r, "%s:%ld: column '%s' appears twice", r->name,
                                   r->line, column_names[c]);
            r->column_of[c] = f;
        }
        if (r->column_of[c] < 0 && c < COL_REQUIRED)
            return reader_fail(r, "%s:%ld: missing column '%s' (the header needs "
                               "layer,fwd_ms,bwd_ms,params,mem_bytes)", r->name,
                               r->line, column_names[c]);
    }
    return 0;
}

/* A row's numbers, in the order of the columns' checks. */
static int read_values(const struct costs_reader *r, char **fields,
                       struct balance_extra *row)
{
    const int *col = r->column_of;
    row->update_ms = 0.0;
    if (csv_number(r, COL_FWD, fields[col[COL_FWD]], &row->fwd_ms) ||
        csv_number(r, COL_BWD, fields[col[COL_BWD]], &row->bwd_ms) ||
        csv_number(r, COL_PARAMS, fields[col[COL_PARAMS]], &row->params) ||
        csv_bytes(r, fields[col[COL_MEM]], &row->mem_bytes) ||
        (col[COL_UPDATE] >= 0 &&
         csv_number(r, COL_UPDATE, fields[col[COL_UPDATE]], &row->update_ms)))
        return -1;
    return 0;
}

static int grow_doubles(double **array, int capacity)
{
    double *grown = realloc(*array, (size_t)capacity * sizeof(double));
    if (!grown) return -1;
    *array = grown;
    return 0;
}

/* Room for one more block; the arrays stay the caller's to free either way. */
static int reserve_block(struct costs_reader *r, struct plan_input *in)
{
    if (in->blocks < r->capacity) return 0;
    int capacity = r->capacity ? 2 * r->capacity : 64;
    if (capacity > MAX_BLOCKS)
        return reader_fail(r, "%s:%ld: more than 10,000,000 blocks", r->name, r->line);
    int64_t *mem = realloc(in->mem_bytes, (size_t)capacity * sizeof(int64_t));
    if (mem) in->mem_bytes = mem;
    if (!mem || grow_doubles(&in->fwd_ms, capacity) ||
        grow_doubles(&in->bwd_ms, capacity) || grow_doubles(&in->params, capacity) ||
        grow_doubles(&in->update_ms, capacity))
        return reader_fail(r, "%s:%ld: out of memory", r->name, r->line);
    r->capacity = capacity;
    return 0;
}

/* A row after the header: a block, or the embedding or head. */
static int read_row(struct costs_reader *r, struct plan_input *in, char **fields,
                    long count)
{
    if (count != r->header_fields)
        return reader_fail(r, "%s:%ld: %ld fields, but the header has %ld", r->name,
                           r->line, count, r->header_fields);
    if (r->head_line)
        return reader_fail(r, "%s:%ld: a row after 'head' (line %ld); the head must "
                           "be the last row", r->name, r->line, r->head_line);
    const char *name = fields[r->column_of[COL_LAYER]];
    struct balance_extra row;
    if (read_values(r, fields, &row)) return -1;
    if (!strcmp(name, "embed")) {
        if (in->blocks > 0 || in->has_embed)
            return reader_fail(r, "%s:%ld: 'embed' must be the first row", r->name,
                               r->line);
        in->has_embed = 1;
        in->profile.embed = row;
        return 0;
    }
    if (!strcmp(name, "head")) {
        r->head_line = r->line;
        in->has_head = 1;
        in->profile.head = row;
        return 0;
    }
    if (reserve_block(r, in)) return -1;
    in->update_ms[in->blocks] = row.update_ms;
    in->fwd_ms[in->blocks] = row.fwd_ms;
    in->bwd_ms[in->blocks] = row.bwd_ms;
    in->params[in->blocks] = row.params;
    in->mem_bytes[in->blocks] = row.mem_bytes;
    in->blocks++;
    return 0;
}

/* Parses text[0..len), which the caller owns and lets us cut up: text[len]
 * is a NUL, and no other NUL may occur (it is reported). */
static int parse_in_place(char *text, size_t len, const char *name,
                          struct plan_input *out, char *err, size_t errsize)
{
    struct costs_reader r = {.name = name, .err = err, .errsize = errsize};
    memset(out, 0, sizeof *out);
    if (strlen(text) != len)
        return reader_fail(&r, "%s: contains a NUL byte; not a CSV file", name);
    char *fields[MAX_COLUMNS];
    int rc = 0;
    char *line = text;
    for (r.line = 1; line && rc == 0; r.line++) {
        char *newline = strchr(line, '\n');
        if (newline) *newline = 0;
        char *content = trim(line);
        line = newline ? newline + 1 : NULL;
        if (!*content || *content == '#') continue;
        long count = split_fields(content, fields, MAX_COLUMNS);
        rc = r.header_fields ? read_row(&r, out, fields, count)
                             : read_header(&r, fields, count);
    }
    if (rc == 0 && !r.header_fields)
        rc = reader_fail(&r, "%s: empty; expected a CSV header", name);
    if (rc == 0 && out->blocks == 0)
        rc = reader_fail(&r, "%s: no block rows", name);
    if (rc) {
        plan_input_free(out);
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->profile.blocks = out->blocks;
    out->profile.fwd_ms = out->fwd_ms;
    out->profile.bwd_ms = out->bwd_ms;
    out->profile.params = out->params;
    out->profile.mem_bytes = out->mem_bytes;
    if (r.column_of[COL_UPDATE] >= 0) out->profile.update_ms = out->update_ms;
    return 0;
}

int plan_parse_costs(const char *text, size_t len, const char *name,
                     struct plan_input *out, char *err, size_t errsize)
{
    char *copy = malloc(len + 1);
    if (!copy) {
        memset(out, 0, sizeof *out);
        struct costs_reader r = {.err = err, .errsize = errsize};
        return reader_fail(&r, "%s: out of memory", name);
    }
    if (len > 0) memcpy(copy, text, len);
    copy[len] = 0;
    int rc = parse_in_place(copy, len, name, out, err, errsize);
    free(copy);
    return rc;
}

int plan_read_costs(const char *path, struct plan_input *out, char *err,
                    size_t errsize)
{
    struct costs_reader r = {.name = path, .err = err, .errsize = errsize};
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return reader_fail(&r, "cannot open '%s': %s", path, dm_errno_text());
    size_t size = 0, capacity = 1 << 16;
    char *text = malloc(capacity);
    int failed = !text;
    while (!failed) {
        if (size + 1 >= capacity) {
            char *grown = realloc(text, 2 * capacity);
            if (!grown) {
                failed = 1;
                break;
            }
            text = grown;
            capacity *= 2;
        }
        size_t got = fread(text + size, 1, capacity - size - 1, f);
        size += got;
        if (got == 0) break;
    }
    int read_error = ferror(f);
    fclose(f);
    if (failed || read_error) {
        free(text);
        return failed ? reader_fail(&r, "%s: out of memory", path)
                      : reader_fail(&r, "cannot read '%s'", path);
    }
    text[size] = 0;
    int rc = parse_in_place(text, size, path, out, err, errsize);
    free(text);
    return rc;
}

void plan_input_free(struct plan_input *in)
{
    free(in->fwd_ms);
    free(in->bwd_ms);
    free(in->update_ms);
    free(in->wgrad_ms);
    free(in->params);
    free(in->mem_bytes);
}
