/* HDF5 error reporting and small attribute helpers shared by the run log,
 * the checkpoint and the tools, and the one check of a file's bytes that
 * HDF5 1.10 does not make before trusting them (its global heaps). It
 * never decides what a file means; it only turns HDF5's error stack into
 * one readable line. */
#define _GNU_SOURCE   /* memmem */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "ckpt/h5util.h"

void dm_h5_init(void)
{
    static int done;
    if (done) return;
    /* No cleanup of HDF5's at exit: every file is closed by its owner on
     * the normal path, and after a failed write (a full disk) closing the
     * broken file at exit crashes inside HDF5 1.10 (H5F__close_cb). */
    H5dont_atexit();
    if (H5open() < 0) DM_FATAL("H5open failed: the HDF5 library did not start");
    if (H5Eset_auto2(H5E_DEFAULT, NULL, NULL) < 0)
        DM_FATAL("H5Eset_auto2 failed: cannot silence HDF5's own error printing");
    done = 1;
}

/* What the stack walk keeps: the outermost entry (the API call the user
 * made) and the innermost one (where HDF5 found the problem). */
struct error_walk {
    int entries;
    char api_function[64];
    char api_desc[256];
    char inner_function[64];
    char inner_desc[256];
    hid_t inner_major, inner_minor;
};

static herr_t collect_entry(unsigned n, const H5E_error2_t *entry, void *data)
{
    struct error_walk *walk = data;
    const char *function = entry->func_name ? entry->func_name : "?";
    const char *desc = entry->desc ? entry->desc : "";
    if (n == 0) {
        snprintf(walk->api_function, sizeof walk->api_function, "%s", function);
        snprintf(walk->api_desc, sizeof walk->api_desc, "%s", desc);
    }
    snprintf(walk->inner_function, sizeof walk->inner_function, "%s", function);
    snprintf(walk->inner_desc, sizeof walk->inner_desc, "%s", desc);
    walk->inner_major = entry->maj_num;
    walk->inner_minor = entry->min_num;
    walk->entries++;
    return 0;
}

void dm_h5_error_text(char *buf, size_t size)
{
    struct error_walk walk;
    memset(&walk, 0, sizeof walk);
    /* Copying the stack clears the default one, so the next failure starts
     * from an empty stack. */
    hid_t stack = H5Eget_current_stack();
    if (stack < 0) {
        snprintf(buf, size, "HDF5 error stack unavailable");
        return;
    }
    H5Ewalk2(stack, H5E_WALK_DOWNWARD, collect_entry, &walk);
    if (walk.entries == 0) {
        snprintf(buf, size, "no HDF5 error recorded");
        H5Eclose_stack(stack);
        return;
    }
    char major[128] = "", minor[128] = "";
    H5Eget_msg(walk.inner_major, NULL, major, sizeof major);
    H5Eget_msg(walk.inner_minor, NULL, minor, sizeof minor);
    if (walk.entries == 1)
        snprintf(buf, size, "%s: %s [%s: %s]", walk.api_function, walk.api_desc,
                 major, minor);
    else
        snprintf(buf, size, "%s: %s; cause: %s: %s [%s: %s]", walk.api_function,
                 walk.api_desc, walk.inner_function, walk.inner_desc, major, minor);
    H5Eclose_stack(stack);
    for (char *c = buf; *c; c++)   /* HDF5's texts hold newlines: one line */
        if (*c == '\n') *c = ' ';
}

/* The file being written, for messages about a write the system refused. */
static char file_context[1024];

void dm_h5_set_file_context(const char *path)
{
    snprintf(file_context, sizeof file_context, "%s", path ? path : "");
}

/* Why the system refused a write, when HDF5's text (through sec2 or
 * MPI-IO) says it did; NULL for any other failure. */
static const char *refused_write(const char *text)
{
    static const char *const reasons[] = {
        "No space left on device", "Disk quota exceeded", "Read-only file system",
        "Input/output error", "File too large",
    };
    for (size_t k = 0; k < sizeof reasons / sizeof *reasons; k++)
        if (strstr(text, reasons[k])) return reasons[k];
    return NULL;
}

