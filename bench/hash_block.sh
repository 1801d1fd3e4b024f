#!/usr/bin/env bash
# The cost of one hash-attention block against one dense block at the same
# length (issue 17), forward + backward, timed alternately in one process
# (bench/hash_block.c: medians over REPS repeats; it first checks a
# one-bucket hash block against the dense one and fails on a mismatch).
# Defaults: configs/hash.ini's micro-batch (8 buckets, C 64, 4 heads, B 2)
# at T 1024 and 2048, one thread (a rank's share of 2 cores with 2 ranks).
# Usage: bench/hash_block.sh [T ...]; BUCKETS, C, NH, B, REPS, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s "$BUILD/bench/hash_block" >/dev/null
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
REPS=${REPS:-21} "$BUILD/bench/hash_block" "$@"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
