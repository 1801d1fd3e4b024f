/* The balancing controller (balance.h): what `dynmo train` runs after
 * every step, as pure code over the measured profile.
 *
 * It keeps an exponential moving average (weight 1/2 on the newest step) of
 * every block's forward and backward time per micro-batch and update time
 * per step, and of the extra time of the first stage (embedding) and the
 * last stage (head and loss). Every `every` steps it asks a balancing
 * method for a layout, predicts the step time of the current and the
 * proposed layout from the same averages, and applies the proposal only
 * when it is predicted at least min_improvement faster and the predicted
 * saving over the next interval beats min_gain times the cost of migrating,
 * fitted to the migrations so far (balance_migration_cost_ms). Each
 * decision becomes a row of the run log, finished one step later with the
 * step time measured after it.
 *
 * Must not: call MPI, touch the model, print or write files. The caller
 * (src/tools) broadcasts the layout, migrates and logs. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "balance_internal.h"

#define MIGRATIONS_KEPT 8
#define EMA_WEIGHT 0.5

enum { POLICY_NONE = -2, POLICY_RANDOM = -3 };

struct balance_controller {
    int method;                 /* enum balance_method, or POLICY_* */
    int stages, blocks, every, micro_batches;
    enum dm_schedule schedule;
    int virtual_stages;         /* chunks per stage (1: none); stages counts chunks */
    uint64_t seed;
    double min_gain, min_improvement;
    double block_params;
    double *block_sizes;        /* (blocks) each unit's parameters */
    double *matrix_weights;     /* (blocks) each unit's prunable matrix weights */
    double *params;             /* (blocks) parameters that still compute */
    double *fwd_ema, *bwd_ema;  /* (blocks) ms per micro-batch */
    double *wgrad_ema;          /* (blocks) zb: the weight parts' share of bwd_ema */
    int have_wgrad;             /* the observations measured weight parts */
    double *update_ema;         /* (blocks) ms once a step */
    struct balance_extra embed_ema, head_ema;   /* time fields only */
    int64_t *mem_bytes;         /* (blocks) */
    int have_ema;
    /* The last MIGRATIONS_KEPT migrations (bytes, ms), oldest overwritten. */
    double migrated_bytes[MIGRATIONS_KEPT], migrated_ms[MIGRATIONS_KEPT];
    int migrations;
    struct balance_sharing sharing;   /* groups = 0: a processor per stage */
    int pending;                      /* a decision row waits for its next step */
    float pending_row[BALANCE_DECISION_COLUMNS];
};

/* balance.method's names beyond the methods: "none", "random", and
 * "partition" / "diffusion" taking their cost from balance.cost. */
static int parse_policy(const char *method, const char *cost)
{
    char name[64];
    snprintf(name, sizeof name, "%s", method);
    if (!strcmp(name, "partition") || !strcmp(name, "diffusion"))
        snprintf(name, sizeof name, "%s-%s", method, cost);
    if (!strcmp(name, "none")) return POLICY_NONE;
    if (!strcmp(name, "random")) return POLICY_RANDOM;
    return balance_method_parse(name);
}

int balance_controller_valid_method(const char *method, const char *cost, char *err,
                                    size_t errsize)
{
    if (parse_policy(method, cost) != -1) return BALANCE_OK;
    char valid[512] = "none, random, partition, diffusion";
    for (int m = 0; m < BALANCE_METHOD_COUNT; m++) {
        strncat(valid, ", ", sizeof valid - strlen(valid) - 1);
        strncat(valid, balance_method_name(m), sizeof valid - strlen(valid) - 1);
    }
    return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                        "balance.method = '%s' is not a method (valid: %s)", method, valid);
}

