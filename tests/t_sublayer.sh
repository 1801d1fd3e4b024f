#!/usr/bin/env bash
# balance.units = sublayer (docs/balance.md): a block's attention and its
# MLP as separate units of placement. A 5-layer model laid out 3,4,3 units
# on 3 stages (boundaries inside blocks 1 and 3) and 5,5 on 2 (inside
# block 2) gives the losses and gradient norms of one rank bit for bit,
# and so do the balancers moving units between stages and the zero-bubble
# schedule (parallel.schedule = zb); layouts count
# units: bad layouts and stage counts exit 2 with one message naming the
# units, and what cannot split yet is refused. A sublayer run's
# checkpoints hold its unit layout and resume bit for bit with units or
# whole blocks on other stage counts.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
need_dynmo
work_dir
tiny_config "$dir/tiny.ini" model.layers=5 train.steps=6 train.grad_clip=0.05

units=(balance.units=sublayer)
train one 1 "$dir/tiny.ini" "${units[@]}" && bits one steps/loss steps/grad_norm
train three 3 "$dir/tiny.ini" "${units[@]}" parallel.pp=3 balance.initial=explicit:3,4,3 &&
  bits three steps/loss steps/grad_norm && same one three "3,4,3 units on 3 stages" steps/loss steps/grad_norm
grep -q "layout 3,4,3" "$dir/three.out" || fail "3 stages: the log line does not show layout 3,4,3"
train two 2 "$dir/tiny.ini" "${units[@]}" parallel.pp=2 balance.initial=explicit:5,5 &&
  bits two steps/loss steps/grad_norm && same one two "5,5 units on 2 stages" steps/loss steps/grad_norm
train whole 1 "$dir/tiny.ini" && bits whole steps/loss && same one whole "units against whole blocks on one rank" steps/loss

# The zero-bubble schedule (parallel.schedule = zb): each half's weight
# part is deferred to the WGRAD slots as a block's is (/units/wgrad_ms,
# above 0 for every unit and below its backward; /layers/wgrad_ms their
# sums); 3,4,3 units on 3 stages, and units migrating every step on 4,
# each against one rank.
train zb3 3 "$dir/tiny.ini" "${units[@]}" parallel.pp=3 parallel.schedule=zb \
  balance.initial=explicit:3,4,3 && bits zb3 steps/loss steps/grad_norm &&
  same one zb3 "zb, 3,4,3 units on 3 stages" steps/loss steps/grad_norm
/usr/bin/python3 - "$dir/zb3/runlog.h5" <<'PY' || fail "zb with sublayer units: the halves' weight parts"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
w, b = f['/units/wgrad_ms'][:], f['/units/bwd_ms'][:]
layers = f['/layers/wgrad_ms'][:]
assert w.shape == (6, 10) and np.all(w > 0) and np.all(w < b), (w, b)
assert np.allclose(layers, w[:, 0::2] + w[:, 1::2], rtol=1e-5), (layers, w)
print(f"ok: zb with sublayer units: every half's weight part deferred "
      f"({w.mean():.3f} of {b.mean():.3f} ms a unit)")
PY
train zbr4 4 "$dir/tiny.ini" "${units[@]}" parallel.pp=4 parallel.schedule=zb \
  balance.method=random balance.every=1 && bits zbr4 steps/loss steps/grad_norm &&
  same one zbr4 "zb, random every step on 4 stages" steps/loss steps/grad_norm
grep -qE "migrated [0-9]+ units" "$dir/zbr4.out" || fail "zbr4: no units migrated"

# Migration of units: random layouts every 2 steps from 3,4,3 on 3
# stages, every step on 4 (halves leave whole blocks, join their other
# half, or arrive from two stages at a third), and the time balancers
# on the per-unit profile; each against one rank.
migrated() { grep -qE "migrated [0-9]+ units" "$dir/$1.out" || fail "$1: no units migrated"; }
train random3 3 "$dir/tiny.ini" "${units[@]}" parallel.pp=3 balance.initial=explicit:3,4,3 \
  balance.method=random balance.every=2 train.steps=8 run.trace_from=3 run.trace_steps=2 \
  ckpt.dir="$dir/units_ck" ckpt.every=3 ckpt.keep=5 &&
  migrated random3 &&
  train one8 1 "$dir/tiny.ini" "${units[@]}" train.steps=8 && bits one8 steps/loss steps/grad_norm &&
  bits random3 steps/loss steps/grad_norm &&
  same one8 random3 "random every 2 steps from 3,4,3 units" steps/loss steps/grad_norm
