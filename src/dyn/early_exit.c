/* Early exit (dyn.kind=early_exit), in the spirit of CALM: after every
 * block from dyn.exit_from on, each token still active gets a confidence
 * (dyn.exit_confidence = softmax: top-1 minus top-2 probability of the
 * shared LM head; saturation: cosine of the hidden state before and after
 * the block); when it reaches dyn.exit_threshold the token leaves, its
 * state is copied forward, and later blocks compute only the tokens that
 * remain (src/model/exit.c does the work; this file is the policy).
 *
 * The LM head on a pipeline: only the last stage holds the final norm,
 * and the middle stages hold no wte at all, so before every step the last
 * stage broadcasts a read-only copy of [wte | lnf_w | lnf_b] (V*C + 2C
 * floats, written by the previous optimizer step) over the pipeline
 * communicator, with a polled non-blocking broadcast. Every stage's exit
 * heads then use the same bits, so the decisions do not depend on the
 * layout. The broadcast is skipped when neither the softmax criterion nor
 * the exit losses need the head (saturation with exit_loss_weight = 0).
 *
 * Exits are allowed from step dyn.exit_warmup on; before that the exit
 * heads only train. The step line shows the share of (token, block) pairs
 * skipped in the previous step over the whole pipeline (one two-number
 * reduction per step). Nothing here looks at the layout or at timings. */
#include <stdio.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dyn/scheme.h"

struct early_exit {
    struct gpt_exit exit;
    int warmup, need_head, layers;
    struct dyn_env env;
    float *head;         /* (V*C + 2C) copy from the last stage (the backend's memory), or NULL */
    float *head_host;    /* its host staging for the broadcast on a device (NULL on the CPU) */
    double skipped_share;
};

static void early_exit_check(const struct dm_config *cfg)
{
    if (strcmp(cfg->dyn_kind, "early_exit") != 0) return;
    if (cfg->exit_from >= cfg->layers - 1)
        dm_user_error("dyn.exit_from = %d leaves no block to skip: model.layers = %d, so "
                      "exit_from must be below %d", cfg->exit_from, cfg->layers,
                      cfg->layers - 1);
    if (strcmp(cfg->exit_confidence, "softmax") != 0 &&
        strcmp(cfg->exit_confidence, "saturation") != 0)
        dm_user_error("dyn.exit_confidence = '%s' must be softmax or saturation",
                      cfg->exit_confidence);
}

static void *early_exit_create(const struct dm_config *cfg, const struct dyn_env *env)
{
    struct early_exit *e = dm_alloc(sizeof *e);
    e->exit.confidence = !strcmp(cfg->exit_confidence, "saturation") ? GPT_EXIT_SATURATION
                                                                      : GPT_EXIT_SOFTMAX;
    e->exit.from = cfg->exit_from;
    e->exit.threshold = (float)cfg->exit_threshold;
    e->exit.loss_weight = (float)cfg->exit_loss_weight;
    e->warmup = cfg->exit_warmup;
    e->layers = cfg->layers;
    e->env = *env;
    e->need_head = e->exit.confidence == GPT_EXIT_SOFTMAX || e->exit.loss_weight > 0.0f;
    e->exit.layer_tokens = dm_alloc((size_t)cfg->layers * sizeof(double));
    e->exit.layer_computed = dm_alloc((size_t)cfg->layers * sizeof(double));
    if (e->need_head && env->stages > 1) {
        size_t bytes = ((size_t)cfg->vocab * cfg->channels + 2 * (size_t)cfg->channels) *
                       sizeof(float);
        e->head = backend_current()->alloc(bytes);
        e->head_host = backend_staging(bytes);
    }
    return e;
}

static void early_exit_destroy(void *state, struct gpt *model)
{
    (void)model;
    struct early_exit *e = state;
    dm_free(e->exit.layer_tokens);
    dm_free(e->exit.layer_computed);
    if (e->head) backend_current()->free(e->head);
    backend_staging_free(e->head_host);
    dm_free(e);
}

/* The model of models[0..count) that holds the head, or NULL. */
static struct gpt *head_model(struct gpt *const *models, int count)
{
    for (int c = 0; c < count; c++)
        if (models[c]->has_head) return models[c];
    return NULL;
}

/* The LM head every exit reads: the model's own with one stage; on a
 * pipeline a copy of the last stage's, broadcast (the weights of the last
 * update). */
