/* dynmo model: a GPT-2 style decoder on the CPU (fp32), its ops forward and
 * backward, AdamW, and the token dataset and loader.
 *
 * The transformer block is the unit of placement, migration and
 * checkpointing: its parameters, gradients, Adam moments and dynamic state
 * live in one contiguous slab. A struct gpt holds a contiguous range of
 * blocks and, optionally, the embedding (first stage) and the final norm,
 * tied head and loss (last stage); one rank with all of them is the whole
 * model. This module never calls MPI and never looks at a layout. */
#ifndef DYNMO_MODEL_H
#define DYNMO_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "dynmo/core.h"

struct block;
struct gpt_ext_ops;

/* ---- shapes ------------------------------------------------------------ */

/* An extension of the blocks by a dynamic scheme (src/dyn, the model's
 * interface dynmo/block_ext.h): its ops and its parameters by value. */
enum { GPT_EXT_MAX = 4, GPT_EXT_PARAM_BYTES = 64 };
struct gpt_ext {
    const struct gpt_ext_ops *ops;
    _Alignas(8) unsigned char params[GPT_EXT_PARAM_BYTES];
};

/* The model's shape: its dimensions and the extensions of its blocks in
 * the order they apply (ext_count of them; dyn_shape_from_config adds the
 * schemes' that a config runs). */
struct gpt_shape {
    int vocab, max_seq, layers, heads, channels;   /* vocab: the embedding's rows */
    int vocab_used;     /* the tokens the model reads and predicts (model.vocab), 0: all
                           vocab rows. The rows beyond them (model.vocab_pad) are zero and
                           unused: no logit of theirs is computed (gpt_vocab_used) */
    int ext_count;
    struct gpt_ext ext[GPT_EXT_MAX];
};
/* The tokens of a shape's vocabulary (vocab_used, or vocab when 0); the
 * rows beyond them pad the embedding (model.vocab_pad). */
static inline int gpt_vocab_used(const struct gpt_shape *s)
{
    return s->vocab_used > 0 ? s->vocab_used : s->vocab;
}
/* The shape's dimensions as cfg describes them, no extension: vocab is
 * model.vocab rounded up to a multiple of model.vocab_pad. */
struct gpt_shape gpt_shape_from_config(const struct dm_config *cfg);

/* Whether block `index` keeps the dense MLP (no extension of it replaces
 * it), whether any block of the model does not, and the ordinal of block
 * `index` among the blocks that keep it (-1 when it does not: its /mlp
 * row in a checkpoint whose blocks are split). */
int gpt_block_has_mlp(const struct gpt_shape *shape, int index);
int gpt_shape_replaces_mlp(const struct gpt_shape *shape);
int gpt_mlp_ordinal(const struct gpt_shape *shape, int index);
/* Parameters of block `index`: block_param_count(C) for a dense block,
 * the shared tensors and an extension's floats for a block whose MLP an
 * extension replaces, plus the floats extensions add. Blocks differ in
 * size; ask this (or blk->nparams), never assume block_param_count for
 * every block. */
size_t gpt_block_param_count(const struct gpt_shape *shape, int index);
/* Units of placement (balance.units = sublayer): a block's two halves,
 * its attention (ln1_w .. attproj_b: what runs from the block's input to
 * the residual stream after attention) and its MLP (ln2_w onwards, with
 * the extensions' floats), each a unit of its own; BLOCK_HALVES is the
 * whole block. gpt_unit_param_count: the parameters of one half of block
 * `index` (or of the whole block); block_half_matrix_weights: its
 * prunable matrix weights, 4C^2 of the attention, 8C^2 of the MLP. */
enum { BLOCK_HALF_ATTENTION = 1, BLOCK_HALF_MLP = 2, BLOCK_HALVES = 3 };
size_t gpt_unit_param_count(const struct gpt_shape *shape, int index, int half);
size_t block_half_matrix_weights(int C, int half);

/* ---- ops: one function per op and direction ----------------------------
 * Outputs first, then inputs, then sizes. Backward functions ACCUMULATE
 * (+=) into parameter gradients and into input gradients unless noted.
 * All use dm_parallel_for; results do not depend on the thread count.
 * Call them from one thread at a time (dm_parallel_for is not reentrant
 * and the weight-gradient and layernorm partial sums use per-process
 * scratch). */

/* out = inp @ weight^T + bias. weight is (OC, C) as in torch.nn.Linear;
 * bias may be NULL. */
void matmul_forward(float *out,                 /* (N, OC) */
                    const float *inp,           /* (N, C) */
                    const float *weight,        /* (OC, C) */
                    const float *bias,          /* (OC) or NULL */
                    int N, int C, int OC);
/* dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum_n dout.
 * dinp may be NULL (no input gradient wanted), dweight and dbias may be
 * NULL (frozen weights). */
void matmul_backward(float *dinp, float *dweight, float *dbias,
                     const float *dout,         /* (N, OC) */
                     const float *inp,          /* (N, C) */
                     const float *weight,       /* (OC, C) */
                     int N, int C, int OC);
/* The same, except that dinp is overwritten (dinp = dout @ weight). */
void matmul_backward_overwrite(float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp,
                               const float *weight, int N, int C, int OC);

/* Fused forms for the block (one pass over the output less each):
 * out = residual + bias + inp @ weight^T (residual (N, OC); may be out);
 * out = inp @ weight^T + bias and gelu_out = gelu(out);
 * dinp = (dout @ weight) * gelu'(gelu_inp) (overwritten; gelu_inp (N, C)),
 * with dweight, dbias as in matmul_backward. */
void matmul_forward_residual(float *out, const float *inp, const float *weight,
                             const float *bias, const float *residual,
                             int N, int C, int OC);
void matmul_forward_gelu(float *out, float *gelu_out, const float *inp,
                         const float *weight, const float *bias, int N, int C, int OC);
void matmul_backward_gelu(float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight,
                          const float *gelu_inp, int N, int C, int OC);

/* out = (inp - mean) * rstd * weight + bias, eps 1e-5; saves mean, rstd.
 * In backward, dinp may be NULL (only parameter gradients wanted) and
 * dweight, dbias may be NULL (frozen). */
void layernorm_forward(float *out, float *mean, float *rstd,   /* (N,C),(N),(N) */
                       const float *inp, const float *weight, const float *bias,
                       int N, int C);
void layernorm_backward(float *dinp, float *dweight, float *dbias,
                        const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd,
                        int N, int C);

/* Each backward above as its two halves for the zero-bubble schedule
 * (ops_split.c): the input gradient (B, which the previous stage waits
 * for) and the weight gradient (W, which may wait). Each half computes
 * exactly what the whole backward computes for its outputs, bit for bit,
 * so B then W is the whole backward. matmul: dinp = dout @ weight
 * (overwritten); dweight += dout^T @ inp, dbias += sum_n dout (dbias may be
 * NULL). layernorm: dinp += the input gradient; dweight, dbias +=. */
