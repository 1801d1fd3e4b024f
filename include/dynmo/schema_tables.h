/* One checkpoint schema's tables (dynmo/schema.h), compiled in from its
 * .def file (checkpoint_schema/): a file includes this once per .def,
 * with SCHEMA_FILE naming the .def file (a string, relative to the
 * including file: "../../checkpoint_schema/v1.def" from src/ckpt or
 * src/dyn) and SCHEMA_NAME the struct ckpt_schema to define (static when
 * SCHEMA_STATIC is defined). No include guard on purpose: ckpt_file.c
 * includes it per version, a scheme for its fragment. */
#define SCHEMA_CAT2(a, b) a##b
#define SCHEMA_CAT(a, b) SCHEMA_CAT2(a, b)

#define SCHEMA_VERSION(n) n
#define SCHEMA_GROUP(path)
#define SCHEMA_ATTR(object, name, type, value)
#define SCHEMA_DATASET(path, type, dim0, dim1)
enum {
    SCHEMA_CAT(SCHEMA_NAME, _number) =
#include SCHEMA_FILE
};
#undef SCHEMA_VERSION
#define SCHEMA_VERSION(n)

#undef SCHEMA_GROUP
#define SCHEMA_GROUP(path) path,
static const char *const SCHEMA_CAT(SCHEMA_NAME, _groups)[] = {
#include SCHEMA_FILE
};
#undef SCHEMA_GROUP
#define SCHEMA_GROUP(path)

#undef SCHEMA_ATTR
#define SCHEMA_ATTR(object, name, type, value) {object, name, SCHEMA_TYPE_##type, value},
static const struct schema_attr SCHEMA_CAT(SCHEMA_NAME, _attrs)[] = {
#include SCHEMA_FILE
};
#undef SCHEMA_ATTR
#define SCHEMA_ATTR(object, name, type, value)

#undef SCHEMA_DATASET
#define SCHEMA_DATASET(path, type, dim0, dim1) {path, SCHEMA_TYPE_##type, {dim0, dim1}},
static const struct schema_dataset SCHEMA_CAT(SCHEMA_NAME, _datasets)[] = {
#include SCHEMA_FILE
};

#ifdef SCHEMA_STATIC
static
#endif
const struct ckpt_schema SCHEMA_NAME = {
    .version = SCHEMA_CAT(SCHEMA_NAME, _number),
    .groups = SCHEMA_CAT(SCHEMA_NAME, _groups),
    .group_count = (int)(sizeof SCHEMA_CAT(SCHEMA_NAME, _groups) /
                         sizeof SCHEMA_CAT(SCHEMA_NAME, _groups)[0]),
    .attrs = SCHEMA_CAT(SCHEMA_NAME, _attrs),
    .attr_count = (int)(sizeof SCHEMA_CAT(SCHEMA_NAME, _attrs) /
                        sizeof SCHEMA_CAT(SCHEMA_NAME, _attrs)[0]),
    .datasets = SCHEMA_CAT(SCHEMA_NAME, _datasets),
    .dataset_count = (int)(sizeof SCHEMA_CAT(SCHEMA_NAME, _datasets) /
                           sizeof SCHEMA_CAT(SCHEMA_NAME, _datasets)[0]),
};

#undef SCHEMA_VERSION
#undef SCHEMA_GROUP
#undef SCHEMA_ATTR
#undef SCHEMA_DATASET
#undef SCHEMA_CAT
#undef SCHEMA_CAT2
