/* Tests of the token dataset and loader (src/model/data.c, docs/data.md):
 * prepare -> open -> fill round trip against the original bytes, the
 * header byte by byte and its checksum recomputed here independently,
 * deterministic shuffling, every window exactly once per epoch,
 * data-parallel shares, cursor restore, and rejection of bad token files
 * (each in a forked child that must exit 2 naming the file and problem). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dynmo/model.h"
#include "dynmo/tools.h"
#include "testing.h"

static char tmpdir[256];

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = malloc(*n + 1);
    if (fread(data, 1, *n, f) != *n) exit(1);
    fclose(f);
    return data;
}

static void prepare(const char *out, const char *fraction, const char *a, const char *b)
{
    char *argv[8];
    int argc = 0;
    argv[argc++] = "prepare";
    argv[argc++] = "--out";
    argv[argc++] = (char *)out;
    argv[argc++] = "--val-fraction";
    argv[argc++] = (char *)fraction;
    argv[argc++] = (char *)a;
    if (b) argv[argc++] = (char *)b;
    argv[argc] = NULL;
    CHECK(cmd_prepare(argc, argv) == 0);
}

static uint32_t le32(const unsigned char *p)
{
    return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
    return le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* FNV-1a 64 over raw bytes, written here from its definition. */
static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* ---- prepare -> file bytes -> open --------------------------------------- */

static void test_roundtrip(void)
{
    char a[512], b[512], out[512], train[600], val[600];
    snprintf(a, sizeof a, "%s/a.txt", tmpdir);
    snprintf(b, sizeof b, "%s/b.txt", tmpdir);
    snprintf(out, sizeof out, "%s/rt/nested", tmpdir);
    char text_a[8192], text_b[4096];
    size_t na = 0, nb = 0;
    for (int i = 0; i < 150; i++)
        na += (size_t)snprintf(text_a + na, sizeof text_a - na,
                               "%d. In the beginning was the word.\n", i);
    for (int i = 0; i < 60; i++)
        nb += (size_t)snprintf(text_b + nb, sizeof text_b - nb,
                               "And the word was %d.\n", i);
    write_file(a, text_a, na);
    write_file(b, text_b, nb);
    prepare(out, "0.1", a, b);

    /* expected stream: a, one 0x00, b */
    size_t n = na + 1 + nb;
    unsigned char *stream = malloc(n);
    memcpy(stream, text_a, na);
    stream[na] = 0;
    memcpy(stream + na + 1, text_b, nb);

    snprintf(train, sizeof train, "%s/train.bin", out);
    snprintf(val, sizeof val, "%s/val.bin", out);
    size_t train_bytes, val_bytes;
    unsigned char *tb = read_file(train, &train_bytes);
    unsigned char *vb = read_file(val, &val_bytes);
    uint64_t ntrain = le64(tb + 24), nval = le64(vb + 24);
    CHECK(memcmp(tb, "DYNMOTOK", 8) == 0 && memcmp(vb, "DYNMOTOK", 8) == 0);
    CHECK(le32(tb + 8) == 1 && le32(tb + 12) == 256 && le32(tb + 16) == 2);
    CHECK(le32(tb + 20) == 0);
    CHECK(train_bytes == 64 + 2 * ntrain && val_bytes == 64 + 2 * nval);
    CHECK_MSG(ntrain + nval == n, "%llu + %llu != %zu", (unsigned long long)ntrain,
              (unsigned long long)nval, n);
    for (int i = 40; i < 64; i++) CHECK(tb[i] == 0 && vb[i] == 0);
    CHECK(le64(tb + 32) == fnv1a(tb + 64, train_bytes - 64));
    CHECK(le64(vb + 32) == fnv1a(vb + 64, val_bytes - 64));
    int mismatches = 0;
    for (size_t i = 0; i < ntrain; i++)
        mismatches += tb[64 + 2 * i] != stream[i] || tb[65 + 2 * i] != 0;
    for (size_t i = 0; i < nval; i++)
        mismatches += vb[64 + 2 * i] != stream[ntrain + i] || vb[65 + 2 * i] != 0;
    CHECK_MSG(mismatches == 0, "%d tokens differ from the input bytes", mismatches);
    /* val is the tail, starting at a line start, within one line of 10% */
    CHECK(stream[ntrain - 1] == '\n');
    CHECK(nval <= n / 10 && nval + 40 >= n / 10);

    struct token_file tf;
    token_file_open(&tf, train, 256, -1, 17);
    CHECK(tf.count == ntrain && tf.vocab == 256);
    CHECK(tf.checksum == le64(tb + 32));
    int *all = malloc(sizeof(int) * ntrain), differ = 0;
    token_file_read(&tf, 0, ntrain, all);
    for (size_t i = 0; i < ntrain; i++) differ += all[i] != stream[i];
    CHECK_MSG(differ == 0, "%d tokens read back differ from the input bytes", differ);
    free(all);

    /* every filled sample is some aligned window of the original bytes */
    const int T = 16;
    struct loader ld;
    loader_init(&ld, &tf, T, 1234);
    CHECK(ld.windows == (long)((ntrain - 1) / T));
    int inputs[4 * 16], targets[4 * 16], bad = 0;
    for (long s = 0; s < 2 * ld.windows; s += 4) {
        loader_fill(&ld, s, 4, inputs, targets);
        for (int k = 0; k < 4; k++) {
            long found = -1;
            for (long w = 0; w < ld.windows && found < 0; w++) {
                int same = 1;
                for (int t = 0; t < T && same; t++)
                    same = inputs[k * T + t] == stream[w * T + t] &&
                           targets[k * T + t] == stream[w * T + t + 1];
                if (same) found = w;
            }
            bad += found < 0;
        }
    }
    CHECK_MSG(bad == 0, "%d samples are not windows of the input", bad);
    loader_free(&ld);
    token_file_close(&tf);
    free(tb);
    free(vb);
    free(stream);
}

