/* `dynmo import-hf DIR --out CKPT.h5`: a Hugging Face GPT-2 directory
 * (config.json + model.safetensors) as a dynmo checkpoint at step 0 with
 * a fresh optimizer, which `ckpt.resume` loads under any layout
 * (docs/weights.md). Everything is checked before the checkpoint is
 * written, and it is published whole or not at all. It must not write
 * anywhere but --out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/tools.h"
#include "dynmo/world.h"
#include "tools/args.h"
#include "tools/weights/hf_gpt2.h"
#include "tools/weights/safetensors.h"
#include "tools/weights/weights.h"

#define IMPORT_USAGE "usage: dynmo import-hf DIR --out CKPT.h5 [--seed N] [--vocab-pad M]\n"

/* Tensors transformers keeps in some files that are no parameters: the
 * causal mask and its fill value of each attention layer. */
static int is_buffer(const char *name)
{
    size_t n = strlen(name);
    return (n > 10 && !strcmp(name + n - 10, ".attn.bias")) ||
           (n > 17 && !strcmp(name + n - 17, ".attn.masked_bias"));
}

/* The entry of tensor `name` with or without HF_GPT2_PREFIX, or NULL. */
static const struct safetensors_entry *find(const struct safetensors_file *f, const char *name)
{
    char full[128];
    snprintf(full, sizeof full, HF_GPT2_PREFIX "%s", name);
    const struct safetensors_entry *e = safetensors_find(f, full);
    return e ? e : safetensors_find(f, name);
}

/* Checks that every tensor the model needs is in the file with its shape
 * and a dtype dynmo converts, and that the file holds nothing else but
 * the buffers and a head tied to wte. */
static void check_tensors(const struct safetensors_file *f, const struct hf_gpt2_tensor *t,
                          int count)
{
    for (int i = 0; i < count; i++) {
        const struct safetensors_entry *e = find(f, t[i].name);
        if (!e) dm_user_error("import-hf: %s has no tensor %s (nor " HF_GPT2_PREFIX "%s): not "
                              "a GPT-2 of this config.json", f->path, t[i].name, t[i].name);
        int rank = t[i].cols ? 2 : 1;
        if (e->rank != rank || e->shape[0] != t[i].rows || (rank == 2 && e->shape[1] != t[i].cols)) {
            char shape[256] = "(";
            for (int d = 0; d < e->rank; d++)
                snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld",
                         d ? ", " : "", (long long)e->shape[d]);
            dm_user_error("import-hf: %s: tensor %s has shape %s), but config.json makes it "
                          "(%ld%s%.0ld)", f->path, e->name, shape, t[i].rows,
                          t[i].cols ? ", " : "", t[i].cols);
        }
        if (e->dtype == SAFETENSORS_OTHER)
            dm_user_error("import-hf: %s: tensor %s is %s; dynmo reads F32, F16 and BF16",
                          f->path, e->name, e->dtype_name);
    }
    for (int i = 0; i < f->count; i++) {
        const char *name = f->entries[i].name;
        const char *bare = strncmp(name, HF_GPT2_PREFIX, strlen(HF_GPT2_PREFIX)) ? name
                         : name + strlen(HF_GPT2_PREFIX);
        int known = is_buffer(bare) || !strcmp(name, "lm_head.weight");
        for (int k = 0; k < count && !known; k++) known = !strcmp(bare, t[k].name);
        if (!known)
            dm_user_error("import-hf: %s holds tensor %s, which dynmo's GPT does not have (a "
                          "GPT-2 with other layers?)", f->path, name);
    }
}

/* A head stored beside wte must be wte itself (tied). */
static void check_head(const struct safetensors_file *f, const struct gpt *model)
{
    const struct safetensors_entry *head = safetensors_find(f, "lm_head.weight");
    if (!head) return;
    int V = gpt_vocab_used(&model->shape);
    size_t n = (size_t)V * (size_t)model->shape.channels;
    if (head->rank != 2 || head->shape[0] != V || head->shape[1] != model->shape.channels ||
        head->dtype == SAFETENSORS_OTHER)
        dm_user_error("import-hf: %s: lm_head.weight is not shaped as wte (%d, %d) in F32, "
                      "F16 or BF16", f->path, V, model->shape.channels);
    float *w = dm_alloc(n * sizeof(float));
    safetensors_to_float(f, head, w);
    int same = !memcmp(w, model->wte, n * sizeof(float));
    dm_free(w);
    if (!same)
        dm_user_error("import-hf: %s: lm_head.weight differs from wte.weight: an untied head, "
                      "which dynmo's GPT (head tied to wte) cannot represent", f->path);
}

/* What --help prints. */
static void usage(FILE *out)
{
    fprintf(out, IMPORT_USAGE "Imports a Hugging Face GPT-2 (config.json and model.safetensors "
                 "in DIR) as a dynmo checkpoint at step 0\nwith a fresh optimizer; it prints "
                 "the config keys to train from it with ckpt.resume=CKPT.h5.\n--seed N: the "
                 "train.seed the checkpoint records (default 1337; a resume must use it).\n--vocab-pad M: "
                 "the embedding's rows padded to a multiple of M (model.vocab_pad; zero rows,\n"
                 "never predicted).\n");
}

