/* Configuration: INI files (read here, line by line) and "section.key=
 * value" overrides, both through one table of keys with types and ranges.
 * Later features add rows to the table; every message about a bad key
 * names the key and, for an unknown one, lists the valid keys of its
 * section. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"

enum key_type { KEY_INT, KEY_DOUBLE, KEY_U64, KEY_STRING };

struct config_key {
    const char *section, *name;
    enum key_type type;
    size_t offset;
    double min, max;     /* inclusive range for numbers */
    const char *help;
};

#define F(field) offsetof(struct dm_config, field)
static const struct config_key keys[] = {
    {"model", "vocab", KEY_INT, F(vocab), 2, 1 << 20, "tokens in the vocabulary"},
    {"model", "max_seq", KEY_INT, F(max_seq), 1, 1 << 16, "positions"},
    {"model", "layers", KEY_INT, F(layers), 1, 4096, "transformer blocks"},
    {"model", "heads", KEY_INT, F(heads), 1, 1024, "attention heads"},
    {"model", "channels", KEY_INT, F(channels), 1, 1 << 16, "model width"},
    {"model", "moe_every", KEY_INT, F(moe_every), 0, 4096,
     "mixture-of-experts blocks: 0 none, 1 every block, 2 every other block"},
    {"model", "experts", KEY_INT, F(experts), 1, 4096, "experts in an MoE block"},
    {"model", "top_k", KEY_INT, F(top_k), 1, 4096, "experts per token"},
    {"model", "expert_hidden", KEY_INT, F(expert_hidden), 0, 1 << 20,
     "hidden width of an expert (0: 4 x channels)"},
    {"model", "mod_every", KEY_INT, F(mod_every), 0, 4096,
     "mixture-of-depths blocks: 0 none, 1 every block, 2 every other block"},
    {"model", "mod_capacity", KEY_DOUBLE, F(mod_capacity), -1e9, 1e9,
     "fraction of a sequence's tokens a MoD block processes, in (0, 1]"},
    {"model", "attention", KEY_STRING, F(attention), 0, 16, "dense or hash"},
    {"model", "vocab_pad", KEY_INT, F(vocab_pad), 1, 65536,
     "the embedding's rows padded to a multiple of this (1: none)"},
    {"train", "batch", KEY_INT, F(batch), 1, 1 << 20, "sequences per step"},
    {"train", "seq", KEY_INT, F(seq), 1, 1 << 16, "tokens per sequence"},
    {"train", "micro_batches", KEY_INT, F(micro_batches), 1, 1 << 20, "micro-batches per step"},
    {"train", "steps", KEY_INT, F(steps), 0, 1e9, "optimizer steps"},
    {"train", "lr", KEY_DOUBLE, F(lr), 0, 10, "peak learning rate"},
    {"train", "min_lr_ratio", KEY_DOUBLE, F(min_lr_ratio), 0, 1, "cosine floor / lr"},
    {"train", "warmup", KEY_INT, F(warmup), 0, 1e9, "warm-up steps"},
    {"train", "weight_decay", KEY_DOUBLE, F(weight_decay), 0, 10, "AdamW weight decay"},
    {"train", "beta1", KEY_DOUBLE, F(beta1), 0, 0.999999, "Adam beta1"},
    {"train", "beta2", KEY_DOUBLE, F(beta2), 0, 0.999999999, "Adam beta2"},
    {"train", "eps", KEY_DOUBLE, F(eps), 1e-30, 1, "Adam epsilon"},
    {"train", "grad_clip", KEY_DOUBLE, F(grad_clip), 0, 1e9, "global norm clip (0 = off)"},
    {"train", "seed", KEY_U64, F(seed), 0, 0, "random seed"},
    {"train", "eval_every", KEY_INT, F(eval_every), 0, 1e9, "steps between validations (0 = off)"},
    {"train", "eval_batches", KEY_INT, F(eval_batches), 1, 1e6, "batches per validation"},
    {"train", "threads", KEY_INT, F(threads), 0, 64, "threads per rank (0 = auto)"},
    {"train", "device", KEY_STRING, F(device), 0, 16, "cpu or cuda"},
    {"train", "precision", KEY_STRING, F(precision), 0, 16,
     "operands of a device's matrix products: fp32, tf32 or bf16"},
    {"data", "train", KEY_STRING, F(train_path), 0, 1024,
     "training tokens: a file, a Megatron prefix, a list or a pattern"},
    {"data", "val", KEY_STRING, F(val_path), 0, 1024, "validation token file"},
    {"data", "eot", KEY_INT, F(eot), -1, (1 << 20) - 1,
     "end-of-text token between documents (-1: none), below model.vocab"},
    {"run", "out_dir", KEY_STRING, F(out_dir), 0, 1024, "output directory"},
    {"run", "log_every", KEY_INT, F(log_every), 1, 1e9, "steps between progress lines"},
    {"run", "trace_from", KEY_INT, F(trace_from), 0, 1e9,
     "first step whose instructions go to /trace/events (0: none)"},
    {"run", "trace_steps", KEY_INT, F(trace_steps), 1, 1000, "steps traced from trace_from"},
    {"parallel", "pp", KEY_INT, F(pp), 1, 4096, "pipeline stages"},
    {"parallel", "dp", KEY_INT, F(dp), 1, 4096, "data-parallel replicas"},
    {"parallel", "turns", KEY_INT, F(turns), 0, 1,
     "1: ranks that outnumber their CPUs compute one at a time per CPU"},
    {"parallel", "schedule", KEY_STRING, F(schedule), 0, 32,
     "1f1b, gpipe, zb (ZB-H1: weight gradients deferred) or interleaved (virtual stages)"},
    {"parallel", "virtual", KEY_INT, F(virtual_stages), 1, 64,
     "interleaved: model chunks per rank (Megatron's virtual stages)"},
    {"parallel", "ep", KEY_INT, F(ep), 1, 4096,
     "expert-parallel degree (divides parallel.dp and model.experts)"},
    {"balance", "initial", KEY_STRING, F(initial), 0, 1024, "uniform, params or explicit:n1,n2,..."},
    {"balance", "method", KEY_STRING, F(method), 0, 32, "balancer (none: static)"},
    {"balance", "every", KEY_INT, F(every), 1, 1e9, "steps between balancing decisions"},
    {"balance", "cost", KEY_STRING, F(cost), 0, 32, "time or params"},
    {"balance", "units", KEY_STRING, F(units), 0, 16,
     "units of placement: block, or sublayer (a block's attention and its MLP apart)"},
    {"balance", "min_gain", KEY_DOUBLE, F(min_gain), 0, 1e9, "required saving / migration cost"},
    {"balance", "min_improvement", KEY_DOUBLE, F(min_improvement), 0, 0.99,
     "required predicted speed-up of a re-layout (fraction)"},
    {"ckpt", "dir", KEY_STRING, F(ckpt_dir), 0, 1024, "checkpoint directory (empty: none)"},
    {"ckpt", "every", KEY_INT, F(ckpt_every), 0, 1e9, "steps between checkpoints (0: none)"},
    {"ckpt", "resume", KEY_STRING, F(resume), 0, 1024, "auto, none or a checkpoint file"},
    {"ckpt", "keep", KEY_INT, F(keep), 1, 1e6, "complete checkpoints kept"},
    {"ckpt", "allow_new_data", KEY_INT, F(allow_new_data), 0, 1,
     "1: resume on other training data than the checkpoint's"},
    {"dyn", "kind", KEY_STRING, F(dyn_kind), 0, 32, "dynamism scheme (none, freeze, early_exit, prune)"},
    {"dyn", "freeze_window", KEY_INT, F(freeze_window), 1, 1e6, "steps per gradient-norm window"},
    {"dyn", "freeze_threshold", KEY_DOUBLE, F(freeze_threshold), 0, 1e9, "relative gradient-norm change below which a block freezes"},
    {"dyn", "freeze_every", KEY_INT, F(freeze_every), 1, 1e9, "steps between freeze checks"},
    {"dyn", "freeze_per_check", KEY_INT, F(freeze_per_check), 1, 4096, "most blocks frozen at one check"},
    {"dyn", "freeze_max", KEY_INT, F(freeze_max), -1, 4096, "most blocks frozen (-1: all but the last)"},
    {"dyn", "exit_from", KEY_INT, F(exit_from), 0, 4096, "first block after which tokens may exit"},
    {"dyn", "exit_threshold", KEY_DOUBLE, F(exit_threshold), 0, 1, "confidence needed to exit"},
    {"dyn", "exit_confidence", KEY_STRING, F(exit_confidence), 0, 16, "softmax or saturation"},
    {"dyn", "exit_loss_weight", KEY_DOUBLE, F(exit_loss_weight), 0, 1e3, "weight of the exit heads' losses"},
    {"dyn", "exit_warmup", KEY_INT, F(exit_warmup), 0, 1e9, "steps before tokens may exit"},
    {"dyn", "prune_start", KEY_INT, F(prune_start), 0, 1e9, "first pruning step (0-based)"},
    {"dyn", "prune_every", KEY_INT, F(prune_every), 1, 1e9, "steps between pruning steps"},
    {"dyn", "prune_steps", KEY_INT, F(prune_steps), 1, 1e6, "pruning intervals n of the schedule"},
    {"dyn", "sparsity_initial", KEY_DOUBLE, F(sparsity_initial), 0, 1, "sparsity at prune_start"},
    {"dyn", "sparsity_final", KEY_DOUBLE, F(sparsity_final), 0, 1, "sparsity after the last pruning step"},
    {"dyn", "csr_sparsity", KEY_DOUBLE, F(csr_sparsity), 0, 2, "block sparsity from which its matrices use CSR (> 1: never)"},
    {"moe", "router", KEY_STRING, F(moe_router), 0, 16, "softmax or sigmoid"},
    {"moe", "capacity_factor", KEY_DOUBLE, F(capacity_factor), 0, 1000,
     "expert capacity factor (0: dropless; not negative)"},
    {"moe", "drop", KEY_STRING, F(moe_drop), 0, 16, "probs, position or slot"},
    {"moe", "aux_loss", KEY_DOUBLE, F(aux_loss), 0, 1000, "alpha of the load-balancing loss"},
    {"moe", "z_loss", KEY_DOUBLE, F(z_loss), 0, 1000, "beta of the router z-loss"},
    {"moe", "bias_rate", KEY_DOUBLE, F(bias_rate), 0, 1000,
     "gamma of the auxiliary-loss-free bias update (sigmoid router)"},
    {"moe", "placement", KEY_STRING, F(moe_placement), 0, 16,
     "static, balanced or random (a test aid): which expert-parallel rank holds which expert"},
    {"moe", "replicas_max", KEY_INT, F(replicas_max), -1e9, 1e9,
     "extra copies of hot experts per MoE block (0: none; replication is not done yet)"},
    {"mod", "routing", KEY_STRING, F(mod_routing), 0, 16,
     "topk (capacity x T per sequence) or causal (a trained predictor decides)"},
    {"mod", "predictor_hidden", KEY_INT, F(mod_predictor_hidden), -1e9, 1e9,
     "hidden width of the causal routing's MLP predictor, 1..65536"},
    {"hash", "buckets", KEY_INT, F(hash_buckets), -1e9, 1e9,
     "hash buckets per head: 1 (causal attention) or even"},
    {"repack", "enable", KEY_INT, F(repack_enable), 0, 1, "re-pack onto fewer ranks (0/1)"},
    {"repack", "every", KEY_INT, F(repack_every), 1, 1e9, "steps between re-pack decisions"},
    {"repack", "epsilon", KEY_DOUBLE, F(repack_epsilon), 0, 10, "allowed predicted slow-down"},
    {"repack", "min_ranks", KEY_INT, F(repack_min_ranks), 1, 1 << 20, "fewest ranks to re-pack to"},
};
#undef F
#define NKEYS (sizeof keys / sizeof keys[0])
_Static_assert(NKEYS <= CONFIG_MAX_KEYS, "struct dm_config.key_set has a flag per key");

