/* The checkpoint's skeleton driver: a serial HDF5 file driver (POSIX
 * pread/pwrite, like HDF5's sec2) that can be told to discard raw-data
 * writes. The checkpoint writer creates the file's skeleton with it on one
 * rank (groups, attributes, datasets with every chunk allocated) without
 * the fill values HDF5 writes into every filtered chunk it allocates; the
 * ranks then write the chunks through MPI-IO. See checkpoint.c.
 *
 * Internal to src/ckpt. Nothing here calls MPI. */
#ifndef DYNMO_CKPT_SKELETON_DRIVER_H
#define DYNMO_CKPT_SKELETON_DRIVER_H

#include <hdf5.h>

/* A new file access property list that selects the skeleton driver; the
 * caller closes it. Fatal on HDF5 failure. */
hid_t ckpt_skeleton_fapl(void);

/* Turns discarding of raw-data writes to `file` (open with the skeleton
 * driver) on or off; off when the file is opened. While it is on, every
 * write HDF5 hands the driver as raw data (H5FD_MEM_DRAW, which includes
 * the global heap of variable-length strings) is dropped: the bytes on
 * disk stay a hole until someone writes them. Returns the bytes dropped
 * since the last call. Fatal on HDF5 failure. */
unsigned long long ckpt_skeleton_discard_raw(hid_t file, int on);

#endif