void matmul_backward_input(float *dinp, const float *dout, const float *weight,
                           int N, int C, int OC);
void matmul_backward_weight(float *dweight, float *dbias, const float *dout,
                            const float *inp, int N, int C, int OC);
void layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                              const float *weight, const float *mean, const float *rstd,
                              int N, int C);
void layernorm_backward_weight(float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *mean, const float *rstd,
                               int N, int C);

/* Causal multi-head self-attention core (no projections):
 * qkv (B,T,3C) laid out [q | k | v] per token, heads split along C.
 * att (B,NH,T,T) keeps the softmax probabilities for backward. */
void attention_forward(float *out,              /* (B,T,C) */
                       float *att,              /* (B,NH,T,T) */
                       const float *qkv,        /* (B,T,3C) */
                       int B, int T, int C, int NH);
/* dqkv is overwritten (not accumulated). scratch: (B,NH,T,T) floats. */
void attention_backward(float *dqkv, float *scratch,
                        const float *dout, const float *qkv, const float *att,
                        int B, int T, int C, int NH);

/* GELU, tanh approximation. dinp may be dout (in place). */
void gelu_forward(float *out, const float *inp, long N);
void gelu_backward(float *dinp, const float *inp, const float *dout, long N); /* overwrite */

/* out = a + b; out may be a or b (in place). */
void residual_forward(float *out, const float *a, const float *b, long N);

/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] */
void encoder_forward(float *out, const int *tokens,
                     const float *wte, const float *wpe, int B, int T, int C);
void encoder_backward(float *dwte, float *dwpe, const float *dout,
                      const int *tokens, int B, int T, int C);

/* Fused softmax + cross-entropy over logits (N, V). losses[n] = -log p;
 * dlogits (may alias logits) = (p - onehot) * dloss_scale. */
void crossentropy_forward(float *losses, float *probs,
                          const float *logits, const int *targets, int N, int V);
void crossentropy_softmax_backward(float *dlogits, const float *probs,
                                   const int *targets, float dloss_scale,
                                   int N, int V);

/* ---- the transformer block --------------------------------------------
 * Parameter order inside a block (also the serialisation and checkpoint
 * order), C = channels:
 *   ln1_w (C) ln1_b (C) qkv_w (3C,C) qkv_b (3C) attproj_w (C,C) attproj_b (C)
 *   ln2_w (C) ln2_b (C) fc_w (4C,C) fc_b (4C) fcproj_w (C,4C) fcproj_b (C)
 * 12C^2 + 13C floats. */
enum {
    BP_LN1_W, BP_LN1_B, BP_QKV_W, BP_QKV_B, BP_ATTPROJ_W, BP_ATTPROJ_B,
    BP_LN2_W, BP_LN2_B, BP_FC_W, BP_FC_B, BP_FCPROJ_W, BP_FCPROJ_B,
    BP_COUNT
};
size_t block_param_count(int C);
/* Element offset and size of tensor k (BP_*) inside a block's parameters. */
size_t block_tensor_offset(int C, int k);
size_t block_tensor_size(int C, int k);
/* Whether tensor k is a matrix (receives weight decay). */
int block_tensor_is_matrix(int k);
/* The tensors of one block in parameter order: how many, and tensor k's
 * element offset and size; returns whether it is a matrix (weight decay).
 * A dense block's are the BP_* tensors; a block whose MLP an extension
 * replaces has the eight before fc_w (BP_FC_W of them); each extension's
 * tensors follow (dynmo/block_ext.h). */
int block_tensor_count(const struct block *blk);
int block_tensor_at(const struct block *blk, int k, size_t *offset, size_t *size);
/* Random stream of tensor k of layer `index`: ((index + 1) << 8) | k.
 * The embeddings use GPT_STREAM_WTE and GPT_STREAM_WPE (below 256, so
 * they never collide with a block's). */
uint64_t block_tensor_stream(int index, int k);
enum { GPT_STREAM_WTE = 1, GPT_STREAM_WPE = 2 };

/* ---- sparse matrices (src/model/sparse.c) --------------------------------
 * A weight (rows, cols) in compressed sparse rows: the nonzeros of row r
 * are col_idx[row_ptr[r] .. row_ptr[r+1]) with values in the same places.
 * The kernels split their work into fixed tiles of rows (never by thread
 * count), so their results do not depend on the thread count. */
struct csr_matrix {
    int rows, cols, nnz;
    int *row_ptr;       /* (rows + 1) */
    int *col_idx;       /* (nnz), ascending within a row */
    float *values;      /* (nnz) */
};

/* out = inp @ W^T + bias with W in CSR (OC rows, C columns); bias may be
 * NULL. Same contract as matmul_forward. */
void sparse_matmul_forward(float *out,               /* (N, OC) */
                           const float *inp,         /* (N, C) */
                           const struct csr_matrix *weight,
                           const float *bias,        /* (OC) or NULL */
                           int N, int C, int OC);
/* dinp = dout @ W (overwritten; may be NULL); dweight, the DENSE (OC, C)
 * gradient, += dout^T @ inp only at W's nonzeros (a sampled dense-dense
 * product: every other entry is left untouched); dbias += sum_n dout.
 * dweight and dbias may be NULL. */
void sparse_matmul_backward(float *dinp, float *dweight, float *dbias,
                            const float *dout,       /* (N, OC) */
                            const float *inp,        /* (N, C) */
                            const struct csr_matrix *weight,
                            int N, int C, int OC);

/* ---- pruning state of a block (dyn.kind=prune; docs/block-slab.md) -------
 * The prunable weights of a block are its four matrices qkv_w, attproj_w,
 * fc_w, fcproj_w (12C^2 weights, "matrix weights" below, in that order);
 * layernorms and biases are never pruned. Slot m of the four is tensor
 * block_matrix_tensor(m). */
enum { BLOCK_MATRICES = 4 };
int block_matrix_tensor(int m);
size_t block_matrix_weights(int C);      /* 12 C^2 */

/* Flags of the pack header (docs/block-slab.md). */
#define BLOCK_FLAG_MASKED (UINT64_C(1) << 8)  /* a prune mask follows v */
#define BLOCK_FLAG_CSR    (UINT64_C(1) << 9)  /* CSR indices follow the mask */

struct block_sparse {
    unsigned char *mask;     /* (12C^2) 1 kept, 0 pruned, matrix-weight order */
    long kept;               /* ones in mask */
    long kept_attention;     /* of them, the attention half's (qkv_w, attproj_w) */
    int use_csr;             /* matrices multiplied in CSR (csr[] valid) */
    struct csr_matrix csr[BLOCK_MATRICES];  /* values refreshed by block_forward */
    /* On a device whose memory the host cannot read (on_device; all NULL
     * on the CPU): csr[]'s arrays in the backend's memory, each value's
     * position in its matrix (r cols + col_idx, for the refresh: a gather
     * from params), and the pruned weights' offsets in the slab's
     * gradients with as many zeros (gpt_mask_pruned_grads: a scatter). */
    int on_device;
    struct csr_matrix csr_device[BLOCK_MATRICES];
    int *value_at[BLOCK_MATRICES];   /* (nnz) */
    int *pruned;                     /* (12C^2 - kept) */
    float *zeros;                    /* (12C^2 - kept) */
};

