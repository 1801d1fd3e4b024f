#!/usr/bin/env bash
# The dynamic schemes under interleaved 1F1B (parallel.schedule =
# interleaved, parallel.virtual = 2): for each scheme (hash attention,
# freezing, pruning, early exit, mixture of depths, mixture of experts),
# the losses and gradient norms of 2 and 4 stages of 2 chunks each, the
# blocks re-laid out at random over the chunks every 2 steps (they
# migrate between chunks with their scheme's state), are the one-rank
# run's bit for bit, and so are those of a run resumed from a checkpoint
# (the stateful schemes). Mixture of experts on 2 replicas, with every
# expert on each or split over them (parallel.ep = 2, placed at random,
# copied), gives 1f1b's bits on the same grid. The refusals are in
# t_schedule_interleaved.sh.
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
# resumed NAME: NAME's run on 2 stages x 2 chunks with checkpoints at
# steps 3 and 6, ckpt-6 removed, run again: it resumes at step 3 and its
# losses are one rank's.
resumed() {
  local name=$1 run=$1-resume
  local args=(parallel.pp=2 "${il[@]}" ckpt.dir="$dir/$run.ck" ckpt.every=3)
  train "$run" 2 "$dir/$name.ini" "${args[@]}" && rm -f "$dir/$run.ck/ckpt-6.h5" &&
    train "$run" 2 "$dir/$name.ini" "${args[@]}" || return
  grep -q "resumed from .*step 3" "$dir/$run.out" || fail "$name: did not resume at step 3"
  bits "$run" "${sets[@]}" && same "$name-1" "$run" "$name, interleaved, resumed at step 3" "${sets[@]}"
}
scheme hash model.attention=hash hash.buckets=2
# Freezing: two blocks a check from step 2 on (a window of 1 step), 10
# of the 12 by the end, the frozen prefix crossing chunks and stages.
scheme freeze dyn.kind=freeze dyn.freeze_window=1 dyn.freeze_every=1 dyn.freeze_threshold=100 \
  dyn.freeze_per_check=2
grep -q "frozen 10/12" "$dir/freeze-4.out" || fail "freeze: not 10 blocks frozen at the end"
resumed freeze   # the frozen prefix counted over every chunk's blocks
# Pruning: the global cut over every chunk of every stage at steps 2 and 4.
scheme prune dyn.kind=prune dyn.prune_start=2 dyn.prune_every=2 dyn.prune_steps=1 \
  dyn.sparsity_final=0.8 dyn.csr_sparsity=0.7
resumed prune    # the masks rebuilt from the zeros of every chunk's blocks
# Early exit: exits allowed from step 2, the exit heads' losses weighted.
scheme exit dyn.kind=early_exit dyn.exit_from=1 dyn.exit_threshold=0.0005 dyn.exit_warmup=2 \
  dyn.exit_loss_weight=0.5
grep -Eq 'skipped ([1-9]|0\.[1-9])' "$dir/exit-4.out" || fail "early exit: no token exited"
resumed exit
# Mixture of depths: every second block, a quarter of the tokens, chosen
# by the causal predictor (trained against top-k).
scheme mod model.mod_every=2 model.mod_capacity=0.25 mod.routing=causal
resumed mod      # the routers and predictors with their blocks
# Mixture of experts: 4 experts, top-2, every second block.
moe=(model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=32)
scheme moe "${moe[@]}"
resumed moe      # the routers' state with their blocks
# Two replicas of 2 stages: every replica holding every expert
# (parallel.ep = 1), and the experts split over the two (parallel.ep =
# 2), placed at random with a copy each decision, resumed from step 3 of
# such a run: 1f1b's bits on the same grid.
grid=(parallel.pp=2 parallel.dp=2)
ep2=(parallel.ep=2 moe.placement=random moe.replicas_max=1 ckpt.dir="$dir/moe-ep2.ck" ckpt.every=3)
train moe-grid 4 "$dir/moe.ini" "${grid[@]}" && bits moe-grid "${sets[@]}" && {
  train moe-dp 4 "$dir/moe.ini" "${grid[@]}" "${il[@]}" && bits moe-dp "${sets[@]}" &&
    same moe-grid moe-dp "moe, interleaved on 2 stages x 2 chunks x 2 replicas" "${sets[@]}"
  train moe-ep2 4 "$dir/moe.ini" "${grid[@]}" "${il[@]}" "${ep2[@]}" && bits moe-ep2 "${sets[@]}" &&
    same moe-grid moe-ep2 "moe, interleaved, the experts over 2 replicas, placed at random" \
      "${sets[@]}" && rm -f "$dir/moe-ep2.ck/ckpt-6.h5" &&
    train moe-ep2 4 "$dir/moe.ini" "${grid[@]}" "${il[@]}" "${ep2[@]}" && bits moe-ep2 "${sets[@]}" &&
    same moe-grid moe-ep2 "moe, interleaved, the experts over 2 replicas, resumed at step 3" \
      "${sets[@]}"
  grep -q "resumed from .*step 3" "$dir/moe-ep2.out" || fail "moe, parallel.ep = 2: did not resume"
}
finish
