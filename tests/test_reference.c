/* Checks dynmo's GPT, dense and with mixture-of-experts blocks, against
 * independent PyTorch implementations.
 *
 * tests/reference/make_fixture.py builds the same tiny model in PyTorch and
 * writes tests/reference/fixture_tiny.bin (format documented there and in
 * tests/reference/README.md): weights, a batch, the logits, the loss, every
 * gradient, and the losses of ten clipped AdamW steps. This test loads the
 * weights into a one-rank dynmo model and compares: logits and each gradient
 * tensor to 1e-4 absolute, the loss and the ten training losses to 1e-5
 * relative. It prints the largest difference per tensor. It reads only the
 * fixture: it never needs torch. The fixture is found at
 * $DYNMO_FIXTURE, else at tests/reference/fixture_tiny.bin under the current
 * directory or under any directory above this executable.
 *
 * tests/reference/make_moe_fixture.py writes six MoE fixtures (version 2,
 * "DMREF002", 4 experts: top-2 softmax dropless, softmax with capacity,
 * sigmoid with the selection bias and capacity, softmax with capacity and
 * GShard's drop order (drop=slot); top-1 softmax with capacity and top-1
 * sigmoid, whose gate is the chosen score), found beside the dense one.
 * For them the test also compares the balancing losses (aux + z), each MoE
 * block's routing (choices and dropped pairs) of the first forward, the ten
 * training losses with and without the balancing losses (1e-5 relative)
 * and the bias after the ten steps.
 *
 * tests/reference/make_mod_hash_model_fixture.py writes two more (version
 * 3, "DMREF003"): a model with a mixture-of-depths block (causal routing
 * by an MLP predictor) and one with hash-sparse attention (4 buckets). For
 * them the test also
 * compares the MoD block's choice and the predictor's BCE, and the hash
 * rotations dynmo draws for step 0; the training loop hands each step's
 * index to the model, as dynmo train does. With $DYNMO_FIXTURE only that
 * file is checked. tests/fixture.h reads the files. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dynmo/core.h"
#include "dynmo/dyn.h"
#include "dynmo/model.h"
#include "dynmo/moe.h"
#include "dyn/hash.h"
#include "dyn/mod.h"
#include "fixture.h"
#include "testing.h"

static const char *const moe_fixtures[] = {
    "fixture_moe.bin", "fixture_moe_capacity.bin", "fixture_moe_sigmoid.bin",
    "fixture_moe_top1.bin", "fixture_moe_top1_sigmoid.bin", "fixture_moe_slot.bin",
    "fixture_mod_model.bin", "fixture_hash_model.bin",
};

static const double logits_tolerance = 1e-4;     /* absolute */
static const double grad_tolerance = 1e-4;       /* absolute */
static const double loss_tolerance = 1e-5;       /* relative */

/* The MoE blocks' balancing losses of the forwards since the last
 * gpt_begin_step; then begins a new step (one rank: the step's sums
 * are this rank's values, which gpt_end_step takes as they are,
 * updating the sigmoid router's bias). */
static void end_moe_step(struct gpt *model)
{
    int n = gpt_step_values(model, NULL);
    double *values = malloc((size_t)(n ? n : 1) * sizeof(double));
    gpt_step_values(model, values);
    gpt_end_step(model, values);
    free(values);
    gpt_begin_step(model);
}

/* Version 3, after the first forward: the MoD blocks' choices and BCE, the
 * hash rotations of step 0 (dynmo's own draw against the fixture's). */
static void check_mod_hash(const struct fixture *fx, const struct gpt *model,
                           const struct gpt_acts *acts)
{
    int N = fx->batch * fx->seq, M = gpt_mod_block_count(&model->shape);
    if (M > 0) {
        int *chosen = fixture_take(fx, "chosen", DTYPE_INT32, (long)M * N);
        float *bce = fixture_take(fx, "bce", DTYPE_FLOAT32, 1);
        CHECK(chosen && bce);
        int differ = 0, count = 0, m = 0;
        double sum = 0.0;
        for (int i = 0; chosen && i < model->num_blocks; i++) {
            const struct block_mod *mod = block_mod_of(&model->blocks[i]);
            if (!mod) continue;
            const struct mod_acts *ma = block_mod_acts((struct block_acts *)&acts->blocks[i]);
            for (int n = 0; n < N; n++) {
                differ += ma->chosen[n] != chosen[m * N + n];
                count += chosen[m * N + n];
            }
            sum += mod->bce;
            m++;
        }
        printf("MoD: %d of %d choices differ from torch's (%d chosen); predictor BCE dynmo "
               "%.7g torch %.7g\n", differ, M * N, count, sum, bce ? bce[0] : NAN);
        CHECK_MSG(differ == 0, "%d MoD choices differ", differ);
        if (bce) CHECK_NEAR(sum, bce[0], loss_tolerance * fabs(bce[0]));
        free(chosen);
        free(bce);
    }
    if (fx->hash_buckets > 1) {
        int NH = fx->heads, hs = fx->channels / NH, half = fx->hash_buckets / 2;
        long per = (long)NH * hs * half;
        float *want = fixture_take(fx, "rotation", DTYPE_FLOAT32, per * fx->layers);
        float *got = malloc((size_t)per * sizeof(float));
        int same = want != NULL;
        for (int l = 0; want && l < fx->layers; l++) {
            hash_rotation_draw(got, NH, hs, fx->hash_buckets, fx->seed, l, 0);
            same &= memcmp(got, want + l * per, (size_t)per * sizeof(float)) == 0;
        }
        printf("hash rotations of step 0: %s torch's\n", same ? "the same bits as" : "DIFFER from");
        CHECK(same);
        free(want);
        free(got);
    }
}

