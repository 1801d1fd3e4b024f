/* The pieces of `dynmo simulate` (src/tools/simulate*.c), private to
 * src/tools: the command line and the summary (simulate.c), the cost model
 * fitted to a run log and the trajectory of each block's dynamic state,
 * from a run log mapped by relative depth or from a scenario file
 * (simulate_model.c), one policy run step by step through the balancing
 * controller and the predictor of src/balance (simulate_policy.c), and the
 * output files shaped like run logs (simulate_out.c).
 *
 * Nothing here decides a layout or simulates a schedule itself: layouts
 * come from balance_controller_* and balance_propose, step times from
 * balance_predict_shared over the lists of schedule_stage, as in training
 * (docs/simulate.md). Everything is deterministic. */
#ifndef DYNMO_TOOLS_SIMULATE_H
#define DYNMO_TOOLS_SIMULATE_H

#include <stdint.h>
#include "dynmo/balance.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "tools/plan/plan.h"
#include "tools/simulate/hardware.h"

/* ---- the dynamic state of the blocks over training ---------------------- */

/* What a block's cost depends on, at one step: the states, each a signal
 * of a registered scheme that declares a cost role (dyn_signal.cost), in
 * the order of the roles (then of the table), so the fit's features keep
 * one order. State k's name, neutral value and role are its signal's. */
#define SIM_STATES_MAX 16
int sim_state_count(void);
const struct dyn_signal *sim_state_signal(int state);
const char *sim_state_name(int state);
float sim_state_neutral(int state);
enum dyn_cost_role sim_state_role(int state);
/* The first state of role, or -1. */
int sim_state_of_role(enum dyn_cost_role role);

/* The state of every block at every step: value[state][step * blocks + block].
 * present[state] says which the source has (the others hold their neutral
 * values, sim_state_neutral). */
struct sim_trajectory {
    int steps, blocks;
    float *value[SIM_STATES_MAX];
    int present[SIM_STATES_MAX];
};

void sim_trajectory_free(struct sim_trajectory *t);
/* The most steps x units (blocks, or halves under --split-blocks) one
 * simulation holds: about 100 bytes each over the trajectory and seven
 * policies' results. */
#define SIM_MAX_CELLS 10000000L
/* A user error when steps x units exceeds SIM_MAX_CELLS. */
void sim_check_size(long steps, long units);
/* The model without its dynamism: src's blocks at every step in their
 * neutral state (all tokens, dense, none frozen, every tile), except that
 * a block with experts (busiest-rank load > 0) keeps them, evenly loaded
 * (load 1). */
void sim_trajectory_neutral(struct sim_trajectory *t, const struct sim_trajectory *src);

/* ---- what the run log gives --------------------------------------------- */

struct sim_run {
    char path[1200];           /* RUN_DIR/runlog.h5 */
    struct dm_config cfg;      /* its configuration (the root attribute config) */
    int layers, stages, steps, micro_batches;
    enum dm_schedule schedule;
    float *fwd, *bwd, *update; /* (steps, layers) measured ms; update may be NULL */
    float *busy, *stage_update;/* (steps, width) measured per stage */
    int width;                 /* stage columns */
    int *layout;               /* (steps, width) blocks per stage, each a layout of layers */
    int *layout_stages;        /* (steps) stages of each layout */
    float *step_ms;            /* (steps) measured */
    float csr_sparsity;        /* dyn.csr_sparsity: where a block's matrices go to CSR */
    int first_step;            /* 1-based step of row 0 (a resumed run's log starts later) */
    long rows, *kept;          /* the log's rows, and (steps) the row of each measured step */
    struct balance_extra *embed, *head; /* (steps) the end stages' extras, time fields */
    struct sim_trajectory state;
    /* 2 under balance.units = sublayer (its layouts count units, a block's
     * attention 2j and its MLP 2j + 1), else 1; with 2, unit_fwd, unit_bwd
     * and unit_update are (steps, 2 layers) measured ms (/units/). */
    int units_per_block;
    float *unit_fwd, *unit_bwd, *unit_update;
    struct plan_sharing plan_sharing; /* the stage sharing it recorded, at its stage count */
    /* With shares (non-NULL): its replicas' ranks took turns on the same
     * CPUs; the sharing of all its replicas, each group's share of its
     * CPUs as processor sharing (replica_sharing.cores = shares). */
    double *shares;
    struct balance_sharing replica_sharing;
};

