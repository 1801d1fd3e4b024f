#!/usr/bin/env bash
# The rate of one libFuzzer harness on a fixed corpus: runs each BIN for
# RUNS executions (-seed=1) on its own copy of CORPUS, one after the other,
# with the options scripts/fuzz.sh gives, and prints per binary the
# executions, the wall seconds, executions a second, and the CPU time of
# the fuzzer and every process it started, per execution (getrusage of
# the waited-for descendants, through /usr/bin/time). Give two binaries
# (one built before a change, one after) to compare them back to back on
# a loaded machine; the CPU time per execution is the steadier figure.
#
# Usage: bench/fuzz_rate.sh CORPUS RUNS BIN...
#   e.g. bench/fuzz_rate.sh build/fuzz/corpus/runlog 3000 /tmp/fuzz_runlog.old build/fuzz/fuzz_runlog
# Exit 1 when a binary crashed or ran fewer than RUNS executions.
set -u
cd "$(dirname "$0")/.."
if [ $# -lt 3 ] || [ ! -d "$1" ]; then
  echo "usage: bench/fuzz_rate.sh CORPUS RUNS BIN..." >&2
  exit 2
fi
corpus=$1
runs=$2
shift 2
work=$(mktemp -d /tmp/dynmo-fuzz-rate.XXXXXX)
trap 'rm -rf "$work"' EXIT
printf '%-40s %10s %9s %8s %12s\n' binary executions seconds exec/s cpu-ms/exec
failed=0
for bin in "$@"; do
  rm -rf "$work/corpus"
  cp -r "$corpus" "$work/corpus"
  /usr/bin/time -f '%e %U %S' -o "$work/time" \
    env LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin" -runs="$runs" -seed=1 -print_final_stats=1 -timeout=30 -rss_limit_mb=2048 \
    -artifact_prefix="$work/" "$work/corpus" >"$work/log" 2>&1
  rc=$?
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
  executions=${executions:-0}
  read -r wall user sys < <(tail -n 1 "$work/time")
  awk -v b="$bin" -v n="$executions" -v w="$wall" -v u="$user" -v s="$sys" 'BEGIN {
    printf "%-40s %10d %9.1f %8.1f %12.2f\n", b, n, w, (w > 0 ? n / w : 0), (n > 0 ? 1000 * (u + s) / n : 0) }'
  if [ $rc -ne 0 ] || [ "$executions" -lt "$runs" ]; then
    echo "  $bin: exit $rc, $executions of $runs executions; its log:" >&2
    tail -n 20 "$work/log" >&2
    failed=1
  fi
done
exit $failed
