#!/usr/bin/env bash
# Units of placement (issue 30, docs/balance.md "Units of placement"): each
# dynamism scheme on RANKS ranks (default "2 4"; 4 ranks share this machine's
# 2 cores) four ways -- static uniform, static params, balanced with whole
# blocks and balanced with sublayer units (partition-time every K steps) --
# and prints each run's mean step time over steps SETTLE..STEPS, the speedup
# of each balanced run over the best static one, and the two layout bounds
# of the static uniform run (bench/bound.py: whole blocks, and sublayer
# units from the halves' own measured costs). The static uniform run has
# balance.units = sublayer (a static layout of whole blocks) so that its
# log holds both profiles. Every run of a scheme and rank count must end
# with the same loss bits (balancing never changes the math): the script
# says so or fails.
# Usage: bench/sublayer.sh [K]; SCHEMES= (default "freeze early_exit prune hash
# mod"), RANKS= (default "2 4"), OUT= the runs' folder.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
K=${1:-10}
out=${OUT:-runs/bench-sublayer}; mkdir -p "$out"
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
mean_ms() { /usr/bin/python3 -c 'import sys, h5py
ms = h5py.File(sys.argv[1], "r")["/steps/step_ms"][int(sys.argv[2]):]
print(f"{ms.mean():.1f}")' "$1" "$2"; }
for ranks in ${RANKS:-2 4}; do
  for scheme in ${SCHEMES:-freeze early_exit prune hash mod}; do
    # per scheme: its config, its steps and the settled window's first step
    extra=()
    case $scheme in
      freeze) steps=240 settle=180 ;;
      early_exit) steps=80 settle=40 ;;
      prune) steps=60 settle=30   # pruned from step 10 to 90% by step 25
             extra=(dyn.prune_start=10 dyn.prune_every=5 dyn.prune_steps=4) ;;
      hash) steps=40 settle=20 extra=(model.max_seq=1024 train.seq=1024) ;;
      mod) steps=60 settle=30 ;;
      *) echo "bench/sublayer.sh: unknown scheme '$scheme'" >&2; exit 2 ;;
    esac
    m=$(sed -n 's/^micro_batches = //p' configs/$scheme.ini)
    declare -A ms=()
    for way in uniform params block sublayer; do
      case $way in
        uniform) args=(balance.units=sublayer balance.method=none balance.initial=uniform) ;;
        params) args=(balance.method=none balance.initial=params) ;;
        block) args=(balance.method=partition-time balance.initial=uniform balance.every="$K") ;;
        sublayer) args=(balance.units=sublayer balance.method=partition-time
                        balance.initial=uniform balance.every="$K") ;;
      esac
      name=$scheme-$ranks-$way
      mpiexec -n "$ranks" "$DYNMO" train --config configs/$scheme.ini parallel.pp="$ranks" \
        parallel.dp=1 train.steps="$steps" train.eval_every=0 run.log_every=10 \
        run.out_dir="$out/$name" "${extra[@]}" "${args[@]}" > "$out/$name.out" 2>&1 \
        || { echo "bench/sublayer.sh: $name failed (see $out/$name.out)" >&2; exit 1; }
      h5dump -b LE -d /steps/loss -o "$out/$name.loss" "$out/$name/runlog.h5" > /dev/null
      cmp -s "$out/$scheme-$ranks-uniform.loss" "$out/$name.loss" \
        || { echo "bench/sublayer.sh: $name's losses differ from the uniform run's" >&2; exit 1; }
      ms[$way]=$(mean_ms "$out/$name/runlog.h5" "$settle")
    done
    bounds=$(/usr/bin/python3 bench/bound.py "$out/$scheme-$ranks-uniform/runlog.h5" "$settle" \
             "$steps" "$ranks" "$m" "$DYNMO" | grep '^bound')
    bb=$(echo "$bounds" | sed -n 's/^bound static-\(uniform\|params\):.* = \([0-9.]*\)x$/\2/p' \
         | sort -g | head -n 1)
    bs=$(echo "$bounds" | sed -n 's/^bound sublayer:.* = \([0-9.]*\)x$/\1/p')
    /usr/bin/python3 - "$scheme" "$ranks" "$settle" "$steps" "${ms[uniform]}" "${ms[params]}" \
      "${ms[block]}" "${ms[sublayer]}" "$bb" "$bs" <<'PY'
import sys
scheme, ranks, settle, steps = sys.argv[1:5]
u, p, b, s, bb, bs = map(float, sys.argv[5:11])
best = min(u, p)
print(f"{scheme} on {ranks} ranks, steps {settle}-{steps}: static uniform {u:.1f} ms, "
      f"static params {p:.1f} ms, balanced blocks {b:.1f} ms ({best / b:.3f}x; bound "
      f"{bb:.3f}x, {100 * (best / b) / bb:.1f}% of it), balanced sublayer {s:.1f} ms "
      f"({best / s:.3f}x; bound {bs:.3f}x, {100 * (best / s) / bs:.1f}% of it); "
      f"losses bit-identical")
PY
    unset ms
  done
done
