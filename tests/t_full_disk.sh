#!/usr/bin/env bash
# A full disk is one message and exit 2, never a crash (issue 15): the run
# log on a 16 KiB file system, and a checkpoint that does not fit on 2 and
# 4 ranks (one message from any number of ranks; MPICH adds its own
# one-line note of the abort). The previous complete checkpoint stays the
# one `latest` names, and resuming from it gives the same losses as a run
# that never failed. Needs root to mount a tmpfs; skipped (77) otherwise.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
mnt=$dir/mnt
mkdir -p "$mnt"
trap 'umount "$mnt" 2>/dev/null; kill -9 $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
if ! mount -t tmpfs -o size=16k tmpfs "$mnt" 2>/dev/null; then
  echo "cannot mount a tmpfs here (not root?)"; exit 77
fi
tiny_config "$dir/t.ini" model.channels=64 train.steps=30
# one_message NAME RC ERRFILE: exit 2, one line of ours on stderr, no crash
one_message() {
  local name=$1 rc=$2 err=$3
  local ours; ours=$(grep -c 'dynmo: error:' "$err")
  if [ "$rc" -eq 2 ] && [ "$ours" -eq 1 ] && ! grep -qiE 'segmentation|signal 11|backtrace|internal error' "$err"; then
    echo "ok: $name: $(grep 'dynmo: error:' "$err")"
  else
    fail "$name: exit $rc, stderr: $(head -c 1500 "$err")"
  fi
}
"$DYNMO" train --config "$dir/t.ini" run.out_dir="$mnt/run" train.steps=200 > "$dir/log.out" 2> "$dir/log.err"
one_message "run log on a full disk" $? "$dir/log.err"
grep -q "cannot write $mnt/run/runlog.h5: No space left on device" "$dir/log.err" || fail "run log: the message names no file"
umount "$mnt"

mount -t tmpfs -o size=6m tmpfs "$mnt"
"$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/full" > "$dir/full.out" 2>&1 || fail "reference run"
bits full /steps/loss
for n in 2 4; do
  rm -rf "${mnt:?}"/*
  mpiexec -n $n "$DYNMO" train --config "$dir/t.ini" parallel.pp=$n ckpt.dir="$mnt/ck" ckpt.every=1 \
    ckpt.keep=3 run.out_dir="$dir/out$n" > "$dir/ck$n.out" 2> "$dir/ck$n.err"
  one_message "checkpoint on a full disk, $n ranks" $? "$dir/ck$n.err"
  grep -q "cannot write $mnt/ck/ckpt-[0-9]*.h5.tmp: No space left on device" "$dir/ck$n.err" \
    || fail "$n ranks: the message names no checkpoint file"
  latest=$(cat "$mnt/ck/latest")
  "$DYNMO" check-ckpt "$mnt/ck/$latest" >/dev/null 2>&1 && echo "ok: $n ranks: latest names $latest, complete" \
    || fail "$n ranks: latest names $latest, which does not check"
done
# resume from what the full disk left, elsewhere, to the end
mkdir -p "$dir/ck"; cp "$mnt/ck/$latest" "$dir/ck/"
cp -r "$dir/out4" "$dir/resumed"
"$DYNMO" train --config "$dir/t.ini" ckpt.dir="$dir/ck" run.out_dir="$dir/resumed" > "$dir/resumed.out" 2>&1 \
  || fail "resume after a full disk: $(tail -n 2 "$dir/resumed.out")"
bits resumed /steps/loss
cmp -s "$dir/full.steps.loss" "$dir/resumed.steps.loss" && echo "ok: resumed after a full disk: losses bit-identical" \
  || fail "resumed after a full disk: losses differ"
finish
