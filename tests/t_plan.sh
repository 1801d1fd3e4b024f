#!/usr/bin/env bash
# `dynmo plan` on the committed cost fixtures: the exact partition prints the
# layout worked out by hand in the comments below, an optimal --current is
# kept, the memory cap is honoured, every method prints its block; bad CSV
# exits 2 naming the file and line, bad arguments exit 2 naming the
# argument. Run from the repository root with $DYNMO set (tests/run.sh).
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
if [ ! -x "$DYNMO" ]; then
  echo "skip: no dynmo binary at $DYNMO"
  exit 77
fi
work=$(mktemp -d /tmp/dynmo-t-plan.XXXXXX)
trap 'rm -rf "$work"' EXIT
costs=tests/data/costs_pruned.csv

# expect_lines NAME PATTERN... : the last plan output contains each line.
expect_lines() {
  local name=$1; shift
  for line in "$@"; do
    grep -qxF -- "$line" "$work/out" || { fail "$name: no line '$line' in: $(cat "$work/out")"; return; }
  done
  echo "ok: $name"
}

# Block costs (fwd + bwd) are 12,12,12,9,9,6,6,3,3,3,3,3, embed 1, head 6:
# 88 in all. No layout on 4 stages stays within 24 (greedy: [0] 13, [1,2] 24,
# [3,4,5] 24, leaving 21 + 6 = 27), and 2,2,4,4 reaches 25, 21, 24, 18.
"$DYNMO" plan --costs $costs --stages 4 --method partition-time >"$work/out" 2>&1 ||
  fail "partition-time: exit $?"
expect_lines "partition-time" "method: partition-time" "layout: 2,2,4,4" \
  "max_stage_ms: 25.000" "bytes_moved: 256000"

# Megatron's static layout: 3 blocks per stage; stage 0 = 1 + 36.
"$DYNMO" plan --costs $costs --stages 4 --method static-uniform >"$work/out" 2>&1 ||
  fail "static-uniform: exit $?"
expect_lines "static-uniform" "layout: 3,3,3,3" "max_stage_ms: 37.000" "bytes_moved: 0"

# An optimal current layout is kept: it is the only layout that moves nothing.
"$DYNMO" plan --costs $costs --stages 4 --method partition-time --current 2,2,4,4 \
  >"$work/out" 2>&1 || fail "current: exit $?"
expect_lines "optimal current is kept" "layout: 2,2,4,4" "bytes_moved: 0" "reference: 2,2,4,4"

# Under 230000 bytes stage 0 cannot hold blocks 0 and 1 (16000 + 224000), and
# blocks 3-6 (256000) cannot share a stage: 1,2,3,6 is optimal at 27.
"$DYNMO" plan --costs $costs --stages 4 --method partition-time --mem-cap 230000 \
  >"$work/out" 2>&1 || fail "mem-cap: exit $?"
expect_lines "mem-cap" "layout: 1,2,3,6" "max_stage_ms: 27.000" "max_stage_mem_bytes: 224000"

# Every method, both schedules; equal stages give (m + S - 1)(f + b).
"$DYNMO" plan --costs $costs --stages 4 --schedule gpipe --micro-batches 8 >"$work/out" 2>&1 ||
  fail "all methods: exit $?"
methods=$(grep -c '^method: ' "$work/out")
[ "$methods" -eq 8 ] && echo "ok: all 8 methods printed" || fail "all methods: $methods method blocks"
for key in layout max_stage_ms step_ms bubble_ratio; do
  n=$(grep -c "^$key: " "$work/out")
  [ "$n" -eq 8 ] || fail "all methods: $n '$key' lines, want 8"
done
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes\n0,1,2,1,1\n1,1,2,1,1\n2,1,2,1,1\n3,1,2,1,1\n' >"$work/equal.csv"
"$DYNMO" plan --costs "$work/equal.csv" --stages 4 --method static-uniform --micro-batches 8 \
  >"$work/out" 2>&1 || fail "equal: exit $?"
expect_lines "predictor on equal stages" "step_ms: 33.000" "bubble_ratio: 0.2727"
"$DYNMO" plan --costs "$work/equal.csv" --stages 2 --method repack --epsilon 0.5 \
  --micro-batches 4 >"$work/out" 2>&1 || fail "repack: exit $?"
# 2 stages: (4+1) x 6 = 30 ms; 1 stage: 4 x 12 = 48 > 30 x 1.5: no re-pack,
expect_lines "repack keeps 2 stages at epsilon 0.5" "layout: 2,2" "step_ms: 30.000"
"$DYNMO" plan --costs "$work/equal.csv" --stages 2 --method repack --epsilon 0.7 \
  --micro-batches 4 >"$work/out" 2>&1 || fail "repack: exit $?"
# ... but 48 <= 30 x 1.7.
expect_lines "repack onto 1 stage at epsilon 0.7" "stages: 1" "layout: 4" "step_ms: 48.000"

