/* Checkpoints under MPI: a chain of worlds (4 -> 2 -> 1 -> 3 -> ... ranks,
 * each with its own pipeline x data-parallel grid and layout) where every
 * world loads what the previous one saved and must find every parameter
 * and Adam moment bit for bit (random 32-bit patterns: NaN payloads,
 * infinities, denormals, signed zeros), with the metadata, layout history
 * and per-block state; keep bounds the files; faults (flipped byte seen by
 * one rank only, truncation, another model, a .tmp, a latest pointing
 * nowhere) fail on every rank with the same message or fall back.
 *
 * Run without MPI it re-executes itself under `mpiexec -n 4`; under
 * `mpiexec -n P` it uses the worlds that fit in P ranks. Other modes are
 * tools for tests/t_checkpoint.sh, tests/data/ckpt/make.sh and
 * bench/ckpt_bench.sh:
 *   --save DIR [--step N] [--keep K] [--pp S] [--fill F]   write a checkpoint
 *   --load FILE                                            load it (exit 2 on error)
 *   --resume DIR                                           resume=auto
 *   --bench DIR [--repeat R]                               time write and read
 * with the model given by --layers --channels --heads --vocab --max-seq
 * and, for mixture-of-experts blocks, --moe-every --experts --top-k
 * --expert-hidden (default: the tiny dense model of the chain).
 *
 * A model with MoE blocks (test_moe_rows) is saved by one world and loaded
 * by others, every value and the blocks' MoE state bit for bit; its file
 * holds exactly the floats the blocks compute with: /blocks rows of the
 * shared tensors only, the dense blocks' MLP in /mlp (absent when every
 * block is an MoE block), no padding. */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <hdf5.h>
#include "dynmo/ckpt.h"
#include "dynmo/moe.h"
#include "ckpt/ckpt_file.h"
#include "dynmo/world.h"
#include "testing.h"

static int world_rank, world_size;
static char dir[512];

/* ---- helpers --------------------------------------------------------------- */

static void wait_polled(MPI_Request *request)
{
    int done = 0;
    while (MPI_Test(request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) sched_yield();
}

static void barrier(MPI_Comm comm)
{
    MPI_Request request;
    MPI_Ibarrier(comm, &request);
    wait_polled(&request);
}

static int sum_int(int value, MPI_Comm comm)
{
    int total = 0;
    MPI_Request request;
    MPI_Iallreduce(&value, &total, 1, MPI_INT, MPI_SUM, comm, &request);
    wait_polled(&request);
    return total;
}

static double max_double(double value, MPI_Comm comm)
{
    double out = 0;
    MPI_Request request;
    MPI_Iallreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, comm, &request);
    wait_polled(&request);
    return out;
}

/* A float of random bits (any pattern, NaNs included) for generation g of
 * a tensor; odd layers' parameters have every fourth value exactly zero
 * so that sparsity is not trivially zero. */
static float fill_value(int g, uint64_t stream, int which, size_t i, int zeros)
{
    if (zeros && i % 4 == 0) return (i / 4) % 2 ? 0.0f : -0.0f;
    uint32_t bits = (uint32_t)(dm_hash64((uint64_t)g * 16 + (uint64_t)which, stream, i) >> 17);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void fill_tensor(float *out, size_t n, int g, uint64_t stream, int which, int zeros)
{
    for (size_t i = 0; i < n; i++) out[i] = fill_value(g, stream, which, i, zeros);
}

static size_t count_mismatches(const float *have, size_t n, int g, uint64_t stream,
                               int which, int zeros)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = fill_value(g, stream, which, i, zeros);
        bad += memcmp(&have[i], &want, sizeof want) != 0;
    }
    return bad;
}

#define EMBED_STREAM 1000003

/* Fills every tensor this rank holds with generation g's values; the
 * embedding slab (also the last stage's tied copy) gets the same values
 * everywhere. */
/* An MoE block's state of generation g: a finite bias, and routed and
 * dropped counts with 0 <= dropped <= routed (what the loader checks). */
static float moe_bias_value(int g, int index, int e) { return 0.125f * (float)(g + index - e); }
static int64_t moe_tokens_value(int g, int index, int e) { return 1000 * g + 10 * index + e; }
static int64_t moe_dropped_value(int g, int index, int e) { return (g + index + e) % 5; }

static void fill_model(struct gpt *model, int g)
{
    for (int i = 0; i < model->num_blocks; i++) {
        struct block *blk = &model->blocks[i];
        int zeros = blk->index % 2 == 1;
        blk->frozen = (blk->index + g) % 3 == 0;   /* as meta_for's flags */
        fill_tensor(blk->params, blk->nparams, g, (uint64_t)blk->index, 0, zeros);
        fill_tensor(blk->m, blk->nparams, g, (uint64_t)blk->index, 1, 0);
        fill_tensor(blk->v, blk->nparams, g, (uint64_t)blk->index, 2, 0);
        struct block_moe *moe = block_moe_of(blk);
        for (int e = 0; moe && e < moe->cfg.experts; e++) {
            moe->bias[e] = moe_bias_value(g, blk->index, e);
            moe->tokens[e] = moe_tokens_value(g, blk->index, e);
            moe->dropped[e] = moe_dropped_value(g, blk->index, e);
        }
    }
    if (model->embed_slab) {
        fill_tensor(model->wte, model->embed_nparams, g, EMBED_STREAM, 0, 0);
        fill_tensor(model->embed_m, model->embed_nparams, g, EMBED_STREAM, 1, 0);
        fill_tensor(model->embed_v, model->embed_nparams, g, EMBED_STREAM, 2, 0);
    }
}

/* Mismatching values of generation g in this rank's tensors, plus any
 * non-zero gradient. */
static size_t check_model(const struct gpt *model, int g)
{
    size_t bad = 0;
    for (int i = 0; i < model->num_blocks; i++) {
        const struct block *blk = &model->blocks[i];
        int zeros = blk->index % 2 == 1;
        bad += count_mismatches(blk->params, blk->nparams, g, (uint64_t)blk->index, 0, zeros);
        bad += count_mismatches(blk->m, blk->nparams, g, (uint64_t)blk->index, 1, 0);
        bad += count_mismatches(blk->v, blk->nparams, g, (uint64_t)blk->index, 2, 0);
        for (size_t k = 0; k < blk->nparams; k++) bad += blk->grads[k] != 0.0f;
        const struct block_moe *moe = block_moe_of(blk);
        for (int e = 0; moe && e < moe->cfg.experts; e++)
            bad += moe->bias[e] != moe_bias_value(g, blk->index, e) ||
                   moe->tokens[e] != moe_tokens_value(g, blk->index, e) ||
                   moe->dropped[e] != moe_dropped_value(g, blk->index, e);
    }
    if (model->embed_slab) {
        bad += count_mismatches(model->wte, model->embed_nparams, g, EMBED_STREAM, 0, 0);
        bad += count_mismatches(model->embed_m, model->embed_nparams, g, EMBED_STREAM, 1, 0);
        bad += count_mismatches(model->embed_v, model->embed_nparams, g, EMBED_STREAM, 2, 0);
        for (size_t k = 0; k < model->embed_nparams; k++) bad += model->dwte[k] != 0.0f;
    }
    return bad;
}

