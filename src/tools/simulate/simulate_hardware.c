/* `dynmo simulate --hardware HW.ini --config F [key=value ...]`
 * (docs/simulate.md, "The hardware model"): the config's model priced op
 * by op on a hardware file instead of costs fitted to a run log. This file
 * fills what simulate otherwise reads from the log (the shape, the
 * trajectory of the schemes' states, the end stages' extras), prices each
 * block at its state through hardware_ops.c, takes the transfer and the
 * gradient all-reduce lines from the hardware's links, and refuses a shape
 * whose busiest stage does not fit the hardware's memory.
 *
 * Must not: choose layouts or simulate schedules (the policies run through
 * src/balance as every simulation does), or measure anything. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "tools/simulate/simulate.h"

struct sim_hardware {
    struct hardware hw;
    struct hw_model model;
    struct gpt_shape shape;              /* the config's, its schemes' blocks */
    int runs_state[SIM_STATES_MAX];      /* the config runs the state's scheme */
    char config_path[1024];
    int from_run;
    char run_path[1200];
};

/* The config: the file, its overrides, the checks of the config and of
 * every scheme. simulate reads no data, so an empty data.train or
 * run.out_dir is not asked for. */
static void load_config(struct dm_config *cfg, const struct sim_hardware_input *in)
{
    config_defaults(cfg);
    config_load_file(cfg, in->config);
    for (int i = 0; i < in->override_count; i++) config_apply_override(cfg, in->overrides[i]);
    if (!cfg->train_path[0]) snprintf(cfg->train_path, sizeof cfg->train_path, "(none)");
    if (!cfg->out_dir[0]) snprintf(cfg->out_dir, sizeof cfg->out_dir, "(none)");
    dyn_config_validate(cfg);
}

/* The states a run of cfg has from its config alone, as each signal
 * declares them (cost_of_config; neutral without): every token computed
 * (no exit, no freezing foreseen), the pruning schedule's sparsity in
 * force at each step, the routed share at its capacity, every tile the
 * even groups give, even loads. */
static void config_trajectory(struct sim_trajectory *t, const struct dm_config *cfg, int steps)
{
    memset(t, 0, sizeof *t);
    t->steps = steps;
    t->blocks = cfg->layers;
    size_t n = (size_t)steps * (size_t)cfg->layers;
    struct gpt_shape shape = dyn_shape_from_config(cfg);
    for (int k = 0; k < sim_state_count(); k++) {
        t->value[k] = dm_alloc(n * sizeof(float));
        const struct dyn_signal *signal = sim_state_signal(k);
        t->present[k] = dyn_signal_active(signal, cfg);
        for (int step = 0; step < steps; step++)
            for (int j = 0; j < cfg->layers; j++) {
                int carrier = t->present[k] && dyn_signal_layer(signal, &shape, j);
                t->value[k][(size_t)step * cfg->layers + j] =
                    carrier && signal->cost_of_config ? signal->cost_of_config(cfg, step)
                                                      : sim_state_neutral(k);
            }
    }
}

/* What a block computes at state (sim_state_count() values), by role: a
 * state counts where the config runs its scheme, on the scheme's blocks
 * (a run's MoE loads drive the config's MoE blocks, never its dense ones). */
static struct hw_block_state block_state(const struct sim_hardware *h, int block,
                                         const float *state)
{
    const struct dm_config *c = &h->model.cfg;
    struct hw_block_state s = {.active = 1, .tokens = 1, .tiles = 1};
    for (int k = 0; k < sim_state_count(); k++) {
        if (!h->runs_state[k] ||
            (block >= 0 && !dyn_signal_layer(sim_state_signal(k), &h->shape, block)))
            continue;
        double v = state[k];
        switch (sim_state_role(k)) {
        case DYN_COST_TOKEN_SHARE: s.active = v; break;
        case DYN_COST_ROUTED_SHARE: s.tokens = v; break;
        case DYN_COST_SPARSITY: s.sparsity = v; break;
        case DYN_COST_FROZEN: s.frozen = v != 0; break;
        case DYN_COST_TILE_SHARE: s.tiles = v; break;
        case DYN_COST_BUSIEST_RANK: s.busiest_load = v; break;
        default: break;
        }
    }
    s.exit_head = block >= 0 && !strcmp(c->dyn_kind, "early_exit") && block >= c->exit_from &&
                  block < c->layers - 1;
    return s;
}

