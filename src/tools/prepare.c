/* `dynmo prepare`: text files -> byte-level token files (docs/data.md).
 * Every byte is one token; the files are joined with one 0x00 byte between
 * them and the last fraction of the stream, moved forward to a line start,
 * becomes validation data. Everything is read and checked before anything
 * is created, and both outputs are written to temporaries and renamed, so
 * a failure leaves the previous outputs untouched. The format is the
 * model's (token_file_write_bytes); this file only drives it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "dynmo/model.h"
#include "dynmo/tools.h"

#define BYTE_VOCAB 256

static const char prepare_usage[] =
    "usage: dynmo prepare --out DIR [--val-fraction F] FILE...\n"
    "\n"
    "Turns text files into byte-level token files for training: every byte\n"
    "is one token (vocab 256). The files are joined in the order given with\n"
    "one 0x00 byte between consecutive files; the last fraction F of the\n"
    "stream (moved forward to the next line start) becomes validation data.\n"
    "Writes DIR/train.bin and DIR/val.bin atomically (docs/data.md).\n"
    "\n"
    "  --out DIR           output directory (created if missing)\n"
    "  --val-fraction F    share of tokens for validation, 0 < F <= 0.5\n"
    "                      (default 0.05)\n"
    "  --help              this text\n";

/* The whole input in memory, as bytes (= tokens). */
struct byte_buffer {
    unsigned char *data;
    size_t size, capacity;
};

static void buffer_reserve(struct byte_buffer *buf, size_t extra)
{
    if (buf->size + extra <= buf->capacity) return;
    size_t capacity = buf->capacity ? buf->capacity : (1 << 20);
    while (capacity < buf->size + extra) capacity *= 2;
    unsigned char *data = realloc(buf->data, capacity);
    if (!data) DM_FATAL("out of memory reading %zu bytes of input", capacity);
    buf->data = data;
    buf->capacity = capacity;
}

static void read_whole_file(struct byte_buffer *buf, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) dm_user_error("prepare: cannot open %s: %s", path, dm_errno_text());
    for (;;) {
        buffer_reserve(buf, 1 << 20);
        size_t got = fread(buf->data + buf->size, 1, buf->capacity - buf->size, f);
        buf->size += got;
        if (got == 0) break;
    }
    if (ferror(f)) dm_user_error("prepare: cannot read %s: %s", path, dm_errno_text());
    fclose(f);
}

/* Parses F for --val-fraction; a problem is a user error naming it. */
static double parse_val_fraction(const char *text)
{
    char *end;
    errno = 0;
    double f = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !(f > 0.0 && f <= 0.5))
        dm_user_error("prepare: --val-fraction must be a number in (0, 0.5], "
                      "got '%s'", text);
    return f;
}

/* Value of option `name` at argv[*i], as "--name VALUE" or "--name=VALUE";
 * NULL if argv[*i] is not this option. */
static const char *option_value(int argc, char **argv, int *i, const char *name)
{
    size_t len = strlen(name);
    const char *arg = argv[*i];
    if (strncmp(arg, name, len) != 0) return NULL;
    if (arg[len] == '=') return arg + len + 1;
    if (arg[len] != '\0') return NULL;
    if (*i + 1 >= argc)
        dm_user_error("prepare: %s needs a value (see `dynmo prepare --help`)", name);
    return argv[++*i];
}

struct prepare_args {
    const char *out_dir;
    double val_fraction;
    const char **inputs;    /* (argc) */
    int num_inputs;
};

/* Returns 1 when --help was asked (and printed). */
static int parse_args(int argc, char **argv, struct prepare_args *a)
{
    int only_files = 0;
    a->out_dir = NULL;
    a->val_fraction = 0.05;
    a->inputs = dm_alloc((size_t)argc * sizeof *a->inputs);
    a->num_inputs = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value;
        if (only_files || arg[0] != '-' || arg[1] == '\0') {
            a->inputs[a->num_inputs++] = arg;
        } else if (strcmp(arg, "--") == 0) {
            only_files = 1;
        } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(prepare_usage, stdout);
            return 1;
        } else if ((value = option_value(argc, argv, &i, "--out"))) {
            if (!*value) dm_user_error("prepare: --out needs a directory");
            a->out_dir = value;
        } else if ((value = option_value(argc, argv, &i, "--val-fraction"))) {
            a->val_fraction = parse_val_fraction(value);
        } else {
            dm_user_error("prepare: unknown option '%s' (see `dynmo prepare --help`)",
                          arg);
        }
    }
    if (!a->out_dir)
        dm_user_error("prepare: no output directory: give --out DIR "
                      "(see `dynmo prepare --help`)");
    if (a->num_inputs == 0)
        dm_user_error("prepare: no input files: give one or more text files "
                      "(see `dynmo prepare --help`)");
    return 0;
}

/* Every input joined with one 0x00 between files, read and checked before
 * anything is created; returns where validation starts (a line start
 * where one follows the cut). */
