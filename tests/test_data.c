/* Tests of the token dataset and loader (src/model/data.c,
 * src/model/token_formats.c, docs/data.md): prepare -> open -> fill round
 * trip against the original bytes, the header byte by byte and its
 * checksum recomputed here independently, deterministic shuffling, every
 * window exactly once per epoch, data-parallel shares, cursor restore; the
 * fixtures of tests/data/tokens written by megatron-core and in llm.c's
 * format read as the same stream as the dynmo file of the same ids, lists
 * and patterns, end-of-text tokens between documents (the expected stream
 * built here from the index's own bytes); and rejection of bad token files
 * and of each damaged copy of the fixtures (each in a forked child that
 * must exit 2 with one line naming the file and the problem). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dynmo/model.h"
#include "dynmo/tools.h"
#include "testing.h"
#include "fixture.h"

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
    const char *named;   /* what the message must name, if not path */
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
    const char *named = args->named ? args->named : args->path;
    CHECK_MSG(strstr(message, named) != NULL, "message does not name %s: %s", named, message);
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

/* ---- the fixtures of other tools' formats (tests/data/tokens) -------------- */

static char tokens_dir[1200];

static void fixture_path(char *path, size_t size, const char *name)
{
    snprintf(path, size, "%s/%s", tokens_dir, name);
}

static int *read_stream(const struct token_file *tf)
{
    int *all = malloc(sizeof(int) * (tf->count + 1));
    token_file_read(tf, 0, tf->count, all);
    return all;
}

/* The documents of a Megatron index, from its bytes (the format as
 * megatron-core's _IndexWriter writes it): *documents of them, the token
 * index where each starts (starts[documents] = the token count). */
static uint64_t *megatron_document_starts(const char *prefix, uint64_t *documents)
{
    char path[1400];
    snprintf(path, sizeof path, "%s.idx", prefix);
    size_t n;
    unsigned char *idx = read_file(path, &n);
    uint64_t sequences = le64(idx + 18), entries = le64(idx + 26);
    CHECK(n == 34 + 12 * sequences + 8 * entries);
    uint64_t *sequence_start = calloc(sequences + 1, sizeof(uint64_t));
    for (uint64_t q = 0; q < sequences; q++)
        sequence_start[q + 1] = sequence_start[q] + le32(idx + 34 + 4 * q);
    *documents = entries - 1;
    uint64_t *starts = calloc(entries, sizeof(uint64_t));
    for (uint64_t d = 0; d < entries; d++)
        starts[d] = sequence_start[le64(idx + 34 + 12 * sequences + 8 * d)];
    free(sequence_start);
    free(idx);
    return starts;
}

