/* The transformer block: its slab (parameters, gradients, Adam moments),
 * deterministic initialisation, serialisation for migration and
 * checkpoints, activations, backward scratch, and forward/backward.
 *
 * A block's initial weights are a pure function of (seed, layer index):
 * every value is dm_normal(seed, stream, element) with a stream derived
 * from the layer and the tensor, so any rank that builds layer k gets the
 * same bits. The pack format is documented byte by byte in
 * docs/block-slab.md; change both together. Nothing here calls MPI. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "dynmo/backend.h"
#include "dynmo/model.h"
#include "model/internal.h"

/* ---- parameter layout --------------------------------------------------- */

size_t block_tensor_size(int C, int k)
{
    size_t c = (size_t)C;
    switch (k) {
    case BP_LN1_W: case BP_LN1_B: case BP_ATTPROJ_B:
    case BP_LN2_W: case BP_LN2_B: case BP_FCPROJ_B:
        return c;
    case BP_QKV_W: return 3 * c * c;
    case BP_QKV_B: return 3 * c;
    case BP_ATTPROJ_W: return c * c;
    case BP_FC_W: return 4 * c * c;
    case BP_FC_B: return 4 * c;
    case BP_FCPROJ_W: return 4 * c * c;
    default: DM_FATAL("block tensor %d out of range", k);
    }
}

size_t block_tensor_offset(int C, int k)
{
    DM_ASSERT(k >= 0 && k <= BP_COUNT);
    size_t offset = 0;
    for (int i = 0; i < k; i++) offset += block_tensor_size(C, i);
    return offset;
}

size_t block_param_count(int C) { return block_tensor_offset(C, BP_COUNT); }

int block_tensor_is_matrix(int k)
{
    return k == BP_QKV_W || k == BP_ATTPROJ_W || k == BP_FC_W || k == BP_FCPROJ_W;
}

/* Whether an extension replaces the block's MLP. */
static int block_replaces_mlp(const struct block *blk)
{
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops->replaces_mlp) return 1;
    return 0;
}

/* The tensors of the block itself, before its extensions': the dense
 * ones, or those before the MLP when an extension replaces it. */
static int own_tensor_count(const struct block *blk)
{
    return block_replaces_mlp(blk) ? BP_FC_W : BP_COUNT;
}

int block_tensor_count(const struct block *blk)
{
    int n = own_tensor_count(blk);
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops->tensor_count) n += blk->ext[i].ops->tensor_count(blk->ext[i].state);
    return n;
}

/* Tensor k of the block's extensions (k counted from the first of theirs):
 * each extension's offsets are from its floats' start in the slab. */
static int ext_tensor_at(const struct block *blk, int k, size_t *offset, size_t *size)
{
    for (int i = 0; i < blk->ext_count; i++) {
        const struct block_ext_slot *slot = &blk->ext[i];
        int n = slot->ops->tensor_count ? slot->ops->tensor_count(slot->state) : 0;
        if (k >= n) {
            k -= n;
            continue;
        }
        int matrix = slot->ops->tensor_at(slot->state, k, offset, size);
        *offset += slot->offset;
        return matrix;
    }
    DM_FATAL("block %d has no extension tensor %d", blk->index, k);
}

int block_tensor_at(const struct block *blk, int k, size_t *offset, size_t *size)
{
    int C = blk->C;
    DM_ASSERT(k >= 0 && k < block_tensor_count(blk));
    if (k >= own_tensor_count(blk)) return ext_tensor_at(blk, k - own_tensor_count(blk), offset, size);
    *offset = block_tensor_offset(C, k);
    *size = block_tensor_size(C, k);
    return block_tensor_is_matrix(k);
}

uint64_t block_tensor_stream(int index, int k)
{
    return ((uint64_t)(index + 1) << 8) | (uint64_t)k;
}

/* ---- slab and initialisation ---------------------------------------------- */

int gpt_block_has_mlp(const struct gpt_shape *shape, int index)
{
    for (int i = 0; i < shape->ext_count; i++)
        if (shape->ext[i].ops->replaces_mlp && gpt_ext_owns(&shape->ext[i], shape, index))
            return 0;
    return 1;
}

int gpt_shape_replaces_mlp(const struct gpt_shape *shape)
{
    for (int l = 0; l < shape->layers; l++)
        if (!gpt_block_has_mlp(shape, l)) return 1;
    return 0;
}

int gpt_mlp_ordinal(const struct gpt_shape *shape, int index)
{
    if (!gpt_block_has_mlp(shape, index)) return -1;
    int n = 0;
    for (int l = 0; l < index; l++) n += gpt_block_has_mlp(shape, l);
    return n;
}

/* The floats of a block of layer index before its extensions': the dense
 * tensors, or those before the MLP when an extension replaces it. */
static size_t own_param_count(const struct gpt_shape *shape, int index)
{
    int C = shape->channels;
    return gpt_block_has_mlp(shape, index) ? block_param_count(C)
                                           : block_tensor_offset(C, BP_FC_W);
}

size_t gpt_block_param_count(const struct gpt_shape *shape, int index)
{
    size_t n = own_param_count(shape, index);
    for (int i = 0; i < shape->ext_count; i++) {
        const struct gpt_ext *ext = &shape->ext[i];
        if (ext->ops->floats && gpt_ext_owns(ext, shape, index))
            n += ext->ops->floats(ext, shape, index);
    }
    return n;
}

size_t gpt_unit_param_count(const struct gpt_shape *shape, int index, int half)
{
    size_t attention = block_tensor_offset(shape->channels, BP_LN2_W);
    if (half == BLOCK_HALF_ATTENTION) return attention;
    if (half == BLOCK_HALF_MLP) return gpt_block_param_count(shape, index) - attention;
    return gpt_block_param_count(shape, index);
}

size_t block_half_matrix_weights(int C, int half)
{
    size_t c2 = (size_t)C * (size_t)C;
    return half == BLOCK_HALF_ATTENTION ? 4 * c2 : half == BLOCK_HALF_MLP ? 8 * c2 : 12 * c2;
}

/* The extensions that own layer index, each with its floats after the
 * block's own and its state (views into the slab). */
static void block_alloc_ext(struct block *blk, const struct gpt_shape *shape)
{
    size_t at = own_param_count(shape, blk->index);
    for (int i = 0; i < shape->ext_count; i++) {
        const struct gpt_ext *ext = &shape->ext[i];
        if (!gpt_ext_owns(ext, shape, blk->index)) continue;
        struct block_ext_slot *slot = &blk->ext[blk->ext_count++];
        slot->ops = ext->ops;
        slot->offset = at;
        if (ext->ops->alloc)
            slot->state = ext->ops->alloc(ext, shape, blk, blk->params + at, blk->grads + at);
        if (ext->ops->floats) at += ext->ops->floats(ext, shape, blk->index);
    }
    DM_ASSERT(at == blk->nparams);
}