struct balance_controller *balance_controller_create(const struct balance_controller_config *c,
                                                     char *err, size_t errsize)
{
    if (balance_controller_valid_method(c->method, c->cost, err, errsize) != BALANCE_OK)
        return NULL;
    int v = c->virtual_stages > 1 ? c->virtual_stages : 1;
    if (c->stages < 1 || c->blocks < c->stages || c->every < 1 || c->micro_batches < 1 ||
        c->stages % v != 0) {
        balance_fail(BALANCE_BAD_INPUT, err, errsize,
                     "controller: %d stages (%d chunks each), %d blocks, every %d, %d "
                     "micro-batches", c->stages, v, c->blocks, c->every, c->micro_batches);
        return NULL;
    }
    struct balance_controller *ctl = dm_alloc(sizeof *ctl);
    ctl->method = parse_policy(c->method, c->cost);
    ctl->stages = c->stages;
    ctl->blocks = c->blocks;
    ctl->every = c->every;
    ctl->micro_batches = c->micro_batches;
    ctl->schedule = c->schedule;
    ctl->virtual_stages = v;
    ctl->seed = c->seed;
    ctl->min_gain = c->min_gain;
    ctl->min_improvement = c->min_improvement;
    ctl->block_params = c->block_params;
    size_t n = (size_t)c->blocks;
    double **const per_block[] = {&ctl->params,    &ctl->block_sizes, &ctl->matrix_weights,
                                  &ctl->fwd_ema,   &ctl->bwd_ema,     &ctl->wgrad_ema,
                                  &ctl->update_ema};
    dm_carve_doubles(per_block, sizeof per_block / sizeof per_block[0], n);
    ctl->mem_bytes = dm_alloc(n * sizeof(int64_t));
    for (size_t b = 0; b < n; b++)
        ctl->block_sizes[b] = c->block_param_counts ? c->block_param_counts[b] : c->block_params;
    for (size_t b = 0; b < n; b++) ctl->params[b] = ctl->block_sizes[b];
    for (size_t b = 0; b < n; b++)
        ctl->matrix_weights[b] =
            c->unit_matrix_weights ? c->unit_matrix_weights[b] : c->block_matrix_weights;
    ctl->sharing.stages = c->stages;
    return ctl;
}

void balance_controller_destroy(struct balance_controller *ctl)
{
    if (!ctl) return;
    dm_free(ctl->params);   /* and the other per-block doubles, carved from it */
    dm_free(ctl->mem_bytes);
    dm_free(ctl);
}

void balance_controller_set_sharing(struct balance_controller *ctl,
                                    const struct balance_sharing *sharing)
{
    struct balance_sharing none = {.stages = ctl->stages};
    ctl->sharing = sharing ? *sharing : none;
}

int balance_controller_active(const struct balance_controller *ctl)
{
    return ctl->method != POLICY_NONE;
}

int balance_controller_is_decision_step(const struct balance_controller *ctl, int step)
{
    return ctl->method != POLICY_NONE && (step + 1) % ctl->every == 0;
}

/* A random layout drawn from (seed, step): every stage at least one
 * block. For testing that migration never changes the math. */
static void random_layout(int *counts, int stages, int blocks, uint64_t seed, int step)
{
    for (int s = 0; s < stages; s++) counts[s] = 1;
    for (int k = 0; k < blocks - stages; k++)
        counts[dm_hash64(seed, 0x6c61796f7574ULL + (uint64_t)step, (uint64_t)k) %
               (uint64_t)stages]++;
}

static double ema(double old, double now, int have)
{
    return have ? (1.0 - EMA_WEIGHT) * old + EMA_WEIGHT * now : now;
}

/* Folds one step into the averages. The first and last stage's extra time
 * is what their compute time has beyond their blocks: the embedding, the
 * head and loss per micro-batch, and at the step's end the embedding's and
 * head's update and the gradient exchanges. */
