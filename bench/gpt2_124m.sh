#!/usr/bin/env bash
# A GPT-2-124M-shaped run (vocab 50,257, 12 layers x 768 channels, 12
# heads, T 1024, random weights) trained for a few steps from a Megatron
# indexed dataset, on 1 rank and on 4 pipeline stages: each run's mean step
# time (steps after the first) and each rank's peak resident memory.
# The dataset (2^20 random GPT-2 ids in documents of 1,024 tokens) is
# written by megatron-core's IndexedDatasetBuilder, imported as
# tests/data/tokens/make_fixtures.py does, from PYTHON (a Python with numpy,
# torch and megatron-core; default /work/venv-fixtures/bin/python).
#
# Usage: bench/gpt2_124m.sh [STEPS]   (default 4; from the repository root,
# after make)
set -eu
steps=${1:-4}
python=${PYTHON:-/work/venv-fixtures/bin/python}
dir=build/bench/gpt2_124m
mkdir -p "$dir"
if [ ! -f "$dir/tokens.idx" ]; then
  "$python" - "$dir/tokens" <<'PY'
import sys
import numpy as np
import torch
sys.path.insert(0, "tests/data/tokens")
from make_fixtures import import_indexed_dataset
indexed_dataset = import_indexed_dataset()
rng = np.random.RandomState(124)
builder = indexed_dataset.IndexedDatasetBuilder(sys.argv[1] + ".bin", dtype=np.uint16)
for d in range(1024):
    builder.add_document(torch.from_numpy(rng.randint(0, 50257, size=1024).astype(np.int64)), [1024])
builder.finalize(sys.argv[1] + ".idx")
PY
fi
model="model.vocab=50257 model.max_seq=1024 model.layers=12 model.heads=12 model.channels=768"
train="train.batch=4 train.seq=1024 train.micro_batches=4 train.steps=$steps train.eval_every=0 \
train.warmup=1 data.train=$dir/tokens data.val=$dir/tokens run.log_every=1"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $(date -u +%Y-%m-%d)"
for ranks in 1 4; do
  out=$dir/run-$ranks
  rm -rf "$out"
  # shellcheck disable=SC2086
  /usr/bin/time -f "peak resident %M KiB (%C)" -o "$dir/time-$ranks.txt" \
    mpiexec -n "$ranks" build/dynmo train --config configs/demo.ini $model $train \
    parallel.pp="$ranks" run.out_dir="$out" > "$dir/train-$ranks.log" 2>&1
  ms=$(sed -n 's/.*| \([0-9.]*\) ms |.*/\1/p' "$dir/train-$ranks.log" | tail -n +2 |
       awk '{s += $1; n++} END {if (n) printf "%.0f", s / n}')
  loss=$(sed -n 's/^step .* | loss \([0-9.]*\) |.*/\1/p' "$dir/train-$ranks.log" | tr '\n' ' ')
  echo "pp=$ranks: mean step ${ms} ms (steps 2-$steps), losses: $loss"
  grep -h "peak\|memory" "$dir/train-$ranks.log" | head -3
done
