#!/usr/bin/env bash
# The fixed cost of one expert all-to-all round between ranks that take
# turns on shared CPUs (`dynmo simulate --exchange-ms`, its default for a
# run's own shape; docs/simulate.md): records configs/moe.ini (2 stages x
# 2 replicas, experts over 2 ranks) with a seed the validation runs do not
# use (train.seed=SEED, default 7) for STEPS steps (default 60), then
# simulates that run with X = 0, 0.02, ..., 1 ms and prints the X whose
# simulated step times have the least median error against the measured
# ones (fitted costs, the run's layouts). The validated runs of
# bench/sim_record.sh are not used. NICE (e.g. -20, as root) runs the
# training at that niceness when other jobs share the machine.
# Usage: bench/sim_exchange.sh [OUT]   (default runs/simcal)
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
out=${1:-runs/simcal}; mkdir -p "$out"
run="$out/moe-4-seed${SEED:-7}"
if ! grep -q "^  run log: " "$run.out" 2>/dev/null; then
  rm -rf "$run"
  ${NICE:+nice -n "$NICE"} mpiexec -n 4 "$DYNMO" train --config configs/moe.ini \
    train.seed="${SEED:-7}" train.steps="${STEPS:-60}" balance.method=none \
    run.out_dir="$run" run.log_every=1 > "$run.out" 2>&1
fi
grep throughput "$run.out"
best="" best_err=""
for i in $(seq 0 50); do
  x=$(awk -v i="$i" 'BEGIN { printf "%.2f", i * 0.02 }')
  err=$("$DYNMO" simulate --from-run "$run" --validate --policies static-uniform --exchange-ms "$x" |
        grep 'validation: fitted costs, replay' | grep -oP 'median error \K[0-9.]+')
  if [ -z "$best" ] || awk -v a="$err" -v b="$best_err" 'BEGIN { exit !(a < b) }'; then
    best=$x; best_err=$err
  fi
done
echo "exchange round: $best ms (median error $best_err% on $run, fitted costs, its layouts)"