/* One block: a single slab holds [params | grads | adam m | adam v];
 * dynamic state lives beside it (sparse: NULL until the block is pruned;
 * the extensions' states) and travels in its pack. For a block whose MLP
 * an extension replaces p[k] and g[k] are set for the eight shared
 * tensors only (k < BP_FC_W); the rest are the extension's views. */
struct block {
    int index;          /* global layer index, 0..layers-1 */
    int C, NH;
    size_t nparams;
    float *slab;        /* owns everything below */
    size_t slab_floats;
    float *params;      /* (nparams) */
    float *grads;       /* (nparams) */
    float *m, *v;       /* (nparams) each */
    float *p[BP_COUNT]; /* views into params */
    float *g[BP_COUNT]; /* views into grads */
    struct block_sparse *sparse;   /* pruning state, or NULL */
    /* The extensions that own this layer (dynmo/block_ext.h), in the
     * shape's order, each with its state beside the slab (NULL: none) and
     * where its floats start in the slab. */
    int ext_count;
    struct block_ext_slot {
        const struct gpt_ext_ops *ops;
        void *state;
        size_t offset;
    } ext[GPT_EXT_MAX];
    int halves;         /* balance.units = sublayer: BLOCK_HALF_ATTENTION or
                           BLOCK_HALF_MLP when only that half of the block is this
                           stage's (it computes, updates and sums only that half;
                           the other half's parameters are another stage's);
                           BLOCK_HALVES: the whole block of a sublayer run, run
                           as its two halves so that each is timed
                           (gpt_forward); 0: the whole block */
    int frozen;         /* layer freezing (pack flag BLOCK_FLAG_FROZEN): no
                           weight gradients and no optimizer update; its
                           gradients stay zero (whoever sets the flag on a
                           live block zeroes them), so the step's end skips
                           them */
};
#define BLOCK_FLAG_FROZEN (UINT64_C(1) << 0)   /* the block is frozen */

/* Allocates block `index` and initialises its weights from (seed, index)
 * alone: N(0, 0.02) for matrices, 0.02/sqrt(2*layers) for the two residual
 * projections, ones/zeros for layernorms, zero biases. Element i of tensor
 * k is std * dm_normal(seed, block_tensor_stream(index, k), i). Gradients
 * and moments start at zero. Uses dm_parallel_for. */
void block_init(struct block *blk, int index, const struct gpt_shape *shape,
                uint64_t seed);
/* The weights part of block_init, on a block whose slab is still all
 * zero (gpt_init_weights). */
void block_init_weights(struct block *blk, const struct gpt_shape *shape, uint64_t seed);
void block_free(struct block *blk);
/* A block whose slab pointers (slab, params, grads, m, v, p[], g[]) point
 * at host memory holding blk's slab, for code that reads or writes it
 * wholesale (checkpoints): *blk itself when staging is NULL (the backend's
 * memory is the host's: backend_staging), else staging (slab_floats
 * floats), filled by a copy down when fetch is set. Everything else is
 * blk's, shared: the view owns nothing. block_host_view_store copies the
 * view's slab up into blk (nothing when they are the same memory). */
struct block block_host_view(const struct block *blk, float *staging, int fetch);
void block_host_view_store(struct block *blk, const struct block *view);

/* Prunes the block: keep (12C^2 bytes, matrix-weight order, 1 = keep)
 * becomes its mask; params, gradients and Adam moments of pruned weights
 * are set to exactly zero. The matrices go to CSR when the block's
 * sparsity is at least csr_sparsity (> 1: never), else they stay dense
 * and gpt_mask_pruned_grads masks their gradients. keep may be NULL: the
 * mask is then rebuilt from the weights that are exactly zero (after a
 * checkpoint load, which saves pruned weights as zeros). */
void block_prune(struct block *blk, const unsigned char *keep, double csr_sparsity);
/* Prunes the block by the cut of src/dyn/prune.c: its mask becomes key >
 * cut for every matrix weight (block_prune_key, global index layer x 12
 * C^2 + the place in matrix-weight order), and the rest as block_prune,
 * with the table's prune_mask where the slab lives: on a device only the
 * mask comes down. mask_device is the backend's memory of 12 C^2 bytes
 * (scratch, overwritten). */
void block_prune_cut(struct block *blk, uint64_t cut, unsigned char *mask_device,
                     double csr_sparsity);
/* The total order that decides which weights survive: a larger key is
 * kept first; magnitude first (the bits of |w|), then the lower global
 * index (0xffffffff minus it below). */
uint64_t block_prune_key(float weight, uint32_t global_index);
/* Fraction of the matrix weights that are pruned (0 without a mask). */
double block_matrix_sparsity(const struct block *blk);
/* Units of placement (balance.units = sublayer): matrix slot m belongs to
 * the attention half (qkv_w, attproj_w) or the MLP half (fc_w, fcproj_w);
 * block_owns_matrix: whether blk computes slot m (every slot of a block
 * held whole). block_half_mask_range: where a half's matrices sit in the
 * mask (matrix-weight order: the attention's 4 C^2, then the MLP's 8 C^2).
 * block_prune_join_mask: the other half's part of the mask, as the stage
 * of that half pruned it, copied into blk's (which then holds the whole
 * block's mask, as a block held whole does: the kept count, the CSR
 * decision at csr_sparsity and the pack follow); blk must be pruned. */
int block_matrix_half(int m);
/* The pruned share of a half's matrix weights (BLOCK_HALVES: the
 * block's, as block_matrix_sparsity): a unit's sparsity in the profile. */
double block_half_sparsity(const struct block *blk, int half);
int block_owns_matrix(const struct block *blk, int m);
void block_half_mask_range(int C, int half, size_t *offset, size_t *count);
void block_prune_join_mask(struct block *blk, int half, const unsigned char *part,
                           double csr_sparsity);

/* Serialisation of one block for migration and checkpoints (docs/block-slab.md):
 * a 64-byte header (magic "DMBLOCK1", layer index, C, NH, nparams, flags,
 * payload size, checksum) then params, m, v, dynamic state. Gradients are
 * not packed (they are zero at a step boundary). block_pack_size tells the
 * bytes; block_pack writes exactly that many into buf.
 * block_unpack checks the header and the checksum against the expected
 * shape and returns 0, or -1 with a message in err (nothing changed) when
 * they do not match. blk is either zeroed (struct block blk = {0}), and
 * is then allocated as the layer the header names, or an allocated block
 * of that same layer, whose params and moments are replaced. Gradients
 * are zeroed. */
size_t block_pack_size(const struct block *blk);
void block_pack(const struct block *blk, void *buf);
int block_unpack(struct block *blk, const void *buf, size_t bytes,
                 const struct gpt_shape *shape, char *err, size_t errsize);

