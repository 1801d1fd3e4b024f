/* Readers of the token files dynmo trains on, each detected by its first
 * bytes: dynmo's own (DYNMOTOK, `dynmo prepare`), an llm.c token shard
 * (magic 20240520 or 20240801 in a 256-int32 header) and a Megatron /
 * megatron-core indexed dataset (PREFIX.idx, magic "MMIDIDX\0\0", beside
 * PREFIX.bin). Each input is memory-mapped and checked whole before
 * training starts: header, sizes, every token id against the model's
 * vocabulary. A problem is one line naming the file and the byte offset
 * where it is; this file never ends the job itself (data.c's callers decide
 * how), and it reads no token it has not checked. The formats are in
 * docs/data.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dynmo/model.h"
#include "token_input.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "token files are mapped as little-endian integers");

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

#define LLMC_HEADER_BYTES 1024          /* 256 int32 */
#define LLMC_MAGIC_UINT16 20240520      /* llm.c's GPT-2 shards, version 1 */
#define LLMC_MAGIC_UINT32 20240801      /* llm.c's Llama 3 shards, version 7 */
#define LLMC_MAGIC_EVAL 20240522        /* llm.c's multiple-choice eval files */

#define MEGATRON_MAGIC "MMIDIDX\0\0"
#define MEGATRON_MAGIC_BYTES 9
#define MEGATRON_HEADER_BYTES 34        /* magic, u64 version, u8 dtype, u64 x 2 counts */

