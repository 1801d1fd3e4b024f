/* The checkpoint writer: ckpt_save, all ranks at once through parallel
 * HDF5 over MPI-IO. Loading is ckpt_load.c's.
 *
 * The file layout is checkpoint_schema/v1.def, or a scheme's own version
 * (ckpt_schema_for), with the lines of the schemes' fragments and of the
 * extension dyn.def when the scheme's own state is saved (meta->dyn_state,
 * ckpt_dyn.c); this file creates exactly the groups and datasets listed
 * there (ckpt_file.c checks them the same way) and writes the rows the
 * schemes name (dyn_ckpt_block_rows). The directory around the file is ckpt_dir.c's: the names, the
 * temporary, publishing (fsync, rename, fsync the directory, and only then
 * move the completion marker DIR/latest and delete old checkpoints). This
 * file writes the one temporary file it is given and never chooses a name.
 *
 * Rank 0 creates the file's skeleton (groups, attributes, datasets with
 * every chunk allocated) alone through a serial driver that drops the fill
 * values parallel HDF5 would write into every chunk (skeleton_driver.c);
 * then all ranks open it through MPI-IO and write their chunks. The raw
 * data are written as finished chunks whose Fletcher32 checksum we compute
 * (fletcher32.c), so that HDF5's slower filtered collective write path is
 * not needed; readers verify with HDF5's own filter.
 *
 * Every wait of ours is a non-blocking collective polled with MPI_Test and
 * sched_yield (MPICH's blocking waits spin and starve peers when ranks
 * outnumber cores). Errors that every rank can reach agreement on are
 * returned on every rank with one message; failures inside HDF5's own
 * collective calls take the fatal path, since a rank that skipped a
 * collective would leave its peers waiting forever. This file must not
 * decide training policy (when to save, what to do on failure). */
/* sync_file_range (Linux), to start the writeback of a save early. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "dynmo/backend.h"
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/world.h"
#include "ckpt/ckpt_dir.h"
#include "ckpt/ckpt_file.h"
#include "ckpt/h5util.h"
#include "ckpt/skeleton_driver.h"

/* Most bytes of one chunk: large enough that the chunk index stays small
 * and each write moves a big piece, small enough that the writer's chunk
 * buffer and readers' buffers stay modest and a checksum failure
 * pinpoints a region. 4 MiB measured as fast as 8 and 16 (docs/PERFORMANCE.md). */
#define CHUNK_TARGET_BYTES ((size_t)4 << 20)
#define MESSAGE_BYTES 1024

/* ---- polled collectives ---------------------------------------------------- */

/* FNV-1a over bytes, for the cross-rank consistency check of meta. */
static uint64_t fnv1a_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* Every rank must pass the same meta (except frozen, which is per owner):
 * a difference is a bug in the caller, and would make HDF5's collective
 * metadata diverge, so it is fatal. */
static void check_same_everywhere(const char *dir, int keep, const struct ckpt_meta *meta,
                                  int layers, MPI_Comm comm)
{
    uint64_t h = 1469598103934665603ULL;
    long scalars[] = {meta->step, meta->optimizer_steps, meta->lr_schedule_step,
                      meta->pp, meta->dp, meta->history.count, meta->history.layers, keep,
                      layers};
    h = fnv1a_bytes(h, scalars, sizeof scalars);
    h = fnv1a_bytes(h, &meta->seed, sizeof meta->seed);
    h = fnv1a_bytes(h, &meta->train_checksum, sizeof meta->train_checksum);
    h = fnv1a_bytes(h, dir, strlen(dir));
    if (meta->config_text) h = fnv1a_bytes(h, meta->config_text, strlen(meta->config_text));
    h = fnv1a_bytes(h, meta->dyn_kind, strlen(meta->dyn_kind));
    h = fnv1a_bytes(h, &meta->dyn_state_count, sizeof meta->dyn_state_count);
    if (meta->dyn_state_count > 0)
        h = fnv1a_bytes(h, meta->dyn_state, (size_t)meta->dyn_state_count * sizeof(double));
    h = fnv1a_bytes(h, meta->data_cursor, (size_t)meta->dp * sizeof(long));
    h = fnv1a_bytes(h, meta->layout, (size_t)meta->pp * sizeof(int));
    if (meta->unit_layout) {   /* a sublayer run's: layout and history derive from these */
        h = fnv1a_bytes(h, meta->unit_layout, (size_t)meta->pp * sizeof(int));
        h = fnv1a_bytes(h, meta->unit_history.layout, (size_t)meta->unit_history.count *
                                                          (size_t)meta->unit_history.layers *
                                                          sizeof(int));
    }
    if (meta->history.count > 0) {
        size_t n = (size_t)meta->history.count;
        h = fnv1a_bytes(h, meta->history.step, n * sizeof(long));
        h = fnv1a_bytes(h, meta->history.stages, n * sizeof(int));
        h = fnv1a_bytes(h, meta->history.layout, n * (size_t)layers * sizeof(int));
    }
    /* min(h) == max(h) iff min(h) == ~min(~h). */
    unsigned long long mine[2] = {h, ~h}, lowest[2];
    MPI_Request request;
    WORLD_MPI(MPI_Iallreduce(mine, lowest, 2, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm,
                            &request));
    world_wait(&request);
    if (lowest[0] != ~lowest[1])
        DM_FATAL("ckpt_save: ranks passed different checkpoint metadata (step, layout, "
                 "cursors, history, scheme state, config or directory): every rank must "
                 "pass the same");
}

