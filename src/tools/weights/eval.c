/* `dynmo eval --checkpoint CKPT.h5 --data PATH [--seq T] [--eot N]`: the
 * mean next-token cross-entropy of a checkpoint's model over a token
 * stream (any data.train accepts) cut into windows of T + 1 tokens, T
 * apart, from token 0: every whole window, each predicting its last T
 * tokens from those before. On P ranks each holds the whole model and
 * takes a contiguous share of the batches of windows; rank 0 gathers every window's
 * sum and adds them in window order, so the loss has the same bits on any
 * number of ranks. Each rank uses every core it may. It must not change
 * the checkpoint or write any file. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/ckpt.h"
#include "dynmo/core.h"
#include "dynmo/tools.h"
#include "dynmo/world.h"
#include "tools/weights/weights.h"

#define EVAL_USAGE "usage: dynmo eval --checkpoint CKPT.h5 --data PATH [--seq T] [--eot N]\n"
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

/* The per-token loss sums of `count` windows starting at window `first`
 * (one double each, into sums), computed together in acts. */
static void window_losses(struct gpt *model, struct gpt_acts *acts, const struct token_file *tf,
                          long first, int count, int T, int *window, double *sums)
{
    int *tokens, *targets;
    gpt_acts_inputs(acts, &tokens, &targets);
    for (int b = 0; b < count; b++) {
        token_file_read(tf, (uint64_t)(first + b) * (uint64_t)T, (size_t)T + 1, window);
        memcpy(tokens + (size_t)b * T, window, (size_t)T * sizeof(int));
        memcpy(targets + (size_t)b * T, window + 1, (size_t)T * sizeof(int));
    }
    gpt_acts_inputs_ready(acts);
    gpt_forward(model, acts);
    for (int b = 0; b < count; b++) {
        double sum = 0;
        for (long i = (long)b * T; i < (long)(b + 1) * T; i++) sum += acts->losses[i];
        sums[b] = sum;
    }
}

/* Window sums of windows [first, last), B at a time. */
static void share_losses(struct gpt *model, const struct token_file *tf, long first, long last,
                         int T, int B, double *sums)
{
    long n = last - first;
    if (n <= 0) return;
    if (B > n) B = (int)n;
    int *window = dm_alloc(((size_t)T + 1) * sizeof(int));
    struct gpt_acts acts, tail;
    gpt_acts_alloc(&acts, model, B, T);
    int rest = (int)(n % B);
    if (rest) gpt_acts_alloc(&tail, model, rest, T);
    long w = first;
    for (; w + B <= last; w += B) window_losses(model, &acts, tf, w, B, T, window, sums + w - first);
    if (rest) window_losses(model, &tail, tf, w, rest, T, window, sums + w - first);
    if (rest) gpt_acts_free(&tail);
    gpt_acts_free(&acts);
    dm_free(window);
}

/* Rank r's share of the windows: whole batches of B (the same batches on
 * any number of ranks, so each window is computed in the same company and
 * its sum has the same bits), contiguous, [*first, *last). */
static void share_of(long windows, int B, int P, int r, long *first, long *last)
{
    long batches = (windows + B - 1) / B;
    *first = batches * r / P * B;
    *last = batches * (r + 1) / P * B;
    if (*first > windows) *first = windows;
    if (*last > windows) *last = windows;
}

/* Rank 0: every rank's window sums in window order; the others send
 * theirs. */
static double *gather_sums(const double *mine, long windows, int B)
{
    int P = dm_world_size(), rank = dm_rank();
    int *counts = dm_alloc((size_t)P * sizeof(int)), *displs = dm_alloc((size_t)P * sizeof(int));
    for (int r = 0; r < P; r++) {
        long first, last;
        share_of(windows, B, P, r, &first, &last);
        displs[r] = (int)first;
        counts[r] = (int)(last - first);
    }
    double *all = rank == 0 ? dm_alloc((size_t)(windows ? windows : 1) * sizeof(double)) : NULL;
    MPI_Request req;
    MPI_Igatherv(mine, counts[rank], MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0,
                 MPI_COMM_WORLD, &req);
    world_wait(&req);
    dm_free(counts);
    dm_free(displs);
    return all;
}