void config_defaults(struct dm_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->vocab = 256;
    cfg->vocab_pad = 1;
    cfg->max_seq = 256;
    cfg->layers = 8;
    cfg->heads = 4;
    cfg->channels = 256;
    cfg->moe_every = 0;
    cfg->experts = 8;
    cfg->top_k = 2;
    cfg->expert_hidden = 0;
    cfg->mod_every = 0;
    cfg->mod_capacity = 0.125;
    snprintf(cfg->attention, sizeof cfg->attention, "dense");
    snprintf(cfg->mod_routing, sizeof cfg->mod_routing, "topk");
    cfg->mod_predictor_hidden = 32;
    cfg->hash_buckets = 8;
    cfg->batch = 8;
    cfg->seq = 256;
    cfg->micro_batches = 1;
    cfg->steps = 100;
    cfg->lr = 6e-4;
    cfg->min_lr_ratio = 0.1;
    cfg->warmup = 10;
    cfg->weight_decay = 0.1;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.95;
    cfg->eps = 1e-8;
    cfg->grad_clip = 1.0;
    cfg->seed = 1337;
    cfg->eval_every = 0;
    cfg->eval_batches = 4;
    cfg->threads = 0;
    snprintf(cfg->device, sizeof cfg->device, "cpu");
    snprintf(cfg->precision, sizeof cfg->precision, "fp32");
    snprintf(cfg->train_path, sizeof cfg->train_path, "data/kjv/train.bin");
    snprintf(cfg->val_path, sizeof cfg->val_path, "data/kjv/val.bin");
    cfg->eot = -1;
    snprintf(cfg->out_dir, sizeof cfg->out_dir, "runs/latest");
    cfg->log_every = 1;
    cfg->trace_steps = 1;
    cfg->pp = 1;
    cfg->dp = 1;
    cfg->turns = 1;
    cfg->ep = 1;
    cfg->virtual_stages = 1;
    snprintf(cfg->schedule, sizeof cfg->schedule, "1f1b");
    snprintf(cfg->initial, sizeof cfg->initial, "uniform");
    snprintf(cfg->method, sizeof cfg->method, "none");
    cfg->every = 10;
    snprintf(cfg->cost, sizeof cfg->cost, "time");
    snprintf(cfg->units, sizeof cfg->units, "block");
    cfg->min_gain = 1.0;
    cfg->min_improvement = 0.02;
    snprintf(cfg->resume, sizeof cfg->resume, "auto");
    snprintf(cfg->dyn_kind, sizeof cfg->dyn_kind, "none");
    cfg->freeze_window = 10;
    cfg->freeze_threshold = 0.05;
    cfg->freeze_every = 10;
    cfg->freeze_max = -1;
    cfg->freeze_per_check = 1;
    cfg->exit_from = 1;
    cfg->exit_threshold = 0.9;
    snprintf(cfg->exit_confidence, sizeof cfg->exit_confidence, "softmax");
    cfg->exit_loss_weight = 1.0;
    cfg->exit_warmup = 0;
    cfg->prune_start = 30;
    cfg->prune_every = 10;
    cfg->prune_steps = 4;
    cfg->sparsity_initial = 0.0;
    cfg->sparsity_final = 0.9;
    cfg->csr_sparsity = 0.9;
    cfg->keep = 2;
    snprintf(cfg->moe_router, sizeof cfg->moe_router, "softmax");
    cfg->capacity_factor = 0.0;
    snprintf(cfg->moe_drop, sizeof cfg->moe_drop, "probs");
    snprintf(cfg->moe_placement, sizeof cfg->moe_placement, "static");
    cfg->aux_loss = 0.01;
    cfg->z_loss = 0.001;
    cfg->bias_rate = 0.0;
    cfg->repack_every = 50;
    cfg->repack_epsilon = 0.05;
    cfg->repack_min_ranks = 1;
}

