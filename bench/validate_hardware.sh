#!/usr/bin/env bash
# The hardware model's validation on this machine (docs/simulate.md, "The
# hardware model"; issue 34):
#  1. `dynmo calibrate` twice: with the threads one rank alone uses (for
#     `dynmo bench` on one rank) and with one thread beside a busy peer
#     (for the 2-rank runs on 2 cores, where each rank computes with one
#     while the other computes too);
#  2. three model shapes the calibration never ran (other layers, channels,
#     heads and sequence lengths than any calibrated op), each timed by
#     `dynmo bench` on one rank and predicted by `dynmo simulate --hardware
#     --stages 1`: each error and the median;
#  3. a 2-rank run (2 stages, static uniform) of each scheme of SCHEMES,
#     trained for STEPS steps, and its mean step predicted from the config
#     alone (`dynmo simulate --hardware --config`, no run log): each error
#     and the median;
#  4. where build/bench/hw_ops is built (`make build/bench/hw_ops`), each
#     shape's block op by op, measured beside its price on the calibrated
#     file (OUT/ops-N.txt), to show which op an error comes from.
# The figures are only worth recording on a quiet machine: before each
# measurement it waits (up to WAIT seconds, default 300) for the 1-minute
# load average to fall below LOAD (default 1.5), and it writes the load
# next to each figure in OUT/loads.txt. QUICK=1 is the smoke check: quick
# calibrations, 2 bench steps, 6 training steps, no waiting.
# Needs the corpus of scripts/prepare-corpus.sh (data/kjv) for step 3.
# Usage: bench/validate_hardware.sh [OUT]   (default runs/hwval)
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
out=${1:-runs/hwval}; mkdir -p "$out"
QUICK=${QUICK:-0}
SCHEMES=${SCHEMES:-freeze early_exit prune hash mod moe}
STEPS=${STEPS:-40}
quick=(); bench_steps=(--warmup 2 --steps 8)
if [ "$QUICK" = 1 ]; then
  quick=(--quick); bench_steps=(--warmup 1 --steps 2); STEPS=6
fi
quiet() {
  [ "$QUICK" = 1 ] && return 0
  local waited=0
  while awk -v max="${LOAD:-1.5}" '{ exit !($1 >= max) }' /proc/loadavg && [ $waited -lt "${WAIT:-300}" ]; do
    sleep 5; waited=$((waited + 5))
  done
}
load() { echo "$1: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T)" >> "$out/loads.txt"; }
step_of() { sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# error WHAT MEASURED PREDICTED FILE: one line into FILE
error() {
  awk -v s="$1" -v m="$2" -v p="$3" \
    'BEGIN { printf "%s: measured %.2f ms/step, predicted %.2f, error %.1f%%\n", s, m, p, 100 * (p - m) / m }' \
    | tee -a "$4"
}
# median_error FILE NAME: the median |error| of FILE's lines, appended
median_error() {
  echo "$2: median |error| $(sed -n 's/.*error \(-\{0,1\}[0-9.]*\)%/\1/p' "$1" | tr -d - | median)%" \
    | tee -a "$1"
}

# 1. calibration
quiet; load calibrate
mpiexec -n 2 "$DYNMO" calibrate --out "$out/cpu.ini" "${quick[@]}" > "$out/calibrate.out" 2>&1
quiet; load calibrate-1-thread
mpiexec -n 2 "$DYNMO" calibrate --out "$out/cpu-1thread.ini" --threads 1 --busy-peer "${quick[@]}" \
  > "$out/calibrate-1thread.out" 2>&1

# 2. three shapes the calibration never ran, on one rank
shapes=("model.layers=6 model.channels=96 model.heads=3 train.seq=128 model.max_seq=128 train.batch=8 train.micro_batches=2"
        "model.layers=10 model.channels=160 model.heads=5 train.seq=64 model.max_seq=64 train.batch=16 train.micro_batches=4"
        "model.layers=4 model.channels=320 model.heads=8 train.seq=192 model.max_seq=192 train.batch=4 train.micro_batches=1")
: > "$out/shapes.txt"
for i in "${!shapes[@]}"; do
  read -r -a kv <<<"${shapes[i]}"
  quiet; load "shape $i"
  measured=$("$DYNMO" bench --config configs/ref.ini "${kv[@]}" train.eval_every=0 "${bench_steps[@]}" 2>&1 \
             | sed -n 's/^bench: median \([0-9.]*\) ms\/step.*/\1/p')
  predicted=$("$DYNMO" simulate --hardware "$out/cpu.ini" --config configs/ref.ini "${kv[@]}" \
              train.eval_every=0 --stages 1 --steps 1 --policies static-uniform | step_of)
  error "shape ${shapes[i]}" "$measured" "$predicted" "$out/shapes.txt"
done
median_error "$out/shapes.txt" shapes

# 3. a 2-rank run of each scheme, predicted from its config alone
: > "$out/schemes.txt"
for scheme in $SCHEMES; do
  grid=(parallel.pp=2 parallel.dp=1)
  [ "$scheme" = moe ] && grid=(parallel.pp=2 parallel.dp=1 parallel.ep=1)
  args=(balance.method=none balance.initial=uniform train.steps=$STEPS train.warmup=1
        train.eval_every=0 "${grid[@]}")
  run=$out/$scheme-2
  rm -rf "$run"
  quiet; load "$scheme"
  mpiexec -n 2 "$DYNMO" train --config configs/$scheme.ini "${args[@]}" run.out_dir="$run" \
    > "$run.out" 2>&1
  measured=$("$DYNMO" simulate --from-run "$run" --validate --policies static-uniform 2>/dev/null \
             | sed -n 's/^validation: measured costs, replay .* mean [0-9.]* ms simulated, \([0-9.]*\) measured.*/\1/p')
  predicted=$("$DYNMO" simulate --hardware "$out/cpu-1thread.ini" --config configs/$scheme.ini \
              "${args[@]}" --policies static-uniform | step_of)
  error "$scheme on 2 ranks" "$measured" "$predicted" "$out/schemes.txt"
done
median_error "$out/schemes.txt" schemes

# 4. the shapes' blocks op by op (one micro-batch: B sequences of T tokens)
HW_OPS=${HW_OPS:-build/bench/hw_ops}
if [ -x "$HW_OPS" ]; then
  # B T C NH and the layers of each shape above; the threads `dynmo bench` uses
  ops_shapes=("4 128 96 3 6" "4 64 160 5 10" "4 192 320 8 4")
  for i in "${!ops_shapes[@]}"; do
    read -r B T C NH layers <<<"${ops_shapes[i]}"
    quiet; load "ops $i"
    "$HW_OPS" "$out/cpu.ini" "$B" "$T" "$C" "$NH" "$(nproc)" "$([ "$QUICK" = 1 ] && echo 3 || echo 30)" \
      "$layers" > "$out/ops-$i.txt"
    echo "ops $i: $(grep 'block_forward' "$out/ops-$i.txt")"
  done
fi