/* Every (stage, replica) pair exactly once: the grid the caller described
 * must be the communicator's. */
static void check_grid(int stage, int dp_rank, int pp, int dp, MPI_Comm comm)
{
    int size;
    WORLD_MPI(MPI_Comm_size(comm, &size));
    int mine = stage * dp + dp_rank;
    int *all = dm_alloc((size_t)size * sizeof(int));
    MPI_Request request;
    WORLD_MPI(MPI_Iallgather(&mine, 1, MPI_INT, all, 1, MPI_INT, comm, &request));
    world_wait(&request);
    int *seen = dm_alloc((size_t)size * sizeof(int));
    for (int r = 0; r < size; r++) {
        if (all[r] < 0 || all[r] >= pp * dp || seen[all[r]]++)
            DM_FATAL("ckpt_save: rank %d claims (stage, replica) %d of a %d x %d grid, "
                     "which is out of range or claimed twice", r, all[r], pp, dp);
    }
    dm_free(seen);
    dm_free(all);
}

/* ---- writing ------------------------------------------------------------------ */

static void iso_time_now(char *buf, size_t size)
{
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &utc);
}

static void write_integer_attr(hid_t loc, const char *name, enum schema_type type,
                               long long value)
{
    hid_t space = DM_H5(H5Screate(H5S_SCALAR));
    hid_t attr = DM_H5(H5Acreate2(loc, name, schema_file_type(type), space, H5P_DEFAULT,
                                  H5P_DEFAULT));
    if (type == SCHEMA_TYPE_UINT64) {
        unsigned long long u;
        memcpy(&u, &value, sizeof u);
        DM_H5(H5Awrite(attr, H5T_NATIVE_ULLONG, &u));
    } else {
        DM_H5(H5Awrite(attr, H5T_NATIVE_LLONG, &value));
    }
    DM_H5(H5Aclose(attr));
    DM_H5(H5Sclose(space));
}

/* Chunk shape of a schema dataset: datasets indexed by layer get one
 * layer per chunk row so that each chunk has a single writer; the rest
 * are written by one rank and get whole rows per chunk. Each dimension is
 * split into near-equal pieces so that no chunk is mostly padding. A chunk
 * holds at most CHUNK_TARGET_BYTES. Returns the dataset's rank. */
static int dataset_geometry(const struct schema_dataset *d, const struct ckpt_dims *dims,
                            hsize_t extent[2], hsize_t chunk[2])
{
    int rank = ckpt_dataset_extent(d, dims, extent);
    DM_ASSERT(rank > 0 && extent[0] > 0 && extent[1] > 0);
    hsize_t target = CHUNK_TARGET_BYTES / schema_type_size(d->type);
    hsize_t cols = rank == 2 ? extent[1] : extent[0];
    hsize_t pieces = (cols + target - 1) / target;
    hsize_t col_chunk = (cols + pieces - 1) / pieces;
    if (rank == 1) {
        chunk[0] = col_chunk;
        chunk[1] = 1;
        return rank;
    }
    hsize_t rows = target / col_chunk;
    int per_block = !strcmp(d->dims[0], "layers") || dyn_ckpt_is_dim(d->dims[0]);
    if (per_block || rows < 1) rows = 1;
    if (rows > extent[0]) rows = extent[0];
    chunk[0] = rows;
    chunk[1] = col_chunk;
    return rank;
}

/* Creates dataset d with every chunk allocated now (early allocation),
 * so that the ranks' chunk writes later change no metadata. */
