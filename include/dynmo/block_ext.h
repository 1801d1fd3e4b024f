/* dynmo block_ext: the model's extension interface, what a dynamic scheme
 * (src/dyn) implements to change the transformer blocks, and the model's
 * helpers such a scheme builds on. Part of the model module.
 *
 * The model knows no scheme by name. Whoever builds the model describes
 * the schemes in its shape (struct gpt_shape.ext: each extension's ops and
 * its parameters by value, dyn_shape_from_config) and every block of a
 * layer an extension owns gets that extension's state beside the slab.
 * An extension may:
 *   - add floats to an owned block's slab (after the dense tensors, or
 *     after the shared ones when it replaces the MLP), which then migrate,
 *     reduce, update and checkpoint with the block, and say which of them
 *     are tensors (weight decay) and how they start;
 *   - keep a state beside the slab that travels in the block's pack
 *     (its flag bit in the pack header, its bytes after the pruning
 *     state's; docs/block-slab.md);
 *   - run around the block at four hook points: the whole block, its
 *     attention core (over the (B, T) batch, or over packed sequences of
 *     different lengths), its MLP half, and once a step (values the
 *     caller sums over the data-parallel replicas).
 * A hook left NULL is the dense block's own. The model never calls MPI;
 * an extension that needs the caller at run time (expert parallelism's
 * exchange) gets a pointer the caller hands the model (gpt_ext_runtime). */
#ifndef DYNMO_BLOCK_EXT_H
#define DYNMO_BLOCK_EXT_H

#include <stddef.h>
#include <stdint.h>
#include "dynmo/model.h"

struct gpt_ext_ops {
    const char *name;          /* the scheme's name ("mod"): messages */
    const char *block_noun;    /* what an owned block is in messages ("a mixture of depths") */
    const char *owned_text;    /* "the model's layer N ..." when it owns it ("is one") */
    const char *not_owned_text;/* ... and when not ("is not") */
    uint64_t pack_flag;        /* the pack header's flag of an owned block; 0: none */
    int replaces_mlp;          /* an owned block has no dense MLP (fc_w .. fcproj_b) */
    int never_pruned;          /* an owned block never carries a pruning mask */

    /* Whether layer `index` is one of its blocks: the one rule. */
    int (*owns)(const struct gpt_ext *ext, const struct gpt_shape *shape, int index);
    /* Floats an owned block adds to its slab (after the dense or the shared
     * tensors); NULL: none. */
    size_t (*floats)(const struct gpt_ext *ext, const struct gpt_shape *shape, int index);
    /* The state of an owned block, made with its slab: params and grads
     * point at the extension's floats in it. NULL alloc: no state. */
    void *(*alloc)(const struct gpt_ext *ext, const struct gpt_shape *shape, struct block *blk,
                   float *params, float *grads);
    void (*free)(void *state);
    /* Its floats' initial values into params (the host's copy of them, the
     * dense tensors drawn already), from (seed, layer) alone. */
    void (*init_weights)(void *state, const struct block *blk, const struct gpt_shape *shape,
                         float *params, uint64_t seed);
    /* Its tensors, after the dense ones in block_tensor_at's numbering:
     * offset from the start of its floats, size, and whether it takes
     * weight decay. */
    int (*tensor_count)(const void *state);
    int (*tensor_at)(const void *state, int k, size_t *offset, size_t *size);

    /* Its part of the pack (NULL: none): bytes, written, and read back
     * after the parameters are in place (0, or -1 with a message). */
    size_t (*pack_bytes)(const void *state);
    void (*pack)(const void *state, unsigned char *out);
    int (*unpack)(void *state, const struct block *blk, const unsigned char *in, size_t bytes,
                  char *err, size_t errsize);

    /* Hooks (NULL: the dense block's). block_forward / backward replace the
     * whole block (block_forward's and block_backward's contracts).
     * attention_forward / backward replace the attention core: atty from
     * qkv (acts), over the (B, T) batch when start is NULL, else over B
     * sequences packed one after the other, sequence b rows start[b] ..
     * start[b + 1] (block_forward_packed); the backward writes dqkv from
     * datty. mlp_forward writes out = res1 + MLP(ln2) (acts->ln2,
     * acts->res1) over N rows; mlp_backward writes d_ln2 (overwritten)
     * from dout, accumulating its gradients unless the block is frozen. */
    void (*block_forward)(struct block *blk, void *state, struct block_acts *acts, float *out,
                          const float *in, int B, int T);
    void (*block_backward)(struct block *blk, void *state, struct block_acts *acts,
                           struct block_scratch *scratch, float *din, const float *dout,
                           const float *in, int B, int T);
    void (*attention_forward)(struct block *blk, void *state, struct block_acts *acts,
                              const int *start, int B, int T);
    void (*attention_backward)(struct block *blk, void *state, struct block_acts *acts,
                               float *dqkv, const float *datty, const int *start, int B, int T);
    void (*mlp_forward)(struct block *blk, void *state, struct block_acts *acts, float *out,
                        int N);
    void (*mlp_backward)(struct block *blk, void *state, struct block_acts *acts, float *d_ln2,
                         const float *dout, int N);
    /* Frees what the hooks left in a block_acts (block_ext_acts). */
    void (*acts_free)(void *acts);

