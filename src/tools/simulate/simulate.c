/* `dynmo simulate`: whole training runs at another scale from measured
 * costs (docs/simulate.md). It fits each block's forward, backward and
 * update time to its dynamic state from a run log, takes the trajectory
 * of the states from that run (mapped onto a deeper model by relative
 * depth) or from a scenario file, and runs every policy (static uniform,
 * static params, each balancer of src/balance at a cadence, re-packing)
 * step by step through the same controller, balancers and predictor that
 * `dynmo train` uses; then prints the summary table (throughput per
 * policy, speedup over the best static layout, bubble, rank-hours, the
 * layout bound) and writes one file per policy shaped like a run log.
 * --validate compares the simulation of the run's own policy, and of the
 * layouts it actually had, against its measured step times.
 *
 * This file is the command: the arguments, the setup of the simulated
 * run, the summary and the validation. Must not: decide layouts or
 * simulate schedules (src/balance), or write anything before every input
 * is checked; bad input is exit 2 with one message. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/tools.h"
#include "tools/args.h"
#include "tools/simulate/simulate.h"

#define SUMMARY_BYTES 16384

struct simulate_args {
    const char *run_dir, *scenario, *out, *policies;
    int blocks, stages, replicas, micro_batches, steps, every, repack_every;
    int schedule;                 /* -1: the run's */
    double latency_ms, bandwidth_gbs, migration_ms, restart_s, epsilon, attention_share;
    double exchange_ms;           /* < 0: by the sharing (make_setup) */
    int validate, split;
    /* the expert placement what-if: --ep (0: the run's), --placement
     * (NULL: none), --replicas-max (-1: none) */
    int ep, replicas_max;
    const char *placement;
    double load_run, load_placed; /* the mean busiest-rank load, the run's and placed */
    /* --hardware HW.ini --config F [section.key=value ...]: the config's
     * model priced on the hardware (simulate_hardware.c) */
    const char *hardware, *config;
    char **overrides;
    int override_count, latency_given, bandwidth_given;
};

/* One expert all-to-all round's fixed cost between ranks that take turns
 * on shared CPUs, on this machine (docs/simulate.md): a rank waiting for
 * the exchange sleeps in 0.5 ms polls (world_wait_round) while its
 * partner on the same CPU computes, and the CPU idles from the partner's
 * arrival to the sleeper's next poll. Fitted by bench/sim_exchange.sh to
 * a run the validation does not use (2026-12-01: 0.28 ms, which the
 * replicas' processor sharing stretches to 0.56 ms of a step, about one
 * poll). */
#define SHARED_EXCHANGE_MS 0.28

static void usage(FILE *out)
{
    char states[512] = "";   /* the schemes' declared states */
    for (int k = 0; k < sim_state_count(); k++)
        snprintf(states + strlen(states), sizeof states - strlen(states), "%s%s", k ? "," : "",
                 sim_state_name(k));
    fprintf(out,
        "usage: dynmo simulate --from-run RUN_DIR [options]\n"
        "       dynmo simulate --hardware HW.ini --config F [section.key=value ...]\n"
        "                      [--from-run RUN_DIR] [options]\n"
        "Simulates whole training runs from a run's measured costs, with every\n"
        "balancing policy, through the trainer's own balancers and predictor\n"
        "(docs/simulate.md).\n"
        "  --from-run RUN_DIR    the run log whose costs are fitted (and whose\n"
        "                        trajectory drives the simulation)\n"
        "  --scenario FILE.csv   the trajectory from a file instead: header\n"
        "                        step,block and any of the states\n"
        "                        (%s)\n"
        "  --blocks N            transformer blocks (default: the run's; the run's\n"
        "                        trajectory is mapped by relative depth)\n"
        "  --stages S            pipeline stages (default: the run's)\n"
        "  --replicas D          data-parallel replicas (default 1; with --validate\n"
        "                        the run's)\n"
        "  --micro-batches m     per step and replica (default: the run's at its\n"
        "                        stage count, else 4 x stages)\n"
        "  --schedule 1f1b|gpipe|zb (default: the run's)\n"
        "  --steps T             steps (default: the trajectory's; mapped by time)\n"
        "  --every K             steps between balancing decisions (default: the run's)\n"
        "  --policies P,...      static-uniform, static-params, partition-time,\n"
        "                        partition-params, diffusion-time, diffusion-params,\n"
        "                        repack (default: all)\n"
        "  --latency-ms L        transfer line: L + bytes / bandwidth (default 0.01)\n"
        "  --bandwidth-gbs B     (default 6, this machine's MPI send)\n"
        "  --migration-ms M      fixed cost of a migration beyond its bytes (default 12)\n"
        "  --exchange-ms X       fixed cost of an all-to-all round over the run's\n"
        "                        parallel.ep > 1 ranks (default: L; for the run's own\n"
        "                        shape when its ranks took turns on shared CPUs, this\n"
        "                        machine's 0.28)\n"
        "  --restart-s R         a re-pack's checkpoint and restart (default 1.5)\n"
        "  --repack-every N      steps between re-pack decisions (default: the run's\n"
        "                        repack.every)\n"
        "  --epsilon E           re-pack may slow the step by 1 + E (default: the run's)\n"
        "  --split-blocks        the sub-block what-if: attention and MLP of each block\n"
        "                        are separate units of placement (a run of\n"
        "                        balance.units = sublayer always is, priced by its\n"
        "                        measured units)\n"
        "  --attention-share A   attention's share of a block's time (default: from\n"
        "                        the model's FLOPs at its sequence length)\n"
        "  --ep N                expert-parallel ranks the run's per-expert counts\n"
        "                        are placed on (default: the run's parallel.ep)\n"
        "  --placement P         static or balanced (the trainer's placement planner;\n"
        "                        default: the run's)\n"
        "  --replicas-max R      with balanced, up to R copies of hot experts a block\n"
        "  --hardware HW.ini     price the config's model op by op on a hardware file\n"
        "                        (hardware/*.ini, `dynmo calibrate`) instead of a\n"
        "                        run's costs; with --from-run, that run's states\n"
        "  --config F            the model and run to price (with --hardware)\n"
        "  --validate            compare with the run's measured step times\n"
        "  --out DIR             write DIR/<policy>.h5 (kind \"simulation\") and\n"
        "                        DIR/summary.txt\n", states);
}

