/* The run log's read side: a run log (or a simulation's file, or any file
 * shaped like one) opened once and read through checked paths, for the
 * tools (inspect, report, trace, simulate, plan --from-run) and the
 * trainer's resume.
 *
 * Before HDF5 reads any of it, the file's metadata is walked byte by byte
 * (dm_h5_check_metadata, in dm_h5_open_readonly): HDF5 1.10 would crash,
 * loop or allocate without limit on damaged metadata. Then every dataset
 * is listed with its type and shape, and those of the schema
 * (docs/runlog.md) must have their rank, columns and a numeric type; every
 * read checks the name, rank and size against that listing; the
 * configuration is parsed with the config module's own checks; the layout
 * history's rows are checked to be layouts of model.layers blocks. A
 * problem is -1 with one message naming the file and the problem, never a
 * crash. It never writes. The writer is runlog.c. */
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "ckpt/h5util.h"
#include "ckpt/runlog_list.h"

struct runlog_file {
    char path[1024];
    hid_t file;
    char kind[32];                      /* root attribute kind, "" when absent */
    struct runlog_listing list;         /* sorted by name */
};

/* ---- the listing --------------------------------------------------------- */

/* The rank a dataset of the schema (docs/runlog.md, and the datasets of
 * docs/simulate.md's files) has, or 0 for a name outside it. */
static int schema_rank(const char *name)
{
    static const char *const series[] = {
        RUNLOG_STEP_LOSS, RUNLOG_STEP_LR, RUNLOG_STEP_GRAD_NORM, RUNLOG_STEP_MS,
        RUNLOG_STEP_TOKENS_PER_S, RUNLOG_STEP_PEAK_RSS_MB, RUNLOG_STEP_RANKS,
        RUNLOG_STEP_BUBBLE, RUNLOG_STEP_IMBALANCE, RUNLOG_EVAL_STEP, RUNLOG_EVAL_LOSS,
        "/steps/migrate_ms"};
    static const char *const matrices[] = {
        RUNLOG_LAYER_FWD_MS, RUNLOG_LAYER_BWD_MS, RUNLOG_LAYER_UPDATE_MS, RUNLOG_LAYER_WGRAD_MS,
        RUNLOG_UNIT_FWD_MS, RUNLOG_UNIT_BWD_MS, RUNLOG_UNIT_UPDATE_MS, RUNLOG_UNIT_WGRAD_MS,
        RUNLOG_LAYOUT_HISTORY, RUNLOG_LAYOUT_CHUNKS, RUNLOG_STAGE_BUSY_MS, RUNLOG_STAGE_IDLE_MS,
        RUNLOG_STAGE_UPDATE_MS, RUNLOG_TRACE_EVENTS, RUNLOG_BALANCE_DECISIONS,
        "/layers/frozen", "/layers/tiles_share"};
    for (size_t i = 0; i < sizeof series / sizeof *series; i++)
        if (!strcmp(name, series[i])) return 1;
    for (size_t i = 0; i < sizeof matrices / sizeof *matrices; i++)
        if (!strcmp(name, matrices[i])) return 2;
    return dyn_signal_of_dataset(name) ? 2 : 0;   /* a scheme's signal: [steps, columns] */
}

static int fixed_columns(const char *name)
{
    return !strcmp(name, RUNLOG_TRACE_EVENTS) || !strcmp(name, RUNLOG_BALANCE_DECISIONS)
               ? RUNLOG_EVENT_COLUMNS : 0;
}

