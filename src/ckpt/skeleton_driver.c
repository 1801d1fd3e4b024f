/* The skeleton driver (skeleton_driver.h): a minimal serial HDF5 file
 * driver of our own on the public virtual-file-driver interface (pread /
 * pwrite on one descriptor, offering what HDF5's POSIX driver offers),
 * with a switch that discards raw-data writes.
 *
 * Why it exists: parallel HDF5 1.10 allocates every chunk of a dataset
 * when it is created or first opened for writing through MPI-IO, and
 * writes the filtered fill value into every chunk of a dataset with a
 * filter (Fletcher32 here), whatever the fill time says; the checkpoint
 * then overwrites every chunk, so every byte reached the page cache twice.
 * Created serially through this driver with discarding on, the datasets
 * get the same allocation (addresses and sizes in the chunk index) while
 * the fill bytes are dropped; the file's end is extended with ftruncate,
 * so the chunks are holes until the ranks write them. A file opened
 * through MPI-IO whose chunks are allocated is not filled again.
 *
 * It must not be used for anything a reader will see unwritten: every
 * chunk allocated while discarding must be written afterwards. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "ckpt/h5util.h"
#include "ckpt/skeleton_driver.h"

struct skeleton_file {
    H5FD_t base;                 /* HDF5's part; must come first */
    int fd;
    haddr_t eoa;                 /* end of the address space HDF5 allocated */
    haddr_t eof;                 /* end of the bytes on disk */
    dev_t device;
    ino_t inode;
    int discard_raw;
    unsigned long long dropped;  /* raw bytes dropped since the last switch */
};

/* The largest address a file offset can hold, as sec2 has it. */
#define SKELETON_MAXADDR (((haddr_t)1 << (8 * sizeof(off_t) - 1)) - 1)

/* Puts a driver failure on HDF5's error stack, so that the API call that
 * failed reports it (dm_h5_error_text shows the innermost cause). */
#define SKELETON_FAIL(minor, ...)                                            \
    H5Epush2(H5E_DEFAULT, __FILE__, __func__, __LINE__, H5E_ERR_CLS, H5E_VFL, \
             (minor), __VA_ARGS__)

