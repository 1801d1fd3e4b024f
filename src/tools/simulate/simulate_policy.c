/* One policy of `dynmo simulate`, step by step: each step's block costs
 * from the fitted model at the trajectory's state, the step time of the
 * policy's layout from the predictor (balance_predict_shared over the
 * lists of schedule_stage, as in training, plus the activation transfers
 * of the transfer line), and, for the balancers, the balancing controller
 * of src/balance fed the simulated step as `dynmo train` feeds it a
 * measured one, migrations charged by the transfer line; re-packing asks
 * the controller's re-pack planner and restarts on fewer stages.
 *
 * Must not: choose a layout or simulate a schedule itself (src/balance
 * does both), write files, or depend on anything but its arguments. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/model.h"
#include "tools/simulate/simulate.h"

/* The blocks' costs and what the balancer reads at one step. */
struct step_costs {
    double *fwd, *bwd, *update, *params, *sparsity, *mem;  /* (blocks) */
    double *exchange;      /* (blocks) an expert all-to-all round's ms, 0 without one */
    int64_t *mem_bytes;
    struct balance_extra embed, head;                      /* time fields */
};

static void costs_alloc(struct step_costs *c, int n)
{
    double **const arrays[] = {&c->fwd, &c->bwd, &c->update, &c->params, &c->sparsity, &c->mem,
                               &c->exchange};
    dm_carve_doubles(arrays, sizeof arrays / sizeof arrays[0], (size_t)n);
    c->mem_bytes = dm_alloc((size_t)n * sizeof(int64_t));
}

static void costs_free(struct step_costs *c)
{
    dm_free(c->fwd);   /* and the other doubles carved from it (costs_alloc) */
    dm_free(c->mem_bytes);
}

/* Milliseconds to move `bytes` once (the transfer line). */
static double transfer_ms(const struct sim_setup *setup, double bytes)
{
    return bytes > 0 ? setup->latency_ms + bytes / setup->bytes_per_ms : 0.0;
}

/* One expert all-to-all round of a block with experts split over ep > 1
 * ranks (load g > 0; the MLP unit under the what-if): its fixed cost and
 * the rows the busiest rank receives through the transfer line. The
 * block profiles leave these waits out, in training as here. */
static double exchange_round_ms(const struct sim_setup *setup, double load, int unit)
{
    if (setup->ep <= 1 || !(load > 0) || (setup->split && unit % 2 == 0)) return 0.0;
    return setup->exchange_ms + load * setup->exchange_bytes / setup->bytes_per_ms;
}

/* The units' costs at step t through the cost model: a block's state, its
 * time scaled by the unit's share of the block under the sub-block
 * what-if (attention, then MLP). */
static void step_costs_at(struct step_costs *c, const struct sim_setup *setup, int t)
{
    const struct sim_trajectory *tr = setup->traj;
    float state[SIM_STATES_MAX];
    int busiest = sim_state_of_role(DYN_COST_BUSIEST_RANK);
    int sparsity = sim_state_of_role(DYN_COST_SPARSITY);
    double matrices = (double)block_matrix_weights(setup->cfg.channels);
    /* a sublayer run's units are priced by their own fits (measured apart) */
    int measured_units = setup->split && setup->model->unit_fitted && !setup->model->hardware;
    for (int u = 0; u < setup->blocks; u++) {
        int b = setup->split ? u / 2 : u;
        double share = !setup->split ? 1.0 : u % 2 ? 1.0 - setup->attention_share
                                                   : setup->attention_share;
        double matrix_share = !setup->split ? 1.0 : u % 2 ? 2.0 / 3.0 : 1.0 / 3.0;
        double time_share = measured_units ? 1.0 : share;
        double update_share = measured_units ? 1.0 : matrix_share;
        for (int k = 0; k < sim_state_count(); k++)
            state[k] = tr->value[k][(long)t * tr->blocks + b];
        if (measured_units)
            sim_model_unit(setup->model, u % 2, state, setup->csr_sparsity, &c->fwd[u],
                           &c->bwd[u], &c->update[u]);
        else
            sim_model_block_at(setup->model, b, state, setup->csr_sparsity, &c->fwd[u],
                               &c->bwd[u], &c->update[u]);
        if (setup->measured) {   /* the run's own costs of the step (its shape) */
            const struct sim_run *run = setup->measured;
            int units = run->unit_fwd ? 2 * run->layers : run->layers;
            long i = (long)t * units + u;
            c->fwd[u] = run->unit_fwd ? run->unit_fwd[i] : run->fwd[i];
            c->bwd[u] = run->unit_fwd ? run->unit_bwd[i] : run->bwd[i];
            c->update[u] = run->unit_fwd ? run->unit_update[i] : run->update ? run->update[i]
                                                                            : 0.0;
        }
        c->fwd[u] *= time_share;
        c->bwd[u] *= time_share;
        c->exchange[u] = exchange_round_ms(setup, busiest >= 0 ? state[busiest] : 0.0f, u);
        c->update[u] *= update_share;
        /* The controller takes a unit's nonzeros as its parameters less
         * sparsity x a block's matrices: a unit holds its share of them. */
        c->sparsity[u] = (sparsity >= 0 ? state[sparsity] : 0.0f) * matrix_share;
        c->params[u] = setup->block_params[u] - c->sparsity[u] * matrices;
        c->mem_bytes[u] = (int64_t)(16.0 * setup->block_params[u]);
        c->mem[u] = (double)c->mem_bytes[u];
    }
    c->embed = setup->measured ? setup->measured->embed[t] : setup->model->embed;
    c->head = setup->measured ? setup->measured->head[t] : setup->model->head;
}