static long parse_long(const char *arg, const char *text, long min, long max)
{
    return tool_parse_long("simulate: ", arg, text, min, max);
}

static double parse_double(const char *arg, const char *text, double min)
{
    return tool_parse_double("simulate: ", arg, text, min);
}

/* The value of option argv[*i], which must have one. */
static const char *value_of(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) dm_user_error("simulate: %s needs a value", argv[*i]);
    return argv[++*i];
}

static void parse_args(struct simulate_args *a, int argc, char **argv)
{
    *a = (struct simulate_args){.schedule = -1, .latency_ms = 0.01, .bandwidth_gbs = 6.0,
                                .migration_ms = 12.0, .restart_s = 1.5, .epsilon = -1,
                                .attention_share = -1, .exchange_ms = -1,
                                .replicas_max = -1};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        tool_help(o, usage);
        if (!strcmp(o, "--validate")) { a->validate = 1; continue; }
        if (!strcmp(o, "--split-blocks")) { a->split = 1; continue; }
        if (o[0] != '-' && strchr(o, '=')) {   /* a config override */
            if (!a->overrides) a->overrides = dm_alloc((size_t)argc * sizeof(char *));
            a->overrides[a->override_count++] = argv[i];
            continue;
        }
        const char *v = value_of(argc, argv, &i);
        if (!strcmp(o, "--from-run")) a->run_dir = v;
        else if (!strcmp(o, "--hardware")) a->hardware = v;
        else if (!strcmp(o, "--config")) a->config = v;
        else if (!strcmp(o, "--scenario")) a->scenario = v;
        else if (!strcmp(o, "--out")) a->out = v;
        else if (!strcmp(o, "--policies")) a->policies = v;
        else if (!strcmp(o, "--blocks")) a->blocks = (int)parse_long(o, v, 1, 100000);
        else if (!strcmp(o, "--stages")) a->stages = (int)parse_long(o, v, 1, 4096);
        else if (!strcmp(o, "--replicas")) a->replicas = (int)parse_long(o, v, 1, 1000000);
        else if (!strcmp(o, "--micro-batches")) a->micro_batches = (int)parse_long(o, v, 1, 1 << 20);
        else if (!strcmp(o, "--steps")) a->steps = (int)parse_long(o, v, 1, 100000000);
        else if (!strcmp(o, "--every")) a->every = (int)parse_long(o, v, 1, 1000000000);
        else if (!strcmp(o, "--ep")) a->ep = (int)parse_long(o, v, 1, 4096);
        else if (!strcmp(o, "--replicas-max")) a->replicas_max = (int)parse_long(o, v, 0, 4096);
        else if (!strcmp(o, "--placement")) {
            if (strcmp(v, "static") && strcmp(v, "balanced"))
                dm_user_error("simulate: --placement: '%s' is not static or balanced", v);
            a->placement = v;
        }
        else if (!strcmp(o, "--repack-every")) a->repack_every = (int)parse_long(o, v, 1, 1000000000);
        else if (!strcmp(o, "--latency-ms")) {
            a->latency_ms = parse_double(o, v, 0);
            a->latency_given = 1;
        } else if (!strcmp(o, "--bandwidth-gbs")) {
            a->bandwidth_gbs = parse_double(o, v, 1e-9);
            a->bandwidth_given = 1;
        }
        else if (!strcmp(o, "--migration-ms")) a->migration_ms = parse_double(o, v, 0);
        else if (!strcmp(o, "--exchange-ms")) a->exchange_ms = parse_double(o, v, 0);
        else if (!strcmp(o, "--restart-s")) a->restart_s = parse_double(o, v, 0);
        else if (!strcmp(o, "--epsilon")) a->epsilon = parse_double(o, v, 0);
        else if (!strcmp(o, "--attention-share")) {
            a->attention_share = parse_double(o, v, 0);
            if (a->attention_share > 1)
                dm_user_error("simulate: --attention-share: '%s' is not a share in [0, 1]", v);
        }
        else if (!strcmp(o, "--schedule")) {
            if (strcmp(v, "1f1b") && strcmp(v, "gpipe") && strcmp(v, "zb"))
                dm_user_error("simulate: --schedule: '%s' is not 1f1b, gpipe or zb", v);
            a->schedule = !strcmp(v, "gpipe") ? DM_SCHEDULE_GPIPE
                        : !strcmp(v, "zb") ? DM_SCHEDULE_ZB : DM_SCHEDULE_1F1B;
        } else {
            usage(stderr);
            dm_user_error("simulate: unknown option '%s'", o);
        }
    }
    if (a->hardware && a->validate)
        dm_user_error("simulate: --hardware with --validate: the validation compares a run's "
                      "own costs with its step times; leave out one of them");
    if (a->hardware && !a->config)
        dm_user_error("simulate: --hardware needs --config F, the model to price");
    if (!a->hardware && (a->config || a->override_count))
        dm_user_error("simulate: --config and section.key=value overrides go with --hardware "
                      "HW.ini (without it the model is the run's)");
    if (a->hardware && a->scenario)
        dm_user_error("simulate: --hardware takes its states from the config or --from-run, "
                      "not --scenario");
    if (a->hardware && (a->ep || a->placement || a->replicas_max >= 0))
        dm_user_error("simulate: --hardware places experts as its config says: give "
                      "parallel.ep, moe.placement and moe.replicas_max instead of --ep, "
                      "--placement and --replicas-max");
    if (a->hardware && a->blocks)
        dm_user_error("simulate: --hardware: the depth is the config's model.layers (give "
                      "model.layers=N), not --blocks");
    if (!a->run_dir && !a->hardware) {
        usage(stderr);
        dm_user_error("simulate: --from-run RUN_DIR is required (the costs come from a run)");
    }
}