herr_t runlog_list_one(hid_t group, const char *name, const H5L_info_t *link, void *data)
{
    struct runlog_listing *f = data;
    if (link->type != H5L_TYPE_HARD) return 0;
    hid_t object = H5Oopen(group, name, H5P_DEFAULT);
    if (object < 0) return -1;
    if (H5Iget_type(object) != H5I_DATASET) {
        H5Oclose(object);
        return 0;
    }
    f->infos = dm_grow(f->infos, sizeof *f->infos, f->count, &f->capacity, 16);
    struct runlog_dataset_info *d = &f->infos[f->count++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "/%s", name);
    hid_t type = H5Dget_type(object), space = H5Dget_space(object);
    int status = type >= 0 && space >= 0 ? 0 : -1;
    if (status == 0) {
        H5T_class_t type_class = H5Tget_class(type);
        d->is_int = type_class == H5T_INTEGER;
        d->is_number = type_class == H5T_INTEGER || type_class == H5T_FLOAT;
        d->element_bytes = (int)H5Tget_size(type);
        d->rank = H5Sget_simple_extent_ndims(space);
        hsize_t dims[H5S_MAX_RANK] = {0};
        if (d->rank > 0) H5Sget_simple_extent_dims(space, dims, NULL);
        d->dims[0] = d->rank >= 1 ? (long)dims[0] : 1;
        d->dims[1] = d->rank == 2 ? (long)dims[1] : (d->rank == 1 ? 1 : 0);
        if (dims[0] > (hsize_t)LONG_MAX || (d->rank == 2 && dims[1] > (hsize_t)INT_MAX)) {
            d->rank = -1;   /* reported by check_listing */
            d->dims[0] = d->dims[1] = 0;
        }
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Oclose(object);
    return status;
}

static int compare_info_names(const void *a, const void *b)
{
    return strcmp(((const struct runlog_dataset_info *)a)->name,
                  ((const struct runlog_dataset_info *)b)->name);
}

/* The schema's datasets have their rank, a numeric type and, for the
 * events, their columns. Others are listed, and read only by rank. */
static int check_listing(const struct runlog_file *f, char *err, size_t errsize)
{
    for (int i = 0; i < f->list.count; i++) {
        const struct runlog_dataset_info *d = &f->list.infos[i];
        int rank = schema_rank(d->name), columns = fixed_columns(d->name);
        if (d->rank < 0) {
            dm_set_message(err, errsize, "%s: %s has more rows or columns than a run log can "
                           "hold", f->path, d->name);
            return -1;
        }
        if (rank && (d->rank != rank || !d->is_number)) {
            dm_set_message(err, errsize, "%s: %s is %s of rank %d; a run log's is numbers of "
                           "rank %d (docs/runlog.md)", f->path, d->name,
                           d->is_number ? "numbers" : "not numbers", d->rank, rank);
            return -1;
        }
        if (columns && d->dims[1] != columns) {
            dm_set_message(err, errsize, "%s: %s has %ld columns, a run log's has %d "
                           "(docs/runlog.md)", f->path, d->name, d->dims[1], columns);
            return -1;
        }
    }
    return 0;
}

/* ---- open and close ------------------------------------------------------ */

static int read_text_attr(struct runlog_file *f, const char *name, char **text, char *err,
                          size_t errsize)
{
    char inner[768];
    int status = dm_h5_read_attr_text(f->file, name, text, inner, sizeof inner);
    if (status < 0) dm_set_message(err, errsize, "%s: %s", f->path, inner);
    return status;
}

/* kind, if the file says one, is a run log's or a simulation's; a
 * format_version, if it gives one, is the one this dynmo reads. */
static int check_root(struct runlog_file *f, char *err, size_t errsize)
{
    char *text = NULL;
    int status = read_text_attr(f, "kind", &text, err, errsize);
    if (status < 0) return -1;
    if (status == 0 && strcmp(text, RUNLOG_KIND) != 0 && strcmp(text, SIMULATION_KIND) != 0) {
        dm_set_message(err, errsize, "%s is not a run log (root attribute kind is \"%.40s\", "
                       "expected \"%s\" or \"%s\")", f->path, text, RUNLOG_KIND,
                       SIMULATION_KIND);
        dm_free(text);
        return -1;
    }
    snprintf(f->kind, sizeof f->kind, "%s", text ? text : "");
    dm_free(text);
    text = NULL;
    status = read_text_attr(f, "format_version", &text, err, errsize);
    if (status < 0) return -1;
    if (status == 0 && strcmp(text, "1") != 0) {
        dm_set_message(err, errsize, "%s has run log format version %.40s; this dynmo reads "
                       "version %d", f->path, text, RUNLOG_FORMAT_VERSION);
        dm_free(text);
        return -1;
    }
    dm_free(text);
    return 0;
}

struct runlog_file *runlog_open_read(const char *path, char *err, size_t errsize)
{
    struct runlog_file *f = dm_alloc(sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->file = dm_h5_open_readonly(path, err, errsize);
    if (f->file < 0) {
        dm_free(f);
        return NULL;
    }
    if (dm_h5_newer_format(path)) {
        dm_set_message(err, errsize, "%s is not a run log: it is written in HDF5's newer file "
                       "format (as dynmo's checkpoints are), run logs in its default one", path);
        runlog_close_read(f);
        return NULL;
    }
    if (check_root(f, err, errsize) != 0) {
        runlog_close_read(f);
        return NULL;
    }
    if (H5Lvisit(f->file, H5_INDEX_NAME, H5_ITER_INC, runlog_list_one, &f->list) < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        dm_set_message(err, errsize, "%s: cannot list its datasets: %s", path, text);
        runlog_close_read(f);
        return NULL;
    }
    if (f->list.count > 1)
        qsort(f->list.infos, (size_t)f->list.count, sizeof *f->list.infos, compare_info_names);
    if (check_listing(f, err, errsize) != 0) {
        runlog_close_read(f);
        return NULL;
    }
    return f;
}

void runlog_close_read(struct runlog_file *f)
{
    if (!f) return;
    if (f->file >= 0) H5Fclose(f->file);
    dm_free(f->list.infos);
    dm_free(f);
}

void runlog_file_fail(struct runlog_file *f, const char *prefix, const char *fmt, ...)
{
    char text[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    runlog_close_read(f);
    dm_user_error("%s: %s", prefix, text);
}

const char *runlog_file_path(const struct runlog_file *f) { return f->path; }
const char *runlog_file_kind(const struct runlog_file *f) { return f->kind; }

int runlog_file_list(const struct runlog_file *f, const struct runlog_dataset_info **infos)
{
    *infos = f->list.infos;
    return f->list.count;
}

const struct runlog_dataset_info *runlog_file_dataset(const struct runlog_file *f,
                                                      const char *name)
{
    struct runlog_dataset_info key;
    snprintf(key.name, sizeof key.name, "%s", name);
    if (!f->list.count) return NULL;
    return bsearch(&key, f->list.infos, (size_t)f->list.count, sizeof *f->list.infos,
                   compare_info_names);
}

long runlog_file_steps(const struct runlog_file *f)
{
    long steps = 0;
    for (int i = 0; i < f->list.count; i++)
        if (!strncmp(f->list.infos[i].name, "/steps/", 7) && f->list.infos[i].dims[0] > steps)
            steps = f->list.infos[i].dims[0];
    return steps;
}

/* ---- datasets ------------------------------------------------------------ */

/* The listed dataset `name` of rank want_rank, open; -1 with err set. */
static hid_t open_listed(const struct runlog_file *f, const char *name, int want_rank,
                         const struct runlog_dataset_info **info, char *err, size_t errsize)
{
    *info = runlog_file_dataset(f, name);
    if (!*info) {
        dm_set_message(err, errsize, "%s has no dataset %s", f->path, name);
        return -1;
    }
    if ((*info)->rank != want_rank) {
        dm_set_message(err, errsize, "%s: %s has rank %d, expected %d", f->path, name,
                       (*info)->rank, want_rank);
        return -1;
    }
    if (!(*info)->is_number) {
        dm_set_message(err, errsize, "%s: %s holds no numbers", f->path, name);
        return -1;
    }
    if ((*info)->dims[1] > 0 && (*info)->dims[0] > RUNLOG_MAX_CELLS / (*info)->dims[1]) {
        dm_set_message(err, errsize, "%s: %s has %ld x %ld cells, more than a reader takes "
                       "(%ld)", f->path, name, (*info)->dims[0], (*info)->dims[1],
                       (long)RUNLOG_MAX_CELLS);
        return -1;
    }
    hid_t dataset = H5Dopen2(f->file, name, H5P_DEFAULT);
    if (dataset < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        dm_set_message(err, errsize, "%s: %s is not a readable dataset: %s", f->path, name,
                       text);
    }
    return dataset;
}

static long read_whole(struct runlog_file *f, const char *name, int want_rank,
                       hid_t memory_type, void **values, int *ncols, char *err, size_t errsize)
{
    *values = NULL;
    const struct runlog_dataset_info *d;
    hid_t dataset = open_listed(f, name, want_rank, &d, err, errsize);
    if (dataset < 0) return -1;
    long result = -1;
    size_t count = (size_t)d->dims[0] * (size_t)d->dims[1];
    *values = dm_alloc(count * 4);
    if (count > 0 &&
        H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, *values) < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        dm_set_message(err, errsize, "%s: cannot read %s: %s", f->path, name, text);
        dm_free(*values);
        *values = NULL;
    } else {
        if (ncols) *ncols = (int)d->dims[1];
        result = d->dims[0];
    }
    H5Dclose(dataset);
    return result;
}

long runlog_file_series(struct runlog_file *f, const char *name, float **values, char *err,
                        size_t errsize)
{
    return read_whole(f, name, 1, H5T_NATIVE_FLOAT, (void **)values, NULL, err, errsize);
}

long runlog_file_int_series(struct runlog_file *f, const char *name, int **values, char *err,
                            size_t errsize)
{
    return read_whole(f, name, 1, H5T_NATIVE_INT, (void **)values, NULL, err, errsize);
}

long runlog_file_matrix(struct runlog_file *f, const char *name, float **values, int *ncols,
                        char *err, size_t errsize)
{
    return read_whole(f, name, 2, H5T_NATIVE_FLOAT, (void **)values, ncols, err, errsize);
}

long runlog_file_int_matrix(struct runlog_file *f, const char *name, int **values, int *ncols,
                            char *err, size_t errsize)
{
    return read_whole(f, name, 2, H5T_NATIVE_INT, (void **)values, ncols, err, errsize);
}

int runlog_file_row(struct runlog_file *f, const char *name, long row, float *out, int ncols,
                    char *err, size_t errsize)
{
    const struct runlog_dataset_info *d;
    hid_t dataset = open_listed(f, name, 2, &d, err, errsize);
    if (dataset < 0) return -1;
    int status = -1;
    hid_t file_space = -1, memory_space = -1;
    long rows = d->dims[0];
    long index = row < 0 ? rows + row : row;
    if (index < 0 || index >= rows) {
        dm_set_message(err, errsize, "%s: row %ld of %s is out of range (it has %ld rows)",
                       f->path, row, name, rows);
        goto done;
    }
    if (d->dims[1] != ncols) {
        dm_set_message(err, errsize, "%s: %s has %ld columns, the caller expected %d", f->path,
                       name, d->dims[1], ncols);
        goto done;
    }
    hsize_t start[2] = {(hsize_t)index, 0}, count[2] = {1, (hsize_t)ncols};
    hsize_t row_dims[1] = {(hsize_t)ncols};
    file_space = DM_H5_TRY(H5Dget_space(dataset), err, errsize, failed);
    DM_H5_TRY(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, count, NULL), err,
              errsize, failed);
    memory_space = DM_H5_TRY(H5Screate_simple(1, row_dims, NULL), err, errsize, failed);
    DM_H5_TRY(H5Dread(dataset, H5T_NATIVE_FLOAT, memory_space, file_space, H5P_DEFAULT, out),
              err, errsize, failed);
    status = 0;
    goto done;
failed: {
        char inner[1024];
        snprintf(inner, sizeof inner, "%s", err);
        dm_set_message(err, errsize, "%s: cannot read row %ld of %s: %s", f->path, row, name,
                       inner);
    }
done:
    if (memory_space >= 0) H5Sclose(memory_space);
    if (file_space >= 0) H5Sclose(file_space);
    H5Dclose(dataset);
    return status;
}

/* ---- root attributes ------------------------------------------------------ */

int runlog_file_attr(struct runlog_file *f, const char *name, char **text, char *err,
                     size_t errsize)
{
    return read_text_attr(f, name, text, err, errsize);
}

/* A numeric root attribute array (integers only when `integers`),
 * converted to `type` (entries of `size` bytes). */
static long read_attr_array(struct runlog_file *f, const char *name, int integers, hid_t type,
                            size_t size, void **values, char *err, size_t errsize)
{
    *values = NULL;
    long count = -1;
    hid_t attr = -1, space = -1, stored = -1;
    htri_t exists = H5Aexists(f->file, name);
    if (exists < 0) goto failed;
    if (!exists) return 0;
    attr = H5Aopen(f->file, name, H5P_DEFAULT);
    stored = attr >= 0 ? H5Aget_type(attr) : -1;
    space = attr >= 0 ? H5Aget_space(attr) : -1;
    if (stored < 0 || space < 0) goto failed;
    H5T_class_t kind = H5Tget_class(stored);
    hssize_t points = H5Sget_simple_extent_npoints(space);
    if ((kind != H5T_INTEGER && (integers || kind != H5T_FLOAT)) ||
        H5Sget_simple_extent_ndims(space) > 1) {
        dm_set_message(err, errsize, "%s: attribute %s is not an array of %s", f->path, name,
                       integers ? "integers" : "numbers");
        goto done;
    }
    if (points < 0 || points > RUNLOG_MAX_ATTR) {
        dm_set_message(err, errsize, "%s: attribute %s has %lld entries (at most %d)", f->path,
                       name, (long long)points, RUNLOG_MAX_ATTR);
        goto done;
    }
    void *buffer = dm_alloc((size_t)(points > 0 ? points : 1) * size);
    if (H5Aread(attr, type, buffer) < 0) {
        dm_free(buffer);
        goto failed;
    }
    *values = buffer;
    count = (long)points;
    goto done;
failed: {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        dm_set_message(err, errsize, "%s: cannot read attribute %s: %s", f->path, name, text);
    }
done:
    if (space >= 0) H5Sclose(space);
    if (stored >= 0) H5Tclose(stored);
    if (attr >= 0) H5Aclose(attr);
    return count;
}

long runlog_file_attr_ints(struct runlog_file *f, const char *name, int **values, char *err,
                           size_t errsize)
{
    return read_attr_array(f, name, 1, H5T_NATIVE_INT, sizeof(int), (void **)values, err,
                           errsize);
}

long runlog_file_attr_doubles(struct runlog_file *f, const char *name, double **values,
                              char *err, size_t errsize)
{
    return read_attr_array(f, name, 0, H5T_NATIVE_DOUBLE, sizeof(double), (void **)values, err,
                           errsize);
}

/* ---- the configuration ----------------------------------------------------- */

/* What the readers compute with, beyond each key's own range: the
 * schemes' relations (dyn_check_log_config; relations the readers never
 * divide or index by are not checked: a simulation's config, written for
 * its own shape, need not satisfy training's). */
static int check_config(const struct dm_config *c, char *problem, size_t size)
{
    return dyn_check_log_config(c, problem, size);
}

int runlog_file_config(struct runlog_file *f, struct dm_config *cfg, char *err, size_t errsize)
{
    config_defaults(cfg);
    char *text = NULL;
    int status = read_text_attr(f, "config", &text, err, errsize);
    if (status != 0) return status;
    char problem[768];
    status = config_parse_printed(cfg, text, "its configuration (root attribute config)",
                                  problem, sizeof problem);
    if (status != 0) dm_set_message(err, errsize, "%s: %s", f->path, problem);
    dm_free(text);
    if (status == 0 && check_config(cfg, problem, sizeof problem) != 0) {
        dm_set_message(err, errsize, "%s: its configuration (root attribute config): %s",
                       f->path, problem);
        status = -1;
    }
    return status;
}

/* ---- the layout history ---------------------------------------------------- */

void runlog_layouts_free(struct runlog_layouts *l)
{
    dm_free(l->counts);
    dm_free(l->stages);
    memset(l, 0, sizeof *l);
}

/* Row r: a filler row (all 0), or S >= 1 stages of >= 1 block each, then
 * zeros, summing to `layers`. Sets *stages; -1 with err naming the row. */
static int check_layout_row(const struct runlog_file *f, const int *row, int width, long r,
                            int layers, int *stages, char *err, size_t errsize)
{
    int S = 0;
    long total = 0;
    while (S < width && row[S] != 0) {
        if (row[S] < 0 || row[S] > layers) {
            dm_set_message(err, errsize, "%s: %s row %ld (step %ld) places %d blocks on stage "
                           "%d; a layout of model.layers = %d blocks places 1 to %d on each "
                           "stage", f->path, RUNLOG_LAYOUT_HISTORY, r, r + 1, row[S], S,
                           layers, layers);
            return -1;
        }
        total += row[S++];
    }
    for (int s = S; s < width; s++)
        if (row[s] != 0) {
            dm_set_message(err, errsize, "%s: %s row %ld (step %ld) places %d blocks on stage "
                           "%d after an empty stage %d", f->path, RUNLOG_LAYOUT_HISTORY, r,
                           r + 1, row[s], s, S);
            return -1;
        }
    if (S > 0 && total != layers) {
        dm_set_message(err, errsize, "%s: %s row %ld (step %ld) places %ld blocks in all, but "
                       "the model has %d (model.layers)", f->path, RUNLOG_LAYOUT_HISTORY, r,
                       r + 1, total, layers);
        return -1;
    }
    *stages = S;
    return 0;
}

int runlog_file_layouts(struct runlog_file *f, int layers, struct runlog_layouts *out,
                        char *err, size_t errsize)
{
    memset(out, 0, sizeof *out);
    if (!runlog_file_dataset(f, RUNLOG_LAYOUT_HISTORY)) return 1;
    out->rows = runlog_file_int_matrix(f, RUNLOG_LAYOUT_HISTORY, &out->counts, &out->width,
                                       err, errsize);
    if (out->rows < 0) return -1;
    if (out->rows > 0 && out->width < 1) {
        dm_set_message(err, errsize, "%s: %s has no columns", f->path, RUNLOG_LAYOUT_HISTORY);
        runlog_layouts_free(out);
        return -1;
    }
    out->stages = dm_alloc((size_t)(out->rows ? out->rows : 1) * sizeof *out->stages);
    /* Without model.layers, the first layout's total is the model's. */
    for (long r = 0; layers <= 0 && r < out->rows; r++) {
        long total = 0;
        for (int s = 0; s < out->width && out->counts[r * out->width + s] > 0; s++)
            total += out->counts[r * out->width + s];
        if (total > 0) layers = total > RUNLOG_MAX_LAYERS ? RUNLOG_MAX_LAYERS : (int)total;
    }
    out->layers = layers;
    for (long r = 0; r < out->rows; r++)
        if (check_layout_row(f, out->counts + r * out->width, out->width, r, layers,
                             &out->stages[r], err, errsize) != 0) {
            runlog_layouts_free(out);
            return -1;
        }
    return 0;
}

/* ---- one-call readers by path ------------------------------------------------ */

long runlog_read_series(const char *path, const char *name, float **values, char *err,
                        size_t errsize)
{
    *values = NULL;
    struct runlog_file *f = runlog_open_read(path, err, errsize);
    long n = f ? runlog_file_series(f, name, values, err, errsize) : -1;
    runlog_close_read(f);
    return n;
}

long runlog_read_matrix(const char *path, const char *name, float **values, int *ncols,
                        char *err, size_t errsize)
{
    *values = NULL;
    struct runlog_file *f = runlog_open_read(path, err, errsize);
    long n = f ? runlog_file_matrix(f, name, values, ncols, err, errsize) : -1;
    runlog_close_read(f);
    return n;
}

long runlog_read_int_matrix(const char *path, const char *name, int **values, int *ncols,
                            char *err, size_t errsize)
{
    *values = NULL;
    struct runlog_file *f = runlog_open_read(path, err, errsize);
    long n = f ? runlog_file_int_matrix(f, name, values, ncols, err, errsize) : -1;
    runlog_close_read(f);
    return n;
}

int runlog_read_row(const char *path, const char *name, long row, float *out, int ncols,
                    char *err, size_t errsize)
{
    struct runlog_file *f = runlog_open_read(path, err, errsize);
    int status = f ? runlog_file_row(f, name, row, out, ncols, err, errsize) : -1;
    runlog_close_read(f);
    return status;
}

int runlog_list_datasets(const char *path, struct runlog_dataset_info **infos, char *err,
                         size_t errsize)
{
    *infos = NULL;
    struct runlog_file *f = runlog_open_read(path, err, errsize);
    if (!f) return -1;
    int count = f->list.count;
    *infos = dm_alloc((size_t)(count ? count : 1) * sizeof **infos);
    if (count) memcpy(*infos, f->list.infos, (size_t)count * sizeof **infos);
    runlog_close_read(f);
    return count;
}

int runlog_read_root_attr(const char *path, const char *attr, char **text, char *err,
                          size_t errsize)
{
    *text = NULL;
    struct runlog_file *f = runlog_open_read(path, err, errsize);
    int status = f ? runlog_file_attr(f, attr, text, err, errsize) : -1;
    runlog_close_read(f);
    return status;
}

int dm_file_kind(const char *path, char *kind, size_t kindsize, char *err, size_t errsize)
{
    hid_t file = dm_h5_open_readonly(path, err, errsize);
    if (file < 0) return -1;
    char *text = NULL, inner[768];
    int status = dm_h5_read_attr_text(file, "kind", &text, inner, sizeof inner);
    H5Fclose(file);
    if (status < 0) {
        dm_set_message(err, errsize, "%s: %s", path, inner);
        return -1;
    }
    snprintf(kind, kindsize, "%s", text ? text : "");
    dm_free(text);
    return 0;
}
