#!/usr/bin/env bash
# Every path the run will need is checked before the first step, on every
# rank, agreed into one message (issue 15): an unusable ckpt.dir (a
# regular file, a path under a file, a read-only mount, `latest` a
# directory, too little room) or run.out_dir is exit 2 at start-up, not
# after the steps, and a signal then still finds a usable directory. The
# training data's checksum is recorded in checkpoints and checked on
# resume (ckpt.allow_new_data=1 continues on other data on purpose);
# layout counts beyond the model are refused, never wrapped; a `latest`
# of random bytes is never echoed.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/t.ini"
run() { "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/out" "$@"; }
# no_step NAME: the failed run must not have trained a step
no_step() { [ -e "$dir/out/runlog.h5" ] && h5dump -d /steps/loss "$dir/out/runlog.h5" >/dev/null 2>&1 \
  && fail "$1: it trained before failing"; rm -rf "$dir/out"; }

echo x > "$dir/file"
expect_error "ckpt.dir a regular file" "ckpt.dir = .*/file cannot be used" run ckpt.dir="$dir/file"
no_step "ckpt.dir a regular file"
expect_error "ckpt.dir under a file" "ckpt.dir = .*/file/ck cannot be used" run ckpt.dir="$dir/file/ck"
no_step "ckpt.dir under a file"
mkdir -p "$dir/ck1/latest"
expect_error "latest a directory" "ckpt.dir = .*ck1: .*/latest is not a regular file" run ckpt.dir="$dir/ck1"
no_step "latest a directory"
expect_error "run.out_dir under a file" "run.out_dir = .*/file/out cannot be used" \
  "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/file/out"