# Bad CSV: exit 2, file and line named.
expect_error "missing column" "costs_bad_column.csv:1: missing column 'bwd_ms'" \
  "$DYNMO" plan --costs tests/data/costs_bad_column.csv --stages 2
expect_error "not a number" "costs_bad_number.csv:4: column bwd_ms: 'two' is not a number" \
  "$DYNMO" plan --costs tests/data/costs_bad_number.csv --stages 2
expect_error "negative" "costs_bad_negative.csv:4: column fwd_ms: -1 is negative" \
  "$DYNMO" plan --costs tests/data/costs_bad_negative.csv --stages 2
expect_error "field count" "costs_bad_fields.csv:3: 4 fields, but the header has 5" \
  "$DYNMO" plan --costs tests/data/costs_bad_fields.csv --stages 2
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes\n0,1,2,1,1\nembed,1,1,1,1\n' >"$work/embed.csv"
expect_error "embed not first" "embed.csv:3: 'embed' must be the first row" \
  "$DYNMO" plan --costs "$work/embed.csv" --stages 1
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes\n0,1,2,1,1\nhead,1,1,1,1\n1,1,2,1,1\n' >"$work/head.csv"
expect_error "head not last" "head.csv:4: a row after 'head'" \
  "$DYNMO" plan --costs "$work/head.csv" --stages 1
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes\n0,1,2,1,1.5\n' >"$work/bytes.csv"
expect_error "fractional bytes" "bytes.csv:2: column mem_bytes: '1.5' is not a whole number" \
  "$DYNMO" plan --costs "$work/bytes.csv" --stages 1
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes\n0,nan,2,1,1\n' >"$work/nan.csv"
expect_error "nan" "nan.csv:2: column fwd_ms: 'nan' is not a finite number" \
  "$DYNMO" plan --costs "$work/nan.csv" --stages 1
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes\nembed,1,1,1,1\n' >"$work/noblocks.csv"
expect_error "no blocks" "noblocks.csv: no block rows" \
  "$DYNMO" plan --costs "$work/noblocks.csv" --stages 1
: >"$work/empty.csv"
expect_error "empty file" "empty.csv: empty" "$DYNMO" plan --costs "$work/empty.csv" --stages 1
expect_error "missing file" "cannot open '$work/missing.csv'" \
  "$DYNMO" plan --costs "$work/missing.csv" --stages 1

# Bad arguments: exit 2, the argument named.
expect_error "no --costs" "--costs FILE.csv (.or --from-run DIR --step N.) is required" "$DYNMO" plan --stages 2
expect_error "no --stages" "--stages S is required" "$DYNMO" plan --costs $costs
expect_error "stages 0" "^dynmo: error: --stages: '0'" "$DYNMO" plan --costs $costs --stages 0
expect_error "stages text" "^dynmo: error: --stages: 'four'" "$DYNMO" plan --costs $costs --stages four
expect_error "too many stages" "--stages: 13 stages but .* has only 12 blocks" \
  "$DYNMO" plan --costs $costs --stages 13
expect_error "unknown method" "--method: unknown method 'fastest'" \
  "$DYNMO" plan --costs $costs --stages 2 --method fastest
expect_error "bad mem-cap" "--mem-cap: '-5'" "$DYNMO" plan --costs $costs --stages 2 --mem-cap -5
expect_error "mem-cap unit" "--mem-cap: '3MB'" "$DYNMO" plan --costs $costs --stages 2 --mem-cap 3MB
expect_error "block over cap" "block 0 needs 112000 bytes, more than the stage capacity of 100000" \
  "$DYNMO" plan --costs $costs --stages 4 --mem-cap 100000
expect_error "cap too small" "need at least 5 stages of 200000 bytes" \
  "$DYNMO" plan --costs $costs --stages 4 --mem-cap 200000
expect_error "current count" "--current: 2 stages, but --stages is 4" \
  "$DYNMO" plan --costs $costs --stages 4 --current 6,6
expect_error "current sum" "--current: the layout covers 11 blocks" \
  "$DYNMO" plan --costs $costs --stages 2 --current 5,6
expect_error "current zero" "--current: '6,0,6'" "$DYNMO" plan --costs $costs --stages 3 --current 6,0,6
expect_error "schedule" "--schedule: 'zb'" "$DYNMO" plan --costs $costs --stages 2 --schedule zb
expect_error "micro-batches" "--micro-batches: '0'" "$DYNMO" plan --costs $costs --stages 2 --micro-batches 0
expect_error "unknown option" "unknown option '--fast'" "$DYNMO" plan --costs $costs --stages 2 --fast 1
expect_error "missing value" "--stages: needs a value" "$DYNMO" plan --costs $costs --stages
expect_error "diffusion over cap" "method diffusion-time failed" \
  "$DYNMO" plan --costs $costs --stages 4 --method diffusion-time --mem-cap 240000
"$DYNMO" plan --help >"$work/out" 2>&1 && grep -q "usage: dynmo plan" "$work/out" &&
  echo "ok: --help" || fail "--help"
finish
