#!/usr/bin/env bash
# The pipeline schedules side by side (issue 32): dynmo bench on the
# reference model under each of 1f1b, gpipe and zb, on RANKS ranks (default
# "2 4", one stage a rank; 4 ranks share this machine's 2 cores), M
# micro-batches (default 8). Prints per run the median step, the bubble and
# the schedule's bound from the measured stage compute (the predictor), and
# fails when a run's loss does not fall (dynmo bench's own check).
# Usage: bench/schedules.sh [STEPS]   (timed steps, default 10)
# BIND= passes mpiexec -bind-to (e.g. BIND=rr); EXTRA= adds overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
STEPS=${1:-10}
out=${OUT:-runs/bench-schedules}; mkdir -p "$out"
for ranks in ${RANKS:-2 4}; do
  for schedule in ${SCHEDULES:-1f1b gpipe zb}; do
    name=$schedule-$ranks
    mpiexec ${BIND:+-bind-to "$BIND"} -n "$ranks" "$DYNMO" bench --config configs/ref.ini \
      parallel.pp="$ranks" parallel.schedule="$schedule" train.micro_batches="${M:-8}" \
      --steps "$STEPS" ${EXTRA:-} > "$out/$name.out" 2>&1
    median=$(grep -oP 'bench: median \K[0-9.]+' "$out/$name.out")
    bubble=$(grep -oP 'bench: bubble \K[0-9.]+' "$out/$name.out")
    bound=$(grep -oP 'bound from the measured stage compute: \K[0-9.]+' "$out/$name.out" || echo "?")
    printf '%-10s step %8s ms  bubble %5s%%  predicted bound %8s ms\n' "$name" "$median" \
      "$bubble" "$bound"
  done
done
