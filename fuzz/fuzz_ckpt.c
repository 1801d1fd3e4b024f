/* libFuzzer harness of the checkpoint checker and loader's reader:
 * ckpt_check_image, which runs exactly what `dynmo check-ckpt` and the
 * loader run on a file (the schema's structure, the metadata's values,
 * every chunk's checksum) on an HDF5 file image in memory. The input is a
 * checkpoint file's bytes; no MPI is needed (the offline reader never
 * calls it).
 *
 * Besides crashes and sanitizer reports, it fails when a check leaves an
 * HDF5 object open: in a long-running loader that is a leak. */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "dynmo/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ckpt_check_image(data, size, "fuzz.h5", 1, NULL, NULL);
    ssize_t open_objects = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open_objects != 0) {
        fprintf(stderr, "fuzz_ckpt: %zd HDF5 objects left open after the check\n",
                open_objects);
        abort();
    }
    return 0;
}
