/* dynmo world: the MPI world of one dynmo process. Start-up and the
 * fatal-path hooks (a failure on one rank aborts the job), polled waits
 * and collectives, agreeing on one error across ranks, how ranks share
 * processors, and the one check of an MPI call. Every module that talks
 * MPI goes through it; it uses only core.
 *
 * Every wait in dynmo polls: MPI_Test, then sched_yield (or, on a rank
 * whose CPUs are shared by more ranks, a short sleep: world_wait_round).
 * With more ranks than cores, MPICH's blocking waits spin and starve the
 * rank that would let them finish, so blocking collectives are never used:
 * their non-blocking forms are waited for with world_wait. */
#ifndef DYNMO_WORLD_H
#define DYNMO_WORLD_H

#include <stddef.h>
#include <mpi.h>

/* Checks one MPI call: MPI_COMM_WORLD and every communicator made from it
 * return errors (MPI_ERRORS_RETURN, set by world_init) instead of MPICH's
 * default of aborting inside the library, and a failure takes the fatal
 * path with "[rank N] file:line: internal error: CALL: MPI's error text"
 * and exit status 1 for the whole job. */
#define WORLD_MPI(call)                                                       \
    do {                                                                      \
        int world_mpi_rc_ = (call);                                           \
        if (world_mpi_rc_ != MPI_SUCCESS)                                     \
            world_mpi_failed(world_mpi_rc_, #call, __FILE__, __LINE__);       \
    } while (0)
__attribute__((noreturn)) void world_mpi_failed(int code, const char *call, const char *file,
                                                int line);

/* Both wait for non-blocking MPI requests by polling (MPI_Test, then
 * world_wait_round) and return the seconds waited; an MPI error takes the
 * fatal path with MPI's own text. A null request is complete. */
double world_wait(MPI_Request *req);
double world_wait_all(int n, MPI_Request *reqs);

/* Initialises MPI (thread level FUNNELED), records rank and size in core,
 * sets MPI_ERRORS_RETURN on MPI_COMM_WORLD (so WORLD_MPI sees failures),
 * and registers MPI_Abort as the fatal hook and MPI_Finalize as the clean
 * user-error exit. Idempotent.
 *
 * A test-only switch: with DYNMO_TEST_MPI_FAULT=send in the environment,
 * the job's last rank then sends to a rank that does not exist, through
 * WORLD_MPI, so that the tests can see the fatal path of a failing MPI
 * call (tests/t_world.sh). */
void world_init(int *argc, char ***argv);
/* Finalises MPI if world_init started it, bounded: a rank whose
 * MPI_Finalize has not returned within DYNMO_FINALIZE_SECONDS (default 60,
 * 0 for no bound) prints a warning and exits with `status`, the status the
 * caller is about to exit with (its files must be complete by then). The
 * test-only DYNMO_TEST_MPI_FAULT=finalize keeps the last rank from ever
 * reaching MPI_Finalize (tests/t_world.sh). */
void world_finalize(int status);
/* The CPUs this rank may use (its affinity mask at start-up: taskset,
 * mpiexec's binding, a Slurm cpuset) divided by the ranks of its node that
 * may run on any of them; at least 1. What its compute threads should be. */
int world_cpus_for_rank(void);
/* Ranks of this job that run on this node (MPI_COMM_TYPE_SHARED). */
int world_local_size(void);
/* This rank among them (0..world_local_size() - 1). */
int world_local_rank(void);
/* Collective: 1 when every rank names a device (id: the backend's
 * device_id) and no two ranks of a node name the same one; 0 when some
 * rank has none ("") or shares its device with another of its node. */
int world_devices_distinct(const char *id);

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

/* One round of a polled wait that began at t0 (dm_now): gives back this
 * rank's turn (world_compute_begin) if it holds one, then yields the core,
 * or, when this rank is oversubscribed and the wait is older than 100 us,
 * sleeps 500 us. world_wait and world_wait_all use it; a loop that
 * polls with something else (MPI_Iprobe) calls it between polls. */
void world_wait_round(double t0);

/* Collective (every rank of the job): ranks of a node whose CPU sets
 * overlap form a turn group. Ranks of a group with more ranks than CPUs and
 * several CPUs (unbound) first pin themselves one to a CPU, round robin in
 * rank order, which splits the group into one per CPU (world_stage_sharing
 * then sees the new placement). The ranks of a group then take turns:
 * world_compute_begin admits one at a time, first come first served (a
 * ticket lock in POSIX shared memory, waits on a futex), so a computation
 * runs alone on its CPU instead of being time-sliced with its neighbours'.
 * Returns 1 when the job takes turns (the same on every rank; 0, with a
 * warning from rank 0, when some rank cannot pin itself or map the shared
 * memory). Idempotent. */
int world_take_turns(void);
/* One round of a wait that polls something other than MPI (a device
 * transfer; backend_set_wait_round): MPI's progress (a probe), so that
 * the non-blocking operations this rank posted before go on for the ranks
 * that wait on them, then world_wait_round from the wait's first round
 * (first set). */
void world_poll_round(int first);

/* Before a computation, when this rank takes turns: gives back a turn it
 * still holds and waits for a new one. The turn is kept after the
 * computation, so that the rank posts its sends before a woken peer takes
 * the CPU, and given back by the next world_compute_begin or by
 * world_wait_round (a rank never waits for a message holding a turn: the
 * peer it waits for may need it). A no-op unless this rank takes turns. */
void world_compute_begin(void);
/* Gives back the turn this rank holds, if any. The engine calls it when its
 * instruction list is done: no rank may hold a turn into code that waits
 * without world_wait_round (a blocking collective inside HDF5). */
void world_release_turn(void);

/* Collective: broadcasts n ints from rank 0, polled (MPI_Ibcast). */
void world_bcast_ints(int *buf, int n);
/* Collective over MPI_COMM_WORLD: the largest of every rank's value,
 * polled (MPI_Iallreduce). */
int world_max_int(int value);

/* Collective over ranks 0 and 1 (others return 0): sends `bytes` from
 * rank 0 to rank 1 `reps` times with polled non-blocking calls, returns
 * the bytes per second rank 1 saw (broadcast to both). The reference that
 * block migration is measured against. */
double world_transfer_rate(size_t bytes, int reps);

#endif
