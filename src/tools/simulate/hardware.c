/* The hardware file of `dynmo simulate --hardware` (docs/simulate.md, "The
 * hardware model"): an INI file in the style of dynmo's configs, every key
 * required and range-checked, read into struct hardware; the same file
 * written back by `dynmo calibrate`; and the pricing of one op on it (a
 * roofline of the op's FLOPs at its class's achieved rate and its bytes at
 * the achieved bandwidth, plus a fixed overhead).
 *
 * Must not: measure anything or know the model's ops (hardware_ops.c). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "tools/simulate/hardware.h"

/* One key: where its value goes, its range and what it means (for the
 * message of a value out of range). */
struct hw_key {
    const char *section, *key;
    size_t offset;
    int is_int;
    double min, max;
    const char *meaning;
    int optional;                /* absent: bandwidth_gbs (check_whole) */
};

#define HW_DOUBLE(sec, k, field, lo, hi, what) \
    {sec, k, offsetof(struct hardware, field), 0, lo, hi, what, 0}
#define HW_OPTIONAL_GBS(k, field, what) \
    {"device", k, offsetof(struct hardware, field), 0, 0.01, 1e5, what, 1}

/* A link's two keys, where_latency_us and where_bandwidth_gbs. */
#define HW_LINE(sec, field, where, what) \
    HW_DOUBLE(sec, where "_latency_us", field.latency_us, 0, 1e7, "microseconds of " what), \
    HW_DOUBLE(sec, where "_bandwidth_gbs", field.bandwidth_gbs, 1e-4, 1e5, "GB/s of " what)

static const struct hw_key keys[] = {
    HW_DOUBLE("device", "memory_gb", memory_gb, 1e-3, 1e5, "GB of device memory"),
    HW_DOUBLE("device", "peak_bandwidth_gbs", peak_bandwidth_gbs, 0.1, 1e5,
              "GB/s of memory bandwidth at its peak"),
    HW_DOUBLE("device", "bandwidth_gbs", bandwidth_gbs, 0.01, 1e5,
              "GB/s achieved by elementwise and normalisation ops"),
    HW_DOUBLE("device", "op_overhead_us", op_overhead_us, 0, 1e5, "microseconds per op"),
    {"device", "bytes_per_element", offsetof(struct hardware, bytes_per_element), 1, 2, 4,
     "bytes of an activation or weight in the ops: 2 or 4", 0},
    HW_OPTIONAL_GBS("gelu_gbs", gelu_gbs, "GB/s achieved by GELU forward and backward"),
    HW_OPTIONAL_GBS("layernorm_gbs", layernorm_gbs, "GB/s achieved by the layernorm forward"),
    HW_OPTIONAL_GBS("adamw_gbs", adamw_gbs, "GB/s achieved by AdamW (28 bytes a parameter)"),
    HW_DOUBLE("gemm", "peak_tflops", gemm_peak_tflops, 1e-4, 1e5, "dense TFLOP/s at the peak"),
    HW_DOUBLE("attention", "tflops", attention_tflops, 1e-7, 1e5,
              "TFLOP/s achieved by causal attention"),
    HW_DOUBLE("attention", "hash_tflops", group_attention_tflops, 1e-7, 1e5,
              "TFLOP/s achieved by hash attention's tiles"),
    HW_DOUBLE("attention", "sparse_tflops", sparse_tflops, 1e-7, 1e5,
              "TFLOP/s achieved by CSR products on their nonzeros"),
    {"link", "ranks_per_node", offsetof(struct hardware, ranks_per_node), 1, 1, 1e4,
     "ranks (devices) that share a node's links", 0},
    HW_LINE("link", p2p_intra, "intra", "a message within a node"),
    HW_LINE("link", p2p_inter, "inter", "a message between nodes"),
    HW_LINE("collective", collective_intra, "intra", "an all-reduce within a node (bus)"),
    HW_LINE("collective", collective_inter, "inter", "an all-reduce between nodes (bus)"),
};
#define KEY_COUNT (int)(sizeof keys / sizeof keys[0])
static const char *const sections[] = {"device", "gemm", "attention", "link", "collective"};
#define SECTION_COUNT (int)(sizeof sections / sizeof sections[0])

