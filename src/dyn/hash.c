/* Hash-sparse attention (Pagliardini et al. 2023; model.attention = hash,
 * [hash]; docs/mod-hash.md), the whole scheme: its config rules and
 * refusals, its extension of the blocks (every block's attention core is
 * the op table's group_attention_* with a rotation drawn from (seed,
 * layer, step), over the batch or over a MoD block's packed sequences),
 * its signals (tiles visited, query rows with their own key only) and its
 * part of the checkpoint. The kernel itself is src/model/
 * group_attention.c (and the plugin's). Nothing here calls MPI or reads
 * a layout. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/schema.h"
#include "dyn/hash.h"
#include "dyn/scheme.h"

#define SCHEMA_FILE "../../checkpoint_schema/hash.def"
#define SCHEMA_NAME hash_schema
#define SCHEMA_STATIC
#include "dynmo/schema_tables.h"
#undef SCHEMA_FILE
#undef SCHEMA_NAME
#undef SCHEMA_STATIC

static int hash_active(const struct dm_config *cfg) { return !strcmp(cfg->attention, "hash"); }

static const char *const hash_keys[] = {"hash.*", NULL};

static void hash_check(const struct dm_config *cfg)
{
    int hash = hash_active(cfg);
    if (!hash && strcmp(cfg->attention, "dense") != 0)
        dm_user_error("model.attention = '%s' must be dense or hash", cfg->attention);
    if (!hash && dyn_keys_set(cfg, hash_keys))
        dm_user_error("hash.buckets = %d is set but model.attention = dense: set "
                      "model.attention = hash, or remove [hash]", cfg->hash_buckets);
    if (!hash) return;
    if (cfg->hash_buckets < 1 || (cfg->hash_buckets > 1 && cfg->hash_buckets % 2))
        dm_user_error("hash.buckets = %d must be 1 or an even number >= 2 (the hash is the "
                      "argmax over [xR ; -xR], R with buckets / 2 columns)",
                      cfg->hash_buckets);
    if (cfg->hash_buckets > cfg->max_seq)
        dm_user_error("hash.buckets = %d exceeds model.max_seq = %d: a sequence has fewer "
                      "tokens than buckets (at most max_seq buckets)", cfg->hash_buckets,
                      cfg->max_seq);
}

/* The schemes it does not combine with (dyn_config_validate refuses them). */
static const struct dyn_refusal hash_refuses[] = {
    {"early_exit", "exited tokens answer as keys outside the hash buckets"},
    {NULL, NULL},
};

/* ---- the block extension: every block's attention core ------------------------------ */

/* Its parameters in a shape (gpt_shape.ext). */
struct hash_params {
    int buckets;                 /* 1, or even */
    uint32_t seed_lo, seed_hi;   /* the run's seed (train.seed) */
};
static const struct gpt_ext_ops hash_ext_ops;

/* What a block's hash attention counted since the last read: tiles
 * visited (forward and backward), query rows (per head) its forwards saw,
 * and those of them that attended to their own key alone. */
struct block_hash {
    int buckets;
    uint64_t seed;
    double tiles, queries, own_key_only;
};

static const struct hash_params *hash_params_of(const struct gpt_shape *shape)
{
    return gpt_shape_ext_params(shape, &hash_ext_ops);
}

static void hash_shape_add(struct gpt_shape *shape, int buckets, uint64_t seed)
{
    struct hash_params p = {.buckets = buckets, .seed_lo = (uint32_t)seed,
                            .seed_hi = (uint32_t)(seed >> 32)};
    gpt_shape_add_ext(shape, &hash_ext_ops, &p, sizeof p);
}

static int hash_owns(const struct gpt_ext *ext, const struct gpt_shape *shape, int index)
{
    (void)ext;
    (void)shape;
    (void)index;
    return 1;   /* every block attends by buckets */
}

static void *hash_alloc(const struct gpt_ext *ext, const struct gpt_shape *shape,
                        struct block *blk, float *params, float *grads)
{
    (void)shape;
    (void)blk;
    (void)params;
    (void)grads;
    const struct hash_params *p = (const struct hash_params *)ext->params;
    struct block_hash *h = dm_alloc(sizeof *h);
    h->buckets = p->buckets;
    h->seed = (uint64_t)p->seed_lo | ((uint64_t)p->seed_hi << 32);
    return h;
}

