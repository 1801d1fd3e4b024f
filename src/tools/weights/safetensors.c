/* The safetensors reader and float32 writer (safetensors.h). Every field
 * of the header is checked before the data is touched: a file from
 * anywhere is input, never trusted. It must not know what the tensors
 * mean. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "tools/weights/safetensors.h"

/* A header larger than this is not a checkpoint's: safetensors itself
 * refuses headers over 100 MB. */
#define HEADER_MAX_BYTES (100u << 20)

static int dtype_bytes(enum safetensors_dtype d)
{
    return d == SAFETENSORS_F32 ? 4 : d == SAFETENSORS_OTHER ? 0 : 2;
}

/* Bytes per element of the dtypes safetensors defines, for the range
 * check of tensors we do not convert; 0 for an unknown name. */
static int any_dtype_bytes(const char *name)
{
    static const struct { const char *name; int bytes; } table[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4},
        {"F16", 2}, {"BF16", 2}, {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1},
        {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].name, name)) return table[i].bytes;
    return 0;
}

uint64_t safetensors_elements(const struct safetensors_entry *e)
{
    uint64_t n = 1;
    for (int i = 0; i < e->rank; i++) n *= (uint64_t)e->shape[i];
    return n;
}

/* Reads one entry of the header; 0 or -1 with the problem in err. */
static int parse_entry(struct safetensors_entry *e, const char *name, json_object *value,
                       size_t data_size, char *err, size_t errsize)
{
    if (strlen(name) >= sizeof e->name) {
        dm_set_message(err, errsize, "a tensor name of %zu bytes (at most %zu)", strlen(name),
                       sizeof e->name - 1);
        return -1;
    }
    snprintf(e->name, sizeof e->name, "%s", name);
    json_object *dtype, *shape, *offsets;
    if (!json_object_is_type(value, json_type_object) ||
        !json_object_object_get_ex(value, "dtype", &dtype) ||
        !json_object_is_type(dtype, json_type_string) ||
        !json_object_object_get_ex(value, "shape", &shape) ||
        !json_object_is_type(shape, json_type_array) ||
        !json_object_object_get_ex(value, "data_offsets", &offsets) ||
        !json_object_is_type(offsets, json_type_array) ||
        json_object_array_length(offsets) != 2) {
        dm_set_message(err, errsize, "tensor %s: not an object with dtype, shape and "
                       "data_offsets [begin, end]", name);
        return -1;
    }
    snprintf(e->dtype_name, sizeof e->dtype_name, "%s", json_object_get_string(dtype));
    e->dtype = !strcmp(e->dtype_name, "F32") ? SAFETENSORS_F32
             : !strcmp(e->dtype_name, "F16") ? SAFETENSORS_F16
             : !strcmp(e->dtype_name, "BF16") ? SAFETENSORS_BF16 : SAFETENSORS_OTHER;
    int bytes = any_dtype_bytes(e->dtype_name);
    if (!bytes) {
        dm_set_message(err, errsize, "tensor %s: unknown dtype '%s'", name, e->dtype_name);
        return -1;
    }
    size_t rank = json_object_array_length(shape);
    if (rank > SAFETENSORS_MAX_RANK) {
        dm_set_message(err, errsize, "tensor %s: %zu dimensions (at most %d)", name, rank,
                       SAFETENSORS_MAX_RANK);
        return -1;
    }
    e->rank = (int)rank;
    uint64_t elements = 1;
    for (size_t i = 0; i < rank; i++) {
        json_object *d = json_object_array_get_idx(shape, i);
        errno = 0;
        int64_t v = json_object_is_type(d, json_type_int) ? json_object_get_int64(d) : -1;
        if (v < 0 || errno || (v > 0 && elements > (UINT64_MAX / 8) / (uint64_t)v)) {
            dm_set_message(err, errsize, "tensor %s: shape entry %zu is not a size", name, i);
            return -1;
        }
        e->shape[i] = v;
        elements *= (uint64_t)v;
    }
    for (int i = 0; i < 2; i++) {
        json_object *o = json_object_array_get_idx(offsets, (size_t)i);
        errno = 0;
        int64_t v = json_object_is_type(o, json_type_int) ? json_object_get_int64(o) : -1;
        if (v < 0 || errno) {
            dm_set_message(err, errsize, "tensor %s: data_offsets[%d] is not an offset", name, i);
            return -1;
        }
        if (i == 0) e->begin = (uint64_t)v;
        else e->end = (uint64_t)v;
    }
    if (e->begin > e->end || e->end > data_size) {
        dm_set_message(err, errsize, "tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 ") "
                       "outside the %zu bytes of data", name, e->begin, e->end, data_size);
        return -1;
    }
    if (e->end - e->begin != elements * (uint64_t)bytes) {
        dm_set_message(err, errsize, "tensor %s: %" PRIu64 " bytes of data for %" PRIu64
                       " elements of %s", name, e->end - e->begin, elements, e->dtype_name);
        return -1;
    }
    return 0;
}

