/* The op-level model of `dynmo simulate --hardware` (docs/simulate.md,
 * "The hardware model"): the ops a transformer block, the embedding and
 * the head run per micro-batch, as src/model runs them (dense_forward and
 * dense_backward of block.c, the fused residual and GELU products, the
 * CSR products of a pruned block, the packed rows of early exit and
 * mixture of depths, hash attention's tiles, an MoE block's router and
 * experts, AdamW once a step), with each op's FLOPs and bytes, priced on a
 * hardware file by hardware_op_ms.
 *
 * Must not: read files, measure, or decide anything about layouts. */
#include <math.h>
#include <string.h>
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "tools/simulate/hardware.h"

/* AdamW's bytes per parameter in fp32: read the weight, its gradient and
 * two moments, write the weight and the moments (at adamw_gbs); besides,
 * the gradient read once more for the global norm and zeroed after the
 * step (at bandwidth_gbs). */
#define ADAMW_BYTES_PER_PARAM 28.0
#define GRAD_BYTES_PER_PARAM 4.0
#define ADAMW_FLOPS_PER_PARAM 15.0
/* A CSR nonzero: its value and its column index. */
#define CSR_BYTES_PER_NONZERO 8.0

static void add_op(struct hw_pass *p, const struct hw_model *m, const char *name,
                   enum hw_op_class cls, double flops, double tflops, double bytes)
{
    DM_ASSERT(p->count < HW_OPS_MAX);
    double ms = hardware_op_ms(m->hw, flops, tflops, bytes);
    p->op[p->count++] = (struct hw_op){name, cls, flops, bytes, ms};
    p->ms += ms;
    p->flops += flops;
    p->bytes += bytes;
}

/* What a product's epilogue streams after its GEMM, on the rows the GEMM
 * just wrote: a residual's bytes (at bandwidth_gbs) and GELU's or its
 * derivative's (at gelu_gbs). The model runs an epilogue after the sgemm
 * of each chunk of rows, not under it, so its time adds to the GEMM's. */
struct epilogue {
    double residual_bytes, gelu_bytes;
};
static const struct epilogue no_epilogue = {0, 0};

static double epilogue_ms(const struct hardware *hw, struct epilogue x)
{
    return x.residual_bytes / (hw->bandwidth_gbs * 1e6) + x.gelu_bytes / (hw->gelu_gbs * 1e6);
}

static void add_entry(struct hw_pass *p, const char *name, enum hw_op_class cls, double count,
                      double flops, double bytes, double ms)
{
    DM_ASSERT(p->count < HW_OPS_MAX);
    p->op[p->count++] = (struct hw_op){name, cls, count * flops, count * bytes, count * ms};
    p->ms += count * ms;
    p->flops += count * flops;
    p->bytes += count * bytes;
}

/* `count` equal GEMMs m x n x k forward as one entry (an MoE rank's
 * experts), each with its epilogue. */
static void add_gemms(struct hw_pass *p, const struct hw_model *m, const char *name, double count,
                      double rows, double n, double k, struct epilogue x)
{
    if (!(rows >= 1) || count <= 0) return;
    const struct hardware *hw = m->hw;
    double e = hw->bytes_per_element;
    double flops = 2 * rows * n * k, bytes = e * (rows * k + k * n + rows * n);
    double ms = hardware_op_ms(hw, flops, hardware_gemm_tflops(hw, rows, n, k), bytes) +
                epilogue_ms(hw, x);
    add_entry(p, name, HW_GEMM, count, flops, bytes + x.residual_bytes + x.gelu_bytes, ms);
}

/* The names of a product's backward: its input gradient's and weight
 * gradient's (priced apart) and the two together. */
#define BACKWARD_NAMES(product) \
    ((const char *const[3]){product " dinp", product " dweight", product " backward"})

/* The backward of `count` equal products rows x in -> rows x out: the
 * input gradient (rows, in) and the weight (out, in) and bias gradients.
 * On a file with backward points, one op at their rate over 4 rows in out
 * FLOPs, as the model runs it (one parallel loop over both gradients'
 * chunks, then the reduction of the weight gradient's row parts and the
 * bias); else two products at the forward points, as names[0] and
 * names[1]. The epilogue (GELU's derivative) follows the input gradient. */
