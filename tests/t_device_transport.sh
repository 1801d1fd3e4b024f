#!/usr/bin/env bash
# The replicas' gradient sums and the tied embedding's exchange over the
# devices' own transport (docs/gpu.md, "Between replicas, and the tied
# embedding"; src/pipe/device_comm.c), on the emulated device: a
# node of DYNMO_EMULATE_DEVICES devices, each rank on its own while there
# are enough (as CUDA ranks on their GPUs, where the sums go over NCCL).
# - every rank on its own device: rank 0 says both go over the devices'
#   transport; with fewer devices than ranks, through host staging and
#   MPI, as before;
# - the losses of dp=2, pp=2, pp=3, pp=2 x dp=2, dp=3 and MoE with
#   pp=2 x dp=2 x ep=2
#   are the same bits either way, and so are blocks moving every step
#   (the emulated transport sums in replica order, as the MPI path does),
#   and dp=2 is within 1e-4 of the CPU;
# - the gradients no longer cross the host: a dp=2 run, and a pp=2 run
#   (the tied exchange), copy to the host less than a fifth of what they
#   copy with MPI's staging.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
. "$(dirname "$0")/device_lib.sh"

# pair NAME RANKS [key=value...]: NAME-shared on one device, NAME-own on a
# device per rank; their losses the same bits, each run's line on the sums
pair() {
  local name=$1 ranks=$2; shift 2
  DYNMO_EMULATE_DEVICES=1 run "$name-shared" "$ranks" train.device=emulate train.steps=8 "$@" || return
  DYNMO_EMULATE_DEVICES=$ranks run "$name-own" "$ranks" train.device=emulate train.steps=8 "$@" || return
  grep -q '^transport: host staging and MPI' "$dir/$name-shared.out" \
    || fail "$name on one device: no line on the staging: $(grep '^transport' "$dir/$name-shared.out")"
  grep -q "^transport: the replicas' gradient sums and the tied embedding's exchange over the devices' own" \
    "$dir/$name-own.out" || fail "$name on a device per rank: no line on the transport: $(grep '^transport' "$dir/$name-own.out")"
  if cmp -s "$dir/$name-shared.loss" "$dir/$name-own.loss"; then
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
# MoE with its experts over 2 ranks: the shared tensors over the
# transport, the experts' sums by their holders over MPI (expert.c)
pair moe-ep2 4 parallel.pp=2 parallel.dp=2 parallel.ep=2 model.moe_every=2 model.experts=4 \
  model.top_k=2 moe.capacity_factor=1.25
# blocks moving every step (a random layout each step) on the transport:
# the same bits as the static layout there
pair moving 4 parallel.pp=2 parallel.dp=2 balance.method=random balance.every=1 && {
  if cmp -s "$dir/pp2dp2-own.loss" "$dir/moving-own.loss"; then
    echo "ok: pp=2 x dp=2 on the transport, a random layout every step: the static layout's losses, bit for bit"
  else
    fail "pp=2 x dp=2 on the transport: a random layout every step changes the losses"
  fi
}
run dp2-cpu 2 parallel.dp=2 train.steps=8 && out=$(close dp2-cpu dp2-own) \
  && echo "ok: dp=2 on the transport vs the CPU: $out" || fail "dp=2 on the transport vs the CPU: ${out:-}"

# what crosses: the bytes the model copies to the host, per rank
# (crossed NAME [key=value...]: $staged and $own, the most any rank of
# an 8-step run copies, on one device and on a device per rank)
down() { sed -n 's/^emulate: .*, \([0-9]*\) bytes copied to the host$/\1/p' "$1" | sort -n | tail -n 1; }
crossed() {
  local name=$1 d; shift
  for d in 1 2; do
    tiny_config "$dir/$name$d.ini" "run.out_dir=$dir/$name$d" train.device=emulate train.steps=8 \
      "$@" > "$dir/$name$d.ini"
    DYNMO_EMULATE_DEVICES=$d DYNMO_EMULATE_ALLOC_COUNTS=1 timeout -k 10 120 mpiexec -n 2 "$DYNMO" \
      train --config "$dir/$name$d.ini" > "$dir/$name$d.out" 2>&1 || fail "$name on $d devices: exit $?"
  done
  staged=$(down "$dir/${name}1.out") own=$(down "$dir/${name}2.out")
  [ -n "$staged" ] && [ -n "$own" ] || { fail "$name: no byte counts"; staged=0 own=0; }
}
# dp=2: the replicas' sums were nearly all of it
crossed dp2 parallel.dp=2
[ "$staged" -gt 0 ] && [ $((own * 5)) -lt "$staged" ] \
  && echo "ok: 8 steps of dp=2 copy $own bytes to the host on the transport, $staged through MPI's staging" \
  || fail "dp=2: $own bytes to the host on the transport, $staged through MPI's staging (want under a fifth)"
# pp=2: the tied halves (vocab 256 x 32 channels a step) no longer cross;
# the activations between the stages still do (MPI)
crossed pp2 parallel.pp=2
tied=$((8 * 256 * 32 * 4))
[ "$staged" -gt 0 ] && [ $((staged - own)) -ge "$tied" ] \
  && echo "ok: 8 steps of pp=2 copy $own bytes to the host on the transport, $staged through MPI's staging (the tied halves: $tied)" \
  || fail "pp=2: $own bytes to the host on the transport, $staged through MPI's staging (want $tied fewer)"
finish
