/* The hardware cost model of `dynmo simulate --hardware` and `dynmo
 * calibrate` (docs/simulate.md, "The hardware model"), private to
 * src/tools: the hardware file (an INI file of rates, bandwidths,
 * overheads, memory and links: hardware.c), the op-level model that prices
 * the ops a block, the embedding and the head run on it (hardware_ops.c),
 * and the setup of a simulation from a config instead of a run log
 * (simulate_hardware.c).
 *
 * Nothing here measures (calibrate.c does) or decides a layout (the
 * simulation runs through src/balance as every simulation does). */
#ifndef DYNMO_TOOLS_HARDWARE_H
#define DYNMO_TOOLS_HARDWARE_H

#include <stddef.h>
#include "dynmo/core.h"

/* ---- the hardware file ----------------------------------------------------- */

/* The most [gemm] points (of each direction) and [attention] points a
 * file may list. */
#define HW_GEMM_POINTS_MAX 64
#define HW_ATTENTION_POINTS_MAX 32

/* One measured or assumed GEMM: out (m, n) = a (m, k) x b (k, n) at an
 * achieved rate. */
struct hw_gemm_point {
    double m, n, k, tflops;
};

/* Causal attention measured at sequence length T and head size hs: its
 * forward's and its backward's achieved rates (of causal_flops and twice
 * that, hardware_ops.c). */
struct hw_attention_point {
    double T, head_size, forward_tflops, backward_tflops;
};

/* A link's alpha-beta line: a message of b bytes takes latency + b /
 * bandwidth. */
struct hw_link {
    double latency_us, bandwidth_gbs;
};

struct hardware {
    char path[1024];
    char name[128];
    /* [device] */
    double memory_gb;            /* capacity for parameters, state and activations */
    double peak_bandwidth_gbs;   /* memory bandwidth, datasheet */
    double bandwidth_gbs;        /* achieved by elementwise and normalisation ops */
    double op_overhead_us;       /* fixed cost of every op (launch, thread fork) */
    int bytes_per_element;       /* activations and weights in the ops: 4 (fp32), 2 (bf16) */
    /* optional: what GELU, the layernorm forward and AdamW achieve on
     * their bytes where that is not bandwidth_gbs (a CPU computes GELU's
     * tanh and AdamW's square root slower than it streams); a file
     * without them has bandwidth_gbs here */
    double gelu_gbs, layernorm_gbs, adamw_gbs;
    /* [gemm] point: a product forward (out = inp W^T + bias); backward_point
     * (optional): its backward as the model runs it, the input gradient
     * and the weight and bias gradients together (4 m n k FLOPs); a file
     * without them prices the backward as two forward products */
    double gemm_peak_tflops;
    int gemm_points, backward_points;
    struct hw_gemm_point gemm[HW_GEMM_POINTS_MAX], backward[HW_GEMM_POINTS_MAX];
    /* [attention] achieved rates of the score and value products (dense
     * causal, forward and backward together), of bucket-sorted hash
     * attention, and of the CSR products of a pruned block (on their
     * nonzeros); point (optional): causal attention by direction at a
     * length and head size, which a file that has them prices instead of
     * tflops */
    double attention_tflops, group_attention_tflops, sparse_tflops;
    int attention_points;
    struct hw_attention_point attention[HW_ATTENTION_POINTS_MAX];
    /* hash_point (optional): hash attention by direction at a length and
     * head size, rates of the FLOPs of the tiles it visits (priced instead
     * of hash_tflops where a file has them) */
    int hash_points;
    struct hw_attention_point hash[HW_ATTENTION_POINTS_MAX];
    /* [link] point-to-point and [collective] all-reduce lines, within a node
     * and between nodes; gpus_per_node ranks share a node */
    int ranks_per_node;
    struct hw_link p2p_intra, p2p_inter, collective_intra, collective_inter;
};

/* Parses a hardware file's text[0..len) into hw (name is what messages
 * call it). Every key of every section is required; a missing, unknown,
 * repeated (but [gemm] point) or absurd figure (out of its range, an
 * achieved rate above its peak) is an error. Returns 0, or -1 with one
 * message naming the file and the key in err. Never exits. */
int hardware_parse_text(struct hardware *hw, const char *text, size_t len, const char *name,
                        char *err, size_t errsize);
/* Reads and parses the file at path; a user error (exit 2) on any problem. */
void hardware_load(struct hardware *hw, const char *path);
/* Writes hw as a hardware file that hardware_parse_text reads back, with
 * `comment` (lines, each written after "# ") at its top. Returns 0, or -1
 * with err filled. */
int hardware_write(const struct hardware *hw, const char *path, const char *comment, char *err,
                   size_t errsize);

