/* The trainer's side of balancing (train.h): it feeds every measured step
 * to src/balance's controller, logs the decisions, and has the engine
 * switch layouts, every rank at the same step boundary; and it finds out,
 * once at start-up, how the stages share processors.
 *
 * The decisions themselves are the controller's (pure code); this file
 * only carries numbers between the engine, the controller and the run log. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/pipe.h"
#include "dynmo/world.h"
#include "tools/train/train.h"

struct train_balancer {
    struct balance_controller *ctl;
    int stages;
    /* Under interleaved the controller balances the V = S v virtual
     * stages (the chunks); V = S otherwise. */
    int vstages;
    int micro_batches;
    int *next;                      /* (vstages) the layout to run next */
    double *vcompute, *vupdate;     /* (vstages) the chunks' observed figures (observe_chunks) */
    int *group;                     /* (stages) sharing group of each stage */
    double *cores;                  /* (stages) processors of each group */
    double *shares;                 /* (stages) each group's share of its CPUs, other
                                     * replicas' ranks counted (share_processors) */
    struct balance_sharing sharing;
};

struct train_balancer *train_balancer_create(const struct dm_config *cfg, int stages)
{
    /* Units differ in size with the schemes' extensions and as halves. */
    double *matrix = NULL, *sizes = train_unit_params(cfg, &matrix);
    int vstages = stages * cfg->virtual_stages;
    struct balance_controller_config c = {
        .method = cfg->method, .cost = cfg->cost, .stages = vstages,
        .blocks = train_unit_count(cfg),
        .every = cfg->every, .micro_batches = cfg->micro_batches,
        .schedule = config_schedule(cfg), .virtual_stages = cfg->virtual_stages,
        .seed = cfg->seed, .min_gain = cfg->min_gain,
        .min_improvement = cfg->min_improvement,
        .block_params = (double)block_param_count(cfg->channels),
        .block_matrix_weights = (double)block_matrix_weights(cfg->channels),
        .block_param_counts = sizes, .unit_matrix_weights = matrix,
    };
    char err[768];
    struct balance_controller *ctl = balance_controller_create(&c, err, sizeof err);
    dm_free(sizes);
    dm_free(matrix);
    if (!ctl) dm_user_error("%s", err);
    struct train_balancer *tb = dm_alloc(sizeof *tb);
    tb->ctl = ctl;
    tb->stages = stages;
    tb->vstages = vstages;
    tb->micro_batches = cfg->micro_batches;
    tb->next = dm_alloc((size_t)(vstages + 1) * sizeof(int));
    tb->vcompute = dm_alloc((size_t)vstages * sizeof(double));
    tb->vupdate = dm_alloc((size_t)vstages * sizeof(double));
    tb->group = dm_alloc((size_t)stages * sizeof(int));
    double **const per_stage[] = {&tb->cores, &tb->shares};
    dm_carve_doubles(per_stage, sizeof per_stage / sizeof per_stage[0], (size_t)stages);
    return tb;
}

void train_balancer_destroy(struct train_balancer *tb)
{
    balance_controller_destroy(tb->ctl);
    dm_free(tb->next);
    dm_free(tb->vcompute);
    dm_free(tb->vupdate);
    dm_free(tb->group);
    dm_free(tb->cores);   /* and shares, carved from it */
    dm_free(tb);
}

static void observation_of(struct balance_observation *obs, const struct step_stats *st)
{
    struct balance_observation o = {
        .fwd_ms = st->unit_fwd_ms, .bwd_ms = st->unit_bwd_ms,
        .wgrad_ms = st->unit_wgrad_ms,   /* zeros but under zb, which alone reads it */
        .update_ms = st->unit_update_ms, .mem_bytes = st->unit_mem_bytes,
        .sparsity = st->unit_sparsity, .stage_compute_ms = st->stage_compute_ms,
        .stage_update_ms = st->stage_update_ms, .layout = st->layout, .step_ms = st->step_ms,
        .migrated_blocks = st->migrated_blocks, .migrated_bytes = st->migrated_bytes,
        .migrate_ms = st->migrate_ms,
    };
    *obs = o;
}

/* Rank 0, under interleaved: the observation over the virtual stages.
 * The layout is the chunks'; the controller takes the embedding's and
 * the head's extra time from the first and last virtual stage's compute
 * and update time beyond their blocks, so those are their stage's less
 * its other chunks' blocks (the middle ones it does not read). */
static void observe_chunks(struct train_balancer *tb, struct balance_observation *obs,
                           const struct engine *eng)
{
    const int *chunks = engine_chunk_layout(eng);
    balance_chunk_stage_times(obs->fwd_ms, obs->bwd_ms, obs->update_ms, chunks, tb->stages,
                              tb->vstages / tb->stages, tb->micro_batches,
                              obs->stage_compute_ms, obs->stage_update_ms, tb->vcompute,
                              tb->vupdate);
    obs->layout = chunks;
    obs->stage_compute_ms = tb->vcompute;
    obs->stage_update_ms = tb->vupdate;
}

/* Rank 0: the decision of step `step`, with its log line; the layout to
 * run next into tb->next. */
