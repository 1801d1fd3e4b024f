/* Mixture of depths (model.mod_every, [mod]; docs/mod-hash.md) as a
 * dynamic scheme: its descriptor, the config's rules over its keys and its
 * refusals of other schemes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/schema.h"
#include "dyn/scheme.h"

#define SCHEMA_FILE "../../checkpoint_schema/mod.def"
#define SCHEMA_NAME mod_schema
#define SCHEMA_STATIC
#include "dynmo/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
#undef SCHEMA_STATIC
/* mod.def's SCHEMA_VERSION: the /mod format written and read. */
enum { MOD_FORMAT = 2 };
_Static_assert((int)mod_schema_number == (int)MOD_FORMAT, "mod.def's SCHEMA_VERSION is the /mod format");

static int mod_active(const struct dm_config *cfg) { return cfg->mod_every > 0; }

static const char *const mod_keys[] = {"mod.*", NULL};

static void mod_check_on(const struct dm_config *cfg)
{
    char value[32];
    dm_format_shortest(value, sizeof value, cfg->mod_capacity);
    if (!(cfg->mod_capacity > 0.0 && cfg->mod_capacity <= 1.0))
        dm_user_error("model.mod_capacity = %s is outside (0, 1]: it is the fraction of "
                      "a sequence's tokens a mixture-of-depths block processes", value);
    if (cfg->mod_every > cfg->layers)
        dm_user_error("model.mod_every = %d exceeds model.layers = %d: no block would "
                      "be a mixture of depths", cfg->mod_every, cfg->layers);
    if (strcmp(cfg->mod_routing, "topk") != 0 && strcmp(cfg->mod_routing, "causal") != 0)
        dm_user_error("mod.routing = '%s' must be topk or causal", cfg->mod_routing);
    if (cfg->mod_predictor_hidden < 1 || cfg->mod_predictor_hidden > 65536)
        dm_user_error("mod.predictor_hidden = %d is outside 1..65536: it is the hidden "
                      "width of the causal routing's MLP predictor",
                      cfg->mod_predictor_hidden);
    if (config_was_set(cfg, "mod.predictor_hidden") && strcmp(cfg->mod_routing, "causal") != 0)
        dm_user_error("mod.predictor_hidden = %d is set but mod.routing = %s has no "
                      "predictor: set mod.routing = causal, or remove "
                      "mod.predictor_hidden", cfg->mod_predictor_hidden, cfg->mod_routing);
}

/* Its keys, then the schemes it does not combine with. */
static void mod_check(const struct dm_config *cfg)
{
    if (cfg->mod_every == 0 && dyn_keys_set(cfg, mod_keys))
        dm_user_error("[mod] is set (mod.routing = %s, mod.predictor_hidden = %d) but "
                      "model.mod_every = 0 (no mixture-of-depths blocks): set "
                      "model.mod_every, or remove [mod]", cfg->mod_routing,
                      cfg->mod_predictor_hidden);
    if (cfg->mod_every == 0) return;
    mod_check_on(cfg);
    if (cfg->moe_every > 0)
        dm_user_error("model.mod_every = %d with model.moe_every = %d: mixture of depths "
                      "and mixture of experts do not combine yet; set one of them to 0",
                      cfg->mod_every, cfg->moe_every);
    if (!strcmp(cfg->dyn_kind, "prune") || !strcmp(cfg->dyn_kind, "early_exit"))
        dm_user_error("dyn.kind = %s does not combine with mixture of depths "
                      "(model.mod_every = %d) yet", cfg->dyn_kind, cfg->mod_every);
}

/* ---- signals --------------------------------------------------------------------- */

static int mod_owns(const struct gpt_shape *shape, int layer) { return gpt_block_is_mod(shape, layer); }
static int mod_causal(const struct dm_config *cfg) { return !strcmp(cfg->mod_routing, "causal"); }

/* The tokens the block's forwards processed since the last read, then zero. */
static void read_tokens(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    struct block_mod *mod = model->blocks[i].mod;
    value[0] = mod->tokens;
    mod->tokens = 0.0;
}

/* The predictor's mean BCE over the forwards since the last read, then zero. */
static void read_bce(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    struct block_mod *mod = model->blocks[i].mod;
    value[0] = mod->bce_forwards ? mod->bce / (double)mod->bce_forwards : 0.0;
    mod->bce = 0.0;
    mod->bce_forwards = 0;
}

