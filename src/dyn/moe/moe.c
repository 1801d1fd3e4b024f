/* Mixture of experts (model.moe_every, [moe]; docs/moe.md) as a dynamic
 * scheme: its descriptor, the config's rules over its keys and its
 * refusals of other schemes. Its blocks' compute is moe_block.c; the
 * parallel split of its experts over ranks is src/pipe/expert.c. */
#include <math.h>
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

/* ---- signals --------------------------------------------------------------------- */

static int moe_owns(const struct gpt_shape *shape, int layer) { return gpt_block_is_moe(shape, layer); }
static int moe_cells(const struct gpt_shape *shape) { return shape->moe.experts; }
static int moe_split(const struct dm_config *cfg) { return cfg->ep > 1; }

/* The block's last step (gpt_moe_end_step: summed over the replicas). */
static void read_tokens(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block_moe *moe = model->blocks[i].moe;
    for (int e = 0; e < moe->cfg.experts; e++) value[e] = (double)moe->tokens[e];
}

static void read_dropped(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block_moe *moe = model->blocks[i].moe;
    for (int e = 0; e < moe->cfg.experts; e++) value[e] = (double)moe->dropped[e];
}

static void read_bias(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block_moe *moe = model->blocks[i].moe;
    for (int e = 0; e < moe->cfg.experts; e++) value[e] = moe->bias[e];
}

static void read_aux(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    value[0] = model->blocks[i].moe->aux;
}

static void read_z(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    value[0] = model->blocks[i].moe->z;
}

/* The rows this rank's experts took (expert parallelism), then zero. */
static void read_rank_rows(struct gpt *model, int i, double *value, double *weight)
{
    struct block_moe *moe = model->blocks[i].moe;
    value[0] = moe->rows_taken;
    weight[0] = 1.0;
    moe->rows_taken = 0.0;
}

static const struct dyn_signal moe_signals[] = {
    {"/moe/tokens", "expert load", "token-expert pairs",
     "pairs routed to each expert in the step, over micro-batches and replicas",
     DYN_SIGNAL_CELLS, DYN_COMBINE_REPLICA0, 1, -1, NULL, moe_cells, read_tokens},
    {"/moe/dropped", "pairs dropped", "token-expert pairs",
     "of those, the pairs each expert's capacity dropped",
     DYN_SIGNAL_CELLS, DYN_COMBINE_REPLICA0, 1, -1, NULL, moe_cells, read_dropped},
    {"/moe/bias", "selection bias", "score",
     "each expert's selection bias after the step (sigmoid router)",
     DYN_SIGNAL_CELLS, DYN_COMBINE_REPLICA0, 0, 0, NULL, moe_cells, read_bias},
    {"/moe/aux_loss", "balancing loss", "loss",
     "the block's Switch/GShard balancing loss, mean over the step's forwards",
     DYN_SIGNAL_BLOCKS, DYN_COMBINE_PER_FORWARD, 0, 0, NULL, NULL, read_aux},
    {"/moe/z_loss", "router z-loss", "loss",
     "the block's router z-loss, mean over the step's forwards",
     DYN_SIGNAL_BLOCKS, DYN_COMBINE_PER_FORWARD, 0, 0, NULL, NULL, read_z},
    {"/moe/rank_load", "busiest expert rank", "x mean",
     "the rows the block's busiest expert-parallel rank took over the mean rank's",
     DYN_SIGNAL_BLOCKS, DYN_COMBINE_BUSIEST, 0, 0, moe_split, NULL, read_rank_rows},
};

/* The busiest expert of any MoE block against its block's mean, and the
 * share of the step's pairs that capacity dropped. */
static void moe_step_note(const struct dm_config *cfg, const struct dyn_signal_row *rows,
                          int count, double tokens, char *buf, size_t size)
{
    (void)tokens;
    const struct dyn_signal_row *routed_row = dyn_signal_row_of(rows, count, &moe_signals[0]);
    const struct dyn_signal_row *dropped_row = dyn_signal_row_of(rows, count, &moe_signals[1]);
    if (!routed_row || !dropped_row) return;
    int E = cfg->experts, blocks = routed_row->columns / E;
    double routed = 0.0, dropped = 0.0, worst = 0.0;
    for (int j = 0; j < blocks; j++) {
        double sum = 0.0, most = 0.0;
        for (int e = 0; e < E; e++) {
            double c = routed_row->values[j * E + e];
            sum += c;
            most = c > most ? c : most;
            dropped += dropped_row->values[j * E + e];
        }
        routed += sum;
        if (sum > 0) worst = fmax(worst, most * E / sum);
    }
    snprintf(buf, size, "experts: busiest %.2fx mean, dropped %.1f%%", worst,
             routed > 0 ? 100.0 * dropped / routed : 0.0);
}

const struct dyn_scheme dyn_scheme_moe = {
    .name = "moe",
    .active = moe_active,
    .keys = moe_keys,
    .check = moe_check,
    .owns = moe_owns,
    .signals = moe_signals,
    .signal_count = sizeof moe_signals / sizeof moe_signals[0],
    .step_note = moe_step_note,
};
