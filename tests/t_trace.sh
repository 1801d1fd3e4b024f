#!/usr/bin/env bash
# `dynmo trace` (issue 19): a real 2-stage run traces steps 2 and 3 (a
# random re-balance every 2 steps moves blocks before step 3); its Chrome
# trace JSON must follow the trace-event format (every event has ph, ts,
# pid and tid; complete events have a non-negative dur; each rank's events
# are in time order; one process per rank named "rank N", one track per
# instruction kind, named) and match the run log's own numbers: one event
# per row of /trace/events with its step, rank, stage, op, micro-batch,
# wall and CPU time, and, inside a step, the same start times relative to
# each other. Bad input is exit 2 with one message and no file written:
# a run without a trace, a file that is not a run log, an unwritable
# --out.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
work_dir
py=/usr/bin/python3
tiny_config "$dir/t.ini" parallel.pp=2 run.trace_from=2 run.trace_steps=2 \
  balance.method=random balance.every=2
timeout -k 10 120 mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/traced" \
  > "$dir/traced.out" 2>&1 || { fail "traced run exited $?"; tail -n 5 "$dir/traced.out"; finish; }
out=$("$DYNMO" trace "$dir/traced/runlog.h5" --out "$dir/trace.json" 2>&1) \
  || fail "dynmo trace exited $?: $out"
echo "$out"
grep -q "instructions of steps 2 to 3 on 2 ranks" <<<"$out" || fail "trace summary: $out"

$py - "$dir/trace.json" "$dir/traced/runlog.h5" <<'PY' && echo "ok: the trace JSON follows the format and the run log" \
  || fail "the trace JSON does not follow the trace-event format or the run log"
import json, sys, h5py
from collections import defaultdict
doc = json.load(open(sys.argv[1]))
rows = h5py.File(sys.argv[2], "r")["/trace/events"][:]
events = doc["traceEvents"]
problems = []
for i, e in enumerate(events):
    missing = [k for k in ("ph", "ts", "pid", "tid", "name") if k not in e]
    if missing: problems.append(f"event {i} lacks {missing}: {e}")
    elif e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
        problems.append(f"event {i}: complete event with dur {e.get('dur')}")
    elif e["ph"] not in ("X", "M"): problems.append(f"event {i}: phase {e['ph']}")
last = {}
for e in events:
    if e.get("ph") != "X": continue
    if e["ts"] < last.get(e["pid"], float("-inf")):
        problems.append(f"rank {e['pid']}: event at {e['ts']} after one at {last[e['pid']]}")
    last[e["pid"]] = e["ts"]
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
         if e.get("ph") == "M" and e["name"] == "thread_name"}
procs = {e["pid"]: e["args"]["name"] for e in events
         if e.get("ph") == "M" and e["name"] == "process_name"}
if procs != {0: "rank 0", 1: "rank 1"}: problems.append(f"process names {procs}")
x = [e for e in events if e.get("ph") == "X" and e.get("cat") != "step"]
if len(x) != len(rows): problems.append(f"{len(x)} instruction events, the log has {len(rows)} rows")
labels = {0: "receive activation", 1: "forward", 2: "send activation", 3: "receive gradient",
          4: "backward", 5: "send gradient", 6: "gradient sums", 7: "optimizer"}
