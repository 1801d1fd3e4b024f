/* The replicas' gradient sums and the tied embedding's exchange over the
 * devices' own transport (engine_internal.h): NCCL on CUDA, the emulated
 * device's shared memory, where every rank of the job has a device of its
 * own. Where ranks share a device (or on the CPU) both stay on MPI through
 * host staging (reduce.c). The groups are the stage's replicas and each
 * replica's first and last stage; a group's unique id travels by a polled
 * broadcast over its MPI communicator, the only MPI the transport sees.
 * Must not: be used by some ranks of a group and not others (the choice
 * is collective and the same on every rank). */
#include <string.h>
#include "pipe/engine_internal.h"

/* bcast_ints for comm_init: ctx is the group's MPI communicator */
static void group_bcast_ints(void *ctx, int *buf, int n)
{
    MPI_Request req;
    WORLD_MPI(MPI_Ibcast(buf, n, MPI_INT, 0, *(MPI_Comm *)ctx, &req));
    world_wait(&req);
}

/* The first and last stage of each replica: a transport group of two
 * (group rank 0 the first stage). Collective over the world. */
static void tied_init(struct engine *eng, int transport)
{
    const struct pipe_grid *g = &eng->grid;
    int end = g->stages > 1 && (g->stage == 0 || g->stage == g->stages - 1);
    eng->tied_mpi = MPI_COMM_NULL;
    WORLD_MPI(MPI_Comm_split(MPI_COMM_WORLD, end && transport ? g->replica : MPI_UNDEFINED,
                             g->stage, &eng->tied_mpi));
    if (eng->tied_mpi == MPI_COMM_NULL) return;
    const struct dm_backend *ops = backend_current();
    eng->tied_comm = ops->comm_init(g->stage == 0 ? 0 : 1, 2, group_bcast_ints, &eng->tied_mpi);
    eng->tied_theirs =
        ops->alloc((size_t)eng->shape.vocab * (size_t)eng->shape.channels * sizeof(float));
}

void engine_device_comm_init(struct engine *eng)
{
    const struct dm_backend *ops = backend_current();
    eng->replica_comm = eng->tied_comm = NULL;
    eng->tied_theirs = NULL;
    int transport = world_devices_distinct(ops->comm_init ? ops->device_id : "");
    if (transport && eng->grid.replicas > 1)
        eng->replica_comm = ops->comm_init(eng->grid.replica, eng->grid.replicas,
                                           group_bcast_ints, &eng->stage_comm);
    tied_init(eng, transport);
    if (dm_rank() != 0 || !ops->comm_init) return;
    const char *how = strcmp(ops->name, "cuda") ? "the emulated device's shared memory" : "NCCL";
    if (transport)
        dm_log("transport: the replicas' gradient sums and the tied embedding's exchange over "
               "the devices' own (%s)\n", how);
    else
        dm_log("transport: host staging and MPI (ranks of a node share a device)\n");
}

void engine_device_comm_free(struct engine *eng)
{
    const struct dm_backend *ops = backend_current();
    if (eng->replica_comm) ops->comm_free(eng->replica_comm);
    if (eng->tied_comm) ops->comm_free(eng->tied_comm);
    if (eng->tied_theirs) ops->free(eng->tied_theirs);
    if (eng->tied_mpi != MPI_COMM_NULL) WORLD_MPI(MPI_Comm_free(&eng->tied_mpi));
    eng->replica_comm = eng->tied_comm = NULL;
    eng->tied_theirs = NULL;
}