static hid_t create_dataset(hid_t file, const struct schema_dataset *d,
                            const struct ckpt_dims *dims)
{
    hsize_t extent[2], chunk[2];
    int rank = dataset_geometry(d, dims, extent, chunk);
    hid_t space = DM_H5(H5Screate_simple(rank, extent, NULL));
    hid_t dcpl = DM_H5(H5Pcreate(H5P_DATASET_CREATE));
    DM_H5(H5Pset_chunk(dcpl, rank, chunk));
    DM_H5(H5Pset_fletcher32(dcpl));
    DM_H5(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    DM_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
    hid_t dataset = DM_H5(H5Dcreate2(file, d->path, schema_file_type(d->type), space,
                                     H5P_DEFAULT, dcpl, H5P_DEFAULT));
    DM_H5(H5Pclose(dcpl));
    DM_H5(H5Sclose(space));
    return dataset;
}

/* The schemes' attributes (dyn.h's writer), into the open file *ctx. */
static void writer_int(void *ctx, const char *object, const char *name, long long value)
{
    hid_t group = DM_H5(H5Oopen(*(hid_t *)ctx, object, H5P_DEFAULT));
    write_integer_attr(group, name, SCHEMA_TYPE_INT64, value);
    DM_H5(H5Oclose(group));
}

static void writer_string(void *ctx, const char *object, const char *name, const char *text)
{
    hid_t group = DM_H5(H5Oopen(*(hid_t *)ctx, object, H5P_DEFAULT));
    dm_h5_write_string_attr(group, name, text);
    DM_H5(H5Oclose(group));
}

/* The root and group attributes, which rank 0 writes into the skeleton. */
static void write_attributes(hid_t file, const struct gpt_shape *shape,
                             const struct ckpt_meta *meta, const struct ckpt_dims *dims,
                             const struct ckpt_schema *schema)
{
    char created[32];
    iso_time_now(created, sizeof created);
    dm_h5_write_string_attr(file, "kind", CHECKPOINT_KIND);
    write_integer_attr(file, "schema_version", SCHEMA_TYPE_INT64, schema->version);
    dm_h5_write_string_attr(file, "dynmo_version", DYNMO_VERSION);
    dm_h5_write_string_attr(file, "created", created);
    dm_h5_write_string_attr(file, "config", meta->config_text ? meta->config_text : "");
    write_integer_attr(file, "world_pp", SCHEMA_TYPE_INT64, meta->pp);
    write_integer_attr(file, "world_dp", SCHEMA_TYPE_INT64, meta->dp);
    write_integer_attr(file, "world_size", SCHEMA_TYPE_INT64, (long long)meta->pp * meta->dp);

    hid_t group = DM_H5(H5Gopen2(file, "/model", H5P_DEFAULT));
    write_integer_attr(group, "vocab", SCHEMA_TYPE_INT64, shape->vocab);
    write_integer_attr(group, "max_seq", SCHEMA_TYPE_INT64, shape->max_seq);
    write_integer_attr(group, "layers", SCHEMA_TYPE_INT64, shape->layers);
    write_integer_attr(group, "heads", SCHEMA_TYPE_INT64, shape->heads);
    write_integer_attr(group, "channels", SCHEMA_TYPE_INT64, shape->channels);
    write_integer_attr(group, "block_params", SCHEMA_TYPE_INT64, dims->block_params);
    DM_H5(H5Gclose(group));

    long long seed, checksum;
    memcpy(&seed, &meta->seed, sizeof seed);
    memcpy(&checksum, &meta->train_checksum, sizeof checksum);
    group = DM_H5(H5Gopen2(file, "/training", H5P_DEFAULT));
    write_integer_attr(group, "step", SCHEMA_TYPE_INT64, meta->step);
    write_integer_attr(group, "optimizer_steps", SCHEMA_TYPE_INT64, meta->optimizer_steps);
    write_integer_attr(group, "lr_schedule_step", SCHEMA_TYPE_INT64, meta->lr_schedule_step);
    write_integer_attr(group, "seed", SCHEMA_TYPE_UINT64, seed);
    dm_h5_write_string_attr(group, "rng", "counter-based");
    DM_H5(H5Gclose(group));

    group = DM_H5(H5Gopen2(file, "/data", H5P_DEFAULT));
    write_integer_attr(group, "train_checksum", SCHEMA_TYPE_UINT64, checksum);
    DM_H5(H5Gclose(group));
    if (meta->dyn_state_count > 0) ckpt_dyn_write_attributes(file, meta);
    if (meta->unit_layout) ckpt_units_write_attributes(file);
    struct dyn_ckpt_writer writer = {.ctx = &file, .int_attr = writer_int,
                                     .string_attr = writer_string};
    dyn_ckpt_write_attrs(shape, &writer);   /* the schemes' fragments */
}

/* Rank 0 creates the file's skeleton alone, with the serial skeleton
 * driver: groups, every dataset with all its chunks allocated, and the
 * attributes; no raw data. Parallel HDF5 would write the filtered fill
 * value into every chunk here (see skeleton_driver.c), doubling the bytes
 * a save writes; the skeleton driver drops those writes, so each chunk
 * stays a hole until its writer fills it. Discarding is on only while the
 * datasets are created, before any attribute exists, because the global
 * heap of the string attributes is raw data to the driver too. */
static void create_skeleton(const char *tmp, const struct gpt_shape *shape,
                            const struct ckpt_meta *meta, const struct ckpt_dims *dims,
                            const struct ckpt_schema *schema)
{
    dm_h5_set_file_context(tmp);
    hid_t fapl = ckpt_skeleton_fapl();
    DM_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110));
    hid_t file = DM_H5(H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    DM_H5(H5Pclose(fapl));
    for (int i = 0; i < schema->group_count; i++)
        DM_H5(H5Gclose(DM_H5(H5Gcreate2(file, schema->groups[i], H5P_DEFAULT,
                                        H5P_DEFAULT, H5P_DEFAULT))));
    unsigned long long allocated = 0;
    ckpt_skeleton_discard_raw(file, 1);
    for (int i = 0; i < schema->dataset_count; i++) {
        if (!ckpt_dataset_present(&schema->datasets[i], dims)) continue;   /* no rows */
        hid_t dataset = create_dataset(file, &schema->datasets[i], dims);
        allocated += H5Dget_storage_size(dataset);
        DM_H5(H5Dclose(dataset));
    }
    unsigned long long dropped = ckpt_skeleton_discard_raw(file, 0);
    /* What was dropped must be the fill of every allocated chunk, once (or
     * nothing, from an HDF5 that does not fill), never other raw data. */
    DM_ASSERT(dropped == allocated || dropped == 0);
    write_attributes(file, shape, meta, dims, schema);
    DM_H5(H5Fclose(file));
}

