#!/usr/bin/env bash
# The devices' own transport (docs/gpu.md, "Between devices";
# src/pipe/device_comm.c) on the emulated device: a node of
# DYNMO_EMULATE_DEVICES devices, each rank on its own while there are
# enough (as CUDA ranks on their GPUs, where it is NCCL). The emulated
# transport's sends complete only when their peer has taken them (a
# rendezvous, as NCCL's), so an order of transfers that could deadlock
# on NCCL hangs here and fails the run.
# - every rank on its own device: rank 0 says the transport carries it
#   all; with fewer devices than ranks, host staging and MPI, as before;
# - the losses are the same bits either way for dp=2, pp=2, pp=3,
#   pp=2 x dp=2, dp=3; 1F1B on 4 stages with 8 micro-batches and with 2
#   (fewer than its warm-up), GPipe on 3 stages, validation passes, early
#   exit over 2 stages (its exit layers stay on MPI); MoE's rows over an
#   expert group of 2 (pp=2 x dp=2 x ep=2) and the holders' sums of two
#   groups (dp=4 x ep=2); blocks moving every step (a random layout each
#   step; their slabs over the transport), also against the static
#   layout; six seeded random worlds (pp, dp, micro-batches, schedule,
#   moving blocks, validation, early exit); and dp=2 is within 1e-4 of
#   the CPU;
# - what no longer crosses the host: 8 steps of dp=2 copy to the host
#   under a fifth of what they copy through MPI's staging; of pp=2, the
#   tied halves and the activations and gradients between the stages
#   less; moving blocks every step and MoE over 2 expert groups, under a
#   fifth.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
. "$(dirname "$0")/device_lib.sh"

# pair NAME RANKS [key=value...]: NAME-shared on one device, NAME-own on a
# device per rank; their losses the same bits, each run's line on the sums.
# Both runs count what they copy (DYNMO_EMULATE_ALLOC_COUNTS=1 prints it at
# exit and changes nothing else), for crossed below.
pair() {
  local name=$1 ranks=$2; shift 2
  DYNMO_EMULATE_ALLOC_COUNTS=1 DYNMO_EMULATE_DEVICES=1 \
    run "$name-shared" "$ranks" train.device=emulate train.steps=8 "$@" || return
  DYNMO_EMULATE_ALLOC_COUNTS=1 DYNMO_EMULATE_DEVICES=$ranks \
    run "$name-own" "$ranks" train.device=emulate train.steps=8 "$@" || return
  grep -q '^transport: host staging and MPI' "$dir/$name-shared.out" \
    || fail "$name on one device: no line on the staging: $(grep '^transport' "$dir/$name-shared.out")"
  grep -q "^transport: activations, gradients, migrating blocks, expert rows, the replicas' sums and the tied embedding device to device" \
    "$dir/$name-own.out" || fail "$name on a device per rank: no line on the transport: $(grep '^transport' "$dir/$name-own.out")"
  if cmp -s "$dir/$name-shared.steps.loss" "$dir/$name-own.steps.loss"; then
    echo "ok: $name: $ranks ranks, each on its own device (the transport) or all on one (MPI): the same losses, bit for bit"
  else
    fail "$name: the transport's losses differ from MPI's"
  fi
}
pair dp2 2 parallel.dp=2
pair pp2 2 parallel.pp=2
pair pp3 3 parallel.pp=3
pair pp2dp2 4 parallel.pp=2 parallel.dp=2
pair dp3 3 parallel.dp=3 train.batch=12 train.micro_batches=2
pair pp4-m8 4 parallel.pp=4 train.batch=16 train.micro_batches=8
pair pp4-m2 4 parallel.pp=4 train.micro_batches=2
pair gpipe3 3 parallel.pp=3 parallel.schedule=gpipe
pair eval2 2 parallel.pp=2 train.eval_every=3 train.eval_batches=2
pair exit2 2 parallel.pp=2 dyn.kind=early_exit dyn.exit_from=1 dyn.exit_threshold=0.0005 \
  dyn.exit_warmup=2
pair moe-dp4 4 parallel.dp=4 parallel.ep=2 model.moe_every=2 model.experts=4 model.top_k=2 \
  moe.capacity_factor=1.25 train.micro_batches=2