/* The sparsity save must record for layer `index` (fraction of zeros in
 * the matrices of the filled parameters). */
static float expected_sparsity(int index, int C)
{
    if (index % 2 == 0) return 0.0f;
    size_t zeros = 0, total = 0;
    for (int k = 0; k < BP_COUNT; k++) {
        if (!block_tensor_is_matrix(k)) continue;
        size_t off = block_tensor_offset(C, k), n = block_tensor_size(C, k);
        for (size_t i = off; i < off + n; i++) zeros += i % 4 == 0;
        total += n;
    }
    return (float)((double)zeros / (double)total);
}

/* ---- worlds ------------------------------------------------------------------ */

struct world {
    int ranks, pp, dp;
    int layout[8];
};

static struct gpt_shape tiny_shape(void)
{
    struct gpt_shape s = {.vocab = 61, .max_seq = 16, .layers = 7, .heads = 2, .channels = 16};
    return s;
}

/* This rank's place in world w (ranks 0..w->ranks-1 of MPI_COMM_WORLD),
 * as the engine's grid has it: rank = replica * stages + stage. */
static void place(const struct world *w, int rank, int *stage, int *dp_rank, int *first)
{
    *stage = rank % w->pp;
    *dp_rank = rank / w->pp;
    *first = 0;
    for (int s = 0; s < *stage; s++) *first += w->layout[s];
}

static void build_for(struct gpt *model, const struct gpt_shape *shape, const struct world *w,
                      int rank)
{
    int stage, dp_rank, first;
    place(w, rank, &stage, &dp_rank, &first);
    gpt_build(model, shape, first, w->layout[stage], stage == 0, stage == w->pp - 1, 1234);
}

static MPI_Comm split_world(int ranks)
{
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank < ranks ? 0 : MPI_UNDEFINED, world_rank, &comm);
    return comm;
}

/* The metadata of generation g in world w. History: what the previous
 * generation's checkpoint held (loaded), which save extends. */
struct expected_history {
    int count;
    long step[16];
    int stages[16];
    int layout[16][8];
};

/* The global batch the test's config text names: each replica's cursor
 * must stay within step x batch + batch, as in a real run. */
#define TEST_BATCH 64

/* Replica d's cursor in generation g at `step`: distinct for every d and
 * g, and within what a run of TEST_BATCH can have drawn. */
static long test_cursor(long step, int g, int d)
{
    return step * TEST_BATCH + 7L * d + g;
}

static void meta_for(struct ckpt_meta *meta, int g, long step, const struct world *w,
                     const struct ckpt_meta *loaded, int layers, int *frozen, long *cursors,
                     char *config)
{
    memset(meta, 0, sizeof *meta);
    /* All three equal, as dynmo writes them (the loader refuses others). */
    meta->step = meta->optimizer_steps = meta->lr_schedule_step = step;
    meta->seed = 0xdeadbeefcafef00dULL + (uint64_t)g;
    meta->train_checksum = 0x8000000000000001ULL ^ (uint64_t)g;
    snprintf(config, 256, "model.layers = %d\ntrain.batch = %d\n# generation %d\n", layers,
             TEST_BATCH, g);
    meta->config_text = config;
    meta->pp = w->pp;
    meta->dp = w->dp;
    for (int d = 0; d < w->dp; d++) cursors[d] = test_cursor(step, g, d);
    meta->data_cursor = cursors;
    meta->layout = (int *)w->layout;
    for (int i = 0; i < layers; i++) frozen[i] = (i + g) % 3 == 0;
    meta->frozen = frozen;
    if (loaded) meta->history = loaded->history;   /* borrowed */
}

static void history_extend(struct expected_history *h, long step, const struct world *w,
                           int layers)
{
    int n = h->count;
    if (n > 0 && h->stages[n - 1] == w->pp &&
        !memcmp(h->layout[n - 1], w->layout, (size_t)w->pp * sizeof(int)))
        return;
    h->step[n] = step;
    h->stages[n] = w->pp;
    memset(h->layout[n], 0, sizeof h->layout[n]);
    memcpy(h->layout[n], w->layout, (size_t)w->pp * sizeof(int));
    (void)layers;
    h->count = n + 1;
}

