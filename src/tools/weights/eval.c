/* `dynmo eval --checkpoint CKPT.h5 --data PATH [--seq T] [--eot N] [--pp S]
 * [--layout SPEC]`: the mean next-token cross-entropy of a checkpoint's
 * model over a token stream (any data.train accepts) cut into windows of
 * T + 1 tokens, T apart, from token 0: every whole window, each
 * predicting its last T tokens from those before. The model runs forward
 * through the pipeline engine (engine_forward_samples) as training lays
 * it out: S stages, each rank building and loading only its blocks, and
 * P / S replicas taking contiguous shares of the batches of windows; the
 * blocks are whatever the checkpoint holds (dense, mixture of experts or
 * of depths, hash attention), computed by training's own forward. Rank 0
 * adds the windows' sums in window order, so the loss has the same bits
 * on any number of ranks and under any layout. Each rank uses every core
 * it may. It must not change the checkpoint or write any file but the
 * one --window-losses names. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dynmo/balance.h"
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/pipe.h"
#include "dynmo/tools.h"
#include "dynmo/world.h"
#include "tools/args.h"
#include "tools/train/train.h"
#include "tools/weights/weights.h"

#define EVAL_USAGE                                                                          \
    "usage: dynmo eval --checkpoint CKPT.h5 --data PATH [--seq T] [--eot N] [--pp S] "     \
    "[--layout SPEC]\n                  [--window-losses FILE]\n"
/* The logits and probabilities of a batch of windows stay under this. */
#define EVAL_BATCH_BYTES (1L << 30)

static long parse_count(const char *flag, const char *v, long lo, long hi)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi)
        dm_user_error("eval: %s '%s' is not an integer from %ld to %ld", flag, v, lo, hi);
    return x;
}

/* The windows a forward pass reads: sample w is tokens [wT, wT + T]. */
struct eval_windows {
    const struct token_file *tf;
    int T;
    int *window;   /* (T + 1) */
};

static void fill_windows(void *ctx, long first, int count, int *tokens, int *targets)
{
    struct eval_windows *ew = ctx;
    int T = ew->T;
    for (int b = 0; b < count; b++) {
        token_file_read(ew->tf, (uint64_t)(first + b) * (uint64_t)T, (size_t)T + 1, ew->window);
        memcpy(tokens + (size_t)b * T, ew->window, (size_t)T * sizeof(int));
        memcpy(targets + (size_t)b * T, ew->window + 1, (size_t)T * sizeof(int));
    }
}

/* The configuration the checkpoint was trained with (its stored text;
 * the model keys of its shape when it has none), as the engine of an
 * eval needs it: S stages x D replicas of every expert (parallel.ep = 1),
 * one micro-batch of B windows of T tokens per replica, on the CPU. */
static void eval_config(struct dm_config *cfg, const struct ckpt_meta *meta, const char *ckpt,
                        const char *data, int S, int D, int T, int B, const char *layout)
{
    char err[1200], name[1100];
    config_defaults(cfg);
    snprintf(name, sizeof name, "%s: its configuration", ckpt);
    if (meta->config_text) {
        if (config_parse_printed(cfg, meta->config_text, name, err, sizeof err))
            dm_user_error("eval: %s", err);
        /* the text lists every key, defaults too: none was the user's
         * choice here, which the checks of unused keys ask about */
        memset(cfg->key_set, 0, sizeof cfg->key_set);
    } else {
        const struct gpt_shape *s = &meta->shape;
        cfg->vocab = gpt_vocab_used(s);
        cfg->max_seq = s->max_seq;
        cfg->layers = s->layers;
        cfg->heads = s->heads;
        cfg->channels = s->channels;
    }
    cfg->pp = S;
    cfg->dp = D;
    cfg->ep = 1;
    cfg->seq = T;
    cfg->micro_batches = 1;
    cfg->batch = B * D;
    cfg->trace_from = 0;
    snprintf(cfg->schedule, sizeof cfg->schedule, "1f1b");   /* a forward pass: any schedule's */
    cfg->virtual_stages = 1;
    snprintf(cfg->device, sizeof cfg->device, "cpu");
    snprintf(cfg->precision, sizeof cfg->precision, "fp32");   /* the CPU's products */
    /* what only training reads, so that its checks hold whatever was stored */
    snprintf(cfg->train_path, sizeof cfg->train_path, "%s", data);
    if (!cfg->out_dir[0]) snprintf(cfg->out_dir, sizeof cfg->out_dir, ".");
    cfg->ckpt_every = 0;
    cfg->repack_enable = 0;
    snprintf(cfg->initial, sizeof cfg->initial, "%s", layout ? layout : "params");
    config_validate(cfg);
    dyn_config_validate(cfg);
}