/* zero = 0 leaves params and Adam moments unset (the caller fills them at
 * once); gradients are always zero. The block's size and kind (dense or
 * MoE, its extensions) are the shape's for layer `index`. */
static void block_alloc_slab(struct block *blk, int index, const struct gpt_shape *shape,
                             int zero)
{
    int C = shape->channels;
    memset(blk, 0, sizeof *blk);
    blk->index = index;
    blk->C = C;
    blk->NH = shape->heads;
    blk->nparams = gpt_block_param_count(shape, index);
    blk->slab_floats = 4 * blk->nparams;
    const struct dm_backend *ops = backend_current();
    if (zero || !ops->host_access) {
        blk->slab = ops->alloc(blk->slab_floats * sizeof(float));   /* zero-filled */
    } else {
        blk->slab = dm_alloc_uninit(blk->slab_floats * sizeof(float));
        memset(blk->slab + blk->nparams, 0, blk->nparams * sizeof(float));
    }
    blk->params = blk->slab;
    blk->grads = blk->params + blk->nparams;
    blk->m = blk->grads + blk->nparams;
    blk->v = blk->m + blk->nparams;
    int tensors = gpt_block_has_mlp(shape, index) ? BP_COUNT : BP_FC_W;
    for (int k = 0; k < tensors; k++) {
        size_t off = block_tensor_offset(C, k);
        blk->p[k] = blk->params + off;
        blk->g[k] = blk->grads + off;
    }
    block_alloc_ext(blk, shape);
}

struct normal_fill_args {
    float *out;
    uint64_t seed, stream, first;
    float std;
};

static void normal_fill_range(void *arg, long begin, long end)
{
    const struct normal_fill_args *a = arg;
    for (long i = begin; i < end; i++)
        a->out[i] = a->std * dm_normal(a->seed, a->stream, a->first + (uint64_t)i);
}

void init_normal_at(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t first,
                    float std)
{
    struct normal_fill_args a = {.out = out, .seed = seed, .stream = stream, .first = first,
                                 .std = std};
    dm_parallel_for((long)n, 1024, normal_fill_range, &a);
}

void init_normal(float *out, size_t n, uint64_t seed, uint64_t stream, float std)
{
    init_normal_at(out, n, seed, stream, 0, std);
}

void block_alloc_zero(struct block *blk, int index, const struct gpt_shape *shape)
{
    int C = shape->channels;
    DM_ASSERT(index >= 0 && shape->heads > 0 && C % shape->heads == 0);
    block_alloc_slab(blk, index, shape, 1);
}

void block_init(struct block *blk, int index, const struct gpt_shape *shape, uint64_t seed)
{
    block_alloc_zero(blk, index, shape);
    block_init_weights(blk, shape, seed);
}

void block_init_weights(struct block *blk, const struct gpt_shape *shape, uint64_t seed)
{
    int C = shape->channels, index = blk->index;
    float residual_std = (float)(0.02 / sqrt(2.0 * shape->layers));
    size_t bytes = blk->nparams * sizeof(float);
    float *staging = backend_staging(bytes);   /* drawn on the host, then copied up */
    float *params = backend_write_begin(staging, blk->params);
    if (staging) backend_current()->copy_to_host(params, blk->params, bytes);
    for (int k = 0; k < own_tensor_count(blk); k++) {
        size_t n = block_tensor_size(C, k);
        float *p = params + (blk->p[k] - blk->params);
        if (k == BP_LN1_W || k == BP_LN2_W) {
            for (size_t i = 0; i < n; i++) p[i] = 1.0f;
        } else if (block_tensor_is_matrix(k)) {
            float std = (k == BP_ATTPROJ_W || k == BP_FCPROJ_W) ? residual_std : 0.02f;
            init_normal(p, n, seed, block_tensor_stream(index, k), std);
        }
        /* biases stay zero (the slab is zero) */
    }
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops->init_weights)
            blk->ext[i].ops->init_weights(blk->ext[i].state, blk, shape,
                                          params + blk->ext[i].offset, seed);
    backend_write_end(blk->params, params, bytes);
    backend_staging_free(staging);
}

void block_free(struct block *blk)
{
    block_sparse_free(blk);
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops->free) blk->ext[i].ops->free(blk->ext[i].state);
    if (blk->slab) backend_current()->free(blk->slab);
    memset(blk, 0, sizeof *blk);
}

struct block block_host_view(const struct block *blk, float *staging, int fetch)
{
    struct block view = *blk;
    if (!staging) return view;
    size_t bytes = blk->slab_floats * sizeof(float);
    if (fetch) backend_current()->copy_to_host(staging, blk->slab, bytes);
    view.slab = staging;
    view.params = staging + (blk->params - blk->slab);
    view.grads = staging + (blk->grads - blk->slab);
    view.m = staging + (blk->m - blk->slab);
    view.v = staging + (blk->v - blk->slab);
    for (int k = 0; k < BP_COUNT; k++) {
        view.p[k] = blk->p[k] ? staging + (blk->p[k] - blk->slab) : NULL;
        view.g[k] = blk->g[k] ? staging + (blk->g[k] - blk->slab) : NULL;
    }
    return view;
}

void block_host_view_store(struct block *blk, const struct block *view)
{
    backend_write_end(blk->slab, view->slab, blk->slab_floats * sizeof(float));
}

/* ---- serialisation (docs/block-slab.md) ------------------------------------ */

#define PACK_MAGIC "DMBLOCK1"
#define PACK_HEADER_BYTES 64

struct pack_header {              /* exactly 64 bytes, little-endian */
    char magic[8];                /* "DMBLOCK1" */
    uint32_t header_bytes;        /* 64 */
    int32_t index;                /* global layer index */
    int32_t channels;             /* C */
    int32_t heads;                /* NH */
    uint64_t nparams;             /* floats in each of params, m, v */
    uint64_t flags;               /* 0: no flags defined yet */
    uint64_t dynamic_bytes;       /* bytes of dynamic state after v: 0 for now */
    uint64_t payload_bytes;       /* everything after the header */
    uint64_t checksum;            /* of the payload, see payload_checksum */
};
_Static_assert(sizeof(struct pack_header) == PACK_HEADER_BYTES, "pack header is 64 bytes");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the pack format is little-endian");

