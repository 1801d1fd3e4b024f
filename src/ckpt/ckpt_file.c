/* The checkpoint file as data: the schema tables compiled in from
 * checkpoint_schema/v1.def, with the schemes' parts (their fragments,
 * their own versions: dyn_ckpt_* of dynmo/dyn.h), the structural check of
 * an open file against them (and the extension dyn.def where the file has
 * /dyn, ckpt_dyn.c), and the serial readers of metadata and rows that the
 * loader, the checker and inspect share.
 *
 * It never writes and never calls MPI: the collective writer lives in
 * checkpoint.c, the loader in ckpt_load.c. Every problem goes through
 * ckpt_problem so that the loader can stop at the first and the checker
 * can list them all. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "ckpt/ckpt_dir.h"
#include "ckpt/ckpt_file.h"
#include "ckpt/h5util.h"

/* ---- the schema, compiled in from checkpoint_schema/v1.def ---------------------- */

#define SCHEMA_FILE "../../checkpoint_schema/v1.def"
#define SCHEMA_NAME ckpt_schema_v1
#include "dynmo/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
_Static_assert(ckpt_schema_v1_number == CHECKPOINT_SCHEMA_VERSION,
               "checkpoint_schema/v1.def and CHECKPOINT_SCHEMA_VERSION disagree");

const struct ckpt_schema *ckpt_schema_of_version(long version)
{
    if (version == ckpt_schema_v1.version) return &ckpt_schema_v1;
    return dyn_ckpt_version_schema(version);   /* a scheme's own */
}

const struct ckpt_schema *ckpt_schema_for(const struct gpt_shape *shape)
{
    int version = dyn_ckpt_version(shape);
    const struct ckpt_schema *base = version ? dyn_ckpt_version_schema(version) : &ckpt_schema_v1;
    return dyn_ckpt_schema(base, shape);   /* the schemes' fragments */
}

const char *schema_type_name(enum schema_type type)
{
    switch (type) {
    case SCHEMA_TYPE_STRING: return "string";
    case SCHEMA_TYPE_INT64: return "int64";
    case SCHEMA_TYPE_UINT64: return "uint64";
    case SCHEMA_TYPE_INT32: return "int32";
    case SCHEMA_TYPE_FLOAT32: return "float32";
    case SCHEMA_TYPE_FLOAT64: return "float64";
    }
    return "?";
}

hid_t schema_file_type(enum schema_type type)
{
    switch (type) {
    case SCHEMA_TYPE_INT64: return H5T_STD_I64LE;
    case SCHEMA_TYPE_UINT64: return H5T_STD_U64LE;
    case SCHEMA_TYPE_INT32: return H5T_STD_I32LE;
    case SCHEMA_TYPE_FLOAT32: return H5T_IEEE_F32LE;
    case SCHEMA_TYPE_FLOAT64: return H5T_IEEE_F64LE;
    case SCHEMA_TYPE_STRING: break;
    }
    DM_FATAL("schema type %s has no fixed HDF5 file type", schema_type_name(type));
}

size_t schema_type_size(enum schema_type type)
{
    switch (type) {
    case SCHEMA_TYPE_INT32:
    case SCHEMA_TYPE_FLOAT32: return 4;
    case SCHEMA_TYPE_INT64:
    case SCHEMA_TYPE_UINT64:
    case SCHEMA_TYPE_FLOAT64:
    case SCHEMA_TYPE_STRING: return 8;
    }
    return 8;
}

long ckpt_dim(const struct ckpt_dims *dims, const char *name)
{
    if (!strcmp(name, "layers")) return dims->layers;
    if (!strcmp(name, "block_params")) return dims->block_params;
    if (!strcmp(name, "vocab")) return dims->vocab;
    if (!strcmp(name, "max_seq")) return dims->max_seq;
    if (!strcmp(name, "channels")) return dims->channels;
    if (!strcmp(name, "pp")) return dims->pp;
    if (!strcmp(name, "dp")) return dims->dp;
    if (!strcmp(name, "history")) return dims->history;
    if (!strcmp(name, "dyn_state")) return dims->dyn_state;
    if (!strcmp(name, "units"))
        return dims->units_per_block > 0 && dims->layers >= 0
                   ? dims->units_per_block * dims->layers : -1;
    for (int i = 0; i < dims->scheme_dims; i++)
        if (!strcmp(name, dims->scheme_dim_names[i])) return dims->scheme_dim_values[i];
    return -1;
}

void ckpt_dims_of_shape(struct ckpt_dims *dims, const struct gpt_shape *shape)
{
    memset(dims, 0, sizeof *dims);
    dims->layers = shape->layers;
    dims->block_params = (long)block_param_count(shape->channels);
    dims->vocab = shape->vocab;
    dims->max_seq = shape->max_seq;
    dims->channels = shape->channels;
    dims->pp = dims->dp = dims->history = -1;
    dims->dyn_state = -1;
    dims->scheme_dims = dyn_ckpt_dims(shape, dims->scheme_dim_names, dims->scheme_dim_values,
                                      DYN_CKPT_PARTS_MAX);
}

const struct schema_dataset *ckpt_schema_dataset(const struct ckpt_schema *schema,
                                                 const char *name)
{
    for (int i = 0; i < schema->dataset_count; i++)
        if (!strcmp(schema->datasets[i].path, name)) return &schema->datasets[i];
    return NULL;
}

int ckpt_dataset_extent(const struct schema_dataset *d, const struct ckpt_dims *dims,
                        hsize_t extent[2])
{
    int rank = d->dims[1][0] ? 2 : 1;
    for (int i = 0; i < rank; i++) {
        long value = ckpt_dim(dims, d->dims[i]);
        if (value < 0) return -1;
        extent[i] = (hsize_t)value;
    }
    if (rank == 1) extent[1] = 1;
    return rank;
}

int ckpt_dataset_present(const struct schema_dataset *d, const struct ckpt_dims *dims)
{
    hsize_t extent[2];
    return !(ckpt_dataset_extent(d, dims, extent) > 0 && extent[0] == 0);
}

void ckpt_problem(struct ckpt_problems *problems, const char *fmt, ...)
{
    char text[1024];
    int n = snprintf(text, sizeof text, "checkpoint %s: ", problems->path);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof text) vsnprintf(text + n, sizeof text - (size_t)n, fmt, ap);
    va_end(ap);
    if (problems->count == 0) snprintf(problems->first, sizeof problems->first, "%s", text);
    problems->count++;
    if (problems->report) problems->report(problems->ctx, text);
}

void ckpt_header_free(struct ckpt_header *header)
{
    dm_free(header->config_text);
    header->config_text = NULL;
    if (header->schemes) dyn_ckpt_file_free(header->schemes);
    header->schemes = NULL;
}

/* ---- what the schemes' parts see of a file (dyn.h's reader) ------------------- */

