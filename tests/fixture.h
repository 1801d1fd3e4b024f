/* The reader of the PyTorch reference fixtures (tests/reference/make_*.py,
 * tests/reference/README.md), shared by test_reference and
 * test_exit_reference: the DMREF format in each of its versions (1 the
 * dense GPT, 2 with MoE blocks, 3 with MoD blocks or hash attention, 4
 * early exit and freezing), where to find the files, the config a
 * fixture was made with, its parameters' canonical flat order derived from
 * the shape alone, and the largest difference of two float arrays.
 * It must not know what a test checks: a test takes the arrays it wants
 * and compares them itself. The file is little-endian, as the hosts the
 * tests run on are (x86-64, aarch64). Include testing.h's counters: a
 * fixture that cannot be read, or lacks an array a test takes, counts as
 * a failed check. */
#ifndef DYNMO_TESTS_FIXTURE_H
#define DYNMO_TESTS_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dynmo/core.h"
#include "dynmo/model.h"
#include "testing.h"

#define FIXTURE_DIR "tests/reference"
#define FIXTURE_MAX_ARRAYS 24

enum { DTYPE_FLOAT32 = 0, DTYPE_INT32 = 1, DTYPE_FLOAT64 = 2 };
enum { KIND_EXIT = 0, KIND_FREEZE = 1 };   /* version 4's kind */

struct fixture_array {
    char name[17];
    uint32_t dtype;
    int count;
    const void *data;   /* points into fixture.bytes; may be unaligned */
};

struct fixture {
    unsigned char *bytes;
    size_t size;
    int version;        /* the header's: 1 to 4 */
    int vocab, max_seq, layers, heads, channels, batch, seq, steps, warmup;
    double lr, min_lr_ratio, beta1, beta2, eps, weight_decay, grad_clip;
    /* version 2: the MoE blocks */
    int moe_every, experts, top_k, expert_hidden, router, drop;
    double capacity_factor, aux_loss, z_loss, bias_rate;
    /* version 3: the MoD blocks and hash attention */
    int mod_every, mod_routing, hash_buckets, mod_predictor_hidden;
    double mod_capacity;
    uint64_t seed;      /* the hash rotations' (train.seed) */
    /* version 4: early exit or freezing */
    int kind, exit_from, exit_confidence, exit_warmup;
    double exit_threshold, exit_loss_weight;
    int num_arrays;
    struct fixture_array arrays[FIXTURE_MAX_ARRAYS];
};

static inline int32_t fixture_i32(const unsigned char *p) { int32_t x; memcpy(&x, p, 4); return x; }
static inline uint32_t fixture_u32(const unsigned char *p) { uint32_t x; memcpy(&x, p, 4); return x; }
static inline double fixture_f64(const unsigned char *p) { double x; memcpy(&x, p, 8); return x; }

/* Finds the directory tests/reference that holds the file `probe`: under
 * the current directory (the test runner runs from the repository root),
 * else under each directory above the executable (build/tests/test_x,
 * build/ref/tests/test_x, ...). Writes it to dir; 0 when none holds it
 * (dir is then FIXTURE_DIR, for the message). */
static inline int fixture_dir(char *dir, size_t size, const char *probe)
{
    char path[2200];
    snprintf(dir, size, "%s", FIXTURE_DIR);
    snprintf(path, sizeof path, "%s/%s", dir, probe);
    if (access(path, R_OK) == 0) return 1;
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = '\0';
    for (char *slash = strrchr(exe, '/'); slash; slash = strrchr(exe, '/')) {
        *slash = '\0';
        snprintf(dir, size, "%s/%s", exe, FIXTURE_DIR);
        snprintf(path, sizeof path, "%s/%s", dir, probe);
        if (access(path, R_OK) == 0) return 1;
    }
    snprintf(dir, size, "%s", FIXTURE_DIR);
    return 0;
}

/* The bytes of each version's header before its array count. */
static inline size_t fixture_header_bytes(int version)
{
    switch (version) {
    case 2: return 104 + 24 + 32;   /* int32[6] and float64[4] of the MoE keys */
    case 3: return 104 + 16 + 16;   /* int32[4], float64 capacity, uint64 seed */
    case 4: return 104 + 16 + 16;   /* int32[4], float64 threshold and weight */
    default: return 104;
    }
}

