/* The schemes' parts of a checkpoint (dyn.h): which fragments a file of a
 * model holds (the model keys, shared by the schemes that have them, then
 * each present scheme's own lines, in the table's order), the schema they
 * make with a base version, and the routing of attributes, dimensions,
 * rows and the resume rule to the scheme that declared them. Must not:
 * know any scheme's lines, or touch HDF5 (src/ckpt does). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/schema.h"
#include "dyn/scheme.h"

/* What a file holds: the model keys, and each scheme's own lines. */
struct presence {
    int model_keys;
    unsigned own;   /* bit i: scheme i of the table */
};

static const struct dyn_ckpt_part *part_at(int i)
{
    return dyn_scheme_at(i)->ckpt;
}

static struct presence presence_of_shape(const struct gpt_shape *shape)
{
    struct presence p = {0, 0};
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (!part || !part->in_shape || !part->in_shape(shape)) continue;
        p.own |= 1u << i;
        p.model_keys |= part->model_keys;
    }
    return p;
}

/* Whether a line of the part's fragment is a model key. */
static int is_model_key(const struct dyn_ckpt_part *part, const char *object)
{
    return part->model_keys && !strcmp(object, "/model");
}

/* ---- the merged schema -------------------------------------------------------- */

enum { MERGED_LINES = 160, MERGED_CACHE = 32 };
struct merged {
    const struct ckpt_schema *base;
    struct presence presence;
    struct ckpt_schema schema;
    const char *groups[MERGED_LINES];
    struct schema_attr attrs[MERGED_LINES];
    struct schema_dataset datasets[MERGED_LINES];
};

/* Appends the lines of part s (model keys only, or its own lines). */
static void append_lines(struct merged *m, const struct dyn_ckpt_part *part, int keys)
{
    struct ckpt_schema *out = &m->schema;
    const struct ckpt_schema *s = part->schema;
    if (!s) return;
    DM_ASSERT(out->group_count + s->group_count <= MERGED_LINES &&
              out->attr_count + s->attr_count <= MERGED_LINES &&
              out->dataset_count + s->dataset_count <= MERGED_LINES);
    for (int i = 0; i < s->attr_count; i++)
        if (is_model_key(part, s->attrs[i].object) == keys) m->attrs[out->attr_count++] = s->attrs[i];
    if (keys) return;
    for (int i = 0; i < s->group_count; i++) m->groups[out->group_count++] = s->groups[i];
    for (int i = 0; i < s->dataset_count; i++) m->datasets[out->dataset_count++] = s->datasets[i];
}

static void merge_base(struct merged *m, const struct ckpt_schema *base)
{
    struct ckpt_schema *out = &m->schema;
    DM_ASSERT(base->group_count <= MERGED_LINES && base->attr_count <= MERGED_LINES &&
              base->dataset_count <= MERGED_LINES);
    out->version = base->version;
    out->groups = m->groups;
    out->attrs = m->attrs;
    out->datasets = m->datasets;
    for (int i = 0; i < base->group_count; i++) m->groups[out->group_count++] = base->groups[i];
    for (int i = 0; i < base->attr_count; i++) m->attrs[out->attr_count++] = base->attrs[i];
    for (int i = 0; i < base->dataset_count; i++)
        m->datasets[out->dataset_count++] = base->datasets[i];
}

/* Built on first use, one per (base, presence); the process builds them
 * from one thread (set-up, the checker). */
static const struct ckpt_schema *merged_schema(const struct ckpt_schema *base,
                                               struct presence p)
{
    static struct merged cache[MERGED_CACHE];
    static int cached;
    if (!p.model_keys && !p.own) return base;
    for (int i = 0; i < cached; i++)
        if (cache[i].base == base && cache[i].presence.model_keys == p.model_keys &&
            cache[i].presence.own == p.own)
            return &cache[i].schema;
    if (cached == MERGED_CACHE) DM_FATAL("more than %d checkpoint schemas", MERGED_CACHE);
    struct merged *m = &cache[cached++];
    memset(m, 0, sizeof *m);
    m->base = base;
    m->presence = p;
    merge_base(m, base);
    for (int i = 0; p.model_keys && i < dyn_scheme_count(); i++)
        if (part_at(i) && part_at(i)->model_keys) append_lines(m, part_at(i), 1);
    for (int i = 0; i < dyn_scheme_count(); i++)
        if (p.own & (1u << i)) append_lines(m, part_at(i), 0);
    return &m->schema;
}