/* ---- policies ---------------------------------------------------------- */

static const struct sim_policy all_policies[] = {
    {"static-uniform", SIM_STATIC_UNIFORM, NULL},
    {"static-params", SIM_STATIC_PARAMS, NULL},
    {"partition-time", SIM_BALANCED, "partition-time"},
    {"partition-params", SIM_BALANCED, "partition-params"},
    {"diffusion-time", SIM_BALANCED, "diffusion-time"},
    {"diffusion-params", SIM_BALANCED, "diffusion-params"},
    {"repack", SIM_REPACK, "partition-time"},
};
#define POLICY_COUNT (int)(sizeof all_policies / sizeof all_policies[0])

/* The policies --policies names (all by default), in the table's order. */
static int choose_policies(const char *list, struct sim_policy *out)
{
    int chosen[POLICY_COUNT] = {0}, count = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list ? list : "all");
    for (char *name = strtok(buf, ","); name; name = strtok(NULL, ",")) {
        int all = !strcmp(name, "all"), found = all;
        for (int p = 0; p < POLICY_COUNT; p++)
            if (all || !strcmp(name, all_policies[p].name)) chosen[p] = found = 1;
        if (!found)
            dm_user_error("simulate: --policies: '%s' is not a policy (static-uniform, "
                          "static-params, partition-time, partition-params, diffusion-time, "
                          "diffusion-params, repack, all)", name);
    }
    for (int p = 0; p < POLICY_COUNT; p++)
        if (chosen[p]) out[count++] = all_policies[p];
    if (count == 0)
        dm_user_error("simulate: --policies '%s' names no policy (static-uniform, static-params, "
                      "partition-time, partition-params, diffusion-time, diffusion-params, "
                      "repack, all)", list);
    return count;
}

/* ---- the simulated run ----------------------------------------------- */

/* The trajectory: the scenario's, or the run's mapped onto the simulated
 * depth and steps. A scenario state the run cannot price is a user error. */
static void make_trajectory(struct sim_trajectory *traj, const struct simulate_args *a,
                            const struct sim_run *run, const struct sim_model *model)
{
    if (!a->scenario) {
        int blocks = a->blocks ? a->blocks : run->layers, steps = a->steps ? a->steps : run->steps;
        sim_check_size(steps, (long)blocks * (a->split ? 2 : 1));
        sim_trajectory_map(traj, &run->state, &run->cfg, blocks, steps);
        return;
    }
    sim_scenario_read(traj, a->scenario, a->steps);
    sim_check_size(traj->steps, (long)traj->blocks * (a->split ? 2 : 1));
    if (a->blocks && a->blocks != traj->blocks)
        dm_user_error("simulate: --blocks %d, but the scenario %s lists %d blocks", a->blocks,
                      a->scenario, traj->blocks);
    for (int k = 0; k < sim_state_count(); k++) {
        if (!traj->present[k] || sim_state_role(k) == DYN_COST_FROZEN || model->uses[k])
            continue;
        for (long i = 0; i < (long)traj->steps * traj->blocks; i++)
            if (traj->value[k][i] != sim_state_neutral(k))
                dm_user_error("simulate: the scenario %s sets %s, but %s has no %s that varies "
                              "to fit its cost to", a->scenario, sim_state_name(k), run->path,
                              sim_state_name(k));
    }
}

/* The run's processor sharing at its own shape (of all its replicas when
 * their ranks took turns on the same CPUs, else of its one replica's
 * stages) and the expert exchange rounds of its parallel.ep. */
static void setup_sharing(struct sim_setup *s, const struct simulate_args *a,
                          const struct sim_run *run, int per_micro_batch)
{
    const struct dm_config *rc = &run->cfg;
    if (s->stages == run->stages && (!s->split || run->units_per_block == 2) &&
        s->replicas == rc->dp && run->shares)
        s->sharing = &run->replica_sharing;
    else if (s->stages == run->stages && s->replicas == 1 && run->plan_sharing.group)
        s->sharing = &run->plan_sharing.sharing;
    s->ep = rc->ep;
    s->exchange_bytes = 4.0 * per_micro_batch * rc->seq * rc->top_k * rc->channels *
                        (rc->ep - 1) / rc->ep;
    s->exchange_ms = a->exchange_ms >= 0 ? a->exchange_ms
                   : s->sharing == &run->replica_sharing ? SHARED_EXCHANGE_MS : s->latency_ms;
}

/* Everything the policies share, from the arguments, the run and the
 * trajectory. Bad sizes are user errors. */
