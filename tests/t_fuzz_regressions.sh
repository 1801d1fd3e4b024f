#!/usr/bin/env bash
# The inputs `make fuzz` found, and one found reading the code it ran
# (tests/fuzz-regressions/<target>/, each described in
# tests/fuzz-regressions/README.md), replayed through the same
# code path as the fuzzer's: $BUILD/fuzz-replay/<target>, the harness
# fuzz/fuzz_<target>.c built by gcc with AddressSanitizer and UBSan on the
# code it exercises. Every input must run to its end within 60 s: a crash,
# a sanitizer report, a failed harness check or a hang fails the test.
# The damaged checkpoints must also be refused by `dynmo check-ckpt`
# (exit 2) with the message that names the damage, the damaged run logs by
# `dynmo inspect` (or `dynmo trace`, for the trace's values).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DYNMO=${DYNMO:-$BUILD/dynmo}
. tests/lib.sh
export ASAN_OPTIONS=abort_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

replayed=0
for dir in tests/fuzz-regressions/*/; do
  target=$(basename "$dir")
  bin=$BUILD/fuzz-replay/$target
  if [ ! -x "$bin" ]; then
    fail "$bin is missing (make all builds it)"
    continue
  fi
  for input in "$dir"*; do
    [ -f "$input" ] || continue
    out=$(timeout -k 10 60 "$bin" "$input" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
      echo "ok: $target $(basename "$input")"
    elif [ $rc -eq 124 ]; then
      fail "$target $(basename "$input"): still running after 60 s (a hang)"
    else
      fail "$target $(basename "$input"): exit $rc: $(tail -n 20 <<<"$out")"
    fi
    replayed=$((replayed + 1))
  done
done
[ $replayed -gt 0 ] || fail "no input under tests/fuzz-regressions/"

# What a user sees for them: one line, exit 2, naming the damage.
for input in tests/fuzz-regressions/ckpt/gheap-object-past-collection-*; do
  expect_error "check-ckpt $(basename "$input")" \
    "damaged: the global heap collection at byte 2048 .* holds object [0-9]+ of [0-9]+ bytes with [0-9]+ bytes left in it" \
    timeout -k 10 60 "$DYNMO" check-ckpt "$input"
done
for input in tests/fuzz-regressions/ckpt/gheap-free-space-size-*; do
  expect_error "check-ckpt $(basename "$input")" \
    "damaged: the global heap collection at byte 2048 .* gives its free space 0 bytes where [0-9]+ remain" \
    timeout -k 10 60 "$DYNMO" check-ckpt "$input"
done
# The damaged run logs: every reader refuses them, naming the damage.
for input in tests/fuzz-regressions/runlog/*.h5; do
  case $(basename "$input") in
    trace-*) expect_error "trace $(basename "$input")" \
               "trace: $input: row [0-9]+ of /trace/events .* has a step that is not one of the log's" \
               timeout -k 10 60 "$DYNMO" trace "$input" --out "${TMPDIR:-/tmp}/dynmo-fuzz-regression.json" ;;
    moe-*) expect_error "inspect $(basename "$input")" \
             "inspect: $input: row [0-9]+ column [0-9]+ of /moe/tokens and /moe/dropped: -?[0-9]+ routed, -?[0-9]+ dropped" \
             timeout -k 10 60 "$DYNMO" inspect "$input" ;;
    *) expect_error "inspect $(basename "$input")" "inspect: $input: damaged: the root group /: " \
         timeout -k 10 60 "$DYNMO" inspect "$input" ;;
  esac
done
expect_error "check-ckpt history-sum-overflow.h5" \
  "history-sum-overflow.h5: /layout: layout history entry 0 \(2 stages\) is not a layout of 2 blocks" \
  "$DYNMO" check-ckpt tests/fuzz-regressions/ckpt/history-sum-overflow.h5
finish
