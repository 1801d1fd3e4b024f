#!/usr/bin/env bash
# The dynamic schemes under interleaved 1F1B (parallel.schedule =
# interleaved, parallel.virtual = 2): for each scheme, the losses and
# gradient norms of 2 and 4 stages of 2 chunks each, the blocks re-laid
# out at random over the chunks every 2 steps (they migrate between
# chunks with their scheme's state), are the one-rank run's bit for bit.
# What interleaved does not run yet exits 2 with one message.
set -u
. "$(dirname "$0")/lib.sh"
need_dynmo
work_dir
train_cpus=$(two_cpus) train_limit=120
sets=(steps/loss steps/grad_norm)
# 12 blocks: 3 a chunk on 2 stages, 2,1,1,2,2,1,1,2 on 4 stages.
chunks=([2]=balance.initial=uniform [4]=balance.initial=explicit:2,1,1,2,2,1,1,2)
il=(parallel.schedule=interleaved parallel.virtual=2 balance.method=random balance.every=2)
# scheme NAME SETTING...: 12 blocks on one rank, on 2 stages x 2 chunks
# and on 4 stages x 2 chunks, the same bits.
scheme() {
  local name=$1; shift
  tiny_config "$dir/$name.ini" model.layers=12 model.channels=16 train.steps=6 "$@"
  train "$name-1" 1 "$dir/$name.ini" && bits "$name-1" "${sets[@]}" || return
  local S
  for S in 2 4; do
    train "$name-$S" "$S" "$dir/$name.ini" parallel.pp="$S" "${il[@]}" "${chunks[$S]}" &&
      bits "$name-$S" "${sets[@]}" &&
      same "$name-1" "$name-$S" "$name, interleaved on $S stages x 2 chunks" "${sets[@]}" &&
      { grep -q "migrated [0-9]* blocks" "$dir/$name-$S.out" || fail "$name on $S stages: no migration"; }
  done
}
scheme hash model.attention=hash hash.buckets=2
# Freezing: two blocks a check from step 2 on (a window of 1 step), 10
# of the 12 by the end, the frozen prefix crossing chunks and stages.
scheme freeze dyn.kind=freeze dyn.freeze_window=1 dyn.freeze_every=1 dyn.freeze_threshold=100 \
  dyn.freeze_per_check=2
grep -q "frozen 10/12" "$dir/freeze-4.out" || fail "freeze: not 10 blocks frozen at the end"
# Resumed on 2 stages from step 3 (ckpt-6 removed): the frozen prefix
# counted over every chunk's blocks, the run one rank's.
train freeze-resume 2 "$dir/freeze.ini" parallel.pp=2 "${il[@]}" ckpt.dir="$dir/freeze.ck" \
  ckpt.every=3 && rm -f "$dir/freeze.ck/ckpt-6.h5" &&
  train freeze-resume 2 "$dir/freeze.ini" parallel.pp=2 "${il[@]}" ckpt.dir="$dir/freeze.ck" \
    ckpt.every=3 && {
  grep -q "resumed from .*step 3" "$dir/freeze-resume.out" || fail "freeze: did not resume at step 3"
  bits freeze-resume "${sets[@]}" && same freeze-1 freeze-resume "freeze, interleaved, resumed" "${sets[@]}"
}
# Pruning: the global cut over every chunk of every stage at steps 2 and 4.
scheme prune dyn.kind=prune dyn.prune_start=2 dyn.prune_every=2 dyn.prune_steps=1 \
  dyn.sparsity_final=0.8 dyn.csr_sparsity=0.7
# Early exit: exits allowed from step 2, the exit heads' losses weighted.
scheme exit dyn.kind=early_exit dyn.exit_from=1 dyn.exit_threshold=0.0005 dyn.exit_warmup=2 \
  dyn.exit_loss_weight=0.5
grep -Eq 'skipped ([1-9]|0\.[1-9])' "$dir/exit-4.out" || fail "early exit: no token exited"
finish
