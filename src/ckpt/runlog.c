/* The run log: one HDF5 file per run holding per-step metrics, per-layer
 * profiles and the layout history as extendible 1-D and 2-D datasets
 * (docs/runlog.md). Rank 0 writes it serially through the default (sec2)
 * driver and flushes after every step so that a killed run keeps what it
 * finished. Appends are cheap because each dataset's handle and dataspaces
 * stay open in a small cache for the life of the handle.
 *
 * It must not call MPI, and it must not decide what is logged: the trainer
 * chooses the series; this file only stores them. The read side is
 * runlog_read.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "ckpt/h5util.h"
#include "ckpt/runlog_list.h"

/* Elements per chunk: small enough that the per-step flush rewrites little,
 * large enough that a long run's chunk index stays small. */
#define CHUNK_ELEMENTS 1024
#define NAME_MAX_BYTES 256

struct runlog_dataset {
    char name[NAME_MAX_BYTES];
    unsigned long name_hash;
    hid_t dataset;
    hid_t file_space;    /* resized to the current extent on each append */
    hid_t memory_space;  /* (ncols) */
    int is_int;
    int rank;            /* 1 or 2 */
    int ncols;           /* 1 for a series */
    hsize_t rows;
};

struct runlog {
    char path[1024];
    hid_t file;
    struct runlog_dataset *datasets;  /* (count), grown by doubling */
    int count;
    long capacity;
    long steps;   /* rows every per-step dataset holds (runlog_end_step) */
};

/* Rows are steps in every dataset but these, whose rows are events. */
static int rows_are_steps(const char *name)
{
    return strncmp(name, "/eval/", 6) != 0 && strcmp(name, RUNLOG_TRACE_EVENTS) != 0 &&
           strcmp(name, RUNLOG_BALANCE_DECISIONS) != 0;
}

/* What a cell holds where nothing was measured (a step before a resume in
 * a new run.out_dir, a stage past a re-pack, a dataset the resumed run does
 * not write): NaN, or for integers 0 (no blocks on that stage, no ranks),
 * or what a scheme's signal declares (-1 for counts where 0 is a count). */
static int int_filler(const char *name)
{
    const struct dyn_signal *signal = dyn_signal_of_dataset(name);
    return signal ? signal->filler : 0;
}

static unsigned long fnv1a_of_name(const char *name)
{
    unsigned long h = 1469598103934665603UL;
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211UL;
    return h;
}

static void check_name(const char *name)
{
    size_t n = strlen(name);
    if (name[0] != '/' || n < 2 || n >= NAME_MAX_BYTES || name[n - 1] == '/')
        DM_FATAL("run log dataset name \"%s\" must be an absolute path like "
                 "\"/steps/loss\" shorter than %d bytes", name, NAME_MAX_BYTES);
}


static void iso_time_now(char *buf, size_t size)
{
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &utc);
}

static struct runlog *runlog_new(const char *path, hid_t file)
{
    struct runlog *log = dm_alloc(sizeof *log);
    snprintf(log->path, sizeof log->path, "%s", path);
    log->file = file;
    log->capacity = 16;
    log->datasets = dm_alloc((size_t)log->capacity * sizeof *log->datasets);
    return log;
}

struct runlog *runlog_create(const char *path, const struct dm_config *cfg)
{
    return runlog_create_kind(path, cfg, RUNLOG_KIND);
}

struct runlog *runlog_create_kind(const char *path, const struct dm_config *cfg,
                                  const char *kind)
{
    dm_h5_init();
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        dm_user_error_local("cannot create the run log %s (check that its directory "
                            "exists and is writable): %s", path, text);
    }
    size_t config_bytes = 1 << 16;
    char *config_text = dm_alloc(config_bytes);
    config_print(cfg, config_text, config_bytes);
    char created[64];
    iso_time_now(created, sizeof created);
    dm_h5_write_string_attr(file, "kind", kind);
    dm_h5_write_int_attr(file, "format_version", RUNLOG_FORMAT_VERSION);
    dm_h5_write_string_attr(file, "dynmo_version", DYNMO_VERSION);
    dm_h5_write_string_attr(file, "created", created);
    dm_h5_write_string_attr(file, "config", config_text);
    dm_free(config_text);
    DM_H5(H5Fflush(file, H5F_SCOPE_LOCAL));
    return runlog_new(path, file);
}