void sim_hardware_block(const struct sim_hardware *h, int block, const float *state,
                        double *fwd, double *bwd, double *update)
{
    struct hw_block_state s = block_state(h, block, state);
    struct hw_pass pass;
    hw_block_forward(&pass, &h->model, &s);
    *fwd = pass.ms;
    hw_block_backward(&pass, &h->model, &s);
    *bwd = pass.ms;
    hw_block_update(&pass, &h->model, &s);
    *update = pass.ms;
}

struct sim_hardware *sim_hardware_prepare(struct sim_run *run, struct sim_model *model,
                                          struct sim_trajectory *traj,
                                          const struct sim_hardware_input *in)
{
    struct sim_hardware *h = dm_alloc(sizeof *h);
    hardware_load(&h->hw, in->hardware);
    struct dm_config cfg;
    load_config(&cfg, in);
    snprintf(h->config_path, sizeof h->config_path, "%s", in->config);
    h->model = (struct hw_model){&h->hw, cfg, cfg.batch / (cfg.dp * cfg.micro_batches)};
    memset(run, 0, sizeof *run);
    int steps;
    if (in->run_dir) {
        /* The run gives its trajectory of states only: its costs, layouts
         * and processor sharing belong to its own machine. */
        sim_run_read(run, in->run_dir, 0);
        run->units_per_block = 1;   /* the config's units, priced on the hardware */
        /* the run's expert counts placed as the config places its experts */
        const struct dm_config *rc = &run->cfg;
        if (cfg.moe_every > 0 && rc->moe_every > 0 && rc->experts == cfg.experts &&
            (rc->ep != cfg.ep || strcmp(rc->moe_placement, cfg.moe_placement) ||
             rc->replicas_max != cfg.replicas_max))
            sim_run_place_experts(run, cfg.ep, cfg.moe_placement, cfg.replicas_max);
        steps = in->steps ? in->steps : run->steps;
        sim_check_size(steps, cfg.layers);
        sim_trajectory_map(traj, &run->state, &run->cfg, cfg.layers, steps);
        dm_free(run->shares);
        run->shares = NULL;
        dm_free(run->plan_sharing.group);
        dm_free(run->plan_sharing.cores);
        memset(&run->plan_sharing, 0, sizeof run->plan_sharing);
        h->from_run = 1;
        snprintf(h->run_path, sizeof h->run_path, "%s", run->path);
    } else {
        steps = in->steps ? in->steps : cfg.steps;
        sim_check_size(steps, cfg.layers);
        config_trajectory(traj, &cfg, steps);
        snprintf(run->path, sizeof run->path, "%s", in->config);
    }
    run->cfg = cfg;
    run->layers = cfg.layers;
    run->stages = cfg.pp;
    run->micro_batches = cfg.micro_batches;
    run->schedule = config_schedule(&cfg);
    run->csr_sparsity = (float)cfg.csr_sparsity;
    h->shape = dyn_shape_from_config(&cfg);
    memset(model, 0, sizeof *model);
    model->hardware = h;
    for (int k = 0; k < sim_state_count(); k++) {
        h->runs_state[k] = dyn_signal_active(sim_state_signal(k), &cfg);
        model->uses[k] = traj->present[k] && h->runs_state[k];
    }
    struct hw_pass f, b, u;
    hw_embed_passes(&f, &b, &u, &h->model);
    model->embed = (struct balance_extra){.fwd_ms = f.ms, .bwd_ms = b.ms, .update_ms = u.ms};
    hw_head_passes(&f, &b, &u, &h->model);
    model->head = (struct balance_extra){.fwd_ms = f.ms, .bwd_ms = b.ms, .update_ms = u.ms};
    return h;
}

static const struct hw_link *link_for(const struct sim_hardware *h, int ranks, int collective)
{
    int within = ranks <= h->hw.ranks_per_node;
    if (collective) return within ? &h->hw.collective_intra : &h->hw.collective_inter;
    return within ? &h->hw.p2p_intra : &h->hw.p2p_inter;
}