static void add_gemms_backward(struct hw_pass *p, const struct hw_model *m,
                               const char *const names[3], double count, double rows,
                               double in, double out, struct epilogue x)
{
    if (!(rows >= 1) || count <= 0) return;
    const struct hardware *hw = m->hw;
    double rate = hardware_gemm_backward_tflops(hw, rows, out, in);
    if (!(rate > 0)) {
        add_gemms(p, m, names[0], count, rows, in, out, x);
        add_gemms(p, m, names[1], count, out, in, rows, no_epilogue);
        return;
    }
    double e = hw->bytes_per_element;
    double flops = 4 * rows * in * out;
    double bytes = e * (2 * rows * out + 2 * rows * in + 2 * in * out);
    double ms = hardware_op_ms(hw, flops, rate, bytes) + epilogue_ms(hw, x);
    add_entry(p, names[2], HW_GEMM, count, flops, bytes + x.residual_bytes + x.gelu_bytes, ms);
}

/* A memory-bound op over `bytes` at gbs (0: bandwidth_gbs), once. */
static void add_memory_at(struct hw_pass *p, const struct hw_model *m, const char *name,
                          double flops, double bytes, double gbs)
{
    if (bytes <= 0) return;
    const struct hardware *hw = m->hw;
    double ms = hw->op_overhead_us / 1e3 + bytes / ((gbs > 0 ? gbs : hw->bandwidth_gbs) * 1e6);
    add_entry(p, name, HW_MEMORY, 1, flops, bytes, ms);
}

/* A memory-bound op at bandwidth_gbs (residuals, copies, gathers). */
static void add_memory(struct hw_pass *p, const struct hw_model *m, const char *name,
                       double flops, double bytes)
{
    add_memory_at(p, m, name, flops, bytes, 0);
}

/* A layernorm forward over rows x C (at layernorm_gbs). */
static void add_layernorm(struct hw_pass *p, const struct hw_model *m, const char *name,
                          double rows, double C)
{
    add_memory_at(p, m, name, 8 * rows * C, 2 * m->hw->bytes_per_element * rows * C,
                  m->hw->layernorm_gbs);
}

/* One of the block's four products (rows x in -> rows x out) forward:
 * dense (bias, residual or GELU fused) or, past dyn.csr_sparsity, the CSR
 * product on the nonzeros and the residual or GELU as their own ops. */
static void product_forward(struct hw_pass *p, const struct hw_model *m,
                            const struct hw_block_state *s, const char *name, double rows,
                            double in, double out, int residual, int gelu)
{
    double e = m->hw->bytes_per_element;
    if (s->sparsity >= m->cfg.csr_sparsity && s->sparsity > 0) {
        double nnz = (1 - s->sparsity) * in * out;
        add_op(p, m, name, HW_GEMM, 2 * rows * nnz, m->hw->sparse_tflops,
               CSR_BYTES_PER_NONZERO * nnz + e * rows * (in + out));
        if (residual) add_memory(p, m, "residual", rows * out, 3 * e * rows * out);
        if (gelu)
            add_memory_at(p, m, "gelu", 8 * rows * out, 2 * e * rows * out, m->hw->gelu_gbs);
        return;
    }
    add_gemms(p, m, name, 1, rows, out, in,
              (struct epilogue){residual * 2 * e * rows * out, gelu * 2 * e * rows * out});
}

/* Its backward: the input gradient and the weight gradient (and the
 * bias's, a pass over the output gradient), GELU's derivative fused. */
static void product_backward(struct hw_pass *p, const struct hw_model *m,
                             const struct hw_block_state *s, const char *const names[3],
                             double rows, double in, double out, int gelu)
{
    double e = m->hw->bytes_per_element;
    if (s->sparsity >= m->cfg.csr_sparsity && s->sparsity > 0) {
        double nnz = (1 - s->sparsity) * in * out;
        add_op(p, m, names[2], HW_GEMM, 4 * rows * nnz, m->hw->sparse_tflops,
               2 * CSR_BYTES_PER_NONZERO * nnz + 2 * e * rows * (in + out));
        if (gelu)
            add_memory_at(p, m, "gelu backward", 8 * rows * in, 3 * e * rows * in,
                          m->hw->gelu_gbs);
        return;
    }
    add_gemms_backward(p, m, names, 1, rows, in, out,
                       (struct epilogue){0, gelu ? 3 * e * rows * in : 0});
}

