#!/usr/bin/env bash
# Damaged run logs (issue 28): every reader of a run log ends a damaged
# one with exit 2 and one line naming the file and the problem, never a
# crash, a hang or an allocation without limit. Made here from a real
# 2-stage traced run:
# - flipped bytes HDF5 1.10 trusts: the global heap object number of the
#   string attribute kind (one byte: inspect, report and trace segfaulted
#   in H5HG_read; simulate does not read kind, and took the damaged file)
#   and of config (inspect, report and simulate segfaulted; trace took
#   it), the address of /layout/history's chunk (one bit: its blocks per
#   stage read 2 bytes off; simulate segfaulted, report refused it), a
#   digit of the config text (parallel.ep = 9 with 8 experts: simulate
#   divided by 8 / 9 = 0); the file cut short (refused before too, in
#   HDF5's words);
# - counts that lie: a /layout/history entry of 10^6, a negative one, a
#   row that does not sum to model.layers (simulate segfaulted, or
#   simulated made-up layouts and said nothing), a rank of 10^7 in
#   /trace/events (trace grew to 3.7 GB and more until it died, report
#   drew it), a step beyond the log's and steps out of order.
# The old readers ran under a 4 GB address-space limit and 60 s here.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
work_dir
py=/usr/bin/python3
limit() { timeout -k 10 60 prlimit --as=4000000000 -- "$@"; }

tiny_config "$dir/t.ini" parallel.pp=2 run.trace_from=2 run.trace_steps=2 \
  balance.method=random balance.every=2
timeout -k 10 120 mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/good" \
  > "$dir/good.out" 2>&1 || { fail "the traced run exited $?"; tail -n 5 "$dir/good.out"; finish; }

# The four readers of a run log in DIR, each expected to say regex.
readers_refuse() { # NAME DIR REGEX
  local name=$1 run=$2 regex=$3
  rm -rf "$dir/rep" "$dir/trace.json"
  expect_error "inspect, $name" "inspect: $run/runlog.h5: $regex" \
    limit "$DYNMO" inspect "$run/runlog.h5"
  expect_error "report, $name" "report: $run/runlog.h5: $regex" \
    limit "$DYNMO" report "$run/runlog.h5" --out "$dir/rep"
  expect_error "trace, $name" "trace: $run/runlog.h5: $regex" \
    limit "$DYNMO" trace "$run/runlog.h5" --out "$dir/trace.json"
  expect_error "simulate, $name" "simulate: $run/runlog.h5: $regex" \
    limit "$DYNMO" simulate --from-run "$run" --policies static-uniform
  [ -e "$dir/rep" ] && fail "$name: report wrote $dir/rep"
  [ -e "$dir/trace.json" ] && fail "$name: trace wrote $dir/trace.json"
}

for cmd in "inspect $dir/good/runlog.h5" "report $dir/good/runlog.h5 --out $dir/rep-good" \
           "trace $dir/good/runlog.h5 --out $dir/good.json" \
           "simulate --from-run $dir/good --policies static-uniform"; do
  # shellcheck disable=SC2086
  "$DYNMO" $cmd >/dev/null 2>"$dir/err" || fail "the good log: $cmd: $(cat "$dir/err")"
done

# ---- flipped bytes ------------------------------------------------------------
# damage.py SRC KIND DST: one flipped byte (or bit) of a kind below.
cat > "$dir/damage.py" <<'PY'
import struct, sys, h5py
src, kind, dst = sys.argv[1:4]
with h5py.File(src, "r") as f:
    root = h5py.h5o.get_info(f.id).addr
    chunk = f["/layout/history"].id.get_chunk_info(0).byte_offset
