#!/usr/bin/env bash
# `dynmo plan` on the committed cost fixtures: the exact partition prints the
# layout worked out by hand in the comments below, an optimal --current is
# kept, the memory cap is honoured (diffusion and repack-first-fit refuse a
# start over it, exit 2 naming the stage), every method prints its block; stages
# sharing processors (--cores, --stage-groups/--group-cores, a run log's
# stage_groups/group_cores) change the processors line and the predicted
# steps; bad CSV exits 2 naming the file and line, bad arguments exit 2
# naming the argument. Run from the repository root with $DYNMO set
# (tests/run.sh).
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
need_dynmo
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
# An update (once a step) on block 0 starts stage 0, and so every stage, 5 ms
# later; on the last block it hides behind the fill but for 5 - 3 ms.
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes,update_ms\n0,1,2,1,1,5\n1,1,2,1,1,0\n2,1,2,1,1,0\n3,1,2,1,1,0\n' \
  >"$work/update.csv"
"$DYNMO" plan --costs "$work/update.csv" --stages 4 --method static-uniform --micro-batches 8 \
  >"$work/out" 2>&1 || fail "update: exit $?"
expect_lines "an update on the first stage" "step_ms: 38.000" \
  "update_ms: blocks 5.000  embed 0.000  head 0.000 (once a step)"
sed 's/,5$/,0/; s/^3,1,2,1,1,0$/3,1,2,1,1,5/' "$work/update.csv" >"$work/update_last.csv"
"$DYNMO" plan --costs "$work/update_last.csv" --stages 4 --method static-uniform \
  --micro-batches 8 >"$work/out" 2>&1 || fail "update last: exit $?"
expect_lines "an update on the last stage" "step_ms: 35.000"
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
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes,update_ms\n0,1,2,1,1,-1\n' >"$work/negupdate.csv"
expect_error "negative update" "negupdate.csv:2: column update_ms: -1 is negative" \
  "$DYNMO" plan --costs "$work/negupdate.csv" --stages 1
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
# The zero-bubble and interleaved schedules: 16 equal blocks (1 ms forward,
# 2 ms backward) on 4 stages, 8 micro-batches. 1F1B: (8 + 3) x 12 = 132 ms.
# ZB-H1 with F = B = W = 4 ms: (3 x 8 + 3) x 4 = 108 ms. Interleaved with
# 2 chunks of 2 blocks per stage: 8 x 12 + 3 x 12 / 2 = 114 ms.
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes\n' >"$work/sixteen.csv"
for i in $(seq 0 15); do echo "$i,1,2,1,1" >>"$work/sixteen.csv"; done
step_of() {  # SCHEDULE [options]: the static-uniform layout's step_ms
  local schedule=$1; shift
  "$DYNMO" plan --costs "$work/sixteen.csv" --stages 4 --micro-batches 8 --method static-uniform \
    --schedule "$schedule" "$@" >"$work/out" 2>&1 || { fail "$schedule: exit $?"; return; }
  sed -n 's/^step_ms: //p' "$work/out"
}
one=$(step_of 1f1b); zb=$(step_of zb); inter=$(step_of interleaved --virtual 2)
expect_lines "interleaved prints its chunks" "layout: 2,2,2,2,2,2,2,2" \
  "stages: 4 x 2 chunks  micro_batches: 8  schedule: interleaved  mem_cap: none"
echo "step_ms: 1f1b $one, zb $zb, interleaved $inter"
[ "$one" = "132.000" ] || fail "1f1b on 16 equal blocks: $one ms, want 132"
awk -v a="$zb" -v b="$inter" -v c="$one" 'BEGIN { exit !(a + 0 < c + 0 && b + 0 < c + 0) }' &&
  echo "ok: zb and interleaved predicted faster than 1f1b" ||
  fail "zb ($zb) and interleaved ($inter) must be faster than 1f1b ($one)"
[ "$zb" = "108.000" ] && [ "$inter" = "114.000" ] || fail "zb $zb (want 108), interleaved $inter (want 114)"
# Every method runs on the chunks; the re-packers say they cannot.
"$DYNMO" plan --costs $costs --stages 2 --micro-batches 4 --schedule interleaved >"$work/out" 2>&1 ||
  fail "interleaved, all methods: exit $?"