# MoE with its experts over 2 ranks: the shared tensors, the rows and the
# holders' sums over the transport (expert.c)
pair moe-ep2 4 parallel.pp=2 parallel.dp=2 parallel.ep=2 model.moe_every=2 model.experts=4 \
  model.top_k=2 moe.capacity_factor=1.25
# blocks moving every step (a random layout each step) on the transport:
# the same bits as the static layout there
pair moving 4 parallel.pp=2 parallel.dp=2 balance.method=random balance.every=1 && {
  if cmp -s "$dir/pp2dp2-own.steps.loss" "$dir/moving-own.steps.loss"; then
    echo "ok: pp=2 x dp=2 on the transport, a random layout every step: the static layout's losses, bit for bit"
  else
    fail "pp=2 x dp=2 on the transport: a random layout every step changes the losses"
  fi
}
# a seeded sweep of random worlds, schedules, micro-batch counts, moving
# blocks, validation and early exit: the same bits, and no run hangs
RANDOM=20261202
for trial in 1 2 3 4 5 6; do
  pp=$((RANDOM % 3 + 2)) dp=1; [ $pp = 2 ] && dp=$((RANDOM % 2 + 1))
  mbs=(1 2 4 8) extra=()
  mb=${mbs[$((RANDOM % 4))]}
  [ $((RANDOM % 3)) = 0 ] && extra+=(parallel.schedule=gpipe)
  [ $((RANDOM % 2)) = 0 ] && extra+=(balance.method=random balance.every=1)
  [ $((RANDOM % 3)) = 0 ] && extra+=(train.eval_every=2 train.eval_batches=1)
  [ $((RANDOM % 4)) = 0 ] && extra+=(dyn.kind=early_exit dyn.exit_from=1 dyn.exit_threshold=0.0005 \
    dyn.exit_warmup=1)
  echo "sweep $trial: pp=$pp dp=$dp micro_batches=$mb ${extra[*]}"
  pair "sweep$trial" $((pp * dp)) parallel.pp=$pp parallel.dp=$dp train.batch=$((2 * mb * dp)) \
    train.micro_batches=$mb "${extra[@]}"
done
run dp2-cpu 2 parallel.dp=2 train.steps=8 && out=$(close dp2-cpu dp2-own) \
  && echo "ok: dp=2 on the transport vs the CPU: $out" || fail "dp=2 on the transport vs the CPU: ${out:-}"

# what crosses: the bytes the model copies to the host, per rank
# (crossed NAME: $staged and $own, the most any rank of pair NAME's 8-step
# runs copies, on one device and on a device per rank)
down() { sed -n 's/^emulate: .*, \([0-9]*\) bytes copied to the host$/\1/p' "$1" | sort -n | tail -n 1; }
crossed() {
  staged=$(down "$dir/$1-shared.out") own=$(down "$dir/$1-own.out")
  [ -n "$staged" ] && [ -n "$own" ] || { fail "$1: no byte counts"; staged=0 own=0; }
}
# under_fifth NAME WHAT: $own under a fifth of $staged
under_fifth() {
  [ "$staged" -gt 0 ] && [ $((own * 5)) -lt "$staged" ] \
    && echo "ok: 8 steps of $2 copy $own bytes to the host on the transport, $staged through MPI's staging" \
    || fail "$1: $own bytes to the host on the transport, $staged through MPI's staging (want under a fifth)"
}
# dp=2: the replicas' sums were nearly all of it
crossed dp2
under_fifth dp2 dp=2
# pp=2: the tied halves (vocab 256 x 32 channels a step) and the
# activations and gradients (4 micro-batches of 2 x 32 x 32 floats each
# way a step; each stage copied down what it sent) no longer cross
crossed pp2
tied=$((8 * 256 * 32 * 4)) acts=$((8 * 4 * 2 * 32 * 32 * 4))
[ "$staged" -gt 0 ] && [ $((staged - own)) -ge $((tied + acts)) ] \
  && echo "ok: 8 steps of pp=2 copy $own bytes to the host on the transport, $staged through MPI's staging (the tied halves $tied, the activations $acts)" \
  || fail "pp=2: $own bytes to the host on the transport, $staged through MPI's staging (want $((tied + acts)) fewer)"
crossed moving
under_fifth moving "pp=2 x dp=2 moving blocks every step"
crossed moe-dp4
under_fifth moe-dp4 "MoE over 2 expert groups of 2 (dp=4 x ep=2)"
finish