train random4 4 "$dir/tiny.ini" "${units[@]}" parallel.pp=4 balance.method=random balance.every=1 &&
  migrated random4 && bits random4 steps/loss steps/grad_norm &&
  same one random4 "random every step on 4 stages" steps/loss steps/grad_norm
# the same with each unit's floats in pieces of 4 KiB (as a unit over 1 GiB goes)
DYNMO_TEST_MIGRATE_PIECE_BYTES=4096 train pieces 4 "$dir/tiny.ini" "${units[@]}" parallel.pp=4 \
  balance.method=random balance.every=1 && migrated pieces && bits pieces steps/loss &&
  same random4 pieces "units sent in 4 KiB pieces" steps/loss
for method in diffusion partition; do
  train "$method" 2 "$dir/tiny.ini" "${units[@]}" parallel.pp=2 balance.method=$method \
    balance.every=2 balance.min_improvement=0 balance.min_gain=0 &&
    bits "$method" steps/loss steps/grad_norm &&
    same one "$method" "$method on unit costs" steps/loss steps/grad_norm
done

# Checkpoints of a sublayer run (checkpoint_schema/units.def): random3
# wrote them at steps 3 and 6 (blocks split over two stages, each written
# whole by the stage of its attention). check-ckpt accepts them, and each
# resumes bit-identical to the uninterrupted run: with units on 2 stages
# (balancing on) and on 3 (the history in units carried over), with whole
# blocks on 2 and on 3 (the history mapped to whole blocks).
for step in 3 6; do
  "$DYNMO" check-ckpt "$dir/units_ck/ckpt-$step.h5" > "$dir/check$step.out" 2>&1 ||
    fail "check-ckpt of a sublayer checkpoint: $(cat "$dir/check$step.out")"
done
/usr/bin/python3 - "$dir/units_ck/ckpt-6.h5" <<'PY' && echo "ok: ckpt-6 holds the unit layouts and the nearest whole blocks" ||
import sys, h5py
f = h5py.File(sys.argv[1], 'r')
assert f['/units'].attrs['kind'] in (b'sublayer', 'sublayer')
units, blocks = f['/units/history_per_stage'][:], f['/layout/history_blocks_per_stage'][:]
assert units.shape[1] == 10 and blocks.shape[1] == 5 and len(units) == len(blocks) >= 1, units
assert list(units[0][:3]) == [3, 4, 3] and list(blocks[0][:3]) == [1, 2, 2], (units, blocks)
assert list(f['/units/per_stage'][:]) == list(units[-1][:3])
PY
  fail "ckpt-6: /units and /layout"
resumed() {   # NAME STAGES STEP [overrides]: a resume of ckpt-STEP against random3
  local name=$1 stages=$2 step=$3; shift 3
  train "$name" "$stages" "$dir/tiny.ini" parallel.pp="$stages" train.steps=8 \
    ckpt.resume="$dir/units_ck/ckpt-$step.h5" "$@" &&
    grep -q "resumed from .*ckpt-$step.h5 at step $step" "$dir/$name.out" &&
    same_tail random3 "$name" $((8 - step)) "a sublayer checkpoint at step $step resumed: $name"
}
resumed units2 2 3 "${units[@]}" balance.method=random balance.every=1
resumed units3 3 6 "${units[@]}" balance.initial=explicit:1,1,8
resumed blocks2 2 3
resumed blocks3 3 6
# damaged: a unit layout the history does not end with
cp "$dir/units_ck/ckpt-6.h5" "$dir/damaged.h5"
/usr/bin/python3 -c "import h5py, sys; h5py.File(sys.argv[1], 'r+')['/units/per_stage'][:] = [4, 3, 3]" \
  "$dir/damaged.h5"
expect_error "check-ckpt of a damaged unit layout" \
  "the unit layout history does not end with the current unit layout" \
  "$DYNMO" check-ckpt "$dir/damaged.h5"
# a history in units that cannot map to whole blocks on the same stages
train halves 3 "$dir/tiny.ini" "${units[@]}" parallel.pp=3 balance.initial=explicit:1,1,8 \
  train.steps=2 ckpt.dir="$dir/halves_ck" ckpt.every=2 &&
  train_refused "a unit history that cannot map" \
    "layout history entry 0 \(from step 0\): the sublayer layout 1,1,8 cannot map to whole blocks.*resume it with balance.units = sublayer" \
    3 "$dir/tiny.ini" parallel.pp=3 ckpt.resume="$dir/halves_ck/ckpt-2.h5"