/* Checks dynmo against one fixture; returns 0 (failures are counted by
 * the CHECK macros). */
static int run_fixture(const char *path)
{
    struct fixture fx;
    if (fixture_load(&fx, path, 1, 3) != 0) {
        testing_failures++;
        return -1;
    }
    printf("fixture %s: V=%d S=%d L=%d NH=%d C=%d B=%d T=%d steps=%d warmup=%d\n", path,
           fx.vocab, fx.max_seq, fx.layers, fx.heads, fx.channels, fx.batch, fx.seq,
           fx.steps, fx.warmup);
    int moe = fx.version == 2;
    if (moe)
        printf("  MoE: every %d, %d experts, top-%d, hidden %d, %s router, capacity factor %g "
               "(drop %s), aux %g, z %g, bias rate %g\n", fx.moe_every, fx.experts, fx.top_k,
               fx.expert_hidden, fx.router ? "sigmoid" : "softmax", fx.capacity_factor,
               fixture_drop_name(fx.drop), fx.aux_loss, fx.z_loss, fx.bias_rate);

    if (fx.version == 3)
        printf("  MoD: every %d, capacity %g, %s routing (predictor hidden %d); hash buckets %d, "
               "seed %llu\n", fx.mod_every, fx.mod_capacity, fx.mod_routing ? "causal" : "top-k",
               fx.mod_predictor_hidden, fx.hash_buckets, (unsigned long long)fx.seed);

    struct dm_config cfg;
    fixture_config(&cfg, &fx);
    dyn_config_validate(&cfg);
    struct gpt_shape shape = dyn_shape_from_config(&cfg);

    const int B = fx.batch, T = fx.seq, V = fx.vocab, C = fx.channels;
    const int M = gpt_moe_block_count(&shape), K = fx.top_k;
    int num_tensors;
    struct named_tensor *tensors = fixture_tensors(&fx, &num_tensors);
    const size_t P = tensors[num_tensors - 1].offset + tensors[num_tensors - 1].size;
    CHECK_MSG(gpt_param_count(&shape) == P, "gpt_param_count %zu, fixture layout %zu",
              gpt_param_count(&shape), P);

    float *ref_params = fixture_take(&fx, "params", DTYPE_FLOAT32, (long)P);
    int *tokens = fixture_take(&fx, "tokens", DTYPE_INT32, (long)B * T);
    int *targets = fixture_take(&fx, "targets", DTYPE_INT32, (long)B * T);
    float *ref_logits = fixture_take(&fx, "logits", DTYPE_FLOAT32, (long)B * T * V);
    float *ref_loss = fixture_take(&fx, "loss", DTYPE_FLOAT32, 1);
    float *ref_grads = fixture_take(&fx, "grads", DTYPE_FLOAT32, (long)P);
    double *ref_lrs = fixture_take(&fx, "lrs", DTYPE_FLOAT64, fx.steps);
    float *ref_train_losses = fixture_take(&fx, "train_losses", DTYPE_FLOAT32, fx.steps);
    float *ref_balance = NULL, *ref_totals = NULL, *ref_bias = NULL;
    int *ref_choice = NULL, *ref_kept = NULL;
    if (moe) {
        long pairs = (long)M * B * T * K;
        ref_balance = fixture_take(&fx, "balance", DTYPE_FLOAT32, 1);
        ref_totals = fixture_take(&fx, "train_totals", DTYPE_FLOAT32, fx.steps);
        ref_bias = fixture_take(&fx, "bias", DTYPE_FLOAT32, (long)M * fx.experts);
        ref_choice = fixture_take(&fx, "choice", DTYPE_INT32, pairs);
        ref_kept = fixture_take(&fx, "kept", DTYPE_INT32, pairs);
    }
    if (!ref_params || !tokens || !targets || !ref_logits || !ref_loss || !ref_grads ||
        !ref_lrs || !ref_train_losses || testing_failures) {
        testing_failures++;
        return -1;
    }

    struct gpt model;
    gpt_build(&model, &shape, 0, shape.layers, 1, 1, 1);
    gpt_params_from_flat(&model, ref_params);
    float *flat = malloc(P * sizeof(float));
    gpt_params_to_flat(&model, flat);
    CHECK_MSG(memcmp(flat, ref_params, P * sizeof(float)) == 0,
              "parameters do not survive gpt_params_from_flat/gpt_params_to_flat");

    struct gpt_acts acts;
    gpt_acts_alloc(&acts, &model, B, T);
    memcpy(acts.tokens, tokens, (size_t)B * T * sizeof(int));
    memcpy(acts.targets, targets, (size_t)B * T * sizeof(int));
    struct block_scratch scratch;
    block_scratch_alloc(&scratch, B, T, C, shape.heads);

    /* One forward and backward pass against torch's. */
    gpt_zero_grads(&model);
    gpt_begin_step(&model);
    float loss = gpt_forward(&model, &acts);
    size_t where;
    double logits_diff = max_abs_diff(acts.logits, ref_logits, (size_t)B * T * V, &where);
    printf("logits: max |diff| %.3g at %zu (dynmo %.7g, torch %.7g)\n", logits_diff, where,
           acts.logits[where], ref_logits[where]);
    CHECK_MSG(logits_diff <= logits_tolerance, "logits differ by %.3g", logits_diff);
    printf("loss: dynmo %.7f torch %.7f\n", loss, ref_loss[0]);
    CHECK_NEAR(loss, ref_loss[0], loss_tolerance * fabs(ref_loss[0]));
    if (fx.version == 3) check_mod_hash(&fx, &model, &acts);
    if (moe) {
        double balance = gpt_moe_balance_loss(&model);
        printf("balancing losses (aux + z): dynmo %.7g torch %.7g\n", balance, ref_balance[0]);
        CHECK_NEAR(balance, ref_balance[0], loss_tolerance * fabs(ref_balance[0]));
        /* The routing of every MoE block: the same choices, the same drops. */
        int m = 0, differ = 0, dropped = 0;
        for (int i = 0; i < model.num_blocks; i++) {
            if (!block_moe_of(&model.blocks[i])) continue;
            struct moe_routing r;
            moe_routing_of(&acts.blocks[i], &r);
            CHECK(r.N == B * T && r.k == K);
            for (long p = 0; p < (long)B * T * K; p++) {
                long at = (long)m * B * T * K + p;
                differ += r.choice[p] != ref_choice[at] || (r.row[p] >= 0) != ref_kept[at];
                dropped += r.row[p] < 0;
            }
            m++;
        }
        printf("routing: %d of %d pairs differ from torch's (%d dropped by capacity)\n",
               differ, M * B * T * K, dropped);
        CHECK_MSG(differ == 0, "%d routing decisions differ", differ);
    }

    gpt_backward(&model, &acts, &scratch, 1.0f, NULL, NULL);
    gpt_tie_wte_grads(&model, NULL);   /* one rank holds both ends of wte */
    gpt_grads_to_flat(&model, flat);
    double worst_grad_diff = 0.0;
    for (int i = 0; i < num_tensors; i++) {
        const struct named_tensor *t = &tensors[i];
        double diff = max_abs_diff(flat + t->offset, ref_grads + t->offset, t->size, &where);
        if (!moe || diff > grad_tolerance / 10)
            printf("grad %-18s max |diff| %.3g at %zu (dynmo %.7g, torch %.7g)\n", t->name,
                   diff, where, flat[t->offset + where], ref_grads[t->offset + where]);
        CHECK_MSG(diff <= grad_tolerance, "gradient %s differs by %.3g", t->name, diff);
        if (diff > worst_grad_diff) worst_grad_diff = diff;
    }
    printf("grads: worst max |diff| %.3g over %d tensors\n", worst_grad_diff, num_tensors);

    double ref_sumsq = 0.0;
    for (size_t i = 0; i < P; i++) ref_sumsq += (double)ref_grads[i] * ref_grads[i];
    double sumsq = gpt_grad_sumsq(&model);
    printf("grad norm: dynmo %.7f torch %.7f\n", sqrt(sumsq), sqrt(ref_sumsq));
    CHECK_NEAR(sqrt(sumsq), sqrt(ref_sumsq), 1e-5 * sqrt(ref_sumsq));

    /* The schedule the fixture was trained with must be dynmo's. */
    for (int step = 0; step < fx.steps; step++)
        CHECK_NEAR(lr_at_step(&cfg, step), ref_lrs[step], 1e-12 * fx.lr);

    /* Ten steps on the same batch: the loss before each update. */
    double worst_loss_diff = 0.0;
    gpt_begin_step(&model);
    for (int step = 0; step < fx.steps; step++) {
        gpt_zero_grads(&model);
        model.step = step;   /* hash attention's rotations, as dynmo train sets it */
        float step_loss = gpt_forward(&model, &acts);
        double total = step_loss + gpt_moe_balance_loss(&model);
        gpt_backward(&model, &acts, &scratch, 1.0f, NULL, NULL);
        gpt_tie_wte_grads(&model, NULL);
        double norm = sqrt(gpt_grad_sumsq(&model));
        float grad_scale = norm > fx.grad_clip ? (float)(fx.grad_clip / norm) : 1.0f;
        gpt_adamw_update(&model, lr_at_step(&cfg, step), fx.beta1, fx.beta2, fx.eps,
                         fx.weight_decay, grad_scale, step + 1);
        end_moe_step(&model);
        double relative = fabs((double)step_loss - ref_train_losses[step]) /
                          fabs((double)ref_train_losses[step]);
        printf("step %2d: lr %.6g loss dynmo %.7f torch %.7f relative diff %.3g", step,
               lr_at_step(&cfg, step), step_loss, ref_train_losses[step], relative);
        CHECK_NEAR(step_loss, ref_train_losses[step],
                   loss_tolerance * fabs(ref_train_losses[step]));
        if (relative > worst_loss_diff) worst_loss_diff = relative;
        if (moe) {
            double rel_total = fabs(total - ref_totals[step]) / fabs((double)ref_totals[step]);
            printf("; with balance dynmo %.7f torch %.7f relative diff %.3g", total,
                   ref_totals[step], rel_total);
            CHECK_NEAR(total, ref_totals[step], loss_tolerance * fabs(ref_totals[step]));
            if (rel_total > worst_loss_diff) worst_loss_diff = rel_total;
        }
        printf("\n");
    }
    printf("training: worst relative loss diff %.3g over %d steps\n", worst_loss_diff,
           fx.steps);
    if (moe) {
        double worst_bias = 0.0;
        int m = 0;
        for (int i = 0; i < model.num_blocks; i++) {
            const struct block_moe *bm = block_moe_of(&model.blocks[i]);
            if (!bm) continue;
            for (int e = 0; e < fx.experts; e++)
                worst_bias = fmax(worst_bias, fabs(bm->bias[e] - ref_bias[m * fx.experts + e]));
            m++;
        }
        printf("bias after %d steps: max |diff| %.3g\n", fx.steps, worst_bias);
        CHECK_MSG(worst_bias <= 1e-6, "the selection bias differs by %.3g", worst_bias);
    }

    block_scratch_free(&scratch);
    gpt_acts_free(&acts);
    gpt_free(&model);
    free(flat);
    free(tensors);
    free(ref_params);
    free(tokens);
    free(targets);
    free(ref_logits);
    free(ref_loss);
    free(ref_grads);
    free(ref_lrs);
    free(ref_train_losses);
    free(ref_balance);
    free(ref_totals);
    free(ref_bias);
    free(ref_choice);
    free(ref_kept);
    free(fx.bytes);
    return 0;
}