static void hash_free(void *state) { dm_free(state); }

static struct block_hash *block_hash_of(const struct block *blk)
{
    return block_ext_state(blk, &hash_ext_ops);
}

/* What the forward saves for the backward. */
struct hash_acts {
    int B, T;
    float *lse;         /* (B,NH,T) */
    int *order;         /* (B,NH,2,T) */
    int *bucket;        /* (B,NH,2,T) */
    float *rotation;    /* (NH, hs, nb/2) */
    /* lse, order, bucket and rotation are the backend's memory; the
     * rotation is drawn on the host, in this staging on a device (NULL on
     * the CPU, which draws in place), and copied up once per forward */
    float *rotation_host;
    size_t rotation_bytes;
};

static void hash_acts_free(void *acts)
{
    struct hash_acts *ha = acts;
    const struct dm_backend *ops = backend_current();
    ops->free(ha->lse);
    ops->free(ha->order);
    ops->free(ha->bucket);
    ops->free(ha->rotation);
    backend_staging_free(ha->rotation_host);
    dm_free(ha);
}

/* The block's saved state, allocated by the first forward for the acts'
 * (B, T); freed with the acts. */
static struct hash_acts *hash_acts_get(const struct block *blk, const struct block_hash *h,
                                       struct block_acts *acts)
{
    struct hash_acts **slot = (struct hash_acts **)block_ext_acts(acts, &hash_ext_ops);
    if (*slot) return *slot;
    const struct dm_backend *ops = backend_current();
    int B = acts->B, T = acts->T, NH = blk->NH, hs = blk->C / blk->NH;
    struct hash_acts *ha = dm_alloc(sizeof *ha);
    ha->B = B;
    ha->T = T;
    ha->lse = ops->alloc((size_t)B * NH * T * sizeof(float));
    ha->order = ops->alloc((size_t)B * NH * 2 * T * sizeof(int));
    ha->bucket = ops->alloc((size_t)B * NH * 2 * T * sizeof(int));
    ha->rotation_bytes = ((size_t)NH * hs * (size_t)(h->buckets / 2) + 1) * sizeof(float);
    ha->rotation = ops->alloc(ha->rotation_bytes);
    ha->rotation_host = backend_staging(ha->rotation_bytes);
    *slot = ha;
    return ha;
}

/* A stream far above every block tensor's ((index + 1) << 8 | k). */
#define ROTATION_STREAM_BASE (UINT64_C(0x48415348) << 32)

void hash_rotation_draw(float *rotation, int NH, int hs, int buckets, uint64_t seed,
                        int layer, long step)
{
    DM_ASSERT(buckets >= 1 && (buckets == 1 || buckets % 2 == 0));
    size_t n = (size_t)NH * hs * (size_t)(buckets / 2);
    if (n == 0) return;
    uint64_t stream = ROTATION_STREAM_BASE ^
                      dm_hash64((uint64_t)layer, UINT64_C(0x726f74), (uint64_t)step);
    block_init_normal(rotation, n, seed, stream, 0, 1.0f);
    /* each column of each head's R (hs, half) divided by its norm, the
     * squares summed in double in row order (the fixture does the same) */
    int half = buckets / 2;
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < half; c++) {
            float *column = rotation + (size_t)h * hs * half + c;
            double squares = 0.0;
            for (int d = 0; d < hs; d++)
                squares += (double)column[(size_t)d * half] * column[(size_t)d * half];
            double norm = sqrt(squares);
            if (norm > 0.0)
                for (int d = 0; d < hs; d++)
                    column[(size_t)d * half] = (float)((double)column[(size_t)d * half] / norm);
        }
}

/* This step's rotation of the block, drawn on the host and copied up. */
static void rotation_draw(struct hash_acts *ha, const struct block *blk,
                          const struct block_hash *h, const struct block_acts *acts)
{
    float *rotation = backend_write_begin(ha->rotation_host, ha->rotation);
    hash_rotation_draw(rotation, blk->NH, blk->C / blk->NH, h->buckets, h->seed, blk->index,
                       acts->step);
    backend_write_end(ha->rotation, rotation, ha->rotation_bytes);
}

