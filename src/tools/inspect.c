/* `dynmo inspect FILE [--json]`: a summary of a run log (configuration,
 * steps, first and last loss, mean step time, each dynamic scheme's
 * summary of its datasets (dyn_summarise_log: the schemes write it, inspect
 * names none), every dataset with its shape)
 * or of a checkpoint (model, step, optimizer and schedule position, world,
 * layout and its history, data cursors, the scheme's saved state, and per
 * block its stage, size, sparsity and frozen flag) for people, or the same as one JSON object for
 * scripts (written with json-c). The kind comes from the file's root
 * attribute "kind" (a simulation, kind "simulation", reads as a run
 * log). It reads through the public readers only (runlog_*,
 * ckpt_read_info) and never writes; anything else is a user error naming
 * the file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <json.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "dynmo/tools.h"

struct summary {
    const char *path;
    int simulated;                      /* kind "simulation" (dynmo simulate) */
    /* The schemes' summaries (dyn_summarise_log): text lines and the same
     * as JSON under "schemes" */
    char **lines;
    int line_count;
    long line_capacity;
    json_object *schemes;
    char *version, *created, *config, *format_version; /* dm_alloc'd; NULL if absent */
    long steps;
    double first_loss, last_loss, mean_step_ms;
    long timed_steps;                   /* steps behind mean_step_ms */
    struct runlog_dataset_info *datasets;
    int dataset_count;
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dynmo inspect FILE [--json]\n"
            "Summarises a run log (<run.out_dir>/" RUNLOG_FILE_NAME "): configuration, "
            "steps,\nfirst and last loss, mean step time, each dynamic scheme's summary of "
            "its\ndatasets, and every dataset with its shape;\nor a checkpoint (<ckpt.dir>/ckpt-<step>.h5): model, step, world, "
            "layout and\nhistory, data cursors, and per block its stage, size, sparsity "
            "and frozen flag.\n  --json   print the same as one JSON object\n"
            "A run log may belong to a run that is still writing it; a simulation\n"
            "(dynmo simulate --out, docs/simulate.md) reads as a run log.\n");
}

/* A run log's summary read through the checked reader; every problem is
 * one message naming the file (exit 2). */
struct reading {
    struct runlog_file *f;
    struct dm_config cfg;     /* the defaults where the file has no config */
    char err[1200];
};

static void fail_reading(struct reading *rd)
{
    runlog_close_read(rd->f);
    dm_user_error("inspect: %s", rd->err);
}

static char *read_attr_or_die(struct reading *rd, const char *name)
{
    char *text = NULL;
    if (runlog_file_attr(rd->f, name, &text, rd->err, sizeof rd->err) < 0) fail_reading(rd);
    return text;
}

/* A series the file may lack: its rows, 0 when absent. */
static long read_optional_series(struct reading *rd, const char *name, float **values)
{
    *values = NULL;
    if (!runlog_file_dataset(rd->f, name)) return 0;
    long n = runlog_file_series(rd->f, name, values, rd->err, sizeof rd->err);
    if (n < 0) fail_reading(rd);
    return n;
}

static void load_schemes(struct summary *s, struct reading *rd);