int config_was_set(const struct dm_config *cfg, const char *key)
{
    const char *dot = strchr(key, '.');
    DM_ASSERT(dot != NULL);
    size_t len = (size_t)(dot - key);
    int any = !strcmp(dot + 1, "*"), known = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        if (strlen(keys[i].section) != len || strncmp(keys[i].section, key, len) != 0) continue;
        if (!any && strcmp(keys[i].name, dot + 1) != 0) continue;
        known = 1;
        if (cfg->key_set[i]) return 1;
    }
    if (!known) DM_FATAL("config_was_set: no key %s", key);
    return 0;
}

enum dm_schedule config_schedule(const struct dm_config *cfg)
{
    if (strcmp(cfg->schedule, "gpipe") == 0) return DM_SCHEDULE_GPIPE;
    if (strcmp(cfg->schedule, "zb") == 0) return DM_SCHEDULE_ZB;
    if (strcmp(cfg->schedule, "interleaved") == 0) return DM_SCHEDULE_INTERLEAVED;
    return DM_SCHEDULE_1F1B;
}

static void list_section_keys(const char *section, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(keys[i].section, section) != 0) continue;
        used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s%s",
                                 used ? ", " : "", keys[i].name);
    }
}

/* The index in keys[] of the section's first key (the section's identity
 * below), or -1 for a section we do not know. */