n=$(grep -c '^step_ms: ' "$work/out")
[ "$n" -eq 6 ] && grep -q "^error: repack re-packs whole stages" "$work/out" &&
  echo "ok: interleaved: 6 methods, repack refused" || fail "interleaved, all methods: $(cat "$work/out")"
expect_error "virtual without interleaved" "--virtual: only --schedule interleaved" \
  "$DYNMO" plan --costs "$work/sixteen.csv" --stages 4 --schedule zb --virtual 2
expect_error "interleaved micro-batches" "--micro-batches: interleaved needs a multiple of the 4 stages \(got 6\)" \
  "$DYNMO" plan --costs "$work/sixteen.csv" --stages 4 --schedule interleaved --micro-batches 6
expect_error "too many chunks" "--virtual: 4 stages x 5 chunks but .* has only 16 blocks" \
  "$DYNMO" plan --costs "$work/sixteen.csv" --stages 4 --schedule interleaved --virtual 5 --micro-batches 8
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
# Sublayer units (--units sublayer): 3,6,3,6,3,6,3,6 ms on 3 stages. Whole
# blocks (9 ms each) cannot do better than 18; units reach 15 with
# [3,6,3] [6,3,6] [3,6], a boundary inside block 1 (after 3 units).
"$DYNMO" plan --costs tests/data/costs_sublayer.csv --units sublayer --stages 3 \
  --method partition-time >"$work/out" 2>&1 || fail "units sublayer: exit $?"
expect_lines "units sublayer" "costs: tests/data/costs_sublayer.csv (8 sublayer units of 4 blocks)" \
  "layout: 3,3,2" "max_stage_ms: 15.000" "split_blocks: 1" "units_moved: 0"
# Under zb a unit has its weight part as a block does (half of each
# backward without a wgrad_ms column): zb predicts faster than 1f1b on
# units as on the same rows read as blocks.
sub_step() {
  "$DYNMO" plan --costs tests/data/costs_sublayer.csv --stages 3 --method partition-time "$@" \
    >"$work/out" 2>&1 || fail "$*: exit $?"
  sed -n 's/^step_ms: //p' "$work/out"
}
s1=$(sub_step --units sublayer --schedule 1f1b); sz=$(sub_step --units sublayer --schedule zb)
b1=$(sub_step --schedule 1f1b); bz=$(sub_step --schedule zb)
[ -n "$s1" ] && awk -v a="$sz" -v b="$s1" 'BEGIN { exit !(a + 0 < b + 0) }' &&
  awk -v a="$bz" -v b="$b1" 'BEGIN { exit !(a + 0 < b + 0) }' &&
  echo "ok: units sublayer under zb: $sz ms < 1f1b's $s1 (rows as blocks: zb $bz < 1f1b $b1)" ||
  fail "units sublayer under zb: $sz ms, want less than 1f1b's $s1; rows as blocks zb $bz, 1f1b $b1"
grep -v '^3\.' tests/data/costs_sublayer.csv >"$work/odd.csv"
printf '3.attention,1,2,4000,64000\n' >>"$work/odd.csv"
expect_error "units odd" "--units sublayer: .*odd.csv has 7 unit rows" \
  "$DYNMO" plan --costs "$work/odd.csv" --units sublayer --stages 2
expect_error "units name" "--units: 'layer' is not block or sublayer" \
  "$DYNMO" plan --costs $costs --units layer --stages 2
expect_error "current sum" "--current: the layout covers 11 blocks" \
  "$DYNMO" plan --costs $costs --stages 2 --current 5,6
expect_error "current zero" "--current: '6,0,6'" "$DYNMO" plan --costs $costs --stages 3 --current 6,0,6
expect_error "schedule" "--schedule: 'zero-bubble'" \
  "$DYNMO" plan --costs $costs --stages 2 --schedule zero-bubble
expect_error "micro-batches" "--micro-batches: '0'" "$DYNMO" plan --costs $costs --stages 2 --micro-batches 0
expect_error "unknown option" "unknown option '--fast'" "$DYNMO" plan --costs $costs --stages 2 --fast 1
expect_error "missing value" "--stages: needs a value" "$DYNMO" plan --costs $costs --stages
expect_error "diffusion over cap" "method diffusion-time failed" \
  "$DYNMO" plan --costs $costs --stages 4 --method diffusion-time --mem-cap 240000
