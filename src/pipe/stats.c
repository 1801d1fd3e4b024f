/* The engine's statistics (engine_internal.h): each step, every rank's
 * profile (compute, wait, per-block times, memory, sparsity, update time
 * and the signals of the active schemes, dynmo/dyn.h) is gathered on rank 0 into struct step_stats, with the
 * bubble ratio and the imbalance (the paper's Eq. 2); on traced steps
 * (run.trace_from) every instruction's start, wall and CPU time too.
 * Must not: decide anything from the numbers (the balancer does). */
#include <math.h>
#include <string.h>
#include <time.h>
#include "pipe/engine_internal.h"

/* Doubles a rank sends for a traced step: its count and step start, then
 * TRACE_FIELDS per instruction, room for the longest list. */
static size_t trace_block(const struct engine *eng)
{
    return 2 + (size_t)TRACE_FIELDS * SCHEDULE_MAX_INSTRS(eng->micro_batches * eng->virtual);
}

double engine_thread_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The per-unit fields of a rank's profile, in this order at 4 + k U (U
 * units: the layers, or twice as many with balance.units = sublayer). */
enum { PROFILE_FWD, PROFILE_BWD, PROFILE_MEM, PROFILE_SPARSITY, PROFILE_UPDATE, PROFILE_WGRAD,
       PROFILE_FIELDS };

/* The six figures of struct step_stats per layer and per unit, in the
 * profile's order: where engine_stats_alloc puts them and
 * engine_stats_free finds them. */
struct profile_figures {
    double **layer[PROFILE_FIELDS], **unit[PROFILE_FIELDS];
};

static struct profile_figures profile_figures(struct step_stats *st)
{
    return (struct profile_figures){
        .layer = {[PROFILE_FWD] = &st->layer_fwd_ms,       [PROFILE_BWD] = &st->layer_bwd_ms,
                  [PROFILE_MEM] = &st->layer_mem_bytes,    [PROFILE_SPARSITY] = &st->layer_sparsity,
                  [PROFILE_UPDATE] = &st->layer_update_ms, [PROFILE_WGRAD] = &st->layer_wgrad_ms},
        .unit = {[PROFILE_FWD] = &st->unit_fwd_ms,       [PROFILE_BWD] = &st->unit_bwd_ms,
                 [PROFILE_MEM] = &st->unit_mem_bytes,    [PROFILE_SPARSITY] = &st->unit_sparsity,
                 [PROFILE_UPDATE] = &st->unit_update_ms, [PROFILE_WGRAD] = &st->unit_wgrad_ms}};
}

/* The signals the run writes (dyn_signals) and, per signal, where its
 * (value, weight) pairs sit in a rank's profile: layer by layer, cell by
 * cell, after the fixed part. */
static void signals_alloc(struct engine *eng)
{
    const struct dyn_signal *list[DYN_SIGNALS_MAX];
    struct step_stats *st = &eng->stats;
    int L = eng->shape.layers, n = dyn_signals(&eng->cfg, list, DYN_SIGNALS_MAX);
    int at = 5 + PROFILE_FIELDS * st->units;
    st->signal_count = n;
    st->signals = dm_alloc((size_t)(n ? n : 1) * sizeof *st->signals);
    eng->signal_at = dm_alloc((size_t)(n ? n : 1) * sizeof(int));
    for (int k = 0; k < n; k++) {
        struct dyn_signal_row *row = &st->signals[k];
        row->signal = list[k];
        row->columns = dyn_signal_width(list[k], &eng->shape);
        row->values = dm_alloc((size_t)(row->columns ? row->columns : 1) * sizeof(double));
        eng->signal_at[k] = at;
        at += 2 * L * dyn_signal_cells(list[k], &eng->shape);
    }
    eng->gather_len = at;
}