static void test_fixture_formats(void)
{
    char dynmo[1300], megatron[1300], megatron_idx[1300], llmc[1300];
    fixture_path(dynmo, sizeof dynmo, "gpt2_dynmo.bin");
    fixture_path(megatron, sizeof megatron, "gpt2_megatron");
    fixture_path(megatron_idx, sizeof megatron_idx, "gpt2_megatron.idx");
    fixture_path(llmc, sizeof llmc, "gpt2_llmc.bin");
    struct token_file tf_dynmo, tf_megatron, tf_idx, tf_llmc;
    token_file_open(&tf_dynmo, dynmo, 50257, -1, 2);
    token_file_open(&tf_megatron, megatron, 50257, -1, 2);
    token_file_open(&tf_idx, megatron_idx, 50257, -1, 2);
    token_file_open(&tf_llmc, llmc, 50257, -1, 2);
    uint64_t count = tf_dynmo.count;
    CHECK_MSG(count > 1000 && tf_megatron.count == count && tf_idx.count == count &&
              tf_llmc.count == count, "counts %llu %llu %llu %llu",
              (unsigned long long)count, (unsigned long long)tf_megatron.count,
              (unsigned long long)tf_idx.count, (unsigned long long)tf_llmc.count);
    int *a = read_stream(&tf_dynmo), *b = read_stream(&tf_megatron);
    int *c = read_stream(&tf_idx), *d = read_stream(&tf_llmc);
    int differ = 0, largest = 0;
    for (uint64_t i = 0; i < count; i++) {
        differ += a[i] != b[i] || a[i] != c[i] || a[i] != d[i];
        if (a[i] > largest) largest = a[i];
    }
    CHECK_MSG(differ == 0, "%d tokens differ between the three formats", differ);
    CHECK(largest == 50256);
    /* the same tokens are the same data, whatever the format */
    CHECK(tf_megatron.checksum == tf_llmc.checksum && tf_idx.checksum == tf_llmc.checksum);

    /* the loader draws the same samples from each */
    struct loader from_dynmo, from_megatron;
    loader_init(&from_dynmo, &tf_dynmo, 16, 3);
    loader_init(&from_megatron, &tf_megatron, 16, 3);
    long W = from_dynmo.windows;
    int *in_a = malloc(sizeof(int) * 16 * 2 * W), *in_b = malloc(sizeof(int) * 16 * 2 * W);
    int *tg_a = malloc(sizeof(int) * 16 * 2 * W), *tg_b = malloc(sizeof(int) * 16 * 2 * W);
    loader_fill(&from_dynmo, 0, (int)(2 * W), in_a, tg_a);
    loader_fill(&from_megatron, 0, (int)(2 * W), in_b, tg_b);
    CHECK(from_megatron.windows == W);
    CHECK(memcmp(in_a, in_b, sizeof(int) * 16 * 2 * W) == 0);
    CHECK(memcmp(tg_a, tg_b, sizeof(int) * 16 * 2 * W) == 0);
    loader_free(&from_dynmo);
    loader_free(&from_megatron);
    free(in_a);
    free(in_b);
    free(tg_a);
    free(tg_b);

    /* int32 and uint32 ids beyond 65,535 (Llama 3's vocab) */
    char megatron32[1300], llmc32[1300];
    fixture_path(megatron32, sizeof megatron32, "llama3_megatron");
    fixture_path(llmc32, sizeof llmc32, "llama3_llmc.bin");
    struct token_file tf_m32, tf_l32;
    token_file_open(&tf_m32, megatron32, 128256, -1, 2);
    token_file_open(&tf_l32, llmc32, 128256, -1, 2);
    CHECK(tf_m32.count == tf_l32.count && tf_m32.count > 500);
    int *e = read_stream(&tf_m32), *f = read_stream(&tf_l32);
    int above = 0;
    differ = 0;
    for (uint64_t i = 0; i < tf_m32.count; i++) {
        differ += e[i] != f[i];
        above += e[i] > 65535;
    }
    CHECK_MSG(differ == 0, "%d int32/uint32 tokens differ", differ);
    CHECK_MSG(above > 100, "only %d ids above 65535", above);
    CHECK(e[0] == 128255);

    /* a pattern, in byte order, and a list, in its own order */
    char shard_a[600], shard_b[600], pattern[600], list[2600];
    snprintf(shard_a, sizeof shard_a, "%s/shard_a.bin", tmpdir);
    snprintf(shard_b, sizeof shard_b, "%s/shard_b.bin", tmpdir);
    size_t na, nb;
    unsigned char *bytes_a = read_file(llmc, &na), *bytes_b = read_file(llmc32, &nb);
    write_file(shard_a, bytes_a, na);
    write_file(shard_b, bytes_b, nb);
    snprintf(pattern, sizeof pattern, "%s/shard_*.bin", tmpdir);
    struct token_file tf_glob, tf_list;
    token_file_open(&tf_glob, pattern, 128256, -1, 2);
    snprintf(list, sizeof list, "%s,%s", shard_b, shard_a);
    token_file_open(&tf_list, list, 128256, -1, 2);
    CHECK(tf_glob.input_count == 2 && tf_glob.count == count + tf_l32.count);
    CHECK(tf_list.input_count == 2 && tf_list.count == count + tf_l32.count);
    int *g = read_stream(&tf_glob), *h = read_stream(&tf_list);
    differ = 0;
    for (uint64_t i = 0; i < count; i++) differ += g[i] != d[i] || h[tf_l32.count + i] != d[i];
    for (uint64_t i = 0; i < tf_l32.count; i++) differ += g[count + i] != f[i] || h[i] != f[i];
    CHECK_MSG(differ == 0, "%d tokens of the pattern or the list out of place", differ);
    CHECK(tf_glob.checksum != tf_list.checksum);
    free(bytes_a);
    free(bytes_b);
    free(g);
    free(h);
    token_file_close(&tf_glob);
    token_file_close(&tf_list);

    /* end-of-text tokens: between the llm.c shard and the dataset, and
     * between the dataset's documents; every window read in the middle of
     * the stream matches */
    enum { EOT = 50256 };
    uint64_t documents;
    uint64_t *starts = megatron_document_starts(megatron, &documents);
    CHECK(documents == 12 && starts[documents] == count);
    uint64_t expected_count = count + 1 + count + documents - 1;
    int *expected = malloc(sizeof(int) * expected_count);
    uint64_t at = 0;
    for (uint64_t i = 0; i < count; i++) expected[at++] = d[i];
    for (uint64_t doc = 0; doc < documents; doc++) {
        expected[at++] = EOT;
        for (uint64_t i = starts[doc]; i < starts[doc + 1]; i++) expected[at++] = b[i];
    }
    CHECK(at == expected_count);
    struct token_file tf_eot;
    snprintf(list, sizeof list, "%s,%s", llmc, megatron);
    token_file_open(&tf_eot, list, 50257, EOT, 2);
    CHECK_MSG(tf_eot.count == expected_count, "%llu tokens with end-of-text, want %llu",
              (unsigned long long)tf_eot.count, (unsigned long long)expected_count);
    if (tf_eot.count == expected_count) {
        int *got = read_stream(&tf_eot), window[7], bad = 0;
        differ = 0;
        for (uint64_t i = 0; i < expected_count; i++) differ += got[i] != expected[i];
        for (uint64_t first = 0; first + 7 <= expected_count; first++) {
            token_file_read(&tf_eot, first, 7, window);
            bad += memcmp(window, expected + first, sizeof window) != 0;
        }
        CHECK_MSG(differ == 0 && bad == 0, "%d tokens, %d windows differ with end-of-text",
                  differ, bad);
        free(got);
    }
    CHECK(tf_eot.checksum != tf_llmc.checksum);
    token_file_close(&tf_eot);
    /* one dynmo file with eot set is the file itself */
    struct token_file tf_one;
    token_file_open(&tf_one, dynmo, 50257, EOT, 2);
    CHECK(tf_one.count == count && tf_one.checksum == tf_dynmo.checksum);
    token_file_close(&tf_one);

    free(starts);
    free(expected);
    free(a);
    free(b);
    free(c);
    free(d);
    free(e);
    free(f);
    token_file_close(&tf_dynmo);
    token_file_close(&tf_megatron);
    token_file_close(&tf_idx);
    token_file_close(&tf_llmc);
    token_file_close(&tf_m32);
    token_file_close(&tf_l32);
}

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A copy of a Megatron fixture as tmpdir/name.{idx,bin}: the index with
 * bytes [at, at + patch_bytes) replaced (or, patch NULL, cut to at bytes;
 * or, extra > 0, extra zero bytes appended), the data cut to data_bytes
 * (SIZE_MAX: whole). Returns the prefix in path. */
