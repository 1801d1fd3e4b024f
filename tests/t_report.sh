#!/usr/bin/env bash
# `dynmo report` states the right numbers (issue 19): two synthetic run logs
# of known values, written here with h5py, a balanced run (a layout change
# at step 4 after an applied decision at step 3, known step times, bubble,
# imbalance, peak memory, losses, a trace of steps 3 and 4) and a static one
# (slower, with a resumed run's filler row), and a simulation file shaped
# like a run log. The page must state exactly those numbers, the layout
# change and its decision, the speedup 1.25x, the timeline's steps, and
# the layout figure's PNG must show the change where it happened (its
# pixels are read back with a small PNG decoder). Bad input is exit 2 with
# one message and no directory left behind: not a run log, a checkpoint,
# a missing file, a timeline of untraced steps, an unwritable --out, a
# --out holding other files, and a write that fails half-way (a file size
# limit) both for a new report and over a previous one, which survives.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
py=/usr/bin/python3
work=$(mktemp -d /tmp/dynmo-t-report.XXXXXX)
trap 'rm -rf "$work"' EXIT

$py - "$work" <<'PY' || { echo "FAIL: cannot write the synthetic run logs"; exit 1; }
import sys, h5py, numpy as np
work = sys.argv[1]
steps, layers = 10, 6
config = "\n".join(["model.layers = 6", "model.channels = 32", "model.heads = 2",
                    "train.micro_batches = 4", "parallel.pp = 2", "parallel.dp = 1",
                    "parallel.schedule = 1f1b", "dyn.kind = early_exit", "balance.every = 3",
                    "balance.initial = uniform"])
def write(path, kind, method, step_ms, layout, extra=lambda f: None):
    with h5py.File(path, "w") as f:
        f.attrs["kind"] = kind
        f.attrs["format_version"] = np.int64(1)
        f.attrs["dynmo_version"] = "0.1.0"
        f.attrs["created"] = "2026-12-01T00:00:00Z"
        f.attrs["config"] = config + f"\nbalance.method = {method}\n"
        f["/steps/loss"] = np.array([5 - 0.1 * i for i in range(steps)], np.float32)
        f["/steps/step_ms"] = np.array(step_ms, np.float32)
        f["/steps/tokens_per_s"] = np.array([256 / ms * 1000 for ms in step_ms], np.float32)
        f["/steps/bubble_ratio"] = np.array([0.9] + [0.25] * (steps - 1), np.float32)
        f["/steps/imbalance"] = np.array([0.5] + [0.1] * (steps - 1), np.float32)
        f["/steps/peak_rss_mb"] = np.arange(100, 100 + steps, dtype=np.float32)
        cost = np.array([[1.0 + j for j in range(layers)]] * steps, np.float32)
        f["/layers/fwd_ms"] = cost
        f["/layers/bwd_ms"] = 2 * cost
        f["/layers/active"] = np.array([[1 - 0.1 * j for j in range(layers)]] * steps, np.float32)
        f["/layout/history"] = np.array(layout, np.int32)
        f["/eval/step"] = np.array([5, 10], np.int32)
        f["/eval/loss"] = np.array([4.6, 4.1], np.float32)
        extra(f)
def balanced_extra(f):
    f["/balance/decisions"] = np.array([[3, 100, 80, 95, 1, 1, 82, 1e6],
                                        [6, 80, 79.5, 80, 0, 0, 80.4, 0]], np.float32)
    rows = []
    for step in (3, 4):
        for rank in (0, 1):
            t = 0.0 if rank == 0 else 2.0
            for op, mb, wall, cpu in [(1, 0, 2, 2), (2, 0, 0.5, 0.5), (4, 0, 3, 3),
                                      (6, -1, 1, 0.5), (7, -1, 1, 1)]:
                rows.append([step, rank, rank, op if rank == 0 or op != 2 else 0, mb, t, wall, cpu])
                t += wall + 0.25
    f["/trace/events"] = np.array(rows, np.float32)
write(f"{work}/balanced.h5", "runlog", "partition-time", [500] + [80] * (steps - 1),
      [[3, 3]] * 3 + [[2, 4]] * (steps - 3), balanced_extra)
static_ms = [500] + [100] * (steps - 1)
static_ms[2] = float("nan")            # a resumed run's filler row
static_layout = [[3, 3]] * steps
static_layout[2] = [0, 0]
write(f"{work}/static.h5", "runlog", "none", static_ms, static_layout)
with h5py.File(f"{work}/simulated.h5", "w") as f:
    f.attrs["kind"] = "simulation"
    f["/steps/step_ms"] = np.array([90.0] * steps, np.float32)
    f["/layout/history"] = np.array([[3, 3]] * steps, np.int32)