static void make_setup(struct sim_setup *s, const struct simulate_args *a, const struct sim_run *run,
                       const struct sim_model *model, const struct sim_trajectory *traj)
{
    memset(s, 0, sizeof *s);
    s->model = model;
    s->traj = traj;
    s->split = a->split;
    s->blocks = traj->blocks * (s->split ? 2 : 1);
    s->steps = traj->steps;
    s->stages = a->stages ? a->stages : run->stages;
    if (s->stages > s->blocks)
        dm_user_error("simulate: --stages %d is more than the %d %s (a stage holds at least "
                      "one)", s->stages, s->blocks, s->split ? "units" : "blocks");
    s->replicas = a->replicas ? a->replicas : a->validate || a->hardware ? run->cfg.dp : 1;
    s->micro_batches = a->micro_batches ? a->micro_batches
                     : s->stages == run->stages ? run->micro_batches : 4 * s->stages;
    s->schedule = a->schedule >= 0 ? (enum dm_schedule)a->schedule : run->schedule;
    if (s->schedule == DM_SCHEDULE_INTERLEAVED) {   /* its layouts are the stages' */
        dm_log("simulate: parallel.schedule = interleaved is simulated as 1f1b over the "
               "%d stages (simulate does not lay out chunks)\n", run->stages);
        s->schedule = DM_SCHEDULE_1F1B;
    }
    s->every = a->every ? a->every : run->cfg.every;
    s->repack_every = a->repack_every ? a->repack_every : run->cfg.repack_every;
    s->repack_epsilon = a->epsilon >= 0 ? a->epsilon : run->cfg.repack_epsilon;
    s->restart_ms = a->restart_s * 1e3;
    s->latency_ms = a->latency_ms;
    s->bytes_per_ms = a->bandwidth_gbs * 1e6;
    s->migration_ms = a->migration_ms;
    s->csr_sparsity = run->csr_sparsity;
    const struct dm_config *rc = &run->cfg;
    int per_micro_batch = rc->batch / (rc->dp * rc->micro_batches);   /* sequences */
    s->cfg = *rc;
    s->cfg.pp = s->stages;
    s->cfg.dp = s->replicas;
    s->cfg.micro_batches = s->micro_batches;
    s->cfg.batch = per_micro_batch * s->micro_batches * s->replicas;
    s->cfg.steps = s->steps;
    s->cfg.every = s->every;
    s->tokens_per_step = (double)s->cfg.batch * rc->seq;
    s->activation_bytes = 4.0 * per_micro_batch * rc->seq * rc->channels;
    s->cfg.layers = traj->blocks;
    struct gpt_shape shape = dyn_shape_from_config(&s->cfg);
    s->block_params = dm_alloc((size_t)s->blocks * sizeof(double));
    for (int u = 0; u < s->blocks; u++) {
        double block = (double)gpt_block_param_count(&shape, s->split ? u / 2 : u);
        s->block_params[u] = !s->split ? block : u % 2 ? block * 2 / 3 : block / 3;
    }
    s->cfg.layers = s->blocks;
    /* with units, the output's config counts each unit as a block (its
     * layouts, /layers/ columns and the readers' checks agree) */
    if (s->split) snprintf(s->cfg.units, sizeof s->cfg.units, "block");
    double C = rc->channels, T = rc->seq;   /* attention's FLOPs over the block's */
    s->attention_share = a->attention_share >= 0 ? a->attention_share
                       : (8 * C * C * T + 2 * T * T * C) / (24 * C * C * T + 2 * T * T * C);
    setup_sharing(s, a, run, per_micro_batch);
    s->replay_layout = run->layout;
    s->replay_width = run->width;
}

/* A state of a training block at the extremes describe_model states, by
 * its role: full (every token, dense, every tile, experts evenly loaded
 * when the fit saw them) or low (10% of the tokens, 90% sparsity, a
 * quarter of the tiles, the busiest expert rank at 1.5x the mean). */
static float extreme_state(const struct sim_model *model, int k, int low)
{
    switch (sim_state_role(k)) {
    case DYN_COST_TOKEN_SHARE: case DYN_COST_ROUTED_SHARE: return low ? 0.1f : 1.0f;
    case DYN_COST_SPARSITY: return low ? 0.9f : 0.0f;
    case DYN_COST_TILE_SHARE: return low ? 0.25f : 1.0f;
    case DYN_COST_BUSIEST_RANK: return low ? 1.5f : model->uses[k] ? 1.0f : 0.0f;
    default: return 0.0f;
    }
}

/* The fitted model of a training block at its extremes (extreme_state):
 * forward and backward ms per micro-batch, update ms. */