/* Everything between start and the end of the line, without blanks at either end. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = 0;
    return s;
}

/* A number that is the whole of text and finite. */
static int parse_number(const char *text, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || *trim(end) || errno == ERANGE || !isfinite(x)) return -1;
    *out = x;
    return 0;
}

struct reader {
    struct hardware *hw;
    const char *name;
    int section;                 /* index into sections, -1 before the first */
    int line;
    int seen[KEY_COUNT], seen_name;
    char *err;
    size_t errsize;
};

#define FAIL(r, ...) \
    do { \
        int used_ = snprintf((r)->err, (r)->errsize, "hardware file %s:%d: ", (r)->name, \
                             (r)->line); \
        if (used_ >= 0 && (size_t)used_ < (r)->errsize) \
            snprintf((r)->err + used_, (r)->errsize - (size_t)used_, __VA_ARGS__); \
        return -1; \
    } while (0)

/* The four numbers of a point's value into v; `form` names them for the
 * message. */
static int read_four(struct reader *r, const char *key, const char *value, const char *form,
                     double v[4])
{
    const char *section = sections[r->section];
    char copy[256], *save = NULL;
    snprintf(copy, sizeof copy, "%s", value);
    int n = 0;
    for (char *f = strtok_r(copy, " \t", &save); f; f = strtok_r(NULL, " \t", &save)) {
        if (n == 4 || parse_number(f, &v[n]) != 0)
            FAIL(r, "[%s] %s = %s is not '%s' (four numbers)", section, key, value, form);
        n++;
    }
    if (n != 4) FAIL(r, "[%s] %s = %s is not '%s' (four numbers)", section, key, value, form);
    return 0;
}

/* A rate of a point, v in [1e-7, 1e5] TFLOP/s. */
static int check_rate(struct reader *r, const char *key, const char *value, double v)
{
    if (!(v >= 1e-7 && v <= 1e5))
        FAIL(r, "[%s] %s = %s: %g TFLOP/s is out of range [1e-07, 100000]",
             sections[r->section], key, value, v);
    return 0;
}

/* The first n numbers of a point, v[i] called names[i], each whole in
 * [1, 1e7]. */
static int check_sizes(struct reader *r, const char *key, const char *value, const double *v,
                       int n, const char *const names[])
{
    for (int i = 0; i < n; i++)
        if (v[i] < 1 || v[i] > 1e7 || v[i] != floor(v[i]))
            FAIL(r, "[%s] %s = %s: %s must be a whole number in [1, 10000000]",
                 sections[r->section], key, value, names[i]);
    return 0;
}

/* [gemm] point (or backward_point) = m n k tflops */
static int read_point(struct reader *r, const char *key, const char *value)
{
    struct hardware *hw = r->hw;
    int backward = !strcmp(key, "backward_point");
    int *count = backward ? &hw->backward_points : &hw->gemm_points;
    if (*count == HW_GEMM_POINTS_MAX)
        FAIL(r, "[gemm] lists more than %d %ss", HW_GEMM_POINTS_MAX, key);
    double v[4];
    static const char *const names[] = {"m", "n", "k"};
    if (read_four(r, key, value, "m n k tflops", v) != 0 ||
        check_sizes(r, key, value, v, 3, names) != 0 || check_rate(r, key, value, v[3]) != 0)
        return -1;
    (backward ? hw->backward : hw->gemm)[(*count)++] =
        (struct hw_gemm_point){v[0], v[1], v[2], v[3]};
    return 0;
}

