#!/usr/bin/env bash
# balance.units = sublayer (docs/balance.md, "Units of placement") with
# the schemes whose state reaches into both halves of a block or lives in
# one: pruning (each stage masks its halves' matrices, the global cut
# stays that of whole blocks, a block split over two stages holds its
# whole mask on both) and mixture of experts (router, experts and MoE
# state in the MLP unit). On 2 stages (a boundary inside a block), on 3
# (3,4,3 units: inside blocks 1 and 3) static, under zb and while units
# migrate (balance.method = random every step or every 2), and on 4
# migrating every step, the losses, gradient norms and the scheme's
# signals of one rank bit for bit; their checkpoints resume bit for bit.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
need_dynmo
work_dir

units=(balance.units=sublayer)
migrated() { grep -qE "migrated [0-9]+ units" "$dir/$1.out" || fail "$1: no units migrated"; }

# layouts NAME WHAT DATASET...: $dir/NAME.ini with units 3,4,3 on 3
# stages (NAME_static3, with the options in static_extra), the same
# re-laid out at random every step (NAME3, random_extra), random every
# step on 4 stages (NAME4) and zb with 3,4,3 on 3 (NAME_zb), each
# against NAME1's bits of DATASET...
layouts() {
  local name=$1 what=$2; shift 2
  local ini=$dir/$name.ini moving=(balance.method=random balance.every=1)
  train "${name}_static3" 3 "$ini" "${units[@]}" parallel.pp=3 balance.initial=explicit:3,4,3 \
    "${static_extra[@]}" && bits "${name}_static3" "$@" &&
    same "${name}1" "${name}_static3" "$what, 3,4,3 units on 3 stages" "$@"
  train "${name}3" 3 "$ini" "${units[@]}" parallel.pp=3 balance.initial=explicit:3,4,3 \
    "${moving[@]}" "${random_extra[@]}" && migrated "${name}3" && bits "${name}3" "$@" &&
    same "${name}1" "${name}3" "$what, 3,4,3 units on 3 stages, random every step" "$@"
  # a stage may hold one half alone
  train "${name}4" 4 "$ini" "${units[@]}" parallel.pp=4 "${moving[@]}" && migrated "${name}4" &&
    bits "${name}4" "$@" && same "${name}1" "${name}4" "$what, random every step on 4 stages" "$@"
  train "${name}_zb" 3 "$ini" "${units[@]}" parallel.pp=3 parallel.schedule=zb \
    balance.initial=explicit:3,4,3 && bits "${name}_zb" "$@" &&
    same "${name}1" "${name}_zb" "$what, zb, 3,4,3 units on 3 stages" "$@"
}

# Pruning to 80% at steps 2 and 4, in CSR from 50%: one rank with units
# against whole blocks, then 5,5 units on 2 stages re-laid out every 2
# steps and the layouts, against one rank; the checkpoint at step 6 of
# 3,4,3 units migrating (blocks pruned, in CSR) resumed on 2 stages.
pruned=(steps/loss steps/grad_norm layers/sparsity)
tiny_config "$dir/prune.ini" model.layers=5 train.steps=8 train.grad_clip=0.05 \
  dyn.kind=prune dyn.prune_start=2 dyn.prune_every=2 dyn.prune_steps=2 \
  dyn.sparsity_final=0.8 dyn.csr_sparsity=0.5
train prune1 1 "$dir/prune.ini" "${units[@]}" && bits prune1 "${pruned[@]}"
/usr/bin/python3 - "$dir/prune1/runlog.h5" <<'PY' || fail "pruning with units: not pruned to 80%"
import sys, h5py
s = h5py.File(sys.argv[1], 'r')['/layers/sparsity'][:]
assert abs(s[-1].mean() - 0.8) < 0.01 and (s[0] == 0).all(), s
print("ok: pruning with units: sparsity %.3f at the end" % s[-1].mean())
PY
grep -q "5/5 blocks in CSR" "$dir/prune1.out" || fail "prune1: the blocks are not in CSR"
train prune_whole 1 "$dir/prune.ini" && bits prune_whole "${pruned[@]}" &&
  same prune1 prune_whole "pruning, units against whole blocks on one rank" "${pruned[@]}"
train prune2 2 "$dir/prune.ini" "${units[@]}" parallel.pp=2 balance.initial=explicit:5,5 \
  balance.method=random balance.every=2 && migrated prune2 && bits prune2 "${pruned[@]}" &&
  same prune1 prune2 "pruning, 5,5 units on 2 stages, random every 2 steps" "${pruned[@]}"
static_extra=() random_extra=(ckpt.dir="$dir/prune_ck" ckpt.every=6)
layouts prune pruning "${pruned[@]}"
train prune_resumed 2 "$dir/prune.ini" "${units[@]}" parallel.pp=2 \
  balance.initial=explicit:3,7 ckpt.resume="$dir/prune_ck/ckpt-6.h5" &&
  same_tail prune3 prune_resumed 2 "pruning, a sublayer checkpoint at step 6 resumed on 2 stages"