/* Reads a fixture of a version from lowest to highest into fx (fx->bytes
 * to free); 0, or -1 after printing why. */
static inline int fixture_load(struct fixture *fx, const char *path, int lowest, int highest)
{
    memset(fx, 0, sizeof *fx);
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < 108) {
        fprintf(stderr, "%s: %ld bytes, too short for a fixture\n", path, size);
        fclose(f);
        return -1;
    }
    fx->size = (size_t)size;
    fx->bytes = malloc(fx->size);
    size_t got = fread(fx->bytes, 1, fx->size, f);
    fclose(f);
    if (got != fx->size) { fprintf(stderr, "%s: short read\n", path); return -1; }

    const unsigned char *p = fx->bytes;
    for (int v = lowest; v <= highest; v++) {
        char magic[9];
        snprintf(magic, sizeof magic, "DMREF%03d", v);
        if (!memcmp(p, magic, 8) && fixture_u32(p + 8) == (uint32_t)v) fx->version = v;
    }
    if (!fx->version) {
        fprintf(stderr, "%s: not a DMREF fixture of version %d to %d\n", path, lowest, highest);
        return -1;
    }
    size_t offset = fixture_header_bytes(fx->version);
    if (fx->size < offset + 4) goto truncated;
    int *ints[] = {&fx->vocab, &fx->max_seq, &fx->layers, &fx->heads, &fx->channels,
                   &fx->batch, &fx->seq, &fx->steps, &fx->warmup};
    for (int i = 0; i < 9; i++) *ints[i] = fixture_i32(p + 12 + 4 * i);
    double *reals[] = {&fx->lr, &fx->min_lr_ratio, &fx->beta1, &fx->beta2, &fx->eps,
                       &fx->weight_decay, &fx->grad_clip};
    for (int i = 0; i < 7; i++) *reals[i] = fixture_f64(p + 48 + 8 * i);
    if (fx->version == 2) {
        int *moe_ints[] = {&fx->moe_every, &fx->experts, &fx->top_k, &fx->expert_hidden,
                           &fx->router, &fx->drop};
        for (int i = 0; i < 6; i++) *moe_ints[i] = fixture_i32(p + 104 + 4 * i);
        double *moe_reals[] = {&fx->capacity_factor, &fx->aux_loss, &fx->z_loss,
                               &fx->bias_rate};
        for (int i = 0; i < 4; i++) *moe_reals[i] = fixture_f64(p + 128 + 8 * i);
    } else if (fx->version == 3) {
        int *mod_ints[] = {&fx->mod_every, &fx->mod_routing, &fx->hash_buckets,
                           &fx->mod_predictor_hidden};
        for (int i = 0; i < 4; i++) *mod_ints[i] = fixture_i32(p + 104 + 4 * i);
        fx->mod_capacity = fixture_f64(p + 120);
        memcpy(&fx->seed, p + 128, 8);
    } else if (fx->version == 4) {
        int *scheme[] = {&fx->kind, &fx->exit_from, &fx->exit_confidence, &fx->exit_warmup};
        for (int i = 0; i < 4; i++) *scheme[i] = fixture_i32(p + 104 + 4 * i);
        fx->exit_threshold = fixture_f64(p + 120);
        fx->exit_loss_weight = fixture_f64(p + 128);
    }
    uint32_t num_arrays = fixture_u32(p + offset);
    offset += 4;
    if (num_arrays > FIXTURE_MAX_ARRAYS) {
        fprintf(stderr, "%s: %u arrays, at most %d expected\n", path, num_arrays,
                FIXTURE_MAX_ARRAYS);
        return -1;
    }
    for (uint32_t i = 0; i < num_arrays; i++) {
        struct fixture_array *a = &fx->arrays[i];
        if (offset + 24 > fx->size) goto truncated;
        memcpy(a->name, p + offset, 16);
        a->name[16] = '\0';
        a->dtype = fixture_u32(p + offset + 16);
        a->count = fixture_i32(p + offset + 20);
        if (a->dtype > DTYPE_FLOAT64 || a->count < 0) {
            fprintf(stderr, "%s: array %s has dtype %u, count %d\n", path, a->name, a->dtype,
                    a->count);
            return -1;
        }
        offset += 24;
        size_t bytes = (size_t)a->count * (a->dtype == DTYPE_FLOAT64 ? 8 : 4);
        if (offset + bytes > fx->size) goto truncated;
        a->data = p + offset;
        offset += bytes;
    }
    fx->num_arrays = (int)num_arrays;
    if (offset != fx->size) {
        fprintf(stderr, "%s: %zu trailing bytes\n", path, fx->size - offset);
        return -1;
    }
    return 0;