static const struct dyn_signal mod_signals[] = {
    {"/mod/tokens", "MoD tokens processed", "tokens",
     "tokens the block computed in the step, over micro-batches and replicas",
     DYN_SIGNAL_BLOCKS, DYN_COMBINE_SUM, 0, 0, NULL, NULL, read_tokens},
    {"/mod/predictor_bce", "predictor BCE", "nats",
     "the causal predictor's binary cross-entropy against the top-k choice",
     DYN_SIGNAL_BLOCKS, DYN_COMBINE_REPLICA_MEAN, 0, 0, mod_causal, NULL, read_bce},
};

/* The MoD blocks' share of the tokens that reached them. */
static void mod_step_note(const struct dm_config *cfg, const struct dyn_signal_row *rows,
                          int count, double tokens, char *buf, size_t size)
{
    (void)cfg;
    const struct dyn_signal_row *row = dyn_signal_row_of(rows, count, &mod_signals[0]);
    if (!row) return;
    double sum = 0.0;
    for (int j = 0; j < row->columns; j++) sum += row->values[j];
    double share = row->columns > 0 && tokens > 0 ? sum / (row->columns * tokens) : 0.0;
    snprintf(buf, size, "MoD %.1f%% tokens", 100.0 * share);
}

/* ---- the checkpoint (checkpoint_schema/mod.def) ------------------------------------ */

static int mod_in_shape(const struct gpt_shape *shape) { return shape->mod.every > 0; }

static int mod_in_file(const struct dyn_ckpt_reader *rd)
{
    return rd->int_attr(rd->ctx, "/model", "mod_every", 0) > 0;
}

/* A /mod in another format is refused, naming it. */
static int mod_check_format(const struct dyn_ckpt_reader *rd)
{
    if (!rd->has(rd->ctx, "/mod", NULL)) return 0;   /* reported with its group */
    long long format = rd->int_attr(rd->ctx, "/mod", "format", 1);
    if (format == MOD_FORMAT) return 0;
    dyn_ckpt_problem(rd, "its mixture-of-depths rows (/mod) are in format %lld%s; this dynmo "
                     "reads /mod format %d only (the router, then the causal routing's MLP "
                     "predictor of mod.predictor_hidden units; checkpoint_schema/mod.def): "
                     "resume with the dynmo that wrote it, or start a new run in another "
                     "ckpt.dir", format, format == 1 ? " (no attribute format: written before "
                                                      "format 2, with a linear causal "
                                                      "predictor)" : "", MOD_FORMAT);
    return -1;
}

static void mod_write_attrs(const struct gpt_shape *shape, const struct dyn_ckpt_writer *w)
{
    const struct gpt_mod *mod = &shape->mod;
    char capacity[40];
    snprintf(capacity, sizeof capacity, "%.17g", mod->every > 0 ? mod->capacity : 0.0);
    w->int_attr(w->ctx, "/model", "mod_every", mod->every);
    w->string_attr(w->ctx, "/model", "mod_capacity", capacity);
    w->string_attr(w->ctx, "/model", "mod_routing",
                   mod->every == 0 ? "" : mod->routing == MOD_ROUTING_CAUSAL ? "causal" : "topk");
    if (mod->every == 0) return;
    w->int_attr(w->ctx, "/mod", "format", MOD_FORMAT);
    w->int_attr(w->ctx, "/mod", "predictor_hidden", mod->predictor_hidden);
}

/* What a file says. */
struct mod_file {
    long long every, hidden;
    double capacity;
    int routing, routing_ok;
};

static void mod_store(void *raw, const char *object, const char *name, long long value,
                      const char *text)
{
    (void)object;
    struct mod_file *f = raw;
    if (!strcmp(name, "mod_every")) {
        f->every = value;
    } else if (!strcmp(name, "predictor_hidden")) {
        f->hidden = value;
    } else if (!strcmp(name, "mod_routing")) {
        f->routing = !strcmp(text, "causal") ? MOD_ROUTING_CAUSAL : MOD_ROUTING_TOPK;
        f->routing_ok = !strcmp(text, "causal") || !strcmp(text, "topk") || !text[0];
    } else if (!strcmp(name, "mod_capacity")) {
        char *end = NULL;
        f->capacity = strtod(text, &end);
        if (!text[0] || *end) f->capacity = NAN;
    }
}

