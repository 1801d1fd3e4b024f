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
printf "%-22s %8s %8s %10s %10s %10s\n" run replay policy "sim ms" "meas ms" "layouts"
for log in "$dir"/*/runlog.h5; do
  run=$(basename "$(dirname "$log")")
  [[ $run == *-dense ]] && continue
  out=$("$DYNMO" simulate --from-run "$dir/$run" --validate --policies static-uniform)
  replay=$(grep -oP 'validation: replay .*?median error \K[0-9.]+' <<<"$out")
  policy=$(grep -v 'validation: replay' <<<"$out" | grep -oP 'validation: .*?median error \K[0-9.]+' || echo "$replay")
  line=$(grep 'validation:' <<<"$out" | tail -1)
  sim=$(grep -oP 'mean \K[0-9.]+(?= ms simulated)' <<<"$line")
  meas=$(grep -oP 'simulated, \K[0-9.]+(?= measured)' <<<"$line")
  same=$(grep -oP "layout at \K[0-9]+ of [0-9]+" <<<"$line")
  printf "%-22s %7s%% %7s%% %10s %10s %10s\n" "$run" "$replay" "$policy" "$sim" "$meas" "$same"
  echo "$run $sim $meas" >> "$dir/.means"
done
# Ranking: static against balanced, simulated and measured.
sort -u "$dir/.means" | awk '
  { split($1, p, "-"); key = p[1] "-" p[2]; way = p[3]; sim[key, way] = $2; meas[key, way] = $3; keys[key] = 1 }
  END { for (k in keys) if ((k, "static") in sim && (k, "balanced") in sim) {
          s = sim[k, "static"] / sim[k, "balanced"]; m = meas[k, "static"] / meas[k, "balanced"];
          printf "%-16s balanced over static: simulated %.3fx, measured %.3fx: %s\n", k, s, m,
                 ((s - 1) * (m - 1) > 0 || (s < 1.02 && s > 0.98 && m < 1.02 && m > 0.98)) ? "same ranking" : "DIFFERENT ranking" } }'
rm -f "$dir/.means"
