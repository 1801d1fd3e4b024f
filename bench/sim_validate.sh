#!/usr/bin/env bash
# Issue 18's validation: each run that bench/sim_record.sh recorded, fed to
# `dynmo simulate --validate` with its own costs and trajectory; prints the
# median per-step error of the simulated step times against the measured
# ones (the run's own layouts replayed, and the run's own policy simulated),
# and per scheme and rank count whether the simulation ranks static and
# balanced as the measurement does (mean step after the first).
# Usage: bench/sim_validate.sh [DIR]   (default runs/simval)
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
dir=${1:-runs/simval}
printf "%-22s %-26s %-26s %8s %8s %8s %10s\n" run "fitted: replay, policy" "measured: replay, policy" \
  "sim ms" "sim' ms" "meas ms" "layouts"
rm -f "$dir/.means"
for log in "$dir"/*/runlog.h5; do
  run=$(basename "$(dirname "$log")")
  [[ $run == *-dense ]] && continue
  out=$("$DYNMO" simulate --from-run "$dir/$run" --validate --policies static-uniform)
  errors=()
  for costs in fitted measured; do
    lines=$(grep "validation: $costs costs" <<<"$out")
    replay=$(grep -oP 'replay .*?median error \K[0-9.]+' <<<"$lines")
    policy=$(tail -1 <<<"$lines" | grep -oP 'median error \K[0-9.]+')
    errors+=("$replay%, $policy%")
    eval "mean_$costs=$(tail -1 <<<"$lines" | grep -oP 'mean \K[0-9.]+(?= ms simulated)')"
  done
  line=$(grep 'validation: fitted' <<<"$out" | tail -1)
  meas=$(grep -oP 'simulated, \K[0-9.]+(?= measured)' <<<"$line")
  same=$(grep -oP "layout at \K[0-9]+ of [0-9]+" <<<"$line")
  printf "%-22s %-26s %-26s %8s %8s %8s %10s\n" "$run" "${errors[0]}" "${errors[1]}" "$mean_fitted" \
    "$mean_measured" "$meas" "$same"
  speedup=$("$DYNMO" simulate --from-run "$dir/$run" --policies static-uniform,partition-time |
            grep -oP 'best balancer: partition-time, \K[0-9.]+')
  moves=0   # the run's migrations (a balanced run that never moved ran uniform throughout)
  [ -f "$dir/$run.out" ] && moves=$(grep -c 'migrated [0-9]* blocks' "$dir/$run.out" || true)
  echo "$run $meas $speedup $moves" >> "$dir/.means"
done
# Ranking: partition-time against static-uniform, as simulated from each
# run's costs and as measured (the static run's mean step over the
# balanced run's).
sort -u "$dir/.means" | awk '
  { split($1, p, "-"); key = p[1] "-" p[2]; way = p[3]; meas[key, way] = $2; sim[key, way] = $3
    moves[key, way] = $4; keys[key] = 1 }
  END { for (k in keys) if ((k, "static") in meas && (k, "balanced") in meas) {
          m = meas[k, "static"] / meas[k, "balanced"]; a = sim[k, "static"]; b = sim[k, "balanced"];
          verdict = ((a - 1) * (m - 1) > 0 && (b - 1) * (m - 1) > 0) ? "same ranking" : "DIFFERENT ranking"
          # a tie: the simulated balancer keeps the uniform layout and so did the run
          if (a == 1 && b == 1 && moves[k, "balanced"] == 0)
            verdict = sprintf("tie: neither the simulation nor the run moved a block (the measured %+.1f%% is two runs of one layout)", 100 * (m - 1))
          printf "%-14s partition-time over static-uniform: simulated %.3fx (static run'"'"'s costs), %.3fx (balanced run'"'"'s), measured %.3fx: %s\n",
                 k, a, b, m, verdict } }'
rm -f "$dir/.means"
# The migration line (ms = a + b x MB) through the balanced runs' migrations
# (their step lines: "migrated N blocks, X MB, T ms"): what --migration-ms
# and --bandwidth-gbs describe.
cat "$dir"/*-balanced.out 2>/dev/null | grep -oP 'migrated \d+ blocks, \K[0-9.]+ MB, \d+(?= ms)' |
  awk '{ x = $1; y = $3; n++; sx += x; sy += y; sxx += x * x; sxy += x * y }
       END { if (n < 2) exit; b = (n * sxy - sx * sy) / (n * sxx - sx * sx); a = (sy - b * sx) / n;
             printf "migrations: %d, ms = %.1f + %.2f x MB (least squares; %.2f GB/s)\n", n, a, b, (b > 0 ? 1 / b : 0) }'