/* Reads DIR/runlog.h5: config, per-block and per-stage times, layouts, the
 * block states of its measured steps (filler rows left out), and the
 * processor sharing it recorded when `stages` (0: the run's) is its stage
 * count. A log without per-block costs (/layers/fwd_ms, /layers/bwd_ms),
 * without layouts or stage times, or with fewer than 3 measured steps is a
 * user error (exit 2) naming it. */
void sim_run_read(struct sim_run *run, const char *dir, int stages);
void sim_run_free(struct sim_run *run);
/* The expert placement what-if: the busiest expert rank's load of every
 * MoE block and measured step (the state of role DYN_COST_BUSIEST_RANK,
 * replaced in run->state) priced from the run's per-expert counts
 * (/moe/tokens, /moe/dropped) on ep ranks under placement ("static" or
 * "balanced") with replicas_max copies, by the MoE scheme's reader
 * (moe_load_of_log) and so by the placement planner the trainer's
 * controller runs (balance_placement_plan, balance_copies_plan). A log
 * without the counts is a user error. Call after the fit (which takes the
 * run's own loads). */
void sim_run_place_experts(struct sim_run *run, int ep, const char *placement, int replicas_max);

/* ---- the cost model ----------------------------------------------------- */

/* The fit's features: 1, then each state's (its role's, dyn.h). */
#define SIM_FEATURES_MAX (1 + 2 * SIM_STATES_MAX)
enum { SIM_FWD = 0, SIM_BWD, SIM_UPDATE, SIM_DIRECTIONS };

/* Per direction (forward and backward per micro-batch, update once a
 * step) and per class (0 training, 1 frozen), time = beta . features(state)
 * fitted by least squares to every (step, block) of the run after the
 * first step. The embedding's and head's extras are the medians of
 * balance_end_stage_extras over the same steps. */
struct sim_model {
    double beta[SIM_DIRECTIONS][2][SIM_FEATURES_MAX];
    int features;              /* how many */
    int fitted[2];             /* samples of each class > 0 */
    int uses[SIM_STATES_MAX];  /* the fit saw this state vary */
    struct balance_extra embed, head;
    double fit_error;          /* median |fit - measured| / measured, block fwd + bwd */
    long samples;
    /* Non-NULL (--hardware): no fit; each block is priced op by op on a
     * hardware file (simulate_hardware.c), embed and head likewise. */
    const struct sim_hardware *hardware;
    /* A run of balance.units = sublayer (unit_fitted 1): its attentions'
     * (unit_beta[0]) and MLPs' (unit_beta[1]) measured costs fitted apart,
     * as beta, with the same features. */
    double unit_beta[2][SIM_DIRECTIONS][2][SIM_FEATURES_MAX];
    int unit_fitted;
};

/* Fits the model to run. Never fails (a class without samples falls back:
 * frozen blocks forward as training ones and do no backward or update). */
void sim_model_fit(struct sim_model *model, const struct sim_run *run);

/* A block's forward, backward and update ms in state (sim_state_count()
 * values), csr the run's dyn.csr_sparsity. */
void sim_model_block(const struct sim_model *model, const float *state, float csr,
                     double *fwd, double *bwd, double *update);

/* A unit's forward, backward and update ms from a sublayer run's units
 * fitted apart (model->unit_fitted): half 0 a block's attention, 1 its
 * MLP, in the block's state. */
void sim_model_unit(const struct sim_model *model, int half, const float *state, float csr,
                    double *fwd, double *bwd, double *update);

/* Block `block`'s costs (sim_model_block; -1: a block of no scheme's own),
 * priced on the hardware when the model has one. */