static struct balance_profile profile_of(const struct step_costs *c,
                                         const struct sim_setup *setup,
                                         const struct balance_sharing *sharing)
{
    struct balance_profile p = {
        .blocks = setup->blocks, .fwd_ms = c->fwd, .bwd_ms = c->bwd, .params = c->params,
        .mem_bytes = c->mem_bytes, .embed = c->embed, .head = c->head,
        .sharing = sharing, .update_ms = c->update,
    };
    return p;
}

/* The stage times of `counts` (the stage cost definition of balance.h,
 * extras included): busy compute per stage, and the predicted step. The
 * activation transfers ride on the receiving stage's instructions, the
 * expert exchanges on the stage's (SIM_EXCHANGE_FWD rounds forward, _BWD
 * backward), the replicas' gradient sums on each stage's update. */
static int predict_step(const struct step_costs *c, const struct sim_setup *setup,
                        const int *counts, int stages, const struct balance_sharing *sharing,
                        struct sim_step *out, float *busy, float *stage_update, char *err,
                        size_t errsize)
{
    double *f = dm_alloc(5 * (size_t)stages * sizeof(double));   /* stages: user input */
    double *b = f + stages, *u = b + stages, *cf = u + stages, *cb = cf + stages;
    double *cost_arrays[3] = {c->fwd, c->bwd, c->update};
    double *stage_arrays[3] = {f, b, u};
    const struct balance_extra *e = &c->embed, *h = &c->head;
    double firsts[3] = {e->fwd_ms, e->bwd_ms, e->update_ms}, lasts[3] = {h->fwd_ms, h->bwd_ms,
                                                                         h->update_ms};
    for (int k = 0; k < 3; k++) {
        struct balance_costs costs = {.blocks = setup->blocks, .cost = cost_arrays[k],
                                      .mem_bytes = c->mem_bytes, .first_cost = firsts[k],
                                      .last_cost = lasts[k]};
        for (int s = 0, begin = 0; s < stages; begin += counts[s++])
            stage_arrays[k][s] = balance_stage_cost(&costs, stages, s, begin, begin + counts[s]);
    }
    double act = transfer_ms(setup, setup->activation_bytes), D = setup->replicas;
    double lo = INFINITY, hi = 0, sum = 0;
    for (int s = 0, begin = 0; s < stages; begin += counts[s++]) {
        double grad_bytes = 0;
        for (int j = begin; j < begin + counts[s]; j++) {
            grad_bytes += c->update[j] > 0 ? 4.0 * setup->block_params[j] : 0.0;
            f[s] += SIM_EXCHANGE_FWD * c->exchange[j];
            b[s] += SIM_EXCHANGE_BWD * c->exchange[j];
        }
        if (D > 1 && setup->gradient_link)   /* an all-reduce line at its bus bandwidth */
            u[s] += grad_bytes > 0 ? setup->gradient_link->latency_us / 1e3 +
                        2 * (D - 1) / D * grad_bytes / (setup->gradient_link->bandwidth_gbs * 1e6)
                                   : 0.0;
        else if (D > 1)
            u[s] += 2 * (D - 1) / D * transfer_ms(setup, grad_bytes);
        busy[s] = (float)(setup->micro_batches * (f[s] + b[s]) + u[s]);
        stage_update[s] = (float)u[s];
        lo = fmin(lo, busy[s]);
        hi = fmax(hi, busy[s]);
        sum += busy[s];
        cf[s] = f[s] + (s > 0 ? act : 0.0);
        cb[s] = b[s] + (s < stages - 1 ? act : 0.0);
    }
    struct balance_prediction p = {0};
    int rc = balance_predict_shared(cf, cb, u, stages, setup->micro_batches, setup->schedule,
                                    sharing, &p, err, errsize);
    out->step_ms = p.step_ms;
    out->bubble = p.bubble_ratio;
    out->imbalance = sum > 0 ? (hi - lo) / (sum / stages) : 0.0;
    out->stages = stages;
    dm_free(f);
    return rc;
}