static void share_head(struct early_exit *e, struct gpt *const *models, int count)
{
    if (!e->need_head) return;
    struct gpt_exit *x = &e->exit;
    struct gpt *model = head_model(models, count);
    const struct gpt_shape *s = &models[0]->shape;
    size_t VC = (size_t)s->vocab * s->channels, C = (size_t)s->channels;
    MPI_Request req;
    if (e->env.stages == 1) {
        x->wte = model->wte;
        x->lnf_w = model->lnf_w;
        x->lnf_b = model->lnf_b;
        return;
    }
    int root = e->env.stages - 1;
    /* MPI moves host memory: the root's head comes down, the others' goes up */
    const struct dm_backend *ops = backend_current();
    float *head = backend_write_begin(e->head_host, e->head);
    if (e->env.stage == root) {
        ops->copy_to_host(head, model->wte, VC * sizeof(float));
        ops->copy_to_host(head + VC, model->lnf_w, C * sizeof(float));
        ops->copy_to_host(head + VC + C, model->lnf_b, C * sizeof(float));
    }
    WORLD_MPI(MPI_Ibcast(head, (int)(VC + 2 * C), MPI_FLOAT, root, e->env.pipeline_comm, &req));
    world_wait(&req);
    backend_write_end(e->head, head, (VC + 2 * C) * sizeof(float));
    x->wte = e->head;
    x->lnf_w = e->head + VC;
    x->lnf_b = e->head + VC + C;
}

static void early_exit_before_step(void *state, struct gpt *const *models, int count, int step)
{
    struct early_exit *e = state;
    struct gpt_exit *x = &e->exit;
    for (int c = 0; c < count; c++) models[c]->exit = x;   /* the chunks share the counts */
    x->allow = step >= e->warmup;
    if (e->env.stages > 1) {
        double mine[2] = {x->token_blocks, x->token_blocks_skipped}, total[2];
        MPI_Request req;
        WORLD_MPI(MPI_Iallreduce(mine, total, 2, MPI_DOUBLE, MPI_SUM, e->env.pipeline_comm, &req));
        world_wait(&req);
        e->skipped_share = total[0] > 0 ? total[1] / total[0] : 0.0;
    } else {
        e->skipped_share = x->token_blocks > 0 ? x->token_blocks_skipped / x->token_blocks : 0.0;
    }
    x->token_blocks = x->token_blocks_skipped = x->exit_loss_sum = 0.0;
    memset(x->layer_tokens, 0, (size_t)e->layers * sizeof(double));
    memset(x->layer_computed, 0, (size_t)e->layers * sizeof(double));
    share_head(e, models, count);
}

static void early_exit_before_eval(void *state, struct gpt *const *models, int count)
{
    share_head(state, models, count);
}

static void early_exit_after_reduce(void *state, struct gpt *const *models, int count, int step,
                                    const double *block_sumsq)
{
    (void)state;
    (void)models;
    (void)count;
    (void)step;
    (void)block_sumsq;
}

static void early_exit_describe(const void *state, struct gpt *const *models, int count,
                                char *buf, size_t size)
{
    (void)models;
    (void)count;
    const struct early_exit *e = state;
    snprintf(buf, size, "skipped %.1f%% token-blocks", 100.0 * e->skipped_share);
}

/* The share of the tokens reaching the block that it computed in the
 * step (1 while no token has exited); ranks' values add up, so the
 * stage of a block's attention half alone gives 0: the stage of its MLP
 * (the block's end, where its tokens are counted) gives the share. */
static void read_active(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct gpt_exit *x = model->exit;
    int layer = model->first_block + i;
    if (model->blocks[i].halves == BLOCK_HALF_ATTENTION) {
        value[0] = 0.0;
        return;
    }
    value[0] = x && x->layer_tokens && x->layer_tokens[layer] > 0
                   ? x->layer_computed[layer] / x->layer_tokens[layer] : 1.0;
}

static const struct dyn_signal early_exit_signals[] = {
    {.dataset = "/layers/active",
     .label = "active tokens",
     .unit = "share",
     .meaning = "the share of the tokens reaching the block that it computed (the rest had exited)",
     .columns = DYN_SIGNAL_LAYERS,
     .combine = DYN_COMBINE_REPLICA0,
     .read = read_active,
     .figure_label = "active tokens",
     .figure_unit = "share",
     .cost = DYN_COST_TOKEN_SHARE,
     .cost_name = "active",
     .cost_dataset = "/layers/active",
     .neutral = 1.0f},
};

static const char *const early_exit_keys[] = {"dyn.exit_from", "dyn.exit_threshold",
                                              "dyn.exit_confidence", "dyn.exit_loss_weight",
                                              "dyn.exit_warmup", NULL};

const struct dyn_scheme dyn_scheme_early_exit = {
    .name = "early_exit",
    .kind = "early_exit",
    .keys = early_exit_keys,
    .check = early_exit_check,
    .title = "early exit",
    DYN_SIGNALS(early_exit_signals),
    .create = early_exit_create,
    .destroy = early_exit_destroy,
    .before_step = early_exit_before_step,
    .after_reduce = early_exit_after_reduce,
    .before_eval = early_exit_before_eval,
    .describe = early_exit_describe,
};
