/* Tests for the hardware cost model of `dynmo simulate --hardware`
 * (src/tools/simulate/hardware.c, hardware_ops.c): the hardware file's
 * parser on a good file, the shipped files and every kind of bad figure
 * (each message must name the key); the GEMM table's interpolation; the
 * op model's FLOPs against counts by hand for a tiny shape, each scheme's
 * effect on them, and that the prices scale as a roofline must (twice the
 * GEMM rate halves a GEMM-bound op's time, twice the bandwidth a
 * memory-bound op's); the measured figures `dynmo calibrate` adds (GELU's,
 * the layernorm's and AdamW's bandwidths, the backward GEMM points, the
 * attention points by direction): parsed, checked, defaulted where a file
 * lacks them, interpolated and priced (an epilogue adds to its GEMM); and
 * that a written file reads back the same. No timing is measured. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "testing.h"
#include "tools/simulate/hardware.h"

static const char good[] =
    "# a test machine\n"
    "[device]\n"
    "name = test machine\n"
    "memory_gb = 16            # comment after a value\n"
    "peak_bandwidth_gbs = 100\n"
    "bandwidth_gbs = 50\n"
    "op_overhead_us = 10\n"
    "bytes_per_element = 4\n"
    "[gemm]\n"
    "peak_tflops = 2\n"
    "point = 64 64 64 0.25\n"
    "point = 1024 1024 1024 1\n"
    "[attention]\n"
    "tflops = 0.5\n"
    "hash_tflops = 0.25\n"
    "sparse_tflops = 0.125\n"
    "[link]\n"
    "ranks_per_node = 2\n"
    "intra_latency_us = 10\n"
    "intra_bandwidth_gbs = 6\n"
    "inter_latency_us = 20\n"
    "inter_bandwidth_gbs = 1\n"
    "[collective]\n"
    "intra_latency_us = 30\n"
    "intra_bandwidth_gbs = 3\n"
    "inter_latency_us = 40\n"
    "inter_bandwidth_gbs = 0.5\n";

static int parse(struct hardware *hw, const char *text, char *err, size_t size)
{
    err[0] = 0;
    return hardware_parse_text(hw, text, strlen(text), "test.ini", err, size);
}

/* base with the line holding `find` replaced by `with` (NULL: removed). */
static void edited_from(char *out, size_t size, const char *base, const char *find,
                        const char *with)
{
    const char *at = strstr(base, find);
    if (!at) {
        snprintf(out, size, "%s", base);
        return;
    }
    const char *line_end = strchr(at, '\n');
    snprintf(out, size, "%.*s%s%s%s", (int)(at - base), base, with ? with : "",
             with ? "\n" : "", line_end + 1);
}

static void edited(char *out, size_t size, const char *find, const char *with)
{
    edited_from(out, size, good, find, with);
}

/* good with the figures `dynmo calibrate` measures besides: GELU's, the
 * layernorm's and AdamW's bandwidths, two backward GEMM points, two
 * attention points and a hash point. */
static void measured(char *out, size_t size)
{
    char a[4096], b[4096];
    edited(a, sizeof a, "bytes_per_element",
           "bytes_per_element = 4\ngelu_gbs = 20\nlayernorm_gbs = 40\nadamw_gbs = 25");
    edited_from(b, sizeof b, a, "point = 1024 1024 1024 1",
                "point = 1024 1024 1024 1\nbackward_point = 64 64 64 0.125\n"
                "backward_point = 1024 1024 1024 0.5");
    edited_from(out, size, b, "sparse_tflops",
                "sparse_tflops = 0.125\npoint = 64 16 0.1 0.2\npoint = 1024 64 0.4 0.3\n"
                "hash_point = 256 16 0.01 0.02");
}

/* A bad line: `find`'s line of the base replaced by `with` (NULL:
 * removed), and what the message must hold. */
struct bad_case {
    const char *find, *with, *want;
};

