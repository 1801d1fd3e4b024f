/* The engine's statistics (engine_internal.h): each step, every rank's
 * profile (compute, wait, per-block times, memory, sparsity, active share,
 * update time) is gathered on rank 0 into struct step_stats, with the
 * bubble ratio and the imbalance (the paper's Eq. 2); on traced steps
 * (run.trace_from) every instruction's start, wall and CPU time too.
 * Must not: decide anything from the numbers (the balancer does). */
#include <math.h>
#include <string.h>
#include <time.h>
#include "pipe/engine_internal.h"

/* A rank's gathered values of one MoE block: per expert the routed and
 * dropped pairs and the bias, then the aux and z losses, then the rows
 * its experts took (parallel.ep > 1). */
#define MOE_RECORD(experts) (3 * (experts) + 3)

/* Doubles a rank sends for a traced step: its count and step start, then
 * TRACE_FIELDS per instruction, room for the longest list. */
static size_t trace_block(const struct engine *eng)
{
    return 2 + (size_t)TRACE_FIELDS * SCHEDULE_MAX_INSTRS(eng->micro_batches);
}

double engine_thread_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
                                 SCHEDULE_MAX_INSTRS(eng->micro_batches) *
                                 STEP_TRACE_COLUMNS * sizeof(float));
        }
    }
    st->layer_fwd_ms = dm_alloc((size_t)L * sizeof(double));
    st->layer_bwd_ms = dm_alloc((size_t)L * sizeof(double));
    st->layer_mem_bytes = dm_alloc((size_t)L * sizeof(double));
    st->layer_sparsity = dm_alloc((size_t)L * sizeof(double));
    st->layer_active = dm_alloc((size_t)L * sizeof(double));
    st->layer_update_ms = dm_alloc((size_t)L * sizeof(double));
    st->layer_tiles = dm_alloc((size_t)L * sizeof(double));
    st->layer_own_key_only = dm_alloc((size_t)L * sizeof(double));
    st->layer_mod_tokens = dm_alloc((size_t)L * sizeof(double));
    st->layer_mod_bce = dm_alloc((size_t)L * sizeof(double));
    st->stage_update_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_compute_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_wait_ms = dm_alloc((size_t)S * sizeof(double));
    st->stage_peak_mb = dm_alloc((size_t)S * sizeof(double));
    st->layout = dm_alloc((size_t)S * sizeof(int));
    /* MoE: per MoE block, experts x (tokens, dropped, bias), aux, z */
    st->moe_blocks = gpt_moe_block_count(&eng->shape);
    st->experts = st->moe_blocks ? eng->shape.moe.experts : 0;
    size_t moe_cells = (size_t)st->moe_blocks * (size_t)st->experts;
    if (st->moe_blocks) {
        st->moe_tokens = dm_alloc(moe_cells * sizeof(double));
        st->moe_dropped = dm_alloc(moe_cells * sizeof(double));
        st->moe_bias = dm_alloc(moe_cells * sizeof(double));
        st->moe_aux = dm_alloc((size_t)st->moe_blocks * sizeof(double));
        st->moe_z = dm_alloc((size_t)st->moe_blocks * sizeof(double));
        st->moe_rank_load = dm_alloc((size_t)st->moe_blocks * sizeof(double));
    }
    /* per rank: loss sum, compute, wait, peak, then fwd/bwd/mem/sparsity/active/
     * update per layer, then the stage's update, then the MoE blocks' values,
     * then hash attention's query rows and those with their own key alone,
     * the MoD predictors' BCE, the MoD blocks' tokens and hash attention's
     * tiles per layer */
    eng->gather_len = 5 + 6 * L + st->moe_blocks * MOE_RECORD(st->experts) + 5 * L;
    eng->gather_send = dm_alloc((size_t)eng->gather_len * sizeof(double));
    eng->gather_recv = dm_alloc((size_t)eng->gather_len * g->world_size * sizeof(double));
    eng->gather_req = MPI_REQUEST_NULL;
}