/* FNV-1a over 64-bit little-endian words (a trailing partial word is
 * zero-padded). Catches a truncated or corrupted transfer; not a defence
 * against tampering. */
static uint64_t payload_checksum(const unsigned char *p, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
    }
    if (i < bytes) {
        uint64_t w = 0;
        memcpy(&w, p + i, bytes - i);
        h = (h ^ w) * 0x100000001b3ULL;
    }
    return h;
}

/* The extensions' part of the dynamic state, in their order. */
static size_t ext_pack_bytes(const struct block *blk)
{
    size_t n = 0;
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops->pack_bytes) n += blk->ext[i].ops->pack_bytes(blk->ext[i].state);
    return n;
}

/* The dynamic state after v: the pruning state, then the extensions'
 * states in their order. */
static size_t dynamic_bytes(const struct block *blk)
{
    return block_sparse_pack_bytes(blk) + ext_pack_bytes(blk);
}

static void pack_dynamic(const struct block *blk, unsigned char *out)
{
    block_sparse_pack(blk, out);
    out += block_sparse_pack_bytes(blk);
    for (int i = 0; i < blk->ext_count; i++) {
        if (!blk->ext[i].ops->pack_bytes) continue;
        blk->ext[i].ops->pack(blk->ext[i].state, out);
        out += blk->ext[i].ops->pack_bytes(blk->ext[i].state);
    }
}

/* The extensions' states, each its pack_bytes of what follows the
 * pruning state; the last of them gets the rest (its unpack says what is
 * wrong with a state of another size). */
static int unpack_ext(struct block *blk, const unsigned char *in, size_t bytes, char *err,
                      size_t errsize)
{
    int last = -1;
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops->pack_bytes) last = i;
    for (int i = 0; i <= last; i++) {
        const struct gpt_ext_ops *ops = blk->ext[i].ops;
        if (!ops->pack_bytes) continue;
        size_t n = i == last ? bytes : ops->pack_bytes(blk->ext[i].state);
        if (n > bytes) n = bytes;
        if (ops->unpack(blk->ext[i].state, blk, in, n, err, errsize) != 0) return -1;
        in += n;
        bytes -= n;
    }
    return 0;
}

static int unpack_dynamic(struct block *blk, uint64_t flags, const unsigned char *in,
                          size_t bytes, char *err, size_t errsize)
{
    size_t ext = ext_pack_bytes(blk);
    size_t own = flags & BLOCK_FLAG_MASKED ? (bytes > ext ? bytes - ext : 0) : 0;
    if (block_sparse_unpack(blk, flags, in, own, err, errsize) != 0) return -1;
    return unpack_ext(blk, in + own, bytes - own, err, errsize);
}

/* Every header field but the checksum, which depends on what travels. */
static void fill_header(struct pack_header *h, const struct block *blk)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, PACK_MAGIC, 8);
    h->header_bytes = PACK_HEADER_BYTES;
    h->index = blk->index;
    h->channels = blk->C;
    h->heads = blk->NH;
    h->nparams = blk->nparams;
    h->flags = (blk->frozen ? BLOCK_FLAG_FROZEN : 0) | block_sparse_flags(blk);
    for (int i = 0; i < blk->ext_count; i++) h->flags |= blk->ext[i].ops->pack_flag;
    h->dynamic_bytes = dynamic_bytes(blk);
    h->payload_bytes = 3 * blk->nparams * sizeof(float) + h->dynamic_bytes;
}

size_t block_pack_size(const struct block *blk)
{
    return PACK_HEADER_BYTES + 3 * blk->nparams * sizeof(float) + dynamic_bytes(blk);
}

void block_pack(const struct block *blk, void *buf)
{
    unsigned char *out = buf;
    size_t floats_bytes = blk->nparams * sizeof(float);
    unsigned char *payload = out + PACK_HEADER_BYTES;
    const struct dm_backend *ops = backend_current();
    ops->copy_to_host(payload, blk->params, floats_bytes);
    ops->copy_to_host(payload + floats_bytes, blk->m, 2 * floats_bytes);   /* m, v adjacent */
    pack_dynamic(blk, payload + 3 * floats_bytes);
    struct pack_header h;
    fill_header(&h, blk);
    h.checksum = payload_checksum(payload, h.payload_bytes);
    memcpy(out, &h, sizeof h);
}

/* An extension's flag in a pack header says what the model's layer is. */
static int check_ext_flag(const struct pack_header *h, const struct gpt_ext *ext,
                          const struct gpt_shape *shape, char *err, size_t errsize)
{
    const struct gpt_ext_ops *ops = ext->ops;
    if (!ops->pack_flag) return 0;
    int owns = gpt_ext_owns(ext, shape, h->index), flagged = (h->flags & ops->pack_flag) != 0;
    if (flagged == owns &&
        !(owns && ops->never_pruned && (h->flags & (BLOCK_FLAG_MASKED | BLOCK_FLAG_CSR))))
        return 0;
    snprintf(err, errsize, "packed block %d %s %s, but the model's layer %d %s", h->index,
             flagged ? "is" : "is not", ops->block_noun, h->index,
             owns ? ops->owned_text : ops->not_owned_text);
    return -1;
}

/* The checks of a pack header that do not depend on how the payload
 * travels: magic, header size, layer index, shape, parameter count, flags. */