# The reference 3,3,3,3 puts 16000 + 3 x 112000 bytes on stage 0, over the
# cap; merging never splits a stage, so Algorithm 2 refuses (it used to
# merge stages 2 and 3 and print 3,3,6 with stage 0 still over the cap).
expect_error "first-fit over cap" \
  "method repack-first-fit failed: stage 0 of the starting layout holds 352000 bytes, more than the capacity of 240000 bytes" \
  "$DYNMO" plan --costs $costs --stages 4 --method repack-first-fit --mem-cap 240000
"$DYNMO" plan --help >"$work/out" 2>&1 && grep -q "usage: dynmo plan" "$work/out" &&
  grep -q -- "--stage-groups" "$work/out" && echo "ok: --help" || fail "--help"

# ---- stages sharing processors ----------------------------------------------
# equal.csv on 4 stages, m = 8: 4 x 8 x 3 = 96 ms of work. Dedicated: 33.
"$DYNMO" plan --costs "$work/equal.csv" --stages 4 --method static-uniform --micro-batches 8 \
  >"$work/out" 2>&1 || fail "dedicated: exit $?"
expect_lines "dedicated processors line" "processors: one per stage" "step_ms: 33.000"
# One core: it never idles while work is left, so the step is all the work.
"$DYNMO" plan --costs "$work/equal.csv" --stages 4 --method static-uniform --micro-batches 8 \
  --cores 1 >"$work/out" 2>&1 || fail "--cores 1: exit $?"
expect_lines "--cores 1" "processors: stages share them: groups 0,0,0,0 with 1 cores" \
  "step_ms: 96.000" "bubble_ratio: 0.7500"
# step_ms_between NAME LOW HIGH: every step_ms line of the last output lies
# in (LOW, HIGH].
step_ms_between() {
  awk -v lo="$2" -v hi="$3" '/^step_ms: /{n++; if (!($2 > lo && $2 <= hi)) bad++}
    END{exit !(n > 0 && !bad)}' "$work/out" && echo "ok: $1" ||
    fail "$1: step_ms not in ($2, $3]: $(grep '^step_ms' "$work/out" | tr '\n' ' ')"
}
# Two cores: at least half the work (48) and slower than dedicated (33).
"$DYNMO" plan --costs "$work/equal.csv" --stages 4 --method static-uniform --micro-batches 8 \
  --cores 2 >"$work/out" 2>&1 || fail "--cores 2: exit $?"
expect_lines "--cores 2 line" "processors: stages share them: groups 0,0,0,0 with 2 cores"
step_ms_between "--cores 2 step between half the work and all of it" 48 96
# Pairs of stages on one core each: each core has 48 ms of work.
"$DYNMO" plan --costs "$work/equal.csv" --stages 4 --method static-uniform --micro-batches 8 \
  --stage-groups 0,0,1,1 --group-cores 1,1 >"$work/out" 2>&1 || fail "--stage-groups: exit $?"
expect_lines "--stage-groups line" "processors: stages share them: groups 0,0,1,1 with 1,1 cores"
step_ms_between "--stage-groups step above a core's work" 48 96
# Enough cores for every stage: as dedicated, and it says so.
"$DYNMO" plan --costs "$work/equal.csv" --stages 4 --method static-uniform --micro-batches 8 \
  --cores 4 >"$work/out" 2>&1 || fail "--cores 4: exit $?"
expect_lines "--cores 4 is dedicated" "step_ms: 33.000" \
  "processors: stages share them: groups 0,0,0,0 with 4 cores (no group has more stages than cores: as one per stage)"
# Stages {0,1} and {2,3} on one core each, m = 16: every method's step is
# predicted with the sharing, so it is at least a core's share of the
# 16 x 88 ms of work (704). partition-time searches on that prediction: it
# beats static-uniform (976 ms shared) and cannot reach the dedicated 451 ms.
"$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,0,1,1 --group-cores 1,1 \
  >"$work/out" 2>&1 || fail "all methods shared: exit $?"