# Re-packing with units (repack.enable): from 4 stages to the 3 that
# repack.min_ranks allows, exit 3 with the next world's layout in units
# (from the measured unit costs: a boundary may fall inside a block),
# which the next link resumes with
# (balance.initial = explicit:<layout>, ckpt.resume = auto) bit for bit.
timeout -k 10 180 mpiexec -n 4 "$DYNMO" train --config "$dir/tiny.ini" "${units[@]}" \
  parallel.pp=4 train.steps=8 repack.enable=1 repack.every=4 repack.epsilon=5 \
  repack.min_ranks=3 ckpt.dir="$dir/repack_ck" run.out_dir="$dir/repacked" \
  > "$dir/repack.out" 2>&1
rc=$?
next_pp=$(sed -n 's/^pp = //p' "$dir/repack_ck/next_world" 2>/dev/null)
next_layout=$(sed -n 's/^layout = //p' "$dir/repack_ck/next_world" 2>/dev/null)
if [ $rc -eq 3 ] && [ "$next_pp" = 3 ] && [ -n "$next_layout" ]; then
  echo "ok: re-pack with units: exit 3, next world pp 3, layout $next_layout units"
  train repacked 3 "$dir/tiny.ini" "${units[@]}" parallel.pp=3 train.steps=8 \
    balance.initial="explicit:$next_layout" ckpt.dir="$dir/repack_ck" ckpt.resume=auto &&
    same_tail one8 repacked 4 "re-packed from 4 stages to 3 with units at step 4"
else
  fail "re-pack with units: exit $rc, next world pp '$next_pp' layout '$next_layout': $(tail -3 "$dir/repack.out")"
fi

# Freezing (per block: a frozen block's two halves freeze together) on
# 2 and 3 stages with boundaries inside blocks, and while units migrate;
# threshold 100 freezes a block at every check (4 of 5 by step 12).
tiny_config "$dir/freeze.ini" model.layers=5 train.steps=12 train.grad_clip=0.05 \
  dyn.kind=freeze dyn.freeze_window=2 dyn.freeze_every=2 dyn.freeze_threshold=100
train freeze1 1 "$dir/freeze.ini" "${units[@]}" && bits freeze1 steps/loss steps/grad_norm &&
  grep -q "frozen 4/5" "$dir/freeze1.out" || fail "freeze1: no 4 of 5 blocks frozen"
train freeze2 2 "$dir/freeze.ini" "${units[@]}" parallel.pp=2 balance.initial=explicit:3,7 &&
  bits freeze2 steps/loss steps/grad_norm &&
  same freeze1 freeze2 "freezing, 3,7 units on 2 stages" steps/loss steps/grad_norm
train freeze3 3 "$dir/freeze.ini" "${units[@]}" parallel.pp=3 balance.initial=explicit:3,4,3 \
  balance.method=random balance.every=1 ckpt.dir="$dir/freeze_ck" ckpt.every=6 && migrated freeze3 &&
  bits freeze3 steps/loss steps/grad_norm &&
  same freeze1 freeze3 "freezing, 3,4,3 units on 3 stages, random every step" steps/loss steps/grad_norm
# its checkpoint at step 6 (frozen blocks and the window) resumed on 2 stages
train freeze_resumed 2 "$dir/freeze.ini" "${units[@]}" parallel.pp=2 \
  balance.initial=explicit:3,7 ckpt.resume="$dir/freeze_ck/ckpt-6.h5" &&
  same_tail freeze3 freeze_resumed 6 "freezing, a sublayer checkpoint resumed on 2 stages"

# Early exit (softmax confidence): a block's active rows come from
# exit_layer, which travels with the stream after attention; its exit
# head, decision and counts are its MLP's. Tokens exit at steps 3-4
# (/layers/active < 1 on blocks 2-4, some split). On one rank against
# whole blocks, on 2 stages (5,5: inside block 2) and on 3 while units
# migrate every step, the losses, gradient norms and /layers/active of
# one rank.
exited=(steps/loss steps/grad_norm layers/active)
tiny_config "$dir/exit.ini" model.layers=5 train.steps=8 train.grad_clip=0.05 \
  dyn.kind=early_exit dyn.exit_from=1 dyn.exit_threshold=0.0005 dyn.exit_warmup=2 \
  dyn.exit_loss_weight=0.5