/* Rows the block computes per micro-batch and tokens per packed sequence. */
static void block_rows(const struct hw_model *m, const struct hw_block_state *s, double *rows,
                       double *per_sequence)
{
    *per_sequence = fmax(1.0, round(s->tokens * m->cfg.seq));
    *rows = *per_sequence * m->sequences;
}

/* Causal attention's FLOPs over n tokens of each of B sequences: the score
 * and value products over the n (n + 1) / 2 pairs of each head. */
static double causal_flops(double B, double n, double C)
{
    return 2.0 * B * n * (n + 1) * C;
}

/* The signal of the tile-share role when the config runs its scheme (the
 * block's attention visits only its share of causal attention's tiles),
 * else NULL. */
static const struct dyn_signal *tile_signal(const struct hw_model *m)
{
    const struct dyn_signal *t = dyn_signal_of_cost(DYN_COST_TILE_SHARE);
    return t && t->cost_scale && dyn_signal_active(t, &m->cfg) ? t : NULL;
}

static void price_attention_forward(struct hw_pass *p, const struct hw_model *m,
                                    const struct hw_block_state *s, double n)
{
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, B = m->sequences, C = c->channels, NH = c->heads;
    double io = e * B * n * 4 * C;   /* q, k, v in, the output out */
    const struct dyn_signal *tiles = tile_signal(m);
    if (tiles) {
        double share = s->tiles * tiles->cost_scale(c, (int)n);
        add_op(p, m, "hash attention", HW_ATTENTION, share * causal_flops(B, n, C),
               hardware_hash_tflops(m->hw, n, C / NH, 0), 2 * io);
        return;
    }
    /* the scores' softmax (B, NH, n, n) written once and read by the value product */
    add_op(p, m, "attention", HW_ATTENTION, causal_flops(B, n, C),
           hardware_attention_tflops(m->hw, n, C / NH, 0), io + 2 * 4.0 * B * NH * n * n);
}

static void price_attention_backward(struct hw_pass *p, const struct hw_model *m,
                                     const struct hw_block_state *s, double n)
{
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, B = m->sequences, C = c->channels, NH = c->heads;
    double io = e * B * n * 8 * C;   /* q, k, v, output gradient in; their gradients out */
    const struct dyn_signal *tiles = tile_signal(m);
    if (tiles) {
        double share = s->tiles * tiles->cost_scale(c, (int)n);
        add_op(p, m, "hash attention backward", HW_ATTENTION, 2 * share * causal_flops(B, n, C),
               hardware_hash_tflops(m->hw, n, C / NH, 1), 2 * io);
        return;
    }
    add_op(p, m, "attention backward", HW_ATTENTION, 2 * causal_flops(B, n, C),
           hardware_attention_tflops(m->hw, n, C / NH, 1), io + 3 * 4.0 * B * NH * n * n);
}

/* The routed MLP of the busiest-rank role's scheme, as its signal
 * declares it from the config. */
static struct dyn_routed_mlp routed_mlp(const struct hw_model *m)
{
    const struct dyn_signal *load = dyn_signal_of_cost(DYN_COST_BUSIEST_RANK);
    DM_ASSERT(load && load->cost_routed_mlp);
    struct dyn_routed_mlp r;
    load->cost_routed_mlp(&m->cfg, &r);
    return r;
}

/* Early exit's block with tokens gone (exit.c's block_forward_rows): the
 * input copied forward, ln1 and K, V over all N rows, Q, the attention's
 * query rows (each against the keys up to its position: a of causal's
 * pairs), the projection, ln2 and the MLP over the Na active rows,
 * gathered and scattered back. */
static void rows_forward(struct hw_pass *p, const struct hw_model *m,
                         const struct hw_block_state *s)
{
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, C = c->channels, NH = c->heads, B = m->sequences;
    double T = c->seq, N = B * T, Na = round(s->active * N);
    add_memory(p, m, "copy", 0, 2 * e * N * C);
    if (Na < 1) return;
    add_layernorm(p, m, "ln1", N, C);
    product_forward(p, m, s, "kv", N, C, 2 * C, 0, 0);
    add_memory(p, m, "gather", 0, 2 * e * Na * C);
    product_forward(p, m, s, "q", Na, C, C, 0, 0);
    add_op(p, m, "attention rows", HW_ATTENTION, s->active * causal_flops(B, T, C),
           hardware_attention_tflops(m->hw, T, C / NH, 0),
           e * (2 * Na * C + 2 * N * C) + 2 * 4.0 * NH * Na * T);
    product_forward(p, m, s, "proj", Na, C, C, 0, 0);
    add_memory(p, m, "residual", Na * C, 5 * e * Na * C);   /* the input's rows gathered, added */
    add_layernorm(p, m, "ln2", Na, C);
    product_forward(p, m, s, "fc", Na, C, 4 * C, 0, 1);
    product_forward(p, m, s, "fcproj", Na, 4 * C, C, 1, 0);
    add_memory(p, m, "scatter", 0, 2 * e * Na * C);
}