/* The raw data are written as finished chunks (H5Dwrite_chunk): this rank
 * copies a chunk's elements into chunk_buffer, zero-pads what lies past the
 * dataset's edge, appends the Fletcher32 checksum exactly as HDF5's filter
 * would, and writes the bytes where the collective creation allocated the
 * chunk. Every chunk keeps the size it was allocated with (data + 4), so
 * no chunk moves and no metadata changes: the writes are independent and
 * need no collective call. Readers run HDF5's own Fletcher32 filter over
 * them. The host and the file are little-endian, so elements are copied
 * as they are. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoint chunks are written as little-endian bytes");
_Static_assert(sizeof(long) == 8 && sizeof(int) == 4 && sizeof(float) == 4,
               "checkpoint element types");

struct chunk_writer {
    const struct ckpt_schema *schema;
    const hid_t *datasets;          /* (schema->dataset_count), open on every rank */
    const struct ckpt_dims *dims;
    unsigned char *chunk_buffer;    /* CHUNK_TARGET_BYTES + 4 */
    int writeback_fd;               /* the file, read-only, for start_writeback; or -1 */
};

/* Asks the kernel to start writing the file's dirty pages to disk now,
 * without waiting for them, so that the disk works while the ranks are
 * still writing and rank 0's fsync at the end has less left to wait for
 * (measured on 4 ranks: faster in 7 of 7 paired saves, by 15% in the
 * median; no change on 2). A hint only: a failure changes nothing, the
 * fsync still makes the file durable. */
static void start_writeback(const struct chunk_writer *w)
{
    if (w->writeback_fd >= 0) sync_file_range(w->writeback_fd, 0, 0, SYNC_FILE_RANGE_WRITE);
}

/* Writes rows [row0, row0 + nrows) of dataset `name` from src (row-major,
 * the dataset's own columns per row; a 1-D dataset has one column). The
 * rows must be whole chunk rows, or run to the dataset's last row. */
static void write_rows(const struct chunk_writer *w, const char *name, hsize_t row0,
                       hsize_t nrows, const void *src)
{
    int index = -1;
    for (int i = 0; i < w->schema->dataset_count && index < 0; i++)
        if (!strcmp(w->schema->datasets[i].path, name)) index = i;
    DM_ASSERT(index >= 0);
    const struct schema_dataset *d = &w->schema->datasets[index];
    hid_t dataset = w->datasets[index];
    hsize_t extent[2], chunk[2];
    int rank = dataset_geometry(d, w->dims, extent, chunk);
    size_t elem = schema_type_size(d->type);
    hsize_t rows = extent[0], cols = rank == 2 ? extent[1] : 1;
    hsize_t chunk_rows = chunk[0], chunk_cols = rank == 2 ? chunk[1] : 1;
    size_t chunk_bytes = (size_t)(chunk_rows * chunk_cols) * elem;
    DM_ASSERT(chunk_bytes <= CHUNK_TARGET_BYTES);
    DM_ASSERT(row0 % chunk_rows == 0 && row0 + nrows <= rows);
    DM_ASSERT((row0 + nrows) % chunk_rows == 0 || row0 + nrows == rows);
    const unsigned char *bytes = src;
    for (hsize_t r = row0; r < row0 + nrows; r += chunk_rows)
        for (hsize_t c = 0; c < cols; c += chunk_cols) {
            hsize_t used_rows = rows - r < chunk_rows ? rows - r : chunk_rows;
            hsize_t used_cols = cols - c < chunk_cols ? cols - c : chunk_cols;
            if (used_rows < chunk_rows || used_cols < chunk_cols)
                memset(w->chunk_buffer, 0, chunk_bytes);
            for (hsize_t i = 0; i < used_rows; i++)
                memcpy(w->chunk_buffer + (size_t)(i * chunk_cols) * elem,
                       bytes + (size_t)((r - row0 + i) * cols + c) * elem,
                       (size_t)used_cols * elem);
            uint32_t sum = ckpt_fletcher32(w->chunk_buffer, chunk_bytes);
            unsigned char *tail = w->chunk_buffer + chunk_bytes;
            tail[0] = (unsigned char)sum;
            tail[1] = (unsigned char)(sum >> 8);
            tail[2] = (unsigned char)(sum >> 16);
            tail[3] = (unsigned char)(sum >> 24);
            hsize_t offset[2] = {r, c};
            DM_H5(H5Dwrite_chunk(dataset, H5P_DEFAULT, 0, offset, chunk_bytes + 4,
                                 w->chunk_buffer));
        }
}

/* Fraction of exactly-zero weights in a block's matrices (what pruning
 * produces); descriptive state for inspect and the balancer. */
static float block_sparsity(const struct block *blk)
{
    size_t zeros = 0, total = 0;
    for (int k = 0; k < block_tensor_count(blk); k++) {
        size_t offset, n;
        if (!block_tensor_at(blk, k, &offset, &n)) continue;
        const float *p = blk->params + offset;
        for (size_t i = 0; i < n; i++) zeros += p[i] == 0.0f;
        total += n;
    }
    return total ? (float)((double)zeros / (double)total) : 0.0f;
}

static int layout_sum(const int *layout, int stages)
{
    int sum = 0;
    for (int s = 0; s < stages; s++) sum += layout[s];
    return sum;
}