struct reader_ctx {
    hid_t file;
    const struct ckpt_header *header;   /* for whole datasets, or NULL */
    struct ckpt_problems *problems;
};

static int read_whole(hid_t file, const struct ckpt_header *header, const char *name,
                      hid_t memory_type, void *out, struct ckpt_problems *problems);

static int reader_dataset(void *ctx, const char *name, int int64, void *out)
{
    const struct reader_ctx *c = ctx;
    DM_ASSERT(c->header != NULL);
    return read_whole(c->file, c->header, name, int64 ? H5T_NATIVE_INT64 : H5T_NATIVE_FLOAT, out,
                      c->problems);
}

static int reader_has(void *ctx, const char *object, const char *attr)
{
    const struct reader_ctx *c = ctx;
    if (!dm_h5_path_exists(c->file, object)) return 0;
    if (!attr) return 1;
    htri_t exists = H5Aexists_by_name(c->file, object, attr, H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);
    return exists > 0;
}

static long long reader_int(void *ctx, const char *object, const char *name,
                            long long fallback)
{
    const struct reader_ctx *c = ctx;
    long long value = fallback;
    if (!reader_has(ctx, object, name)) return fallback;
    hid_t attr = H5Aopen_by_name(c->file, object, name, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0 || H5Aread(attr, H5T_NATIVE_LLONG, &value) < 0) value = fallback;
    if (attr >= 0) H5Aclose(attr);
    H5Eclear2(H5E_DEFAULT);
    return value;
}

static void reader_problem(void *ctx, const char *text)
{
    const struct reader_ctx *c = ctx;
    ckpt_problem(c->problems, "%s", text);
}

/* rd over file (-1: problems only, no file; header: whole datasets can be
 * read), reporting into problems. The context lives in static storage:
 * one reader at a time, from one thread. */
static void reader_of(struct dyn_ckpt_reader *rd, hid_t file, const struct ckpt_header *header,
                      struct ckpt_problems *problems)
{
    static struct reader_ctx ctx;
    ctx.file = file;
    ctx.header = header;
    ctx.problems = problems;
    *rd = (struct dyn_ckpt_reader){.ctx = &ctx, .has = reader_has, .int_attr = reader_int,
                                   .problem = reader_problem,
                                   .dataset = header ? reader_dataset : NULL};
}

/* ---- attributes ------------------------------------------------------------ */


static const char *attr_where(const char *object, const char *name, char *buf, size_t size)
{
    if (!strcmp(object, "/")) snprintf(buf, size, "root attribute %s", name);
    else snprintf(buf, size, "attribute %s of %s", name, object);
    return buf;
}

/* Reads one scalar integer attribute; checks the schema type (64-bit,
 * signed or not). Returns 0, 1 when absent, -1 on any other problem (reported). */
static int read_integer_attr(hid_t file, const struct schema_attr *a, long long *value,
                             struct ckpt_problems *problems)
{
    char where[160];
    attr_where(a->object, a->name, where, sizeof where);
    int status = -1;
    hid_t attr = -1, type = -1, space = -1;
    htri_t exists = H5Aexists_by_name(file, a->object, a->name, H5P_DEFAULT);
    if (exists <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return 1;
    }
    attr = H5Aopen_by_name(file, a->object, a->name, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0) goto fail;
    type = H5Aget_type(attr);
    space = H5Aget_space(attr);
    if (type < 0 || space < 0) goto fail;
    int want_signed = a->type == SCHEMA_TYPE_INT64;
    if (H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != 8 ||
        (H5Tget_sign(type) == H5T_SGN_2) != want_signed ||
        H5Sget_simple_extent_npoints(space) != 1) {
        ckpt_problem(problems, "%s is not a scalar %s", where, schema_type_name(a->type));
        goto done;
    }
    if (want_signed) {
        if (H5Aread(attr, H5T_NATIVE_LLONG, value) < 0) goto fail;
    } else {
        unsigned long long u = 0;
        if (H5Aread(attr, H5T_NATIVE_ULLONG, &u) < 0) goto fail;
        memcpy(value, &u, sizeof u);
    }
    status = 0;
    goto done;
fail: {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        ckpt_problem(problems, "cannot read %s: %s", where, text);
    }
done:
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (attr >= 0) H5Aclose(attr);
    return status;
}

/* Reads one string attribute into a dm_alloc'd buffer. Returns 0, 1 when
 * absent, -1 on another problem (reported). */
static int read_string_attr(hid_t file, const struct schema_attr *a, char **text,
                            struct ckpt_problems *problems)
{
    char where[160];
    attr_where(a->object, a->name, where, sizeof where);
    *text = NULL;
    hid_t object = H5Oopen(file, a->object, H5P_DEFAULT);
    if (object < 0) {
        H5Eclear2(H5E_DEFAULT);
        return 1;
    }
    hid_t attr = -1, type = -1;
    int status;
    htri_t exists = H5Aexists(object, a->name);
    if (exists <= 0) {
        H5Eclear2(H5E_DEFAULT);
        status = 1;
        goto done;
    }
    attr = H5Aopen(object, a->name, H5P_DEFAULT);
    type = attr >= 0 ? H5Aget_type(attr) : -1;
    if (type < 0 || H5Tget_class(type) != H5T_STRING) {
        H5Eclear2(H5E_DEFAULT);
        ckpt_problem(problems, "%s is not a string", where);
        status = -1;
        goto done;
    }
    char err[768];
    status = dm_h5_read_attr_text(object, a->name, text, err, sizeof err);
    if (status < 0) ckpt_problem(problems, "cannot read %s: %s", where, err);
done:
    if (type >= 0) H5Tclose(type);
    if (attr >= 0) H5Aclose(attr);
    H5Oclose(object);
    return status;
}

/* kind and schema_version are the same in every version's schema. */
static const struct schema_attr *find_attr(const char *object, const char *name)
{
    const struct ckpt_schema *schema = &ckpt_schema_v1;
    for (int i = 0; i < schema->attr_count; i++)
        if (!strcmp(schema->attrs[i].object, object) && !strcmp(schema->attrs[i].name, name))
            return &schema->attrs[i];
    DM_FATAL("checkpoint schema has no attribute %s of %s", name, object);
}