static int parse_header(struct safetensors_file *f, const char *text, size_t len, char *err,
                        size_t errsize)
{
    json_tokener *tok = json_tokener_new();
    json_object *root = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = (size_t)json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    int rc = -1;
    if (!root || jerr != json_tokener_success) {
        dm_set_message(err, errsize, "its header is not JSON (%s)",
                       json_tokener_error_desc(jerr));
        goto out;
    }
    for (size_t i = used; i < len; i++)
        if (text[i] != ' ') {
            dm_set_message(err, errsize, "its header has bytes after the JSON object");
            goto out;
        }
    if (!json_object_is_type(root, json_type_object)) {
        dm_set_message(err, errsize, "its header is not a JSON object");
        goto out;
    }
    f->entries = dm_alloc((size_t)json_object_object_length(root) * sizeof *f->entries + 1);
    json_object_object_foreach(root, key, value) {
        if (!strcmp(key, "__metadata__")) continue;
        if (parse_entry(&f->entries[f->count], key, value, f->data_size, err, errsize)) goto out;
        f->count++;
    }
    rc = 0;
out:
    json_object_put(root);
    return rc;
}

int safetensors_open(struct safetensors_file *f, const char *path, char *err, size_t errsize)
{
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    char problem[1024];
    const char *kind = NULL;
    int fd = dm_open_regular(path, &kind);
    if (fd < 0) {
        if (kind) dm_set_message(err, errsize, "%s is %s, not a safetensors file", path, kind);
        else dm_set_message(err, errsize, "cannot open %s: %s", path, dm_errno_text());
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 8) {
        close(fd);
        dm_set_message(err, errsize, "%s: %lld bytes, too short for a safetensors file", path,
                       (long long)st.st_size);
        return -1;
    }
    f->size = (size_t)st.st_size;
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        dm_set_message(err, errsize, "cannot map %s: %s", path, dm_errno_text());
        return -1;
    }
    f->map = map;
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--) header = header << 8 | f->map[i];
    if (header > HEADER_MAX_BYTES || header > f->size - 8) {
        dm_set_message(err, errsize, "%s: its header length field says %" PRIu64 " bytes, but "
                       "the file has %zu after it: not a safetensors file, or truncated", path,
                       header, f->size - 8);
        safetensors_close(f);
        return -1;
    }
    f->data = f->map + 8 + header;
    f->data_size = f->size - 8 - (size_t)header;
    if (parse_header(f, (const char *)f->map + 8, (size_t)header, problem, sizeof problem)) {
        dm_set_message(err, errsize, "%s: %s", path, problem);
        safetensors_close(f);
        return -1;
    }
    return 0;
}

void safetensors_close(struct safetensors_file *f)
{
    if (f->map) munmap((void *)f->map, f->size);
    dm_free(f->entries);
    memset(f, 0, sizeof *f);
}

