/* The one table of dynamic schemes and the dispatcher of dyn.h: the
 * config's validation pass over every scheme's rules, and the hooks of
 * the scheme dyn.kind names ("none" runs none). Adding a scheme is adding
 * its descriptor (scheme.h) to the table below; nothing else here names a
 * scheme. Must not: know what any scheme does. */
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include "dynmo/dyn.h"
#include "dyn/scheme.h"

/* ---- the table ---------------------------------------------------------------- */

enum { DYN_SCHEMES_MAX = DYN_SCHEMES_LIMIT };

/* The built-in schemes, each defined in its own file of src/dyn. */
extern const struct dyn_scheme dyn_scheme_moe, dyn_scheme_hash, dyn_scheme_mod, dyn_scheme_freeze,
    dyn_scheme_early_exit, dyn_scheme_prune;

static const struct dyn_scheme *schemes[DYN_SCHEMES_MAX] = {
    &dyn_scheme_moe,
    &dyn_scheme_hash,
    &dyn_scheme_mod,
    &dyn_scheme_freeze,
    &dyn_scheme_early_exit,
    &dyn_scheme_prune,
};
static int scheme_count = 6;

int dyn_scheme_count(void) { return scheme_count; }

const struct dyn_scheme *dyn_scheme_at(int i)
{
    DM_ASSERT(i >= 0 && i < scheme_count);
    return schemes[i];
}

void dyn_register_scheme(const struct dyn_scheme *scheme)
{
    if (scheme_count == DYN_SCHEMES_MAX) DM_FATAL("more than %d dynamic schemes", DYN_SCHEMES_MAX);
    for (int i = 0; i < scheme_count; i++)
        if (!strcmp(schemes[i]->name, scheme->name))
            DM_FATAL("a dynamic scheme named %s is registered already", scheme->name);
    schemes[scheme_count++] = scheme;
}

static const struct dyn_scheme *scheme_of_kind(const char *kind)
{
    for (int i = 0; i < scheme_count; i++)
        if (schemes[i]->kind && !strcmp(schemes[i]->kind, kind)) return schemes[i];
    return NULL;
}

int dyn_scheme_active(const struct dyn_scheme *scheme, const struct dm_config *cfg)
{
    if (scheme->kind) return !strcmp(cfg->dyn_kind, scheme->kind);
    return scheme->active && scheme->active(cfg);
}

int dyn_keys_set(const struct dm_config *cfg, const char *const *keys)
{
    for (int i = 0; keys && keys[i]; i++)
        if (config_was_set(cfg, keys[i])) return 1;
    return 0;
}

/* ---- the model's shape --------------------------------------------------------- */

struct gpt_shape dyn_shape_from_config(const struct dm_config *cfg)
{
    struct gpt_shape shape = gpt_shape_from_config(cfg);
    for (int i = 0; i < scheme_count; i++)
        if (schemes[i]->add_to_shape && dyn_scheme_active(schemes[i], cfg))
            schemes[i]->add_to_shape(cfg, &shape);
    return shape;
}

struct gpt_shape dyn_shape_for_rank(const struct dm_config *cfg, int replica)
{
    struct gpt_shape shape = dyn_shape_from_config(cfg);
    for (int i = 0; i < scheme_count; i++)
        if (schemes[i]->shard && dyn_scheme_active(schemes[i], cfg))
            schemes[i]->shard(cfg, &shape, replica);
    return shape;
}

double dyn_block_memory(const struct dm_config *cfg, const struct gpt_shape *shape, int layer,
                        int micro_B)
{
    double bytes = 0.0;
    for (int i = 0; i < scheme_count; i++)
        if (schemes[i]->block_memory && dyn_scheme_active(schemes[i], cfg))
            bytes += schemes[i]->block_memory(cfg, shape, layer, micro_B);
    return bytes;
}

void dyn_describe_shape(const struct gpt_shape *shape,
                        void (*emit)(void *ctx, const char *line), void *ctx)
{
    for (int i = 0; i < scheme_count; i++) {
        if (!schemes[i]->describe_shape) continue;
        char line[512] = "";
        schemes[i]->describe_shape(shape, line, sizeof line);
        if (line[0]) emit(ctx, line);
    }
}

/* ---- signals -------------------------------------------------------------------- */

int dyn_signals(const struct dm_config *cfg, const struct dyn_signal **out, int max)
{
    int n = 0;
    for (int i = 0; i < scheme_count; i++) {
        const struct dyn_scheme *scheme = schemes[i];
        if (!dyn_scheme_active(scheme, cfg)) continue;
        for (int k = 0; k < scheme->signal_count; k++) {
            const struct dyn_signal *signal = &scheme->signals[k];
            if (!signal->read || (signal->written && !signal->written(cfg))) continue;
            if (n == max) DM_FATAL("more than %d signals", max);
            out[n++] = signal;
        }
    }
    return n;
}