/* Live migration without copies: block_pack_meta writes the header and the
 * dynamic state (block_meta_size bytes); the parameters (nparams floats at
 * blk->params) and the Adam moments (2 * nparams floats at blk->m, v
 * follows m in the slab) travel straight between slabs.
 * block_unpack_meta_begin validates the header as block_unpack does and
 * allocates the slab (zero gradients) so the caller can receive into
 * params and m; block_unpack_meta_end then applies the dynamic state
 * (masks, CSR), which needs the parameters. Both return 0 or -1 with err.
 * block_prepare_receive allocates block `index`'s slab beforehand (params
 * and moments unset, gradients zero), for a receiver that takes the whole
 * block as one message; block_unpack_meta_begin then only validates. */
void block_prepare_receive(struct block *blk, int index, const struct gpt_shape *shape);
size_t block_meta_size(const struct block *blk);
void block_pack_meta(const struct block *blk, void *buf);
int block_unpack_meta_begin(struct block *blk, const void *buf, size_t bytes,
                            const struct gpt_shape *shape, char *err, size_t errsize);
int block_unpack_meta_end(struct block *blk, const void *buf, size_t bytes, char *err,
                          size_t errsize);

/* Activations of one block for one micro-batch in flight. */
struct block_acts {
    int B, T;
    float *mem;         /* owns everything below */
    float *ln1;         /* (B,T,C) */
    float *ln1_mean, *ln1_rstd;   /* (B,T) */
    float *qkv;         /* (B,T,3C) */
    float *atty;        /* (B,T,C) attention output before projection */
    float *att;         /* (B,NH,T,T) softmax probabilities */
    float *res1;        /* (B,T,C) residual after attention */
    float *ln2;         /* (B,T,C) */
    float *ln2_mean, *ln2_rstd;   /* (B,T) */
    float *fch;         /* (B,T,4C) */
    float *fch_gelu;    /* (B,T,4C) */
    /* What the extensions' hooks keep for the backward (block_ext_acts),
     * made by their first forward, freed with these acts. */
    struct {
        const struct gpt_ext_ops *ops;
        void *acts;
    } ext[GPT_EXT_MAX];
    long step;          /* the optimizer step being run (gpt_forward sets it from
                           gpt.step): what an extension's draws may depend on */
    float loss_scale;   /* MoE: the scale of the balancing losses' gradient in
                           block_backward (gpt_backward sets its dloss_scale;
                           block_acts_alloc sets 1) */
};
void block_acts_alloc(struct block_acts *acts, int B, int T, int C, int NH);
void block_acts_free(struct block_acts *acts);
size_t block_acts_bytes(int B, int T, int C, int NH);
/* Scratch shared by all blocks of a rank during backward; sized for the
 * largest micro-batch. */
struct block_scratch {
    float *mem;
    float *d_res1, *d_ln, *d_qkv, *d_atty, *d_fch, *d_att; /* see block.c */
    float *d_resid;     /* (B,T,C): gradient between blocks in gpt_backward */
};
void block_scratch_alloc(struct block_scratch *s, int B, int T, int C, int NH);
void block_scratch_free(struct block_scratch *s);

/* out = block(in). in and out are (B,T,C) and must not alias. */
void block_forward(struct block *blk, struct block_acts *acts,
                   float *out, const float *in, int B, int T);
/* Given dout, accumulates parameter gradients into blk->grads and writes
 * din (overwritten; may be NULL for the first block when not needed).
 * din may alias dout (not in). Uses all of scratch except d_resid. */
void block_backward(struct block *blk, struct block_acts *acts,
                    struct block_scratch *scratch, float *din,
                    const float *dout, const float *in, int B, int T);

/* One half of a block (balance.units = sublayer; struct block.halves).
 * With blk->halves set to one half, block_forward computes that half only:
 * the attention half maps the block input to the residual stream after
 * attention (res1), the MLP half maps res1 to the block output; and
 * block_backward the matching gradients (the attention half takes d_res1
 * as dout). The two halves run one after the other give the whole block's
 * outputs, input gradient and parameter gradients bit for bit. Dense
 * or pruned blocks (a pruned half multiplies its own matrices in CSR
 * when the whole block does) and extensions that stay inside the
 * attention (gpt_ext_fits_units; others: an internal error).
 * block_is_half: whether blk holds one half only. block_tensor_half:
 * the half tensor k (block_tensor_at's order) belongs to.
 * block_half_range: the floats of a half in the slab's params (and grads,
 * m, v at the same offsets), BLOCK_HALVES the whole. block_half_grad_sumsq:
 * the sum of squares of a half's gradients (0 for a frozen block), each
 * half summed on its own so that a block's halves on two stages add up to
 * the same bits as on one. */
int block_is_half(const struct block *blk);
int block_tensor_half(const struct block *blk, int k);
void block_half_range(const struct block *blk, int half, size_t *offset, size_t *count);
double block_half_grad_sumsq(const struct block *blk, int half);

/* The block's backward in two parts for the zero-bubble schedule
 * (block_split.c): block_backward_input computes din (as block_backward)
 * and keeps in *w the output gradients that the weight gradients need;
 * block_backward_weight, any time later but before acts, in or w are
 * reused, accumulates the weight gradients from them and from the
 * activations. Run in micro-batch order, the two give block_backward's
 * din and gradients bit for bit. A frozen block has no weight part; a
 * block whose backward an extension or CSR products replace computes it
 * whole in the input part (w->fused). One struct block_wgrad per
 * micro-batch between its two parts, allocated for (B, T, C). */
struct block_wgrad {
    int fused;          /* the input part did everything */
    int mlp_fused;      /* the input part did the MLP's weights too (an extension's
                           MLP, mixture of experts): the weight part is attention's */
    float *mem;         /* owns everything below */
    float *dout;        /* (B,T,C) the block's output gradient */
    float *d_fch;       /* (B,T,4C) of the MLP's hidden layer */
    float *d_ln2;       /* (B,T,C) of ln2's output */
    float *d_res1;      /* (B,T,C) of the residual after attention */
    float *d_qkv;       /* (B,T,3C) */
    float *d_ln1;       /* (B,T,C) of ln1's output */
};
void block_wgrad_alloc(struct block_wgrad *w, int B, int T, int C);
void block_wgrad_free(struct block_wgrad *w);
void block_backward_input(struct block *blk, struct block_acts *acts,
                          struct block_scratch *scratch, struct block_wgrad *w, float *din,
                          const float *dout, const float *in, int B, int T);
void block_backward_weight(struct block *blk, const struct block_acts *acts,
                           const struct block_wgrad *w, const float *in, int B, int T);

/* ---- the model on one rank ---------------------------------------------
 * Embedding parameters: wte (V,C), wpe (max_seq,C).
 * Head parameters: lnf_w (C), lnf_b (C); the LM head is wte (tied).
 * Canonical flat order of all parameters (fixtures, tests, checkpoints):
 *   wte, wpe, block 0 ... block L-1 (block order above), lnf_w, lnf_b. */

