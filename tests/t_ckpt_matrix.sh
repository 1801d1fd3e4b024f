#!/usr/bin/env bash
# Every combination of schemes the config accepts writes checkpoints that
# load (issue 28): for each of dyn.kind (none, freeze, early_exit, prune) x
# MoE blocks x mixture-of-depths blocks x hash attention, either the config
# refuses it at start-up (exit 2, one message naming both) or a 2-stage run
# of 6 steps checkpoints at step 3, `dynmo check-ckpt` passes that
# checkpoint, and a run resumed from it on 1 stage finishes with losses
# bit-identical to the uninterrupted run's. At least the combinations the
# docs name as accepted must be accepted (a refusal there fails).
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/t.ini" model.layers=4 train.steps=6 train.warmup=1 train.lr=3e-3
declare -A scheme=(
  [none]=""
  [freeze]="dyn.kind=freeze dyn.freeze_window=2 dyn.freeze_every=2 dyn.freeze_threshold=10 dyn.freeze_max=2"
  [early_exit]="dyn.kind=early_exit dyn.exit_warmup=1 dyn.exit_threshold=0.05"
  [prune]="dyn.kind=prune dyn.prune_start=1 dyn.prune_every=2 dyn.prune_steps=2 dyn.csr_sparsity=0.5"
)
moe="model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=32"
mod="model.mod_every=2 model.mod_capacity=0.5"
hash="model.attention=hash hash.buckets=2"
accepted=0; refused=0
for kind in none freeze early_exit prune; do
  for m in 0 1; do for d in 0 1; do for h in 0 1; do
    name="$kind"; extra=${scheme[$kind]}
    [ $m = 1 ] && { name+="+moe"; extra+=" $moe"; }
    [ $d = 1 ] && { name+="+mod"; extra+=" $mod"; }
    [ $h = 1 ] && { name+="+hash"; extra+=" $hash"; }
    # shellcheck disable=SC2086
    timeout -k 10 120 mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" parallel.pp=2 $extra \
      run.out_dir="$dir/$name-full" ckpt.dir="$dir/$name-ck" ckpt.every=3 ckpt.keep=3 \
      > "$dir/$name-full.out" 2>&1
    rc=$?
    if [ $rc -eq 2 ]; then
      lines=$(grep -c 'error' "$dir/$name-full.out")
      [ "$lines" -eq 1 ] && [ ! -e "$dir/$name-full" ] && [ ! -e "$dir/$name-ck" ] \
        || fail "$name: refused with $lines error lines or left files: $(cat "$dir/$name-full.out")"
      echo "refused: $name: $(grep -m1 error "$dir/$name-full.out")"
      refused=$((refused + 1)); continue
    fi
    [ $rc -eq 0 ] || { fail "$name: exit $rc: $(tail -n 2 "$dir/$name-full.out")"; continue; }
    accepted=$((accepted + 1))
    out=$("$DYNMO" check-ckpt "$dir/$name-ck/ckpt-3.h5" 2>&1) ||
      { fail "$name: check-ckpt of ckpt-3.h5: $out"; continue; }
    # shellcheck disable=SC2086
    timeout -k 10 120 mpiexec -n 1 "$DYNMO" train --config "$dir/t.ini" parallel.pp=1 $extra \
      run.out_dir="$dir/$name-resumed" ckpt.dir="$dir/$name-ck2" \
      ckpt.resume="$dir/$name-ck/ckpt-3.h5" > "$dir/$name-resumed.out" 2>&1 ||
      { fail "$name: resume: exit $?: $(tail -n 2 "$dir/$name-resumed.out")"; continue; }
    bits "$name-full" /steps/loss && bits "$name-resumed" /steps/loss || continue
    # the resumed log's first 3 rows are filler: compare steps 4-6
    if cmp -s <(tail -c 12 "$dir/$name-full.steps.loss") <(tail -c 12 "$dir/$name-resumed.steps.loss"); then
      echo "ok: $name: check-ckpt passes, resumed on 1 stage bit-identical"
    else
      fail "$name: resumed losses differ from the uninterrupted run's"
    fi
  done; done; done
done
echo "$accepted combinations accepted, $refused refused at start-up"
# These combine (docs/config.md, "Combinations"): a refusal of one is a
# regression. What is refused today (MoE with MoD; early exit with MoE, MoD
# or hash attention; pruning with MoE or MoD) is checked above to be one
# message at start-up, leaving nothing behind.
for must in none none+hash none+mod none+mod+hash none+moe none+moe+hash freeze freeze+hash \
            freeze+mod freeze+mod+hash freeze+moe freeze+moe+hash early_exit prune prune+hash; do
  [ -e "$dir/$must-full" ] || fail "$must is refused, but it combines"
done
finish