static void write_array_attr(hid_t loc, const char *name, hid_t file_type, hid_t mem_type,
                             int n, const void *values)
{
    if (H5Aexists(loc, name) > 0) DM_H5(H5Adelete(loc, name));
    if (n == 0) return;
    hsize_t dims[1] = {(hsize_t)n};
    hid_t space = DM_H5(H5Screate_simple(1, dims, NULL));
    hid_t attr = DM_H5(H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT));
    DM_H5(H5Awrite(attr, mem_type, values));
    DM_H5(H5Aclose(attr));
    DM_H5(H5Sclose(space));
}

void runlog_set_sharing(struct runlog *log, int stages, const int *group, int groups,
                        const double *cores, const double *shares, int turns)
{
    write_array_attr(log->file, RUNLOG_ATTR_GROUP_TURNS, H5T_STD_I32LE, H5T_NATIVE_INT,
                     groups ? 1 : 0, &turns);
    write_array_attr(log->file, RUNLOG_ATTR_STAGE_GROUPS, H5T_STD_I32LE, H5T_NATIVE_INT,
                     groups ? stages : 0, group);
    write_array_attr(log->file, RUNLOG_ATTR_GROUP_CORES, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                     groups, cores);
    write_array_attr(log->file, RUNLOG_ATTR_GROUP_SHARES, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                     shares ? groups : 0, shares);
}

struct runlog *runlog_open_append(const char *path)
{
    char err[1024], kind[64];
    if (dm_file_kind(path, kind, sizeof kind, err, sizeof err) != 0)
        dm_user_error_local("cannot reopen the run log: %s", err);
    if (strcmp(kind, RUNLOG_KIND) != 0)
        dm_user_error_local("%s is not a dynmo run log (root attribute kind is "
                            "\"%s\", expected \"%s\")", path, kind, RUNLOG_KIND);
    char *version = NULL;
    int status = runlog_read_root_attr(path, "format_version", &version, err, sizeof err);
    if (status < 0) dm_user_error_local("cannot reopen the run log: %s", err);
    if (status > 0) dm_user_error_local("%s: no format_version attribute", path);
    long format = strtol(version, NULL, 10);
    dm_free(version);
    if (format != RUNLOG_FORMAT_VERSION)
        dm_user_error_local("%s has run log format version %ld; this dynmo appends to "
                            "version %d only (start a new run directory)", path, format,
                            RUNLOG_FORMAT_VERSION);
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (file < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        dm_user_error_local("cannot reopen the run log %s for writing (is another "
                            "run writing it?): %s", path, text);
    }
    return runlog_new(path, file);
}

static struct runlog_dataset *find_dataset(struct runlog *log, const char *name,
                                           unsigned long hash)
{
    for (int i = 0; i < log->count; i++) {
        struct runlog_dataset *d = &log->datasets[i];
        if (d->name_hash == hash && strcmp(d->name, name) == 0) return d;
    }
    return NULL;
}

static struct runlog_dataset *add_slot(struct runlog *log)
{
    log->datasets = dm_grow(log->datasets, sizeof *log->datasets, log->count, &log->capacity, 16);
    struct runlog_dataset *d = &log->datasets[log->count++];
    memset(d, 0, sizeof *d);
    return d;
}

static void create_dataset(struct runlog *log, struct runlog_dataset *d)
{
    hsize_t dims[2] = {0, (hsize_t)d->ncols};
    hsize_t maxdims[2] = {H5S_UNLIMITED, H5S_UNLIMITED};
    hsize_t chunk_rows = CHUNK_ELEMENTS / (hsize_t)d->ncols;
    hsize_t chunk[2] = {chunk_rows ? chunk_rows : 1, (hsize_t)d->ncols};
    hid_t space = DM_H5(H5Screate_simple(d->rank, dims, maxdims));
    hid_t dcpl = DM_H5(H5Pcreate(H5P_DATASET_CREATE));
    DM_H5(H5Pset_chunk(dcpl, d->rank, chunk));
    hid_t lcpl = DM_H5(H5Pcreate(H5P_LINK_CREATE));
    DM_H5(H5Pset_create_intermediate_group(lcpl, 1));
    hid_t file_type = d->is_int ? H5T_STD_I32LE : H5T_IEEE_F32LE;
    d->dataset = DM_H5(H5Dcreate2(log->file, d->name, file_type, space, lcpl,
                                  dcpl, H5P_DEFAULT));
    DM_H5(H5Pclose(lcpl));
    DM_H5(H5Pclose(dcpl));
    DM_H5(H5Sclose(space));
    d->rows = 0;
}

