/* Mixture of experts (model.moe_every, [moe]; docs/moe.md) as a dynamic
 * scheme: its descriptor, the config's rules over its keys and its
 * refusals of other schemes, its parameters in a shape and their split
 * over parallel.ep ranks, its signals, its part of the checkpoint. Its
 * blocks (the extension, dynmo/moe.h) are block.c beside it; the parallel
 * split of its experts over ranks is src/pipe/expert.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "dynmo/balance.h"
#include "dynmo/moe.h"
#include "dynmo/schema.h"
#include "dyn/scheme.h"
#include "dyn/moe/log.h"

/* Its checkpoints are schema versions of their own: 3, which it writes,
 * and 2, what an older dynmo wrote (read only; checkpoint_schema/v3.def,
 * v2.def). */
#define SCHEMA_STATIC
#define SCHEMA_FILE "../../checkpoint_schema/v3.def"
#define SCHEMA_NAME moe_v3
#include "dynmo/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
#define SCHEMA_FILE "../../checkpoint_schema/v2.def"
#define SCHEMA_NAME moe_v2
#include "dynmo/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
#undef SCHEMA_STATIC

static int moe_active(const struct dm_config *cfg) { return cfg->moe_every > 0; }

/* The keys that describe the experts, beside [moe]. */
static const char *const moe_keys[] = {"moe.*", "model.experts", "model.top_k",
                                       "model.expert_hidden", NULL};

/* moe.placement and moe.replicas_max: moving and copying experts needs
 * expert parallelism, and copies come at the placement decisions (a rank
 * holds its E / ep experts and up to replicas_max copies; whether that
 * fits in memory, train_check_memory says through moe_block_memory). */
static void moe_check_placement(const struct dm_config *cfg)
{
    const char *p = cfg->moe_placement;
    if (strcmp(p, "static") != 0 && strcmp(p, "balanced") != 0 && strcmp(p, "random") != 0)
        dm_user_error("moe.placement = '%s' must be static, balanced or random", p);
    if (strcmp(p, "static") != 0 && cfg->ep <= 1)
        dm_user_error("moe.placement = %s moves experts between expert-parallel ranks, but "
                      "parallel.ep = %d: set parallel.ep > 1 or moe.placement = static", p,
                      cfg->ep);
    if (strcmp(p, "static") != 0 && cfg->experts / (cfg->ep > 0 ? cfg->ep : 1) > 256)
        dm_user_error("moe.placement = %s holds at most 256 experts per expert-parallel rank, "
                      "but model.experts = %d over parallel.ep = %d is %d", p, cfg->experts,
                      cfg->ep, cfg->experts / cfg->ep);
    if (strcmp(p, "static") != 0 && strcmp(cfg->device, "cpu") != 0)
        dm_user_error("moe.placement = %s runs on train.device = cpu only for now, not %s", p,
                      cfg->device);
    int room = cfg->experts - cfg->experts / (cfg->ep > 0 ? cfg->ep : 1);
    if (cfg->replicas_max < 0 || cfg->replicas_max > room)
        dm_user_error("moe.replicas_max = %d must be 0 .. %d (the experts a rank of parallel.ep "
                      "= %d does not hold)", cfg->replicas_max, room, cfg->ep);
    if (cfg->replicas_max > 0 && strcmp(p, "static") == 0)
        dm_user_error("moe.replicas_max = %d copies hot experts at the placement decisions, but "
                      "moe.placement = static makes none: set moe.placement = balanced",
                      cfg->replicas_max);
    if (cfg->replicas_max > 0 && cfg->ep > BALANCE_COPY_RANKS_MAX)
        dm_user_error("moe.replicas_max = %d: copies of experts work in expert-parallel groups of "
                      "at most %d ranks, not parallel.ep = %d", cfg->replicas_max,
                      BALANCE_COPY_RANKS_MAX, cfg->ep);
}

static void moe_check_off(const struct dm_config *cfg)
{
    if (dyn_keys_set(cfg, moe_keys))
        dm_user_error("MoE keys are set ([moe] or model.experts, model.top_k, "
                      "model.expert_hidden) but model.moe_every = 0 (no MoE blocks): set "
                      "model.moe_every, or remove those keys");
    if (cfg->ep != 1)
        dm_user_error("parallel.ep = %d needs MoE blocks, but model.moe_every = 0", cfg->ep);
}