void sim_model_block_at(const struct sim_model *model, int block, const float *state,
                        float csr, double *fwd, double *bwd, double *update);

/* The run's trajectory mapped onto `blocks` blocks by relative depth and
 * onto `steps` steps by relative time: of the blocks that carry a state
 * (its scheme's, dyn_signal_layer, in the model of cfg, the run's, and in
 * that model at `blocks` blocks), carrier j of n takes the state at depth
 * (j + 0.5) / n of the run's carriers, interpolated; the other blocks its
 * neutral value; frozen blocks stay a prefix. */
void sim_trajectory_map(struct sim_trajectory *out, const struct sim_trajectory *src,
                        const struct dm_config *cfg, int blocks, int steps);

/* Reads a scenario (docs/simulate.md): a CSV with header step,block and
 * one or more of the states' names; every listed step lists
 * every block once; a step's states hold until the next listed step. The
 * trajectory covers `steps` steps (0: through the last listed step). Bad
 * input is a user error naming the file and line. */
void sim_scenario_read(struct sim_trajectory *out, const char *path, int steps);

/* ---- a policy, step by step ---------------------------------------------- */

enum sim_policy_kind { SIM_STATIC_UNIFORM, SIM_STATIC_PARAMS, SIM_BALANCED, SIM_REPACK,
                       SIM_REPLAY };

struct sim_policy {
    char name[48];
    enum sim_policy_kind kind;
    const char *method;        /* SIM_BALANCED, SIM_REPACK: balance.method */
};

/* Everything a policy run needs; shared by all policies. */
struct sim_setup {
    const struct sim_model *model;
    const struct sim_trajectory *traj;
    struct dm_config cfg;      /* the simulated model and run (layers, pp, dp, ...) */
    int blocks, stages, replicas, micro_batches, steps, every;  /* blocks: units of placement */
    /* The sub-block what-if: each block is two units of placement, its
     * attention (unit 2j, attention_share of the block's time) and its MLP
     * (unit 2j + 1); 0: a block is one unit. */
    int split;
    double attention_share;
    enum dm_schedule schedule;
    float csr_sparsity;
    double latency_ms, bytes_per_ms;   /* the transfer line */
    /* Experts split over ep > 1 ranks (the run's parallel.ep): each MoE
     * block's micro-batch waits for SIM_EXCHANGE_FWD all-to-all rounds
     * forward and SIM_EXCHANGE_BWD backward (src/pipe/expert.c), each
     * exchange_ms plus the busiest rank's rows, g x exchange_bytes, through
     * the transfer line's bandwidth. */
    int ep;
    double exchange_ms, exchange_bytes;
    double migration_ms;               /* a migration's fixed cost beyond its bytes */
    /* Non-NULL: the replicas' gradient sum is an all-reduce on this line
     * (latency, bus bandwidth) instead of 2 (D-1)/D of the transfer line. */
    const struct hw_link *gradient_link;
    double activation_bytes;           /* one micro-batch's activations, one way */
    double tokens_per_step;
    double *block_params;              /* (blocks) dense parameters */
    const struct balance_sharing *sharing; /* for `stages` stages, or NULL */
    double repack_epsilon, restart_ms;
    int repack_every;
    const int *replay_layout;          /* SIM_REPLAY: (steps, replay_width) */
    /* Non-NULL: each step's block costs and extras are the run's measured
     * ones instead of the model's (--validate; the run's own shape). */
    const struct sim_run *measured;
    int replay_width;
};

/* The expert all-to-all rounds of an MoE block's micro-batch (ep > 1):
 * forward the counts, the rows and the outputs; backward the output
 * gradients and the input gradients. */
#define SIM_EXCHANGE_FWD 3
#define SIM_EXCHANGE_BWD 2

/* One simulated step, as the output and the summary read it. */
struct sim_step {
    double step_ms, bubble, imbalance, migrate_ms;
    int stages, migrated_blocks;
    double migrated_bytes;
};