const struct ckpt_schema *dyn_ckpt_schema(const struct ckpt_schema *base,
                                          const struct gpt_shape *shape)
{
    return merged_schema(base, presence_of_shape(shape));
}

/* ---- the schemes' own versions ------------------------------------------------- */

/* The scheme that owns schema version `version`, or -1. */
static int owner_of_version(long version)
{
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        for (int k = 0; part && part->versions && part->versions[k]; k++)
            if (part->versions[k]->version == version) return i;
    }
    return -1;
}

int dyn_ckpt_version(const struct gpt_shape *shape)
{
    struct presence p = presence_of_shape(shape);
    for (int i = 0; i < dyn_scheme_count(); i++)
        if ((p.own & (1u << i)) && part_at(i)->versions) return part_at(i)->versions[0]->version;
    return 0;
}

const struct ckpt_schema *dyn_ckpt_version_schema(long version)
{
    int i = owner_of_version(version);
    if (i < 0) return NULL;
    for (int k = 0; part_at(i)->versions[k]; k++)
        if (part_at(i)->versions[k]->version == version) return part_at(i)->versions[k];
    return NULL;
}

void dyn_ckpt_versions_text(char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (part && part->versions_text)
            used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s",
                                     part->versions_text);
    }
}

/* ---- writing ------------------------------------------------------------------ */

void dyn_ckpt_write_attrs(const struct gpt_shape *shape, const struct dyn_ckpt_writer *w)
{
    struct presence p = presence_of_shape(shape);
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (part && part->write_attrs && ((part->model_keys && p.model_keys) || (p.own & (1u << i))))
            part->write_attrs(shape, w);
    }
}

int dyn_ckpt_dims(const struct gpt_shape *shape, const char **names, long *values, int max)
{
    struct presence p = presence_of_shape(shape);
    int n = 0;
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (!(p.own & (1u << i)) || !part->dims) continue;
        for (int k = 0; part->dims[k]; k++) {
            if (n == max) DM_FATAL("more than %d checkpoint dimensions of schemes", max);
            names[n] = part->dims[k];
            values[n++] = part->dim(shape, part->dims[k]);
        }
    }
    return n;
}

int dyn_ckpt_is_dim(const char *name)
{
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        for (int k = 0; part && part->dims && part->dims[k]; k++)
            if (!strcmp(part->dims[k], name)) return 1;
    }
    return 0;
}

int dyn_ckpt_block_rows(const struct gpt_shape *shape, long version, const struct block *blk,
                        struct dyn_ckpt_rows *out, int max, int *base)
{
    struct presence p = presence_of_shape(shape);
    int n = 0;
    *base = owner_of_version(version) >= 0;
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if ((p.own & (1u << i)) && part->rows)
            n += part->rows(shape, version, blk, out + n, max - n);
    }
    return n;
}

int dyn_ckpt_writes_sharded(const struct gpt_shape *shape, int dp_rank)
{
    struct presence p = presence_of_shape(shape);
    for (int i = 0; i < dyn_scheme_count(); i++)
        if ((p.own & (1u << i)) && part_at(i)->writes_sharded)
            return part_at(i)->writes_sharded(shape, dp_rank);
    return 0;
}

void dyn_ckpt_write_state(const struct gpt_shape *shape, const struct block *blk,
                          const struct dyn_ckpt_state_writer *w)
{
    struct presence p = presence_of_shape(shape);
    for (int i = 0; i < dyn_scheme_count(); i++)
        if ((p.own & (1u << i)) && part_at(i)->write_state) part_at(i)->write_state(shape, blk, w);
}

/* ---- the schemes' states in a file ------------------------------------------------ */

struct dyn_ckpt_states {
    void *state[DYN_SCHEMES_LIMIT];
};

int dyn_ckpt_read_states(const struct gpt_shape *shape, const struct dyn_ckpt_reader *rd,
                         struct dyn_ckpt_states **states)
{
    struct presence p = presence_of_shape(shape);
    struct dyn_ckpt_states *all = dm_alloc(sizeof *all);
    int any = 0;
    *states = NULL;
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (!(p.own & (1u << i)) || !part->read_state) continue;
        if (part->read_state(shape, rd, &all->state[i]) != 0) {
            dyn_ckpt_states_free(all);
            return -1;
        }
        any |= all->state[i] != NULL;
    }
    if (any) *states = all;
    else dyn_ckpt_states_free(all);
    return 0;
}

void dyn_ckpt_apply_states(const struct dyn_ckpt_states *states, const struct gpt_shape *shape,
                           struct block *blk)
{
    for (int i = 0; states && i < dyn_scheme_count(); i++)
        if (states->state[i]) part_at(i)->apply_state(states->state[i], shape, blk);
}

