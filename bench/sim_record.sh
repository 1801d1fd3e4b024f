#!/usr/bin/env bash
# Issue 18's validation runs: each scheme of SCHEMES (default freeze,
# early_exit, prune; also mod, moe and moe16, configs/moe.ini with 16
# experts and top-4) on RANKS ranks (default "2 4"),
# static uniform and balanced (partition-time every K steps), STEPS steps
# (default 120), each run's log kept for `dynmo simulate`
# (bench/sim_validate.sh compares them). Every scheme runs as
# parallel.pp = RANKS except moe, which runs 2 stages: on 2 ranks with its
# experts unsplit (ep=1), on 4 its config's grid (pp=2 dp=2 ep=2). Pruning first trains DENSE dense
# steps on one rank and checkpoints them; its runs resume from there.
# Before each run it waits (up to WAIT seconds, default 300) for the
# 1-minute load average to fall below LOAD (default 1.5): the machine is
# shared, and every run's load before and after goes to OUT/loads.txt.
# NICE (e.g. -20, as root) runs them at that niceness when other jobs
# cannot be stopped. Runs already recorded in OUT (their output ends with the run log's line)
# are kept. UNITS=sublayer records each run with balance.units = sublayer
# instead, named SCHEME-RANKS-WAY-sublayer.
# Usage: bench/sim_record.sh [OUT]   (default runs/simval)
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
out=${1:-runs/simval}; mkdir -p "$out"
K=${K:-10}; DENSE=${DENSE:-100}
prune_args=(dyn.prune_start=$DENSE)
quiet() {
  local waited=0
  while awk -v max="${LOAD:-1.5}" '{ exit !($1 >= max) }' /proc/loadavg && [ $waited -lt "${WAIT:-300}" ]; do
    sleep 5; waited=$((waited + 5))
  done
}
if [[ " ${SCHEMES:-freeze early_exit prune} " == *" prune "* && ! -e "$out/prune-dense/ckpt-$DENSE.h5" ]]; then
  "$DYNMO" train --config configs/prune.ini parallel.pp=1 train.steps=$DENSE "${prune_args[@]}" \
    ckpt.dir="$out/prune-dense" ckpt.every=$DENSE run.out_dir="$out/prune-dense" > "$out/prune-dense.out" 2>&1
fi
for ranks in ${RANKS:-2 4}; do
  for scheme in ${SCHEMES:-freeze early_exit prune}; do
    grid=(parallel.pp="$ranks" parallel.dp=1)   # one stage a rank (configs/hash.ini has dp=2)
    config=$scheme
    if [ $scheme = moe ] || [ $scheme = moe16 ]; then   # 2 ranks: 2 stages, experts unsplit; 4: the config's 2 x 2, ep=2
      grid=(parallel.pp=2 parallel.dp=1 parallel.ep=1)
      [ "$ranks" = 4 ] && grid=()
      # moe16: the LLaMA-MoE-3.5B-like routing, 16 experts and top-4 (bench/sim_paper.sh)
      [ $scheme = moe16 ] && config=moe && grid+=(model.experts=16 model.top_k=4)
    fi
    for way in static balanced; do
      args=(balance.method=none balance.initial=uniform)
      [ $way = balanced ] && args=(balance.method=partition-time balance.initial=uniform balance.every=$K)
      extra=(train.steps=${STEPS:-120})
      [ $scheme = prune ] && extra=(train.steps=$((DENSE + 60)) "${prune_args[@]}"
                                    ckpt.resume="$out/prune-dense/ckpt-$DENSE.h5")
      name=$scheme-$ranks-$way
      # UNITS=sublayer: the runs with a block's attention and MLP as units
      # (their per-unit costs drive bench/sim_paper.sh's sub-block columns)
      [ "${UNITS:-block}" = sublayer ] && name=$name-sublayer && args+=(balance.units=sublayer)
      grep -q "^  run log: " "$out/$name.out" 2>/dev/null && continue   # recorded already
      quiet
      before="$(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T)"
      ${NICE:+nice -n "$NICE"} mpiexec -n "$ranks" "$DYNMO" train --config configs/$config.ini "${grid[@]}" \
        run.out_dir="$out/$name" run.log_every=1 "${args[@]}" "${extra[@]}" > "$out/$name.out" 2>&1
      echo "$name: load $before, after $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T)" >> "$out/loads.txt"
    done
  done
done