# the same on 2 ranks: one message
out=$(mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" parallel.pp=2 run.out_dir="$dir/out" \
      ckpt.dir="$dir/file" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && [ "$(grep -c 'error' <<<"$out")" -eq 1 ] && echo "ok: 2 ranks, one message: $out" \
  || fail "2 ranks: exit $rc, messages: $out"
no_step "2 ranks"

# A read-only mount and a file system too small for one checkpoint (root
# only: mount a tmpfs; skipped where mounting is not allowed).
mnt=$dir/mnt
mkdir -p "$mnt"
trap 'umount "$mnt" 2>/dev/null; rm -rf "$dir"' EXIT
if mount -t tmpfs -o size=64k,ro tmpfs "$mnt" 2>/dev/null; then
  expect_error "read-only ckpt.dir" "ckpt.dir = .*mnt is not writable: Read-only file system" \
    run ckpt.dir="$mnt"
  umount "$mnt"
  mount -t tmpfs -o size=64k tmpfs "$mnt"
  expect_error "full ckpt.dir" "ckpt.dir = .*mnt has 0.1 MiB free, but a checkpoint of this run needs about [0-9.]+ MiB" \
    run ckpt.dir="$mnt"
  umount "$mnt"
  no_step "mounts"
else
  echo "skip: cannot mount a tmpfs here (not root?): read-only and full ckpt.dir untested"
fi

# The data checksum: recorded, checked, overridable.
"$DYNMO" prepare --out "$dir/other" /usr/share/common-licenses/Apache-2.0 >/dev/null || fail "prepare other"
run ckpt.dir="$dir/ck2" > "$dir/first.out" 2>&1 || fail "checkpointed run failed: $(tail -n 2 "$dir/first.out")"
sum=$(h5dump -a /data/train_checksum "$dir/ck2/ckpt-4.h5" 2>/dev/null | grep -o '(0): [0-9]*' | cut -d' ' -f2)
[ -n "$sum" ] && [ "$sum" != 0 ] && echo "ok: checkpoint records train_checksum $sum" \
  || fail "train_checksum not recorded (got '$sum')"
expect_error "resume on other data" "was written training on data with checksum [0-9a-f]+, but .*other/train.bin has [0-9a-f]+: .*ckpt.allow_new_data=1" \
  run ckpt.dir="$dir/ck2" train.steps=6 data.train="$dir/other/train.bin"
run ckpt.dir="$dir/ck2" train.steps=6 data.train="$dir/other/train.bin" ckpt.allow_new_data=1 \
  > "$dir/new.out" 2>&1 && grep -q 'resumed from' "$dir/new.out" && echo "ok: ckpt.allow_new_data=1 resumes on other data" \
  || fail "allow_new_data: $(tail -n 2 "$dir/new.out")"

# A model too large for the node is refused before anything is allocated;
# an allocation the system refuses anyway (here an address-space limit)
# is exit 2 and one message, not an internal error.
expect_error "model too large" "this model needs about [0-9.]+ GiB on its busiest rank .* use more stages" \
  run model.layers=96 model.channels=8192 model.heads=64
if [ -z "${SANITIZE:-}" ]; then   # AddressSanitizer cannot run under an address-space limit
  expect_error "out of memory" "out of memory: cannot allocate [0-9.]+ MiB more" \
    bash -c 'ulimit -v 1500000; exec "$@"' - "$DYNMO" train --config "$dir/t.ini" \
    run.out_dir="$dir/oom" model.layers=8 model.channels=1024 model.heads=8
fi

# Layout counts never wrap.
expect_error "explicit count beyond the model" "stage 0 has 4294967300 blocks, more than model.layers = 6" \
  run balance.initial=explicit:4294967300
# A `latest` of random bytes is described, not echoed.
mkdir -p "$dir/ck3"; cp "$dir/ck2/ckpt-4.h5" "$dir/ck3/"
printf '\x01\xfe\x07garbage\x1b[31m' > "$dir/ck3/latest"
run ckpt.dir="$dir/ck3" train.steps=6 > "$dir/garbage.out" 2>&1
grep -q 'something that is no checkpoint name' "$dir/garbage.out" && ! grep -q 'garbage' "$dir/garbage.out" \
  && echo "ok: random latest described: $(grep -o 'resume: .*' "$dir/garbage.out" | head -c 200)" \
  || fail "random latest: $(grep resume "$dir/garbage.out")"
# A run resumed into a new run.out_dir keeps row i = step i + 1: the steps
# before the checkpoint are NaN rows (ranks 0, layout 0), then its own.
run train.steps=6 ckpt.dir="$dir/ck6" ckpt.every=4 run.out_dir="$dir/ref6" > "$dir/ref6.out" 2>&1 \
  || fail "reference run"
mkdir -p "$dir/ck4r"; cp "$dir/ck6/ckpt-4.h5" "$dir/ck4r/"
run ckpt.dir="$dir/ck4r" train.steps=6 run.out_dir="$dir/fresh" > "$dir/fresh.out" 2>&1 \
  || fail "resume into a fresh out_dir: $(tail -n 2 "$dir/fresh.out")"
/usr/bin/python3 - "$dir/fresh/runlog.h5" "$dir/ref6/runlog.h5" <<'PY' && echo "ok: resume into a fresh run.out_dir: rows 1-4 NaN, 5-6 are steps 5-6" || fail "resumed run log rows are off"
import sys, h5py, numpy as np
f, g = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
loss, ranks, layout = f["/steps/loss"][:], f["/steps/ranks"][:], f["/layout/history"][:]
assert len(loss) == 6 and np.isnan(loss[:4]).all() and not np.isnan(loss[4:]).any(), loss
assert (ranks[:4] == 0).all() and (ranks[4:] == 1).all(), ranks
assert (layout[:4] == 0).all() and (layout[4:] == 6).all(), layout
assert f["/layers/fwd_ms"].shape == (6, 6) and np.isnan(f["/layers/fwd_ms"][:4]).all()
assert np.array_equal(loss[4:], g["/steps/loss"][4:6]), (loss, g["/steps/loss"][:])
PY
finish
