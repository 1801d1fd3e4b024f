/* Checks dynmo's early exit and layer freezing against an independent
 * PyTorch reference written from the CALM paper and docs/dynamism.md.
 *
 * tests/reference/make_exit_fixture.py writes three "DMREF004" fixtures of a
 * tiny GPT (vocab 256, 4 layers, 32 channels; format in that script and in
 * tests/reference/README.md), found beside fixture_tiny.bin:
 *
 * - fixture_exit_softmax.bin, fixture_exit_saturation.bin: early exit with
 *   each confidence dynmo offers, run through the early_exit scheme
 *   (dyn_create, dyn_before_step on one stage) as dynmo train runs it. One
 *   forward and backward of the initial model with exits allowed: the exit
 *   layer of every token (equal), each token's confidence at every block
 *   where tokens may leave (recomputed from dynmo's residual stream with the
 *   backend's confidence ops, 1e-5 absolute), the final logits with the
 *   exited tokens' copied states (1e-4 absolute), the final loss and the
 *   weighted exit losses (1e-5 relative), every gradient (1e-4 absolute).
 *   CALM's per-layer weights: forced exit patterns isolate each exit head's
 *   term lambda w_l L_l of the loss, and w_l derived from it against the
 *   reference's L_l must be CALM's (1e-5 relative). Then eight AdamW steps:
 *   the final loss and the whole loss before each update (1e-5 relative)
 *   and every token's exit layer in each step (equal).
 * - fixture_freeze.bin: eight AdamW steps with blocks frozen from chosen
 *   steps on, set at the step boundary as the freeze scheme's before_step
 *   does (flag, prefix, the block's gradients zeroed): the losses (1e-5
 *   relative), the last step's gradients (1e-4 absolute; exactly zero for
 *   frozen blocks and, under a frozen prefix, wpe), the parameters and
 *   AdamW moments after the last update against torch's (stated below),
 *   and each frozen block's parameters and moments the same bits as when
 *   it froze.
 *
 * It prints the largest difference of every comparison. It never needs
 * torch. The fixtures are found under tests/reference/ of the current
 * directory or of any directory above this executable, or in
 * $DYNMO_EXIT_FIXTURES (a directory); tests/fixture.h reads them. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#include "dynmo/backend.h"
#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "fixture.h"
#include "testing.h"

static const char *const fixtures[] = {
    "fixture_exit_softmax.bin", "fixture_exit_saturation.bin", "fixture_freeze.bin",
};

static const double logits_tolerance = 1e-4;       /* absolute */
static const double grad_tolerance = 1e-4;         /* absolute */
static const double loss_tolerance = 1e-5;         /* relative */
static const double confidence_tolerance = 1e-5;   /* absolute (a probability or a cosine) */
static const double weight_tolerance = 1e-5;       /* relative */
/* After eight AdamW steps at lr <= 1e-3, a tenth of one step: where a
 * gradient is not much larger than its float32 rounding, AdamW's
 * normalised step differs by a share of lr (measured: 9.9e-6 at most, in
 * a key weight); the key biases, whose gradient is rounding alone, have
 * their own bound (check_params). */
static const double param_tolerance = 1e-4;        /* absolute */
static const double moment_tolerance = 1e-4;       /* relative to the largest of the tensor */

static double relative_diff(double got, double want)
{
    return fabs(got - want) / fabs(want);
}

/* One optimizer step as the engine's optimizer_step does it: clipping by
 * the global norm (torch's clip_grad_norm_), AdamW. */
static void optimizer_step(struct gpt *model, const struct dm_config *cfg, int step)
{
    gpt_tie_wte_grads(model, NULL);   /* one rank holds both ends of wte */
    double norm = sqrt(gpt_grad_sumsq(model));
    float scale = norm > cfg->grad_clip ? (float)(cfg->grad_clip / (norm + 1e-6)) : 1.0f;
    gpt_adamw_update(model, lr_at_step(cfg, step), cfg->beta1, cfg->beta2, cfg->eps,
                     cfg->weight_decay, scale, step + 1);
}

