/* The checkpoint's record of hash-sparse attention and mixture of depths
 * (docs/mod-hash.md): the schema extensions checkpoint_schema/model-keys.def
 * (the /model keys) and mod.def (the MoD blocks' router and predictor, in
 * mod.def's own format), the schemas a model with either is written and
 * checked in (version 1, or 3 with MoE blocks, plus the extensions; 2 is
 * read too; a dense model's stay as they were), writing the keys, and
 * reading them back into a checkpoint header; a file whose /mod is in
 * another format is refused, naming it.
 *
 * It never calls MPI and writes nothing but the /model and /mod
 * attributes; the rows go through checkpoint.c's writer and the loader
 * like any other. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "ckpt/ckpt_file.h"
#include "ckpt/h5util.h"

#define SCHEMA_FILE "../../checkpoint_schema/model-keys.def"
#define SCHEMA_NAME ckpt_schema_model_keys
#include "ckpt/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
#define SCHEMA_FILE "../../checkpoint_schema/mod.def"
#define SCHEMA_NAME ckpt_schema_mod
#include "ckpt/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
_Static_assert(ckpt_schema_mod_number == CKPT_MOD_FORMAT,
               "mod.def's SCHEMA_VERSION is the /mod format written and read");

/* A base schema followed by the extensions' lines: the extension lines
 * come after the base's, so that a check can start where the base ends. */
enum { MERGED_MAX = 96 };
struct merged_schema {
    struct ckpt_schema schema;
    const char *groups[MERGED_MAX];
    struct schema_attr attrs[MERGED_MAX];
    struct schema_dataset datasets[MERGED_MAX];
};

static void merge_append(struct merged_schema *m, const struct ckpt_schema *s)
{
    struct ckpt_schema *out = &m->schema;
    DM_ASSERT(out->group_count + s->group_count <= MERGED_MAX &&
              out->attr_count + s->attr_count <= MERGED_MAX &&
              out->dataset_count + s->dataset_count <= MERGED_MAX);
    for (int i = 0; i < s->group_count; i++) m->groups[out->group_count++] = s->groups[i];
    for (int i = 0; i < s->attr_count; i++) m->attrs[out->attr_count++] = s->attrs[i];
    for (int i = 0; i < s->dataset_count; i++)
        m->datasets[out->dataset_count++] = s->datasets[i];
}

/* Built on first use, one per (base version, with /mod or not); the
 * process builds them from one thread (set-up, the checker). */
const struct ckpt_schema *ckpt_schema_extended(const struct ckpt_schema *base, int with_mod)
{
    static struct merged_schema merged[3][2];
    static int built[3][2];
    DM_ASSERT(base == &ckpt_schema_v1 || base == &ckpt_schema_v2 || base == &ckpt_schema_v3);
    int b = base->version - 1;
    struct merged_schema *m = &merged[b][with_mod != 0];
    if (!built[b][with_mod != 0]) {
        memset(m, 0, sizeof *m);
        m->schema.version = base->version;
        m->schema.groups = m->groups;
        m->schema.attrs = m->attrs;
        m->schema.datasets = m->datasets;
        merge_append(m, base);
        merge_append(m, &ckpt_schema_model_keys);
        if (with_mod) merge_append(m, &ckpt_schema_mod);
        built[b][with_mod != 0] = 1;
    }
    return &m->schema;
}

int ckpt_shape_has_model_keys(const struct gpt_shape *shape)
{
    return shape->hash.buckets > 0 || shape->mod.every > 0;
}

static void write_int64_attr(hid_t loc, const char *name, long long value)
{
    hid_t space = DM_H5(H5Screate(H5S_SCALAR));
    hid_t attr = DM_H5(H5Acreate2(loc, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT));
    DM_H5(H5Awrite(attr, H5T_NATIVE_LLONG, &value));
    DM_H5(H5Aclose(attr));
    DM_H5(H5Sclose(space));
}