void dm_h5_fail(const char *file, int line, const char *call)
{
    char text[1024];
    dm_h5_error_text(text, sizeof text);
    /* A write the system refused (a full disk, a quota, a read-only file
     * system) is the user's to fix, not our bug: status 2, naming the file. */
    const char *reason = refused_write(text);
    if (reason)
        dm_user_error_local("cannot write %s: %s", file_context[0] ? file_context : "a file",
                            reason);
    dm_internal_error(file, line, "%s failed: %s", call, text);
}

void dm_h5_describe_failure(char *err, size_t errsize, const char *call)
{
    char text[1024];
    dm_h5_error_text(text, sizeof text);
    if (err && errsize) snprintf(err, errsize, "%s failed: %s", call, text);
}

/* ---- global heaps ----------------------------------------------------------
 * HDF5 keeps variable-length strings (every string attribute dynmo writes)
 * in global heap collections: "GCOL", version 1, three reserved bytes, the
 * collection's size, then objects of (index: 2 bytes, reference count: 2,
 * reserved: 4, size, data padded to 8 bytes), the free space last as
 * object 0 whose size is all that remains. HDF5 1.10.8 believes those
 * sizes: an object larger than its collection makes H5HG_read copy past
 * it (a crash), and a free-space object of the wrong size makes the
 * collection's decoding loop forever. Sizes are "size of lengths" bytes
 * wide, which the superblock gives. */

#define HEAP_SCAN_BYTES ((size_t)4 << 20)

static uint64_t little_endian(const unsigned char *p, size_t bytes)
{
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; i++) value |= (uint64_t)p[i] << (8 * i);
    return value;
}

/* The superblock's "size of lengths" (2, 4 or 8), or 0 when no superblock
 * is in bytes[0..size) (HDF5 looks for it at 0, 512, 1024, 2048, ...). */
static size_t size_of_lengths(const unsigned char *bytes, size_t size)
{
    static const unsigned char signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    for (size_t at = 0; at + 16 <= size; at = at ? 2 * at : 512) {
        if (memcmp(bytes + at, signature, sizeof signature) != 0) continue;
        unsigned version = bytes[at + 8];
        size_t lengths = version <= 1 ? bytes[at + 14] : bytes[at + 10];
        return lengths == 2 || lengths == 4 || lengths == 8 ? lengths : 0;
    }
    return 0;
}

/* Checks the one collection at bytes + at; file_size bounds it. */
static int heap_collection_ok(const unsigned char *bytes, size_t size, size_t at,
                              uint64_t file_size, size_t lengths, char *err, size_t errsize)
{
    size_t header = 8 + lengths, object_header = 8 + lengths;
    if (at + header > size) return 0;   /* cut off by the scan: HDF5 checks the rest */
    uint64_t collection = little_endian(bytes + at + 8, lengths);
    if (bytes[at + 4] != 1 || collection < header || collection > file_size - at) {
        snprintf(err, errsize, "damaged: the global heap collection at byte %zu (where HDF5 "
                 "keeps string attributes) has version %u and size %llu in a file of %llu "
                 "bytes", at, bytes[at + 4], (unsigned long long)collection,
                 (unsigned long long)file_size);
        return -1;
    }
    uint64_t end = at + collection < size ? at + collection : size;
    for (uint64_t p = at + header; p + object_header <= end;) {
        unsigned index = (unsigned)little_endian(bytes + p, 2);
        uint64_t object = little_endian(bytes + p + 8, lengths);
        uint64_t remaining = at + collection - p;
        if (index == 0) {
            if (object == remaining) return 0;
            snprintf(err, errsize, "damaged: the global heap collection at byte %zu (where "
                     "HDF5 keeps string attributes) gives its free space %llu bytes where "
                     "%llu remain (HDF5 1.10 would loop forever decoding it)", at,
                     (unsigned long long)object, (unsigned long long)remaining);
            return -1;
        }
        if (object > remaining || object_header + ((object + 7) & ~(uint64_t)7) > remaining) {
            snprintf(err, errsize, "damaged: the global heap collection at byte %zu (where "
                     "HDF5 keeps string attributes) holds object %u of %llu bytes with %llu "
                     "bytes left in it (HDF5 1.10 would read past the collection)", at, index,
                     (unsigned long long)object, (unsigned long long)remaining);
            return -1;
        }
        p += object_header + ((object + 7) & ~(uint64_t)7);
    }
    return 0;
}

