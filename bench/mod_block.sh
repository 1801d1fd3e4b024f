#!/usr/bin/env bash
# Whether a mixture-of-depths block's cost follows the tokens it processes
# when sequences choose unevenly (issue 17): even, skewed (same tokens,
# one long sequence) and padded (every sequence as long as the longest)
# choices, forward + backward, timed in rotating order in one process
# (bench/mod_block.c; medians over REPS; it fails if a token not
# chosen changes). Twice: configs/mod.ini's micro-batch (B 2, T 256,
# 64 tokens), and B 4, T 512, 512 tokens. One thread.
# Environment: REPS (default 31), THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s "$BUILD/bench/mod_block" >/dev/null
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
REPS=${REPS:-31} "$BUILD/bench/mod_block"
REPS=${REPS:-31} B=4 T=512 TOKENS=512 "$BUILD/bench/mod_block"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