void ckpt_write_model_keys(hid_t model_group, const struct gpt_shape *shape)
{
    const struct gpt_mod *mod = &shape->mod;
    char capacity[40];
    snprintf(capacity, sizeof capacity, "%.17g", mod->every > 0 ? mod->capacity : 0.0);
    dm_h5_write_string_attr(model_group, "attention", shape->hash.buckets > 0 ? "hash"
                                                                            : "dense");
    write_int64_attr(model_group, "hash_buckets", shape->hash.buckets);
    write_int64_attr(model_group, "mod_every", mod->every);
    dm_h5_write_string_attr(model_group, "mod_capacity", capacity);
    dm_h5_write_string_attr(model_group, "mod_routing",
                            mod->every == 0 ? ""
                            : mod->routing == MOD_ROUTING_CAUSAL ? "causal" : "topk");
}

void ckpt_write_mod_attributes(hid_t file, const struct gpt_shape *shape)
{
    hid_t group = DM_H5(H5Gopen2(file, "/mod", H5P_DEFAULT));
    write_int64_attr(group, "format", CKPT_MOD_FORMAT);
    write_int64_attr(group, "predictor_hidden", shape->mod.predictor_hidden);
    DM_H5(H5Gclose(group));
}

/* Integer attribute name of object (a group), or fallback when it is
 * absent or unreadable (the check of the attribute itself reports that). */
static long long file_integer(hid_t file, const char *object, const char *name,
                              long long fallback)
{
    long long value = fallback;
    if (!dm_h5_path_exists(file, object) ||
        H5Aexists_by_name(file, object, name, H5P_DEFAULT) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return fallback;
    }
    hid_t attr = H5Aopen_by_name(file, object, name, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0 || H5Aread(attr, H5T_NATIVE_LLONG, &value) < 0) value = fallback;
    if (attr >= 0) H5Aclose(attr);
    H5Eclear2(H5E_DEFAULT);
    return value;
}

/* The file's mod_every when /model has the keys (0 when it is absent or
 * unreadable). */
static long long file_mod_every(hid_t file)
{
    return file_integer(file, "/model", "mod_every", 0);
}

int ckpt_check_mod_format(hid_t file, struct ckpt_problems *problems)
{
    if (!dm_h5_path_exists(file, "/mod")) return 0;   /* reported with its group */
    long long format = file_integer(file, "/mod", "format", 1);
    if (format == CKPT_MOD_FORMAT) return 0;
    ckpt_problem(problems, "its mixture-of-depths rows (/mod) are in format %lld%s; this "
                 "dynmo reads /mod format %d only (the router, then the causal routing's MLP "
                 "predictor of mod.predictor_hidden units; checkpoint_schema/mod.def): resume "
                 "with the dynmo that wrote it, or start a new run in another ckpt.dir",
                 format, format == 1 ? " (no attribute format: written before format 2, "
                                       "with a linear causal predictor)" : "",
                 CKPT_MOD_FORMAT);
    return -1;
}

const struct ckpt_schema *ckpt_schema_of_file(hid_t file, const struct ckpt_schema *base)
{
    htri_t keys = dm_h5_path_exists(file, "/model")
                      ? H5Aexists_by_name(file, "/model", "attention", H5P_DEFAULT) : 0;
    H5Eclear2(H5E_DEFAULT);
    if (keys <= 0) return base;
    return ckpt_schema_extended(base, file_mod_every(file) > 0);
}

void ckpt_header_store_model_key(struct ckpt_header *h, const char *name, const char *text)
{
    if (!strcmp(name, "attention")) {
        snprintf(h->attention, sizeof h->attention, "%s", text);
    } else if (!strcmp(name, "mod_routing")) {
        h->shape.mod.routing = !strcmp(text, "causal") ? MOD_ROUTING_CAUSAL : MOD_ROUTING_TOPK;
        h->mod_routing_ok = !strcmp(text, "causal") || !strcmp(text, "topk") || !text[0];
    } else if (!strcmp(name, "mod_capacity")) {
        char *end = NULL;
        h->shape.mod.capacity = strtod(text, &end);
        if (!text[0] || *end) h->shape.mod.capacity = NAN;
    }
}

/* The keys' values against each other and the model; the MoD dimensions.
 * Returns 0, or -1 after reporting. */