static void fold(struct balance_controller *ctl, const struct balance_observation *obs)
{
    int S = ctl->stages, n = ctl->blocks;
    double busy[2] = {obs->stage_compute_ms[0], obs->stage_compute_ms[S - 1]};
    double update[2] = {obs->stage_update_ms[0], obs->stage_update_ms[S - 1]};
    struct balance_extra embed, head;
    balance_end_stage_extras(obs->fwd_ms, obs->bwd_ms, obs->update_ms, obs->layout, S,
                             ctl->micro_batches, busy, update, &embed, &head);
    struct balance_extra *emas[2] = {&ctl->embed_ema, &ctl->head_ema}, *now[2] = {&embed, &head};
    for (int k = 0; k < 2; k++) {
        emas[k]->fwd_ms = ema(emas[k]->fwd_ms, now[k]->fwd_ms, ctl->have_ema);
        emas[k]->bwd_ms = ema(emas[k]->bwd_ms, now[k]->bwd_ms, ctl->have_ema);
        emas[k]->update_ms = ema(emas[k]->update_ms, now[k]->update_ms, ctl->have_ema);
    }
    for (int b = 0; b < n; b++) {
        ctl->fwd_ema[b] = ema(ctl->fwd_ema[b], obs->fwd_ms[b], ctl->have_ema);
        ctl->bwd_ema[b] = ema(ctl->bwd_ema[b], obs->bwd_ms[b], ctl->have_ema);
        if (obs->wgrad_ms)
            ctl->wgrad_ema[b] = ema(ctl->wgrad_ema[b], obs->wgrad_ms[b], ctl->have_ema);
        ctl->update_ema[b] = ema(ctl->update_ema[b], obs->update_ms[b], ctl->have_ema);
        ctl->mem_bytes[b] = (int64_t)obs->mem_bytes[b];
        /* Parameters that still compute: a pruned block's nonzeros. */
        ctl->params[b] = ctl->block_sizes[b] - obs->sparsity[b] * ctl->matrix_weights[b];
    }
    ctl->have_ema = 1;
    ctl->have_wgrad |= obs->wgrad_ms != NULL;
    if (obs->migrated_blocks > 0 && obs->migrated_bytes > 0) {
        int slot = ctl->migrations++ % MIGRATIONS_KEPT;
        ctl->migrated_bytes[slot] = obs->migrated_bytes;
        ctl->migrated_ms[slot] = obs->migrate_ms;
    }
}

int balance_controller_observe(struct balance_controller *ctl,
                               const struct balance_observation *obs,
                               float row[BALANCE_DECISION_COLUMNS])
{
    if (ctl->method == POLICY_NONE) return 0;
    int finished = ctl->pending;
    if (finished) {
        ctl->pending_row[6] = (float)obs->step_ms;   /* measured after the decision */
        memcpy(row, ctl->pending_row, sizeof ctl->pending_row);
        ctl->pending = 0;
    }
    fold(ctl, obs);
    return finished;
}

static void current_profile(const struct balance_controller *ctl, struct balance_profile *profile)
{
    struct balance_profile p = {
        .blocks = ctl->blocks, .fwd_ms = ctl->fwd_ema, .bwd_ms = ctl->bwd_ema,
        .params = ctl->params, .mem_bytes = ctl->mem_bytes,
        .embed = ctl->embed_ema, .head = ctl->head_ema,
        .sharing = ctl->sharing.groups ? &ctl->sharing : NULL,
        .update_ms = ctl->update_ema,
        .wgrad_ms = ctl->have_wgrad ? ctl->wgrad_ema : NULL,
        .virtual_stages = ctl->virtual_stages,
    };
    *profile = p;
}

/* The predicted cost of migrating `bytes`, from the kept migrations. */
static double migration_ms(const struct balance_controller *ctl, double bytes)
{
    int n = ctl->migrations < MIGRATIONS_KEPT ? ctl->migrations : MIGRATIONS_KEPT;
    return balance_migration_cost_ms(ctl->migrated_bytes, ctl->migrated_ms, n, bytes);
}

/* Proposes a layout with the controller's method into next and weighs it
 * against the current one; the verdict goes into *d. */