/* Compares every gradient tensor with the reference's; returns the worst. */
static double check_grads(const float *grads, const float *want,
                          const struct named_tensor *tensors, int num_tensors)
{
    double worst = 0.0;
    for (int i = 0; i < num_tensors; i++) {
        const struct named_tensor *t = &tensors[i];
        size_t where;
        double diff = max_abs_diff(grads + t->offset, want + t->offset, t->size, &where);
        CHECK_MSG(diff <= grad_tolerance, "gradient %s differs by %.3g at %zu (dynmo %.7g, "
                  "torch %.7g)", t->name, diff, where, grads[t->offset + where],
                  want[t->offset + where]);
        if (diff > worst) worst = diff;
    }
    return worst;
}

/* ---- early exit ---------------------------------------------------------------------- */

/* Each token's confidence at block `layer` (global, 0-based), recomputed
 * from dynmo's residual stream with the backend's ops: the shared head's
 * probabilities of the block's output (softmax), or the cosine of the
 * block's input and output (saturation). conf: (N). */
static void confidences_at(float *conf, const struct gpt *model, const struct gpt_acts *acts,
                           int layer, int measure)
{
    const struct dm_backend *ops = backend_current();
    int N = acts->B * acts->T, C = model->shape.channels, V = model->shape.vocab;
    size_t BTC = (size_t)N * C;
    const float *in = acts->residual + (size_t)layer * BTC, *out = in + BTC;
    if (measure == GPT_EXIT_SATURATION) {
        int *rows = malloc((size_t)N * sizeof(int));
        for (int n = 0; n < N; n++) rows[n] = n;
        ops->exit_saturation_confidence(conf, in, out, rows, N, C);
        free(rows);
        return;
    }
    float *normed = malloc(BTC * sizeof(float)), *mean = malloc((size_t)N * sizeof(float));
    float *rstd = malloc((size_t)N * sizeof(float)), *losses = malloc((size_t)N * sizeof(float));
    float *logits = malloc((size_t)N * V * sizeof(float));
    float *probs = malloc((size_t)N * V * sizeof(float));
    ops->layernorm_forward(normed, mean, rstd, out, model->lnf_w, model->lnf_b, N, C);
    ops->matmul_forward(logits, normed, model->wte, NULL, N, C, V);
    ops->crossentropy_forward(losses, probs, logits, acts->targets, N, V);
    ops->exit_softmax_confidence(conf, probs, N, V);
    free(normed);
    free(mean);
    free(rstd);
    free(losses);
    free(logits);
    free(probs);
}

/* The forward's loss with every token forced to leave after block `after`
 * (layers: none leaves); the weighted exit losses go to *exit_loss. */
static float forced_forward(struct gpt *model, struct gpt_acts *acts, int *forced, int after,
                            double *exit_loss)
{
    int N = acts->B * acts->T;
    for (int n = 0; n < N; n++) forced[n] = after;
    model->exit->forced = forced;
    model->exit->exit_loss_sum = 0.0;
    float loss = gpt_forward(model, acts);
    *exit_loss = model->exit->exit_loss_sum;
    model->exit->forced = NULL;
    return loss;
}

