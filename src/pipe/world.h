/* The MPI world of one dynmo process: start-up, the fatal-path hooks and
 * polled waits. Internal to src/ until the pipeline engine lands in
 * include/dynmo/pipe.h. */
#ifndef DYNMO_PIPE_WORLD_H
#define DYNMO_PIPE_WORLD_H

#include <stddef.h>
#include <mpi.h>

/* Initialises MPI (thread level FUNNELED), records rank and size in core,
 * and registers MPI_Abort as the fatal hook and MPI_Finalize as the clean
 * user-error exit. Idempotent. */
void world_init(int *argc, char ***argv);
/* Finalises MPI if world_init started it. */
void world_finalize(void);
/* Ranks of this job that run on this node (MPI_COMM_TYPE_SHARED). */
int world_local_size(void);

/* Collective over comm: every rank learns `code` and `message` of the
 * lowest rank whose code is non-zero (message into err, cut at errsize and
 * at WORLD_MESSAGE_BYTES - 1 bytes). Returns that code; 0 when no rank
 * failed. For problems each rank finds on its own (its files), so that all
 * ranks act on one of them together and none is left waiting. Polled. */
#define WORLD_MESSAGE_BYTES 1024
int world_agree(int code, const char *message, MPI_Comm comm, char *err, size_t errsize);

/* How the S stages of replica 0 (ranks 0..S-1) share processors: stages on
 * one node whose CPU sets overlap form a group; group g's stages get
 * cores[g] = CPUs x (its stages) / (ranks of the job that may run on those
 * CPUs), so other replicas take their share. Fills group (S) and cores (up
 * to S) and returns the number of groups when some group has fewer cores
 * than stages; returns 0 (a processor per stage) otherwise. Every rank
 * computes the same answer from the placements gathered at start-up. */
int world_stage_sharing(int stages, int *group, double *cores);

/* One round of a polled wait that began at t0 (dm_now): yields the core,
 * or, when this rank is oversubscribed and the wait is older than 100 us,
 * sleeps 500 us. pipe_wait and pipe_wait_all use it; a loop that
 * polls with something else (MPI_Iprobe) calls it between polls. */
void world_wait_round(double t0);

/* Collective: broadcasts n ints from rank 0, polled (MPI_Ibcast). */
void world_bcast_ints(int *buf, int n);

/* Collective over ranks 0 and 1 (others return 0): sends `bytes` from
 * rank 0 to rank 1 `reps` times with polled non-blocking calls, returns
 * the bytes per second rank 1 saw (broadcast to both). The reference that
 * block migration is measured against. */
double world_transfer_rate(size_t bytes, int reps);

#endif
