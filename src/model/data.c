/* The token dataset: writing byte-level token files (for `dynmo prepare`,
 * src/tools/prepare.c), opening and validating them, and the deterministic loader
 * that cuts a token file into windows and serves them in a per-epoch
 * permutation by global sample index.
 *
 * A sample must be a pure function of (file, T, seed, sample index): that
 * is what lets a restart, a re-pack onto fewer ranks or a different
 * data-parallel width see exactly the same data stream. So nothing here
 * keeps hidden state that changes what a sample is (the cached permutation
 * is only a cache), and nothing here calls MPI. The format and the
 * sampling rules are in docs/data.md. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dynmo/model.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "token files are mapped as little-endian uint16");

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

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
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

uint64_t token_checksum(const uint16_t *tokens, uint64_t count)
{
    uint64_t h = FNV_OFFSET;
    for (uint64_t i = 0; i < count; i++) {
        h = (h ^ (tokens[i] & 0xffu)) * FNV_PRIME;
        h = (h ^ (uint64_t)(tokens[i] >> 8)) * FNV_PRIME;
    }
    return h;
}

/* ---- token files -------------------------------------------------------- */

/* Writes the message of a failed check into err (token_file_try_open). */
static void token_file_say(char *err, size_t errsize, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void token_file_say(char *err, size_t errsize, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errsize, fmt, ap);
    va_end(ap);
}

/* A failed check: its message into err, then the common way out. */
#define TOKEN_FAIL(...)                            \
    do {                                           \
        token_file_say(err, errsize, __VA_ARGS__); \
        goto fail;                                 \
    } while (0)

/* What a token file's header says, checked against the file's size and
 * the model: 0, or -1 with the message in err. */
struct token_header {
    uint32_t vocab;
    uint64_t count, checksum;
};

static int check_header(struct token_header *h, const unsigned char *header, size_t size,
                        const char *path, uint32_t model_vocab, uint64_t min_tokens,
                        char *err, size_t errsize)
{
    if (memcmp(header, TOKEN_FILE_MAGIC, 8) != 0)
        TOKEN_FAIL("%s is not a dynmo token file (bad magic; make one with `dynmo prepare`)",
                   path);
    uint32_t version = get_u32(header + 8);
    if (version != TOKEN_FILE_VERSION)
        TOKEN_FAIL("token file %s has version %u; this dynmo reads version %d (re-run "
                   "`dynmo prepare`)", path, version, TOKEN_FILE_VERSION);
    h->vocab = get_u32(header + 12);
    uint32_t token_bytes = get_u32(header + 16);
    h->count = get_u64(header + 24);
    h->checksum = get_u64(header + 32);
    if (token_bytes != TOKEN_BYTES)
        TOKEN_FAIL("token file %s has %u-byte tokens; this dynmo reads %d-byte tokens", path,
                   token_bytes, TOKEN_BYTES);
    if (h->vocab == 0)
        TOKEN_FAIL("token file %s has vocab 0 in its header: no token can be valid (a corrupt "
                   "header; re-run `dynmo prepare`)", path);
    if (h->vocab > model_vocab)
        TOKEN_FAIL("token file %s has vocab %u, larger than the model's vocab %u (set "
                   "model.vocab)", path, h->vocab, model_vocab);
    uint64_t payload = size - TOKEN_FILE_HEADER_BYTES;
    if (h->count > UINT64_MAX / TOKEN_BYTES || payload != h->count * TOKEN_BYTES)
        TOKEN_FAIL("token file %s is truncated or corrupt: the header says %llu tokens but "
                   "the file holds %llu bytes of tokens", path, (unsigned long long)h->count,
                   (unsigned long long)payload);
    if (h->count < min_tokens)
        TOKEN_FAIL("token file %s has %llu tokens, fewer than the %llu needed (one sequence "
                   "plus its target)", path, (unsigned long long)h->count,
                   (unsigned long long)min_tokens);
    return 0;
fail:
    return -1;
}

/* One pass checks every token: a token >= vocab would index past the
 * embedding, and the checksum catches a file changed after prepare. */