step_ms_between "every method predicted with the sharing" 704 100000
uniform_ms=$(grep -A5 '^method: static-uniform' "$work/out" | sed -n 's/^step_ms: //p')
grep -A5 '^method: partition-time' "$work/out" | sed -n 's/^step_ms: //p' >"$work/pt"
shared_pt=$(cat "$work/pt")
"$DYNMO" plan --costs $costs --stages 4 --method partition-time >"$work/out" 2>&1
dedicated_pt=$(sed -n 's/^step_ms: //p' "$work/out")
awk -v s="$shared_pt" -v u="$uniform_ms" -v d="$dedicated_pt" 'BEGIN{exit !(s < u && s > d)}' &&
  echo "ok: shared partition-time $shared_pt: faster than uniform $uniform_ms, slower than dedicated $dedicated_pt" ||
  fail "shared partition-time $shared_pt vs uniform $uniform_ms, dedicated $dedicated_pt"

# Taking turns (--sharing turns, as dynmo train's ranks do): 3 stages of
# f = b = 1 ms, m = 2, stages 0 and 2 on one core, stage 1 on its own: 9 ms
# (worked out in tests/test_balance.c), where each stage alone gives 8.
printf 'layer,fwd_ms,bwd_ms,params,mem_bytes\n0,1,1,1,1\n1,1,1,1,1\n2,1,1,1,1\n' >"$work/three.csv"
"$DYNMO" plan --costs "$work/three.csv" --stages 3 --method static-uniform --micro-batches 2 \
  --stage-groups 0,1,0 --group-cores 1,1 --sharing turns >"$work/out" 2>&1 || fail "--sharing turns: exit $?"
expect_lines "--sharing turns" "processors: stages share them: groups 0,1,0 with 1,1 cores, taking turns" \
  "step_ms: 9.000"
"$DYNMO" plan --costs "$work/equal.csv" --stages 4 --method static-uniform --micro-batches 8 \
  --cores 1 --sharing turns >"$work/out" 2>&1 || fail "--cores 1 --sharing turns: exit $?"
expect_lines "--cores 1 taking turns: all the work" "step_ms: 96.000"
expect_error "sharing name" "--sharing: 'even' is not fluid or turns" \
  "$DYNMO" plan --costs $costs --stages 4 --cores 2 --sharing even
expect_error "turns fractional cores" "--sharing turns: sharing: group 0 has 1.5 cores; stages that take turns need a whole number" \
  "$DYNMO" plan --costs $costs --stages 4 --cores 1.5 --sharing turns
expect_error "turns without sharing" "--sharing: no stages share processors here" \
  "$DYNMO" plan --costs $costs --stages 4 --sharing turns

# Bad sharing values: exit 2, the option named.
expect_error "cores 0" "--cores: '0' is not a number of processors > 0" \
  "$DYNMO" plan --costs $costs --stages 4 --cores 0
expect_error "cores negative" "--cores: '-2' is not a number" \
  "$DYNMO" plan --costs $costs --stages 4 --cores -2
expect_error "cores text" "--cores: 'two' is not a number" \
  "$DYNMO" plan --costs $costs --stages 4 --cores two
expect_error "cores nan" "--cores: 'nan' is not a number" \
  "$DYNMO" plan --costs $costs --stages 4 --cores nan
expect_error "cores with groups" "--cores: give --cores .* not both" \
  "$DYNMO" plan --costs $costs --stages 4 --cores 2 --stage-groups 0,0,1,1 --group-cores 1,1
expect_error "groups without cores" "--stage-groups needs --group-cores" \
  "$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,0,1,1
expect_error "cores without groups" "--group-cores needs --stage-groups" \
  "$DYNMO" plan --costs $costs --stages 4 --group-cores 1,1
expect_error "group count" "--stage-groups: 3 stages, but --stages is 4" \
  "$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,0,1 --group-cores 1,1
expect_error "group out of range" "--stage-groups: stage 2 is in group 2, but --group-cores gives 2 groups" \
  "$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,0,2,1 --group-cores 1,1
expect_error "group text" "--stage-groups: '0,x,1,1' is not a list of group numbers >= 0" \
  "$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,x,1,1 --group-cores 1,1
expect_error "group negative" "--stage-groups: '0,-1,1,1' is not a list" \
  "$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,-1,1,1 --group-cores 1,1
expect_error "group cores zero" "--group-cores: '1,0' is not a list of core counts > 0" \
  "$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,0,1,1 --group-cores 1,0
expect_error "group cores text" "--group-cores: '1,many' is not a list of core counts" \
  "$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,0,1,1 --group-cores 1,many
expect_error "unused group" "--group-cores: 3 core counts, but --stage-groups uses groups 0..1 only" \
  "$DYNMO" plan --costs $costs --stages 4 --stage-groups 0,0,1,1 --group-cores 1,1,1