struct gpt {
    struct gpt_shape shape;
    int first_block, num_blocks;   /* this rank's contiguous range */
    int has_embed, has_head;
    struct block *blocks;          /* num_blocks of them */
    /* embedding + head parameters in one slab: [wte wpe lnf_w lnf_b] x
     * {params, grads, m, v}, then dwte_head (V,C) if has_head. On a
     * pipeline the first and last stage each hold a copy of wte.
     * The tied gradient: the embedding's share accumulates in dwte, the
     * head's share in dwte_head, over all micro-batches; then
     * gpt_tie_wte_grads forms dwte = embedding share + head share. Keeping
     * the two sums apart until then makes the result the same bits on one
     * rank and on any pipeline layout. */
    float *embed_slab;
    size_t embed_nparams;
    float *wte, *wpe, *lnf_w, *lnf_b;
    float *dwte, *dwpe, *dlnf_w, *dlnf_b;
    float *embed_m, *embed_v;
    float *dwte_head;              /* (V,C) or NULL */
    int wte_grads_pending;         /* backward ran since the last tie */
    /* The profile: seconds each block spent in forward and backward, and in
     * its share of the step's end (gradient norm, masking, optimizer update,
     * zeroing), since the caller last zeroed them (the pipeline engine
     * does, every step). The six arrays of seconds are one allocation
     * that block_fwd_s starts. */
    double *block_fwd_s, *block_bwd_s, *block_update_s;   /* (num_blocks) */
    /* balance.units = sublayer: of block_fwd_s and block_bwd_s, what the
     * block's attention half took (a block held whole, halves
     * BLOCK_HALVES, runs as its two halves, each timed; an attention half
     * alone: all of it; an MLP half alone: none). */
    double *attention_fwd_s, *attention_bwd_s;             /* (num_blocks) */
    double *block_wgrad_s;   /* (num_blocks) zb: the weight parts' share of block_bwd_s */
    double *attention_wgrad_s;   /* (num_blocks) zb with halves: the attention half's
                                    share of block_wgrad_s (and of attention_bwd_s) */
    /* Layer freezing: blocks [0, frozen_prefix) (global indices), and the
     * embedding when frozen_prefix > 0, are frozen with everything before
     * them: their backward is skipped entirely. A frozen block outside the
     * prefix still passes the input gradient back, without weight
     * gradients. Set by the freeze scheme (src/dyn/freeze.c). */
    int frozen_prefix;
    /* Early exit (src/model/exit.c), or NULL: owned by the early-exit scheme. */
    struct gpt_exit *exit;
    /* The caller's run-time helpers of extensions (gpt_ext_set_runtime):
     * each extension's, handed to its blocks and to those the model adopts. */
    struct {
        const struct gpt_ext_ops *ops;
        const void *runtime;
    } ext_runtime[GPT_EXT_MAX];
    /* The optimizer step being run (0 until the caller sets it): an
     * extension's draws may depend on it (block_acts.step). */
    long step;
};

/* Builds blocks [first_block, first_block+num_blocks) and, if asked, the
 * embedding and head, all initialised from seed alone. */
void gpt_build(struct gpt *model, const struct gpt_shape *shape,
               int first_block, int num_blocks, int has_embed, int has_head,
               uint64_t seed);
/* gpt_build in two parts, for a resume: the model with every parameter,
 * gradient and moment zero, and later, only if no checkpoint filled it,
 * the initialisation gpt_build would have done (the same bits). */
void gpt_build_deferred(struct gpt *model, const struct gpt_shape *shape, int first_block,
                        int num_blocks, int has_embed, int has_head);
void gpt_init_weights(struct gpt *model, uint64_t seed);
void gpt_free(struct gpt *model);
/* The embedding slab's params, grads, m and v ([wte wpe lnf_w lnf_b] each,
 * 4 embed_nparams floats) where the host can reach them: model->embed_slab
 * when staging is NULL, else staging filled by a copy down when fetch is
 * set; gpt_embed_host_store copies them back up (as block_host_view). */
float *gpt_embed_host_view(const struct gpt *model, float *staging, int fetch);
void gpt_embed_host_store(struct gpt *model, const float *view);
/* One host buffer (backend_staging) that holds any one of the model's
 * slabs, its largest block's or the embedding's, for a pass that moves
 * them one after another through block_host_view and gpt_embed_host_view
 * (a checkpoint's save or load): NULL where the host reaches the backend's
 * memory. The caller frees it with backend_staging_free. */
float *gpt_host_staging(const struct gpt *model);

/* Replaces the block range of a model (live migration): the model takes
 * ownership of `blocks` (count of them, first global index `first`); the
 * caller has already freed or moved the old blocks' slabs. The profile
 * arrays are resized and zeroed. */
void gpt_replace_blocks(struct gpt *model, struct block *blocks, int first, int count);
size_t gpt_param_count(const struct gpt_shape *shape);  /* whole model */

/* Copies the whole model's parameters (or gradients) to/from the canonical
 * flat order. Only for a model that holds everything (one rank). */
void gpt_params_to_flat(const struct gpt *model, float *flat);
void gpt_params_from_flat(struct gpt *model, const float *flat);
void gpt_grads_to_flat(const struct gpt *model, float *flat);

/* Activations for one micro-batch on this rank: per-block acts plus the
 * embedding output, the final norm and the logits. */
struct gpt_acts {
    int B, T;
    int num_blocks;                /* the model's, when allocated */
    int capacity;                  /* block_acts allocated (>= num_blocks): a stage
                                      that shrinks keeps its spare buffers */
    struct block_acts *blocks;     /* capacity */
    float *residual;               /* (num_blocks+1, B, T, C): input of each block, last = output */
    float *lnf, *lnf_mean, *lnf_rstd;  /* (B,T,C),(B,T),(B,T) */
    float *logits;                 /* (B,T,V); becomes dlogits in backward */
    float *probs;                  /* (B,T,V) */
    float *losses;                 /* (B,T) */
    int *tokens, *targets;         /* (B,T) */
    /* Host staging (backend.h's backend_staging; NULL on a backend the host
     * reads itself): the inputs the loader fills, the losses read back. */
    int *tokens_host, *targets_host;   /* (B,T) */
    float *losses_host;                /* (B,T) */
    struct exit_acts *exit;        /* early-exit state (src/model/exit.c), or NULL */
};
void gpt_acts_alloc(struct gpt_acts *acts, const struct gpt *model, int B, int T);
void gpt_acts_free(struct gpt_acts *acts);
/* After gpt_replace_blocks: resizes acts to the model's new block count,
 * keeping the per-block activation buffers it already has (they are all
 * the same size; an extension's buffers, block_ext_acts, are sized by its
 * first forward and kept): a shrinking stage keeps its
 * spares, a growing one reuses
 * them and allocates only beyond its largest size so far, so live
 * migration allocates (and zero-fills) almost nothing. Contents are not
 * kept. */