static int section_index(const char *section)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].section, section) == 0) return (int)i;
    return -1;
}

static int key_index(const char *section, const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].section, section) == 0 && strcmp(keys[i].name, name) == 0)
            return (int)i;
    return -1;
}

static void list_sections(char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        if (i > 0 && strcmp(keys[i].section, keys[i - 1].section) == 0) continue;
        used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s%s",
                                 used ? ", " : "", keys[i].section);
    }
}

void dm_format_shortest(char *buf, size_t size, double x)
{
    char best[32], candidate[32];
    snprintf(best, sizeof best, "%.17g", x);
    for (int digits = 1; digits < 17; digits++) {
        snprintf(candidate, sizeof candidate, "%.*g", digits, x);
        if (strtod(candidate, NULL) == x && strlen(candidate) < strlen(best))
            memcpy(best, candidate, sizeof best);
    }
    snprintf(buf, size, "%s", best);
}

#define KEY_ERROR(...) do { snprintf(err, errsize, __VA_ARGS__); return -1; } while (0)
/* Parses value as key's type into field, within the key's range. Returns
 * 0, or -1 with a message naming the problem in err. */
static int set_value(const struct config_key *key, char *field, const char *section,
                     const char *name, const char *value, char *err, size_t errsize)
{
    char *end = NULL;
    errno = 0;
    switch (key->type) {
    case KEY_INT: {
        long v = strtol(value, &end, 10);
        if (end == value || *end)
            KEY_ERROR("%s.%s = '%s' is not an integer", section, name, value);
        if (errno == ERANGE || v < key->min || v > key->max)
            KEY_ERROR("%s.%s = %s is out of range [%.0f, %.0f] (%s)", section, name, value,
                      key->min, key->max, key->help);
        *(int *)field = (int)v;
        break;
    }
    case KEY_U64: {
        /* strtoull takes "-1" for 2^64 - 1: a sign makes it out of range. */
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end)
            KEY_ERROR("%s.%s = '%s' is not an integer", section, name, value);
        if (errno == ERANGE || (strchr(value, '-') && v != 0))
            KEY_ERROR("%s.%s = %s is out of range [0, %" PRIu64 "] (%s)", section, name,
                      value, UINT64_MAX, key->help);
        *(uint64_t *)field = (uint64_t)v;
        break;
    }
    case KEY_DOUBLE: {
        /* An overflow is infinite and out of range; an underflow is the
         * nearest representable value, checked against the range. */
        double v = strtod(value, &end);
        if (end == value || *end || isnan(v))
            KEY_ERROR("%s.%s = '%s' is not a number", section, name, value);
        if (v < key->min || v > key->max) {
            char low[32], high[32];
            dm_format_shortest(low, sizeof low, key->min);
            dm_format_shortest(high, sizeof high, key->max);
            KEY_ERROR("%s.%s = %s is out of range [%s, %s] (%s)", section, name, value, low,
                      high, key->help);
        }
        *(double *)field = v;
        break;
    }
    case KEY_STRING:
        if (strlen(value) >= (size_t)key->max)
            KEY_ERROR("%s.%s is longer than %d characters", section, name, (int)key->max - 1);
        snprintf(field, (size_t)key->max, "%s", value);
        break;
    }
    return 0;
}

