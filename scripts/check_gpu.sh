#!/usr/bin/env bash
# make check-gpu: the CUDA backend on a machine with a GPU (docs/gpu.md).
# Runs, in order, and reports each as PASS, FAIL or NOT RUN (and why):
#   1. the plugin $BUILD/libdynmo_cuda.so exists and a GPU answers;
#   2. every op of the plugin's table against the CPU backend, relative
#      error at most 1e-4 ($BUILD/gpu/check_ops cuda);
#   3. a 20-step run with train.device=cuda against the same run on the
#      CPU, losses within 1e-4;
#   4. static and balanced pipeline runs on cuda (2 ranks), losses
#      bit-identical to each other;
#   5. a checkpoint written on cuda at step 10 resumed on the CPU to step
#      20, and one written on the CPU resumed on cuda, losses within 1e-4
#      of the CPU's own 20 steps.
# Exits 0 only when every check passed: a missing piece (no GPU, no
# plugin, a model that does not route through the table yet) is a
# failure with its reason, never a pass.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DYNMO=$PWD/$BUILD/dynmo
export DYNMO_CUDA_PLUGIN=$PWD/$BUILD/libdynmo_cuda.so
dir=$(mktemp -d /tmp/dynmo-check-gpu.XXXXXX)
trap 'rm -rf "$dir"' EXIT
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
if [ ! -f "$DYNMO_CUDA_PLUGIN" ]; then
  report FAIL "plugin: $DYNMO_CUDA_PLUGIN missing (make USE_CUDA=1)"; summary
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  report FAIL "device: nvidia-smi finds no GPU on $(hostname)"; summary
fi
report PASS "device: $(nvidia-smi -L | head -n 1)"

# 2. every op
if "$BUILD/gpu/check_ops" cuda > "$dir/ops.log" 2>&1; then
  report PASS "ops: $(tail -n 1 "$dir/ops.log")"
else
  cat "$dir/ops.log"
  report FAIL "ops: $(tail -n 1 "$dir/ops.log")"
fi

# 3-5. the model on the GPU
"$DYNMO" prepare --out "$dir/data" /usr/share/common-licenses/GPL-3 >/dev/null
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
lr = 3e-3
warmup = 2
[data]
train = $dir/data/train.bin
val = $dir/data/val.bin
INI
train() { # NAME RANKS overrides...: the run's /steps/loss into $dir/NAME.loss as text
  local name=$1 ranks=$2; shift 2
  timeout 600 mpiexec -n "$ranks" "$DYNMO" train --config "$dir/run.ini" \
    run.out_dir="$dir/$name" "$@" > "$dir/$name.out" 2>&1 || return 1
  /usr/bin/python3 -c 'import h5py, sys
for x in h5py.File(sys.argv[1], "r")["/steps/loss"][:]: print("%.9g" % x)' \
    "$dir/$name/runlog.h5" > "$dir/$name.loss"
}
within() { # A B: every loss of A within 1e-4 of B's, same count
  paste "$dir/$1.loss" "$dir/$2.loss" | awk 'NF != 2 {bad = 1} NF == 2 && ($1 - $2 > 1e-4 || $2 - $1 > 1e-4) {bad = 1} END {exit bad}' &&
    [ "$(wc -l < "$dir/$1.loss")" = "$(wc -l < "$dir/$2.loss")" ]
}
why() { grep -m 1 'error' "$dir/$1.out" || tail -n 1 "$dir/$1.out"; }

train cpu 1 train.device=cpu || report FAIL "reference CPU run: $(why cpu)"
if ! train cuda 1 train.device=cuda; then
  report FAIL "20-step run on cuda: $(why cuda)"
  report "NOT RUN" "static vs balanced on cuda: needs the 20-step run on cuda"
  report "NOT RUN" "checkpoints cuda -> cpu -> cuda: need the 20-step run on cuda"
  summary
fi
within cuda cpu && report PASS "20 steps, cuda vs cpu: losses within 1e-4" \
  || report FAIL "20 steps, cuda vs cpu: losses differ by more than 1e-4"

if train static 2 train.device=cuda parallel.pp=2 && \
   train balanced 2 train.device=cuda parallel.pp=2 balance.method=partition-time balance.every=5; then
  cmp -s "$dir/static.loss" "$dir/balanced.loss" && report PASS "static vs balanced on cuda: bit-identical" \
    || report FAIL "static vs balanced on cuda: losses differ"
else
  report FAIL "static vs balanced on cuda: $(why static; why balanced)"
fi

# A checkpoint at step 10 on one device, the last 10 steps on the other.
resume_across() { # FROM TO
  local from=$1 to=$2
  train "ck_$from" 1 train.device="$from" ckpt.dir="$dir/ck_$from" ckpt.every=10 &&
    train "resumed_$to" 1 train.device="$to" ckpt.dir="$dir/ck_$to" \
      ckpt.resume="$dir/ck_$from/ckpt-10.h5" || return 1
  tail -n 10 "$dir/cpu.loss" > "$dir/tail_cpu.loss"
  tail -n 10 "$dir/resumed_$to.loss" > "$dir/tail_$to.loss"
  within "tail_$to" tail_cpu
}
for pair in "cuda cpu" "cpu cuda"; do
  set -- $pair
  if resume_across "$1" "$2"; then
    report PASS "checkpoint $1 -> $2: steps 11-20 within 1e-4 of the CPU run"
  else
    report FAIL "checkpoint $1 -> $2: $(why "resumed_$2" 2>/dev/null || why "ck_$1")"
  fi
done
summary