/* Its backward (block_backward_rows): the MLP, ln2 and the projection over
 * the active rows, the attention's query rows, K and V's gradients over
 * every row, Q's over the active ones, ln1 over every row. */
static void rows_backward(struct hw_pass *p, const struct hw_model *m,
                          const struct hw_block_state *s)
{
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, C = c->channels, NH = c->heads, B = m->sequences;
    double T = c->seq, N = B * T, Na = round(s->active * N);
    if (Na < 1) {
        add_memory(p, m, "copy", 0, 2 * e * N * C);
        return;
    }
    add_memory(p, m, "gather", 0, 2 * e * Na * C);
    product_backward(p, m, s, BACKWARD_NAMES("fcproj"), Na, 4 * C, C, 1);
    product_backward(p, m, s, BACKWARD_NAMES("fc"), Na, C, 4 * C, 0);
    add_memory(p, m, "ln2 backward", 10 * Na * C, 4 * e * Na * C);
    product_backward(p, m, s, BACKWARD_NAMES("proj"), Na, C, C, 0);
    add_op(p, m, "attention rows backward", HW_ATTENTION, 2 * s->active * causal_flops(B, T, C),
           hardware_attention_tflops(m->hw, T, C / NH, 1),
           e * (4 * Na * C + 4 * N * C) + 3 * 4.0 * NH * Na * T);
    product_backward(p, m, s, BACKWARD_NAMES("kv"), N, C, 2 * C, 0);
    product_backward(p, m, s, BACKWARD_NAMES("q"), Na, C, C, 0);
    add_memory(p, m, "scatter", 0, 6 * e * N * C);   /* dQ rows, the residual's copy and rows */
    add_memory(p, m, "ln1 backward", 10 * N * C, 4 * e * N * C);
}

/* The early-exit head after the block: layernorm and logits over the active rows. */
static void exit_head_forward(struct hw_pass *p, const struct hw_model *m, double rows)
{
    const struct dm_config *c = &m->cfg;
    add_layernorm(p, m, "exit ln", rows, c->channels);
    add_gemms(p, m, "exit logits", 1, rows, c->vocab, c->channels, no_epilogue);
    add_memory(p, m, "exit softmax", 5 * rows * c->vocab, 2 * 4.0 * rows * c->vocab);
}

static void exit_head_backward(struct hw_pass *p, const struct hw_model *m, double rows)
{
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, C = c->channels;
    if (!(c->exit_loss_weight > 0)) return;
    add_memory(p, m, "exit softmax backward", 2 * rows * c->vocab, 2 * 4.0 * rows * c->vocab);
    add_gemms_backward(p, m, BACKWARD_NAMES("exit logits"), 1, rows, C, c->vocab, no_epilogue);
    add_memory(p, m, "exit ln backward", 10 * rows * C, 4 * e * rows * C);
}

