/* Mixture of depths (src/dyn/mod.c; docs/mod-hash.md): its parameters in
 * a model's shape, its blocks, and the parts of its block extension that
 * tests call directly. Private to src/dyn and tests.
 *
 * A MoD block computes only its chosen tokens: those of all sequences are
 * packed, each sequence's in ascending position, into one dense (tokens,
 * C) batch, run through the block's ops (attention per sequence, among its
 * own chosen tokens: block_forward_packed), and leave as x + r (f(x) - x)
 * with the router r = w . x; every other token passes through bit for
 * bit. Its router router_w (C) and, with causal routing, its predictor MLP
 * (pred_w1 (H, C), pred_b1 (H), pred_w2 (H), pred_b2 (1);
 * dynmo/mod_predictor.h) are the block's extension floats, after the dense
 * tensors, so they migrate, reduce, update and checkpoint with it. The
 * pack header says so (MOD_PACK_FLAG; no dynamic state follows). */
#ifndef DYNMO_DYN_MOD_H
#define DYNMO_DYN_MOD_H

#include "dynmo/block_ext.h"
#include "dynmo/model.h"

enum { MOD_ROUTING_TOPK = 0, MOD_ROUTING_CAUSAL = 1 };
#define MOD_PACK_FLAG (UINT64_C(1) << 11)

/* Its parameters in a shape (gpt_shape.ext). */
struct mod_params {
    int every;              /* block l is a MoD block when (l + 1) % every == 0 */
    int routing;            /* MOD_ROUTING_*: top-k over the sequence, or the causal predictor */
    double capacity;        /* fraction of a sequence's tokens the top-k choice takes, (0, 1] */
    int predictor_hidden;   /* causal routing: the predictor MLP's hidden width (>= 1); 0
                               with top-k routing */
    int zero;               /* 0 */
};
extern const struct gpt_ext_ops mod_ext_ops;
/* The shape's mixture of depths, or NULL (none). */
const struct mod_params *mod_params_of(const struct gpt_shape *shape);
/* Adds mixture of depths (every > 0) to shape. */
void mod_shape_add(struct gpt_shape *shape, const struct mod_params *params);

int gpt_block_is_mod(const struct gpt_shape *shape, int index);
int gpt_mod_block_count(const struct gpt_shape *shape);
/* Floats a MoD block adds to a dense block's: C (top-k) or C +
 * mod_predictor_params(C, H) (causal); 0 for any other block. */
size_t mod_extra_param_count(const struct gpt_shape *shape, int index);
/* k = ceil(capacity x T), at least 1 and at most T. */
int mod_capacity_tokens(double capacity, int T);

/* A MoD block's state beside its slab. */
struct block_mod {
    int C;
    int routing;                 /* MOD_ROUTING_* */
    double capacity;
    int hidden;                  /* the predictor's hidden width H; 0 with top-k */
    float *router_w, *router_g;  /* (C) views into params and grads */
    float *pred_w, *pred_g;      /* (mod_predictor_params(C, H)) views of the predictor's
                                    weight, or NULL with top-k routing */
    double tokens;               /* tokens its forwards processed since the owner
                                    last zeroed it (the run log's /mod/tokens) */
    double bce;                  /* the predictor's BCE summed over its forwards
                                    likewise (causal routing) */
    long bce_forwards;           /* the forwards summed into bce */
    const int *forced;           /* tests: the choice to use instead of routing, or NULL */
};
/* The block's MoD state, or NULL (not a MoD block). */
struct block_mod *block_mod_of(const struct block *blk);
/* Tests: the next forwards of blk use chosen (B*T, 0/1) as their choice
 * instead of routing (the router still scales), until called with NULL. */
void block_mod_force_choice(struct block *blk, const int *chosen);

/* What a MoD block's forward keeps for its backward. */
struct mod_acts {
    int B, T, C;             /* the allocation's */
    int kmax;                /* the last forward's longest sequence choice */
    long tokens;             /* tokens the last forward processed */
    int *count;              /* (B) chosen tokens per sequence */
    int *pos;                /* (B, T) chosen positions, ascending, count[b] valid */
    int *chosen;             /* (B*T) 0/1 */
    int *target;             /* (B*T) 0/1 the top-k choice (the predictor's target) */
    float *router;           /* (B*T) r */
    int *rows;               /* (tokens) the block row of each packed row */
    float *gathered_in;      /* (tokens, C) the packed chosen rows */
    float *gathered_out;     /* (tokens, C) f(x) of the packed rows */
    /* chosen, target, router, rows and the gathered rows are the
     * backend's memory; count and pos the host's. On a device the choice
     * comes down and the packed rows' list goes up through these staging
     * buffers (NULL on the CPU, which works in place), (B*T) each. */
    int *chosen_host;
    int *rows_host;
    float *work;             /* (2 B*T*C) backward work on a device (the CPU's is static) */
};
void mod_acts_alloc(struct mod_acts *m, int B, int T, int C);
void mod_acts_free(struct mod_acts *m);
/* A block's MoD activations (made by its first forward), or NULL. */
struct mod_acts *block_mod_acts(struct block_acts *acts);

/* out (B,T,C) from in for the tokens chosen (B*T, 0/1) and the router
 * weight (C). acts is the block's, allocated for at least (B, T). out may
 * be in. */
void mod_block_forward(struct block *blk, struct block_acts *acts, struct mod_acts *m,
                       float *out, const float *in, const float *router_weight,
                       const int *chosen, int B, int T);
/* din (overwritten; may alias dout) and the router weight's gradient
 * (accumulated; NULL: none) from dout; block gradients accumulated as
 * block_backward. work: (B*T*C) floats. */
void mod_block_backward(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                        struct mod_acts *m, float *din, float *drouter_weight,
                        const float *dout, const float *router_weight, int B, int T,
                        float *work);

#endif
