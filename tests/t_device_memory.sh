#!/usr/bin/env bash
# Device-resident tensors (docs/gpu.md), proved on the strict emulated
# device (train.device = emulate; kernels/emulate.c): its memory is an
# arena the host cannot touch outside the table's entries, and its ops
# refuse host pointers, so a run that finishes read and wrote the model's
# tensors only through the table and explicit copies.
# - the arena traps: the host reading a device tensor dies naming "host
#   read of device memory" (and with DYNMO_EMULATE_STRICT=0 the same read
#   goes through, so the check can fail); an op handed host memory stops;
# - 20-step strict runs against the CPU's, losses within 1e-4 relative:
#   one rank (with validation), 2 stages static and balanced (migrating
#   every step; bit-identical to each other), 2 replicas, 2 x 2; hash
#   attention, mixture of depths (causal on 2 stages migrating, top-k
#   with hash attention), early exit (softmax on 2 migrating stages with
#   validation, saturation; tokens exit), pruning (CSR on 2 migrating
#   stages, masked on 2 replicas; resumed past its first step), mixture
#   of experts (softmax with capacity and both losses on 2 migrating
#   stages, sigmoid with bias on 2 replicas) and freezing;
# - a checkpoint chain emulate -> cpu -> emulate, the last losses within
#   1e-4 of the uninterrupted CPU run;
# - a MoD and an MoE checkpoint written there resumed on the CPU;
# - expert parallelism (parallel.ep = 2, its exchange staged through host
#   buffers): pp=2 dp=2 and pp=1 dp=4 (two expert groups) against the
#   CPU's losses, each bit-identical to ep=1 on the strict device (as on
#   the CPU, t_moe_ep.sh), pp=2 dp=2 balanced (migrating every step)
#   bit-identical to static, and a checkpoint written with ep=2 there
#   resumed on the CPU;
# - the staging pool: with DYNMO_EMULATE_ALLOC_COUNTS=1 the emulator counts
#   the model's alloc and alloc_host calls; a pp=2 dp=2 ep=2 run (the tied
#   exchange, the replica sums, the expert exchange) and a MoD run (its
#   choice and row staging) make as many in 5 steps as in 2: steps after
#   the first allocate nothing;
# - early exit's confidence computed on the device: a step of early exit
#   (softmax, saturation) copies to the host less than one exiting
#   block's probabilities or rows of one micro-batch would (the emulator
#   also counts the bytes the model copies down, same variable);
# - MoD's copies: the emulator also counts the bytes copied down; a step
#   of a one-rank MoD run (3 blocks, 4 micro-batches) copies down at most
#   the dense step's plus, per MoD block and micro-batch, the choice (B*T
#   ints): its activations stay on the device, and the MLP predictor's
#   gradient is formed and added where the slab lives (the linear
#   predictor's weight and gradient, 2 C floats, used to come down).
# - MoE's combine and its backward on the device (local experts, ep = 1):
#   a step copies to the device and to the host less than one N x C
#   tensor per MoE block and micro-batch (only the routing's arrays
#   cross).
# - checkpoints: a save copies each block's slab and the embedding's down
#   once (its sparsity taken from the copy it writes), 6 blocks or 12,
#   dense or pruned into CSR, and a save and a load each allocate one
#   staging buffer whatever the block count.
# - MoE's routing and its backward on the device: a step copies at most
#   the dense step's plus, per MoE block and micro-batch, the choice, the
#   chosen scores and the losses' sums down and the assignment (rows,
#   tokens, counts, bias) up; the logits and their gradient stay there.
# - pruning on the device: a pruning step copies down the radix select's
#   histograms and the blocks' masks, and up at most the pruned weights'
#   indices, never a block's slab.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
plugin=$(dirname "$DYNMO")/libdynmo_emulate.so
[ -f "$plugin" ] || { echo "FAIL: no $plugin (make builds it)"; exit 1; }
unset DYNMO_EMULATE_STRICT
. "$(dirname "$0")/device_lib.sh"

# the arena and the op-argument checks; strict is the default
DYNMO_EMULATE_PLUGIN=$plugin "$BUILD/gpu/check_ops" emulate 2>&1 | head -n 1 | grep -q "trapping arena" \
  && echo "ok: the emulated device is the strict one by default" \
  || fail "the emulated device does not describe itself as the trapping arena"
