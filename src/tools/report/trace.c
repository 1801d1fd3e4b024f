/* `dynmo trace RUNLOG --out FILE.json`: the traced steps of a run log
 * (/trace/events, written with run.trace_from) in the Chrome trace-event
 * format, so that the pipeline opens in Perfetto or chrome://tracing: one
 * process per rank, one track (thread) per instruction kind, one complete
 * ("X") event per instruction, and a track of steps. Written with json-c.
 *
 * Times inside a step are the run log's (ms after rank 0 began the step,
 * in microseconds here). The log does not record the time between traced
 * steps, so each traced step is placed after the previous one ends on
 * every rank, 1 ms later: the order holds, the gap is not measured
 * (docs/report.md). It reads only through the public run-log readers and
 * writes only FILE, atomically. */
#include <json.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/tools.h"
#include "tools/report/report.h"

#define STEP_GAP_MS 1.0
#define STEP_TRACK SCHEDULE_OP_COUNT   /* the tid of the steps' track */

struct placed {
    json_object *event;
    int rank;
    double ts;          /* us */
    int order;          /* ties: metadata, then steps, then instructions */
};

struct trace_out {
    struct placed *events;
    long count, capacity;
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dynmo trace RUNLOG --out FILE.json\n"
            "Writes the traced steps of a run log (train with run.trace_from=N\n"
            "run.trace_steps=K) as Chrome trace events: open FILE.json in Perfetto\n"
            "(ui.perfetto.dev, Open trace file) or chrome://tracing. One process per rank,\n"
            "one track per instruction kind, one event per instruction (docs/report.md).\n");
}

static void push(struct trace_out *t, json_object *event, int rank, double ts, int order)
{
    t->events = dm_grow(t->events, sizeof *t->events, t->count, &t->capacity, 1024);
    t->events[t->count++] = (struct placed){event, rank, ts, order};
}

static int compare_placed(const void *a, const void *b)
{
    const struct placed *x = a, *y = b;
    if (x->rank != y->rank) return (x->rank > y->rank) - (x->rank < y->rank);
    if (x->order == 0 || y->order == 0) return (x->order > y->order) - (x->order < y->order);
    if (x->ts != y->ts) return (x->ts > y->ts) - (x->ts < y->ts);
    return (x->order > y->order) - (x->order < y->order);
}

/* json-c's constructors, NULL-checked: out of memory is an internal error. */
static json_object *checked(json_object *o)
{
    if (!o) DM_FATAL("json-c: cannot allocate a JSON value (out of memory?)");
    return o;
}

static void put(json_object *object, const char *key, json_object *value)
{
    if (json_object_object_add(object, key, checked(value)) != 0)
        DM_FATAL("json-c: cannot add \"%s\" to an object", key);
}

/* An event with the fields every trace event has here. */
static json_object *event(const char *name, const char *phase, int pid, int tid, double ts)
{
    json_object *e = checked(json_object_new_object());
    put(e, "name", json_object_new_string(name));
    put(e, "ph", json_object_new_string(phase));
    put(e, "pid", json_object_new_int(pid));
    put(e, "tid", json_object_new_int(tid));
    put(e, "ts", json_object_new_double(ts));
    return e;
}

static json_object *metadata(const char *name, int pid, int tid, const char *key,
                             json_object *value)
{
    json_object *e = event(name, "M", pid, tid, 0), *args = checked(json_object_new_object());
    put(args, key, value);
    put(e, "args", args);
    return e;
}

/* Process and track names for every rank and the kinds it ran. */
static void add_metadata(struct trace_out *out, const struct trace *t)
{
    unsigned char *used = dm_alloc((size_t)t->max_ranks * SCHEDULE_OP_COUNT);
    for (long i = 0; i < t->count; i++)
        used[(size_t)t->events[i].rank * SCHEDULE_OP_COUNT + (size_t)t->events[i].op] = 1;
    for (int r = 0; r < t->max_ranks; r++) {
        char name[32];
        snprintf(name, sizeof name, "rank %d", r);
        push(out, metadata("process_name", r, 0, "name", json_object_new_string(name)), r,
             0, 0);
        push(out, metadata("process_sort_index", r, 0, "sort_index", json_object_new_int(r)), r, 0, 0);
        push(out, metadata("thread_name", r, STEP_TRACK, "name",
                                json_object_new_string("step")), r, 0, 0);
        push(out, metadata("thread_sort_index", r, STEP_TRACK, "sort_index",
                                json_object_new_int(-1)),
             r, 0, 0);
        for (int op = 0; op < SCHEDULE_OP_COUNT; op++) {
            if (!used[(size_t)r * SCHEDULE_OP_COUNT + (size_t)op]) continue;
            push(out, metadata("thread_name", r, op, "name",
                                json_object_new_string(trace_op_label(op))),
                 r, 0, 0);
            push(out, metadata("thread_sort_index", r, op, "sort_index",
                                json_object_new_int(op)), r,
                 0, 0);
        }
    }
    dm_free(used);
}