/* The keys (docs/moe.md) and the expert-parallel degree. */
/* With a capacity, the experts' room is shared by a micro-batch's tokens. */
static int moe_couples_batch(const struct dm_config *cfg) { return cfg->capacity_factor > 0; }

/* The schemes it does not combine with (dyn_config_validate refuses them). */
static const struct dyn_refusal moe_refuses[] = {
    {"mod", NULL},
    {"prune", NULL},
    {"early_exit", NULL},
    {NULL, NULL},
};

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
    if (cfg->dp % cfg->ep != 0)
        dm_user_error("parallel.ep = %d does not divide parallel.dp = %d", cfg->ep, cfg->dp);
    if (cfg->experts % cfg->ep != 0)
        dm_user_error("parallel.ep = %d does not divide model.experts = %d", cfg->ep,
                      cfg->experts);
    moe_check_placement(cfg);
}

/* ---- signals --------------------------------------------------------------------- */

static int moe_scheme_owns(const struct gpt_shape *shape, int layer)
{
    return gpt_block_is_moe(shape, layer);
}
static int moe_cells(const struct gpt_shape *shape) { return moe_params_of(shape)->experts; }
static int moe_split(const struct dm_config *cfg) { return cfg->ep > 1; }

/* The expert-parallel rank that holds each expert (moe.placement moves
 * them; the same on every replica of the stage). */
static void read_placement(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block_moe *moe = block_moe_of(&model->blocks[i]);
    int E = moe->cfg.experts, per = moe_owned_experts(&moe->cfg);
    for (int at = 0; at < E; at++) value[moe->order[at]] = at / per;
}

static int moe_moves_experts(const struct dm_config *cfg)
{
    return cfg->ep > 1 && strcmp(cfg->moe_placement, "static") != 0;
}

/* The copies of each expert its group held in the step (moe.replicas_max;
 * the same on every replica of the stage). */
static void read_copies(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block_moe *moe = block_moe_of(&model->blocks[i]);
    for (int e = 0; e < moe->cfg.experts; e++) value[e] = moe->copies[e];
}

static int moe_copies_experts(const struct dm_config *cfg)
{
    return moe_moves_experts(cfg) && cfg->replicas_max > 0;
}

/* The block's last step (gpt_moe_end_step: summed over the replicas). */
static void read_tokens(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block_moe *moe = block_moe_of(&model->blocks[i]);
    for (int e = 0; e < moe->cfg.experts; e++) value[e] = (double)moe->tokens[e];
}

static void read_dropped(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block_moe *moe = block_moe_of(&model->blocks[i]);
    for (int e = 0; e < moe->cfg.experts; e++) value[e] = (double)moe->dropped[e];
}

static void read_bias(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block_moe *moe = block_moe_of(&model->blocks[i]);
    for (int e = 0; e < moe->cfg.experts; e++) value[e] = moe->bias[e];
}

static void read_aux(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    value[0] = block_moe_of(&model->blocks[i])->aux;
}

static void read_z(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    value[0] = block_moe_of(&model->blocks[i])->z;
}

/* The rows this rank's experts took (expert parallelism), then zero. */
static void read_rank_rows(struct gpt *model, int i, double *value, double *weight)
{
    struct block_moe *moe = block_moe_of(&model->blocks[i]);
    value[0] = moe->rows_taken;
    weight[0] = 1.0;
    moe->rows_taken = 0.0;
}

/* Without a run, the experts are evenly loaded: the busiest rank takes
 * the mean. */
static float load_of_config(const struct dm_config *cfg, int step)
{
    (void)cfg;
    (void)step;
    return 1.0f;
}

/* Its blocks' MLP: each token through top_k of the experts, a rank
 * holding experts / ep of them. */
static void routed_mlp_of_config(const struct dm_config *cfg, struct dyn_routed_mlp *out)
{
    out->units = cfg->experts;
    out->hidden = cfg->expert_hidden > 0 ? cfg->expert_hidden : 4.0 * cfg->channels;
    out->choices = cfg->top_k;
    out->units_per_rank = out->units / (cfg->ep > 0 ? cfg->ep : 1);
}