static H5FD_t *skeleton_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr)
{
    (void)fapl;
    if (maxaddr == 0 || maxaddr == HADDR_UNDEF || maxaddr > SKELETON_MAXADDR) {
        SKELETON_FAIL(H5E_BADVALUE, "bad maximum address for %s", name);
        return NULL;
    }
    int mode = flags & H5F_ACC_RDWR ? O_RDWR : O_RDONLY;
    if (flags & H5F_ACC_TRUNC) mode |= O_TRUNC;
    if (flags & H5F_ACC_CREAT) mode |= O_CREAT;
    if (flags & H5F_ACC_EXCL) mode |= O_EXCL;
    int fd = open(name, mode, 0666);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        SKELETON_FAIL(H5E_CANTOPENFILE, "cannot open %s: %s", name, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    struct skeleton_file *file = calloc(1, sizeof *file);
    if (!file) {
        SKELETON_FAIL(H5E_CANTALLOC, "out of memory opening %s", name);
        close(fd);
        return NULL;
    }
    file->fd = fd;
    file->eof = (haddr_t)st.st_size;
    file->device = st.st_dev;
    file->inode = st.st_ino;
    return &file->base;
}

static herr_t skeleton_close(H5FD_t *base)
{
    struct skeleton_file *file = (struct skeleton_file *)base;
    int rc = close(file->fd);
    free(file);
    if (rc != 0) {
        SKELETON_FAIL(H5E_CANTCLOSEFILE, "close failed: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static int skeleton_cmp(const H5FD_t *a, const H5FD_t *b)
{
    const struct skeleton_file *f1 = (const struct skeleton_file *)a;
    const struct skeleton_file *f2 = (const struct skeleton_file *)b;
    if (f1->device != f2->device) return f1->device < f2->device ? -1 : 1;
    if (f1->inode != f2->inode) return f1->inode < f2->inode ? -1 : 1;
    return 0;
}

/* What sec2 offers: metadata and small raw data are aggregated into
 * larger blocks and metadata writes are accumulated. */
static herr_t skeleton_query(const H5FD_t *base, unsigned long *flags)
{
    (void)base;
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA |
             H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA;
    return 0;
}

static haddr_t skeleton_get_eoa(const H5FD_t *base, H5FD_mem_t type)
{
    (void)type;
    return ((const struct skeleton_file *)base)->eoa;
}

static herr_t skeleton_set_eoa(H5FD_t *base, H5FD_mem_t type, haddr_t addr)
{
    (void)type;
    ((struct skeleton_file *)base)->eoa = addr;
    return 0;
}

static haddr_t skeleton_get_eof(const H5FD_t *base, H5FD_mem_t type)
{
    (void)type;
    return ((const struct skeleton_file *)base)->eof;
}

/* The handle is the driver's own file, for ckpt_skeleton_discard_raw. */
static herr_t skeleton_get_handle(H5FD_t *base, hid_t fapl, void **handle)
{
    (void)fapl;
    *handle = base;
    return 0;
}

/* Bytes past the end of the file read as zeros, as in sec2. */
static herr_t skeleton_read(H5FD_t *base, H5FD_mem_t type, hid_t dxpl, haddr_t addr,
                            size_t size, void *buffer)
{
    (void)type;
    (void)dxpl;
    struct skeleton_file *file = (struct skeleton_file *)base;
    unsigned char *out = buffer;
    while (size > 0) {
        ssize_t n = pread(file->fd, out, size, (off_t)addr);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            SKELETON_FAIL(H5E_READERROR, "pread failed: %s", strerror(errno));
            return -1;
        }
        if (n == 0) {
            memset(out, 0, size);
            break;
        }
        out += n;
        addr += (haddr_t)n;
        size -= (size_t)n;
    }
    return 0;
}

static herr_t skeleton_write(H5FD_t *base, H5FD_mem_t type, hid_t dxpl, haddr_t addr,
                             size_t size, const void *buffer)
{
    (void)dxpl;
    struct skeleton_file *file = (struct skeleton_file *)base;
    if (file->discard_raw && type == H5FD_MEM_DRAW) {
        file->dropped += size;
        return 0;
    }
    const unsigned char *in = buffer;
    while (size > 0) {
        ssize_t n = pwrite(file->fd, in, size, (off_t)addr);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            SKELETON_FAIL(H5E_WRITEERROR, "pwrite failed: %s",
                          n < 0 ? strerror(errno) : "nothing written");
            return -1;
        }
        in += n;
        addr += (haddr_t)n;
        size -= (size_t)n;
    }
    if (addr > file->eof) file->eof = addr;
    return 0;
}

/* The file ends where HDF5's address space ends: this is what extends it
 * over the dropped chunks (as holes) when the file is closed. */
static herr_t skeleton_truncate(H5FD_t *base, hid_t dxpl, hbool_t closing)
{
    (void)dxpl;
    (void)closing;
    struct skeleton_file *file = (struct skeleton_file *)base;
    if (file->eoa == file->eof) return 0;
    if (ftruncate(file->fd, (off_t)file->eoa) != 0) {
        SKELETON_FAIL(H5E_SEEKERROR, "ftruncate failed: %s", strerror(errno));
        return -1;
    }
    file->eof = file->eoa;
    return 0;
}

static const H5FD_class_t skeleton_class = {
    .name = "dynmo_ckpt_skeleton",
    .maxaddr = SKELETON_MAXADDR,
    .fc_degree = H5F_CLOSE_WEAK,
    .open = skeleton_open,
    .close = skeleton_close,
    .cmp = skeleton_cmp,
    .query = skeleton_query,
    .get_eoa = skeleton_get_eoa,
    .set_eoa = skeleton_set_eoa,
    .get_eof = skeleton_get_eof,
    .get_handle = skeleton_get_handle,
    .read = skeleton_read,
    .write = skeleton_write,
    .truncate = skeleton_truncate,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

/* The driver's id, registered on first use (HDF5 keeps its own copy of
 * the class). */
static hid_t driver = -1;

hid_t ckpt_skeleton_fapl(void)
{
    if (driver < 0 || H5Iis_valid(driver) <= 0)
        driver = DM_H5(H5FDregister(&skeleton_class));
    hid_t fapl = DM_H5(H5Pcreate(H5P_FILE_ACCESS));
    DM_H5(H5Pset_driver(fapl, driver, NULL));
    return fapl;
}

unsigned long long ckpt_skeleton_discard_raw(hid_t file, int on)
{
    void *handle = NULL;
    DM_H5(H5Fget_vfd_handle(file, H5P_DEFAULT, &handle));
    struct skeleton_file *f = handle;
    DM_ASSERT(f && driver >= 0 && f->base.driver_id == driver);
    unsigned long long dropped = f->dropped;
    f->dropped = 0;
    f->discard_raw = on;
    return dropped;
}