train exit1 1 "$dir/exit.ini" "${units[@]}" && bits exit1 "${exited[@]}"
/usr/bin/python3 - "$dir/exit1/runlog.h5" <<'PY' || fail "early exit with units: no token exited"
import sys, h5py
a = h5py.File(sys.argv[1], 'r')['/layers/active'][:]
assert (a[:, 2:] < 1).any(), a
print("ok: early exit with units: tokens exited (least active share %.3f)" % a.min())
PY
train exit_whole 1 "$dir/exit.ini" && bits exit_whole "${exited[@]}" &&
  same exit1 exit_whole "early exit, units against whole blocks on one rank" "${exited[@]}"
train exit2 2 "$dir/exit.ini" "${units[@]}" parallel.pp=2 balance.initial=explicit:5,5 &&
  bits exit2 "${exited[@]}" && same exit1 exit2 "early exit, 5,5 units on 2 stages" "${exited[@]}"
train exit3 3 "$dir/exit.ini" "${units[@]}" parallel.pp=3 balance.initial=explicit:3,4,3 \
  balance.method=random balance.every=1 && migrated exit3 && bits exit3 "${exited[@]}" &&
  same exit1 exit3 "early exit, 3,4,3 units on 3 stages, random every step" "${exited[@]}"

# Hash attention stays inside the attention unit (docs/mod-hash.md): on
# 2 and 3 stages with boundaries inside blocks, units migrating on 3, the
# losses, gradient norms and the blocks' tiles and own-key-only shares
# of one rank.
hashed=(steps/loss steps/grad_norm hash/tiles hash/own_key_only)
tiny_config "$dir/hash.ini" model.layers=5 train.steps=6 train.grad_clip=0.05 \
  model.attention=hash hash.buckets=4
train hash1 1 "$dir/hash.ini" "${units[@]}" && bits hash1 "${hashed[@]}"
train hash2 2 "$dir/hash.ini" "${units[@]}" parallel.pp=2 balance.initial=explicit:5,5 &&
  bits hash2 "${hashed[@]}" && same hash1 hash2 "hash attention, 5,5 units on 2 stages" "${hashed[@]}"
train hash3 3 "$dir/hash.ini" "${units[@]}" parallel.pp=3 balance.initial=explicit:3,4,3 \
  balance.method=random balance.every=1 && migrated hash3 && bits hash3 "${hashed[@]}" &&
  same hash1 hash3 "hash attention, 3,4,3 units on 3 stages, random every step" "${hashed[@]}"

# A checkpoint of whole blocks resumed with sublayer units (ckpt.resume =
# FILE; the history's layouts in units): on 2 stages and on 3 while units
# migrate, steps 4-6 give the uninterrupted block run's losses.
train blocks 2 "$dir/tiny.ini" parallel.pp=2 ckpt.dir="$dir/ck" ckpt.every=3
for stages in 2 3; do
  initial=explicit:5,5; [ $stages = 3 ] && initial=explicit:3,4,3
  train "resumed$stages" $stages "$dir/tiny.ini" "${units[@]}" parallel.pp=$stages \
    balance.initial=$initial balance.method=random balance.every=1 \
    ckpt.resume="$dir/ck/ckpt-3.h5" || continue
  grep -q "resumed from .*ckpt-3.h5 at step 3" "$dir/resumed$stages.out" ||
    fail "resumed$stages: no resume line"
  /usr/bin/python3 - "$dir/blocks/runlog.h5" "$dir/resumed$stages/runlog.h5" <<'PY' &&
import sys, h5py
a, b = (h5py.File(p, 'r')['/steps/loss'][:].view('<u4') for p in sys.argv[1:])
assert len(a) == 6 and len(b) == 6 and list(a[3:]) == list(b[3:]), (a, b)
PY
    echo "ok: a checkpoint of whole blocks resumed with units on $stages stages: steps 4-6 bit-identical" ||
    fail "resumed$stages: steps 4-6 differ from the block run"
done

