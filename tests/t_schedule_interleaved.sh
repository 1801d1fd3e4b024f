#!/usr/bin/env bash
# Interleaved 1F1B (parallel.schedule = interleaved, parallel.virtual = v)
# in dynmo train: each rank holds v chunks of the model, chunk c of stage
# s being virtual stage c S + s, and runs balance's instruction list for
# them. The losses and gradient norms are bit-identical to the one-rank
# run on 2 and 4 stages with 2 chunks, on 2 stages with 4 chunks, on an
# uneven explicit layout of the chunks, with two replicas, traced, with
# random re-layouts of the 8 chunks of 4 stages every 2 steps (blocks
# migrate between chunks) and with the balancing controller deciding on
# the chunks; the validation losses too. Checkpoints resume across
# schedules (interleaved -> 1f1b -> interleaved) and an interleaved run's
# checkpoint holds the same data as 1f1b's. Bad values exit 2 with one
# message.
set -u
. "$(dirname "$0")/lib.sh"
need_dynmo
work_dir
tiny_config "$dir/tiny.ini" model.layers=8 train.steps=6 train.eval_every=3
train_cpus=$(two_cpus) train_limit=120
sets=(steps/loss steps/grad_norm)
run() { train "$1" "$2" "$dir/tiny.ini" "${@:3}" && bits "$1" "${sets[@]}"; }
il=(parallel.schedule=interleaved)
run base 1
has base /eval/loss && sets+=(eval/loss) && bits base eval/loss
run il2 2 parallel.pp=2 "${il[@]}" parallel.virtual=2 &&
  same base il2 "interleaved, 2 stages x 2 chunks" "${sets[@]}"
run il4 4 parallel.pp=4 "${il[@]}" parallel.virtual=2 &&
  same base il4 "interleaved, 4 stages x 2 chunks" "${sets[@]}"
run il24 2 parallel.pp=2 "${il[@]}" parallel.virtual=4 &&
  same base il24 "interleaved, 2 stages x 4 chunks" "${sets[@]}"
run ilx 2 parallel.pp=2 "${il[@]}" parallel.virtual=2 balance.initial=explicit:1,3,3,1 &&
  same base ilx "interleaved on chunks of 1,3,3,1 blocks" "${sets[@]}"
# Two replicas: against 1f1b on the same grid (each replica's micro-batch
# is half the one rank's, so its sums differ from one rank's).
run dp1f1b 4 parallel.pp=2 parallel.dp=2 &&
  run ildp 4 parallel.pp=2 parallel.dp=2 "${il[@]}" parallel.virtual=2 &&
  same dp1f1b ildp "interleaved with 2 replicas (against 1f1b on the same grid)" "${sets[@]}"
grep -q "interleaved, layout 2,2,2,2" "$dir/il2.out" ||
  fail "interleaved: the start line does not show the 4 chunks' layout"
# A traced step: every stage runs each micro-batch's forward and backward
# once per chunk (4 micro-batches x 2 chunks).
run trace 2 parallel.pp=2 "${il[@]}" parallel.virtual=2 run.trace_from=2 run.trace_steps=1 && {
  same base trace "a traced interleaved run" "${sets[@]}"
  /usr/bin/python3 - "$dir/trace/runlog.h5" <<'PY' || fail "interleaved: the traced step is wrong"
import sys, h5py
e = h5py.File(sys.argv[1], 'r')['/trace/events'][:]
for rank in (0, 1):
    ops = list(e[e[:, 1] == rank][:, 3].astype(int))
    assert ops.count(1) == 8 and ops.count(4) == 8, ops
print("ok: a traced interleaved step: 8 FWD, 8 BWD per stage")
PY
}
# Re-layouts: 12 blocks in 8 chunks of 4 stages, random every 2 steps,
# and the controller (balance.method=partition over the 8 virtual stages).
tiny_config "$dir/twelve.ini" model.layers=12 train.steps=6 train.eval_every=3
twelve() { train "$1" "$2" "$dir/twelve.ini" "${@:3}" && bits "$1" "${sets[@]}"; }
chunks8=(parallel.pp=4 "${il[@]}" parallel.virtual=2 balance.initial=explicit:2,1,1,2,2,1,1,2)
twelve base12 1
twelve ilr 4 "${chunks8[@]}" balance.method=random balance.every=2 && {
  same base12 ilr "interleaved with random re-layouts of 8 chunks every 2 steps" "${sets[@]}"
  grep -q "migrated [0-9]* blocks" "$dir/ilr.out" || fail "interleaved: no migration shown"
}
# The controller starts from 5 blocks in the last chunk: it proposes
# layouts of the 8 chunks, predicted as interleaved, and migrates.
twelve ilp 4 parallel.pp=4 "${il[@]}" parallel.virtual=2 balance.initial=explicit:1,1,1,1,1,1,1,5 \
  balance.method=partition balance.every=2 balance.min_gain=0 && {
  same base12 ilp "interleaved balanced by the controller" "${sets[@]}"
  grep -Eq "balance: step 2: partition-time proposes ([0-9]+,){7}[0-9]+ .* over 1,1,1,1,1,1,1,5 .*: migrating" \
    "$dir/ilp.out" || fail "interleaved: the controller did not move the 8 chunks' blocks at step 2"
}
twelve ild 2 parallel.pp=2 "${il[@]}" parallel.virtual=2 balance.method=diffusion \
  balance.every=2 && same base12 ild "interleaved balanced by diffusion" "${sets[@]}"