/* Sets one key. Returns 0, or -1 with a message naming the problem in
 * err (the caller adds where it came from). */
static int set_key(struct dm_config *cfg, const char *section, const char *name,
                   const char *value, char *err, size_t errsize)
{
    char valid[1024];
    if (section_index(section) < 0) {
        list_sections(valid, sizeof valid);
        KEY_ERROR("unknown section [%s] (valid sections: %s)", section, valid);
    }
    int k = key_index(section, name);
    if (k < 0) {
        list_section_keys(section, valid, sizeof valid);
        KEY_ERROR("unknown key %s.%s (valid keys of [%s]: %s)", section,
                      name, section, valid);
    }
    const struct config_key *key = &keys[k];
    char *field = (char *)cfg + key->offset;
    cfg->key_set[k] = 1;
    return set_value(key, field, section, name, value, err, errsize);
}

/* ---- the INI file ---------------------------------------------------------
 * The syntax (docs/config.md, "Syntax"): one item per line, of any length;
 * blank lines and lines whose first non-blank character is ';' or '#' are
 * comments; ';' or '#' after a blank starts an inline comment; "[section]"
 * and "key = value" with blanks around names and values ignored, so an
 * indented line is an ordinary line (never the continuation of the one
 * above); every section and every key appears at most once per file. */

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* Drops the blanks (and a CR of a CRLF line end) around text, in place. */
static char *trim(char *text)
{
    while (is_blank(*text)) text++;
    size_t n = strlen(text);
    while (n > 0 && (is_blank(text[n - 1]) || text[n - 1] == '\r')) text[--n] = 0;
    return text;
}

/* Cuts text at the first ';' or '#' that follows a blank. */
static void cut_inline_comment(char *text)
{
    for (char *p = text + 1; *p; p++)
        if ((*p == ';' || *p == '#') && is_blank(p[-1])) {
            *p = 0;
            return;
        }
}

/* Where a file has put things so far, for the duplicate checks, and where
 * a problem goes. */
struct file_reader {
    const char *path;
    int section;              /* section_index of the open section; -1 before one */
    int section_line[NKEYS];  /* by section_index: the line of its header; 0: none yet */
    int key_line[NKEYS];      /* by key index: the line that set it; 0: not set */
    char *err;
    size_t errsize;
};

/* A problem on line `number`: "path:number: text" into the reader's err,
 * and the line's reader returns -1. */
#define LINE_ERROR(...)                                                      \
    do {                                                                     \
        char line_error_text[2048];                                          \
        snprintf(line_error_text, sizeof line_error_text, __VA_ARGS__);      \
        snprintf(rd->err, rd->errsize, "%s:%d: %s", rd->path, number,        \
                 line_error_text);                                           \
        return -1;                                                           \
    } while (0)