/* Each case must be refused with its message, naming the file. */
static void expect_refused(const char *base, const struct bad_case *cases, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        char text[4096], err[512];
        edited_from(text, sizeof text, base, cases[i].find, cases[i].with);
        struct hardware hw;
        int rc = parse(&hw, text, err, sizeof err);
        CHECK_MSG(rc == -1 && strstr(err, cases[i].want) && strstr(err, "test.ini"),
                  "case %zu (%s -> %s): rc %d, message '%s', want '%s'", i, cases[i].find,
                  cases[i].with ? cases[i].with : "(removed)", rc, err, cases[i].want);
    }
}

static void test_good(void)
{
    struct hardware hw;
    char err[512];
    CHECK_MSG(parse(&hw, good, err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(hw.name, "test machine"));
    CHECK_NEAR(hw.memory_gb, 16, 0);
    CHECK_NEAR(hw.bandwidth_gbs, 50, 0);
    CHECK(hw.bytes_per_element == 4);
    CHECK(hw.gemm_points == 2);
    CHECK_NEAR(hw.gemm[1].tflops, 1, 0);
    CHECK_NEAR(hw.sparse_tflops, 0.125, 0);
    CHECK(hw.ranks_per_node == 2);
    CHECK_NEAR(hw.p2p_inter.latency_us, 20, 0);
    CHECK_NEAR(hw.collective_inter.bandwidth_gbs, 0.5, 0);
    /* a file without the measured extras: bandwidth_gbs for GELU, the
     * layernorm and AdamW, no backward or attention points */
    CHECK(hw.gelu_gbs == 50 && hw.layernorm_gbs == 50 && hw.adamw_gbs == 50);
    CHECK(hw.backward_points == 0 && hw.attention_points == 0);
}

static void test_measured(void)
{
    struct hardware hw;
    char text[4096], err[512];
    measured(text, sizeof text);
    CHECK_MSG(parse(&hw, text, err, sizeof err) == 0, "%s", err);
    CHECK(hw.gelu_gbs == 20 && hw.layernorm_gbs == 40 && hw.adamw_gbs == 25);
    CHECK(hw.gemm_points == 2 && hw.backward_points == 2 && hw.attention_points == 2);
    CHECK(hw.hash_points == 1);
    CHECK_NEAR(hw.hash[0].backward_tflops, 0.02, 0);
    CHECK_NEAR(hw.backward[1].tflops, 0.5, 0);
    CHECK_NEAR(hw.attention[0].T, 64, 0);
    CHECK_NEAR(hw.attention[0].head_size, 16, 0);
    CHECK_NEAR(hw.attention[1].forward_tflops, 0.4, 0);
    CHECK_NEAR(hw.attention[1].backward_tflops, 0.3, 0);
    static const struct bad_case cases[] = {
        {"gelu_gbs", "gelu_gbs = 200", "gelu_gbs = 200 is above peak_bandwidth_gbs"},
        {"adamw_gbs", "adamw_gbs = 0", "adamw_gbs = 0 is out of range"},
        {"layernorm_gbs", "layernorm_gbs = fast", "layernorm_gbs = 'fast' is not a number"},
        {"backward_point = 64", "backward_point = 64 64 64 5", "backward_point 64 64 64 at 5"},
        {"backward_point = 64", "backward_point = 64 64 0.1", "'m n k tflops'"},
        {"point = 64 16", "point = 64 16 0.1", "'T head_size forward_tflops backward_tflops'"},
        {"point = 64 16", "point = 64.5 16 0.1 0.2", "T must be a whole number"},
        {"point = 64 16", "point = 64 0 0.1 0.2", "head_size must be a whole number"},
        {"point = 64 16", "point = 64 16 0.1 9", "[attention] point 64 16 at 0.1 and 9"},
        {"point = 64 16", "point = 64 16 0 0.2", "out of range"},
        {"hash_point", "hash_point = 256 16 3 0.02", "[attention] hash_point 256 16 at 3"},
        {"hash_point", "hash_point = 256 16 0.01", "hash_point = 256 16 0.01 is not"},
    };
    expect_refused(text, cases, sizeof cases / sizeof cases[0]);
    /* interpolation: a point's own rate, halfway in log2 their mean; the
     * backward table is not the forward one; no points: 0 and tflops */
    parse(&hw, text, err, sizeof err);
    CHECK_NEAR(hardware_gemm_backward_tflops(&hw, 64, 64, 64), 0.125, 0);
    CHECK_NEAR(hardware_gemm_backward_tflops(&hw, 256, 256, 256), 0.3125, 1e-12);
    CHECK_NEAR(hardware_gemm_tflops(&hw, 256, 256, 256), 0.625, 1e-12);
    CHECK_NEAR(hardware_attention_tflops(&hw, 64, 16, 0), 0.1, 0);
    CHECK_NEAR(hardware_attention_tflops(&hw, 64, 16, 1), 0.2, 0);
    CHECK_NEAR(hardware_attention_tflops(&hw, 256, 32, 0), 0.25, 1e-12);
    CHECK_NEAR(hardware_attention_tflops(&hw, 256, 32, 1), 0.25, 1e-12);
    struct hardware plain;
    parse(&plain, good, err, sizeof err);
    CHECK(hardware_gemm_backward_tflops(&plain, 64, 64, 64) == 0);
    CHECK(hardware_attention_tflops(&plain, 64, 16, 1) == 0.5);
    CHECK(hardware_hash_tflops(&plain, 64, 16, 0) == 0.25);   /* hash_tflops */
    CHECK_NEAR(hardware_hash_tflops(&hw, 64, 64, 1), 0.02, 0);   /* one point: its rate */
}

/* Each case: a line changed (or removed) and what the message must hold. */
static void test_bad(void)
{
    static const struct bad_case cases[] = {
        {"memory_gb", NULL, "[device] memory_gb is missing"},
        {"name =", NULL, "[device] name is missing"},
        {"peak_tflops", NULL, "[gemm] peak_tflops is missing"},
        {"sparse_tflops", NULL, "[attention] sparse_tflops is missing"},
        {"ranks_per_node", NULL, "[link] ranks_per_node is missing"},
        {"inter_bandwidth_gbs = 0.5", NULL, "[collective] inter_bandwidth_gbs is missing"},
        {"memory_gb", "memory_gb = -1", "memory_gb = -1 is out of range"},
        {"memory_gb", "memory_gb = 0", "memory_gb = 0 is out of range"},
        {"memory_gb", "memory_gb = 1e9", "memory_gb = 1e9 is out of range"},
        {"memory_gb", "memory_gb = lots", "memory_gb = 'lots' is not a number"},
        {"memory_gb", "memory_gb = inf", "memory_gb = 'inf' is not a number"},
        {"memory_gb", "memory_gb = nan", "memory_gb = 'nan' is not a number"},
        {"memory_gb", "memory_gb =", "memory_gb = '' is not a number"},
        {"bandwidth_gbs = 50", "bandwidth_gbs = 500", "bandwidth_gbs = 500 is above"},
        {"bytes_per_element", "bytes_per_element = 2.5", "bytes_per_element = 2.5 is out"},
        {"bytes_per_element", "bytes_per_element = 8", "bytes_per_element = 8 is out"},
        {"op_overhead_us", "op_overhead_us = -5", "op_overhead_us = -5 is out of range"},
        {"point = 64", "point = 64 64 64 3", "above peak_tflops"},
        {"point = 64", "point = 64 64 0.25", "'m n k tflops'"},
        {"point = 64", "point = 64 64 64 64 1", "'m n k tflops'"},
        {"point = 64", "point = 0 64 64 0.25", "m must be a whole number"},
        {"point = 64", "point = 64 64 64 0", "out of range"},
        {"tflops = 0.5", "tflops = 5", "[attention] tflops = 5 is above"},
        {"intra_latency_us = 10", "intra_latency_us = -1", "intra_latency_us = -1 is out"},
        {"intra_bandwidth_gbs = 6", "intra_bandwidth_gbs = 0", "intra_bandwidth_gbs = 0 is out"},
        {"op_overhead_us", "op_overhead = 1", "unknown key 'op_overhead' in [device]"},
        {"[attention]", "[attention", "section header"},
        {"[attention]", "[atention]", "unknown section [atention]"},
        {"op_overhead_us", "op_overhead_us = 10\nop_overhead_us = 10", "op_overhead_us is given twice"},
        {"# a test machine", "memory_gb = 1", "'memory_gb' before any [section]"},
        {"op_overhead_us", "op_overhead_us 10", "expected 'key = value'"},
    };
    expect_refused(good, cases, sizeof cases / sizeof cases[0]);
}

static void test_shipped(void)
{
    const char *files[] = {"hardware/h100-sxm.ini", "hardware/h200.ini", "hardware/a100.ini"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        FILE *f = fopen(files[i], "r");
        CHECK_MSG(f != NULL, "%s is not readable from %s", files[i], getcwd(NULL, 0));
        if (!f) continue;
        char text[16384];
        size_t n = fread(text, 1, sizeof text, f);
        fclose(f);
        struct hardware hw;
        char err[512];
        CHECK_MSG(hardware_parse_text(&hw, text, n, files[i], err, sizeof err) == 0, "%s", err);
        CHECK(hw.bytes_per_element == 2 && hw.ranks_per_node == 8);
    }
}

static void test_gemm_table(void)
{
    struct hardware hw;
    char err[512];
    parse(&hw, good, err, sizeof err);
    CHECK_NEAR(hardware_gemm_tflops(&hw, 64, 64, 64), 0.25, 0);
    CHECK_NEAR(hardware_gemm_tflops(&hw, 1024, 1024, 1024), 1, 0);
    /* halfway in log2 between the two points: their mean */
    CHECK_NEAR(hardware_gemm_tflops(&hw, 256, 256, 256), 0.625, 1e-12);
    double r = hardware_gemm_tflops(&hw, 128, 128, 128);
    CHECK(r > 0.25 && r < 0.625);
    /* far outside: between the two, nearer the nearer */
    r = hardware_gemm_tflops(&hw, 1e6, 1e6, 1e6);
    CHECK(r > 0.625 && r < 1);
}

/* A tiny model: B = 2 sequences of T = 4 tokens, C = 8, 2 heads, V = 16. */
static struct hw_model tiny(const struct hardware *hw)
{
    struct hw_model m = {.hw = hw, .sequences = 2};
    config_defaults(&m.cfg);
    m.cfg.channels = 8;
    m.cfg.heads = 2;
    m.cfg.seq = 4;
    m.cfg.max_seq = 4;
    m.cfg.vocab = 16;
    m.cfg.layers = 2;
    m.cfg.csr_sparsity = 0.5;
    m.cfg.experts = 4;
    m.cfg.top_k = 2;
    m.cfg.expert_hidden = 0;
    m.cfg.ep = 1;
    snprintf(m.cfg.attention, sizeof m.cfg.attention, "dense");
    snprintf(m.cfg.dyn_kind, sizeof m.cfg.dyn_kind, "none");
    return m;
}

static double class_ms(const struct hw_pass *p, enum hw_op_class cls)
{
    double ms = 0;
    for (int i = 0; i < p->count; i++)
        if (p->op[i].cls == cls) ms += p->op[i].ms;
    return ms;
}

static double class_flops(const struct hw_pass *p, enum hw_op_class cls)
{
    double flops = 0;
    for (int i = 0; i < p->count; i++)
        if (p->op[i].cls == cls) flops += p->op[i].flops;
    return flops;
}

static void test_flops(void)
{
    struct hardware hw;
    char err[512];
    parse(&hw, good, err, sizeof err);
    struct hw_model m = tiny(&hw);
    double C = 8, N = 8, B = 2, T = 4;
    /* the four products: 2 N (3C^2 + C^2 + 4C^2 + 4C^2); causal attention:
     * scores and values over the T (T + 1) / 2 pairs, 2 x 2 C FLOPs each */
    double gemm = 2 * N * 12 * C * C, attention = B * T * (T + 1) / 2 * 4 * C;
    struct hw_block_state dense = {.active = 1, .tokens = 1, .tiles = 1};
    struct hw_pass f, b, u;
    hw_block_forward(&f, &m, &dense);
    hw_block_backward(&b, &m, &dense);
    hw_block_update(&u, &m, &dense);
    CHECK_NEAR(class_flops(&f, HW_GEMM), gemm, 0);
    CHECK_NEAR(class_flops(&f, HW_ATTENTION), attention, 0);
    CHECK_NEAR(class_flops(&b, HW_GEMM), 2 * gemm, 0);
    CHECK_NEAR(class_flops(&b, HW_ATTENTION), 2 * attention, 0);
    /* AdamW streams 36 bytes per parameter of 12 C^2 + 13 C */
    CHECK_NEAR(u.bytes, 36 * (12 * C * C + 13 * C), 0);

    /* MoD, half the tokens routed (packed): half the rows, n = 2 per sequence */
    struct hw_block_state half = dense;
    half.tokens = 0.5;
    hw_block_forward(&f, &m, &half);
    CHECK_NEAR(class_flops(&f, HW_GEMM), gemm / 2, 0);
    CHECK_NEAR(class_flops(&f, HW_ATTENTION), B * 2 * 3 / 2.0 * 4 * C, 0);

    /* early exit, half the tokens active: ln1 and K, V over every row, Q
     * and the rest over half; the query rows against their keys: half of
     * causal's pairs */
    struct hw_block_state exits = dense;
    exits.active = 0.5;
    hw_block_forward(&f, &m, &exits);
    hw_block_backward(&b, &m, &exits);
    CHECK_NEAR(class_flops(&f, HW_GEMM), 2 * N * 2 * C * C + 2 * (N / 2) * 10 * C * C, 0);
    CHECK_NEAR(class_flops(&b, HW_GEMM), 2 * (2 * N * 2 * C * C + 2 * (N / 2) * 10 * C * C), 0);
    CHECK_NEAR(class_flops(&f, HW_ATTENTION), attention / 2, 0);
    CHECK_NEAR(class_flops(&b, HW_ATTENTION), attention, 0);
    exits.active = 0;   /* every token gone: the input copied forward, nothing computed */
    hw_block_forward(&f, &m, &exits);
    CHECK(f.flops == 0 && f.count == 1 && f.bytes == 2 * 4 * N * C);

    /* frozen: forward as dense, no backward, no update */
    struct hw_block_state frozen = dense;
    frozen.frozen = 1;
    hw_block_forward(&f, &m, &frozen);
    hw_block_backward(&b, &m, &frozen);
    hw_block_update(&u, &m, &frozen);
    CHECK_NEAR(class_flops(&f, HW_GEMM), gemm, 0);
    CHECK(b.count == 0 && b.ms == 0 && u.ms == 0);

    /* sparsity below dyn.csr_sparsity: dense products; at 0.9: CSR on a tenth */
    struct hw_block_state sparse = dense;
    sparse.sparsity = 0.4;
    hw_block_forward(&f, &m, &sparse);
    CHECK_NEAR(class_flops(&f, HW_GEMM), gemm, 0);
    sparse.sparsity = 0.9;
    hw_block_forward(&f, &m, &sparse);
    CHECK_NEAR(class_flops(&f, HW_GEMM), 0.1 * gemm, 1e-9 * gemm);
    hw_block_backward(&b, &m, &sparse);
    CHECK_NEAR(class_flops(&b, HW_GEMM), 0.2 * gemm, 1e-9 * gemm);

    /* experts evenly loaded (g = 1): router 2 N C E, each of the N k pairs
     * through an expert of 4C: 2 x 2 C (4C) FLOPs */
    struct hw_block_state moe = dense;
    moe.busiest_load = 1;
    hw_block_forward(&f, &m, &moe);
    double moe_mlp = 2 * N * C * 4 + N * 2 * 2 * 2 * C * 4 * C;
    CHECK_NEAR(class_flops(&f, HW_GEMM), 2 * N * 4 * C * C + moe_mlp, 1e-9 * gemm);
    moe.busiest_load = 1.5;   /* the busiest rank: half again its rows */
    hw_block_forward(&f, &m, &moe);
    CHECK_NEAR(class_flops(&f, HW_GEMM),
               2 * N * 4 * C * C + 2 * N * C * 4 + 1.5 * N * 2 * 2 * 2 * C * 4 * C, 1e-9 * gemm);

    /* hash attention: the tiles' share of causal */
    snprintf(m.cfg.attention, sizeof m.cfg.attention, "hash");
    m.cfg.hash_buckets = 2;
    struct hw_block_state tiles = dense;
    tiles.tiles = 0.5;
    hw_block_forward(&f, &m, &tiles);
    CHECK_NEAR(class_flops(&f, HW_ATTENTION), 0.5 * attention * group_attention_even_share(4, 2),
               1e-12);
    CHECK_NEAR(group_attention_even_share(64, 2), 2.0 / 3.0, 1e-12);   /* 2 of 3 tiles of nt = 2 */
    CHECK_NEAR(group_attention_even_share(64, 1), 1, 0);
    CHECK_NEAR(group_attention_even_share(2048, 8), 8.0 * 8 * 9 / (64.0 * 65), 1e-12);

    /* an early-exit head: V C per active token forward */
    snprintf(m.cfg.attention, sizeof m.cfg.attention, "dense");
    struct hw_block_state head = dense;
    head.exit_head = 1;
    hw_block_forward(&f, &m, &head);
    CHECK_NEAR(class_flops(&f, HW_GEMM), gemm + 2 * N * 16 * C, 0);

    /* the head: logits 2 N C V forward, twice that backward */
    struct hw_pass hf, hb, hu;
    hw_head_passes(&hf, &hb, &hu, &m);
    CHECK_NEAR(class_flops(&hf, HW_GEMM), 2 * N * C * 16, 0);
    CHECK_NEAR(class_flops(&hb, HW_GEMM), 4 * N * C * 16, 0);
}

/* A machine where every op is compute- or memory-bound without overhead. */
static void test_scaling(void)
{
    struct hardware hw, fast;
    char err[512];
    parse(&hw, good, err, sizeof err);
    hw.op_overhead_us = 0;
    hw.bandwidth_gbs = hw.peak_bandwidth_gbs = 1e5;   /* GEMMs compute-bound */
    fast = hw;
    fast.gemm_peak_tflops *= 2;
    for (int p = 0; p < fast.gemm_points; p++) fast.gemm[p].tflops *= 2;
    struct hw_model m = tiny(&hw), mf = tiny(&fast);
    m.sequences = mf.sequences = 64;
    struct hw_block_state dense = {.active = 1, .tokens = 1, .tiles = 1};
    struct hw_pass a, b;
    hw_block_forward(&a, &m, &dense);
    hw_block_forward(&b, &mf, &dense);
    /* the GEMMs' compute halves; their epilogues (proj's and fcproj's
     * residual, fc's GELU) stream as before */
    double N = 64 * 4, C = 8, e = 4;
    double epilogues = 2 * 2 * e * N * C / (hw.bandwidth_gbs * 1e6) +
                       2 * e * N * 4 * C / (hw.gelu_gbs * 1e6);
    CHECK_NEAR(class_ms(&b, HW_GEMM) - epilogues, (class_ms(&a, HW_GEMM) - epilogues) / 2,
               1e-12 * class_ms(&a, HW_GEMM));
    CHECK_NEAR(class_ms(&b, HW_ATTENTION), class_ms(&a, HW_ATTENTION), 0);
    CHECK_NEAR(class_ms(&b, HW_MEMORY), class_ms(&a, HW_MEMORY), 0);
    /* twice the bandwidth halves the memory-bound ops (AdamW) */
    struct hardware wide = hw;
    wide.bandwidth_gbs *= 2;
    wide.adamw_gbs *= 2;
    struct hw_model mw = tiny(&wide);
    hw_block_update(&a, &m, &dense);
    hw_block_update(&b, &mw, &dense);
    CHECK_NEAR(b.ms, a.ms / 2, 1e-12 * a.ms);
    /* the overhead adds once per op */
    struct hardware slow = hw;
    slow.op_overhead_us = 100;
    struct hw_model ms = tiny(&slow);
    ms.sequences = m.sequences;
    hw_block_forward(&a, &m, &dense);
    hw_block_forward(&b, &ms, &dense);
    CHECK_NEAR(b.ms - a.ms, 0.1 * a.count, 1e-9);
    /* a link: latency + bytes / bandwidth */
    struct hw_link link = {10, 2};
    CHECK_NEAR(hardware_link_ms(&link, 4e6), 0.01 + 2, 1e-12);
    /* a stage: 16 bytes a parameter, activations per micro-batch in flight */
    double one = hw_stage_bytes(&m, 1000, 2, 1), three = hw_stage_bytes(&m, 1000, 2, 3);
    CHECK_NEAR(hw_stage_bytes(&m, 1000, 2, 0), 16000, 0);
    CHECK_NEAR(three - 16000, 3 * (one - 16000), 1e-6);
}

static const struct hw_op *find_op(const struct hw_pass *p, const char *name)
{
    for (int i = 0; i < p->count; i++)
        if (!strcmp(p->op[i].name, name)) return &p->op[i];
    return NULL;
}

/* The measured figures priced: each product's backward one op at the
 * backward points, attention by direction at its points, GELU's epilogue
 * added to its GEMM at gelu_gbs, the layernorm at layernorm_gbs, AdamW at
 * adamw_gbs with the overhead once per tensor. */
static void test_measured_prices(void)
{
    struct hardware hw;
    char text[4096], err[512];
    measured(text, sizeof text);
    parse(&hw, text, err, sizeof err);
    hw.op_overhead_us = 0;
    hw.peak_bandwidth_gbs = hw.bandwidth_gbs = 1e5;   /* the GEMMs compute-bound */
    struct hw_model m = tiny(&hw);
    m.sequences = 64;
    double C = 8, N = 64 * 4, e = 4;
    struct hw_block_state dense = {.active = 1, .tokens = 1, .tiles = 1};
    struct hw_pass f, b, u;
    hw_block_forward(&f, &m, &dense);
    hw_block_backward(&b, &m, &dense);
    CHECK_NEAR(class_flops(&b, HW_GEMM), 2 * class_flops(&f, HW_GEMM), 0);
    const struct hw_op *fc = find_op(&b, "fc backward"), *qkv = find_op(&b, "qkv backward");
    CHECK(fc && qkv && !find_op(&b, "fc dinp") && !find_op(&b, "qkv dweight"));
    if (qkv)
        CHECK_NEAR(qkv->ms, 4 * N * C * 3 * C / (hardware_gemm_backward_tflops(&hw, N, 3 * C, C)
                                                 * 1e9), 1e-12);
    const struct hw_op *att = find_op(&f, "attention"), *attb = find_op(&b, "attention backward");
    CHECK(att && attb);
    if (att && attb) {
        CHECK_NEAR(att->ms, att->flops / (hardware_attention_tflops(&hw, 4, 4, 0) * 1e9), 1e-12);
        CHECK_NEAR(attb->ms, attb->flops / (hardware_attention_tflops(&hw, 4, 4, 1) * 1e9),
                   1e-12);
    }
    /* hash attention: its tiles' FLOPs at the hash points' rate by direction */
    struct hw_model mh = m;
    snprintf(mh.cfg.attention, sizeof mh.cfg.attention, "hash");
    mh.cfg.hash_buckets = 2;
    struct hw_pass hf, hb;
    hw_block_forward(&hf, &mh, &dense);
    hw_block_backward(&hb, &mh, &dense);
    const struct hw_op *ha = find_op(&hf, "hash attention");
    const struct hw_op *hab = find_op(&hb, "hash attention backward");
    CHECK(ha && hab);
    if (ha && hab) {
        CHECK_NEAR(ha->ms, ha->flops / (0.01 * 1e9), 1e-12);
        CHECK_NEAR(hab->ms, hab->flops / (0.02 * 1e9), 1e-12);
    }
    /* GELU's epilogue: its bytes at gelu_gbs on top of the fc GEMM */
    struct hardware fast_gelu = hw;
    fast_gelu.gelu_gbs *= 2;
    struct hw_model mg = m;
    mg.hw = &fast_gelu;
    struct hw_pass g;
    hw_block_forward(&g, &mg, &dense);
    double gelu_ms = 2 * e * N * 4 * C / (hw.gelu_gbs * 1e6);
    CHECK_NEAR(find_op(&f, "fc")->ms - find_op(&g, "fc")->ms, gelu_ms / 2, 1e-12);
    CHECK_NEAR(find_op(&f, "ln1")->ms, 2 * e * N * C / (hw.layernorm_gbs * 1e6), 1e-12);
    /* AdamW: 28 bytes a parameter at adamw_gbs, the gradient's norm and
     * zeroing 4 each at bandwidth_gbs, and one overhead per tensor */
    double params = 12 * C * C + 13 * C;
    hw_block_update(&u, &m, &dense);
    CHECK_NEAR(u.ms, 28 * params / (hw.adamw_gbs * 1e6) + 8 * params / (hw.bandwidth_gbs * 1e6),
               1e-12);
    hw.op_overhead_us = 10;
    struct hw_pass u2;
    hw_block_update(&u2, &m, &dense);
    CHECK_NEAR(u2.ms - u.ms, 0.01 * (12 + 2), 1e-12);   /* 12 tensors, the norm, the zeroing */
    /* an MoE block: the 8 shared tensors, the router and 4 for each of
     * the rank's 4 experts */
    struct hw_block_state moe = dense;
    moe.busiest_load = 1;
    struct hw_pass with, without;
    hw_block_update(&with, &m, &moe);
    hw.op_overhead_us = 0;
    hw_block_update(&without, &m, &moe);
    CHECK_NEAR(with.ms - without.ms, 0.01 * (8 + 1 + 4 * 4 + 2), 1e-12);
}

static void test_write_back(void)
{
    struct hardware hw, back;
    char err[512];
    parse(&hw, good, err, sizeof err);
    char path[] = "/tmp/dynmo-test-hardware-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_MSG(hardware_write(&hw, path, "written by test_hardware\nsecond line", err,
                             sizeof err) == 0, "%s", err);
    FILE *f = fopen(path, "r");
    char text[16384];
    size_t n = f ? fread(text, 1, sizeof text, f) : 0;
    if (f) fclose(f);
    unlink(path);
    CHECK_MSG(hardware_parse_text(&back, text, n, path, err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(back.name, hw.name) && back.gemm_points == hw.gemm_points);
    CHECK_NEAR(back.gemm[0].tflops, hw.gemm[0].tflops, 0);
    CHECK_NEAR(back.collective_inter.bandwidth_gbs, hw.collective_inter.bandwidth_gbs, 0);
    CHECK_NEAR(back.op_overhead_us, hw.op_overhead_us, 0);

    /* the measured extras too */
    char text2[4096];
    measured(text2, sizeof text2);
    parse(&hw, text2, err, sizeof err);
    fd = mkstemp(strcpy(path, "/tmp/dynmo-test-hardware-XXXXXX"));
    CHECK(fd >= 0);
    close(fd);
    CHECK_MSG(hardware_write(&hw, path, "measured", err, sizeof err) == 0, "%s", err);
    f = fopen(path, "r");
    n = f ? fread(text, 1, sizeof text, f) : 0;
    if (f) fclose(f);
    unlink(path);
    CHECK_MSG(hardware_parse_text(&back, text, n, path, err, sizeof err) == 0, "%s", err);
    CHECK(back.backward_points == 2 && back.attention_points == 2 && back.hash_points == 1);
    CHECK(back.gelu_gbs == 20 && back.layernorm_gbs == 40 && back.adamw_gbs == 25);
    CHECK_NEAR(back.backward[0].tflops, 0.125, 0);
    CHECK_NEAR(back.attention[1].backward_tflops, 0.3, 0);
}

int main(void)
{
    test_good();
    test_bad();
    test_shipped();
    test_measured();
    test_gemm_table();
    test_flops();
    test_scaling();
    test_measured_prices();
    test_write_back();
    return testing_report("test_hardware");
}