void engine_stats_alloc(struct engine *eng)
{
    const struct pipe_grid *g = &eng->grid;
    int L = eng->shape.layers, S = g->stages;
    struct step_stats *st = &eng->stats;
    if (eng->cfg.trace_from > 0) {
        size_t block = trace_block(eng);
        eng->trace_mine = dm_alloc(block * sizeof(double));
        if (g->rank == 0) {
            eng->trace_all = dm_alloc(block * (size_t)g->world_size * sizeof(double));
            st->trace = dm_alloc((size_t)g->world_size *
                                 SCHEDULE_MAX_INSTRS(eng->micro_batches * eng->virtual) *
                                 STEP_TRACE_COLUMNS * sizeof(float));
        }
    }
    st->units = L * (eng->sublayer ? 2 : 1);
    struct profile_figures figures = profile_figures(st);
    for (int k = 0; k < PROFILE_FIELDS; k++) {
        *figures.layer[k] = dm_alloc((size_t)L * sizeof(double));
        *figures.unit[k] = dm_alloc((size_t)st->units * sizeof(double));
    }
    st->stage_update_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_compute_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_wait_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_peak_mb = dm_alloc((size_t)S * sizeof(double));
    st->layout = dm_alloc((size_t)S * sizeof(int));
    st->chunks = eng->virtual > 1 ? S * eng->virtual : 0;
    st->chunk_layout = st->chunks ? dm_alloc((size_t)st->chunks * sizeof(int)) : NULL;
    /* per rank: loss sum, compute, wait, peak, then fwd/bwd/mem/sparsity/
     * update/wgrad per unit, then the stage's update, then the signals */
    signals_alloc(eng);
    eng->gather_send = dm_alloc((size_t)eng->gather_len * sizeof(double));
    eng->gather_recv = dm_alloc((size_t)eng->gather_len * g->world_size * sizeof(double));
    eng->gather_req = MPI_REQUEST_NULL;
}

void engine_stats_free(struct engine *eng)
{
    world_wait(&eng->gather_req);
    struct step_stats *st = &eng->stats;
    struct profile_figures figures = profile_figures(st);
    for (int k = 0; k < PROFILE_FIELDS; k++) {
        dm_free(*figures.layer[k]);
        dm_free(*figures.unit[k]);
    }
    for (int k = 0; k < st->signal_count; k++) dm_free(st->signals[k].values);
    dm_free(st->signals);
    dm_free(eng->signal_at);
    dm_free(st->stage_update_ms);
    dm_free(st->trace);
    dm_free(eng->trace_mine);
    dm_free(eng->trace_all);
    dm_free(st->stage_compute_ms);
    dm_free(st->stage_wait_ms);
    dm_free(st->stage_peak_mb);
    dm_free(st->layout);
    dm_free(st->chunk_layout);
    dm_free(eng->gather_send);
    dm_free(eng->gather_recv);
}

void engine_trace_record(struct engine *eng, const struct schedule_instr *in, double wall,
                         double cpu)
{
    double *r = eng->trace_mine + 2 + (size_t)TRACE_FIELDS * eng->trace_count++;
    r[0] = in->op;
    r[1] = in->micro_batch;
    r[2] = (wall - eng->step_t0) * 1e3;
    r[3] = (dm_now() - wall) * 1e3;
    r[4] = (engine_thread_cpu_seconds() - cpu) * 1e3;
}

/* This rank's values of every signal for its blocks: at the signal's
 * place, layer by layer, cell by cell, (value, weight) pairs; a block that
 * is not one of the signal's scheme's gives none. */
static void pack_signals(struct engine *eng, double *v)
{
    struct gpt *m = &eng->model;
    const struct step_stats *st = &eng->stats;
    for (int k = 0; k < st->signal_count; k++) {
        const struct dyn_signal *signal = st->signals[k].signal;
        int cells = dyn_signal_cells(signal, &eng->shape);
        double *value = dm_alloc(2 * (size_t)cells * sizeof(double)), *weight = value + cells;
        for (int i = 0; i < m->num_blocks; i++) {
            int layer = m->first_block + i;
            if (!dyn_signal_layer(signal, &eng->shape, layer)) continue;
            if (m->blocks[i].halves == BLOCK_HALF_ATTENTION && dyn_signal_in_mlp_unit(signal))
                continue;   /* the stage of the block's MLP gives them */
            for (int c = 0; c < cells; c++) value[c] = weight[c] = 0.0;
            signal->read(m, i, value, weight);
            double *x = v + eng->signal_at[k] + 2 * (size_t)layer * cells;
            for (int c = 0; c < cells; c++) {
                x[2 * c] = value[c];
                x[2 * c + 1] = weight[c];
            }
        }
        dm_free(value);
    }
}

/* Block i's figures at unit u of the profile v (U units). */
static void pack_unit(double *v, int U, int u, double fwd, double bwd, double mem,
                      double sparsity, double update, double wgrad)
{
    v[4 + PROFILE_FWD * U + u] = fwd;
    v[4 + PROFILE_BWD * U + u] = bwd;
    v[4 + PROFILE_MEM * U + u] = mem;
    v[4 + PROFILE_SPARSITY * U + u] = sparsity;
    v[4 + PROFILE_UPDATE * U + u] = update;
    v[4 + PROFILE_WGRAD * U + u] = wgrad;
}