/* Opens the skeleton tmp through MPI-IO on every rank (collective). */
static hid_t open_parallel(const char *tmp, MPI_Comm comm)
{
    hid_t fapl = DM_H5(H5Pcreate(H5P_FILE_ACCESS));
    /* Each rank writes whole chunks of its own: large, disjoint pieces,
     * for which ROMIO's two strategies for small interleaved writes only
     * cost. Collective buffering ships every byte to an aggregator, and
     * data sieving reads each region back before writing it (measured: a
     * full extra read of the file). Writes go straight to the file. */
    MPI_Info info;
    WORLD_MPI(MPI_Info_create(&info));
    WORLD_MPI(MPI_Info_set(info, "romio_cb_write", "disable"));
    WORLD_MPI(MPI_Info_set(info, "romio_ds_write", "disable"));
    DM_H5(H5Pset_fapl_mpio(fapl, comm, info));
    WORLD_MPI(MPI_Info_free(&info));
    /* Metadata writes are collective (one rank writes each entry). Metadata
     * reads stay independent: each rank looks up its own chunks' addresses
     * while the others write theirs, so the reads cannot be collective. */
    DM_H5(H5Pset_coll_metadata_write(fapl, 1));
    DM_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110));
    hid_t file = DM_H5(H5Fopen(tmp, H5F_ACC_RDWR, fapl));
    DM_H5(H5Pclose(fapl));
    return file;
}

/* Rank 0 writes the small datasets: cursors, layout, history, the
 * scheme's own state (when it has one), and the per-block state gathered
 * from the stages' writers (collective: every rank takes part in the
 * reductions). sparsity holds the writer's blocks' values, which
 * write_tensors took from the host copies it wrote, and zero elsewhere.
 * Each layer has one writer, so the sum of the contributions is that
 * writer's value exactly. */
static void write_small_datasets(const struct chunk_writer *w, const struct gpt *models,
                                 int chunks, const struct ckpt_meta *meta,
                                 const struct layout_history *history, int writer,
                                 const float *sparsity, MPI_Comm comm)
{
    int rank, layers = models[0].shape.layers;
    WORLD_MPI(MPI_Comm_rank(comm, &rank));
    int *frozen = dm_alloc((size_t)layers * sizeof(int));
    int *frozen_all = dm_alloc((size_t)layers * sizeof(int));
    float *sparsity_all = dm_alloc((size_t)layers * sizeof(float));
    for (int c = 0; writer && c < chunks; c++)
        for (int i = 0; i < models[c].num_blocks; i++) {
            const struct gpt *model = &models[c];
            if (model->blocks[i].halves == BLOCK_HALF_MLP) continue;   /* its attention's holder */
            int layer = model->first_block + i;
            frozen[layer] = model->blocks[i].frozen || (meta->frozen && meta->frozen[layer]);
        }
    MPI_Request requests[2];
    WORLD_MPI(MPI_Ireduce(frozen, frozen_all, layers, MPI_INT, MPI_SUM, 0, comm, &requests[0]));
    WORLD_MPI(MPI_Ireduce(sparsity, sparsity_all, layers, MPI_FLOAT, MPI_SUM, 0, comm,
                         &requests[1]));
    world_wait(&requests[0]);
    world_wait(&requests[1]);
    if (rank == 0) {
        hsize_t n = (hsize_t)history->count;
        write_rows(w, "/data/cursor", 0, (hsize_t)meta->dp, meta->data_cursor);
        write_rows(w, "/layout/blocks_per_stage", 0, (hsize_t)meta->pp, meta->layout);
        write_rows(w, "/layout/history_step", 0, n, history->step);
        write_rows(w, "/layout/history_stages", 0, n, history->stages);
        write_rows(w, "/layout/history_blocks_per_stage", 0, n, history->layout);
        write_rows(w, "/blocks/state/frozen", 0, (hsize_t)layers, frozen_all);
        write_rows(w, "/blocks/state/sparsity", 0, (hsize_t)layers, sparsity_all);
        if (meta->dyn_state_count > 0)
            write_rows(w, "/dyn/state", 0, (hsize_t)meta->dyn_state_count, meta->dyn_state);
        if (meta->unit_layout) {
            DM_ASSERT(meta->unit_history.count == history->count);
            write_rows(w, "/units/per_stage", 0, (hsize_t)meta->pp, meta->unit_layout);
            write_rows(w, "/units/history_per_stage", 0, n, meta->unit_history.layout);
        }
    }
    dm_free(frozen);
    dm_free(frozen_all);
    dm_free(sparsity_all);
}

/* The state beyond the slab a scheme writes (dyn_ckpt_write_state). */
static void state_rows(void *ctx, const char *name, long row, long count, const void *values)
{
    write_rows(ctx, name, (hsize_t)row, (hsize_t)count, values);
}

/* A block's rows (dyn_ckpt_block_rows: the schemes', and its own /blocks
 * row unless a scheme's version holds them): the replicated ones and its
 * state by replica 0 of the stage (whole), the sharded ones by each rank
 * that holds them (sharded). */