struct sim_result {
    struct sim_step *steps;        /* (steps) */
    int *layout;                   /* (steps, stages of the first world) */
    float *fwd, *bwd, *update;     /* (steps, blocks) modelled ms */
    float *busy, *idle, *stage_update; /* (steps, stages) */
    float *decisions;              /* (decision_count, BALANCE_DECISION_COLUMNS) */
    int decision_count;
    double total_ms, rank_ms;      /* steps + migrations + restarts; x ranks */
    double step_sum_ms;            /* the steps alone */
    int repack_step, repack_stages;/* first re-pack (0: none) and its stages */
    double restart_ms;
    int migrations;
};

/* Runs policy over setup's steps into res (free with sim_result_free). A
 * balancer that fails is a user error naming the policy and the step. */
void sim_policy_run(struct sim_result *res, const struct sim_setup *setup,
                    const struct sim_policy *policy);
void sim_result_free(struct sim_result *res);

/* The best layout's step at step t (0-based), for the layout bound: the
 * predicted step time of the layout partition-time proposes for that
 * step's own costs, on setup's stages and sharing. NAN with err filled
 * when the balancer fails. */
double sim_best_step_ms(const struct sim_setup *setup, int step, char *err, size_t errsize);

/* ---- output -------------------------------------------------------------- */

/* Checks DIR before the work: absent, empty or an earlier simulation's
 * (tools/out_dir.h), not holding RUN_DIR; a user error otherwise. */
void sim_check_output(const char *dir, const char *run_dir);
/* Writes one file shaped like a run log (root attribute kind
 * "simulation") per policy, DIR/<policy>.h5, and DIR/summary.txt holding
 * `summary`, into a new directory beside DIR renamed into place: DIR is
 * whole or absent, never half written, and marked as simulate's. */
void sim_write_output(const char *dir, const char *run_dir, const struct sim_setup *setup,
                      const struct sim_policy *policies, const struct sim_result *results,
                      int count, const char *summary);

/* ---- from a hardware file (simulate_hardware.c) ------------------------- */

/* `dynmo simulate --hardware HW.ini --config F [key=value ...]`: the
 * config's model priced op by op on the hardware (hardware.h). */
struct sim_hardware;
struct sim_hardware_input {
    const char *hardware, *config, *run_dir;
    char *const *overrides;
    int override_count;
    int steps;                 /* 0: the config's train.steps, or the run's steps */
};

/* Loads the hardware file and the config (overrides applied, the config's
 * and the schemes' checks) and fills what a run log would give: run holds
 * the config's shape (cfg, layers, stages, micro-batches, schedule) and
 * no measured costs; model prices blocks on the hardware; traj is the
 * states of `steps` steps, the run's at run_dir mapped onto the config's
 * depth, else the config's own (every token computed, the pruning
 * schedule, MoD blocks at model.mod_capacity, experts evenly loaded).
 * Returns the pricing, freed by sim_hardware_free. User errors exit 2. */
struct sim_hardware *sim_hardware_prepare(struct sim_run *run, struct sim_model *model,
                                          struct sim_trajectory *traj,
                                          const struct sim_hardware_input *in);
/* Block `block`'s forward and backward ms per micro-batch and update ms
 * at state (sim_state_count() values; block -1: a block of no scheme's). */
void sim_hardware_block(const struct sim_hardware *h, int block, const float *state,
                        double *fwd, double *bwd, double *update);
/* Fits setup to the hardware: the transfer line (unless given), the
 * expert exchange's fixed cost (unless given) and the replicas' gradient
 * all-reduce from its links (within a node while stages x replicas fit
 * one); then a user error naming the numbers when the busiest stage of the
 * uniform layout does not fit the hardware's memory. */
void sim_hardware_setup(const struct sim_hardware *h, struct sim_setup *setup,
                        int latency_given, int bandwidth_given, int exchange_given);
/* The summary's trajectory and costs lines. */
size_t sim_hardware_describe(const struct sim_hardware *h, char *text, size_t size);
void sim_hardware_free(struct sim_hardware *h);

#endif
