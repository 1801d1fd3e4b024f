/* Checks dynmo's GPT against an independent PyTorch implementation.
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
 * directory or under any directory above this executable. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dynmo/core.h"
#include "dynmo/model.h"
#include "testing.h"

#define FIXTURE_RELATIVE_PATH "tests/reference/fixture_tiny.bin"
#define FIXTURE_HEADER_BYTES 108
#define MAX_ARRAYS 16

static const double logits_tolerance = 1e-4;     /* absolute */
static const double grad_tolerance = 1e-4;       /* absolute */
static const double loss_tolerance = 1e-5;       /* relative */

enum { DTYPE_FLOAT32 = 0, DTYPE_INT32 = 1, DTYPE_FLOAT64 = 2 };

struct fixture_array {
    char name[17];
    uint32_t dtype;
    int count;
    const void *data;   /* points into fixture.bytes; may be unaligned */
};

struct fixture {
    unsigned char *bytes;
    size_t size;
    int vocab, max_seq, layers, heads, channels, batch, seq, steps, warmup;
    double lr, min_lr_ratio, beta1, beta2, eps, weight_decay, grad_clip;
    int num_arrays;
    struct fixture_array arrays[MAX_ARRAYS];
};

static int file_exists(const char *path)
{
    return access(path, R_OK) == 0;
}

/* Finds the fixture: the override, the current directory (the test runner
 * runs from the repository root), then each directory above the executable
 * (build/tests/test_reference, build/ref/tests/test_reference, ...). */
static int locate_fixture(char *path, size_t size)
{
    const char *override = getenv("DYNMO_FIXTURE");
    if (override && *override) {
        snprintf(path, size, "%s", override);
        return file_exists(path);
    }
    snprintf(path, size, "%s", FIXTURE_RELATIVE_PATH);
    if (file_exists(path)) return 1;
    char dir[1024];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0) return 0;
    dir[n] = '\0';
    for (char *slash = strrchr(dir, '/'); slash; slash = strrchr(dir, '/')) {
        *slash = '\0';
        snprintf(path, size, "%s/%s", dir, FIXTURE_RELATIVE_PATH);
        if (file_exists(path)) return 1;
    }
    snprintf(path, size, "%s", FIXTURE_RELATIVE_PATH);
    return 0;
}

static int32_t read_i32(const unsigned char *p) { int32_t x; memcpy(&x, p, 4); return x; }
static uint32_t read_u32(const unsigned char *p) { uint32_t x; memcpy(&x, p, 4); return x; }
static double read_f64(const unsigned char *p) { double x; memcpy(&x, p, 8); return x; }

/* Reads and parses the fixture; returns 0, or -1 after printing why. The
 * host is assumed little-endian (x86-64, aarch64), as the file is. */