/* Stores an integer attribute's value where the header keeps it. */
static void header_store_integer(struct ckpt_header *h, const struct schema_attr *a,
                                 long long value)
{
    uint64_t u;
    memcpy(&u, &value, sizeof u);
    const char *o = a->object, *n = a->name;
    if (!strcmp(o, "/")) {
        if (!strcmp(n, "schema_version")) h->schema_version = value;
        else if (!strcmp(n, "world_pp")) h->world_pp = value;
        else if (!strcmp(n, "world_dp")) h->world_dp = value;
        else if (!strcmp(n, "world_size")) h->world_size = value;
    } else if (!strcmp(o, "/model")) {
        if (!strcmp(n, "vocab")) h->dims.vocab = value;
        else if (!strcmp(n, "max_seq")) h->dims.max_seq = value;
        else if (!strcmp(n, "layers")) h->dims.layers = value;
        else if (!strcmp(n, "heads")) h->heads = value;
        else if (!strcmp(n, "channels")) h->dims.channels = value;
        else if (!strcmp(n, "block_params")) h->dims.block_params = value;
    } else if (!strcmp(o, "/training")) {
        if (!strcmp(n, "step")) h->step = value;
        else if (!strcmp(n, "optimizer_steps")) h->optimizer_steps = value;
        else if (!strcmp(n, "lr_schedule_step")) h->lr_schedule_step = value;
        else if (!strcmp(n, "seed")) h->seed = u;
    } else if (!strcmp(o, "/data")) {
        if (!strcmp(n, "train_checksum")) h->train_checksum = u;
    }
}

static void header_store_string(struct ckpt_header *h, const struct schema_attr *a,
                                const char *text)
{
    if (!strcmp(a->object, "/dyn") && !strcmp(a->name, "kind"))
        snprintf(h->dyn_kind, sizeof h->dyn_kind, "%s", text);
    if (strcmp(a->object, "/") != 0) return;
    if (!strcmp(a->name, "dynmo_version"))
        snprintf(h->dynmo_version, sizeof h->dynmo_version, "%s", text);
    else if (!strcmp(a->name, "created"))
        snprintf(h->created, sizeof h->created, "%s", text);
    else if (!strcmp(a->name, "config")) {
        size_t n = strlen(text);
        h->config_text = dm_alloc(n + 1);
        memcpy(h->config_text, text, n);
    }
}

/* Checks one schema attribute: present, of its type, with its required
 * value; stores it in the header. Returns 0 when it is usable. */
static int check_attr(hid_t file, const struct schema_attr *a, struct ckpt_header *h,
                      struct ckpt_problems *problems)
{
    char where[160];
    attr_where(a->object, a->name, where, sizeof where);
    if (a->type == SCHEMA_TYPE_STRING) {
        char *text = NULL;
        int status = read_string_attr(file, a, &text, problems);
        if (status == 1) {
            ckpt_problem(problems, "%s is missing", where);
            return -1;
        }
        if (status < 0) return -1;
        int ok = !a->value[0] || !strcmp(text, a->value);
        if (!ok)
            ckpt_problem(problems, "%s is \"%s\", expected \"%s\"", where, text, a->value);
        else if (h->schemes && dyn_ckpt_file_owns(h->schemes, a->object, a->name))
            dyn_ckpt_file_store(h->schemes, a->object, a->name, 0, text);
        else
            header_store_string(h, a, text);
        dm_free(text);
        return ok ? 0 : -1;
    }
    long long value = 0;
    int status = read_integer_attr(file, a, &value, problems);
    if (status == 1) {
        if (!strcmp(a->name, "complete") && !strcmp(a->object, "/"))
            ckpt_problem(problems, "incomplete: the root attribute complete is missing "
                         "(the writer did not finish this file)");
        else
            ckpt_problem(problems, "%s is missing", where);
        return -1;
    }
    if (status < 0) return -1;
    if (a->value[0] && value != strtoll(a->value, NULL, 10)) {
        ckpt_problem(problems, "%s is %lld, expected %s", where, value, a->value);
        return -1;
    }
    if (h->schemes && dyn_ckpt_file_owns(h->schemes, a->object, a->name))
        dyn_ckpt_file_store(h->schemes, a->object, a->name, value, "");
    else
        header_store_integer(h, a, value);
    return 0;
}

/* ---- structure --------------------------------------------------------------- */

static int check_type(hid_t type, enum schema_type want)
{
    H5T_class_t type_class = H5Tget_class(type);
    size_t size = H5Tget_size(type);
    H5T_order_t order = H5Tget_order(type);
    switch (want) {
    case SCHEMA_TYPE_FLOAT32:
        return type_class == H5T_FLOAT && size == 4 && order == H5T_ORDER_LE;
    case SCHEMA_TYPE_FLOAT64:
        return type_class == H5T_FLOAT && size == 8 && order == H5T_ORDER_LE;
    case SCHEMA_TYPE_INT32:
        return type_class == H5T_INTEGER && size == 4 && order == H5T_ORDER_LE &&
               H5Tget_sign(type) == H5T_SGN_2;
    case SCHEMA_TYPE_INT64:
        return type_class == H5T_INTEGER && size == 8 && order == H5T_ORDER_LE &&
               H5Tget_sign(type) == H5T_SGN_2;
    case SCHEMA_TYPE_UINT64:
        return type_class == H5T_INTEGER && size == 8 && order == H5T_ORDER_LE &&
               H5Tget_sign(type) == H5T_SGN_NONE;
    case SCHEMA_TYPE_STRING:
        return type_class == H5T_STRING;
    }
    return 0;
}

/* One dataset: present, of its type, shape, chunked with Fletcher32. */
/* The dataset's shape against the schema's, with the dimensions known. */
static void check_shape(hid_t space, const struct schema_dataset *d,
                        const struct ckpt_dims *dims, struct ckpt_problems *problems)
{
    hsize_t want[2];
    int want_rank = ckpt_dataset_extent(d, dims, want);
    int rank = H5Sget_simple_extent_ndims(space);
    hsize_t have[H5S_MAX_RANK] = {0};
    if (rank > 0) H5Sget_simple_extent_dims(space, have, NULL);
    if (want_rank < 0) {
        ckpt_problem(problems, "cannot check the shape of %s: dimension %s or %s unknown",
                     d->path, d->dims[0], d->dims[1][0] ? d->dims[1] : d->dims[0]);
        return;
    }
    if (rank == want_rank && have[0] == want[0] && (rank != 2 || have[1] == want[1])) return;
    char shape[64];
    if (rank == 2)
        snprintf(shape, sizeof shape, "[%llu, %llu]", (unsigned long long)have[0],
                 (unsigned long long)have[1]);
    else if (rank == 1)
        snprintf(shape, sizeof shape, "[%llu]", (unsigned long long)have[0]);
    else
        snprintf(shape, sizeof shape, "of rank %d", rank);
    if (want_rank == 2)
        ckpt_problem(problems, "%s has shape %s, expected [%s, %s] = [%llu, %llu]",
                     d->path, shape, d->dims[0], d->dims[1],
                     (unsigned long long)want[0], (unsigned long long)want[1]);
    else
        ckpt_problem(problems, "%s has shape %s, expected [%s] = [%llu]", d->path,
                     shape, d->dims[0], (unsigned long long)want[0]);
}

