/* The balancing loop of `dynmo train` (see balancing.h).
 *
 * Rank 0 keeps an exponential moving average (weight 1/2 on the newest
 * step) of every block's profiled forward and backward time per
 * micro-batch, and of the extra time of the first stage (embedding) and
 * the last stage (head and loss). Every balance.every steps it asks
 * src/balance for a layout, predicts the step time of the current and the
 * proposed layout with the same costs, and migrates only when the proposal
 * is predicted at least balance.min_improvement faster and the predicted
 * saving over the next interval beats balance.min_gain times the cost of
 * migrating (fitted to the migrations so far: migration_ms). The engine
 * broadcasts the decision, so
 * every rank switches at the same step boundary. Decisions are logged in
 * the run log (/balance/...) with the step time measured after them. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "tools/balancing.h"

#define MIGRATIONS_KEPT 8

enum { METHOD_NONE = -2, METHOD_RANDOM = -3 };
#define EMA_WEIGHT 0.5

struct balancer {
    int method;                 /* enum balance_method, or METHOD_* */
    int stages, layers, every, micro_batches;
    enum dm_schedule schedule;
    uint64_t seed;
    double min_gain, min_improvement;
    double *params;             /* (layers) nonzero parameters per block */
    size_t block_params, block_matrix_weights;  /* dense counts of one block */
    double *fwd_ema, *bwd_ema;  /* (layers) ms per micro-batch */
    double *update_ema;         /* (layers) ms once a step */
    struct balance_extra embed_ema, head_ema;   /* time fields only */
    int64_t *mem_bytes;         /* (layers) */
    int have_ema;
    /* The last MIGRATIONS_KEPT migrations (bytes, ms), oldest overwritten. */
    double migrated_bytes[MIGRATIONS_KEPT], migrated_ms[MIGRATIONS_KEPT];
    int migrations;
    int *proposal, *current;
    /* stages that share processors (balancer_set_sharing); groups = 0: none */
    struct balance_sharing sharing;
    /* the last decision, logged one step later with the measured time */
    int pending;
    float pending_row[8];
};

struct balancer *balancer_create(const struct dm_config *cfg, int stages)
{
    struct balancer *bal = dm_alloc(sizeof *bal);
    char name[64];
    snprintf(name, sizeof name, "%s", cfg->method);
    /* "partition" and "diffusion" take their cost from balance.cost. */
    if (!strcmp(name, "partition") || !strcmp(name, "diffusion"))
        snprintf(name, sizeof name, "%s-%s", cfg->method, cfg->cost);
    if (!strcmp(name, "none")) bal->method = METHOD_NONE;
    else if (!strcmp(name, "random")) bal->method = METHOD_RANDOM;
    else bal->method = balance_method_parse(name);
    if (bal->method == -1) {
        char valid[512] = "none, random, partition, diffusion";
        for (int m = 0; m < BALANCE_METHOD_COUNT; m++) {
            strncat(valid, ", ", sizeof valid - strlen(valid) - 1);
            strncat(valid, balance_method_name(m), sizeof valid - strlen(valid) - 1);
        }
        dm_user_error("balance.method = '%s' is not a method (valid: %s)", cfg->method, valid);
    }
    bal->stages = stages;
    bal->layers = cfg->layers;
    bal->every = cfg->every;
    bal->micro_batches = cfg->micro_batches;
    bal->schedule = config_schedule(cfg);
    bal->seed = cfg->seed;
    bal->min_gain = cfg->min_gain;
    bal->min_improvement = cfg->min_improvement;
    size_t L = (size_t)cfg->layers;
    bal->params = dm_alloc(L * sizeof(double));
    bal->fwd_ema = dm_alloc(L * sizeof(double));
    bal->bwd_ema = dm_alloc(L * sizeof(double));
    bal->update_ema = dm_alloc(L * sizeof(double));
    bal->mem_bytes = dm_alloc(L * sizeof(int64_t));
    bal->block_params = block_param_count(cfg->channels);
    bal->block_matrix_weights = block_matrix_weights(cfg->channels);
    for (size_t l = 0; l < L; l++) bal->params[l] = (double)bal->block_params;
    bal->proposal = dm_alloc((size_t)stages * sizeof(int));
    bal->current = dm_alloc((size_t)stages * sizeof(int));
    return bal;
}

void balancer_set_sharing(struct balancer *bal, int groups, const int *group,
                          const double *cores, int turns)
{
    struct balance_sharing sharing = {.stages = bal->stages, .groups = groups,
                                      .group = group, .cores = cores, .turns = turns};
    bal->sharing = sharing;
}

void balancer_destroy(struct balancer *bal)
{
    dm_free(bal->params);
    dm_free(bal->fwd_ema);
    dm_free(bal->bwd_ema);
    dm_free(bal->update_ema);
    dm_free(bal->mem_bytes);
    dm_free(bal->proposal);
    dm_free(bal->current);
    dm_free(bal);
}