static size_t read_inputs(struct byte_buffer *stream, const struct prepare_args *a)
{
    for (int k = 0; k < a->num_inputs; k++) {
        if (k > 0) {
            buffer_reserve(stream, 1);
            stream->data[stream->size++] = 0x00;   /* file separator */
        }
        read_whole_file(stream, a->inputs[k]);
    }
    size_t n = stream->size;
    if (n <= (size_t)(a->num_inputs - 1)) {
        if (a->num_inputs == 1)
            dm_user_error("prepare: the input is empty: %s has no bytes", a->inputs[0]);
        dm_user_error("prepare: the input is empty: all %d files have no bytes",
                      a->num_inputs);
    }
    size_t val_target = (size_t)(a->val_fraction * (double)n);
    if (val_target == 0)
        dm_user_error("prepare: the input is too small to split: %zu bytes, and "
                      "--val-fraction %g leaves no validation token", n, a->val_fraction);
    size_t cut = n - val_target;
    if (stream->data[cut - 1] != '\n') {
        unsigned char *newline = memchr(stream->data + cut, '\n', n - cut);
        if (newline && (size_t)(newline - stream->data) + 1 < n)
            cut = (size_t)(newline - stream->data) + 1;
    }
    return cut;
}

/* Before anything is read or written: DIR/train.bin and DIR/val.bin may be
 * new, or token files (an earlier prepare's, which are replaced), never a
 * file of another kind and never one of the inputs. */
static void check_outputs(const struct prepare_args *a)
{
    const char *names[2] = {"train.bin", "val.bin"};
    for (int k = 0; k < 2; k++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", a->out_dir, names[k]);
        struct stat out;
        if (stat(path, &out) != 0) continue;   /* new (or an error the write reports) */
        for (int i = 0; i < a->num_inputs; i++) {
            struct stat in;
            if (stat(a->inputs[i], &in) == 0 && in.st_dev == out.st_dev &&
                in.st_ino == out.st_ino)
                dm_user_error("prepare: %s is one of the inputs: write to another --out",
                              path);
        }
        char magic[sizeof TOKEN_FILE_MAGIC - 1];
        FILE *f = S_ISREG(out.st_mode) ? fopen(path, "rb") : NULL;
        int ours = f && fread(magic, 1, sizeof magic, f) == sizeof magic &&
                   !memcmp(magic, TOKEN_FILE_MAGIC, sizeof magic);
        if (f) fclose(f);
        if (!ours)
            dm_user_error("prepare: %s exists and is not a token file (a file dynmo prepare "
                          "wrote): write to another --out, or remove it first", path);
    }
}

/* DIR/train.bin and DIR/val.bin: both temporaries complete before either
 * rename, so an error leaves the previous outputs (if any) untouched and
 * no partial file behind. */
static void write_outputs(const char *out_dir, const struct byte_buffer *stream, size_t cut,
                          uint64_t checksums[2], char final_paths[2][1200])
{
    if (dm_make_dirs(out_dir, NULL, 0) != 0)
        dm_user_error("prepare: cannot create output directory %s: %s",
                      out_dir, dm_errno_text());
    const char *names[2] = {"train.bin", "val.bin"};
    const unsigned char *parts[2] = {stream->data, stream->data + cut};
    size_t sizes[2] = {cut, stream->size - cut};
    char temp_paths[2][1200];
    for (int k = 0; k < 2; k++) {
        snprintf(final_paths[k], 1200, "%s/%s", out_dir, names[k]);
        snprintf(temp_paths[k], sizeof temp_paths[k], "%s/.%s.tmp.%ld", out_dir,
                 names[k], (long)getpid());
    }
    for (int k = 0; k < 2; k++) {
        if (token_file_write_bytes(temp_paths[k], parts[k], sizes[k], &checksums[k]) != 0) {
            int saved_errno = errno;
            for (int j = 0; j <= k; j++) unlink(temp_paths[j]);
            errno = saved_errno;
            dm_user_error("prepare: cannot write %s: %s", final_paths[k],
                          dm_errno_text());
        }
    }
    for (int k = 0; k < 2; k++)
        if (rename(temp_paths[k], final_paths[k]) != 0) {
            int saved_errno = errno;
            for (int j = k; j < 2; j++) unlink(temp_paths[j]);
            errno = saved_errno;
            dm_user_error("prepare: cannot rename %s to %s: %s", temp_paths[k],
                          final_paths[k], dm_errno_text());
        }
    dm_fsync_path(out_dir, NULL, 0);
}

int cmd_prepare(int argc, char **argv)
{
    struct prepare_args a;
    if (parse_args(argc, argv, &a)) {
        dm_free(a.inputs);
        return DM_EXIT_OK;
    }
    check_outputs(&a);
    struct byte_buffer stream = {0};
    size_t cut = read_inputs(&stream, &a), n = stream.size;
    uint64_t checksums[2];
    char final_paths[2][1200];
    write_outputs(a.out_dir, &stream, cut, checksums, final_paths);
    dm_startup_done();   /* the directories made are the output's from here on */
    dm_log("prepare: %d file%s, %zu bytes -> %zu byte-level tokens (vocab %d)\n",
           a.num_inputs, a.num_inputs == 1 ? "" : "s", n - (size_t)(a.num_inputs - 1), n,
           BYTE_VOCAB);
    size_t sizes[2] = {cut, n - cut};
    for (int k = 0; k < 2; k++)
        dm_log("prepare: %-5s %10zu tokens -> %s (checksum %016llx)\n",
               k == 0 ? "train" : "val", sizes[k], final_paths[k],
               (unsigned long long)checksums[k]);
    free(stream.data);
    dm_free(a.inputs);
    return DM_EXIT_OK;
}
