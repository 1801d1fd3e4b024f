/* `dynmo export-hf CKPT.h5 --out DIR`: a dense dynmo checkpoint as a
 * Hugging Face GPT-2 directory (config.json + model.safetensors, float32)
 * that transformers' GPT2LMHeadModel.from_pretrained loads
 * (docs/weights.md). DIR is written through out_dir: replaced whole or
 * not at all, and never over a user's files. A model a GPT-2 cannot
 * express (a scheme's blocks, pruning, early exit) is refused. */
#include <stdio.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/tools.h"
#include "dynmo/world.h"
#include "tools/args.h"
#include "tools/out_dir.h"
#include "tools/weights/hf_gpt2.h"
#include "tools/weights/safetensors.h"
#include "tools/weights/weights.h"

#define EXPORT_USAGE "usage: dynmo export-hf CKPT.h5 --out DIR\n"

/* What --help prints. */
static void usage(FILE *out)
{
    fprintf(out, EXPORT_USAGE "Writes a dense checkpoint as a Hugging Face GPT-2 directory "
                 "(config.json, model.safetensors)\nthat transformers' "
                 "GPT2LMHeadModel.from_pretrained loads. DIR is created, or replaced\nwhen "
                 "it holds an earlier export and nothing else.\n");
}

int cmd_export_hf(int argc, char **argv)
{
    const char *ckpt = NULL, *dir = NULL;
    for (int i = 1; i < argc; i++) {
        tool_help(argv[i], usage);
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            dir = argv[++i];
        } else {
            weights_positional("export-hf", EXPORT_USAGE, argv[i], &ckpt);
        }
    }
    if (!ckpt || !dir) dm_user_error("export-hf: %s\n" EXPORT_USAGE,
                                     ckpt ? "--out DIR is required" : "CKPT.h5 is required");
    struct out_dir o = {.tool = "export-hf", .what = "the model", .writer = "dynmo export-hf",
                        .inputs = &ckpt, .input_count = 1};
    out_dir_check(&o, dir);
    char err[4096], why[512];
    struct ckpt_meta meta;
    if (ckpt_read_info(ckpt, &meta, err, sizeof err)) dm_user_error("export-hf: %s", err);
    if (weights_not_dense(&meta, why, sizeof why))
        dm_user_error("export-hf: %s cannot be a GPT-2: %s", ckpt, why);

    world_init(&argc, &argv);
    if (dm_world_size() != 1)
        dm_user_error("export-hf runs on one rank (it was started on %d)", dm_world_size());
    struct gpt model;
    weights_load_checkpoint(ckpt, &model, &meta);

    struct hf_gpt2_tensor *t;
    int count = hf_gpt2_tensors(&model.shape, &t);
    struct safetensors_tensor *out = dm_alloc((size_t)count * sizeof *out);
    char (*names)[96] = dm_alloc((size_t)count * sizeof *names);
    float **data = dm_alloc((size_t)count * sizeof *data);
    for (int i = 0; i < count; i++) {
        snprintf(names[i], sizeof names[i], HF_GPT2_PREFIX "%s", t[i].name);
        data[i] = dm_alloc_uninit(hf_gpt2_elements(&t[i]) * sizeof(float));
        hf_gpt2_copy(data[i], hf_gpt2_dynmo_floats(&model, &t[i]), &t[i], 1);
        out[i] = (struct safetensors_tensor){.name = names[i], .rank = t[i].cols ? 2 : 1,
                                             .shape = {t[i].rows, t[i].cols}, .data = data[i]};
    }
    out_dir_begin(&o, dir);
    char path[OUT_DIR_PATH_BYTES + 300];
    snprintf(path, sizeof path, "%s/model.safetensors", o.tmp);
    if (safetensors_write(path, out, count, err, sizeof err)) dm_user_error("export-hf: %s", err);
    char *config = hf_gpt2_config_text(&model.shape);
    snprintf(path, sizeof path, "%s/config.json", o.tmp);
    if (dm_write_file_atomic(path, config, strlen(config), err, sizeof err))
        dm_user_error("export-hf: %s", err);
    out_dir_commit(&o);
    size_t padding = (size_t)(model.shape.vocab - gpt_vocab_used(&model.shape)) *
                     (size_t)model.shape.channels;   /* model.vocab_pad's rows: not exported */
    printf("exported %s (step %ld): GPT-2 of %d layers x %d channels, %d heads, vocab %d, "
           "%d positions (%zu parameters)\nwrote %s/config.json and %s/model.safetensors\n",
           ckpt, meta.step, model.shape.layers, model.shape.channels, model.shape.heads,
           gpt_vocab_used(&model.shape), model.shape.max_seq,
           gpt_param_count(&model.shape) - padding, dir, dir);
    dm_free(config);
    for (int i = 0; i < count; i++) dm_free(data[i]);
    dm_free(data);
    dm_free(names);
    dm_free(out);
    dm_free(t);
    gpt_free(&model);
    ckpt_meta_free(&meta);
    world_finalize(DM_EXIT_OK);
    return DM_EXIT_OK;
}