buf = bytearray(open(src, "rb").read())
u16 = lambda a: struct.unpack_from("<H", buf, a)[0]
u32 = lambda a: struct.unpack_from("<I", buf, a)[0]
u64 = lambda a: struct.unpack_from("<Q", buf, a)[0]
def messages(addr):   # the messages of a version 1 object header: (type, data at, size)
    out, chunks = [], [(addr + 16, u32(addr + 8))]
    while chunks:
        at, size = chunks.pop(0)
        end = at + size
        while at + 8 <= end:
            t, n = u16(at), u16(at + 2)
            out.append((t, at + 8, n))
            if t == 0x10: chunks.append((u64(at + 8), u64(at + 16)))
            at += 8 + n
    return out
def string_data(name):   # where a string attribute's (length, heap address, object) is
    pad = lambda x: (x + 7) & ~7
    for t, at, n in messages(root):
        if t == 0x0C and buf[at + 8:at + 9 + len(name)] == name.encode() + b"\0":
            return at + 8 + pad(u16(at + 2)) + pad(u16(at + 4)) + pad(u16(at + 6))
    raise SystemExit("no attribute " + name)
if kind in ("kind", "config"):
    buf[string_data(kind) + 13] ^= 0x7f      # global heap object n -> n + 32512
elif kind == "chunk-address":
    needle = struct.pack("<Q", chunk)
    hits = [i for i in range(len(buf) - 8) if buf[i:i + 8] == needle]
    assert len(hits) == 1, hits
    buf[hits[0]] ^= 0x02
open(dst, "wb").write(buf)
PY
for kind in kind config chunk-address; do
  mkdir -p "$dir/$kind"
  $py "$dir/damage.py" "$dir/good/runlog.h5" "$kind" "$dir/$kind/runlog.h5" ||
    fail "cannot damage the run log ($kind)"
done
readers_refuse "the string kind names a heap object that is not there" "$dir/kind" \
  "damaged: the root group /: attribute kind: its string is global heap object [0-9]+, which the collection at byte [0-9]+ does not hold"
readers_refuse "the string config names a heap object that is not there" "$dir/config" \
  "damaged: the root group /: attribute config: its string is global heap object [0-9]+, which the collection at byte [0-9]+ does not hold"
expect_error "simulate, the layouts read 2 bytes off" \
  "simulate: $dir/chunk-address/runlog.h5: /layout/history row 0 \(step 1\) places [0-9]+ blocks on stage 0; a layout of model.layers = 6 blocks places 1 to 6 on each stage" \
  limit "$DYNMO" simulate --from-run "$dir/chunk-address" --policies static-uniform
expect_error "report, the layouts read 2 bytes off" \
  "report: $dir/chunk-address/runlog.h5: /layout/history row 0 \(step 1\) places [0-9]+ blocks on stage 0" \
  limit "$DYNMO" report "$dir/chunk-address/runlog.h5" --out "$dir/rep"
# A digit of the config text (in the global heap) flipped: parallel.ep = 9
# with 8 experts; simulate divided by 8 / 9 = 0 (SIGFPE).
tiny_config "$dir/moe.ini" model.moe_every=2 model.expert_hidden=32
timeout -k 10 120 "$DYNMO" train --config "$dir/moe.ini" run.out_dir="$dir/moe" > "$dir/moe.out" 2>&1 ||
  fail "the MoE run exited $?: $(tail -n 3 "$dir/moe.out")"
mkdir -p "$dir/ep"
$py - "$dir/moe/runlog.h5" "$dir/ep/runlog.h5" <<'PY' || fail "cannot flip parallel.ep"
import sys
buf = bytearray(open(sys.argv[1], "rb").read())
at = buf.find(b"parallel.ep = 1\n")
assert at > 0 and buf.find(b"parallel.ep = 1\n", at + 1) < 0
buf[at + len("parallel.ep = ")] = ord("9")
open(sys.argv[2], "wb").write(buf)
PY
expect_error "simulate, parallel.ep = 9 with 8 experts" \
  "simulate: $dir/ep/runlog.h5: its configuration \(root attribute config\): parallel.ep = 9 does not divide model.experts = 8" \
  limit "$DYNMO" simulate --from-run "$dir/ep" --policies static-uniform
