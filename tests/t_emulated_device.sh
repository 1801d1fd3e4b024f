#!/usr/bin/env bash
# The emulated device (train.device = emulate; docs/gpu.md): the whole
# model on the CUDA plugin's kernels, their per-thread functions run on
# the CPU (build/libdynmo_emulate.so, kernels/emulate.c).
# - 20-step runs (dense, early exit, pruning with CSR, MoD, hash
#   attention, MoE) against the CPU's: every loss within 1e-4 relative
#   (MoE on the lenient device, DYNMO_EMULATE_STRICT=0, so that mode runs
#   too; the strict device's runs are tests/t_device_memory.sh's), and
#   the dense run's not all bit-identical (the kernels' tree sums in the
#   loss differ from the CPU's, so identical bits would mean the device
#   was not used; on this tiny model the weights often stay bit-identical,
#   so other runs may match). The MoD router, top-k, predictor and packed
#   block and hash attention go through the table like the rest.
# - On the emulated device, static and balanced pipelines on 2 ranks give
#   the same bits.
# - A checkpoint written there resumes on the CPU, and one written on the
#   CPU resumes there: the last losses within 1e-4 of the CPU run.
# - check_ops (every op of the table against the CPU's) on the emulated
#   table; no emulated plugin: exit 2.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
plugin=$(dirname "$DYNMO")/libdynmo_emulate.so
[ -f "$plugin" ] || { echo "FAIL: no $plugin (make builds it)"; exit 1; }
. "$(dirname "$0")/device_lib.sh"

strict=1   # DYNMO_EMULATE_STRICT for run (device_lib.sh); the MoE run sets 0
names=(dense early_exit prune mod hash moe)
settings=(""
          "dyn.kind=early_exit dyn.exit_from=2 dyn.exit_warmup=2 dyn.exit_threshold=0.05"
          "dyn.kind=prune dyn.prune_start=2 dyn.prune_every=2 dyn.prune_steps=4
           dyn.sparsity_final=0.8 dyn.csr_sparsity=0.5"
          "model.mod_every=2 model.mod_capacity=0.25 mod.routing=causal"
          "model.attention=hash hash.buckets=4"
          "model.moe_every=2")
for i in 0 1 2 3 4 5; do
  name=${names[i]}; set -- ${settings[i]}
  run "$name-cpu" 1 train.device=cpu "$@" || continue
  case $name in moe) strict=0 ;; esac   # the lenient device too
  run "$name-emu" 1 train.device=emulate "$@" || { strict=1; continue; }
  strict=1
  if out=$(close "$name-cpu" "$name-emu"); then echo "ok: $name on emulate vs cpu: $out"
  else fail "$name on emulate vs cpu: $out"; fi
  [ "$name" = dense ] && cmp -s "$dir/$name-cpu.steps.loss" "$dir/$name-emu.steps.loss" \
    && fail "dense: emulate gave the CPU's bits in every loss: the kernels did not run"
done

run static 2 train.device=emulate parallel.pp=2 && \
run balanced 2 train.device=emulate parallel.pp=2 balance.method=random balance.every=1 && {
  grep -q "migrated" "$dir/balanced.out" || fail "the balanced run never migrated"
  cmp -s "$dir/static.steps.loss" "$dir/balanced.steps.loss" \
    && echo "ok: emulate, 2 ranks: static and balanced (migrating every step) bit-identical" \
    || fail "emulate: balanced losses differ from static"
}

# checkpoints across devices: 20 steps on one with a checkpoint at step
# 10, resumed from it on the other for steps 11 to 20
for pair in "emulate cpu" "cpu emulate"; do
  set -- $pair; tag=$1-$2
  run "$tag-1" 1 train.device=$1 ckpt.dir="$dir/$tag-ck" ckpt.every=10 || continue
  run "$tag" 1 train.device=$2 ckpt.dir="$dir/$tag-ck2" ckpt.resume="$dir/$tag-ck/ckpt-10.h5" \
    || continue
  grep -q "ckpt-10.h5" "$dir/$tag.out" || fail "$tag: the resume does not name ckpt-10.h5"
  if out=$(close dense-cpu "$tag" 10); then echo "ok: checkpoint $1 -> $2: $out"
  else fail "checkpoint $1 -> $2: $out"; fi
done

# every op of the emulated table against the CPU's, through its own memory calls
if DYNMO_EMULATE_PLUGIN=$plugin "$BUILD/gpu/check_ops" emulate > "$dir/ops.log" 2>&1 &&
   grep -q "check_ops: 0 of [1-9][0-9]* checks failed" "$dir/ops.log"; then
  echo "ok: $(tail -n 1 "$dir/ops.log") (emulate)"
else
  fail "check_ops emulate: $(tail -n 3 "$dir/ops.log")"
fi

expect_error "no emulated plugin" \
  "train.device = emulate: cannot load the emulated-device plugin $dir/none.so" \
  env DYNMO_EMULATE_PLUGIN="$dir/none.so" "$DYNMO" train --config "$dir/dense-cpu.ini" \
  train.device=emulate
finish