/* The world a policy runs on: its stages, layout and controller. */
struct world {
    int stages;
    int *layout;                          /* (first world's stages) */
    struct balance_controller *ctl;       /* NULL: static */
    const struct balance_sharing *sharing;
};

static struct balance_controller *controller_for(const struct sim_setup *setup,
                                                 const struct sim_policy *policy, int stages)
{
    const struct dm_config *cfg = &setup->cfg;
    struct balance_controller_config cc = {
        .method = policy->method, .cost = "time", .stages = stages, .blocks = setup->blocks,
        .every = setup->every, .micro_batches = setup->micro_batches,
        .schedule = setup->schedule, .seed = cfg->seed, .min_gain = cfg->min_gain,
        .min_improvement = cfg->min_improvement, .block_params = setup->block_params[0],
        .block_matrix_weights = (double)block_matrix_weights(cfg->channels),
        .block_param_counts = setup->block_params,
    };
    char err[512];
    struct balance_controller *ctl = balance_controller_create(&cc, err, sizeof err);
    if (!ctl) dm_user_error("simulate: policy %s: %s", policy->name, err);
    return ctl;
}

static void world_start(struct world *w, const struct sim_setup *setup,
                        const struct sim_policy *policy)
{
    char err[512];
    memset(w, 0, sizeof *w);
    w->stages = setup->stages;
    w->layout = dm_alloc((size_t)setup->stages * sizeof(int));
    w->sharing = setup->sharing;
    if (policy->kind == SIM_STATIC_PARAMS) {
        /* DeepSpeed's equal parameters over the units (balance.initial =
         * params, as train_initial_layout lays out whole blocks) */
        const struct dm_config *cfg = &setup->cfg;
        struct balance_costs params = {
            .blocks = setup->blocks, .cost = setup->block_params,
            .first_cost = (double)(cfg->vocab + cfg->max_seq) * cfg->channels,
            .last_cost = 2.0 * cfg->channels,
        };
        int64_t *mem = dm_alloc((size_t)setup->blocks * sizeof(int64_t));
        params.mem_bytes = mem;
        enum balance_units units = setup->split ? BALANCE_UNITS_SUBLAYER : BALANCE_UNITS_BLOCK;
        int blocks = setup->blocks / balance_units_per_block(units);
        if (balance_layout_from_spec("params", setup->stages, blocks, units, &params, w->layout,
                                     err, sizeof err) != BALANCE_OK)
            dm_user_error("simulate: static-params: %s", err);
        dm_free(mem);
    } else if (balance_static_uniform(setup->blocks, setup->stages, w->layout, err,
                                      sizeof err) != BALANCE_OK) {
        dm_user_error("simulate: %s", err);
    }
    if (policy->kind == SIM_BALANCED || policy->kind == SIM_REPACK) {
        w->ctl = controller_for(setup, policy, w->stages);
        balance_controller_set_sharing(w->ctl, w->sharing);
    }
}

/* The layout the run itself had at step t (SIM_REPLAY). */
static void replay_layout(struct world *w, const struct sim_setup *setup, int t)
{
    const int *row = setup->replay_layout + (long)t * setup->replay_width;
    w->stages = 0;
    while (w->stages < setup->replay_width && row[w->stages] > 0) {
        w->layout[w->stages] = row[w->stages];
        w->stages++;
    }
}

