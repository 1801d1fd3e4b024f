/* Gradual global magnitude pruning (dyn.kind=prune): the paper's section
 * 3.2.1 and Algorithm 1, with the schedule of Zhu & Gupta.
 *
 * At the pruning steps t0, t0 + dt, ..., t0 + n dt (dyn.prune_start,
 * dyn.prune_every, dyn.prune_steps), before the step runs, the target
 * sparsity s_t of the schedule is applied to the whole distributed model
 * at once: of the P prunable weights (the matrices qkv_w, attproj_w, fc_w
 * and fcproj_w of every block; embeddings, layernorms and biases are never
 * pruned) the K = P - round(s_t P) of largest magnitude are kept, the
 * rest become exactly zero for good. Ties are broken by the global index
 * of the weight (lower index kept), so the kept set is one well-defined
 * set: the same one that a single process holding the whole model picks,
 * on any layout. Every rank of the replica's pipeline takes part
 * (prune_global_cut); replicas hold identical weights and decide alike.
 * The global index is 32 bits, so a model has at most PRUNE_MAX_WEIGHTS
 * (2^32 - 1) prunable weights, refused beyond at start-up; every count of
 * weights and keys is a long (64 bits), since half that limit is already
 * past INT32_MAX.
 *
 * What a pruned block keeps (mask, CSR) lives in its slab and pack
 * (block_prune, docs/block-slab.md). A checkpoint saves parameters only,
 * with pruned weights exactly zero; after a resume past t0 the masks are
 * rebuilt from those zeros at the first step (a kept weight that is
 * exactly 0.0f in fp32 at that moment would be taken for pruned; we have
 * never seen one). With balance.units = sublayer a stage prunes the
 * matrices of the halves it computes, and the two stages of a block split
 * between them trade their parts of its mask (trade_split_masks), so the
 * cut and the masks are those of whole blocks. This file must not look at
 * the layout or at timings. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dyn/prune.h"
#include "dyn/scheme.h"

struct prune {
    struct dm_config cfg;
    MPI_Comm comm;
    int started;            /* masks rebuilt (resume) at the first step */
    double sparsity;        /* in force now, whole model */
};

/* ---- the schedule --------------------------------------------------------- */

double prune_schedule_at(const struct dm_config *cfg, int step)
{
    int t0 = cfg->prune_start, dt = cfg->prune_every, n = cfg->prune_steps;
    if (step < t0 || (step - t0) % dt != 0 || (step - t0) / dt > n) return -1.0;
    double progress = (double)(step - t0) / ((double)n * dt);
    double rest = 1.0 - progress;
    return cfg->sparsity_final + (cfg->sparsity_initial - cfg->sparsity_final) * rest * rest * rest;
}

double prune_sparsity_in_force(const struct dm_config *cfg, int step)
{
    if (step < cfg->prune_start) return 0.0;
    int j = (step - cfg->prune_start) / cfg->prune_every;
    if (j > cfg->prune_steps) j = cfg->prune_steps;
    return prune_schedule_at(cfg, cfg->prune_start + j * cfg->prune_every);
}

/* ---- keys and selection ------------------------------------------------------ */

uint64_t prune_key(float weight, uint32_t global_index)
{
    return block_prune_key(weight, global_index);
}

static void swap_keys(uint64_t *a, uint64_t *b)
{
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Reorders a[0..n) so that a[k] is the k-th smallest (0-based), with
 * nothing larger before it and nothing smaller after it. Quickselect with
 * a median-of-three pivot; deterministic. */
static void select_kth(uint64_t *a, long n, long k)
{
    long lo = 0, hi = n - 1;
    while (hi > lo) {
        long mid = lo + (hi - lo) / 2;
        if (a[mid] < a[lo]) swap_keys(&a[mid], &a[lo]);
        if (a[hi] < a[lo]) swap_keys(&a[hi], &a[lo]);
        if (a[hi] < a[mid]) swap_keys(&a[hi], &a[mid]);
        uint64_t pivot = a[mid];
        long i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) swap_keys(&a[i++], &a[j--]);
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return;
    }
}

/* Counts of weights and keys are longs: 64 bits, far above PRUNE_MAX_WEIGHTS. */
_Static_assert(sizeof(long) >= 8, "prune counts weights in long, which must have 64 bits");