static void load_summary(struct summary *s, const char *path)
{
    struct reading rd = {0};
    memset(s, 0, sizeof *s);
    s->path = path;
    s->first_loss = s->last_loss = s->mean_step_ms = NAN;
    rd.f = runlog_open_read(path, rd.err, sizeof rd.err);
    if (!rd.f) dm_user_error("inspect: %s", rd.err);
    s->version = read_attr_or_die(&rd, "dynmo_version");
    s->created = read_attr_or_die(&rd, "created");
    s->config = read_attr_or_die(&rd, "config");
    s->format_version = read_attr_or_die(&rd, "format_version");
    if (runlog_file_config(rd.f, &rd.cfg, rd.err, sizeof rd.err) < 0) fail_reading(&rd);
    const struct runlog_dataset_info *infos;
    s->dataset_count = runlog_file_list(rd.f, &infos);
    s->datasets = dm_alloc((size_t)(s->dataset_count ? s->dataset_count : 1) * sizeof *infos);
    if (s->dataset_count) memcpy(s->datasets, infos, (size_t)s->dataset_count * sizeof *infos);
    s->steps = runlog_file_steps(rd.f);

    float *values = NULL;
    long n = read_optional_series(&rd, RUNLOG_STEP_LOSS, &values);
    if (n > 0) {
        s->first_loss = values[0];
        s->last_loss = values[n - 1];
    }
    dm_free(values);
    n = read_optional_series(&rd, RUNLOG_STEP_MS, &values);
    if (n > 0) {
        /* The first step pays page faults and warm-up; train reports the
         * mean over the steps after it, and so does inspect. */
        long first = n > 1 ? 1 : 0;
        double sum = 0;
        for (long i = first; i < n; i++) sum += values[i];
        s->timed_steps = n - first;
        s->mean_step_ms = sum / (double)s->timed_steps;
    }
    dm_free(values);
    load_schemes(s, &rd);
    runlog_close_read(rd.f);
}

/* ---- the schemes' summaries ------------------------------------------------- */

static json_object *checked(json_object *o);
static void put(json_object *object, const char *key, json_object *value);
static json_object *number(double value);
static json_object *integer(long long value);

static int reader_has(void *ctx, const char *dataset)
{
    return runlog_file_dataset(((struct reading *)ctx)->f, dataset) != NULL;
}

static long reader_floats(void *ctx, const char *dataset, float **values, int *cols)
{
    struct reading *rd = ctx;
    long rows = runlog_file_matrix(rd->f, dataset, values, cols, rd->err, sizeof rd->err);
    if (rows < 0) fail_reading(rd);
    return rows;
}

static long reader_ints(void *ctx, const char *dataset, int **values, int *cols)
{
    struct reading *rd = ctx;
    long rows = runlog_file_int_matrix(rd->f, dataset, values, cols, rd->err, sizeof rd->err);
    if (rows < 0) fail_reading(rd);
    return rows;
}

static void reader_fail(void *ctx, const char *text)
{
    struct reading *rd = ctx;
    snprintf(rd->err, sizeof rd->err, "%s", text);
    fail_reading(rd);
}

/* The writer keeps the lines and builds the JSON objects on a stack. */
enum { SUMMARY_DEPTH = 8 };
struct summary_writer {
    struct summary *s;
    json_object *stack[SUMMARY_DEPTH];
    int depth;
};

static void writer_line(void *ctx, const char *text)
{
    struct summary *s = ((struct summary_writer *)ctx)->s;
    s->lines = dm_grow(s->lines, sizeof *s->lines, s->line_count, &s->line_capacity, 8);
    size_t n = strlen(text) + 1;
    s->lines[s->line_count] = dm_alloc(n);
    memcpy(s->lines[s->line_count++], text, n);
}

/* value under key in the open object, or the next of the open list */
static void writer_add(struct summary_writer *w, const char *key, json_object *value)
{
    if (key) put(w->stack[w->depth - 1], key, value);
    else json_object_array_add(w->stack[w->depth - 1], value);
}

static void writer_push(struct summary_writer *w, const char *key, json_object *value)
{
    if (w->depth == SUMMARY_DEPTH) DM_FATAL("a scheme's summary nests deeper than %d", SUMMARY_DEPTH);
    writer_add(w, key, value);
    w->stack[w->depth++] = value;
}

static void writer_open(void *ctx, const char *key)
{
    writer_push(ctx, key, checked(json_object_new_object()));
}

static void writer_open_list(void *ctx, const char *key)
{
    writer_push(ctx, key, checked(json_object_new_array()));
}

static void writer_close(void *ctx)
{
    struct summary_writer *w = ctx;
    DM_ASSERT(w->depth > 1);
    w->depth--;
}

static void writer_number(void *ctx, const char *key, double value)
{
    writer_add(ctx, key, number(value));
}

static void writer_integer(void *ctx, const char *key, long long value)
{
    writer_add(ctx, key, integer(value));
}