int dm_h5_check_global_heaps(const void *start, size_t size, uint64_t file_size, char *err,
                             size_t errsize)
{
    const unsigned char *bytes = start;
    size_t lengths = size_of_lengths(bytes, size);
    if (!lengths) return 0;
    for (size_t at = 0; at + 4 <= size;) {
        const unsigned char *found = memmem(bytes + at, size - at, "GCOL", 4);
        if (!found) break;
        at = (size_t)(found - bytes);
        if (heap_collection_ok(bytes, size, at, file_size, lengths, err, errsize) != 0)
            return -1;
        at += 4;
    }
    return 0;
}

/* dm_h5_check_global_heaps on the first HEAP_SCAN_BYTES of the file at
 * path, where HDF5 puts the collections of a file whose string attributes
 * were written before its data (every dynmo file). */
static int file_heaps_ok(const char *path, uint64_t file_size, char *err, size_t errsize)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, errsize, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t want = file_size < HEAP_SCAN_BYTES ? (size_t)file_size : HEAP_SCAN_BYTES, got = 0;
    unsigned char *bytes = malloc(want ? want : 1);
    if (!bytes) DM_FATAL("out of memory reading the start of %s", path);
    while (got < want) {
        ssize_t n = pread(fd, bytes + got, want - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    char reason[512];
    int status = dm_h5_check_global_heaps(bytes, got, file_size, reason, sizeof reason);
    free(bytes);
    if (status != 0) snprintf(err, errsize, "%s: %s", path, reason);
    return status;
}

hid_t dm_h5_open_readonly(const char *path, char *err, size_t errsize)
{
    dm_h5_init();
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errsize, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errsize, "%s: not a regular file", path);
        return -1;
    }
    htri_t is_hdf5 = H5Fis_hdf5(path);
    if (is_hdf5 < 0) {
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        snprintf(err, errsize, "%s: cannot read: %s", path, text);
        return -1;
    }
    if (is_hdf5 == 0) {
        snprintf(err, errsize, "%s: not an HDF5 file (no HDF5 signature)", path);
        return -1;
    }
    if (dm_h5_check_metadata(path, err, errsize) < 0 ||
        file_heaps_ok(path, (uint64_t)st.st_size, err, errsize) != 0)
        return -1;
    hid_t fapl = DM_H5(H5Pcreate(H5P_FILE_ACCESS));
    /* A live writer holds HDF5's lock; readers of a run log must not need it. */
    DM_H5(H5Pset_file_locking(fapl, 0, 1));
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (file < 0) {
        /* Read the stack before any other HDF5 call clears it. */
        char text[1024];
        dm_h5_error_text(text, sizeof text);
        snprintf(err, errsize,
                 "%s: cannot open this HDF5 file (damaged, truncated or locked): %s",
                 path, text);
    }
    DM_H5(H5Pclose(fapl));
    return file;
}

void dm_h5_write_string_attr(hid_t loc, const char *name, const char *value)
{
    hid_t type = DM_H5(H5Tcopy(H5T_C_S1));
    DM_H5(H5Tset_size(type, H5T_VARIABLE));
    DM_H5(H5Tset_cset(type, H5T_CSET_UTF8));
    hid_t space = DM_H5(H5Screate(H5S_SCALAR));
    hid_t attr = DM_H5(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT));
    DM_H5(H5Awrite(attr, type, &value));
    DM_H5(H5Aclose(attr));
    DM_H5(H5Sclose(space));
    DM_H5(H5Tclose(type));
}