# --from-run: a run log that recorded shared processors (root attributes
# stage_groups and group_cores), written here with h5py: 8 blocks of 3 ms
# on 4 stages of 2, m = 8, no extras (busy = 8 x 6 ms). Dedicated:
# (8 + 3) x 6 = 66 ms; each pair of stages is 96 ms of work for one core.
make_run() { # DIR PYTHON-ATTRIBUTE-LINES
  mkdir -p "$1"
  /usr/bin/python3 - "$1/runlog.h5" "$2" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'w')
f.attrs['config'] = "model.channels = 8\nmodel.layers = 8\ntrain.micro_batches = 8\n"
f['/layers/fwd_ms'] = np.ones((1, 8), np.float32)
f['/layers/bwd_ms'] = 2 * np.ones((1, 8), np.float32)
f['/layout/history'] = np.array([[2, 2, 2, 2]], np.int32)
f['/stages/busy_ms'] = np.array([[48, 48, 48, 48]], np.float32)
exec(sys.argv[2])
PY
}
if /usr/bin/python3 -c 'import h5py' 2>/dev/null; then
  make_run "$work/run" "f.attrs['stage_groups'] = np.array([0, 0, 1, 1], np.int32); f.attrs['group_cores'] = np.array([1.0, 1.0])"
  "$DYNMO" plan --from-run "$work/run" --step 1 --method static-uniform >"$work/out" 2>&1 ||
    fail "from-run shared: exit $? $(cat "$work/out")"
  expect_lines "--from-run takes the run's sharing" \
    "processors: stages share them: groups 0,0,1,1 with 1,1 cores (from the run log)"
  step_ms_between "--from-run shared step above a core's work" 96 192
  "$DYNMO" plan --from-run "$work/run" --step 1 --method static-uniform --cores 4 >"$work/out" 2>&1 ||
    fail "from-run --cores: exit $?"
  expect_lines "--cores overrides the run's sharing" "step_ms: 66.000" \
    "processors: stages share them: groups 0,0,0,0 with 4 cores (no group has more stages than cores: as one per stage)"
  "$DYNMO" plan --from-run "$work/run" --step 1 --method static-uniform --stages 2 >"$work/out" 2>&1 ||
    fail "from-run --stages 2: exit $?"
  expect_lines "other stage count: dedicated, and it says why" \
    "processors: one per stage (the run's 4 stages shared processors, but --stages is 2)"
  # A run whose ranks took turns (root attribute group_turns = 1).
  make_run "$work/runturns" "f.attrs['stage_groups'] = np.array([0, 0, 1, 1], np.int32); f.attrs['group_cores'] = np.array([1.0, 1.0]); f.attrs['group_turns'] = np.array([1], np.int32)"
  "$DYNMO" plan --from-run "$work/runturns" --step 1 --method static-uniform >"$work/out" 2>&1 ||
    fail "from-run turns: exit $? $(cat "$work/out")"
  expect_lines "--from-run takes the run's turns" \
    "processors: stages share them: groups 0,0,1,1 with 1,1 cores, taking turns (from the run log)"
  step_ms_between "--from-run turns step above a core's work" 96 192
  "$DYNMO" plan --from-run "$work/runturns" --step 1 --method static-uniform --sharing fluid >"$work/out" 2>&1 ||
    fail "from-run --sharing fluid: exit $?"
  expect_lines "--sharing fluid overrides the run's turns" \
    "processors: stages share them: groups 0,0,1,1 with 1,1 cores (from the run log)"
  # A bad sharing in the run log: exit 2 naming it.
  bad_run() {   # NAME ATTRS WHAT MESSAGE
    make_run "$work/$1" "$2"
    expect_error "$3" "$4" "$DYNMO" plan --from-run "$work/$1" --step 1
  }
  bad_run run3 "f.attrs['stage_groups'] = np.array([0, 0, 1], np.int32); f.attrs['group_cores'] = np.array([1.0, 1.0])" \
    "run log group count" "stage_groups has 3 entries but the run has 4 stages"
  bad_run runhalf "f.attrs['stage_groups'] = np.array([0, 0, 1, 1], np.int32)" \
    "run log without group_cores" "has the attribute stage_groups but not group_cores"
  bad_run runrange "f.attrs['stage_groups'] = np.array([0, 0, 1, 2], np.int32); f.attrs['group_cores'] = np.array([1.0, 1.0])" \
    "run log group out of range" "stage 3 is in group 2, outside 0..1"
  bad_run runzero "f.attrs['stage_groups'] = np.array([0, 0, 1, 1], np.int32); f.attrs['group_cores'] = np.array([1.0, 0.0])" \
    "run log zero cores" "group 1 has 0 cores"
  bad_run runturns2 "f.attrs['stage_groups'] = np.array([0, 0, 1, 1], np.int32); f.attrs['group_cores'] = np.array([1.0, 1.0]); f.attrs['group_turns'] = np.array([2], np.int32)" \
    "run log group_turns 2" "the attribute group_turns must be one value, 0 or 1"
  bad_run runfloat "f.attrs['stage_groups'] = np.array([0.0, 0, 1, 1]); f.attrs['group_cores'] = np.array([1.0, 1.0])" \
    "run log float groups" "attribute stage_groups is not an array of integers"
  # A layout history that does not cover the model: exit 2, not a read
  # past the ends of the layout.
  bad_run runnolayout "del f['/layout/history']; f['/layout/history'] = np.zeros((1, 4), np.int32)" \
    "run log empty layout" "has no layout for step 1"
  bad_run runwronglayout "del f['/layout/history']; f['/layout/history'] = np.array([[3, 3, 2, 2]], np.int32)" \
    "run log layout over the blocks" "/layout/history row 0 \(step 1\) places 10 blocks in all, but the model has 8 \(model.layers\)"
  make_run "$work/plain" ""
  "$DYNMO" plan --from-run "$work/plain" --step 1 --method static-uniform >"$work/out" 2>&1 ||
    fail "from-run plain: exit $?"
  expect_lines "--from-run without sharing attributes" "processors: one per stage" "step_ms: 66.000"
  # Interleaved: 8 blocks of 1..8 ms forward (twice that backward) on 2
  # stages of 2 chunks, 1,3,2,2 blocks (stage 0: blocks 0, 4, 5; stage 1:
  # 1-3, 6, 7), the embedding 1.5 ms and the head 3 ms a micro-batch, m =
  # 4. --from-run plans the chunks under the run's schedule from
  # /layout/chunks, and takes the ends' time from each stage less its
  # chunks' blocks: under --schedule 1f1b it predicts what a 1f1b run of
  # 4,4 blocks with the same costs logs.
  block_run() { # DIR CONFIG HISTORY BUSY PYTHON
    mkdir -p "$1"
    /usr/bin/python3 - "$1/runlog.h5" "$2" "$3" "$4" "$5" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'w')
