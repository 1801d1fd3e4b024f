/* Mixture of experts (model.moe_every, [moe]; docs/moe.md) as a dynamic
 * scheme: its descriptor, the config's rules over its keys and its
 * refusals of other schemes. Its blocks' compute is moe_block.c; the
 * parallel split of its experts over ranks is src/pipe/expert.c. */
#include <stdio.h>
#include <string.h>
#include "dyn/scheme.h"

static int moe_active(const struct dm_config *cfg) { return cfg->moe_every > 0; }

/* The keys that describe the experts, beside [moe]. */
static const char *const moe_keys[] = {"moe.*", "model.experts", "model.top_k",
                                       "model.expert_hidden", NULL};

static void moe_check_off(const struct dm_config *cfg)
{
    if (dyn_keys_set(cfg, moe_keys))
        dm_user_error("MoE keys are set ([moe] or model.experts, model.top_k, "
                      "model.expert_hidden) but model.moe_every = 0 (no MoE blocks): set "
                      "model.moe_every, or remove those keys");
    if (cfg->ep != 1)
        dm_user_error("parallel.ep = %d needs MoE blocks, but model.moe_every = 0", cfg->ep);
}

/* The keys (docs/moe.md), the schemes it refuses and the expert-parallel
 * degree. */
static void moe_check(const struct dm_config *cfg)
{
    if (cfg->moe_every == 0) {
        moe_check_off(cfg);
        return;
    }
    if (cfg->moe_every > cfg->layers)
        dm_user_error("model.moe_every = %d exceeds model.layers = %d: no block would be a "
                      "mixture of experts", cfg->moe_every, cfg->layers);
    if (cfg->top_k > cfg->experts)
        dm_user_error("model.top_k = %d exceeds model.experts = %d: a token cannot choose "
                      "more experts than there are (E >= k)", cfg->top_k, cfg->experts);
    if (strcmp(cfg->moe_router, "softmax") != 0 && strcmp(cfg->moe_router, "sigmoid") != 0)
        dm_user_error("moe.router = '%s' must be softmax or sigmoid", cfg->moe_router);
    if (strcmp(cfg->moe_drop, "probs") != 0 && strcmp(cfg->moe_drop, "position") != 0 &&
        strcmp(cfg->moe_drop, "slot") != 0)
        dm_user_error("moe.drop = '%s' must be probs, position or slot", cfg->moe_drop);
    char value[32];
    dm_format_shortest(value, sizeof value, cfg->bias_rate);
    if (cfg->bias_rate > 0 && strcmp(cfg->moe_router, "sigmoid") != 0)
        dm_user_error("moe.bias_rate = %s needs moe.router = sigmoid (the selection bias "
                      "belongs to the sigmoid-score router)", value);
    if (!strcmp(cfg->dyn_kind, "prune") || !strcmp(cfg->dyn_kind, "early_exit"))
        dm_user_error("dyn.kind = %s does not support MoE blocks yet (model.moe_every = %d)",
                      cfg->dyn_kind, cfg->moe_every);
    if (cfg->dp % cfg->ep != 0)
        dm_user_error("parallel.ep = %d does not divide parallel.dp = %d", cfg->ep, cfg->dp);
    if (cfg->experts % cfg->ep != 0)
        dm_user_error("parallel.ep = %d does not divide model.experts = %d", cfg->ep,
                      cfg->experts);
}

const struct dyn_scheme dyn_scheme_moe = {
    .name = "moe",
    .active = moe_active,
    .keys = moe_keys,
    .check = moe_check,
};
