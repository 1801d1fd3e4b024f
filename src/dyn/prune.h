/* Gradual global magnitude pruning (dyn.kind=prune), the parts that tests
 * call directly: the Zhu & Gupta schedule and the distributed global
 * top-k of the paper's Algorithm 1. Internal to src/dyn and tests. */
#ifndef DYNMO_DYN_PRUNE_H
#define DYNMO_DYN_PRUNE_H

#include <mpi.h>
#include <stdint.h>
#include "dynmo/backend.h"
#include "dynmo/core.h"

/* The target sparsity of the schedule of Zhu & Gupta at step t (0-based):
 * s_t = s_f + (s_i - s_f) (1 - (t - t0) / (n dt))^3 for the pruning steps
 * t = t0, t0 + dt, ..., t0 + n dt, and -1 at every other step. */
double prune_schedule_at(const struct dm_config *cfg, int step);
/* The sparsity in force at step t: that of the last pruning step <= t
 * (0 before the first). */
double prune_sparsity_in_force(const struct dm_config *cfg, int step);

/* The total order that decides which weights survive: a larger key is
 * kept first. Magnitude first (the bits of |w|, monotone for floats);
 * among equal magnitudes, the lower global index wins. The global index
 * of a weight is layer * 12 C^2 + its place in the block's matrix-weight
 * order (block_matrix_tensor), below 2^32 - 1. */
uint64_t prune_key(float weight, uint32_t global_index);

/* Collective over comm (every rank passes the same keep and total): the
 * cut such that exactly the `keep` largest of all ranks' keys together
 * satisfy key > cut, when the ranks hold `total` distinct keys in all and
 * this rank holds keys[0..n) (reordered in place). Algorithm 1: every rank
 * selects its local top min(keep, n) (or, when fewer weights are pruned
 * than kept, its local bottom min(total - keep, n)), rank 0 gathers them
 * (MPI_Igatherv: counts differ per rank), selects the global one and
 * broadcasts the cut; every wait is polled. keep == total gives a cut
 * below every key (0 when no key is 0), keep == 0 gives UINT64_MAX. */
uint64_t prune_global_cut(MPI_Comm comm, uint64_t *keys, long n, long keep, long total);

/* One rank's share of a round of prune_radix_cut: counts
 * (DM_PRUNE_BUCKETS, zeroed by the caller) += how many of this rank's
 * keys equal prefix on the bits above shift + 8, by their bits shift ..
 * shift + 7. */
typedef void (*prune_histogram_fn)(long *counts, void *ctx, uint64_t prefix, int shift);

/* Collective over comm, as prune_global_cut and with the same result (the
 * same uint64_t), without the keys in one place: a radix select of eight
 * rounds of 8 bits; each round every rank makes its histogram (on a
 * device, where its weights live), the ranks sum them (MPI_Iallreduce,
 * polled) and each picks the bucket that holds the cut. */
uint64_t prune_radix_cut(MPI_Comm comm, prune_histogram_fn histogram, void *ctx, long keep,
                         long total);

#endif