static void megatron_variant(const char *fixture, const char *name, size_t at,
                             const void *patch, size_t patch_bytes, size_t extra,
                             size_t data_bytes, char *path, size_t path_size)
{
    char from[1300], to[1300];
    snprintf(path, path_size, "%s/%s", tmpdir, name);
    size_t n;
    snprintf(from, sizeof from, "%s/%s.idx", tokens_dir, fixture);
    unsigned char *idx = read_file(from, &n);
    unsigned char *copy = calloc(n + extra, 1);
    memcpy(copy, idx, n);
    if (patch) memcpy(copy + at, patch, patch_bytes);
    snprintf(to, sizeof to, "%s.idx", path);
    write_file(to, copy, patch || extra ? n + extra : at < n ? at : n);
    snprintf(from, sizeof from, "%s/%s.bin", tokens_dir, fixture);
    unsigned char *bin = read_file(from, &n);
    snprintf(to, sizeof to, "%s.bin", path);
    write_file(to, bin, data_bytes < n ? data_bytes : n);
    free(idx);
    free(copy);
    free(bin);
}

static void test_bad_fixtures(void)
{
    char path[1300], named[1400], good_path[1300];
    size_t n;
    struct open_args args = {.path = path, .model_vocab = 50257, .min_tokens = 1, .eot = -1};

    /* llm.c shards */
    fixture_path(good_path, sizeof good_path, "gpt2_llmc.bin");
    unsigned char *good = read_file(good_path, &n);
    unsigned char word[4];
    put_le32(word, 2);
    write_variant("llmc_version.bin", good, n, 4, word, 4, path, sizeof path);
    expect_rejected(&args, "has version 2 (byte 4)");
    put_le32(word, 0xffffffffu);
    write_variant("llmc_negative.bin", good, n, 8, word, 4, path, sizeof path);
    expect_rejected(&args, "negative token count -1 (byte 8)");
    write_variant("llmc_short.bin", good, n, n - 1, NULL, 0, path, sizeof path);
    expect_rejected(&args, "truncated or corrupt: the header says");
    write_variant("llmc_header.bin", good, n, 500, NULL, 0, path, sizeof path);
    expect_rejected(&args, "shorter than the 1024-byte header");
    unsigned char high[2] = {0xff, 0xff};
    write_variant("llmc_high.bin", good, n, 1024 + 2 * 5, high, 2, path, sizeof path);
    expect_rejected(&args, "token 65535 at byte 1034 (position 5) is not below model.vocab 50257");
    put_le32(word, 20240522);
    write_variant("llmc_eval.bin", good, n, 0, word, 4, path, sizeof path);
    expect_rejected(&args, "llm.c evaluation file");
    put_le32(word, 0);
    write_variant("llmc_count0.bin", good, n, 8, word, 4, path, sizeof path);
    expect_rejected(&args, "the header says 0 tokens");
    free(good);
    fixture_path(path, sizeof path, "llama3_llmc.bin");
    args.model_vocab = 100000;
    expect_rejected(&args, "is not below model.vocab 100000");
    args.model_vocab = 50257;

    /* Megatron datasets: the index, then the data against it */
    unsigned char byte, eight[8];
    megatron_variant("gpt2_megatron", "m_magic", 0, "MMIDIDY", 7, 0, SIZE_MAX, path,
                     sizeof path);
    expect_rejected(&args, "bad magic");
    put_le64(eight, 2);
    megatron_variant("gpt2_megatron", "m_version", 9, eight, 8, 0, SIZE_MAX, path, sizeof path);
    expect_rejected(&args, "version 2 (byte 9)");
    byte = 7;
    megatron_variant("gpt2_megatron", "m_float", 17, &byte, 1, 0, SIZE_MAX, path, sizeof path);
    expect_rejected(&args, "dtype code 7 (byte 17), which dynmo cannot hold as token ids");
    byte = 9;
    megatron_variant("gpt2_megatron", "m_code9", 17, &byte, 1, 0, SIZE_MAX, path, sizeof path);
    expect_rejected(&args, "dtype code 9 (byte 17)");
    megatron_variant("gpt2_megatron", "m_header", 20, NULL, 0, 0, SIZE_MAX, path, sizeof path);
    expect_rejected(&args, "shorter than the 34-byte header");
    fixture_path(good_path, sizeof good_path, "gpt2_megatron.idx");
    good = read_file(good_path, &n);
    uint64_t sequences = le64(good + 18), entries = le64(good + 26);
    megatron_variant("gpt2_megatron", "m_cut", n - 8, NULL, 0, 0, SIZE_MAX, path, sizeof path);
    expect_rejected(&args, "is truncated: its header says");
    megatron_variant("gpt2_megatron", "m_modes", 0, NULL, 0, sequences, SIZE_MAX, path,
                     sizeof path);
    expect_rejected(&args, "multimodal");
    megatron_variant("gpt2_megatron", "m_padded", 0, NULL, 0, 3, SIZE_MAX, path, sizeof path);
    expect_rejected(&args, "but its header's counts");
    put_le32(word, 0xffffffffu);
    megatron_variant("gpt2_megatron", "m_length", 34 + 4 * 2, word, 4, 0, SIZE_MAX, path,
                     sizeof path);
    expect_rejected(&args, "sequence 2 has length -1 (byte 42)");
    size_t pointers = 34 + 4 * sequences;
    put_le64(eight, le64(good + pointers + 8) + 2);
    megatron_variant("gpt2_megatron", "m_pointer", pointers + 8, eight, 8, 0, SIZE_MAX, path,
                     sizeof path);
    expect_rejected(&args, "sequence 1 starts at byte");
    size_t document_index = pointers + 8 * sequences;
    put_le64(eight, 1);
    megatron_variant("gpt2_megatron", "m_doc0", document_index, eight, 8, 0, SIZE_MAX, path,
                     sizeof path);
    expect_rejected(&args, "document index entry 0");
    put_le64(eight, sequences - 1);
    megatron_variant("gpt2_megatron", "m_doclast", document_index + 8 * (entries - 1), eight, 8,
                     0, SIZE_MAX, path, sizeof path);
    expect_rejected(&args, "never decreasing");
    unsigned char empty[34 + 8] = {0};   /* no sequence; document index [0] */
    memcpy(empty, "MMIDIDX\0\0", 9);
    put_le64(empty + 9, 1);
    empty[17] = 8;
    put_le64(empty + 26, 1);
    snprintf(path, sizeof path, "%s/m_empty", tmpdir);
    snprintf(named, sizeof named, "%s.idx", path);
    write_file(named, empty, sizeof empty);
    snprintf(named, sizeof named, "%s.bin", path);
    write_file(named, empty, 0);
    expect_rejected(&args, "has no documents");
    free(good);
    fixture_path(good_path, sizeof good_path, "gpt2_megatron.bin");
    good = read_file(good_path, &n);
    megatron_variant("gpt2_megatron", "m_bin", SIZE_MAX, NULL, 0, 0, n - 2, path, sizeof path);
    snprintf(named, sizeof named, "%s.bin", path);
    args.named = named;
    expect_rejected(&args, "but its index");
    args.named = NULL;
    free(good);
    megatron_variant("gpt2_megatron", "m_nobin", SIZE_MAX, NULL, 0, 0, SIZE_MAX, path,
                     sizeof path);
    snprintf(named, sizeof named, "%s.bin", path);
    unlink(named);
    args.named = named;
    expect_rejected(&args, "cannot open token file");
    args.named = NULL;
    snprintf(path, sizeof path, "%s/no_such_prefix", tmpdir);
    expect_rejected(&args, "no Megatron dataset's prefix");
    /* a token the model cannot hold, and a negative one */
    fixture_path(good_path, sizeof good_path, "gpt2_megatron.bin");
    good = read_file(good_path, &n);
    megatron_variant("gpt2_megatron", "m_high", SIZE_MAX, NULL, 0, 0, SIZE_MAX, path,
                     sizeof path);
    write_variant("m_high.bin", good, n, 6, high, 2, named, sizeof named);
    expect_rejected(&args, "token 65535 at byte 6 (position 3) is not below model.vocab 50257");
    free(good);
    fixture_path(good_path, sizeof good_path, "llama3_megatron.bin");
    good = read_file(good_path, &n);
    megatron_variant("llama3_megatron", "m_negative", SIZE_MAX, NULL, 0, 0, SIZE_MAX, path,
                     sizeof path);
    put_le32(word, (uint32_t)-5);
    snprintf(named, sizeof named, "%s.bin", path);
    write_variant("m_negative.bin", good, n, 4 * 7, word, 4, named, sizeof named);
    args.model_vocab = 128256;
    expect_rejected(&args, "token -5 at byte 28 (position 7) is negative");
    free(good);
    fixture_path(path, sizeof path, "llama3_megatron");
    args.model_vocab = 65536;
    expect_rejected(&args, "is not below model.vocab 65536");
    args.model_vocab = 50257;
    /* names: an index not called .idx, a data file named for its prefix */
    fixture_path(good_path, sizeof good_path, "gpt2_megatron.idx");
    good = read_file(good_path, &n);
    write_variant("index_without_suffix", good, n, 0, "M", 1, path, sizeof path);
    expect_rejected(&args, "not named PREFIX.idx");
    free(good);
    fixture_path(path, sizeof path, "gpt2_megatron.bin");
    expect_rejected(&args, "name the prefix");

    /* lists and patterns */
    char list[2700], llmc[1300];
    fixture_path(llmc, sizeof llmc, "gpt2_llmc.bin");
    args.path = list;
    snprintf(list, sizeof list, "%s,,%s", llmc, llmc);
    expect_rejected(&args, "has an empty element (element 2)");
    snprintf(list, sizeof list, "%s,", llmc);
    expect_rejected(&args, "has an empty element (element 2)");
    snprintf(list, sizeof list, "%s/nothing_*.bin", tmpdir);
    expect_rejected(&args, "matches no file");
    snprintf(list, sizeof list, "%s,%s/llmc_version.bin", llmc, tmpdir);
    snprintf(named, sizeof named, "%s/llmc_version.bin", tmpdir);
    args.named = named;
    expect_rejected(&args, "has version 2 (byte 4)");
    args.named = "data.eot";
    snprintf(list, sizeof list, "%s", llmc);
    args.eot = 50257;
    expect_rejected(&args, "data.eot = 50257 is not a token of the model's vocab 50257");
    args.eot = -1;
    args.named = "the path is empty";
    list[0] = '\0';
    expect_rejected(&args, "no token file named");
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
    char reference[1100];
    CHECK_MSG(fixture_dir(reference, sizeof reference, "fixture_tiny.bin"),
              "cannot find tests/reference (run from the repository)");
    snprintf(tokens_dir, sizeof tokens_dir, "%s/../data/tokens", reference);
    test_fixture_formats();
    test_bad_fixtures();
    char command[400];
    snprintf(command, sizeof command, "rm -rf '%s'", tmpdir);
    if (system(command) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return testing_report("test_data");
}
