/* MPI start-up and the hooks that make core's fatal path abort the whole
 * job (STYLE.md: no rank is left waiting on a dead peer). */
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dynmo/core.h"
#include "dynmo/pipe.h"
#include "pipe/world.h"

static int started;
static int local_size = 1;

static void abort_job(int status)
{
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized && dm_world_size() > 1) MPI_Abort(MPI_COMM_WORLD, status);
}

static void finalize_job(void)
{
    world_finalize();
}

void world_init(int *argc, char ***argv)
{
    if (started) return;
    int provided = 0, rank = 0, size = 1;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dynmo: error: MPI_Init_thread failed\n");
        exit(DM_EXIT_INTERNAL);
    }
    started = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dm_set_rank(rank, size);
    dm_set_abort_hook(abort_job);
    dm_set_finalize_hook(finalize_job);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
}

void world_finalize(void)
{
    int finalized = 0;
    if (!started) return;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

int world_local_size(void) { return local_size; }

int world_agree(int code, const char *message, MPI_Comm comm, char *err, size_t errsize)
{
    int rank, size;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
        DM_FATAL("MPI_Comm_rank/size failed");
    int mine = code ? rank : size, lowest = size;
    MPI_Request request;
    if (MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm, &request) != MPI_SUCCESS)
        DM_FATAL("MPI_Iallreduce of the failure flags failed");
    pipe_wait(&request);
    if (lowest == size) return 0;
    struct {
        int code;
        char message[WORLD_MESSAGE_BYTES];
    } agreed;
    memset(&agreed, 0, sizeof agreed);
    if (rank == lowest) {
        agreed.code = code;
        snprintf(agreed.message, sizeof agreed.message, "%s", message ? message : "");
    }
    if (MPI_Ibcast(&agreed, (int)sizeof agreed, MPI_BYTE, lowest, comm, &request) !=
        MPI_SUCCESS)
        DM_FATAL("MPI_Ibcast of a failure message failed");
    pipe_wait(&request);
    if (err && errsize) snprintf(err, errsize, "%s", agreed.message);
    return agreed.code;
}

void world_bcast_ints(int *buf, int n)
{
    if (dm_world_size() == 1) return;
    MPI_Request req;
    if (MPI_Ibcast(buf, n, MPI_INT, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        DM_FATAL("MPI_Ibcast failed");
    pipe_wait(&req);
}


double world_transfer_rate(size_t bytes, int reps)
{
    int rank = dm_rank();
    if (rank > 1) return 0.0;
    char *buf = dm_alloc(bytes);
    memset(buf, rank + 1, bytes);
    double rate = 0.0;
    int ack = 0;
    for (int r = -1; r < reps; r++) {   /* r = -1 warms up */
        MPI_Request req;
        double t0 = dm_now();
        if (rank == 0) {
            MPI_Isend(buf, (int)bytes, MPI_BYTE, 1, 77, MPI_COMM_WORLD, &req);
            pipe_wait(&req);
            MPI_Irecv(&ack, 1, MPI_INT, 1, 78, MPI_COMM_WORLD, &req);
            pipe_wait(&req);
        } else {
            MPI_Irecv(buf, (int)bytes, MPI_BYTE, 0, 77, MPI_COMM_WORLD, &req);
            pipe_wait(&req);
            MPI_Isend(&ack, 1, MPI_INT, 0, 78, MPI_COMM_WORLD, &req);
            pipe_wait(&req);
        }
        if (r >= 0) rate += (dm_now() - t0);
    }
    dm_free(buf);
    return (double)bytes * reps / rate;
}

static void test_or_die(MPI_Request *req, int *done)
{
    int rc = MPI_Test(req, done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        DM_FATAL("MPI_Test: %s", text);
    }
}

double pipe_wait(MPI_Request *req)
{
    double t0 = dm_now();
    int done = 0;
    while (*req != MPI_REQUEST_NULL) {
        test_or_die(req, &done);
        if (done) break;
        sched_yield();
    }
    return dm_now() - t0;
}

double pipe_wait_all(int n, MPI_Request *reqs)
{
    double t0 = dm_now();
    for (;;) {
        int pending = 0;
        for (int i = 0; i < n; i++) {
            if (reqs[i] == MPI_REQUEST_NULL) continue;
            int done = 0;
            test_or_die(&reqs[i], &done);
            pending += !done;
        }
        if (!pending) break;
        sched_yield();
    }
    return dm_now() - t0;
}