PY

# ---- the numbers the page states ------------------------------------------------------------
out=$("$DYNMO" report "$work/balanced.h5" "$work/static.h5" --out "$work/rep" 2>&1) \
  || fail "report of the synthetic logs exited $?: $out"
echo "$out"
for f in loss throughput layout-1 layout-2 cost-1 cost-2 timeline-1; do
  [ -s "$work/rep/$f.svg" ] && [ -s "$work/rep/$f.png" ] || fail "figure $f.svg/.png missing"
done
[ -e "$work/rep/timeline-2.svg" ] && fail "a timeline for the static run, which traced nothing"
ls -a "$work" | grep -q '^\.rep\.' && fail "a temporary directory was left beside the report"
$py - "$work/rep" <<'PY' && echo "ok: the page states the known numbers, the change at step 4, the speedup 1.25x" \
  || fail "the page does not state the synthetic logs' numbers"
import re, sys, html
page = open(sys.argv[1] + "/index.html").read()
def cell(key):
    m = re.search(r'id="%s">(.*?)</t[dh]>' % re.escape(key), page, re.S)
    return html.unescape(m.group(1)) if m else None
want = {"r1-name": "balanced", "r2-name": "static",
        "r1-steps": "10", "r1-mean-step-ms": "80.00 ms", "r2-mean-step-ms": "100.00 ms",
        "r1-throughput": "3200 tokens/s", "r2-throughput": "2560 tokens/s",
        "r1-bubble": "25.0%", "r1-imbalance": "0.100", "r1-peak-mb": "109 MiB",
        "r1-loss-first": "5.0000", "r1-loss-last": "4.1000", "r1-val-loss": "4.1000",
        "r1-layout-changes": "4", "r2-layout-changes": "none",
        "r1-dyn": "early_exit", "r1-balance": "partition-time every 3 steps",
        "r1-traced": "3 to 4", "r2-traced": "-",
        "r1-kind": "run log (dynmo train)"}
bad = [(k, cell(k), v) for k, v in want.items() if cell(k) != v]
for k, got, v in bad: print(f"{k}: page says {got!r}, want {v!r}")
speedup = re.search(r'id="speedup-2">(.*?)</p>', page)
said = html.unescape(speedup.group(1)) if speedup else None
want_speedup = "balanced runs 1.25x as fast as static: 80.00 ms against 100.00 ms a step over steps 2 to 10."
if said != want_speedup: bad.append(1); print(f"speedup: {said!r}, want {want_speedup!r}")
change = re.findall(r'<tr class="layout-change" data-step="(\d+)">(.*?)</tr>', page)
if [c[0] for c in change] != ["4"]: bad.append(1); print("layout changes:", change)
elif "<td>3,3</td><td>2,4</td>" not in change[0][1] or \
        "at step 3: predicted 80.00 ms/step (from 100.00), measured 82.00 ms" not in change[0][1]:
    bad.append(1); print("layout change row:", change[0][1])
decisions = re.findall(r'<tr class="decision" data-step="(\d+)">(.*?)</tr>', page)
if [d[0] for d in decisions] != ["3", "6"] or "+2.5%" not in decisions[0][1] \
        or "+0.5%" not in decisions[1][1] or "<td>yes</td>" not in decisions[0][1]:
    bad.append(1); print("decisions:", decisions)
if "step 3 (before the layout change) and step 4 (after it)" not in page:
    bad.append(1); print("the timeline does not draw steps 3 and 4")
for needle in ("<script", "http://", "https://", 'src="/', 'src="file:'):
    if needle in page: bad.append(1); print("the page is not self-contained:", needle)
imgs = re.findall(r'<img src="data:image/svg\+xml;base64,', page)
if len(imgs) != 7: bad.append(1); print("inline figures:", len(imgs))
sys.exit(1 if bad else 0)
PY

# ---- the layout figure's pixels: the change at step 4 of 10 ---------------------------------
$py - "$work/rep/layout-1.png" <<'PY' && echo "ok: layout-1.png shows 3,3 then 2,4 from step 4 (30% along the step axis)" \
  || fail "layout-1.png does not show the change at step 4"
import sys, zlib, struct
from collections import Counter
def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR": w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT": idat += body
    assert depth == 8 and interlace == 0 and ctype in (2, 6), (depth, ctype, interlace)
    bpp = 4 if ctype == 6 else 3
    raw, stride, rows, prev, i = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp), 0
    for y in range(h):
        kind, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if kind == 1: line[x] = (line[x] + a) & 255
            elif kind == 2: line[x] = (line[x] + b) & 255
            elif kind == 3: line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return w, h, rows