static size_t describe_model(char *text, size_t size, const struct sim_model *model, float csr)
{
    float full[SIM_STATES_MAX], low[SIM_STATES_MAX];
    int varied = 0, busiest = -1;   /* the state of the busiest-rank role, when fitted */
    for (int k = 0; k < sim_state_count(); k++) {
        full[k] = extreme_state(model, k, 0);
        low[k] = extreme_state(model, k, 1);
        varied |= sim_state_role(k) != DYN_COST_FROZEN && model->uses[k];
        if (sim_state_role(k) == DYN_COST_BUSIEST_RANK && model->uses[k]) busiest = k;
    }
    double f, b, u, lf, lb, lu;
    sim_model_block(model, full, csr, &f, &b, &u);
    sim_model_block(model, low, csr, &lf, &lb, &lu);
    int n = snprintf(text, size, "model: a full block %.3f + %.3f ms a micro-batch, %.3f ms "
                     "update; embedding %.3f + %.3f, head %.3f + %.3f", f, b, u,
                     model->embed.fwd_ms, model->embed.bwd_ms, model->head.fwd_ms,
                     model->head.bwd_ms);
    if (varied && n >= 0 && (size_t)n < size)
        n += snprintf(text + n, size - (size_t)n, "; at 10%% of the tokens, 90%% sparsity, a "
                      "quarter of the tiles%s%s%s: %.3f + %.3f", busiest >= 0 ? ", the " : "",
                      busiest >= 0 ? sim_state_signal(busiest)->label : "",
                      busiest >= 0 ? " 1.5x the mean" : "", lf, lb);
    if (n >= 0 && (size_t)n < size) n += snprintf(text + n, size - (size_t)n, "\n");
    return n < 0 ? 0 : (size_t)n < size ? (size_t)n : size - 1;
}

/* The lines above the table: what was simulated, the cost model, the
 * transfer line. */
static void describe(char *text, size_t size, const struct simulate_args *a,
                     const struct sim_setup *s, const struct sim_run *run,
                     const struct sim_model *model)
{
    size_t used = 0;
    char states[512] = "", units[48] = "";
    if (s->split) snprintf(units, sizeof units, " (%d units)", s->blocks);
    for (int k = 0; k < sim_state_count(); k++)
        if (model->uses[k])
            snprintf(states + strlen(states), sizeof states - strlen(states), "%s%s",
                     states[0] ? ", " : "", sim_state_name(k));
    used += (size_t)snprintf(text + used, size - used,
        "simulate: %d blocks%s, %d stages x %d replica%s, m = %d, %s, %d steps, decisions "
        "every %d steps%s\n", s->traj->blocks, units, s->stages, s->replicas, s->replicas == 1 ? "" : "s",
        s->micro_batches,
        schedule_name(s->schedule), s->steps, s->every,
        s->sharing == &run->replica_sharing ? " (ranks share processors as in the run, its "
        "replicas included)" : s->sharing ? " (stages share processors as in the run)" : "");
    if (model->hardware)
        used += sim_hardware_describe(model->hardware, text + used, size - used);
    else used += (size_t)snprintf(text + used, size - used,
        "trajectory: %s%s%s\ncosts: fitted to %ld block-steps of %s (%d blocks, %d measured "
        "steps), median error %.1f%% per block; states: %s\n",
        a->scenario ? "the scenario " : "the run's", a->scenario ? a->scenario : "",
        !a->scenario && s->blocks != run->layers ? ", mapped by relative depth" : "",
        model->samples, run->path, run->layers, run->steps, 100 * model->fit_error,
        states[0] ? states : "none (constant costs)");
    used += describe_model(text + used, size - used, model, s->csr_sparsity);
    if (s->split && model->unit_fitted && !model->hardware) {
        float full[SIM_STATES_MAX];
        for (int k = 0; k < sim_state_count(); k++) full[k] = extreme_state(model, k, 0);
        double af, ab, au, mf, mb, mu;
        sim_model_unit(model, 0, full, s->csr_sparsity, &af, &ab, &au);
        sim_model_unit(model, 1, full, s->csr_sparsity, &mf, &mb, &mu);
        used += (size_t)snprintf(text + used, size - used, "units of placement: the attention "
            "and the MLP of each block, as the run measured them (balance.units = sublayer): "
            "attention %.3f + %.3f ms, MLP %.3f + %.3f ms a micro-batch (attention %.0f%% of "
            "the forward; its FLOPs share %.0f%%)\n", af, ab, mf, mb,
            af + mf > 0 ? 100 * af / (af + mf) : 0.0, 100 * s->attention_share);
    } else if (s->split) {
        used += (size_t)snprintf(text + used, size - used, "units of placement: the attention "
                                 "and the MLP of each block (attention %.0f%% of its time)\n",
                                 100 * s->attention_share);
    }
    if (a->load_placed > 0) {
        char copies[64] = "";
        if (run->cfg.replicas_max > 0)
            snprintf(copies, sizeof copies, " with up to %d copies a block",
                     run->cfg.replicas_max);
        used += (size_t)snprintf(text + used, size - used, "experts: placement %s%s over ep = "
            "%d ranks: the busiest expert rank at %.3fx the mean (mean over the MoE blocks and "
            "steps; the run's own %.3fx)\n", run->cfg.moe_placement, copies, run->cfg.ep,
            a->load_placed, a->load_run);
    }
    char exchange[160] = "";
    int busiest = sim_state_of_role(DYN_COST_BUSIEST_RANK);
    if (s->ep > 1 && busiest >= 0 && model->uses[busiest])
        snprintf(exchange, sizeof exchange, "; all-to-all over parallel.ep = %d ranks: %d + %d "
                 "exchange rounds a micro-batch, %.3f ms + %.0f KB each", s->ep,
                 SIM_EXCHANGE_FWD, SIM_EXCHANGE_BWD, s->exchange_ms, s->exchange_bytes / 1e3);
    snprintf(text + used, size - used,
        "transfer: %.3f ms + bytes / %.3g GB/s; a migration %.1f ms more; a re-pack restart "
        "%.1f s%s\n", s->latency_ms, s->bytes_per_ms / 1e6, s->migration_ms, s->restart_ms / 1e3,
        exchange);
}

/* ---- the summary --------------------------------------------------------- */

static int is_static(const struct sim_policy *p)
{
    return p->kind == SIM_STATIC_UNIFORM || p->kind == SIM_STATIC_PARAMS;
}