/* Windows per batch: as many as keep a batch's logits and probabilities
 * within EVAL_BATCH_BYTES, at most 16; for blocks whose tokens compete
 * for room (mixture of experts with a capacity), a training micro-batch,
 * so that each window meets the capacity it was trained with. */
static int eval_batch(const struct ckpt_meta *meta, long T, long windows)
{
    struct dm_config trained;
    char err[1200];
    config_defaults(&trained);
    if (meta->config_text &&
        config_parse_printed(&trained, meta->config_text, "", err, sizeof err) == 0 &&
        dyn_batch_coupled(&trained))
        return trained.batch / (trained.dp * trained.micro_batches);
    long per_window = 8L * T * gpt_vocab_used(&meta->shape);
    long B = EVAL_BATCH_BYTES / per_window;
    if (B < 1) B = 1;
    if (B > 16) B = 16;
    if (B > windows) B = windows ? windows : 1;
    return (int)B;
}

/* Rank 0: each window's mean loss, one a line as %.17g (the double read
 * back exactly), at path: written to path.tmp, then renamed. */
static void write_window_losses(const char *path, const double *sums, long windows, long T)
{
    char tmp[4200], err[512];
    if (strlen(path) > 4000) dm_user_error("eval: --window-losses: the path is too long");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, sizeof err, "%s", dm_errno_text());
        dm_user_error("eval: --window-losses: cannot create %s: %s", tmp, err);
    }
    for (long w = 0; w < windows; w++) fprintf(f, "%.17g\n", sums[w] / (double)T);
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, sizeof err, "%s", dm_errno_text());
        unlink(tmp);
        dm_user_error("eval: --window-losses: cannot write %s: %s", path, err);
    }
}

/* Stages of the pipeline: --pp, else the checkpoint's parallel.pp when
 * the world is a whole number of its pipelines, else 1. */
static int eval_stages(long pp_arg, const struct ckpt_meta *meta, int P)
{
    int S = pp_arg ? (int)pp_arg : (meta->pp > 0 && P % meta->pp == 0 ? meta->pp : 1);
    if (S > meta->shape.layers)
        dm_user_error("eval: --pp %d exceeds the model's %d blocks: every stage needs a block",
                      S, meta->shape.layers);
    if (P % S != 0)
        dm_user_error("eval: --pp %d does not divide the %d ranks of the job (mpiexec -n): "
                      "the ranks are replicas of a pipeline of --pp stages", S, P);
    return S;
}

/* What --help prints. */
static void usage(FILE *out)
{
    fprintf(out, EVAL_USAGE "The mean next-token cross-entropy of the checkpoint's model over "
                 "the tokens of PATH\n(any form data.train takes) cut into windows of T + 1 "
                 "tokens, T apart, from token 0\n(T: model.max_seq unless given; --eot N: "
                 "the token between documents, as data.eot).\nPrints `loss: X` and the "
                 "tokens predicted. On P ranks (mpiexec -n P) the model is split over\n"
                 "--pp S stages (default: the checkpoint's parallel.pp when it divides P, "
                 "else 1; --layout SPEC as\nbalance.initial, default params) and P / S "
                 "replicas take shares of the windows; the same bits\nunder any P and "
                 "layout. --window-losses FILE: each window's mean loss, one a line.\n");
}