void dyn_ckpt_states_free(struct dyn_ckpt_states *states)
{
    for (int i = 0; states && i < dyn_scheme_count(); i++)
        if (states->state[i]) part_at(i)->free_state(states->state[i]);
    dm_free(states);
}

int dyn_ckpt_compare(const struct gpt_shape *file, const struct gpt_shape *run, char *err,
                     size_t errsize)
{
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (part && part->compare && part->compare(file, run, err, errsize) != 0) return -1;
    }
    return 0;
}

/* ---- reading ------------------------------------------------------------------ */

struct dyn_ckpt_file {
    struct presence presence;
    unsigned char raw[DYN_SCHEMES_LIMIT][DYN_CKPT_RAW_BYTES];   /* each scheme's values */
};

/* The file has model keys when any scheme's first one is there. */
static int file_has_model_keys(const struct dyn_ckpt_reader *rd)
{
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (!part || !part->model_keys || !part->schema) continue;
        for (int k = 0; k < part->schema->attr_count; k++)
            if (is_model_key(part, part->schema->attrs[k].object))
                return rd->has(rd->ctx, "/model", part->schema->attrs[k].name);
    }
    return 0;
}

struct dyn_ckpt_file *dyn_ckpt_file_open(const struct dyn_ckpt_reader *rd, long version)
{
    struct dyn_ckpt_file *f = dm_alloc(sizeof *f);
    DM_ASSERT(dyn_scheme_count() <= DYN_SCHEMES_LIMIT);
    f->presence.model_keys = file_has_model_keys(rd);
    int owner = owner_of_version(version);
    if (owner >= 0) f->presence.own |= 1u << owner;   /* the version is the scheme's */
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (!part) continue;
        if (part->check_format && part->check_format(rd) != 0) {
            dm_free(f);
            return NULL;
        }
        if (part->in_file && part->in_file(rd)) f->presence.own |= 1u << i;
    }
    return f;
}

const struct ckpt_schema *dyn_ckpt_file_schema(const struct dyn_ckpt_file *f,
                                               const struct ckpt_schema *base)
{
    return merged_schema(base, f->presence);
}

/* The scheme whose present lines declare attribute (object, name), or -1. */
static int owner_of(const struct dyn_ckpt_file *f, const char *object, const char *name)
{
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        if (!part) continue;
        int keys = part->model_keys && f->presence.model_keys, own = f->presence.own & (1u << i);
        if (own && part->owns_attr && part->owns_attr(object, name)) return i;
        if (!part->schema) continue;
        for (int k = 0; k < part->schema->attr_count; k++) {
            const struct schema_attr *a = &part->schema->attrs[k];
            if (strcmp(a->object, object) != 0 || strcmp(a->name, name) != 0) continue;
            if (is_model_key(part, object) ? keys : own) return i;
        }
    }
    return -1;
}

int dyn_ckpt_file_owns(const struct dyn_ckpt_file *f, const char *object, const char *name)
{
    return owner_of(f, object, name) >= 0;
}

void dyn_ckpt_file_store(struct dyn_ckpt_file *f, const char *object, const char *name,
                         long long value, const char *text)
{
    int i = owner_of(f, object, name);
    DM_ASSERT(i >= 0);
    part_at(i)->store(f->raw[i], object, name, value, text);
}

int dyn_ckpt_file_check(struct dyn_ckpt_file *f, struct gpt_shape *shape,
                        const struct dyn_ckpt_reader *rd)
{
    for (int i = 0; i < dyn_scheme_count(); i++) {
        const struct dyn_ckpt_part *part = part_at(i);
        int present = part && ((part->model_keys && f->presence.model_keys) ||
                               (f->presence.own & (1u << i)));
        if (present && part->check(f->raw[i], shape, rd) != 0) return -1;
    }
    return 0;
}

void dyn_ckpt_file_free(struct dyn_ckpt_file *f)
{
    dm_free(f);
}

void dyn_ckpt_problem(const struct dyn_ckpt_reader *rd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dyn_send_problem(rd->problem, rd->ctx, fmt, ap);
    va_end(ap);
}

int dyn_ckpt_one_row(struct dyn_ckpt_rows *out, int max, const char *group, long ordinal,
                     size_t offset, size_t floats)
{
    DM_ASSERT(max >= 1 && ordinal >= 0);
    out[0] = (struct dyn_ckpt_rows){.group = group, .row = ordinal, .count = 1,
                                    .offset = offset, .floats = floats};
    return 1;
}