/* The static policy with the least time, or -1. */
static int best_static(const struct sim_policy *policies, const struct sim_result *results,
                       int count)
{
    int best = -1;
    for (int i = 0; i < count; i++)
        if (is_static(&policies[i]) && (best < 0 || results[i].total_ms < results[best].total_ms))
            best = i;
    return best;
}

/* The layout bound: the best static layout's step time over the best
 * layout's at each decision step (at most 50 of them, evenly spread),
 * summed. */
static double layout_bound(const struct sim_setup *setup, const struct sim_result *best,
                           double *static_ms, double *best_layout_ms)
{
    int stride = setup->every, samples = 0;
    if (setup->steps / stride > 50) stride = setup->steps / 50;
    if (stride > setup->steps) stride = setup->steps;   /* fewer steps than a decision: the last */
    double fixed = 0, best_ms = 0;
    char err[512];
    for (int t = stride - 1; t < setup->steps; t += stride, samples++) {
        double ms = sim_best_step_ms(setup, t, err, sizeof err);
        if (!isfinite(ms)) dm_user_error("simulate: the layout bound at step %d: %s", t + 1, err);
        fixed += best->steps[t].step_ms;
        best_ms += ms;
    }
    *static_ms = samples ? fixed / samples : NAN;
    *best_layout_ms = samples ? best_ms / samples : NAN;
    return samples && best_ms > 0 ? fixed / best_ms : NAN;
}

static double mean_bubble(const struct sim_result *r, int steps)
{
    double sum = 0;
    for (int t = 0; t < steps; t++) sum += r->steps[t].bubble;
    return sum / steps;
}

/* The table of every policy, then the best balancer, re-packing and the
 * bound, into text. */
static void summarise(char *text, size_t size, const struct sim_setup *setup,
                      const struct sim_policy *policies, const struct sim_result *results,
                      int count, double dense_ms)
{
    size_t used = strlen(text);
#define ADD(...) used += (size_t)snprintf(text + used, used < size ? size - used : 0, __VA_ARGS__)
    int ref = best_static(policies, results, count), best = -1, time_balanced = -1;
    ADD("%-18s %9s %10s %8s %7s %10s %6s %11s\n", "policy", "ms/step", "tokens/s", "speedup",
        "bubble", "migrations", "ranks", "rank-hours");
    for (int i = 0; i < count; i++) {
        const struct sim_result *r = &results[i];
        double speedup = ref >= 0 ? results[ref].total_ms / r->total_ms : NAN;
        int ranks = (r->repack_stages ? r->repack_stages : setup->stages) * setup->replicas;
        char speedup_text[32] = "       -";   /* no static policy chosen: no reference */
        if (ref >= 0) snprintf(speedup_text, sizeof speedup_text, "%7.3fx", speedup);
        ADD("%-18s %9.2f %10.1f %8s %6.1f%% %10d %6d %11.4f\n", policies[i].name,
            r->total_ms / setup->steps, setup->tokens_per_step * setup->steps / (r->total_ms / 1e3),
            speedup_text, 100 * mean_bubble(r, setup->steps), r->migrations, ranks,
            r->rank_ms / 3.6e6);
        if (!is_static(&policies[i]) && (best < 0 || r->total_ms < results[best].total_ms))
            best = i;
        if (policies[i].kind == SIM_BALANCED && !strcmp(policies[i].name, "partition-time"))
            time_balanced = i;
    }
    for (int i = 0; i < count; i++) {
        const struct sim_result *r = &results[i];
        if (policies[i].kind != SIM_REPACK) continue;
        int base = time_balanced >= 0 ? time_balanced : ref;
        if (!r->repack_step && setup->repack_every >= setup->steps)
            ADD("repack: no re-pack decision before the last step (every %d steps of %d)\n",
                setup->repack_every, setup->steps);
        else if (!r->repack_step)
            ADD("repack: no smaller world keeps the step within the epsilon\n");
        else if (base < 0)
            ADD("repack: from step %d on %d of %d ranks (no static or partition-time policy "
                "chosen to compare its rank-hours with)\n", r->repack_step,
                r->repack_stages * setup->replicas, setup->stages * setup->replicas);
        else
            ADD("repack: from step %d on %d of %d ranks, saving %.1f%% of the rank-hours of %s\n",
                r->repack_step, r->repack_stages * setup->replicas, setup->stages * setup->replicas,
                100 * (1 - r->rank_ms / results[base].rank_ms), policies[base].name);
    }
    if (ref >= 0) {
        double static_ms, layout_ms, bound = layout_bound(setup, &results[ref], &static_ms,
                                                          &layout_ms);
        ADD("best static: %s; best balancer: %s, %.3fx over it; layout bound %.3fx (at the "
            "decision steps: the best static layout %.2f ms/step, each step's best layout "
            "%.2f)\n", policies[ref].name, best >= 0 ? policies[best].name : "-",
            best >= 0 ? results[ref].total_ms / results[best].total_ms : NAN, bound, static_ms,
            layout_ms);
        if (isfinite(dense_ms) && best >= 0)
            ADD("without the dynamism (static-uniform, every block computing all it can): "
                "%.2f ms/step; the dynamism alone %.3fx, with the best balancer %.3fx\n",
                dense_ms / setup->steps, dense_ms / results[ref].total_ms,
                dense_ms / results[best].total_ms);
    }
#undef ADD
}

/* ---- validation ---------------------------------------------------------- */

