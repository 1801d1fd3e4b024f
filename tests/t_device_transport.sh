#!/usr/bin/env bash
# The replicas' gradient sums over the devices' own transport (docs/gpu.md,
# "Between replicas"; src/pipe/device_comm.c), on the emulated device: a
# node of DYNMO_EMULATE_DEVICES devices, each rank on its own while there
# are enough (as CUDA ranks on their GPUs, where the sums go over NCCL).
# - every rank on its own device: rank 0 says the sums go over the
#   devices' transport; with fewer devices than ranks, through host
#   staging and MPI, as before;
# - the losses of dp=2, pp=2 x dp=2, dp=3 and MoE with pp=2 x dp=2 x ep=2
#   are the same bits either way, and so are blocks moving every step
#   (the emulated transport sums in replica order, as the MPI path does),
#   and dp=2 is within 1e-4 of the CPU;
# - the gradients no longer cross the host: a dp=2 run copies to the host
#   less than a fifth of what it copies with MPI's staging.
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
  grep -q '^replicas: gradient sums through host staging and MPI' "$dir/$name-shared.out" \
    || fail "$name on one device: no line on the staged sums: $(grep '^replicas' "$dir/$name-shared.out")"
  grep -q "^replicas: gradient sums over the devices' own transport" "$dir/$name-own.out" \
    || fail "$name on a device per rank: no line on the transport: $(grep '^replicas' "$dir/$name-own.out")"
  if cmp -s "$dir/$name-shared.loss" "$dir/$name-own.loss"; then
    echo "ok: $name: $ranks ranks, each on its own device (the transport) or all on one (MPI): the same losses, bit for bit"
  else
    fail "$name: the transport's losses differ from MPI's"
  fi
}
pair dp2 2 parallel.dp=2
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
for d in 1 2; do
  tiny_config "$dir/bytes$d.ini" "run.out_dir=$dir/bytes$d" train.device=emulate parallel.dp=2 \
    train.steps=8 > "$dir/bytes$d.ini"
  DYNMO_EMULATE_DEVICES=$d DYNMO_EMULATE_ALLOC_COUNTS=1 timeout -k 10 120 mpiexec -n 2 "$DYNMO" train \
    --config "$dir/bytes$d.ini" > "$dir/bytes$d.out" 2>&1 || fail "bytes on $d devices: exit $?"
done
down() { sed -n 's/^emulate: .*, \([0-9]*\) bytes copied to the host$/\1/p' "$1" | sort -n | tail -n 1; }
staged=$(down "$dir/bytes1.out") own=$(down "$dir/bytes2.out")
if [ -n "$staged" ] && [ -n "$own" ] && [ $((own * 5)) -lt "$staged" ]; then
  echo "ok: 8 steps of dp=2 copy $own bytes to the host on the transport, $staged through MPI's staging"
else
  fail "bytes copied to the host: '$own' on the transport, '$staged' through MPI's staging (want under a fifth)"
fi
finish