static void write_block(const struct chunk_writer *w, const struct gpt *model,
                        const struct block *blk, int whole, int sharded)
{
    struct dyn_ckpt_rows rows[DYN_CKPT_ROWS_MAX];
    int base, n = dyn_ckpt_block_rows(&model->shape, w->schema->version, blk, rows,
                                      DYN_CKPT_ROWS_MAX, &base);
    if (whole && !base) {   /* version 1: the block whole */
        write_rows(w, "/blocks/params", (hsize_t)blk->index, 1, blk->params);
        write_rows(w, "/blocks/adam_m", (hsize_t)blk->index, 1, blk->m);
        write_rows(w, "/blocks/adam_v", (hsize_t)blk->index, 1, blk->v);
    }
    if (whole) {
        struct dyn_ckpt_state_writer sw = {.ctx = (void *)w, .rows = state_rows};
        dyn_ckpt_write_state(&model->shape, blk, &sw);
    }
    const float *bases[3] = {blk->params, blk->m, blk->v};
    const char *kinds[3] = {"params", "adam_m", "adam_v"};
    for (int r = 0; r < n; r++) {
        if (!(rows[r].sharded ? sharded : whole)) continue;
        for (int k = 0; k < 3; k++) {
            char name[96];
            snprintf(name, sizeof name, "%s/%s", rows[r].group, kinds[k]);
            write_rows(w, name, (hsize_t)rows[r].row, (hsize_t)rows[r].count,
                       bases[k] + rows[r].offset);
        }
    }
}

/* The embedding's rows (stage 0) and the head's (the last stage) from the
 * host copy of the embedding slab, [wte wpe lnf_w lnf_b] for params and
 * for m and v. */
static void write_embedding(const struct chunk_writer *w, const struct gpt *model,
                            const float *slab, int stage, int stages)
{
    const struct gpt_shape *shape = &model->shape;
    size_t C = (size_t)shape->channels, n = model->embed_nparams;
    size_t wpe = (size_t)shape->vocab * C;
    size_t lnf = wpe + (size_t)shape->max_seq * C;
    const float *bases[3] = {slab, slab + 2 * n, slab + 3 * n};   /* params, m, v */
    const char *kinds[3] = {"params", "adam_m", "adam_v"};
    for (int k = 0; k < 3; k++) {
        char name[64];
        if (stage == 0) {
            snprintf(name, sizeof name, "/embedding/%s/wte", kinds[k]);
            write_rows(w, name, 0, (hsize_t)shape->vocab, bases[k]);
            snprintf(name, sizeof name, "/embedding/%s/wpe", kinds[k]);
            write_rows(w, name, 0, (hsize_t)shape->max_seq, bases[k] + wpe);
        }
        if (stage == stages - 1) {
            snprintf(name, sizeof name, "/head/%s/lnf_w", kinds[k]);
            write_rows(w, name, 0, (hsize_t)C, bases[k] + lnf);
            snprintf(name, sizeof name, "/head/%s/lnf_b", kinds[k]);
            write_rows(w, name, 0, (hsize_t)C, bases[k] + lnf + C);
        }
    }
}

/* A writer's tensors: its blocks' rows, then the embedding (stage 0) and
 * the head (last stage), all by replica 0 of the stage, but the sharded
 * rows of parts split over a group of replicas, which each holder writes. On a
 * device each slab that has rows to write comes down once, into the one
 * staging buffer of the save, and the block's sparsity (into
 * sparsity[layer], replica 0's blocks) is taken from that same copy. */
static void write_tensors(const struct chunk_writer *w, const struct gpt *model, int stage,
                          int stages, int dp_rank, float *sparsity)
{
    int whole = dp_rank == 0, sharded = dyn_ckpt_writes_sharded(&model->shape, dp_rank);
    float *staging = gpt_host_staging(model);   /* NULL on the CPU: the slabs themselves */
    for (int i = 0; i < model->num_blocks; i++) {
        const struct block *blk = &model->blocks[i];
        if (!whole && !(sharded && gpt_block_shard_units(&model->shape, blk->index) > 0))
            continue;   /* nothing of it here */
        if (blk->halves == BLOCK_HALF_MLP)
            continue;   /* the holder of its attention writes the whole block */
        struct block view = block_host_view(blk, staging, 1);
        if (whole) sparsity[blk->index] = block_sparsity(&view);
        write_block(w, model, &view, whole, sharded);
        start_writeback(w);
    }
    if (whole && model->embed_slab)   /* not a middle stage */
        write_embedding(w, model, gpt_embed_host_view(model, staging, 1), stage, stages);
    backend_staging_free(staging);
    if (whole) start_writeback(w);
}

/* The schema of a save and its dimensions (history: the entries written). */
static const struct ckpt_schema *save_schema(struct ckpt_dims *dims,
                                             const struct gpt_shape *shape,
                                             const struct ckpt_meta *meta, int history)
{
    ckpt_dims_of_shape(dims, shape);
    dims->pp = meta->pp;
    dims->dp = meta->dp;
    dims->history = history;
    const struct ckpt_schema *schema = ckpt_schema_for(shape);
    if (meta->dyn_state_count > 0) {   /* the scheme's own state: dyn.def's /dyn */
        schema = ckpt_schema_with_dyn(schema);
        dims->dyn_state = meta->dyn_state_count;
    }
    if (meta->unit_layout) {   /* a sublayer run's units: units.def's /units */
        schema = ckpt_schema_with_units(schema);
        dims->units_per_block = 2;
    }
    return schema;
}