void hw_block_forward(struct hw_pass *p, const struct hw_model *m,
                      const struct hw_block_state *s)
{
    memset(p, 0, sizeof *p);
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, C = c->channels, N, n;
    block_rows(m, s, &N, &n);
    if (s->active < 1) {
        rows_forward(p, m, s);
        if (s->exit_head) exit_head_forward(p, m, round(s->active * m->sequences * c->seq));
        return;
    }
    double all = (double)m->sequences * c->seq;
    if (s->tokens < 1) {
        /* MoD (mod.c): the router over every token (the hook's, for the
         * top-k, and mod_block_forward's), the top-k, the input copied to
         * the output, the chosen rows gathered */
        add_memory(p, m, "router", 2 * all * C, e * all * C);
        add_memory(p, m, "top-k", all, 4.0 * all);
        add_memory(p, m, "router (block)", 2 * all * C, e * all * C);
        add_memory(p, m, "copy", 0, 2 * e * all * C);
        add_memory(p, m, "gather", 0, 2 * e * N * C);
    }
    add_layernorm(p, m, "ln1", N, C);
    product_forward(p, m, s, "qkv", N, C, 3 * C, 0, 0);
    price_attention_forward(p, m, s, n);
    product_forward(p, m, s, "proj", N, C, C, 1, 0);
    add_layernorm(p, m, "ln2", N, C);
    if (s->busiest_load > 0) {
        struct dyn_routed_mlp r = routed_mlp(m);
        double E = r.units, H = r.hidden, per_rank = r.units_per_rank;
        double rows = s->busiest_load * N * r.choices;   /* the busiest rank's */
        add_gemms(p, m, "router", 1, N, E, C, no_epilogue);
        /* the scores, the top k and the load sums over the N x E logits (fp32) */
        add_memory(p, m, "top-k", 5 * N * E, 3 * 4.0 * N * E);
        add_memory(p, m, "dispatch", 0, 2 * e * rows * C);
        add_gemms(p, m, "routed fc", per_rank, rows / per_rank, H, C,
                  (struct epilogue){0, 2 * e * rows / per_rank * H});
        add_gemms(p, m, "routed proj", per_rank, rows / per_rank, C, H, no_epilogue);
        add_memory(p, m, "combine", 2 * N * C, e * (rows + 2 * N) * C);
    } else {
        product_forward(p, m, s, "fc", N, C, 4 * C, 0, 1);
        product_forward(p, m, s, "fcproj", N, 4 * C, C, 1, 0);
    }
    /* MoD: the block's rows scaled by the router and added into theirs */
    if (s->tokens < 1) add_memory(p, m, "combine", 2 * N * C, 3 * e * N * C);
    if (s->exit_head) exit_head_forward(p, m, N);
}

void hw_block_backward(struct hw_pass *p, const struct hw_model *m,
                       const struct hw_block_state *s)
{
    memset(p, 0, sizeof *p);
    if (s->frozen) return;   /* a frozen prefix: nothing before it needs a gradient */
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, C = c->channels, N, n;
    block_rows(m, s, &N, &n);
    if (s->active < 1) {
        if (s->exit_head) exit_head_backward(p, m, round(s->active * m->sequences * c->seq));
        rows_backward(p, m, s);
        return;
    }
    if (s->exit_head) exit_head_backward(p, m, N);
    if (s->tokens < 1) {   /* MoD: the gradient copied through, the chosen rows' scaled */
        add_memory(p, m, "copy", 0, 2 * e * m->sequences * c->seq * C);
        add_memory(p, m, "scale chosen", N * C, 2 * e * N * C);
    }
    if (s->busiest_load > 0) {
        struct dyn_routed_mlp mlp = routed_mlp(m);
        double E = mlp.units, H = mlp.hidden, per_rank = mlp.units_per_rank;
        double rows = s->busiest_load * N * mlp.choices, r = rows / per_rank;
        add_memory(p, m, "combine backward", 2 * N * C, e * (rows + 2 * N) * C);
        add_gemms_backward(p, m, BACKWARD_NAMES("routed proj"), per_rank, r, H, C,
                           (struct epilogue){0, 3 * e * r * H});
        add_gemms_backward(p, m, BACKWARD_NAMES("routed fc"), per_rank, r, C, H, no_epilogue);
        add_memory(p, m, "dispatch backward", 0, 2 * e * rows * C);
        add_memory(p, m, "top-k backward", 3 * N * E, 3 * 4.0 * N * E);
        add_gemms_backward(p, m, BACKWARD_NAMES("router"), 1, N, C, E, no_epilogue);
    } else {
        product_backward(p, m, s, BACKWARD_NAMES("fcproj"), N, 4 * C, C, 1);
        product_backward(p, m, s, BACKWARD_NAMES("fc"), N, C, 4 * C, 0);
    }
    add_memory(p, m, "ln2 backward", 10 * N * C, 4 * e * N * C);
    product_backward(p, m, s, BACKWARD_NAMES("proj"), N, C, C, 0);
    price_attention_backward(p, m, s, n);
    product_backward(p, m, s, BACKWARD_NAMES("qkv"), N, C, 3 * C, 0);
    add_memory(p, m, "ln1 backward", 10 * N * C, 4 * e * N * C);
    /* MoD: the rows' input gradient added into theirs, the router's */
    if (s->tokens < 1) add_memory(p, m, "combine backward", 3 * N * C, 4 * e * N * C);
}

