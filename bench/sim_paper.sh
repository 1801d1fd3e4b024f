#!/usr/bin/env bash
# Issue 18's paper-scale table: each scheme's recorded 2-rank static run
# (bench/sim_record.sh; the 4-rank one where there is no 2-rank run, and
# for MoE, whose 4-rank run splits the experts over 2 ranks)
# drives `dynmo simulate` at the paper's scale (24
# pipeline stages x 30 data-parallel replicas, 4 micro-batches per stage,
# 1,000 steps; models of DEPTHS blocks), once with whole blocks as the
# unit of placement and once with attention and MLP apart (--split-blocks).
# Prints one markdown row per scheme and depth: the best balancer's
# speedup over the best static layout, the layout bound, the dynamism's own
# saving (static-uniform with it over without) and both together,
# re-packing's ranks and rank-hours, and the sub-block what-if against the
# same whole-block static layout: its layout bound and its best balancer.
# With HARDWARE=FILE (hardware/h100-sxm.ini) the blocks are priced op by op
# on that hardware file instead of the run's fitted costs (docs/simulate.md,
# "The hardware model"): each scheme's config at the paper's shape (hidden
# size 1024, 32 heads, sequence length 2048, GPT-2's vocabulary, micro-batches
# of 2 sequences), the run's trajectory of states driving it, the links
# the file's. STEPS (default 1000) sets the simulated steps.
# Usage: bench/sim_paper.sh [DIR]   (default runs/simval2)
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
dir=${1:-runs/simval2}
S=${STAGES:-24}; D=${REPLICAS:-30}
echo "| scheme | blocks | best balancer | over best static | layout bound | dynamism alone | dynamism + balancer | re-pack | sub-block: bound | sub-block: best balancer | seconds |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for scheme in ${SCHEMES:-freeze early_exit prune}; do
  for L in ${DEPTHS:-32 48}; do
    for unit in block split; do
      extra=(); [ $unit = split ] && extra=(--split-blocks)
      start=$(date +%s.%N)
      run=$dir/$scheme-2-static; [ -e "$run" ] || run=$dir/$scheme-4-static
      # MoE: the 4-rank run, whose experts are split over 2 ranks (on 2
      # ranks ep = 1 and a block's load never varies)
      [ $scheme = moe ] && [ -e "$dir/moe-4-static" ] && run=$dir/moe-4-static
      if [ -n "${HARDWARE:-}" ]; then
        shape=(model.layers="$L" model.channels=1024 model.heads=32 train.seq=2048
               model.max_seq=2048 model.vocab=50304 train.micro_batches=$((4 * S))
               train.batch=$((2 * 4 * S * D)) parallel.pp="$S" parallel.dp="$D")
        "$DYNMO" simulate --hardware "$HARDWARE" --config "configs/$scheme.ini" "${shape[@]}" \
          --from-run "$run" --steps "${STEPS:-1000}" "${extra[@]}" > "/tmp/sim_paper_$unit.out"
      else
        "$DYNMO" simulate --from-run "$run" --blocks "$L" --stages "$S" \
          --replicas "$D" --micro-batches $((4 * S)) --steps "${STEPS:-1000}" --latency-ms 0.02 \
          --bandwidth-gbs 25 "${extra[@]}" > "/tmp/sim_paper_$unit.out"
      fi
      eval "secs_$unit=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
    done
    b=/tmp/sim_paper_block.out; p=/tmp/sim_paper_split.out
    best=$(grep -oP 'best balancer: \K[a-z-]+' $b)
    speedup=$(grep -oP 'best balancer: [a-z-]+, \K[0-9.]+x' $b)
    bound=$(grep -oP 'layout bound \K[0-9.]+x' $b)
    alone=$(grep -oP 'the dynamism alone \K[0-9.]+x' $b || echo -)
    both=$(grep -oP 'with the best balancer \K[0-9.]+x' $b || echo -)
    repack=$(grep -oP 'repack: \K.*' $b | sed 's/ of the rank-hours of partition-time/ rank-hours/')
    # the sub-block what-if against the whole-block best static layout
    static_ms=$(grep -oP 'the best static layout \K[0-9.]+' $b)
    split_layout_ms=$(grep -oP "each step's best layout \K[0-9.]+" $p)
    block_static=$(grep -oP 'best static: \K[a-z-]+' $b)
    static_total=$(awk -v n="$block_static" '$1 == n { print $2 }' $b)
    split_best=$(grep -oP 'best balancer: \K[a-z-]+' $p)
    split_total=$(awk -v n="$split_best" '$1 == n { print $2 }' $p)
    sub_bound=$(awk -v a="$static_ms" -v b="$split_layout_ms" 'BEGIN { printf "%.3fx", a / b }')
    sub_best=$(awk -v a="$static_total" -v b="$split_total" 'BEGIN { printf "%.3fx", a / b }')
    echo "| $scheme | $L | $best | $speedup | $bound | $alone | $both | $repack | $sub_bound | $sub_best ($split_best) | $secs_block + $secs_split |"
  done
done