void gpt_acts_resize(struct gpt_acts *acts, const struct gpt *model);
/* Where the host writes a micro-batch's token ids and targets (B T each):
 * acts->tokens and acts->targets themselves when the backend's memory is
 * the host's, else host staging; gpt_acts_inputs_ready then copies them
 * to the device (once per micro-batch). */
void gpt_acts_inputs(struct gpt_acts *acts, int **tokens, int **targets);
void gpt_acts_inputs_ready(struct gpt_acts *acts);

/* Forward of this rank's part. If has_embed, reads tokens; else the input
 * activation must already be in acts->residual[0]. If has_head, targets
 * must be set and the mean loss over B*T is returned; else returns 0 and
 * the output activation is acts->residual[num_blocks]. */
float gpt_forward(struct gpt *model, struct gpt_acts *acts);

/* Backward of this rank's part, accumulating gradients. dloss_scale scales
 * the loss gradient (1/micro_batches for accumulation); each token's loss
 * gradient is dloss_scale / (B*T). If !has_head, the gradient wrt this
 * rank's output is read from dout (B,T,C). If !has_embed, the gradient wrt
 * the input is written to din (B,T,C). With has_head the head's share of
 * the tied wte gradient goes to dwte_head (see gpt_tie_wte_grads), and
 * acts->logits is overwritten with dlogits. */
void gpt_backward(struct gpt *model, struct gpt_acts *acts,
                  struct block_scratch *scratch, float dloss_scale,
                  const float *dout, float *din);
/* The same in the zero-bubble schedule's two parts: gpt_backward_input
 * is gpt_backward with each block's weight gradients left for later
 * (block_backward_input, into wgrads[i], num_blocks of them allocated for
 * (B, T, C)); the head's and the embedding's run whole in it, as does
 * everything under early exit and every block held as halves (balance.units
 * = sublayer: wgrads[i].fused). gpt_backward_weight, before acts or wgrads
 * are reused, accumulates the blocks' weight gradients (block_bwd_s counts
 * both parts, block_wgrad_s this one: 0 for a block without a weight
 * part). In micro-batch order, the two parts give gpt_backward's bits. */
void gpt_backward_input(struct gpt *model, struct gpt_acts *acts,
                        struct block_scratch *scratch, float dloss_scale,
                        const float *dout, float *din, struct block_wgrad *wgrads);
void gpt_backward_weight(struct gpt *model, struct gpt_acts *acts,
                         const struct block_wgrad *wgrads);

/* Completes the tied wte gradient after the last micro-batch's backward
 * and before gpt_grad_sumsq / gpt_adamw_update (which fail on a pending
 * head share). On one rank holding both ends pass other = NULL:
 * dwte += dwte_head. On a pipeline, other is the peer's share (V*C floats):
 * the first stage passes the last stage's dwte_head (dwte += other) and the
 * last stage passes the first stage's dwte (dwte = other + dwte_head); all
 * three give the same bits. No-op for a rank with neither end. */
void gpt_tie_wte_grads(struct gpt *model, const float *other);

/* Adds the profile time (dm_profile_now) since *t to block i's
 * block_update_s (if the model has one: a struct gpt put together by hand
 * may not) and sets *t to now: one clock read per block in a loop over the
 * blocks' end-of-step work. */
void gpt_charge_update(struct gpt *model, int i, double *t);

/* Zeroes every gradient, dwte_head included (a frozen block's are zero
 * already and are skipped). */
void gpt_zero_grads(struct gpt *model);
/* Zeroes the gradients of the pruned weights of every dense pruned block
 * (one pass over its matrix gradients): call once a step, after the last
 * micro-batch's backward and before the gradient norm and the optimizer. */
void gpt_mask_pruned_grads(struct gpt *model);

/* Sum of squares of the gradients this rank holds, as the sum, in this
 * order, of: wte and wpe (only if has_embed: after the tied-gradient
 * exchange the first stage's dwte is the whole one, and the last stage's
 * copy is not counted again), each block's block_grad_sumsq, lnf_w and
 * lnf_b (if has_head). Each term is summed in double in a fixed order, so
 * the result does not depend on the thread count; adding the per-layer
 * terms in the same order reproduces a one-rank run bit for bit. */
double gpt_grad_sumsq(const struct gpt *model);
double block_grad_sumsq(const struct block *blk);   /* 0 when frozen, without reading */
/* A block whose parameters an extension splits over ranks (parallel.ep
 * replicas of a stage hold different parts): gpt_block_shard_units is
 * the parts of layer index's block in the whole model (0: none),
 * block_held_parts how many this rank's block holds and block_held_part
 * which part its j-th is, and block_replicated_floats the floats at the
 * front of the slab that every replica holds (all of them without
 * parts). block_grad_sumsq_parts returns the sum of squares of the
 * replicated floats' gradients and writes the held parts' into parts,
 * parts[j] the j-th held part's; the holders of a stage's parts each
 * contribute their own terms, which the caller adds in part order, so
 * that the sum is the same bits as one rank holding them all. */
int gpt_block_shard_units(const struct gpt_shape *shape, int index);
int block_held_parts(const struct block *blk);
int block_held_part(const struct block *blk, int j);
size_t block_replicated_floats(const struct block *blk);
double block_grad_sumsq_parts(const struct block *blk, double *parts);
/* The wte+wpe term and the lnf term of gpt_grad_sumsq. */
double gpt_embed_grad_sumsq(const struct gpt *model);
double gpt_head_grad_sumsq(const struct gpt *model);

/* ---- once a step: the extensions' values over the replicas --------------
 * gpt_begin_step before a step's first micro-batch; gpt_step_values
 * writes this rank's blocks' step values (block order, each extension's
 * in its order; returns how many; values NULL: the count), which the
 * caller sums over the data-parallel replicas (the model never calls MPI)
 * and hands to gpt_end_step. The same sums on every replica leave the
 * same state everywhere. */
void gpt_begin_step(struct gpt *model);
int gpt_step_values(const struct gpt *model, double *values);
void gpt_end_step(struct gpt *model, const double *values);

/* ---- attention within groups (src/model/group_attention.c) ----------------
 * Causal attention within groups of tokens, per (sequence, head): queries
 * and keys go to nb groups by a rotation R (hs, nb/2) with unit-norm
 * columns, g(x) = argmax([xR ; -xR]); nb = 1 puts every token in group 0
 * (ordinary causal attention). Query i attends to key j when both share a
 * group and j <= i, and always to its own key j = i, so every query has at
 * least one key. The work runs in tiles of the group-sorted order and
 * skips a tile without an allowed pair, forward and backward (the CPU's
 * entries of the op table of the same names). Hash-sparse attention
 * (src/dyn/hash.c) is its user. */

/* out (B,T,C) from qkv (B,T,3C) as attention_forward; saves lse (B,NH,T)
 * (log-sum-exp of each query's allowed scores), group (B,NH,2,T) (query
 * then key group by position) and order (B,NH,2,T) (positions sorted
 * stably by query, then key, group) for the backward. *alone (may be
 * NULL) = the (sequence, head, query) rows with no key of their group at
 * or before them, which attend to their own key alone. rotation may be
 * NULL when groups = 1. Returns the tiles visited. */
