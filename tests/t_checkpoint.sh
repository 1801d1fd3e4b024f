#!/usr/bin/env bash
# Checkpoints end to end, outside the training loop:
#  - the reshard chain and in-process faults of test_checkpoint under
#    mpiexec -n 1 and -n 2 (run.sh runs the binary bare, which re-executes
#    itself under -n 4: together P = 1, 2, 4);
#  - `dynmo check-ckpt` on the committed fixtures (tests/data/ckpt/make.sh):
#    exit 0 for valid files, 2 naming the file and the problem otherwise,
#    among them values no run can have written (a step of 10^12, a cursor
#    of 2^62, a file name that disagrees with its step);
#  - an MoE checkpoint of schema version 2 (what dynmo wrote before
#    version 3) is valid and loads, every value as written;
#  - loading each damaged fixture: exit 2 with one error line naming the
#    file and the problem, on a 2-rank world;
#  - resume=auto on assembled directories: a latest naming a missing or a
#    corrupt file falls back to the previous complete checkpoint and says
#    so; a lone .tmp is a fresh start; nothing usable, or another model, is
#    exit 2;
#  - `dynmo inspect` of a checkpoint, text and --json;
#  - a save killed with SIGKILL while it writes a 300 MB file: latest and
#    the previous checkpoint are untouched, resume loads the previous one,
#    and the next save removes the stale .tmp.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DYNMO=${DYNMO:-$BUILD/dynmo}
. tests/lib.sh
T=$BUILD/tests/test_checkpoint
if [ ! -x "$T" ] || [ ! -x "$DYNMO" ]; then
  echo "skip: build $T and $DYNMO first"
  exit 77
fi
work=$(mktemp -d /tmp/dynmo-t-ckpt.XXXXXX)
job=
cleanup() {
  [ -n "$job" ] && kill -9 -- "-$job" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fx=tests/data/ckpt
tiny=(--layers 2 --channels 8 --heads 2 --vocab 16 --max-seq 8)

# expect_ok NAME REGEX CMD...: exit 0 and stdout matching REGEX.
expect_ok() {
  local name=$1 regex=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ]; then fail "$name: exit $rc, want 0: $out"; return; fi
  if ! grep -Eq -- "$regex" <<<"$out"; then fail "$name: output '$out' does not match /$regex/"; return; fi
  echo "ok: $name"
}

for P in 1 2; do
  out=$(mpiexec -n $P "$T" 2>&1) || fail "test_checkpoint on $P ranks: $(tail -n 20 <<<"$out")"
  grep -q "0 failed" <<<"$out" && echo "ok: test_checkpoint on $P ranks"
done

# ---- check-ckpt on the fixtures ------------------------------------------------
expect_ok "check-ckpt good" 'ok: schema version 1, step 10, 2 layers of 8 channels' \
  "$DYNMO" check-ckpt "$fx/good.h5"
expect_ok "check-ckpt other model (a valid file)" 'ok: schema version 1' \
  "$DYNMO" check-ckpt "$fx/other-model.h5"
expect_ok "check-ckpt --quick flipped (structure only)" 'data not read' \
  "$DYNMO" check-ckpt --quick "$fx/flipped.h5"
expect_error "check-ckpt flipped" "flipped.h5: corrupt: Fletcher32 checksum mismatch in /blocks/params" \
  "$DYNMO" check-ckpt "$fx/flipped.h5"
expect_error "check-ckpt truncated" "truncated.h5: .*truncated" \
  "$DYNMO" check-ckpt "$fx/truncated.h5"
expect_error "check-ckpt schema" "schema-v99.h5: schema version 99; this dynmo reads checkpoint schema version 1" \
  "$DYNMO" check-ckpt "$fx/schema-v99.h5"
expect_error "check-ckpt no completion attribute" "no-complete.h5: incomplete: the root attribute complete is missing" \
  "$DYNMO" check-ckpt "$fx/no-complete.h5"
expect_error "check-ckpt missing dataset" "missing-dataset.h5: incomplete: dataset /blocks/adam_v is missing" \
  "$DYNMO" check-ckpt "$fx/missing-dataset.h5"
expect_error "check-ckpt not a checkpoint" "not an HDF5 file" "$DYNMO" check-ckpt "$fx/make.sh"
expect_error "check-ckpt missing file" "no-such.h5: No such file" "$DYNMO" check-ckpt "$fx/no-such.h5"
expect_error "check-ckpt two files, one bad" "1 problem in 1 of 2 files" \
  "$DYNMO" check-ckpt "$fx/good.h5" "$fx/flipped.h5"