# match each row to its event by (step, rank, op, micro-batch): unique keys
by_key = {(e["args"]["step"], e["pid"], e["tid"], e["args"]["micro_batch"]): e for e in x}
if len(by_key) != len(x): problems.append("two events share step, rank, op, micro-batch")
origin = {}
for r in rows:
    step, rank, stage, op, mb, start, wall, cpu = r
    key = (int(step), int(rank), int(op), int(mb))
    e = by_key.get(key)
    if e is None: problems.append(f"no event for row {list(r)}"); continue
    if e["name"] != labels[int(op)] or names.get((e["pid"], e["tid"])) != labels[int(op)]:
        problems.append(f"row {key}: named {e['name']}, track {names.get((e['pid'], e['tid']))}")
    if e["args"]["stage"] != int(stage): problems.append(f"row {key}: stage {e['args']['stage']}")
    if abs(e["dur"] - wall * 1000) > 1e-3 or abs(e["args"]["cpu_ms"] - cpu) > 1e-6 \
            or abs(e["args"]["wall_ms"] - wall) > 1e-6:
        problems.append(f"row {key}: dur {e['dur']} us, wall {wall} ms, cpu {cpu}")
    # inside a step, every event sits at its start plus one offset for the step
    offset = e["ts"] - start * 1000
    if abs(offset - origin.setdefault(int(step), offset)) > 1e-3:
        problems.append(f"row {key}: ts {e['ts']} is not start {start} ms + the step's offset")
for p in problems[:20]: print(p)
print(f"{len(events)} events, {len(x)} instructions, {len(rows)} rows, tracks {sorted(set(names.values()))}")
sys.exit(1 if problems else 0)
PY

# bad input
timeout -k 10 60 "$DYNMO" train --config "$dir/t.ini" parallel.pp=1 run.trace_from=0 train.steps=1 \
  balance.method=none run.out_dir="$dir/plain" > "$dir/plain.out" 2>&1 || fail "untraced run exited $?"
expect_error "trace of a run without a trace" "has no traced steps \(/trace/events is missing: train with run.trace_from" \
  "$DYNMO" trace "$dir/plain/runlog.h5" --out "$dir/none.json"
[ -e "$dir/none.json" ] && fail "a run without a trace left a file"
expect_error "trace of a checkpoint" "good.h5 is a dynmo checkpoint, not a run log" \
  "$DYNMO" trace tests/data/ckpt/good.h5 --out "$dir/ckpt.json"
expect_error "trace of a text file" "t.ini: not an HDF5 file" "$DYNMO" trace "$dir/t.ini" --out "$dir/x.json"
mkdir "$dir/adir"
expect_error "trace --out a directory" "cannot write $dir/adir" \
  "$DYNMO" trace "$dir/traced/runlog.h5" --out "$dir/adir"
expect_error "trace --out under a file" "cannot write $dir/t.ini/x.json" \
  "$DYNMO" trace "$dir/traced/runlog.h5" --out "$dir/t.ini/x.json"
# A FIFO (as /dev/null would be) is refused and stays: a rename over it
# would have replaced the device by the trace.
mkfifo "$dir/fifo.json"
expect_error "trace --out a FIFO" "$dir/fifo.json exists and is not a regular file" \
  "$DYNMO" trace "$dir/traced/runlog.h5" --out "$dir/fifo.json"
[ -p "$dir/fifo.json" ] || fail "trace --out a FIFO replaced it"
ls "$dir" | grep -q '\.tmp$' && fail "a failed trace left a temporary file: $(ls "$dir")"
# Only a file trace wrote is replaced: never another file, never its input.
echo "my notes" > "$dir/notes.json"
expect_error "trace --out a file of the user's" "$dir/notes.json exists and is not a trace dynmo wrote" \
  "$DYNMO" trace "$dir/traced/runlog.h5" --out "$dir/notes.json"
[ "$(cat "$dir/notes.json")" = "my notes" ] || fail "trace replaced the user's notes.json"
cp "$dir/traced/runlog.h5" "$dir/copy.h5"
expect_error "trace --out its own run log" "--out $dir/copy.h5 is the run log it reads" \
  "$DYNMO" trace "$dir/copy.h5" --out "$dir/copy.h5"
cmp -s "$dir/copy.h5" "$dir/traced/runlog.h5" || fail "trace --out its input changed it"
"$DYNMO" trace "$dir/traced/runlog.h5" --out "$dir/trace.json" > /dev/null 2>&1 \
  && echo "ok: trace replaces a trace it wrote" || fail "trace over its own earlier trace exited $?"
expect_error "trace without --out" "--out FILE.json is required" "$DYNMO" trace "$dir/traced/runlog.h5"
finish
