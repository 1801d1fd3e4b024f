/* Gradual global magnitude pruning (dyn.kind=prune), the parts that tests
 * call directly: the Zhu & Gupta schedule and the distributed global
 * top-k of the paper's Algorithm 1. Internal to src/dyn and tests. */
#ifndef DYNMO_DYN_PRUNE_H
#define DYNMO_DYN_PRUNE_H

#include <mpi.h>
#include <stddef.h>
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

/* The most prunable weights a model may have: 2^32 - 1. The tie-break's
 * global index is 32 bits, and with indices 0 .. 2^32 - 2 the low half of
 * every key (0xffffffff minus the index) is at least 1, so no key is 0.
 * prune_check_model (dyn.kind = prune at start-up) and the cuts below
 * share this one limit; every count of weights or keys is a long (64
 * bits), so a model of 2^31 to 2^32 - 1 weights is counted exactly. */
#define PRUNE_MAX_WEIGHTS 4294967295L

/* The prunable weights of a model: layers x 12 C^2 (block_matrix_weights),
 * in 64 bits. */
long prune_model_weights(int layers, int channels);

/* 0 when a model of `layers` blocks of width `channels` has at most
 * PRUNE_MAX_WEIGHTS prunable weights; else -1 with a message in err that
 * names the count, the limit and the fix (the scheme's start-up check). */
int prune_check_model(int layers, int channels, char *err, size_t errsize);

/* The weights kept at sparsity s of total: total - round(s total). */
long prune_keep_count(long total, double sparsity);

/* The total order that decides which weights survive: a larger key is
 * kept first. Magnitude first (the bits of |w|, monotone for floats);
 * among equal magnitudes, the lower global index wins. The global index
 * of a weight is layer * 12 C^2 + its place in the block's matrix-weight
 * order (block_matrix_tensor), below PRUNE_MAX_WEIGHTS. */
uint64_t prune_key(float weight, uint32_t global_index);

/* Collective over comm (every rank passes the same keep and total): the
 * cut such that exactly the `keep` largest of all ranks' keys together
 * satisfy key > cut, when the ranks hold `total` distinct keys in all and
 * this rank holds keys[0..n) (reordered in place). Algorithm 1: every rank
 * selects its local top min(keep, n) (or, when fewer weights are pruned
 * than kept, its local bottom min(total - keep, n)), rank 0 gathers them
 * (prune_gather_cut: MPI_Igatherv, counts differ per rank), selects the
 * global one and broadcasts the cut; every wait is polled. total <=
 * PRUNE_MAX_WEIGHTS. keep == total gives a cut below every key (0, and
 * no key is 0), keep == 0 gives UINT64_MAX. */
uint64_t prune_global_cut(MPI_Comm comm, uint64_t *keys, long n, long keep, long total);

/* prune_global_cut after the local selection, collective over comm: this
 * rank's candidates[0..count) (its local top min(keep, n) keys, or bottom
 * min(total - keep, n)) gathered on rank 0, which selects the cut and
 * broadcasts it. MPI's counts and displacements are ints, so the gather
 * runs in rounds of at most round_keys keys from all ranks together
 * (prune_global_cut passes INT_MAX; a test passes a few to run many
 * rounds on little data). total <= PRUNE_MAX_WEIGHTS. */
uint64_t prune_gather_cut(MPI_Comm comm, const uint64_t *candidates, long count, long keep,
                          long total, long round_keys);

/* One rank's share of a round of prune_radix_cut: counts
 * (DM_PRUNE_BUCKETS, zeroed by the caller) += how many of this rank's
 * keys equal prefix on the bits above shift + 8, by their bits shift ..
 * shift + 7. */
typedef void (*prune_histogram_fn)(long *counts, void *ctx, uint64_t prefix, int shift);

/* Collective over comm, as prune_global_cut and with the same result (the
 * same uint64_t), without the keys in one place: a radix select of eight
 * rounds of 8 bits; each round every rank makes its histogram (on a
 * device, where its weights live), the ranks sum them (MPI_Iallreduce,
 * polled) and each picks the bucket that holds the cut. total <=
 * PRUNE_MAX_WEIGHTS. */
uint64_t prune_radix_cut(MPI_Comm comm, prune_histogram_fn histogram, void *ctx, long keep,
                         long total);

#endif