# Mixture of experts: the router, the experts and the MoE state (the
# sigmoid router's bias, the counts) are the MLP unit's. MoE blocks 1 and
# 3 of 4 experts (top-2, the sigmoid router and its bias): 3,7 units on 2
# stages (block 1 split) re-laid out every 2 steps and the layouts,
# against one rank: losses, gradient norms, expert counts and biases.
moed=(steps/loss steps/grad_norm moe/tokens moe/dropped moe/bias)
tiny_config "$dir/moe.ini" model.layers=5 train.steps=8 train.grad_clip=0.05 \
  model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=64 \
  moe.router=sigmoid moe.bias_rate=0.01 moe.capacity_factor=1.25 moe.drop=probs
train moe1 1 "$dir/moe.ini" "${units[@]}" && bits moe1 "${moed[@]}"
train moe2 2 "$dir/moe.ini" "${units[@]}" parallel.pp=2 balance.initial=explicit:3,7 \
  balance.method=random balance.every=2 && migrated moe2 && bits moe2 "${moed[@]}" &&
  same moe1 moe2 "MoE, 3,7 units on 2 stages, random every 2 steps" "${moed[@]}"
static_extra=(ckpt.dir="$dir/moe_ck" ckpt.every=4) random_extra=()
layouts moe MoE "${moed[@]}"
# 2 replicas (the counts summed over them) of 2 stages whose units
# migrate every step, against 2 replicas of one stage
train moe_dp 2 "$dir/moe.ini" "${units[@]}" parallel.dp=2 && bits moe_dp "${moed[@]}" &&
  train moe_dp4 4 "$dir/moe.ini" "${units[@]}" parallel.dp=2 parallel.pp=2 \
    balance.method=random balance.every=1 && migrated moe_dp4 && bits moe_dp4 "${moed[@]}" &&
  same moe_dp moe_dp4 "MoE, 2 replicas of 2 stages, random every step" "${moed[@]}"

# moe_static3's checkpoint at step 4 (MoE blocks 1 and 3 split, each
# written whole by its attention's stage with its MLP's floats and MoE
# state):
# check-ckpt accepts it, and it resumes on 2 stages (units migrating
# every 2 steps) and on one rank with the uninterrupted run's losses and
# biases
"$DYNMO" check-ckpt "$dir/moe_ck/ckpt-4.h5" > "$dir/moe_check.out" 2>&1 ||
  fail "check-ckpt of a sublayer MoE checkpoint: $(cat "$dir/moe_check.out")"
same_bias_tail() {   # A B WHAT: the last 4 steps' /moe/bias of A and B
  /usr/bin/python3 - "$dir/$1/runlog.h5" "$dir/$2/runlog.h5" <<'PY' &&
import sys, h5py
a, b = (h5py.File(p, 'r')['/moe/bias'][:] for p in sys.argv[1:])
assert len(a) == 8 and len(b) == 8 and (a[4:] == b[4:]).all() and (a[4:] != 0).any(), (a, b)
PY
    echo "ok: $3: /moe/bias of steps 5-8 bit-identical" || fail "$3: /moe/bias differs"
}
train moe_resumed2 2 "$dir/moe.ini" "${units[@]}" parallel.pp=2 balance.method=random \
  balance.every=2 ckpt.resume="$dir/moe_ck/ckpt-4.h5" &&
  same_tail moe_static3 moe_resumed2 4 "MoE, a sublayer checkpoint at step 4 resumed on 2 stages" &&
  same_bias_tail moe_static3 moe_resumed2 "MoE, a sublayer checkpoint resumed on 2 stages"
train moe_resumed1 1 "$dir/moe.ini" "${units[@]}" ckpt.resume="$dir/moe_ck/ckpt-4.h5" &&
  same_tail moe_static3 moe_resumed1 4 "MoE, a sublayer checkpoint at step 4 resumed on one rank" &&
  same_bias_tail moe_static3 moe_resumed1 "MoE, a sublayer checkpoint resumed on one rank"

# what does not split yet: expert parallelism
train_refused "sublayer MoE with expert parallelism" \
  "balance.units = sublayer with mixture-of-experts blocks needs parallel.ep = 1" 4 \
  "$dir/moe.ini" "${units[@]}" parallel.pp=2 parallel.dp=2 parallel.ep=2

# On the emulated device (docs/gpu.md: the cut by histograms where the
# weights live, the masks made there), units migrating every step on 3
# stages, against one rank's device.
if [ -f "$(dirname "$DYNMO")/libdynmo_emulate.so" ]; then
  . tests/device_lib.sh
  strict=1
  emulated=(train.device=emulate model.layers=5 train.steps=8 "${units[@]}" dyn.kind=prune
            dyn.prune_start=2 dyn.prune_every=2 dyn.prune_steps=2 dyn.sparsity_final=0.8
            dyn.csr_sparsity=0.5)
  run emu_prune1 1 "${emulated[@]}" &&
    DYNMO_EMULATE_DEVICES=3 run emu_prune3 3 "${emulated[@]}" parallel.pp=3 \
      balance.initial=explicit:3,4,3 balance.method=random balance.every=1 &&
    migrated emu_prune3 && same emu_prune1 emu_prune3 \
      "pruning on the emulated device, 3,4,3 units migrating every step" steps/loss
else
  echo "skip: the emulated device (no $(dirname "$DYNMO")/libdynmo_emulate.so)"
fi

finish
