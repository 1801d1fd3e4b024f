/* The listing of a run log's datasets, shared by the writer (what a resume
 * cuts back or fills) and the readers (what they may read): one H5Lvisit
 * callback that appends every dataset with its type, rank and extent.
 * Private to src/ckpt. */
#ifndef DYNMO_CKPT_RUNLOG_LIST_H
#define DYNMO_CKPT_RUNLOG_LIST_H

#include <hdf5.h>
#include "dynmo/ckpt.h"

struct runlog_listing {
    struct runlog_dataset_info *infos;  /* (count) in visit order; dm_free them */
    int count;
    long capacity;
};

/* H5Lvisit's callback, data a struct runlog_listing: a dataset's entry
 * (its name with a leading '/'); a dimension beyond what a run log holds
 * (rows past LONG_MAX, columns past INT_MAX) gives rank -1 and no extent.
 * -1 when HDF5 cannot open or describe it. */
herr_t runlog_list_one(hid_t group, const char *name, const H5L_info_t *link, void *data);

#endif
