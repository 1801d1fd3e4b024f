/* The checkpoint schema extension dyn.def: a dynamism scheme's own state
 * (freezing's gradient-norm window) as the group /dyn, its attribute kind
 * and the float64 dataset /dyn/state. A file has it only when the run's
 * scheme keeps such a state; every other file is its version's schema
 * alone, byte for byte what it was before this extension.
 *
 * Here: the extension's lines compiled in and appended to a version's
 * schema (so the writer, the structural check and the full read treat
 * /dyn like every other entry), the reader of /dyn into struct ckpt_meta
 * with the scheme's own value checks (dyn_state_check), and the writer's
 * attribute. What the state means is src/dyn's; what to do with it on a
 * resume is the caller's. No MPI. */
#include <stdio.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "ckpt/ckpt_file.h"
#include "ckpt/h5util.h"

/* ---- dyn.def's lines -------------------------------------------------------- */

#define SCHEMA_GROUP(path) path,
#define SCHEMA_ATTR(object, name, type, value)
#define SCHEMA_DATASET(path, type, dim0, dim1)
static const char *const dyn_groups[] = {
#include "../../checkpoint_schema/dyn.def"
};
#undef SCHEMA_GROUP
#undef SCHEMA_ATTR
#define SCHEMA_GROUP(path)
#define SCHEMA_ATTR(object, name, type, value) {object, name, SCHEMA_TYPE_##type, value},
static const struct schema_attr dyn_attrs[] = {
#include "../../checkpoint_schema/dyn.def"
};
#undef SCHEMA_ATTR
#undef SCHEMA_DATASET
#define SCHEMA_ATTR(object, name, type, value)
#define SCHEMA_DATASET(path, type, dim0, dim1) {path, SCHEMA_TYPE_##type, {dim0, dim1}},
static const struct schema_dataset dyn_datasets[] = {
#include "../../checkpoint_schema/dyn.def"
};
#undef SCHEMA_GROUP
#undef SCHEMA_ATTR
#undef SCHEMA_DATASET

#define COUNT(array) ((int)(sizeof array / sizeof array[0]))

static const struct ckpt_schema dyn_part = {
    .groups = dyn_groups,
    .group_count = COUNT(dyn_groups),
    .attrs = dyn_attrs,
    .attr_count = COUNT(dyn_attrs),
    .datasets = dyn_datasets,
    .dataset_count = COUNT(dyn_datasets),
};

/* Room for a base schema's entries plus an extension's (v3 has 34
 * datasets, the schemes' fragments add theirs), and for every base: v1,
 * v2, v3, each alone or with the schemes' fragments (dyn_ckpt_schema),
 * with dyn.def, units.def or both. */
#define MERGED_ENTRIES 192
#define MERGED_SCHEMAS 64

/* One extended schema per base and extension, made on first use and kept. */
struct merged_schema {
    const struct ckpt_schema *base, *part;
    const char *groups[MERGED_ENTRIES];
    struct schema_attr attrs[MERGED_ENTRIES];
    struct schema_dataset datasets[MERGED_ENTRIES];
    struct ckpt_schema schema;
};
static struct merged_schema merged[MERGED_SCHEMAS];
static int merged_count;

const struct ckpt_schema *ckpt_schema_append(const struct ckpt_schema *base,
                                             const struct ckpt_schema *part)
{
    for (int i = 0; i < merged_count; i++)
        if (merged[i].part == part && (merged[i].base == base || &merged[i].schema == base))
            return &merged[i].schema;
    DM_ASSERT(merged_count < MERGED_SCHEMAS);
    DM_ASSERT(base->group_count + part->group_count <= MERGED_ENTRIES &&
              base->attr_count + part->attr_count <= MERGED_ENTRIES &&
              base->dataset_count + part->dataset_count <= MERGED_ENTRIES);
    struct merged_schema *m = &merged[merged_count++];
    m->base = base;
    m->part = part;
    memcpy(m->groups, base->groups, (size_t)base->group_count * sizeof m->groups[0]);
    memcpy(m->groups + base->group_count, part->groups,
           (size_t)part->group_count * sizeof m->groups[0]);
    memcpy(m->attrs, base->attrs, (size_t)base->attr_count * sizeof m->attrs[0]);
    memcpy(m->attrs + base->attr_count, part->attrs,
           (size_t)part->attr_count * sizeof m->attrs[0]);
    memcpy(m->datasets, base->datasets, (size_t)base->dataset_count * sizeof m->datasets[0]);
    memcpy(m->datasets + base->dataset_count, part->datasets,
           (size_t)part->dataset_count * sizeof m->datasets[0]);
    m->schema = (struct ckpt_schema){
        .version = base->version,
        .groups = m->groups,
        .group_count = base->group_count + part->group_count,
        .attrs = m->attrs,
        .attr_count = base->attr_count + part->attr_count,
        .datasets = m->datasets,
        .dataset_count = base->dataset_count + part->dataset_count,
    };
    return &m->schema;
}

