/* The mapping between transformers' GPT-2 and dynmo's dense GPT
 * (hf_gpt2.h). dynmo's block is GPT-2's: pre-norm, fused q|k|v with the
 * heads split along C, tanh GELU (transformers' "gelu_new"), layer norm
 * with epsilon 1e-5, a tied head. What it cannot represent is refused
 * here, key by key; it must not read tensors or write files. */
#include <json.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "tools/weights/hf_gpt2.h"

/* dynmo's layer-norm epsilon (layernorm_forward). */
#define DYNMO_LAYERNORM_EPS 1e-5

/* Integer key `key` of root in [lo, hi] into *out; -1 with err when it is
 * missing, not an integer or out of range. */
static int dimension(json_object *root, const char *file, const char *key, long lo, long hi,
                     int *out, char *err, size_t errsize)
{
    json_object *v;
    if (!json_object_object_get_ex(root, key, &v)) {
        dm_set_message(err, errsize, "%s has no %s", file, key);
        return -1;
    }
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < lo ||
        json_object_get_int64(v) > hi) {
        dm_set_message(err, errsize, "%s: %s = %s, which dynmo cannot represent (an integer "
                       "from %ld to %ld)", file, key, json_object_to_json_string(v), lo, hi);
        return -1;
    }
    *out = (int)json_object_get_int64(v);
    return 0;
}

/* A boolean key that must be `want` when present (missing: transformers'
 * default, which is `want`). */
static int boolean(json_object *root, const char *file, const char *key, int want,
                   const char *why, char *err, size_t errsize)
{
    json_object *v;
    if (!json_object_object_get_ex(root, key, &v)) return 0;
    if (!json_object_is_type(v, json_type_boolean) || json_object_get_boolean(v) != want) {
        dm_set_message(err, errsize, "%s: %s = %s, but dynmo's GPT %s", file, key,
                       json_object_to_json_string(v), why);
        return -1;
    }
    return 0;
}

static int check_config(json_object *root, const char *file, struct gpt_shape *shape,
                        char *err, size_t errsize)
{
    if (!json_object_is_type(root, json_type_object)) {
        dm_set_message(err, errsize, "%s is not a JSON object", file);
        return -1;
    }
    json_object *v;
    if (json_object_object_get_ex(root, "model_type", &v) &&
        strcmp(json_object_get_string(v), "gpt2")) {
        dm_set_message(err, errsize, "%s: model_type = %s; dynmo imports GPT-2 models "
                       "(model_type \"gpt2\") only", file, json_object_to_json_string(v));
        return -1;
    }
    if (json_object_object_get_ex(root, "activation_function", &v) &&
        strcmp(json_object_get_string(v), "gelu_new") &&
        strcmp(json_object_get_string(v), "gelu_pytorch_tanh")) {
        dm_set_message(err, errsize, "%s: activation_function = %s, but dynmo's GPT computes "
                       "the tanh GELU (\"gelu_new\") only", file, json_object_to_json_string(v));
        return -1;
    }
    memset(shape, 0, sizeof *shape);
    if (dimension(root, file, "vocab_size", 2, 1 << 20, &shape->vocab, err, errsize) ||
        dimension(root, file, "n_positions", 1, 65536, &shape->max_seq, err, errsize) ||
        dimension(root, file, "n_layer", 1, 4096, &shape->layers, err, errsize) ||
        dimension(root, file, "n_head", 1, 1024, &shape->heads, err, errsize) ||
        dimension(root, file, "n_embd", 1, 65536, &shape->channels, err, errsize))
        return -1;
    if (shape->channels % shape->heads) {
        dm_set_message(err, errsize, "%s: n_head = %d does not divide n_embd = %d", file,
                       shape->heads, shape->channels);
        return -1;
    }
    if (json_object_object_get_ex(root, "n_inner", &v) && !json_object_is_type(v, json_type_null) &&
        (!json_object_is_type(v, json_type_int) ||
         json_object_get_int64(v) != 4L * shape->channels)) {
        dm_set_message(err, errsize, "%s: n_inner = %s, but dynmo's MLP is 4 x n_embd = %d "
                       "wide (n_inner null or %d)", file, json_object_to_json_string(v),
                       4 * shape->channels, 4 * shape->channels);
        return -1;
    }
    if (json_object_object_get_ex(root, "layer_norm_epsilon", &v)) {
        double eps = json_object_get_double(v);
        if (!(json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)) ||
            fabs(eps - DYNMO_LAYERNORM_EPS) > 1e-6 * DYNMO_LAYERNORM_EPS) {
            dm_set_message(err, errsize, "%s: layer_norm_epsilon = %s, but dynmo's layer norm "
                           "uses 1e-05", file, json_object_to_json_string(v));
            return -1;
        }
    }
    if (boolean(root, file, "tie_word_embeddings", 1, "ties the head to wte", err, errsize) ||
        boolean(root, file, "scale_attn_weights", 1, "scales attention by 1/sqrt(head size)",
                err, errsize) ||
        boolean(root, file, "scale_attn_by_inverse_layer_idx", 0,
                "does not scale attention by the layer index", err, errsize) ||
        boolean(root, file, "reorder_and_upcast_attn", 0,
                "computes attention in one order in float32", err, errsize) ||
        boolean(root, file, "add_cross_attention", 0, "has no cross-attention", err, errsize) ||
        boolean(root, file, "is_encoder_decoder", 0, "is a decoder only", err, errsize))
        return -1;
    return 0;
}

