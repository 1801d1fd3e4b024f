/* Hash-sparse attention (model.attention = hash, [hash]; docs/mod-hash.md)
 * as a dynamic scheme: its descriptor, the config's rules over its keys
 * and its refusals of other schemes. */
#include <stdio.h>
#include <string.h>
#include "dynmo/schema.h"
#include "dyn/scheme.h"

#define SCHEMA_FILE "../../checkpoint_schema/hash.def"
#define SCHEMA_NAME hash_schema
#define SCHEMA_STATIC
#include "dynmo/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
#undef SCHEMA_STATIC

static int hash_active(const struct dm_config *cfg) { return !strcmp(cfg->attention, "hash"); }

static const char *const hash_keys[] = {"hash.*", NULL};

static void hash_check(const struct dm_config *cfg)
{
    int hash = hash_active(cfg);
    if (!hash && strcmp(cfg->attention, "dense") != 0)
        dm_user_error("model.attention = '%s' must be dense or hash", cfg->attention);
    if (!hash && dyn_keys_set(cfg, hash_keys))
        dm_user_error("hash.buckets = %d is set but model.attention = dense: set "
                      "model.attention = hash, or remove [hash]", cfg->hash_buckets);
    if (!hash) return;
    if (cfg->hash_buckets < 1 || (cfg->hash_buckets > 1 && cfg->hash_buckets % 2))
        dm_user_error("hash.buckets = %d must be 1 or an even number >= 2 (the hash is the "
                      "argmax over [xR ; -xR], R with buckets / 2 columns)",
                      cfg->hash_buckets);
    if (cfg->hash_buckets > cfg->max_seq)
        dm_user_error("hash.buckets = %d exceeds model.max_seq = %d: a sequence has fewer "
                      "tokens than buckets (at most max_seq buckets)", cfg->hash_buckets,
                      cfg->max_seq);
    if (!strcmp(cfg->dyn_kind, "early_exit"))
        dm_user_error("model.attention = hash does not combine with dyn.kind = early_exit "
                      "(exited tokens answer as keys outside the hash buckets)");
}

/* ---- signals --------------------------------------------------------------------- */

/* The tiles the block's hash attention visited since the last read,
 * forward and backward, then zero. */
static void read_tiles(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    struct block *blk = &model->blocks[i];
    value[0] = blk->hash_tiles;
    blk->hash_tiles = 0.0;
}

/* The query rows (per head) that attended to their own key alone, over
 * those its forwards saw, then zero. */
static void read_own_key_only(struct gpt *model, int i, double *value, double *weight)
{
    struct block *blk = &model->blocks[i];
    value[0] = blk->hash_own_key_only;
    weight[0] = blk->hash_queries;
    blk->hash_own_key_only = blk->hash_queries = 0.0;
}

static const struct dyn_signal hash_signals[] = {
    {"/hash/tiles", "hash tiles visited", "tiles",
     "attention tiles the block visited, forward and backward, over micro-batches and "
     "replicas",
     DYN_SIGNAL_LAYERS, DYN_COMBINE_SUM, 0, 0, NULL, NULL, read_tiles},
    {"/hash/own_key_only", "own key only", "share",
     "the share of the query rows that had no key of their bucket but their own",
     DYN_SIGNAL_LAYERS, DYN_COMBINE_RATIO, 0, 0, NULL, NULL, read_own_key_only},
};

/* ---- the checkpoint (checkpoint_schema/hash.def) ---------------------------------- */

static int hash_in_shape(const struct gpt_shape *shape) { return shape->hash.buckets > 0; }

static void hash_write_attrs(const struct gpt_shape *shape, const struct dyn_ckpt_writer *w)
{
    w->string_attr(w->ctx, "/model", "attention", shape->hash.buckets > 0 ? "hash" : "dense");
    w->int_attr(w->ctx, "/model", "hash_buckets", shape->hash.buckets);
}

/* What a file says. */
struct hash_file {
    char attention[16];
    long long buckets;
};

static void hash_store(void *raw, const char *object, const char *name, long long value,
                       const char *text)
{
    (void)object;
    struct hash_file *f = raw;
    if (!strcmp(name, "attention")) snprintf(f->attention, sizeof f->attention, "%s", text);
    else if (!strcmp(name, "hash_buckets")) f->buckets = value;
}

static int hash_file_check(const void *raw, struct gpt_shape *shape,
                           const struct dyn_ckpt_reader *rd)
{
    const struct hash_file *f = raw;
    int hash = !strcmp(f->attention, "hash"), buckets = (int)f->buckets;
    if ((!hash && strcmp(f->attention, "dense") != 0) || buckets < 0 ||
        (hash && (buckets < 1 || (buckets > 1 && buckets % 2) ||
                  (shape->max_seq > 0 && buckets > shape->max_seq))) ||
        (!hash && buckets != 0)) {
        dyn_ckpt_problem(rd, "/model: attention \"%s\" with hash_buckets %d (expected dense "
                         "with 0, or hash with 1 or an even number up to max_seq)",
                         f->attention, buckets);
        return -1;
    }
    shape->hash.buckets = buckets;
    return 0;
}

static int hash_compare(const struct gpt_shape *file, const struct gpt_shape *run, char *err,
                        size_t errsize)
{
    if (file->hash.buckets == run->hash.buckets) return 0;
    snprintf(err, errsize, "written for a different model: attention is %s with %d hash "
             "buckets in the checkpoint but %s with %d in this run (model.attention, "
             "hash.buckets; use the checkpoint's model config, or start a new run in another "
             "ckpt.dir)", file->hash.buckets ? "hash" : "dense", file->hash.buckets,
             run->hash.buckets ? "hash" : "dense", run->hash.buckets);
    return -1;
}

static const struct dyn_ckpt_part hash_ckpt = {
    .schema = &hash_schema,
    .model_keys = 1,
    .in_shape = hash_in_shape,
    .write_attrs = hash_write_attrs,
    .store = hash_store,
    .check = hash_file_check,
    .compare = hash_compare,
};

const struct dyn_scheme dyn_scheme_hash = {
    .ckpt = &hash_ckpt,
    .name = "hash",
    .active = hash_active,
    .keys = hash_keys,
    .check = hash_check,
    .signals = hash_signals,
    .signal_count = sizeof hash_signals / sizeof hash_signals[0],
};
