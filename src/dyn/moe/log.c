/* Mixture of experts in a run log, for inspect (the scheme's
 * summarise_log) and for simulate's cost model (the busiest expert rank of
 * each MoE block, moe_load_of_log): each MoE block's most and least loaded expert and its
 * dropped share over the logged steps, from /moe/tokens and /moe/dropped
 * (columns j * experts + e: MoE block j in layer order, expert e; a row
 * of -1 is a step the log does not hold). Reads through the caller's
 * reader only. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/balance.h"
#include "dynmo/moe.h"
#include "dyn/moe/log.h"
#include "dyn/scheme.h"

/* One MoE block's load over the logged steps. */
struct moe_load {
    int layer;                          /* global block index */
    double tokens, dropped;             /* routed and dropped token-expert pairs */
    int most, least;                    /* experts with the most and the fewest */
    double most_share, least_share;     /* their share of the block's routed pairs */
};

/* The counts: columns blocks x experts, the dropped as many rows, each
 * row a filler row of -1 or counts with 0 <= dropped <= routed. */
static void check_counts(const struct dyn_log_reader *rd, const int *tokens, const int *dropped,
                         long rows, int ncols, long drows, int dcols, int blocks)
{
    const struct dm_config *cfg = rd->cfg;
    char text[1200];
    if (!blocks || ncols != blocks * cfg->experts || drows != rows || dcols != ncols) {
        snprintf(text, sizeof text, "%s: /moe/tokens is [%ld, %d] and /moe/dropped [%ld, %d]; "
                 "model.layers, moe_every and experts (%d, %d, %d) give [steps, %d]", rd->path,
                 rows, ncols, drows, dcols, cfg->layers, cfg->moe_every, cfg->experts,
                 blocks * cfg->experts);
        rd->fail(rd->ctx, text);
    }
    for (long i = 0; i < rows * ncols; i++) {
        int filler = tokens[i - i % ncols] < 0;
        if (filler ? tokens[i] != -1 || dropped[i] != -1
                   : tokens[i] < 0 || dropped[i] < 0 || dropped[i] > tokens[i]) {
            snprintf(text, sizeof text, "%s: row %ld column %ld of /moe/tokens and "
                     "/moe/dropped: %d routed, %d dropped (a step's counts have 0 <= dropped "
                     "<= routed; a row the log does not hold is -1 throughout)", rd->path,
                     i / ncols, i % ncols, tokens[i], dropped[i]);
            rd->fail(rd->ctx, text);
        }
    }
}

/* Block j's load over the rows that are not filler. */
static void block_load(struct moe_load *m, const int *tokens, const int *dropped, long rows,
                       int ncols, int j, int E, double *per_expert)
{
    for (int e = 0; e < E; e++) per_expert[e] = 0.0;
    for (long r = 0; r < rows; r++) {
        if (tokens[r * ncols] < 0) continue;   /* filler */
        for (int e = 0; e < E; e++) {
            per_expert[e] += tokens[r * ncols + j * E + e];
            m->dropped += dropped[r * ncols + j * E + e];
        }
    }
    for (int e = 0; e < E; e++) {
        m->tokens += per_expert[e];
        if (per_expert[e] > per_expert[m->most]) m->most = e;
        if (per_expert[e] < per_expert[m->least]) m->least = e;
    }
    m->most_share = m->tokens > 0 ? per_expert[m->most] / m->tokens : 0.0;
    m->least_share = m->tokens > 0 ? per_expert[m->least] / m->tokens : 0.0;
}

static void write_expert(const struct dyn_summary_writer *w, const char *key, int expert,
                         double share)
{
    w->open(w->ctx, key);
    w->integer(w->ctx, "expert", expert);
    w->number(w->ctx, "share", share);
    w->close(w->ctx);
}

static void write_block(const struct dyn_summary_writer *w, const struct moe_load *m)
{
    char line[256];
    snprintf(line, sizeof line, "  %5d  %13.0f   expert %-3d %5.1f%%  expert %-3d %5.1f%%  %6.2f%%",
             m->layer, m->tokens, m->most, 100.0 * m->most_share, m->least,
             100.0 * m->least_share, m->tokens > 0 ? 100.0 * m->dropped / m->tokens : 0.0);
    w->line(w->ctx, line);
    w->open(w->ctx, NULL);
    w->integer(w->ctx, "layer", m->layer);
    w->number(w->ctx, "routed", m->tokens);
    w->number(w->ctx, "dropped", m->dropped);
    write_expert(w, "most_loaded", m->most, m->most_share);
    write_expert(w, "least_loaded", m->least, m->least_share);
    w->close(w->ctx);
}