/* Checks a loaded meta against generation g written by world w. */
static void check_meta(const struct ckpt_meta *m, int g, const struct world *w,
                       const struct expected_history *h, const struct gpt_shape *shape)
{
    CHECK(m->allocated == 1);
    CHECK(m->step == 10L * (g + 1));
    CHECK(m->optimizer_steps == m->step);
    CHECK(m->lr_schedule_step == m->step);
    CHECK(m->seed == 0xdeadbeefcafef00dULL + (uint64_t)g);
    CHECK(m->train_checksum == (0x8000000000000001ULL ^ (uint64_t)g));
    CHECK(m->schema_version == CHECKPOINT_SCHEMA_VERSION);
    CHECK(!strcmp(m->dynmo_version, DYNMO_VERSION));
    CHECK(strlen(m->created) == 20);
    char config[256];
    snprintf(config, sizeof config, "model.layers = %d\ntrain.batch = %d\n# generation %d\n",
             shape->layers, TEST_BATCH, g);
    CHECK_MSG(m->config_text && !strcmp(m->config_text, config), "config '%s'",
              m->config_text ? m->config_text : "(null)");
    CHECK(!memcmp(&m->shape, shape, sizeof *shape));
    CHECK_MSG(m->pp == w->pp && m->dp == w->dp, "world %d x %d, want %d x %d", m->pp, m->dp,
              w->pp, w->dp);
    for (int d = 0; d < w->dp && m->dp == w->dp; d++)
        CHECK(m->data_cursor[d] == test_cursor(m->step, g, d));
    CHECK(m->pp == w->pp && !memcmp(m->layout, w->layout, (size_t)w->pp * sizeof(int)));
    CHECK_MSG(m->history.count == h->count, "history of %d entries, want %d",
              m->history.count, h->count);
    CHECK(m->history.layers == shape->layers);
    for (int k = 0; k < h->count && m->history.count == h->count; k++) {
        CHECK(m->history.step[k] == h->step[k]);
        CHECK(m->history.stages[k] == h->stages[k]);
        for (int j = 0; j < shape->layers; j++)
            CHECK(m->history.layout[(size_t)k * shape->layers + j] ==
                  (j < 8 ? h->layout[k][j] : 0));
    }
    for (int i = 0; i < shape->layers; i++) {
        CHECK_MSG(m->frozen[i] == ((i + g) % 3 == 0), "frozen[%d] = %d", i, m->frozen[i]);
        float want = expected_sparsity(i, shape->channels);
        CHECK_MSG(m->sparsity[i] == want, "sparsity[%d] = %g, want %g", i,
                  (double)m->sparsity[i], (double)want);
    }
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int file_says(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return !strcmp(buf, text);
}

/* ---- the chain ------------------------------------------------------------------- */

static const struct world worlds[] = {
    {4, 2, 2, {5, 2}},
    {2, 2, 1, {1, 6}},
    {1, 1, 1, {7}},
    {3, 3, 1, {2, 2, 3}},
    {4, 4, 1, {1, 2, 3, 1}},
    {2, 1, 2, {7}},
    {3, 1, 3, {7}},
    {2, 2, 1, {6, 1}},
    {1, 1, 1, {7}},
};
#define WORLDS ((int)(sizeof worlds / sizeof worlds[0]))

static void test_chain(void)
{
    struct gpt_shape shape = tiny_shape();
    snprintf(dir, sizeof dir, "%s/chain", getenv("CKPT_TEST_DIR"));
    struct expected_history history = {0};
    struct ckpt_meta previous = {0};     /* what the last generation loaded */
    int g = 0, previous_world = -1, kept_steps[WORLDS], saves = 0;
    for (int wi = 0; wi < WORLDS; wi++) {
        const struct world *w = &worlds[wi];
        if (w->ranks > world_size) continue;
        MPI_Comm comm = split_world(w->ranks);
        if (comm != MPI_COMM_NULL) {
            struct gpt model;
            build_for(&model, &shape, w, world_rank);
            struct ckpt_meta loaded = {0};
            if (g > 0) {
                char loaded_path[1024] = "";
                int found = ckpt_resume_auto(dir, &model, &loaded, comm, loaded_path,
                                             sizeof loaded_path);
                CHECK_MSG(found == 1, "generation %d found nothing", g);
                size_t bad = check_model(&model, g - 1);
                CHECK_MSG(bad == 0, "world %d (%d ranks, %d x %d): %zu values differ after "
                          "loading generation %d", wi, w->ranks, w->pp, w->dp, bad, g - 1);
                check_meta(&loaded, g - 1, &worlds[previous_world], &history, &shape);
                for (int i = 0; i < model.num_blocks; i++)
                    CHECK(model.blocks[i].frozen == ((model.blocks[i].index + g - 1) % 3 == 0));
            }
            fill_model(&model, g);
            struct ckpt_meta meta;
            int frozen[16];
            long cursors[8];
            char config[256];
            int stage, dp_rank, first;
            place(w, world_rank, &stage, &dp_rank, &first);
            meta_for(&meta, g, 10L * (g + 1), w, g > 0 ? &loaded : NULL, shape.layers, frozen,
                     cursors, config);
            char path[1024], err[1024];
            int rc = ckpt_save(dir, 2, &model, &meta, stage, dp_rank, comm, path, sizeof path,
                               err, sizeof err);
            CHECK_MSG(rc == 0, "save of generation %d failed: %s", g, err);
            ckpt_meta_free(&loaded);
            gpt_free(&model);
            MPI_Comm_free(&comm);
        }
        history_extend(&history, 10L * (g + 1), w, shape.layers);
        kept_steps[saves++] = (int)(10L * (g + 1));
        previous_world = wi;
        g++;
        barrier(MPI_COMM_WORLD);
    }
    (void)previous;

    /* keep = 2: the two newest remain, latest names the newest, no .tmp. */
    if (world_rank == 0) {
        char path[1024];
        for (int i = 0; i < saves; i++) {
            ckpt_path(path, sizeof path, dir, kept_steps[i]);
            CHECK_MSG(file_exists(path) == (i >= saves - 2), "%s %s", path,
                      file_exists(path) ? "exists" : "is missing");
            snprintf(path + strlen(path), sizeof path - strlen(path), ".tmp");
            CHECK(!file_exists(path));
        }
        char latest[1024], name[64];
        snprintf(latest, sizeof latest, "%s/latest", dir);
        snprintf(name, sizeof name, "ckpt-%d.h5", kept_steps[saves - 1]);
        CHECK_MSG(file_says(latest, name), "latest does not name %s", name);
        ckpt_path(path, sizeof path, dir, kept_steps[saves - 1]);
        int problems = ckpt_check_file(path, 1, NULL, NULL);
        CHECK_MSG(problems == 0, "check of %s: %d problems", path, problems);
    }

    /* The whole world loads the newest once more, as one pipeline. */
    struct world all = {world_size, world_size, 1, {0}};
    for (int s = 0; s < world_size; s++) all.layout[s] = shape.layers / world_size +
                                                         (s < shape.layers % world_size);
    struct gpt model;
    build_for(&model, &shape, &all, world_rank);
    struct ckpt_meta loaded;
    char path[1024], err[1024];
    ckpt_path(path, sizeof path, dir, kept_steps[saves - 1]);
    int rc = ckpt_load_try(path, &model, &loaded, MPI_COMM_WORLD, err, sizeof err);
    CHECK_MSG(rc == 0, "final load: %s", err);
    if (rc == 0) {
        CHECK(check_model(&model, g - 1) == 0);
        check_meta(&loaded, g - 1, &worlds[previous_world], &history, &shape);
    }
    ckpt_meta_free(&loaded);
    gpt_free(&model);
    barrier(MPI_COMM_WORLD);
}

/* ---- a model with mixture-of-experts blocks ------------------------------------------ */

/* The extent of dataset `name` of the file at path ({0, 0} when the file
 * has no such dataset; a 1-D dataset's second extent is 1). */
static void dataset_extent(const char *path, const char *name, hsize_t extent[2])
{
    extent[0] = extent[1] = 0;
    hid_t file = -1, dataset = -1;
    H5E_BEGIN_TRY {
        file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        dataset = file >= 0 ? H5Dopen2(file, name, H5P_DEFAULT) : -1;
    } H5E_END_TRY;
    if (dataset >= 0) {
        hid_t space = H5Dget_space(dataset);
        hsize_t dims[2] = {0, 1};
        if (H5Sget_simple_extent_ndims(space) <= 2) H5Sget_simple_extent_dims(space, dims, NULL);
        extent[0] = dims[0];
        extent[1] = dims[1];
        H5Sclose(space);
        H5Dclose(dataset);
    }
    if (file >= 0) H5Fclose(file);
}

/* Every other block an MoE block, then every block: one world saves, each
 * world that fits loads (another grid and layout each time), and finds
 * every parameter, Adam moment and MoE state bit for bit. The file holds
 * the floats the blocks compute with and nothing else: /blocks rows of the
 * shared tensors (ln1_w .. ln2_b) for every block, the dense blocks' MLP
 * (fc, fcproj) in /mlp, absent when there is no dense block, the router
 * and the experts in /moe. */
static void test_moe_rows(void)
{
    for (int every = 2; every >= 1; every--) {
        struct gpt_shape shape = tiny_shape();
        struct moe_params moe = {.every = every, .experts = 4, .top_k = 2, .hidden = 24};
        moe_shape_add(&shape, &moe);
        int layers = shape.layers, C = shape.channels, g = 40 + every;
        int moe_blocks = gpt_moe_block_count(&shape), dense = layers - moe_blocks;
        size_t shared = moe_shared_param_count(C), mlp = block_param_count(C) - shared;
        snprintf(dir, sizeof dir, "%s/moe-every-%d", getenv("CKPT_TEST_DIR"), every);
        const struct world *writer = NULL;
        for (int wi = 0; wi < WORLDS && !writer; wi++)
            if (worlds[wi].ranks <= world_size) writer = &worlds[wi];
        char path[1024], err[1024];
        MPI_Comm comm = split_world(writer->ranks);
        if (comm != MPI_COMM_NULL) {
            struct gpt model;
            build_for(&model, &shape, writer, world_rank);
            fill_model(&model, g);
            struct ckpt_meta meta;
            int frozen[16];
            long cursors[8];
            char config[256];
            int stage, dp_rank, first;
            place(writer, world_rank, &stage, &dp_rank, &first);
            meta_for(&meta, g, 10, writer, NULL, layers, frozen, cursors, config);
            int rc = ckpt_save(dir, 1, &model, &meta, stage, dp_rank, comm, path, sizeof path,
                               err, sizeof err);
            CHECK_MSG(rc == 0, "MoE save (moe_every %d): %s", every, err);
            gpt_free(&model);
            MPI_Comm_free(&comm);
        }
        barrier(MPI_COMM_WORLD);
        ckpt_path(path, sizeof path, dir, 10);
        int loads = 0;
        for (int wi = 0; wi < WORLDS; wi++) {
            const struct world *w = &worlds[wi];
            if (w->ranks > world_size) continue;
            comm = split_world(w->ranks);
            if (comm != MPI_COMM_NULL) {
                struct gpt model;
                build_for(&model, &shape, w, world_rank);
                struct ckpt_meta loaded;
                int rc = ckpt_load_try(path, &model, &loaded, comm, err, sizeof err);
                CHECK_MSG(rc == 0, "MoE load (moe_every %d) into world %d: %s", every, wi, err);
                if (rc == 0) {
                    size_t bad = check_model(&model, g);
                    CHECK_MSG(bad == 0, "moe_every %d, world %d (%d x %d): %zu values differ",
                              every, wi, w->pp, w->dp, bad);
                    CHECK(loaded.schema_version == 3 && loaded.scheme_states != NULL &&
                          gpt_moe_block_count(&loaded.shape) == moe_blocks);
                    ckpt_meta_free(&loaded);
                }
                gpt_free(&model);
                MPI_Comm_free(&comm);
                loads++;
            }
            barrier(MPI_COMM_WORLD);
        }
        if (world_rank != 0) continue;
        hsize_t blocks[2], mlp_rows[2], router[2], experts[2];
        dataset_extent(path, "/blocks/params", blocks);
        dataset_extent(path, "/mlp/params", mlp_rows);
        dataset_extent(path, "/moe/router/params", router);
        dataset_extent(path, "/moe/experts/params", experts);
        size_t in_file = blocks[0] * blocks[1] + mlp_rows[0] * mlp_rows[1] +
                         router[0] * router[1] + experts[0] * experts[1];
        size_t computed = 0;
        for (int l = 0; l < layers; l++) computed += gpt_block_param_count(&shape, l);
        printf("MoE checkpoint (moe_every %d: %d MoE, %d dense blocks), loaded by %d worlds: "
               "/blocks [%llu, %llu], /mlp [%llu, %llu], /moe/router [%llu, %llu], "
               "/moe/experts [%llu, %llu]: %zu floats per tensor kind, the blocks compute "
               "with %zu\n", every, moe_blocks, dense, loads, (unsigned long long)blocks[0],
               (unsigned long long)blocks[1], (unsigned long long)mlp_rows[0],
               (unsigned long long)mlp_rows[1], (unsigned long long)router[0],
               (unsigned long long)router[1], (unsigned long long)experts[0],
               (unsigned long long)experts[1], in_file, computed);
        CHECK_MSG(blocks[0] == (hsize_t)layers && blocks[1] == shared,
                  "/blocks/params is [%llu, %llu], want [%d, %zu] (the shared tensors)",
                  (unsigned long long)blocks[0], (unsigned long long)blocks[1], layers, shared);
        CHECK_MSG(dense ? mlp_rows[0] == (hsize_t)dense && mlp_rows[1] == mlp
                        : mlp_rows[0] == 0,
                  "/mlp/params is [%llu, %llu], want [%d, %zu] (absent when 0)",
                  (unsigned long long)mlp_rows[0], (unsigned long long)mlp_rows[1], dense, mlp);
        CHECK_MSG(in_file == computed, "the file holds %zu floats of parameters, the blocks "
                  "compute with %zu", in_file, computed);
        int problems = ckpt_check_file(path, 1, NULL, NULL);
        CHECK_MSG(problems == 0, "check of %s: %d problems", path, problems);
    }
    barrier(MPI_COMM_WORLD);
}

/* ---- faults ------------------------------------------------------------------------ */

/* Saves generation 0 of the tiny model from the whole world at `step`,
 * with the scheme state `state` (count values of dyn.kind `kind`; kind
 * NULL: none). */
static void save_tiny_state(const char *where, long step, int keep, const char *kind,
                            const double *state, long count)
{
    struct gpt_shape shape = tiny_shape();
    struct world w = {world_size, world_size, 1, {0}};
    for (int s = 0; s < world_size; s++) w.layout[s] = shape.layers / world_size +
                                                       (s < shape.layers % world_size);
    struct gpt model;
    build_for(&model, &shape, &w, world_rank);
    fill_model(&model, 0);
    struct ckpt_meta meta;
    int frozen[16];
    long cursors[8];
    char config[256], err[1024];
    meta_for(&meta, 0, step, &w, NULL, shape.layers, frozen, cursors, config);
    if (kind) {
        snprintf(meta.dyn_kind, sizeof meta.dyn_kind, "%s", kind);
        meta.dyn_state = (double *)state;
        meta.dyn_state_count = count;
    }
    int rc = ckpt_save(where, keep, &model, &meta, world_rank, 0, MPI_COMM_WORLD, NULL, 0,
                       err, sizeof err);
    CHECK_MSG(rc == 0, "save: %s", err);
    gpt_free(&model);
}

static void save_tiny(const char *where, long step, int keep)
{
    save_tiny_state(where, step, keep, NULL, NULL, 0);
}

static void copy_file(const char *from, const char *to, long truncate_to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    DM_ASSERT(in && out);
    char buf[1 << 16];
    size_t n;
    long total = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (truncate_to >= 0 && total + (long)n > truncate_to) n = (size_t)(truncate_to - total);
        fwrite(buf, 1, n, out);
        total += (long)n;
        if (truncate_to >= 0 && total >= truncate_to) break;
    }
    fclose(in);
    fclose(out);
}