static void decide(struct train_balancer *tb, const struct balance_observation *obs, int step)
{
    struct balance_decision d;
    char err[512];
    int S = tb->vstages;
    int *proposal = tb->next;
    if (balance_controller_decide(tb->ctl, obs, step, proposal, &d, err, sizeof err) !=
        BALANCE_OK)
        dm_warn("balance: step %d: %s\n", step + 1, err);
    if (d.changed && d.method && strcmp(d.method, "random")) {
        char from[256], to[256];
        layout_format(from, sizeof from, obs->layout, S);
        layout_format(to, sizeof to, proposal, S);
        dm_log("balance: step %d: %s proposes %s (predicted %.1f ms/step) over %s (%.1f "
               "ms/step); saving %.0f ms over %d steps vs migration ~%.0f ms: %s\n",
               step + 1, d.method, to, d.next_ms, from, d.now_ms, d.saving_ms, d.every,
               d.migrate_ms,
               d.apply ? "migrating" : !d.enough ? "skipped (under balance.min_improvement)"
                                                 : "skipped");
    }
    if (!d.apply) memcpy(tb->next, obs->layout, (size_t)S * sizeof(int));
}

/* When stages time-share processors (more ranks than CPUs), profiles
 * measure CPU time, so a block costs what it computes and not how long it
 * waited for a CPU, the ranks take turns computing (parallel.turns), and
 * the balancer predicts with the sharing. Collective. Returns the number of
 * groups (0: a processor per stage); *turns says whether they take turns. */
static int share_processors(const struct dm_config *cfg, int stages, int threads, int *group,
                            double *cores, double *shares, int *turns)
{
    *turns = 0;
    *shares = -1;   /* none */
    int groups = world_stage_sharing(stages, group, cores);
    if (!groups) return 0;
    /* A thread's CPU time is the rank's only when it computes alone. */
    char unused[8];
    if (world_agree(threads > 1, "", MPI_COMM_WORLD, unused, sizeof unused)) {
        dm_log("processors: stages share them, but some rank runs %d threads: profiling "
               "wall time with a processor per stage\n", threads);
        return 0;
    }
    dm_profile_cpu_time(1);
    if (cfg->turns && world_take_turns()) {
        /* unbound ranks have pinned themselves: the groups are now per CPU */
        groups = world_stage_sharing(stages, group, cores);
        /* the predictor's turns need whole cores: a group's share of its
         * CPU when other replicas run there too (kept for the run log) */
        int rounded = 0;
        for (int g = 0; g < groups; g++) {
            shares[g] = cores[g];
            cores[g] = fmax(1.0, round(cores[g]));
            rounded |= shares[g] < cores[g];
        }
        if (!rounded) shares[0] = -1;
        *turns = 1;
        if (!groups) return 0;   /* pinned, replica 0's stages share no CPU */
    }
    char text[512] = "";
    size_t used = 0;
    for (int s = 0; s < stages && used < sizeof text; s++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%d", s ? "," : "", group[s]);
    for (int g = 0; g < groups && used < sizeof text; g++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%.3g", g ? "," : " with ",
                                 cores[g]);
    dm_log("processors: stages share them (groups %s cores); profiling CPU time, waits "
           "sleep%s\n", text, *turns ? ", ranks take turns computing" : "");
    return groups;
}

void train_balancer_share_processors(struct train_balancer *tb, const struct dm_config *cfg,
                                     int threads, struct runlog *log)
{
    int turns = 0, S = tb->stages;
    int groups = share_processors(cfg, S, threads, tb->group, tb->cores, tb->shares, &turns);
    int replicas = groups && tb->shares[0] >= 0;
    /* Other replicas' ranks taking turns on the same CPUs slow every stage
     * alike; the predictor takes them as processor sharing at each group's
     * share (as dynmo simulate does, within 5% of the measured steps), so
     * that its predicted steps and savings are on the measured scale. */
    struct balance_sharing sharing = {.stages = S, .groups = groups, .group = tb->group,
                                      .cores = replicas ? tb->shares : tb->cores,
                                      .turns = replicas ? 0 : turns};
    tb->sharing = sharing;
    balance_controller_set_sharing(tb->ctl, groups ? &tb->sharing : NULL);
    if (replicas)
        dm_log("processors: the balancer predicts with the replicas' shares of the CPUs "
               "(%.3g of a CPU per stage of group 0)\n", tb->shares[0]);
    if (log)
        runlog_set_sharing(log, S, tb->group, groups, tb->cores, replicas ? tb->shares : NULL,
                           turns);
}

void train_balancer_after_step(struct train_balancer *tb, struct engine *eng,
                               struct runlog *log, const struct step_stats *st, int step)
{
    if (!balance_controller_active(tb->ctl)) return;
    struct balance_observation obs;
    if (dm_rank() == 0) {
        observation_of(&obs, st);
        if (tb->vstages > tb->stages) observe_chunks(tb, &obs, eng);
        float row[BALANCE_DECISION_COLUMNS];
        if (balance_controller_observe(tb->ctl, &obs, row))
            runlog_append_row(log, RUNLOG_BALANCE_DECISIONS, row, BALANCE_DECISION_COLUMNS);
    }
    if (!balance_controller_is_decision_step(tb->ctl, step)) return;
    if (dm_rank() == 0) decide(tb, &obs, step);
    engine_relayout(eng, tb->next);
}

int train_balancer_repack(struct train_balancer *tb, const struct step_stats *st, double epsilon,
                          int min_stages, int *counts)
{
    struct balance_observation obs;
    observation_of(&obs, st);
    char err[512];
    int stages = balance_controller_repack(tb->ctl, &obs, epsilon, min_stages, counts, err,
                                           sizeof err);
    if (err[0]) dm_warn("repack: %s; staying on %d stages\n", err, tb->stages);
    return stages;
}