/* Over the (B, T) batch. */
static void batch_forward(struct block *blk, struct block_hash *h, struct block_acts *acts,
                          int B, int T)
{
    struct hash_acts *ha = hash_acts_get(blk, h, acts);
    int C = blk->C, NH = blk->NH;
    rotation_draw(ha, blk, h, acts);
    const struct dm_backend *ops = backend_current();
    long alone = 0;
    h->tiles += (double)ops->group_attention_forward(acts->atty, ha->lse, ha->order, ha->bucket,
                                                     &alone, acts->qkv, ha->rotation, B, T, C,
                                                     NH, h->buckets);
    h->own_key_only += (double)alone;
    h->queries += (double)B * T * NH;
}

/* Packed sequences (block_forward_packed): sequence b's saved state sits
 * where its rows do: lse at NH start[b], order and bucket at 2 NH
 * start[b] (each (1, NH, [2,] n) as for B = 1); the rows in all are at
 * most the acts' B x T, so the arrays fit. Each sequence is hashed and
 * attended on its own with the block's rotation of this step. */
static void packed_forward(struct block *blk, struct block_hash *h, struct block_acts *acts,
                           const int *start, int B)
{
    struct hash_acts *ha = hash_acts_get(blk, h, acts);
    const struct dm_backend *ops = backend_current();
    int C = blk->C, NH = blk->NH;
    DM_ASSERT(start[B] <= acts->B * acts->T);
    rotation_draw(ha, blk, h, acts);
    for (int b = 0; b < B; b++) {
        int s = start[b], n = start[b + 1] - start[b];
        if (n == 0) continue;
        long alone = 0;
        h->tiles += (double)ops->group_attention_forward(
            acts->atty + (long)s * C, ha->lse + (long)NH * s, ha->order + 2L * NH * s,
            ha->bucket + 2L * NH * s, &alone, acts->qkv + 3L * s * C, ha->rotation, 1, n, C,
            NH, h->buckets);
        h->own_key_only += (double)alone;
        h->queries += (double)n * NH;
    }
}

static void hash_attention_hook(struct block *blk, void *state, struct block_acts *acts,
                                const int *start, int B, int T)
{
    if (start) packed_forward(blk, state, acts, start, B);
    else batch_forward(blk, state, acts, B, T);
}

/* dqkv overwritten from datty, over the batch or the packed sequences. */
static void hash_attention_back_hook(struct block *blk, void *state, struct block_acts *acts,
                                     float *dqkv, const float *datty, const int *start, int B,
                                     int T)
{
    struct block_hash *h = state;
    struct hash_acts *ha = *block_ext_acts(acts, &hash_ext_ops);
    const struct dm_backend *ops = backend_current();
    int C = blk->C, NH = blk->NH;
    DM_ASSERT(ha != NULL);
    if (!start) {
        h->tiles += (double)ops->group_attention_backward(dqkv, datty, acts->qkv, acts->atty,
                                                          ha->lse, ha->order, ha->bucket, B,
                                                          T, C, NH);
        return;
    }
    for (int b = 0; b < B; b++) {
        int s = start[b], n = start[b + 1] - start[b];
        if (n == 0) continue;
        h->tiles += (double)ops->group_attention_backward(
            dqkv + 3L * s * C, datty + (long)s * C, acts->qkv + 3L * s * C,
            acts->atty + (long)s * C, ha->lse + (long)NH * s, ha->order + 2L * NH * s,
            ha->bucket + 2L * NH * s, 1, n, C, NH);
    }
}

static const struct gpt_ext_ops hash_ext_ops = {
    .name = "hash",
    .block_noun = "a block with hash attention",
    .owned_text = "has it",
    .not_owned_text = "does not",
    .owns = hash_owns,
    .alloc = hash_alloc,
    .free = hash_free,
    .attention_forward = hash_attention_hook,
    .attention_backward = hash_attention_back_hook,
    .acts_free = hash_acts_free,
};

static void hash_describe_shape(const struct gpt_shape *shape, char *buf, size_t size)
{
    const struct hash_params *p = hash_params_of(shape);
    if (p) snprintf(buf, size, "attention: hash-sparse, %d buckets per head", p->buckets);
}

static void hash_add_to_shape(const struct dm_config *cfg, struct gpt_shape *shape)
{
    hash_shape_add(shape, cfg->hash_buckets, cfg->seed);
}

/* ---- signals --------------------------------------------------------------------- */

