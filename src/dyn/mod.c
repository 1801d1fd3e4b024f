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

const struct dyn_scheme dyn_scheme_mod = {
    .name = "mod",
    .active = mod_active,
    .keys = mod_keys,
    .check = mod_check,
    .owns = mod_owns,
    .signals = mod_signals,
    .signal_count = sizeof mod_signals / sizeof mod_signals[0],
    .step_note = mod_step_note,
};
