#!/usr/bin/env bash
# Issue 6 and 16 measurements: each dynamism scheme (freeze, early_exit, moe) three
# ways -- static uniform, static params, balanced (partition-time every
# K steps) -- on RANKS ranks (default "2 4"; 4 ranks share this machine's
# 2 cores; moe runs its config's pp=2 dp=2 ep=2, on 4 ranks only). Prints
# the summary throughput, mean bubble and imbalance of the steps after
# SETTLE, per run; for moe also the expert skew (bench/moe_skew.py) and the
# layout bound (bench/bound.py) of the static uniform run. Usage: bench/dyn_schemes.sh [STEPS] [SETTLE] [K]
# BIND= passes mpiexec -bind-to (e.g. BIND=rr: 4 ranks on 2 cores as
# 0,1,0,1; stages on one core then form a sharing group, docs/pipeline.md).
# EXTRA= adds overrides to every run (e.g. EXTRA=parallel.turns=0).
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
STEPS=${1:-120}; SETTLE=${2:-60}; K=${3:-10}
out=${OUT:-runs/bench-dyn}; mkdir -p "$out"
for ranks in ${RANKS:-2 4}; do
  for scheme in ${SCHEMES:-freeze early_exit moe}; do
    # moe: its config's pp=2 dp=2 ep=2 (4 ranks only); the others: one stage a rank
    grid=(parallel.pp="$ranks")
    if [ $scheme = moe ]; then [ "$ranks" = 4 ] || continue; grid=(parallel.pp=2 parallel.dp=2 parallel.ep=2); fi
    for way in uniform params balanced; do
      args=(balance.method=none balance.initial=uniform)
      [ $way = params ] && args=(balance.method=none balance.initial=params)
      [ $way = balanced ] && args=(balance.method=partition-time balance.initial=uniform balance.every=$K)
      name=$scheme-$ranks-$way
      mpiexec ${BIND:+-bind-to "$BIND"} -n "$ranks" "$DYNMO" train --config configs/$scheme.ini "${grid[@]}" \
        train.steps="$STEPS" run.out_dir="$out/$name" run.log_every=1 "${args[@]}" ${EXTRA:-} > "$out/$name.out" 2>&1
      /usr/bin/python3 - "$out/$name/runlog.h5" "$SETTLE" "$name" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r'); s = int(sys.argv[2])
step_ms = f['/steps/step_ms'][s:] if '/steps/step_ms' in f else None
keys = list(f['/steps'].keys())
def get(k): return f['/steps/' + k][s:] if k in keys else np.array([np.nan])
ms = get('step_ms')
print(f"{sys.argv[3]:28s} step {np.mean(ms):7.1f} ms  bubble {np.mean(get('bubble_ratio')):.3f}"
      f"  imbalance {np.mean(get('imbalance')):.3f}")
PY
    done
    if [ $scheme = moe ]; then   # the expert skew and the layout bound of the static uniform run
      /usr/bin/python3 bench/moe_skew.py "$out/$scheme-$ranks-uniform/runlog.h5" "$SETTLE" "$STEPS" 2 | tail -n 1
      /usr/bin/python3 bench/bound.py "$out/$scheme-$ranks-uniform/runlog.h5" "$SETTLE" "$STEPS" 2 \
        "$(sed -n 's/^micro_batches = //p' configs/moe.ini)" "$DYNMO" | grep '^bound'
    fi
  done
done