/* ---- a corpus whose windows name themselves ------------------------------
 * Window w (stride T) starts with the bytes w & 0xff, w >> 8; the rest is
 * pseudo-random. From a sample's first two inputs we know its window. */

enum { WT = 8, WWINDOWS = 1000 };
static char ids_train[600];
static unsigned char ids_bytes[WT * WWINDOWS + 1];

static void make_id_corpus(void)
{
    char path[512], out[512];
    snprintf(path, sizeof path, "%s/ids.bin", tmpdir);
    snprintf(out, sizeof out, "%s/ids", tmpdir);
    uint64_t x = 88172645463325252ULL;
    for (size_t i = 0; i < sizeof ids_bytes; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids_bytes[i] = (unsigned char)x;
        if (i % WT == 0) ids_bytes[i] = (unsigned char)(i / WT);
        if (i % WT == 1) ids_bytes[i] = (unsigned char)((i / WT) >> 8);
    }
    write_file(path, ids_bytes, sizeof ids_bytes);
    prepare(out, "0.05", path, NULL);
    snprintf(ids_train, sizeof ids_train, "%s/train.bin", out);
}

static long window_of(const int *inputs) { return inputs[0] | inputs[1] << 8; }

static void test_every_window_once(void)
{
    struct token_file tf;
    token_file_open(&tf, ids_train, 256, -1, WT + 1);
    struct loader ld;
    loader_init(&ld, &tf, WT, 42);
    long W = ld.windows;
    CHECK(W == (long)((tf.count - 1) / WT) && W > 900);
    int *inputs = malloc(sizeof(int) * WT * W), *targets = malloc(sizeof(int) * WT * W);
    int *seen = calloc((size_t)W, sizeof(int));
    for (int epoch = 0; epoch < 3; epoch++) {
        memset(seen, 0, sizeof(int) * W);
        loader_fill(&ld, epoch * W, (int)W, inputs, targets);
        int wrong_content = 0, out_of_range = 0, unvisited = 0, twice = 0;
        for (long k = 0; k < W; k++) {
            long w = window_of(inputs + k * WT);
            if (w >= W) {
                out_of_range++;
                continue;
            }
            seen[w]++;
            for (int t = 0; t < WT; t++)
                wrong_content += inputs[k * WT + t] != ids_bytes[w * WT + t] ||
                                 targets[k * WT + t] != ids_bytes[w * WT + t + 1];
        }
        for (long w = 0; w < W; w++) {
            unvisited += seen[w] == 0;
            twice += seen[w] > 1;
        }
        CHECK_MSG(out_of_range == 0 && unvisited == 0 && twice == 0,
                  "epoch %d: %d out of range, %d unvisited, %d more than once",
                  epoch, out_of_range, unvisited, twice);
        CHECK_MSG(wrong_content == 0, "epoch %d: %d wrong tokens", epoch, wrong_content);
    }
    loader_free(&ld);
    token_file_close(&tf);
    free(inputs);
    free(targets);
    free(seen);
}

