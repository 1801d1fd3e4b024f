#!/usr/bin/env bash
# Checkpoint write and read throughput against dd on the same disk.
#
# Writes and loads a checkpoint of at least 500 MB (default: 8 blocks of
# 768 channels, params + Adam m and v: 685 MB) on 2 and 4 ranks, each one
# pipeline stage (every rank writes its blocks), REPEAT times, through
# test_checkpoint's --bench mode; every load is checked value by value (a
# wrong value fails the run). After every run it times dd on the same
# directory: `dd if=/dev/zero bs=1M conv=fsync` for writes (the checkpoint
# is fsynced too) and `dd of=/dev/null bs=1M` of a file whose pages were
# dropped with iflag=nocache for cold reads (the checkpoint's pages are
# dropped the same way, per file, with posix_fadvise before each load).
# Prints every run with its dd and the load average, the median of each
# figure, the ratio of the medians to dd and the median of the run-by-run
# ratios (the fairer figure on a machine shared with other work).
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
status=0
for ranks in $ranks_list; do
  # One save-and-load per mpiexec, each followed by dd, so that every
  # ratio compares figures measured back to back (other work on a shared
  # machine moves both by 2x within minutes). Both start a second after
  # the previous file was deleted: the disk is mounted with discard, and a
  # write right after the deletion of 700 MB runs at half speed or less.
  runs=() dd_write=() dd_read=()
  for i in $(seq "$repeat"); do
    sleep 1
    out=$(mpiexec -n "$ranks" "$bin" "${model[@]}" --pp "$ranks" --repeat 1 --bench "$work/r$ranks" 2>&1)
    rc=$?
    if [ $rc -ne 0 ] || grep -q 'values WRONG' <<<"$out"; then
      echo "$out" | sed 's/^/   /'
      echo "ckpt_bench: the $ranks-rank run failed or loaded wrong values"
      status=1
      continue 2
    fi
    line=$(grep '^bench' <<<"$out")
    bytes=$(awk '{print $9}' <<<"$line")
    mb=$(( (bytes + 1048575) / 1048576 ))
    sleep 1
    w=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count="$mb" conv=fsync 2>&1 | awk '/copied/ {print $1 / $(NF-3) / 1e6}')
    dd if="$work/dd.bin" iflag=nocache count=0 status=none
    r=$(dd if="$work/dd.bin" of=/dev/null bs=1M 2>&1 | awk '/copied/ {print $1 / $(NF-3) / 1e6}')
    rm -f "$work/dd.bin"
    echo "   $line | dd write $w read $r MB/s | load $(cut -d' ' -f1 /proc/loadavg)"
    runs+=("$line") dd_write+=("$w") dd_read+=("$r")
  done
  field() { printf '%s\n' "${runs[@]}" | awk -v f="$1" '{print $f}'; }
  write=$(field 13 | median) read=$(field 17 | median)
  wbest=$(field 13 | sort -g | tail -n1) rbest=$(field 17 | sort -g | tail -n1)
  ddw=$(printf '%s\n' "${dd_write[@]}" | median)
  ddr=$(printf '%s\n' "${dd_read[@]}" | median)
  # The median of the run-by-run ratios, each against the dd right after it.
  wratio=$(paste <(field 13) <(printf '%s\n' "${dd_write[@]}") | awk '{print 100 * $1 / $2}' | median)
  rratio=$(paste <(field 17) <(printf '%s\n' "${dd_read[@]}") | awk '{print 100 * $1 / $2}' | median)
  awk -v n="$ranks" -v b="$bytes" -v w="$write" -v r="$read" -v wb="$wbest" -v rb="$rbest" \
      -v dw="$ddw" -v dr="$ddr" -v wr="$wratio" -v rr="$rratio" 'BEGIN {
    printf "== %d ranks, %.0f MB: write median %.0f MB/s (best %.0f), dd %.0f MB/s: %.0f%% of dd, run by run %.0f%% (target 70%%)\n", n, b / 1e6, w, wb, dw, 100 * w / dw, wr
    printf "== %d ranks, %.0f MB: read  median %.0f MB/s (best %.0f), dd %.0f MB/s: %.0f%% of dd, run by run %.0f%% (target 70%%)\n", n, b / 1e6, r, rb, dr, 100 * r / dr, rr }'
done
exit $status