w, h, rows = read_png(sys.argv[1])
colourful = Counter(p for row in rows for p in row if max(p) - min(p) > 60)
(c0, _), (c1, _) = colourful.most_common(2)
# stage 0 is the band at the top of the plot
top = next(p for row in rows for p in row if p in (c0, c1))
if top != c0: c0, c1 = c1, c0
columns = []
for x in range(w):
    n0 = sum(1 for y in range(h) if rows[y][x] == c0)
    n1 = sum(1 for y in range(h) if rows[y][x] == c1)
    columns.append((x, n0, n1))
most = max(n0 + n1 for _, n0, n1 in columns)
plot = [(x, n0 / (n0 + n1)) for x, n0, n1 in columns if n0 + n1 > 0.8 * most]
left, right = plot[0][0], plot[-1][0]
change = next(x for x, share in plot if share < 0.42)
where = (change - left) / (right - left)
before = [s for x, s in plot if x < change - 2]
after = [s for x, s in plot if x > change + 2]
print(f"plot x {left}..{right}, stage 0 holds {sum(before)/len(before):.3f} of the blocks before "
      f"x={change} ({where:.3f} of the way) and {sum(after)/len(after):.3f} after")
ok = abs(where - 0.3) < 0.02 and all(abs(s - 0.5) < 0.05 for s in before) \
     and all(abs(s - 1 / 3) < 0.05 for s in after)
sys.exit(0 if ok else 1)
PY

# ---- a simulation file (dynmo simulate's output will be shaped like a run log) ---------------
out=$("$DYNMO" report "$work/simulated.h5" "$work/static.h5" --out "$work/sim" 2>&1) \
  || fail "report of a simulation file exited $?: $out"
grep -q 'id="r1-kind">simulation (dynmo simulate)<' "$work/sim/index.html" \
  && grep -q 'id="speedup-2">simulated runs 1.11x as fast as static' "$work/sim/index.html" \
  && echo "ok: a simulation file is read like a run log" \
  || fail "the simulation file's page: $(grep -o 'id="r1-kind">[^<]*' "$work/sim/index.html")"

# ---- replacing a previous report ------------------------------------------------------------
[ -e "$work/rep/layout-2.png" ] || fail "the two-run report has no layout-2.png"
"$DYNMO" report "$work/static.h5" --out "$work/rep" >/dev/null 2>&1 || fail "report over a report exited $?"
[ ! -e "$work/rep/layout-2.png" ] && [ -s "$work/rep/layout-1.png" ] \
  && echo "ok: a previous report is replaced whole" || fail "the previous report was not replaced whole"
# The marker names exactly the files the report wrote.
diff <(tail -n +2 "$work/rep/.dynmo-report" | sort) <(ls "$work/rep" | sort) > /dev/null \
  && echo "ok: .dynmo-report names the report's $(ls "$work/rep" | wc -l) files" \
  || fail ".dynmo-report does not name the report's files"
# A file the report did not write, even one named like its own, is never deleted.
touch "$work/rep/stale.png"
expect_error "a report over a report holding a file of the user's" \
  "holds stale.png, which dynmo report did not write" \
  "$DYNMO" report "$work/static.h5" --out "$work/rep"
[ -e "$work/rep/stale.png" ] && [ -s "$work/rep/index.html" ] && rm "$work/rep/stale.png" \
  || fail "the report over a user's file changed the directory"

# ---- a config attribute that is not UTF-8 -----------------------------------------------------
# Invalid bytes (a stray continuation, an overlong '/', a cut sequence) and
# a control byte become U+FFFD: the page stays valid UTF-8.
cp "$work/static.h5" "$work/bytes.h5"
$py - "$work/bytes.h5" <<'PY' || fail "cannot write the non-UTF-8 config"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "a") as f:
    f.attrs["config"] = np.bytes_(b"model.layers = 6\nrun.out_dir = caf\xc3\xa9/\x80\xc0\xaf\x1b[31m\xe2\x82\n")
PY
"$DYNMO" report "$work/bytes.h5" --out "$work/bytes" >/dev/null 2>&1 || fail "report of a non-UTF-8 config: exit $?"
$py - "$work/bytes/index.html" <<'PY' && echo "ok: a non-UTF-8 config is shown with U+FFFD, the page valid UTF-8" || fail "the page of a non-UTF-8 config"
import sys
text = open(sys.argv[1], "rb").read().decode("utf-8")   # strict: raises on invalid bytes
assert "run.out_dir = caf\u00e9/\ufffd\ufffd\ufffd\ufffd[31m\ufffd" in text, "no replacement characters"
assert "\x1b" not in text
PY

