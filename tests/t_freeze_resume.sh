#!/usr/bin/env bash
# Layer freezing across a checkpoint: the scheme's gradient-norm window is
# saved in the checkpoint (/dyn/state, checkpoint_schema/dyn.def), so a run
# stopped at a step inside the window and resumed, on the same world or on
# another pipeline and layout, freezes at the same steps and gives the
# uninterrupted run's losses bit for bit (the test fails with the restore
# disabled: the window refills and blocks freeze 4 steps late). check-ckpt
# and inspect show the file's /dyn; a corrupted state (NaN, negative) is
# reported and refused on resume; another window, a checkpoint without
# state and a run of another dyn.kind each go on and say so in one line; a
# run without freezing writes no /dyn; a window too long to save is exit 2.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
py=/usr/bin/python3
# Window 3 checked every 2 steps: the first check is after step 6 (two
# full windows), then every 2 steps; threshold 100 freezes at every check.
# The checkpoint at step 4 is inside the first window.
tiny_config "$dir/t.ini" model.layers=8 train.steps=14 run.log_every=1 dyn.kind=freeze \
  dyn.freeze_window=3 dyn.freeze_every=2 dyn.freeze_threshold=100
train_limit=300
# run NAME RANKS [overrides...]: t.ini on RANKS ranks
run() { train "$1" "$2" "$dir/t.ini" "${@:3}"; }
# step N and the frozen count its line shows, from step $2 on
decisions() { sed -n 's|^step \([0-9]*\)/14 .*frozen \([0-9]*\)/8.*|\1 \2|p' "$1" | awk -v from="$2" '$1 >= from'; }

run full 2 parallel.pp=2 ckpt.dir="$dir/ck" ckpt.every=4 ckpt.keep=5
run same 2 parallel.pp=2 ckpt.resume="$dir/ck/ckpt-4.h5"
run other 4 parallel.pp=4 balance.initial=explicit:1,1,1,5 ckpt.resume="$dir/ck/ckpt-4.h5"
echo "uninterrupted: $(decisions "$dir/full.out" 1 | awk '{printf "%s:%s ", $1, $2}')"
[ "$(decisions "$dir/full.out" 14)" = "14 5" ] || fail "the uninterrupted run did not freeze 5 blocks by step 14"
for r in same other; do
  grep -q 'resumed from .*ckpt-4.h5 at step 4' "$dir/$r.out" || { fail "$r did not resume at step 4"; continue; }
  if [ "$(decisions "$dir/$r.out" 5)" = "$(decisions "$dir/full.out" 5)" ] && [ -n "$(decisions "$dir/$r.out" 5)" ]; then
    echo "ok: $r: blocks freeze at the uninterrupted run's steps"
  else
    fail "$r: frozen counts of steps 5-14 differ: $(decisions "$dir/$r.out" 5 | tr '\n' ' ') vs $(decisions "$dir/full.out" 5 | tr '\n' ' ')"
  fi
  $py - "$dir/full/runlog.h5" "$dir/$r/runlog.h5" <<'PY' && echo "ok: $r: losses of steps 5-14 bit-identical to the uninterrupted run" || fail "$r: losses differ from the uninterrupted run"
import sys, h5py, numpy as np
a = h5py.File(sys.argv[1], 'r')['/steps/loss'][:].view('<u4')
b = h5py.File(sys.argv[2], 'r')['/steps/loss'][:].view('<u4')
assert len(a) == 14 and len(b) >= 10, (len(a), len(b))
different = np.nonzero(a[-10:] != b[-10:])[0]
assert len(different) == 0, f"first different step: {5 + different[0]}"
PY
done

# The file: the version's datasets plus dyn.def's, the state's header.
"$DYNMO" check-ckpt "$dir/ck/ckpt-4.h5" > "$dir/check.out" 2>&1 \
  && echo "ok: check-ckpt accepts it: $(grep -o 'ok: .*' "$dir/check.out")" || fail "check-ckpt: $(tail -n 2 "$dir/check.out")"
$py - "$dir/ck/ckpt-4.h5" checkpoint_schema/v1.def checkpoint_schema/dyn.def <<'PY' || fail "the checkpoint's /dyn is not dyn.def's"
import re, sys, h5py
listed = []
for schema in sys.argv[2:]:
    listed += re.findall(r'^SCHEMA_DATASET\("([^"]+)", (\w+),', open(schema).read(), re.M)