f.attrs['config'] = "model.channels = 8\nmodel.layers = 8\ntrain.micro_batches = 4\n" + sys.argv[2].replace("\\n", "\n")
fwd = np.arange(1, 9, dtype=np.float32)[None, :]
f['/layers/fwd_ms'], f['/layers/bwd_ms'] = fwd, 2 * fwd
f['/layout/history'] = np.array([eval(sys.argv[3])], np.int32)
f['/stages/busy_ms'] = np.array([eval(sys.argv[4])], np.float32)
exec(sys.argv[5])
PY
  }
  il="parallel.pp = 2\nparallel.schedule = interleaved\nparallel.virtual = 2\n"
  block_run "$work/il" "$il" "[3, 5]" "[4 * (36 + 1.5), 4 * (72 + 3)]" \
    "f['/layout/chunks'] = np.array([[1, 3, 2, 2]], np.int32)"
  block_run "$work/il1f1b" "parallel.pp = 2\n" "[4, 4]" "[4 * (30 + 1.5), 4 * (78 + 3)]" ""
  "$DYNMO" plan --from-run "$work/il" --step 1 --method static-uniform >"$work/out" 2>&1 ||
    fail "from-run interleaved: exit $? $(cat "$work/out")"
  expect_lines "--from-run of an interleaved run plans its chunks" \
    "stages: 2 x 2 chunks  micro_batches: 4  schedule: interleaved  mem_cap: none" \
    "reference: 1,3,2,2" "layout: 2,2,2,2"
  "$DYNMO" plan --from-run "$work/il" --step 1 --method static-uniform --schedule 1f1b >"$work/out" 2>&1 ||
    fail "from-run interleaved as 1f1b: exit $?"
  expect_lines "an interleaved run planned as 1f1b" "reference: 3,5" "layout: 4,4"
  il_step=$(sed -n 's/^step_ms: //p' "$work/out")
  "$DYNMO" plan --from-run "$work/il1f1b" --step 1 --method static-uniform >"$work/out" 2>&1 ||
    fail "from-run 1f1b twin: exit $?"
  [ -n "$il_step" ] && [ "$il_step" = "$(sed -n 's/^step_ms: //p' "$work/out")" ] &&
    echo "ok: the interleaved run's embedding and head: the 1f1b run's ($il_step ms)" ||
    fail "the interleaved run's ends: $il_step ms against the 1f1b run's $(sed -n 's/^step_ms: //p' "$work/out")"
  "$DYNMO" plan --from-run "$work/il" --step 1 --method static-uniform --stages 2 --current 2,2,2,2 \
    --virtual 2 --schedule interleaved >"$work/out" 2>&1 || fail "from-run interleaved --current: exit $?"
  expect_lines "--current over the chunks" "reference: 2,2,2,2"
  expect_error "--current counts chunks" "--current: 2 entries, but the plan has 4 chunks" \
    "$DYNMO" plan --from-run "$work/il" --step 1 --stages 2 --current 4,4
  # zb: the weight parts the run logged (/layers/wgrad_ms) price W. Half
  # the backward is what a log without them gets; none (W = 0) is slower.
  for w in 0 1 none; do
    pyw="f['/layers/wgrad_ms'] = $w * fwd"; [ $w = none ] && pyw=""
    block_run "$work/zb$w" "parallel.pp = 2\nparallel.schedule = zb\n" "[4, 4]" \
      "[4 * (30 + 1.5), 4 * (78 + 3)]" "$pyw"
    "$DYNMO" plan --from-run "$work/zb$w" --step 1 --method static-uniform >"$work/out" 2>&1 ||
      fail "from-run zb: exit $?"
    grep -q "schedule: zb" "$work/out" || fail "from-run zb: not planned as zb: $(cat "$work/out")"
    eval "zb$w=\$(sed -n 's/^step_ms: //p' \"\$work/out\")"
  done
  [ -n "$zb1" ] && [ "$zb1" = "$zbnone" ] && awk -v a="$zb1" -v b="$zb0" 'BEGIN{exit !(a < b)}' &&
    echo "ok: --from-run of a zb run prices its logged weight parts ($zb0 ms without, $zb1 ms with half)" ||
    fail "--from-run zb: $zb0 ms with no weight part, $zb1 with half (want $zbnone, less)"
  # --step A-B: the mean of the steps' costs. Two steps of 1..8 and 3..10
  # ms forward plan as one step of 2..9; the bound line divides the best
  # static layout's step by partition-time's.
  block_run "$work/two" "parallel.pp = 2\n" "[4, 4]" "[4 * (30 + 1.5), 4 * (78 + 3)]" \
    "del f['/layers/fwd_ms'], f['/layers/bwd_ms'], f['/layout/history'], f['/stages/busy_ms']