/* The tiles the block's hash attention visited since the last read,
 * forward and backward, then zero. */
static void read_tiles(struct gpt *model, int i, double *value, double *weight)
{
    (void)weight;
    struct block_hash *h = block_hash_of(&model->blocks[i]);
    value[0] = h->tiles;
    h->tiles = 0.0;
}

/* The query rows (per head) that attended to their own key alone, over
 * those its forwards saw, then zero. */
static void read_own_key_only(struct gpt *model, int i, double *value, double *weight)
{
    struct block_hash *h = block_hash_of(&model->blocks[i]);
    value[0] = h->own_key_only;
    weight[0] = h->queries;
    h->own_key_only = h->queries = 0.0;
}

/* A step's tiles as the share of those causal attention would visit: 2
 * (forward, backward) x batch x heads x nt (nt + 1) / 2, nt the 32-token
 * tiles of a sequence (docs/mod-hash.md). */
static void tiles_share(const struct dm_config *cfg, const struct gpt_shape *shape,
                        const float *row, float *layers)
{
    long nt = (cfg->seq + 31) / 32;
    double all = 2.0 * (double)cfg->batch * (double)cfg->heads * (double)(nt * (nt + 1) / 2);
    for (int l = 0; l < shape->layers; l++) layers[l] = (float)(row[l] / all);
}

/* Hash attention's tiles when its buckets are even (simulate --hardware's
 * scale of the tile share). */
static double tiles_of_even_groups(const struct dm_config *cfg, int tokens)
{
    return group_attention_even_share(tokens, cfg->hash_buckets);
}

static const struct dyn_signal hash_signals[] = {
    {.dataset = "/hash/tiles",
     .label = "hash tiles visited",
     .unit = "tiles",
     .meaning = "attention tiles the block visited, forward and backward, over micro-batches and "
                "replicas",
     .columns = DYN_SIGNAL_LAYERS,
     .combine = DYN_COMBINE_SUM,
     .read = read_tiles,
     .figure_label = "hash tiles visited (of causal)",
     .figure_unit = "share",
     .to_layers = tiles_share,
     .cost = DYN_COST_TILE_SHARE,
     .cost_name = "tiles",
     .cost_dataset = "/layers/tiles_share",
     .neutral = 1.0f,
     .cost_scale = tiles_of_even_groups},
    {.dataset = "/hash/own_key_only",
     .label = "own key only",
     .unit = "share",
     .meaning = "the share of the query rows that had no key of their bucket but their own",
     .columns = DYN_SIGNAL_LAYERS,
     .combine = DYN_COMBINE_RATIO,
     .read = read_own_key_only},
};

/* ---- the checkpoint (checkpoint_schema/hash.def) ---------------------------------- */

static int hash_in_shape(const struct gpt_shape *shape) { return hash_params_of(shape) != NULL; }

/* The shape's buckets, 0 with dense attention. */
static int buckets_of(const struct gpt_shape *shape)
{
    return hash_params_of(shape) ? hash_params_of(shape)->buckets : 0;
}

static void hash_write_attrs(const struct gpt_shape *shape, const struct dyn_ckpt_writer *w)
{
    w->string_attr(w->ctx, "/model", "attention", buckets_of(shape) > 0 ? "hash" : "dense");
    w->int_attr(w->ctx, "/model", "hash_buckets", buckets_of(shape));
}

/* What a file says. */
struct hash_file {
    char attention[16];
    long long buckets;
};

static void hash_store(void *raw, const char *object, const char *name, long long value,
                       const char *text)
{
    (void)object;
    struct hash_file *f = raw;
    if (!strcmp(name, "attention")) snprintf(f->attention, sizeof f->attention, "%s", text);
    else if (!strcmp(name, "hash_buckets")) f->buckets = value;
}

static int hash_file_check(const void *raw, struct gpt_shape *shape,
                           const struct dyn_ckpt_reader *rd)
{
    const struct hash_file *f = raw;
    int hash = !strcmp(f->attention, "hash"), buckets = (int)f->buckets;
    if ((!hash && strcmp(f->attention, "dense") != 0) || buckets < 0 ||
        (hash && (buckets < 1 || (buckets > 1 && buckets % 2) ||
                  (shape->max_seq > 0 && buckets > shape->max_seq))) ||
        (!hash && buckets != 0)) {
        dyn_ckpt_problem(rd, "/model: attention \"%s\" with hash_buckets %d (expected dense "
                         "with 0, or hash with 1 or an even number up to max_seq)",
                         f->attention, buckets);
        return -1;
    }
    if (hash) hash_shape_add(shape, buckets, 0);   /* the seed is the run's, not the model's */
    return 0;
}