# ---- bad input: exit 2, one message, nothing left behind ------------------------------------
# one_error NAME REGEX CMD...: expect_error, and exactly one line on stderr.
one_error() {
  local name=$1 regex=$2; shift 2
  expect_error "$name" "$regex" "$@"
  local lines; lines=$("$@" 2>&1 >/dev/null | wc -l)
  [ "$lines" -eq 1 ] || fail "$name: $lines lines of error output, want 1"
}
# no_leftovers WHAT PARENT NAME [kept]: no temporary directory beside
# PARENT/NAME, and no NAME either unless it is a report that must be kept.
no_leftovers() {
  local what=$1 parent=$2 name=$3 kept=${4:-}
  if { [ -z "$kept" ] && [ -e "$parent/$name" ]; } ||
     ls -a "$parent" | grep -q "^\.$name\.\(tmp\|old\)-"; then
    fail "$what: left $(ls -a "$parent" | grep "$name" | tr '\n' ' ')"
  fi
}
echo "not HDF5" > "$work/text.h5"
one_error "a text file" "text.h5" "$DYNMO" report "$work/text.h5" --out "$work/bad1"
no_leftovers "a text file" "$work" bad1
one_error "a checkpoint" "good.h5 is a dynmo checkpoint, not a run log" \
  "$DYNMO" report tests/data/ckpt/good.h5 --out "$work/bad2"
no_leftovers "a checkpoint" "$work" bad2
one_error "a missing file" "nonexistent.h5" "$DYNMO" report "$work/nonexistent.h5" --out "$work/bad3"
one_error "a timeline of an untraced step" "did not trace step 7 \(it traced steps 3 to 4\)" \
  "$DYNMO" report "$work/balanced.h5" --timeline 7 --out "$work/bad4"
no_leftovers "a timeline of an untraced step" "$work" bad4
one_error "a timeline of a log without a trace" "static.h5 has no traced steps.*run.trace_from" \
  "$DYNMO" report "$work/static.h5" --timeline 2 --out "$work/bad5"
no_leftovers "a timeline of a log without a trace" "$work" bad5
echo "a file" > "$work/afile"
one_error "--out under a file" "afile is not a directory" \
  "$DYNMO" report "$work/balanced.h5" --out "$work/afile/rep"
one_error "--out in /proc" "cannot write the report to /proc/dynmo-report" \
  "$DYNMO" report "$work/balanced.h5" --out /proc/dynmo-report
mkdir "$work/mine" && echo "notes" > "$work/mine/notes.txt"
one_error "--out holding other files" "holds notes.txt, which dynmo report did not write" \
  "$DYNMO" report "$work/balanced.h5" --out "$work/mine"
[ "$(cat "$work/mine/notes.txt")" = notes ] || fail "--out holding other files: notes.txt changed"
# Nor does a report go where its inputs are.
mkdir -p "$work/runs" && cp "$work/balanced.h5" "$work/runs/runlog.h5"
one_error "--out holding its own input" "--out $work/runs holds the input $work/runs/runlog.h5" \
  "$DYNMO" report "$work/runs/runlog.h5" --out "$work/runs"
[ -s "$work/runs/runlog.h5" ] || fail "--out holding its own input: the run log changed"
one_error "--out a parent of its input" "holds the input" \
  "$DYNMO" report "$work/runs/runlog.h5" --out "$work"
one_error "--from 0" "--from '0' is not a step number" \
  "$DYNMO" report "$work/balanced.h5" --from 0 --out "$work/bad6"
# A write that fails half-way (files over 100 KiB refused): exit 2, the
# temporary directory removed, a previous report untouched.
half() { (trap '' XFSZ; ulimit -f 100; exec "$DYNMO" report "$work/balanced.h5" "$work/static.h5" "$@"); }
one_error "a write that fails half-way" "cannot write the report to .*half: writing .*: File too large" \
  half --out "$work/half"
no_leftovers "a write that fails half-way" "$work" half
before=$(ls "$work/rep" | tr '\n' ' ')
one_error "a failed write over a report" "File too large" half --out "$work/rep"
[ "$(ls "$work/rep" | tr '\n' ' ')" = "$before" ] && [ -s "$work/rep/index.html" ] \
  && echo "ok: the previous report survives a failed write" || fail "the previous report changed"
no_leftovers "a failed write over a report" "$work" rep kept
finish
