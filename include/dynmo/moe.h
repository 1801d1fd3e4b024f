/* dynmo moe: mixture of experts (src/dyn/moe/, docs/moe.md), the parts of
 * the scheme that its expert parallelism (src/pipe/expert.c) and the tests
 * call: its parameters in a model's shape, its blocks, a block's state
 * beside its slab, the experts phase run by a caller, the step's counts.
 * Part of the dyn module (its public header of one scheme).
 *
 * An MoE block replaces its MLP by E expert MLPs and a linear router
 * (block extension with an MLP hook, dynmo/block_ext.h). Its floats after
 * the eight tensors every block has (ln1_w .. ln2_b, moe_shared_param_count:
 * 4C^2 + 8C): the router router_w (E, C), then the experts it holds, each
 * fc_w (H, C) fc_b (H) fcproj_w (C, H) fcproj_b (C)
 * (moe_expert_param_count: 2HC + H + C). */
#ifndef DYNMO_MOE_H
#define DYNMO_MOE_H

#include <stddef.h>
#include <stdint.h>
#include "dynmo/block_ext.h"
#include "dynmo/model.h"

enum { MOE_ROUTER_SOFTMAX = 0, MOE_ROUTER_SIGMOID = 1 };
/* Which pairs a full expert keeps (docs/moe.md, Capacity): probs the
 * highest scores; position by (token, slot), so a token's pairs together;
 * slot by (slot, token), every token's first choice before any second
 * choice (GShard). */
enum { MOE_DROP_PROBS = 0, MOE_DROP_POSITION = 1, MOE_DROP_SLOT = 2 };
#define MOE_PACK_FLAG (UINT64_C(1) << 10)   /* MoE state follows v */

/* Its parameters in a shape (gpt_shape.ext); no padding. */
struct moe_params {
    int every;              /* block l is an MoE block when (l + 1) % every == 0 */
    int experts, top_k;     /* E, k */
    int hidden;             /* H, an expert's hidden width */
    int router;             /* MOE_ROUTER_*: softmax, or sigmoid scores with a selection bias */
    int drop;               /* MOE_DROP_*: which overflow a full expert drops first */
    float capacity_factor;  /* 0: dropless; else capacity ceil(k * N * factor / E) */
    float aux_loss, z_loss; /* alpha (Switch/GShard balancing loss), beta (router z-loss) */
    float bias_rate;        /* gamma of the auxiliary-loss-free bias update */
    int shard_first;        /* expert parallelism: the first expert this rank's MoE */
    int shard_count;        /* blocks hold, and how many; 0: all E (parallel.ep = 1) */
    int placed;             /* the run moves experts (moe.placement is not static): its
                               checkpoints keep the placement (/moe/state/placement) */
};
extern const struct gpt_ext_ops moe_ext_ops;
/* The shape's mixture of experts, or NULL (none). */
const struct moe_params *moe_params_of(const struct gpt_shape *shape);
void moe_shape_add(struct gpt_shape *shape, const struct moe_params *params);
/* Expert parallelism over P ranks: rank r's MoE blocks hold experts
 * r E / P .. (r + 1) E / P - 1 (no-op without MoE or with P = 1). */
void moe_shape_shard(struct gpt_shape *shape, int P, int rank);

/* Whether block `index` is a mixture of experts: the one rule. */
int gpt_block_is_moe(const struct gpt_shape *shape, int index);
/* MoE blocks of the model, and the ordinal of block `index` among them
 * (0 for the first MoE block in layer order), or -1 for a dense block. */
int gpt_moe_block_count(const struct gpt_shape *shape);
int gpt_moe_ordinal(const struct gpt_shape *shape, int index);

size_t moe_shared_param_count(int C);
size_t moe_expert_param_count(int C, int H);
/* The experts a block holds: shard_count, or all E when it is 0; the
 * floats of an MoE block (the shared tensors, the router, the held
 * experts), and with every expert (the model's size). */
int moe_owned_experts(const struct moe_params *moe);
size_t moe_block_param_count(int C, const struct moe_params *moe);
size_t moe_full_param_count(int C, const struct moe_params *moe);

/* The experts phase of an MoE block run by the caller (expert parallelism,
 * src/pipe/expert.c), forward and backward: the model never calls MPI; the
 * runner sends each expert's rows to the rank that owns it, runs them
 * there with moe_expert_forward / moe_expert_backward and brings the rows
 * back. x, dy: (rows, C) grouped by expert, expert e's rows offset[e] ..
 * offset[e + 1] (E + 1 offsets; on the host); y, dx: the same rows, to
 * write; x, y, dx, dy are the backend's memory (device memory on a
 * device: the runner stages what MPI moves). key names the micro-batch's
 * activations of this block (the same pointer in the forward and the
 * backward of one micro-batch), so that the runner can keep what the
 * backward needs. experts_backward also owes the expert gradients
 * (accumulated, unless the block is frozen). The caller hands it to the
 * model with gpt_ext_set_runtime(model, &moe_ext_ops, exchange). */
