/* The metadata of an HDF5 file, checked byte by byte before HDF5 1.10 reads
 * it. HDF5 1.10.8 believes most sizes, counts and addresses it decodes: an
 * attribute whose data is larger than its message is copied past the
 * header (a heap overflow), a string attribute naming a global heap object
 * that is not there is read from a null or foreign pointer (a crash), an
 * object header, a string or a heap free list of an absurd size is
 * allocated before it is read, a chunk dimension of 0 is divided by, a
 * free list or a B-tree that loops is followed forever.
 *
 * So a reader of a run log first walks everything HDF5 will reach from the
 * superblock: object headers and their messages, groups (symbol tables:
 * v1 B-trees, symbol nodes, local heaps), the global heap objects that
 * string attributes point to, and each dataset's chunk index and chunks
 * (a compressed chunk is inflated, its output counted and dropped), and
 * accepts only the formats dynmo's run logs are written in: HDF5's
 * default file format (superblock 0 or 1, version 1 object headers,
 * symbol-table groups) as dynmo, h5py and h5repack write it, integer,
 * IEEE float and string data, chunked (deflate, shuffle, Fletcher32),
 * contiguous or compact storage. Anything else is refused with one line
 * naming the structure, its byte offset and the problem. Every dataset's
 * extent must be backed by data stored in the file, so that a reader may
 * allocate its extent.
 *
 * It never calls HDF5 and never writes; it reads the file with pread.
 * Internal to src/ckpt and src/tools (h5util.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "dynmo/core.h"
#include "ckpt/h5util.h"

#define UNDEFINED_ADDRESS UINT64_MAX
/* Bounds on what a run log holds, far above what dynmo writes and small
 * enough that nothing below allocates without limit. */
#define MAX_HEADER_CHUNK ((uint64_t)1 << 20)     /* bytes of one object header chunk */
#define MAX_HEADER_CHUNKS 64                     /* chunks of one object header */
#define MAX_K 1024                               /* B-tree and symbol node K */
#define MAX_TREE_LEVELS 32
#define MAX_GROUP_DEPTH 8
#define MAX_OBJECTS 100000                       /* object headers in one file */
#define MAX_LOCAL_HEAP ((uint64_t)1 << 24)       /* bytes of a group's name heap */
#define MAX_GLOBAL_HEAP ((uint64_t)1 << 26)      /* bytes of one global heap collection */
#define MAX_CHUNK_BYTES ((uint64_t)1 << 26)      /* bytes of one dataset chunk */
#define MAX_RANK 32
#define MAX_FILTERS 32

/* A set of file addresses (open addressing): every structure is visited
 * once, so a loop or a shared node is seen. */
struct address_set {
    uint64_t *slots;    /* UNDEFINED_ADDRESS = empty */
    size_t capacity, count;
};

/* A global heap collection already checked: its objects' indices and sizes. */
struct collection {
    uint64_t address;
    int count;
    uint32_t *index;
    uint64_t *size;
};

struct check {
    int fd;                       /* the file */
    uint64_t file_size;
    uint64_t end;                 /* the end of file address the superblock gives */
    unsigned leaf_k, internal_k, chunk_k;
    struct address_set seen;
    struct collection *collections;
    int collection_count;
    int objects;
    char *err;
    size_t errsize;
    int failed;
    unsigned char *scratch;       /* inflate's output, dropped */
};

__attribute__((format(printf, 2, 3)))
static int fail(struct check *c, const char *fmt, ...)
{
    if (c->failed) return -1;
    c->failed = 1;
    int n = snprintf(c->err, c->errsize, "damaged: ");
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < c->errsize) vsnprintf(c->err + n, c->errsize - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t le(const unsigned char *p, size_t bytes)
{
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; i++) value |= (uint64_t)p[i] << (8 * i);
    return value;
}

