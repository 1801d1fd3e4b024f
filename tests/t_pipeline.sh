#!/usr/bin/env bash
# Pipeline and data parallelism (issue 3): for D = 1 the loss trajectory of
# every layout and schedule is bit-identical to the one-rank run; a layout
# that changes every step (live migration) gives the same bits; D = 2 x S = 2
# matches the one-rank run with the same global batch within a tight
# tolerance; bad parallel.* settings exit 2 on every rank with one message;
# a rank killed with SIGKILL ends the job within seconds; 4 ranks pinned to one
# CPU take turns (never two computations at once) with the same bits, and
# unbound ranks on 2 CPUs pin themselves 0,1,0,1 to take turns.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/tiny.ini"
# Every run on the same two CPUs whatever the machine has, so the check of
# how unbound ranks pin themselves below runs (and can fail) everywhere.
cpus=$(two_cpus)
train_cpus=$cpus train_limit=120
# run NAME RANKS [overrides...]: a run of tiny.ini and its losses' bits
run() { train "$1" "$2" "$dir/tiny.ini" "${@:3}" && bits "$1" /steps/loss; }
run base 1
for sched in 1f1b gpipe; do
  for layout in "2 uniform" "2 params" "2 explicit:5,1" "3 uniform" "3 explicit:1,4,1" \
                "4 uniform" "4 params" "4 explicit:1,1,3,1"; do
    set -- $layout
    name="s$1-${2//[:,]/_}-$sched"
    run "$name" "$1" parallel.pp="$1" balance.initial="$2" parallel.schedule="$sched" || continue
    if cmp -s "$dir/base.steps.loss" "$dir/$name.steps.loss"; then echo "ok: $name bit-identical"
    else fail "$name: losses differ from the one-rank run"; fi
  done
done
# Live migration to a random layout after every step.
run migrate 4 parallel.pp=4 balance.method=random balance.every=1 && {
  cmp -s "$dir/base.steps.loss" "$dir/migrate.steps.loss" && echo "ok: random re-layout every step bit-identical" \
    || fail "migrating every step changed the losses"
  grep -q "migrated [0-9]* blocks" "$dir/migrate.out" || fail "no migration shown in the step lines"
}
# A block too large for one message (over 1 GiB of slab) goes as its header
# and then its slab in pieces: here in pieces of 4 KiB (a block of the tiny
# model is 12 pieces of parameters and 24 of moments), the same bits.
DYNMO_TEST_MIGRATE_PIECE_BYTES=4096 run pieces 4 parallel.pp=4 balance.method=random balance.every=1 && {
  cmp -s "$dir/base.steps.loss" "$dir/pieces.steps.loss" && echo "ok: blocks migrated in 4 KiB pieces, bit-identical" \
    || fail "migrating in pieces changed the losses"
}
# Tracing steps 2-3 (run.trace_from): the same bits, and one /trace/events
# row per instruction of each traced step and rank, in list order.
run trace 4 parallel.pp=4 run.trace_from=2 run.trace_steps=2 && {
  cmp -s "$dir/base.steps.loss" "$dir/trace.steps.loss" && echo "ok: a traced run is bit-identical" \
    || fail "tracing changed the losses"
  /usr/bin/python3 - "$dir/trace/runlog.h5" "$dir/migrate/runlog.h5" <<'PY' || fail "/trace/events is wrong"
import sys, h5py, numpy as np
e = h5py.File(sys.argv[1], 'r')['/trace/events'][:]
assert e.shape[1] == 8 and sorted(set(e[:, 0])) == [2.0, 3.0], (e.shape, set(e[:, 0]))
m = 4   # micro-batches of tiny_config
for step in (2, 3):
    for rank in range(4):
        r = e[(e[:, 0] == step) & (e[:, 1] == rank)]
        ops = list(r[:, 3].astype(int))
        assert np.all(r[:, 2] == rank), r[:, 2]                    # stage = rank (D = 1)
        assert ops.count(1) == m and ops.count(4) == m, ops        # FWD and BWD per micro-batch
        assert ops[-2:] == [6, 7] and np.all(r[-2:, 4] == -1), ops # the step's end, no micro-batch
        assert np.all(np.diff(r[:, 5]) >= 0), r[:, 5]              # starts in list order
        assert np.all(r[:, 6] >= 0) and np.all(r[:, 7] <= r[:, 6] + 0.5), r[:, 6:]
assert '/trace' not in h5py.File(sys.argv[2], 'r'), "an untraced run has /trace"
print(f"ok: /trace/events: {len(e)} instructions over 2 steps and 4 ranks")
PY
}
# Unbound ranks that outnumber the CPUs pin themselves round robin to take
# turns: on 2 CPUs the 4-stage runs above (mpiexec -n 4 with no binding)
# say so and their stages share per CPU (0,1,0,1); their bits were checked
# above.
grep -q "ranks that shared CPUs unpinned are pinned one to a CPU" "$dir/s4-uniform-1f1b.out" &&
  grep -q "groups 0,1,0,1 with 1,1 cores); .*ranks take turns computing" "$dir/s4-uniform-1f1b.out" &&
  echo "ok: 4 unbound ranks on 2 CPUs pinned themselves 0,1,0,1 and take turns" ||
  fail "4 unbound ranks on 2 CPUs: $(grep processors "$dir/s4-uniform-1f1b.out")"