static void run_exit(const struct fixture *fx, const struct dm_config *cfg, struct gpt *model,
                     struct gpt_acts *acts, struct block_scratch *scratch,
                     const struct named_tensor *tensors, int num_tensors, const float *params)
{
    const int L = fx->layers, N = fx->batch * fx->seq, V = fx->vocab, from = fx->exit_from;
    const size_t P = tensors[num_tensors - 1].offset + tensors[num_tensors - 1].size;
    const double lambda = fx->exit_loss_weight;
    printf("  early exit: %s confidence, threshold %.9g, from block %d, lambda %g, exits "
           "from step %d\n", fx->exit_confidence ? "saturation" : "softmax", fx->exit_threshold,
           from, lambda, fx->exit_warmup);
    float *ref_logits = fixture_take(fx, "logits", DTYPE_FLOAT32, (long)N * V);
    float *ref_loss = fixture_take(fx, "loss", DTYPE_FLOAT32, 1);
    float *ref_exit_loss = fixture_take(fx, "exit_loss", DTYPE_FLOAT32, 1);
    float *ref_grads = fixture_take(fx, "grads", DTYPE_FLOAT32, (long)P);
    int *ref_exit_layer = fixture_take(fx, "exit_layer", DTYPE_INT32, N);
    float *ref_confidence = fixture_take(fx, "confidence", DTYPE_FLOAT32, (long)L * N);
    float *ref_layer_losses = fixture_take(fx, "layer_losses", DTYPE_FLOAT32, L);
    double *ref_weights = fixture_take(fx, "exit_weights", DTYPE_FLOAT64, L);
    double *ref_lrs = fixture_take(fx, "lrs", DTYPE_FLOAT64, fx->steps);
    float *ref_train_losses = fixture_take(fx, "train_losses", DTYPE_FLOAT32, fx->steps);
    float *ref_train_totals = fixture_take(fx, "train_totals", DTYPE_FLOAT32, fx->steps);
    int *ref_train_exits = fixture_take(fx, "train_exits", DTYPE_INT32, (long)fx->steps * N);
    if (!ref_logits || !ref_loss || !ref_exit_loss || !ref_grads || !ref_exit_layer ||
        !ref_confidence || !ref_layer_losses || !ref_weights || !ref_lrs ||
        !ref_train_losses || !ref_train_totals || !ref_train_exits)
        goto done;

    /* The scheme as dynmo train runs it on one stage. */
    struct dyn_env env = {.pipeline_comm = MPI_COMM_SELF, .stage = 0, .stages = 1};
    struct dyn *dyn = dyn_create(cfg, &env);

    /* One forward and backward of the initial model, exits allowed. */
    dyn_before_step(dyn, &model, 1, fx->exit_warmup);
    gpt_zero_grads(model);
    float loss = gpt_forward(model, acts);
    double exit_loss = model->exit->exit_loss_sum;
    const int *exit_layer = gpt_exit_layers(model, acts);
    int differ = 0, left = 0;
    for (int n = 0; n < N; n++) {
        differ += exit_layer[n] != ref_exit_layer[n];
        left += ref_exit_layer[n] < L;
    }
    printf("exit layers: %d of %d tokens differ from torch's (%d leave early)\n", differ, N,
           left);
    CHECK_MSG(differ == 0, "%d exit layers differ", differ);

    float *conf = malloc((size_t)N * sizeof(float));
    double worst_conf = 0.0;
    for (int l = from; l < L - 1; l++) {
        confidences_at(conf, model, acts, l, fx->exit_confidence);
        size_t where;
        double diff = max_abs_diff(conf, ref_confidence + (size_t)l * N, (size_t)N, &where);
        printf("confidence after block %d: max |diff| %.3g (dynmo %.7g, torch %.7g)\n", l, diff,
               conf[where], ref_confidence[(size_t)l * N + where]);
        CHECK_MSG(diff <= confidence_tolerance, "confidences after block %d differ by %.3g",
                  l, diff);
        if (diff > worst_conf) worst_conf = diff;
    }
    free(conf);

    size_t where;
    double logits_diff = max_abs_diff(acts->logits, ref_logits, (size_t)N * V, &where);
    printf("logits: max |diff| %.3g (dynmo %.7g, torch %.7g)\n", logits_diff,
           acts->logits[where], ref_logits[where]);
    CHECK_MSG(logits_diff <= logits_tolerance, "logits differ by %.3g", logits_diff);
    printf("loss: dynmo %.7f torch %.7f; weighted exit losses: dynmo %.7f torch %.7f\n", loss,
           ref_loss[0], exit_loss, ref_exit_loss[0]);
    CHECK_NEAR(loss, ref_loss[0], loss_tolerance * fabs(ref_loss[0]));
    CHECK_NEAR(exit_loss, ref_exit_loss[0], loss_tolerance * fabs(ref_exit_loss[0]));

    gpt_backward(model, acts, scratch, 1.0f, NULL, NULL);
    gpt_tie_wte_grads(model, NULL);
    float *flat = malloc(P * sizeof(float));
    gpt_grads_to_flat(model, flat);
    double worst_grad = check_grads(flat, ref_grads, tensors, num_tensors);
    printf("grads: worst max |diff| %.3g over %d tensors\n", worst_grad, num_tensors);

    /* CALM's weights: with every token leaving after block k, the heads
     * up to k see every token, so the exit losses grow by lambda w_k L_k
     * from k - 1 to k, L_k being CALM's loss of head k over every token. */
    int *forced = malloc((size_t)N * sizeof(int));
    double all = 0.0, want_all = 0.0, previous = 0.0, worst_weight = 0.0;
    float final_loss = forced_forward(model, acts, forced, L, &all);
    for (int l = from; l < L - 1; l++) want_all += lambda * ref_weights[l] * ref_layer_losses[l];
    printf("no exits: final loss dynmo %.7f torch %.7f; weighted exit losses dynmo %.7f "
           "torch %.7f\n", final_loss, ref_layer_losses[L - 1], all, want_all);
    CHECK_NEAR(final_loss, ref_layer_losses[L - 1], loss_tolerance * ref_layer_losses[L - 1]);
    CHECK_NEAR(all, want_all, loss_tolerance * want_all);
    for (int k = from; k < L - 1; k++) {
        double upto;
        forced_forward(model, acts, forced, k, &upto);
        double weight = (upto - previous) / (lambda * ref_layer_losses[k]);
        double rel = relative_diff(weight, ref_weights[k]);
        printf("exit head after block %d: CALM weight dynmo %.7f torch %.7f (L_%d %.7f)\n", k,
               weight, ref_weights[k], k, ref_layer_losses[k]);
        CHECK_MSG(rel <= weight_tolerance, "the weight of exit head %d differs by %.3g "
                  "(relative)", k, rel);
        if (rel > worst_weight) worst_weight = rel;
        previous = upto;
    }
    printf("the final loss: weight 1 in dynmo's loss (docs/dynamism.md), CALM's w_%d %.7f\n",
           L - 1, ref_weights[L - 1]);
    free(forced);

    /* Training from the initial model. */
    for (int step = 0; step < fx->steps; step++)
        CHECK_NEAR(lr_at_step(cfg, step), ref_lrs[step], 1e-12 * fx->lr);
    gpt_params_from_flat(model, params);
    double worst_loss = 0.0;
    int worst_exits = 0;
    for (int step = 0; step < fx->steps; step++) {
        dyn_before_step(dyn, &model, 1, step);
        gpt_zero_grads(model);
        float step_loss = gpt_forward(model, acts);
        double total = step_loss + model->exit->exit_loss_sum;
        const int *exits = gpt_exit_layers(model, acts);
        int step_differ = 0, step_left = 0;
        for (int n = 0; n < N; n++) {
            step_differ += exits[n] != ref_train_exits[(size_t)step * N + n];
            step_left += exits[n] < L;
        }
        gpt_backward(model, acts, scratch, 1.0f, NULL, NULL);
        optimizer_step(model, cfg, step);
        double rel = relative_diff(step_loss, ref_train_losses[step]);
        double rel_total = relative_diff(total, ref_train_totals[step]);
        printf("step %d: loss dynmo %.7f torch %.7f (%.3g); with exit losses dynmo %.7f torch "
               "%.7f (%.3g); %d left early, %d exit layers differ\n", step, step_loss,
               ref_train_losses[step], rel, total, ref_train_totals[step], rel_total, step_left,
               step_differ);
        CHECK_MSG(rel <= loss_tolerance, "step %d's loss differs by %.3g", step, rel);
        CHECK_MSG(rel_total <= loss_tolerance, "step %d's whole loss differs by %.3g", step,
                  rel_total);
        CHECK_MSG(step_differ == 0, "step %d: %d exit layers differ", step, step_differ);
        worst_loss = fmax(worst_loss, fmax(rel, rel_total));
        if (step_differ > worst_exits) worst_exits = step_differ;
    }
    printf("early exit: largest differences: confidence %.3g, logits %.3g, gradient %.3g, "
           "CALM weight %.3g (relative), training loss %.3g (relative); exit layers differing "
           "%d\n", worst_conf, logits_diff, worst_grad, worst_weight, worst_loss,
           differ > worst_exits ? differ : worst_exits);
    model->exit = NULL;
    dyn_destroy(dyn);
    free(flat);
done:
    free(ref_logits);
    free(ref_loss);
    free(ref_exit_loss);
    free(ref_grads);
    free(ref_exit_layer);
    free(ref_confidence);
    free(ref_layer_losses);
    free(ref_weights);
    free(ref_lrs);
    free(ref_train_losses);
    free(ref_train_totals);
    free(ref_train_exits);
}