/* A count per expert of each MoE block (int32 cells, -1 for a step not
 * measured, stage replica 0's: the same on every replica), written by
 * runs where `written` says so (NULL: every MoE run). */
#define MOE_EXPERT_COUNTS(name, what, counts, means, when, reader)                       \
    {.dataset = name, .label = what, .unit = counts, .meaning = means,                    \
     .columns = DYN_SIGNAL_CELLS, .combine = DYN_COMBINE_REPLICA0, .is_int = 1,            \
     .filler = -1, .written = when, .cells = moe_cells, .read = reader}

static const struct dyn_signal moe_signals[] = {
    MOE_EXPERT_COUNTS("/moe/tokens", "expert load", "token-expert pairs",
                      "pairs routed to each expert in the step, over micro-batches and replicas",
                      NULL, read_tokens),
    MOE_EXPERT_COUNTS("/moe/dropped", "pairs dropped", "token-expert pairs",
                      "of those, the pairs each expert's capacity dropped", NULL, read_dropped),
    {.dataset = "/moe/bias",
     .label = "selection bias",
     .unit = "score",
     .meaning = "each expert's selection bias after the step (sigmoid router)",
     .columns = DYN_SIGNAL_CELLS,
     .combine = DYN_COMBINE_REPLICA0,
     .cells = moe_cells,
     .read = read_bias},
    {.dataset = "/moe/aux_loss",
     .label = "balancing loss",
     .unit = "loss",
     .meaning = "the block's Switch/GShard balancing loss, mean over the step's forwards",
     .columns = DYN_SIGNAL_BLOCKS,
     .combine = DYN_COMBINE_PER_FORWARD,
     .read = read_aux},
    {.dataset = "/moe/z_loss",
     .label = "router z-loss",
     .unit = "loss",
     .meaning = "the block's router z-loss, mean over the step's forwards",
     .columns = DYN_SIGNAL_BLOCKS,
     .combine = DYN_COMBINE_PER_FORWARD,
     .read = read_z},
    MOE_EXPERT_COUNTS("/moe/placement", "expert placement", "rank",
                      "the expert-parallel rank (of its group) that held each expert in the step",
                      moe_moves_experts, read_placement),
    MOE_EXPERT_COUNTS("/moe/copies", "expert copies", "copies",
                      "the copies of each expert on other ranks of its group in the step "
                      "(moe.replicas_max)", moe_copies_experts, read_copies),
    {.dataset = "/moe/rank_load",
     .label = "busiest expert rank",
     .unit = "x mean",
     .meaning = "the rows the block's busiest expert-parallel rank took over the mean rank's",
     .columns = DYN_SIGNAL_BLOCKS,
     .combine = DYN_COMBINE_BUSIEST,
     .written = moe_split,
     .read = read_rank_rows,
     .cost = DYN_COST_BUSIEST_RANK,
     .cost_name = "moe_load",
     .cost_dataset = "/layers/moe_load",
     .neutral = 0.0f,
     .cost_of_log = moe_load_of_log,
     .cost_of_config = load_of_config,
     .cost_routed_mlp = routed_mlp_of_config},
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


/* ---- its checkpoints (checkpoint_schema/v3.def, v2.def) ------------------------------ */

enum { MOE_VERSION = 3, MOE_VERSION_PADDED = 2 };
_Static_assert((int)moe_v3_number == (int)MOE_VERSION, "v3.def is version 3");
_Static_assert((int)moe_v2_number == (int)MOE_VERSION_PADDED, "v2.def is version 2");
static const struct ckpt_schema *const moe_versions[] = {&moe_v3, &moe_v2, NULL};

static int moe_in_shape(const struct gpt_shape *shape) { return moe_params_of(shape) != NULL; }

/* Its /model attributes (the versions' other lines are every file's). */
static const char *const moe_attr_names[] = {"moe_every", "experts", "top_k", "expert_hidden",
                                             "moe_router", "moe_capacity_factor", "moe_drop",
                                             NULL};

static int moe_owns_attr(const char *object, const char *name)
{
    if (strcmp(object, "/model") != 0) return 0;
    for (int i = 0; moe_attr_names[i]; i++)
        if (!strcmp(name, moe_attr_names[i])) return 1;
    return 0;
}

static const char *const router_names[] = {"softmax", "sigmoid"};
static const char *const drop_names[] = {"probs", "position", "slot"};

/* The index of text among names, or -2 when it is none of them. */
static int name_index(const char *const *names, int count, const char *text)
{
    for (int i = 0; i < count; i++)
        if (!strcmp(names[i], text)) return i;
    return -2;
}

/* Version 3's routing keys: the routing that decides what each token
 * computes, kept beside the shape and compared on resume. */
static void moe_write_attrs(const struct gpt_shape *shape, const struct dyn_ckpt_writer *w)
{
    const struct moe_params *p = moe_params_of(shape);
    char factor[40];
    snprintf(factor, sizeof factor, "%.17g", (double)p->capacity_factor);
    w->int_attr(w->ctx, "/model", "moe_every", p->every);
    w->int_attr(w->ctx, "/model", "experts", p->experts);
    w->int_attr(w->ctx, "/model", "top_k", p->top_k);
    w->int_attr(w->ctx, "/model", "expert_hidden", p->hidden);
    w->string_attr(w->ctx, "/model", "moe_router", router_names[p->router]);
    w->string_attr(w->ctx, "/model", "moe_capacity_factor", factor);
    w->string_attr(w->ctx, "/model", "moe_drop", drop_names[p->drop]);
}

/* What a file says; routing -1 where it records none (version 2), -2
 * where it is no name this dynmo knows, factor NAN where not a number. */
struct moe_file {
    long long every, experts, top_k, hidden;
    int router, drop, routed;
    float factor;
};

static void moe_store(void *raw, const char *object, const char *name, long long value,
                      const char *text)
{
    (void)object;
    struct moe_file *f = raw;
    if (!strcmp(name, "moe_every")) f->every = value;
    else if (!strcmp(name, "experts")) f->experts = value;
    else if (!strcmp(name, "top_k")) f->top_k = value;
    else if (!strcmp(name, "expert_hidden")) f->hidden = value;
    else if (!strcmp(name, "moe_router")) f->router = name_index(router_names, 2, text);
    else if (!strcmp(name, "moe_drop")) f->drop = name_index(drop_names, 3, text);
    else if (!strcmp(name, "moe_capacity_factor")) {
        char *end = NULL;
        double v = strtod(text, &end);
        f->factor = text[0] && !*end && v >= 0 ? (float)v : NAN;
    }
    f->routed |= !strncmp(name, "moe_", 4) && strcmp(name, "moe_every") != 0;
}

static int moe_file_check(const void *raw, struct gpt_shape *shape,
                          const struct dyn_ckpt_reader *rd)
{
    const struct moe_file *f = raw;
    struct moe_params p = {.every = (int)f->every, .experts = (int)f->experts,
                           .top_k = (int)f->top_k, .hidden = (int)f->hidden,
                           .router = f->routed ? f->router : -1,
                           .drop = f->routed ? f->drop : -1, .capacity_factor = f->factor,
                           .placed = rd->has(rd->ctx, "/moe/state/placement", NULL)};
    int bad = f->routed && (f->router < 0 || f->drop < 0 || isnan(f->factor));
    if (bad)
        dyn_ckpt_problem(rd, "/model attributes moe_router, moe_drop and moe_capacity_factor "
                         "are not a routing this dynmo knows (softmax or sigmoid; probs, "
                         "position or slot; a factor >= 0)");
    long L = shape->layers, C = shape->channels;
    if (L < 1 || C < 1 || C > 1 << 20 || L > 1 << 20 || f->every < 1 || f->every > L ||
        f->experts < 1 || f->experts > 1 << 20 || f->top_k < 1 || f->top_k > f->experts ||
        f->hidden < 1 || f->hidden > 1 << 24) {
        dyn_ckpt_problem(rd, "/model: mixture-of-experts attributes out of range (moe_every %d, "
                         "experts %d, top_k %d, expert_hidden %d for %ld layers)", p.every,
                         p.experts, p.top_k, p.hidden, L);
        return -1;
    }
    moe_shape_add(shape, &p);
    return bad ? -1 : 0;
}

/* Its dimensions: its blocks' rows (moe_layers, expert_rows: row j E + e
 * is expert e of MoE block j), their widths, version 3's split of every
 * block's rows (shared_params in /blocks, a dense block's MLP in /mlp),
 * and the rows of the placement (placed_layers: moe_layers when the run
 * moves experts, else 0 and the dataset is not written). */
static const char *const moe_dims[] = {"moe_layers", "experts", "router_params", "expert_rows",
                                       "expert_params", "shared_params", "dense_layers",
                                       "mlp_params", "placed_layers", NULL};

static long moe_dim(const struct gpt_shape *shape, const char *name)
{
    const struct moe_params *p = moe_params_of(shape);
    long M = gpt_moe_block_count(shape), E = p->experts, C = shape->channels;
    long shared = (long)moe_shared_param_count(shape->channels);
    const long values[] = {M, E, E * C, M * E,
                           (long)moe_expert_param_count(shape->channels, p->hidden), shared,
                           shape->layers - M, (long)block_param_count(shape->channels) - shared,
                           p->placed ? M : 0};
    for (int i = 0; moe_dims[i]; i++)
        if (!strcmp(name, moe_dims[i])) return values[i];
    return -1;
}

static int add_row(struct dyn_ckpt_rows *out, int n, int max, struct dyn_ckpt_rows row)
{
    DM_ASSERT(n < max);
    out[n] = row;
    return n + 1;
}

/* Every row of a block: its shared tensors (version 3: /blocks; version
 * 2: its /blocks row, a dense block's width, an MoE block's padding read
 * and dropped), a dense block's MLP (version 3: /mlp), an MoE block's
 * router and the experts it holds (sharded: written by their holders). */
static int moe_rows(const struct gpt_shape *shape, long version, const struct block *blk,
                    struct dyn_ckpt_rows *out, int max)
{
    size_t shared = moe_shared_param_count(blk->C), dense = block_param_count(blk->C);
    int moe = gpt_block_is_moe(shape, blk->index), n = 0;
    if (version == MOE_VERSION_PADDED)
        n = add_row(out, n, max, (struct dyn_ckpt_rows){.group = "/blocks", .row = blk->index,
                                                        .count = 1, .floats = moe ? shared : dense,
                                                        .stored = dense});
    else
        n = add_row(out, n, max, (struct dyn_ckpt_rows){.group = "/blocks", .row = blk->index,
                                                        .count = 1, .floats = shared});
    if (version != MOE_VERSION_PADDED && !moe)
        n = add_row(out, n, max, (struct dyn_ckpt_rows){.group = "/mlp",
                                                        .row = gpt_mlp_ordinal(shape, blk->index),
                                                        .count = 1, .offset = shared,
                                                        .floats = dense - shared});
    if (!moe) return n;
    const struct block_moe *m = block_moe_of(blk);
    long j = gpt_moe_ordinal(shape, blk->index), E = m->cfg.experts;
    size_t router = (size_t)E * (size_t)blk->C;
    n = add_row(out, n, max, (struct dyn_ckpt_rows){.group = "/moe/router", .row = j, .count = 1,
                                                    .offset = shared, .floats = router});
    /* the held experts as runs of consecutive experts in consecutive
     * slots (one run unless moe.placement moved experts) */
    int owned = moe_owned_experts(&m->cfg);
    for (int first = 0, k = 1; k <= owned; k++) {
        if (k < owned && moe_held_expert(m, k) == moe_held_expert(m, k - 1) + 1) continue;
        n = add_row(out, n, max,
                    (struct dyn_ckpt_rows){.group = "/moe/experts",
                                           .row = j * E + moe_held_expert(m, first),
                                           .count = k - first,
                                           .offset = shared + router +
                                                     (size_t)first * m->expert_params,
                                           .floats = m->expert_params, .sharded = 1});
        first = k;
    }
    return n;
}

static int moe_writes_sharded(const struct gpt_shape *shape, int dp_rank)
{
    const struct moe_params *p = moe_params_of(shape);
    return p->shard_count ? dp_rank < p->experts / p->shard_count : dp_rank == 0;
}

/* An MoE block's selection bias and last step's counts: row j of /moe/state. */
static void moe_write_state(const struct gpt_shape *shape, const struct block *blk,
                            const struct dyn_ckpt_state_writer *w)
{
    const struct block_moe *m = block_moe_of(blk);
    if (!m) return;
    long j = gpt_moe_ordinal(shape, blk->index);
    w->rows(w->ctx, "/moe/state/bias", j, 1, m->bias);
    w->rows(w->ctx, "/moe/state/tokens", j, 1, m->tokens);
    w->rows(w->ctx, "/moe/state/dropped", j, 1, m->dropped);
    if (m->cfg.placed) {
        int64_t *order = dm_alloc((size_t)m->cfg.experts * sizeof(int64_t));
        for (int i = 0; i < m->cfg.experts; i++) order[i] = m->order[i];
        w->rows(w->ctx, "/moe/state/placement", j, 1, order);
        dm_free(order);
    }
}

/* Every MoE block's state, per MoE block j and expert e at j E + e. */
struct moe_states {
    int blocks, experts;
    float *bias;
    int64_t *tokens, *dropped;
    int64_t *placement;   /* NULL: the file keeps none (the static placement) */
};

static void moe_free_state(void *state)
{
    struct moe_states *st = state;
    dm_free(st->bias);
    dm_free(st->tokens);
    dm_free(st->dropped);
    dm_free(st->placement);
    dm_free(st);
}

/* Checked: a bias finite, 0 <= dropped <= routed, each placement an
 * order of the experts. */
static int check_states(const struct moe_states *st, const struct dyn_ckpt_reader *rd)
{
    for (long j = 0; st->placement && j < st->blocks; j++) {
        int64_t *row = st->placement + j * st->experts;
        for (long i = 0; i < st->experts; i++) {
            int seen = 0;
            for (long k = 0; k < st->experts; k++) seen += row[k] == i;
            if (seen != 1) {
                dyn_ckpt_problem(rd, "/moe/state/placement[%ld] holds expert %ld %d times "
                                 "(an order of the %d experts holds each once)", j, i, seen,
                                 st->experts);
                return -1;
            }
        }
    }
    for (long c = 0; c < (long)st->blocks * st->experts; c++) {
        long j = c / st->experts, e = c % st->experts;
        if (!isfinite(st->bias[c])) {
            dyn_ckpt_problem(rd, "/moe/state/bias[%ld][%ld] is %g (must be finite)", j, e,
                             (double)st->bias[c]);
            return -1;
        }
        if (st->tokens[c] < 0 || st->dropped[c] < 0 || st->dropped[c] > st->tokens[c]) {
            dyn_ckpt_problem(rd, "/moe/state: MoE block %ld expert %ld has %ld routed and %ld "
                             "dropped pairs (need 0 <= dropped <= routed)", j, e,
                             (long)st->tokens[c], (long)st->dropped[c]);
            return -1;
        }
    }
    return 0;
}

static int moe_read_state(const struct gpt_shape *shape, const struct dyn_ckpt_reader *rd,
                          void **state)
{
    struct moe_states *st = dm_alloc(sizeof *st);
    st->blocks = gpt_moe_block_count(shape);
    st->experts = moe_params_of(shape)->experts;
    size_t cells = (size_t)st->blocks * (size_t)st->experts;
    st->bias = dm_alloc(cells * sizeof(float));
    st->tokens = dm_alloc(cells * sizeof(int64_t));
    st->dropped = dm_alloc(cells * sizeof(int64_t));
    if (rd->dataset(rd->ctx, "/moe/state/bias", 0, st->bias) ||
        rd->dataset(rd->ctx, "/moe/state/tokens", 1, st->tokens) ||
        rd->dataset(rd->ctx, "/moe/state/dropped", 1, st->dropped) ||
        (moe_params_of(shape)->placed &&
         rd->dataset(rd->ctx, "/moe/state/placement", 1,
                     st->placement = dm_alloc(cells * sizeof(int64_t)))) ||
        check_states(st, rd)) {
        moe_free_state(st);
        return -1;
    }
    *state = st;
    return 0;
}

static void moe_apply_state(const void *state, const struct gpt_shape *shape, struct block *blk)
{
    const struct moe_states *st = state;
    struct block_moe *m = block_moe_of(blk);
    if (!m) return;
    long j = gpt_moe_ordinal(shape, blk->index), E = st->experts;
    DM_ASSERT(E == m->cfg.experts && j < st->blocks);
    for (long e = 0; e < E; e++) {
        m->bias[e] = st->bias[j * E + e];
        m->tokens[e] = st->tokens[j * E + e];
        m->dropped[e] = st->dropped[j * E + e];
    }
    /* the kept placement, when this run moves experts too (each rank
     * then reads the experts of its positions); otherwise where
     * parallel.ep puts them */
    if (st->placement && m->cfg.placed && m->cfg.shard_count > 0)
        for (long i = 0; i < E; i++) m->order[i] = (int)st->placement[j * E + i];
}

/* The run's routing against the file's: both known (a version-2 file's
 * are -1: not recorded), the same. */
static int compare_routing(const struct moe_params *file, const struct moe_params *run,
                           char *err, size_t errsize)
{
    if (file->every == 0 || (file->router == -1 && file->drop == -1)) return 0;   /* version 2 */
    if (file->router < 0 || file->drop < 0 || isnan(file->capacity_factor)) {
        snprintf(err, errsize, "its /model attributes moe_router, moe_drop and "
                 "moe_capacity_factor are not a routing this dynmo knows");
        return -1;
    }
    if (file->router == run->router && file->drop == run->drop &&
        file->capacity_factor == run->capacity_factor)
        return 0;
    char file_factor[32], run_factor[32];
    dm_format_shortest(file_factor, sizeof file_factor, file->capacity_factor);
    dm_format_shortest(run_factor, sizeof run_factor, run->capacity_factor);
    snprintf(err, errsize, "written for a different model: its MoE routing is moe.router %s, "
             "moe.capacity_factor %s, moe.drop %s in the checkpoint but %s, %s, %s in this run "
             "(they decide what each token computes: use the checkpoint's, or start a new run "
             "in another ckpt.dir)", router_names[file->router], file_factor,
             drop_names[file->drop], router_names[run->router], run_factor,
             drop_names[run->drop]);
    return -1;
}

/* The resume rule: the same MoE blocks and experts, then the same routing. */
static int moe_compare(const struct gpt_shape *file, const struct gpt_shape *run, char *err,
                       size_t errsize)
{
    static const struct moe_params none;
    const struct moe_params *f = moe_params_of(file) ? moe_params_of(file) : &none;
    const struct moe_params *r = moe_params_of(run) ? moe_params_of(run) : &none;
    struct { const char *key; int file, run; } keys[] = {
        {"moe_every", f->every, r->every}, {"experts", f->experts, r->experts},
        {"top_k", f->top_k, r->top_k}, {"expert_hidden", f->hidden, r->hidden},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (keys[i].file != keys[i].run) {
            snprintf(err, errsize, "written for a different model: model.%s is %d in the "
                     "checkpoint but %d in this run (use the checkpoint's model config, "
                     "or start a new run in another ckpt.dir)", keys[i].key, keys[i].file,
                     keys[i].run);
            return -1;
        }
    return compare_routing(f, r, err, errsize);
}

static const struct dyn_ckpt_part moe_ckpt = {
    .versions = moe_versions,
    .versions_text = ", 3 (with mixture-of-experts blocks) and 2 (MoE blocks as an older "
                     "dynmo wrote them)",
    .owns_attr = moe_owns_attr,
    .in_shape = moe_in_shape,
    .write_attrs = moe_write_attrs,
    .store = moe_store,
    .check = moe_file_check,
    .dims = moe_dims,
    .dim = moe_dim,
    .rows = moe_rows,
    .writes_sharded = moe_writes_sharded,
    .write_state = moe_write_state,
    .read_state = moe_read_state,
    .apply_state = moe_apply_state,
    .free_state = moe_free_state,
    .compare = moe_compare,
};

/* ---- its blocks in a model ---------------------------------------------------------- */

static void moe_add_to_shape(const struct dm_config *cfg, struct gpt_shape *shape)
{
    struct moe_params p = {
        .every = cfg->moe_every, .experts = cfg->experts, .top_k = cfg->top_k,
        .hidden = cfg->expert_hidden > 0 ? cfg->expert_hidden : 4 * cfg->channels,
        .router = strcmp(cfg->moe_router, "sigmoid") ? MOE_ROUTER_SOFTMAX : MOE_ROUTER_SIGMOID,
        .drop = !strcmp(cfg->moe_drop, "position") ? MOE_DROP_POSITION
                : !strcmp(cfg->moe_drop, "slot")   ? MOE_DROP_SLOT
                                                    : MOE_DROP_PROBS,
        .capacity_factor = (float)cfg->capacity_factor, .aux_loss = (float)cfg->aux_loss,
        .z_loss = (float)cfg->z_loss, .bias_rate = (float)cfg->bias_rate,
        .placed = strcmp(cfg->moe_placement, "static") != 0,
    };
    moe_shape_add(shape, &p);
}

/* Replica r's blocks hold the experts of its rank in its expert group. */
static void moe_shard(const struct dm_config *cfg, struct gpt_shape *shape, int replica)
{
    moe_shape_shard(shape, cfg->ep, replica % (cfg->ep > 0 ? cfg->ep : 1));
}

/* What an MoE block keeps beyond its slab on its rank: with parallel.ep >
 * 1 the other sources' gradient sums of its held experts (E - E / ep
 * experts' worth), with moe.replicas_max the copies a rank may hold (each
 * its weights and a gradient sum per source), and the routing and expert
 * activations of the micro-batches it holds at once. */
static double moe_block_memory(const struct dm_config *cfg, const struct gpt_shape *shape,
                               int layer, int micro_B)
{
    const struct moe_params *p = moe_params_of(shape);
    if (!gpt_block_is_moe(shape, layer)) return 0.0;
    double expert = 4.0 * (double)moe_expert_param_count(shape->channels, p->hidden);
    double sums = cfg->ep > 1 ? (p->experts - moe_owned_experts(p)) * expert : 0.0;
    sums += (double)cfg->replicas_max * (1.0 + cfg->ep) * expert;
    return sums + (double)cfg->micro_batches * (double)moe_acts_bytes(shape, micro_B, cfg->seq);
}

static void moe_describe_shape(const struct gpt_shape *shape, char *buf, size_t size)
{
    const struct moe_params *p = moe_params_of(shape);
    if (!p) return;
    snprintf(buf, size, "mixture of experts: every %d blocks (%d MoE blocks), %d experts of "
             "hidden width %d, top-%d: %zu parameters per MoE block", p->every,
             gpt_moe_block_count(shape), p->experts, p->hidden, p->top_k,
             gpt_block_param_count(shape, p->every - 1));
}

/* What the readers of a stored config divide by (simulate prices MoE
 * blocks in groups of experts / parallel.ep). */
static int moe_check_log_config(const struct dm_config *cfg, char *problem, size_t size)
{
    if (cfg->moe_every > 0 && cfg->experts % cfg->ep != 0) {
        snprintf(problem, size, "parallel.ep = %d does not divide model.experts = %d", cfg->ep,
                 cfg->experts);
        return -1;
    }
    return 0;
}

const struct dyn_scheme dyn_scheme_moe = {
    .ckpt = &moe_ckpt,
    .ext = &moe_ext_ops,
    .add_to_shape = moe_add_to_shape,
    .shard = moe_shard,
    .block_memory = moe_block_memory,
    .describe_shape = moe_describe_shape,
    .name = "moe",
    .active = moe_active,
    .keys = moe_keys,
    .check = moe_check,
    .couples_batch = moe_couples_batch,
    .title = "mixture of experts",
    .switch_key = "model.moe_every",
    .switch_off = "0",
    .refuses = moe_refuses,
    .owns = moe_scheme_owns,
    DYN_SIGNALS(moe_signals),
    .step_note = moe_step_note,
    .summarise_log = moe_summarise_log,
    .check_log_config = moe_check_log_config,
};