/* The collective HDF5 part of save: creates tmp and writes everything. */
static void write_file(const char *tmp, const struct gpt *models, int chunks,
                       const struct ckpt_meta *meta, int stage, int dp_rank, MPI_Comm comm)
{
    int rank;
    WORLD_MPI(MPI_Comm_rank(comm, &rank));
    dm_h5_set_file_context(tmp);
    const struct gpt_shape *shape = &models[0].shape;

    /* The history written always ends with the current layout. */
    struct layout_history history = {0};
    layout_history_copy(&history, &meta->history);
    history.layers = shape->layers;   /* an empty caller's history may be zeroed */
    layout_history_push(&history, meta->step, meta->layout, meta->pp);

    struct ckpt_dims dims;
    const struct ckpt_schema *schema = save_schema(&dims, shape, meta, history.count);

    /* The skeleton first, by rank 0; the others wait (polled). */
    if (rank == 0) create_skeleton(tmp, shape, meta, &dims, schema);
    MPI_Request request;
    WORLD_MPI(MPI_Ibarrier(comm, &request));
    world_wait(&request);
    hid_t file = open_parallel(tmp, comm);

    /* Every chunk is allocated already, so opening the datasets through
     * MPI-IO allocates and fills nothing. They stay open on every rank
     * until the collective close below. */
    hid_t *datasets = dm_alloc((size_t)schema->dataset_count * sizeof(hid_t));
    for (int i = 0; i < schema->dataset_count; i++)
        datasets[i] = ckpt_dataset_present(&schema->datasets[i], &dims)
                          ? DM_H5(H5Dopen2(file, schema->datasets[i].path, H5P_DEFAULT))
                          : -1;

    /* Replica 0 of each stage writes that stage's tensors (the holders of
     * a scheme's split parts their own parts' rows). */
    int writer = dp_rank == 0, tensors = writer || dyn_ckpt_writes_sharded(shape, dp_rank);
    struct chunk_writer w = {.schema = schema, .datasets = datasets, .dims = &dims,
                             .chunk_buffer = dm_alloc(CHUNK_TARGET_BYTES + 4),
                             .writeback_fd = tensors ? open(tmp, O_RDONLY) : -1};
    float *sparsity = dm_alloc((size_t)shape->layers * sizeof(float));   /* zero */
    for (int c = 0; tensors && c < chunks; c++)
        write_tensors(&w, &models[c], stage, meta->pp, dp_rank, sparsity);
    write_small_datasets(&w, models, chunks, meta, &history, writer, sparsity, comm);
    if (w.writeback_fd >= 0) close(w.writeback_fd);
    dm_free(sparsity);
    dm_free(w.chunk_buffer);
    for (int i = 0; i < schema->dataset_count; i++)
        if (datasets[i] >= 0) DM_H5(H5Dclose(datasets[i]));
    dm_free(datasets);

    /* Last, the completion attribute: a file without it never finished.
     * No H5Fflush: through MPI-IO it syncs the file on every rank, and
     * rank 0's fsync after the close (ckpt_dir_publish) makes every rank's
     * bytes durable at once. */
    write_integer_attr(file, "complete", SCHEMA_TYPE_INT64, 1);
    DM_H5(H5Fclose(file));
    layout_history_free(&history);
}

/* What the loader will check must hold already: a bad layout, history or
 * flag in a save is the caller's bug, not a user error. */
static void check_save_arguments(const struct gpt *models, int chunks,
                                 const struct ckpt_meta *meta, int stage, int dp_rank, int size)
{
    const struct gpt_shape *shape = &models[0].shape;
    DM_ASSERT(meta->pp >= 1 && meta->dp >= 1 && meta->pp * meta->dp == size);
    DM_ASSERT(stage >= 0 && stage < meta->pp && dp_rank >= 0 && dp_rank < meta->dp);
    DM_ASSERT(meta->step >= 0 && meta->data_cursor && meta->layout);
    /* a sublayer run's stage holds units [first, first + count): the
     * blocks they touch, its first and last may be halves */
    const int *layout = meta->unit_layout ? meta->unit_layout : meta->layout;
    int per_block = meta->unit_layout ? 2 : 1, units = per_block * shape->layers;
    DM_ASSERT(!meta->unit_layout || meta->pp <= shape->layers);
    DM_ASSERT(layout && layout_sum(layout, meta->pp) == units);
    for (int s = 0; s < meta->pp; s++) DM_ASSERT(layout[s] >= 1);
    int first = layout_sum(layout, stage), end = first + layout[stage];
    if (chunks == 1) {
        DM_ASSERT(models[0].first_block == first / per_block &&
                  models[0].num_blocks == (end + per_block - 1) / per_block - first / per_block);
    } else {   /* interleaved: whole blocks, the stage's chunks together */
        int held = 0;
        for (int c = 0; c < chunks; c++) held += models[c].num_blocks;
        DM_ASSERT(!meta->unit_layout && held == layout[stage]);
    }
    for (int c = 0; c < chunks; c++)
        DM_ASSERT(models[c].has_embed == (stage == 0 && c == 0) &&
                  models[c].has_head == (stage == meta->pp - 1 && c == chunks - 1));
    const struct layout_history *history = meta->unit_layout ? &meta->unit_history
                                                             : &meta->history;
    DM_ASSERT(history->count >= 0);
    if (history->count > 0) {
        char problem[256];
        DM_ASSERT(history->layers == units);
        if (layout_history_check(history, problem, sizeof problem) != 0)
            DM_FATAL("ckpt_save: %s", problem);
        DM_ASSERT(history->step[history->count - 1] <= meta->step);
    }
    for (int d = 0; d < meta->dp; d++) DM_ASSERT(meta->data_cursor[d] >= 0);
    DM_ASSERT(meta->dyn_state_count >= 0 &&
              (meta->dyn_state_count == 0 || (meta->dyn_state && meta->dyn_kind[0])));
    for (int c = 0; c < chunks; c++)
        for (int i = 0; i < models[c].num_blocks; i++) {
            int flag = meta->frozen ? meta->frozen[models[c].first_block + i] : 0;
            DM_ASSERT((flag == 0 || flag == 1) &&
                      (models[c].blocks[i].frozen == 0 || models[c].blocks[i].frozen == 1));
        }
}