int main(void)
{
    char dir[2048], path[2200];
    const char *override = getenv("DYNMO_FIXTURE");
    int found;
    if (override && *override) {
        snprintf(path, sizeof path, "%s", override);
        found = access(path, R_OK) == 0;
    } else {
        found = fixture_dir(dir, sizeof dir, "fixture_tiny.bin");
        snprintf(path, sizeof path, "%s/fixture_tiny.bin", dir);
    }
    if (!found) {
        fprintf(stderr, "test_reference: fixture not found at %s (run from the repository "
                        "root, or set DYNMO_FIXTURE; regenerate with "
                        "/usr/bin/python3 tests/reference/make_fixture.py)\n", path);
        return 1;
    }
    dm_threads_init(2);
    run_fixture(path);
    if (!override || !*override) {
        /* The MoE fixtures lie beside the dense one. */
        for (size_t i = 0; i < sizeof moe_fixtures / sizeof moe_fixtures[0]; i++) {
            char moe_path[2200];
            snprintf(moe_path, sizeof moe_path, "%s/%s", dir, moe_fixtures[i]);
            printf("\n");
            if (access(moe_path, R_OK) != 0) {
                fprintf(stderr, "test_reference: MoE fixture %s not found (regenerate with "
                        "/usr/bin/python3 tests/reference/make_moe_fixture.py)\n", moe_path);
                testing_failures++;
                continue;
            }
            run_fixture(moe_path);
        }
    }
    dm_threads_shutdown();
    return testing_report("test_reference");
}
