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

# A run refused at start-up leaves nothing it created: not run.out_dir nor
# its parents, not ckpt.dir, not a run log (each rank undoes what it made;
# what existed before stays).
left() { # left NAME: fails when anything under $dir/new exists
  if [ -e "$dir/new" ]; then fail "$1 left $(cd "$dir" && find new | tr '\n' ' ')"
  else echo "ok: $1 left nothing behind"; fi
}
expect_error "a model too large for the disk of ckpt.dir" "a checkpoint of this run needs about" \
  timeout -k 5 60 mpiexec -n 2 "$DYNMO" train --config "${T[@]}" parallel.pp=2 model.channels=8192 \
  model.heads=64 model.layers=64 run.out_dir="$dir/new/a/b" ckpt.dir="$dir/new/ck/x"
left "a model too large for the disk"
expect_error "a model too large for memory" "this model needs about .* GiB on its busiest rank" \
  timeout -k 5 60 mpiexec -n 2 "$DYNMO" train --config "${T[@]}" parallel.pp=2 model.channels=8192 \
  model.heads=64 model.layers=64 run.out_dir="$dir/new/a/b"
left "a model too large for memory"
timeout -k 5 60 "$DYNMO" train --config "${T[@]}" run.out_dir="$dir/first" ckpt.dir="$dir/ck" \
  ckpt.every=2 train.steps=2 > "$dir/first.out" 2>&1 || fail "the checkpointed run: exit $?"
expect_error "a checkpoint of another model" "written for a different model: model.channels" \
  timeout -k 5 60 mpiexec -n 2 "$DYNMO" train --config "${T[@]}" parallel.pp=2 model.channels=32 \
  run.out_dir="$dir/new/run" ckpt.dir="$dir/new/ck" ckpt.resume="$dir/ck/ckpt-2.h5"
left "a checkpoint of another model"
# A runlog.h5 in run.out_dir is continued or replaced only when it is one.
mkdir -p "$dir/notlog" && echo "my notes" > "$dir/notlog/runlog.h5"
expect_error "a runlog.h5 that is no run log" "holds runlog.h5, which is not a dynmo run log \(not HDF5 or damaged\)" \
  timeout -k 5 60 "$DYNMO" train --config "${T[@]}" run.out_dir="$dir/notlog"
cp "$dir/ck/ckpt-2.h5" "$dir/notlog/runlog.h5"
expect_error "a checkpoint named runlog.h5" "which is not a dynmo run log \(a dynmo checkpoint\)" \
  timeout -k 5 60 "$DYNMO" train --config "${T[@]}" run.out_dir="$dir/notlog"
cmp -s "$dir/ck/ckpt-2.h5" "$dir/notlog/runlog.h5" || fail "a checkpoint named runlog.h5 was replaced"
mkdir -p "$dir/new/mine"
expect_error "a checkpoint of another model into a directory of the user's" "written for a different model" \
  timeout -k 5 60 "$DYNMO" train --config "${T[@]}" model.channels=32 run.out_dir="$dir/new/mine/run" \
  ckpt.resume="$dir/ck/ckpt-2.h5"
[ -d "$dir/new/mine" ] && [ ! -e "$dir/new/mine/run" ] && echo "ok: the user's directory stays, ours went" \
  || fail "a failed start in a directory of the user's: $(cd "$dir" && find new | tr '\n' ' ')"
finish