out=$(DYNMO_EMULATE_PLUGIN=$plugin "$BUILD/gpu/check_ops" emulate --host-read 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "host read of device memory at 0x" <<<"$out"; then
  echo "ok: a host read of a device tensor dies (exit $rc): $(grep -m1 'host read' <<<"$out" | cut -c1-60)..."
else
  fail "host read of device memory: exit $rc, not trapped: $(tail -n 2 <<<"$out")"
fi
out=$(DYNMO_EMULATE_STRICT=0 DYNMO_EMULATE_PLUGIN=$plugin "$BUILD/gpu/check_ops" emulate \
      --host-read 2>&1)
grep -q "nothing trapped it" <<<"$out" && echo "ok: with DYNMO_EMULATE_STRICT=0 the same read goes through" \
  || fail "DYNMO_EMULATE_STRICT=0: the host read did not go through: $(tail -n 2 <<<"$out")"
out=$(DYNMO_EMULATE_PLUGIN=$plugin "$BUILD/gpu/check_ops" emulate --host-pointer 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "gelu_forward: pointer argument .* is host memory" <<<"$out"; then
  echo "ok: an op handed host memory stops (exit $rc)"
else
  fail "an op handed host memory: exit $rc: $(tail -n 2 <<<"$out")"
fi

# compare NAME RANKS [key=value...]: NAME on the CPU and on the strict emulated device
compare() {
  local name=$1 ranks=$2; shift 2
  run "$name-cpu" "$ranks" train.device=cpu "$@" || return 1
  run "$name-emu" "$ranks" train.device=emulate "$@" || return 1
  if out=$(close "$name-cpu" "$name-emu"); then echo "ok: $name strict emulate vs cpu: $out"
  else fail "$name strict emulate vs cpu: $out"; return 1; fi
}

compare dense 1 train.eval_every=5 train.eval_batches=2
compare pp2 2 parallel.pp=2
compare balanced 2 parallel.pp=2 balance.method=random balance.every=1 && {
  grep -q "migrated" "$dir/balanced-emu.out" || fail "the balanced run never migrated"
  cmp -s "$dir/pp2-emu.steps.loss" "$dir/balanced-emu.steps.loss" \
    && echo "ok: strict emulate, 2 ranks: static and balanced (migrating every step) bit-identical" \
    || fail "strict emulate: balanced losses differ from static"
}
compare dp2 2 parallel.dp=2
compare pp2dp2 4 parallel.pp=2 parallel.dp=2
compare hash 2 parallel.pp=2 model.attention=hash hash.buckets=4
compare mod 2 parallel.pp=2 balance.method=random balance.every=1 model.mod_every=2 \
  model.mod_capacity=0.25 mod.routing=causal
compare mod_hash 1 model.mod_every=2 model.mod_capacity=0.25 model.attention=hash hash.buckets=4
compare exit_softmax 2 parallel.pp=2 balance.method=random balance.every=1 dyn.kind=early_exit \
  dyn.exit_from=1 dyn.exit_threshold=0.0005 dyn.exit_warmup=2 train.eval_every=10
compare exit_saturation 2 parallel.pp=2 dyn.kind=early_exit dyn.exit_from=1 \
  dyn.exit_threshold=0.9 dyn.exit_confidence=saturation dyn.exit_loss_weight=0.5
for name in exit_softmax exit_saturation; do
  grep -q "skipped [1-9][0-9.]*% token-blocks" "$dir/$name-emu.out" \
    && echo "ok: $name: tokens exited on the strict device ($(grep -o 'skipped [0-9.]*%' "$dir/$name-emu.out" | tail -n 1))" \
    || fail "$name: no token exited on the strict device"
done
P="dyn.kind=prune dyn.prune_start=2 dyn.prune_every=2 dyn.prune_steps=4 dyn.sparsity_final=0.8"
compare prune_csr 2 $P dyn.csr_sparsity=0.5 parallel.pp=2 balance.method=random balance.every=1 \
  && { grep -q "here: [1-9][0-9]*/[0-9]* blocks in CSR" "$dir/prune_csr-emu.out" \
         && echo "ok: prune_csr: blocks in CSR on the strict device" \
         || fail "prune_csr: no block in CSR on the strict device"; }
compare prune_masked 2 $P dyn.csr_sparsity=0.95 parallel.dp=2
compare moe 2 parallel.pp=2 balance.method=random balance.every=1 model.moe_every=2 \
  model.experts=4 model.top_k=2 moe.capacity_factor=1.25 moe.aux_loss=0.1 moe.z_loss=0.001
compare moe_sigmoid 2 parallel.dp=2 model.moe_every=1 model.experts=4 model.top_k=2 \
  moe.router=sigmoid moe.bias_rate=0.01 moe.capacity_factor=1.25 moe.drop=position
compare freeze 2 parallel.pp=2 dyn.kind=freeze dyn.freeze_window=1 dyn.freeze_every=2 \
  dyn.freeze_threshold=100 dyn.freeze_per_check=1 && {
  grep -q 'frozen [1-9]' "$dir/freeze-emu.out" && echo "ok: freezing froze blocks on the strict device" \
    || fail "freeze: nothing froze on the strict device"
}

# a checkpoint chain: emulate (to step 10) -> cpu (to 15) -> emulate (to 20)
run chain-1 1 train.device=emulate ckpt.dir="$dir/chain-ck1" ckpt.every=10 && \
run chain-2 1 train.device=cpu ckpt.dir="$dir/chain-ck2" ckpt.every=5 \
    ckpt.resume="$dir/chain-ck1/ckpt-10.h5" && \
run chain-3 1 train.device=emulate ckpt.dir="$dir/chain-ck3" \
    ckpt.resume="$dir/chain-ck2/ckpt-15.h5" && {
  if out=$(close dense-cpu chain-2 10); then echo "ok: checkpoint emulate -> cpu: $out"
  else fail "checkpoint emulate -> cpu: $out"; fi
  if out=$(close dense-cpu chain-3 5); then echo "ok: checkpoint cpu -> emulate: $out"
  else fail "checkpoint cpu -> emulate: $out"; fi
}

# a MoD checkpoint (its router and predictor in the slab) from the strict
# device resumed on the CPU
M="model.mod_every=2 model.mod_capacity=0.25 mod.routing=causal"
run modck-1 1 train.device=emulate $M ckpt.dir="$dir/modck" ckpt.every=10 && \
run modck-2 1 train.device=cpu $M ckpt.dir="$dir/modck2" ckpt.resume="$dir/modck/ckpt-10.h5" && {
  if out=$(close mod-cpu modck-2 10); then echo "ok: MoD checkpoint emulate -> cpu: $out"
  else fail "MoD checkpoint emulate -> cpu: $out"; fi
}

# pruning resumed past its first step on the strict device (the masks and
# CSR rebuilt from the checkpoint's zeros): steps 15 to 20 as the CPU's
run prck-1 1 train.device=emulate $P dyn.csr_sparsity=0.5 ckpt.dir="$dir/prck" ckpt.every=7 && \
run prck-2 1 train.device=emulate $P dyn.csr_sparsity=0.5 ckpt.dir="$dir/prck2" \
    ckpt.resume="$dir/prck/ckpt-14.h5" && \
run prune-cpu 1 train.device=cpu $P dyn.csr_sparsity=0.5 && {
  if out=$(close prune-cpu prck-2 6); then echo "ok: pruning resumed on the strict device: $out"
  else fail "pruning resumed on the strict device: $out"; fi
}

# an MoE checkpoint (router, experts, bias and counts) from the strict
# device resumed on the CPU
M="model.moe_every=2 model.experts=4 model.top_k=2 moe.capacity_factor=1.25 moe.aux_loss=0.1"
M="$M moe.z_loss=0.001"
run moeck-1 1 train.device=emulate $M ckpt.dir="$dir/moeck" ckpt.every=10 && \
run moeck-2 1 train.device=cpu $M ckpt.dir="$dir/moeck2" ckpt.resume="$dir/moeck/ckpt-10.h5" && {
  if out=$(close moe-cpu moeck-2 10); then echo "ok: MoE checkpoint emulate -> cpu: $out"
  else fail "MoE checkpoint emulate -> cpu: $out"; fi
}

# expert parallelism on the strict device: its rows, products and
# gradient sums in device memory, MPI through host staging; 8 steps
E="model.moe_every=2 model.experts=4 model.top_k=2 moe.capacity_factor=1.25 moe.aux_loss=0.1"
E="$E moe.z_loss=0.001 train.steps=8"
compare moe_ep 4 parallel.pp=2 parallel.dp=2 parallel.ep=2 $E && \
run moe_ep1-emu 4 train.device=emulate parallel.pp=2 parallel.dp=2 parallel.ep=1 $E && {
  cmp -s "$dir/moe_ep-emu.steps.loss" "$dir/moe_ep1-emu.steps.loss" \
    && echo "ok: strict emulate, pp=2 dp=2: ep=2 and ep=1 losses bit-identical" \
    || fail "strict emulate, pp=2 dp=2: ep=2 losses differ from ep=1"
}
run moe_ep_random-emu 4 train.device=emulate parallel.pp=2 parallel.dp=2 parallel.ep=2 $E \
    balance.method=random balance.every=1 && {
  grep -q "migrated" "$dir/moe_ep_random-emu.out" || fail "the balanced ep=2 run never migrated"
  cmp -s "$dir/moe_ep-emu.steps.loss" "$dir/moe_ep_random-emu.steps.loss" \
    && echo "ok: strict emulate, ep=2: balanced (migrating expert shards every step) and static bit-identical" \
    || fail "strict emulate, ep=2: balanced losses differ from static"
}
D="parallel.pp=1 parallel.dp=4 train.micro_batches=2 moe.router=sigmoid moe.bias_rate=0.01"
compare moe_ep_groups 4 $D parallel.ep=2 $E && \
run moe_ep_groups1-emu 4 train.device=emulate $D parallel.ep=1 $E && {
  cmp -s "$dir/moe_ep_groups-emu.steps.loss" "$dir/moe_ep_groups1-emu.steps.loss" \
    && echo "ok: strict emulate, pp=1 dp=4 (two expert groups): ep=2 and ep=1 losses bit-identical" \
    || fail "strict emulate, pp=1 dp=4: ep=2 losses differ from ep=1"
}

# a checkpoint written with ep=2 on the strict device (each expert's rows
# by its owner) resumed on the CPU: steps 5 to 8 as the CPU's
run moe_epck-1 4 train.device=emulate parallel.pp=2 parallel.dp=2 parallel.ep=2 $E \
    ckpt.dir="$dir/moe_epck" ckpt.every=4 && \
run moe_epck-2 4 train.device=cpu parallel.pp=2 parallel.dp=2 parallel.ep=2 $E \
    ckpt.dir="$dir/moe_epck2" ckpt.resume="$dir/moe_epck/ckpt-4.h5" && {
  if out=$(close moe_ep-cpu moe_epck-2 4); then echo "ok: ep=2 checkpoint emulate -> cpu: $out"
  else fail "ep=2 checkpoint emulate -> cpu: $out"; fi
}

# counted NAME RANKS [key=value...]: NAME for 2 and for 5 steps on the
# strict device with DYNMO_EMULATE_ALLOC_COUNTS=1, the output of each in
# $dir/NAME2.out, $dir/NAME5.out
counted() {
  local name=$1 ranks=$2 steps; shift 2
  for steps in 2 5; do
    tiny_config "$dir/$name$steps.ini" "run.out_dir=$dir/$name$steps" train.device=emulate "$@" \
      train.steps=$steps > "$dir/$name$steps.ini"
    DYNMO_EMULATE_ALLOC_COUNTS=1 timeout -k 10 180 mpiexec -n "$ranks" "$DYNMO" train \
      --config "$dir/$name$steps.ini" > "$dir/$name$steps.out" 2>&1 || fail "$name$steps: exit $?"
  done
}

# the staging pool: the model's device and host allocations, per rank, the
# same after 5 steps as after 2 (pool NAME RANKS [key=value...])
pool() {
  local name=$1 ranks=$2 steps
  counted "$@"
  for steps in 2 5; do
    grep "^emulate: .* allocations" "$dir/$name$steps.out" | sort > "$dir/$name$steps.counts"
  done
  if [ "$(wc -l < "$dir/${name}2.counts")" -eq "$ranks" ] &&
     cmp -s "$dir/${name}2.counts" "$dir/${name}5.counts"; then
    echo "ok: $name: each of $ranks ranks allocates as much in 5 steps as in 2 (lines like '$(head -n 1 "$dir/${name}5.counts" | cut -c10-)')"
  else
    fail "$name: allocations after 2 steps [$(tr '\n' ';' < "$dir/${name}2.counts")], after 5 [$(tr '\n' ';' < "$dir/${name}5.counts")]"
  fi
}
# blocks moving every step: their slabs' host staging comes from the
# pool (grown at least twofold), so 12 steps of random layouts on 2
# stages allocate at most 12 more host buffers over both ranks than 12
# static steps (2 ranks x 2 directions x 3 growths), where one a moving
# block on each of its two ranks, as before, would be 2 per block moved
host_allocs() { sed -n 's/^emulate: .* \([0-9]*\) host allocations$/\1/p' "$1" | awk '{s += $1} END {print s + 0}'; }
for method in none random; do
  tiny_config "$dir/moving-$method.ini" "run.out_dir=$dir/moving-$method" train.device=emulate \
    parallel.pp=2 balance.method=$method balance.every=1 train.steps=12 > "$dir/moving-$method.ini"
  DYNMO_EMULATE_ALLOC_COUNTS=1 timeout -k 10 180 mpiexec -n 2 "$DYNMO" train \
    --config "$dir/moving-$method.ini" > "$dir/moving-$method.out" 2>&1 || fail "moving-$method: exit $?"
done
static=$(host_allocs "$dir/moving-none.out") moving=$(host_allocs "$dir/moving-random.out")
moved=$(grep -o 'migrated [0-9]* blocks' "$dir/moving-random.out" | awk '{s += $2} END {print s + 0}')
if [ "$moved" -ge 8 ] && [ "$static" -gt 0 ] && [ $((moving - static)) -le 12 ]; then
  echo "ok: 12 steps moving $moved blocks allocate $((moving - static)) more host buffers than static ones (at most 12)"
else
  fail "12 steps moving $moved blocks: $moving host allocations against $static static (want at most 12 more, 8+ blocks moved)"
fi
pool "staging pool, pp=2 dp=2 ep=2" 4 parallel.pp=2 parallel.dp=2 parallel.ep=2 $E
pool "staging, pp=2 MoD causal" 2 parallel.pp=2 model.mod_every=2 model.mod_capacity=0.25 \
  mod.routing=causal

# per_step NAME [key=value...]: $up and $down = the bytes one step of a
# one-rank run copies to the device and to the host, (5 steps - 2 steps)
# / 3, from the emulator's counts (-1 when it printed none)
per_step() {
  local name=$1 two five; shift
  counted "$name" 1 "$@"
  two=$(sed -n 's/^emulate: \([0-9]*\) bytes copied to the device, .*/\1/p' "$dir/${name}2.out")
  five=$(sed -n 's/^emulate: \([0-9]*\) bytes copied to the device, .*/\1/p' "$dir/${name}5.out")
  up=-1
  [ -n "$two" ] && [ -n "$five" ] && up=$(( (five - two) / 3 ))
  two=$(sed -n 's/^emulate: .*, \([0-9]*\) bytes copied to the host$/\1/p' "$dir/${name}2.out")
  five=$(sed -n 's/^emulate: .*, \([0-9]*\) bytes copied to the host$/\1/p' "$dir/${name}5.out")
  down=-1
  [ -n "$two" ] && [ -n "$five" ] && down=$(( (five - two) / 3 ))
}

# early exit's confidence on the device: only the active tokens'
# confidences come down, so a whole step copies to the host less than
# one exiting block's probabilities (N V floats) or input and output rows
# (2 N C) of one micro-batch (N = 64 tokens, C = 32, V = 256). Copying
# those down for every exiting block and micro-batch took about 1 MB
# (softmax) and 260 kB (saturation) per step here; the confidences take
# 9 kB and 3 kB with everything else (copied NAME LIMIT WAYS [key=value...]:
# WAYS "host", "device" or both; under NAME LIMIT WAYS: the same check of
# the $up and $down a per_step left)
copied() {
  local name=$1 limit=$2 ways=$3; shift 3
  per_step "$name" "$@"
  under "$name" "$limit" "$ways"
}
under() {
  local name=$1 limit=$2 ways=$3 way bytes
  for way in $ways; do
    bytes=$down; [ "$way" = device ] && bytes=$up
    if [ "$bytes" -ge 0 ] && [ "$bytes" -lt "$limit" ]; then
      echo "ok: $name: $bytes bytes copied to the $way per step (under $limit)"
    else
      fail "$name: $bytes bytes copied to the $way per step, not under $limit"
    fi
  done
}
copied "early exit softmax copies down" $((64 * 256 * 4)) host dyn.kind=early_exit \
  dyn.exit_from=1 dyn.exit_threshold=0.0005 dyn.exit_warmup=1
copied "early exit saturation copies down" $((2 * 64 * 32 * 4)) host dyn.kind=early_exit \
  dyn.exit_from=1 dyn.exit_threshold=0.9 dyn.exit_confidence=saturation

# MoD's activations stay on the device: per MoD block and micro-batch only
# the choice (B*T ints) crosses
per_step copies-dense; dense_up=$up dense_down=$down dense=$down
per_step copies-mod model.mod_every=2 model.mod_capacity=0.25 mod.routing=causal; mod=$down
N=64   # the tiny model's micro-batch of 2 x 32 tokens
most=$(( 3 * 4 * N * 4 ))
if [ "$dense" -gt 0 ] && [ "$mod" -gt 0 ] && [ $(( mod - dense )) -le "$most" ]; then
  echo "ok: a MoD step copies down $mod bytes, the dense step $dense: $(( mod - dense )) more (at most $most; activations stay on the device)"
else
  fail "a MoD step copies down $mod bytes, the dense step $dense: more than $most bytes more"
fi

# MoE with local experts (ep = 1) combines on the device: per MoE block
# and micro-batch only the routing crosses (the logits, N E floats, and
# dgate, N k, down; gate and row, N k each, the grouped rows' tokens and
# dlogits up), so a step copies each way less than one N x C tensor per
# MoE block and micro-batch (3 blocks x 4 micro-batches x 64 tokens x 32
# channels). Combining on the host (y, res1, dout and dx down; out, dy
# and d_ln2 up) took 364 kB up and 507 kB down per step here; the routing
# takes 31 kB and 19 kB with everything else. (The same run serves the
# check of the softmax router's routing below.)
per_step copies-moe-softmax model.moe_every=2 model.experts=4 model.top_k=2 moe.router=softmax \
  moe.capacity_factor=1.25 moe.aux_loss=0.1 moe.z_loss=0.001
softmax_up=$up softmax_down=$down
under "MoE ep=1 copies" $((3 * 4 * 64 * 32 * 4)) "device host"
# Checkpoints on the device: a save copies each slab down once (a block's
# sparsity comes from the copy of its rows), through one staging buffer
# for the whole save, and a load copies them up through one. saved NAME
# LAYERS STEPS [key=value...]: one rank, STEPS steps, without and with a
# checkpoint at the end; $save_down and $save_hosts = what saving added
# to the bytes copied to the host and to the host allocations.
down_bytes() { sed -n 's/^emulate: .*, \([0-9]*\) bytes copied to the host$/\1/p' "$1"; }
saved() {
  local name=$1 layers=$2 steps=$3 kind; shift 3
  for kind in none ckpt; do
    local extra=(); [ $kind = ckpt ] && extra=("ckpt.dir=$dir/$name-ck")
    tiny_config "$dir/$name-$kind.ini" "run.out_dir=$dir/$name-$kind" train.device=emulate \
      model.layers=$layers train.steps=$steps "$@" ${extra[@]+"${extra[@]}"} > "$dir/$name-$kind.ini"
    DYNMO_EMULATE_ALLOC_COUNTS=1 timeout -k 10 180 mpiexec -n 1 "$DYNMO" train \
      --config "$dir/$name-$kind.ini" > "$dir/$name-$kind.out" 2>&1 || fail "$name-$kind: exit $?"
  done
  save_down=$(( $(down_bytes "$dir/$name-ckpt.out") - $(down_bytes "$dir/$name-none.out") ))
  save_hosts=$(( $(host_allocs "$dir/$name-ckpt.out") - $(host_allocs "$dir/$name-none.out") ))
}
# the tiny model's slabs: a block's params, grads, m and v (12 C^2 + 13 C
# floats each, C = 32), the embedding's [wte wpe lnf_w lnf_b] (V = 256,
# T = 32) four times. The old code copied each block's slab down twice
# (6 blocks: 2587648 bytes, 12: 5026816) and allocated staging per copy
# (13 and 25 host buffers); once is 1368064 and 2587648 bytes.
slab=$(( 4 * 4 * (12 * 32 * 32 + 13 * 32) )) embed=$(( 4 * 4 * (256 * 32 + 32 * 32 + 2 * 32) ))
saved ckpt6 6 2; down6=$save_down hosts6=$save_hosts
saved ckpt12 12 2; down12=$save_down hosts12=$save_hosts
saved ckpt_prune 6 10 $P dyn.csr_sparsity=0.5; down_prune=$save_down hosts_prune=$save_hosts
grep -q "here: [1-9][0-9]*/[0-9]* blocks in CSR" "$dir/ckpt_prune-ckpt.out" \
  || fail "checkpoint of a pruned run: no block in CSR when it saved"
for entry in "6|6 blocks|$down6" "12|12 blocks|$down12" "6|6 pruned blocks (CSR)|$down_prune"; do
  IFS='|' read -r blocks what bytes <<<"$entry"
  most=$(( blocks * slab + embed ))
  if [ "$bytes" -gt 0 ] && [ "$bytes" -le "$most" ]; then
    echo "ok: a save of $what copies $bytes bytes down (each slab once: at most $most)"
  else
    fail "a save of $what copies $bytes bytes down, more than each slab once ($most)"
  fi
done
if [ "$hosts6" -ge 1 ] && [ "$hosts6" -le 2 ] && [ "$hosts12" -eq "$hosts6" ] &&
   [ "$hosts_prune" -eq "$hosts6" ]; then
  echo "ok: a save allocates $hosts6 host buffer(s) for 6 blocks, 12, or 6 pruned"
else
  fail "host buffers a save allocates: $hosts6 for 6 blocks, $hosts12 for 12, $hosts_prune for 6 pruned (want the same, at most 2)"
fi
# a load (and the save at the end of the resumed run): as many host
# buffers with 12 blocks as with 6
for layers in 6 12; do
  tiny_config "$dir/resumed$layers.ini" "run.out_dir=$dir/resumed$layers" train.device=emulate \
    model.layers=$layers train.steps=3 "ckpt.dir=$dir/resumed$layers-ck" \
    "ckpt.resume=$dir/ckpt$layers-ck/ckpt-2.h5" > "$dir/resumed$layers.ini"
  DYNMO_EMULATE_ALLOC_COUNTS=1 timeout -k 10 180 mpiexec -n 1 "$DYNMO" train \
    --config "$dir/resumed$layers.ini" > "$dir/resumed$layers.out" 2>&1 || fail "resumed$layers: exit $?"
done
hosts6=$(host_allocs "$dir/resumed6.out") hosts12=$(host_allocs "$dir/resumed12.out")
grep -q "^step 3/3" "$dir/resumed12.out" || fail "resumed12: no step 3"
if [ "$hosts6" -gt 0 ] && [ "$hosts12" -eq "$hosts6" ]; then
  echo "ok: a run resumed (load and save) allocates $hosts6 host buffers with 6 blocks and with 12"
else
  fail "a run resumed (load and save) allocates $hosts6 host buffers with 6 blocks, $hosts12 with 12"
fi

# MoE's routing on the device (route_topk_forward, _sums, _backward): per
# MoE block and micro-batch at most the choice and the chosen scores (2 N
# k ints and floats) and the losses' sums (E + 1 doubles) come down, and
# at most the rows, the grouped rows' tokens (2 N k ints), the pairs per
# expert and the sigmoid router's bias (2 E) go up, beyond the dense
# step's copies; nothing crosses in the backward. Routing on the host
# (the logits and dgate down; gates, rows, tokens and dlogits up) took
# 31261 bytes up and 19456 down per step with capacity and both losses
# here, and fails it; the device's routing takes 13021 and 13621. (routed
# NAME: the check of the $up and $down of a step with NAME's router,
# against the dense step's copies-dense above.)
N=64 C=32 K=2 E=4 blocks=$((3 * 4))
routed() {
  local name=$1
  most_down=$(( dense_down + blocks * (2 * N * K * 4 + (E + 1) * 8) ))
  most_up=$(( dense_up + blocks * (2 * N * K + 2 * E) * 4 ))
  if [ "$down" -gt "$dense_down" ] && [ "$down" -le "$most_down" ] && [ "$up" -le "$most_up" ]; then
    echo "ok: MoE $name routing on the device: $up bytes up (at most $most_up), $down down (at most $most_down) per step"
  else
    fail "MoE $name: $up bytes up per step (at most $most_up), $down down (at most $most_down, more than $dense_down): the routing crosses"
  fi
}
up=$softmax_up down=$softmax_down
routed softmax   # copies-moe-softmax, the MoE ep=1 run above
per_step copies-moe-sigmoid model.moe_every=2 model.experts=$E model.top_k=$K moe.router=sigmoid \
  moe.bias_rate=0.01 moe.capacity_factor=1.25 moe.drop=position moe.aux_loss=0.1
routed sigmoid
# Pruning on the device (prune_histogram, prune_mask; src/dyn/prune.c):
# a pruning step copies down only the radix select's histograms (8 rounds
# of 256 counts) and each block's mask (12 C^2 bytes), and up only what
# the masked or CSR form needs (at most the pruned weights' indices, 4
# bytes each, on the first step, which keeps the blocks dense), beyond a
# step that prunes nothing. Keys and masks made on the host (each block's
# slab down three times and up once) took 1358028 bytes up and 3659776
# down for the first pruning step here, and fail it; the device's take
# 138444 and 91136. (bytes_after NAME STEPS: $up $down of a STEPS-step
# one-rank pruned run)
bytes_after() {
  tiny_config "$dir/$1.ini" "run.out_dir=$dir/$1" train.device=emulate train.steps=$2 $P \
    dyn.csr_sparsity=0.5 > "$dir/$1.ini"
  DYNMO_EMULATE_ALLOC_COUNTS=1 timeout -k 10 180 mpiexec -n 1 "$DYNMO" train \
    --config "$dir/$1.ini" > "$dir/$1.out" 2>&1 || fail "$1: exit $?"
  up=$(sed -n 's/^emulate: \([0-9]*\) bytes copied to the device, .*/\1/p' "$dir/$1.out")
  down=$(sed -n 's/^emulate: .*, \([0-9]*\) bytes copied to the host$/\1/p' "$dir/$1.out")
  up=${up:--1} down=${down:--1}
}
declare -a ups downs
for steps in 3 4 5 6 7; do
  bytes_after "prune-bytes$steps" $steps; ups[steps]=$up downs[steps]=$down
done
C=32 blocks=6
plain_up=$(( ups[4] - ups[3] )) plain_down=$(( downs[4] - downs[3] ))
most_down=$(( plain_down + blocks * 12 * C * C + 8 * 256 * 8 ))
most_up=$(( plain_up + blocks * 12 * C * C * 4 ))
first_up=$(( ups[5] - ups[4] )) first_down=$(( downs[5] - downs[4] ))
csr_down=$(( downs[7] - downs[6] ))
grep -q "^step 7/7 .*here: 6/6 blocks in CSR" "$dir/prune-bytes7.out" \
  || fail "pruning bytes: the blocks are not in CSR after step 7"
if [ "${ups[3]}" -gt 0 ] && [ "$first_up" -le "$most_up" ] && [ "$first_down" -le "$most_down" ] \
   && [ "$csr_down" -le "$most_down" ]; then
  echo "ok: a pruning step on the device: $first_up bytes up (at most $most_up), $first_down down (at most $most_down; $csr_down going to CSR)"
else
  fail "a pruning step: $first_up bytes up (at most $most_up), $first_down down and $csr_down going to CSR (at most $most_down): slabs cross"
fi
finish
