/* dynmo schema: the lines of the checkpoint schema as the .def files of
 * checkpoint_schema/ declare them (groups, attributes, datasets with their
 * types and named dimensions), the one description that the writer, the
 * loader and `dynmo check-ckpt` follow. A schema version is the base's
 * lines (ckpt); a dynamic scheme adds its fragment's lines (dyn), so the
 * types live here, with the schemes, below the checkpoint module.
 * dynmo/schema_tables.h compiles a .def file into a struct ckpt_schema. */
#ifndef DYNMO_SCHEMA_H
#define DYNMO_SCHEMA_H

enum schema_type {
    SCHEMA_TYPE_STRING,
    SCHEMA_TYPE_INT64,
    SCHEMA_TYPE_UINT64,
    SCHEMA_TYPE_INT32,
    SCHEMA_TYPE_FLOAT32,
    SCHEMA_TYPE_FLOAT64,     /* the extension dyn.def's /dyn/state */
};

struct schema_attr {
    const char *object;      /* "/" or a group path */
    const char *name;
    enum schema_type type;
    const char *value;       /* required value as text, "" = any */
};

struct schema_dataset {
    const char *path;
    enum schema_type type;
    const char *dims[2];     /* dimension names; dims[1] "" = one-dimensional */
};

/* One .def file's tables: a schema version (checkpoint_schema/vN.def) or a
 * scheme's fragment; version is its SCHEMA_VERSION. */
struct ckpt_schema {
    int version;
    const char *const *groups;
    int group_count;
    const struct schema_attr *attrs;
    int attr_count;
    const struct schema_dataset *datasets;
    int dataset_count;
};

#endif