static void open_existing_dataset(struct runlog *log, struct runlog_dataset *d)
{
    d->dataset = DM_H5(H5Dopen2(log->file, d->name, H5P_DEFAULT));
    hid_t type = DM_H5(H5Dget_type(d->dataset));
    H5T_class_t type_class = H5Tget_class(type);
    DM_H5(H5Tclose(type));
    hid_t space = DM_H5(H5Dget_space(d->dataset));
    int rank = DM_H5(H5Sget_simple_extent_ndims(space));
    hsize_t dims[2] = {0, 1};
    if (rank == 1 || rank == 2) DM_H5(H5Sget_simple_extent_dims(space, dims, NULL));
    DM_H5(H5Sclose(space));
    int is_int = type_class == H5T_INTEGER;
    if ((type_class != H5T_INTEGER && type_class != H5T_FLOAT) || rank != d->rank ||
        is_int != d->is_int || (rank == 2 && dims[1] < 1))
        DM_FATAL("run log %s: appending %s %s of %d columns to %s, which holds "
                 "%s data of rank %d with %d columns", log->path,
                 d->is_int ? "int" : "float", d->rank == 1 ? "values" : "rows",
                 d->ncols, d->name, is_int ? "int" : "float", rank,
                 rank == 2 ? (int)dims[1] : 1);
    d->rows = dims[0];
    d->ncols = rank == 2 ? (int)dims[1] : 1;   /* rows of other widths: append adapts them */
}

/* (Re)makes the cached dataspaces of d for its rows and columns. */
static void reset_spaces(struct runlog_dataset *d)
{
    if (d->file_space > 0) DM_H5(H5Sclose(d->file_space));
    if (d->memory_space > 0) DM_H5(H5Sclose(d->memory_space));
    hsize_t dims[2] = {d->rows, (hsize_t)d->ncols};
    d->file_space = DM_H5(H5Screate_simple(d->rank, dims, NULL));
    hsize_t row_dims[1] = {(hsize_t)d->ncols};
    d->memory_space = DM_H5(H5Screate_simple(1, row_dims, NULL));
}

/* Writes `count` rows of `ncols` cells (native int or float) at row `first`
 * of d, extending it to first + count rows. */
static void write_rows(struct runlog_dataset *d, hsize_t first, hsize_t count, const void *rows)
{
    hsize_t dims[2] = {first + count, (hsize_t)d->ncols};
    DM_H5(H5Dset_extent(d->dataset, dims));
    hid_t file_space = DM_H5(H5Screate_simple(d->rank, dims, NULL));
    hsize_t start[2] = {first, 0}, block[2] = {count, (hsize_t)d->ncols};
    DM_H5(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, block, NULL));
    hid_t memory_space = DM_H5(H5Screate_simple(d->rank, block, NULL));
    DM_H5(H5Dwrite(d->dataset, d->is_int ? H5T_NATIVE_INT : H5T_NATIVE_FLOAT, memory_space,
                   file_space, H5P_DEFAULT, rows));
    DM_H5(H5Sclose(memory_space));
    DM_H5(H5Sclose(file_space));
    if (first + count > d->rows) d->rows = first + count;
}

/* `count` cells of d's filler at `cells` (4-byte ints or floats). */
static void fill_cells(const struct runlog_dataset *d, void *cells, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (d->is_int) ((int *)cells)[i] = int_filler(d->name);
        else ((float *)cells)[i] = NAN;
    }
}

/* Filler rows until d holds `rows` rows (a few thousand at a time). */
static void fill_to(struct runlog_dataset *d, hsize_t rows)
{
    if (d->rows >= rows) return;
    hsize_t block = CHUNK_ELEMENTS * 4 / (hsize_t)d->ncols;
    if (block < 1) block = 1;
    if (block > rows - d->rows) block = rows - d->rows;
    void *buffer = dm_alloc((size_t)(block * (hsize_t)d->ncols) * 4);
    fill_cells(d, buffer, (size_t)(block * (hsize_t)d->ncols));
    while (d->rows < rows) {
        hsize_t n = rows - d->rows < block ? rows - d->rows : block;
        write_rows(d, d->rows, n, buffer);
    }
    dm_free(buffer);
}

/* The cached dataset `name`, opened or created on first use, checked to be
 * of the requested kind. */
