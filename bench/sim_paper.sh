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
# same whole-block static layout: its layout bound and its best balancer,
# the units priced by a FLOPs share of each block ("FLOPs") or, where DIR
# holds the run's sublayer twin (SCHEME-2-static-sublayer, UNITS=sublayer
# bench/sim_record.sh), by its measured units (the twin named).
# With HARDWARE=FILE (hardware/h100-sxm.ini) the blocks are priced op by op
# on that hardware file instead of the run's fitted costs (docs/simulate.md,
# "The hardware model"): each scheme's config at the paper's shape (hidden
# size 1024, 32 heads, sequence length 2048, GPT-2's vocabulary, micro-batches
# of 2 sequences), the run's trajectory of states driving it, the links
# the file's. STEPS (default 1000) sets the simulated steps.
#
# Then the MoE rows with expert placement (docs/simulate.md, "Expert
# placement"), on the paper's MoE grid of 128 GPUs (16 stages x 8
# replicas, 4 micro-batches per stage, the experts over ep = 8 of the
# replicas): each run's per-expert counts placed static, balanced (the
# placement planner) and balanced with COPIES (default 2) expert copies a
# block, each with the static layouts and the balancers. Two shapes, each
# from its recorded run when DIR has it: Mixtral-8x7B-like (32 blocks, 8
# experts, top-2; DIR/moe-4-static, configs/moe.ini) and LLaMA-MoE-3.5B-like
# (32 blocks, 16 experts, top-4; DIR/moe16-4-static, SCHEMES=moe16
# bench/sim_record.sh). Per shape and placement: the busiest expert rank
# over the mean (mean over blocks and steps), the best static layout's and
# the best balancer's ms/step, and each against the static placement's
# best static layout (the paper's baseline). MOE=0 leaves them out;
# SCHEMES= (empty) prints the MoE rows alone.
# Usage: bench/sim_paper.sh [DIR]   (default runs/simval2)
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
dir=${1:-runs/simval2}
S=${STAGES:-24}; D=${REPLICAS:-30}
echo "| scheme | blocks | best balancer | over best static | layout bound | dynamism alone | dynamism + balancer | re-pack | sub-block: bound | sub-block: best balancer | seconds |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for scheme in ${SCHEMES-freeze early_exit prune}; do
  for L in ${DEPTHS:-32 48}; do
    for unit in block split; do
      extra=(); [ $unit = split ] && extra=(--split-blocks)
      start=$(date +%s.%N)
      run=$dir/$scheme-2-static; [ -e "$run" ] || run=$dir/$scheme-4-static
      # MoE: the 4-rank run, whose experts are split over 2 ranks (on 2
      # ranks ep = 1 and a block's load never varies)
      [ $scheme = moe ] && [ -e "$dir/moe-4-static" ] && run=$dir/moe-4-static
      # the sub-block columns from the run's sublayer twin when recorded
      # (UNITS=sublayer bench/sim_record.sh): its units' measured costs
      # instead of a FLOPs share
      [ $unit = split ] && [ -e "$run-sublayer" ] && [ -z "${HARDWARE:-}" ] && run=$run-sublayer
      eval "run_$unit=\${run##*/}"
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
    units=FLOPs; [ "$run_split" != "$run_block" ] && units=$run_split
    echo "| $scheme | $L | $best | $speedup | $bound | $alone | $both | $repack | $sub_bound ($units) | $sub_best ($split_best) | $secs_block + $secs_split |"
  done
done

[ "${MOE:-1}" = 0 ] && exit 0
# ---- MoE with expert placement: 16 stages x 8 replicas, ep = 8 ------------
MS=${MOE_STAGES:-16}; MD=${MOE_REPLICAS:-8}; EP=${MOE_EP:-8}; COPIES=${COPIES:-2}
echo
echo "| shape | run | placement | busiest rank / mean | best static ms/step | best balancer ms/step | static layout over static placement | best balancer over static placement | seconds |"
echo "|---|---|---|---|---|---|---|---|---|"
for shape in mixtral llama-moe; do
  name=moe-4-static; [ $shape = llama-moe ] && name=moe16-4-static
  run=$dir/$name
  if [ ! -e "$run/runlog.h5" ]; then
    echo "| $shape | (no $run: record it with SCHEMES=${name%%-*} RANKS=4 bench/sim_record.sh) | | | | | | | |"
    continue
  fi
  base=
  for placement in static balanced copies; do
    what=(--placement "$placement"); [ $placement = copies ] && what=(--placement balanced --replicas-max "$COPIES")
    start=$(date +%s.%N)
    out=/tmp/sim_paper_moe_$placement.out
    "$DYNMO" simulate --from-run "$run" --blocks 32 --stages "$MS" --replicas "$MD" --ep "$EP" \
      --micro-batches $((4 * MS)) --steps "${STEPS:-1000}" --latency-ms 0.02 --bandwidth-gbs 25 \
      --policies static-uniform,static-params,partition-time,diffusion-time "${what[@]}" > "$out"
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    load=$(grep -oP 'busiest expert rank at \K[0-9.]+x' "$out")
    static_ms=$(awk '$1 ~ /^static-/ { if (best == "" || $2 < best) best = $2 } END { print best }' "$out")
    balancer_ms=$(awk '$1 ~ /-time$/ { if (best == "" || $2 < best) best = $2 } END { print best }' "$out")
    [ -z "$base" ] && base=$static_ms
    over() { awk -v a="$base" -v b="$1" 'BEGIN { printf "%.3fx", a / b }'; }
    label=$placement; [ $placement = copies ] && label="balanced + $COPIES copies"
    echo "| $shape | ${run##*/} | $label | $load | $static_ms | $balancer_ms | $(over "$static_ms") | $(over "$balancer_ms") | $secs |"
  done
done