fwd = np.array([np.arange(1, 9), np.arange(3, 11)], np.float32)
f['/layers/fwd_ms'], f['/layers/bwd_ms'] = fwd, 2 * fwd
f['/layout/history'] = np.array([[4, 4], [4, 4]], np.int32)
f['/stages/busy_ms'] = np.array([[4 * (30 + 1.5), 4 * (78 + 3)], [4 * (54 + 1.5), 4 * (102 + 3)]], np.float32)"
  block_run "$work/mean" "parallel.pp = 2\n" "[4, 4]" "[4 * (42 + 1.5), 4 * (90 + 3)]" \
    "del f['/layers/fwd_ms'], f['/layers/bwd_ms']
f['/layers/fwd_ms'], f['/layers/bwd_ms'] = fwd + 1, 2 * (fwd + 1)"
  plan_steps() { "$DYNMO" plan --from-run "$@" --method static-uniform,partition-time >"$work/out" 2>&1 ||
    fail "plan --from-run $*: exit $?"; grep -E '^(step_ms|bound|layout):' "$work/out"; }
  two=$(plan_steps "$work/two" --step 1-2); mean=$(plan_steps "$work/mean" --step 1)
  plan_steps "$work/two" --step 1-2 >/dev/null
  grep -q "^costs: .*two steps 1-2 (their mean)" "$work/out" && [ -n "$two" ] && [ "$two" = "$mean" ] &&
    echo "ok: --step 1-2 plans the steps' mean costs ($(echo "$two" | grep '^bound'))" ||
    fail "--step 1-2: $two, against the mean's $mean"
  echo "$two" | grep -Eq '^bound: [0-9.]+x \(best static static-uniform [0-9.]+ ms / partition-time [0-9.]+ ms\)$' ||
    fail "no bound line: $two"
  block_run "$work/relaid" "parallel.pp = 2\n" "[4, 4]" "[150, 300]" \
    "del f['/layout/history'], f['/layers/fwd_ms'], f['/layers/bwd_ms'], f['/stages/busy_ms']