long prune_model_weights(int layers, int channels)
{
    return (long)layers * (long)block_matrix_weights(channels);
}

int prune_check_model(int layers, int channels, char *err, size_t errsize)
{
    long weights = prune_model_weights(layers, channels);
    if (weights <= PRUNE_MAX_WEIGHTS) return 0;
    snprintf(err, errsize, "dyn.kind = prune: model.layers = %d x 12 x model.channels^2 = %ld "
             "prunable weights, more than the %ld (2^32 - 1) that the 32-bit global index of "
             "the tie-break numbers (use fewer layers or channels)", layers, weights,
             PRUNE_MAX_WEIGHTS);
    return -1;
}

long prune_keep_count(long total, double sparsity)
{
    return total - (long)llround(sparsity * (double)total);
}

uint64_t prune_gather_cut(MPI_Comm comm, const uint64_t *candidates, long count, long keep,
                          long total, long round_keys)
{
    DM_ASSERT(keep >= 0 && keep <= total && total <= PRUNE_MAX_WEIGHTS && count >= 0 &&
              round_keys >= 1);
    if (keep == 0) return UINT64_MAX;
    if (keep == total) return 0;
    long pruned = total - keep;
    int top = keep <= pruned;
    long want = top ? keep : pruned;
    int rank, size;
    WORLD_MPI(MPI_Comm_rank(comm, &rank));
    WORLD_MPI(MPI_Comm_size(comm, &size));
    /* Every rank learns every count, so that all agree on the rounds. */
    long *counts = dm_alloc((size_t)size * sizeof(long));
    MPI_Request req;
    WORLD_MPI(MPI_Iallgather(&count, 1, MPI_LONG, counts, 1, MPI_LONG, comm, &req));
    world_wait(&req);
    long gathered = 0, most = 0;
    for (int r = 0; r < size; r++) {
        gathered += counts[r];
        if (counts[r] > most) most = counts[r];
    }
    DM_ASSERT(gathered >= want);
    /* MPI's counts and displacements are ints: a round takes at most
     * `share` keys from each rank, round_keys (<= INT_MAX) from all. */
    long share = round_keys / size > 0 ? round_keys / size : 1;
    if (share > INT_MAX / size) share = INT_MAX / size;
    long rounds = (most + share - 1) / share;
    uint64_t *all = NULL;
    int *round_counts = NULL, *displs = NULL;
    if (rank == 0) {
        all = dm_alloc((size_t)gathered * sizeof(uint64_t));
        round_counts = dm_alloc((size_t)size * sizeof(int));
        displs = dm_alloc((size_t)size * sizeof(int));
    }
    long filled = 0;   /* keys in all so far (rank 0) */
    for (long round = 0; round < rounds; round++) {
        long from = round * share;
        int mine = (int)(count > from ? (count - from < share ? count - from : share) : 0);
        if (rank == 0) {
            int in_round = 0;
            for (int r = 0; r < size; r++) {
                long left = counts[r] > from ? counts[r] - from : 0;
                round_counts[r] = (int)(left < share ? left : share);
                displs[r] = in_round;
                in_round += round_counts[r];
            }
            WORLD_MPI(MPI_Igatherv(mine ? candidates + from : candidates, mine, MPI_UINT64_T,
                                   all + filled, round_counts, displs, MPI_UINT64_T, 0, comm,
                                   &req));
            filled += in_round;
        } else {
            WORLD_MPI(MPI_Igatherv(mine ? candidates + from : candidates, mine, MPI_UINT64_T,
                                   NULL, NULL, NULL, MPI_UINT64_T, 0, comm, &req));
        }
        world_wait(&req);
    }
    uint64_t cut = 0;
    if (rank == 0) {
        DM_ASSERT(filled == gathered);
        if (top) {
            select_kth(all, gathered, gathered - keep);
            cut = all[gathered - keep] - 1;   /* keys > cut: the keep largest */
        } else {
            select_kth(all, gathered, pruned - 1);
            cut = all[pruned - 1];            /* keys <= cut: the pruned smallest */
        }
        dm_free(all);
        dm_free(round_counts);
        dm_free(displs);
    }
    dm_free(counts);
    WORLD_MPI(MPI_Ibcast(&cut, 1, MPI_UINT64_T, 0, comm, &req));
    world_wait(&req);
    return cut;
}