static struct runlog_dataset *get_dataset(struct runlog *log, const char *name,
                                          int is_int, int rank, int ncols)
{
    unsigned long hash = fnv1a_of_name(name);
    struct runlog_dataset *d = find_dataset(log, name, hash);
    if (d) {
        if (d->is_int != is_int || d->rank != rank || (rank == 1 && ncols != 1))
            DM_FATAL("run log %s: %s holds %s data of rank %d with %d columns; "
                     "append gave %s data of rank %d with %d columns", log->path,
                     name, d->is_int ? "int" : "float", d->rank, d->ncols,
                     is_int ? "int" : "float", rank, ncols);
        return d;
    }
    check_name(name);
    if (ncols < 1) DM_FATAL("run log %s: row of %d columns for %s", log->path, ncols, name);
    d = add_slot(log);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->name_hash = hash;
    d->is_int = is_int;
    d->rank = rank;
    d->ncols = ncols;
    if (dm_h5_path_exists(log->file, name)) {
        open_existing_dataset(log, d);
    } else {
        create_dataset(log, d);
        if (rows_are_steps(name)) fill_to(d, (hsize_t)log->steps);   /* row i is step i + 1 */
    }
    reset_spaces(d);
    return d;
}

/* d with `ncols` columns where it had fewer (more stages after a resume):
 * the dataset is made anew, its rows kept, the new cells filler. */
static void widen(struct runlog *log, struct runlog_dataset *d, int ncols)
{
    size_t old = (size_t)d->ncols, rows = (size_t)d->rows;
    void *cells = dm_alloc((rows ? rows : 1) * (size_t)ncols * 4);
    if (rows) {
        DM_H5(H5Dread(d->dataset, d->is_int ? H5T_NATIVE_INT : H5T_NATIVE_FLOAT, H5S_ALL,
                      H5S_ALL, H5P_DEFAULT, cells));
        for (size_t r = rows; r-- > 0;) {   /* spread in place, last row first */
            memmove((char *)cells + r * (size_t)ncols * 4, (char *)cells + r * old * 4, old * 4);
            fill_cells(d, (char *)cells + (r * (size_t)ncols + old) * 4, (size_t)ncols - old);
        }
    }
    DM_H5(H5Dclose(d->dataset));
    DM_H5(H5Ldelete(log->file, d->name, H5P_DEFAULT));
    d->ncols = ncols;
    create_dataset(log, d);
    if (rows) write_rows(d, 0, rows, cells);
    dm_free(cells);
    reset_spaces(d);
}

static void append(struct runlog *log, const char *name, int is_int, int rank,
                   const void *row, int ncols)
{
    DM_ASSERT(log != NULL && row != NULL);
    dm_h5_set_file_context(log->path);
    struct runlog_dataset *d = get_dataset(log, name, is_int, rank, ncols);
    if (ncols > d->ncols) widen(log, d, ncols);
    if (ncols < d->ncols) {   /* fewer stages than the log's widest: filler past them */
        void *wide = dm_alloc((size_t)d->ncols * 4);
        memcpy(wide, row, (size_t)ncols * 4);
        fill_cells(d, (char *)wide + (size_t)ncols * 4, (size_t)(d->ncols - ncols));
        write_rows(d, d->rows, 1, wide);
        dm_free(wide);
        return;
    }
    ncols = d->ncols;
    hsize_t dims[2] = {d->rows + 1, (hsize_t)ncols};
    DM_H5(H5Dset_extent(d->dataset, dims));
    DM_H5(H5Sset_extent_simple(d->file_space, rank, dims, NULL));
    hsize_t start[2] = {d->rows, 0};
    hsize_t count[2] = {1, (hsize_t)ncols};
    DM_H5(H5Sselect_hyperslab(d->file_space, H5S_SELECT_SET, start, NULL, count, NULL));
    DM_H5(H5Dwrite(d->dataset, is_int ? H5T_NATIVE_INT : H5T_NATIVE_FLOAT,
                   d->memory_space, d->file_space, H5P_DEFAULT, row));
    d->rows++;
}

void runlog_append_scalar(struct runlog *log, const char *name, float value)
{
    append(log, name, 0, 1, &value, 1);
}

void runlog_append_int_scalar(struct runlog *log, const char *name, int value)
{
    append(log, name, 1, 1, &value, 1);
}