static int fixture_load(struct fixture *fx, const char *path)
{
    memset(fx, 0, sizeof *fx);
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < FIXTURE_HEADER_BYTES) {
        fprintf(stderr, "%s: %ld bytes, too short for a fixture\n", path, size);
        fclose(f);
        return -1;
    }
    fx->bytes = malloc((size_t)size);
    fx->size = (size_t)size;
    size_t got = fread(fx->bytes, 1, fx->size, f);
    fclose(f);
    if (got != fx->size) { fprintf(stderr, "%s: short read\n", path); return -1; }

    const unsigned char *p = fx->bytes;
    if (memcmp(p, "DMREF001", 8) != 0 || read_u32(p + 8) != 1) {
        fprintf(stderr, "%s: not a version-1 DMREF001 fixture\n", path);
        return -1;
    }
    int *ints[] = {&fx->vocab, &fx->max_seq, &fx->layers, &fx->heads, &fx->channels,
                   &fx->batch, &fx->seq, &fx->steps, &fx->warmup};
    for (int i = 0; i < 9; i++) *ints[i] = read_i32(p + 12 + 4 * i);
    double *reals[] = {&fx->lr, &fx->min_lr_ratio, &fx->beta1, &fx->beta2, &fx->eps,
                       &fx->weight_decay, &fx->grad_clip};
    for (int i = 0; i < 7; i++) *reals[i] = read_f64(p + 48 + 8 * i);
    uint32_t num_arrays = read_u32(p + 104);
    if (num_arrays > MAX_ARRAYS) {
        fprintf(stderr, "%s: %u arrays, at most %d expected\n", path, num_arrays, MAX_ARRAYS);
        return -1;
    }
    size_t offset = FIXTURE_HEADER_BYTES;
    for (uint32_t i = 0; i < num_arrays; i++) {
        struct fixture_array *a = &fx->arrays[i];
        if (offset + 24 > fx->size) goto truncated;
        memcpy(a->name, p + offset, 16);
        a->name[16] = '\0';
        a->dtype = read_u32(p + offset + 16);
        a->count = read_i32(p + offset + 20);
        size_t element = a->dtype == DTYPE_FLOAT64 ? 8 : 4;
        if (a->dtype > DTYPE_FLOAT64 || a->count < 0) {
            fprintf(stderr, "%s: array %s has dtype %u, count %d\n", path, a->name,
                    a->dtype, a->count);
            return -1;
        }
        offset += 24;
        if (offset + element * (size_t)a->count > fx->size) goto truncated;
        a->data = p + offset;
        offset += element * (size_t)a->count;
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

/* Copies array `name` into a fresh buffer (aligned) after checking its
 * dtype and count; NULL after printing why when it does not match. */
static void *fixture_take(const struct fixture *fx, const char *name, uint32_t dtype,
                          long expected_count)
{
    for (int i = 0; i < fx->num_arrays; i++) {
        const struct fixture_array *a = &fx->arrays[i];
        if (strcmp(a->name, name) != 0) continue;
        if (a->dtype != dtype || a->count != expected_count) {
            fprintf(stderr, "fixture array %s: dtype %u count %d, expected dtype %u count %ld\n",
                    name, a->dtype, a->count, dtype, expected_count);
            return NULL;
        }
        size_t bytes = (size_t)a->count * (dtype == DTYPE_FLOAT64 ? 8 : 4);
        void *copy = malloc(bytes ? bytes : 1);
        memcpy(copy, a->data, bytes);
        return copy;
    }
    fprintf(stderr, "fixture has no array %s\n", name);
    return NULL;
}

/* One named tensor of the canonical flat order, derived here from the shape
 * alone (not from model.c's offsets) so that a layout bug shows up. */
struct named_tensor {
    char name[32];
    size_t offset, size;
};

static int canonical_tensors(struct named_tensor *out, int max, int V, int S, int L, int C)
{
    static const char *block_names[BP_COUNT] = {
        "ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b",
        "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"};
    const size_t c = (size_t)C;
    const size_t block_sizes[BP_COUNT] = {c, c, 3 * c * c, 3 * c, c * c, c,
                                          c, c, 4 * c * c, 4 * c, 4 * c * c, c};
    int n = 0;
    size_t offset = 0;
#define ADD(label, count)                                                     \
    do {                                                                      \
        DM_ASSERT(n < max);                                                   \
        snprintf(out[n].name, sizeof out[n].name, "%s", label);               \
        out[n].offset = offset;                                               \
        out[n].size = (count);                                                \
        offset += out[n].size;                                                \
        n++;                                                                  \
    } while (0)
    ADD("wte", (size_t)V * c);
    ADD("wpe", (size_t)S * c);
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < BP_COUNT; k++) {
            char label[32];
            snprintf(label, sizeof label, "block%d.%s", l, block_names[k]);
            ADD(label, block_sizes[k]);
        }
    }
    ADD("lnf_w", c);
    ADD("lnf_b", c);
#undef ADD
    return n;
}

/* Largest |a - b| over n floats; its index goes to *where. */
static double max_abs_diff(const float *a, const float *b, size_t n, size_t *where)
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