f['/layout/history'] = np.array([[4, 4], [3, 5]], np.int32)
f['/layers/fwd_ms'] = np.ones((2, 8), np.float32); f['/layers/bwd_ms'] = np.ones((2, 8), np.float32)
f['/stages/busy_ms'] = np.full((2, 2), 100, np.float32)"
  expect_error "a range over a re-layout" "/layout/history differs at steps 1 and 2 \(a re-layout inside steps 1-2\)" \
    "$DYNMO" plan --from-run "$work/relaid" --step 1-2
  expect_error "steps past the log" "--step 1-3: .* has steps 1..2" "$DYNMO" plan --from-run "$work/relaid" --step 1-3
  expect_error "a backward range" "--step: '2-1' is not a step N or a range A-B" \
    "$DYNMO" plan --from-run "$work/relaid" --step 2-1
  expect_error "--step without a run" "--step: only --from-run reads steps" \
    "$DYNMO" plan --costs "$costs" --stages 2 --step 1
  # --units block plans a sublayer run in whole blocks (/layers/, its unit
  # layout halved): what the same costs logged by a block run give.
  block_run "$work/units" "parallel.pp = 2\nbalance.units = sublayer\n" "[8, 8]" \
    "[4 * (30 + 1.5), 4 * (78 + 3)]" \
    "f['/units/fwd_ms'] = np.repeat(fwd, 2, axis=1) / 2; f['/units/bwd_ms'] = np.repeat(fwd, 2, axis=1)"
  "$DYNMO" plan --from-run "$work/units" --step 1 --units block --method static-uniform >"$work/out" 2>&1 ||
    fail "--units block on a sublayer run: exit $? $(cat "$work/out")"
  expect_lines "--units block on a sublayer run" "reference: 4,4" "step_ms: $il_step"
  "$DYNMO" plan --from-run "$work/units" --step 1 --method static-uniform >"$work/out" 2>&1 ||
    fail "a sublayer run in its units: exit $?"
  expect_lines "a sublayer run in its units" "reference: 8,8" "step_ms: $il_step"
  block_run "$work/unitsplit" "parallel.pp = 2\nbalance.units = sublayer\n" "[7, 9]" \
    "[150, 300]" "f['/units/fwd_ms'] = np.repeat(fwd, 2, axis=1) / 2; f['/units/bwd_ms'] = np.repeat(fwd, 2, axis=1)"
  expect_error "--units block on a split block" "splits a block \(entry 0 holds 7 units\)" \
    "$DYNMO" plan --from-run "$work/unitsplit" --step 1 --units block
  expect_error "--units sublayer with --from-run" "--units sublayer: --from-run reads the run log's own units" \
    "$DYNMO" plan --from-run "$work/units" --step 1 --units sublayer
  block_run "$work/ilnochunks" "$il" "[3, 5]" "[150, 300]" ""
  expect_error "interleaved run without chunks" "needs /layout/chunks with 4 columns" \
    "$DYNMO" plan --from-run "$work/ilnochunks" --step 1
  block_run "$work/ilbadchunks" "$il" "[3, 5]" "[150, 300]" \
    "f['/layout/chunks'] = np.array([[1, 3, 0, 4]], np.int32)"
  expect_error "chunks with an empty one" "/layout/chunks at step 1 is not a layout of the run's 8 units over 4 chunks" \
    "$DYNMO" plan --from-run "$work/ilbadchunks" --step 1
else
  echo "skip: --from-run sharing cases need /usr/bin/python3 with h5py"
fi
finish