/* Every scheme's summary of the datasets it declares. */
static void load_schemes(struct summary *s, struct reading *rd)
{
    const struct dyn_log_reader reader = {rd, &rd->cfg, runlog_file_path(rd->f), reader_has,
                                          reader_floats, reader_ints, reader_fail};
    struct summary_writer sw = {.s = s, .depth = 1};
    const struct dyn_summary_writer writer = {&sw, writer_line, writer_open, writer_open_list,
                                              writer_close, writer_number, writer_integer};
    s->schemes = sw.stack[0] = checked(json_object_new_object());
    dyn_summarise_log(&reader, &writer);
    DM_ASSERT(sw.depth == 1);
}
static void free_summary(struct summary *s)
{
    for (int i = 0; i < s->line_count; i++) dm_free(s->lines[i]);
    dm_free(s->lines);
    if (s->schemes) json_object_put(s->schemes);
    dm_free(s->version);
    dm_free(s->created);
    dm_free(s->config);
    dm_free(s->format_version);
    dm_free(s->datasets);
}

static const char *type_name(const struct runlog_dataset_info *d)
{
    if (d->element_bytes == 4) return d->is_int ? "int32" : "float32";
    if (d->element_bytes == 8) return d->is_int ? "int64" : "float64";
    return d->is_int ? "int" : "other";
}

static void print_shape(FILE *out, const struct runlog_dataset_info *d)
{
    if (d->rank == 2) fprintf(out, "[%ld, %ld]", d->dims[0], d->dims[1]);
    else if (d->rank == 1) fprintf(out, "[%ld]", d->dims[0]);
    else fprintf(out, "(rank %d)", d->rank);
}

/* A stored config, each line indented under "config:". */
static void print_config(const char *config)
{
    printf("config:\n");
    const char *line = config ? config : "";
    while (*line) {
        const char *end = strchr(line, '\n');
        int len = end ? (int)(end - line) : (int)strlen(line);
        printf("  %.*s\n", len, line);
        line += len + (end ? 1 : 0);
    }
}

static void print_text(const struct summary *s)
{
    printf("%s %s\n", s->simulated ? "simulation" : "run log", s->path);
    printf("  written by dynmo %s, created %s, format version %s\n",
           s->version ? s->version : "?", s->created ? s->created : "?",
           s->format_version ? s->format_version : "?");
    printf("  steps: %ld\n", s->steps);
    if (!isnan(s->first_loss))
        printf("  loss: %.4f at the first step, %.4f at the last\n", s->first_loss,
               s->last_loss);
    if (!isnan(s->mean_step_ms))
        printf("  mean step: %.2f ms over %ld step%s%s\n", s->mean_step_ms,
               s->timed_steps, s->timed_steps == 1 ? "" : "s",
               s->steps > s->timed_steps ? " (the first step is left out)" : "");
    for (int i = 0; i < s->line_count; i++) printf("%s\n", s->lines[i]);
    printf("datasets:\n");
    for (int i = 0; i < s->dataset_count; i++) {
        const struct runlog_dataset_info *d = &s->datasets[i];
        printf("  %-28s %-8s ", d->name, type_name(d));
        print_shape(stdout, d);
        printf("\n");
    }
    print_config(s->config);
}

/* ---- JSON (json-c) ---------------------------------------------------------- */

static json_object *checked(json_object *o)
{
    if (!o) DM_FATAL("json-c: cannot allocate a JSON value (out of memory?)");
    return o;
}

static void put(json_object *object, const char *key, json_object *value)
{
    if (json_object_object_add(object, key, value) != 0)
        DM_FATAL("json-c: cannot add \"%s\" to an object", key);
}

/* A string; "" for an attribute the file lacks, as before json-c. */
static json_object *string(const char *text)
{
    return checked(json_object_new_string(text ? text : ""));
}

/* A finite number, or null (json-c would write NaN, which is not JSON). */
static json_object *number(double value)
{
    return isfinite(value) ? checked(json_object_new_double(value)) : NULL;
}