/* The whole file at path in a malloc'd buffer of *bytes bytes. */
static unsigned char *read_bytes(const char *path, size_t *bytes)
{
    struct stat st;
    FILE *f = fopen(path, "rb");
    DM_ASSERT(f && fstat(fileno(f), &st) == 0);
    unsigned char *data = malloc((size_t)st.st_size + 1);
    DM_ASSERT(data && fread(data, 1, (size_t)st.st_size, f) == (size_t)st.st_size);
    fclose(f);
    *bytes = (size_t)st.st_size;
    return data;
}

/* Flips one bit in the middle of the chunk holding element (row, 0) of
 * dataset `name`. */
static void flip_in_chunk(const char *path, const char *name, hsize_t row)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
    hsize_t offset[2] = {row, 0};
    unsigned mask = 0;
    haddr_t address = 0;
    hsize_t size = 0;
    DM_ASSERT(H5Dget_chunk_info_by_coord(dataset, offset, &mask, &address, &size) >= 0);
    H5Dclose(dataset);
    H5Fclose(file);
    int fd = open(path, O_RDWR);
    unsigned char byte;
    off_t at = (off_t)(address + size / 2);
    DM_ASSERT(pread(fd, &byte, 1, at) == 1);
    byte ^= 0x10;
    DM_ASSERT(pwrite(fd, &byte, 1, at) == 1);
    close(fd);
}

