/* The token dataset: the stream of tokens dynmo trains on, made of one or
 * more inputs (dynmo's own files, llm.c shards, Megatron datasets: their
 * readers are token_formats.c) named by a path, a comma-separated list or a
 * pattern, joined in order with an optional end-of-text token between
 * documents; writing byte-level token files (for `dynmo prepare`,
 * src/tools/prepare.c); and the deterministic loader that cuts the stream
 * into windows and serves them in a per-epoch permutation by global sample
 * index.
 *
 * A sample must be a pure function of (stream, T, seed, sample index): that
 * is what lets a restart, a re-pack onto fewer ranks or a different
 * data-parallel width see exactly the same data stream. So nothing here
 * keeps hidden state that changes what a sample is (the cached permutation
 * is only a cache), and nothing here calls MPI. The formats and the
 * sampling rules are in docs/data.md. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dynmo/model.h"
#include "token_input.h"

#define TOKEN_BYTES 2
#define BYTE_VOCAB 256
#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL
/* Keeps the data order's random draws apart from every other stream. */
#define DATA_STREAM 0x64796e6d6f646174ULL   /* "dynmodat" */

/* ---- header encoding ---------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void header_encode(unsigned char header[TOKEN_FILE_HEADER_BYTES],
                          uint32_t vocab, uint64_t count, uint64_t checksum)
{
    memset(header, 0, TOKEN_FILE_HEADER_BYTES);
    memcpy(header, TOKEN_FILE_MAGIC, 8);
    put_u32(header + 8, TOKEN_FILE_VERSION);
    put_u32(header + 12, vocab);
    put_u32(header + 16, TOKEN_BYTES);
    put_u64(header + 24, count);
    put_u64(header + 32, checksum);
}

/* ---- the token stream: inputs named by a path, a list or a pattern -------------- */

/* The names of a stream's inputs, in order: owned strings. */
struct name_list {
    char **names;
    size_t count, capacity;
};

static void name_list_add(struct name_list *l, const char *name, size_t len)
{
    if (l->count == l->capacity) {
        l->capacity = l->capacity ? 2 * l->capacity : 8;
        l->names = realloc(l->names, l->capacity * sizeof *l->names);
        if (!l->names) DM_FATAL("out of memory listing token files");
    }
    char *copy = malloc(len + 1);
    if (!copy) DM_FATAL("out of memory listing token files");
    memcpy(copy, name, len);
    copy[len] = '\0';
    l->names[l->count++] = copy;
}