/* ---- freezing ------------------------------------------------------------------------ */

/* The model's AdamW moments (which 0: m, 1: v) in the canonical flat
 * order (the CPU backend's memory; one rank holds everything). */
static void moments_to_flat(const struct gpt *model, float *flat, int which)
{
    size_t C = (size_t)model->shape.channels;
    size_t embed = (size_t)(model->shape.vocab + model->shape.max_seq) * C;
    const float *moments = which ? model->embed_v : model->embed_m;   /* wte wpe lnf_w lnf_b */
    memcpy(flat, moments, embed * sizeof(float));
    float *pos = flat + embed;
    for (int i = 0; i < model->num_blocks; i++) {
        const struct block *blk = &model->blocks[i];
        memcpy(pos, which ? blk->v : blk->m, blk->nparams * sizeof(float));
        pos += blk->nparams;
    }
    memcpy(pos, moments + embed, 2 * C * sizeof(float));
}

/* The AdamW moments: each tensor's largest difference relative to its
 * largest reference magnitude must be within moment_tolerance; returns
 * the worst. */
static double check_moments(const char *what, const float *got, const float *want,
                            const struct named_tensor *tensors, int num_tensors)
{
    double worst = 0.0;
    for (int i = 0; i < num_tensors; i++) {
        const struct named_tensor *t = &tensors[i];
        double scale = 0.0;
        for (size_t k = 0; k < t->size; k++) scale = fmax(scale, fabs(want[t->offset + k]));
        size_t where;
        double diff = max_abs_diff(got + t->offset, want + t->offset, t->size, &where);
        double relative = scale > 0.0 ? diff / scale : diff;
        CHECK_MSG(relative <= moment_tolerance, "%s of %s differs by %.3g at %zu (dynmo %.7g, "
                  "torch %.7g; largest %.3g)", what, t->name, diff, where,
                  got[t->offset + where], want[t->offset + where], scale);
        if (relative > worst) worst = relative;
    }
    return worst;
}

