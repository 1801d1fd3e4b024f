#!/usr/bin/env bash
# The pipeline schedules side by side (issue 32): dynmo bench on the
# reference model under each of 1f1b, gpipe, zb and interleaved (V chunks a
# rank, default 2), on RANKS ranks (default "2 4", one stage a rank; 4
# ranks share this machine's 2 cores), M micro-batches (default 8). Prints per run the median step, the bubble and
# the schedule's bound from the measured stage compute (the predictor), and
# fails when a run's loss does not fall (dynmo bench's own check). Then
# torch.distributed.pipelining's schedules on the same model, ranks and
# micro-batches (bench/torch_pipe.sh; skipped with a message without
# PyTorch 2.x, or with TORCH=0), and one table of every run's step against
# dynmo's 1F1B and dynmo's fastest schedule on the same ranks.
# Usage: bench/schedules.sh [STEPS]   (timed steps, default 10)
# BIND= passes mpiexec -bind-to (e.g. BIND=rr); EXTRA= adds overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
STEPS=${1:-10}
out=${OUT:-runs/bench-schedules}; mkdir -p "$out"
results=$out/results.txt; : > "$results"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
for ranks in ${RANKS:-2 4}; do
  for schedule in ${SCHEDULES:-1f1b gpipe zb interleaved}; do
    name=$schedule-$ranks
    chunks=; [ "$schedule" = interleaved ] && chunks=parallel.virtual=${V:-2}
    mpiexec ${BIND:+-bind-to "$BIND"} -n "$ranks" "$DYNMO" bench --config configs/ref.ini \
      parallel.pp="$ranks" parallel.schedule="$schedule" $chunks train.micro_batches="${M:-8}" \
      --steps "$STEPS" ${EXTRA:-} > "$out/$name.out" 2>&1
    median=$(grep -oP 'bench: median \K[0-9.]+' "$out/$name.out")
    bubble=$(grep -oP 'bench: bubble \K[0-9.]+' "$out/$name.out")
    bound=$(grep -oP 'bound from the measured stage compute: \K[0-9.]+' "$out/$name.out" || echo "?")
    printf '%-10s step %8s ms  bubble %5s%%  predicted bound %8s ms\n' "$name" "$median" \
      "$bubble" "$bound"
    echo "$ranks dynmo $schedule $median $bubble" >> "$results"
  done
done
if [ "${TORCH:-1}" != 0 ]; then
  OUT=$out bench/torch_pipe.sh "$STEPS" | tee "$out/torch.txt"
  # torch-pipe: NAME ranks R chunks N step MS ms bubble B% loss ...
  awk '$1 == "torch-pipe:" && $3 == "ranks" { sub("%", "", $11); print $4, "torch", $2, $8, $11 }' \
    "$out/torch.txt" >> "$results"
fi
echo
echo "| ranks | system | schedule | step ms | bubble | step / dynmo 1f1b | step / dynmo's fastest |"
echo "|---|---|---|---|---|---|---|"
sort -s -n -k1,1 "$results" | awk '{ rows[NR] = $0; r = $1
       if ($2 == "dynmo" && $3 == "1f1b") base[r] = $4
       if ($2 == "dynmo" && (!(r in best) || $4 < best[r])) best[r] = $4 }
     END { for (i = 1; i <= NR; i++) { split(rows[i], f, " "); r = f[1]
             b = (r in base) ? sprintf("%.3f", f[4] / base[r]) : "-"
             c = (r in best) ? sprintf("%.3f", f[4] / best[r]) : "-"
             printf "| %s | %s | %s | %.1f | %.1f%% | %s | %s |\n", r, f[2], f[3], f[4], f[5], b, c } }'