long group_attention_forward(float *out, float *lse, int *order, int *group, long *alone,
                             const float *qkv, const float *rotation,
                             int B, int T, int C, int NH, int groups);
/* dqkv (B,T,3C) overwritten with the gradient wrt qkv, given dout (B,T,C)
 * and what the forward saved (out is its output). The grouping is
 * piecewise constant: no gradient flows through it. Returns the tiles
 * visited (the forward's). */
/* The share of causal attention's GROUP_TILE x GROUP_TILE tiles over
 * `tokens` tokens that the op visits when its `groups` groups are even:
 * groups x nt_g (nt_g + 1) / 2 of nt (nt + 1) / 2, nt_g the tiles of a
 * group's tokens / groups (1 for one group). */
double group_attention_even_share(int tokens, int groups);
long group_attention_backward(float *dqkv, const float *dout, const float *qkv,
                              const float *out, const float *lse, const int *order,
                              const int *group, int B, int T, int C, int NH);

/* ---- the ops of token routing by depth (src/model/depth_ops.c) --------------
 * A block that computes only the tokens a router chooses (src/dyn/mod.c):
 * the chosen rows of all sequences packed into one dense (tokens, C)
 * batch, leaving as x + r (f(x) - x) with the router r = w . x; every
 * other token passes through bit for bit. The CPU's entries of the op
 * table of the same names. */

/* router (N) = in (N, C) . weight (C) */
void mod_router_forward(float *router, const float *in, const float *weight, int N, int C);
/* chosen (B*T) = 1 for the k tokens of each sequence with the largest
 * router values (ties: the lower position), else 0. */
void mod_select_topk(int *chosen, const float *router, int B, int T, int k);
/* The causal predictor, a small MLP of hidden width H on each token on its
 * own (dynmo/mod_predictor.h: logit = w2 . relu(W1 x + b1) + b2, weight
 * mod_predictor_params(C, H) floats; the caller passes the block input,
 * and no gradient flows back into it: stop-gradient). chosen (may be NULL)
 * = logit > 0. With target (N, 0/1; the top-k choice) returns the mean
 * binary cross-entropy of sigmoid(logit) against it and, when dweight is
 * not NULL, adds scale times its gradient (each weight's summed over the
 * tokens in order from zero, then scaled) into dweight; without target
 * returns 0. */
float mod_predictor_forward_backward(float *dweight, float scale, int *chosen, const float *in,
                                     const float *weight, const int *target, int N, int C,
                                     int H);
/* The block over the n chosen tokens, packed: packed row j (of
 * gathered_in x and gathered_out f = the block of x, (n, C)) is block row
 * rows[j] (rows distinct). mod_combine_forward: out's row rows[j] = x +
 * r (f - x), r = router[rows[j]]; out's other rows untouched.
 * mod_scale_chosen: work (n, C) row j = r din's row rows[j].
 * mod_combine_backward, per packed row j in order: dr = din's row .
 * (f - x); din's row = (1 - r) din's row + work's row j (the block
 * input's gradient) + dr router_weight; drouter_weight (C; may be NULL)
 * += dr x. */
void mod_combine_forward(float *out, const float *gathered_in, const float *gathered_out,
                         const float *router, const int *rows, int n, int C);
void mod_scale_chosen(float *work, const float *din, const float *router, const int *rows, int n,
                      int C);
void mod_combine_backward(float *din, float *drouter_weight, const float *gathered_in,
                          const float *gathered_out, const float *work, const float *router,
                          const float *router_weight, const int *rows, int n, int C);

/* ---- early exit (src/model/exit.c; policy in src/dyn/early_exit.c) -------
 * A token that exits after block l keeps its hidden state (copied forward
 * to the output); later blocks compute only the remaining tokens, while
 * attention still reads the exited tokens' copied states as keys and
 * values. Exit heads (the shared LM head, read-only) after blocks from..
 * layers-2 add lambda * w_l * L_l to the loss, w_l = (l+1) / sum_{j=from}^{
 * layers-1} (j+1) (CALM's depth-proportional weights). */
enum { GPT_EXIT_SOFTMAX = 0, GPT_EXIT_SATURATION = 1 };
struct gpt_exit {
    int from;                /* first global block with an exit head */
    int allow;               /* tokens may exit (0: exit losses only) */
    int confidence;          /* GPT_EXIT_SOFTMAX or GPT_EXIT_SATURATION */
    float threshold;         /* a token exits when confidence >= threshold */
    float loss_weight;       /* lambda */
    const float *wte, *lnf_w, *lnf_b;   /* the LM head to use: (V,C),(C),(C) */
    const int *forced;       /* tests: (B*T) exit layers fixed in advance (no
                                decisions), or NULL */
    /* Counters, accumulated by every forward until the owner zeroes them. */
    double token_blocks, token_blocks_skipped, exit_loss_sum;
    /* (layers, by global block) tokens that reached block l and tokens it
     * computed, accumulated likewise when the owner gives the arrays; or
     * NULL. */
    double *layer_tokens, *layer_computed;
};

/* The (B*T) exit layers of a micro-batch: exit_layer[n] is the block after
 * which token n left, or layers while active. The first stage resets them
 * in gpt_forward; other stages receive them with the activation. */
int *gpt_exit_layers(const struct gpt *model, struct gpt_acts *acts);

/* block_forward for the `nactive` tokens in rows (ascending indices into
 * B*T; the others are copied from in to out); work: (B*T*C) floats. */
void block_forward_rows(struct block *blk, struct block_acts *acts, float *out,
                        const float *in, int B, int T, const int *rows, int nactive,
                        float *work);
/* Its backward: weight gradients from the active tokens; din gets dout
 * for exited tokens plus, for all, the key/value path. Same aliasing
 * rules as block_backward. */
void block_backward_rows(struct block *blk, struct block_acts *acts,
                         struct block_scratch *scratch, float *din, const float *dout,
                         const float *in, int B, int T, const int *rows, int nactive,
                         float *work);

/* Used by gpt_forward / gpt_backward when model->exit is set. */
void exit_begin_forward(struct gpt *model, struct gpt_acts *acts);
void exit_forward_block(struct gpt *model, struct gpt_acts *acts, int i, float *out,
                        const float *in);
/* w NULL: the whole backward; else the zero-bubble schedule's input part
 * (block_backward_input's contract), whose weight part
 * exit_backward_weight runs later. */
void exit_backward_block(struct gpt *model, struct gpt_acts *acts,
                         struct block_scratch *scratch, int i, float *din,
                         const float *dout, const float *in, float dloss_scale,
                         struct block_wgrad *w);
void exit_backward_weight(struct gpt *model, struct gpt_acts *acts, int i,
                          const struct block_wgrad *w, const float *in);
void exit_acts_free(struct gpt_acts *acts);

/* ---- optimizer ----------------------------------------------------------- */