const struct ckpt_schema *ckpt_schema_with_dyn(const struct ckpt_schema *base)
{
    return ckpt_schema_append(base, &dyn_part);
}

/* ---- reading ----------------------------------------------------------------- */

/* /dyn/state's length, the one dimension the extension adds: 1-D, 1 ..
 * DYN_STATE_MAX values (another shape is left to the dataset's check). */
static long dyn_state_length(hid_t file, struct ckpt_problems *problems)
{
    long length = -1;
    if (!dm_h5_path_exists(file, "/dyn/state")) return -1;
    hid_t dataset = H5Dopen2(file, "/dyn/state", H5P_DEFAULT);
    hid_t space = dataset >= 0 ? H5Dget_space(dataset) : -1;
    hsize_t n[H5S_MAX_RANK] = {0};
    if (space >= 0 && H5Sget_simple_extent_ndims(space) == 1) {
        H5Sget_simple_extent_dims(space, n, NULL);
        if (n[0] >= 1 && n[0] <= (hsize_t)DYN_STATE_MAX)
            length = (long)n[0];
        else
            ckpt_problem(problems, "/dyn/state holds %llu values (a scheme's state holds 1 to "
                         "%ld)", (unsigned long long)n[0], DYN_STATE_MAX);
    }
    if (space >= 0) H5Sclose(space);
    if (dataset >= 0) H5Dclose(dataset);
    H5Eclear2(H5E_DEFAULT);
    return length;
}

const struct ckpt_schema *ckpt_dyn_extend(hid_t file, struct ckpt_header *header,
                                          struct ckpt_problems *problems)
{
    if (!dm_h5_path_exists(file, "/dyn")) return header->schema;
    header->schema = ckpt_schema_with_dyn(header->schema);
    header->dims.dyn_state = dyn_state_length(file, problems);
    return header->schema;
}

int ckpt_dyn_read(hid_t file, const struct ckpt_header *header, struct ckpt_meta *meta,
                  struct ckpt_problems *problems)
{
    long n = header->dims.dyn_state;
    DM_ASSERT(n >= 1 && n <= DYN_STATE_MAX);
    snprintf(meta->dyn_kind, sizeof meta->dyn_kind, "%s", header->dyn_kind);
    meta->dyn_state = dm_alloc((size_t)n * sizeof(double));
    meta->dyn_state_count = n;
    if (ckpt_read_dataset(file, header, "/dyn/state", H5T_NATIVE_DOUBLE, meta->dyn_state,
                          problems) != 0)
        return -1;
    char reason[512];
    if (dyn_state_check(header->dyn_kind, meta->dyn_state, n, (int)header->dims.layers, reason,
                        sizeof reason) != 0) {
        ckpt_problem(problems, "/dyn/state of dyn.kind \"%s\": %s", header->dyn_kind, reason);
        return -1;
    }
    return 0;
}

/* ---- writing ----------------------------------------------------------------- */

void ckpt_dyn_write_attributes(hid_t file, const struct ckpt_meta *meta)
{
    hid_t group = DM_H5(H5Gopen2(file, "/dyn", H5P_DEFAULT));
    dm_h5_write_string_attr(group, "kind", meta->dyn_kind);
    DM_H5(H5Gclose(group));
}