/* With sublayer units, the halves of block i this rank holds: forward
 * and backward as measured apart (gpt_forward), the slab's bytes by each
 * half's floats (the header and dynamic state with the attention), the
 * update time by each half's share of the parameters held, and under zb
 * each half's weight part (gpt_backward_weight). */
static void pack_halves(const struct engine *eng, double *v, int U, int i)
{
    const struct gpt *m = &eng->model;
    const struct block *blk = &m->blocks[i];
    int layer = m->first_block + i;
    size_t offset, attention;
    block_half_range(blk, BLOCK_HALF_ATTENTION, &offset, &attention);
    double pack = (double)block_pack_size(blk);
    double attention_bytes = pack - 3.0 * sizeof(float) * (double)(blk->nparams - attention);
    double share = blk->halves == BLOCK_HALF_ATTENTION ? 1.0
                   : blk->halves == BLOCK_HALF_MLP     ? 0.0
                                                       : (double)attention / (double)blk->nparams;
    if (blk->halves != BLOCK_HALF_MLP)
        pack_unit(v, U, 2 * layer, m->attention_fwd_s[i], m->attention_bwd_s[i],
                  attention_bytes, block_half_sparsity(blk, BLOCK_HALF_ATTENTION),
                  m->block_update_s[i] * share, m->attention_wgrad_s[i]);
    if (blk->halves != BLOCK_HALF_ATTENTION)
        pack_unit(v, U, 2 * layer + 1, m->block_fwd_s[i] - m->attention_fwd_s[i],
                  m->block_bwd_s[i] - m->attention_bwd_s[i], pack - attention_bytes,
                  block_half_sparsity(blk, BLOCK_HALF_MLP), m->block_update_s[i] * (1.0 - share),
                  m->block_wgrad_s[i] - m->attention_wgrad_s[i]);
}

/* The current chunk's units and signals into the profile v. */
static void pack_chunk(struct engine *eng, double *v)
{
    struct gpt *m = &eng->model;
    int U = eng->stats.units;
    for (int i = 0; i < m->num_blocks; i++) {
        if (eng->sublayer) {
            pack_halves(eng, v, U, i);
            continue;
        }
        pack_unit(v, U, m->first_block + i, m->block_fwd_s[i], m->block_bwd_s[i],
                  (double)block_pack_size(&m->blocks[i]), block_matrix_sparsity(&m->blocks[i]),
                  m->block_update_s[i], m->block_wgrad_s[i]);
    }
    pack_signals(eng, v);
}

/* This rank's profile of the step into eng->gather_send: loss sum,
 * compute, wait, peak memory, then per unit (at its column: a block's
 * layer, or its halves' with sublayer units) forward, backward, slab
 * bytes, sparsity, update time and the weight parts' time (zb), then the
 * stage's update time, then the signals; the units of every chunk. */
static void pack_profile(struct engine *eng, float loss_sum)
{
    double *v = eng->gather_send;
    memset(v, 0, (size_t)eng->gather_len * sizeof(double));
    v[0] = loss_sum;
    v[1] = eng->compute_s;
    v[2] = eng->wait_s;
    v[3] = (double)dm_peak_rss_bytes();
    for (int c = 0; c < eng->virtual; c++) {
        engine_use_chunk(eng, c);
        pack_chunk(eng, v);
    }
    engine_use_chunk(eng, 0);
    v[4 + PROFILE_FIELDS * eng->stats.units] = eng->update_s;
}

static void clear_stats(struct step_stats *st, int S)
{
    for (int k = 0; k < st->signal_count; k++)
        for (int c = 0; c < st->signals[k].columns; c++) st->signals[k].values[c] = 0.0;
    for (int u = 0; u < st->units; u++) {
        st->unit_fwd_ms[u] = st->unit_bwd_ms[u] = st->unit_mem_bytes[u] = 0.0;
        st->unit_sparsity[u] = st->unit_update_ms[u] = st->unit_wgrad_ms[u] = 0.0;
    }
    for (int s = 0; s < S; s++) {
        st->stage_compute_ms[s] = st->stage_wait_ms[s] = st->stage_peak_mb[s] = 0.0;
        st->stage_update_ms[s] = 0.0;
    }
}

/* Rank 0: one column of a signal, its (value, weight) pair at `at` of
 * every rank's profile, combined as the signal declares. */