int ckpt_check_model_keys(struct ckpt_header *h, struct ckpt_problems *problems)
{
    if (!h->model_keys) return 0;   /* none: a dense model's file */
    struct gpt_shape *s = &h->shape;
    int hash = !strcmp(h->attention, "hash");
    if ((!hash && strcmp(h->attention, "dense") != 0) || s->hash.buckets < 0 ||
        (hash && (s->hash.buckets < 1 || (s->hash.buckets > 1 && s->hash.buckets % 2) ||
                  (h->dims.max_seq > 0 && s->hash.buckets > h->dims.max_seq))) ||
        (!hash && s->hash.buckets != 0)) {
        ckpt_problem(problems, "/model: attention \"%s\" with hash_buckets %d (expected "
                     "dense with 0, or hash with 1 or an even number up to max_seq)", h->attention,
                     s->hash.buckets);
        return -1;
    }
    if (s->mod.every < 0 || s->mod.every > s->layers ||
        (s->mod.every > 0 && (!(s->mod.capacity > 0.0 && s->mod.capacity <= 1.0) ||
                              !h->mod_routing_ok))) {
        ckpt_problem(problems, "/model: mixture-of-depths keys out of range (mod_every %d "
                     "for %d layers, mod_capacity %g, mod_routing valid %d)", s->mod.every,
                     s->layers, s->mod.capacity, h->mod_routing_ok);
        return -1;
    }
    if (s->mod.every == 0) {   /* the run's shape has them zero then */
        s->mod.capacity = 0.0;
        s->mod.routing = 0;
        s->mod.predictor_hidden = 0;
    }
    int causal = s->mod.every > 0 && s->mod.routing == MOD_ROUTING_CAUSAL;
    if (s->mod.every > 0 && (causal ? s->mod.predictor_hidden < 1 ||
                                      s->mod.predictor_hidden > 65536
                                    : s->mod.predictor_hidden != 0)) {
        ckpt_problem(problems, "/mod: predictor_hidden %d with %s routing (expected 1 .. 65536 "
                     "with causal, 0 with topk)", s->mod.predictor_hidden,
                     causal ? "causal" : "topk");
        return -1;
    }
    h->dims.mod_layers = gpt_mod_block_count(s) > 0 ? gpt_mod_block_count(s) : -1;
    h->dims.mod_params = s->mod.every > 0 ? (long)mod_extra_param_count(s, s->mod.every - 1) : -1;
    return 0;
}

int ckpt_compare_model_keys(const struct gpt_shape *file_shape,
                            const struct gpt_shape *run_shape, char *err, size_t errsize)
{
    const struct gpt_mod *f = &file_shape->mod, *r = &run_shape->mod;
    static const char *routing[] = {"topk", "causal"};
    if (file_shape->hash.buckets != run_shape->hash.buckets) {
        snprintf(err, errsize, "written for a different model: attention is %s with %d "
                 "hash buckets in the checkpoint but %s with %d in this run (model.attention, "
                 "hash.buckets; use the checkpoint's model config, or start a new run in "
                 "another ckpt.dir)", file_shape->hash.buckets ? "hash" : "dense",
                 file_shape->hash.buckets, run_shape->hash.buckets ? "hash" : "dense",
                 run_shape->hash.buckets);
        return -1;
    }
    if (f->every != r->every || (f->every > 0 && (f->capacity != r->capacity ||
                                                  f->routing != r->routing ||
                                                  f->predictor_hidden != r->predictor_hidden))) {
        snprintf(err, errsize, "written for a different model: mixture of depths is "
                 "model.mod_every %d, model.mod_capacity %g, mod.routing %s, "
                 "mod.predictor_hidden %d in the checkpoint but %d, %g, %s, %d in this run (use "
                 "the checkpoint's model config, or start a new run in another ckpt.dir)",
                 f->every, f->capacity, f->every ? routing[f->routing] : "-",
                 f->predictor_hidden, r->every, r->capacity,
                 r->every ? routing[r->routing] : "-", r->predictor_hidden);
        return -1;
    }
    return 0;
}