static json_object *integer(long long value)
{
    return checked(json_object_new_int64(value));
}

static json_object *int_array(const int *values, int n)
{
    json_object *a = checked(json_object_new_array());
    for (int i = 0; i < n; i++) json_object_array_add(a, integer(values[i]));
    return a;
}

/* Prints o as one JSON document on stdout and frees it; numbers keep the
 * 9 significant digits of a float32. */
static void print_and_free(json_object *o)
{
    json_c_set_serialization_double_format("%.9g", JSON_C_OPTION_GLOBAL);
    puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_SPACED |
                                           JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
}

static void print_json(const struct summary *s)
{
    json_object *o = checked(json_object_new_object());
    put(o, "file", string(s->path));
    put(o, "kind", string(s->simulated ? SIMULATION_KIND : RUNLOG_KIND));
    put(o, "dynmo_version", string(s->version));
    put(o, "created", string(s->created));
    char *end = NULL;
    long version = s->format_version ? strtol(s->format_version, &end, 10) : 0;
    if (s->format_version && end != s->format_version && *end == '\0')
        put(o, "format_version", integer(version));
    else
        put(o, "format_version", string(s->format_version));
    put(o, "steps", integer(s->steps));
    put(o, "loss_first", number(s->first_loss));
    put(o, "loss_last", number(s->last_loss));
    put(o, "mean_step_ms", number(s->mean_step_ms));
    put(o, "mean_step_ms_steps", integer(s->timed_steps));
    /* each scheme's object, named by the scheme, where the file holds its datasets */
    json_object_object_foreach(s->schemes, key, value) put(o, key, json_object_get(value));
    json_object *datasets = checked(json_object_new_array());
    for (int i = 0; i < s->dataset_count; i++) {
        const struct runlog_dataset_info *d = &s->datasets[i];
        json_object *entry = checked(json_object_new_object());
        put(entry, "name", string(d->name));
        put(entry, "type", string(type_name(d)));
        json_object *shape = checked(json_object_new_array());
        for (int k = 0; k < d->rank && k < 2; k++) json_object_array_add(shape, integer(d->dims[k]));
        put(entry, "shape", shape);
        json_object_array_add(datasets, entry);
    }
    put(o, "datasets", datasets);
    put(o, "config", string(s->config));
    print_and_free(o);
}

/* ---- checkpoints ------------------------------------------------------------ */

/* The stage that owns block `layer` under a layout. */
static int stage_of(const int *layout, int stages, int layer)
{
    for (int s = 0, end = 0; s < stages; s++) {
        end += layout[s];
        if (layer < end) return s;
    }
    return stages - 1;
}

static void print_counts(FILE *out, const int *counts, int n)
{
    fputc('[', out);
    for (int i = 0; i < n; i++) fprintf(out, i ? ", %d" : "%d", counts[i]);
    fputc(']', out);
}

static void print_scheme_line(void *ctx, const char *line)
{
    (void)ctx;
    printf("  %s\n", line);
}

/* Who wrote the checkpoint, and its model: the shape and its dynamic blocks. */
static void print_checkpoint_model(const struct ckpt_meta *m)
{
    const struct gpt_shape *s = &m->shape;
    size_t block_params = block_param_count(s->channels);
    printf("  written by dynmo %s, created %s, schema version %d\n", m->dynmo_version,
           m->created, m->schema_version);
    char rows[64] = "";
    if (gpt_vocab_used(s) != s->vocab)
        snprintf(rows, sizeof rows, " (%d embedding rows: model.vocab_pad)", s->vocab);
    printf("  model: %d layers, %d channels, %d heads, vocab %d%s, max_seq %d: %zu "
           "parameters (%zu per dense block)\n", s->layers, s->channels, s->heads,
           gpt_vocab_used(s), rows, s->max_seq, gpt_param_count(s), block_params);
    dyn_describe_shape(s, print_scheme_line, NULL);   /* the schemes' own lines */
}