static void name_list_free(struct name_list *l)
{
    for (size_t i = 0; i < l->count; i++) free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One element of the list: a name that exists (or names a Megatron
 * prefix) as itself; else, holding *, ? or [, a pattern whose matches are
 * added in byte order (not the locale's). */
static int expand_element(struct name_list *l, const char *element, char *err, size_t errsize)
{
    struct stat st;
    char idx[1100];
    snprintf(idx, sizeof idx, "%s.idx", element);
    if (!strpbrk(element, "*?[") || stat(element, &st) == 0 || stat(idx, &st) == 0) {
        name_list_add(l, element, strlen(element));
        return 0;
    }
    glob_t g;
    int rc = glob(element, GLOB_NOSORT, NULL, &g);
    if (rc == GLOB_NOMATCH) TOKEN_FAIL("token file pattern %s matches no file", element);
    if (rc != 0) {
        globfree(&g);
        TOKEN_FAIL("cannot expand token file pattern %s (%s)", element,
             rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, compare_names);
    for (size_t i = 0; i < g.gl_pathc; i++) name_list_add(l, g.gl_pathv[i], strlen(g.gl_pathv[i]));
    globfree(&g);
    return 0;
fail:
    return -1;
}

/* The comma-separated elements of path, each expanded. */
static int list_inputs(struct name_list *l, const char *path, char *err, size_t errsize)
{
    if (!path[0]) TOKEN_FAIL("no token file named: the path is empty");
    int element = 1;
    for (const char *p = path;; element++) {
        size_t len = strcspn(p, ",");
        if (len == 0)
            TOKEN_FAIL("token file list '%s' has an empty element (element %d): name a file "
                 "between every two commas", path, element);
        char one[1024];
        snprintf(one, sizeof one, "%.*s", (int)len, p);
        if (expand_element(l, one, err, errsize) != 0) goto fail;
        if (p[len] == '\0') break;
        p += len + 1;
    }
    return 0;
fail:
    return -1;
}

/* The stream's identity: a single dynmo file keeps its header's checksum
 * (what runs and checkpoints recorded before lists existed); anything else
 * is FNV-1a 64 over each input's hash, the end-of-text token and the count. */
static uint64_t stream_checksum(const struct token_file *tf)
{
    if (tf->input_count == 1 && tf->inputs[0].format == TOKEN_FORMAT_DYNMO)
        return tf->inputs[0].hash;
    uint64_t h = FNV_OFFSET;
    unsigned char word[8];
    for (int i = 0; i <= tf->input_count + 1; i++) {
        uint64_t v = i < tf->input_count ? tf->inputs[i].hash
                   : i == tf->input_count ? (uint64_t)(int64_t)tf->eot : tf->count;
        put_u64(word, v);
        for (int b = 0; b < 8; b++) h = (h ^ word[b]) * FNV_PRIME;
    }
    return h;
}

int token_file_try_open(struct token_file *tf, const char *path, uint32_t model_vocab, int eot,
                        uint64_t min_tokens, char *err, size_t errsize)
{
    memset(tf, 0, sizeof *tf);
    struct name_list names = {0};
    if (strlen(path) >= sizeof tf->path)
        TOKEN_FAIL("token file path is longer than %zu bytes: %.80s...", sizeof tf->path - 1, path);
    strcpy(tf->path, path);
    if (eot >= 0 && (uint32_t)eot >= model_vocab)
        TOKEN_FAIL("data.eot = %d is not a token of the model's vocab %u", eot, model_vocab);
    tf->eot = eot < 0 ? -1 : eot;
    if (list_inputs(&names, path, err, errsize) != 0) goto fail;
    tf->inputs = dm_alloc(names.count * sizeof *tf->inputs);
    uint64_t position = 0;
    for (size_t i = 0; i < names.count; i++) {
        struct token_input *in = &tf->inputs[i];
        if (token_input_open(in, names.names[i], model_vocab, err, errsize) != 0) goto fail;
        tf->input_count++;
        in->first = position;
        in->span = in->count + (tf->eot >= 0 ? in->documents - 1 + (i > 0) : 0);
        position += in->span;
        if (in->bound > tf->vocab) tf->vocab = in->bound;
    }
    tf->count = position;
    if (tf->eot >= 0 && (uint32_t)tf->eot + 1 > tf->vocab) tf->vocab = (uint32_t)tf->eot + 1;
    if (tf->count < min_tokens)
        TOKEN_FAIL("token file %s has %llu tokens, fewer than the %llu needed (one sequence plus its "
             "target)", path, (unsigned long long)tf->count, (unsigned long long)min_tokens);
    tf->checksum = stream_checksum(tf);
    name_list_free(&names);
    return 0;
fail:
    name_list_free(&names);
    token_file_close(tf);
    return -1;
}

#undef FAIL

void token_file_open(struct token_file *tf, const char *path, uint32_t model_vocab, int eot,
                     uint64_t min_tokens)
{
    char err[1024];
    if (token_file_try_open(tf, path, model_vocab, eot, min_tokens, err, sizeof err) != 0)
        dm_user_error_local("%s", err);
}

void token_file_from_memory(struct token_file *tf, const char *name, const uint32_t *tokens,
                            uint64_t count, uint32_t vocab)
{
    memset(tf, 0, sizeof *tf);
    snprintf(tf->path, sizeof tf->path, "%s", name);
    tf->inputs = dm_alloc(sizeof *tf->inputs);
    tf->input_count = 1;
    struct token_input *in = &tf->inputs[0];
    snprintf(in->name, sizeof in->name, "%s", name);
    in->format = TOKEN_FORMAT_MEMORY;
    in->dtype = TOKEN_U32;
    in->item_bytes = 4;
    in->tokens = (const unsigned char *)tokens;
    in->count = in->span = count;
    in->bound = vocab;
    in->documents = 1;
    tf->vocab = vocab;
    tf->count = count;
    tf->eot = -1;
}

void token_file_close(struct token_file *tf)
{
    for (int i = 0; i < tf->input_count; i++) token_input_close(&tf->inputs[i]);
    dm_free(tf->inputs);
    memset(tf, 0, sizeof *tf);
}

/* Where stream position p reads from: one end-of-text token (*run 1,
 * *source NULL), or *run tokens of *source from its token *k on. */
static void locate(const struct token_file *tf, uint64_t p, const struct token_input **source,
                   uint64_t *k, uint64_t *run)
{
    int lo = 0, hi = tf->input_count - 1;   /* the last input starting at or before p */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (tf->inputs[mid].first <= p) lo = mid;
        else hi = mid - 1;
    }
    const struct token_input *in = &tf->inputs[lo];
    uint64_t q = p - in->first;
    *source = NULL;
    *run = 1;
    if (tf->eot >= 0 && lo > 0) {
        if (q == 0) return;   /* the end-of-text token before this input */
        q--;
    }
    if (tf->eot < 0 || in->documents == 1) {
        *source = in;
        *k = q;
        *run = in->count - q;
        return;
    }
    /* document d's first token sits at q = start(d) + d (d end-of-text
     * tokens before it): the last d with start(d) + d <= q */
    uint64_t dlo = 0, dhi = in->documents - 1;
    while (dlo < dhi) {
        uint64_t mid = dlo + (dhi - dlo + 1) / 2;
        if (token_input_document_start(in, mid) + mid <= q) dlo = mid;
        else dhi = mid - 1;
    }
    uint64_t end = token_input_document_start(in, dlo + 1);
    *k = q - dlo;
    if (*k == end) {
        DM_ASSERT(dlo + 1 < in->documents);
        return;   /* the end-of-text token after document dlo */
    }
    *source = in;
    *run = end - *k;
}

void token_file_read(const struct token_file *tf, uint64_t first, size_t n, int *out)
{
    DM_ASSERT(first <= tf->count && n <= tf->count - first);
    while (n > 0) {
        const struct token_input *in;
        uint64_t k, run;
        locate(tf, first, &in, &k, &run);
        size_t m = run < n ? (size_t)run : n;
        if (in) token_input_decode(out, in, k, m);
        else out[0] = tf->eot;
        out += m;
        first += m;
        n -= m;
    }
}

/* ---- writing a token file ----------------------------------------------- */

int token_file_write_bytes(const char *path, const unsigned char *bytes, size_t n,
                           uint64_t *checksum_out)
{
    enum { CHUNK = 1 << 16 };
    static uint16_t chunk[CHUNK];
    uint64_t checksum = FNV_OFFSET;
    for (size_t i = 0; i < n; i++) {
        checksum = (checksum ^ bytes[i]) * FNV_PRIME;
        checksum = checksum * FNV_PRIME;   /* the high byte, always 0 */
    }
    *checksum_out = checksum;

    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return -1;
    unsigned char header[TOKEN_FILE_HEADER_BYTES];
    header_encode(header, BYTE_VOCAB, n, checksum);
    int rc = dm_write_all(fd, header, sizeof header);
    for (size_t done = 0; rc == 0 && done < n; done += CHUNK) {
        size_t m = n - done < CHUNK ? n - done : CHUNK;
        for (size_t i = 0; i < m; i++) chunk[i] = bytes[done + i];
        rc = dm_write_all(fd, chunk, m * sizeof chunk[0]);
    }
    if (rc == 0) rc = fsync(fd);
    int saved_errno = errno;
    if (close(fd) != 0 && rc == 0) return -1;
    errno = saved_errno;
    return rc;
}

/* ---- the loader ----------------------------------------------------------- */

/* Fisher-Yates driven by the counter-based RNG: draw i depends only on
 * (seed, epoch, i), so any rank computes the same permutation. */
static void epoch_permutation(long *perm, long windows, uint64_t seed, long epoch)
{
    for (long w = 0; w < windows; w++) perm[w] = w;
    uint64_t stream = DATA_STREAM ^ (uint64_t)epoch;
    for (long i = windows - 1; i > 0; i--) {
        uint64_t r = dm_hash64(seed, stream, (uint64_t)i);
        long j = (long)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
        long t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void loader_init(struct loader *ld, const struct token_file *tf, int T, uint64_t seed)
{
    DM_ASSERT(T >= 1);
    memset(ld, 0, sizeof *ld);
    if (tf->count < (uint64_t)T + 1)
        dm_user_error_local("token file %s has %llu tokens, too few for one "
                            "sequence of %d tokens plus its target", tf->path,
                            (unsigned long long)tf->count, T);
    ld->tf = tf;
    ld->T = T;
    ld->seed = seed;
    ld->windows = (long)((tf->count - 1) / (uint64_t)T);
    ld->perm = dm_alloc((size_t)ld->windows * sizeof *ld->perm);
    ld->cached_epoch = -1;
    ld->cursor = 0;
}

void loader_free(struct loader *ld)
{
    dm_free(ld->perm);
    memset(ld, 0, sizeof *ld);
}

void loader_fill(struct loader *ld, long first_sample, int count,
                 int *inputs, int *targets)
{
    DM_ASSERT(first_sample >= 0 && count >= 0);
    const int T = ld->T;
    for (int k = 0; k < count; k++) {
        long sample = first_sample + k;
        long epoch = sample / ld->windows;
        if (epoch != ld->cached_epoch) {
            epoch_permutation(ld->perm, ld->windows, ld->seed, epoch);
            ld->cached_epoch = epoch;
        }
        uint64_t start = (uint64_t)ld->perm[sample % ld->windows] * (uint64_t)T;
        if (inputs) token_file_read(ld->tf, start, (size_t)T, inputs + (size_t)k * T);
        if (targets) token_file_read(ld->tf, start + 1, (size_t)T, targets + (size_t)k * T);
    }
}

void loader_dp_share(int global_count, int dp_rank, int dp_size,
                     int *offset, int *count)
{
    DM_ASSERT(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size && global_count >= 0);
    int base = global_count / dp_size, extra = global_count % dp_size;
    *offset = dp_rank * base + (dp_rank < extra ? dp_rank : extra);
    *count = base + (dp_rank < extra ? 1 : 0);
}

int loader_next(struct loader *ld, int global_count, int dp_rank, int dp_size,
                int *inputs, int *targets)
{
    int offset, count;
    loader_dp_share(global_count, dp_rank, dp_size, &offset, &count);
    loader_fill(ld, ld->cursor + offset, count, inputs, targets);
    ld->cursor += global_count;
    return count;
}