int cmd_import_hf(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL;
    uint64_t seed = 1337;
    int vocab_pad = 1;
    for (int i = 1; i < argc; i++) {
        tool_help(argv[i], usage);
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            const char *v = argv[++i];
            seed = strtoull(v, &end, 10);
            if (!*v || *end || *v == '-') dm_user_error("import-hf: --seed '%s' is not a "
                                                        "non-negative integer", v);
        } else if (!strcmp(argv[i], "--vocab-pad") && i + 1 < argc) {
            char *end;
            const char *v = argv[++i];
            long x = strtol(v, &end, 10);
            if (!*v || *end || x < 1 || x > 65536)
                dm_user_error("import-hf: --vocab-pad '%s' is not an integer from 1 to 65536", v);
            vocab_pad = (int)x;
        } else {
            weights_positional("import-hf", IMPORT_USAGE, argv[i], &dir);
        }
    }
    if (!dir || !out) dm_user_error("import-hf: %s\n" IMPORT_USAGE,
                                    dir ? "--out CKPT.h5 is required" : "DIR is required");
    weights_check_new_file("import-hf", out);
    char err[4600];
    struct gpt_shape shape;
    if (hf_gpt2_read_config(dir, &shape, err, sizeof err)) dm_user_error("import-hf: %s", err);
    int vocab = shape.vocab;
    long rows = ((long)vocab + vocab_pad - 1) / vocab_pad * vocab_pad;
    if (rows > 1L << 20)
        dm_user_error("import-hf: vocab_size %d padded to a multiple of --vocab-pad %d is %ld "
                      "rows, more than 2^20: choose a smaller --vocab-pad", vocab, vocab_pad,
                      rows);
    shape.vocab = (int)rows;   /* the used rows from the file, the rest zero */
    shape.vocab_used = vocab;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct safetensors_file f;
    if (safetensors_open(&f, path, err, sizeof err)) dm_user_error("import-hf: %s", err);
    struct hf_gpt2_tensor *tensors;
    int count = hf_gpt2_tensors(&shape, &tensors);
    check_tensors(&f, tensors, count);

    world_init(&argc, &argv);
    if (dm_world_size() != 1)
        dm_user_error("import-hf runs on one rank (it was started on %d); the checkpoint loads "
                      "under any world", dm_world_size());
    struct gpt model;
    gpt_build_deferred(&model, &shape, 0, shape.layers, 1, 1);
    size_t largest = 0;
    for (int i = 0; i < count; i++)
        if (hf_gpt2_elements(&tensors[i]) > largest) largest = hf_gpt2_elements(&tensors[i]);
    float *buffer = dm_alloc(largest * sizeof(float));
    memset(model.wte + (size_t)vocab * shape.channels, 0,
           (size_t)(rows - vocab) * shape.channels * sizeof(float));
    for (int i = 0; i < count; i++) {
        safetensors_to_float(&f, find(&f, tensors[i].name), buffer);
        hf_gpt2_copy(hf_gpt2_dynmo_floats(&model, &tensors[i]), buffer, &tensors[i], 0);
    }
    dm_free(buffer);
    check_head(&f, &model);
    safetensors_close(&f);

    struct dm_config cfg;
    config_defaults(&cfg);
    cfg.vocab = vocab;
    cfg.vocab_pad = vocab_pad;
    cfg.max_seq = shape.max_seq;
    cfg.layers = shape.layers;
    cfg.heads = shape.heads;
    cfg.channels = shape.channels;
    cfg.seed = seed;
    if (cfg.seq > cfg.max_seq) cfg.seq = cfg.max_seq;
    char *config_text = dm_alloc(1 << 16);
    config_print(&cfg, config_text, 1 << 16);
    long cursor = 0;
    int layout = shape.layers;
    struct ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.seed = seed;
    meta.config_text = config_text;
    meta.pp = meta.dp = 1;
    meta.data_cursor = &cursor;
    meta.layout = &layout;
    weights_save_checkpoint("import-hf", out, &model, &meta);
    dm_free(config_text);

    printf("imported %s: GPT-2 of %d layers x %d channels, %d heads, vocab %d, %d positions "
           "(%zu parameters)\nwrote %s (step 0, fresh optimizer state)\n"
           "train from it with ckpt.resume=%s and these keys:\n"
           "[model]\nvocab = %d\n", dir, shape.layers, shape.channels, shape.heads, vocab,
           shape.max_seq, gpt_param_count(&shape), out, out, vocab);
    if (vocab_pad > 1) printf("vocab_pad = %d\n", vocab_pad);
    printf("max_seq = %d\nlayers = %d\nheads = %d\nchannels = %d\n[train]\nseed = %llu\n",
           shape.max_seq, shape.layers, shape.heads, shape.channels, (unsigned long long)seed);
    gpt_free(&model);
    dm_free(tensors);
    world_finalize(DM_EXIT_OK);
    return DM_EXIT_OK;
}