int hf_gpt2_read_config(const char *dir, struct gpt_shape *shape, char *err, size_t errsize)
{
    char file[4200];
    snprintf(file, sizeof file, "%s/config.json", dir);
    const char *kind = NULL;
    int fd = dm_open_regular(file, &kind);
    if (fd < 0) {
        if (kind) dm_set_message(err, errsize, "%s is %s, not a file", file, kind);
        else dm_set_message(err, errsize, "cannot read %s: %s (a Hugging Face model directory "
                            "holds config.json and model.safetensors)", file, dm_errno_text());
        return -1;
    }
    json_object *root = json_object_from_fd(fd);
    close(fd);
    if (!root) {
        char why[256];
        snprintf(why, sizeof why, "%s", json_util_get_last_err());
        why[strcspn(why, "\n")] = '\0';
        dm_set_message(err, errsize, "%s is not JSON (%s)", file, why);
        return -1;
    }
    int rc = check_config(root, file, shape, err, errsize);
    json_object_put(root);
    return rc;
}

char *hf_gpt2_config_text(const struct gpt_shape *shape)
{
    json_object *root = json_object_new_object();
    json_object *arch = json_object_new_array();
    json_object_array_add(arch, json_object_new_string("GPT2LMHeadModel"));
    json_object_object_add(root, "architectures", arch);
    json_object_object_add(root, "model_type", json_object_new_string("gpt2"));
    json_object_object_add(root, "activation_function", json_object_new_string("gelu_new"));
    json_object_object_add(root, "vocab_size", json_object_new_int(gpt_vocab_used(shape)));
    json_object_object_add(root, "n_positions", json_object_new_int(shape->max_seq));
    json_object_object_add(root, "n_embd", json_object_new_int(shape->channels));
    json_object_object_add(root, "n_layer", json_object_new_int(shape->layers));
    json_object_object_add(root, "n_head", json_object_new_int(shape->heads));
    json_object_object_add(root, "n_inner", NULL);
    json_object_object_add(root, "layer_norm_epsilon",
                           json_object_new_double_s(DYNMO_LAYERNORM_EPS, "1e-05"));
    /* dynmo trains without dropout. */
    json_object_object_add(root, "resid_pdrop", json_object_new_double_s(0.0, "0.0"));
    json_object_object_add(root, "embd_pdrop", json_object_new_double_s(0.0, "0.0"));
    json_object_object_add(root, "attn_pdrop", json_object_new_double_s(0.0, "0.0"));
    json_object_object_add(root, "initializer_range", json_object_new_double_s(0.02, "0.02"));
    json_object_object_add(root, "scale_attn_weights", json_object_new_boolean(1));
    json_object_object_add(root, "scale_attn_by_inverse_layer_idx", json_object_new_boolean(0));
    json_object_object_add(root, "reorder_and_upcast_attn", json_object_new_boolean(0));
    json_object_object_add(root, "tie_word_embeddings", json_object_new_boolean(1));
    json_object_object_add(root, "torch_dtype", json_object_new_string("float32"));
    const char *text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
                                                      JSON_C_TO_STRING_SPACED);
    size_t n = strlen(text);
    char *out = dm_alloc(n + 2);
    memcpy(out, text, n);
    out[n] = '\n';
    json_object_put(root);
    return out;
}