/* A random layout drawn from (seed, step): every stage at least one
 * block. For testing that migration never changes the math. */
static void random_layout(int *counts, int stages, int layers, uint64_t seed, int step)
{
    for (int s = 0; s < stages; s++) counts[s] = 1;
    for (int k = 0; k < layers - stages; k++)
        counts[dm_hash64(seed, 0x6c61796f7574ULL + (uint64_t)step, (uint64_t)k) %
               (uint64_t)stages]++;
}

static double ema(double old, double now, int have)
{
    return have ? (1.0 - EMA_WEIGHT) * old + EMA_WEIGHT * now : now;
}

/* Folds one step's profile into the averages (rank 0). The first and last
 * stage's extra time is what their compute time has beyond their blocks:
 * the embedding, the head and loss per micro-batch, and at the step's end
 * the embedding's and head's update and the gradient exchanges. */
static void update_profile(struct balancer *bal, const struct step_stats *st)
{
    int S = bal->stages, L = bal->layers;
    double busy[2] = {st->stage_compute_ms[0], st->stage_compute_ms[S - 1]};
    double update[2] = {st->stage_update_ms[0], st->stage_update_ms[S - 1]};
    struct balance_extra embed, head;
    balance_end_stage_extras(st->layer_fwd_ms, st->layer_bwd_ms, st->layer_update_ms,
                             st->layout, S, bal->micro_batches, busy, update, &embed, &head);
    struct balance_extra *emas[2] = {&bal->embed_ema, &bal->head_ema}, *now[2] = {&embed, &head};
    for (int k = 0; k < 2; k++) {
        emas[k]->fwd_ms = ema(emas[k]->fwd_ms, now[k]->fwd_ms, bal->have_ema);
        emas[k]->bwd_ms = ema(emas[k]->bwd_ms, now[k]->bwd_ms, bal->have_ema);
        emas[k]->update_ms = ema(emas[k]->update_ms, now[k]->update_ms, bal->have_ema);
    }
    for (int l = 0; l < L; l++) {
        bal->fwd_ema[l] = ema(bal->fwd_ema[l], st->layer_fwd_ms[l], bal->have_ema);
        bal->bwd_ema[l] = ema(bal->bwd_ema[l], st->layer_bwd_ms[l], bal->have_ema);
        bal->update_ema[l] = ema(bal->update_ema[l], st->layer_update_ms[l], bal->have_ema);
        bal->mem_bytes[l] = (int64_t)st->layer_mem_bytes[l];
        /* Parameters that still compute: a pruned block's nonzeros. */
        bal->params[l] = (double)bal->block_params -
                         st->layer_sparsity[l] * (double)bal->block_matrix_weights;
    }
    bal->have_ema = 1;
    if (st->migrated_blocks > 0 && st->migrated_bytes > 0) {
        int slot = bal->migrations++ % MIGRATIONS_KEPT;
        bal->migrated_bytes[slot] = st->migrated_bytes;
        bal->migrated_ms[slot] = st->migrate_ms;
    }
}

/* The predicted cost of migrating `bytes`, from the kept migrations. */
static double migration_ms(const struct balancer *bal, double bytes)
{
    int n = bal->migrations < MIGRATIONS_KEPT ? bal->migrations : MIGRATIONS_KEPT;
    return balance_migration_cost_ms(bal->migrated_bytes, bal->migrated_ms, n, bytes);
}

static void log_pending(struct balancer *bal, struct runlog *log, const struct step_stats *st)
{
    if (!bal->pending) return;
    bal->pending_row[6] = (float)st->step_ms;   /* measured after the decision */
    runlog_append_row(log, RUNLOG_BALANCE_DECISIONS, bal->pending_row, 8);
    bal->pending = 0;
}

static void fill_profile(struct balancer *bal, struct balance_profile *profile)
{
    struct balance_profile p = {
        .blocks = bal->layers, .fwd_ms = bal->fwd_ema, .bwd_ms = bal->bwd_ema,
        .params = bal->params, .mem_bytes = bal->mem_bytes,
        .embed = bal->embed_ema, .head = bal->head_ema,
        .sharing = bal->sharing.groups ? &bal->sharing : NULL,
        .update_ms = bal->update_ema,
    };
    *profile = p;
}