static void write_loads(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w,
                        const int *tokens, const int *dropped, long rows, int ncols,
                        const struct gpt_shape *shape)
{
    int E = rd->cfg->experts, blocks = gpt_moe_block_count(shape);
    long steps = 0;
    for (long r = 0; r < rows; r++) steps += tokens[r * ncols] >= 0;
    char line[512];
    snprintf(line, sizeof line, "mixture of experts: %d MoE blocks of %d experts, top-%d, over "
             "%ld steps (token-expert pairs routed; shares of the block's pairs):", blocks, E,
             rd->cfg->top_k, steps);
    w->line(w->ctx, line);
    w->line(w->ctx, "  block   pairs routed   most loaded      least loaded     dropped");
    w->open(w->ctx, "moe");
    w->integer(w->ctx, "experts", E);
    w->integer(w->ctx, "top_k", rd->cfg->top_k);
    w->integer(w->ctx, "steps", steps);
    w->open_list(w->ctx, "blocks");
    double *per_expert = dm_alloc((size_t)E * sizeof(double));
    for (int layer = 0, j = 0; layer < shape->layers; layer++) {
        if (!gpt_block_is_moe(shape, layer)) continue;
        struct moe_load m = {.layer = layer};
        block_load(&m, tokens, dropped, rows, ncols, j++, E, per_expert);
        write_block(w, &m);
    }
    dm_free(per_expert);
    w->close(w->ctx);
    w->close(w->ctx);
}

void moe_summarise_log(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w)
{
    if (!rd->has(rd->ctx, "/moe/tokens")) return;
    struct gpt_shape shape = dyn_shape_from_config(rd->cfg);
    int *tokens = NULL, *dropped = NULL, ncols = 0, dcols = 0;
    long rows = rd->ints(rd->ctx, "/moe/tokens", &tokens, &ncols);
    long drows = rd->has(rd->ctx, "/moe/dropped")
                     ? rd->ints(rd->ctx, "/moe/dropped", &dropped, &dcols) : 0;
    check_counts(rd, tokens, dropped, rows, ncols, drows, dcols, gpt_moe_block_count(&shape));
    write_loads(rd, w, tokens, dropped, rows, ncols, &shape);
    dm_free(tokens);
    dm_free(dropped);
}

/* ---- the state of the cost model ------------------------------------------------ */

/* The busiest rank as the run measured it (/moe/rank_load, parallel.ep >
 * 1: over every expert group), spread onto the layers (dense blocks 0). */
static float *measured_rank_loads(const struct dyn_log_reader *rd, long rows, int L,
                                  const int *layer, int blocks)
{
    float *load = dyn_log_floats(rd, "/moe/rank_load", rows, blocks);
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    for (long i = 0; i < rows * L; i++) m[i] = 0.0f;
    for (long r = 0; r < rows; r++)
        for (int j = 0; j < blocks; j++) {
            float g = load[r * blocks + j];
            if (!(g >= 0.0f && g <= DYN_COST_BUSIEST_MAX)) {
                dm_free(load);
                dm_free(m);
                dyn_log_problem(rd, "%s: %s[%ld][%d] is %g (must be in [0, %g])", rd->path,
                            "/moe/rank_load", r, j, g, DYN_COST_BUSIEST_MAX);
            }
            m[r * L + layer[j]] = g > 0.0f ? g : 1.0f;
        }
    dm_free(load);
    return m;
}

/* The busiest rank's kept pairs of one block's step (kept: E experts' pairs)
 * over ep ranks under the placement cfg names: static, expert e on rank
 * e / (E / ep); balanced, the placement planner's order for these counts
 * (balance_placement_plan), and with moe.replicas_max = R its copies on
 * top (balance_copies_plan), as the controller decides them. order and
 * copies: scratch of E and R entries. */