int hf_gpt2_tensors(const struct gpt_shape *shape, struct hf_gpt2_tensor **out)
{
    static const struct { const char *name; int part, transposed; } block[] = {
        {"ln_1.weight", BP_LN1_W, 0},        {"ln_1.bias", BP_LN1_B, 0},
        {"attn.c_attn.weight", BP_QKV_W, 1}, {"attn.c_attn.bias", BP_QKV_B, 0},
        {"attn.c_proj.weight", BP_ATTPROJ_W, 1}, {"attn.c_proj.bias", BP_ATTPROJ_B, 0},
        {"ln_2.weight", BP_LN2_W, 0},        {"ln_2.bias", BP_LN2_B, 0},
        {"mlp.c_fc.weight", BP_FC_W, 1},     {"mlp.c_fc.bias", BP_FC_B, 0},
        {"mlp.c_proj.weight", BP_FCPROJ_W, 1}, {"mlp.c_proj.bias", BP_FCPROJ_B, 0},
    };
    long C = shape->channels;
    /* transformers' (rows, cols) of each block tensor: Conv1D weights are (in, out). */
    const long dims[BP_COUNT][2] = {
        [BP_LN1_W] = {C, 0}, [BP_LN1_B] = {C, 0}, [BP_QKV_W] = {C, 3 * C},
        [BP_QKV_B] = {3 * C, 0}, [BP_ATTPROJ_W] = {C, C}, [BP_ATTPROJ_B] = {C, 0},
        [BP_LN2_W] = {C, 0}, [BP_LN2_B] = {C, 0}, [BP_FC_W] = {C, 4 * C},
        [BP_FC_B] = {4 * C, 0}, [BP_FCPROJ_W] = {4 * C, C}, [BP_FCPROJ_B] = {C, 0},
    };
    int n = 4 + BP_COUNT * shape->layers;
    struct hf_gpt2_tensor *t = dm_alloc((size_t)n * sizeof *t);
    int k = 0;
    /* the used rows only: padding (model.vocab_pad) is dynmo's */
    t[k++] = (struct hf_gpt2_tensor){"wte.weight", -1, HF_PART_WTE, gpt_vocab_used(shape), C, 0};
    t[k++] = (struct hf_gpt2_tensor){"wpe.weight", -1, HF_PART_WPE, shape->max_seq, C, 0};
    for (int l = 0; l < shape->layers; l++)
        for (int b = 0; b < BP_COUNT; b++) {
            struct hf_gpt2_tensor *x = &t[k++];
            snprintf(x->name, sizeof x->name, "h.%d.%s", l, block[b].name);
            x->layer = l;
            x->part = block[b].part;
            x->rows = dims[block[b].part][0];
            x->cols = dims[block[b].part][1];
            x->transposed = block[b].transposed;
        }
    t[k++] = (struct hf_gpt2_tensor){"ln_f.weight", -1, HF_PART_LNF_W, C, 0, 0};
    t[k++] = (struct hf_gpt2_tensor){"ln_f.bias", -1, HF_PART_LNF_B, C, 0, 0};
    *out = t;
    return k;
}

size_t hf_gpt2_elements(const struct hf_gpt2_tensor *t)
{
    return (size_t)t->rows * (size_t)(t->cols ? t->cols : 1);
}

float *hf_gpt2_dynmo_floats(struct gpt *model, const struct hf_gpt2_tensor *t)
{
    switch (t->part) {
    case HF_PART_WTE: return model->wte;
    case HF_PART_WPE: return model->wpe;
    case HF_PART_LNF_W: return model->lnf_w;
    case HF_PART_LNF_B: return model->lnf_b;
    default: break;
    }
    struct block *blk = &model->blocks[t->layer - model->first_block];
    return blk->params + block_tensor_offset(model->shape.channels, t->part);
}

void hf_gpt2_copy(float *dst, const float *src, const struct hf_gpt2_tensor *t, int to_hf)
{
    if (!t->transposed) {
        memcpy(dst, src, hf_gpt2_elements(t) * sizeof(float));
        return;
    }
    /* transformers' (rows, cols) is dynmo's (cols, rows). */
    long R = t->rows, Cc = t->cols;
    for (long r = 0; r < R; r++)
        for (long c = 0; c < Cc; c++) {
            if (to_hf) dst[r * Cc + c] = src[c * R + r];
            else dst[c * R + r] = src[r * Cc + c];
        }
}
