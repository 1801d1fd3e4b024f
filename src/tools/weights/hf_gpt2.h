/* Hugging Face's GPT-2 (transformers' GPT2LMHeadModel) as dynmo's dense
 * GPT: which config.json dynmo can represent, and the tensors of one in
 * both layouts. Shared by import-hf and export-hf; neither file format
 * nor MPI is here, only the mapping. */
#ifndef DYNMO_TOOLS_HF_GPT2_H
#define DYNMO_TOOLS_HF_GPT2_H

#include <stddef.h>
#include "dynmo/model.h"

/* The name transformers gives a GPT2LMHeadModel's tensors start with;
 * a GPT2Model's (the hub's original gpt2 files) lack it. */
#define HF_GPT2_PREFIX "transformer."

/* Reads DIR/config.json into shape (dimensions, no extension). Every key
 * that would make the model compute something dynmo does not (another
 * model_type or activation, n_inner other than null or 4 n_embd, a
 * layer_norm_epsilon other than dynmo's 1e-5, an untied head, attention
 * scaled otherwise, cross-attention) and every missing or out-of-range
 * dimension is -1 with a message naming the file and the key in err. */
int hf_gpt2_read_config(const char *dir, struct gpt_shape *shape, char *err, size_t errsize);

/* config.json text for shape (a dm_alloc'd string the caller frees). */
char *hf_gpt2_config_text(const struct gpt_shape *shape);

/* One tensor of the model in transformers' layout: its name (without
 * HF_GPT2_PREFIX), its shape there (rows, cols; cols 0 for a vector), and
 * where its floats are in dynmo's model: layer (-1 for the embedding and
 * head), part (a BP_* index, or one of HF_PART_*), and whether the
 * transformers matrix is the transpose of dynmo's (its Conv1D layers keep
 * weights as (in, out), dynmo as (out, in)). */
enum { HF_PART_WTE = 100, HF_PART_WPE, HF_PART_LNF_W, HF_PART_LNF_B };
struct hf_gpt2_tensor {
    char name[64];
    int layer, part;
    long rows, cols;
    int transposed;
};
/* The model's tensors in transformers' order (wte, wpe, each block, ln_f);
 * returns the count (dm_alloc'd array in *out, the caller frees). */
int hf_gpt2_tensors(const struct gpt_shape *shape, struct hf_gpt2_tensor **out);
/* The floats of tensor t in a whole model (one rank holds everything),
 * in dynmo's layout. */
float *hf_gpt2_dynmo_floats(struct gpt *model, const struct hf_gpt2_tensor *t);
/* Elements of tensor t. */
size_t hf_gpt2_elements(const struct hf_gpt2_tensor *t);
/* Copies tensor t from transformers' layout (src) to dynmo's (dst), or
 * back when to_hf; a transposed one is transposed, others copied. */
void hf_gpt2_copy(float *dst, const float *src, const struct hf_gpt2_tensor *t, int to_hf);

#endif
