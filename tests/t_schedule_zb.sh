#!/usr/bin/env bash
# The zero-bubble schedule (parallel.schedule = zb, ZB-H1) in dynmo train:
# each block's backward split into its input part (BWD) and its weight part
# (WGRAD, deferred into the slots the instruction list gives). The loss
# trajectory is bit-identical to the one-rank run on 2 and 4 stages, on an
# uneven layout, with random re-layouts every 2 steps (live migration
# between a BWD and its WGRAD never happens: migration is at step
# boundaries), with layers freezing, early exit, mixture of depths, hash
# attention, pruning (CSR) and mixture of experts (against 1f1b on the same
# grid), on the emulated device, and across checkpoints resumed under
# another schedule; a traced step holds one WGRAD (op 8)
# per micro-batch on every stage; the run log keeps the weight parts' time
# apart (/layers/wgrad_ms). Bad values exit 2 with one message.
set -u
. "$(dirname "$0")/lib.sh"
need_dynmo
work_dir
tiny_config "$dir/tiny.ini" train.steps=6
train_cpus=$(two_cpus) train_limit=120
run() { train "$1" "$2" "$dir/tiny.ini" "${@:3}" && bits "$1" /steps/loss; }
run base 1
run zb1 1 parallel.schedule=zb && same base zb1 "zb on one rank" /steps/loss
run zb2 2 parallel.pp=2 parallel.schedule=zb && same base zb2 "zb on 2 stages" /steps/loss
run zb4 4 parallel.pp=4 parallel.schedule=zb && same base zb4 "zb on 4 stages" /steps/loss
# The profile records the weight parts apart: /layers/wgrad_ms, a share of
# /layers/bwd_ms; a 1f1b run has no such dataset.
/usr/bin/python3 - "$dir/zb2/runlog.h5" "$dir/base/runlog.h5" <<'PY' || fail "zb: /layers/wgrad_ms is wrong"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
w, b = f['/layers/wgrad_ms'][:], f['/layers/bwd_ms'][:]
assert w.shape == b.shape and np.all(w > 0) and np.all(w < b), (w, b)
assert '/layers/wgrad_ms' not in h5py.File(sys.argv[2], 'r')
print(f"ok: /layers/wgrad_ms: the weight parts take {np.median(w / b):.2f} of the backward (median)")
PY
run zbx 3 parallel.pp=3 parallel.schedule=zb balance.initial=explicit:1,4,1 &&
  same base zbx "zb on 3 uneven stages" /steps/loss
run zbr 4 parallel.pp=4 parallel.schedule=zb balance.method=random balance.every=2 && {
  same base zbr "zb with random re-layouts every 2 steps" /steps/loss
  grep -q "migrated [0-9]* blocks" "$dir/zbr.out" || fail "zb: no migration shown in the step lines"
}
# The balancing controller deciding every 2 steps on the measured weight
# parts (balance.method=partition): the same bits whatever it decides.
run zbp 4 parallel.pp=4 parallel.schedule=zb balance.method=partition balance.every=2 &&
  same base zbp "zb balanced by the controller" /steps/loss
# Freezing: a frozen block has no weight part; the same bits as 1F1B's.
freeze=(dyn.kind=freeze dyn.freeze_window=1 dyn.freeze_every=2 dyn.freeze_threshold=10)
run fbase 1 "${freeze[@]}"
run fzb 4 parallel.pp=4 parallel.schedule=zb "${freeze[@]}" && {
  same fbase fzb "zb with layers freezing" /steps/loss
  grep -Eq "frozen [1-9][0-9]*/6" "$dir/fzb.out" || fail "zb with freezing: no block froze"
}
# Checkpoints resume across schedules (they hold layers, not a schedule):
# 6 steps under one schedule with checkpoints at 3 and 6; ckpt-6 removed,
# the rerun under the other resumes at 3 and redoes 4-6. The run log's
# /layers/wgrad_ms then covers the zb steps only; report reads it.
for pair in "zb 1f1b" "1f1b zb"; do
  set -- $pair
  name="resume-$1-$2"
  train "$name" 2 "$dir/tiny.ini" parallel.pp=2 parallel.schedule="$1" \
    ckpt.dir="$dir/$name.ck" ckpt.every=3 || continue
  rm -f "$dir/$name.ck/ckpt-6.h5"
  train "$name" 2 "$dir/tiny.ini" parallel.pp=2 parallel.schedule="$2" \
    ckpt.dir="$dir/$name.ck" ckpt.every=3 || continue
  grep -q "resumed from .*step 3" "$dir/$name.out" || fail "$name: did not resume at step 3"
  bits "$name" /steps/loss && same base "$name" "$1 resumed under $2" /steps/loss
  "$DYNMO" report "$dir/$name/runlog.h5" --out "$dir/$name.report" >"$dir/$name.report.out" 2>&1 ||
    fail "$name: dynmo report failed: $(tail -n 2 "$dir/$name.report.out")"