static void result_alloc(struct sim_result *res, const struct sim_setup *setup)
{
    size_t T = (size_t)setup->steps, n = (size_t)setup->blocks, S = (size_t)setup->stages;
    memset(res, 0, sizeof *res);
    res->steps = dm_alloc(T * sizeof *res->steps);
    res->layout = dm_alloc(T * S * sizeof(int));
    float **const per_block[] = {&res->fwd, &res->bwd, &res->update};
    float **const per_stage[] = {&res->busy, &res->idle, &res->stage_update};
    dm_carve_floats(per_block, sizeof per_block / sizeof per_block[0], T * n);
    dm_carve_floats(per_stage, sizeof per_stage / sizeof per_stage[0], T * S);
    res->decisions = dm_alloc((T / (size_t)setup->every + 2) * BALANCE_DECISION_COLUMNS *
                              sizeof(float));
}

void sim_result_free(struct sim_result *res)
{
    dm_free(res->steps);
    dm_free(res->layout);
    dm_free(res->fwd);    /* and bwd, update (result_alloc) */
    dm_free(res->busy);   /* and idle, stage_update */
    dm_free(res->decisions);
    memset(res, 0, sizeof *res);
}

/* Step t's rows of the result: its modelled block costs, layout and stage
 * times (stages of a smaller world past its last are NaN). */
static void record_step(struct sim_result *res, const struct sim_setup *setup,
                        const struct step_costs *c, const struct world *w, int t,
                        struct sim_step *st)
{
    long n = setup->blocks, S = setup->stages;
    for (long b = 0; b < n; b++) {
        res->fwd[t * n + b] = (float)c->fwd[b];
        res->bwd[t * n + b] = (float)c->bwd[b];
        res->update[t * n + b] = (float)c->update[b];
    }
    for (long s = 0; s < S; s++) {
        int here = s < w->stages;
        res->layout[t * S + s] = here ? w->layout[s] : 0;
        if (!here) res->busy[t * S + s] = res->stage_update[t * S + s] = NAN;
        res->idle[t * S + s] = here ? (float)(st->step_ms - res->busy[t * S + s]) : NAN;
    }
    res->steps[t] = *st;
    res->step_sum_ms += st->step_ms;
    res->total_ms += st->step_ms + st->migrate_ms;
    res->rank_ms += (st->step_ms + st->migrate_ms) * w->stages * setup->replicas;
}

/* The controller's view of step t (as train_balance.c builds it from the
 * measured step). stage arrays: (2, stages) scratch. */
static void observe(struct balance_observation *obs, const struct step_costs *c,
                    const struct sim_result *res, const struct world *w,
                    const struct sim_setup *setup, int t, double *stage)
{
    for (int s = 0; s < w->stages; s++) {
        stage[s] = res->busy[(long)t * setup->stages + s];
        stage[w->stages + s] = res->stage_update[(long)t * setup->stages + s];
    }
    const struct sim_step *st = &res->steps[t];
    struct balance_observation o = {
        .fwd_ms = c->fwd, .bwd_ms = c->bwd, .update_ms = c->update, .mem_bytes = c->mem,
        .sparsity = c->sparsity, .stage_compute_ms = stage,
        .stage_update_ms = stage + w->stages, .layout = w->layout, .step_ms = st->step_ms,
        .migrated_blocks = st->migrated_blocks, .migrated_bytes = st->migrated_bytes,
        .migrate_ms = st->migrate_ms,
    };
    *obs = o;
}

/* A balancing decision after step t: the layout changes when the
 * controller applies its proposal; the migration is charged to the next
 * step (*next). */
static void decide(struct sim_result *res, struct world *w, const struct sim_setup *setup,
                   const struct sim_policy *policy, const struct balance_observation *obs,
                   const struct step_costs *c, int t, struct sim_step *next)
{
    float row[BALANCE_DECISION_COLUMNS];
    if (balance_controller_observe(w->ctl, obs, row))
        memcpy(res->decisions + (long)res->decision_count++ * BALANCE_DECISION_COLUMNS, row,
               sizeof row);
    int *proposal = dm_alloc((size_t)w->stages * sizeof(int));
    struct balance_decision d;
    char err[512];
    if (balance_controller_decide(w->ctl, obs, t, proposal, &d, err, sizeof err) != BALANCE_OK)
        dm_user_error("simulate: policy %s, step %d: %s", policy->name, t + 1, err);
    if (!d.apply) {
        dm_free(proposal);
        return;
    }
    struct balance_move *moves = dm_alloc((size_t)(setup->blocks + 1) * sizeof *moves);
    int count = 0;
    int64_t bytes = 0;
    if (balance_migration_plan(c->mem_bytes, setup->blocks, 0, w->layout, w->stages, proposal,
                               w->stages, moves, &count, &bytes, err, sizeof err) != BALANCE_OK)
        dm_user_error("simulate: policy %s, step %d: %s", policy->name, t + 1, err);
    dm_free(moves);
    memcpy(w->layout, proposal, (size_t)w->stages * sizeof(int));
    dm_free(proposal);
    next->migrated_blocks = count;
    next->migrated_bytes = (double)bytes;
    next->migrate_ms = setup->migration_ms + transfer_ms(setup, (double)bytes);
    res->migrations++;
}