/* Learning rate at step (0-based), as in tests/reference/make_fixture.py:
 *   step <  warmup: lr * (step + 1) / warmup
 *   step >= warmup: ratio = (step - warmup) / max(1, steps - warmup),
 *                   min + 0.5 * (1 + cos(pi * ratio)) * (lr - min),
 *                   min = lr * min_lr_ratio. */
double lr_at_step(const struct dm_config *cfg, int step);

/* One AdamW update (decoupled weight decay on matrices and embeddings
 * only, bias correction with t = step+1) of every parameter this rank
 * holds; grad_scale multiplies gradients first (clipping; torch's
 * clip_grad_norm_ uses min(1, clip / (norm + 1e-6))). Updates wte if
 * has_embed or has_head, wpe if has_embed, lnf if has_head. */
void gpt_adamw_update(struct gpt *model, double lr, double beta1,
                      double beta2, double eps, double weight_decay,
                      float grad_scale, int t);

/* The element-wise AdamW kernel, exposed for tests. torch.optim.AdamW's
 * arithmetic: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps), g = grads*grad_scale. */
void adamw_update(float *params, const float *grads, float *m, float *v,
                  long n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, int t);

/* ---- data ---------------------------------------------------------------
 * dynmo's token files (docs/data.md): a 64-byte little-endian header
 *   offset  0  magic "DYNMOTOK" (8 bytes)
 *   offset  8  uint32 version = 1
 *   offset 12  uint32 vocab (256: byte level)
 *   offset 16  uint32 token_bytes = 2
 *   offset 20  uint32 reserved (0)
 *   offset 24  uint64 count (tokens)
 *   offset 32  uint64 checksum: FNV-1a 64 of the token bytes as stored
 *   offset 40  24 reserved bytes (0)
 * then count uint16 little-endian tokens; the file is exactly
 * 64 + 2 * count bytes. */
#define TOKEN_FILE_MAGIC "DYNMOTOK"
#define TOKEN_FILE_VERSION 1
#define TOKEN_FILE_HEADER_BYTES 64

struct token_input;   /* one file or Megatron dataset of a stream (src/model) */

/* The token stream of data.train or data.val: one or more inputs, each
 * detected by its content (a dynmo token file, an llm.c token shard, a
 * Megatron indexed dataset named by its prefix), named by a path, a
 * comma-separated list or a pattern (*, ?, [...]), read in order as one
 * stream, with eot between documents when eot >= 0 (docs/data.md). Every
 * input stays memory-mapped; nothing is copied. */
struct token_file {
    char path[1024];          /* as given */
    uint32_t vocab;           /* every token of the stream is below this */
    uint64_t count;           /* tokens in the stream, end-of-text tokens included */
    uint64_t checksum;        /* identifies the data (run logs, checkpoints) */
    int eot;                  /* the token between documents; -1: none */
    int input_count;
    struct token_input *inputs;   /* (input_count) */
};

/* Opens, maps and validates every input of path. Any problem (a missing
 * or unreadable file, a pattern that matches nothing, an empty list
 * element, a header that is not what it claims, a size that does not match
 * the header or a Megatron data file that does not match its index, a
 * token type that cannot be a token id, a token >= its bound, a checksum
 * mismatch, fewer than min_tokens tokens in all, eot not below
 * model_vocab) ends with dm_user_error_local naming the file and what is
 * wrong (and where): status 2 for the whole job, even when only this rank
 * sees it. Reads every token once (the checks). Not collective. tf owns
 * the mappings until token_file_close. */
void token_file_open(struct token_file *tf, const char *path, uint32_t model_vocab, int eot,
                     uint64_t min_tokens);
/* The same checks without ending the job: 0, or -1 with the message in
 * err (and tf empty). `dynmo train` uses it so that all ranks agree on one
 * message. */
int token_file_try_open(struct token_file *tf, const char *path, uint32_t model_vocab, int eot,
                        uint64_t min_tokens, char *err, size_t errsize);
/* A stream over tokens[0..count) of the caller's memory, which must
 * outlive it; every token below vocab (unchecked). Close with
 * token_file_close. */
void token_file_from_memory(struct token_file *tf, const char *name, const uint32_t *tokens,
                            uint64_t count, uint32_t vocab);
void token_file_close(struct token_file *tf);

/* out[0..n) = stream tokens [first, first + n), which must exist. */
void token_file_read(const struct token_file *tf, uint64_t first, size_t n, int *out);

/* Writes bytes[0..n) as a byte-level token file (vocab 256, one token a
 * byte) at path: created exclusively (O_EXCL), written, fsynced, closed;
 * its checksum into *checksum_out. Returns 0, or -1 with errno set; the
 * caller removes a partial file (and renames a complete one into place:
 * `dynmo prepare`, src/tools/prepare.c). */
int token_file_write_bytes(const char *path, const unsigned char *bytes, size_t n,
                           uint64_t *checksum_out);

/* Deterministic sampler of (input, target) windows of T+1 tokens. The
 * dataset is cut into windows at stride T (window w is tokens
 * [w*T, w*T+T]); each epoch visits them in a permutation drawn from
 * (seed, epoch) with dm_hash64. A global sample index s names one window:
 * epoch s / windows, position s % windows in that epoch's permutation, so
 * a sample is a pure function of (stream, T, seed, s). The cursor is just
 * the number of samples consumed, so saving and restoring it is one
 * integer, and data-parallel rank r of D takes a contiguous share of
 * every global batch by index (loader_dp_share). */
struct loader {
    const struct token_file *tf;
    int T;
    uint64_t seed;
    long windows;        /* samples per epoch */
    long cached_epoch;   /* epoch whose permutation is in perm; -1: none */
    long *perm;          /* (windows) position in epoch -> window */
    long cursor;         /* next global sample index */
};

/* Needs at least T+1 tokens (one window), else dm_user_error_local naming
 * the file. tf must outlive the loader. Cursor starts at 0. */
void loader_init(struct loader *ld, const struct token_file *tf, int T, uint64_t seed);
void loader_free(struct loader *ld);

/* Fills inputs and targets (count, T) with global samples
 * [first_sample, first_sample + count): targets are inputs shifted by
 * one token. Either array may be NULL (a pipeline stage that needs only
 * one of them). Does not move the cursor. */
void loader_fill(struct loader *ld, long first_sample, int count,
                 int *inputs, int *targets);

/* Rank dp_rank of dp_size takes samples [offset, offset + count) of a
 * global batch of global_count; shares are contiguous, in rank order, and
 * differ by at most one sample (the first global_count % dp_size ranks
 * take one more). */
void loader_dp_share(int global_count, int dp_rank, int dp_size,
                     int *offset, int *count);

/* Fills this rank's share of the global batch at the cursor (as
 * loader_fill) and advances the cursor by global_count, the same on every
 * rank. Returns the number of samples filled. */
int loader_next(struct loader *ld, int global_count, int dp_rank, int dp_size,
                int *inputs, int *targets);

#endif
