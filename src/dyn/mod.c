/* Mixture of depths (model.mod_every, [mod]; docs/mod-hash.md) as a
 * dynamic scheme: its descriptor, the config's rules over its keys and its
 * refusals of other schemes. */
#include <stdio.h>
#include <string.h>
#include "dyn/scheme.h"

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

const struct dyn_scheme dyn_scheme_mod = {
    .name = "mod",
    .active = mod_active,
    .keys = mod_keys,
    .check = mod_check,
};