/* [attention] point (or hash_point) = T head_size forward_tflops backward_tflops */
static int read_attention_point(struct reader *r, const char *key, const char *value)
{
    struct hardware *hw = r->hw;
    int hash = !strcmp(key, "hash_point");
    int *count = hash ? &hw->hash_points : &hw->attention_points;
    if (*count == HW_ATTENTION_POINTS_MAX)
        FAIL(r, "[attention] lists more than %d %ss", HW_ATTENTION_POINTS_MAX, key);
    double v[4];
    static const char *const names[] = {"T", "head_size"};
    if (read_four(r, key, value, "T head_size forward_tflops backward_tflops", v) != 0 ||
        check_sizes(r, key, value, v, 2, names) != 0 || check_rate(r, key, value, v[2]) != 0 ||
        check_rate(r, key, value, v[3]) != 0)
        return -1;
    (hash ? hw->hash : hw->attention)[(*count)++] =
        (struct hw_attention_point){v[0], v[1], v[2], v[3]};
    return 0;
}

static int read_key(struct reader *r, const char *key, const char *value)
{
    if (r->section < 0) FAIL(r, "'%s' before any [section]", key);
    const char *section = sections[r->section];
    if (!strcmp(section, "device") && !strcmp(key, "name")) {
        if (r->seen_name) FAIL(r, "[device] name is given twice");
        if (!*value || strlen(value) >= sizeof r->hw->name)
            FAIL(r, "[device] name must be 1 to %zu characters", sizeof r->hw->name - 1);
        snprintf(r->hw->name, sizeof r->hw->name, "%s", value);
        r->seen_name = 1;
        return 0;
    }
    if (!strcmp(section, "gemm") && (!strcmp(key, "point") || !strcmp(key, "backward_point")))
        return read_point(r, key, value);
    if (!strcmp(section, "attention") && (!strcmp(key, "point") || !strcmp(key, "hash_point")))
        return read_attention_point(r, key, value);
    for (int i = 0; i < KEY_COUNT; i++) {
        const struct hw_key *k = &keys[i];
        if (strcmp(k->section, section) || strcmp(k->key, key)) continue;
        if (r->seen[i]) FAIL(r, "[%s] %s is given twice", section, key);
        double x;
        if (parse_number(value, &x) != 0)
            FAIL(r, "[%s] %s = '%s' is not a number (%s)", section, key, value, k->meaning);
        if (x < k->min || x > k->max || (k->is_int && x != floor(x)))
            FAIL(r, "[%s] %s = %s is out of range [%g, %g] (%s)", section, key, value, k->min,
                 k->max, k->meaning);
        if (k->is_int) *(int *)((char *)r->hw + k->offset) = (int)x;
        else *(double *)((char *)r->hw + k->offset) = x;
        r->seen[i] = 1;
        return 0;
    }
    FAIL(r, "unknown key '%s' in [%s]", key, section);
}

static int read_line(struct reader *r, char *line)
{
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *semi = strchr(line, ';');
    if (semi) *semi = 0;
    line = trim(line);
    if (!*line) return 0;
    if (*line == '[') {
        char *close = strchr(line, ']');
        if (!close || *trim(close + 1)) FAIL(r, "a section header must look like [name]");
        *close = 0;
        for (int s = 0; s < SECTION_COUNT; s++)
            if (!strcmp(trim(line + 1), sections[s])) {
                r->section = s;
                return 0;
            }
        FAIL(r, "unknown section [%s] (device, gemm, attention, link, collective)",
             trim(line + 1));
    }
    char *eq = strchr(line, '=');
    if (!eq) FAIL(r, "expected 'key = value'");
    *eq = 0;
    return read_key(r, trim(line), trim(eq + 1));
}

