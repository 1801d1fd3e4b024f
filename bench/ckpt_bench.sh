#!/usr/bin/env bash
# Checkpoint write and read throughput against dd on the same disk.
#
# Writes and loads a checkpoint of at least 500 MB (default: 8 blocks of
# 768 channels, params + Adam m and v: 685 MB) on 2 and 4 ranks, each one
# pipeline stage (every rank writes its blocks), REPEAT times, through
# test_checkpoint's --bench mode; every load is checked value by value (a
# wrong value fails the run). Between runs it times dd on the same
# directory: `dd if=/dev/zero bs=1M conv=fsync` for writes (the checkpoint
# is fsynced too) and `dd of=/dev/null bs=1M` of a file whose pages were
# dropped with iflag=nocache for cold reads (the checkpoint's pages are
# dropped the same way, per file, with posix_fadvise before each load).
# Prints every run, the median of each figure, and the ratio to dd.
#
# Usage: bench/ckpt_bench.sh [DIR]   (DIR: where to write, default a new
# directory under /tmp; removed afterwards). Environment: BUILD (build),
# RANKS ("2 4"), REPEAT (5), LAYERS (8), CHANNELS (768).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
bin=$BUILD/tests/test_checkpoint
[ -x "$bin" ] || { echo "ckpt_bench: build $bin first (make BUILD=$BUILD)"; exit 1; }
ranks_list=${RANKS:-"2 4"}
repeat=${REPEAT:-5}
model=(--layers "${LAYERS:-8}" --channels "${CHANNELS:-768}" --heads 12 --vocab 256 --max-seq 256)
if [ $# -ge 1 ]; then
  dir=$1; mkdir -p "$dir"; work=$(mktemp -d "$dir/run.XXXXXX")
else
  work=$(mktemp -d /tmp/dynmo-ckpt-bench.XXXXXX); dir=$work
fi
trap 'rm -rf "$work"' EXIT

median() { sort -g | awk '{v[NR]=$1} END {if (NR) print (NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2)}'; }

echo "== machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, disk $(df -h "$dir" | awk 'NR==2 {print $1, $2}'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== model: ${model[*]}; $repeat runs per world"
dd_write=() dd_read=()
status=0
for ranks in $ranks_list; do
  out=$(mpiexec -n "$ranks" "$bin" "${model[@]}" --pp "$ranks" --repeat "$repeat" --bench "$work/r$ranks" 2>&1)
  rc=$?
  echo "$out" | sed 's/^/   /'
  if [ $rc -ne 0 ] || grep -q 'values WRONG' <<<"$out"; then
    echo "ckpt_bench: the $ranks-rank run failed or loaded wrong values"
    status=1
    continue
  fi
  bytes=$(awk '/^bench/ {print $9; exit}' <<<"$out")
  mb=$(( (bytes + 1048575) / 1048576 ))
  for i in $(seq "$repeat"); do
    w=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count="$mb" conv=fsync 2>&1 | awk '/copied/ {print $1 / $(NF-3) / 1e6}')
    dd if="$work/dd.bin" iflag=nocache count=0 status=none
    r=$(dd if="$work/dd.bin" of=/dev/null bs=1M 2>&1 | awk '/copied/ {print $1 / $(NF-3) / 1e6}')
    dd_write+=("$w") dd_read+=("$r")
  done
  rm -f "$work/dd.bin"
  write=$(awk '/^bench/ {print $13}' <<<"$out" | median)
  read=$(awk '/^bench/ {print $17}' <<<"$out" | median)
  wbest=$(awk '/^bench/ {print $13}' <<<"$out" | sort -g | tail -n1)
  rbest=$(awk '/^bench/ {print $17}' <<<"$out" | sort -g | tail -n1)
  ddw=$(printf '%s\n' "${dd_write[@]}" | median)
  ddr=$(printf '%s\n' "${dd_read[@]}" | median)
  awk -v n="$ranks" -v b="$bytes" -v w="$write" -v r="$read" -v wb="$wbest" -v rb="$rbest" \
      -v dw="$ddw" -v dr="$ddr" 'BEGIN {
    printf "== %d ranks, %.0f MB: write median %.0f MB/s (best %.0f), dd %.0f MB/s: %.0f%% of dd (target 70%%)\n", n, b / 1e6, w, wb, dw, 100 * w / dw
    printf "== %d ranks, %.0f MB: read  median %.0f MB/s (best %.0f), dd %.0f MB/s: %.0f%% of dd (target 70%%)\n", n, b / 1e6, r, rb, dr, 100 * r / dr }'
  dd_write=() dd_read=()
done
exit $status