int dyn_signals_all(const struct dyn_signal **out, int max)
{
    int n = 0;
    for (int i = 0; i < scheme_count; i++)
        for (int k = 0; k < schemes[i]->signal_count; k++) {
            if (n == max) DM_FATAL("more than %d signals", max);
            out[n++] = &schemes[i]->signals[k];
        }
    return n;
}

const struct dyn_signal *dyn_signal_of_cost(enum dyn_cost_role role)
{
    for (int i = 0; i < scheme_count; i++)
        for (int k = 0; k < schemes[i]->signal_count; k++)
            if (schemes[i]->signals[k].cost == role) return &schemes[i]->signals[k];
    return NULL;
}

/* The scheme that declared signal. */
static const struct dyn_scheme *scheme_of_signal(const struct dyn_signal *signal)
{
    for (int i = 0; i < scheme_count; i++)
        if (signal >= schemes[i]->signals && signal < schemes[i]->signals + schemes[i]->signal_count)
            return schemes[i];
    DM_FATAL("signal %s belongs to no scheme", signal->dataset);
}

int dyn_signal_active(const struct dyn_signal *signal, const struct dm_config *cfg)
{
    return dyn_scheme_active(scheme_of_signal(signal), cfg);
}

const struct dyn_signal *dyn_signal_of_dataset(const char *name)
{
    for (int i = 0; i < scheme_count; i++)
        for (int k = 0; k < schemes[i]->signal_count; k++)
            if (!strcmp(schemes[i]->signals[k].dataset, name)) return &schemes[i]->signals[k];
    return NULL;
}

int dyn_signal_layer(const struct dyn_signal *signal, const struct gpt_shape *shape, int layer)
{
    const struct dyn_scheme *scheme = scheme_of_signal(signal);
    if (signal->columns == DYN_SIGNAL_LAYERS || !scheme->owns) return 1;
    return scheme->owns(shape, layer);
}

int dyn_signal_in_mlp_unit(const struct dyn_signal *signal)
{
    const struct dyn_scheme *scheme = scheme_of_signal(signal);
    return scheme->ext && gpt_ext_fits_mlp_unit(scheme->ext);
}

int dyn_signal_cells(const struct dyn_signal *signal, const struct gpt_shape *shape)
{
    return signal->columns == DYN_SIGNAL_CELLS ? signal->cells(shape) : 1;
}

int dyn_signal_width(const struct dyn_signal *signal, const struct gpt_shape *shape)
{
    int layers = 0;
    for (int l = 0; l < shape->layers; l++) layers += dyn_signal_layer(signal, shape, l);
    return layers * dyn_signal_cells(signal, shape);
}

const struct dyn_signal_row *dyn_signal_row_of(const struct dyn_signal_row *rows, int count,
                                               const struct dyn_signal *signal)
{
    for (int k = 0; k < count; k++)
        if (rows[k].signal == signal) return &rows[k];
    return NULL;
}

void dyn_step_notes(const struct dm_config *cfg, const struct dyn_signal_row *rows, int count,
                    double tokens, void (*emit)(void *ctx, const char *note), void *ctx)
{
    for (int i = 0; i < scheme_count; i++) {
        if (!schemes[i]->step_note || !dyn_scheme_active(schemes[i], cfg)) continue;
        char note[256] = "";
        schemes[i]->step_note(cfg, rows, count, tokens, note, sizeof note);
        if (note[0]) emit(ctx, note);
    }
}

/* ---- the validation pass ------------------------------------------------------ */

/* dyn.kind names none or one of the schemes with a kind. */
static void check_kind(const struct dm_config *cfg)
{
    if (scheme_of_kind(cfg->dyn_kind) || !strcmp(cfg->dyn_kind, "none")) return;
    char valid[256] = "none";
    size_t used = strlen(valid);
    for (int i = 0; i < scheme_count; i++)
        if (schemes[i]->kind)
            used += (size_t)snprintf(valid + used, used < sizeof valid ? sizeof valid - used : 0,
                                     ", %s", schemes[i]->kind);
    dm_user_error("dyn.kind = '%s' is not a scheme (valid: %s)", cfg->dyn_kind, valid);
}

static const struct dyn_scheme *scheme_named(const char *name)
{
    for (int i = 0; i < scheme_count; i++)
        if (!strcmp(schemes[i]->name, name)) return schemes[i];
    return NULL;
}

/* "model.mod_every = 2" and "model.mod_every = 0" for scheme in cfg. */
static void scheme_switch(const struct dyn_scheme *scheme, const struct dm_config *cfg,
                          char *on, char *off, size_t size)
{
    const char *key = scheme->switch_key ? scheme->switch_key : "dyn.kind";
    char value[64];
    if (!config_value_text(cfg, key, value, sizeof value))
        snprintf(value, sizeof value, "its default");
    snprintf(on, size, "%s = %s", key, value);
    snprintf(off, size, "%s = %s", key, scheme->switch_off ? scheme->switch_off : "none");
}