uint64_t prune_global_cut(MPI_Comm comm, uint64_t *keys, long n, long keep, long total)
{
    DM_ASSERT(keep >= 0 && keep <= total && total <= PRUNE_MAX_WEIGHTS);
    if (keep == 0) return UINT64_MAX;
    if (keep == total) return 0;
    long pruned = total - keep;
    int top = keep <= pruned;   /* send whichever side is smaller */
    long want = top ? keep : pruned;
    long m = want < n ? want : n;
    const uint64_t *send = keys;
    if (top) {
        if (m < n) select_kth(keys, n, n - m);
        send = keys + (n - m);
    } else if (m < n) {
        select_kth(keys, n, m - 1);
    }
    return prune_gather_cut(comm, send, m, keep, total, INT_MAX);
}

/* The key of ascending rank `rank` (0-based) among all ranks' keys: eight
 * rounds of 8 bits, each summing the ranks' histograms of the keys that
 * share the bits found so far. */
static uint64_t select_rank(MPI_Comm comm, prune_histogram_fn histogram, void *ctx, long rank)
{
    uint64_t prefix = 0;
    long counts[DM_PRUNE_BUCKETS], sums[DM_PRUNE_BUCKETS];
    for (int shift = 56; shift >= 0; shift -= 8) {
        memset(counts, 0, sizeof counts);
        histogram(counts, ctx, prefix, shift);
        MPI_Request req;
        WORLD_MPI(MPI_Iallreduce(counts, sums, DM_PRUNE_BUCKETS, MPI_LONG, MPI_SUM, comm, &req));
        world_wait(&req);
        int digit = 0;   /* the next 8 bits of the key */
        while (rank >= sums[digit]) {
            rank -= sums[digit++];
            DM_ASSERT(digit < DM_PRUNE_BUCKETS);
        }
        prefix |= (uint64_t)digit << shift;
    }
    return prefix;
}

uint64_t prune_radix_cut(MPI_Comm comm, prune_histogram_fn histogram, void *ctx, long keep,
                         long total)
{
    DM_ASSERT(keep >= 0 && keep <= total && total <= PRUNE_MAX_WEIGHTS);
    if (keep == 0) return UINT64_MAX;
    if (keep == total) return 0;
    long pruned = total - keep;
    if (keep <= pruned)   /* prune_global_cut's cut: the keep-th largest key minus 1 */
        return select_rank(comm, histogram, ctx, pruned) - 1;
    return select_rank(comm, histogram, ctx, pruned - 1);
}

/* ---- the scheme ----------------------------------------------------------------- */

static void prune_check(const struct dm_config *cfg)
{
    if (strcmp(cfg->dyn_kind, "prune") != 0) return;
    char initial[32], final[32];   /* as read: 0.5 and 0.50000001 differ */
    dm_format_shortest(initial, sizeof initial, cfg->sparsity_initial);
    dm_format_shortest(final, sizeof final, cfg->sparsity_final);
    if (cfg->sparsity_initial > cfg->sparsity_final)
        dm_user_error("dyn.sparsity_initial = %s is above dyn.sparsity_final = %s: pruning "
                      "never restores weights (make sparsity_initial <= sparsity_final)",
                      initial, final);
    if (cfg->sparsity_final >= 1.0)
        dm_user_error("dyn.sparsity_final = %s would prune every weight (use a value below 1)",
                      final);
    char err[320];
    if (prune_check_model(cfg->layers, cfg->channels, err, sizeof err))
        dm_user_error("%s", err);
}

static void *prune_create(const struct dm_config *cfg, const struct dyn_env *env)
{
    struct prune *pr = dm_alloc(sizeof *pr);
    pr->cfg = *cfg;
    pr->comm = env->pipeline_comm;
    return pr;
}

static void prune_destroy(void *state, struct gpt *model)
{
    (void)model;
    dm_free(state);
}

/* The matrix weights this rank computes: every matrix of a block held
 * whole, a half's own (balance.units = sublayer; block_owns_matrix), so
 * that a block split over two stages counts once in the selection. */
