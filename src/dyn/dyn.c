/* The dispatcher of dyn.h: picks the scheme by dyn.kind. Schemes add
 * themselves here; "none" does nothing. */
#include <stdio.h>
#include <string.h>
#include "dynmo/dyn.h"

struct dyn {
    char kind[32];
    struct dyn_env env;
};

struct dyn *dyn_create(const struct dm_config *cfg, const struct dyn_env *env)
{
    if (strcmp(cfg->dyn_kind, "none") != 0)
        dm_user_error("dyn.kind = '%s' is not a scheme (valid: none)", cfg->dyn_kind);
    struct dyn *dyn = dm_alloc(sizeof *dyn);
    snprintf(dyn->kind, sizeof dyn->kind, "%s", cfg->dyn_kind);
    dyn->env = *env;
    return dyn;
}

void dyn_destroy(struct dyn *dyn) { dm_free(dyn); }
const char *dyn_kind_name(const struct dyn *dyn) { return dyn->kind; }

void dyn_before_step(struct dyn *dyn, struct gpt *model, int step)
{
    (void)dyn;
    (void)model;
    (void)step;
}

void dyn_after_reduce(struct dyn *dyn, struct gpt *model, int step, const double *block_sumsq)
{
    (void)dyn;
    (void)model;
    (void)step;
    (void)block_sumsq;
}

void dyn_describe(const struct dyn *dyn, const struct gpt *model, char *buf, size_t size)
{
    (void)dyn;
    (void)model;
    if (size) buf[0] = 0;
}