/* The parameters after training, within param_tolerance, but for the
 * key biases (the middle third of qkv_b): adding one bias to every key of
 * a query shifts all its scores alike, which the softmax ignores, so
 * their gradient is zero but for rounding, and AdamW, dividing by the
 * root of its own square, turns that rounding into steps of up to about
 * lr in both implementations. There the bound is twice the sum of the
 * learning rates. The worst of the others goes to *worst, the key
 * biases' to *worst_key. */
static void check_params(const float *got, const float *want, const struct named_tensor *tensors,
                         int num_tensors, int C, double key_tolerance, double *worst,
                         double *worst_key)
{
    *worst = *worst_key = 0.0;
    for (int i = 0; i < num_tensors; i++) {
        const struct named_tensor *t = &tensors[i];
        int qkv_bias = strstr(t->name, ".qkv_b") != NULL;
        double largest = 0.0, largest_key = 0.0;
        size_t where = 0;
        for (size_t k = 0; k < t->size; k++) {
            double diff = fabs((double)got[t->offset + k] - want[t->offset + k]);
            if (isnan(diff)) diff = INFINITY;
            if (qkv_bias && k >= (size_t)C && k < 2 * (size_t)C) {
                largest_key = fmax(largest_key, diff);
            } else if (diff > largest) {
                largest = diff;
                where = k;
            }
        }
        CHECK_MSG(largest <= param_tolerance, "parameters of %s differ by %.3g at %zu (dynmo "
                  "%.7g, torch %.7g)", t->name, largest, where, got[t->offset + where],
                  want[t->offset + where]);
        if (qkv_bias)
            CHECK_MSG(largest_key <= key_tolerance, "the key biases of %s differ by %.3g, more "
                      "than %.3g", t->name, largest_key, key_tolerance);
        if (largest > *worst) {
            *worst = largest;
            printf("parameters: %s's max |diff| %.3g at %zu (dynmo %.7g, torch %.7g)\n",
                   t->name, largest, where, got[t->offset + where], want[t->offset + where]);
        }
        *worst_key = fmax(*worst_key, largest_key);
    }
}