/* The figures that must agree with each other: achieved below peak. */
static int check_whole(struct reader *r)
{
    struct hardware *hw = r->hw;
    r->line = 0;
#define WHOLE_FAIL(...) \
    do { \
        snprintf(r->err, r->errsize, "hardware file %s: ", r->name); \
        size_t used_ = strlen(r->err); \
        snprintf(r->err + used_, r->errsize - used_, __VA_ARGS__); \
        return -1; \
    } while (0)
    if (!r->seen_name) WHOLE_FAIL("[device] name is missing (the hardware's name)");
    for (int i = 0; i < KEY_COUNT; i++) {
        if (r->seen[i]) continue;
        if (!keys[i].optional)
            WHOLE_FAIL("[%s] %s is missing (%s)", keys[i].section, keys[i].key, keys[i].meaning);
        *(double *)((char *)hw + keys[i].offset) = hw->bandwidth_gbs;
    }
    if (hw->gemm_points == 0)
        WHOLE_FAIL("[gemm] point is missing (at least one 'point = m n k tflops')");
    for (int i = 0; i < KEY_COUNT; i++) {
        if (!keys[i].optional && keys[i].offset != offsetof(struct hardware, bandwidth_gbs))
            continue;
        double achieved = *(double *)((char *)hw + keys[i].offset);
        if (achieved > hw->peak_bandwidth_gbs)
            WHOLE_FAIL("[device] %s = %g is above peak_bandwidth_gbs = %g (achieved "
                       "cannot exceed peak)", keys[i].key, achieved, hw->peak_bandwidth_gbs);
    }
    for (int backward = 0; backward < 2; backward++) {
        int count = backward ? hw->backward_points : hw->gemm_points;
        const struct hw_gemm_point *points = backward ? hw->backward : hw->gemm;
        for (int p = 0; p < count; p++)
            if (points[p].tflops > hw->gemm_peak_tflops)
                WHOLE_FAIL("[gemm] %s %.0f %.0f %.0f at %g TFLOP/s is above peak_tflops = %g "
                           "(achieved cannot exceed peak)", backward ? "backward_point" : "point",
                           points[p].m, points[p].n, points[p].k, points[p].tflops,
                           hw->gemm_peak_tflops);
    }
    for (int hash = 0; hash < 2; hash++)
        for (int p = 0; p < (hash ? hw->hash_points : hw->attention_points); p++) {
            const struct hw_attention_point *a = hash ? &hw->hash[p] : &hw->attention[p];
            if (fmax(a->forward_tflops, a->backward_tflops) > hw->gemm_peak_tflops)
                WHOLE_FAIL("[attention] %s %.0f %.0f at %g and %g TFLOP/s is above [gemm] "
                           "peak_tflops = %g (achieved cannot exceed peak)",
                           hash ? "hash_point" : "point", a->T, a->head_size, a->forward_tflops,
                           a->backward_tflops, hw->gemm_peak_tflops);
        }
    const char *rates[3] = {"tflops", "hash_tflops", "sparse_tflops"};
    double values[3] = {hw->attention_tflops, hw->group_attention_tflops, hw->sparse_tflops};
    for (int i = 0; i < 3; i++)
        if (values[i] > hw->gemm_peak_tflops)
            WHOLE_FAIL("[attention] %s = %g is above [gemm] peak_tflops = %g (achieved cannot "
                       "exceed peak)", rates[i], values[i], hw->gemm_peak_tflops);
#undef WHOLE_FAIL
    return 0;
}

int hardware_parse_text(struct hardware *hw, const char *text, size_t len, const char *name,
                        char *err, size_t errsize)
{
    memset(hw, 0, sizeof *hw);
    snprintf(hw->path, sizeof hw->path, "%s", name);
    struct reader r = {.hw = hw, .name = name, .section = -1, .err = err, .errsize = errsize};
    char line[1024];
    for (size_t start = 0; start < len;) {
        r.line++;
        const char *end = memchr(text + start, '\n', len - start);
        size_t length = end ? (size_t)(end - (text + start)) : len - start;
        if (length >= sizeof line) FAIL(&r, "a line longer than %zu characters", sizeof line - 1);
        memcpy(line, text + start, length);
        line[length] = 0;
        if (strlen(line) != length) FAIL(&r, "a NUL byte in the line (a hardware file is text)");
        start += length + 1;
        char *at = r.line == 1 && !strncmp(line, "\xef\xbb\xbf", 3) ? line + 3 : line;   /* BOM */
        if (read_line(&r, at) != 0) return -1;
    }
    return check_whole(&r);
}

