#!/usr/bin/env bash
# torch.distributed.pipelining's schedules on the reference model (issue 32):
# bench/torch_pipe.py on RANKS ranks (default "2 4", gloo, one process and
# one thread a rank), M micro-batches (default 8), each schedule the
# installed torch has (TORCH_SCHEDULES= chooses, comma-separated). Prints
# one line per run and keeps the outputs in OUT (runs/bench-schedules).
# Needs PyTorch 2.x: TORCH2_PYTHON, by default /work/venv-torch2/bin/python
# (bench/README.md says how to make it); without it, says so and exits 0.
# TORCH_ARGS= adds options of bench/torch_pipe.py (e.g. a smaller model).
# Usage: bench/torch_pipe.sh [STEPS]   (timed steps, default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-10}
python=${TORCH2_PYTHON:-/work/venv-torch2/bin/python}
if [ ! -x "$python" ]; then
  echo "torch-pipe: skipped: no PyTorch 2.x at $python (set TORCH2_PYTHON; bench/README.md)"
  exit 0
fi
# PyPI's torch is built for CUDA and loads its libraries even on the CPU:
# the system's CUDA directory supplies the ones not installed as wheels.
for dir in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64; do
  [ -d "$dir" ] && LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} && break
done
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
out=${OUT:-runs/bench-schedules}; mkdir -p "$out"
for ranks in ${RANKS:-2 4}; do
  OMP_NUM_THREADS=1 "$python" -W ignore bench/torch_pipe.py --ranks "$ranks" \
    --micro-batches "${M:-8}" --steps "$STEPS" ${TORCH_SCHEDULES:+--schedules "$TORCH_SCHEDULES"} ${TORCH_ARGS:-} \
    > "$out/torch-$ranks.out" 2>&1 || { cat "$out/torch-$ranks.out" >&2; exit 1; }
  grep '^torch-pipe: ' "$out/torch-$ranks.out"
done