static void run_freeze(const struct fixture *fx, const struct dm_config *cfg,
                       struct gpt *model, struct gpt_acts *acts, struct block_scratch *scratch,
                       const struct named_tensor *tensors, int num_tensors)
{
    const int L = fx->layers;
    const size_t P = tensors[num_tensors - 1].offset + tensors[num_tensors - 1].size;
    int *frozen_from = fixture_take(fx, "frozen_from", DTYPE_INT32, L);
    double *ref_lrs = fixture_take(fx, "lrs", DTYPE_FLOAT64, fx->steps);
    float *ref_losses = fixture_take(fx, "train_losses", DTYPE_FLOAT32, fx->steps);
    float *ref_grads = fixture_take(fx, "last_grads", DTYPE_FLOAT32, (long)P);
    float *ref_params = fixture_take(fx, "final_params", DTYPE_FLOAT32, (long)P);
    float *ref_m = fixture_take(fx, "final_m", DTYPE_FLOAT32, (long)P);
    float *ref_v = fixture_take(fx, "final_v", DTYPE_FLOAT32, (long)P);
    float **snapshot = calloc((size_t)L, sizeof *snapshot);
    float *flat = malloc(P * sizeof(float));
    if (!frozen_from || !ref_lrs || !ref_losses || !ref_grads || !ref_params || !ref_m || !ref_v)
        goto done;
    printf("  freezing: blocks frozen from steps");
    for (int l = 0; l < L; l++) printf(" %d", frozen_from[l]);
    printf(" (-1: never)\n");
    for (int step = 0; step < fx->steps; step++)
        CHECK_NEAR(lr_at_step(cfg, step), ref_lrs[step], 1e-12 * fx->lr);

    double worst_loss = 0.0;
    for (int step = 0; step < fx->steps; step++) {
        /* The step boundary, as the freeze scheme's before_step leaves it:
         * a block that freezes has its gradients zeroed and its flag set;
         * the prefix is the frozen blocks before the first unfrozen one. */
        for (int l = 0; l < L; l++) {
            struct block *blk = &model->blocks[l];
            if (frozen_from[l] != step) continue;
            memset(blk->grads, 0, blk->nparams * sizeof(float));
            blk->frozen = 1;
            snapshot[l] = malloc(3 * blk->nparams * sizeof(float));
            memcpy(snapshot[l], blk->params, blk->nparams * sizeof(float));
            memcpy(snapshot[l] + blk->nparams, blk->m, blk->nparams * sizeof(float));
            memcpy(snapshot[l] + 2 * blk->nparams, blk->v, blk->nparams * sizeof(float));
        }
        int prefix = 0;
        while (prefix < L && model->blocks[prefix].frozen) prefix++;
        model->frozen_prefix = prefix;
        gpt_zero_grads(model);
        float loss = gpt_forward(model, acts);
        gpt_backward(model, acts, scratch, 1.0f, NULL, NULL);
        if (step == fx->steps - 1) {
            gpt_tie_wte_grads(model, NULL);
            gpt_grads_to_flat(model, flat);
            double worst_grad = check_grads(flat, ref_grads, tensors, num_tensors);
            printf("last step's grads (prefix %d): worst max |diff| %.3g over %d tensors\n",
                   prefix, worst_grad, num_tensors);
            for (int i = 0; i < num_tensors; i++) {
                const struct named_tensor *t = &tensors[i];
                int block = -1;
                if (sscanf(t->name, "block%d.", &block) != 1) block = -1;
                int frozen = block >= 0 ? model->blocks[block].frozen
                                        : !strcmp(t->name, "wpe") && prefix > 0;
                if (!frozen) continue;
                int nonzero = 0;
                for (size_t k = 0; k < t->size; k++) nonzero += flat[t->offset + k] != 0.0f;
                CHECK_MSG(nonzero == 0, "frozen %s has %d nonzero gradients", t->name, nonzero);
            }
        }
        optimizer_step(model, cfg, step);
        double rel = relative_diff(loss, ref_losses[step]);
        printf("step %d: frozen prefix %d, loss dynmo %.7f torch %.7f relative diff %.3g\n",
               step, prefix, loss, ref_losses[step], rel);
        CHECK_MSG(rel <= loss_tolerance, "step %d's loss differs by %.3g", step, rel);
        worst_loss = fmax(worst_loss, rel);
    }

    int unchanged = 1;
    for (int l = 0; l < L; l++) {
        const struct block *blk = &model->blocks[l];
        if (!snapshot[l]) continue;
        int same = !memcmp(snapshot[l], blk->params, blk->nparams * sizeof(float)) &&
                   !memcmp(snapshot[l] + blk->nparams, blk->m, blk->nparams * sizeof(float)) &&
                   !memcmp(snapshot[l] + 2 * blk->nparams, blk->v, blk->nparams * sizeof(float));
        printf("block %d, frozen from step %d: parameters and moments %s\n", l, frozen_from[l],
               same ? "the same bits as when it froze" : "CHANGED after it froze");
        CHECK_MSG(same, "frozen block %d changed", l);
        unchanged &= same;
    }
    double lr_sum = 0.0;
    for (int step = 0; step < fx->steps; step++) lr_sum += ref_lrs[step];
    double params_diff, key_diff;
    gpt_params_to_flat(model, flat);
    check_params(flat, ref_params, tensors, num_tensors, fx->channels, 2.0 * lr_sum,
                 &params_diff, &key_diff);
    moments_to_flat(model, flat, 0);
    double m_diff = check_moments("m", flat, ref_m, tensors, num_tensors);
    moments_to_flat(model, flat, 1);
    double v_diff = check_moments("v", flat, ref_v, tensors, num_tensors);
    printf("freezing: largest differences: training loss %.3g (relative), parameters %.3g "
           "(the key biases %.3g, bound %.3g), m %.3g and v %.3g (relative to each tensor's "
           "largest); frozen blocks %s\n", worst_loss, params_diff, key_diff, 2.0 * lr_sum,
           m_diff, v_diff, unchanged ? "unchanged" : "CHANGED");
done:
    for (int l = 0; l < L; l++) free(snapshot[l]);
    free(snapshot);
    free(flat);
    free(frozen_from);
    free(ref_lrs);
    free(ref_losses);
    free(ref_grads);
    free(ref_params);
    free(ref_m);
    free(ref_v);
}