static long owned_weights(const struct gpt *model)
{
    long n = 0;
    for (int b = 0; b < model->num_blocks; b++)
        for (int m = 0; m < BLOCK_MATRICES; m++)
            if (block_owns_matrix(&model->blocks[b], m))
                n += (long)block_tensor_size(model->shape.channels, block_matrix_tensor(m));
    return n;
}

/* The keys of the matrix weights this rank computes (owned_weights of
 * them, block by block), each block's weights read on the host (a copy
 * down on a device). */
static void prune_keys(uint64_t *keys, const struct gpt *model, size_t per_block)
{
    long n = 0;
    for (int b = 0; b < model->num_blocks; b++) {
        const struct block *blk = &model->blocks[b];
        float *staging = backend_staging(blk->slab_floats * sizeof(float));
        struct block view = block_host_view(blk, staging, 1);
        uint32_t base = (uint32_t)((size_t)blk->index * per_block), i = 0;
        for (int m = 0; m < BLOCK_MATRICES; m++) {
            int t = block_matrix_tensor(m);
            size_t count = block_tensor_size(blk->C, t);
            if (block_owns_matrix(blk, m))
                for (size_t e = 0; e < count; e++)
                    keys[n++] = prune_key(view.p[t][e], base + i + (uint32_t)e);
            i += (uint32_t)count;
        }
        backend_staging_free(staging);
    }
}

/* The mask of a block's matrix weights: key > cut where this rank
 * computes the matrix, 0 where another stage does (its part comes by
 * trade_split_masks). */
static void mask_of_cut(unsigned char *mask, const struct block *blk, uint64_t cut)
{
    float *staging = backend_staging(blk->slab_floats * sizeof(float));
    struct block view = block_host_view(blk, staging, 1);
    uint32_t base = (uint32_t)((size_t)blk->index * block_matrix_weights(blk->C)), i = 0;
    for (int m = 0; m < BLOCK_MATRICES; m++) {
        int t = block_matrix_tensor(m);
        size_t count = block_tensor_size(blk->C, t);
        int own = block_owns_matrix(blk, m);
        for (size_t e = 0; e < count; e++, i++)
            mask[i] = own && prune_key(view.p[t][e], base + i) > cut;
    }
    backend_staging_free(staging);
}

/* balance.units = sublayer: a block whose attention is this stage's last
 * unit has its MLP on the next stage, one whose MLP is this stage's
 * first has its attention on the previous (the pipeline's ranks are its
 * stages in order). Each side prunes its own half's matrices; the two
 * trade their parts of the mask, so that both hold the whole block's, as
 * a block held whole does: the same kept count and CSR decision, and a
 * migrating half carries the whole mask. Collective between neighbours. */
static void trade_split_masks(struct prune *pr, struct gpt *model)
{
    if (!model->num_blocks) return;
    int rank;
    WORLD_MPI(MPI_Comm_rank(pr->comm, &rank));
    struct block *ends[2] = {&model->blocks[0], &model->blocks[model->num_blocks - 1]};
    MPI_Request reqs[4];
    unsigned char *received[2] = {NULL, NULL};
    int n = 0;
    for (int e = 0; e < 2; e++) {
        struct block *blk = ends[e];
        int mine = e ? BLOCK_HALF_ATTENTION : BLOCK_HALF_MLP;
        if (blk->halves != mine || !blk->sparse) continue;
        int other = e ? BLOCK_HALF_MLP : BLOCK_HALF_ATTENTION, peer = e ? rank + 1 : rank - 1;
        size_t offset, count, other_offset, other_count;
        block_half_mask_range(blk->C, mine, &offset, &count);
        block_half_mask_range(blk->C, other, &other_offset, &other_count);
        received[e] = dm_alloc(other_count);
        DM_ASSERT(count <= INT_MAX && other_count <= INT_MAX);
        WORLD_MPI(MPI_Isend(blk->sparse->mask + offset, (int)count, MPI_UNSIGNED_CHAR, peer,
                            blk->index, pr->comm, &reqs[n++]));
        WORLD_MPI(MPI_Irecv(received[e], (int)other_count, MPI_UNSIGNED_CHAR, peer, blk->index,
                            pr->comm, &reqs[n++]));
    }
    world_wait_all(n, reqs);
    for (int e = 0; e < 2; e++) {
        if (!received[e]) continue;
        block_prune_join_mask(ends[e], e ? BLOCK_HALF_MLP : BLOCK_HALF_ATTENTION, received[e],
                              pr->cfg.csr_sparsity);
        dm_free(received[e]);
    }
}