void runlog_append_row(struct runlog *log, const char *name,
                       const float *row, int ncols)
{
    append(log, name, 0, 2, row, ncols);
}

void runlog_append_int_row(struct runlog *log, const char *name,
                           const int *row, int ncols)
{
    append(log, name, 1, 2, row, ncols);
}

long runlog_rows(struct runlog *log, const char *name)
{
    struct runlog_dataset *d = find_dataset(log, name, fnv1a_of_name(name));
    if (d) return (long)d->rows;
    if (!dm_h5_path_exists(log->file, name)) return -1;
    hid_t dataset = DM_H5(H5Dopen2(log->file, name, H5P_DEFAULT));
    hid_t space = DM_H5(H5Dget_space(dataset));
    hsize_t dims[2] = {0, 0};
    int rank = DM_H5(H5Sget_simple_extent_ndims(space));
    if (rank < 1 || rank > 2)
        DM_FATAL("run log %s: %s has rank %d, expected 1 or 2", log->path, name, rank);
    DM_H5(H5Sget_simple_extent_dims(space, dims, NULL));
    DM_H5(H5Sclose(space));
    DM_H5(H5Dclose(dataset));
    return (long)dims[0];
}

void runlog_truncate(struct runlog *log, const char *name, long rows)
{
    long current = runlog_rows(log, name);
    if (current < 0) DM_FATAL("run log %s: cannot truncate %s: no such dataset",
                              log->path, name);
    if (rows < 0 || rows > current)
        DM_FATAL("run log %s: cannot truncate %s of %ld rows to %ld rows",
                 log->path, name, current, rows);
    struct runlog_dataset *d = find_dataset(log, name, fnv1a_of_name(name));
    hid_t dataset = d ? d->dataset : DM_H5(H5Dopen2(log->file, name, H5P_DEFAULT));
    hid_t space = DM_H5(H5Dget_space(dataset));
    hsize_t dims[2] = {0, 0};
    DM_H5(H5Sget_simple_extent_dims(space, dims, NULL));
    DM_H5(H5Sclose(space));
    dims[0] = (hsize_t)rows;
    DM_H5(H5Dset_extent(dataset, dims));
    if (d) d->rows = (hsize_t)rows;
    else DM_H5(H5Dclose(dataset));
}

void runlog_resume_at(struct runlog *log, long start)
{
    DM_ASSERT(log != NULL && start >= 0);
    dm_h5_set_file_context(log->path);
    struct runlog_listing listing = {0};
    if (H5Lvisit(log->file, H5_INDEX_NAME, H5_ITER_INC, runlog_list_one, &listing) < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        dm_user_error_local("run log %s: cannot list its datasets to resume: %s", log->path,
                            text);
    }
    for (int i = 0; i < listing.count; i++) {
        const struct runlog_dataset_info *info = &listing.infos[i];
        if (!rows_are_steps(info->name) || info->element_bytes != 4 || info->rank < 1 ||
            info->rank > 2)
            continue;
        struct runlog_dataset *d = get_dataset(log, info->name, info->is_int, info->rank,
                                               info->rank == 2 ? (int)info->dims[1] : 1);
        if ((long)d->rows > start) runlog_truncate(log, info->name, start);
        fill_to(d, (hsize_t)start);
    }
    dm_free(listing.infos);
    log->steps = start;
}

void runlog_end_step(struct runlog *log)
{
    dm_h5_set_file_context(log->path);
    log->steps++;
    for (int i = 0; i < log->count; i++) {
        struct runlog_dataset *d = &log->datasets[i];
        if (rows_are_steps(d->name)) fill_to(d, (hsize_t)log->steps);
    }
}

void runlog_flush(struct runlog *log)
{
    dm_h5_set_file_context(log->path);
    DM_H5(H5Fflush(log->file, H5F_SCOPE_LOCAL));
}

void runlog_close(struct runlog *log)
{
    if (!log) return;
    dm_h5_set_file_context(log->path);
    for (int i = 0; i < log->count; i++) {
        struct runlog_dataset *d = &log->datasets[i];
        DM_H5(H5Sclose(d->memory_space));
        DM_H5(H5Sclose(d->file_space));
        DM_H5(H5Dclose(d->dataset));
    }
    DM_H5(H5Fflush(log->file, H5F_SCOPE_LOCAL));
    DM_H5(H5Fclose(log->file));
    dm_free(log->datasets);
    dm_free(log);
}