static const char *kind_name(int op)
{
    static const char *const names[TRACE_KIND_COUNT] = {"forward", "backward", "update",
                                                        "send", "wait"};
    return names[trace_op_kind(op)];
}

/* The origin (ms) of each traced step on the trace's time line: after the
 * previous step's last event on any rank (or its step time, if longer). */
static void place_steps(const struct trace *t, const struct series *step_ms, double *origin)
{
    double end_of_previous = 0;
    for (int k = 0; k < t->step_count; k++) {
        double lo = 0, hi = 0;
        for (long i = t->first[k]; i < t->first[k + 1]; i++) {
            lo = fmin(lo, t->events[i].start_ms);
            hi = fmax(hi, t->events[i].start_ms + t->events[i].wall_ms);
        }
        long row = t->steps[k] - 1;
        if (row < step_ms->count && isfinite(step_ms->values[row]))
            hi = fmax(hi, step_ms->values[row]);
        origin[k] = (k ? end_of_previous + STEP_GAP_MS : 0) - lo;
        end_of_previous = origin[k] + hi;
    }
}

static void add_events(struct trace_out *out, const struct trace *t, const double *origin)
{
    double *lo = dm_alloc((size_t)t->max_ranks * sizeof *lo);
    double *hi = dm_alloc((size_t)t->max_ranks * sizeof *hi);
    for (int k = 0; k < t->step_count; k++) {
        for (int r = 0; r < t->ranks[k]; r++) {
            lo[r] = INFINITY;
            hi[r] = -INFINITY;
        }
        for (long i = t->first[k]; i < t->first[k + 1]; i++) {
            const struct trace_event *e = &t->events[i];
            double ts = (origin[k] + e->start_ms) * 1e3;
            json_object *x = event(trace_op_label(e->op), "X", e->rank, e->op, ts);
            json_object *args = checked(json_object_new_object());
            put(x, "cat", json_object_new_string(kind_name(e->op)));
            put(x, "dur", json_object_new_double(e->wall_ms * 1e3));
            put(args, "step", json_object_new_int(e->step));
            put(args, "stage", json_object_new_int(e->stage));
            put(args, "micro_batch", json_object_new_int(e->micro_batch));
            put(args, "wall_ms", json_object_new_double(e->wall_ms));
            put(args, "cpu_ms", json_object_new_double(e->cpu_ms));
            put(x, "args", args);
            push(out, x, e->rank, ts, 2);
            lo[e->rank] = fmin(lo[e->rank], e->start_ms);
            hi[e->rank] = fmax(hi[e->rank], e->start_ms + e->wall_ms);
        }
        for (int r = 0; r < t->ranks[k]; r++) {
            if (!isfinite(lo[r])) continue;
            char name[32];
            snprintf(name, sizeof name, "step %d", t->steps[k]);
            double ts = (origin[k] + lo[r]) * 1e3;
            json_object *x = event(name, "X", r, STEP_TRACK, ts);
            json_object *args = checked(json_object_new_object());
            put(x, "cat", json_object_new_string("step"));
            put(x, "dur", json_object_new_double((hi[r] - lo[r]) * 1e3));
            put(args, "step", json_object_new_int(t->steps[k]));
            put(x, "args", args);
            push(out, x, r, ts, 1);
        }
    }
    dm_free(lo);
    dm_free(hi);
}

/* The Chrome trace of t; step_ms (may be empty) places the steps. */
static json_object *build_trace(const char *path, const struct trace *t,
                                const struct series *step_ms)
{
    double *origin = dm_alloc((size_t)t->step_count * sizeof *origin);
    place_steps(t, step_ms, origin);
    struct trace_out out = {0};
    add_metadata(&out, t);
    add_events(&out, t, origin);
    qsort(out.events, (size_t)out.count, sizeof *out.events, compare_placed);
    json_object *events = checked(json_object_new_array_ext((int)out.count));
    for (long i = 0; i < out.count; i++)
        if (json_object_array_add(events, out.events[i].event) != 0)
            DM_FATAL("json-c: cannot append a trace event");
    dm_free(out.events);
    dm_free(origin);
    json_object *root = checked(json_object_new_object()), *other = checked(json_object_new_object());
    put(other, "writer", json_object_new_string("dynmo trace"));   /* first: TRACE_SIGNATURE */
    put(other, "runlog", json_object_new_string(path));
    put(other, "dynmo_version", json_object_new_string(DYNMO_VERSION));
    put(other, "first_step", json_object_new_int(t->steps[0]));
    put(other, "last_step", json_object_new_int(t->steps[t->step_count - 1]));
    put(other, "ranks", json_object_new_int(t->max_ranks));
    put(other, "note", json_object_new_string("times inside a step are the run log's; traced "
                                              "steps follow each other 1 ms apart (the gap "
                                              "is not measured)"));
    put(root, "otherData", other);   /* before the events: the file's first bytes */
    put(root, "traceEvents", events);
    put(root, "displayTimeUnit", json_object_new_string("ms"));
    return root;
}