int cmd_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *data = NULL, *layout_spec = NULL, *window_losses = NULL;
    long T = 0, eot = -1, pp = 0;
    for (int i = 1; i < argc; i++) {
        tool_help(argv[i], usage);
        if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc) {
            ckpt = argv[++i];
        } else if (!strcmp(argv[i], "--data") && i + 1 < argc) {
            data = argv[++i];
        } else if (!strcmp(argv[i], "--seq") && i + 1 < argc) {
            T = parse_count("--seq", argv[++i], 1, 65536);
        } else if (!strcmp(argv[i], "--eot") && i + 1 < argc) {
            eot = parse_count("--eot", argv[++i], 0, 1 << 20);
        } else if (!strcmp(argv[i], "--pp") && i + 1 < argc) {
            pp = parse_count("--pp", argv[++i], 1, 4096);
        } else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
            layout_spec = argv[++i];
        } else if (!strcmp(argv[i], "--window-losses") && i + 1 < argc) {
            window_losses = argv[++i];
        } else {
            dm_user_error("eval: unexpected argument '%s'\n" EVAL_USAGE, argv[i]);
        }
    }
    if (!ckpt || !data) dm_user_error("eval: %s is required\n" EVAL_USAGE,
                                      ckpt ? "--data PATH" : "--checkpoint CKPT.h5");
    char err[4096], why[512];
    struct ckpt_meta meta;
    if (ckpt_read_info(ckpt, &meta, err, sizeof err)) dm_user_error("eval: %s", err);
    if (weights_not_evaluable(&meta, why, sizeof why))
        dm_user_error("eval: %s is not a model eval computes: %s", ckpt, why);
    if (!T) T = meta.shape.max_seq;
    if (T > meta.shape.max_seq)
        dm_user_error("eval: --seq %ld is beyond the model's %d positions (model.max_seq)", T,
                      meta.shape.max_seq);
    int vocab = gpt_vocab_used(&meta.shape);
    if (eot >= vocab) dm_user_error("eval: --eot %ld is not below the model's vocab %d", eot, vocab);

    world_init(&argc, &argv);
    int P = dm_world_size(), rank = dm_rank();
    int S = eval_stages(pp, &meta, P), D = P / S;
    struct token_file tf;
    token_file_open(&tf, data, (uint32_t)vocab, (int)eot, (uint64_t)T + 1);
    int threads = world_cpus_for_rank();
    dm_threads_init(threads);
    long windows = (long)((tf.count - 1) / (uint64_t)T);
    if (windows > INT_MAX)
        dm_user_error("eval: %s holds %ld windows of %ld + 1 tokens, more than eval counts; "
                      "give a larger --seq", data, windows, T);
    int B = eval_batch(&meta, T, windows);
    struct dm_config cfg;
    eval_config(&cfg, &meta, ckpt, data, S, D, (int)T, B, layout_spec);
    int *layout = dm_alloc((size_t)S * sizeof(int));
    train_initial_layout(layout, &cfg, S);
    struct engine *eng = engine_create(&cfg, layout, 1);
    struct ckpt_meta loaded;
    ckpt_load(ckpt, engine_model(eng), &loaded, MPI_COMM_WORLD);
    ckpt_meta_free(&loaded);
    /* the draws of the checkpoint's last step (hash attention's rotation):
     * what the validation pass after that step computed */
    engine_model(eng)->step = meta.step > 0 ? meta.step - 1 : 0;

    struct eval_windows ew = {.tf = &tf, .T = (int)T,
                              .window = dm_alloc(((size_t)T + 1) * sizeof(int))};
    double *sums = rank == 0 ? dm_alloc((size_t)(windows ? windows : 1) * sizeof(double)) : NULL;
    engine_forward_samples(eng, windows, fill_windows, &ew, sums);
    double sum = 0;
    for (long w = 0; sums && w < windows; w++) sum += sums[w];
    long predicted = windows * T;
    if (rank == 0 && window_losses) write_window_losses(window_losses, sums, windows, T);
    if (rank == 0) {
        char text[256];
        layout_format(text, sizeof text, engine_layout(eng), S);
        printf("loss: %.7f\ntokens: %ld predicted in %ld windows of %ld + 1 (of %llu in %s), "
               "%d rank%s x %d threads\npipeline: %d stage%s (blocks %s) x %d replica%s, "
               "%d window%s a batch\n", sum / (double)predicted, predicted, windows, T,
               (unsigned long long)tf.count, data, P, P == 1 ? "" : "s", threads, S,
               S == 1 ? "" : "s", text, D, D == 1 ? "" : "s", B, B == 1 ? "" : "s");
    }
    dm_free(sums);
    dm_free(ew.window);
    dm_free(layout);
    engine_destroy(eng);
    token_file_close(&tf);
    ckpt_meta_free(&meta);
    dm_threads_shutdown();
    world_finalize(DM_EXIT_OK);
    return DM_EXIT_OK;
}