/* This rank's histogram for prune_radix_cut: the table's prune_histogram
 * over every matrix of every block of its models, where the weights live. */
struct device_histogram {
    struct gpt *const *models;
    int count;
    long *counts, *partial;   /* device: (DM_PRUNE_BUCKETS), (chunks, DM_PRUNE_BUCKETS) */
};

static void device_histogram(long *counts, void *ctx, uint64_t prefix, int shift)
{
    const struct device_histogram *dh = ctx;
    const struct dm_backend *ops = backend_current();
    ops->zero(dh->counts, DM_PRUNE_BUCKETS * sizeof(long));
    for (int c = 0; c < dh->count; c++) {
        const struct gpt *model = dh->models[c];
        for (int b = 0; b < model->num_blocks; b++) {
            const struct block *blk = &model->blocks[b];
            uint32_t base = (uint32_t)((size_t)blk->index * block_matrix_weights(blk->C));
            for (int m = 0; m < BLOCK_MATRICES; m++) {
                int t = block_matrix_tensor(m);
                long count = (long)block_tensor_size(blk->C, t);
                if (block_owns_matrix(blk, m))
                    ops->prune_histogram(dh->counts, dh->partial, blk->p[t], count, base,
                                         prefix, shift);
                base += (uint32_t)count;
            }
        }
    }
    ops->copy_to_host(counts, dh->counts, DM_PRUNE_BUCKETS * sizeof(long));
}

/* On a device: the cut by the radix select over histograms made where the
 * weights live, and each block masked there (only histograms and masks
 * come down). The same cut as prune_global_cut's, bit for bit. */
static void prune_on_device(struct prune *pr, struct gpt *const *models, int count, long keep,
                            long total)
{
    const struct dm_backend *ops = backend_current();
    int C = models[0]->shape.channels;
    long largest = (long)block_tensor_size(C, BP_FC_W);   /* the largest matrix */
    long chunks = (largest + DM_PRUNE_CHUNK - 1) / DM_PRUNE_CHUNK;
    struct device_histogram dh = {
        .models = models,
        .count = count,
        .counts = ops->alloc(DM_PRUNE_BUCKETS * sizeof(long)),
        .partial = ops->alloc((size_t)(chunks ? chunks : 1) * DM_PRUNE_BUCKETS * sizeof(long)),
    };
    uint64_t cut = prune_radix_cut(pr->comm, device_histogram, &dh, keep, total);
    ops->free(dh.counts);
    ops->free(dh.partial);
    unsigned char *mask = ops->alloc(block_matrix_weights(C));
    for (int c = 0; c < count; c++)
        for (int b = 0; b < models[c]->num_blocks; b++)
            block_prune_cut(&models[c]->blocks[b], cut, mask, pr->cfg.csr_sparsity);
    ops->free(mask);
}

/* On the CPU: the keys of every block of the rank's models (its chunks,
 * one after the other), prune_global_cut, the mask keys > cut. */
static void prune_on_host(struct prune *pr, struct gpt *const *models, int count, long keep,
                          long total)
{
    size_t per_block = block_matrix_weights(models[0]->shape.channels);
    long n = 0;
    for (int c = 0; c < count; c++) n += owned_weights(models[c]);
    uint64_t *keys = dm_alloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    long at = 0;   /* the keys of the chunks before c */
    for (int c = 0; c < count; c++) {
        prune_keys(keys + at, models[c], per_block);
        at += owned_weights(models[c]);
    }
    uint64_t cut = prune_global_cut(pr->comm, keys, n, keep, total);
    dm_free(keys);
    /* the selection reordered the keys: the mask reads the weights again */
    unsigned char *mask = dm_alloc(per_block);
    for (int c = 0; c < count; c++)
        for (int b = 0; b < models[c]->num_blocks; b++) {
            mask_of_cut(mask, &models[c]->blocks[b], cut);
            block_prune(&models[c]->blocks[b], mask, pr->cfg.csr_sparsity);
        }
    dm_free(mask);
}