static int check_header(const struct pack_header *h, const struct block *blk,
                        const struct gpt_shape *shape, char *err, size_t errsize)
{
    if (memcmp(h->magic, PACK_MAGIC, 8) != 0) {
        snprintf(err, errsize, "not a packed block (magic is not \"%s\")", PACK_MAGIC);
        return -1;
    }
    if (h->header_bytes != PACK_HEADER_BYTES) {
        snprintf(err, errsize, "block header is %u bytes, expected %d (another version?)",
                 h->header_bytes, PACK_HEADER_BYTES);
        return -1;
    }
    if (h->index < 0 || h->index >= shape->layers) {
        snprintf(err, errsize, "block layer index %d is outside the model's %d layers",
                 h->index, shape->layers);
        return -1;
    }
    if (blk->slab && h->index != blk->index) {
        snprintf(err, errsize, "packed block is layer %d, expected layer %d",
                 h->index, blk->index);
        return -1;
    }
    if (h->channels != shape->channels || h->heads != shape->heads) {
        snprintf(err, errsize, "packed block %d has channels %d, heads %d; the model has "
                 "channels %d, heads %d", h->index, h->channels, h->heads,
                 shape->channels, shape->heads);
        return -1;
    }
    size_t nparams = gpt_block_param_count(shape, h->index);
    if (h->nparams != nparams) {
        snprintf(err, errsize, "packed block %d has %llu parameters, expected %zu",
                 h->index, (unsigned long long)h->nparams, nparams);
        return -1;
    }
    uint64_t known_flags = BLOCK_FLAG_FROZEN | BLOCK_FLAG_MASKED | BLOCK_FLAG_CSR,
             with_state = BLOCK_FLAG_MASKED;
    for (int i = 0; i < shape->ext_count; i++) {
        const struct gpt_ext *ext = &shape->ext[i];
        if (check_ext_flag(h, ext, shape, err, errsize)) return -1;
        known_flags |= ext->ops->pack_flag;
        if (ext->ops->pack_bytes) with_state |= ext->ops->pack_flag;
    }
    if ((h->flags & ~known_flags) != 0 ||
        (!(h->flags & with_state) && h->dynamic_bytes != 0)) {
        snprintf(err, errsize, "packed block %d has flags 0x%llx and %llu bytes of dynamic "
                 "state, which this version does not know", h->index,
                 (unsigned long long)h->flags, (unsigned long long)h->dynamic_bytes);
        return -1;
    }
    return 0;
}

int block_unpack(struct block *blk, const void *buf, size_t bytes,
                 const struct gpt_shape *shape, char *err, size_t errsize)
{
    const unsigned char *in = buf;
    struct pack_header h;
    if (bytes < PACK_HEADER_BYTES) {
        snprintf(err, errsize, "block buffer has %zu bytes, shorter than the %d-byte header",
                 bytes, PACK_HEADER_BYTES);
        return -1;
    }
    memcpy(&h, in, sizeof h);
    if (check_header(&h, blk, shape, err, errsize)) return -1;
    size_t nparams = gpt_block_param_count(shape, h.index);
    size_t floats_bytes = nparams * sizeof(float);
    size_t dyn_bytes = (size_t)h.dynamic_bytes;
    if (h.dynamic_bytes > bytes || h.payload_bytes != 3 * floats_bytes + dyn_bytes ||
        bytes != PACK_HEADER_BYTES + 3 * floats_bytes + dyn_bytes) {
        snprintf(err, errsize, "packed block %d is %zu bytes (payload field %llu), "
                 "expected %zu", h.index, bytes, (unsigned long long)h.payload_bytes,
                 PACK_HEADER_BYTES + 3 * floats_bytes + dyn_bytes);
        return -1;
    }
    const unsigned char *payload = in + PACK_HEADER_BYTES;
    if (payload_checksum(payload, 3 * floats_bytes + dyn_bytes) != h.checksum) {
        snprintf(err, errsize, "packed block %d fails its checksum (corrupted or truncated)",
                 h.index);
        return -1;
    }
    if (!blk->slab) block_alloc_slab(blk, h.index, shape, 1);
    const struct dm_backend *ops = backend_current();
    ops->copy_to_device(blk->params, payload, floats_bytes);
    ops->copy_to_device(blk->m, payload + floats_bytes, 2 * floats_bytes);   /* m, v adjacent */
    ops->zero(blk->grads, floats_bytes);
    blk->frozen = (h.flags & BLOCK_FLAG_FROZEN) != 0;
    /* The checksum passed, so only a writer's bug can fail here; the
     * parameters are already in place then. */
    return unpack_dynamic(blk, h.flags, payload + 3 * floats_bytes, dyn_bytes, err, errsize);
}

/* ---- migration without copies ----------------------------------------------
 * The header and the dynamic state travel as one small message; the
 * parameters and the Adam moments go straight from the sender's slab into
 * the receiver's (MPI is reliable, so no checksum over them: the header's
 * checksum covers the dynamic state only). */

size_t block_meta_size(const struct block *blk)
{
    return PACK_HEADER_BYTES + dynamic_bytes(blk);
}

void block_pack_meta(const struct block *blk, void *buf)
{
    unsigned char *out = buf;
    pack_dynamic(blk, out + PACK_HEADER_BYTES);
    struct pack_header h;
    fill_header(&h, blk);
    h.checksum = payload_checksum(out + PACK_HEADER_BYTES, h.dynamic_bytes);
    memcpy(out, &h, sizeof h);
}

int block_unpack_meta_begin(struct block *blk, const void *buf, size_t bytes,
                            const struct gpt_shape *shape, char *err, size_t errsize)
{
    struct pack_header h;
    if (bytes < PACK_HEADER_BYTES) {
        snprintf(err, errsize, "block header message has %zu bytes", bytes);
        return -1;
    }
    memcpy(&h, buf, sizeof h);
    if (!blk->slab) memset(blk, 0, sizeof *blk);
    if (check_header(&h, blk, shape, err, errsize)) return -1;
    if (bytes != PACK_HEADER_BYTES + h.dynamic_bytes ||
        payload_checksum((const unsigned char *)buf + PACK_HEADER_BYTES, h.dynamic_bytes) !=
            h.checksum) {
        snprintf(err, errsize, "block %d header message is damaged", h.index);
        return -1;
    }
    if (!blk->slab) block_alloc_slab(blk, h.index, shape, 0);
    blk->frozen = (h.flags & BLOCK_FLAG_FROZEN) != 0;
    return 0;
}

void block_prepare_receive(struct block *blk, int index, const struct gpt_shape *shape)
{
    block_alloc_slab(blk, index, shape, 0);
}

int block_unpack_meta_end(struct block *blk, const void *buf, size_t bytes, char *err,
                          size_t errsize)
{
    struct pack_header h;
    memcpy(&h, buf, sizeof h);
    return unpack_dynamic(blk, h.flags, (const unsigned char *)buf + PACK_HEADER_BYTES,
                          bytes - PACK_HEADER_BYTES, err, errsize);
}

/* ---- activations and scratch -------------------------------------------------
 * Each tensor starts on a 64-byte boundary. */

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

struct acts_sizes {
    size_t btc, bt, att;
};

static struct acts_sizes acts_sizes(int B, int T, int C, int NH)
{
    struct acts_sizes s;
    s.btc = round16((size_t)B * T * C);
    s.bt = round16((size_t)B * T);
    s.att = round16((size_t)B * NH * T * T);
    return s;
}

static size_t block_acts_floats(int B, int T, int C, int NH)
{
    struct acts_sizes s = acts_sizes(B, T, C, NH);
    /* ln1 qkv(3) atty res1 ln2 fch(4) fch_gelu(4) = 15 x BTC; 4 x BT; att */
    return 15 * s.btc + 4 * s.bt + s.att;
}