int cmd_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *data = NULL;
    long T = 0, eot = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf(EVAL_USAGE "The mean next-token cross-entropy of the checkpoint's model over "
                   "the tokens of PATH\n(any form data.train takes) cut into windows of T + 1 "
                   "tokens, T apart, from token 0\n(T: model.max_seq unless given; --eot N: "
                   "the token between documents, as data.eot).\nPrints `loss: X` and the "
                   "tokens predicted. On P ranks (mpiexec -n P) each takes a share of the "
                   "windows; the same bits on any P.\n");
            return DM_EXIT_OK;
        } else if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc) {
            ckpt = argv[++i];
        } else if (!strcmp(argv[i], "--data") && i + 1 < argc) {
            data = argv[++i];
        } else if (!strcmp(argv[i], "--seq") && i + 1 < argc) {
            T = parse_count("--seq", argv[++i], 1, 65536);
        } else if (!strcmp(argv[i], "--eot") && i + 1 < argc) {
            eot = parse_count("--eot", argv[++i], 0, 1 << 20);
        } else {
            dm_user_error("eval: unexpected argument '%s'\n" EVAL_USAGE, argv[i]);
        }
    }
    if (!ckpt || !data) dm_user_error("eval: %s is required\n" EVAL_USAGE,
                                      ckpt ? "--data PATH" : "--checkpoint CKPT.h5");
    char err[4096], why[512];
    struct ckpt_meta meta;
    if (ckpt_read_info(ckpt, &meta, err, sizeof err)) dm_user_error("eval: %s", err);
    if (weights_not_dense(&meta, why, sizeof why))
        dm_user_error("eval: %s is not a dense GPT, which eval computes: %s", ckpt, why);
    if (!T) T = meta.shape.max_seq;
    if (T > meta.shape.max_seq)
        dm_user_error("eval: --seq %ld is beyond the model's %d positions (model.max_seq)", T,
                      meta.shape.max_seq);
    if (eot >= meta.shape.vocab)
        dm_user_error("eval: --eot %ld is not below the model's vocab %d", eot, meta.shape.vocab);

    world_init(&argc, &argv);
    struct token_file tf;
    token_file_open(&tf, data, (uint32_t)meta.shape.vocab, (int)eot, (uint64_t)T + 1);
    int threads = world_cpus_for_rank();
    dm_threads_init(threads);
    struct gpt model;
    weights_load_checkpoint(ckpt, &model, &meta);

    long windows = (long)((tf.count - 1) / (uint64_t)T);
    if (windows > INT_MAX)
        dm_user_error("eval: %s holds %ld windows of %ld + 1 tokens, more than eval counts; "
                      "give a larger --seq", data, windows, T);
    long per_window = 8L * T * meta.shape.vocab;
    int B = (int)(EVAL_BATCH_BYTES / per_window);
    if (B < 1) B = 1;
    if (B > 16) B = 16;
    if (B > windows) B = (int)(windows ? windows : 1);
    int P = dm_world_size(), rank = dm_rank();
    long first, last;
    share_of(windows, B, P, rank, &first, &last);
    double *mine = dm_alloc((size_t)(last > first ? last - first : 1) * sizeof(double));
    share_losses(&model, &tf, first, last, (int)T, B, mine);
    double *all = gather_sums(mine, windows, B), sum = 0;
    for (long w = 0; all && w < windows; w++) sum += all[w];
    long predicted = windows * T;
    if (rank == 0)
        printf("loss: %.7f\ntokens: %ld predicted in %ld windows of %ld + 1 (of %llu in %s), "
               "%d rank%s x %d threads\n", sum / (double)predicted, predicted, windows, T,
               (unsigned long long)tf.count, data, P, P == 1 ? "" : "s", threads);
    dm_free(mine);
    dm_free(all);
    gpt_free(&model);
    token_file_close(&tf);
    ckpt_meta_free(&meta);
    dm_threads_shutdown();
    world_finalize(DM_EXIT_OK);
    return DM_EXIT_OK;
}