dtypes = {"FLOAT32": "<f4", "FLOAT64": "<f8", "INT32": "<i4", "INT64": "<i8"}
with h5py.File(sys.argv[1], "r") as f:
    seen = []
    f.visititems(lambda name, obj: seen.append("/" + name) if isinstance(obj, h5py.Dataset) else None)
    assert sorted(seen) == sorted(p for p, _ in listed), (seen, listed)
    for path, kind in listed:
        assert f[path].dtype.str == dtypes[kind] and f[path].fletcher32, path
    assert f["/dyn"].attrs["kind"] == "freeze", dict(f["/dyn"].attrs)
    s = f["/dyn/state"][:]
    assert len(s) == 3 + 8 * 2 * 3 and list(s[:3]) == [3, 8, 4], s[:3]
    assert (s[3:] >= 0).all() and s[3:].max() > 0, s
    print(f"ok: /dyn: kind freeze, /dyn/state {len(s)} float64: window 3, 8 blocks, 4 steps recorded")
PY
"$DYNMO" inspect "$dir/ck/ckpt-4.h5" | grep -q '^  scheme state: dyn.kind = freeze, 51 values (/dyn/state)$' \
  && "$DYNMO" inspect --json "$dir/ck/ckpt-4.h5" | $py -c 'import json, sys; assert json.load(sys.stdin)["dyn_state"] == {"kind": "freeze", "values": 51}' \
  && echo "ok: inspect shows the scheme's state" || fail "inspect does not show the scheme's state"
for bad in nan -1; do
  mkdir -p "$dir/bad$bad"; cp "$dir/ck/ckpt-4.h5" "$dir/bad$bad/ckpt-4.h5"
  $py -c "import sys, h5py; h5py.File(sys.argv[1], 'r+')['/dyn/state'][10] = float(sys.argv[2])" \
    "$dir/bad$bad/ckpt-4.h5" "$bad" || fail "could not write $bad into /dyn/state"
  expect_error "check-ckpt: /dyn/state holding $bad" "/dyn/state of dyn.kind \"freeze\": value 10 .* is $bad," \
    "$DYNMO" check-ckpt "$dir/bad$bad/ckpt-4.h5"
done
expect_error "resume from a NaN in /dyn/state" "ckpt-4.h5: /dyn/state of dyn.kind \"freeze\": value 10" \
  mpiexec -n 1 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/badrun" ckpt.resume="$dir/badnan/ckpt-4.h5"

# Another window: not an error; the window starts again, and the run says so.
run window2 1 dyn.freeze_window=2 ckpt.resume="$dir/ck/ckpt-4.h5" \
  && grep -q "resume: the dyn.kind = freeze state of .*ckpt-4.h5 does not fit this run: its gradient-norm window is 3 steps over 8 blocks, this run's 2 over 8: the window starts again" "$dir/window2.out" \
  && echo "ok: another window: $(grep -o 'resume: .*' "$dir/window2.out")" || fail "another window: $(grep resume "$dir/window2.out")"
expect_error "a window whose state exceeds what a checkpoint holds" \
  "dyn.freeze_window = 1000000 over 68 blocks keeps 136000000 gradient norms, more than a checkpoint holds" \
  mpiexec -n 1 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/huge" model.layers=68 dyn.freeze_window=1000000
# A run that does not freeze writes no /dyn; a freeze run resumed from
# such a file starts its window again and says so; a run of another kind
# resumed from a freeze checkpoint does not use its state and says so.
run dense 1 dyn.kind=none train.steps=2 ckpt.dir="$dir/dense" ckpt.every=2 \
  && h5ls "$dir/dense/ckpt-2.h5" | grep -q '^blocks ' && ! h5ls "$dir/dense/ckpt-2.h5" | grep -q '^dyn ' \
  && echo "ok: a run without freezing writes no /dyn" || fail "a dense checkpoint has /dyn (or none was written)"
run fromdense 1 ckpt.resume="$dir/dense/ckpt-2.h5" \
  && grep -q "resume: .*ckpt-2.h5 holds no dyn.kind = freeze state (written without it): the scheme's state starts again from this step" "$dir/fromdense.out" \
  && echo "ok: from a checkpoint without state: $(grep -o 'resume: .*' "$dir/fromdense.out")" || fail "from a checkpoint without state: $(grep resume "$dir/fromdense.out")"
run otherkind 1 dyn.kind=none ckpt.resume="$dir/ck/ckpt-4.h5" \
  && grep -q "resume: .*ckpt-4.h5 holds the state of dyn.kind = freeze; this run has dyn.kind = none, so it is not used" "$dir/otherkind.out" \
  && echo "ok: another kind: $(grep -o 'resume: .*' "$dir/otherkind.out")" || fail "another kind: $(grep resume "$dir/otherkind.out")"
finish
