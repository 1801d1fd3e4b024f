#!/usr/bin/env bash
# Layer freezing and early exit on a 4-stage pipeline (issue 6): for each
# scheme, a static run and a balanced run (partition-time from an uneven
# layout, so blocks migrate) give bit-identical /steps/loss; frozen flags
# travel with migrating blocks, are written to the checkpoint, and a run
# resumed from it continues with the same frozen prefix and the same losses.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/t.ini" model.layers=12 model.max_seq=16 train.seq=16 train.steps=12 \
  parallel.pp=4 balance.initial=explicit:1,1,1,9 balance.every=2
FREEZE="dyn.kind=freeze dyn.freeze_window=1 dyn.freeze_every=2 dyn.freeze_threshold=100 dyn.freeze_per_check=1"
EXIT_SOFT="dyn.kind=early_exit dyn.exit_from=1 dyn.exit_threshold=0.0005 dyn.exit_warmup=2 run.log_every=1"
EXIT_SAT="dyn.kind=early_exit dyn.exit_from=1 dyn.exit_threshold=0.9 dyn.exit_confidence=saturation dyn.exit_loss_weight=0.5"
# run NAME [overrides...]: t.ini on 4 ranks and its losses' bits
run() { train "$1" 4 "$dir/t.ini" "${@:2}" && bits "$1" /steps/loss; }
for scheme in FREEZE EXIT_SOFT EXIT_SAT; do
  run "$scheme-static" ${!scheme} || continue
  run "$scheme-balanced" ${!scheme} balance.method=partition-time || continue
  cmp -s "$dir/$scheme-static.steps.loss" "$dir/$scheme-balanced.steps.loss" \
    && echo "ok: $scheme: balanced losses bit-identical to static ($(grep -c '^balance:.*migrating' "$dir/$scheme-balanced.out") migrations; $(grep '^step 12' "$dir/$scheme-balanced.out" | sed 's/.*| //'))" \
    || fail "$scheme: balanced losses differ from static"
  # whether the balancer migrates depends on measured times; freezing must
  grep -q 'migrating' "$dir/$scheme-balanced.out" || { [ $scheme = FREEZE ] \
    && fail "$scheme: no migration happened" || echo "note: $scheme: no migration this time"; }
done
grep -q 'frozen [1-9]' "$dir/FREEZE-balanced.out" || fail "freeze: nothing froze"
# The step's end per block: nothing for a block frozen before the step
# (step 11's line gives the prefix step 12 starts with), something for every
# other block, and each stage's whole step end holds its blocks' shares.
prefix=$(sed -n 's|^step 11/12 .*frozen \([0-9]*\)/12.*|\1|p' "$dir/FREEZE-balanced.out")
/usr/bin/python3 - "$dir/FREEZE-balanced/runlog.h5" "${prefix:-0}" <<'PY' || fail "/layers/update_ms is wrong"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r'); k = int(sys.argv[2])
u, su, lay = f['/layers/update_ms'][:], f['/stages/update_ms'][:], f['/layout/history'][:]
assert u.shape == (12, 12) and su.shape == (12, 4), (u.shape, su.shape)
assert k >= 1 and np.all(u[11, :k] == 0.0), (k, u[11])
assert np.all(u[11, k:] > 0.0) and np.all(u[0] > 0.0), u
starts = np.concatenate([[0], np.cumsum(lay[11])])
for s in range(4):
    assert su[11, s] >= u[11, starts[s]:starts[s + 1]].sum(), (s, su[11], u[11])
print(f"ok: /layers/update_ms: 0 for the {k} frozen blocks, >0 for the rest; stages hold their blocks'")
PY
grep -q 'skipped [1-9]' "$dir/EXIT_SOFT-balanced.out" || fail "early exit: no token exited"
# Validation reads the LM head of the step's update on every stage (the
# last stage's copy shared before the pass, dyn_before_eval): the 4-stage
# runs' validation losses are one rank's bits.
train EXIT_SOFT-one 1 "$dir/t.ini" $EXIT_SOFT parallel.pp=1 balance.initial=uniform train.eval_every=4 &&
  train EXIT_SOFT-eval 4 "$dir/t.ini" $EXIT_SOFT train.eval_every=4 &&
  bits EXIT_SOFT-one eval/loss && bits EXIT_SOFT-eval eval/loss &&
  same EXIT_SOFT-one EXIT_SOFT-eval "early exit's validation losses on 4 stages against one rank" eval/loss
# the run log's per-block active share: 1 before exit_from (block 1), never
# rising with depth, and below 1 somewhere once tokens exit
/usr/bin/python3 - "$dir/EXIT_SOFT-balanced/runlog.h5" <<'PY' || fail "/layers/active is wrong"
import sys, h5py, numpy as np
a = h5py.File(sys.argv[1], 'r')['/layers/active'][:]
assert a.shape == (12, 12), a.shape
assert np.all(a[:, :2] == 1.0), a[:, :2]
assert np.all(np.diff(a, axis=1) <= 0), a
assert a[-1].min() < 1.0, a[-1]
print("ok: /layers/active after the last step:", np.round(a[-1], 2).tolist())
PY
# checkpoint at step 6 of a balanced freezing run, resume from it
run ck $FREEZE balance.method=partition-time ckpt.dir="$dir/ck" ckpt.every=6 || true
frozen=$(/usr/bin/python3 -c "import h5py,sys; print(int(h5py.File(sys.argv[1],'r')['/blocks/state/frozen'][:].sum()))" "$dir/ck/ckpt-6.h5")
[ "${frozen:-0}" -ge 1 ] && echo "ok: checkpoint at step 6 holds $frozen frozen blocks" \
  || fail "the checkpoint holds no frozen flag"
run resumed $FREEZE balance.method=partition-time ckpt.resume="$dir/ck/ckpt-6.h5" || true
grep -q 'resumed from' "$dir/resumed.out" || fail "did not resume"
/usr/bin/python3 - "$dir/ck/runlog.h5" "$dir/resumed/runlog.h5" <<'PY' || fail "resumed losses differ from the uninterrupted run"
import sys, h5py
a = h5py.File(sys.argv[1], 'r')['/steps/loss'][:]
b = h5py.File(sys.argv[2], 'r')['/steps/loss'][:]
print('uninterrupted', list(a[-6:]), 'resumed', list(b[-6:]))
sys.exit(0 if list(a[-6:]) == list(b[-6:]) else 1)
PY
grep '^step 8\b\|^step 7\b' "$dir/resumed.out" | head -2
finish