/* The policy the run itself ran (its balance.method and initial layout);
 * replay when the simulator has none like it (random, explicit layouts). */
static struct sim_policy own_policy(const struct sim_run *run)
{
    const struct dm_config *c = &run->cfg;
    char name[80];
    if (!strcmp(c->method, "none"))
        snprintf(name, sizeof name, "static-%.60s", c->initial);
    else if (!strcmp(c->method, "partition") || !strcmp(c->method, "diffusion"))
        snprintf(name, sizeof name, "%s-%s", c->method, c->cost);
    else
        snprintf(name, sizeof name, "%s", c->method);
    for (int i = 0; i < POLICY_COUNT; i++)
        if (all_policies[i].kind != SIM_REPACK && !strcmp(all_policies[i].name, name))
            return all_policies[i];
    return (struct sim_policy){"replay", SIM_REPLAY, NULL};
}

/* Median relative error of the simulated step times against the
 * measured ones, steps after the first; the means into *sim, *meas. */
static double step_error(const struct sim_result *r, const struct sim_run *run, double *sim,
                         double *meas)
{
    double *err = dm_alloc((size_t)run->steps * sizeof(double));
    int n = 0;
    *sim = *meas = 0;
    for (int t = 1; t < run->steps; t++) {
        err[n++] = fabs(r->steps[t].step_ms - run->step_ms[t]) / run->step_ms[t];
        *sim += r->steps[t].step_ms;
        *meas += run->step_ms[t];
    }
    *sim /= n;
    *meas /= n;
    double median = dm_median(err, n);
    dm_free(err);
    return median;
}

/* Simulates the run's own layouts and its own policy, with the fitted
 * costs and with the run's measured costs of each step, and prints how far
 * each is from the measured step times. */
static void validate(const struct sim_setup *fitted, const struct sim_run *run)
{
    struct sim_policy policies[2] = {{"replay", SIM_REPLAY, NULL}, own_policy(run)};
    int count = policies[1].kind == SIM_REPLAY ? 1 : 2;
    struct sim_setup measured = *fitted;
    measured.measured = run;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < count; i++) {
            const struct sim_setup *setup = c ? &measured : fitted;
            struct sim_result r;
            sim_policy_run(&r, setup, &policies[i]);
            double sim, meas, error = step_error(&r, run, &sim, &meas);
            int same = 0;
            for (int t = 0; t < run->steps; t++)
                same += !memcmp(r.layout + (long)t * setup->stages,
                                run->layout + (long)t * run->width,
                                (size_t)setup->stages * sizeof(int));
            printf("validation: %s costs, %s (%s): median error %.2f%% over steps %d..%d; "
                   "mean %.2f ms simulated, %.2f measured; the run's layout at %d of %d "
                   "steps\n", c ? "measured" : "fitted", policies[i].name,
                   i == 0 ? "the run's layouts" : "the run's policy", 100 * error,
                   run->first_step + 1, run->first_step + run->steps - 1, sim, meas, same,
                   run->steps);
            sim_result_free(&r);
        }
}

/* The total ms of static-uniform on the model without its dynamism
 * (every block in its neutral state), or NAN when the trajectory has no
 * state. */
static double without_dynamism(const struct sim_setup *setup)
{
    int any = 0;
    for (int k = 0; k < sim_state_count(); k++) any |= setup->traj->present[k];
    if (!any) return NAN;
    struct sim_trajectory neutral;
    sim_trajectory_neutral(&neutral, setup->traj);
    struct sim_setup dense = *setup;
    dense.traj = &neutral;
    struct sim_policy policy = {"static-uniform", SIM_STATIC_UNIFORM, NULL};
    struct sim_result r;
    sim_policy_run(&r, &dense, &policy);
    double total = r.total_ms;
    sim_result_free(&r);
    sim_trajectory_free(&neutral);
    return total;
}

/* The mean over the MoE blocks and steps of the run's busiest expert rank
 * over the mean rank (the state of role DYN_COST_BUSIEST_RANK), or 0. */
static double mean_rank_load(const struct sim_run *run)
{
    int k = sim_state_of_role(DYN_COST_BUSIEST_RANK);
    double sum = 0;
    long n = 0;
    for (long i = 0; k >= 0 && i < (long)run->steps * run->layers; i++)
        if (run->state.value[k][i] > 0) {
            sum += run->state.value[k][i];
            n++;
        }
    return n ? sum / n : 0.0;
}

/* --ep, --placement, --replicas-max: the run's per-expert counts placed on
 * the simulated expert-parallel ranks by the placement planner
 * (sim_run_place_experts); run->cfg takes the what-if's ep, placement and
 * copies (the exchange rounds and the output's config follow it). The
 * rules of moe.placement and moe.replicas_max (docs/moe.md) are the
 * what-if's: a user error otherwise. */