/* Every repack_every steps but after the last (the job ends there: no
 * restart to charge): the controller's re-pack planner; when it finds
 * fewer stages, the job restarts on them (restart_ms charged) with a
 * controller for the new stage count and a processor per stage. */
static void try_repack(struct sim_result *res, struct world *w, const struct sim_setup *setup,
                       const struct sim_policy *policy, const struct balance_observation *obs,
                       int t)
{
    if ((t + 1) % setup->repack_every != 0 || t + 1 >= setup->steps || w->stages == 1) return;
    int *counts = dm_alloc((size_t)w->stages * sizeof(int));
    char err[512];
    int k = balance_controller_repack(w->ctl, obs, setup->repack_epsilon, 1, counts, err,
                                      sizeof err);
    if (k >= w->stages) {
        dm_free(counts);
        return;
    }
    res->rank_ms += setup->restart_ms * w->stages * setup->replicas;
    balance_controller_destroy(w->ctl);
    w->stages = k;
    memcpy(w->layout, counts, (size_t)k * sizeof(int));
    dm_free(counts);
    w->sharing = NULL;
    w->ctl = controller_for(setup, policy, k);
    if (!res->repack_step) res->repack_step = t + 2;   /* the first step on fewer ranks */
    res->repack_stages = k;
    res->restart_ms += setup->restart_ms;
    res->total_ms += setup->restart_ms;
}

void sim_policy_run(struct sim_result *res, const struct sim_setup *setup,
                    const struct sim_policy *policy)
{
    result_alloc(res, setup);
    struct step_costs c;
    costs_alloc(&c, setup->blocks);
    struct world w;
    world_start(&w, setup, policy);
    double *stage = dm_alloc(2 * (size_t)setup->stages * sizeof(double));
    struct sim_step next = {0};
    char err[512];
    for (int t = 0; t < setup->steps; t++) {
        step_costs_at(&c, setup, t);
        if (policy->kind == SIM_REPLAY) replay_layout(&w, setup, t);
        struct sim_step st = next;
        memset(&next, 0, sizeof next);
        long row = (long)t * setup->stages;
        if (predict_step(&c, setup, w.layout, w.stages, w.sharing, &st, res->busy + row,
                         res->stage_update + row, err, sizeof err) != BALANCE_OK)
            dm_user_error("simulate: policy %s, step %d: %s", policy->name, t + 1, err);
        record_step(res, setup, &c, &w, t, &st);
        if (!w.ctl) continue;
        struct balance_observation obs;
        observe(&obs, &c, res, &w, setup, t, stage);
        decide(res, &w, setup, policy, &obs, &c, t, &next);
        if (policy->kind == SIM_REPACK && !next.migrated_blocks)
            try_repack(res, &w, setup, policy, &obs, t);
    }
    balance_controller_destroy(w.ctl);
    dm_free(w.layout);
    dm_free(stage);
    costs_free(&c);
}

double sim_best_step_ms(const struct sim_setup *setup, int t, char *err, size_t errsize)
{
    struct step_costs c;
    costs_alloc(&c, setup->blocks);
    step_costs_at(&c, setup, t);
    struct balance_profile profile = profile_of(&c, setup, setup->sharing);
    struct balance_options options = {.micro_batches = setup->micro_batches,
                                      .schedule = setup->schedule};
    int *counts = dm_alloc((size_t)setup->stages * sizeof(int));
    float *busy = dm_alloc(2 * (size_t)setup->stages * sizeof(float)), *update = busy + setup->stages;
    struct balance_result res;
    struct sim_step st = {0};
    int rc = balance_propose(BALANCE_PARTITION_TIME, &profile, setup->stages, NULL, &options,
                             counts, &res, err, errsize);
    if (rc == BALANCE_OK)
        rc = predict_step(&c, setup, counts, setup->stages, setup->sharing, &st, busy, update,
                          err, errsize);
    costs_free(&c);
    dm_free(counts);
    dm_free(busy);
    return rc == BALANCE_OK ? st.step_ms : NAN;
}