/* Chunked, with the Fletcher32 filter: what makes every read checked. */
static void check_checksum_filter(hid_t dcpl, const char *path, struct ckpt_problems *problems)
{
    if (H5Pget_layout(dcpl) != H5D_CHUNKED) {
        ckpt_problem(problems, "%s is not chunked, so it has no Fletcher32 checksum", path);
        return;
    }
    unsigned flags = 0, config = 0;
    size_t nvalues = 0;
    char name[32];
    if (H5Pget_filter_by_id2(dcpl, H5Z_FILTER_FLETCHER32, &flags, &nvalues, NULL,
                             sizeof name, name, &config) < 0) {
        H5Eclear2(H5E_DEFAULT);
        ckpt_problem(problems, "%s has no Fletcher32 checksum filter", path);
    }
}

static void check_dataset(hid_t file, const struct schema_dataset *d,
                          const struct ckpt_dims *dims, struct ckpt_problems *problems)
{
    if (!ckpt_dataset_present(d, dims)) {   /* never written */
        if (dm_h5_path_exists(file, d->path))
            ckpt_problem(problems, "%s is in the file, but %s is 0 for this model (a dataset "
                         "of no rows is not written)", d->path, d->dims[0]);
        return;
    }
    if (!dm_h5_path_exists(file, d->path)) {
        ckpt_problem(problems, "incomplete: dataset %s is missing", d->path);
        return;
    }
    hid_t dataset = H5Dopen2(file, d->path, H5P_DEFAULT);
    if (dataset < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        ckpt_problem(problems, "%s is not a readable dataset: %s", d->path, text);
        return;
    }
    hid_t type = H5Dget_type(dataset), space = H5Dget_space(dataset);
    hid_t dcpl = H5Dget_create_plist(dataset);
    if (type < 0 || space < 0 || dcpl < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        ckpt_problem(problems, "cannot read the description of %s: %s", d->path, text);
    } else {
        if (!check_type(type, d->type))
            ckpt_problem(problems, "%s has the wrong type (expected little-endian %s)",
                         d->path, schema_type_name(d->type));
        check_shape(space, d, dims, problems);
        check_checksum_filter(dcpl, d->path, problems);
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    H5Dclose(dataset);
}

/* As large as any config allows (model.vocab is at most 2^20, the other
 * model.* keys and parallel.dp at most 65536, docs/config.md) and small
 * enough for an int: a /model or world attribute above it is no
 * checkpoint dynmo wrote. */
#define ATTRIBUTE_MAX (1L << 20)

/* Sets one key of cfg from its line in the config text (config_print's
 * "section.key = value"): 1 when set, 0 when the text has no such line,
 * -1 after reporting a bad value. */
static int config_text_key(const char *config, const char *section, const char *key,
                           struct dm_config *cfg, struct ckpt_problems *problems)
{
    char prefix[96];
    size_t n = (size_t)snprintf(prefix, sizeof prefix, "%s.%s = ", section, key);
    const char *line = config;
    while (strncmp(line, prefix, n) != 0) {
        line = strchr(line, '\n');
        if (!line) return 0;
        line++;
    }
    const char *value = line + n;
    char text[64], err[256];
    size_t len = strcspn(value, "\n");
    if (len >= sizeof text) {
        ckpt_problem(problems, "the root attribute config: %s.%s's value is %zu characters "
                     "long, not a number", section, key, len);
        return -1;
    }
    snprintf(text, sizeof text, "%.*s", (int)len, value);
    if (config_set(cfg, section, key, text, err, sizeof err) != 0) {
        ckpt_problem(problems, "the root attribute config: %s", err);
        return -1;
    }
    return 1;
}

/* train.batch of the config text, checked as the config checks it; -1
 * after reporting a problem. */
static long config_text_batch(const char *config, struct ckpt_problems *problems)
{
    struct dm_config cfg;
    config_defaults(&cfg);
    int found = config_text_key(config, "train", "batch", &cfg, problems);
    if (found > 0) return cfg.batch;
    if (found < 0) return -1;
    ckpt_problem(problems, "the root attribute config has no line \"train.batch = N\" (dynmo "
                 "writes every key), so the data cursors cannot be checked");
    return -1;
}

/* The tokens of a model whose config text pads its vocabulary
 * (model.vocab_pad > 1): its model.vocab, checked to pad to `rows` (the
 * /model vocab attribute, the embedding's rows); 0 for a file without
 * padding (no such key, or 1), or after reporting a problem. */
static int config_text_vocab_used(const char *config, long rows, struct ckpt_problems *problems)
{
    struct dm_config cfg;
    config_defaults(&cfg);
    if (config_text_key(config, "model", "vocab_pad", &cfg, problems) <= 0 ||
        cfg.vocab_pad == 1 || config_text_key(config, "model", "vocab", &cfg, problems) <= 0)
        return 0;
    long padded = ((long)cfg.vocab + cfg.vocab_pad - 1) / cfg.vocab_pad * cfg.vocab_pad;
    if (padded != rows) {
        ckpt_problem(problems, "/model: vocab is %ld rows, but the root attribute config's "
                     "model.vocab = %d padded to a multiple of model.vocab_pad = %d is %ld",
                     rows, cfg.vocab, cfg.vocab_pad, padded);
        return 0;
    }
    return cfg.vocab;
}

/* The /training positions as dynmo writes them: each in [0, INT_MAX]
 * (train.steps is an int) and all three equal, since every step applies
 * one optimizer update and moves the schedule one step. */
static void check_positions(const struct ckpt_header *h, struct ckpt_problems *problems)
{
    const struct { const char *name; long value; } positions[] = {
        {"step", h->step},
        {"optimizer_steps", h->optimizer_steps},
        {"lr_schedule_step", h->lr_schedule_step},
    };
    int in_range = 1;
    for (size_t i = 0; i < sizeof positions / sizeof positions[0]; i++) {
        if (positions[i].value < 0) {
            ckpt_problem(problems, "/training/%s is %ld (negative)", positions[i].name,
                         positions[i].value);
            in_range = 0;
        } else if (positions[i].value > INT_MAX) {
            ckpt_problem(problems, "/training/%s is %ld, beyond any run (train.steps is an int: "
                         "at most %d)", positions[i].name, positions[i].value, INT_MAX);
            in_range = 0;
        }
    }
    if (in_range && (h->optimizer_steps != h->step || h->lr_schedule_step != h->step))
        ckpt_problem(problems, "/training: optimizer_steps %ld and lr_schedule_step %ld differ "
                     "from step %ld (dynmo writes all three equal: every step applies one "
                     "update and moves the schedule one step)", h->optimizer_steps,
                     h->lr_schedule_step, h->step);
}

/* A file named ckpt-<N>.h5 (or its .tmp) holds step N: dynmo names it so,
 * and resume=auto picks files by that name. */
static void check_file_name(const struct ckpt_header *h, struct ckpt_problems *problems)
{
    const char *base = strrchr(problems->path, '/');
    base = base ? base + 1 : problems->path;
    long named = ckpt_dir_parse_name(base, 0);
    if (named < 0) named = ckpt_dir_parse_name(base, 1);
    if (named >= 0 && named != h->step)
        ckpt_problem(problems, "the file name %s says step %ld but /training/step is %ld "
                     "(dynmo names a checkpoint ckpt-<step>.h5: a renamed or mislabelled "
                     "file)", base, named, h->step);
}

/* Sanity of the model, world and training attributes, once they are known
 * (the schemes may ask file whether it holds an object). */
static void check_header_values(hid_t file, struct ckpt_header *h,
                                struct ckpt_problems *problems)
{
    struct ckpt_dims *d = &h->dims;
    int model_ok = 0;
    if (d->layers < 1 || d->channels < 1 || d->vocab < 1 || d->max_seq < 1 || h->heads < 1)
        ckpt_problem(problems, "/model attributes out of range (layers %ld, channels %ld, "
                     "heads %ld, vocab %ld, max_seq %ld)", d->layers, d->channels,
                     h->heads, d->vocab, d->max_seq);
    else if (d->layers > ATTRIBUTE_MAX || d->channels > ATTRIBUTE_MAX ||
             d->vocab > ATTRIBUTE_MAX || d->max_seq > ATTRIBUTE_MAX || h->heads > ATTRIBUTE_MAX)
        ckpt_problem(problems, "/model attributes implausibly large (layers %ld, channels %ld, "
                     "heads %ld, vocab %ld, max_seq %ld; a config allows at most 2^20)",
                     d->layers, d->channels, h->heads, d->vocab, d->max_seq);
    else if (d->channels % h->heads != 0)
        ckpt_problem(problems, "/model: heads %ld do not divide channels %ld", h->heads,
                     d->channels);
    else if ((size_t)d->block_params != block_param_count((int)d->channels))
        ckpt_problem(problems, "/model: block_params is %ld, but a block of %ld channels "
                     "has %zu parameters", d->block_params, d->channels,
                     block_param_count((int)d->channels));
    else
        model_ok = 1;
    /* The product only once both factors are known to be small. */
    if (h->world_pp < 1 || h->world_dp < 1 || h->world_pp > ATTRIBUTE_MAX ||
        h->world_dp > ATTRIBUTE_MAX || h->world_size != h->world_pp * h->world_dp)
        ckpt_problem(problems, "world attributes inconsistent: world_pp %ld x world_dp %ld "
                     "!= world_size %ld", h->world_pp, h->world_dp, h->world_size);
    else if (d->layers >= 1 && h->world_pp > d->layers)
        ckpt_problem(problems, "world_pp %ld exceeds the %ld layers", h->world_pp,
                     d->layers);
    check_positions(h, problems);
    if (h->config_text) h->batch = config_text_batch(h->config_text, problems);
    check_file_name(h, problems);
    d->pp = h->world_pp >= 1 && h->world_pp <= ATTRIBUTE_MAX ? h->world_pp : -1;
    d->dp = h->world_dp >= 1 && h->world_dp <= ATTRIBUTE_MAX ? h->world_dp : -1;
    if (!model_ok) return;
    h->shape.vocab = (int)d->vocab;
    if (h->config_text) h->shape.vocab_used = config_text_vocab_used(h->config_text, d->vocab,
                                                                     problems);
    h->shape.max_seq = (int)d->max_seq;
    h->shape.layers = (int)d->layers;
    h->shape.channels = (int)d->channels;
    h->shape.heads = (int)h->heads;
    struct dyn_ckpt_reader rd;   /* the schemes check their own */
    reader_of(&rd, file, NULL, problems);
    if (h->schemes && dyn_ckpt_file_check(h->schemes, &h->shape, &rd) != 0) return;
    d->scheme_dims = dyn_ckpt_dims(&h->shape, d->scheme_dim_names, d->scheme_dim_values,
                                   DYN_CKPT_PARTS_MAX);
}

/* Every dimension and value unknown until the file says. */
static void header_init(struct ckpt_header *header)
{
    memset(header, 0, sizeof *header);
    struct ckpt_dims *dims = &header->dims;
    dims->layers = dims->block_params = dims->vocab = dims->max_seq = dims->channels = -1;
    dims->pp = dims->dp = dims->history = -1;
    dims->dyn_state = -1;
    header->schema_version = header->batch = -1;
}

hid_t ckpt_open_checked(const char *path, struct ckpt_problems *problems,
                        struct ckpt_header *header)
{
    header_init(header);
    char err[1024];
    hid_t file = dm_h5_open_readonly(path, err, sizeof err);
    if (file < 0) {
        /* dm_h5_open_readonly names the path first; ours does already. */
        size_t n = strlen(path);
        const char *reason = err;
        if (!strncmp(err, path, n) && err[n] == ':') reason = err + n + 1;
        while (*reason == ' ') reason++;
        ckpt_problem(problems, "%s", reason);
        return -1;
    }
    if (ckpt_check_structure(file, problems, header) != 0) {
        H5Fclose(file);
        return -1;
    }
    return file;
}

/* The history length is the one dimension a dataset defines: dims->history
 * from /layout/history_step's length (left -1 when it cannot be read; the
 * dataset check reports that). */
static void read_history_dim(hid_t file, struct ckpt_dims *dims,
                             struct ckpt_problems *problems)
{
    if (!dm_h5_path_exists(file, "/layout/history_step")) return;
    hid_t dataset = H5Dopen2(file, "/layout/history_step", H5P_DEFAULT);
    hid_t space = dataset >= 0 ? H5Dget_space(dataset) : -1;
    hsize_t n[H5S_MAX_RANK] = {0};
    if (space >= 0 && H5Sget_simple_extent_ndims(space) == 1) {
        H5Sget_simple_extent_dims(space, n, NULL);
        if (n[0] >= 1) dims->history = (long)n[0];
        else ckpt_problem(problems, "the layout history is empty");
    }
    if (space >= 0) H5Sclose(space);
    if (dataset >= 0) H5Dclose(dataset);
    H5Eclear2(H5E_DEFAULT);
}

int ckpt_check_structure(hid_t file, struct ckpt_problems *problems,
                         struct ckpt_header *header)
{
    header_init(header);
    struct ckpt_dims *dims = &header->dims;
    /* kind and schema version first: a file of another kind or version is
     * that, and listing every difference from our schema would bury it. */
    const struct schema_attr *kind = find_attr("/", "kind");
    char *text = NULL;
    int status = read_string_attr(file, kind, &text, problems);
    if (status == 1)
        ckpt_problem(problems, "not a dynmo checkpoint (its root group has no kind "
                     "attribute)");
    else if (status == 0 && strcmp(text, CHECKPOINT_KIND) != 0)
        ckpt_problem(problems, "not a dynmo checkpoint (root attribute kind is \"%s\", "
                     "expected \"%s\")", text, CHECKPOINT_KIND);
    dm_free(text);
    if (status != 0 || problems->count) return -1;
    const struct schema_attr *version = find_attr("/", "schema_version");
    long long value = 0;
    status = read_integer_attr(file, version, &value, problems);
    if (status == 1)
        ckpt_problem(problems, "the root attribute schema_version is missing");
    const struct ckpt_schema *schema = status == 0 ? ckpt_schema_of_version(value) : NULL;
    if (status == 0 && !schema) {
        char versions[256];   /* the schemes' own */
        dyn_ckpt_versions_text(versions, sizeof versions);
        ckpt_problem(problems, "schema version %lld; this dynmo reads checkpoint schema "
                     "version %d (a dense model)%s only (use the dynmo that wrote it, or start "
                     "a new run)", value, CHECKPOINT_SCHEMA_VERSION, versions);
    }
    if (!schema) return -1;
    struct dyn_ckpt_reader rd;
    reader_of(&rd, file, NULL, problems);
    header->schemes = dyn_ckpt_file_open(&rd, value);   /* after each fragment's format check */
    if (!header->schemes) return -1;
    schema = dyn_ckpt_file_schema(header->schemes, schema);
    header->schema = schema;
    header->schema_version = schema->version;
    schema = ckpt_dyn_extend(file, header, problems);   /* /dyn, when the file has it */
    schema = ckpt_units_extend(file, header);            /* /units, likewise */

    for (int i = 0; i < schema->group_count; i++)
        if (!dm_h5_path_exists(file, schema->groups[i]))
            ckpt_problem(problems, "incomplete: group %s is missing", schema->groups[i]);
    for (int i = 0; i < schema->attr_count; i++) {
        const struct schema_attr *a = &schema->attrs[i];
        if (!dm_h5_path_exists(file, a->object)) continue;   /* reported with its group */
        check_attr(file, a, header, problems);
    }
    check_header_values(file, header, problems);

    read_history_dim(file, dims, problems);
    for (int i = 0; i < schema->dataset_count; i++)
        check_dataset(file, &schema->datasets[i], dims, problems);
    return 0;
}

/* ---- reading ------------------------------------------------------------------ */

static void report_read_failure(struct ckpt_problems *problems, const char *name,
                                const char *what)
{
    char text[1024];
    dm_h5_error_text(text, sizeof text);
    if (strstr(text, "Fletcher32") || strstr(text, "checksum"))
        ckpt_problem(problems, "corrupt: Fletcher32 checksum mismatch in %s%s (a flipped "
                     "or overwritten byte): %s", name, what, text);
    else
        ckpt_problem(problems, "corrupt: reading %s%s failed: %s", name, what, text);
}

/* Reads the hyperslab [start, start+count) of dataset `name` (rank 1 or 2;
 * count[1] ignored for rank 1) into out as memory_type. */
static int read_slab(hid_t file, const char *name, hid_t memory_type, int rank,
                     const hsize_t start[2], const hsize_t count[2], void *out,
                     const char *what, struct ckpt_problems *problems)
{
    int status = -1;
    hid_t file_space = -1, memory_space = -1;
    hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
    if (dataset < 0) goto fail;
    file_space = H5Dget_space(dataset);
    if (file_space < 0) goto fail;
    if (H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, count, NULL) < 0)
        goto fail;
    /* Same shape as the file selection, so that HDF5 maps it to chunks
     * directly rather than element by element. */
    memory_space = H5Screate_simple(rank, count, NULL);
    if (memory_space < 0) goto fail;
    if (H5Dread(dataset, memory_type, memory_space, file_space, H5P_DEFAULT, out) < 0)
        goto fail;
    status = 0;
    goto done;
fail:
    report_read_failure(problems, name, what);
done:
    if (memory_space >= 0) H5Sclose(memory_space);
    if (file_space >= 0) H5Sclose(file_space);
    if (dataset >= 0) H5Dclose(dataset);
    return status;
}