# Ranks that outnumber their CPUs take turns (parallel.turns, on by
# default): 4 ranks bound to CPU 0 compute one at a time. In the trace each
# forward, backward and optimizer step computes in [end - CPU time, end];
# with turns no two of those intervals overlap, and the bits are those of the
# same run without turns, whose overlaps are printed for contrast.
turns_run() { # NAME TURNS
  timeout -k 10 180 mpiexec -bind-to "user:${cpus%%,*},${cpus%%,*},${cpus%%,*},${cpus%%,*}" -n 4 "$DYNMO" train --config "$dir/tiny.ini" \
    run.out_dir="$dir/$1" parallel.pp=4 parallel.turns="$2" model.channels=256 model.max_seq=64 \
    train.seq=64 train.steps=6 run.trace_from=3 run.trace_steps=3 > "$dir/$1.out" 2>&1 \
    || { fail "$1 exited $?"; tail -n 5 "$dir/$1.out"; return 1; }
  bits "$1" /steps/loss
}
overlaps() { # RUNLOG: prints the overlapping pairs of compute intervals, per step
  /usr/bin/python3 - "$1" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], 'r')
assert int(f.attrs['group_turns'][0]) in (0, 1), f.attrs['group_turns']
e = f['/trace/events'][:]
count = 0
for step in sorted(set(e[:, 0])):
    r = e[(e[:, 0] == step) & (e[:, 3] != 6)]       # FWD 1, BWD 4, OPT 7 take turns
    iv = sorted((x[5] + x[6] - x[7], x[5] + x[6]) for x in r
                if int(x[3]) in (1, 4, 7) and x[7] > 0.02)
    reach = -1e30
    for a, b in iv:
        count += a < reach - 0.3     # 0.3 ms: CPU spent polling before the turn, clock reads
        reach = max(reach, b)