size_t block_acts_bytes(int B, int T, int C, int NH)
{
    return block_acts_floats(B, T, C, NH) * sizeof(float);
}

void block_acts_alloc(struct block_acts *acts, int B, int T, int C, int NH)
{
    struct acts_sizes s = acts_sizes(B, T, C, NH);
    acts->B = B;
    acts->T = T;
    acts->mem = backend_current()->alloc(block_acts_bytes(B, T, C, NH));
    float *p = acts->mem;
    acts->ln1 = p;        p += s.btc;
    acts->ln1_mean = p;   p += s.bt;
    acts->ln1_rstd = p;   p += s.bt;
    acts->qkv = p;        p += 3 * s.btc;
    acts->atty = p;       p += s.btc;
    acts->att = p;        p += s.att;
    acts->res1 = p;       p += s.btc;
    acts->ln2 = p;        p += s.btc;
    acts->ln2_mean = p;   p += s.bt;
    acts->ln2_rstd = p;   p += s.bt;
    acts->fch = p;        p += 4 * s.btc;
    acts->fch_gelu = p;   p += 4 * s.btc;
    DM_ASSERT((size_t)(p - acts->mem) == block_acts_floats(B, T, C, NH));
    memset(acts->ext, 0, sizeof acts->ext);
    acts->step = 0;
    acts->loss_scale = 1.0f;
}

void block_acts_free(struct block_acts *acts)
{
    for (int i = 0; i < GPT_EXT_MAX; i++)
        if (acts->ext[i].acts) acts->ext[i].ops->acts_free(acts->ext[i].acts);
    if (acts->mem) backend_current()->free(acts->mem);
    memset(acts, 0, sizeof *acts);
}

/* The backward needs d_fch (4BTC) only until the MLP is done, and d_atty
 * and d_qkv (BTC + 3BTC) only after that, so the latter two share d_fch's
 * memory. d_resid carries the gradient between blocks in gpt_backward. */
void block_scratch_alloc(struct block_scratch *s, int B, int T, int C, int NH)
{
    struct acts_sizes z = acts_sizes(B, T, C, NH);
    s->mem = backend_current()->alloc((8 * z.btc + z.att) * sizeof(float));
    float *p = s->mem;
    s->d_res1 = p;   p += z.btc;
    s->d_ln = p;     p += z.btc;
    s->d_resid = p;  p += z.btc;
    s->d_fch = p;
    s->d_atty = p;
    s->d_qkv = p + z.btc;
    p += 4 * z.btc;
    s->d_att = p;
}

void block_scratch_free(struct block_scratch *s)
{
    if (s->mem) backend_current()->free(s->mem);
    memset(s, 0, sizeof *s);
}

/* ---- forward and backward -------------------------------------------------------- */

struct copy_args {
    float *dst;
    const float *src;
};

static void copy_range(void *arg, long begin, long end)
{
    const struct copy_args *a = arg;
    memcpy(a->dst + begin, a->src + begin, (size_t)(end - begin) * sizeof(float));
}

void parallel_copy(float *dst, const float *src, long n)
{
    struct copy_args a = {.dst = dst, .src = src};
    dm_parallel_for(n, 4096, copy_range, &a);
}

/* The four matrix products of a block: in CSR when the block is pruned
 * past dyn.csr_sparsity, else dense (pruned weights are exact zeros there,
 * and their gradients are masked once a step, gpt_mask_pruned_grads). */
static int matrix_slot(int k)
{
    for (int m = 0; m < BLOCK_MATRICES; m++)
        if (block_matrix_tensor(m) == k) return m;
    DM_FATAL("tensor %d is not a block matrix", k);
}

const struct csr_matrix *block_csr_of(const struct block *blk, int k)
{
    return blk->sparse && blk->sparse->use_csr ? block_sparse_csr(blk, matrix_slot(k)) : NULL;
}

/* out = inp @ W^T + b, plus residual if given; gelu_out = gelu(out) if
 * given. Dense products fuse the residual and GELU into the matmul's
 * row chunks (one pass over the output less). */
static void block_matmul_forward(const struct block *blk, int k, float *out, const float *inp,
                                 int N, int C, int OC, const float *residual, float *gelu_out)
{
    const struct dm_backend *ops = backend_current();
    const struct csr_matrix *w = block_csr_of(blk, k);
    if (w) {
        ops->sparse_matmul_forward(out, inp, w->row_ptr, w->col_idx, w->values, blk->p[k + 1],
                                   N, C, OC);
        if (residual) ops->residual_forward(out, out, residual, (long)N * OC);
        if (gelu_out) ops->gelu_forward(gelu_out, out, (long)N * OC);
    } else if (residual) {
        ops->matmul_forward_residual(out, inp, blk->p[k], blk->p[k + 1], residual, N, C, OC);
    } else if (gelu_out) {
        ops->matmul_forward_gelu(out, gelu_out, inp, blk->p[k], blk->p[k + 1], N, C, OC);
    } else {
        ops->matmul_forward(out, inp, blk->p[k], blk->p[k + 1], N, C, OC);
    }
}

/* dinp overwritten, times gelu'(gelu_inp) if given; weight and bias
 * gradients of tensor k accumulated into g (NULL entries: none wanted). */
static void block_matmul_backward(struct block *blk, int k, float *const *g, float *dinp,
                                  const float *dout, const float *inp, int N, int C, int OC,
                                  const float *gelu_inp)
{
    const struct dm_backend *ops = backend_current();
    const struct csr_matrix *w = block_csr_of(blk, k);
    if (w) {
        ops->sparse_matmul_backward(dinp, g[k], g[k + 1], dout, inp, w->row_ptr, w->col_idx,
                                    w->values, w->nnz, N, C, OC);
        if (gelu_inp) ops->gelu_backward(dinp, gelu_inp, dinp, (long)N * C);
        return;
    }
    if (gelu_inp)
        ops->matmul_backward_gelu(dinp, g[k], g[k + 1], dout, inp, blk->p[k], gelu_inp, N, C, OC);
    else
        ops->matmul_backward_overwrite(dinp, g[k], g[k + 1], dout, inp, blk->p[k], N, C, OC);
}

/* The first of the block's extensions that has a hook at `offset` of
 * struct gpt_ext_ops (offsetof), or NULL. */