/* Reads a whole small schema dataset (its extent from the header's dims). */
static int read_whole(hid_t file, const struct ckpt_header *header, const char *name,
                      hid_t memory_type, void *out, struct ckpt_problems *problems)
{
    const struct schema_dataset *d = ckpt_schema_dataset(header->schema, name);
    if (!d) DM_FATAL("checkpoint schema %d has no dataset %s", header->schema->version, name);
    hsize_t extent[2];
    int rank = ckpt_dataset_extent(d, &header->dims, extent);
    DM_ASSERT(rank > 0);
    hsize_t start[2] = {0, 0};
    return read_slab(file, name, memory_type, rank, start, extent, out, "", problems);
}

int ckpt_read_dataset(hid_t file, const struct ckpt_header *header, const char *name,
                      hid_t memory_type, void *out, struct ckpt_problems *problems)
{
    return read_whole(file, header, name, memory_type, out, problems);
}

/* The fast path of a row read: reads the row's chunks as stored
 * (H5Dread_chunk), checks each one's Fletcher32 with our vectorised
 * checksum (fletcher32.c: 6-7 GB/s against 1.5-2.3 for HDF5's filter,
 * which adds one 16-bit word at a time and made a cold load CPU-bound) and
 * copies the floats out. Applies to float datasets with one-row chunks and
 * the Fletcher32 filter alone, which is what the writer makes. Returns 0
 * when the row was read and verified, -1 when anything is unusual (another
 * layout, a missing or odd-sized chunk, a checksum mismatch): the caller
 * then reads the row through HDF5's own filter, which reports a bad chunk
 * in HDF5's words. The file's floats are little-endian, like the host
 * (checkpoint.c asserts it). */