static int hash_compare(const struct gpt_shape *file, const struct gpt_shape *run, char *err,
                        size_t errsize)
{
    int f = buckets_of(file), r = buckets_of(run);
    if (f == r) return 0;
    snprintf(err, errsize, "written for a different model: attention is %s with %d hash "
             "buckets in the checkpoint but %s with %d in this run (model.attention, "
             "hash.buckets; use the checkpoint's model config, or start a new run in another "
             "ckpt.dir)", f ? "hash" : "dense", f, r ? "hash" : "dense", r);
    return -1;
}

static const struct dyn_ckpt_part hash_ckpt = {
    .schema = &hash_schema,
    .model_keys = 1,
    .in_shape = hash_in_shape,
    .write_attrs = hash_write_attrs,
    .store = hash_store,
    .check = hash_file_check,
    .compare = hash_compare,
};

/* ---- in a run log (inspect) ------------------------------------------------------ */

/* /hash/own_key_only (column l: block l): its mean over the steps the log
 * holds (NaN filler rows left out) and the blocks, and the block with the
 * largest mean. */
struct own_key_only {
    int layers;            /* columns with values (0: none) */
    long steps;            /* rows with values */
    double mean, largest;
    int largest_layer;
};

static void own_key_only_means(struct own_key_only *o, const float *share, long rows, int ncols)
{
    double total = 0.0;
    memset(o, 0, sizeof *o);
    for (int l = 0; l < ncols; l++) {
        double sum = 0.0;
        long n = 0;
        for (long r = 0; r < rows; r++) {
            float v = share[r * ncols + l];
            if (isnan(v)) continue;
            sum += v;
            n++;
        }
        if (n == 0) continue;
        o->steps = n;
        total += sum / (double)n;
        if (o->layers == 0 || sum / (double)n > o->largest) {
            o->largest = sum / (double)n;
            o->largest_layer = l;
        }
        o->layers = ncols;
    }
    o->mean = o->layers ? total / ncols : 0.0;
}

static void hash_summarise_log(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w)
{
    if (!rd->has(rd->ctx, "/hash/own_key_only")) return;
    float *share = NULL;
    int ncols = 0;
    long rows = rd->floats(rd->ctx, "/hash/own_key_only", &share, &ncols);
    char line[512];
    if (rows > 0 && ncols != rd->cfg->layers) {
        snprintf(line, sizeof line, "%s: /hash/own_key_only has %d columns but model.layers "
                 "is %d", rd->path, ncols, rd->cfg->layers);
        rd->fail(rd->ctx, line);
    }
    struct own_key_only o;
    own_key_only_means(&o, share, rows > 0 && ncols > 0 ? rows : 0, ncols);
    dm_free(share);
    if (!o.layers) return;
    snprintf(line, sizeof line, "hash attention: %.3f%% of the query rows had no key of their "
             "bucket but their own (mean over %ld steps and %d blocks; block %d the most, "
             "%.3f%%)", 100.0 * o.mean, o.steps, o.layers, o.largest_layer, 100.0 * o.largest);
    w->line(w->ctx, line);
    w->open(w->ctx, "hash");
    w->number(w->ctx, "own_key_only_share", o.mean);
    w->number(w->ctx, "own_key_only_share_max", o.largest);
    w->integer(w->ctx, "own_key_only_max_block", o.largest_layer);
    w->integer(w->ctx, "steps", o.steps);
    w->close(w->ctx);
}

const struct dyn_scheme dyn_scheme_hash = {
    .ckpt = &hash_ckpt,
    .ext = &hash_ext_ops,
    .add_to_shape = hash_add_to_shape,
    .describe_shape = hash_describe_shape,
    .name = "hash",
    .active = hash_active,
    .keys = hash_keys,
    .check = hash_check,
    .title = "hash-sparse attention",
    .switch_key = "model.attention",
    .switch_off = "dense",
    .refuses = hash_refuses,
    DYN_SIGNALS(hash_signals),
    .summarise_log = hash_summarise_log,
};