mkdir -p "$dir/cut"
head -c 60000 "$dir/good/runlog.h5" > "$dir/cut/runlog.h5"
readers_refuse "cut short" "$dir/cut" \
  "truncated: the file has 60000 bytes, its superblock says [0-9]+ \(a copy cut short, or a disk that filled\)"

# ---- counts that lie ----------------------------------------------------------------
# edit SRC_DIR NAME PYTHON: a copy of a run with its runlog.h5 edited (f open).
edit() {
  rm -rf "${dir:?}/$2"
  cp -r "$1" "$dir/$2"
  $py -c "import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'a')
$3
f.close()" "$dir/$2/runlog.h5" || fail "cannot edit $2"
}
sim=tests/data/sim/freeze-2-static   # 32 blocks on 2 stages, 120 steps
edit $sim million "f['/layout/history'][5] = [1000000, 16]"
expect_error "simulate, a layout entry of 10^6" \
  "simulate: $dir/million/runlog.h5: /layout/history row 5 \(step 6\) places 1000000 blocks on stage 0; a layout of model.layers = 32 blocks places 1 to 32 on each stage" \
  limit "$DYNMO" simulate --from-run "$dir/million" --policies static-uniform
edit $sim negative "f['/layout/history'][5] = [20, -4]"
expect_error "simulate, a negative layout entry" \
  "simulate: $dir/negative/runlog.h5: /layout/history row 5 \(step 6\) places -4 blocks on stage 1" \
  limit "$DYNMO" simulate --from-run "$dir/negative" --policies static-uniform
edit $sim total "f['/layout/history'][5] = [16, 15]"
expect_error "simulate, a layout of 31 blocks" \
  "simulate: $dir/total/runlog.h5: /layout/history row 5 \(step 6\) places 31 blocks in all, but the model has 32 \(model.layers\)" \
  limit "$DYNMO" simulate --from-run "$dir/total" --policies static-uniform
edit $sim gap "f['/layout/history'][5] = [32, 0]; f['/layout/history'][6] = [0, 32]"
expect_error "simulate, a layout with an empty first stage" \
  "simulate: $dir/gap/runlog.h5: /layout/history row 6 \(step 7\) places 32 blocks on stage 1 after an empty stage 0" \
  limit "$DYNMO" simulate --from-run "$dir/gap" --policies static-uniform

# A rank of 10^7 in /trace/events (row 3: step 2 on 2 ranks).
edit "$dir/good" rank "e = f['/trace/events']; r = e[3]; r[1] = 1e7; e[3] = r"
expect_error "trace, a rank of 10^7" \
  "trace: $dir/rank/runlog.h5: row 3 of /trace/events has rank 10000000; step 2 ran on 2 ranks \(/steps/ranks\)" \
  limit "$DYNMO" trace "$dir/rank/runlog.h5" --out "$dir/trace.json"
expect_error "report, a rank of 10^7" \
  "report: $dir/rank/runlog.h5: row 3 of /trace/events has rank 10000000" \
  limit "$DYNMO" report "$dir/rank/runlog.h5" --out "$dir/rep"
edit "$dir/good" nostep "e = f['/trace/events']; r = e[0]; r[0] = 1e6; e[0] = r"
expect_error "trace, a step beyond the log's" \
  "trace: $dir/nostep/runlog.h5: row 0 of /trace/events \(step 1e\+06, rank 0\) has a step that is not one of the log's" \
  limit "$DYNMO" trace "$dir/nostep/runlog.h5" --out "$dir/trace.json"
edit "$dir/good" order "e = f['/trace/events']; r = e[len(e) - 1]; r[0] = 2; e[len(e) - 1] = r"
expect_error "trace, steps out of order" \
  "trace: $dir/order/runlog.h5: row [0-9]+ of /trace/events has step 2 after step 3 \(rows come step by step\)" \
  limit "$DYNMO" trace "$dir/order/runlog.h5" --out "$dir/trace.json"
finish
