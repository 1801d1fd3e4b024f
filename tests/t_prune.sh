#!/usr/bin/env bash
# Gradual global magnitude pruning (issue 7): the distributed global top-k
# equals one process's choice on 1, 3 and 4 ranks (test_prune); a pruned
# run has the same /steps/loss bits on 1 rank, on 4 static stages and on 4
# stages that re-balance every 2 steps (blocks migrate with their masks and
# CSR form); /layers/sparsity is logged, differs across blocks and averages
# the schedule's target; a resume from a checkpoint taken after pruning
# (masks rebuilt from the zeros) continues with the same bits.
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${BUILD:-build}
work_dir
for n in 3 4; do
  timeout -k 10 120 mpiexec -n $n "$BUILD/tests/test_prune" > "$dir/tp$n.out" 2>&1 \
    && echo "ok: test_prune on $n ranks" || { fail "test_prune on $n ranks"; cat "$dir/tp$n.out"; }
done
tiny_config "$dir/t.ini" model.layers=12 model.channels=64 train.steps=16 dyn.kind=prune \
  dyn.prune_start=4 dyn.prune_every=2 dyn.prune_steps=3 dyn.sparsity_final=0.9 dyn.csr_sparsity=0.85
train_limit=120
# run NAME N [overrides...]: t.ini on N stages and its losses' bits
run() { train "$1" "$2" "$dir/t.ini" parallel.pp="$2" "${@:3}" && bits "$1" /steps/loss; }
run one 1
run static 4
run balanced 4 balance.method=partition-time balance.every=2
run params 4 balance.method=partition-params balance.every=2 balance.min_gain=0
# A random layout every 2 steps: migrations of pruned (and CSR) blocks are
# certain, whatever the timings say.
run random 4 balance.method=random balance.every=2
for name in static balanced params random; do
  cmp -s "$dir/one.steps.loss" "$dir/$name.steps.loss" && echo "ok: $name: losses bit-identical to 1 rank" \
    || fail "$name: losses differ from the 1-rank run"
done
grep -q "migrated [0-9]* blocks" "$dir/random.out" && echo "ok: pruned blocks migrated" \
  || fail "no migration happened in the random-layout run"
/usr/bin/python3 - "$dir/static/runlog.h5" <<'PY' || fail "/layers/sparsity"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
s = f['/layers/sparsity'][:]
last = s[-1]
print('sparsity per layer at the last step:', np.round(last, 3))
print('mean by step:', np.round(s.mean(axis=1), 3))
# 0 before step 5 (1-based), 0.9 overall after the last pruning step (step 11)
ok = s.shape == (16, 12) and s[:4].max() == 0 and abs(last.mean() - 0.9) < 1e-3 \
     and last.max() - last.min() > 0.001
sys.exit(0 if ok else 1)
PY
# Resume: the 16-step run again with a checkpoint after step 10, then a run
# resumed from that checkpoint, against the uninterrupted run.
run first 4 ckpt.dir="$dir/ck" ckpt.every=10
run second 4 ckpt.dir="$dir/ck2" ckpt.resume="$dir/ck/ckpt-10.h5"
/usr/bin/python3 - "$dir/static/runlog.h5" "$dir/second/runlog.h5" <<'PY' && echo "ok: resume after pruning continues with the same losses" || fail "resume after pruning changed the losses"
import sys, h5py, numpy as np
a = h5py.File(sys.argv[1], 'r')['/steps/loss'][:]
b = h5py.File(sys.argv[2], 'r')['/steps/loss'][:]
print('resumed rows', len(b), 'last losses', a[-3:], b[-3:])
sys.exit(0 if len(b) >= 6 and np.array_equal(a[-6:], b[-6:]) else 1)
PY
finish