static void place_experts(struct simulate_args *a, struct sim_run *run,
                          const struct sim_model *model)
{
    struct dm_config *rc = &run->cfg;
    int busiest = sim_state_of_role(DYN_COST_BUSIEST_RANK);
    if (rc->moe_every <= 0 || busiest < 0 || !run->state.present[busiest])
        dm_user_error("simulate: --ep, --placement and --replicas-max place experts, but %s "
                      "has no MoE blocks with per-expert counts", run->path);
    if (!model->uses[busiest])
        dm_user_error("simulate: --ep, --placement and --replicas-max change the busiest "
                      "expert rank's load, but it never varied in %s (parallel.ep = %d), so "
                      "the fit has no cost for it: give a run with its experts over ep > 1 "
                      "ranks", run->path, rc->ep);
    if (a->validate)
        dm_user_error("simulate: --validate simulates the run itself: leave out --ep, "
                      "--placement and --replicas-max");
    int E = rc->experts, ep = a->ep ? a->ep : rc->ep;
    int run_balanced = !strcmp(rc->moe_placement, "balanced");   /* else static (or random) */
    const char *placement = a->placement ? a->placement : run_balanced ? "balanced" : "static";
    int copies = a->replicas_max >= 0 ? a->replicas_max
               : run_balanced && !strcmp(placement, "balanced") ? rc->replicas_max : 0;
    if (E % ep)
        dm_user_error("simulate: --ep %d does not divide the run's %d experts", ep, E);
    if (!strcmp(placement, "balanced") && ep == 1)
        dm_user_error("simulate: --placement balanced moves experts between the ranks of an "
                      "expert group, but ep = 1 holds them all on one: give --ep > 1");
    if (copies > 0 && strcmp(placement, "balanced"))
        dm_user_error("simulate: --replicas-max %d copies hot experts at the placement "
                      "decisions, but the placement is %s: give --placement balanced", copies,
                      placement);
    if (copies > E - E / ep)
        dm_user_error("simulate: --replicas-max %d is more than the %d experts a rank does not "
                      "hold (0 .. E - E / ep = %d)", copies, E - E / ep, E - E / ep);
    if (a->ep && (a->replicas ? a->replicas : 1) % ep)
        dm_user_error("simulate: --ep %d needs the replicas (--replicas %d) a multiple of it "
                      "(an expert group's ranks are replicas of a stage)", ep,
                      a->replicas ? a->replicas : 1);
    a->load_run = mean_rank_load(run);
    sim_run_place_experts(run, ep, placement, copies);
    a->load_placed = mean_rank_load(run);
    rc->ep = ep;
    snprintf(rc->moe_placement, sizeof rc->moe_placement, "%s", placement);
    rc->replicas_max = copies;
}

/* ---- the command ------------------------------------------------------- */

int cmd_simulate(int argc, char **argv)
{
    struct simulate_args a;
    parse_args(&a, argc, argv);
    const char *input = a.run_dir ? a.run_dir : a.config;   /* what --out must not hold */
    if (a.out) sim_check_output(a.out, input);   /* a bad --out fails before the work */
    struct sim_run run;
    struct sim_model model;
    struct sim_trajectory traj;
    struct sim_hardware *hardware = NULL;
    if (a.hardware) {
        struct sim_hardware_input in = {a.hardware, a.config, a.run_dir, a.overrides,
                                        a.override_count, a.steps};
        hardware = sim_hardware_prepare(&run, &model, &traj, &in);
    } else {
        sim_run_read(&run, a.run_dir, a.stages);
    }
    if (a.validate && (a.scenario || (a.blocks && a.blocks != run.layers) ||
                       (a.stages && a.stages != run.stages) || a.steps ||
                       (a.replicas && a.replicas != run.cfg.dp) ||
                       a.micro_batches || a.schedule >= 0))
        dm_user_error("simulate: --validate simulates the run itself: leave out --scenario, "
                      "--blocks, --stages, --replicas, --micro-batches, --schedule and --steps");
    struct sim_policy policies[POLICY_COUNT];
    int count = choose_policies(a.policies, policies);
    if (run.units_per_block == 2) {   /* balance.units = sublayer: its measured units */
        if (a.attention_share >= 0)
            dm_user_error("simulate: --attention-share: %s is a run of balance.units = "
                          "sublayer, whose units' costs are measured (the share splits runs "
                          "of whole blocks)", run.path);
        a.split = 1;
    } else if (a.validate && a.split) {
        dm_user_error("simulate: --validate with --split-blocks: %s laid out whole blocks "
                      "(its layouts cannot replay units)", run.path);
    }
    if (!hardware) {
        sim_model_fit(&model, &run);
        if (a.ep || a.placement || a.replicas_max >= 0) place_experts(&a, &run, &model);
        make_trajectory(&traj, &a, &run, &model);
    }
    struct sim_setup setup;
    make_setup(&setup, &a, &run, &model, &traj);
    if (hardware)
        sim_hardware_setup(hardware, &setup, a.latency_given, a.bandwidth_given,
                           a.exchange_ms >= 0);
    double start = dm_now();
    char *text = dm_alloc(SUMMARY_BYTES);
    describe(text, SUMMARY_BYTES, &a, &setup, &run, &model);
    struct sim_result *results = dm_alloc((size_t)count * sizeof *results);
    for (int i = 0; i < count; i++) sim_policy_run(&results[i], &setup, &policies[i]);
    summarise(text, SUMMARY_BYTES, &setup, policies, results, count, without_dynamism(&setup));
    fputs(text, stdout);
    if (hardware)
        printf("predicted step: %.3f ms (%s, the mean over %d steps)\n",
               results[0].step_sum_ms / setup.steps, policies[0].name, setup.steps);
    printf("simulated %d policies x %d steps in %.2f s\n", count, setup.steps, dm_now() - start);
    if (a.validate) validate(&setup, &run);
    if (a.out) sim_write_output(a.out, input, &setup, policies, results, count, text);
    for (int i = 0; i < count; i++) sim_result_free(&results[i]);
    dm_free(results);
    dm_free(text);
    dm_free(setup.block_params);
    sim_trajectory_free(&traj);
    sim_run_free(&run);
    if (hardware) sim_hardware_free(hardware);
    dm_free(a.overrides);
    return DM_EXIT_OK;
}