/* n bytes at `at` into buf; what names the structure for the message. */
static int fetch(struct check *c, uint64_t at, size_t n, void *buf, const char *what)
{
    if (at > c->file_size || n > c->file_size - at)
        return fail(c, "%s at byte %llu (%zu bytes) runs past the end of the file (%llu bytes)",
                    what, (unsigned long long)at, n, (unsigned long long)c->file_size);
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(c->fd, (char *)buf + got, n - got, (off_t)(at + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return fail(c, "%s at byte %llu: cannot read it: %s", what,
                        (unsigned long long)at, r < 0 ? strerror(errno) : "end of file");
        got += (size_t)r;
    }
    return 0;
}

/* Whether [at, at + n) lies inside the file and below its end address. */
static int inside(const struct check *c, uint64_t at, uint64_t n)
{
    return at <= c->end && n <= c->end - at;
}

/* ---- the set of visited addresses ----------------------------------------- */

static int set_insert(struct address_set *s, uint64_t address)
{
    if (2 * (s->count + 1) > s->capacity) {
        size_t capacity = s->capacity ? 2 * s->capacity : 256;
        uint64_t *slots = dm_alloc(capacity * sizeof *slots);
        for (size_t i = 0; i < capacity; i++) slots[i] = UNDEFINED_ADDRESS;
        for (size_t i = 0; i < s->capacity; i++) {
            if (s->slots[i] == UNDEFINED_ADDRESS) continue;
            size_t k = (size_t)(s->slots[i] * 0x9E3779B97F4A7C15ULL) & (capacity - 1);
            while (slots[k] != UNDEFINED_ADDRESS) k = (k + 1) & (capacity - 1);
            slots[k] = s->slots[i];
        }
        dm_free(s->slots);
        s->slots = slots;
        s->capacity = capacity;
    }
    size_t k = (size_t)(address * 0x9E3779B97F4A7C15ULL) & (s->capacity - 1);
    while (s->slots[k] != UNDEFINED_ADDRESS) {
        if (s->slots[k] == address) return 0;
        k = (k + 1) & (s->capacity - 1);
    }
    s->slots[k] = address;
    s->count++;
    return 1;
}

/* Marks a structure visited; a second visit is a loop or a shared node,
 * which no run log has. */
static int visit(struct check *c, uint64_t address, const char *what)
{
    if (set_insert(&c->seen, address)) return 0;
    return fail(c, "%s at byte %llu is reached twice (a loop, or a structure shared by two "
                "owners)", what, (unsigned long long)address);
}

/* ---- global heaps ---------------------------------------------------------- */

/* The collection at address, checked (as dm_h5_check_global_heaps checks
 * one) and remembered with its objects. NULL after failing. */
static const struct collection *collection_at(struct check *c, uint64_t address)
{
    for (int i = 0; i < c->collection_count; i++)
        if (c->collections[i].address == address) return &c->collections[i];
    unsigned char head[16];
    if (fetch(c, address, sizeof head, head, "a global heap collection") != 0) return NULL;
    uint64_t size = le(head + 8, 8);
    if (memcmp(head, "GCOL", 4) != 0 || head[4] != 1)
        return fail(c, "a string attribute points to byte %llu, which holds no global heap "
                    "collection", (unsigned long long)address), NULL;
    if (size < 4096 || size > MAX_GLOBAL_HEAP || !inside(c, address, size))
        return fail(c, "the global heap collection at byte %llu claims %llu bytes",
                    (unsigned long long)address, (unsigned long long)size), NULL;
    unsigned char *bytes = dm_alloc((size_t)size);
    struct collection *found = NULL;
    char reason[512];
    if (fetch(c, address, (size_t)size, bytes, "a global heap collection") != 0) goto done;
    if (dm_h5_check_global_heaps(bytes, (size_t)size, size, reason, sizeof reason) != 0) {
        fail(c, "the global heap collection at byte %llu: %s", (unsigned long long)address,
             reason + (strncmp(reason, "damaged: ", 9) ? 0 : 9));
        goto done;
    }
    /* dm_h5_check_global_heaps found every object inside and the free
     * space last: list them. */
    struct collection k = {.address = address};
    k.index = dm_alloc((size_t)(size / 16 + 1) * sizeof *k.index);
    k.size = dm_alloc((size_t)(size / 16 + 1) * sizeof *k.size);
    for (uint64_t p = 16; p + 16 <= size;) {
        uint32_t index = (uint32_t)le(bytes + p, 2);
        uint64_t object = le(bytes + p + 8, 8);
        if (index == 0) break;
        for (int i = 0; i < k.count; i++)
            if (k.index[i] == index) {
                fail(c, "the global heap collection at byte %llu holds two objects numbered "
                     "%u", (unsigned long long)address, index);
                dm_free(k.index);
                dm_free(k.size);
                goto done;
            }
        k.index[k.count] = index;
        k.size[k.count++] = object;
        p += 16 + ((object + 7) & ~(uint64_t)7);
    }
    if (c->collection_count % 16 == 0) {
        struct collection *grown = dm_alloc((size_t)(c->collection_count + 16) * sizeof *grown);
        if (c->collection_count)
            memcpy(grown, c->collections, (size_t)c->collection_count * sizeof *grown);
        dm_free(c->collections);
        c->collections = grown;
    }
    c->collections[c->collection_count] = k;
    found = &c->collections[c->collection_count++];
done:
    dm_free(bytes);
    return found;
}

/* One stored variable-length string (length, collection address, object
 * index): HDF5 allocates `length` bytes and copies the object into them. */
static int check_vlen_string(struct check *c, const unsigned char *p, const char *where)
{
    uint64_t length = le(p, 4), address = le(p + 4, 8);
    uint32_t index = (uint32_t)le(p + 12, 4);
    if (address == 0) {
        if (length == 0) return 0;
        return fail(c, "%s: a string of %llu bytes stored nowhere", where,
                    (unsigned long long)length);
    }
    const struct collection *k = collection_at(c, address);
    if (!k) return -1;
    for (int i = 0; i < k->count; i++)
        if (k->index[i] == index) {
            if (k->size[i] == length) return 0;
            return fail(c, "%s: a string of %llu bytes is global heap object %u of %llu bytes "
                        "(collection at byte %llu)", where, (unsigned long long)length, index,
                        (unsigned long long)k->size[i], (unsigned long long)address);
        }
    return fail(c, "%s: its string is global heap object %u, which the collection at byte "
                "%llu does not hold", where, index, (unsigned long long)address);
}

/* ---- datatypes and dataspaces ---------------------------------------------- */

enum { TYPE_OTHER, TYPE_INTEGER, TYPE_FLOAT, TYPE_STRING, TYPE_VLEN_STRING };

struct datatype {
    int kind;
    uint64_t size;          /* bytes of one element */
};

/* Decodes a datatype message of n bytes at p: integers of 1, 2, 4 or 8
 * bytes, IEEE floats of 4 or 8, fixed-length strings, variable-length
 * strings of 8-bit characters. *used: the bytes its encoding took. */
static int decode_datatype(struct check *c, const unsigned char *p, size_t n,
                           struct datatype *t, size_t *used, const char *where, int depth)
{
    if (n < 8) return fail(c, "%s: a datatype of %zu bytes", where, n);
    unsigned type_class = p[0] & 15, version = p[0] >> 4;
    uint32_t bits = (uint32_t)le(p + 1, 3);
    uint64_t size = le(p + 4, 4);
    t->size = size;
    if (version < 1 || version > 3)
        return fail(c, "%s: datatype version %u", where, version);
    switch (type_class) {
    case 0: {   /* fixed-point: bit offset, precision */
        if (n < 12) return fail(c, "%s: an integer datatype of %zu bytes", where, n);
        uint64_t offset = le(p + 8, 2), precision = le(p + 10, 2);
        if ((size != 1 && size != 2 && size != 4 && size != 8) || offset != 0 ||
            precision != 8 * size || (bits & ~(uint32_t)9) != 0)
            return fail(c, "%s: an integer datatype of %llu bytes, precision %llu at bit "
                        "%llu, flags 0x%x (dynmo reads whole 8-, 16-, 32- and 64-bit "
                        "integers)", where, (unsigned long long)size,
                        (unsigned long long)precision, (unsigned long long)offset, bits);
        t->kind = TYPE_INTEGER;
        *used = 12;
        return 0;
    }
    case 1: {   /* floating point: IEEE single or double, either byte order */
        if (n < 20) return fail(c, "%s: a float datatype of %zu bytes", where, n);
        static const unsigned ieee[2][7] = {{32, 23, 8, 0, 23, 127, 31},
                                            {64, 52, 11, 0, 52, 1023, 63}};
        const unsigned *want = size == 4 ? ieee[0] : size == 8 ? ieee[1] : NULL;
        unsigned have[7] = {(unsigned)le(p + 10, 2), p[12], p[13], p[14], p[15],
                            (unsigned)le(p + 16, 4), (bits >> 8) & 255};
        if (!want || le(p + 8, 2) != 0 || memcmp(have, want, sizeof have) != 0 ||
            (bits & 0xFE) != 0x20)
            return fail(c, "%s: a floating-point datatype of %llu bytes that is not IEEE "
                        "single or double precision", where, (unsigned long long)size);
        t->kind = TYPE_FLOAT;
        *used = 20;
        return 0;
    }
    case 3:     /* fixed-length string */
        if (size < 1 || size > 65536 || (bits & 15) > 2 || ((bits >> 4) & 15) > 1 ||
            (bits >> 8) != 0)
            return fail(c, "%s: a string datatype of %llu bytes, flags 0x%x", where,
                        (unsigned long long)size, bits);
        t->kind = TYPE_STRING;
        *used = 8;
        return 0;
    case 9: {   /* variable-length: strings only, of 8-bit characters */
        if ((bits & 15) != 1 || ((bits >> 4) & 15) > 2 || ((bits >> 8) & 15) > 1 ||
            (bits >> 12) != 0 || size != 16 || depth > 0)
            return fail(c, "%s: a variable-length datatype with flags 0x%x and "
                        "%llu-byte elements (dynmo reads strings of 16)", where, bits,
                        (unsigned long long)size);
        struct datatype base;
        size_t base_used = 0;
        if (decode_datatype(c, p + 8, n - 8, &base, &base_used, where, depth + 1) != 0)
            return -1;
        if (base.kind != TYPE_INTEGER || base.size != 1)
            return fail(c, "%s: a variable-length string of %llu-byte characters", where,
                        (unsigned long long)base.size);
        t->kind = TYPE_VLEN_STRING;
        *used = 8 + base_used;
        return 0;
    }
    default:
        return fail(c, "%s: a datatype of class %u (dynmo's files hold integers, floats and "
                    "strings only)", where, type_class);
    }
}

struct dataspace {
    int rank;               /* 0: scalar; -1: null (no elements) */
    uint64_t dims[MAX_RANK];
    uint64_t max[MAX_RANK];
    uint64_t points;        /* elements */
};

/* A dataspace message of n bytes at p (versions 1 and 2). */
static int decode_dataspace(struct check *c, const unsigned char *p, size_t n,
                            struct dataspace *s, size_t *used, const char *where)
{
    if (n < 8) return fail(c, "%s: a dataspace of %zu bytes", where, n);
    unsigned version = p[0], rank = p[1], flags = p[2];
    if ((version != 1 && version != 2) || rank > MAX_RANK || (flags & ~1u) != 0 ||
        (version == 2 && p[3] > 2))
        return fail(c, "%s: a dataspace of version %u, rank %u, flags 0x%x", where, version,
                    rank, flags);
    size_t header = version == 1 ? 8 : 4;
    size_t need = header + (size_t)rank * 8 * (flags & 1 ? 2 : 1);
    if (need > n) return fail(c, "%s: a dataspace of rank %u in %zu bytes", where, rank, n);
    s->rank = version == 2 && p[3] == 2 ? -1 : (int)rank;
    if (version == 2 && (p[3] == 0) != (rank == 0))
        return fail(c, "%s: a dataspace of type %u with rank %u", where, p[3], rank);
    s->points = s->rank < 0 ? 0 : 1;
    for (unsigned d = 0; d < rank; d++) {
        s->dims[d] = le(p + header + 8 * d, 8);
        s->max[d] = flags & 1 ? le(p + header + 8 * (rank + d), 8) : s->dims[d];
        if (s->max[d] != UNDEFINED_ADDRESS && s->dims[d] > s->max[d])
            return fail(c, "%s: dimension %u is %llu, above its maximum %llu", where, d,
                        (unsigned long long)s->dims[d], (unsigned long long)s->max[d]);
        if (s->dims[d] && s->points > (UINT64_MAX >> 8) / s->dims[d])
            return fail(c, "%s: a dataspace of more elements than a file can hold", where);
        s->points *= s->dims[d];
    }
    *used = need;
    return 0;
}

/* ---- messages ----------------------------------------------------------- */

/* What one object header holds, gathered from its messages. */
struct header_info {
    char where[320];
    int has_space, has_type, has_layout, has_stab, has_filters, has_fill;
    struct dataspace space;
    struct datatype type;
    int layout_class;               /* 0 compact, 1 contiguous, 2 chunked */
    uint64_t layout_address, layout_size;
    unsigned chunk_rank;            /* chunked: dataset rank + 1 */
    uint64_t chunk_dims[MAX_RANK + 1];
    int filters;
    unsigned filter_id[MAX_FILTERS];
    uint64_t stab_btree, stab_heap;
    uint64_t fill_size;
};

static int check_attribute(struct check *c, const unsigned char *p, size_t n,
                           const struct header_info *h)
{
    char where[400];
    if (n < 8) return fail(c, "%s: an attribute message of %zu bytes", h->where, n);
    unsigned version = p[0], flags = p[1];
    uint64_t name_size = le(p + 2, 2), type_size = le(p + 4, 2), space_size = le(p + 6, 2);
    if (version < 1 || version > 3 || flags != 0)
        return fail(c, "%s: an attribute message of version %u, flags 0x%x (shared "
                    "datatypes and dataspaces are not read)", h->where, version, flags);
    size_t at = version == 3 ? 9 : 8;
    if (version == 3 && p[8] > 1)
        return fail(c, "%s: an attribute name in character set %u", h->where, p[8]);
    uint64_t pad_name = version == 1 ? (name_size + 7) & ~(uint64_t)7 : name_size;
    uint64_t pad_type = version == 1 ? (type_size + 7) & ~(uint64_t)7 : type_size;
    uint64_t pad_space = version == 1 ? (space_size + 7) & ~(uint64_t)7 : space_size;
    if (name_size < 2 || at + pad_name + pad_type + pad_space > n)
        return fail(c, "%s: an attribute's name, datatype and dataspace (%llu, %llu and %llu "
                    "bytes) do not fit its message of %zu", h->where,
                    (unsigned long long)name_size, (unsigned long long)type_size,
                    (unsigned long long)space_size, n);
    const unsigned char *name = p + at;
    if (name[name_size - 1] != '\0' || memchr(name, '\0', name_size - 1))
        return fail(c, "%s: an attribute name that is not one string of %llu bytes", h->where,
                    (unsigned long long)name_size);
    snprintf(where, sizeof where, "%s: attribute %s", h->where, (const char *)name);
    struct datatype type;
    struct dataspace space;
    size_t type_used = 0, space_used = 0;
    if (decode_datatype(c, p + at + pad_name, (size_t)type_size, &type, &type_used, where, 0) ||
        decode_dataspace(c, p + at + pad_name + pad_type, (size_t)space_size, &space,
                         &space_used, where))
        return -1;
    if (space.rank > 1)
        return fail(c, "%s has rank %d (dynmo's attributes are scalars or lists)", where,
                    space.rank);
    uint64_t data_at = at + pad_name + pad_type + pad_space;
    if (space.points > (n - data_at) / (type.size ? type.size : 1) ||
        space.points * type.size > n - data_at)
        return fail(c, "%s holds %llu elements of %llu bytes in the %llu bytes left of its "
                    "message", where, (unsigned long long)space.points,
                    (unsigned long long)type.size, (unsigned long long)(n - data_at));
    if (type.kind == TYPE_VLEN_STRING)
        for (uint64_t i = 0; i < space.points; i++)
            if (check_vlen_string(c, p + data_at + 16 * i, where) != 0) return -1;
    return 0;
}

static int check_layout(struct check *c, const unsigned char *p, size_t n,
                        struct header_info *h)
{
    if (n < 2 || p[0] != 3)
        return fail(c, "%s: a data layout message of version %u (dynmo reads version 3)",
                    h->where, n ? p[0] : 0);
    h->has_layout = 1;
    h->layout_class = p[1];
    switch (p[1]) {
    case 0:
        if (n < 4 || le(p + 2, 2) > n - 4)
            return fail(c, "%s: compact data of %llu bytes in a message of %zu", h->where,
                        n < 4 ? 0ULL : (unsigned long long)le(p + 2, 2), n);
        h->layout_size = le(p + 2, 2);
        return 0;
    case 1:
        if (n < 18) return fail(c, "%s: a contiguous layout of %zu bytes", h->where, n);
        h->layout_address = le(p + 2, 8);
        h->layout_size = le(p + 10, 8);
        return 0;
    case 2: {
        if (n < 11) return fail(c, "%s: a chunked layout of %zu bytes", h->where, n);
        unsigned rank = p[2];
        if (rank < 2 || rank > MAX_RANK + 1 || 11 + (size_t)4 * rank > n)
            return fail(c, "%s: chunks of %u dimensions", h->where, rank);
        h->chunk_rank = rank;
        h->layout_address = le(p + 3, 8);
        uint64_t bytes = 1;
        for (unsigned d = 0; d < rank; d++) {
            h->chunk_dims[d] = le(p + 11 + 4 * d, 4);
            if (h->chunk_dims[d] == 0)
                return fail(c, "%s: chunk dimension %u is 0", h->where, d);
            if (bytes > MAX_CHUNK_BYTES / h->chunk_dims[d])
                return fail(c, "%s: chunks of more than %llu bytes", h->where,
                            (unsigned long long)MAX_CHUNK_BYTES);
            bytes *= h->chunk_dims[d];
        }
        h->layout_size = bytes;
        return 0;
    }
    default:
        return fail(c, "%s: data layout class %u (dynmo reads compact, contiguous and chunked "
                    "data)", h->where, p[1]);
    }
}

/* The filter pipeline: deflate, shuffle and Fletcher32 only. */
static int check_filters(struct check *c, const unsigned char *p, size_t n,
                         struct header_info *h)
{
    if (n < 2 || (p[0] != 1 && p[0] != 2) || p[1] > MAX_FILTERS)
        return fail(c, "%s: a filter pipeline of version %u with %u filters", h->where,
                    n ? p[0] : 0, n > 1 ? p[1] : 0);
    unsigned version = p[0], count = p[1];
    size_t at = version == 1 ? 8 : 2;
    h->has_filters = 1;
    h->filters = (int)count;
    for (unsigned i = 0; i < count; i++) {
        if (at + 6 > n) return fail(c, "%s: filter %u runs past its message", h->where, i);
        unsigned id = (unsigned)le(p + at, 2);
        uint64_t name_size = 0;
        size_t fields = version == 1 || id >= 256 ? 8 : 6;
        if (at + fields > n) return fail(c, "%s: filter %u runs past its message", h->where, i);
        if (fields == 8) name_size = le(p + at + 2, 2);
        uint64_t values = le(p + at + fields - 2, 2);
        uint64_t name_bytes = version == 1 ? (name_size + 7) & ~(uint64_t)7 : name_size;
        uint64_t value_bytes = 4 * values + (version == 1 && values % 2 ? 4 : 0);
        if (name_bytes + value_bytes > n - at - fields)
            return fail(c, "%s: filter %u (%llu name bytes, %llu values) runs past its message",
                        h->where, i, (unsigned long long)name_size,
                        (unsigned long long)values);
        if (id != 1 && id != 2 && id != 3)
            return fail(c, "%s: filter %u (dynmo reads deflate, shuffle and Fletcher32 data "
                        "only)", h->where, id);
        h->filter_id[i] = id;
        at += fields + name_bytes + value_bytes;
    }
    return 0;
}

static int check_fill(struct check *c, const unsigned char *p, size_t n,
                      struct header_info *h, int old)
{
    uint64_t size = 0;
    size_t at = 0;
    if (old) {
        if (n < 4) return fail(c, "%s: an old fill value message of %zu bytes", h->where, n);
        size = le(p, 4);
        at = 4;
    } else {
        if (n < 2 || p[0] < 1 || p[0] > 3)
            return fail(c, "%s: a fill value message of version %u", h->where, n ? p[0] : 0);
        int present;
        if (p[0] == 3) {
            present = (p[1] >> 5) & 1;
            at = 2;
        } else {
            if (n < 4) return fail(c, "%s: a fill value message of %zu bytes", h->where, n);
            present = p[0] == 1 || p[3];
            at = 4;
        }
        if (present) {
            if (at + 4 > n) return fail(c, "%s: a fill value message of %zu bytes", h->where, n);
            size = le(p + at, 4);
            at += 4;
        }
    }
    if (size > n - at)
        return fail(c, "%s: a fill value of %llu bytes in a message of %zu", h->where,
                    (unsigned long long)size, n);
    h->has_fill = 1;
    if (size > h->fill_size) h->fill_size = size;
    return 0;
}

/* One message of a version 1 object header. */
static int check_message(struct check *c, unsigned type, const unsigned char *p, size_t n,
                         struct header_info *h, uint64_t *next_chunk, uint64_t *next_size)
{
    size_t used = 0;
    switch (type) {
    case 0x00:   /* NIL */
        return 0;
    case 0x01:
        if (h->has_space) return fail(c, "%s: two dataspace messages", h->where);
        h->has_space = 1;
        return decode_dataspace(c, p, n, &h->space, &used, h->where);
    case 0x03:
        if (h->has_type) return fail(c, "%s: two datatype messages", h->where);
        h->has_type = 1;
        return decode_datatype(c, p, n, &h->type, &used, h->where, 0);
    case 0x04:
    case 0x05:
        return check_fill(c, p, n, h, type == 0x04);
    case 0x08:
        if (h->has_layout) return fail(c, "%s: two data layout messages", h->where);
        return check_layout(c, p, n, h);
    case 0x0B:
        if (h->has_filters) return fail(c, "%s: two filter pipelines", h->where);
        return check_filters(c, p, n, h);
    case 0x0C:
        return check_attribute(c, p, n, h);
    case 0x0E:
        return n >= 16 ? 0 : fail(c, "%s: a modification time of %zu bytes", h->where, n);
    case 0x12:
        return n >= 8 && p[0] == 1 ? 0 : fail(c, "%s: a modification time message of %zu "
                                                 "bytes", h->where, n);
    case 0x10:
        if (n < 16) return fail(c, "%s: a continuation message of %zu bytes", h->where, n);
        *next_chunk = le(p, 8);
        *next_size = le(p + 8, 8);
        return 0;
    case 0x11:
        if (n < 16) return fail(c, "%s: a symbol table message of %zu bytes", h->where, n);
        if (h->has_stab) return fail(c, "%s: two symbol table messages", h->where);
        h->has_stab = 1;
        h->stab_btree = le(p, 8);
        h->stab_heap = le(p + 8, 8);
        return 0;
    default:
        return fail(c, "%s: a header message of type 0x%02x (not in the file format dynmo's "
                    "run logs are written in)", h->where, type);
    }
}

/* The chunks of a version 1 object header at address: every message
 * inside its chunk, every chunk inside the file. */
static int check_header(struct check *c, uint64_t address, struct header_info *h)
{
    unsigned char prefix[16];
    if (visit(c, address, h->where) != 0 ||
        fetch(c, address, sizeof prefix, prefix, h->where) != 0)
        return -1;
    if (++c->objects > MAX_OBJECTS)
        return fail(c, "more than %d objects in one file", MAX_OBJECTS);
    if (prefix[0] != 1)
        return fail(c, "%s at byte %llu: object header version %u (dynmo reads version 1, "
                    "HDF5's default)", h->where, (unsigned long long)address, prefix[0]);
    uint64_t messages = le(prefix + 2, 2), chunk = address + 16, size = le(prefix + 8, 4);
    uint64_t parsed = 0;
    for (int chunks = 0; chunk != UNDEFINED_ADDRESS; chunks++) {
        if (chunks >= MAX_HEADER_CHUNKS)
            return fail(c, "%s: more than %d header chunks", h->where, MAX_HEADER_CHUNKS);
        if (size > MAX_HEADER_CHUNK || size % 8 || !inside(c, chunk, size))
            return fail(c, "%s: a header chunk of %llu bytes at byte %llu (the file ends at "
                        "%llu)", h->where, (unsigned long long)size,
                        (unsigned long long)chunk, (unsigned long long)c->end);
        if (chunks > 0 && visit(c, chunk, h->where) != 0) return -1;
        unsigned char *bytes = dm_alloc((size_t)size);
        if (fetch(c, chunk, (size_t)size, bytes, h->where) != 0) {
            dm_free(bytes);
            return -1;
        }
        uint64_t next = UNDEFINED_ADDRESS, next_size = 0;
        int status = 0;
        for (uint64_t at = 0; at < size && status == 0; parsed++) {
            if (size - at < 8) {
                status = fail(c, "%s: %llu stray bytes at the end of a header chunk",
                              h->where, (unsigned long long)(size - at));
                break;
            }
            unsigned type = (unsigned)le(bytes + at, 2), flags = bytes[at + 4];
            uint64_t length = le(bytes + at + 2, 2);
            if (length % 8 || length > size - at - 8) {
                status = fail(c, "%s: message %llu (type 0x%02x) of %llu bytes does not fit "
                              "its header chunk of %llu", h->where, (unsigned long long)parsed,
                              type, (unsigned long long)length, (unsigned long long)size);
                break;
            }
            if (flags & ~(unsigned)0x05) {
                status = fail(c, "%s: message %llu (type 0x%02x) has flags 0x%x (shared "
                              "messages are not read)", h->where, (unsigned long long)parsed,
                              type, flags);
                break;
            }
            uint64_t chunk_at = UNDEFINED_ADDRESS, chunk_size = 0;
            status = check_message(c, type, bytes + at + 8, (size_t)length, h, &chunk_at,
                                   &chunk_size);
            if (status == 0 && chunk_at != UNDEFINED_ADDRESS) {
                if (next != UNDEFINED_ADDRESS)
                    status = fail(c, "%s: two continuation messages in one chunk", h->where);
                next = chunk_at;
                next_size = chunk_size;
            }
            at += 8 + length;
        }
        dm_free(bytes);
        if (status != 0) return -1;
        chunk = next;
        size = next_size;
    }
    if (parsed != messages)
        return fail(c, "%s: its header says %llu messages, its chunks hold %llu", h->where,
                    (unsigned long long)messages, (unsigned long long)parsed);
    return 0;
}

/* ---- datasets ----------------------------------------------------------- */

/* The stored bytes of one chunk after the filters a reader undoes (in
 * reverse order, those the mask leaves on): deflate's output is counted. */
static int chunk_output_bytes(struct check *c, const struct header_info *h, uint64_t address,
                              uint64_t stored, unsigned mask, uint64_t *out)
{
    uint64_t size = stored;
    int inflated = 0;
    for (int i = h->filters - 1; i >= 0; i--) {
        if (mask & (1u << i)) continue;
        if (h->filter_id[i] == 3) {   /* Fletcher32: 4 bytes of checksum */
            if (size < 4) return fail(c, "%s: a chunk of %llu bytes with a Fletcher32 "
                                      "checksum", h->where, (unsigned long long)size);
            size -= 4;
        } else if (h->filter_id[i] == 1) {   /* deflate, of what the checksums leave */
            if (inflated)
                return fail(c, "%s: two deflate filters in one pipeline", h->where);
            inflated = 1;
            unsigned char *in = dm_alloc((size_t)size);
            if (fetch(c, address, (size_t)size, in, h->where) != 0) {
                dm_free(in);
                return -1;
            }
            z_stream z;
            memset(&z, 0, sizeof z);
            uint64_t produced = 0;
            int rc = inflateInit(&z);
            if (rc != Z_OK) DM_FATAL("inflateInit failed: zlib %s", zlibVersion());
            z.next_in = in;
            z.avail_in = (uInt)size;
            do {
                z.next_out = c->scratch;
                z.avail_out = 1 << 16;
                rc = inflate(&z, Z_NO_FLUSH);
                produced += (1 << 16) - z.avail_out;
            } while (rc == Z_OK && produced <= h->layout_size);
            inflateEnd(&z);
            dm_free(in);
            if (rc != Z_STREAM_END || produced > h->layout_size)
                return fail(c, "%s: the compressed chunk at byte %llu %s", h->where,
                            (unsigned long long)address,
                            produced > h->layout_size ? "inflates to more than a chunk"
                                                      : "does not inflate");
            size = produced;
        }
    }
    *out = size;
    return 0;
}

/* The node of n bytes at address, visited once and inside the file, in a
 * dm_alloc'd buffer; NULL after reporting, the message naming it as
 * "<kind><where>: its <what>". */
static unsigned char *node_bytes(struct check *c, uint64_t address, size_t n, const char *kind,
                                 const char *where, const char *what)
{
    if (visit(c, address, where) != 0) return NULL;
    if (!inside(c, address, n)) {
        fail(c, "%s%s: its %s at byte %llu (%zu bytes) runs past the end of the file", kind,
             where, what, (unsigned long long)address, n);
        return NULL;
    }
    unsigned char *bytes = dm_alloc(n);
    if (fetch(c, address, n, bytes, where) != 0) {
        dm_free(bytes);
        return NULL;
    }
    return bytes;
}

/* A version-1 B-tree node of `type` (0: a group's, 1: a chunk index) and
 * of at most 2k entries, as node_bytes reads it, whose level is `level`
 * (-1: any up to MAX_TREE_LEVELS): its bytes, *entries and *level; NULL
 * after reporting. */
static unsigned char *tree_node(struct check *c, uint64_t address, size_t n, unsigned type,
                                unsigned k, int level, const char *kind, const char *where,
                                const char *what, unsigned *entries, unsigned *node_level)
{
    unsigned char *bytes = node_bytes(c, address, n, kind, where, what);
    if (!bytes) return NULL;
    *entries = (unsigned)le(bytes + 6, 2);
    *node_level = bytes[5];
    if (memcmp(bytes, "TREE", 4) != 0 || bytes[4] != type || *entries > 2 * k ||
        (level >= 0 && (int)*node_level != level) || *node_level > MAX_TREE_LEVELS) {
        fail(c, "%s%s: its %s at byte %llu is not one (type %u, level %u, %u entries)", kind,
             where, what, (unsigned long long)address, bytes[4], *node_level, *entries);
        dm_free(bytes);
        return NULL;
    }
    return bytes;
}

/* The chunk index (a version 1 B-tree of type 1) of a chunked dataset:
 * every chunk inside the file and, through its filters, exactly a chunk's
 * bytes. *chunks counts them. */
static int check_chunk_tree(struct check *c, const struct header_info *h, uint64_t address,
                            int level, uint64_t *chunks)
{
    size_t key = 8 + 8 * (size_t)h->chunk_rank;
    size_t node = 24 + (size_t)2 * c->chunk_k * 8 + (size_t)(2 * c->chunk_k + 1) * key;
    unsigned entries, node_level;
    unsigned char *bytes = tree_node(c, address, node, 1, c->chunk_k, level, "", h->where,
                                     "chunk index node", &entries, &node_level);
    if (!bytes) return -1;
    int status = -1;
    for (unsigned i = 0; i < entries; i++) {
        const unsigned char *k = bytes + 24 + (size_t)i * (key + 8);
        uint64_t child = le(k + key, 8), stored = le(k, 4);
        unsigned mask = (unsigned)le(k + 4, 4);
        if (node_level > 0) {
            if (check_chunk_tree(c, h, child, (int)node_level - 1, chunks) != 0) goto done;
            continue;
        }
        for (unsigned d = 0; d < h->chunk_rank; d++) {
            uint64_t offset = le(k + 8 + 8 * d, 8);
            if (offset % h->chunk_dims[d] ||
                (d + 1 == h->chunk_rank ? offset != 0 : offset >= h->space.max[d])) {
                fail(c, "%s: a chunk at offset %llu in dimension %u (chunks of %llu)",
                     h->where, (unsigned long long)offset, d,
                     (unsigned long long)h->chunk_dims[d]);
                goto done;
            }
        }
        if (visit(c, child, h->where) != 0) goto done;
        if (stored == 0 || !inside(c, child, stored)) {
            fail(c, "%s: a chunk of %llu bytes at byte %llu (the file ends at %llu)",
                 h->where, (unsigned long long)stored, (unsigned long long)child,
                 (unsigned long long)c->end);
            goto done;
        }
        uint64_t out = stored;
        if (h->filters && chunk_output_bytes(c, h, child, stored, mask, &out) != 0) goto done;
        if (out != h->layout_size) {
            fail(c, "%s: the chunk at byte %llu holds %llu bytes, a chunk is %llu", h->where,
                 (unsigned long long)child, (unsigned long long)out,
                 (unsigned long long)h->layout_size);
            goto done;
        }
        ++*chunks;
    }
    status = 0;
done:
    dm_free(bytes);
    return status;
}

/* A dataset's header as a whole: its type and shape, its layout matching
 * them, and its extent backed by stored data. */
static int check_dataset(struct check *c, struct header_info *h)
{
    if (!h->has_space || !h->has_type || !h->has_layout)
        return fail(c, "%s: a dataset without %s", h->where,
                    !h->has_space ? "a dataspace" : !h->has_type ? "a datatype" : "a layout");
    if (h->type.kind == TYPE_VLEN_STRING)
        return fail(c, "%s: a dataset of variable-length strings", h->where);
    if (h->space.rank < 0 || h->space.points > UINT64_MAX / 16 / h->type.size)
        return fail(c, "%s: a dataset of no or too many elements", h->where);
    if (h->fill_size && h->fill_size != h->type.size)
        return fail(c, "%s: a fill value of %llu bytes for elements of %llu", h->where,
                    (unsigned long long)h->fill_size, (unsigned long long)h->type.size);
    uint64_t bytes = h->space.points * h->type.size;
    if (h->has_filters && h->layout_class != 2)
        return fail(c, "%s: filters on data that is not chunked", h->where);
    if (h->layout_class == 0 || h->layout_class == 1) {
        if (h->layout_size != bytes ||
            (h->layout_class == 1 && bytes && !inside(c, h->layout_address, bytes)))
            return fail(c, "%s: %llu bytes of data stored for an extent of %llu", h->where,
                        (unsigned long long)h->layout_size, (unsigned long long)bytes);
        return 0;
    }
    if (h->chunk_rank != (unsigned)h->space.rank + 1 || h->space.rank < 1 ||
        h->chunk_dims[h->chunk_rank - 1] != h->type.size)
        return fail(c, "%s: chunks of %u dimensions and %llu-byte elements for a dataset of "
                    "rank %d and %llu-byte elements", h->where, h->chunk_rank - 1,
                    (unsigned long long)h->chunk_dims[h->chunk_rank - 1], h->space.rank,
                    (unsigned long long)h->type.size);
    uint64_t chunks = 0;
    if (h->layout_address != UNDEFINED_ADDRESS &&
        check_chunk_tree(c, h, h->layout_address, -1, &chunks) != 0)
        return -1;
    /* Every element must lie in a stored chunk: then a reader's buffer for
     * the extent is no larger than the data the file holds. */
    if (chunks < (bytes + h->layout_size - 1) / h->layout_size)
        return fail(c, "%s: an extent of %llu bytes in %llu stored chunks of %llu", h->where,
                    (unsigned long long)bytes, (unsigned long long)chunks,
                    (unsigned long long)h->layout_size);
    return 0;
}

/* ---- groups ------------------------------------------------------------- */

struct local_heap {
    uint64_t size;
    unsigned char *data;    /* (size) the names */
};

/* A group's name heap: its data inside the file, its free list inside
 * its data, visited once per block. */
static int read_local_heap(struct check *c, uint64_t address, struct local_heap *heap,
                           const char *where)
{
    unsigned char head[32];
    heap->data = NULL;
    if (visit(c, address, where) != 0 || fetch(c, address, sizeof head, head, where) != 0)
        return -1;
    heap->size = le(head + 8, 8);
    uint64_t free_list = le(head + 16, 8), data = le(head + 24, 8);
    if (memcmp(head, "HEAP", 4) != 0 || head[4] != 0 || heap->size > MAX_LOCAL_HEAP ||
        !inside(c, data, heap->size))
        return fail(c, "%s: its name heap at byte %llu is not one (%llu bytes at byte %llu)",
                    where, (unsigned long long)address, (unsigned long long)heap->size,
                    (unsigned long long)data);
    heap->data = dm_alloc((size_t)(heap->size ? heap->size : 1));
    if (heap->size && fetch(c, data, (size_t)heap->size, heap->data, where) != 0) return -1;
    for (uint64_t block = free_list, count = 0; block != 1 && block != UNDEFINED_ADDRESS;
         count++) {
        if (count > heap->size / 16 || block % 8 || heap->size < 16 || block > heap->size - 16)
            return fail(c, "%s: the free list of its name heap at byte %llu is damaged", where,
                        (unsigned long long)address);
        uint64_t next = le(heap->data + block, 8), size = le(heap->data + block + 8, 8);
        if (size < 16 || size > heap->size - block)
            return fail(c, "%s: the free list of its name heap at byte %llu is damaged", where,
                        (unsigned long long)address);
        block = next;
    }
    return 0;
}

static int check_object(struct check *c, uint64_t address, const char *path, int depth,
                        uint64_t cached_btree, uint64_t cached_heap);

/* The entries of one symbol node of a group. */
static int check_symbol_node(struct check *c, uint64_t address, const struct local_heap *heap,
                             const char *path, int depth)
{
    size_t node = 8 + (size_t)2 * c->leaf_k * 40;
    unsigned char *bytes = node_bytes(c, address, node, "group ", path, "symbol node");
    if (!bytes) return -1;
    int status = -1;
    unsigned count = (unsigned)le(bytes + 6, 2);
    if (memcmp(bytes, "SNOD", 4) != 0 || bytes[4] != 1 || count > 2 * c->leaf_k) {
        fail(c, "group %s: its symbol node at byte %llu is not one (%u entries)", path,
             (unsigned long long)address, count);
        goto done;
    }
    for (unsigned i = 0; i < count; i++) {
        const unsigned char *e = bytes + 8 + (size_t)i * 40;
        uint64_t name = le(e, 8), header = le(e + 8, 8);
        unsigned cache = (unsigned)le(e + 16, 4);
        if (name >= heap->size || !memchr(heap->data + name, '\0', (size_t)(heap->size - name)) ||
            heap->data[name] == '\0') {
            fail(c, "group %s: entry %u's name is not a string of its name heap", path, i);
            goto done;
        }
        const char *base = (const char *)heap->data + name;
        if (cache > 1 || strchr(base, '/') || strlen(base) > 255) {
            fail(c, "group %s: entry %u (%.64s) is a %s", path, i, base,
                 cache > 1 ? "symbolic link" : "name dynmo does not write");
            goto done;
        }
        char child[320];
        snprintf(child, sizeof child, "%s%s%s", path, strcmp(path, "/") ? "/" : "", base);
        if (check_object(c, header, child, depth + 1, cache ? le(e + 24, 8) : UNDEFINED_ADDRESS,
                         cache ? le(e + 32, 8) : UNDEFINED_ADDRESS) != 0)
            goto done;
    }
    status = 0;
done:
    dm_free(bytes);
    return status;
}

/* The B-tree (type 0) of a group's symbol table down to its symbol nodes. */
static int check_group_tree(struct check *c, uint64_t address, const struct local_heap *heap,
                            const char *path, int depth, int level)
{
    size_t node = 24 + (size_t)2 * c->internal_k * 8 + (size_t)(2 * c->internal_k + 1) * 8;
    unsigned entries, node_level;
    unsigned char *bytes = tree_node(c, address, node, 0, c->internal_k, level, "group ", path,
                                     "B-tree node", &entries, &node_level);
    if (!bytes) return -1;
    int status = -1;
    /* The keys are names in the heap: a lookup by name compares them. */
    for (unsigned i = 0; i <= entries; i++) {
        uint64_t key = le(bytes + 24 + (size_t)i * 16, 8);
        if (key >= heap->size || !memchr(heap->data + key, '\0', (size_t)(heap->size - key))) {
            fail(c, "group %s: key %u of its B-tree node at byte %llu is not a name of its "
                 "heap", path, i, (unsigned long long)address);
            goto done;
        }
    }
    for (unsigned i = 0; i < entries; i++) {
        uint64_t child = le(bytes + 24 + 8 + (size_t)i * 16, 8);
        if (node_level > 0 ? check_group_tree(c, child, heap, path, depth, (int)node_level - 1)
                           : check_symbol_node(c, child, heap, path, depth))
            goto done;
    }
    status = 0;
done:
    dm_free(bytes);
    return status;
}

static int check_object(struct check *c, uint64_t address, const char *path, int depth,
                        uint64_t cached_btree, uint64_t cached_heap)
{
    struct header_info *h = dm_alloc(sizeof *h);
    snprintf(h->where, sizeof h->where, "%s %s", depth ? "object" : "the root group", path);
    int status = -1;
    if (depth > MAX_GROUP_DEPTH) {
        fail(c, "%s: groups nested deeper than %d", h->where, MAX_GROUP_DEPTH);
        goto done;
    }
    if (!inside(c, address, 16)) {
        fail(c, "%s: its header address %llu is outside the file (%llu bytes)", h->where,
             (unsigned long long)address, (unsigned long long)c->end);
        goto done;
    }
    if (check_header(c, address, h) != 0) goto done;
    if (h->has_stab) {
        if (h->has_layout || h->has_space || h->has_type) {
            fail(c, "%s: both a group and a dataset", h->where);
            goto done;
        }
        if (cached_btree != UNDEFINED_ADDRESS &&
            (cached_btree != h->stab_btree || cached_heap != h->stab_heap)) {
            fail(c, "%s: its parent's cached symbol table (B-tree at %llu, heap at %llu) is not "
                 "its own (%llu, %llu)", h->where, (unsigned long long)cached_btree,
                 (unsigned long long)cached_heap, (unsigned long long)h->stab_btree,
                 (unsigned long long)h->stab_heap);
            goto done;
        }
        struct local_heap heap;
        status = read_local_heap(c, h->stab_heap, &heap, h->where) != 0 ||
                         check_group_tree(c, h->stab_btree, &heap, path, depth, -1) != 0
                     ? -1 : 0;
        dm_free(heap.data);
        goto done;
    }
    if (cached_btree != UNDEFINED_ADDRESS) {
        fail(c, "%s: cached as a group but not one", h->where);
        goto done;
    }
    if (depth == 0) {
        fail(c, "%s: the root is not a group", h->where);
        goto done;
    }
    status = check_dataset(c, h);
done:
    dm_free(h);
    return status;
}

/* ---- the superblock ------------------------------------------------------ */

static int check_superblock(struct check *c, uint64_t *root, uint64_t *btree, uint64_t *heap)
{
    static const unsigned char signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char s[100];
    if (c->file_size < 96) return fail(c, "a file of %llu bytes holds no HDF5 superblock",
                                       (unsigned long long)c->file_size);
    if (fetch(c, 0, c->file_size < sizeof s ? (size_t)c->file_size : sizeof s, s,
              "the superblock") != 0)
        return -1;
    if (memcmp(s, signature, 8) != 0)
        return fail(c, "no HDF5 signature at byte 0 (a user block is not read)");
    unsigned version = s[8];
    if (version > 1) return 1;   /* checksummed metadata: HDF5 verifies it */
    if (s[9] != 0 || s[10] != 0 || s[12] != 0 || s[13] != 8 || s[14] != 8)
        return fail(c, "the superblock gives versions %u, %u, %u and %u-byte offsets, "
                    "%u-byte lengths (dynmo reads 0, 0, 0, 8 and 8)", s[9], s[10], s[12],
                    s[13], s[14]);
    c->leaf_k = (unsigned)le(s + 16, 2);
    c->internal_k = (unsigned)le(s + 18, 2);
    size_t at = 24;
    c->chunk_k = 32;
    if (version == 1) {
        c->chunk_k = (unsigned)le(s + 24, 2);
        at = 28;
    }
    if (c->file_size < at + 72) return fail(c, "the superblock runs past the end of the file");
    if (c->leaf_k < 1 || c->leaf_k > MAX_K || c->internal_k < 1 || c->internal_k > MAX_K ||
        c->chunk_k < 1 || c->chunk_k > MAX_K)
        return fail(c, "the superblock gives B-tree widths %u, %u and %u", c->leaf_k,
                    c->internal_k, c->chunk_k);
    uint64_t base = le(s + at, 8), free_space = le(s + at + 8, 8), end = le(s + at + 16, 8);
    uint64_t driver = le(s + at + 24, 8);
    const unsigned char *entry = s + at + 32;
    if (base != 0 || free_space != UNDEFINED_ADDRESS || driver != UNDEFINED_ADDRESS)
        return fail(c, "the superblock gives a base address %llu, free-space or driver "
                    "information (dynmo's files have none)", (unsigned long long)base);
    if (end > c->file_size) {   /* the commonest damage: say it plainly */
        snprintf(c->err, c->errsize, "truncated: the file has %llu bytes, its superblock says "
                 "%llu (a copy cut short, or a disk that filled)",
                 (unsigned long long)c->file_size, (unsigned long long)end);
        c->failed = 1;
        return -1;
    }
    c->end = end;
    *root = le(entry + 8, 8);
    unsigned cache = (unsigned)le(entry + 16, 4);
    if (cache > 1) return fail(c, "the root group's entry has cache type %u", cache);
    *btree = cache ? le(entry + 24, 8) : UNDEFINED_ADDRESS;
    *heap = cache ? le(entry + 32, 8) : UNDEFINED_ADDRESS;
    return 0;
}

static int check_source(struct check *c)
{
    uint64_t root = 0, btree = UNDEFINED_ADDRESS, heap = UNDEFINED_ADDRESS;
    c->scratch = dm_alloc(1 << 16);
    int status = check_superblock(c, &root, &btree, &heap);
    if (status == 0) status = check_object(c, root, "/", 0, btree, heap);
    dm_free(c->scratch);
    dm_free(c->seen.slots);
    for (int i = 0; i < c->collection_count; i++) {
        dm_free(c->collections[i].index);
        dm_free(c->collections[i].size);
    }
    dm_free(c->collections);
    return status;
}

int dm_h5_check_metadata(const char *path, char *err, size_t errsize)
{
    char reason[768] = "";
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errsize, "%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    struct check c = {.fd = fd, .file_size = (uint64_t)st.st_size, .err = reason,
                      .errsize = sizeof reason};
    int status = check_source(&c);
    close(fd);
    if (status < 0) snprintf(err, errsize, "%s: %s", path, reason);
    return status;
}

int dm_h5_newer_format(const char *path)
{
    unsigned char head[9];
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = pread(fd, head, sizeof head, 0);
    close(fd);
    return n == (ssize_t)sizeof head && !memcmp(head + 1, "HDF", 3) && head[8] > 1;
}