static int check_tokens(const uint16_t *tokens, const struct token_header *h, const char *path,
                        char *err, size_t errsize)
{
    for (uint64_t i = 0; i < h->count; i++)
        if (tokens[i] >= h->vocab)
            TOKEN_FAIL("token file %s is corrupt: token %u at position %llu is not below "
                       "its vocab %u", path, tokens[i], (unsigned long long)i, h->vocab);
    uint64_t actual = token_checksum(tokens, h->count);
    if (actual != h->checksum)
        TOKEN_FAIL("token file %s is corrupt: checksum %016llx, header says %016llx (re-run "
                   "`dynmo prepare`)", path, (unsigned long long)actual,
                   (unsigned long long)h->checksum);
    return 0;
fail:
    return -1;
}

/* Opens path without blocking (a regular file only) and reads its header;
 * the descriptor and the file's size come back. */
static int open_and_read_header(const char *path, unsigned char *header, int *fd_out,
                                size_t *size_out, char *err, size_t errsize)
{
    const char *kind;
    int fd = dm_open_regular(path, &kind);
    *fd_out = fd;
    if (fd < 0 && kind)
        TOKEN_FAIL("token file %s is %s, not a regular file (name a file made by `dynmo "
                   "prepare`)", path, kind);
    if (fd < 0)
        TOKEN_FAIL("cannot open token file %s: %s (make one with `dynmo prepare`)", path,
                   dm_errno_text());
    struct stat st;
    if (fstat(fd, &st) != 0)
        TOKEN_FAIL("cannot stat token file %s: %s", path, dm_errno_text());
    size_t size = *size_out = (size_t)st.st_size;
    ssize_t got = size >= TOKEN_FILE_HEADER_BYTES
                      ? pread(fd, header, TOKEN_FILE_HEADER_BYTES, 0) : 0;
    if (got < 0) TOKEN_FAIL("cannot read token file %s: %s", path, dm_errno_text());
    if (size < TOKEN_FILE_HEADER_BYTES || got != (ssize_t)TOKEN_FILE_HEADER_BYTES)
        TOKEN_FAIL("token file %s is truncated: %zu bytes, shorter than the %d-byte header",
                   path, size, TOKEN_FILE_HEADER_BYTES);
    return 0;
fail:
    return -1;
}

int token_file_try_open(struct token_file *tf, const char *path, uint32_t model_vocab,
                        uint64_t min_tokens, char *err, size_t errsize)
{
    memset(tf, 0, sizeof *tf);
    int fd = -1;
    void *map = MAP_FAILED;
    size_t size = 0;
    if (strlen(path) >= sizeof tf->path)
        TOKEN_FAIL("token file path is longer than %zu bytes: %.80s...", sizeof tf->path - 1,
                   path);
    strcpy(tf->path, path);
    unsigned char header[TOKEN_FILE_HEADER_BYTES];
    struct token_header h;
    if (open_and_read_header(path, header, &fd, &size, err, errsize) != 0 ||
        check_header(&h, header, size, path, model_vocab, min_tokens, err, errsize) != 0)
        goto fail;
    map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) TOKEN_FAIL("cannot map token file %s: %s", path, dm_errno_text());
    close(fd);
    fd = -1;
    const uint16_t *tokens =
        (const uint16_t *)((const char *)map + TOKEN_FILE_HEADER_BYTES);
    if (check_tokens(tokens, &h, path, err, errsize) != 0) goto fail;
    tf->vocab = h.vocab;
    tf->count = h.count;
    tf->checksum = h.checksum;
    tf->tokens = tokens;
    tf->map = map;
    tf->map_bytes = size;
    return 0;

fail:
    if (map != MAP_FAILED) munmap(map, size);
    if (fd >= 0) close(fd);
    memset(tf, 0, sizeof *tf);
    return -1;
}

#undef TOKEN_FAIL

void token_file_open(struct token_file *tf, const char *path,
                     uint32_t model_vocab, uint64_t min_tokens)
{
    char err[1024];
    if (token_file_try_open(tf, path, model_vocab, min_tokens, err, sizeof err) != 0)
        dm_user_error_local("%s", err);
}

void token_file_close(struct token_file *tf)
{
    if (tf->map) DM_CHECK_SYS(munmap(tf->map, tf->map_bytes));
    memset(tf, 0, sizeof *tf);
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
        long window = ld->perm[sample % ld->windows];
        const uint16_t *src = ld->tf->tokens + (size_t)window * (size_t)T;
        if (inputs)
            for (int t = 0; t < T; t++) inputs[(size_t)k * T + t] = src[t];
        if (targets)
            for (int t = 0; t < T; t++) targets[(size_t)k * T + t] = src[t + 1];
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