static void prune_to(struct prune *pr, struct gpt *const *models, int count, double sparsity)
{
    const struct gpt_shape *shape = &models[0]->shape;
    long total = prune_model_weights(shape->layers, shape->channels);
    long keep = prune_keep_count(total, sparsity);
    if (backend_current()->host_access)
        prune_on_host(pr, models, count, keep, total);
    else
        prune_on_device(pr, models, count, keep, total);
    for (int c = 0; c < count; c++) trade_split_masks(pr, models[c]);
    pr->sparsity = sparsity;
}

static void prune_before_step(void *state, struct gpt *const *models, int count, int step)
{
    struct prune *pr = state;
    if (!pr->started) {
        pr->started = 1;
        pr->sparsity = prune_sparsity_in_force(&pr->cfg, step - 1);
        /* A resume past the first pruning step: blocks come from the
         * checkpoint without masks; their pruned weights are the zeros. */
        if (pr->sparsity > 0.0)
            for (int c = 0; c < count; c++) {
                for (int b = 0; b < models[c]->num_blocks; b++)
                    if (!models[c]->blocks[b].sparse)
                        block_prune(&models[c]->blocks[b], NULL, pr->cfg.csr_sparsity);
                trade_split_masks(pr, models[c]);
            }
    }
    double target = prune_schedule_at(&pr->cfg, step);
    if (target <= 0.0) return;   /* not a pruning step, or nothing to prune yet */
    prune_to(pr, models, count, target);
}

static void prune_after_reduce(void *state, struct gpt *const *models, int count, int step,
                               const double *block_sumsq)
{
    (void)state;
    (void)models;
    (void)count;
    (void)step;
    (void)block_sumsq;
}

static void prune_describe(const void *state, struct gpt *const *models, int count, char *buf,
                           size_t size)
{
    const struct prune *pr = state;
    int csr = 0, blocks = 0;
    for (int c = 0; c < count; c++) {
        blocks += models[c]->num_blocks;
        for (int b = 0; b < models[c]->num_blocks; b++)
            csr += models[c]->blocks[b].sparse && models[c]->blocks[b].sparse->use_csr;
    }
    snprintf(buf, size, "sparsity %.1f%% (here: %d/%d blocks in CSR)", 100.0 * pr->sparsity, csr,
             blocks);
}

/* The pruned share of the block's matrices: a block split over two
 * stages (both hold its whole mask) counts where its MLP is. */
static void read_sparsity(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    const struct block *blk = &model->blocks[i];
    value[0] = blk->halves == BLOCK_HALF_ATTENTION ? 0.0 : block_matrix_sparsity(blk);
}

/* A block's sparsity from the schedule alone. */
static float sparsity_of_config(const struct dm_config *cfg, int step)
{
    return (float)prune_sparsity_in_force(cfg, step);
}

static const struct dyn_signal prune_signals[] = {
    {.dataset = "/layers/sparsity",
     .label = "sparsity",
     .unit = "share",
     .meaning = "the pruned share of the block's matrix weights",
     .columns = DYN_SIGNAL_LAYERS,
     .combine = DYN_COMBINE_REPLICA0,
     .read = read_sparsity,
     .figure_label = "sparsity",
     .figure_unit = "share",
     .cost = DYN_COST_SPARSITY,
     .cost_name = "sparsity",
     .cost_dataset = "/layers/sparsity",
     .neutral = 0.0f,
     .cost_of_config = sparsity_of_config},
};

static const char *const prune_config_keys[] = {"dyn.prune_start", "dyn.prune_every", "dyn.prune_steps",
                                         "dyn.sparsity_initial", "dyn.sparsity_final",
                                         "dyn.csr_sparsity", NULL};

const struct dyn_scheme dyn_scheme_prune = {
    .name = "prune",
    .kind = "prune",
    .keys = prune_config_keys,
    .check = prune_check,
    .title = "pruning",
    DYN_SIGNALS(prune_signals),
    .create = prune_create,
    .destroy = prune_destroy,
    .before_step = prune_before_step,
    .after_reduce = prune_after_reduce,
    .describe = prune_describe,
};
