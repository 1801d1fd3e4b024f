#!/usr/bin/env bash
# make bench: dynmo's benchmark of the reference config beside the PyTorch
# implementation of the same model, in the same environment, one after the
# other. PyTorch runs as installed and with OMP_WAIT_POLICY=PASSIVE.
# Prints each figure and the ratio; the numbers go to docs/PERFORMANCE.md.
# Last, the MoE scheme (bench/dyn_schemes.sh with SCHEMES=moe: 3 runs of
# configs/moe.ini on 4 ranks, BENCH_MOE_STEPS steps each, default 60).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DYNMO=${DYNMO:-$BUILD/dynmo}
steps=${BENCH_STEPS:-10}
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
echo "== dynmo bench --config configs/ref.ini --steps $steps"
dynmo_out=$("$DYNMO" bench --config configs/ref.ini --steps "$steps" 2>&1) || { echo "$dynmo_out"; echo "bench: dynmo failed"; exit 1; }
grep '^bench:' <<<"$dynmo_out"
dynmo_ms=$(sed -n 's/^bench: median \([0-9.]*\) ms\/step.*/\1/p' <<<"$dynmo_out")

torch_ms_best=""
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  for setting in "installed" "installed --threads 2" "PASSIVE" "PASSIVE --threads 2"; do
    set -- $setting
    if [ "$1" = PASSIVE ]; then envs=(env OMP_WAIT_POLICY=PASSIVE); else envs=(env); fi
    shift
    echo "== PyTorch ($setting): bench/torch_gpt.py --steps $steps $*"
    out=$("${envs[@]}" /usr/bin/python3 bench/torch_gpt.py --steps "$steps" "$@" 2>&1) || { echo "$out"; continue; }
    echo "$out" | sed 's/^/   /'
    ms=$(sed -n 's/.*ms\/step median \([0-9.]*\).*/\1/p' <<<"$out" | head -n1)
    if [ -n "$ms" ] && { [ -z "$torch_ms_best" ] || awk -v a="$ms" -v b="$torch_ms_best" 'BEGIN{exit !(a<b)}'; }; then
      torch_ms_best=$ms
    fi
  done
else
  echo "== PyTorch not installed (python3-torch): skipped"
fi
if [ -n "$torch_ms_best" ] && [ -n "$dynmo_ms" ]; then
  awk -v d="$dynmo_ms" -v t="$torch_ms_best" \
    'BEGIN{printf "== dynmo %.1f ms/step vs PyTorch best %.1f ms/step: dynmo is %.2fx its throughput (target >= 1.5x)\n", d, t, t/d}'
fi
echo "== balancers: dynmo plan --bench"
"$DYNMO" plan --bench 2>&1 | sed 's/^/   /'
echo "== what -ffp-contract=off costs: bench/contract.sh"
BUILD=$BUILD bench/contract.sh 2>&1 | sed 's/^/   /'
echo "== mixture of experts, configs/moe.ini as pp=2 dp=2 ep=2 on 4 ranks: static uniform, static params, balanced; expert skew and layout bound (docs/PERFORMANCE.md)"
moe_steps=${BENCH_MOE_STEPS:-60}
OUT=runs/bench-moe DYNMO=$DYNMO SCHEMES=moe RANKS=4 bench/dyn_schemes.sh "$moe_steps" $((moe_steps / 2)) 10 2>&1 | sed 's/^/   /'
echo "== a hash-attention block against a dense one (issue 17): bench/hash_block.sh"
BUILD=$BUILD bench/hash_block.sh 2>&1 | sed 's/^/   /'
echo "== a MoD block's cost against the tokens it processes (issue 17): bench/mod_block.sh"
BUILD=$BUILD bench/mod_block.sh 2>&1 | sed 's/^/   /'
echo "== mixture of depths and hash attention (issue 17): bench/mod_hash_schemes.sh"
BENCH_MODHASH_STEPS=${BENCH_MODHASH_STEPS:-60}
DYNMO=$DYNMO bench/mod_hash_schemes.sh "$BENCH_MODHASH_STEPS" $((BENCH_MODHASH_STEPS / 2)) 10 2>&1 | sed 's/^/   /'