static int read_section_header(struct file_reader *rd, char *text, int number)
{
    char *close = strchr(text, ']');
    if (!close) LINE_ERROR("syntax error: '[' without ']' (expected [section])");
    char *rest = trim(close + 1);
    if (*rest)
        LINE_ERROR("syntax error: '%s' after ']' (only a comment may follow [section])", rest);
    *close = 0;
    char *name = trim(text + 1);
    int s = section_index(name);
    if (s < 0) {
        char valid[1024];
        list_sections(valid, sizeof valid);
        LINE_ERROR("unknown section [%s] (valid sections: %s)", name, valid);
    }
    if (rd->section_line[s])
        LINE_ERROR("duplicate section [%s]: also at %s:%d (give each section once, with "
                   "all its keys)", name, rd->path, rd->section_line[s]);
    rd->section_line[s] = number;
    rd->section = s;
    return 0;
}

static int read_line(struct dm_config *cfg, struct file_reader *rd, char *line, int number)
{
    char *text = trim(line);
    if (!*text || *text == ';' || *text == '#') return 0;
    cut_inline_comment(text);
    text = trim(text);
    if (*text == '[') return read_section_header(rd, text, number);
    char *eq = strchr(text, '=');
    if (!eq && is_blank(line[0]))
        LINE_ERROR("syntax error (expected [section] or key = value; an indented line "
                   "does not continue the one above)");
    if (!eq) LINE_ERROR("syntax error (expected [section] or key = value)");
    *eq = 0;
    char *name = trim(text), *value = trim(eq + 1);
    if (!*name) LINE_ERROR("syntax error: no key before '='");
    if (rd->section < 0)
        LINE_ERROR("key '%s' before any [section] (every key belongs to a section)", name);
    const char *section = keys[rd->section].section;
    int k = key_index(section, name);
    if (k >= 0 && rd->key_line[k])
        LINE_ERROR("duplicate key %s.%s: also set at %s:%d (set each key once; a "
                   "section.key=value override on the command line replaces it)",
                   section, name, rd->path, rd->key_line[k]);
    char err[2048];
    if (set_key(cfg, section, name, value, err, sizeof err) != 0) LINE_ERROR("%s", err);
    rd->key_line[k] = number;
    return 0;
}

int config_parse_text(struct dm_config *cfg, const char *text, size_t len, const char *name,
                      char *err, size_t errsize)
{
    /* One copy that the lines are cut out of in place; text stays the
     * caller's and is never read past len. */
    char *copy = malloc(len + 1);
    if (!copy) DM_FATAL("out of memory copying %zu bytes of config %s", len, name);
    if (len > 0) memcpy(copy, text, len);
    copy[len] = 0;
    struct file_reader rd = {.path = name, .section = -1, .err = err, .errsize = errsize};
    int status = 0, number = 0;
    for (size_t start = 0; start < len && status == 0;) {
        number++;
        char *line = copy + start;
        char *newline = memchr(line, '\n', len - start);
        size_t length = newline ? (size_t)(newline - line) : len - start;
        line[length] = 0;
        start += length + 1;
        if (memchr(line, 0, length)) {
            snprintf(err, errsize, "%s:%d: a NUL byte in the line (a config file is text)",
                     name, number);
            status = -1;
            break;
        }
        if (number == 1 && !strncmp(line, "\xef\xbb\xbf", 3)) line += 3;   /* UTF-8 BOM */
        status = read_line(cfg, &rd, line, number);
    }
    free(copy);
    return status;
}

#undef LINE_ERROR

void config_load_file(struct dm_config *cfg, const char *path)
{
    const char *kind;
    int fd = dm_open_regular(path, &kind);
    if (fd < 0 && kind)
        dm_user_error("config file %s is %s, not a regular file (--config names an INI file)",
                      path, kind);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
    if (!f) dm_user_error("cannot read config file %s: %s", path, dm_errno_text());
    size_t size = 0, capacity = 1 << 12;
    char *text = malloc(capacity);
    if (!text) DM_FATAL("out of memory reading config file %s", path);
    for (;;) {
        if (size == capacity) {
            char *grown = realloc(text, 2 * capacity);
            if (!grown) DM_FATAL("out of memory reading config file %s", path);
            text = grown;
            capacity *= 2;
        }
        size_t got = fread(text + size, 1, capacity - size, f);
        size += got;
        if (got == 0) break;
    }
    if (ferror(f)) dm_user_error("cannot read config file %s: %s", path, dm_errno_text());
    fclose(f);
    char err[4096];
    int status = config_parse_text(cfg, text, size, path, err, sizeof err);
    free(text);
    if (status != 0) dm_user_error("%s", err);
}

int config_set(struct dm_config *cfg, const char *section, const char *key, const char *value,
               char *err, size_t errsize)
{
    return set_key(cfg, section, key, value, err, errsize);
}