int main(void)
{
    char path[2048];
    if (!locate_fixture(path, sizeof path)) {
        fprintf(stderr, "test_reference: fixture not found at %s (run from the repository "
                        "root, or set DYNMO_FIXTURE; regenerate with "
                        "/usr/bin/python3 tests/reference/make_fixture.py)\n", path);
        return 1;
    }
    struct fixture fx;
    if (fixture_load(&fx, path) != 0) return 1;
    printf("fixture %s: V=%d S=%d L=%d NH=%d C=%d B=%d T=%d steps=%d warmup=%d\n", path,
           fx.vocab, fx.max_seq, fx.layers, fx.heads, fx.channels, fx.batch, fx.seq,
           fx.steps, fx.warmup);

    dm_threads_init(2);

    struct dm_config cfg;
    config_defaults(&cfg);
    cfg.vocab = fx.vocab;
    cfg.max_seq = fx.max_seq;
    cfg.layers = fx.layers;
    cfg.heads = fx.heads;
    cfg.channels = fx.channels;
    cfg.batch = fx.batch;
    cfg.seq = fx.seq;
    cfg.micro_batches = 1;
    cfg.steps = fx.steps;
    cfg.warmup = fx.warmup;
    cfg.lr = fx.lr;
    cfg.min_lr_ratio = fx.min_lr_ratio;
    cfg.beta1 = fx.beta1;
    cfg.beta2 = fx.beta2;
    cfg.eps = fx.eps;
    cfg.weight_decay = fx.weight_decay;
    cfg.grad_clip = fx.grad_clip;
    config_validate(&cfg);
    struct gpt_shape shape = gpt_shape_from_config(&cfg);

    const int B = fx.batch, T = fx.seq, V = fx.vocab, C = fx.channels;
    struct named_tensor tensors[2 + 64 * BP_COUNT + 2];
    int num_tensors = canonical_tensors(tensors, (int)(sizeof tensors / sizeof tensors[0]),
                                        V, fx.max_seq, fx.layers, C);
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
    if (!ref_params || !tokens || !targets || !ref_logits || !ref_loss || !ref_grads ||
        !ref_lrs || !ref_train_losses || testing_failures)
        return testing_report("test_reference");

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
    float loss = gpt_forward(&model, &acts);
    size_t where;
    double logits_diff = max_abs_diff(acts.logits, ref_logits, (size_t)B * T * V, &where);
    printf("logits: max |diff| %.3g at %zu (dynmo %.7g, torch %.7g)\n", logits_diff, where,
           acts.logits[where], ref_logits[where]);
    CHECK_MSG(logits_diff <= logits_tolerance, "logits differ by %.3g", logits_diff);
    printf("loss: dynmo %.7f torch %.7f\n", loss, ref_loss[0]);
    CHECK_NEAR(loss, ref_loss[0], loss_tolerance * fabs(ref_loss[0]));

    gpt_backward(&model, &acts, &scratch, 1.0f, NULL, NULL);
    gpt_tie_wte_grads(&model, NULL);   /* one rank holds both ends of wte */
    gpt_grads_to_flat(&model, flat);
    double worst_grad_diff = 0.0;
    for (int i = 0; i < num_tensors; i++) {
        const struct named_tensor *t = &tensors[i];
        double diff = max_abs_diff(flat + t->offset, ref_grads + t->offset, t->size, &where);
        printf("grad %-18s max |diff| %.3g at %zu (dynmo %.7g, torch %.7g)\n", t->name, diff,
               where, flat[t->offset + where], ref_grads[t->offset + where]);
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
    for (int step = 0; step < fx.steps; step++) {
        gpt_zero_grads(&model);
        float step_loss = gpt_forward(&model, &acts);
        gpt_backward(&model, &acts, &scratch, 1.0f, NULL, NULL);
        gpt_tie_wte_grads(&model, NULL);
        double norm = sqrt(gpt_grad_sumsq(&model));
        float grad_scale = norm > fx.grad_clip ? (float)(fx.grad_clip / norm) : 1.0f;
        gpt_adamw_update(&model, lr_at_step(&cfg, step), fx.beta1, fx.beta2, fx.eps,
                         fx.weight_decay, grad_scale, step + 1);
        double relative = fabs((double)step_loss - ref_train_losses[step]) /
                          fabs((double)ref_train_losses[step]);
        printf("step %2d: lr %.6g loss dynmo %.7f torch %.7f relative diff %.3g\n", step,
               lr_at_step(&cfg, step), step_loss, ref_train_losses[step], relative);
        CHECK_NEAR(step_loss, ref_train_losses[step],
                   loss_tolerance * fabs(ref_train_losses[step]));
        if (relative > worst_loss_diff) worst_loss_diff = relative;
    }
    printf("training: worst relative loss diff %.3g over %d steps\n", worst_loss_diff,
           fx.steps);

    block_scratch_free(&scratch);
    gpt_acts_free(&acts);
    gpt_free(&model);
    dm_threads_shutdown();
    free(flat);
    free(ref_params);
    free(tokens);
    free(targets);
    free(ref_logits);
    free(ref_loss);
    free(ref_grads);
    free(ref_lrs);
    free(ref_train_losses);
    free(fx.bytes);
    return testing_report("test_reference");
}
