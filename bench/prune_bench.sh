#!/usr/bin/env bash
# Pruning benchmark (issue 7, docs/PERFORMANCE.md "Pruning"): configs/prune.ini
# on 2 and 4 pipeline stages with four layouts: static uniform, static by
# parameters, dynmo partition-params and dynmo partition-time (every 5 steps).
# Prints the mean step time and throughput in each phase of the schedule
# (dense; 52%, 79%, 89%, 90% sparsity), the speedup of the best balanced over
# the best static layout after the last pruning step, and beside it the
# layout bound: `dynmo plan` on the costs profiled in the static run (the
# predicted step time of the static layout over that of the optimal
# partition). The dense phase (600 steps) is trained once on 1 rank, with
# a checkpoint at step 600 that every measured run resumes from (the
# checkpoint is logical: it loads on any rank count and layout), so each
# measured run is the last 100 steps: pruning before 0-based steps 600,
# 610, ..., 640, then 60 steps at 90%.
# Usage: bench/prune_bench.sh [BUILD_DIR] [OUT_DIR] [RANKS...]
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-runs/prune-bench}; shift $(( $# > 2 ? 2 : $# ))
RANKS=${*:-2 4}
DYNMO=$BUILD/dynmo
mkdir -p "$OUT"
DENSE=$OUT/dense-ckpt/ckpt-600.h5
if [ ! -f "$DENSE" ]; then
  echo "== dense phase: 1 rank, steps 1-600 (checkpoint), then 601-700 (the 1-rank losses)"
  "$DYNMO" train --config configs/prune.ini parallel.pp=1 run.out_dir="$OUT/1-dense" \
    run.log_every=100 ckpt.dir="$OUT/dense-ckpt" ckpt.every=600 ckpt.keep=2 \
    ckpt.resume=none > "$OUT/1-dense.log" 2>&1
fi
for r in $RANKS; do
  for v in uniform params partition-params partition-time; do
    case $v in
      uniform) extra=() ;;
      params) extra=(balance.initial=params) ;;
      *) extra=(balance.method=$v balance.every=5) ;;
    esac
    echo "== $r ranks, $v"
    rm -rf "$OUT/$r-$v"   # a run log appends: an old one would mix with this run's rows
    mpiexec -n "$r" "$DYNMO" train --config configs/prune.ini parallel.pp="$r" \
      run.out_dir="$OUT/$r-$v" run.log_every=10 ckpt.resume="$DENSE" "${extra[@]}" \
      > "$OUT/$r-$v.log" 2>&1
    grep -E "^step (610|620|630|640|700)/" "$OUT/$r-$v.log" | cut -c1-160 || true
  done
done
/usr/bin/python3 - "$OUT" "$DYNMO" $RANKS <<'PY'
import sys, subprocess, h5py, numpy as np
out, dynmo, ranks = sys.argv[1], sys.argv[2], [int(r) for r in sys.argv[3:]]
C, tokens = 128, 8 * 64
# Rows of the resumed run's log: row i is 0-based step 600 + i.
phases = [("dense", 1, 10), ("52%", 11, 20), ("79%", 21, 30), ("89%", 31, 40), ("90%", 41, 100)]
variants = ["uniform", "params", "partition-params", "partition-time"]
reference = h5py.File(f"{out}/1-dense/runlog.h5", "r")["/steps/loss"][600:700]
for r in ranks:
    for v in variants:
        loss = h5py.File(f"{out}/{r}-{v}/runlog.h5", "r")["/steps/loss"][:]
        same = np.array_equal(loss, reference)
        print(f"{r} ranks {v}: losses {'bit-identical to' if same else 'DIFFER from'} the 1-rank run")
for r in ranks:
    print(f"\n{r} ranks ({r} stages on 2 cores): ms/step (tokens/s) by phase")
    print("%-18s" % "layout" + "".join("%18s" % p[0] for p in phases))
    final = {}
    for v in variants:
        ms = h5py.File(f"{out}/{r}-{v}/runlog.h5", "r")["/steps/step_ms"][:]
        cells = []
        for name, a, b in phases:
            m = float(np.median(ms[a:b]))
            cells.append("%8.0f (%6.0f)" % (m, tokens / m * 1e3))
        final[v] = float(np.median(ms[41:100]))
        print("%-18s" % v + "".join("%18s" % c for c in cells))
    f = h5py.File(f"{out}/{r}-uniform/runlog.h5", "r")
    fwd = f["/layers/fwd_ms"][41:100].mean(axis=0)
    bwd = f["/layers/bwd_ms"][41:100].mean(axis=0)
    sp = f["/layers/sparsity"][-1]
    print("per-layer sparsity at the end:", " ".join("%.2f" % s for s in sp))
    dense = 12 * C * C + 13 * C
    csv = f"{out}/{r}-costs.csv"
    with open(csv, "w") as fh:
        fh.write("layer,fwd_ms,bwd_ms,params,mem_bytes\n")
        for l in range(len(fwd)):
            p = dense - sp[l] * 12 * C * C
            fh.write(f"{l},{fwd[l]:.4f},{bwd[l]:.4f},{p:.0f},{int(16 * p)}\n")
    plan = subprocess.run([dynmo, "plan", "--costs", csv, "--stages", str(r), "--micro-batches", "4",
                           "--method", "static-uniform,static-params,partition-time"],
                          capture_output=True, text=True).stdout
    print(plan.strip())
    pred, method = {}, None
    for line in plan.splitlines():
        if line.startswith("method:"): method = line.split()[1]
        if line.startswith("step_ms:"): pred[method] = float(line.split()[1])
    bound = min(pred["static-uniform"], pred["static-params"]) / pred["partition-time"]
    best_static = min(final["uniform"], final["params"])
    best_bal = min(final["partition-params"], final["partition-time"])
    print(f"after the last pruning step: best static {best_static:.0f} ms, best balanced "
          f"{best_bal:.0f} ms: speedup {best_static / best_bal:.2f}x "
          f"(time-based {final['partition-time']:.0f} ms, params-based {final['partition-params']:.0f} ms); "
          f"layout bound {bound:.2f}x; measured / bound {best_static / best_bal / bound:.0%}")
PY