/* Rank 0: decides the layout for the next interval into bal->proposal. */
static void decide(struct balancer *bal, struct runlog *log, const struct step_stats *st,
                   int step)
{
    int S = bal->stages;
    memcpy(bal->current, st->layout, (size_t)S * sizeof(int));
    memcpy(bal->proposal, st->layout, (size_t)S * sizeof(int));
    if (bal->method == METHOD_RANDOM) {
        random_layout(bal->proposal, S, bal->layers, bal->seed, step);
        return;
    }
    struct balance_profile profile;
    fill_profile(bal, &profile);
    struct balance_options options = {.mem_cap = 0, .gamma = 0.0, .max_rounds = 0,
                                      .micro_batches = bal->micro_batches,
                                      .schedule = bal->schedule};
    struct balance_result res;
    char err[256];
    if (balance_propose(bal->method, &profile, S, bal->current, &options, bal->proposal, &res,
                        err, sizeof err) != BALANCE_OK) {
        dm_warn("balance: step %d: %s; keeping the layout\n", step + 1, err);
        memcpy(bal->proposal, bal->current, (size_t)S * sizeof(int));
        return;
    }
    struct balance_prediction now, next;
    if (balance_predict(&profile, S, bal->current, bal->micro_batches, bal->schedule, &now, err,
                        sizeof err) != BALANCE_OK ||
        balance_predict(&profile, S, bal->proposal, bal->micro_batches, bal->schedule, &next,
                        err, sizeof err) != BALANCE_OK) {
        dm_warn("balance: step %d: cannot predict: %s; keeping the layout\n", step + 1, err);
        memcpy(bal->proposal, bal->current, (size_t)S * sizeof(int));
        return;
    }
    double saving_ms = (now.step_ms - next.step_ms) * bal->every;
    double migrate_ms = migration_ms(bal, (double)res.bytes_moved);
    int changed = memcmp(bal->proposal, bal->current, (size_t)S * sizeof(int)) != 0;
    int pays = saving_ms > 0 && saving_ms >= bal->min_gain * migrate_ms;
    int enough = next.step_ms <= (1.0 - bal->min_improvement) * now.step_ms;
    int apply = changed && pays && enough;
    char from[256], to[256];
    layout_format(from, sizeof from, bal->current, S);
    layout_format(to, sizeof to, bal->proposal, S);
    if (changed)
        dm_log("balance: step %d: %s proposes %s (predicted %.1f ms/step) over %s (%.1f "
               "ms/step); saving %.0f ms over %d steps vs migration ~%.0f ms: %s\n",
               step + 1, balance_method_name(bal->method), to, next.step_ms, from, now.step_ms,
               saving_ms, bal->every, migrate_ms,
               apply ? "migrating" : !enough ? "skipped (under balance.min_improvement)"
                                             : "skipped");
    float row[8] = {(float)(step + 1), (float)now.step_ms, (float)next.step_ms,
                    (float)st->step_ms, (float)apply, (float)res.blocks_moved, NAN,
                    (float)res.bytes_moved};
    memcpy(bal->pending_row, row, sizeof row);
    bal->pending = 1;
    (void)log;
    if (!apply) memcpy(bal->proposal, bal->current, (size_t)S * sizeof(int));
}

int balancer_repack_plan(struct balancer *bal, const struct step_stats *stats,
                         double epsilon, int min_stages, int *counts)
{
    int S = bal->stages;
    if (!bal->have_ema || bal->method == METHOD_NONE) update_profile(bal, stats);
    struct balance_profile profile;
    fill_profile(bal, &profile);
    /* The sharing describes these S stages; a candidate on fewer stages
     * would run on other ranks' processors, so both sides of the
     * comparison get a processor per stage. */
    profile.sharing = NULL;
    struct balance_result res;
    char err[256];
    memcpy(counts, stats->layout, (size_t)S * sizeof(int));
    if (balance_repack(&profile, stats->layout, S, 0, bal->micro_batches, bal->schedule, epsilon,
                       counts, &res, err, sizeof err) != BALANCE_OK) {
        dm_warn("repack: %s; staying on %d stages\n", err, S);
        return S;
    }
    if (res.stages >= min_stages || min_stages >= S) return res.stages >= min_stages ? res.stages : S;
    double *cost = dm_alloc((size_t)bal->layers * sizeof(double));
    struct balance_costs costs;
    balance_costs_from_profile(&costs, &profile, BALANCE_COST_TIME, cost);
    int stages = S;
    if (balance_partition(&costs, min_stages, 0, NULL, 0, counts, &res, err, sizeof err) ==
        BALANCE_OK)
        stages = min_stages;
    dm_free(cost);
    return stages;
}

void balancer_after_step(struct balancer *bal, struct engine *eng, struct runlog *log,
                         const struct step_stats *stats, int step)
{
    if (bal->method == METHOD_NONE) return;
    if (dm_rank() == 0) {
        log_pending(bal, log, stats);
        update_profile(bal, stats);
    }
    if ((step + 1) % bal->every != 0) return;
    if (dm_rank() == 0) decide(bal, log, stats, step);
    engine_relayout(eng, bal->proposal);
}