void dm_h5_write_int_attr(hid_t loc, const char *name, long value)
{
    long long v = value;
    hid_t space = DM_H5(H5Screate(H5S_SCALAR));
    hid_t attr = DM_H5(H5Acreate2(loc, name, H5T_STD_I64LE, space, H5P_DEFAULT,
                                  H5P_DEFAULT));
    DM_H5(H5Awrite(attr, H5T_NATIVE_LLONG, &v));
    DM_H5(H5Aclose(attr));
    DM_H5(H5Sclose(space));
}

int dm_h5_read_attr_text(hid_t loc, const char *name, char **text,
                         char *err, size_t errsize)
{
    *text = NULL;
    int status = -1;
    hid_t attr = -1, file_type = -1, mem_type = -1, space = -1;
    htri_t exists = DM_H5_TRY(H5Aexists(loc, name), err, errsize, done);
    if (!exists) return 1;
    attr = DM_H5_TRY(H5Aopen(loc, name, H5P_DEFAULT), err, errsize, done);
    file_type = DM_H5_TRY(H5Aget_type(attr), err, errsize, done);
    space = DM_H5_TRY(H5Aget_space(attr), err, errsize, done);
    H5T_class_t type_class = H5Tget_class(file_type);
    if ((type_class != H5T_STRING && type_class != H5T_INTEGER) ||
        H5Sget_simple_extent_npoints(space) != 1) {
        snprintf(err, errsize, "attribute %s is not a single string or integer", name);
        goto done;
    }
    if (type_class == H5T_INTEGER) {
        long long value = 0;
        DM_H5_TRY(H5Aread(attr, H5T_NATIVE_LLONG, &value), err, errsize, done);
        *text = dm_alloc(32);
        snprintf(*text, 32, "%lld", value);
        status = 0;
        goto done;
    }
    mem_type = DM_H5_TRY(H5Tcopy(H5T_C_S1), err, errsize, done);
    /* HDF5 converts between strings of the same character set only. */
    DM_H5_TRY(H5Tset_cset(mem_type, H5Tget_cset(file_type)), err, errsize, done);
    htri_t variable = DM_H5_TRY(H5Tis_variable_str(file_type), err, errsize, done);
    if (variable) {
        DM_H5_TRY(H5Tset_size(mem_type, H5T_VARIABLE), err, errsize, done);
        char *value = NULL;
        DM_H5_TRY(H5Aread(attr, mem_type, &value), err, errsize, done);
        size_t n = value ? strlen(value) : 0;
        *text = dm_alloc(n + 1);
        if (n) memcpy(*text, value, n);
        H5free_memory(value);
    } else {
        size_t n = H5Tget_size(file_type);
        DM_H5_TRY(H5Tset_size(mem_type, n + 1), err, errsize, done);
        DM_H5_TRY(H5Tset_strpad(mem_type, H5T_STR_NULLTERM), err, errsize, done);
        *text = dm_alloc(n + 1);
        DM_H5_TRY(H5Aread(attr, mem_type, *text), err, errsize, done);
    }
    status = 0;
done:
    if (status != 0 && *text) {
        dm_free(*text);
        *text = NULL;
    }
    if (mem_type >= 0) H5Tclose(mem_type);
    if (space >= 0) H5Sclose(space);
    if (file_type >= 0) H5Tclose(file_type);
    if (attr >= 0) H5Aclose(attr);
    return status;
}

int dm_h5_path_exists(hid_t file, const char *path)
{
    if (!strcmp(path, "/")) return 1;
    char prefix[1024];
    size_t n = strlen(path);
    if (n >= sizeof prefix) return 0;
    for (size_t i = 1; i <= n; i++) {
        if (i < n && path[i] != '/') continue;
        memcpy(prefix, path, i);
        prefix[i] = '\0';
        htri_t exists = H5Lexists(file, prefix, H5P_DEFAULT);
        if (exists <= 0) {
            if (exists < 0) H5Eclear2(H5E_DEFAULT);
            return 0;
        }
    }
    return 1;
}