static const struct block_ext_slot *hook_slot(const struct block *blk, size_t offset)
{
    for (int i = 0; i < blk->ext_count; i++) {
        const void *const *hook = (const void *const *)((const char *)blk->ext[i].ops + offset);
        if (*hook) return &blk->ext[i];
    }
    return NULL;
}
#define HOOK(blk, name) hook_slot(blk, offsetof(struct gpt_ext_ops, name))

/* atty from qkv: an extension's attention core, or causal attention over
 * the (B, T) batch (start NULL) or per packed sequence. */
static void attention_core_forward(struct block *blk, struct block_acts *acts, const int *start,
                                   int B, int T)
{
    const struct block_ext_slot *x = HOOK(blk, attention_forward);
    if (x) {
        x->ops->attention_forward(blk, x->state, acts, start, B, T);
        return;
    }
    const struct dm_backend *ops = backend_current();
    int C = blk->C, NH = blk->NH;
    if (!start) {
        ops->attention_forward(acts->atty, acts->att, acts->qkv, B, T, C, NH);
        return;
    }
    long att = 0;   /* sequence b's (NH, n, n) after the earlier ones' */
    for (int b = 0; b < B; b++) {
        int n = start[b + 1] - start[b];
        if (n == 0) continue;
        ops->attention_forward(acts->atty + (long)start[b] * C, acts->att + att,
                               acts->qkv + 3L * start[b] * C, 1, n, C, NH);
        att += (long)NH * n * n;
    }
}

static void attention_core_backward(struct block *blk, struct block_acts *acts,
                                    struct block_scratch *s, const int *start, int B, int T)
{
    const struct block_ext_slot *x = HOOK(blk, attention_backward);
    if (x) {
        x->ops->attention_backward(blk, x->state, acts, s->d_qkv, s->d_atty, start, B, T);
        return;
    }
    const struct dm_backend *ops = backend_current();
    int C = blk->C, NH = blk->NH;
    if (!start) {
        ops->attention_backward(s->d_qkv, s->d_att, s->d_atty, acts->qkv, acts->att, B, T, C, NH);
        return;
    }
    long att = 0;
    for (int b = 0; b < B; b++) {
        int n = start[b + 1] - start[b];
        if (n == 0) continue;
        ops->attention_backward(s->d_qkv + 3L * start[b] * C, s->d_att + att,
                                s->d_atty + (long)start[b] * C, acts->qkv + 3L * start[b] * C,
                                acts->att + att, 1, n, C, NH);
        att += (long)NH * n * n;
    }
}

/* The dense block's own forward: attention core and MLP (or the
 * extensions' in their place). */
static void dense_forward(struct block *blk, struct block_acts *acts, float *out,
                          const float *in, int B, int T)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    DM_ASSERT(B <= acts->B && T <= acts->T);
    float *const *p = blk->p;
    block_sparse_refresh(blk);   /* CSR values follow the last optimizer step */
    ops->layernorm_forward(acts->ln1, acts->ln1_mean, acts->ln1_rstd, in,
                           p[BP_LN1_W], p[BP_LN1_B], N, C);
    block_matmul_forward(blk, BP_QKV_W, acts->qkv, acts->ln1, N, C, 3 * C, NULL, NULL);
    attention_core_forward(blk, acts, NULL, B, T);
    block_matmul_forward(blk, BP_ATTPROJ_W, acts->res1, acts->atty, N, C, C, in, NULL);
    ops->layernorm_forward(acts->ln2, acts->ln2_mean, acts->ln2_rstd, acts->res1,
                           p[BP_LN2_W], p[BP_LN2_B], N, C);
    const struct block_ext_slot *x = HOOK(blk, mlp_forward);
    if (x) {
        x->ops->mlp_forward(blk, x->state, acts, out, N);
        return;
    }
    block_matmul_forward(blk, BP_FC_W, acts->fch, acts->ln2, N, C, 4 * C, NULL,
                         acts->fch_gelu);
    block_matmul_forward(blk, BP_FCPROJ_W, out, acts->fch_gelu, N, 4 * C, C, acts->res1,
                         NULL);
}

/* Where a backward puts weight gradients: a frozen block computes none
 * (every g[k] NULL). */
static float *const *weight_grads(const struct block *blk)
{
    static float *const no_grads[BP_COUNT];
    return blk->frozen ? no_grads : blk->g;
}

/* The attention part's backward, from the gradient of the residual
 * stream after attention (the scratch's d_res1) to din: the whole
 * block's and its attention half's. */
static void attention_part_backward(struct block *blk, struct block_acts *acts,
                                    struct block_scratch *s, float *din, const float *in,
                                    int B, int T)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    float *const *p = blk->p, *const *g = weight_grads(blk);
    block_matmul_backward(blk, BP_ATTPROJ_W, g, s->d_atty, s->d_res1, acts->atty, N, C, C,
                          NULL);
    attention_core_backward(blk, acts, s, NULL, B, T);
    block_matmul_backward(blk, BP_QKV_W, g, s->d_ln, s->d_qkv, acts->ln1, N, C, 3 * C, NULL);
    ops->layernorm_backward_residual(din, s->d_res1, g[BP_LN1_W], g[BP_LN1_B], s->d_ln, in,
                                     p[BP_LN1_W], acts->ln1_mean, acts->ln1_rstd, N, C);
}

/* ---- one half of a block (balance.units = sublayer) ------------------------------
 * The same ops as dense_forward and dense_backward, split at the residual
 * stream after attention: the attention half's output and the MLP half's
 * input are res1, and the gradient between them is d_res1, so the two
 * halves give the whole block's bits. A dense or pruned block, or one
 * whose extensions stay inside its attention (gpt_ext_fits_units). */

int gpt_ext_fits_units(const struct gpt_ext_ops *ops)
{
    return !ops->floats && !ops->pack_bytes && !ops->replaces_mlp && !ops->block_forward &&
           !ops->block_backward && !ops->mlp_forward && !ops->mlp_backward &&
           !ops->step_values && !ops->shard_units;
}

int gpt_ext_fits_mlp_unit(const struct gpt_ext_ops *ops)
{
    return ops->replaces_mlp && ops->mlp_forward && ops->mlp_backward && !ops->block_forward &&
           !ops->block_backward && !ops->attention_forward && !ops->attention_backward;
}

/* A block its halves can compute: extensions that stay inside the
 * attention or inside the MLP (a pruned half multiplies in CSR as the
 * whole block does). */
static int fits_units(const struct block *blk)
{
    for (int i = 0; i < blk->ext_count; i++)
        if (!gpt_ext_fits_units(blk->ext[i].ops) && !gpt_ext_fits_mlp_unit(blk->ext[i].ops))
            return 0;
    return 1;
}

