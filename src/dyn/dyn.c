/* The dispatcher of dyn.h: picks the scheme by dyn.kind. Schemes add
 * themselves here; "none" does nothing. */
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include "dynmo/dyn.h"
#include "dyn/scheme.h"

struct dyn {
    char kind[32];
    struct dyn_env env;
    const struct dyn_scheme *scheme;   /* NULL for "none" */
    void *state;
    struct gpt *model;                 /* the last model a hook saw */
};

static const struct dyn_scheme *const schemes[] = {
    &dyn_scheme_freeze,
    &dyn_scheme_early_exit,
    &dyn_scheme_prune,
};

struct dyn *dyn_create(const struct dm_config *cfg, const struct dyn_env *env)
{
    const struct dyn_scheme *scheme = NULL;
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
        if (!strcmp(cfg->dyn_kind, schemes[i]->kind)) scheme = schemes[i];
    if (!scheme && strcmp(cfg->dyn_kind, "none") != 0)
        dm_user_error("dyn.kind = '%s' is not a scheme (valid: none, freeze, early_exit, prune)",
                      cfg->dyn_kind);
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

void dyn_before_step(struct dyn *dyn, struct gpt *model, int step)
{
    dyn->model = model;
    if (dyn->scheme) dyn->scheme->before_step(dyn->state, model, step);
}

void dyn_after_reduce(struct dyn *dyn, struct gpt *model, int step, const double *block_sumsq)
{
    dyn->model = model;
    if (dyn->scheme) dyn->scheme->after_reduce(dyn->state, model, step, block_sumsq);
}

void dyn_describe(const struct dyn *dyn, const struct gpt *model, char *buf, size_t size)
{
    if (size) buf[0] = 0;
    if (dyn->scheme) dyn->scheme->describe(dyn->state, model, buf, size);
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
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
        if (!strcmp(kind, schemes[i]->kind) && schemes[i]->state_check)
            return schemes[i]->state_check(state, n, layers, err, errsize);
    snprintf(err, errsize, "dyn.kind \"%s\" is no scheme of this dynmo that keeps a state "
             "of its own", kind);
    return -1;
}