const struct safetensors_entry *safetensors_find(const struct safetensors_file *f,
                                                 const char *name)
{
    for (int i = 0; i < f->count; i++)
        if (!strcmp(f->entries[i].name, name)) return &f->entries[i];
    return NULL;
}

/* IEEE half to float, exactly (every half is a float). */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023;
    uint32_t bits;
    if (exponent == 31) {
        bits = sign | 0x7f800000u | mantissa << 13;
    } else if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else {   /* subnormal: normalise */
            int shift = 0;
            while (!(mantissa & 1024)) {
                mantissa <<= 1;
                shift++;
            }
            bits = sign | (uint32_t)(113 - shift) << 23 | (mantissa & 1023) << 13;
        }
    } else {
        bits = sign | (exponent + 112) << 23 | mantissa << 13;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

void safetensors_to_float(const struct safetensors_file *f, const struct safetensors_entry *e,
                          float *out)
{
    const unsigned char *p = f->data + e->begin;
    uint64_t n = safetensors_elements(e);
    int bytes = dtype_bytes(e->dtype);
    if (!bytes) dm_internal_error(__FILE__, __LINE__, "tensor %s: dtype %s", e->name,
                                  e->dtype_name);
    for (uint64_t i = 0; i < n; i++, p += bytes) {
        if (e->dtype == SAFETENSORS_F32) {
            uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                            (uint32_t)p[3] << 24;
            memcpy(&out[i], &bits, 4);
        } else if (e->dtype == SAFETENSORS_F16) {
            out[i] = half_to_float((uint16_t)(p[0] | p[1] << 8));
        } else {
            uint32_t bits = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
            memcpy(&out[i], &bits, 4);
        }
    }
}

int safetensors_write(const char *path, const struct safetensors_tensor *tensors, int count,
                      char *err, size_t errsize)
{
    json_object *root = json_object_new_object();
    json_object *meta = json_object_new_object();
    json_object_object_add(meta, "format", json_object_new_string("pt"));
    json_object_object_add(root, "__metadata__", meta);
    uint64_t offset = 0;
    for (int i = 0; i < count; i++) {
        const struct safetensors_tensor *t = &tensors[i];
        json_object *entry = json_object_new_object(), *shape = json_object_new_array();
        json_object *offsets = json_object_new_array();
        uint64_t n = 1;
        for (int d = 0; d < t->rank; d++) {
            json_object_array_add(shape, json_object_new_int64(t->shape[d]));
            n *= (uint64_t)t->shape[d];
        }
        json_object_array_add(offsets, json_object_new_int64((int64_t)offset));
        offset += 4 * n;
        json_object_array_add(offsets, json_object_new_int64((int64_t)offset));
        json_object_object_add(entry, "dtype", json_object_new_string("F32"));
        json_object_object_add(entry, "shape", shape);
        json_object_object_add(entry, "data_offsets", offsets);
        json_object_object_add(root, t->name, entry);
    }
    const char *text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    unsigned char *head = dm_alloc(8 + padded);
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(head + 8, text, len);
    memset(head + 8 + len, ' ', padded - len);
    json_object_put(root);
    int rc = -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        dm_set_message(err, errsize, "cannot create %s: %s", path, dm_errno_text());
        dm_free(head);
        return -1;
    }
    if (dm_write_all(fd, head, 8 + padded)) goto fail;
    for (int i = 0; i < count; i++) {
        uint64_t n = 1;
        for (int d = 0; d < tensors[i].rank; d++) n *= (uint64_t)tensors[i].shape[d];
        if (dm_write_all(fd, tensors[i].data, 4 * n)) goto fail;   /* x86-64: little-endian */
    }
    if (fsync(fd)) goto fail;
    rc = 0;
fail:
    if (rc) {
        dm_set_message(err, errsize, "cannot write %s: %s", path, dm_errno_text());
        unlink(path);
    }
    close(fd);
    dm_free(head);
    return rc;
}