static void check_memory(const struct sim_hardware *h, const struct sim_setup *setup)
{
    const struct dm_config *c = &h->model.cfg;
    int S = setup->stages, U = setup->blocks, units_per_block = setup->split ? 2 : 1;
    double worst = 0, worst_params = 0, worst_acts = 0;
    int worst_stage = 0, worst_flight = 0;
    double logits = 2 * 4.0 * h->model.sequences * c->seq * c->vocab;
    for (int s = 0, begin = 0; s < S; s++) {
        int count = U / S + (s < U % S);
        double params = 0;
        for (int j = begin; j < begin + count; j++) params += setup->block_params[j];
        begin += count;
        if (s == 0) params += ((double)c->vocab + c->max_seq) * c->channels;
        /* 1F1B: S - s micro-batches alive, ZB-H1: S on every stage */
        int alive = setup->schedule == DM_SCHEDULE_ZB ? S : S - s;
        int in_flight = setup->schedule == DM_SCHEDULE_GPIPE ? setup->micro_batches
                      : alive < setup->micro_batches ? alive : setup->micro_batches;
        double bytes = hw_stage_bytes(&h->model, params, (count + units_per_block - 1) /
                                      units_per_block, in_flight) + (s == S - 1 ? logits : 0);
        if (bytes > worst) {
            worst = bytes;
            worst_stage = s;
            worst_params = params;
            worst_flight = in_flight;
            worst_acts = bytes - 16.0 * params;
        }
    }
    if (worst > h->hw.memory_gb * 1e9)
        dm_user_error("simulate: stage %d of %d needs %.1f GB (%.0fM parameters with gradients "
                      "and AdamW moments %.1f GB; activations of %d micro-batches of %d x %d "
                      "tokens in flight %.1f GB), more than the %g GB of %s (%s): give more "
                      "stages or fewer sequences a micro-batch", worst_stage, S, worst / 1e9,
                      worst_params / 1e6, 16.0 * worst_params / 1e9, worst_flight,
                      h->model.sequences, c->seq, worst_acts / 1e9, h->hw.memory_gb, h->hw.name,
                      h->hw.path);
}

void sim_hardware_setup(const struct sim_hardware *h, struct sim_setup *setup,
                        int latency_given, int bandwidth_given, int exchange_given)
{
    int ranks = setup->stages * setup->replicas;
    const struct hw_link *p2p = link_for(h, ranks, 0);
    if (!latency_given) setup->latency_ms = p2p->latency_us / 1e3;
    if (!bandwidth_given) setup->bytes_per_ms = p2p->bandwidth_gbs * 1e6;
    if (!exchange_given) setup->exchange_ms = setup->latency_ms;
    setup->gradient_link = link_for(h, ranks, 1);
    check_memory(h, setup);
}

size_t sim_hardware_describe(const struct sim_hardware *h, char *text, size_t size)
{
    const struct dm_config *c = &h->model.cfg;
    struct hw_block_state dense = {.active = 1, .tokens = 1, .tiles = 1};
    struct hw_pass f, b;
    hw_block_forward(&f, &h->model, &dense);
    hw_block_backward(&b, &h->model, &dense);
    double cls[HW_CLASSES] = {0};
    for (int i = 0; i < f.count; i++) cls[f.op[i].cls] += f.op[i].ms;
    for (int i = 0; i < b.count; i++) cls[b.op[i].cls] += b.op[i].ms;
    int n = snprintf(text, size,
        "trajectory: %s%s\ncosts: op by op on %s (%s); %s: %d blocks x %d channels, %d heads, "
        "%d x %d tokens a micro-batch; a dense block %.2f + %.2f GFLOP a micro-batch, %.0f%% of "
        "its time in GEMMs, %.0f%% attention, %.0f%% memory-bound ops\n",
        h->from_run ? "the run's states, mapped by relative depth: " : "the config's states "
        "(as each scheme declares them: every token, the pruning schedule, the routed "
        "capacity, even loads)",
        h->from_run ? h->run_path : "", h->hw.name, h->hw.path, h->config_path, c->layers,
        c->channels, c->heads, h->model.sequences, c->seq, f.flops / 1e9, b.flops / 1e9,
        100 * cls[HW_GEMM] / (f.ms + b.ms), 100 * cls[HW_ATTENTION] / (f.ms + b.ms),
        100 * cls[HW_MEMORY] / (f.ms + b.ms));
    return n < 0 ? 0 : (size_t)n < size ? (size_t)n : size - 1;
}

void sim_hardware_free(struct sim_hardware *h)
{
    dm_free(h);
}