# On the emulated device (docs/gpu.md), units migrating every step on 3
# stages through the host staging, and device to device over the
# devices' transport (a device per rank), against one rank's bits.
if [ -f "$(dirname "$DYNMO")/libdynmo_emulate.so" ]; then
  . tests/device_lib.sh
  strict=1
  emulated=(train.device=emulate model.layers=5 train.steps=8 "${units[@]}")
  moving=(parallel.pp=3 balance.initial=explicit:3,4,3 balance.method=random balance.every=1)
  run emu1 1 "${emulated[@]}" &&
    for devices in 1 3; do
      DYNMO_EMULATE_DEVICES=$devices run "emu3_$devices" 3 "${emulated[@]}" "${moving[@]}" &&
        migrated "emu3_$devices" && same emu1 "emu3_$devices" \
          "emulated device ($devices for 3 ranks), units migrating every step" steps/loss
    done
  grep -q "transport: .*device to device" "$dir/emu3_3.out" || fail "emu3_3: no device transport"
  # a checkpoint of 3,4,3 units on devices (the split blocks' MLP halves
  # gathered device to host to device), resumed on one rank's device
  for devices in 1 3; do
    DYNMO_EMULATE_DEVICES=$devices run "emu_ck$devices" 3 "${emulated[@]}" parallel.pp=3 \
      balance.initial=explicit:3,4,3 ckpt.dir="$dir/emu_ck$devices" ckpt.every=4 &&
      run "emu_resumed$devices" 1 "${emulated[@]}" \
        ckpt.resume="$dir/emu_ck$devices/ckpt-4.h5" &&
      same_tail "emu_ck$devices" "emu_resumed$devices" 4 \
        "emulated device ($devices for 3 ranks): a sublayer checkpoint resumed on one rank"
  done
else
  echo "skip: the emulated device (no $(dirname "$DYNMO")/libdynmo_emulate.so)"
fi

# The readers of a sublayer run's log: its layouts count units.
log=$dir/random3/runlog.h5
# each unit timed apart, the blocks' columns their sums; a block run has none
/usr/bin/python3 - "$log" <<'PY' && echo "ok: /units/*: 10 units timed apart, /layers/* their sums" ||
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
for kind in ('fwd_ms', 'bwd_ms'):
    units, layers = f['/units/' + kind][:], f['/layers/' + kind][:]
    assert units.shape == (8, 10) and layers.shape == (8, 5), (units.shape, layers.shape)
    assert (units > 0).all(), f'{kind}: a unit with no time: {units}'
    sums = units[:, 0::2].astype(float) + units[:, 1::2]
    assert np.allclose(sums, layers, rtol=1e-5, atol=0), (kind, sums, layers)
assert f['/units/update_ms'].shape == (8, 10)
PY
  fail "/units/* of a sublayer run"
has whole units/fwd_ms && fail "a run of whole blocks writes /units/fwd_ms"
"$DYNMO" report "$log" --out "$dir/report" > "$dir/report.out" 2>&1 &&
  [ -s "$dir/report/layout-1.svg" ] || fail "report of a sublayer run: $(cat "$dir/report.out")"
"$DYNMO" trace "$log" --out "$dir/trace.json" > "$dir/trace.out" 2>&1 &&
  grep -q "instructions of steps 3 to 4 on 3 ranks" "$dir/trace.out" ||
  fail "trace of a sublayer run: $(cat "$dir/trace.out")"
"$DYNMO" inspect "$log" | grep -q "balance.units = sublayer" || fail "inspect: no balance.units"
"$DYNMO" plan --from-run "$dir/random3" --step 4 > "$dir/plan.out" 2>&1 &&
  grep -q "(10 sublayer units of 5 blocks, embed, head)" "$dir/plan.out" &&
  grep -q "^split_blocks: " "$dir/plan.out" && grep -q "^units_moved: " "$dir/plan.out" ||
  fail "plan --from-run of a sublayer run: $(head -3 "$dir/plan.out")"

bad() { train_refused "$1" "$2" "$3" "$dir/tiny.ini" "${@:4}"; }
bad "units name" "balance.units = 'layer' must be block or sublayer" 1 balance.units=layer
bad "explicit not the unit count" \
  "covers 11 units but the 10 units of model.layers = 5 with balance.units = sublayer" 3 \
  parallel.pp=3 balance.units=sublayer balance.initial=explicit:3,4,4
bad "explicit counts blocks under units=block" "covers 10 blocks but model.layers = 5" 3 \
  parallel.pp=3 balance.initial=explicit:3,4,3
bad "more stages than units" "parallel.pp = 11 exceeds the 10 units of model.layers = 5" 11 \
  parallel.pp=11 balance.units=sublayer
bad "sublayer with MoD blocks" "balance.units = sublayer cannot run with a mixture of depths yet" \
  2 parallel.pp=2 balance.units=sublayer model.mod_every=2
bad "sublayer with early exit by saturation" \
  "balance.units = sublayer cannot run with dyn.exit_confidence = saturation yet" \
  2 parallel.pp=2 balance.units=sublayer dyn.kind=early_exit dyn.exit_confidence=saturation
bad "sublayer checkpoints on more stages than blocks" \
  "balance.units = sublayer with ckpt.dir needs parallel.pp <= model.layers" 3 \
  model.layers=2 parallel.pp=3 balance.units=sublayer ckpt.dir="$dir/ckpt"
finish