int block_is_half(const struct block *blk)
{
    return blk->halves == BLOCK_HALF_ATTENTION || blk->halves == BLOCK_HALF_MLP;
}

int block_tensor_half(const struct block *blk, int k)
{
    return k < BP_LN2_W && k < own_tensor_count(blk) ? BLOCK_HALF_ATTENTION : BLOCK_HALF_MLP;
}

void block_half_range(const struct block *blk, int half, size_t *offset, size_t *count)
{
    size_t attention = block_tensor_offset(blk->C, BP_LN2_W);
    *offset = half == BLOCK_HALF_MLP ? attention : 0;
    *count = half == BLOCK_HALF_ATTENTION ? attention
             : half == BLOCK_HALF_MLP    ? blk->nparams - attention
                                         : blk->nparams;
}

double block_half_grad_sumsq(const struct block *blk, int half)
{
    if (blk->frozen) return 0.0;
    size_t offset, count;
    block_half_range(blk, half, &offset, &count);
    return backend_current()->sum_squares(blk->grads + offset, (long)count);
}

static void half_forward(struct block *blk, struct block_acts *acts, float *out,
                         const float *in, int B, int T)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    float *const *p = blk->p;
    DM_ASSERT(B <= acts->B && T <= acts->T && fits_units(blk));
    block_sparse_refresh(blk);   /* this half's CSR values follow the last step */
    if (blk->halves == BLOCK_HALF_ATTENTION) {
        ops->layernorm_forward(acts->ln1, acts->ln1_mean, acts->ln1_rstd, in,
                               p[BP_LN1_W], p[BP_LN1_B], N, C);
        block_matmul_forward(blk, BP_QKV_W, acts->qkv, acts->ln1, N, C, 3 * C, NULL, NULL);
        attention_core_forward(blk, acts, NULL, B, T);
        block_matmul_forward(blk, BP_ATTPROJ_W, out, acts->atty, N, C, C, in, NULL);
        return;
    }
    ops->layernorm_forward(acts->ln2, acts->ln2_mean, acts->ln2_rstd, in, p[BP_LN2_W],
                           p[BP_LN2_B], N, C);
    const struct block_ext_slot *x = HOOK(blk, mlp_forward);
    if (x) {   /* the hook's residual is acts->res1 */
        if (in != acts->res1) ops->copy_on_device(acts->res1, in, (size_t)N * C * sizeof(float));
        x->ops->mlp_forward(blk, x->state, acts, out, N);
        return;
    }
    block_matmul_forward(blk, BP_FC_W, acts->fch, acts->ln2, N, C, 4 * C, NULL, acts->fch_gelu);
    block_matmul_forward(blk, BP_FCPROJ_W, out, acts->fch_gelu, N, 4 * C, C, in, NULL);
}

/* din may alias dout, as in block_backward: the MLP half reads dout
 * before it writes d_res1 to din; the attention half copies dout to
 * d_res1 first (nothing to copy when dout is the scratch's d_res1, where
 * an MLP half with no din left it: a whole block run as its halves). */
static void half_backward(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                          float *din, const float *dout, const float *in, int B, int T)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    float *const *p = blk->p, *const *g = weight_grads(blk);
    size_t bytes = (size_t)N * C * sizeof(float);
    if (blk->halves == BLOCK_HALF_MLP) {
        const struct block_ext_slot *x = HOOK(blk, mlp_backward);
        if (x) {
            x->ops->mlp_backward(blk, x->state, acts, s->d_ln, dout, N);
        } else {
            block_matmul_backward(blk, BP_FCPROJ_W, g, s->d_fch, dout, acts->fch_gelu, N,
                                  4 * C, C, acts->fch);
            block_matmul_backward(blk, BP_FC_W, g, s->d_ln, s->d_fch, acts->ln2, N, C, 4 * C,
                                  NULL);
        }
        ops->layernorm_backward_residual(s->d_res1, dout, g[BP_LN2_W], g[BP_LN2_B], s->d_ln, in,
                                         p[BP_LN2_W], acts->ln2_mean, acts->ln2_rstd, N, C);
        if (din) ops->copy_on_device(din, s->d_res1, bytes);
        return;
    }
    if (dout != s->d_res1) ops->copy_on_device(s->d_res1, dout, bytes);
    attention_part_backward(blk, acts, s, din, in, B, T);
}

void block_forward(struct block *blk, struct block_acts *acts, float *out, const float *in,
                   int B, int T)
{
    if (block_is_half(blk)) {
        half_forward(blk, acts, out, in, B, T);
        return;
    }
    const struct block_ext_slot *x = HOOK(blk, block_forward);
    if (x) x->ops->block_forward(blk, x->state, acts, out, in, B, T);
    else dense_forward(blk, acts, out, in, B, T);
}

static void dense_backward(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                           float *din, const float *dout, const float *in, int B, int T)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = B * T;
    float *const *p = blk->p, *const *g = weight_grads(blk);
    /* The residual stream passes dout straight through to d_res1 (joined in
     * the ln2 backward). dout is not read after that, so din may alias it. */
    const struct block_ext_slot *x = HOOK(blk, mlp_backward);
    if (x) {
        x->ops->mlp_backward(blk, x->state, acts, s->d_ln, dout, N);
    } else {
        block_matmul_backward(blk, BP_FCPROJ_W, g, s->d_fch, dout, acts->fch_gelu, N, 4 * C,
                              C, acts->fch);
        block_matmul_backward(blk, BP_FC_W, g, s->d_ln, s->d_fch, acts->ln2, N, C, 4 * C,
                              NULL);
    }
    ops->layernorm_backward_residual(s->d_res1, dout, g[BP_LN2_W], g[BP_LN2_B], s->d_ln,
                                     acts->res1, p[BP_LN2_W], acts->ln2_mean, acts->ln2_rstd,
                                     N, C);
    attention_part_backward(blk, acts, s, din, in, B, T);
}

void block_backward(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                    float *din, const float *dout, const float *in, int B, int T)
{
    if (block_is_half(blk)) {
        half_backward(blk, acts, s, din, dout, in, B, T);
        return;
    }
    const struct block_ext_slot *x = HOOK(blk, block_backward);
    if (x) x->ops->block_backward(blk, x->state, acts, s, din, dout, in, B, T);
    else dense_backward(blk, acts, s, din, dout, in, B, T);
}