static double combine_column(const struct engine *eng, enum dyn_signal_combine combine, size_t at)
{
    const struct pipe_grid *g = &eng->grid;
    double sum = 0.0, weights = 0.0, most = 0.0;
    double forwards = (double)eng->micro_batches * g->replicas;
    int holders = 0;
    for (int r = 0; r < g->world_size; r++) {
        const double *x = eng->gather_recv + (size_t)r * eng->gather_len + at;
        int first = r / g->stages == 0;
        switch (combine) {
        case DYN_COMBINE_SUM: sum += x[0]; break;
        case DYN_COMBINE_REPLICA0: if (first) sum += x[0]; break;
        case DYN_COMBINE_REPLICA_MEAN: sum += x[0] / g->replicas; break;
        case DYN_COMBINE_RATIO: sum += x[0]; weights += x[1]; break;
        case DYN_COMBINE_PER_FORWARD: if (first) sum += x[0] / forwards; break;
        case DYN_COMBINE_BUSIEST:
            if (!(x[1] > 0)) break;
            most = x[0] > most ? x[0] : most;
            sum += x[0];
            holders++;
            break;
        }
    }
    if (combine == DYN_COMBINE_RATIO) return weights > 0 ? sum / weights : 0.0;
    if (combine == DYN_COMBINE_BUSIEST) return sum > 0 ? most * holders / sum : 0.0;
    return sum;
}

/* Rank 0: every signal's row, its columns the layers of its scheme's
 * blocks (all layers for a per-layer signal) times its cells. */
static void fold_signals(struct engine *eng)
{
    struct step_stats *st = &eng->stats;
    int L = eng->shape.layers;
    for (int k = 0; k < st->signal_count; k++) {
        struct dyn_signal_row *row = &st->signals[k];
        int cells = dyn_signal_cells(row->signal, &eng->shape), column = 0;
        for (int l = 0; l < L; l++) {
            if (!dyn_signal_layer(row->signal, &eng->shape, l)) continue;
            for (int c = 0; c < cells; c++)
                row->values[column++] = combine_column(
                    eng, row->signal->combine, eng->signal_at[k] + 2 * ((size_t)l * cells + c));
        }
        DM_ASSERT(column == row->columns);
    }
}

/* Rank 0: the layer figures from the units': a block's two halves
 * summed (sparsity: the halves' matrix weights' mean), or the same with
 * whole-block units. */
static void layers_of_units(struct step_stats *st, int L)
{
    int per = st->units / L;
    for (int l = 0; l < L; l++) {
        const int u = per * l;
        st->layer_fwd_ms[l] = st->unit_fwd_ms[u];
        st->layer_bwd_ms[l] = st->unit_bwd_ms[u];
        st->layer_mem_bytes[l] = st->unit_mem_bytes[u];
        st->layer_sparsity[l] = st->unit_sparsity[u];
        st->layer_update_ms[l] = st->unit_update_ms[u];
        st->layer_wgrad_ms[l] = st->unit_wgrad_ms[u];
        if (per == 1) continue;
        st->layer_fwd_ms[l] += st->unit_fwd_ms[u + 1];
        st->layer_bwd_ms[l] += st->unit_bwd_ms[u + 1];
        st->layer_mem_bytes[l] += st->unit_mem_bytes[u + 1];
        st->layer_sparsity[l] = (st->unit_sparsity[u] + 2.0 * st->unit_sparsity[u + 1]) / 3.0;
        st->layer_update_ms[l] += st->unit_update_ms[u + 1];
        st->layer_wgrad_ms[l] += st->unit_wgrad_ms[u + 1];
    }
}

/* Rank 0: folds every rank's profile into eng->stats: stage figures are
 * the maximum over replicas, block figures replica 0's, the bubble the
 * idle share of all ranks, the imbalance Eq. 2 over the stages, the
 * signals as each declares. */
