#!/usr/bin/env bash
# Runs every test: each C test binary under $BUILD/tests and each shell test
# tests/t_*.sh; with a PATTERN (an extended regular expression), only the
# tests whose names match it (`tests/run.sh 'moe|mod'`, or `make check
# TESTS='moe|mod'`). Prints PASS/FAIL per test and ends with "N passed, N
# failed".
# A shell test that exits 77 is counted as skipped (it says why). Each test
# runs under `timeout` (TEST_LIMIT seconds, default 900, then SIGKILL 10 s
# later): a test that hangs fails, saying so, and the run goes on.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export DYNMO="$PWD/$BUILD/dynmo"
export BUILD
if [ -n "${SANITIZE:-}" ]; then
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
fi
limit=${TEST_LIMIT:-900}
pattern=${1:-}
chosen() { [ -z "$pattern" ] || [[ $1 =~ $pattern ]]; }
logdir=$(mktemp -d /tmp/dynmo-tests.XXXXXX)
passed=0; failed=0; skipped=0; failed_names=()
run_one() {
  local name=$1; shift
  local start=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$logdir/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "run.sh: $name did not finish within $limit s" >> "$logdir/$name.log"
  local secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  if [ $rc -eq 0 ]; then
    passed=$((passed+1)); echo "PASS $name (${secs}s)"
  elif [ $rc -eq 77 ]; then
    skipped=$((skipped+1)); echo "SKIP $name: $(tail -n 1 "$logdir/$name.log")"
  else
    failed=$((failed+1)); failed_names+=("$name"); echo "FAIL $name (exit $rc, ${secs}s)"
    sed 's/^/    /' "$logdir/$name.log" | tail -n 30
  fi
}
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  chosen "$(basename "$t")" || continue
  run_one "$(basename "$t")" "$t"
done
for t in tests/t_*.sh; do
  [ -f "$t" ] || continue
  chosen "$(basename "$t" .sh)" || continue
  run_one "$(basename "$t" .sh)" bash "$t"
done
echo "logs: $logdir"
[ $failed -gt 0 ] && echo "failed: ${failed_names[*]}"
if [ $skipped -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ $failed -eq 0 ]
