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
finish
