#!/usr/bin/env bash
# Repeats of bench/mod_hash_schemes.sh's static uniform and balanced runs,
# interleaved (uniform, balanced, then balanced, uniform, ...) so that the
# machine's load, and its drift, fall on both alike; per scheme and rank count prints each
# run's settled step time, the medians, the median speedup, and the layout
# bound (bench/bound.py) of each uniform run. Same settings as the schemes
# script (hash at HASH_SEQ, default 1024).
# Usage: bench/mod_hash_repeats.sh [REPEATS] [STEPS] [SETTLE] [K]
# SCHEMES= (default "mod hash"), RANKS= (default "2 4"), OUT= the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
REPEATS=${1:-3}; STEPS=${2:-40}; SETTLE=${3:-20}; K=${4:-10}
out=${OUT:-runs/bench-mod-hash-repeats}; mkdir -p "$out"
seq=${HASH_SEQ:-1024}
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for ranks in ${RANKS:-2 4}; do
  for scheme in ${SCHEMES:-mod hash}; do
    common=(parallel.pp="$ranks" parallel.dp=1 train.steps="$STEPS" train.eval_every=0
            run.log_every=10)
    [ "$scheme" = hash ] && common+=(model.max_seq="$seq" train.seq="$seq")
    for r in $(seq 1 "$REPEATS"); do
      ways="uniform balanced"   # odd repeats uniform first, even ones balanced first
      [ $((r % 2)) = 0 ] && ways="balanced uniform"
      for way in $ways; do
        args=(balance.method=none balance.initial=uniform)
        [ "$way" = balanced ] && args=(balance.method=partition-time balance.initial=uniform
                                       balance.every="$K")
        mpiexec -n "$ranks" "$DYNMO" train --config "configs/$scheme.ini" "${common[@]}" \
          run.out_dir="$out/$scheme-$ranks-$way-$r" "${args[@]}" > "$out/$scheme-$ranks-$way-$r.out" 2>&1 ||
          { echo "$scheme-$ranks-$way-$r failed:"; tail -n 3 "$out/$scheme-$ranks-$way-$r.out"; exit 1; }
      done
    done
    mb=$(sed -n 's/^micro_batches *= *//p' "configs/$scheme.ini")
    bounds=""
    for r in $(seq 1 "$REPEATS"); do
      b=$(/usr/bin/python3 bench/bound.py "$out/$scheme-$ranks-uniform-$r/runlog.h5" "$SETTLE" "$STEPS" "$ranks" "$mb" "$DYNMO" |
          sed -n 's/^bound static-uniform: .* = \([0-9.]*x\).*/\1/p')
      bounds="$bounds $b"
    done
    /usr/bin/python3 - "$out" "$scheme" "$ranks" "$SETTLE" "$REPEATS" "$bounds" <<'PY'
import sys, h5py, numpy as np
out, scheme, ranks, settle, reps, bounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6].split()
ms = {w: [] for w in ("uniform", "balanced")}
layout, loss = "", set()
for w in ms:
    for r in range(1, reps + 1):
        f = h5py.File(f"{out}/{scheme}-{ranks}-{w}-{r}/runlog.h5", "r")
        ms[w].append(float(np.mean(f["/steps/step_ms"][settle:])))
        loss.add(float(f["/steps/loss"][-1]))
        if w == "balanced":
            layout = ",".join(str(int(x)) for x in f["/layout/history"][-1][:ranks])
u, b = np.median(ms["uniform"]), np.median(ms["balanced"])
print(f"{scheme}-{ranks}: uniform " + ", ".join(f"{x:.0f}" for x in ms["uniform"]) +
      f" ms (median {u:.1f}); balanced " + ", ".join(f"{x:.0f}" for x in ms["balanced"]) +
      f" ms (median {b:.1f}, final layout {layout}); median speedup {u / b:.3f}x; "
      f"bounds {' '.join(bounds)}; {len(loss)} distinct final loss(es)")
PY
  done
done