/* The parameters of a block in state: a dense block's, or with a routed
 * MLP the shared tensors, the router and the rank's units; and the
 * tensors they are in (a dense block's 12, or the 8 shared ones, the
 * router and 4 a unit). */
static double block_params(const struct hw_model *m, const struct hw_block_state *s,
                           int *tensors)
{
    const struct dm_config *c = &m->cfg;
    double C = c->channels, dense = (double)block_param_count(c->channels);
    *tensors = BP_COUNT;
    if (!(s->busiest_load > 0)) return dense;
    struct dyn_routed_mlp r = routed_mlp(m);
    double H = r.hidden, E = r.units;
    double mlp = 8 * C * C + 5 * C;   /* the dense MLP's fc and fcproj with biases */
    double units = r.units_per_rank * (2 * C * H + H + C);
    *tensors = BP_FC_W + 1 + 4 * (int)r.units_per_rank;
    return dense - mlp + C * E + units;
}

/* AdamW over `params` parameters in `tensors` calls (gpt_adamw_update
 * runs one a tensor, each paying the op overhead), then the gradient's
 * norm and its zeroing. */
static void add_update(struct hw_pass *p, const struct hw_model *m, double params, int tensors)
{
    const struct hardware *hw = m->hw;
    double bytes = ADAMW_BYTES_PER_PARAM * params;
    add_entry(p, "adamw", HW_MEMORY, 1, ADAMW_FLOPS_PER_PARAM * params, bytes,
              tensors * hw->op_overhead_us / 1e3 + bytes / (hw->adamw_gbs * 1e6));
    add_memory(p, m, "gradient norm", 2 * params, GRAD_BYTES_PER_PARAM * params);
    add_memory(p, m, "zero gradients", 0, GRAD_BYTES_PER_PARAM * params);
}

void hw_block_update(struct hw_pass *p, const struct hw_model *m,
                     const struct hw_block_state *s)
{
    memset(p, 0, sizeof *p);
    if (s->frozen) return;
    int tensors;
    double params = block_params(m, s, &tensors);
    add_update(p, m, params, tensors);
}

static void passes_clear(struct hw_pass *fwd, struct hw_pass *bwd, struct hw_pass *update)
{
    memset(fwd, 0, sizeof *fwd);
    memset(bwd, 0, sizeof *bwd);
    memset(update, 0, sizeof *update);
}

void hw_embed_passes(struct hw_pass *fwd, struct hw_pass *bwd, struct hw_pass *update,
                     const struct hw_model *m)
{
    passes_clear(fwd, bwd, update);
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, C = c->channels, N = (double)m->sequences * c->seq;
    add_memory(fwd, m, "embedding", N * C, 3 * e * N * C);
    add_memory(bwd, m, "embedding backward", 2 * N * C, 4 * e * N * C);
    double params = ((double)c->vocab + c->max_seq) * C;
    add_update(update, m, params, 2);
}

void hw_head_passes(struct hw_pass *fwd, struct hw_pass *bwd, struct hw_pass *update,
                    const struct hw_model *m)
{
    passes_clear(fwd, bwd, update);
    const struct dm_config *c = &m->cfg;
    double e = m->hw->bytes_per_element, C = c->channels, V = c->vocab;
    double N = (double)m->sequences * c->seq;
    add_layernorm(fwd, m, "lnf", N, C);
    add_gemms(fwd, m, "logits", 1, N, V, C, no_epilogue);
    add_memory(fwd, m, "softmax loss", 5 * N * V, 2 * 4.0 * N * V);
    add_memory(bwd, m, "softmax loss backward", 2 * N * V, 2 * 4.0 * N * V);
    add_gemms_backward(bwd, m, BACKWARD_NAMES("logits"), 1, N, C, V, no_epilogue);
    add_memory(bwd, m, "lnf backward", 10 * N * C, 4 * e * N * C);
    add_update(update, m, 2 * C, 1);
}

double hw_stage_bytes(const struct hw_model *m, double params, int blocks, int in_flight)
{
    const struct dm_config *c = &m->cfg;
    double acts = (double)block_acts_bytes(m->sequences, c->seq, c->channels, c->heads);
    return 16.0 * params + (double)in_flight * blocks * acts;
}