#undef FAIL

void hardware_load(struct hardware *hw, const char *path)
{
    const char *kind;
    int fd = dm_open_regular(path, &kind);
    if (fd < 0 && kind)
        dm_user_error("hardware file %s is %s, not a regular file (--hardware names an INI "
                      "file)", path, kind);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
    if (!f) dm_user_error("cannot read hardware file %s: %s", path, dm_errno_text());
    size_t size = 0, capacity = 1 << 14;
    char *text = dm_alloc(capacity);
    for (;;) {
        size_t got = fread(text + size, 1, capacity - size, f);
        size += got;
        if (got == 0) break;
        if (size == capacity) {
            fclose(f);
            dm_free(text);
            dm_user_error("hardware file %s is larger than %zu bytes (it is a short INI file)",
                          path, capacity - 1);
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) dm_user_error("cannot read hardware file %s: %s", path, dm_errno_text());
    char err[1024];
    int status = hardware_parse_text(hw, text, size, path, err, sizeof err);
    dm_free(text);
    if (status != 0) dm_user_error("%s", err);
}

int hardware_write(const struct hardware *hw, const char *path, const char *comment, char *err,
                   size_t errsize)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        dm_set_message(err, errsize, "cannot write %s: %s", tmp, dm_errno_text());
        return -1;
    }
    for (const char *c = comment; c && *c;) {
        const char *nl = strchr(c, '\n');
        int n = nl ? (int)(nl - c) : (int)strlen(c);
        fprintf(f, "# %.*s\n", n, c);
        c += n + (nl ? 1 : 0);
    }
    fprintf(f, "\n[device]\nname = %s\n", hw->name);
    const char *section = "device";
    for (int i = 0; i < KEY_COUNT; i++) {
        const struct hw_key *k = &keys[i];
        if (strcmp(section, k->section)) {
            fprintf(f, "\n[%s]\n", k->section);
            section = k->section;
        }
        const char *at = (const char *)hw + k->offset;
        if (k->is_int) fprintf(f, "%s = %d    # %s\n", k->key, *(const int *)at, k->meaning);
        else fprintf(f, "%s = %.6g    # %s\n", k->key, *(const double *)at, k->meaning);
        if (!strcmp(k->section, "gemm") && !strcmp(k->key, "peak_tflops")) {
            fprintf(f, "# point = m n k achieved TFLOP/s of out = inp W^T + bias\n");
            for (int p = 0; p < hw->gemm_points; p++)
                fprintf(f, "point = %.0f %.0f %.0f %.6g\n", hw->gemm[p].m, hw->gemm[p].n,
                        hw->gemm[p].k, hw->gemm[p].tflops);
            if (hw->backward_points)
                fprintf(f, "# backward_point = m n k achieved TFLOP/s of its backward (input, "
                        "weight and bias gradients: 4 m n k FLOPs)\n");
            for (int p = 0; p < hw->backward_points; p++)
                fprintf(f, "backward_point = %.0f %.0f %.0f %.6g\n", hw->backward[p].m,
                        hw->backward[p].n, hw->backward[p].k, hw->backward[p].tflops);
        }
        if (!strcmp(k->section, "attention") && !strcmp(k->key, "sparse_tflops")) {
            if (hw->attention_points)
                fprintf(f, "# point = T head_size forward_tflops backward_tflops of causal "
                        "attention\n");
            for (int p = 0; p < hw->attention_points; p++)
                fprintf(f, "point = %.0f %.0f %.6g %.6g\n", hw->attention[p].T,
                        hw->attention[p].head_size, hw->attention[p].forward_tflops,
                        hw->attention[p].backward_tflops);
            if (hw->hash_points)
                fprintf(f, "# hash_point = T head_size forward_tflops backward_tflops of hash "
                        "attention's visited tiles\n");
            for (int p = 0; p < hw->hash_points; p++)
                fprintf(f, "hash_point = %.0f %.0f %.6g %.6g\n", hw->hash[p].T,
                        hw->hash[p].head_size, hw->hash[p].forward_tflops,
                        hw->hash[p].backward_tflops);
        }
    }
    int failed = fflush(f) != 0 || fsync(fileno(f)) != 0;
    failed |= fclose(f) != 0;
    if (failed || rename(tmp, path) != 0) {
        dm_set_message(err, errsize, "cannot write %s: %s", path, dm_errno_text());
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* ---- pricing --------------------------------------------------------------- */

/* The rate of m x n x k among count points weighted by the inverse fourth
 * power of their distance in log2 of each dimension: local enough that the
 * many far points of a calibrated grid do not pull a small shape towards
 * the large shapes' rates. */
static double interpolate_gemm(const struct hw_gemm_point *points, int count, double m,
                               double n, double k)
{
    double weight_sum = 0, rate_sum = 0;
    for (int p = 0; p < count; p++) {
        const struct hw_gemm_point *g = &points[p];
        double dm = log2(m / g->m), dn = log2(n / g->n), dk = log2(k / g->k);
        double d2 = dm * dm + dn * dn + dk * dk;
        if (d2 < 1e-12) return g->tflops;
        weight_sum += 1 / (d2 * d2);
        rate_sum += g->tflops / (d2 * d2);
    }
    return rate_sum / weight_sum;
}

double hardware_gemm_tflops(const struct hardware *hw, double m, double n, double k)
{
    return interpolate_gemm(hw->gemm, hw->gemm_points, m, n, k);
}

double hardware_gemm_backward_tflops(const struct hardware *hw, double m, double n, double k)
{
    if (!hw->backward_points) return 0;
    return interpolate_gemm(hw->backward, hw->backward_points, m, n, k);
}

/* A direction's rate at T and head_size among count attention points by
 * inverse fourth power of the distance in log2 T and log2 head_size. */
static double interpolate_attention(const struct hw_attention_point *points, int count,
                                    double T, double head_size, int backward)
{
    double weight_sum = 0, rate_sum = 0;
    for (int p = 0; p < count; p++) {
        const struct hw_attention_point *a = &points[p];
        double rate = backward ? a->backward_tflops : a->forward_tflops;
        double dt = log2(T / a->T), dh = log2(head_size / a->head_size);
        double d2 = dt * dt + dh * dh;
        if (d2 < 1e-12) return rate;
        weight_sum += 1 / (d2 * d2);
        rate_sum += rate / (d2 * d2);
    }
    return rate_sum / weight_sum;
}

double hardware_attention_tflops(const struct hardware *hw, double T, double head_size,
                                 int backward)
{
    if (!hw->attention_points) return hw->attention_tflops;
    return interpolate_attention(hw->attention, hw->attention_points, T, head_size, backward);
}

double hardware_hash_tflops(const struct hardware *hw, double T, double head_size, int backward)
{
    if (!hw->hash_points) return hw->group_attention_tflops;
    return interpolate_attention(hw->hash, hw->hash_points, T, head_size, backward);
}

double hardware_op_ms(const struct hardware *hw, double flops, double tflops, double bytes)
{
    double compute = tflops > 0 ? flops / (tflops * 1e9) : 0;   /* ms */
    double memory = bytes / (hw->bandwidth_gbs * 1e6);
    return hw->op_overhead_us / 1e3 + (compute > memory ? compute : memory);
}

double hardware_gemm_ms(const struct hardware *hw, double m, double n, double k)
{
    double bytes = hw->bytes_per_element * (m * k + k * n + m * n);
    return hardware_op_ms(hw, 2 * m * n * k, hardware_gemm_tflops(hw, m, n, k), bytes);
}

double hardware_link_ms(const struct hw_link *link, double bytes)
{
    return link->latency_us / 1e3 + bytes / (link->bandwidth_gbs * 1e6);
}