/* ---- the fixtures -------------------------------------------------------------------- */

static void run_fixture(const char *path)
{
    struct fixture fx;
    if (fixture_load(&fx, path, 4, 4) != 0) {
        testing_failures++;
        free(fx.bytes);
        return;
    }
    printf("fixture %s: V=%d S=%d L=%d NH=%d C=%d B=%d T=%d steps=%d warmup=%d\n", path,
           fx.vocab, fx.max_seq, fx.layers, fx.heads, fx.channels, fx.batch, fx.seq, fx.steps,
           fx.warmup);
    struct dm_config cfg;
    fixture_config(&cfg, &fx);
    struct gpt_shape shape = gpt_shape_from_config(&cfg);
    const int B = fx.batch, T = fx.seq;
    int num_tensors;
    struct named_tensor *tensors = fixture_tensors(&fx, &num_tensors);
    const size_t P = tensors[num_tensors - 1].offset + tensors[num_tensors - 1].size;
    CHECK_MSG(gpt_param_count(&shape) == P, "gpt_param_count %zu, fixture layout %zu",
              gpt_param_count(&shape), P);
    float *params = fixture_take(&fx, "params", DTYPE_FLOAT32, (long)P);
    int *tokens = fixture_take(&fx, "tokens", DTYPE_INT32, (long)B * T);
    int *targets = fixture_take(&fx, "targets", DTYPE_INT32, (long)B * T);
    if (params && tokens && targets) {
        struct gpt model;
        gpt_build(&model, &shape, 0, shape.layers, 1, 1, 1);
        gpt_params_from_flat(&model, params);
        struct gpt_acts acts;
        gpt_acts_alloc(&acts, &model, B, T);
        memcpy(acts.tokens, tokens, (size_t)B * T * sizeof(int));
        memcpy(acts.targets, targets, (size_t)B * T * sizeof(int));
        struct block_scratch scratch;
        block_scratch_alloc(&scratch, B, T, fx.channels, fx.heads);
        if (fx.kind == KIND_EXIT)
            run_exit(&fx, &cfg, &model, &acts, &scratch, tensors, num_tensors, params);
        else
            run_freeze(&fx, &cfg, &model, &acts, &scratch, tensors, num_tensors);
        block_scratch_free(&scratch);
        gpt_acts_free(&acts);
        gpt_free(&model);
    }
    free(params);
    free(tokens);
    free(targets);
    free(tensors);
    free(fx.bytes);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    /* $DYNMO_EXIT_FIXTURES, else tests/reference under the current
     * directory or above the executable */
    const char *override = getenv("DYNMO_EXIT_FIXTURES");
    char dir[2048];
    if (override && *override) snprintf(dir, sizeof dir, "%s", override);
    else if (!fixture_dir(dir, sizeof dir, fixtures[0])) {
        fprintf(stderr, "test_exit_reference: fixtures not found under %s (run from the "
                "repository root, or set DYNMO_EXIT_FIXTURES; regenerate with "
                "/usr/bin/python3 tests/reference/make_exit_fixture.py)\n", dir);
        MPI_Finalize();
        return 1;
    }
    dm_threads_init(2);
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        char path[2200];
        snprintf(path, sizeof path, "%s/%s", dir, fixtures[i]);
        if (i > 0) printf("\n");
        run_fixture(path);
    }
    dm_threads_shutdown();
    int rc = testing_report("test_exit_reference");
    MPI_Finalize();
    return rc;
}