static int read_row_chunks(hid_t file, const char *name, hsize_t row, size_t count,
                           float *out)
{
    int status = -1;
    hid_t dataset = -1, dcpl = -1;
    unsigned char *buffer = NULL;
    H5E_BEGIN_TRY {
        dataset = H5Dopen2(file, name, H5P_DEFAULT);
        dcpl = dataset >= 0 ? H5Dget_create_plist(dataset) : -1;
    } H5E_END_TRY;
    hsize_t chunk[2];
    unsigned flags, mask;
    size_t values = 0;
    if (dcpl < 0 || H5Pget_layout(dcpl) != H5D_CHUNKED || H5Pget_chunk(dcpl, 2, chunk) != 2 ||
        chunk[0] != 1 || chunk[1] == 0 || H5Pget_nfilters(dcpl) != 1 ||
        H5Pget_filter2(dcpl, 0, &flags, &values, NULL, 0, NULL, NULL) != H5Z_FILTER_FLETCHER32)
        goto done;
    size_t chunk_bytes = (size_t)chunk[1] * sizeof(float);
    buffer = dm_alloc(chunk_bytes + 4);
    for (size_t column = 0; column < count; column += (size_t)chunk[1]) {
        hsize_t offset[2] = {row, column}, stored = 0;
        herr_t rc = -1;
        H5E_BEGIN_TRY {
            if (H5Dget_chunk_storage_size(dataset, offset, &stored) >= 0 &&
                stored == chunk_bytes + 4)
                rc = H5Dread_chunk(dataset, H5P_DEFAULT, offset, &mask, buffer);
        } H5E_END_TRY;
        if (rc < 0 || mask != 0) goto done;
        const unsigned char *tail = buffer + chunk_bytes;
        uint32_t sum = (uint32_t)tail[0] | (uint32_t)tail[1] << 8 |
                       (uint32_t)tail[2] << 16 | (uint32_t)tail[3] << 24;
        if (ckpt_fletcher32(buffer, chunk_bytes) != sum) goto done;
        size_t used = count - column < chunk[1] ? count - column : (size_t)chunk[1];
        memcpy(out + column, buffer, used * sizeof(float));
    }
    status = 0;
done:
    dm_free(buffer);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (dataset >= 0) H5Dclose(dataset);
    return status;
}