/* ---- pricing one op ------------------------------------------------------- */

/* The achieved GEMM rate (TFLOP/s) of shape m x n x k: the [gemm] points
 * interpolated by the inverse fourth power of the distance in log2(m),
 * log2(n), log2(k) (a point of the same shape gives its own rate). */
double hardware_gemm_tflops(const struct hardware *hw, double m, double n, double k);
/* The rate of a product's backward (4 m n k FLOPs) from the
 * backward_points interpolated the same way, or 0 where the file has none. */
double hardware_gemm_backward_tflops(const struct hardware *hw, double m, double n, double k);
/* Causal attention's rate at length T and head size hs in one direction
 * (backward != 0: the backward's) from the [attention] points interpolated
 * by the inverse fourth power of the distance in log2(T), log2(hs), or
 * tflops where the file has none. */
double hardware_attention_tflops(const struct hardware *hw, double T, double head_size,
                                 int backward);
/* The same for hash attention's visited tiles from the hash points, or
 * hash_tflops where the file has none. */
double hardware_hash_tflops(const struct hardware *hw, double T, double head_size, int backward);
/* Milliseconds of one op: the overhead plus the larger of its FLOPs at
 * the rate and its bytes at the achieved bandwidth (a roofline). */
double hardware_op_ms(const struct hardware *hw, double flops, double tflops, double bytes);
/* A GEMM's milliseconds: hardware_op_ms at hardware_gemm_tflops, reading
 * the two operands and writing the output at bytes_per_element. */
double hardware_gemm_ms(const struct hardware *hw, double m, double n, double k);
/* A message's or an all-reduce's milliseconds on a link line. */
double hardware_link_ms(const struct hw_link *link, double bytes);

/* ---- the op-level model of the GPT -------------------------------------- */

/* The op classes a block's cost splits into, for the per-op table. */
enum hw_op_class { HW_GEMM = 0, HW_ATTENTION, HW_MEMORY, HW_CLASSES };

/* One op of a block, embedding or head, in one direction. */
struct hw_op {
    const char *name;            /* "qkv", "attention", "ln1", ... */
    enum hw_op_class cls;
    double flops, bytes, ms;
};

/* The ops of one pass: at most this many. */
#define HW_OPS_MAX 48

struct hw_pass {
    int count;
    struct hw_op op[HW_OPS_MAX];
    double ms, flops, bytes;     /* sums */
};

/* What a block computes at a state, by role (the values simulate's states
 * hold, docs/simulate.md): early exit's share a of the tokens still
 * active (block_forward_rows: ln1 and the K, V products over every token,
 * Q, attention's query rows, the projection and the MLP over the active
 * rows), MoD's share d of the tokens routed through it (packed sequences:
 * every op over dN rows, the attention's square shrinking as d^2), the
 * sparsity of its matrices (CSR products past
 * dyn.csr_sparsity), frozen (forward only: a frozen prefix computes no
 * backward and no update), the share of the hash attention's expected
 * tiles, and the busiest expert rank's load (0: the dense MLP; g: that
 * rank's g x rows x top-k rows through its experts). */
struct hw_block_state {
    double active, tokens, sparsity, tiles, busiest_load;
    int frozen, exit_head;       /* exit_head: an early-exit head follows the block */
};

/* The shape the model prices: the config's widths, one micro-batch of
 * `sequences` sequences of cfg->seq tokens, on hw. */
struct hw_model {
    const struct hardware *hw;
    struct dm_config cfg;
    int sequences;               /* per micro-batch */
};

/* The ops of a block's forward, backward (the backward of a frozen block
 * is empty) and once-a-step update at state, each priced. */
void hw_block_forward(struct hw_pass *pass, const struct hw_model *m,
                      const struct hw_block_state *state);
void hw_block_backward(struct hw_pass *pass, const struct hw_model *m,
                       const struct hw_block_state *state);
void hw_block_update(struct hw_pass *pass, const struct hw_model *m,
                     const struct hw_block_state *state);
/* The embedding's and the head's (final layernorm, logits, loss) ops per
 * micro-batch and their update once a step. */
void hw_embed_passes(struct hw_pass *fwd, struct hw_pass *bwd, struct hw_pass *update,
                     const struct hw_model *m);
void hw_head_passes(struct hw_pass *fwd, struct hw_pass *bwd, struct hw_pass *update,
                    const struct hw_model *m);

/* Bytes one stage holds: params x 16 (weights, gradients, two moments)
 * and in_flight micro-batches of its blocks' activations (the model's
 * block_acts_bytes). */
double hw_stage_bytes(const struct hw_model *m, double params, int blocks, int in_flight);

#endif