static void fold_profiles(struct engine *eng, double step_s)
{
    const struct pipe_grid *g = &eng->grid;
    int L = eng->shape.layers, S = g->stages;
    struct step_stats *st = &eng->stats;
    double mb_count = (double)eng->micro_batches;
    float loss_total = 0.0f;
    for (int r = 0; r < g->replicas; r++)
        loss_total += (float)eng->gather_recv[(size_t)rank_of(g, S - 1, r) * eng->gather_len];
    st->loss = loss_total / (float)(eng->micro_batches * g->replicas);
    st->step_ms = step_s * 1e3;
    int U = st->units;
    clear_stats(st, S);
    engine_stage_units(eng, st->layout);
    if (st->chunks) memcpy(st->chunk_layout, eng->layout, (size_t)st->chunks * sizeof(int));
    double idle = 0.0, cmax = 0.0, cmin = INFINITY, csum = 0.0;
    for (int r = 0; r < g->world_size; r++) {
        const double *x = eng->gather_recv + (size_t)r * eng->gather_len;
        int s = r % S, rep = r / S;
        const double *update = x + 4 + PROFILE_FIELDS * U;
        if (x[1] * 1e3 > st->stage_compute_ms[s]) st->stage_compute_ms[s] = x[1] * 1e3;
        if (x[2] * 1e3 > st->stage_wait_ms[s]) st->stage_wait_ms[s] = x[2] * 1e3;
        if (x[3] / 1048576.0 > st->stage_peak_mb[s]) st->stage_peak_mb[s] = x[3] / 1048576.0;
        if (update[0] * 1e3 > st->stage_update_ms[s]) st->stage_update_ms[s] = update[0] * 1e3;
        double busy = x[1] > step_s ? step_s : x[1];
        idle += step_s - busy;
        if (rep == 0)
            for (int u = 0; u < U; u++) {
                st->unit_fwd_ms[u] += x[4 + PROFILE_FWD * U + u] * 1e3 / mb_count;
                st->unit_bwd_ms[u] += x[4 + PROFILE_BWD * U + u] * 1e3 / mb_count;
                st->unit_wgrad_ms[u] += x[4 + PROFILE_WGRAD * U + u] * 1e3 / mb_count;
                st->unit_mem_bytes[u] += x[4 + PROFILE_MEM * U + u];
                st->unit_sparsity[u] += x[4 + PROFILE_SPARSITY * U + u];
                st->unit_update_ms[u] += x[4 + PROFILE_UPDATE * U + u] * 1e3;
            }
    }
    layers_of_units(st, L);
    for (int s = 0; s < S; s++) {
        double c = st->stage_compute_ms[s];
        cmax = c > cmax ? c : cmax;
        cmin = c < cmin ? c : cmin;
        csum += c;
    }
    st->imbalance = csum > 0 ? (cmax - cmin) / (csum / S) : 0.0;
    fold_signals(eng);
    st->bubble_ratio = step_s > 0 ? idle / (g->world_size * step_s) : 0.0;
}

void engine_gather_stats(struct engine *eng, float loss_sum, double step_s)
{
    pack_profile(eng, loss_sum);
    world_wait(&eng->gather_req);   /* the previous step's gather (non-root ranks) */
    WORLD_MPI(MPI_Igather(eng->gather_send, eng->gather_len, MPI_DOUBLE, eng->gather_recv,
                          eng->gather_len, MPI_DOUBLE, 0, MPI_COMM_WORLD, &eng->gather_req));
    if (eng->grid.rank != 0) return;
    world_wait(&eng->gather_req);
    fold_profiles(eng, step_s);
}

void engine_gather_trace(struct engine *eng, int step)
{
    const struct pipe_grid *g = &eng->grid;
    size_t block = trace_block(eng);
    eng->trace_mine[0] = eng->trace_count;
    eng->trace_mine[1] = eng->step_t0 * 1e3;
    MPI_Request req;
    WORLD_MPI(MPI_Igather(eng->trace_mine, (int)block, MPI_DOUBLE, eng->trace_all, (int)block,
                       MPI_DOUBLE, 0, MPI_COMM_WORLD, &req));
    world_wait(&req);
    if (g->rank != 0) return;
    struct step_stats *st = &eng->stats;
    int rows = 0;
    for (int r = 0; r < g->world_size; r++) {
        const double *x = eng->trace_all + (size_t)r * block;
        for (int k = 0; k < (int)x[0]; k++) {
            const double *e = x + 2 + (size_t)TRACE_FIELDS * k;
            float *row = st->trace + (size_t)rows++ * STEP_TRACE_COLUMNS;
            row[0] = (float)(step + 1);
            row[1] = (float)r;
            row[2] = (float)(r % g->stages);
            row[3] = (float)e[0];
            row[4] = (float)e[1];
            /* on one node all ranks read the same clock: starts from rank 0's */
            row[5] = (float)(e[2] + x[1] - eng->trace_all[1]);
            row[6] = (float)e[3];
            row[7] = (float)e[4];
        }
    }
    st->trace_rows = rows;
}
