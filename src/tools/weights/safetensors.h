/* The safetensors format (Hugging Face): an 8-byte little-endian header
 * length N, N bytes of JSON mapping each tensor's name to its dtype, shape
 * and data_offsets [begin, end) into the data that follows (plus an
 * optional "__metadata__" map of strings), then the data. A reader of
 * such files (the whole file mapped read-only, every entry checked before
 * a byte of data is used) and a writer of float32 ones. It knows nothing
 * of GPT-2 or of dynmo's model. */
#ifndef DYNMO_TOOLS_SAFETENSORS_H
#define DYNMO_TOOLS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_MAX_RANK 8
#define SAFETENSORS_NAME_BYTES 256

enum safetensors_dtype { SAFETENSORS_F32, SAFETENSORS_F16, SAFETENSORS_BF16, SAFETENSORS_OTHER };

struct safetensors_entry {
    char name[SAFETENSORS_NAME_BYTES];
    char dtype_name[16];            /* as the header spells it ("F32") */
    enum safetensors_dtype dtype;
    int rank;
    int64_t shape[SAFETENSORS_MAX_RANK];
    uint64_t begin, end;            /* byte range in the data section */
};

struct safetensors_file {
    char path[4096];
    const unsigned char *map;       /* the whole file, read-only */
    size_t size;
    const unsigned char *data;      /* the data section: map + 8 + header bytes */
    size_t data_size;
    int count;
    struct safetensors_entry *entries;   /* (count), in the header's order */
};

/* Maps and checks the file at path: its length field against the file's
 * size, the header as a JSON object of entries each with a dtype string,
 * a shape of non-negative integers (at most SAFETENSORS_MAX_RANK) and
 * data_offsets inside the data section, whose byte count is the shape's
 * elements times the dtype's size (F32, F16, BF16; another dtype is kept
 * as SAFETENSORS_OTHER, with its range checked against the section only).
 * Returns 0, or -1 with one message naming the file and the problem (and
 * the tensor) in err; f is then empty. Not collective. */
int safetensors_open(struct safetensors_file *f, const char *path, char *err, size_t errsize);
void safetensors_close(struct safetensors_file *f);
/* The entry named `name`, or NULL. */
const struct safetensors_entry *safetensors_find(const struct safetensors_file *f,
                                                 const char *name);
/* Elements of an entry (the product of its shape; 1 for rank 0). */
uint64_t safetensors_elements(const struct safetensors_entry *e);
/* Converts entry e (F32, F16 or BF16) to float32 into out (elements of
 * them), little-endian as stored; the data need not be aligned. */
void safetensors_to_float(const struct safetensors_file *f, const struct safetensors_entry *e,
                          float *out);

/* One float32 tensor to write: its name, shape and data (the caller's). */
struct safetensors_tensor {
    const char *name;
    int rank;
    int64_t shape[SAFETENSORS_MAX_RANK];
    const float *data;
};
/* Writes `count` tensors as a new safetensors file at path (created
 * exclusively, written, fsynced): the header lists them in the order
 * given, each F32 with its data_offsets, __metadata__ {"format": "pt"},
 * padded with spaces to a multiple of 8 bytes; the data follows in the
 * same order. Returns 0, or -1 with a message naming the path in err (a
 * partly written file is removed). */
int safetensors_write(const char *path, const struct safetensors_tensor *tensors, int count,
                      char *err, size_t errsize);

#endif