/* The checkpoint's blocks, one line each, and its configuration. */
static void print_checkpoint_blocks(const struct ckpt_meta *m)
{
    const struct gpt_shape *s = &m->shape;
    double block_mb = 3.0 * (double)block_param_count(s->channels) * 4.0 / 1e6;
    int frozen = 0;
    for (int i = 0; i < s->layers; i++) frozen += m->frozen[i];
    if (gpt_shape_replaces_mlp(s))   /* blocks of other sizes */
        printf("  blocks (MB: params, Adam m and v; %d frozen):\n", frozen);
    else
        printf("  blocks (%.2f MB each: params, Adam m and v; %d frozen):\n", block_mb, frozen);
    printf("    %5s %5s %9s %8s %6s\n", "layer", "stage", "MB", "sparsity", "frozen");
    for (int i = 0; i < s->layers; i++)
        printf("    %5d %5d %9.2f %8.4f %6s\n", i, stage_of(m->layout, m->pp, i),
               3.0 * (double)gpt_block_param_count(s, i) * 4.0 / 1e6,
               (double)m->sparsity[i], m->frozen[i] ? "yes" : "no");
    print_config(m->config_text);
}

static void print_checkpoint_text(const char *path, const struct ckpt_meta *m)
{
    printf("checkpoint %s\n", path);
    print_checkpoint_model(m);
    printf("  step: %ld (the run resumes at step index %ld); optimizer steps %ld; "
           "learning-rate schedule at step %ld\n", m->step, m->step, m->optimizer_steps,
           m->lr_schedule_step);
    printf("  random state: seed %llu (counter-based: seed and step are the whole state)\n",
           (unsigned long long)m->seed);
    if (m->train_checksum)
        printf("  training data checksum: %016llx\n", (unsigned long long)m->train_checksum);
    printf("  world: %d stage%s x %d replica%s = %d ranks; layout ", m->pp,
           m->pp == 1 ? "" : "s", m->dp, m->dp == 1 ? "" : "s", m->pp * m->dp);
    print_counts(stdout, m->layout, m->pp);
    printf(" blocks per stage\n  data cursors (next sample of each replica): ");
    for (int d = 0; d < m->dp; d++) printf(d ? ", %ld" : "%ld", m->data_cursor[d]);
    printf("\n  layout history:\n");
    for (int k = 0; k < m->history.count; k++) {
        printf("    from step %-8ld ", m->history.step[k]);
        print_counts(stdout, layout_history_entry(&m->history, k), m->history.stages[k]);
        printf("\n");
    }
    if (m->dyn_state_count > 0)
        printf("  scheme state: dyn.kind = %s, %ld values (/dyn/state)\n", m->dyn_kind,
               m->dyn_state_count);
    print_checkpoint_blocks(m);
}

/* The scheme's saved state (/dyn): its kind and how many values. */
static json_object *dyn_state_json(const struct ckpt_meta *m)
{
    json_object *dyn = checked(json_object_new_object());
    put(dyn, "kind", checked(json_object_new_string(m->dyn_kind)));
    put(dyn, "values", integer(m->dyn_state_count));
    return dyn;
}

