#!/usr/bin/env bash
# make check-gpu: the CUDA backend on a machine with a GPU (docs/gpu.md).
# Runs, in order, and reports each as PASS, FAIL or NOT RUN (and why):
#   1. the plugin $BUILD/libdynmo_cuda.so exists and a GPU answers;
#   2. every op of the plugin's table against the CPU backend, relative
#      error at most 1e-4 ($BUILD/gpu/check_ops cuda);
#   3. a 20-step run with train.device=$DEVICE against the same run on the
#      CPU, losses within 1e-4, and against the run on the emulated device
#      (the same kernels' arithmetic on the CPU; a failure there alone
#      points at the kernels as the device compiles them), within 1e-4;
#   3b. the same 20 steps with train.precision=bf16 (bf16 operands of
#      every cuBLAS product, fp32 outputs) against the CPU's fp32 run,
#      losses within 2e-3 (measured on the emulated device, 2026-12-02:
#      1.7e-4 at most; tf32 3.7e-5);
#   4. static and balanced pipeline runs on cuda (2 ranks), losses
#      bit-identical to each other;
#   5. a checkpoint written on cuda at step 10 resumed on the CPU to step
#      20, and one written on the CPU resumed on cuda, losses within 1e-4
#      of the CPU's own 20 steps;
#   6. every dynamic scheme (early exit, pruning with CSR, mixture of
#      depths, hash attention, MoE, freezing; MoE with its experts over 2
#      ranks on 4 ranks sharing the GPU) 20 steps on cuda against the CPU,
#      losses within 1e-4.
# Exits 0 only when every check passed: a missing piece (no GPU, no
# plugin) is a failure with its reason, never a pass.
# DEVICE=emulate runs the same checks on the emulated device (no GPU, no
# plugin needed: tests/t_check_gpu.sh runs the script so in make check).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DEVICE=${DEVICE:-cuda}
case $DEVICE in cuda|emulate) ;; *) echo "check-gpu: DEVICE must be cuda or emulate, not '$DEVICE'"; exit 2 ;; esac
# BUILD may be absolute (scripts/device_session.sh points it at the
# unpacked device bundle, whose mpiexec comes first in PATH).
case $BUILD in /*) build_dir=$BUILD ;; *) build_dir=$PWD/$BUILD ;; esac
DYNMO=$build_dir/dynmo
export DYNMO_CUDA_PLUGIN=$build_dir/libdynmo_cuda.so
export DYNMO_EMULATE_PLUGIN=$build_dir/libdynmo_emulate.so
# The text the runs train on (the device bundle carries a copy), and the
# python3 that reads their losses: the first of PATH's python3 and
# /usr/bin/python3 with h5py (a GPU image's python3 is seldom /usr/bin's).
TEXT=${CHECK_GPU_TEXT:-/usr/share/common-licenses/GPL-3}
PYTHON3=/usr/bin/python3
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import h5py' >/dev/null 2>&1; then PYTHON3=$candidate; break; fi
done
dir=$(mktemp -d /tmp/dynmo-check-gpu.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$dir"' EXIT
results=()
report() { results+=("$(printf '%-8s %s' "$1" "$2")"); echo "check-gpu: $1 $2"; }
summary() {
  local gpu
  gpu=$(nvidia-smi -L 2>/dev/null | head -n 1)
  echo "check-gpu summary ($(date -u +%Y-%m-%dT%H:%MZ), ${gpu:-no GPU}):"
  printf '  %s\n' "${results[@]}"
  printf '%s\n' "${results[@]}" | grep -qv '^PASS' && { echo "check-gpu: FAILED"; exit 1; }
  echo "check-gpu: all passed"; exit 0
}

# 1. the pieces
if [ "$DEVICE" = cuda ]; then
  if [ ! -f "$DYNMO_CUDA_PLUGIN" ]; then
    report FAIL "plugin: $DYNMO_CUDA_PLUGIN missing (make USE_CUDA=1)"; summary
  fi
  if ! nvidia-smi -L >/dev/null 2>&1; then
    report FAIL "device: nvidia-smi finds no GPU on $(hostname)"; summary
  fi
  report PASS "device: $(nvidia-smi -L | head -n 1)"
else
  [ -f "$DYNMO_EMULATE_PLUGIN" ] && report PASS "device: the emulated device ($DYNMO_EMULATE_PLUGIN)" ||
    { report FAIL "device: $DYNMO_EMULATE_PLUGIN missing (make builds it)"; summary; }
fi

# 2. every op
if "$BUILD/gpu/check_ops" "$DEVICE" > "$dir/ops.log" 2>&1; then
  report PASS "ops: $(tail -n 1 "$dir/ops.log")"
else
  cat "$dir/ops.log"
  report FAIL "ops: $(tail -n 1 "$dir/ops.log")"
fi

# 3-5. the model on the GPU
"$DYNMO" prepare --out "$dir/data" "$TEXT" >/dev/null
# lr 1e-3: at 3e-3 this model turns the kernels' other summation orders
# (1e-7 in a loss) into 4e-3 by step 16, AdamW normalising gradients
# that differ only in their last bits (measured on the emulated device,
# DEVICE=emulate); at 1e-3 the 20 steps stay within 5e-7.
cat > "$dir/run.ini" <<INI
[model]
layers = 4
channels = 64
heads = 4
max_seq = 64
[train]
batch = 8
seq = 64
micro_batches = 2
steps = 20
lr = 1e-3
warmup = 2
[data]
train = $dir/data/train.bin
val = $dir/data/val.bin
INI
train() { # NAME RANKS overrides...: the run's /steps/loss into $dir/NAME.loss as text
  local name=$1 ranks=$2; shift 2
  timeout -k 10 600 mpiexec -n "$ranks" "$DYNMO" train --config "$dir/run.ini" \
    run.out_dir="$dir/$name" "$@" > "$dir/$name.out" 2>&1 || return 1
  "$PYTHON3" -c 'import h5py, sys
for x in h5py.File(sys.argv[1], "r")["/steps/loss"][:]: print("%.9g" % x)' \
    "$dir/$name/runlog.h5" > "$dir/$name.loss"
}
within() { # A B [TOL]: every loss of A within TOL (1e-4) of B's, same count
  paste "$dir/$1.loss" "$dir/$2.loss" | awk -v tol="${3:-1e-4}" 'NF != 2 {bad = 1} NF == 2 && ($1 - $2 > tol || $2 - $1 > tol) {bad = 1} END {exit bad}' &&
    [ "$(wc -l < "$dir/$1.loss")" = "$(wc -l < "$dir/$2.loss")" ]
}
why() { grep -m 1 'error' "$dir/$1.out" || tail -n 1 "$dir/$1.out"; }

train cpu 1 train.device=cpu || report FAIL "reference CPU run: $(why cpu)"
if ! train dev 1 train.device=$DEVICE; then
  report FAIL "20-step run on $DEVICE: $(why dev)"
  report "NOT RUN" "bf16 on $DEVICE: needs the 20-step run on $DEVICE"
  report "NOT RUN" "static vs balanced on $DEVICE: needs the 20-step run on $DEVICE"
  report "NOT RUN" "checkpoints $DEVICE -> cpu -> $DEVICE: need the 20-step run on $DEVICE"
  report "NOT RUN" "the dynamic schemes on $DEVICE: need the 20-step run on $DEVICE"
  summary
fi
within dev cpu && report PASS "20 steps, $DEVICE vs cpu: losses within 1e-4" \
  || report FAIL "20 steps, $DEVICE vs cpu: losses differ by more than 1e-4"
if [ "$DEVICE" = cuda ]; then
  if train emulate 1 train.device=emulate; then
    within dev emulate && report PASS "20 steps, cuda vs emulate: losses within 1e-4" \
      || report FAIL "20 steps, cuda vs emulate: losses differ by more than 1e-4"
  else
    report FAIL "20 steps on emulate: $(why emulate)"
  fi
fi

if train bf16 1 train.device=$DEVICE train.precision=bf16; then
  within bf16 cpu 2e-3 && report PASS "20 steps, $DEVICE bf16 vs cpu fp32: losses within 2e-3" \
    || report FAIL "20 steps, $DEVICE bf16 vs cpu fp32: losses differ by more than 2e-3"
else
  report FAIL "20 steps with train.precision=bf16 on $DEVICE: $(why bf16)"
fi

if train static 2 train.device=$DEVICE parallel.pp=2 && \
   train balanced 2 train.device=$DEVICE parallel.pp=2 balance.method=partition-time balance.every=5; then
  cmp -s "$dir/static.loss" "$dir/balanced.loss" && report PASS "static vs balanced on $DEVICE: bit-identical" \
    || report FAIL "static vs balanced on $DEVICE: losses differ"
else
  report FAIL "static vs balanced on $DEVICE: $(why static; why balanced)"
fi

# A checkpoint at step 10 on one device, the last 10 steps on the other.
resume_across() { # FROM TO
  local from=$1 to=$2
  train "ck_$from" 1 train.device="$from" ckpt.dir="$dir/ck_$from" ckpt.every=10 &&
    train "resumed_$to" 1 train.device="$to" ckpt.dir="$dir/resumed_ck_$to" \
      ckpt.resume="$dir/ck_$from/ckpt-10.h5" || return 1
  tail -n 10 "$dir/cpu.loss" > "$dir/tail_cpu.loss"
  tail -n 10 "$dir/resumed_$to.loss" > "$dir/tail_$to.loss"
  within "tail_$to" tail_cpu
}
for pair in "$DEVICE cpu" "cpu $DEVICE"; do
  set -- $pair
  if resume_across "$1" "$2"; then
    report PASS "checkpoint $1 -> $2: steps 11-20 within 1e-4 of the CPU run"
  else
    report FAIL "checkpoint $1 -> $2: $(why "resumed_$2" 2>/dev/null || why "ck_$1")"
  fi
done

# 6. every dynamic scheme on the device against the CPU (RANKS NAME overrides...)
schemes=(
  "1 early-exit dyn.kind=early_exit dyn.exit_from=1 dyn.exit_warmup=2 dyn.exit_threshold=0.05"
  "2 pruning parallel.pp=2 dyn.kind=prune dyn.prune_start=2 dyn.prune_every=2 dyn.prune_steps=4 dyn.sparsity_final=0.8 dyn.csr_sparsity=0.5"
  "2 mod parallel.pp=2 model.mod_every=2 model.mod_capacity=0.25 mod.routing=causal"
  "1 hash model.attention=hash hash.buckets=4"
  "2 moe parallel.pp=2 model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=128"
  "4 moe-ep2 parallel.pp=2 parallel.dp=2 parallel.ep=2 train.micro_batches=1 model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=128"
  "2 freeze parallel.pp=2 dyn.kind=freeze dyn.freeze_every=5 dyn.freeze_max=2")
for scheme in "${schemes[@]}"; do
  set -- $scheme
  ranks=$1 name=$2; shift 2
  if train "$name-cpu" "$ranks" train.device=cpu "$@" && train "$name-dev" "$ranks" train.device=$DEVICE "$@"; then
    within "$name-dev" "$name-cpu" && report PASS "$name on $DEVICE ($ranks ranks): losses within 1e-4 of the CPU" \
      || report FAIL "$name on $DEVICE ($ranks ranks): losses differ from the CPU's by more than 1e-4"
  else
    report FAIL "$name on $DEVICE: $(why "$name-cpu"; why "$name-dev")"
  fi
done
summary