/* The first bytes of every file trace writes (build_trace's first keys). */
#define TRACE_SIGNATURE "{\"otherData\":{\"writer\":\"dynmo trace\""

/* --out may name a new file or one trace wrote, never another file and
 * never the run log it reads. */
static void check_out(const char *out, const char *runlog)
{
    char out_real[PATH_MAX], in_real[PATH_MAX];
    if (realpath(out, out_real) && realpath(runlog, in_real) && !strcmp(out_real, in_real))
        dm_user_error("trace: --out %s is the run log it reads: name another file", out);
    struct stat st;
    if (stat(out, &st) != 0) return;   /* a new file (or a path dm_write_file_atomic refuses) */
    if (!S_ISREG(st.st_mode))
        dm_user_error("trace: cannot write %s: %s exists and is not a regular file", out, out);
    char head[sizeof TRACE_SIGNATURE] = "";
    FILE *f = fopen(out, "rb");
    size_t n = f ? fread(head, 1, sizeof head - 1, f) : 0;
    if (f) fclose(f);
    head[n] = '\0';
    if (strcmp(head, TRACE_SIGNATURE))
        dm_user_error("trace: --out %s exists and is not a trace dynmo wrote: name a new file, "
                      "or remove it first", out);
}

int cmd_trace(int argc, char **argv)
{
    const char *path = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return DM_EXIT_OK;
        } else if (!strcmp(argv[i], "--out")) {
            if (i + 1 >= argc) dm_user_error("trace: --out needs a file name");
            out = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            usage(stderr);
            dm_user_error("trace: unknown option '%s'", argv[i]);
        } else if (path) {
            dm_user_error("trace: one RUNLOG only (got '%s' and '%s')", path, argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path || !out || !out[0]) {
        usage(stderr);
        dm_user_error("trace: %s", !path ? "missing RUNLOG (RUN_DIR/" RUNLOG_FILE_NAME ")"
                                         : "--out FILE.json is required");
    }
    report_file_kind("trace", path);
    check_out(out, path);
    char err[1200];
    struct runlog_file *f = runlog_open_read(path, err, sizeof err);
    if (!f) dm_user_error("trace: %s", err);
    struct trace t;
    int status = trace_load(f, &t, err, sizeof err);
    if (status < 0) dm_user_error("trace: %s", err);
    if (status > 0 || t.count == 0)
        dm_user_error("trace: %s has no traced steps (/trace/events is %s: train with "
                      "run.trace_from=N run.trace_steps=K)", path, status ? "missing" : "empty");
    struct series step_ms = {0};
    if (runlog_file_dataset(f, RUNLOG_STEP_MS)) {
        step_ms.count = runlog_file_series(f, RUNLOG_STEP_MS, &step_ms.values, err, sizeof err);
        if (step_ms.count < 0) dm_user_error("trace: %s", err);
    }
    runlog_close_read(f);
    /* microseconds to the nanosecond, without json-c's 17 digits of noise */
    json_c_set_serialization_double_format("%.12g", JSON_C_OPTION_GLOBAL);
    json_object *root = build_trace(path, &t, &step_ms);
    dm_free(step_ms.values);
    const char *text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN |
                                                            JSON_C_TO_STRING_NOSLASHESCAPE);
    if (!text) DM_FATAL("json-c: cannot write the trace as text (out of memory?)");
    size_t size = strlen(text);
    char *file = dm_alloc_uninit(size + 1);
    memcpy(file, text, size);
    file[size] = '\n';
    if (dm_write_file_atomic(out, file, size + 1, err, sizeof err) != 0)
        dm_user_error("trace: cannot write %s: %s", out, err);
    dm_free(file);
    printf("trace: %s: %ld instructions of steps %d to %d on %d ranks (open it in Perfetto or "
           "chrome://tracing)\n", out, t.count, t.steps[0], t.steps[t.step_count - 1], t.max_ranks);
    json_object_put(root);
    trace_free(&t);
    return DM_EXIT_OK;
}
