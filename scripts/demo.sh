#!/usr/bin/env bash
# The main job (make demo): prepares the default corpus on first use, then
# trains a 4-stage pipeline (32 blocks of 128 channels) on it with early
# exit (dyn.kind=early_exit) twice: with live balancing (partition-time
# every 10 steps: blocks migrate as tokens exit) and under the static
# uniform layout, and prints the two throughputs (whole run, and the mean
# step time after step SETTLED=40, once the exits have settled), and beside
# them the layout bound of the static run's own costs after SETTLED
# (`dynmo plan --from-run` through bench/bound.py: what a perfect balancer
# could buy over the best static layout, with whole blocks and with
# sublayer units; the static run keeps the halves' costs apart for it,
# balance.units = sublayer on a layout of whole blocks). UNITS=sublayer
# balances the other run by attention and MLP halves instead of whole
# blocks. The losses of the two runs are bit-identical (balancing never
# changes the math); the demo checks that too. Both runs trace two steps (run.trace_from)
# and the demo ends by drawing the runs with `dynmo report`
# (docs/report.md) and printing the path of its index.html. About a minute
# on 2 cores (33 s once the corpus is prepared and the build is done).
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
export DYNMO
RANKS=${RANKS:-4}
STEPS=${STEPS:-100}
# Traced: steps 10 and 11, around the first balancing decision (after step
# 10), which moves blocks: the report's timeline shows the pipeline before
# and after it.
TRACE_FROM=${TRACE_FROM:-10}
scripts/prepare-corpus.sh
run() { local name=$1; shift
  echo "demo: $name run (configs/early_exit.ini, $RANKS ranks, $STEPS steps)"
  mpiexec -n "$RANKS" "$DYNMO" train --config configs/early_exit.ini train.steps="$STEPS" \
    parallel.pp="$RANKS" run.out_dir="runs/demo-$name" run.trace_from="$TRACE_FROM" \
    run.trace_steps=2 "$@" | tee "runs/demo-$name.out" \
    | grep -E '^(step|balance:)' || true
}
mkdir -p runs
UNITS=${UNITS:-block}
run balanced balance.method=partition-time balance.every=10 balance.units="$UNITS" "$@"
run static balance.method=none balance.units=sublayer "$@"
tput() { sed -n 's/.*throughput: \([0-9.]*\) tokens\/s.*/\1/p' "runs/demo-$1.out"; }
b=$(tput balanced); s=$(tput static)
echo
grep -E '^  loss: ' runs/demo-balanced.out | sed 's/^  /demo: /'
echo "demo: throughput with live balancing: $b tokens/s; static uniform layout: $s tokens/s;" \
     "speedup $(awk -v b="$b" -v s="$s" 'BEGIN{ if (s > 0) printf "%.2fx", b/s; else print "n/a" }')"
# The same comparison once the exits have set in (they are allowed from step
# 20; by step 40 the share of skipped token-blocks is steady).
SETTLED=${SETTLED:-40}
if [ "$STEPS" -gt "$SETTLED" ] && /usr/bin/python3 -c 'import h5py' 2>/dev/null; then
  /usr/bin/python3 - "$SETTLED" runs/demo-balanced/runlog.h5 runs/demo-static/runlog.h5 <<'PY'
import sys, h5py
first = int(sys.argv[1])
def mean_ms(path):
    return h5py.File(path, "r")["/steps/step_ms"][first:].mean()
bms, sms = mean_ms(sys.argv[2]), mean_ms(sys.argv[3])
print(f"demo: after step {first} (exits settled): live balancing {bms:.1f} ms/step, "
      f"static {sms:.1f} ms/step; speedup {sms / bms:.2f}x")
PY
fi
# What any balancer could buy here: the static run's costs after SETTLED,
# laid out by the optimal partition (whole blocks, then sublayer units).
if [ "$STEPS" -gt "$SETTLED" ]; then
  m=$(sed -n 's/^micro_batches = //p' configs/early_exit.ini)
  /usr/bin/python3 bench/bound.py runs/demo-static/runlog.h5 "$SETTLED" "$STEPS" "$RANKS" "$m" \
      "$DYNMO" > runs/demo-bound.out 2>&1 &&
    echo "demo: the layout bound after step $SETTLED (the static run's costs, optimally laid" \
         "out): whole blocks $(sed -n 's/^bound static-uniform: .* = //p' runs/demo-bound.out)," \
         "sublayer units $(sed -n 's/^bound sublayer: .* = //p' runs/demo-bound.out)" ||
    echo "demo: no layout bound: $(tail -n 1 runs/demo-bound.out)"
fi
if command -v h5dump >/dev/null; then
  h5dump -b LE -d /steps/loss -o runs/demo-balanced.loss runs/demo-balanced/runlog.h5 >/dev/null
  h5dump -b LE -d /steps/loss -o runs/demo-static.loss runs/demo-static/runlog.h5 >/dev/null
  cmp -s runs/demo-balanced.loss runs/demo-static.loss \
    && echo "demo: the two runs' losses are bit-identical" \
    || { echo "demo: ERROR: the balanced run's losses differ from the static run's"; exit 1; }
fi
echo "demo: run logs in runs/demo-balanced/ and runs/demo-static/ (build/dynmo inspect ...)"
"$DYNMO" report runs/demo-balanced/runlog.h5 runs/demo-static/runlog.h5 --out runs/demo-report
echo "demo: the report of the two runs: $PWD/runs/demo-report/index.html"
