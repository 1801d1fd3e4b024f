#!/usr/bin/env bash
# Input files that are not what they claim: each is exit status 2 and one
# message naming the file and the problem, found without blocking (a FIFO
# is never opened, so no rank waits for a writer that never comes).
set -u
. "$(dirname "$0")/lib.sh"
work_dir
T=(configs/ref.ini model.layers=4 model.channels=64 model.max_seq=64 train.seq=64
   train.batch=2 train.steps=6 train.warmup=2 train.eval_every=0
   data.train="$dir/data/train.bin" data.val="$dir/data/val.bin" run.out_dir="$dir/out")
mkfifo "$dir/fifo.bin"

expect_error "FIFO as data.train" "token file $dir/fifo.bin is a FIFO, not a regular file" \
  timeout -k 5 30 "$DYNMO" train --config "${T[@]}" data.train="$dir/fifo.bin"
expect_error "FIFO as data.val" "token file $dir/fifo.bin is a FIFO, not a regular file" \
  timeout -k 5 30 "$DYNMO" train --config "${T[@]}" train.eval_every=2 data.val="$dir/fifo.bin"
expect_error "directory as data.train" "token file $dir/data is a directory, not a regular file" \
  timeout -k 5 30 "$DYNMO" train --config "${T[@]}" data.train="$dir/data"
expect_error "device as data.train" "token file /dev/zero is a character device, not a regular file" \
  timeout -k 5 30 "$DYNMO" train --config "${T[@]}" data.train=/dev/zero
# on 2 ranks: one message, and neither rank waits
out=$(timeout -k 5 60 mpiexec -n 2 "$DYNMO" train --config "${T[@]}" parallel.pp=2 \
      data.train="$dir/fifo.bin" 2>&1 >/dev/null)
rc=$?
n=$(grep -c 'is a FIFO' <<<"$out")
[ $rc -eq 2 ] && [ "$n" -eq 1 ] && echo "ok: 2 ranks, FIFO: one message, exit 2" \
  || fail "2 ranks, FIFO: exit $rc, $n messages: $out"
[ ! -e "$dir/out/runlog.h5" ] || fail "a failed start left a run log behind"
finish
