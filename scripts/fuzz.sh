#!/usr/bin/env bash
# `make fuzz`: runs each libFuzzer harness (fuzz/fuzz_<target>.c, built by
# make in $FUZZ_BUILD with AddressSanitizer and UBSan) for FUZZ_RUNS
# executions, one target after the other, seeded from real files:
#   config  configs/*.ini
#   tokens  train.bin and val.bin of `dynmo prepare` on
#           /usr/share/common-licenses/GPL-3, and the llm.c shards of
#           tests/data/tokens
#   costs   tests/data/*.csv
#   ckpt    tests/data/ckpt/*.h5 and a checkpoint of sublayer units (its
#           /units group) trained here on 3 stages
#   runlog  tests/data/sim/*/runlog.h5 (recorded runs, compressed) and the
#           run logs of two tiny runs trained here: 2 stages with traced
#           steps and a re-balance, and mixture of experts
# Each target's corpus grows in $FUZZ_BUILD/corpus/<target> and is kept
# between runs; a crashing input is written to $FUZZ_BUILD/crashes/<target>/
# and libFuzzer's log to $FUZZ_BUILD/logs/<target>.log. Leaks inside HDF5
# itself are suppressed by fuzz/lsan.supp (each one named there). Prints, per target,
# the executions, the time and what was found, then the same table to
# $FUZZ_BUILD/summary.txt. Exit 1 when a target crashed, reported a
# sanitizer error or ran fewer than FUZZ_RUNS executions.
#
# Usage: scripts/fuzz.sh [TARGET...]   (after `make fuzz-build`; BUILD
# names the normal build, which provides build/dynmo for the token seeds)
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
FUZZ_BUILD=${FUZZ_BUILD:-build/fuzz}
RUNS=${FUZZ_RUNS:-1000000}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config tokens costs ckpt runlog)

seeds=$FUZZ_BUILD/seeds
rm -rf "$seeds"
mkdir -p "$seeds"/{config,tokens,costs,ckpt,runlog} "$FUZZ_BUILD/logs"
cp configs/*.ini "$seeds/config/"
cp tests/data/*.csv "$seeds/costs/"
cp tests/data/ckpt/*.h5 "$seeds/ckpt/"
tokens_dir=$(mktemp -d /tmp/dynmo-fuzz-seed.XXXXXX)
trap 'rm -rf "$tokens_dir"' EXIT
"$BUILD/dynmo" prepare --out "$tokens_dir" /usr/share/common-licenses/GPL-3 >/dev/null ||
  { echo "fuzz: dynmo prepare failed (build $BUILD/dynmo first)" >&2; exit 1; }
cp "$tokens_dir"/train.bin "$tokens_dir"/val.bin tests/data/tokens/*_llmc.bin "$seeds/tokens/"
printf '[model]\nlayers = 6\nchannels = 32\nheads = 2\nmax_seq = 32\n[train]\nbatch = 8\nseq = 32\nmicro_batches = 4\nsteps = 6\nlr = 3e-3\nwarmup = 1\n[data]\ntrain = %s\nval = %s\n' \
  "$tokens_dir/train.bin" "$tokens_dir/val.bin" >"$tokens_dir/tiny.ini"
if [[ " ${targets[*]} " == *" ckpt "* ]]; then
# a checkpoint of sublayer units (its /units group), 3 stages split inside blocks
timeout -k 10 120 mpiexec -n 3 "$BUILD/dynmo" train --config "$tokens_dir/tiny.ini" parallel.pp=3 \
  balance.units=sublayer balance.initial=explicit:3,4,5 train.steps=2 ckpt.every=2 \
  ckpt.dir="$tokens_dir/units-ck" run.out_dir="$tokens_dir/units" >/dev/null ||
  { echo "fuzz: the sublayer seed run failed (build $BUILD/dynmo first)" >&2; exit 1; }
cp "$tokens_dir/units-ck/ckpt-2.h5" "$seeds/ckpt/units.h5"
fi
if [[ " ${targets[*]} " == *" runlog "* ]]; then
for run in tests/data/sim/*/; do cp "$run/runlog.h5" "$seeds/runlog/$(basename "$run").h5"; done
timeout -k 10 120 mpiexec -n 2 "$BUILD/dynmo" train --config "$tokens_dir/tiny.ini" parallel.pp=2 \
  run.trace_from=2 run.trace_steps=2 balance.method=random balance.every=2 \
  run.out_dir="$tokens_dir/traced" >/dev/null &&
  timeout -k 10 120 "$BUILD/dynmo" train --config "$tokens_dir/tiny.ini" model.moe_every=2 \
  model.expert_hidden=32 run.out_dir="$tokens_dir/moe" >/dev/null ||
  { echo "fuzz: the seed runs failed (build $BUILD/dynmo first)" >&2; exit 1; }
cp "$tokens_dir/traced/runlog.h5" "$seeds/runlog/traced.h5"
cp "$tokens_dir/moe/runlog.h5" "$seeds/runlog/moe.h5"
fi

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
summary=$FUZZ_BUILD/summary.txt
{
  echo "make fuzz, $(date -u +%Y-%m-%d), FUZZ_RUNS=$RUNS, $(clang --version | head -n 1), CPU: $cpu"
  printf '%-8s %12s %9s %10s  %s\n' target executions seconds exec/s result
} | tee "$summary"
failed=0
for t in "${targets[@]}"; do
  bin=$FUZZ_BUILD/fuzz_$t
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is missing (make fuzz-build)" >&2
    failed=1
    continue
  fi
  corpus=$FUZZ_BUILD/corpus/$t
  crashes=$FUZZ_BUILD/crashes/$t
  log=$FUZZ_BUILD/logs/$t.log
  mkdir -p "$corpus" "$crashes"
  start=$(date +%s.%N)
  LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 "$bin" -runs="$RUNS" -print_final_stats=1 \
    -timeout=30 -rss_limit_mb=2048 -artifact_prefix="$crashes/" \
    "$corpus" "$seeds/$t" >"$log" 2>&1
  rc=$?
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  executions=${executions:-0}
  rate=$(awk -v n="$executions" -v s="$seconds" 'BEGIN{printf "%.0f", (s > 0 ? n / s : 0)}')
  if [ $rc -ne 0 ]; then
    what=$(grep -m 1 -E '^SUMMARY: |ERROR: libFuzzer|ERROR: AddressSanitizer|runtime error|fuzz_[a-z]+: ' "$log")
    artifact=$(sed -n 's/.*Test unit written to //p' "$log" | tail -n 1)
    result="CRASH (exit $rc): ${what:-see $log}; input ${artifact:-none written}"
    failed=1
  elif [ "$executions" -lt "$RUNS" ]; then
    result="only $executions of $RUNS executions (see $log)"
    failed=1
  else
    result="no crash, no sanitizer report"
  fi
  printf '%-8s %12s %9s %10s  %s\n' "$t" "$executions" "$seconds" "$rate" "$result" | tee -a "$summary"
done
echo "summary: $summary; logs: $FUZZ_BUILD/logs"
exit $failed