truncated:
    fprintf(stderr, "%s: truncated\n", path);
    return -1;
}

/* A fresh, aligned copy of array `name` after checking its dtype and
 * count; NULL, a failure counted, after printing why when it is missing
 * or of another shape. */
static inline void *fixture_take(const struct fixture *fx, const char *name, uint32_t dtype,
                                 long count)
{
    for (int i = 0; i < fx->num_arrays; i++) {
        const struct fixture_array *a = &fx->arrays[i];
        if (strcmp(a->name, name) != 0) continue;
        if (a->dtype != dtype || a->count != count) {
            fprintf(stderr, "fixture array %s: dtype %u count %d, expected dtype %u count %ld\n",
                    name, a->dtype, a->count, dtype, count);
            testing_failures++;
            return NULL;
        }
        size_t bytes = (size_t)count * (dtype == DTYPE_FLOAT64 ? 8 : 4);
        void *copy = malloc(bytes ? bytes : 1);
        memcpy(copy, a->data, bytes);
        return copy;
    }
    fprintf(stderr, "fixture has no array %s\n", name);
    testing_failures++;
    return NULL;
}

/* moe.drop of version 2's drop field. */
static inline const char *fixture_drop_name(int drop)
{
    return drop == 2 ? "slot" : drop == 1 ? "position" : "probs";
}

/* The config the fixture was made with, validated: its model, batch (one
 * micro-batch) and optimizer, and by version the MoE keys, the MoD and
 * hash keys, or dyn.kind and the early-exit keys (a freeze fixture's
 * blocks are frozen by the test, not by the scheme). */
static inline void fixture_config(struct dm_config *cfg, const struct fixture *fx)
{
    config_defaults(cfg);
    cfg->vocab = fx->vocab;
    cfg->max_seq = fx->max_seq;
    cfg->layers = fx->layers;
    cfg->heads = fx->heads;
    cfg->channels = fx->channels;
    cfg->batch = fx->batch;
    cfg->seq = fx->seq;
    cfg->micro_batches = 1;
    cfg->steps = fx->steps;
    cfg->warmup = fx->warmup;
    cfg->lr = fx->lr;
    cfg->min_lr_ratio = fx->min_lr_ratio;
    cfg->beta1 = fx->beta1;
    cfg->beta2 = fx->beta2;
    cfg->eps = fx->eps;
    cfg->weight_decay = fx->weight_decay;
    cfg->grad_clip = fx->grad_clip;
    if (fx->version == 2) {
        cfg->moe_every = fx->moe_every;
        cfg->experts = fx->experts;
        cfg->top_k = fx->top_k;
        cfg->expert_hidden = fx->expert_hidden;
        snprintf(cfg->moe_router, sizeof cfg->moe_router, "%s",
                 fx->router ? "sigmoid" : "softmax");
        snprintf(cfg->moe_drop, sizeof cfg->moe_drop, "%s", fixture_drop_name(fx->drop));
        cfg->capacity_factor = fx->capacity_factor;
        cfg->aux_loss = fx->aux_loss;
        cfg->z_loss = fx->z_loss;
        cfg->bias_rate = fx->bias_rate;
    }
    if (fx->version == 3) {
        cfg->seed = fx->seed;
        if (fx->mod_every > 0) {
            cfg->mod_every = fx->mod_every;
            cfg->mod_capacity = fx->mod_capacity;
            snprintf(cfg->mod_routing, sizeof cfg->mod_routing, "%s",
                     fx->mod_routing ? "causal" : "topk");
            if (fx->mod_routing) cfg->mod_predictor_hidden = fx->mod_predictor_hidden;
        }
        if (fx->hash_buckets > 0) {
            snprintf(cfg->attention, sizeof cfg->attention, "hash");
            cfg->hash_buckets = fx->hash_buckets;
        }
    }
    if (fx->version == 4 && fx->kind == KIND_EXIT) {
        snprintf(cfg->dyn_kind, sizeof cfg->dyn_kind, "early_exit");
        snprintf(cfg->exit_confidence, sizeof cfg->exit_confidence, "%s",
                 fx->exit_confidence ? "saturation" : "softmax");
        cfg->exit_from = fx->exit_from;
        cfg->exit_threshold = fx->exit_threshold;
        cfg->exit_loss_weight = fx->exit_loss_weight;
        cfg->exit_warmup = fx->exit_warmup;
    }
    config_validate(cfg);
}