static void print_checkpoint_json(const char *path, const struct ckpt_meta *m)
{
    const struct gpt_shape *s = &m->shape;
    size_t block_params = block_param_count(s->channels);
    json_object *o = checked(json_object_new_object());
    put(o, "file", string(path));
    put(o, "kind", string(CHECKPOINT_KIND));
    put(o, "dynmo_version", string(m->dynmo_version));
    put(o, "created", string(m->created));
    put(o, "schema_version", integer(m->schema_version));
    json_object *model = checked(json_object_new_object());
    const struct { const char *key; long long value; } sizes[] = {
        {"layers", s->layers}, {"channels", s->channels}, {"heads", s->heads},
        {"vocab", gpt_vocab_used(s)}, {"vocab_rows", s->vocab}, {"max_seq", s->max_seq},
        {"parameters", (long long)gpt_param_count(s)}, {"block_params", (long long)block_params}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        put(model, sizes[i].key, integer(sizes[i].value));
    put(o, "model", model);
    put(o, "step", integer(m->step));
    put(o, "optimizer_steps", integer(m->optimizer_steps));
    put(o, "lr_schedule_step", integer(m->lr_schedule_step));
    put(o, "seed", checked(json_object_new_uint64(m->seed)));
    put(o, "train_checksum", checked(json_object_new_uint64(m->train_checksum)));
    json_object *world = checked(json_object_new_object());
    put(world, "pp", integer(m->pp));
    put(world, "dp", integer(m->dp));
    put(world, "ranks", integer(m->pp * m->dp));
    put(o, "world", world);
    put(o, "layout", int_array(m->layout, m->pp));
    json_object *cursors = checked(json_object_new_array());
    for (int d = 0; d < m->dp; d++) json_object_array_add(cursors, integer(m->data_cursor[d]));
    put(o, "data_cursors", cursors);
    json_object *history = checked(json_object_new_array());
    for (int k = 0; k < m->history.count; k++) {
        json_object *entry = checked(json_object_new_object());
        put(entry, "step", integer(m->history.step[k]));
        put(entry, "layout", int_array(layout_history_entry(&m->history, k),
                                       m->history.stages[k]));
        json_object_array_add(history, entry);
    }
    put(o, "layout_history", history);
    if (m->dyn_state_count > 0) put(o, "dyn_state", dyn_state_json(m));
    json_object *blocks = checked(json_object_new_array());
    for (int i = 0; i < s->layers; i++) {
        json_object *b = checked(json_object_new_object());
        put(b, "layer", integer(i));
        put(b, "stage", integer(stage_of(m->layout, m->pp, i)));
        put(b, "bytes", integer((long long)(3 * gpt_block_param_count(s, i) * 4)));
        put(b, "sparsity", number(m->sparsity[i]));
        put(b, "frozen", checked(json_object_new_boolean(m->frozen[i] != 0)));
        json_object_array_add(blocks, b);
    }
    put(o, "blocks", blocks);
    put(o, "config", string(m->config_text));
    print_and_free(o);
}

static int inspect_checkpoint(const char *path, int json)
{
    struct ckpt_meta meta;
    char err[1024];
    if (ckpt_read_info(path, &meta, err, sizeof err) != 0)
        dm_user_error("inspect: %s (run `dynmo check-ckpt %s` for every problem)", err, path);
    if (json) print_checkpoint_json(path, &meta);
    else print_checkpoint_text(path, &meta);
    ckpt_meta_free(&meta);
    return DM_EXIT_OK;
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return DM_EXIT_OK;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            usage(stderr);
            dm_user_error("inspect: unknown option '%s'", argv[i]);
        } else if (path) {
            usage(stderr);
            dm_user_error("inspect: one FILE only (got '%s' and '%s')", path, argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        dm_user_error("inspect: missing FILE (a run log such as RUN_DIR/" RUNLOG_FILE_NAME
                      " or a checkpoint such as CKPT_DIR/ckpt-100.h5)");
    }

    char kind[64], err[1024];
    if (dm_file_kind(path, kind, sizeof kind, err, sizeof err) != 0)
        dm_user_error("inspect: %s", err);
    if (!strcmp(kind, CHECKPOINT_KIND)) return inspect_checkpoint(path, json);
    if (strcmp(kind, RUNLOG_KIND) != 0 && strcmp(kind, SIMULATION_KIND) != 0) {
        if (kind[0])
            dm_user_error("inspect: %s is an HDF5 file of unknown kind \"%s\" (expected "
                          "a dynmo run log)", path, kind);
        dm_user_error("inspect: %s is an HDF5 file but not a dynmo run log or checkpoint "
                      "(its root group has no \"kind\" attribute)", path);
    }

    struct summary s;
    load_summary(&s, path);
    s.simulated = !strcmp(kind, SIMULATION_KIND);
    if (json) print_json(&s);
    else print_text(&s);
    free_summary(&s);
    return DM_EXIT_OK;
}