done
# Schemes whose blocks' backward runs whole in BWD (mixture of depths),
# pruning with CSR products (their weight outputs deferred), hash
# attention (its own attention core in BWD) and early exit (the active
# rows' weight part): the same bits too.
for scheme in "early dyn.kind=early_exit" \
              "exits dyn.kind=early_exit dyn.exit_threshold=0.0005 dyn.exit_warmup=1" \
              "mod model.mod_every=2 model.mod_capacity=0.25" \
              "hash model.attention=hash hash.buckets=4" \
              "prune dyn.kind=prune dyn.prune_start=1 dyn.prune_every=1 dyn.csr_sparsity=0"; do
  set -- $scheme
  kind=$1; shift
  run "s-$kind" 1 "$@" &&
  run "zb-$kind" 2 parallel.pp=2 parallel.schedule=zb "$@" &&
    same "s-$kind" "zb-$kind" "zb with $kind" /steps/loss
done
# Hash attention, early exit and CSR products keep a weight part: WGRAD
# time on every block (exits: with tokens leaving from block 1 on, the
# active rows').
for kind in hash early exits prune; do
  /usr/bin/python3 - "$dir/zb-$kind/runlog.h5" <<'PY' && echo "ok: zb with $kind: every block has a deferred weight part" || fail "zb with $kind: a block without a weight part"
import sys, h5py
w = h5py.File(sys.argv[1], "r")["/layers/wgrad_ms"][:]
assert (w[-1] > 0).all(), w[-1]
PY
done
# Mixture of experts with expert parallelism (pp = 2, dp = 2, ep = 2; a
# MoE block's MLP backward, with the expert exchange, runs whole in BWD,
# its attention's weight part deferred): zb gives 1f1b's bits on the same
# grid, and every block, MoE or dense, has a weight part in WGRAD.
moe=(model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=64
     parallel.pp=2 parallel.dp=2 parallel.ep=2 train.micro_batches=2)
run moe1f1b 4 "${moe[@]}" && run moezb 4 "${moe[@]}" parallel.schedule=zb && {
  same moe1f1b moezb "zb with mixture of experts (ep = 2)" /steps/loss
  /usr/bin/python3 - "$dir/moezb/runlog.h5" <<'PY' && echo "ok: zb with mixture of experts: every block has a deferred weight part" || fail "zb with mixture of experts: a block without a weight part"
import sys, h5py
w = h5py.File(sys.argv[1], "r")["/layers/wgrad_ms"][:]
assert (w[-1] > 0).all(), w[-1]
PY
}
# On the emulated device (the CUDA plugin's kernels on the CPU): the block's
# weight-gradient inputs live in device memory; the one-rank bits again.
run emu1 1 train.device=emulate &&
  run emu2 2 parallel.pp=2 parallel.schedule=zb train.device=emulate &&
  same emu1 emu2 "zb on the emulated device" /steps/loss
run trace 2 parallel.pp=2 parallel.schedule=zb run.trace_from=2 run.trace_steps=1 && {
  same base trace "a traced zb run" /steps/loss
  /usr/bin/python3 - "$dir/trace/runlog.h5" <<'PY' || fail "zb: /trace/events has not one WGRAD per micro-batch"
import sys, h5py
e = h5py.File(sys.argv[1], 'r')['/trace/events'][:]
for rank in (0, 1):
    ops = list(e[e[:, 1] == rank][:, 3].astype(int))
    assert ops.count(1) == 4 and ops.count(4) == 4 and ops.count(8) == 4, ops
    assert ops.index(8) > ops.index(4), ops   # a weight part after its input part
print("ok: a traced zb step: 4 FWD, 4 BWD, 4 WGRAD per stage")
PY
}
train_refused zb-virtual "parallel.virtual = 2 needs parallel.schedule = interleaved" 2 \
  "$dir/tiny.ini" parallel.pp=2 parallel.schedule=zb parallel.virtual=2
train_refused unknown "parallel.schedule = 'zb2' must be 1f1b, gpipe, zb or interleaved" 1 \
  "$dir/tiny.ini" parallel.schedule=zb2
finish