# ---- values no run can have written (make.sh) -------------------------------------------
# Each fixture is good.h5 with one field changed and valid checksums: the
# checker and the loader both refuse it, naming the value.
impossible=(
  "step-1e12|/training/step is 1000000000000, beyond any run \(train.steps is an int"
  "steps-disagree|/training: optimizer_steps 9 and lr_schedule_step 10 differ from step 10"
  "cursor-2e62|/data/cursor\[0\] is 4611686018427387904, beyond step 10 x train.batch 64 \+ 64 = 704"
  "cursor-negative|/data/cursor\[0\] is -1 \(negative\)"
  "heads-2e32|/model attributes implausibly large \(.*heads 4294967298"
  "no-batch|the root attribute config has no line \"train.batch = N\""
)
for entry in "${impossible[@]}"; do
  name=${entry%%|*} regex=${entry#*|}
  expect_error "check-ckpt $name" "$name.h5: $regex" "$DYNMO" check-ckpt --quick "$fx/$name.h5"
done
cp "$fx/good.h5" "$work/ckpt-20.h5"
cp "$fx/good.h5" "$work/ckpt-10.h5"
misnamed="ckpt-20.h5: the file name ckpt-20.h5 says step 20 but /training/step is 10"
expect_error "check-ckpt: a file name that disagrees with its step" "$misnamed" \
  "$DYNMO" check-ckpt "$work/ckpt-20.h5"
expect_ok "check-ckpt: a file name that agrees with its step" "ok: schema version 1, step 10" \
  "$DYNMO" check-ckpt "$work/ckpt-10.h5"

# ---- loading damaged files on 2 ranks -------------------------------------------------
load() { mpiexec -n 2 "$T" "${tiny[@]}" "$@"; }
expect_ok "load good" 'loaded .*good.h5: step 10, values as written' load --load "$fx/good.h5"
expect_ok "load good into 1 stage" 'values as written' mpiexec -n 1 "$T" "${tiny[@]}" --load "$fx/good.h5"
# An MoE model's checkpoint of schema version 2, written by the dynmo
# before version 3 (its MoE block's /blocks row padded to a dense block's
# width): still valid, and it loads into 2 stages and into 1, every value
# and the MoE state as written.
moe_tiny=("${tiny[@]}" --moe-every 2 --experts 2 --top-k 2 --expert-hidden 8)
expect_ok "check-ckpt an MoE checkpoint of schema version 2" 'ok: schema version 2, step 10, 2 layers' \
  "$DYNMO" check-ckpt "$fx/schema-v2-moe.h5"
expect_ok "load an MoE checkpoint of schema version 2 (2 stages)" 'schema-v2-moe.h5: step 10, values as written' \
  mpiexec -n 2 "$T" "${moe_tiny[@]}" --load "$fx/schema-v2-moe.h5"
expect_ok "load an MoE checkpoint of schema version 2 (1 stage)" 'values as written' \
  mpiexec -n 1 "$T" "${moe_tiny[@]}" --load "$fx/schema-v2-moe.h5"
expect_error "load an MoE checkpoint into a dense model" "schema-v2-moe.h5: written for a different model: model.moe_every is 2 in the checkpoint but 0 in this run" \
  load --load "$fx/schema-v2-moe.h5"
expect_error "load flipped" "checkpoint .*flipped.h5: corrupt: Fletcher32 checksum mismatch in /blocks/params \(layer 1\)" \
  load --load "$fx/flipped.h5"
expect_error "load truncated" "checkpoint .*truncated.h5: .*truncated" load --load "$fx/truncated.h5"
expect_error "load wrong schema" "checkpoint .*schema-v99.h5: schema version 99" load --load "$fx/schema-v99.h5"
expect_error "load other model" "checkpoint .*other-model.h5: written for a different model: model.channels is 12 in the checkpoint but 8 in this run" \
  load --load "$fx/other-model.h5"
expect_error "load without completion attribute" "no-complete.h5: incomplete" load --load "$fx/no-complete.h5"
expect_error "load missing dataset" "missing-dataset.h5: incomplete: dataset /blocks/adam_v is missing" \
  load --load "$fx/missing-dataset.h5"
for entry in "${impossible[@]}"; do
  name=${entry%%|*} regex=${entry#*|}
  expect_error "load $name" "checkpoint .*$name.h5: $regex" load --load "$fx/$name.h5"
done
expect_error "load a file name that disagrees with its step" "$misnamed" load --load "$work/ckpt-20.h5"
cp "$fx/good.h5" "$work/ckpt-10.h5.tmp"
expect_error "load a .tmp" "ckpt-10.h5.tmp: incomplete: a .tmp file" load --load "$work/ckpt-10.h5.tmp"
expect_error "load missing file" "no-such.h5: No such file" load --load "$work/no-such.h5"

# ---- resume=auto ---------------------------------------------------------------------------
d=$work/dangling; mkdir "$d"; cp "$fx/good.h5" "$d/ckpt-10.h5"; echo ckpt-20.h5 >"$d/latest"
expect_ok "resume: latest names a missing file" \
  "latest names ckpt-20.h5, which does not exist; resuming from the previous complete checkpoint .*/ckpt-10.h5" \
  load --resume "$d"
expect_ok "resume: ... and loads it" "loaded .*/ckpt-10.h5: step 10, values as written" load --resume "$d"
d=$work/dangling-only; mkdir "$d"; echo ckpt-20.h5 >"$d/latest"
expect_error "resume: latest names a missing file, nothing else" \
  "no usable checkpoint in .*dangling-only: .*latest names ckpt-20.h5, which does not exist" \
  load --resume "$d"
d=$work/corrupt-latest; mkdir "$d"; cp "$fx/good.h5" "$d/ckpt-10.h5"
cp "$fx/corrupt-step20.h5" "$d/ckpt-20.h5"; echo ckpt-20.h5 >"$d/latest"
expect_ok "resume: latest names a corrupt file" \
  "ckpt-20.h5: corrupt: Fletcher32 checksum mismatch in /blocks/adam_m .*resuming from the previous complete checkpoint .*/ckpt-10.h5" \
  load --resume "$d"
for bad in truncated schema-v99 no-complete; do
  d=$work/latest-$bad; mkdir "$d"; cp "$fx/good.h5" "$d/ckpt-10.h5"
  cp "$fx/$bad.h5" "$d/ckpt-20.h5"; echo ckpt-20.h5 >"$d/latest"
  expect_ok "resume: latest names a file that is $bad" \
    "ckpt-20.h5: .*resuming from the previous complete checkpoint .*/ckpt-10.h5" load --resume "$d"
done
d=$work/no-latest; mkdir "$d"; cp "$fx/good.h5" "$d/ckpt-10.h5"
expect_ok "resume: no latest" "latest is missing; resuming from the newest complete checkpoint .*/ckpt-10.h5" \
  load --resume "$d"
d=$work/only-tmp; mkdir "$d"; cp "$fx/good.h5" "$d/ckpt-10.h5.tmp"
expect_ok "resume: only a .tmp" "no complete checkpoint in .*only-tmp \(ignoring the incomplete ckpt-10.h5.tmp" \
  load --resume "$d"
d=$work/empty; mkdir "$d"
expect_ok "resume: empty directory" "no checkpoint in .*empty; starting from step 0" load --resume "$d"
d=$work/other; mkdir "$d"; cp "$fx/other-model.h5" "$d/ckpt-10.h5"; echo ckpt-10.h5 >"$d/latest"
expect_error "resume: another model is a config mistake, not a fallback" \
  "ckpt-10.h5: written for a different model: model.channels is 12" load --resume "$d"

# ---- other readers verify our checksums ------------------------------------------------
# The writer appends each chunk's Fletcher32 itself; h5py and h5dump check
# them with HDF5's own filter while reading every dataset of a fresh file.
mpiexec -n 2 "$T" --save "$work/fresh" --step 5 --pp 2 >/dev/null || fail "fresh save failed"
/usr/bin/python3 - "$work/fresh/ckpt-5.h5" checkpoint_schema/v1.def <<'PY' && echo "ok: h5py reads every dataset the schema lists" || fail "h5py could not read $work/fresh/ckpt-5.h5"
import re, sys, h5py
listed = re.findall(r'^SCHEMA_DATASET\("([^"]+)", (\w+),', open(sys.argv[2]).read(), re.M)
dtypes = {"FLOAT32": "<f4", "INT32": "<i4", "INT64": "<i8"}
with h5py.File(sys.argv[1], "r") as f:
    assert f.attrs["kind"] == "checkpoint" and f.attrs["schema_version"] == 1
    seen = []
    f.visititems(lambda name, obj: seen.append("/" + name) if isinstance(obj, h5py.Dataset) else None)
    assert sorted(seen) == sorted(p for p, _ in listed), (seen, listed)
    for path, kind in listed:
        d = f[path]
        assert d.dtype.str == dtypes[kind] and d.fletcher32, (path, d.dtype, d.fletcher32)
        d[...]   # HDF5's own Fletcher32 checks every chunk on the way
PY
h5dump "$work/fresh/ckpt-5.h5" >/dev/null 2>&1 && echo "ok: h5dump reads it" || fail "h5dump failed on a fresh checkpoint"

# ---- inspect ----------------------------------------------------------------------------------
expect_ok "inspect checkpoint" "step: 10 .*" "$DYNMO" inspect "$fx/good.h5"
out=$("$DYNMO" inspect --json "$fx/good.h5") || fail "inspect --json exited $?"
/usr/bin/python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
assert j["kind"] == "checkpoint" and j["step"] == 10, j
assert j["model"]["layers"] == 2 and len(j["blocks"]) == 2, j
assert j["world"] == {"pp": 2, "dp": 1, "ranks": 2} and sum(j["layout"]) == 2, j
assert abs(j["blocks"][1]["sparsity"] - 0.25) < 1e-6 and j["blocks"][0]["sparsity"] == 0, j
' <<<"$out" && echo "ok: inspect --json" || fail "inspect --json: $out"
expect_error "inspect corrupt metadata" "schema-v99.h5: schema version 99" "$DYNMO" inspect "$fx/schema-v99.h5"

# ---- SIGKILL while writing ---------------------------------------------------------------------
k=$work/kill
big=(--layers 8 --channels 512 --heads 8 --vocab 256 --max-seq 64)
mpiexec -n 2 "$T" --save "$k" --step 1 "${big[@]}" >/dev/null || fail "first big save failed"
before=$(md5sum <"$k/ckpt-1.h5")
caught=0
for attempt in 1 2 3; do
  # Its own process group, so that the kill reaches mpiexec and every rank.
  setsid mpiexec -n 2 "$T" --save "$k" --step 2 --fill 1 "${big[@]}" >"$work/kill.out" 2>&1 &
  job=$!
  for i in $(seq 1 4000); do
    # bytes on disk, not the length: the file is at its full length (its
    # chunks holes) as soon as rank 0 has made the skeleton
    size=$(stat -c '%b %B' "$k/ckpt-2.h5.tmp" 2>/dev/null | awk '{print $1 * $2}')
    if [ "${size:-0}" -gt 1000000 ]; then
      kill -9 -- "-$job"
      caught=1
      break
    fi
    kill -0 "$job" 2>/dev/null || break
    sleep 0.005
  done
  wait "$job" 2>/dev/null
  job=
  [ $caught = 1 ] && break
  rm -f "$k/ckpt-2.h5"; echo ckpt-1.h5 >"$k/latest"   # it finished first: try again
done
if [ $caught = 1 ]; then
  echo "ok: killed the writer with $size bytes of ckpt-2.h5.tmp on disk (of $(stat -c %s "$k/ckpt-2.h5.tmp" 2>/dev/null || echo '?'))"
  [ "$(cat "$k/latest")" = ckpt-1.h5 ] || fail "latest changed to '$(cat "$k/latest")'"
  [ ! -e "$k/ckpt-2.h5" ] || fail "a killed writer left ckpt-2.h5"
  [ "$(md5sum <"$k/ckpt-1.h5")" = "$before" ] || fail "the previous checkpoint changed"
  expect_ok "check-ckpt the previous checkpoint" "ok: schema version 1, step 1" "$DYNMO" check-ckpt "$k/ckpt-1.h5"
  expect_ok "resume after the kill loads the previous checkpoint" "loaded .*/ckpt-1.h5: step 1" \
    mpiexec -n 2 "$T" "${big[@]}" --resume "$k"
  mpiexec -n 2 "$T" --save "$k" --step 2 --fill 1 "${big[@]}" >/dev/null || fail "save after the kill failed"
  [ ! -e "$k/ckpt-2.h5.tmp" ] || fail "the stale ckpt-2.h5.tmp survived the next save"
  [ "$(cat "$k/latest")" = ckpt-2.h5 ] || fail "latest does not name ckpt-2.h5 after the next save"
else
  fail "could not catch the writer in the middle of ckpt-2.h5.tmp in 3 attempts"
fi
finish