static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int64_t get_i64(const unsigned char *p)
{
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* ---- token types ---------------------------------------------------------------- */

static int dtype_bytes(enum token_dtype t)
{
    switch (t) {
    case TOKEN_U8: case TOKEN_I8: return 1;
    case TOKEN_I16: case TOKEN_U16: return 2;
    case TOKEN_I32: case TOKEN_U32: return 4;
    case TOKEN_I64: return 8;
    }
    return 0;
}

static const char *dtype_name(enum token_dtype t)
{
    static const char *const names[] = {"uint8", "int8", "int16", "uint16", "int32", "uint32",
                                        "int64"};
    return names[t];
}

/* The token of type t at p as int64. */
static int64_t token_at(const unsigned char *p, enum token_dtype t)
{
    switch (t) {
    case TOKEN_U8: return p[0];
    case TOKEN_I8: return (int8_t)p[0];
    case TOKEN_I16: return (int16_t)get_u16(p);
    case TOKEN_U16: return get_u16(p);
    case TOKEN_I32: return (int32_t)get_u32(p);
    case TOKEN_U32: return get_u32(p);
    case TOKEN_I64: return get_i64(p);
    }
    return 0;
}

/* out[0..n) = the n tokens at src as int64, whatever their type. */
static void decode_wide(int64_t *out, const unsigned char *src, enum token_dtype t, size_t n)
{
    size_t bytes = (size_t)dtype_bytes(t);
    for (size_t i = 0; i < n; i++) out[i] = token_at(src + i * bytes, t);
}

void token_input_decode(int *out, const struct token_input *in, uint64_t first, size_t n)
{
    enum { CHUNK = 256 };
    int64_t wide[CHUNK];
    const unsigned char *src = in->tokens + first * (uint64_t)in->item_bytes;
    for (size_t done = 0; done < n; done += CHUNK) {
        size_t m = n - done < CHUNK ? n - done : CHUNK;
        decode_wide(wide, src + done * (size_t)in->item_bytes, in->dtype, m);
        for (size_t i = 0; i < m; i++) out[done + i] = (int)wide[i];   /* checked < bound */
    }
}

/* What check_token_values hashes into in->hash: FNV-1a 64 over the token
 * ids, one 32-bit word each; or over the bytes of uint16 tokens as stored
 * (a dynmo file's header checksum). */
enum token_checksum { CHECKSUM_OF_IDS, CHECKSUM_OF_UINT16_BYTES };

/* Every token of in (already mapped) must be >= 0 and below in->bound; a
 * message starts with subject (which names the file) and gives the byte
 * offset in that file, the tokens starting at data_offset. */
static int check_token_values(struct token_input *in, const char *subject,
                              uint64_t data_offset, const char *bound_name,
                              enum token_checksum checksum_kind, char *err, size_t errsize)
{
    enum { CHUNK = 4096 };
    int64_t wide[CHUNK];
    uint64_t hash = FNV_OFFSET;
    /* Read once, front to back; the pages read are let go every 64 MiB,
     * so that checking a corpus larger than memory keeps none of it
     * resident (the loader maps back in only the windows it draws). */
    const size_t release_every = (size_t)64 << 20, page = (size_t)sysconf(_SC_PAGESIZE);
    size_t released = 0;
    if (in->map && in->count > 0) madvise(in->map, in->map_bytes, MADV_SEQUENTIAL);
    for (uint64_t done = 0; done < in->count; done += CHUNK) {
        size_t m = in->count - done < CHUNK ? (size_t)(in->count - done) : CHUNK;
        size_t read_to = (size_t)(data_offset + (done + m) * (uint64_t)in->item_bytes);
        if (in->map && read_to - released >= release_every) {
            size_t to = read_to / page * page;
            madvise((char *)in->map + released, to - released, MADV_DONTNEED);
            released = to;
        }
        decode_wide(wide, in->tokens + done * (uint64_t)in->item_bytes, in->dtype, m);
        for (size_t i = 0; i < m; i++) {
            if (wide[i] < 0 || wide[i] >= (int64_t)in->bound) {
                unsigned long long at = data_offset + (done + i) * (uint64_t)in->item_bytes;
                TOKEN_FAIL("%s: token %lld at byte %llu (position %llu) is %s %s %u", subject,
                     (long long)wide[i], at, (unsigned long long)(done + i),
                     wide[i] < 0 ? "negative; ids run from 0 to" : "not below", bound_name,
                     in->bound);
            }
            if (checksum_kind == CHECKSUM_OF_IDS) {
                hash = (hash ^ (uint64_t)(uint32_t)wide[i]) * FNV_PRIME;
            } else {
                hash = (hash ^ ((uint64_t)wide[i] & 0xff)) * FNV_PRIME;
                hash = (hash ^ ((uint64_t)wide[i] >> 8)) * FNV_PRIME;
            }
        }
    }
    if (in->map && in->count > 0) {
        madvise((char *)in->map + released, in->map_bytes - released, MADV_DONTNEED);
        madvise(in->map, in->map_bytes, MADV_NORMAL);
    }
    in->hash = hash;
    return 0;
fail:
    return -1;
}

/* ---- opening and mapping ---------------------------------------------------------- */

/* Opens path (a regular file only, never blocking) and maps it whole,
 * read-only; an empty file maps nothing. */
static int map_file(const char *path, void **map, size_t *bytes, char *err, size_t errsize)
{
    *map = NULL;
    *bytes = 0;
    const char *kind;
    int fd = dm_open_regular(path, &kind);
    if (fd < 0 && kind)
        TOKEN_FAIL("token file %s is %s, not a regular file (name a token file, or a Megatron "
             "dataset's prefix: docs/data.md)", path, kind);
    if (fd < 0) TOKEN_FAIL("cannot open token file %s: %s", path, dm_errno_text());
    struct stat st;
    if (fstat(fd, &st) != 0) TOKEN_FAIL("cannot stat token file %s: %s", path, dm_errno_text());
    *bytes = (size_t)st.st_size;
    if (*bytes > 0) {
        void *m = mmap(NULL, *bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) TOKEN_FAIL("cannot map token file %s: %s", path, dm_errno_text());
        *map = m;
    }
    close(fd);
    return 0;
fail:
    if (fd >= 0) close(fd);
    *bytes = 0;
    return -1;
}

void token_input_close(struct token_input *in)
{
    if (in->map) DM_CHECK_SYS(munmap(in->map, in->map_bytes));
    if (in->index_map) DM_CHECK_SYS(munmap(in->index_map, in->index_map_bytes));
    memset(in, 0, sizeof *in);
}

/* ---- dynmo's own files (DYNMOTOK) ------------------------------------------------- */

static int dynmo_open(struct token_input *in, uint32_t model_vocab, char *err, size_t errsize)
{
    const char *path = in->name;
    const unsigned char *header = in->map;
    size_t size = in->map_bytes;
    if (size < TOKEN_FILE_HEADER_BYTES)
        TOKEN_FAIL("token file %s is truncated: %zu bytes, shorter than the %d-byte header", path,
             size, TOKEN_FILE_HEADER_BYTES);
    uint32_t version = get_u32(header + 8);
    if (version != TOKEN_FILE_VERSION)
        TOKEN_FAIL("token file %s has version %u (byte 8); this dynmo reads version %d (re-run "
             "`dynmo prepare`)", path, version, TOKEN_FILE_VERSION);
    uint32_t vocab = get_u32(header + 12), token_bytes = get_u32(header + 16);
    uint64_t count = get_u64(header + 24), checksum = get_u64(header + 32);
    if (token_bytes != 2)
        TOKEN_FAIL("token file %s has %u-byte tokens (byte 16); this dynmo reads 2-byte tokens",
             path, token_bytes);
    if (vocab == 0)
        TOKEN_FAIL("token file %s has vocab 0 in its header (byte 12): no token can be valid (a "
             "corrupt header; re-run `dynmo prepare`)", path);
    if (vocab > model_vocab)
        TOKEN_FAIL("token file %s has vocab %u (byte 12), larger than the model's vocab %u (set "
             "model.vocab)", path, vocab, model_vocab);
    uint64_t payload = size - TOKEN_FILE_HEADER_BYTES;
    if (count > UINT64_MAX / 2 || payload != count * 2)
        TOKEN_FAIL("token file %s is truncated or corrupt: the header says %llu tokens (byte 24) "
             "but the file holds %llu bytes of tokens", path, (unsigned long long)count,
             (unsigned long long)payload);
    in->format = TOKEN_FORMAT_DYNMO;
    in->dtype = TOKEN_U16;
    in->item_bytes = 2;
    in->tokens = header + TOKEN_FILE_HEADER_BYTES;
    in->count = count;
    in->bound = vocab;
    char subject[1200];
    snprintf(subject, sizeof subject, "token file %s is corrupt", path);
    if (check_token_values(in, subject, TOKEN_FILE_HEADER_BYTES, "its vocab",
                           CHECKSUM_OF_UINT16_BYTES, err, errsize) != 0)
        goto fail;
    if (in->hash != checksum)
        TOKEN_FAIL("token file %s is corrupt: checksum %016llx, header says %016llx (byte 32; re-run "
             "`dynmo prepare`)", path, (unsigned long long)in->hash,
             (unsigned long long)checksum);
    return 0;
fail:
    return -1;
}

/* ---- llm.c token shards ------------------------------------------------------------ */

static int llmc_open(struct token_input *in, uint32_t model_vocab, char *err, size_t errsize)
{
    const char *path = in->name;
    const unsigned char *header = in->map;
    size_t size = in->map_bytes;
    uint32_t magic = get_u32(header);
    int wide = magic == LLMC_MAGIC_UINT32;
    int32_t want_version = wide ? 7 : 1;
    if (size < LLMC_HEADER_BYTES)
        TOKEN_FAIL("llm.c token shard %s is truncated: %zu bytes, shorter than the %d-byte header",
             path, size, LLMC_HEADER_BYTES);
    int32_t version = (int32_t)get_u32(header + 4), count = (int32_t)get_u32(header + 8);
    if (version != want_version)
        TOKEN_FAIL("llm.c token shard %s has version %d (byte 4); magic %u goes with version %d "
             "(%s tokens)", path, version, magic, want_version, wide ? "uint32" : "uint16");
    in->format = TOKEN_FORMAT_LLMC;
    in->dtype = wide ? TOKEN_U32 : TOKEN_U16;
    in->item_bytes = dtype_bytes(in->dtype);
    if (count < 0)
        TOKEN_FAIL("llm.c token shard %s has a negative token count %d (byte 8)", path, count);
    uint64_t payload = size - LLMC_HEADER_BYTES;
    if (payload != (uint64_t)count * (uint64_t)in->item_bytes)
        TOKEN_FAIL("llm.c token shard %s is truncated or corrupt: the header says %d tokens (byte 8), "
             "%llu bytes of %s tokens, but the file holds %llu bytes after the %d-byte header",
             path, count, (unsigned long long)count * (unsigned long long)in->item_bytes,
             dtype_name(in->dtype), (unsigned long long)payload, LLMC_HEADER_BYTES);
    if (count == 0) TOKEN_FAIL("llm.c token shard %s holds no tokens (byte 8 says 0)", path);
    in->tokens = header + LLMC_HEADER_BYTES;
    in->count = (uint64_t)count;
    in->bound = model_vocab;
    char subject[1200];
    snprintf(subject, sizeof subject, "llm.c token shard %s", path);
    return check_token_values(in, subject, LLMC_HEADER_BYTES, "model.vocab", CHECKSUM_OF_IDS, err,
                              errsize);
fail:
    return -1;
}

/* ---- Megatron indexed datasets -------------------------------------------------- */

/* megatron-core's DType codes (megatron/core/datasets/indexed_dataset.py);
 * 6 (float64) and 7 (float32) are not token ids. */
static int megatron_dtype(uint8_t code, enum token_dtype *t)
{
    switch (code) {
    case 1: *t = TOKEN_U8; return 0;
    case 2: *t = TOKEN_I8; return 0;
    case 3: *t = TOKEN_I16; return 0;
    case 4: *t = TOKEN_I32; return 0;
    case 5: *t = TOKEN_I64; return 0;
    case 8: *t = TOKEN_U16; return 0;
    }
    return -1;
}

uint64_t token_input_document_start(const struct token_input *in, uint64_t d)
{
    if (in->format != TOKEN_FORMAT_MEGATRON) return d == 0 ? 0 : in->count;
    uint64_t sequence = get_u64(in->document_index + 8 * d);
    if (sequence == in->sequences) return in->count;
    return get_u64(in->pointers + 8 * sequence) / (uint64_t)in->item_bytes;
}

/* The index's header and arrays, checked against each other: what the
 * data file must then hold is *data_bytes. */
static int megatron_check_index(struct token_input *in, const char *idx, uint64_t *data_bytes,
                                char *err, size_t errsize)
{
    const unsigned char *p = in->index_map;
    size_t size = in->index_map_bytes;
    if (size < MEGATRON_HEADER_BYTES)
        TOKEN_FAIL("Megatron index %s is truncated: %zu bytes, shorter than the %d-byte header", idx,
             size, MEGATRON_HEADER_BYTES);
    if (memcmp(p, MEGATRON_MAGIC, MEGATRON_MAGIC_BYTES) != 0)
        TOKEN_FAIL("Megatron index %s has a bad magic (bytes 0-8 are not \"MMIDIDX\\0\\0\")", idx);
    uint64_t version = get_u64(p + 9);
    if (version != 1)
        TOKEN_FAIL("Megatron index %s has version %llu (byte 9); this dynmo reads version 1", idx,
             (unsigned long long)version);
    uint8_t code = p[17];
    if (megatron_dtype(code, &in->dtype) != 0)
        TOKEN_FAIL("Megatron index %s has dtype code %u (byte 17), which dynmo cannot hold as token "
             "ids: it reads the integer codes 1 (uint8), 2 (int8), 3 (int16), 4 (int32), "
             "5 (int64) and 8 (uint16)%s", idx, code,
             code == 6 || code == 7 ? "; 6 and 7 are floating point" : "");
    in->item_bytes = dtype_bytes(in->dtype);
    uint64_t sequences = get_u64(p + 18), entries = get_u64(p + 26);
    uint64_t room = size - MEGATRON_HEADER_BYTES;
    if (sequences > room / 12 || entries > room / 8 || 12 * sequences + 8 * entries > room)
        TOKEN_FAIL("Megatron index %s is truncated: its header says %llu sequences (byte 18) and "
             "%llu document index entries (byte 26), more than its %zu bytes hold", idx,
             (unsigned long long)sequences, (unsigned long long)entries, size);
    uint64_t expected = MEGATRON_HEADER_BYTES + 12 * sequences + 8 * entries;
    if (size != expected)
        TOKEN_FAIL("Megatron index %s is %zu bytes, but its header's counts (%llu sequences, %llu "
             "document index entries) make %llu%s", idx, size, (unsigned long long)sequences,
             (unsigned long long)entries, (unsigned long long)expected,
             size == expected + sequences ? " (the extra byte per sequence is a multimodal "
             "dataset's modes: dynmo reads token datasets only)" : "");
    if (entries < 2)
        TOKEN_FAIL("Megatron index %s has no documents (its document index, byte 26, has %llu "
             "entries)", idx, (unsigned long long)entries);
    const unsigned char *lengths = p + MEGATRON_HEADER_BYTES;
    in->pointers = lengths + 4 * sequences;
    in->document_index = in->pointers + 8 * sequences;
    in->sequences = sequences;
    in->documents = entries - 1;
    uint64_t at = 0;   /* the next sequence's byte offset in the data file */
    for (uint64_t s = 0; s < sequences; s++) {
        int32_t length = (int32_t)get_u32(lengths + 4 * s);
        uint64_t pointer = get_u64(in->pointers + 8 * s);
        if (length < 0)
            TOKEN_FAIL("Megatron index %s: sequence %llu has length %d (byte %llu)", idx,
                 (unsigned long long)s, length,
                 (unsigned long long)(MEGATRON_HEADER_BYTES + 4 * s));
        if (pointer != at)
            TOKEN_FAIL("Megatron index %s: sequence %llu starts at byte %llu of the data (pointer at "
                 "byte %llu), but the sequences before it end at byte %llu", idx,
                 (unsigned long long)s, (unsigned long long)pointer,
                 (unsigned long long)(in->pointers - p + 8 * s), (unsigned long long)at);
        at += (uint64_t)length * (uint64_t)in->item_bytes;
    }
    uint64_t previous = 0;
    for (uint64_t d = 0; d < entries; d++) {
        uint64_t first = get_u64(in->document_index + 8 * d);
        unsigned long long byte = (unsigned long long)(in->document_index - p + 8 * d);
        if ((d == 0 && first != 0) || first < previous || first > sequences ||
            (d == entries - 1 && first != sequences))
            TOKEN_FAIL("Megatron index %s: document index entry %llu (byte %llu) is %llu; entries "
                 "run from 0 up to the sequence count %llu, never decreasing", idx,
                 (unsigned long long)d, byte, (unsigned long long)first,
                 (unsigned long long)sequences);
        previous = first;
    }
    *data_bytes = at;
    return 0;
fail:
    return -1;
}

/* The dataset PREFIX.idx + PREFIX.bin, in->name the prefix. */
static int megatron_open(struct token_input *in, uint32_t model_vocab, char *err,
                         size_t errsize)
{
    char idx[sizeof in->name + 4], bin[sizeof in->name + 4];
    snprintf(idx, sizeof idx, "%s.idx", in->name);
    snprintf(bin, sizeof bin, "%s.bin", in->name);
    uint64_t data_bytes;
    if (map_file(idx, &in->index_map, &in->index_map_bytes, err, errsize) != 0 ||
        megatron_check_index(in, idx, &data_bytes, err, errsize) != 0 ||
        map_file(bin, &in->map, &in->map_bytes, err, errsize) != 0)
        return -1;
    /* read once; with data.eot the loader maps back the few pages it searches */
    madvise(in->index_map, in->index_map_bytes, MADV_DONTNEED);
    if (in->map_bytes != data_bytes)
        TOKEN_FAIL("Megatron data %s is %zu bytes, but its index %s says %llu (%llu sequences of "
             "%s tokens)", bin, in->map_bytes, idx, (unsigned long long)data_bytes,
             (unsigned long long)in->sequences, dtype_name(in->dtype));
    in->format = TOKEN_FORMAT_MEGATRON;
    in->tokens = in->map;
    in->count = data_bytes / (uint64_t)in->item_bytes;
    in->bound = model_vocab;
    if (in->count == 0) TOKEN_FAIL("Megatron dataset %s holds no tokens", in->name);
    char subject[1200];
    snprintf(subject, sizeof subject, "Megatron data %s", bin);
    return check_token_values(in, subject, 0, "model.vocab", CHECKSUM_OF_IDS, err, errsize);
fail:
    return -1;
}

/* ---- detection ------------------------------------------------------------------ */

int token_input_open(struct token_input *in, const char *name, uint32_t model_vocab,
                     char *err, size_t errsize)
{
    memset(in, 0, sizeof *in);
    if (strlen(name) + 4 >= sizeof in->name)
        TOKEN_FAIL("token file path is longer than %zu bytes: %.80s...", sizeof in->name - 5, name);
    strcpy(in->name, name);
    in->documents = 1;
    struct stat st;
    if (stat(name, &st) != 0 && errno == ENOENT) {
        char idx[sizeof in->name];
        snprintf(idx, sizeof idx, "%s.idx", name);
        if (stat(idx, &st) == 0) {
            if (megatron_open(in, model_vocab, err, errsize) != 0) goto fail;
            return 0;
        }
        errno = ENOENT;
        TOKEN_FAIL("cannot open token file %s: %s (and there is no %s, so it is no Megatron "
             "dataset's prefix either)", name, dm_errno_text(), idx);
    }
    if (map_file(name, &in->map, &in->map_bytes, err, errsize) != 0) goto fail;
    const unsigned char *head = in->map;
    size_t size = in->map_bytes;
    if (size >= 8 && memcmp(head, TOKEN_FILE_MAGIC, 8) == 0) {
        if (dynmo_open(in, model_vocab, err, errsize) != 0) goto fail;
        return 0;
    }
    if (size >= MEGATRON_MAGIC_BYTES && memcmp(head, MEGATRON_MAGIC, MEGATRON_MAGIC_BYTES) == 0) {
        if (!ends_with(name, ".idx"))
            TOKEN_FAIL("token file %s is a Megatron index (magic MMIDIDX) not named PREFIX.idx: "
                 "rename it so, beside its PREFIX.bin, and name the prefix", name);
        DM_CHECK_SYS(munmap(in->map, in->map_bytes));
        in->map = NULL;
        in->map_bytes = 0;
        in->name[strlen(in->name) - 4] = '\0';
        if (megatron_open(in, model_vocab, err, errsize) != 0) goto fail;
        return 0;
    }
    uint32_t magic = size >= 4 ? get_u32(head) : 0;
    if (magic == LLMC_MAGIC_UINT16 || magic == LLMC_MAGIC_UINT32) {
        if (llmc_open(in, model_vocab, err, errsize) != 0) goto fail;
        return 0;
    }
    if (magic == LLMC_MAGIC_EVAL)
        TOKEN_FAIL("token file %s is an llm.c evaluation file (magic %u), not a token shard", name,
             magic);
    char hint[2 * sizeof in->name + 128] = "";
    if (ends_with(name, ".bin")) {
        char prefix[sizeof in->name], idx[sizeof in->name + 4];
        snprintf(prefix, sizeof prefix, "%s", name);
        prefix[strlen(prefix) - 4] = '\0';   /* the name less .bin */
        snprintf(idx, sizeof idx, "%s.idx", prefix);
        if (stat(idx, &st) == 0)
            snprintf(hint, sizeof hint, "; it is the data of the Megatron dataset beside %s: "
                     "name the prefix %s", idx, prefix);
    }
    TOKEN_FAIL("%s is not a token file dynmo reads (bad magic: not DYNMOTOK, nor an llm.c shard's "
         "%d or %d, nor a Megatron index's MMIDIDX%s; docs/data.md)", name, LLMC_MAGIC_UINT16,
         LLMC_MAGIC_UINT32, hint);
fail:
    token_input_close(in);
    return -1;
}