static void expect_load_error(const char *path, const struct gpt_shape *shape,
                              const char *needle1, const char *needle2)
{
    struct world w = {world_size, world_size, 1, {0}};
    for (int s = 0; s < world_size; s++) w.layout[s] = shape->layers / world_size +
                                                       (s < shape->layers % world_size);
    struct gpt model;
    build_for(&model, shape, &w, world_rank);
    struct ckpt_meta meta;
    char err[1024] = "";
    int rc = ckpt_load_try(path, &model, &meta, MPI_COMM_WORLD, err, sizeof err);
    CHECK_MSG(rc == -1, "loading %s succeeded", path);
    CHECK_MSG(strstr(err, path) && strstr(err, needle1) && (!needle2 || strstr(err, needle2)),
              "message '%s' lacks the path, '%s' or '%s'", err, needle1,
              needle2 ? needle2 : "");
    CHECK(meta.allocated == 0 && meta.layout == NULL);
    /* Every rank must hold the same message. */
    unsigned long long h = 1469598103934665603ULL, lowest[2], mine[2];
    for (const char *p = err; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    mine[0] = h;
    mine[1] = ~h;
    MPI_Request request;
    MPI_Iallreduce(mine, lowest, 2, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD, &request);
    wait_polled(&request);
    CHECK_MSG(lowest[0] == ~lowest[1], "ranks disagree on the message");
    gpt_free(&model);
}

static void report_count(void *ctx, const char *problem)
{
    (void)problem;
    (*(int *)ctx)++;
}

/* Saves a tiny model at `step` into dir with the scheme state `state`
 * (count values of dyn.kind `kind`; count 0: none). */
static void save_with_state(const char *dir, long step, const char *kind, const double *state,
                            long count)
{
    save_tiny_state(dir, step, 0, kind, state, count);
}

/* The extension dyn.def: a scheme's state comes back as the same doubles
 * and passes the checker; one its scheme's rules refuse (a negative norm,
 * a kind that keeps no state) is reported; a save without one writes no
 * /dyn and reads back none. */
static void test_dyn_state(void)
{
    char dir[1024], path[1100], err[1024];
    snprintf(dir, sizeof dir, "%s/dyn", getenv("CKPT_TEST_DIR"));
    int layers = tiny_shape().layers;
    long n = 3 + 2L * layers;                 /* freezing, window 1 */
    double *state = dm_alloc((size_t)n * sizeof(double));
    state[0] = 1.0;
    state[1] = layers;
    state[2] = 5.0;
    for (long i = 3; i < n; i++) state[i] = 0.1 * (double)i + 1e-13;   /* no float holds it */
    save_with_state(dir, 30, "freeze", state, n);
    state[4] = -1.0;
    save_with_state(dir, 31, "freeze", state, n);
    save_with_state(dir, 32, "prune", state, n);
    save_with_state(dir, 33, "", NULL, 0);
    if (world_rank == 0) {
        struct ckpt_meta meta;
        ckpt_path(path, sizeof path, dir, 30);
        CHECK_MSG(ckpt_read_info(path, &meta, err, sizeof err) == 0, "%s", err);
        state[4] = 0.1 * 4 + 1e-13;
        CHECK(meta.dyn_state_count == n && !strcmp(meta.dyn_kind, "freeze") &&
              !memcmp(meta.dyn_state, state, (size_t)n * sizeof(double)));
        ckpt_meta_free(&meta);
        CHECK(ckpt_check_file(path, 1, NULL, NULL) == 0);
        ckpt_path(path, sizeof path, dir, 31);
        CHECK(ckpt_check_file(path, 1, NULL, NULL) == 1);
        CHECK(ckpt_read_info(path, &meta, err, sizeof err) == -1 &&
              strstr(err, "/dyn/state of dyn.kind \"freeze\": value 4 (block 0 of the window) "
                     "is -1"));
        ckpt_path(path, sizeof path, dir, 32);
        CHECK(ckpt_read_info(path, &meta, err, sizeof err) == -1 &&
              strstr(err, "\"prune\" is no scheme of this dynmo that keeps a state"));
        ckpt_path(path, sizeof path, dir, 33);
        CHECK(ckpt_read_info(path, &meta, err, sizeof err) == 0 && meta.dyn_state_count == 0 &&
              !meta.dyn_state && !meta.dyn_kind[0]);
        ckpt_meta_free(&meta);
        hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        CHECK(file >= 0 && H5Lexists(file, "/dyn", H5P_DEFAULT) == 0);
        if (file >= 0) H5Fclose(file);
    }
    dm_free(state);
}

/* The extension units.def: a sublayer run's save (units 3,4,3,4 of the 7
 * blocks on 4 stages: blocks 1 and 3 split, each stage holding the blocks
 * its units touch, halves marked). The stage of a split block's MLP does
 * not write it (its copy is poisoned here), the stage of its attention
 * writes it whole; the file holds the unit layout, the nearest whole
 * blocks in /layout, passes the checker, and loads whole on 4 stages. */
static void test_units_layout(void)
{
    if (world_size != 4) return;
    char dir[1024], path[1100], err[1024];
    snprintf(dir, sizeof dir, "%s/units", getenv("CKPT_TEST_DIR"));
    struct gpt_shape shape = tiny_shape();
    int units[4] = {3, 4, 3, 4}, first_unit = 0;
    for (int s = 0; s < world_rank; s++) first_unit += units[s];
    int end = first_unit + units[world_rank], first = first_unit / 2;
    struct gpt model;
    gpt_build(&model, &shape, first, (end + 1) / 2 - first, world_rank == 0, world_rank == 3,
              1234);
    fill_model(&model, 0);
    for (int i = 0; i < model.num_blocks; i++) model.blocks[i].halves = BLOCK_HALVES;
    if (first_unit % 2) {
        model.blocks[0].halves = BLOCK_HALF_MLP;
        for (size_t k = 0; k < model.blocks[0].nparams; k++) model.blocks[0].params[k] = NAN;
    }
    if (end % 2) model.blocks[model.num_blocks - 1].halves = BLOCK_HALF_ATTENTION;
    struct world w = {4, 4, 1, {1, 2, 2, 2}};
    struct ckpt_meta meta;
    int frozen[16];
    long cursors[8];
    char config[256];
    meta_for(&meta, 0, 40, &w, NULL, shape.layers, frozen, cursors, config);
    meta.unit_layout = units;
    int rc = ckpt_save(dir, 0, &model, &meta, world_rank, 0, MPI_COMM_WORLD, path, sizeof path,
                       err, sizeof err);
    CHECK_MSG(rc == 0, "save: %s", err);
    gpt_free(&model);
    if (world_rank == 0) {
        struct ckpt_meta info;
        CHECK_MSG(ckpt_read_info(path, &info, err, sizeof err) == 0, "%s", err);
        CHECK(info.unit_layout && !memcmp(info.unit_layout, units, sizeof units));
        CHECK(!memcmp(info.layout, w.layout, 4 * sizeof(int)));
        CHECK(info.unit_history.count == 1 && info.unit_history.layers == 14 &&
              !memcmp(layout_history_entry(&info.unit_history, 0), units, sizeof units));
        for (int i = 0; i < shape.layers; i++) CHECK(info.frozen[i] == (i % 3 == 0));
        ckpt_meta_free(&info);
        CHECK(ckpt_check_file(path, 1, NULL, NULL) == 0);
    }
    struct world whole = {4, 4, 1, {2, 2, 2, 1}};
    build_for(&model, &shape, &whole, world_rank);
    CHECK_MSG(ckpt_load_try(path, &model, &meta, MPI_COMM_WORLD, err, sizeof err) == 0, "%s",
              err);
    CHECK_MSG(check_model(&model, 0) == 0, "rank %d: a sublayer save loads other values",
              world_rank);
    ckpt_meta_free(&meta);
    gpt_free(&model);
    barrier(MPI_COMM_WORLD);
}

static void test_faults(void)
{
    struct gpt_shape shape = tiny_shape();
    char faults[600], good[700], bad[700];
    snprintf(faults, sizeof faults, "%s/faults", getenv("CKPT_TEST_DIR"));
    save_tiny(faults, 10, 0);
    ckpt_path(good, sizeof good, faults, 10);

    /* A flipped byte in the last layer's row: only the rank owning it
     * reads it, yet every rank reports the same corruption. */
    snprintf(bad, sizeof bad, "%s/flipped.h5", faults);
    if (world_rank == 0) {
        copy_file(good, bad, -1);
        flip_in_chunk(bad, "/blocks/params", (hsize_t)shape.layers - 1);
    }
    barrier(MPI_COMM_WORLD);
    expect_load_error(bad, &shape, "Fletcher32", "/blocks/params");
    if (world_rank == 0) {
        int problems = 0;
        CHECK(ckpt_check_file(bad, 1, report_count, &problems) >= 1 && problems >= 1);
        CHECK(ckpt_check_file(bad, 0, NULL, NULL) == 0);   /* structure is intact */
        CHECK(ckpt_check_file(good, 1, NULL, NULL) == 0);
        /* The fuzzer's entry gives the same verdicts on the bytes in memory. */
        size_t bytes;
        unsigned char *image = read_bytes(good, &bytes);
        CHECK(ckpt_check_image(image, bytes, good, 1, NULL, NULL) == 0);
        free(image);
        image = read_bytes(bad, &bytes);
        int in_memory = 0;
        CHECK(ckpt_check_image(image, bytes, bad, 1, report_count, &in_memory) == problems);
        CHECK_MSG(in_memory == problems, "%d problems in memory, %d in the file", in_memory,
                  problems);
        CHECK(ckpt_check_image(image, bytes / 2, bad, 1, NULL, NULL) >= 1);   /* truncated */
        CHECK(ckpt_check_image(image, 0, bad, 1, NULL, NULL) == 1);
        free(image);
    }

    snprintf(bad, sizeof bad, "%s/truncated.h5", faults);
    if (world_rank == 0) {
        struct stat st;
        stat(good, &st);
        copy_file(good, bad, (long)st.st_size / 2);
    }
    barrier(MPI_COMM_WORLD);
    expect_load_error(bad, &shape, "truncated", NULL);

    struct gpt_shape other = shape;
    other.channels = 24;
    other.heads = 3;
    expect_load_error(good, &other, "model.channels is 16 in the checkpoint but 24", NULL);

    snprintf(bad, sizeof bad, "%s/ckpt-10.h5.tmp", faults);
    if (world_rank == 0) copy_file(good, bad, -1);
    barrier(MPI_COMM_WORLD);
    expect_load_error(bad, &shape, "incomplete", ".tmp");

    /* resume=auto: latest names a corrupt file -> the previous one. */
    char auto_dir[700], path[800], loaded_path[1024];
    snprintf(auto_dir, sizeof auto_dir, "%s/auto", faults);
    save_tiny(auto_dir, 10, 0);
    save_tiny(auto_dir, 20, 0);
    save_tiny(auto_dir, 30, 0);
    if (world_rank == 0) {
        ckpt_path(path, sizeof path, auto_dir, 30);
        flip_in_chunk(path, "/blocks/adam_v", 0);
    }
    barrier(MPI_COMM_WORLD);
    struct world w = {world_size, world_size, 1, {0}};
    for (int s = 0; s < world_size; s++) w.layout[s] = shape.layers / world_size +
                                                       (s < shape.layers % world_size);
    struct gpt model;
    build_for(&model, &shape, &w, world_rank);
    struct ckpt_meta meta;
    int found = ckpt_resume_auto(auto_dir, &model, &meta, MPI_COMM_WORLD, loaded_path,
                                 sizeof loaded_path);
    CHECK(found == 1 && meta.step == 20 && strstr(loaded_path, "ckpt-20.h5"));
    CHECK(check_model(&model, 0) == 0);
    ckpt_meta_free(&meta);

    /* latest names a file that is gone -> the newest before it. */
    if (world_rank == 0) {
        ckpt_path(path, sizeof path, auto_dir, 30);
        unlink(path);
        ckpt_path(path, sizeof path, auto_dir, 20);
        unlink(path);
    }
    barrier(MPI_COMM_WORLD);
    if (world_rank == 0) {
        snprintf(path, sizeof path, "%s/latest", auto_dir);
        FILE *f = fopen(path, "w");
        fputs("ckpt-20.h5\n", f);
        fclose(f);
    }
    barrier(MPI_COMM_WORLD);
    found = ckpt_resume_auto(auto_dir, &model, &meta, MPI_COMM_WORLD, loaded_path,
                             sizeof loaded_path);
    CHECK(found == 1 && meta.step == 10 && strstr(loaded_path, "ckpt-10.h5"));
    ckpt_meta_free(&meta);

    /* Only a .tmp: nothing to resume. */
    snprintf(auto_dir, sizeof auto_dir, "%s/only-tmp", faults);
    if (world_rank == 0) {
        mkdir(auto_dir, 0777);
        snprintf(path, sizeof path, "%s/ckpt-10.h5.tmp", auto_dir);
        copy_file(good, path, -1);
    }
    barrier(MPI_COMM_WORLD);
    found = ckpt_resume_auto(auto_dir, &model, &meta, MPI_COMM_WORLD, loaded_path,
                             sizeof loaded_path);
    CHECK(found == 0 && loaded_path[0] == '\0' && meta.allocated == 0);
    gpt_free(&model);

    /* A save into a directory that cannot be created fails on every rank. */
    char err[1024] = "";
    struct gpt_shape s = tiny_shape();
    struct world one = {world_size, world_size, 1, {0}};
    for (int k = 0; k < world_size; k++) one.layout[k] = s.layers / world_size +
                                                         (k < s.layers % world_size);
    build_for(&model, &s, &one, world_rank);
    int frozen[16];
    long cursors[8];
    char config[256];
    meta_for(&meta, 0, 10, &one, NULL, s.layers, frozen, cursors, config);
    snprintf(path, sizeof path, "%s/latest/sub", faults);   /* latest is a file */
    int rc = ckpt_save(path, 2, &model, &meta, world_rank, 0, MPI_COMM_WORLD, NULL, 0, err,
                       sizeof err);
    CHECK_MSG(rc == -1 && strstr(err, "cannot create the checkpoint directory"), "rc %d: %s",
              rc, err);
    CHECK(sum_int(rc == -1, MPI_COMM_WORLD) == world_size);
    gpt_free(&model);
    barrier(MPI_COMM_WORLD);
}

/* ---- the writer's Fletcher32 against HDF5's own filter ------------------------- */

/* Writes `bytes` bytes as one chunk of a uint8 dataset through HDF5's
 * Fletcher32 filter (serial file) and returns the checksum HDF5 stored
 * after the chunk, read back raw. */
static uint32_t hdf5_fletcher32(const char *path, const unsigned char *data, size_t bytes)
{
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[1] = {bytes};
    hid_t space = H5Screate_simple(1, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, dims);
    H5Pset_fletcher32(dcpl);
    hid_t dataset = H5Dcreate2(file, "d", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    DM_ASSERT(H5Dwrite(dataset, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    hsize_t offset[1] = {0}, stored = 0;
    uint32_t mask = 0;
    DM_ASSERT(H5Dget_chunk_storage_size(dataset, offset, &stored) >= 0 && stored == bytes + 4);
    unsigned char *raw = dm_alloc(stored);
    DM_ASSERT(H5Dread_chunk(dataset, H5P_DEFAULT, offset, &mask, raw) >= 0);
    uint32_t sum = (uint32_t)raw[bytes] | (uint32_t)raw[bytes + 1] << 8 |
                   (uint32_t)raw[bytes + 2] << 16 | (uint32_t)raw[bytes + 3] << 24;
    dm_free(raw);
    H5Dclose(dataset);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(file);
    return sum;
}

static void test_fletcher32(void)
{
    /* Around the writer's 512-byte blocks and 8192-byte stripes, and chunk-sized. */
    size_t sizes[] = {1, 2, 3, 4, 5, 511, 512, 513, 719, 720, 721, 1000, 8190, 8192, 8193,
                      24578, 131070, 131071, 12289, 1 << 20, (1 << 20) + 7};
    char path[600];
    snprintf(path, sizeof path, "%s/fletcher.h5", getenv("CKPT_TEST_DIR"));
    int mismatches = 0, cases = 0;
    for (int kind = 0; kind < 5; kind++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            unsigned char *data = dm_alloc(n);
            for (size_t i = 0; i < n; i++) {
                uint64_t h = dm_hash64(kind, k, i);
                data[i] = kind == 0 ? (unsigned char)h            /* random */
                        : kind == 1 ? 0                            /* all zero */
                        : kind == 2 ? 0xff                         /* all ones */
                        : kind == 3 ? (i + 1 == n)                 /* one bit at the end */
                                    : (unsigned char)(i % 2 ? 0xff : 0xfe);
            }
            uint32_t theirs = hdf5_fletcher32(path, data, n), ours = ckpt_fletcher32(data, n);
            CHECK_MSG(theirs == ours, "Fletcher32 of %zu bytes (pattern %d): HDF5 %08x, "
                      "ours %08x", n, kind, theirs, ours);
            mismatches += theirs != ours;
            cases++;
            dm_free(data);
        }
    printf("fletcher32: %d cases against HDF5's filter, %d differ\n", cases, mismatches);
}

/* ---- command-line modes ---------------------------------------------------------------- */

struct options {
    const char *save, *load, *resume, *bench;
    long step;
    int keep, pp, fill, repeat;
    struct gpt_shape shape;
    struct moe_params moe;   /* --moe-every and the rest: into shape once read */
};

static void parse(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->shape = tiny_shape();
    o->step = 10;
    o->keep = 2;
    o->repeat = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) dm_user_error("test_checkpoint: %s needs a value", a);
        if (!strcmp(a, "--save")) o->save = v;
        else if (!strcmp(a, "--load")) o->load = v;
        else if (!strcmp(a, "--resume")) o->resume = v;
        else if (!strcmp(a, "--bench")) o->bench = v;
        else if (!strcmp(a, "--step")) o->step = atol(v);
        else if (!strcmp(a, "--keep")) o->keep = atoi(v);
        else if (!strcmp(a, "--pp")) o->pp = atoi(v);
        else if (!strcmp(a, "--fill")) o->fill = atoi(v);
        else if (!strcmp(a, "--repeat")) o->repeat = atoi(v);
        else if (!strcmp(a, "--layers")) o->shape.layers = atoi(v);
        else if (!strcmp(a, "--channels")) o->shape.channels = atoi(v);
        else if (!strcmp(a, "--heads")) o->shape.heads = atoi(v);
        else if (!strcmp(a, "--vocab")) o->shape.vocab = atoi(v);
        else if (!strcmp(a, "--max-seq")) o->shape.max_seq = atoi(v);
        else if (!strcmp(a, "--moe-every")) o->moe.every = atoi(v);
        else if (!strcmp(a, "--experts")) o->moe.experts = atoi(v);
        else if (!strcmp(a, "--top-k")) o->moe.top_k = atoi(v);
        else if (!strcmp(a, "--expert-hidden")) o->moe.hidden = atoi(v);
        else dm_user_error("test_checkpoint: unknown option %s", a);
        i++;
    }
    struct moe_params *m = &o->moe;
    if (m->every > 0 && (m->every > o->shape.layers || m->experts < 1 || m->top_k < 1 ||
                         m->top_k > m->experts || m->hidden < 1))
        dm_user_error("test_checkpoint: --moe-every %d --experts %d --top-k %d "
                      "--expert-hidden %d is no mixture of experts of %d layers", m->every,
                      m->experts, m->top_k, m->hidden, o->shape.layers);
    if (m->every > 0) moe_shape_add(&o->shape, m);
}

/* The world of a command-line mode: pp stages (default: every rank), the
 * rest data-parallel replicas; uniform layout. */
static struct world mode_world(const struct options *o)
{
    struct world w;
    memset(&w, 0, sizeof w);
    w.ranks = world_size;
    w.pp = o->pp > 0 ? o->pp : world_size;
    w.dp = world_size / w.pp;
    if (w.pp * w.dp != world_size || w.pp > 8 || w.pp > o->shape.layers)
        dm_user_error("test_checkpoint: %d ranks do not form %d stages", world_size, w.pp);
    for (int s = 0; s < w.pp; s++) w.layout[s] = o->shape.layers / w.pp +
                                                 (s < o->shape.layers % w.pp);
    return w;
}

/* Fast deterministic fill for large models: generation `fill`'s values
 * would take too long to draw for a benchmark, so a cheap pattern. */
static void fill_fast(struct gpt *model, int fill)
{
    for (int i = 0; i < model->num_blocks; i++) {
        struct block *blk = &model->blocks[i];
        for (size_t k = 0; k < blk->nparams; k++) {
            blk->params[k] = (float)(k % 1000) * 1e-3f + (float)(blk->index + fill);
            blk->m[k] = -blk->params[k];
            blk->v[k] = 2 * blk->params[k];
        }
    }
}

static int mode_save(const struct options *o, struct world w, const char *where)
{
    struct gpt model;
    build_for(&model, &o->shape, &w, world_rank);
    if (o->shape.layers * o->shape.channels > 4096) fill_fast(&model, o->fill);
    else fill_model(&model, o->fill);
    struct ckpt_meta meta;
    int *frozen = dm_alloc((size_t)o->shape.layers * sizeof(int));
    long cursors[8];
    char config[256], err[1024], path[1024];
    meta_for(&meta, o->fill, o->step, &w, NULL, o->shape.layers, frozen, cursors, config);
    int stage, dp_rank, first;
    place(&w, world_rank, &stage, &dp_rank, &first);
    barrier(MPI_COMM_WORLD);
    double start = dm_now();
    int rc = ckpt_save(where, o->keep, &model, &meta, stage, dp_rank, MPI_COMM_WORLD, path,
                       sizeof path, err, sizeof err);
    double seconds = max_double(dm_now() - start, MPI_COMM_WORLD);
    dm_free(frozen);
    gpt_free(&model);
    if (rc != 0) dm_user_error("%s", err);
    dm_log("saved %s in %.3f s\n", path, seconds);
    return 0;
}

static int mode_load(const struct options *o, struct world w, const char *path, int resume)
{
    struct gpt model;
    build_for(&model, &o->shape, &w, world_rank);
    struct ckpt_meta meta;
    char loaded[1024];
    if (resume) {
        if (!ckpt_resume_auto(path, &model, &meta, MPI_COMM_WORLD, loaded, sizeof loaded)) {
            gpt_free(&model);
            return 0;
        }
    } else {
        ckpt_load(path, &model, &meta, MPI_COMM_WORLD);
        snprintf(loaded, sizeof loaded, "%s", path);
    }
    int bad = 0;
    if (o->shape.layers * o->shape.channels <= 4096)
        bad = sum_int(check_model(&model, (int)(meta.seed - 0xdeadbeefcafef00dULL)) != 0,
                      MPI_COMM_WORLD);
    dm_log("loaded %s: step %ld, %s\n", loaded, meta.step,
           bad ? "VALUES DIFFER" : "values as written");
    ckpt_meta_free(&meta);
    gpt_free(&model);
    return bad ? 1 : 0;
}

/* Values of fill_fast that do not match, for the benchmark's check. */
static size_t check_fast(const struct gpt *model, int fill)
{
    size_t bad = 0;
    for (int i = 0; i < model->num_blocks; i++) {
        const struct block *blk = &model->blocks[i];
        for (size_t k = 0; k < blk->nparams; k++) {
            float p = (float)(k % 1000) * 1e-3f + (float)(blk->index + fill);
            bad += blk->params[k] != p || blk->m[k] != -p || blk->v[k] != 2 * p;
        }
    }
    return bad;
}

/* Drops one file's pages from the page cache (after making them durable),
 * so that the next read comes from the disk; other files stay cached. */
static int evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    int ok = fdatasync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    close(fd);
    return ok;
}

static int mode_bench(const struct options *o, struct world w)
{
    struct gpt model;
    build_for(&model, &o->shape, &w, world_rank);
    struct ckpt_meta meta;
    int *frozen = dm_alloc((size_t)o->shape.layers * sizeof(int));
    long cursors[8];
    char config[256], err[1024], path[1024];
    int stage, dp_rank, first, wrong = 0;
    place(&w, world_rank, &stage, &dp_rank, &first);
    for (int r = 0; r < o->repeat; r++) {
        fill_fast(&model, r);
        meta_for(&meta, 0, r + 1, &w, NULL, o->shape.layers, frozen, cursors, config);
        barrier(MPI_COMM_WORLD);
        double start = dm_now();
        int rc = ckpt_save(o->bench, 0, &model, &meta, stage, dp_rank, MPI_COMM_WORLD, path,
                           sizeof path, err, sizeof err);
        double write_s = max_double(dm_now() - start, MPI_COMM_WORLD);
        if (rc != 0) dm_user_error("%s", err);
        struct stat st;
        stat(path, &st);
        double bytes = (double)st.st_size;
        int cold = world_rank == 0 ? evict(path) : 1;
        cold = sum_int(cold, MPI_COMM_WORLD) == world_size;
        /* Load into zeroed tensors, so that a read that does nothing fails. */
        fill_fast(&model, r + 1000);
        barrier(MPI_COMM_WORLD);
        struct ckpt_meta loaded;
        start = dm_now();
        ckpt_load(path, &model, &loaded, MPI_COMM_WORLD);
        double read_s = max_double(dm_now() - start, MPI_COMM_WORLD);
        ckpt_meta_free(&loaded);
        int bad = sum_int(check_fast(&model, r) != 0, MPI_COMM_WORLD);
        /* Deleted here, untimed, rather than by the next save's keep. */
        if (world_rank == 0) unlink(path);
        wrong += bad;
        dm_log("bench ranks %d pp %d dp %d bytes %.0f write_s %.3f write_MBps %.1f read_s %.3f "
               "read_MBps %.1f read_cache %s values %s\n", world_size, w.pp, w.dp, bytes,
               write_s, bytes / write_s / 1e6, read_s, bytes / read_s / 1e6,
               cold ? "cold" : "warm", bad ? "WRONG" : "ok");
    }
    dm_free(frozen);
    gpt_free(&model);
    return wrong ? 1 : 0;
}

/* ---- main ------------------------------------------------------------------------------- */

static int under_mpi(void)
{
    return getenv("PMI_RANK") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
           getenv("OMPI_COMM_WORLD_SIZE");
}

int main(int argc, char **argv)
{
    if (!under_mpi()) {
        /* Run as a plain test binary: become a 4-rank job. */
        char **args = calloc((size_t)argc + 4, sizeof *args);
        args[0] = "mpiexec";
        args[1] = "-n";
        args[2] = "4";
        for (int i = 0; i < argc; i++) args[3 + i] = argv[i];
        fflush(stdout);
        execvp("mpiexec", args);
        fprintf(stderr, "test_checkpoint: cannot run mpiexec: %s\n", strerror(errno));
        return 1;
    }
    world_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    dm_threads_init(1);
    struct options o;
    parse(argc, argv, &o);
    int status = 0;
    if (o.save) status = mode_save(&o, mode_world(&o), o.save);
    else if (o.load) status = mode_load(&o, mode_world(&o), o.load, 0);
    else if (o.resume) status = mode_load(&o, mode_world(&o), o.resume, 1);
    else if (o.bench) status = mode_bench(&o, mode_world(&o));
    else {
        char template[] = "/tmp/dynmo-test-ckpt.XXXXXX";
        char *tmp = template;
        if (world_rank == 0 && !mkdtemp(template)) tmp = NULL;
        MPI_Request request;
        MPI_Ibcast(template, sizeof template, MPI_CHAR, 0, MPI_COMM_WORLD, &request);
        wait_polled(&request);
        (void)tmp;
        setenv("CKPT_TEST_DIR", template, 1);
        if (world_rank == 0) test_fletcher32();
        test_chain();
        test_moe_rows();
        test_faults();
        test_dyn_state();
        test_units_layout();
        int failures = sum_int(testing_failures, MPI_COMM_WORLD);
        if (world_rank == 0) {
            char command[600];
            snprintf(command, sizeof command, "rm -rf '%s'", template);
            if (failures == 0 && system(command) != 0) fprintf(stderr, "cannot clean %s\n",
                                                               template);
            if (failures) fprintf(stderr, "kept %s for inspection\n", template);
            printf("test_checkpoint on %d ranks: %d checks on rank 0, %d failed on all "
                   "ranks\n", world_size, testing_checks, failures);
        }
        status = failures ? 1 : 0;
    }
    dm_threads_shutdown();
    world_finalize(status);
    return status;
}