static double busiest_rank(const double *kept, int E, int ep, const struct dm_config *cfg,
                           int *order, struct balance_copy *copies)
{
    balance_placement_identity(order, E);
    if (ep > 1 && strcmp(cfg->moe_placement, "balanced") == 0) {
        int *current = order + E;
        balance_placement_identity(current, E);
        balance_placement_plan(kept, E, ep, current, order);
        int n = cfg->replicas_max > 0
              ? balance_copies_plan(kept, order, E, ep, cfg->replicas_max, copies) : 0;
        return balance_copies_busiest(kept, order, E, ep, copies, n);
    }
    return balance_placement_busiest(kept, order, E, ep);
}

/* Older logs and ep = 1 are priced from the counts: a rank's load is the
 * pairs its experts kept (routed - dropped), summed over the expert
 * groups, its experts those of the placement (busiest_rank: static,
 * expert e on rank e / (E / ep) of its group, docs/moe.md; or the
 * planner's for moe.placement = balanced, with its copies), and the state
 * is the busiest rank's over routed / ep (with ep = 1 the kept share;
 * dropless, busiest over mean). A step's counts (not a filler row of -1)
 * have 0 <= dropped <= routed. */
static float *counted_rank_loads(const struct dyn_log_reader *rd, long rows, int L,
                                 const int *layer, int blocks)
{
    int E = rd->cfg->experts, ep = rd->cfg->ep, cols = blocks * E, dcols = 0;
    int *routed = dyn_log_ints(rd, "/moe/tokens", rows, cols), *dropped = NULL;
    if (rd->has(rd->ctx, "/moe/dropped") &&
        (rd->ints(rd->ctx, "/moe/dropped", &dropped, &dcols) < rows || dcols != cols)) {
        dm_free(routed);
        dm_free(dropped);
        dyn_log_problem(rd, "%s: %s does not match %s", rd->path, "/moe/dropped", "/moe/tokens");
    }
    float *m = dm_alloc((size_t)rows * L * sizeof(float));
    double *kept = dm_alloc((size_t)E * sizeof(double));
    int *order = dm_alloc((size_t)2 * E * sizeof(int));
    int copies_max = rd->cfg->replicas_max > 0 ? rd->cfg->replicas_max : 1;
    struct balance_copy *copies = dm_alloc((size_t)copies_max * sizeof *copies);
    for (long i = 0; i < rows * L; i++) m[i] = 0.0f;
    for (long r = 0; r < rows; r++) {
        if (routed[r * cols] < 0) {   /* a step this log does not hold */
            for (int l = 0; l < L; l++) m[r * L + l] = NAN;
            continue;
        }
        for (int j = 0; j < blocks; j++) {
            const int *c = routed + r * cols + (long)j * E;
            const int *d = dropped ? dropped + r * cols + (long)j * E : NULL;
            double total = 0;
            for (int e = 0; e < E; e++) {
                if (c[e] < 0 || (d && (d[e] < 0 || d[e] > c[e]))) {
                    int pairs = c[e], lost = d ? d[e] : 0;
                    dm_free(routed);
                    dm_free(dropped);
                    dm_free(m);
                    dm_free(kept);
                    dm_free(order);
                    dm_free(copies);
                    dyn_log_problem(rd, "%s: at step %ld expert %d of MoE block %d routed %d and "
                                "dropped %d pairs (need 0 <= dropped <= routed)", rd->path,
                                r + 1, e, j, pairs, lost);
                }
                total += c[e];
                kept[e] = c[e] - (d ? d[e] : 0);
            }
            double busiest = busiest_rank(kept, E, ep, rd->cfg, order, copies);
            m[r * L + layer[j]] = total > 0 ? (float)(busiest * ep / total) : 1.0f;
        }
    }
    dm_free(routed);
    dm_free(dropped);
    dm_free(kept);
    dm_free(order);
    dm_free(copies);
    return m;
}

float *moe_load_of_log(const struct dyn_log_reader *rd, const struct gpt_shape *shape, long rows)
{
    int L = shape->layers, blocks = 0;
    int *layer = dm_alloc((size_t)(L > 0 ? L : 1) * sizeof(int));
    for (int l = 0; l < L; l++)
        if (gpt_block_is_moe(shape, l)) layer[blocks++] = l;
    float *m = NULL;
    if (blocks && rd->cfg->ep > 1 && rd->has(rd->ctx, "/moe/rank_load"))
        m = measured_rank_loads(rd, rows, L, layer, blocks);
    else if (blocks && rd->has(rd->ctx, "/moe/tokens"))
        m = counted_rank_loads(rd, rows, L, layer, blocks);
    dm_free(layer);
    return m;
}