int ckpt_read_floats(hid_t file, const char *name, long row, size_t count, float *out,
                     struct ckpt_problems *problems)
{
    if (row < 0) {
        hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
        if (dataset < 0 ||
            H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0) {
            report_read_failure(problems, name, "");
            if (dataset >= 0) H5Dclose(dataset);
            return -1;
        }
        H5Dclose(dataset);
        return 0;
    }
    hsize_t start[2] = {(hsize_t)row, 0}, extent[2] = {1, (hsize_t)count};
    char what[48];
    snprintf(what, sizeof what, strncmp(name, "/blocks/", 8) ? " (row %ld)" : " (layer %ld)",
             row);
    if (read_row_chunks(file, name, (hsize_t)row, count, out) == 0) return 0;
    return read_slab(file, name, H5T_NATIVE_FLOAT, 2, start, extent, out, what, problems);
}

int ckpt_compare_shape(const struct gpt_shape *file_shape,
                       const struct gpt_shape *run_shape, char *err, size_t errsize)
{
    struct { const char *key; int file, run; } keys[] = {
        {"layers", file_shape->layers, run_shape->layers},
        {"channels", file_shape->channels, run_shape->channels},
        {"heads", file_shape->heads, run_shape->heads},
        {"vocab", gpt_vocab_used(file_shape), gpt_vocab_used(run_shape)},
        {"max_seq", file_shape->max_seq, run_shape->max_seq},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (keys[i].file != keys[i].run) {
            snprintf(err, errsize, "written for a different model: model.%s is %d in the "
                     "checkpoint but %d in this run (use the checkpoint's model config, "
                     "or start a new run in another ckpt.dir)", keys[i].key,
                     keys[i].file, keys[i].run);
            return -1;
        }
    if (file_shape->vocab != run_shape->vocab) {
        snprintf(err, errsize, "written for a different model: its embedding has %d rows (model.vocab "
                 "%d padded by model.vocab_pad) but %d in this run (use the checkpoint's "
                 "model.vocab_pad)", file_shape->vocab, gpt_vocab_used(file_shape),
                 run_shape->vocab);
        return -1;
    }
    return dyn_ckpt_compare(file_shape, run_shape, err, errsize);   /* the schemes' rules */
}

/* Checks a blocks-per-stage array: `stages` counts >= 1 summing to layers. */
static int layout_ok(const int *counts, long stages, long layers)
{
    long sum = 0;
    for (long s = 0; s < stages; s++) {
        if (counts[s] < 1) return 0;
        sum += counts[s];
    }
    return sum == layers;
}

/* The scalars the structural check read, into a fresh (owning) meta. */
static void meta_from_header(struct ckpt_meta *meta, const struct ckpt_header *header)
{
    const struct ckpt_dims *d = &header->dims;
    memset(meta, 0, sizeof *meta);
    meta->allocated = 1;
    meta->step = header->step;
    meta->optimizer_steps = header->optimizer_steps;
    meta->lr_schedule_step = header->lr_schedule_step;
    meta->seed = header->seed;
    meta->train_checksum = header->train_checksum;
    const char *config = header->config_text ? header->config_text : "";
    meta->config_text = dm_alloc(strlen(config) + 1);
    memcpy(meta->config_text, config, strlen(config));
    meta->pp = (int)d->pp;
    meta->dp = (int)d->dp;
    meta->shape = header->shape;
    meta->schema_version = (int)header->schema_version;
    snprintf(meta->dynmo_version, sizeof meta->dynmo_version, "%s", header->dynmo_version);
    snprintf(meta->created, sizeof meta->created, "%s", header->created);
}

/* The small datasets: cursors, layout, history, per-block state. */
static int read_meta_arrays(hid_t file, const struct ckpt_header *header,
                            struct ckpt_meta *meta, struct ckpt_problems *problems)
{
    const struct ckpt_dims *d = &header->dims;
    meta->data_cursor = dm_alloc((size_t)d->dp * sizeof(long));
    meta->layout = dm_alloc((size_t)d->pp * sizeof(int));
    layout_history_alloc(&meta->history, (int)d->layers, (int)d->history);
    meta->frozen = dm_alloc((size_t)d->layers * sizeof(int));
    meta->sparsity = dm_alloc((size_t)d->layers * sizeof(float));
    return read_whole(file, header, "/data/cursor", H5T_NATIVE_LONG, meta->data_cursor,
                      problems) ||
           read_whole(file, header, "/layout/blocks_per_stage", H5T_NATIVE_INT, meta->layout,
                      problems) ||
           read_whole(file, header, "/layout/history_step", H5T_NATIVE_LONG,
                      meta->history.step, problems) ||
           read_whole(file, header, "/layout/history_stages", H5T_NATIVE_INT,
                      meta->history.stages, problems) ||
           read_whole(file, header, "/layout/history_blocks_per_stage", H5T_NATIVE_INT,
                      meta->history.layout, problems) ||
           read_whole(file, header, "/blocks/state/frozen", H5T_NATIVE_INT, meta->frozen,
                      problems) ||
           read_whole(file, header, "/blocks/state/sparsity", H5T_NATIVE_FLOAT, meta->sparsity,
                      problems)
               ? -1 : 0;
}

/* Replica r's next sample is step x batch + r x (its share of a batch):
 * never more than step x batch + batch. */
static void check_cursors(const struct ckpt_meta *meta, const struct ckpt_header *header,
                          struct ckpt_problems *problems)
{
    long most = header->step * header->batch + header->batch;
    for (long r = 0; r < header->dims.dp; r++) {
        long cursor = meta->data_cursor[r];
        if (cursor < 0) {
            ckpt_problem(problems, "/data/cursor[%ld] is %ld (negative)", r, cursor);
            return;
        }
        if (cursor > most) {
            ckpt_problem(problems, "/data/cursor[%ld] is %ld, beyond step %ld x train.batch %ld "
                         "+ %ld = %ld (the most samples a run can have drawn)", r, cursor,
                         header->step, header->batch, header->batch, most);
            return;
        }
    }
}

/* The current layout is one, the history well formed and ending with it. */
static void check_layouts(const struct ckpt_meta *meta, const struct ckpt_dims *d,
                          struct ckpt_problems *problems)
{
    int before = problems->count;
    long layers = d->layers, history = d->history;
    if (!layout_ok(meta->layout, d->pp, layers))
        ckpt_problem(problems, "/layout/blocks_per_stage is not a layout of %ld blocks on "
                     "%ld stages (each stage needs >= 1 block, and they must sum to %ld)",
                     layers, d->pp, layers);
    char history_problem[256];
    if (layout_history_check(&meta->history, history_problem, sizeof history_problem) != 0)
        ckpt_problem(problems, "/layout: %s", history_problem);
    if (problems->count != before) return;
    const int *last = layout_history_entry(&meta->history, (int)history - 1);
    if (meta->history.stages[history - 1] != d->pp ||
        memcmp(last, meta->layout, (size_t)d->pp * sizeof(int)) != 0)
        ckpt_problem(problems, "the layout history does not end with the current "
                     "layout /layout/blocks_per_stage");
}

/* Frozen flags are 0 or 1, sparsities in [0, 1]. */
static void check_block_states(const struct ckpt_meta *meta, long layers,
                               struct ckpt_problems *problems)
{
    for (long i = 0; i < layers; i++) {
        if (meta->frozen[i] != 0 && meta->frozen[i] != 1) {
            ckpt_problem(problems, "/blocks/state/frozen[%ld] is %d (must be 0 or 1)", i,
                         meta->frozen[i]);
            return;
        }
        if (!(meta->sparsity[i] >= 0.0f && meta->sparsity[i] <= 1.0f)) {
            ckpt_problem(problems, "/blocks/state/sparsity[%ld] is %g (must be in [0, 1])",
                         i, (double)meta->sparsity[i]);
            return;
        }
    }
}

int ckpt_read_meta_from(hid_t file, const struct ckpt_header *header,
                        struct ckpt_meta *meta, struct ckpt_problems *problems)
{
    const struct ckpt_dims *d = &header->dims;
    DM_ASSERT(d->pp >= 1 && d->dp >= 1 && d->layers >= 1 && d->history >= 1);
    DM_ASSERT(header->batch >= 1 && header->step >= 0 && header->step <= INT_MAX);
    int before = problems->count;
    meta_from_header(meta, header);
    if (read_meta_arrays(file, header, meta, problems) != 0) return -1;
    check_cursors(meta, header, problems);
    check_layouts(meta, d, problems);
    if (d->units_per_block && problems->count == before &&
        ckpt_units_read(file, header, meta, problems) != 0)
        return -1;
    struct dyn_ckpt_reader rd;   /* the schemes' states beyond the slabs */
    reader_of(&rd, file, header, problems);
    if (dyn_ckpt_read_states(&header->shape, &rd, &meta->scheme_states) != 0) return -1;
    if (header->dims.dyn_state > 0 && ckpt_dyn_read(file, header, meta, problems) != 0)
        return -1;
    check_block_states(meta, d->layers, problems);
    return problems->count == before ? 0 : -1;
}

/* Elements (of at most 8 bytes) of the read buffer of ckpt_read_all, at most. */
#define READ_ALL_BUFFER_ELEMENTS ((hsize_t)1 << 22)

/* The read buffer's elements: no more than the largest dataset holds (a
 * small file needs a small buffer), nor READ_ALL_BUFFER_ELEMENTS. */
static hsize_t read_all_buffer_elements(const struct ckpt_header *header)
{
    hsize_t buffer_elements = 1;
    for (int i = 0; i < header->schema->dataset_count; i++) {
        hsize_t extent[2];
        if (ckpt_dataset_extent(&header->schema->datasets[i], &header->dims, extent) < 0)
            continue;
        hsize_t elements = extent[1] && extent[0] > READ_ALL_BUFFER_ELEMENTS / extent[1]
                               ? READ_ALL_BUFFER_ELEMENTS
                               : extent[0] * extent[1];
        if (elements > buffer_elements) buffer_elements = elements;
    }
    return buffer_elements > READ_ALL_BUFFER_ELEMENTS ? READ_ALL_BUFFER_ELEMENTS
                                                       : buffer_elements;
}

int ckpt_read_all(hid_t file, const struct ckpt_header *header,
                  struct ckpt_problems *problems)
{
    int before = problems->count;
    void *buffer = dm_alloc(read_all_buffer_elements(header) * 8);
    for (int i = 0; i < header->schema->dataset_count; i++) {
        const struct schema_dataset *d = &header->schema->datasets[i];
        hsize_t extent[2];
        int rank = ckpt_dataset_extent(d, &header->dims, extent);
        if (rank < 0) continue;
        hid_t memory_type = d->type == SCHEMA_TYPE_FLOAT32 ? H5T_NATIVE_FLOAT
                          : d->type == SCHEMA_TYPE_INT32 ? H5T_NATIVE_INT
                          : d->type == SCHEMA_TYPE_FLOAT64 ? H5T_NATIVE_DOUBLE
                                                         : H5T_NATIVE_LLONG;
        hsize_t rows = extent[0], cols = extent[1];
        hsize_t rows_per = cols <= READ_ALL_BUFFER_ELEMENTS ? READ_ALL_BUFFER_ELEMENTS / cols : 1;
        hsize_t cols_per = cols <= READ_ALL_BUFFER_ELEMENTS ? cols : READ_ALL_BUFFER_ELEMENTS;
        if (rank == 1) {
            rows_per = READ_ALL_BUFFER_ELEMENTS;
            cols_per = 1;
        }
        /* Per layer (a scheme's row), so that a checksum failure names it. */
        int per_layer = rank == 2 && !strcmp(d->dims[0], "layers");
        int per_row = rank == 2 && dyn_ckpt_is_dim(d->dims[0]);   /* a scheme's rows */
        if (per_row) rows_per = 1;
        if (per_layer) rows_per = 1;
        int failed = 0;
        for (hsize_t r = 0; r < rows && !failed; r += rows_per)
            for (hsize_t c = 0; c < cols && !failed; c += cols_per) {
                hsize_t start[2] = {r, c};
                hsize_t count[2] = {rows - r < rows_per ? rows - r : rows_per,
                                    cols - c < cols_per ? cols - c : cols_per};
                char what[64];
                if (per_layer)
                    snprintf(what, sizeof what, " (layer %llu)", (unsigned long long)r);
                else if (per_row)
                    snprintf(what, sizeof what, " (row %llu)", (unsigned long long)r);
                else
                    snprintf(what, sizeof what, " (rows %llu..%llu)", (unsigned long long)r,
                             (unsigned long long)(r + count[0] - 1));
                failed = read_slab(file, d->path, memory_type, rank, start, count, buffer,
                                   what, problems) != 0;
            }
    }
    dm_free(buffer);
    return problems->count - before;
}