/* A sublayer run's meta (unit_layout set) with its layouts as whole
 * blocks too: *whole is meta with layout and history the nearest whole
 * blocks to its units (balance_layout_nearest_blocks, entry for entry),
 * and unit_history *units, the caller's ending with the current unit
 * layout. The caller frees whole->layout, whole->history and *units. */
static const struct ckpt_meta *whole_block_view(const struct ckpt_meta *meta, int layers,
                                                struct ckpt_meta *whole,
                                                struct layout_history *units)
{
    char err[256];
    *whole = *meta;
    layout_history_copy(units, &meta->unit_history);
    units->layers = 2 * layers;   /* an empty caller's history may be zeroed */
    layout_history_push(units, meta->step, meta->unit_layout, meta->pp);
    whole->unit_history = *units;
    whole->layout = dm_alloc((size_t)meta->pp * sizeof(int));
    memset(&whole->history, 0, sizeof whole->history);
    layout_history_alloc(&whole->history, layers, units->count);
    for (int k = 0; k < units->count; k++) {
        whole->history.step[k] = units->step[k];
        whole->history.stages[k] = units->stages[k];
        if (balance_layout_nearest_blocks(layout_history_entry(units, k), units->stages[k],
                                          layers, whole->history.layout + (size_t)k * layers,
                                          err, sizeof err) != BALANCE_OK)
            DM_FATAL("ckpt_save: unit layout history entry %d as whole blocks: %s", k, err);
    }
    if (balance_layout_nearest_blocks(meta->unit_layout, meta->pp, layers, whole->layout, err,
                                      sizeof err) != BALANCE_OK)
        DM_FATAL("ckpt_save: the unit layout as whole blocks: %s", err);
    return whole;
}

int ckpt_save(const char *dir, int keep, const struct gpt *model,
              const struct ckpt_meta *meta, int stage, int dp_rank, MPI_Comm comm,
              char *path_out, size_t path_out_size, char *err, size_t errsize)
{
    return ckpt_save_chunks(dir, keep, model, 1, meta, stage, dp_rank, comm, path_out,
                            path_out_size, err, errsize);
}

int ckpt_save_chunks(const char *dir, int keep, const struct gpt *models, int chunks,
                     const struct ckpt_meta *meta, int stage, int dp_rank, MPI_Comm comm,
                     char *path_out, size_t path_out_size, char *err, size_t errsize)
{
    dm_h5_init();
    int rank, size;
    WORLD_MPI(MPI_Comm_rank(comm, &rank));
    WORLD_MPI(MPI_Comm_size(comm, &size));
    DM_ASSERT(chunks >= 1);
    check_save_arguments(models, chunks, meta, stage, dp_rank, size);
    check_grid(stage, dp_rank, meta->pp, meta->dp, comm);
    struct ckpt_meta whole;   /* a sublayer run's layouts as whole blocks too */
    struct layout_history units = {0};
    int layers = models[0].shape.layers;
    if (meta->unit_layout) meta = whole_block_view(meta, layers, &whole, &units);
    check_same_everywhere(dir, keep, meta, layers, comm);

    /* The directory is ckpt_dir.c's: rank 0 prepares it, every rank
     * writes the temporary, rank 0 publishes it. */
    char message[MESSAGE_BYTES] = "";
    int failed = rank == 0 && ckpt_dir_prepare(dir, meta->step, message, sizeof message) != 0;
    int status = -1;
    if (!world_agree(failed, message, comm, err, errsize)) {
        char tmp[4096];
        ckpt_tmp_path(tmp, sizeof tmp, dir, meta->step);
        write_file(tmp, models, chunks, meta, stage, dp_rank, comm);
        failed = rank == 0 &&
                 ckpt_dir_publish(dir, keep, meta->step, message, sizeof message) != 0;
        status = world_agree(failed, message, comm, err, errsize) ? -1 : 0;
    }
    if (status == 0 && path_out && path_out_size)
        ckpt_path(path_out, path_out_size, dir, meta->step);
    if (meta == &whole) {
        dm_free(whole.layout);
        layout_history_free(&whole.history);
        layout_history_free(&units);
    }
    return status;
}