/* ---- packed sequences (block_ext.h) ---------------------------------------------
 * The row-wise ops (layernorms, the four matrix products with bias,
 * residual and GELU) run once over all packed rows, as block_forward does
 * over B x T rows; the attention core runs per sequence over its own rows
 * (causal among them in ascending order is causal at their original
 * positions). For a block without a pruning mask or another MLP, so these
 * dense ops are exactly the block's. */

void block_forward_packed(struct block *blk, struct block_acts *acts, float *out,
                          const float *in, const int *start, int B)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = start[B];
    float *const *p = blk->p;
    DM_ASSERT(!block_replaces_mlp(blk) && !blk->sparse && N <= acts->B * acts->T);
    ops->layernorm_forward(acts->ln1, acts->ln1_mean, acts->ln1_rstd, in, p[BP_LN1_W], p[BP_LN1_B],
                           N, C);
    ops->matmul_forward(acts->qkv, acts->ln1, p[BP_QKV_W], p[BP_QKV_B], N, C, 3 * C);
    attention_core_forward(blk, acts, start, B, 0);
    ops->matmul_forward_residual(acts->res1, acts->atty, p[BP_ATTPROJ_W], p[BP_ATTPROJ_B], in, N, C,
                                 C);
    ops->layernorm_forward(acts->ln2, acts->ln2_mean, acts->ln2_rstd, acts->res1, p[BP_LN2_W],
                           p[BP_LN2_B], N, C);
    ops->matmul_forward_gelu(acts->fch, acts->fch_gelu, acts->ln2, p[BP_FC_W], p[BP_FC_B], N, C,
                             4 * C);
    ops->matmul_forward_residual(out, acts->fch_gelu, p[BP_FCPROJ_W], p[BP_FCPROJ_B], acts->res1, N,
                                 4 * C, C);
}

void block_backward_packed(struct block *blk, struct block_acts *acts, struct block_scratch *s,
                           float *din, const float *dout, const float *in, const int *start,
                           int B)
{
    const struct dm_backend *ops = backend_current();
    int C = blk->C, N = start[B];
    float *const *p = blk->p;
    static float *const no_grads[BP_COUNT];
    float *const *g = blk->frozen ? no_grads : blk->g;
    ops->matmul_backward_gelu(s->d_fch, g[BP_FCPROJ_W], g[BP_FCPROJ_B], dout, acts->fch_gelu,
                              p[BP_FCPROJ_W], acts->fch, N, 4 * C, C);
    ops->matmul_backward_overwrite(s->d_ln, g[BP_FC_W], g[BP_FC_B], s->d_fch, acts->ln2, p[BP_FC_W],
                                   N, C, 4 * C);
    ops->layernorm_backward_residual(s->d_res1, dout, g[BP_LN2_W], g[BP_LN2_B], s->d_ln, acts->res1,
                                     p[BP_LN2_W], acts->ln2_mean, acts->ln2_rstd, N, C);
    ops->matmul_backward_overwrite(s->d_atty, g[BP_ATTPROJ_W], g[BP_ATTPROJ_B], s->d_res1,
                                   acts->atty, p[BP_ATTPROJ_W], N, C, C);
    attention_core_backward(blk, acts, s, start, B, 0);
    ops->matmul_backward_overwrite(s->d_ln, g[BP_QKV_W], g[BP_QKV_B], s->d_qkv, acts->ln1,
                                   p[BP_QKV_W], N, C, 3 * C);
    ops->layernorm_backward_residual(din, s->d_res1, g[BP_LN1_W], g[BP_LN1_B], s->d_ln, in,
                                     p[BP_LN1_W], acts->ln1_mean, acts->ln1_rstd, N, C);
}

/* ---- the extensions' places (block_ext.h) ----------------------------------------- */

const struct gpt_ext *gpt_shape_ext(const struct gpt_shape *shape, const struct gpt_ext_ops *ops)
{
    for (int i = 0; i < shape->ext_count; i++)
        if (shape->ext[i].ops == ops) return &shape->ext[i];
    return NULL;
}

const void *gpt_shape_ext_params(const struct gpt_shape *shape, const struct gpt_ext_ops *ops)
{
    const struct gpt_ext *ext = gpt_shape_ext(shape, ops);
    return ext ? ext->params : NULL;
}

struct gpt_ext *gpt_shape_add_ext(struct gpt_shape *shape, const struct gpt_ext_ops *ops,
                                  const void *params, size_t params_bytes)
{
    DM_ASSERT(shape->ext_count < GPT_EXT_MAX && params_bytes <= GPT_EXT_PARAM_BYTES &&
              !gpt_shape_ext(shape, ops));
    struct gpt_ext *ext = &shape->ext[shape->ext_count++];
    memset(ext, 0, sizeof *ext);
    ext->ops = ops;
    memcpy(ext->params, params, params_bytes);
    return ext;
}

int gpt_ext_owns(const struct gpt_ext *ext, const struct gpt_shape *shape, int index)
{
    return ext && ext->ops->owns(ext, shape, index);
}

int gpt_ext_block_count(const struct gpt_ext *ext, const struct gpt_shape *shape)
{
    int n = 0;
    for (int l = 0; l < shape->layers; l++) n += gpt_ext_owns(ext, shape, l);
    return n;
}

int gpt_ext_ordinal(const struct gpt_ext *ext, const struct gpt_shape *shape, int index)
{
    if (!gpt_ext_owns(ext, shape, index)) return -1;
    int n = 0;
    for (int l = 0; l < index; l++) n += gpt_ext_owns(ext, shape, l);
    return n;
}

void *block_ext_state(const struct block *blk, const struct gpt_ext_ops *ops)
{
    for (int i = 0; i < blk->ext_count; i++)
        if (blk->ext[i].ops == ops) return blk->ext[i].state;
    return NULL;
}

void **block_ext_acts(struct block_acts *acts, const struct gpt_ext_ops *ops)
{
    for (int i = 0; i < GPT_EXT_MAX; i++) {
        if (acts->ext[i].ops == ops) return &acts->ext[i].acts;
        if (!acts->ext[i].ops) {
            acts->ext[i].ops = ops;
            return &acts->ext[i].acts;
        }
    }
    DM_FATAL("more than %d extensions keep activations", GPT_EXT_MAX);
}

void block_init_normal(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t first,
                       float std)
{
    init_normal_at(out, n, seed, stream, first, std);
}

static void zero_range(void *arg, long begin, long end)
{
    float *dst = arg;
    memset(dst + begin, 0, (size_t)(end - begin) * sizeof(float));
}

void parallel_zero(float *dst, long n)
{
    dm_parallel_for(n, 4096, zero_range, dst);
}