void engine_stats_free(struct engine *eng)
{
    world_wait(&eng->gather_req);
    struct step_stats *st = &eng->stats;
    dm_free(st->layer_fwd_ms);
    dm_free(st->layer_bwd_ms);
    dm_free(st->layer_mem_bytes);
    dm_free(st->layer_sparsity);
    dm_free(st->layer_active);
    dm_free(st->layer_update_ms);
    dm_free(st->layer_tiles);
    dm_free(st->layer_own_key_only);
    dm_free(st->layer_mod_tokens);
    dm_free(st->layer_mod_bce);
    dm_free(st->moe_tokens);
    dm_free(st->moe_dropped);
    dm_free(st->moe_bias);
    dm_free(st->moe_aux);
    dm_free(st->moe_z);
    dm_free(st->moe_rank_load);
    dm_free(st->stage_update_ms);
    dm_free(st->trace);
    dm_free(eng->trace_mine);
    dm_free(eng->trace_all);
    dm_free(st->stage_compute_ms);
    dm_free(st->stage_wait_ms);
    dm_free(st->stage_peak_mb);
    dm_free(st->layout);
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

/* This rank's profile of the step into eng->gather_send: loss sum,
 * compute, wait, peak memory, then per block (at its layer's column)
 * forward, backward, slab bytes, sparsity, active share and update time,
 * then the stage's update time. */
static void pack_profile(struct engine *eng, float loss_sum)
{
    struct gpt *m = &eng->model;
    int L = eng->shape.layers;
    double *v = eng->gather_send;
    memset(v, 0, (size_t)eng->gather_len * sizeof(double));
    v[0] = loss_sum;
    v[1] = eng->compute_s;
    v[2] = eng->wait_s;
    v[3] = (double)dm_peak_rss_bytes();
    for (int i = 0; i < m->num_blocks; i++) {
        int layer = m->first_block + i;
        v[4 + layer] = m->block_fwd_s[i];
        v[4 + L + layer] = m->block_bwd_s[i];
        v[4 + 2 * L + layer] = (double)block_pack_size(&m->blocks[i]);
        v[4 + 3 * L + layer] = block_matrix_sparsity(&m->blocks[i]);
        const struct gpt_exit *x = m->exit;
        v[4 + 4 * L + layer] = x && x->layer_tokens && x->layer_tokens[layer] > 0
                                   ? x->layer_computed[layer] / x->layer_tokens[layer] : 1.0;
        v[4 + 5 * L + layer] = m->block_update_s[i];
    }
    v[4 + 6 * L] = eng->update_s;
    /* MoE blocks: the step's counts over the replicas (reduce.c), bias, losses */
    int E = eng->stats.experts;
    for (int i = 0; i < m->num_blocks; i++) {
        const struct block_moe *moe = m->blocks[i].moe;
        if (!moe) continue;
        double *x = v + 5 + 6 * L +
                    (size_t)gpt_moe_ordinal(&eng->shape, m->first_block + i) * MOE_RECORD(E);
        for (int e = 0; e < E; e++) {
            x[e] = (double)moe->tokens[e];
            x[E + e] = (double)moe->dropped[e];
            x[2 * E + e] = moe->bias[e];
        }
        x[3 * E] = moe->aux;
        x[3 * E + 1] = moe->z;
        x[3 * E + 2] = engine_expert_parallel_take_rows(eng, m->first_block + i);
    }
    for (int i = 0; i < m->num_blocks; i++) {   /* hash attention, then zeroed */
        struct block *blk = &m->blocks[i];
        v[eng->gather_len - L + m->first_block + i] = blk->hash_tiles;
        v[eng->gather_len - 5 * L + m->first_block + i] = blk->hash_queries;
        v[eng->gather_len - 4 * L + m->first_block + i] = blk->hash_own_key_only;
        blk->hash_tiles = blk->hash_queries = blk->hash_own_key_only = 0.0;
        struct block_mod *mod = m->blocks[i].mod;   /* mixture of depths, then zeroed */
        if (!mod) continue;
        v[eng->gather_len - 2 * L + m->first_block + i] = mod->tokens;
        v[eng->gather_len - 3 * L + m->first_block + i] =
            mod->bce_forwards ? mod->bce / (double)mod->bce_forwards : 0.0;
        mod->tokens = mod->bce = 0.0;
        mod->bce_forwards = 0;
    }
}

static void clear_stats(struct step_stats *st, int L, int S, const int *layout)
{
    size_t cells = (size_t)st->moe_blocks * (size_t)st->experts;
    for (size_t c = 0; c < cells; c++)
        st->moe_tokens[c] = st->moe_dropped[c] = st->moe_bias[c] = 0.0;
    for (int j = 0; j < st->moe_blocks; j++)
        st->moe_aux[j] = st->moe_z[j] = st->moe_rank_load[j] = 0.0;
    for (int l = 0; l < L; l++) {
        st->layer_fwd_ms[l] = st->layer_bwd_ms[l] = st->layer_mem_bytes[l] = 0.0;
        st->layer_sparsity[l] = st->layer_active[l] = st->layer_update_ms[l] = 0.0;
        st->layer_tiles[l] = st->layer_mod_tokens[l] = st->layer_mod_bce[l] = 0.0;
        st->layer_own_key_only[l] = 0.0;
    }
    for (int s = 0; s < S; s++) {
        st->stage_compute_ms[s] = st->stage_wait_ms[s] = st->stage_peak_mb[s] = 0.0;
        st->stage_update_ms[s] = 0.0;
        st->layout[s] = layout[s];
    }
}

/* A replica-0 rank's MoE values (zero for the blocks it does not hold)
 * into the stats: each MoE block has one such rank. */
static void fold_moe(struct step_stats *st, const double *x, double forwards)
{
    int E = st->experts;
    for (int j = 0; j < st->moe_blocks; j++) {
        const double *b = x + (size_t)j * MOE_RECORD(E);
        for (int e = 0; e < E; e++) {
            st->moe_tokens[j * E + e] += b[e];
            st->moe_dropped[j * E + e] += b[E + e];
            st->moe_bias[j * E + e] += b[2 * E + e];
        }
        st->moe_aux[j] += b[3 * E] / forwards;
        st->moe_z[j] += b[3 * E + 1] / forwards;
    }
}

/* Rank 0, parallel.ep > 1: each MoE block's busiest expert-parallel rank
 * over the mean, from the rows each rank of its stage (every replica, so
 * every expert group) took; a rank holds the block when it reported its
 * slab's size. */
static void fold_rank_load(struct engine *eng)
{
    struct step_stats *st = &eng->stats;
    int L = eng->shape.layers, E = st->experts;
    if (eng->cfg.ep <= 1) return;
    for (int l = 0; l < L; l++) {
        if (!gpt_block_is_moe(&eng->shape, l)) continue;
        int j = gpt_moe_ordinal(&eng->shape, l), holders = 0;
        double most = 0.0, sum = 0.0;
        for (int r = 0; r < eng->grid.world_size; r++) {
            const double *x = eng->gather_recv + (size_t)r * eng->gather_len;
            if (!(x[4 + 2 * L + l] > 0)) continue;
            double rows = x[5 + 6 * L + (size_t)j * MOE_RECORD(E) + 3 * E + 2];
            most = rows > most ? rows : most;
            sum += rows;
            holders++;
        }
        st->moe_rank_load[j] = sum > 0 ? most * holders / sum : 0.0;
    }
}

/* Rank 0: folds every rank's profile into eng->stats: stage figures are
 * the maximum over replicas, block figures replica 0's, the bubble the
 * idle share of all ranks, the imbalance Eq. 2 over the stages. */
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
    clear_stats(st, L, S, eng->layout);
    double idle = 0.0, cmax = 0.0, cmin = INFINITY, csum = 0.0;
    double *queries = dm_alloc((size_t)L * sizeof(double));   /* hash attention's rows */
    for (int r = 0; r < g->world_size; r++) {
        const double *x = eng->gather_recv + (size_t)r * eng->gather_len;
        int s = r % S, rep = r / S;
        if (x[1] * 1e3 > st->stage_compute_ms[s]) st->stage_compute_ms[s] = x[1] * 1e3;
        if (x[2] * 1e3 > st->stage_wait_ms[s]) st->stage_wait_ms[s] = x[2] * 1e3;
        if (x[3] / 1048576.0 > st->stage_peak_mb[s]) st->stage_peak_mb[s] = x[3] / 1048576.0;
        if (x[4 + 6 * L] * 1e3 > st->stage_update_ms[s]) st->stage_update_ms[s] = x[4 + 6 * L] * 1e3;
        double busy = x[1] > step_s ? step_s : x[1];
        idle += step_s - busy;
        if (rep == 0)
            for (int l = 0; l < L; l++) {
                st->layer_fwd_ms[l] += x[4 + l] * 1e3 / mb_count;
                st->layer_bwd_ms[l] += x[4 + L + l] * 1e3 / mb_count;
                st->layer_mem_bytes[l] += x[4 + 2 * L + l];
                st->layer_sparsity[l] += x[4 + 3 * L + l];
                st->layer_active[l] += x[4 + 4 * L + l];
                st->layer_update_ms[l] += x[4 + 5 * L + l] * 1e3;
            }
        if (rep == 0) fold_moe(st, x + 5 + 6 * L, mb_count * g->replicas);
        for (int l = 0; l < L; l++) st->layer_tiles[l] += x[eng->gather_len - L + l];
        for (int l = 0; l < L; l++) {
            queries[l] += x[eng->gather_len - 5 * L + l];
            st->layer_own_key_only[l] += x[eng->gather_len - 4 * L + l];
        }
        for (int l = 0; l < L; l++) st->layer_mod_tokens[l] += x[eng->gather_len - 2 * L + l];
        for (int l = 0; l < L; l++)   /* each replica's mean over its forwards */
            st->layer_mod_bce[l] += x[eng->gather_len - 3 * L + l] / g->replicas;
    }
    for (int l = 0; l < L; l++)   /* the rows with their own key alone, as a share */
        st->layer_own_key_only[l] = queries[l] > 0 ? st->layer_own_key_only[l] / queries[l] : 0.0;
    dm_free(queries);
    for (int s = 0; s < S; s++) {
        double c = st->stage_compute_ms[s];
        cmax = c > cmax ? c : cmax;
        cmin = c < cmin ? c : cmin;
        csum += c;
    }
    st->imbalance = csum > 0 ? (cmax - cmin) / (csum / S) : 0.0;
    fold_rank_load(eng);
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