static int mod_file_check(const void *raw, struct gpt_shape *shape,
                          const struct dyn_ckpt_reader *rd)
{
    const struct mod_file *f = raw;
    struct gpt_mod m = {.every = (int)f->every, .routing = f->routing, .capacity = f->capacity,
                        .predictor_hidden = (int)f->hidden};
    if (f->every < 0 || f->every > shape->layers ||
        (f->every > 0 && (!(f->capacity > 0.0 && f->capacity <= 1.0) || !f->routing_ok))) {
        dyn_ckpt_problem(rd, "/model: mixture-of-depths keys out of range (mod_every %d for %d "
                         "layers, mod_capacity %g, mod_routing valid %d)", m.every,
                         shape->layers, f->capacity, f->routing_ok);
        return -1;
    }
    if (m.every == 0) m = (struct gpt_mod){0};   /* the run's shape has them zero then */
    int causal = m.every > 0 && m.routing == MOD_ROUTING_CAUSAL;
    if (m.every > 0 && (causal ? m.predictor_hidden < 1 || m.predictor_hidden > 65536
                               : m.predictor_hidden != 0)) {
        dyn_ckpt_problem(rd, "/mod: predictor_hidden %d with %s routing (expected 1 .. 65536 "
                         "with causal, 0 with topk)", m.predictor_hidden,
                         causal ? "causal" : "topk");
        return -1;
    }
    shape->mod = m;
    return 0;
}

static const char *const mod_dims[] = {"mod_layers", "mod_params", NULL};

static long mod_dim(const struct gpt_shape *shape, const char *name)
{
    if (!strcmp(name, "mod_layers")) return gpt_mod_block_count(shape);
    return (long)mod_extra_param_count(shape, shape->mod.every - 1);
}

/* A MoD block's router and predictor, the floats after the dense
 * tensors: row j of /mod for the j-th MoD block. */
static int mod_rows(const struct gpt_shape *shape, const struct block *blk,
                    struct dyn_ckpt_rows *out, int max)
{
    if (!gpt_block_is_mod(shape, blk->index)) return 0;
    size_t dense = block_param_count(blk->C);
    return dyn_ckpt_one_row(out, max, "/mod", gpt_mod_ordinal(shape, blk->index), dense,
                            blk->nparams - dense);
}

static int mod_compare(const struct gpt_shape *file, const struct gpt_shape *run, char *err,
                       size_t errsize)
{
    const struct gpt_mod *f = &file->mod, *r = &run->mod;
    static const char *routing[] = {"topk", "causal"};
    if (f->every == r->every && (f->every == 0 || (f->capacity == r->capacity &&
                                                   f->routing == r->routing &&
                                                   f->predictor_hidden == r->predictor_hidden)))
        return 0;
    snprintf(err, errsize, "written for a different model: mixture of depths is "
             "model.mod_every %d, model.mod_capacity %g, mod.routing %s, "
             "mod.predictor_hidden %d in the checkpoint but %d, %g, %s, %d in this run (use "
             "the checkpoint's model config, or start a new run in another ckpt.dir)",
             f->every, f->capacity, f->every ? routing[f->routing] : "-",
             f->predictor_hidden, r->every, r->capacity,
             r->every ? routing[r->routing] : "-", r->predictor_hidden);
    return -1;
}

static const struct dyn_ckpt_part mod_ckpt = {
    .schema = &mod_schema,
    .model_keys = 1,
    .in_shape = mod_in_shape,
    .in_file = mod_in_file,
    .check_format = mod_check_format,
    .write_attrs = mod_write_attrs,
    .store = mod_store,
    .check = mod_file_check,
    .dims = mod_dims,
    .dim = mod_dim,
    .rows = mod_rows,
    .compare = mod_compare,
};

const struct dyn_scheme dyn_scheme_mod = {
    .ckpt = &mod_ckpt,
    .name = "mod",
    .active = mod_active,
    .keys = mod_keys,
    .check = mod_check,
    .owns = mod_owns,
    .signals = mod_signals,
    .signal_count = sizeof mod_signals / sizeof mod_signals[0],
    .step_note = mod_step_note,
};