/* Window ids of samples [first, first + count) under seed. */
static void window_sequence(const struct token_file *tf, uint64_t seed, long first,
                            int count, long *windows)
{
    struct loader ld;
    loader_init(&ld, tf, WT, seed);
    int *inputs = malloc(sizeof(int) * WT * count);
    loader_fill(&ld, first, count, inputs, NULL);
    for (int k = 0; k < count; k++) windows[k] = window_of(inputs + k * WT);
    free(inputs);
    loader_free(&ld);
}

static int count_differences(const long *a, const long *b, int n)
{
    int d = 0;
    for (int i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

static void test_shuffle_determinism(void)
{
    struct token_file tf;
    token_file_open(&tf, ids_train, 256, -1, WT + 1);
    struct loader probe;
    loader_init(&probe, &tf, WT, 0);
    long W = probe.windows;
    loader_free(&probe);
    long *a = malloc(sizeof(long) * W), *b = malloc(sizeof(long) * W);
    long *c = malloc(sizeof(long) * W), *e1 = malloc(sizeof(long) * W);

    window_sequence(&tf, 7, 0, (int)W, a);
    window_sequence(&tf, 7, 0, (int)W, b);
    CHECK(count_differences(a, b, (int)W) == 0);
    window_sequence(&tf, 8, 0, (int)W, c);
    int d_seed = count_differences(a, c, (int)W);
    CHECK_MSG(d_seed > W * 9 / 10, "seeds 7 and 8 differ at only %d of %ld", d_seed, W);
    window_sequence(&tf, 7, W, (int)W, e1);
    int d_epoch = count_differences(a, e1, (int)W);
    CHECK_MSG(d_epoch > W * 9 / 10, "epochs 0 and 1 differ at only %d of %ld",
              d_epoch, W);
    int identity = 0;
    for (long k = 0; k < W; k++) identity += a[k] == k;
    CHECK_MSG(identity < W / 10, "%d of %ld samples in file order", identity, W);

    /* a sample is a pure function of its index: one at a time, in a
     * scattered order across epochs, gives what one batch fill gives */
    struct loader ld;
    loader_init(&ld, &tf, WT, 7);
    int batch_in[64 * WT], batch_tg[64 * WT], one_in[WT], one_tg[WT], diff = 0;
    long first = W - 30;   /* spans the epoch 0 -> 1 boundary */
    loader_fill(&ld, first, 64, batch_in, batch_tg);
    for (int i = 0; i < 64; i++) {
        int k = (i * 37) % 64;
        loader_fill(&ld, 5 * W + k, 1, one_in, NULL);   /* evict the cache */
        loader_fill(&ld, first + k, 1, one_in, one_tg);
        diff += memcmp(one_in, batch_in + k * WT, sizeof one_in) != 0;
        diff += memcmp(one_tg, batch_tg + k * WT, sizeof one_tg) != 0;
    }
    CHECK_MSG(diff == 0, "%d single-sample fills differ from the batch fill", diff);
    loader_free(&ld);
    token_file_close(&tf);
    free(a);
    free(b);
    free(c);
    free(e1);
}

/* ---- data parallelism and restart ---------------------------------------- */

static void test_dp_shares(void)
{
    struct token_file tf;
    token_file_open(&tf, ids_train, 256, -1, WT + 1);
    int sizes[] = {8, 7, 12};
    for (int si = 0; si < 3; si++) {
        int B = sizes[si];
        for (int D = 1; D <= 4; D++) {
            struct loader single, ranks[4];
            loader_init(&single, &tf, WT, 99);
            for (int r = 0; r < D; r++) loader_init(&ranks[r], &tf, WT, 99);
            /* start near the end of epoch 0 so some batches straddle it */
            long start = single.windows - 3 * B;
            single.cursor = start;
            for (int r = 0; r < D; r++) ranks[r].cursor = start;
            int want_in[12 * WT], want_tg[12 * WT], got_in[12 * WT], got_tg[12 * WT];
            int diff = 0, bad_share = 0;
            for (int step = 0; step < 6; step++) {
                CHECK(loader_next(&single, B, 0, 1, want_in, want_tg) == B);
                int filled = 0;
                for (int r = 0; r < D; r++) {
                    int offset, count;
                    loader_dp_share(B, r, D, &offset, &count);
                    bad_share += offset != filled || count < B / D || count > B / D + 1;
                    int n = loader_next(&ranks[r], B, r, D, got_in + filled * WT,
                                        got_tg + filled * WT);
                    bad_share += n != count;
                    filled += n;
                }
                bad_share += filled != B;
                diff += memcmp(got_in, want_in, sizeof(int) * B * WT) != 0;
                diff += memcmp(got_tg, want_tg, sizeof(int) * B * WT) != 0;
            }
            CHECK_MSG(bad_share == 0, "B=%d D=%d: shares not contiguous", B, D);
            CHECK_MSG(diff == 0, "B=%d D=%d: shares differ from one rank's batch", B, D);
            for (int r = 0; r < D; r++) {
                CHECK(ranks[r].cursor == single.cursor);
                loader_free(&ranks[r]);
            }
            loader_free(&single);
        }
    }
    token_file_close(&tf);
}

static void test_cursor_restore(void)
{
    struct token_file tf;
    token_file_open(&tf, ids_train, 256, -1, WT + 1);
    enum { B = 8, BEFORE = 130, AFTER = 20 };
    struct loader first, restarted;
    loader_init(&first, &tf, WT, 5);
    int in[B * WT], tg[B * WT];
    for (int step = 0; step < BEFORE; step++) loader_next(&first, B, 0, 1, in, tg);
    long saved = first.cursor;
    CHECK(saved == (long)B * BEFORE && saved > first.windows);   /* in epoch 1 */
    int *want = malloc(sizeof(int) * AFTER * B * WT * 2);
    for (int step = 0; step < AFTER; step++)
        loader_next(&first, B, 0, 1, want + step * 2 * B * WT,
                    want + (step * 2 + 1) * B * WT);

    /* a fresh process: only the cursor survives */
    loader_init(&restarted, &tf, WT, 5);
    restarted.cursor = saved;
    int diff = 0;
    for (int step = 0; step < AFTER; step++) {
        loader_next(&restarted, B, 0, 1, in, tg);
        diff += memcmp(in, want + step * 2 * B * WT, sizeof in) != 0;
        diff += memcmp(tg, want + (step * 2 + 1) * B * WT, sizeof tg) != 0;
    }
    CHECK_MSG(diff == 0, "%d batches differ after restoring the cursor", diff);
    CHECK(restarted.cursor == first.cursor);
    free(want);
    loader_free(&first);
    loader_free(&restarted);
    token_file_close(&tf);
}

/* ---- rejection of bad token files ---------------------------------------- */

struct open_args {
    const char *path;
    uint32_t model_vocab;
    uint64_t min_tokens;
    int loader_T;   /* > 0: also build a loader with this T */
    int eot;        /* data.eot, -1: none */
};

static void open_in_child(const struct open_args *args)
{
    struct token_file tf;
    token_file_open(&tf, args->path, args->model_vocab, args->eot, args->min_tokens);
    if (args->loader_T > 0) {
        struct loader ld;
        loader_init(&ld, &tf, args->loader_T, 1);
    }
}

/* Runs open_in_child in a child; it must exit 2 with a message on stderr
 * that names the path and contains `problem`. */
static void expect_rejected(const struct open_args *args, const char *problem)
{
    int pipefd[2];
    if (pipe(pipefd) != 0) exit(1);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 2);
        alarm(30);   /* a check that blocks (open of a FIFO) fails instead of hanging */
        open_in_child(args);
        _exit(0);
    }
    close(pipefd[1]);
    char message[2048];
    size_t n = 0;
    ssize_t got;
    while (n < sizeof message - 1 &&
           (got = read(pipefd[0], message + n, sizeof message - 1 - n)) > 0)
        n += (size_t)got;
    message[n] = '\0';
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    CHECK_MSG(code == 2, "%s (%s): exit %d, message: %s", args->path, problem, code,
              message);
    CHECK_MSG(strstr(message, args->path) != NULL,
              "message does not name %s: %s", args->path, message);
    CHECK_MSG(strstr(message, problem) != NULL,
              "message does not say '%s': %s", problem, message);
    CHECK_MSG(strchr(message, '\n') == message + n - 1, "not one line: %s", message);
}