# Checkpoints resume across schedules: 6 steps under one with checkpoints
# at 3 and 6; ckpt-6 removed, the rerun under the other resumes at 3.
v2=("${il[@]}" parallel.virtual=2)
for pair in "interleaved 1f1b" "1f1b interleaved" "interleaved interleaved"; do
  set -- $pair
  name="resume-$1-$2"
  first=(parallel.schedule=1f1b); [ "$1" = interleaved ] && first=("${v2[@]}")
  second=(parallel.schedule=1f1b); [ "$2" = interleaved ] && second=("${v2[@]}")
  train "$name" 2 "$dir/tiny.ini" parallel.pp=2 "${first[@]}" ckpt.dir="$dir/$name.ck" \
    ckpt.every=3 || continue
  rm -f "$dir/$name.ck/ckpt-6.h5"
  train "$name" 2 "$dir/tiny.ini" parallel.pp=2 "${second[@]}" ckpt.dir="$dir/$name.ck" \
    ckpt.every=3 || continue
  grep -q "resumed from .*step 3" "$dir/$name.out" || fail "$name: did not resume at step 3"
  bits "$name" steps/loss && same base "$name" "$1 resumed under $2" steps/loss
done
"$DYNMO" check-ckpt "$dir/resume-interleaved-1f1b.ck/ckpt-3.h5" >"$dir/check.out" 2>&1 ||
  fail "check-ckpt refuses an interleaved run's checkpoint: $(tail -n 2 "$dir/check.out")"
same_ckpt "$dir/resume-1f1b-interleaved.ck/ckpt-3.h5" "$dir/resume-interleaved-1f1b.ck/ckpt-3.h5" \
  "an interleaved checkpoint against 1f1b's"
# dynmo eval reads an interleaved run's checkpoint as any other (a
# forward pass over its stages): the loss of the 1f1b run's.
for name in resume-interleaved-1f1b resume-1f1b-interleaved; do
  "$DYNMO" eval --checkpoint "$dir/$name.ck/ckpt-3.h5" --data "$dir/data/val.bin" \
    >"$dir/$name.eval" 2>&1 || fail "eval of $name's checkpoint: $(tail -n 2 "$dir/$name.eval")"
done
cmp -s <(grep '^loss: ' "$dir/resume-interleaved-1f1b.eval") \
       <(grep '^loss: ' "$dir/resume-1f1b-interleaved.eval") &&
  grep -q '^loss: [0-9]' "$dir/resume-1f1b-interleaved.eval" &&
  echo "ok: dynmo eval of an interleaved checkpoint: $(grep '^loss: ' "$dir/resume-1f1b-interleaved.eval" | head -1), 1f1b's" ||
  fail "eval: an interleaved checkpoint's loss is not 1f1b's"
# The run log keeps a stage's blocks (its chunks together) as its layout.
/usr/bin/python3 - "$dir/ilx/runlog.h5" <<'PY' || fail "interleaved: /layout/history is not the stages' blocks"
import sys, h5py
rows = h5py.File(sys.argv[1], 'r')['/layout/history'][:]
assert all(list(r) == [4, 4] for r in rows), rows
chunks = h5py.File(sys.argv[1], 'r')['/layout/chunks'][:]
assert all(list(r) == [1, 3, 3, 1] for r in chunks), chunks
print("ok: /layout/history holds each stage's 4 blocks (chunks 1 + 3 and 3 + 1), "
      "/layout/chunks the chunks' 1,3,3,1")
PY
# dynmo plan --from-run plans the chunks of the randomly re-laid-out run
# from the layout of its step 6.
if [ -f "$dir/ilr/runlog.h5" ]; then
  want=$(/usr/bin/python3 -c 'import sys, h5py
print(",".join(str(c) for c in h5py.File(sys.argv[1], "r")["/layout/chunks"][5]))' "$dir/ilr/runlog.h5")
  "$DYNMO" plan --from-run "$dir/ilr" --step 6 --method partition-time >"$dir/plan.out" 2>&1 &&
    grep -qx "reference: $want" "$dir/plan.out" &&
    grep -q "stages: 4 x 2 chunks  micro_batches: 4  schedule: interleaved" "$dir/plan.out" &&
    echo "ok: dynmo plan --from-run plans the run's 8 chunks from step 6's $want" ||
    fail "plan --from-run of an interleaved run: $(head -n 6 "$dir/plan.out")"
fi
ref() { train_refused "$1" "$2" "$3" "$dir/tiny.ini" "${@:4}"; }
ref no-virtual "parallel.schedule = interleaved needs parallel.virtual >= 2" 2 \
  parallel.pp=2 "${il[@]}"
ref virtual-1f1b "parallel.virtual = 2 needs parallel.schedule = interleaved" 2 \
  parallel.pp=2 parallel.virtual=2
ref one-stage "interleaved needs parallel.pp >= 2" 1 "${il[@]}" parallel.virtual=2
ref micro-batches "train.micro_batches = 2 is not a multiple of parallel.pp = 4" 4 \
  parallel.pp=4 "${il[@]}" parallel.virtual=2 train.micro_batches=2
ref not-dividing "parallel.virtual = 3 does not divide the blocks of a rank" 2 \
  parallel.pp=2 "${il[@]}" parallel.virtual=3
ref too-many "parallel.pp x parallel.virtual = 2 x 8 exceeds model.layers = 8" 2 \
  parallel.pp=2 "${il[@]}" parallel.virtual=8
ref explicit-count "lists 2 counts but interleaved lays out parallel.pp x parallel.virtual = 2 x 2 = 4 chunks" 2 parallel.pp=2 "${il[@]}" parallel.virtual=2 \
  balance.initial=explicit:4,4
ref sublayer "interleaved does not run with balance.units = sublayer yet" 2 parallel.pp=2 \
  "${il[@]}" parallel.virtual=2 balance.units=sublayer
ref repack "interleaved does not run with repack.enable yet" 2 parallel.pp=2 "${il[@]}" \
  parallel.virtual=2 repack.enable=1 ckpt.dir="$dir/ck"
finish