/* One named tensor of the canonical flat order (model.h), derived here
 * from the fixture's shape alone (not from model.c's offsets) so that a
 * layout bug shows up. */
struct named_tensor {
    char name[32];
    size_t offset, size;
};

/* The fixture's tensors in the canonical flat order: wte, wpe, each
 * block's (an MoE block's eight shared ones, its router and each expert's
 * four; a MoD block's twelve, its router and, with causal routing, its
 * predictor's four), lnf_w, lnf_b. A fresh array (to free) of *count. */
static inline struct named_tensor *fixture_tensors(const struct fixture *fx, int *count)
{
    static const char *block_names[BP_COUNT] = {
        "ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b",
        "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"};
    static const char *expert_names[4] = {"fc_w", "fc_b", "fcproj_w", "fcproj_b"};
    static const char *pred_names[4] = {"pred_w1", "pred_b1", "pred_w2", "pred_b2"};
    const int moe_every = fx->version == 2 ? fx->moe_every : 0;
    const int experts = moe_every > 0 ? fx->experts : 0;
    const int mod_every = fx->version == 3 ? fx->mod_every : 0;
    const int mod_hidden = mod_every > 0 && fx->mod_routing == 1 ? fx->mod_predictor_hidden : 0;
    const size_t c = (size_t)fx->channels, h = (size_t)fx->expert_hidden;
    const size_t ph = (size_t)mod_hidden;
    const size_t block_sizes[BP_COUNT] = {c, c, 3 * c * c, 3 * c, c * c, c,
                                          c, c, 4 * c * c, 4 * c, 4 * c * c, c};
    const size_t expert_sizes[4] = {h * c, h, c * h, c};
    const size_t pred_sizes[4] = {ph * c, ph, ph, 1};
    const int max = 4 + fx->layers * (BP_COUNT + 5 + 4 * experts);
    struct named_tensor *out = malloc((size_t)max * sizeof *out);
    int n = 0;
    size_t offset = 0;
#define ADD(count, ...)                                                       \
    do {                                                                      \
        DM_ASSERT(n < max);                                                   \
        snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__);               \
        out[n].offset = offset;                                               \
        out[n].size = (count);                                                \
        offset += out[n].size;                                                \
        n++;                                                                  \
    } while (0)
    ADD((size_t)fx->vocab * c, "wte");
    ADD((size_t)fx->max_seq * c, "wpe");
    for (int l = 0; l < fx->layers; l++) {
        int moe = moe_every > 0 && (l + 1) % moe_every == 0;
        for (int k = 0; k < (moe ? 8 : BP_COUNT); k++)
            ADD(block_sizes[k], "block%d.%s", l, block_names[k]);
        if (mod_every > 0 && (l + 1) % mod_every == 0) {
            ADD(c, "block%d.router_w", l);
            for (int k = 0; k < 4 && mod_hidden > 0; k++)
                ADD(pred_sizes[k], "block%d.%s", l, pred_names[k]);
        }
        if (!moe) continue;
        ADD((size_t)experts * c, "block%d.router_w", l);
        for (int e = 0; e < experts; e++)
            for (int k = 0; k < 4; k++)
                ADD(expert_sizes[k], "block%d.e%d.%s", l, e, expert_names[k]);
    }
    ADD(c, "lnf_w");
    ADD(c, "lnf_b");
#undef ADD
    *count = n;
    return out;
}

/* Largest |a - b| over n floats (NaN counts as infinite); its index goes
 * to *where. */
static inline double max_abs_diff(const float *a, const float *b, size_t n, size_t *where)
{
    double largest = 0.0;
    *where = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > largest || isnan(d)) {
            largest = isnan(d) ? INFINITY : d;
            *where = i;
        }
    }
    return largest;
}

#endif