print(count)
PY
}
if turns_run turns 1 && turns_run noturns 0; then
  grep -q "ranks take turns computing" "$dir/turns.out" \
    || fail "turns: the start-up line does not say the ranks take turns"
  grep -q "ranks take turns computing" "$dir/noturns.out" \
    && fail "parallel.turns=0: the start-up line says the ranks take turns"
  cmp -s "$dir/turns.steps.loss" "$dir/noturns.steps.loss" && echo "ok: taking turns is bit-identical" \
    || fail "taking turns changed the losses"
  with=$(overlaps "$dir/turns/runlog.h5") && without=$(overlaps "$dir/noturns/runlog.h5") || fail "turns: trace unreadable"
  [ "${with:-x}" = 0 ] && echo "ok: 4 ranks on one CPU taking turns: no two computations overlap (without turns: $without overlaps)" \
    || fail "4 ranks on one CPU taking turns: $with computations overlap"
  /usr/bin/python3 -c "import h5py,sys; f=h5py.File(sys.argv[1],'r'); sys.exit(0 if f.attrs['group_turns'][0]==1 and list(f.attrs['group_cores'])==[1.0] else 1)" \
    "$dir/turns/runlog.h5" || fail "turns: run log attributes group_turns/group_cores wrong"
fi
# Data parallelism: D=2 x S=2 against one rank with the same global batch
# and the same micro-batch size (2 x 2 micro-batches = 4).
run dp 4 parallel.pp=2 parallel.dp=2 train.micro_batches=2 && \
  /usr/bin/python3 - "$dir/base.steps.loss" "$dir/dp.steps.loss" <<'PY' || fail "D=2 x S=2 differs from one rank beyond 1e-5"
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
x = struct.unpack('<%df' % (len(a) // 4), a); y = struct.unpack('<%df' % (len(b) // 4), b)
worst = max(abs(p - q) / abs(p) for p, q in zip(x, y))
print("dp: largest relative loss difference %.3g" % worst)
sys.exit(0 if len(x) == len(y) and worst <= 1e-5 else 1)
PY
# Bad parallel settings: exit 2 on every rank, one message.
# bad NAME REGEX RANKS overrides...: tiny.ini so changed is refused
bad() { train_refused "$1" "$2" "$3" "$dir/tiny.ini" "${@:4}"; }
bad "S*D != world" "parallel.pp x parallel.dp = 2 x 1 = 2 but the job has 3 ranks" 3 parallel.pp=2
bad "more stages than blocks" "parallel.pp = 8 exceeds model.layers = 6" 8 parallel.pp=8
bad "explicit does not cover" "covers 5 blocks but model.layers = 6" 2 parallel.pp=2 balance.initial=explicit:2,3
bad "explicit wrong length" "lists 3 stages but parallel.pp = 2" 2 parallel.pp=2 balance.initial=explicit:2,2,2
bad "bad schedule" "parallel.schedule = 'zero-bubble' must be 1f1b, gpipe, zb or interleaved" 2 parallel.pp=2 parallel.schedule=zero-bubble
# SIGKILL one rank mid-run: mpiexec must return within seconds, leaving nothing.
mpiexec -n 4 "$DYNMO" train --config "$dir/tiny.ini" run.out_dir="$dir/kill" parallel.pp=4 \
  train.steps=100000 > "$dir/kill.out" 2>&1 &
mpipid=$!
for i in $(seq 1 100); do grep -q "^step 2/" "$dir/kill.out" && break; sleep 0.1; done
victim=$(pgrep -P "$(pgrep -P $mpipid -f hydra_pmi_proxy | head -n1)" | head -n1)
if [ -z "$victim" ]; then victim=$(pgrep -f "run.out_dir=$dir/kill" | grep -v "^$mpipid$" | tail -n1); fi
start=$(date +%s)
kill -9 "$victim" 2>/dev/null || fail "no rank to kill"
for i in $(seq 1 200); do kill -0 $mpipid 2>/dev/null || break; sleep 0.1; done
if kill -0 $mpipid 2>/dev/null; then fail "mpiexec still running 20 s after SIGKILL"; kill -9 $mpipid; fi
wait $mpipid 2>/dev/null
echo "ok: mpiexec returned $(( $(date +%s) - start )) s after SIGKILL of rank pid $victim"
sleep 0.5
left=$(pgrep -f "run.out_dir=$dir/kill" || true)
[ -z "$left" ] || { fail "processes left behind: $left"; kill -9 $left; }
finish