/* The combinations scheme refuses, when cfg runs it and another. */
static void check_refusals(const struct dyn_scheme *scheme, const struct dm_config *cfg)
{
    if (!scheme->refuses || !dyn_scheme_active(scheme, cfg)) return;
    for (const struct dyn_refusal *refusal = scheme->refuses; refusal->scheme; refusal++) {
        const struct dyn_scheme *other = scheme_named(refusal->scheme);
        if (!other || !dyn_scheme_active(other, cfg)) continue;
        char on[128], off[128], other_on[128], other_off[128];
        scheme_switch(scheme, cfg, on, off, sizeof on);
        scheme_switch(other, cfg, other_on, other_off, sizeof other_on);
        dm_user_error("%s with %s: %s and %s do not combine yet%s%s%s; set %s or %s", on,
                      other_on, scheme->title ? scheme->title : scheme->name,
                      other->title ? other->title : other->name, refusal->why ? " (" : "",
                      refusal->why ? refusal->why : "", refusal->why ? ")" : "", off,
                      other_off);
    }
}

int dyn_batch_coupled(const struct dm_config *cfg)
{
    for (int i = 0; i < scheme_count; i++)
        if (schemes[i]->couples_batch && dyn_scheme_active(schemes[i], cfg) &&
            schemes[i]->couples_batch(cfg))
            return 1;
    return 0;
}

void dyn_config_validate(const struct dm_config *cfg)
{
    config_validate(cfg);
    for (int i = 0; i < scheme_count; i++) {
        if (schemes[i]->check) schemes[i]->check(cfg);
        check_refusals(schemes[i], cfg);
    }
    check_kind(cfg);
}

/* ---- the step hooks of the dyn.kind scheme ------------------------------------- */

struct dyn {
    char kind[32];
    struct dyn_env env;
    const struct dyn_scheme *scheme;   /* NULL for "none" */
    void *state;
    struct gpt *model;                 /* the first model the last hook saw */
};

struct dyn *dyn_create(const struct dm_config *cfg, const struct dyn_env *env)
{
    const struct dyn_scheme *scheme = scheme_of_kind(cfg->dyn_kind);
    check_kind(cfg);
    struct dyn *dyn = dm_alloc(sizeof *dyn);
    snprintf(dyn->kind, sizeof dyn->kind, "%s", cfg->dyn_kind);
    dyn->env = *env;
    dyn->scheme = scheme;
    if (scheme) dyn->state = scheme->create(cfg, env);
    return dyn;
}

void dyn_destroy(struct dyn *dyn)
{
    if (dyn->scheme) dyn->scheme->destroy(dyn->state, dyn->model);
    dm_free(dyn);
}
const char *dyn_kind_name(const struct dyn *dyn) { return dyn->kind; }

void dyn_before_step(struct dyn *dyn, struct gpt *const *models, int count, int step)
{
    DM_ASSERT(count >= 1);
    dyn->model = models[0];
    if (dyn->scheme) dyn->scheme->before_step(dyn->state, models, count, step);
}

void dyn_before_eval(struct dyn *dyn, struct gpt *const *models, int count)
{
    DM_ASSERT(count >= 1);
    dyn->model = models[0];
    if (dyn->scheme && dyn->scheme->before_eval)
        dyn->scheme->before_eval(dyn->state, models, count);
}

void dyn_after_reduce(struct dyn *dyn, struct gpt *const *models, int count, int step,
                      const double *block_sumsq)
{
    DM_ASSERT(count >= 1);
    dyn->model = models[0];
    if (dyn->scheme) dyn->scheme->after_reduce(dyn->state, models, count, step, block_sumsq);
}

void dyn_describe(const struct dyn *dyn, struct gpt *const *models, int count, char *buf,
                  size_t size)
{
    if (size) buf[0] = 0;
    if (dyn->scheme) dyn->scheme->describe(dyn->state, models, count, buf, size);
}

long dyn_state_size(const struct dyn *dyn)
{
    if (!dyn->scheme || !dyn->scheme->state_size) return 0;
    return dyn->scheme->state_size(dyn->state);
}

void dyn_state_save(const struct dyn *dyn, double *out)
{
    if (dyn_state_size(dyn) > 0) dyn->scheme->state_save(dyn->state, out);
}

int dyn_state_restore(struct dyn *dyn, const double *in, long n, char *err, size_t errsize)
{
    if (!dyn->scheme || !dyn->scheme->state_restore) {
        snprintf(err, errsize, "dyn.kind = %s keeps no state of its own", dyn->kind);
        return -1;
    }
    return dyn->scheme->state_restore(dyn->state, in, n, err, errsize);
}

int dyn_state_check(const char *kind, const double *state, long n, int layers, char *err,
                    size_t errsize)
{
    const struct dyn_scheme *scheme = scheme_of_kind(kind);
    if (scheme && scheme->state_check)
        return scheme->state_check(state, n, layers, err, errsize);
    snprintf(err, errsize, "dyn.kind \"%s\" is no scheme of this dynmo that keeps a state "
             "of its own", kind);
    return -1;
}