    /* Once a step (NULL: nothing): begin_step before the first
     * micro-batch; step_values writes the block's values of the step
     * (returns how many; values NULL: only the count), which the caller
     * sums over the data-parallel replicas and hands to end_step. */
    void (*begin_step)(void *state);
    int (*step_values)(const void *state, double *values);
    void (*end_step)(struct block *blk, void *state, const double *values);

    /* Parameters split over ranks (NULL: every replica holds them all):
     * replicated_floats is how many of the block's first floats every
     * replica holds; shard_units the parts the rest is split into (all of
     * the block's, in the whole model), held_parts how many this block
     * holds and held_part which part its j-th is; grad_sumsq_parts returns
     * the sum of squares of the replicated floats' gradients and writes the
     * held parts' into parts, parts[j] the j-th held part's. */
    size_t (*replicated_floats)(const struct block *blk, const void *state);
    int (*shard_units)(const struct gpt_ext *ext, const struct gpt_shape *shape, int index);
    int (*held_parts)(const void *state);
    int (*held_part)(const void *state, int j);
    double (*grad_sumsq_parts)(const struct block *blk, const void *state, double *parts);
    /* The caller's run-time helper (gpt_ext_set_runtime), or NULL. */
    void (*set_runtime)(void *state, const void *runtime);
};

/* Whether blocks with this extension split into the two units of
 * balance.units = sublayer: it computes inside the attention only (its
 * attention hooks) and adds no floats, pack state, step values, shards
 * or forward of its own (hash attention does; MoE and MoD do not). */
int gpt_ext_fits_units(const struct gpt_ext_ops *ops);
/* Whether blocks with this extension split with the extension wholly in
 * the MLP unit: it replaces the MLP (its floats end the slab, in the MLP
 * unit's range; its state is kept where the MLP runs) and has no forward,
 * backward or attention of its own (MoE does). */
int gpt_ext_fits_mlp_unit(const struct gpt_ext_ops *ops);

/* The extension of shape with these ops, or NULL. */
const struct gpt_ext *gpt_shape_ext(const struct gpt_shape *shape, const struct gpt_ext_ops *ops);
/* Its parameters (what gpt_shape_add_ext copied), or NULL. */
const void *gpt_shape_ext_params(const struct gpt_shape *shape, const struct gpt_ext_ops *ops);
/* Adds an extension (its ops, parameters copied, params_bytes <=
 * GPT_EXT_PARAM_BYTES) to shape, after those it has. */
struct gpt_ext *gpt_shape_add_ext(struct gpt_shape *shape, const struct gpt_ext_ops *ops,
                                  const void *params, size_t params_bytes);
/* Whether layer index is a block of ext. */
int gpt_ext_owns(const struct gpt_ext *ext, const struct gpt_shape *shape, int index);
/* The blocks of ext in the model, and the ordinal of layer `index` among
 * them in layer order (-1: not one). These three take a NULL ext (a model
 * without the extension, gpt_shape_ext's NULL): no blocks. */
int gpt_ext_block_count(const struct gpt_ext *ext, const struct gpt_shape *shape);
int gpt_ext_ordinal(const struct gpt_ext *ext, const struct gpt_shape *shape, int index);

/* A block's state of the extension with these ops, or NULL (not one of
 * its blocks). */
void *block_ext_state(const struct block *blk, const struct gpt_ext_ops *ops);
/* Where the extension keeps its activations in acts (NULL until it puts
 * something there; block_acts_free frees it with ops->acts_free). */
void **block_ext_acts(struct block_acts *acts, const struct gpt_ext_ops *ops);
/* Hands every block of the model's extension `ops`, and every block it
 * later adopts (gpt_replace_blocks), the caller's helper runtime (NULL:
 * none). runtime must outlive the model or be unset first. */
void gpt_ext_set_runtime(struct gpt *model, const struct gpt_ext_ops *ops, const void *runtime);

/* ---- what an extension builds on ---------------------------------------- */

/* The dense block over B sequences of different lengths packed one after
 * the other, sequence b rows start[b] .. start[b + 1] of in and out
 * (start[B] rows, at most the acts' B x T): the row-wise ops once over all
 * rows, the attention core per sequence (an extension's attention hook
 * with start, or causal attention). The backward overwrites din from dout
 * (dout may alias din) and accumulates the gradients unless frozen. For a
 * block without a pruning mask or an MLP of an extension. */
void block_forward_packed(struct block *blk, struct block_acts *acts, float *out,
                          const float *in, const int *start, int B);
void block_backward_packed(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                           float *din, const float *dout, const float *in, const int *start,
                           int B);

/* out[i] = std * dm_normal(seed, stream, first + i) for i in [0, n), in
 * parallel (a block's initial weights). */
void block_init_normal(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t first,
                       float std);

/* Floats that only grow to the largest request (per-process scratch of the
 * ops; one buffer per kind): returns b->data, valid until the next call. */
struct grow_buffer {
    float *data;
    size_t floats;
};
float *grow_buffer_get(struct grow_buffer *b, size_t floats);

#endif