static void write_variant(const char *name, const unsigned char *good, size_t n,
                          size_t at, const void *patch, size_t patch_bytes,
                          char *path, size_t path_size)
{
    snprintf(path, path_size, "%s/%s", tmpdir, name);
    unsigned char *copy = malloc(n);
    memcpy(copy, good, n);
    if (patch) memcpy(copy + at, patch, patch_bytes);
    write_file(path, copy, at > n || patch ? n : at);   /* no patch: truncate at `at` */
    free(copy);
}

static void test_bad_files(void)
{
    size_t n;
    unsigned char *good = read_file(ids_train, &n);
    uint64_t count = le64(good + 24);
    char path[600];
    struct open_args args = {.path = path, .model_vocab = 256, .min_tokens = 1, .eot = -1};

    snprintf(path, sizeof path, "%s/no-such-file.bin", tmpdir);
    expect_rejected(&args, "cannot open");
    snprintf(path, sizeof path, "%s", tmpdir);
    expect_rejected(&args, "is a directory, not a regular file");
    snprintf(path, sizeof path, "%s/fifo.bin", tmpdir);
    CHECK(mkfifo(path, 0600) == 0);
    expect_rejected(&args, "is a FIFO, not a regular file");
    unlink(path);
    snprintf(path, sizeof path, "/dev/null");
    expect_rejected(&args, "is a character device, not a regular file");

    write_variant("magic.bin", good, n, 0, "DYNMOTOX", 8, path, sizeof path);
    expect_rejected(&args, "bad magic");
    unsigned char two[4] = {2, 0, 0, 0};
    write_variant("version.bin", good, n, 8, two, 4, path, sizeof path);
    expect_rejected(&args, "version 2");
    unsigned char big_vocab[4] = {0x2c, 0x01, 0, 0};   /* 300 */
    write_variant("vocab.bin", good, n, 12, big_vocab, 4, path, sizeof path);
    expect_rejected(&args, "vocab 300");
    unsigned char zero[4] = {0, 0, 0, 0};
    write_variant("vocab0.bin", good, n, 12, zero, 4, path, sizeof path);
    expect_rejected(&args, "vocab 0 in its header");
    unsigned char one_byte[4] = {1, 0, 0, 0};
    write_variant("tokenbytes.bin", good, n, 16, one_byte, 4, path, sizeof path);
    expect_rejected(&args, "1-byte tokens");
    write_variant("short.bin", good, n, n - 1, NULL, 0, path, sizeof path);
    expect_rejected(&args, "truncated");
    write_variant("header.bin", good, n, 40, NULL, 0, path, sizeof path);
    expect_rejected(&args, "truncated");
    unsigned char flipped = good[64 + 2 * 100] ^ 0x01;
    write_variant("flipped.bin", good, n, 64 + 2 * 100, &flipped, 1, path, sizeof path);
    expect_rejected(&args, "checksum");
    unsigned char high = 1;   /* token 100 becomes >= 256 */
    write_variant("high.bin", good, n, 64 + 2 * 100 + 1, &high, 1, path, sizeof path);
    expect_rejected(&args, "not below its vocab");

    snprintf(path, sizeof path, "%s", ids_train);
    args.min_tokens = count + 1;
    expect_rejected(&args, "fewer than");
    args.min_tokens = 1;
    args.loader_T = (int)count;   /* needs count + 1 tokens */
    expect_rejected(&args, "too few");
    args.model_vocab = 128;
    args.loader_T = 0;
    expect_rejected(&args, "larger than the model's vocab 128");
    free(good);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dynmo-test-data.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip();
    make_id_corpus();
    test_every_window_once();
    test_shuffle_determinism();
    test_dp_shares();
    test_cursor_restore();
    test_bad_files();
    char command[400];
    snprintf(command, sizeof command, "rm -rf '%s'", tmpdir);
    if (system(command) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return testing_report("test_data");
}
