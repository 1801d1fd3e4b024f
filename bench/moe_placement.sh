#!/usr/bin/env bash
# Expert placement (moe.placement, docs/moe.md): configs/moe.ini with
# moe.placement = static, balanced, and balanced with copies of hot experts
# (moe.replicas_max = COPIES, default 2), on 2 ranks (pp=1 dp=2 ep=2) and 4
# ranks (pp=2 dp=2 ep=2), with routing left skewed (no bias, no aux loss,
# no z-loss) and with the config's own balancing (the sigmoid bias and
# the z-loss). Prints per run the busiest expert rank's load over the mean
# (/moe/rank_load, averaged over the MoE blocks and the steps after
# SETTLE), the step time over the same steps, and per pair the share of
# the excess load (busiest / mean - 1) that balanced (and balanced with
# copies) removed and its step-time ratio; checks that both end with the
# losses of static
# (placement never changes what is computed) and fails otherwise.
# Usage: bench/moe_placement.sh [STEPS] [SETTLE] [EVERY]
# (defaults 120, 20, 10); RANKS= "2 4" by default; BIND= and EXTRA= (more
# overrides for every run) as in dyn_schemes.sh; OUT= the runs' folder
# (runs/bench-placement).
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
STEPS=${1:-120}; SETTLE=${2:-20}; EVERY=${3:-10}
out=${OUT:-runs/bench-placement}; mkdir -p "$out"
skewed=(moe.bias_rate=0 moe.aux_loss=0 moe.z_loss=0)
status=0
for ranks in ${RANKS:-2 4}; do
  grid=(parallel.pp=1 parallel.dp=2 parallel.ep=2)
  [ "$ranks" = 4 ] && grid=(parallel.pp=2 parallel.dp=2 parallel.ep=2)
  for routing in skewed default; do
    extra=()
    [ $routing = skewed ] && extra=("${skewed[@]}")
    for placement in static balanced copies; do
      name=$ranks-$routing-$placement
      how=(moe.placement=$placement)
      [ $placement = copies ] && how=(moe.placement=balanced moe.replicas_max="${COPIES:-2}")
      mpiexec ${BIND:+-bind-to "$BIND"} -n "$ranks" "$DYNMO" train --config configs/moe.ini \
        "${grid[@]}" train.steps="$STEPS" run.out_dir="$out/$name" run.log_every=10 \
        balance.every="$EVERY" "${how[@]}" "${extra[@]}" ${EXTRA:-} > "$out/$name.out" 2>&1 ||
        { echo "$name failed: $(tail -n 3 "$out/$name.out")"; exit 1; }
    done
    /usr/bin/python3 - "$out" "$ranks-$routing" "$SETTLE" <<'PY' || status=1
import sys, h5py, numpy as np
out, pair, settle = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = {}
for placement in ("static", "balanced", "copies"):
    f = h5py.File(f"{out}/{pair}-{placement}/runlog.h5", "r")
    load = f["/moe/rank_load"][settle:].mean()
    ms = f["/steps/step_ms"][settle:].mean()
    rows[placement] = (load, ms, f["/steps/loss"][:])
    moves = f["/moe/placement"][:] if "/moe/placement" in f else None
    changed = 0 if moves is None else int((np.diff(moves, axis=0) != 0).any(axis=1).sum())
    print(f"{pair}-{placement:9s} busiest rank {load:.3f}x mean  step {ms:7.1f} ms"
          f"  steps whose placement changed {changed}")
ls, ms_s, loss_s = rows["static"]
failed = 0
for placement in ("balanced", "copies"):
    lb, ms_b, loss_b = rows[placement]
    removed = (ls - lb) / (ls - 1) if ls > 1 else float("nan")
    print(f"{pair}: {placement} removed {100 * removed:.0f}% of the excess load (goal >= 50%),"
          f" step time {placement}/static {ms_b / ms_s:.3f}")
    if loss_s.tobytes() != loss_b.tobytes():
        print(f"{pair}: FAIL: {placement} and static losses differ")
        failed = 1
sys.exit(failed)
PY
  done
done
exit $status
