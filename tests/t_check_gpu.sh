#!/usr/bin/env bash
# make check-gpu's script (scripts/check_gpu.sh) on the emulated device
# (DEVICE=emulate): every check it makes on a GPU (the table's ops against
# the CPU's, 20 steps against the CPU, 20 bf16 steps against the CPU,
# static vs balanced bit-identical,
# checkpoints device -> cpu -> device, every dynamic scheme including MoE
# with its experts over 2 ranks) runs and passes here, so a lent GPU's
# minutes are not spent finding the script's own mistakes; a DEVICE it
# does not know is exit 2 with one message.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
out=$dir/check_gpu.out
BUILD=$BUILD DEVICE=emulate timeout -k 10 600 scripts/check_gpu.sh > "$out" 2>&1
rc=$?
passes=$(sed -n '/check-gpu summary/,$p' "$out" | grep -c '^  PASS')
if [ $rc -eq 0 ] && grep -q '^check-gpu: all passed' "$out" && [ "$passes" -eq 14 ]; then
  echo "ok: check_gpu.sh on the emulated device: all $passes checks passed"
else
  fail "check_gpu.sh on the emulated device: exit $rc, $passes of 14 passed"
  sed -n '/check-gpu summary/,$p' "$out"
fi
DEVICE=tpu scripts/check_gpu.sh > "$dir/bad.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l < "$dir/bad.out")" -eq 1 ] && grep -q "DEVICE must be cuda or emulate" "$dir/bad.out"; then
  echo "ok: an unknown DEVICE: exit 2, one message"
else fail "an unknown DEVICE: exit $rc: $(head -n 2 "$dir/bad.out")"; fi
finish
