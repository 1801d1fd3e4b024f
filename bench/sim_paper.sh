#!/usr/bin/env bash
# Issue 18's paper-scale table: each scheme's recorded 2-rank static run
# (bench/sim_record.sh) drives `dynmo simulate` at the paper's scale (24
# pipeline stages x 30 data-parallel replicas, 4 micro-batches per stage,
# 1,000 steps; models of DEPTHS blocks), once with whole blocks as the
# unit of placement and once with attention and MLP apart (--split-blocks).
# Prints one markdown row per scheme, depth and unit: the best balancer's
# speedup over the best static layout, the layout bound, the dynamism's own
# saving (static-uniform with it over without), both together, and
# re-packing's ranks and rank-hours.
# Usage: bench/sim_paper.sh [DIR]   (default runs/simval2)
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
dir=${1:-runs/simval2}
S=${STAGES:-24}; D=${REPLICAS:-30}
echo "| scheme | blocks | unit | best balancer | speedup over best static | layout bound | dynamism alone | dynamism + balancer | re-pack | seconds |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for scheme in ${SCHEMES:-freeze early_exit prune}; do
  for L in ${DEPTHS:-32 48}; do
    for unit in block split; do
      extra=(); [ $unit = split ] && extra=(--split-blocks)
      start=$(date +%s.%N)
      out=$("$DYNMO" simulate --from-run "$dir/$scheme-2-static" --blocks "$L" --stages "$S" \
            --replicas "$D" --micro-batches $((4 * S)) --steps 1000 --latency-ms 0.02 \
            --bandwidth-gbs 25 "${extra[@]}")
      secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
      best=$(grep -oP 'best balancer: \K[a-z-]+' <<<"$out")
      speedup=$(grep -oP 'best balancer: [a-z-]+, \K[0-9.]+x' <<<"$out")
      bound=$(grep -oP 'layout bound \K[0-9.]+x' <<<"$out")
      alone=$(grep -oP 'the dynamism alone \K[0-9.]+x' <<<"$out" || echo -)
      both=$(grep -oP 'with the best balancer \K[0-9.]+x' <<<"$out" || echo -)
      repack=$(grep -oP 'repack: \K.*' <<<"$out" | sed 's/ of the rank-hours of partition-time/ rank-hours/')
      echo "| $scheme | $L | $unit | $best | $speedup | $bound | $alone | $both | $repack | $secs |"
    done
  done
done