static int weigh_proposal(struct balance_controller *ctl, const int *current, int step,
                          double measured_ms, int *next, struct balance_decision *d,
                          char *err, size_t errsize)
{
    int S = ctl->stages;
    struct balance_profile profile;
    current_profile(ctl, &profile);
    struct balance_options options = {.mem_cap = 0, .gamma = 0.0, .max_rounds = 0,
                                      .micro_batches = ctl->micro_batches,
                                      .schedule = ctl->schedule};
    struct balance_result res;
    char why[256];
    if (balance_propose(ctl->method, &profile, S, current, &options, next, &res, why,
                        sizeof why) != BALANCE_OK) {
        memcpy(next, current, (size_t)S * sizeof(int));
        return balance_fail(BALANCE_BAD_INPUT, err, errsize, "%s; keeping the layout", why);
    }
    struct balance_prediction now, then;
    if (balance_predict(&profile, S, current, ctl->micro_batches, ctl->schedule, &now, why,
                        sizeof why) != BALANCE_OK ||
        balance_predict(&profile, S, next, ctl->micro_batches, ctl->schedule, &then, why,
                        sizeof why) != BALANCE_OK) {
        memcpy(next, current, (size_t)S * sizeof(int));
        return balance_fail(BALANCE_BAD_INPUT, err, errsize,
                            "cannot predict: %s; keeping the layout", why);
    }
    d->method = balance_method_name(ctl->method);
    d->now_ms = now.step_ms;
    d->next_ms = then.step_ms;
    d->saving_ms = (now.step_ms - then.step_ms) * ctl->every;
    d->migrate_ms = migration_ms(ctl, (double)res.bytes_moved);
    d->changed = memcmp(next, current, (size_t)S * sizeof(int)) != 0;
    int pays = d->saving_ms > 0 && d->saving_ms >= ctl->min_gain * d->migrate_ms;
    d->enough = then.step_ms <= (1.0 - ctl->min_improvement) * now.step_ms;
    d->apply = d->changed && pays && d->enough;
    d->every = ctl->every;
    float row[BALANCE_DECISION_COLUMNS] = {
        (float)(step + 1), (float)now.step_ms, (float)then.step_ms, (float)measured_ms,
        (float)d->apply, (float)res.blocks_moved, NAN, (float)res.bytes_moved};
    memcpy(ctl->pending_row, row, sizeof row);
    ctl->pending = 1;
    return BALANCE_OK;
}

int balance_controller_decide(struct balance_controller *ctl,
                              const struct balance_observation *obs, int step, int *next,
                              struct balance_decision *d, char *err, size_t errsize)
{
    int S = ctl->stages;
    struct balance_decision none = {.step = step + 1};
    *d = none;
    memcpy(next, obs->layout, (size_t)S * sizeof(int));
    if (!balance_controller_is_decision_step(ctl, step)) return BALANCE_OK;
    if (ctl->method == POLICY_RANDOM) {
        random_layout(next, S, ctl->blocks, ctl->seed, step);
        d->method = "random";
        d->changed = memcmp(next, obs->layout, (size_t)S * sizeof(int)) != 0;
        d->apply = d->changed;
        d->every = ctl->every;
        return BALANCE_OK;
    }
    return weigh_proposal(ctl, obs->layout, step, obs->step_ms, next, d, err, errsize);
}

int balance_controller_repack(struct balance_controller *ctl,
                              const struct balance_observation *obs, double epsilon,
                              int min_stages, int *counts, char *err, size_t errsize)
{
    int S = ctl->stages;
    if (err && errsize) err[0] = 0;
    if (!ctl->have_ema || ctl->method == POLICY_NONE) fold(ctl, obs);
    struct balance_profile profile;
    current_profile(ctl, &profile);
    /* The sharing describes these S stages; a candidate on fewer stages
     * would run on other ranks' processors, so both sides of the
     * comparison get a processor per stage. */
    profile.sharing = NULL;
    struct balance_result res;
    memcpy(counts, obs->layout, (size_t)S * sizeof(int));
    if (balance_repack(&profile, obs->layout, S, 0, ctl->micro_batches, ctl->schedule, epsilon,
                       counts, &res, err, errsize) != BALANCE_OK) {
        memcpy(counts, obs->layout, (size_t)S * sizeof(int));
        return S;
    }
    if (res.stages >= min_stages) return res.stages;
    memcpy(counts, obs->layout, (size_t)S * sizeof(int));
    if (min_stages >= S) return S;
    double *cost = dm_alloc((size_t)ctl->blocks * sizeof(double));
    struct balance_costs costs;
    balance_costs_from_profile(&costs, &profile, BALANCE_COST_TIME, cost);
    int stages = min_stages;
    if (balance_partition(&costs, min_stages, 0, NULL, 0, counts, &res, err, errsize) !=
        BALANCE_OK) {
        memcpy(counts, obs->layout, (size_t)S * sizeof(int));
        stages = S;
    }
    dm_free(cost);
    return stages;
}
