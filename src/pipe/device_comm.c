/* The replicas' gradient sums over the devices' own transport
 * (engine_internal.h): NCCL on CUDA, the emulated device's shared memory,
 * where every rank of the job has a device of its own. Where ranks share
 * a device (or on the CPU) the sums stay on MPI through host staging
 * (reduce.c). The transport's group is the stage's replicas; its
 * unique id travels by a polled broadcast over the stage's communicator,
 * the only MPI the transport sees. Must not: be used by some replicas of
 * a stage and not others (the choice is collective and the same on every
 * rank). */
#include <string.h>
#include "pipe/engine_internal.h"

/* bcast_ints for comm_init: ctx is the group's MPI communicator */
static void group_bcast_ints(void *ctx, int *buf, int n)
{
    MPI_Request req;
    WORLD_MPI(MPI_Ibcast(buf, n, MPI_INT, 0, *(MPI_Comm *)ctx, &req));
    world_wait(&req);
}

void engine_device_comm_init(struct engine *eng)
{
    const struct dm_backend *ops = backend_current();
    eng->replica_comm = NULL;
    int wanted = ops->comm_init && eng->grid.replicas > 1;
    int distinct = world_devices_distinct(wanted ? ops->device_id : "");
    if (wanted && distinct)
        eng->replica_comm = ops->comm_init(eng->grid.replica, eng->grid.replicas,
                                           group_bcast_ints, &eng->stage_comm);
    if (dm_rank() != 0 || !ops->comm_init || eng->grid.replicas == 1) return;
    if (eng->replica_comm)
        dm_log("replicas: gradient sums over the devices' own transport (%s)\n",
               strcmp(ops->name, "cuda") ? "the emulated device's shared memory" : "NCCL");
    else
        dm_log("replicas: gradient sums through host staging and MPI (ranks of a node share "
               "a device)\n");
}

void engine_device_comm_free(struct engine *eng)
{
    if (!eng->replica_comm) return;
    backend_current()->comm_free(eng->replica_comm);
    eng->replica_comm = NULL;
}