void config_apply_override(struct dm_config *cfg, const char *assignment)
{
    char *buf = strdup(assignment);
    if (!buf) DM_FATAL("out of memory copying an override");
    char *eq = strchr(buf, '=');
    char *dot = strchr(buf, '.');
    if (!eq || !dot || dot > eq || dot == buf || dot + 1 == eq)
        dm_user_error("override '%s' must look like section.key=value", assignment);
    *eq = 0;
    *dot = 0;
    char err[2048];
    if (set_key(cfg, buf, dot + 1, eq + 1, err, sizeof err) != 0)
        dm_user_error("override '%s': %s", assignment, err);
    free(buf);
}

/* train.precision: tensor-core operands exist on a device only. */
static void config_validate_precision(const struct dm_config *cfg)
{
    if (strcmp(cfg->precision, "fp32") != 0 && strcmp(cfg->precision, "tf32") != 0 &&
        strcmp(cfg->precision, "bf16") != 0)
        dm_user_error("train.precision = '%s' must be fp32, tf32 or bf16", cfg->precision);
    if (strcmp(cfg->precision, "fp32") != 0 && !strcmp(cfg->device, "cpu"))
        dm_user_error("train.precision = %s needs a device's tensor cores, but train.device = "
                      "cpu multiplies in fp32 only: set train.device = cuda (or emulate), or "
                      "train.precision = fp32", cfg->precision);
}

/* What an interleaved run needs (docs/pipeline.md): v >= 2 chunks per
 * rank on two or more stages, micro-batches a multiple of the stages
 * (Megatron's rule: the micro-batches go through the chunks in groups of
 * S), a chunk of equal size per rank unless the layout is explicit, and
 * none of what the interleaved engine does not run yet. */
static void config_validate_interleaved(const struct dm_config *cfg)
{
    int v = cfg->virtual_stages, S = cfg->pp;
    if (strcmp(cfg->schedule, "interleaved") != 0) {
        if (v != 1)
            dm_user_error("parallel.virtual = %d needs parallel.schedule = interleaved "
                          "(parallel.schedule = %s runs one chunk per rank)", v, cfg->schedule);
        return;
    }
    if (v < 2)
        dm_user_error("parallel.schedule = interleaved needs parallel.virtual >= 2 (model "
                      "chunks per rank); parallel.virtual = 1 is 1f1b");
    if (S < 2)
        dm_user_error("parallel.schedule = interleaved needs parallel.pp >= 2: one stage has "
                      "no pipeline to interleave");
    if (cfg->micro_batches % S != 0)
        dm_user_error("train.micro_batches = %d is not a multiple of parallel.pp = %d: "
                      "interleaved runs the micro-batches through the chunks in groups of "
                      "the stage count", cfg->micro_batches, S);
    if (S * v > cfg->layers)
        dm_user_error("parallel.pp x parallel.virtual = %d x %d exceeds model.layers = %d: "
                      "every chunk needs a block", S, v, cfg->layers);
    if (strncmp(cfg->initial, "explicit", 8) != 0 && cfg->layers % (S * v) != 0)
        dm_user_error("parallel.virtual = %d does not divide the blocks of a rank (model.layers "
                      "= %d over parallel.pp = %d): give each rank a multiple of %d blocks, "
                      "or balance.initial = explicit:n1,...,n%d (pp x virtual chunk sizes)",
                      v, cfg->layers, S, v, S * v);
    const char *refused =
        strcmp(cfg->units, "block") != 0       ? "balance.units = sublayer"
        : strcmp(cfg->device, "cpu") != 0      ? "train.device other than cpu"
        : cfg->repack_enable                   ? "repack.enable"
                                               : NULL;
    if (refused)
        dm_user_error("parallel.schedule = interleaved does not run with %s yet: use "
                      "parallel.schedule = 1f1b, gpipe or zb for it", refused);
}