struct moe_exchange {
    void *ctx;
    void (*experts_forward)(void *ctx, struct block *blk, const void *key, const int *offset,
                            const float *x, float *y);
    void (*experts_backward)(void *ctx, struct block *blk, const void *key, const int *offset,
                             const float *dy, float *dx);
};

/* An MoE block's state beside its slab: views of its router and experts,
 * and its dynamic state, which travels in its pack (MOE_PACK_FLAG) and its
 * checkpoint rows: the selection bias and the last step's counts. */
struct block_moe {
    struct moe_params cfg;       /* E, k, H and the routing, from the shape */
    size_t expert_params;        /* floats of one expert */
    float *router_w, *router_g;  /* (E, C) views into params and grads */
    float *experts_p, *experts_g;/* (owned, expert_params) views: per expert fc_w (H, C),
                                    fc_b (H), fcproj_w (C, H), fcproj_b (C) */
    float *bias;                 /* (E) selection bias of the sigmoid router */
    int64_t *tokens, *dropped;   /* (E) the last finished step's token-expert pairs routed
                                    to each expert and dropped by its capacity, summed
                                    over the data-parallel replicas */
    double aux, z;               /* the last finished step's balancing-loss values, summed
                                    over its forwards and the replicas */
    int64_t *step_tokens, *step_dropped; /* (E) this rank's since the step began */
    double step_aux, step_z;     /* this rank's balancing-loss values (aux, z-loss) summed
                                    over its forwards since the step began */
    int *order;                  /* (E) the placement over the expert-parallel group:
                                    position i holds expert order[i], rank i / (E / ep);
                                    this rank's slot j holds order[shard_first + j]
                                    (the identity unless moe.placement moved experts) */
    const struct moe_exchange *exchange; /* the experts phase's runner, or NULL: local */
    int *copies;                 /* (E) copies of each expert its group holds beside the
                                    expert's own (moe.replicas_max; 0 without) */
    double rows_taken;           /* rows this rank's experts took in the forwards since
                                    the last read (expert parallelism's load) */
};
/* The block's MoE state, or NULL (a dense block). */
struct block_moe *block_moe_of(const struct block *blk);
/* The expert held in slot j (0 .. owned - 1) of the block's slab. */
int moe_held_expert(const struct block_moe *moe, int j);

/* Held expert e's parameters in blk's slab (expert_params floats). */
const float *moe_expert_weights(const struct block *blk, int e);
/* An expert of blk with parameters w (its slab's, or a copy of them) over
 * n rows: h, a (n, H) its pre-activations and GELU (kept for the
 * backward), y (n, C). The same bits row for row whatever the other rows. */
void moe_expert_forward(const struct block *blk, const float *w, const float *x, int n, float *h,
                        float *a, float *y);
/* Its backward over the same n rows: dx (n, C) overwritten, dh (n, H)
 * scratch; the expert's parameter gradients (expert_params floats, laid
 * out as in the slab) accumulate into grads unless it is NULL. */
void moe_expert_backward(const struct block *blk, const float *w, float *grads, const float *dy,
                         const float *x, const float *h, const float *a, int n, float *dh,
                         float *dx);

/* The balancing losses (aux + z-loss, as added to the training loss) of
 * this rank's forwards since the step began, summed over its MoE blocks. */
double gpt_moe_balance_loss(const struct gpt *model);
/* One block's bias update from the step's routed pairs per expert
 * (tokens, E values summed over the replicas): b_i += bias_rate x
 * sign(mean - tokens_i). No-op unless the block routes with the sigmoid
 * router and bias_rate > 0. */
void block_moe_update_bias(struct block *blk, const double *tokens);

/* What routing decided for the tokens of an MoE block's last forward (for
 * tests and tools): per token t and slot j < k (best first) the chosen
 * expert choice[t k + j], its gate weight gate[t k + j] (the chosen score
 * for k = 1, renormalised over the chosen experts for k >= 2; a dropped
 * pair keeps its gate but contributes nothing) and row[t k + j], the
 * pair's row among the expert inputs grouped by expert (-1: dropped by the
 * expert's capacity); offset[e] .. offset[e + 1] are expert e's rows; the
 * router's scores (N, E) (softmax probabilities or sigmoid scores, before
 * the bias), and the micro-batch's aux and z-loss values. Arrays belong to
 * acts and stay valid until its next forward. */
struct moe_routing {
    int N, E, k, capacity;      /* capacity 0: dropless */
    const int *choice;
    const float *gate;
    const int *row;
    const int *offset;          /* (E + 1) */
    const float *scores;
    float aux, z;
};
void moe_routing_of(struct block_acts *acts, struct moe_routing *routing);
/* What an MoE block's forward adds to its block_acts. */
size_t moe_acts_bytes(const struct gpt_shape *shape, int B, int T);

#endif
