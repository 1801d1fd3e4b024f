#!/usr/bin/env bash
# What -ffp-contract=off costs (docs/PERFORMANCE.md): the default build
# against one that lets GCC fuse multiply-adds (FP_CONTRACT=, built into
# build/fused), `dynmo bench` of configs/ref.ini, ROUNDS rounds alternating
# the two so that both see the same machine. Prints each median and the
# ratio of the medians of the rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
rounds=${ROUNDS:-3}
steps=${BENCH_STEPS:-10}
extra=()
[ -n "${THREADS:-}" ] && extra=(train.threads="$THREADS")   # THREADS=1: one core
make --no-print-directory -j2 BUILD=build/fused FP_CONTRACT= build/fused/dynmo >/dev/null || exit 1
median_of() { sed -n 's/^bench: median \([0-9.]*\) ms\/step.*/\1/p'; }
off=(); fused=()
for r in $(seq 1 "$rounds"); do
  a=$("$BUILD/dynmo" bench --config configs/ref.ini "${extra[@]}" --steps "$steps" 2>&1 | median_of)
  b=$(build/fused/dynmo bench --config configs/ref.ini "${extra[@]}" --steps "$steps" 2>&1 | median_of)
  echo "round $r: -ffp-contract=off $a ms/step, fused $b ms/step"
  off+=("$a"); fused+=("$b")
done
printf '%s\n' "${off[@]}" | sort -n | sed -n "$(( (rounds + 1) / 2 ))p" > /tmp/dynmo-contract-off.$$
printf '%s\n' "${fused[@]}" | sort -n | sed -n "$(( (rounds + 1) / 2 ))p" > /tmp/dynmo-contract-fused.$$
awk -v a="$(cat /tmp/dynmo-contract-off.$$)" -v b="$(cat /tmp/dynmo-contract-fused.$$)" \
  'BEGIN{printf "contraction: -ffp-contract=off %.1f ms/step, fused %.1f ms/step (medians of the rounds): off takes %.3fx the time\n", a, b, a/b}'
rm -f /tmp/dynmo-contract-off.$$ /tmp/dynmo-contract-fused.$$
