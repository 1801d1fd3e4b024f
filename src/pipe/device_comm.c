/* The devices' own transport (engine_internal.h): NCCL on CUDA, the
 * emulated device's shared memory, where every rank of the job has a
 * device of its own. It carries the activations and gradients between
 * stages, the migrating blocks' slabs, the engine parts' exchanges (the
 * parallel.ep part's rows), the replicas' gradient sums and the tied
 * embedding's halves, device to device. Where ranks share a device (or on
 * the CPU) all of these stay on MPI through host staging. Each group (a
 * replica's stages, a stage's replicas, an engine part's groups) is a transport
 * communicator made from its MPI communicator: the group's unique id
 * travels by a polled broadcast over it, the only MPI the transport sees.
 * Must not: be used by some ranks of a group and not others (the choice
 * is collective and the same on every rank). */
#include <stdio.h>
#include <string.h>
#include "pipe/engine_internal.h"

/* bcast_ints for comm_init: ctx is the group's MPI communicator */
static void group_bcast_ints(void *ctx, int *buf, int n)
{
    MPI_Request req;
    WORLD_MPI(MPI_Ibcast(buf, n, MPI_INT, 0, *(MPI_Comm *)ctx, &req));
    world_wait(&req);
}

struct dm_backend_comm *engine_transport_over(const struct engine *eng, MPI_Comm comm)
{
    if (!eng->transport) return NULL;
    int rank, size;
    WORLD_MPI(MPI_Comm_rank(comm, &rank));
    WORLD_MPI(MPI_Comm_size(comm, &size));
    if (size < 2) return NULL;
    return backend_current()->comm_init(rank, size, group_bcast_ints, &comm);
}

void engine_device_comm_init(struct engine *eng)
{
    const struct dm_backend *ops = backend_current();
    const struct pipe_grid *g = &eng->grid;
    /* the transport's waits make MPI's progress (a gather posted before) */
    backend_set_wait_round(world_poll_round);
    eng->transport = world_devices_distinct(ops->comm_init ? ops->device_id : "");
    eng->replica_comm = engine_transport_over(eng, eng->stage_comm);
    eng->pipe_comm = engine_transport_over(eng, eng->pipeline_comm);
    eng->tied_theirs = NULL;
    if (eng->pipe_comm && (g->stage == 0 || g->stage == g->stages - 1))
        eng->tied_theirs =
            ops->alloc((size_t)eng->shape.vocab * (size_t)eng->shape.channels * sizeof(float));
    eng->has_pending = 0;
    if (dm_rank() != 0 || !ops->comm_init) return;
    const char *how = strcmp(ops->name, "cuda") ? "the emulated device's shared memory" : "NCCL";
    char parts[256] = "";   /* what the engine's parts exchange, in their words */
    for (int i = 0; engine_parts[i]; i++)
        if (engine_parts[i]->carries)
            snprintf(parts + strlen(parts), sizeof parts - strlen(parts), "%s, ",
                     engine_parts[i]->carries);
    if (eng->transport)
        dm_log("transport: activations, gradients, migrating blocks, %sthe replicas' sums and "
               "the tied embedding device to device (%s)\n", parts, how);
    else
        dm_log("transport: host staging and MPI (ranks of a node share a device)\n");
}

void engine_device_comm_free(struct engine *eng)
{
    const struct dm_backend *ops = backend_current();
    DM_ASSERT(!eng->has_pending);
    if (eng->replica_comm) ops->comm_free(eng->replica_comm);
    if (eng->pipe_comm) ops->comm_free(eng->pipe_comm);
    if (eng->tied_theirs) ops->free(eng->tied_theirs);
    eng->replica_comm = eng->pipe_comm = NULL;
    eng->tied_theirs = NULL;
}

/* The transfers over comm, waited for by the transport itself (it polls):
 * the rank gives back its turn first; the wait counts as the step's. */
void engine_transport_exchange(struct engine *eng, struct dm_backend_comm *comm,
                               const struct dm_comm_op *ops, int n)
{
    world_release_turn();
    double t0 = dm_now();
    backend_current()->comm_exchange(comm, ops, n);
    eng->wait_s += dm_now() - t0;
}

void engine_transport_send(struct engine *eng, const float *buf, size_t count, int stage,
                           int pair)
{
    DM_ASSERT(!eng->has_pending);
    struct dm_comm_op op = {.buf = (float *)buf, .count = count, .peer = stage, .recv = 0};
    if (pair) {
        eng->pending = op;
        eng->has_pending = 1;
        return;
    }
    engine_transport_exchange(eng, eng->pipe_comm, &op, 1);
}

void engine_transport_receive(struct engine *eng, float *buf, size_t count, int stage)
{
    struct dm_comm_op ops[2];
    int n = 0;
    if (eng->has_pending) ops[n++] = eng->pending;
    ops[n++] = (struct dm_comm_op){.buf = buf, .count = count, .peer = stage, .recv = 1};
    eng->has_pending = 0;
    engine_transport_exchange(eng, eng->pipe_comm, ops, n);
}