void config_validate(const struct dm_config *cfg)
{
    long padded = ((long)cfg->vocab + cfg->vocab_pad - 1) / cfg->vocab_pad * cfg->vocab_pad;
    if (padded > 1L << 20)
        dm_user_error("model.vocab = %d padded to a multiple of model.vocab_pad = %d is %ld "
                      "rows, more than 2^20: choose a smaller model.vocab_pad", cfg->vocab,
                      cfg->vocab_pad, padded);
    if (cfg->channels % cfg->heads != 0)
        dm_user_error("model.heads = %d does not divide model.channels = %d", cfg->heads,
                      cfg->channels);
    if (cfg->seq > cfg->max_seq)
        dm_user_error("train.seq = %d exceeds model.max_seq = %d", cfg->seq, cfg->max_seq);
    if (cfg->batch % cfg->micro_batches != 0)
        dm_user_error("train.micro_batches = %d does not divide train.batch = %d",
                      cfg->micro_batches, cfg->batch);
    if (cfg->warmup > cfg->steps && cfg->steps > 0)
        dm_user_error("train.warmup = %d exceeds train.steps = %d", cfg->warmup, cfg->steps);
    if (strcmp(cfg->schedule, "1f1b") != 0 && strcmp(cfg->schedule, "gpipe") != 0 &&
        strcmp(cfg->schedule, "zb") != 0 && strcmp(cfg->schedule, "interleaved") != 0)
        dm_user_error("parallel.schedule = '%s' must be 1f1b, gpipe, zb or interleaved",
                      cfg->schedule);
    config_validate_interleaved(cfg);
    if (strcmp(cfg->device, "cpu") != 0 && strcmp(cfg->device, "cuda") != 0 &&
        strcmp(cfg->device, "emulate") != 0)
        dm_user_error("train.device = '%s' must be cpu, cuda or emulate", cfg->device);
    config_validate_precision(cfg);
    if (strcmp(cfg->cost, "time") != 0 && strcmp(cfg->cost, "params") != 0)
        dm_user_error("balance.cost = '%s' must be time or params", cfg->cost);
    if (strcmp(cfg->units, "block") != 0 && strcmp(cfg->units, "sublayer") != 0)
        dm_user_error("balance.units = '%s' must be block or sublayer", cfg->units);
    int sublayer = !strcmp(cfg->units, "sublayer");
    if (!sublayer && cfg->pp > cfg->layers)
        dm_user_error("parallel.pp = %d exceeds model.layers = %d: every stage needs a block",
                      cfg->pp, cfg->layers);
    if (sublayer && cfg->pp > 2 * cfg->layers)
        dm_user_error("parallel.pp = %d exceeds the %d units of model.layers = %d with "
                      "balance.units = sublayer: every stage needs a unit", cfg->pp,
                      2 * cfg->layers, cfg->layers);
    if (cfg->batch % (cfg->dp * cfg->micro_batches) != 0)
        dm_user_error("parallel.dp x train.micro_batches = %d x %d does not divide "
                      "train.batch = %d", cfg->dp, cfg->micro_batches, cfg->batch);
    if ((cfg->ckpt_every > 0 || cfg->repack_enable) && !cfg->ckpt_dir[0])
        dm_user_error("%s needs ckpt.dir: name a checkpoint directory",
                      cfg->repack_enable ? "repack.enable = 1" : "ckpt.every > 0");
    if (!cfg->train_path[0]) dm_user_error("data.train is empty: name a token file");
    if (cfg->eot >= cfg->vocab)
        dm_user_error("data.eot = %d is not below model.vocab = %d: the end-of-text token "
                      "must be a token of the model", cfg->eot, cfg->vocab);
    if (!cfg->out_dir[0]) dm_user_error("run.out_dir is empty: name an output directory");
}

/* Key i's value in cfg as config_print writes it. */
static void format_value(const struct dm_config *cfg, size_t i, char *value, size_t size)
{
    const char *field = (const char *)cfg + keys[i].offset;
    switch (keys[i].type) {
    case KEY_INT: snprintf(value, size, "%d", *(const int *)field); break;
    case KEY_U64: snprintf(value, size, "%" PRIu64, *(const uint64_t *)field); break;
    case KEY_DOUBLE: snprintf(value, size, "%.17g", *(const double *)field); break;
    case KEY_STRING: snprintf(value, size, "%s", field); break;
    }
}

int config_parse_printed(struct dm_config *cfg, const char *text, const char *name, char *err,
                         size_t errsize)
{
    char *copy = dm_alloc(strlen(text) + 1), problem[768];
    strcpy(copy, text);
    int number = 0, status = 0;
    for (char *line = copy, *next; line && *line && status == 0; line = next) {
        number++;
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (line[strspn(line, " \t\r")] == '\0') continue;
        char *dot = strchr(line, '.'), *eq = strstr(line, " = ");
        if (!dot || !eq || dot > eq) {
            dm_set_message(err, errsize, "line %d of %s is not \"section.key = value\"",
                           number, name);
            status = -1;
            break;
        }
        *dot = '\0';
        *eq = '\0';
        if (config_set(cfg, line, dot + 1, eq + 3, problem, sizeof problem) != 0) {
            dm_set_message(err, errsize, "%s: %s", name, problem);
            status = -1;
        }
    }
    dm_free(copy);
    return status;
}

void config_print(const struct dm_config *cfg, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        char value[1100];
        format_value(cfg, i, value, sizeof value);
        used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s.%s = %s\n",
                                 keys[i].section, keys[i].name, value);
    }
}

int config_value_text(const struct dm_config *cfg, const char *key, char *out, size_t size)
{
    out[0] = '\0';
    if (!config_was_set(cfg, key)) return 0;
    const char *dot = strchr(key, '.');
    char section[64];
    snprintf(section, sizeof section, "%.*s", (int)(dot - key), key);
    format_value(cfg, (size_t)key_index(section, dot + 1), out, size);
    return 1;
}
