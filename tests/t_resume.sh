#!/usr/bin/env bash
# Checkpoint, signal and resume across worlds (issue 5): a run stopped by
# SIGUSR1 (to one rank, then to every rank, then SIGTERM) checkpoints and
# exits 75; resumed with ckpt.resume=auto on 4 -> 2 -> 1 -> 3 ranks it
# finishes with a loss trajectory bit-identical to the uninterrupted run.
# Re-packing: with repack.enable the job checkpoints, writes next_world and
# exits 3; the smaller world it names continues bit-identically.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/t.ini" model.channels=64 train.steps=150 train.lr=1e-3 train.warmup=5
timeout -k 10 300 mpiexec -n 1 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/full" > "$dir/full.out" 2>&1 \
  || fail "uninterrupted run failed"
bits full /steps/loss

ranks_of() { pgrep -P "$(pgrep -P "$1" -f hydra_pmi_proxy | head -n1)" 2>/dev/null; }
# segment N RANKS PP SIGNAL TARGET(one|all): runs until step >= 20*N, then signals.
segment() {
  local n=$1 ranks=$2 pp=$3 sig=$4 target=$5
  mpiexec -n "$ranks" "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/chain" parallel.pp="$pp" \
    ckpt.dir="$dir/ck" ckpt.resume=auto > "$dir/seg$n.out" 2>&1 &
  local pid=$! want=$((20 * n)) i
  for i in $(seq 1 600); do
    last=$(grep -o '^step [0-9]*' "$dir/seg$n.out" | tail -n1 | cut -d' ' -f2)
    [ -n "$last" ] && [ "$last" -ge "$want" ] && break
    kill -0 $pid 2>/dev/null || break; sleep 0.05
  done
  local victims; victims=$(ranks_of $pid)
  if [ "$target" = one ]; then victims=$(tail -n1 <<<"$victims"); fi
  kill -"$sig" $victims 2>/dev/null || fail "segment $n: no rank to signal"
  wait $pid; local rc=$?
  [ $rc -eq 75 ] || { fail "segment $n ($ranks ranks, SIG$sig to $target): exit $rc, want 75"; tail -n 5 "$dir/seg$n.out"; }
  grep -q "signal: checkpoint .* written at step" "$dir/seg$n.out" || fail "segment $n: no checkpoint message"
  grep -q "resumed from" "$dir/seg$n.out" && echo "ok: segment $n: $(grep -o 'resumed from.*' "$dir/seg$n.out")"
  echo "ok: segment $n on $ranks ranks stopped: $(grep -o 'checkpoint .* written at step [0-9]*' "$dir/seg$n.out")"
}
segment 1 4 4 USR1 one
segment 2 2 2 USR1 all
segment 3 1 1 TERM one
timeout -k 10 300 mpiexec -n 3 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/chain" parallel.pp=3 \
  ckpt.dir="$dir/ck" ckpt.resume=auto > "$dir/seg4.out" 2>&1 || fail "last segment failed"
grep -o 'resumed from.*' "$dir/seg4.out"
bits chain /steps/loss
cmp -s "$dir/full.steps.loss" "$dir/chain.steps.loss" && echo "ok: 4 -> 2 -> 1 -> 3 ranks: losses bit-identical to the uninterrupted run" \
  || fail "the resumed chain's losses differ from the uninterrupted run"
ls "$dir/ck"/ckpt-*.h5 | wc -l | grep -qx 2 || fail "ckpt.keep = 2 not honoured: $(ls "$dir/ck")"

# Re-pack: the planner must shrink 4 stages of a 6-block model whose
# micro-batches are tiny (epsilon generous); exit 3 and next_world.
timeout -k 10 300 mpiexec -n 4 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/rp" parallel.pp=4 \
  ckpt.dir="$dir/rpck" repack.enable=1 repack.every=30 repack.epsilon=5 train.eval_every=100 > "$dir/rp1.out" 2>&1
rc=$?
[ $rc -eq 3 ] || fail "re-pack run: exit $rc, want 3 ($(tail -n 2 "$dir/rp1.out"))"
# It stopped before any evaluation: the summary says so, not "nan".
grep -q "validation loss: none yet" "$dir/rp1.out" && ! grep -qi "validation loss: nan" "$dir/rp1.out" \
  && echo "ok: a re-pack before any evaluation: no validation loss yet" \
  || fail "a re-pack before any evaluation: $(grep -i 'validation' "$dir/rp1.out")"
if [ -f "$dir/rpck/next_world" ]; then
  pp=$(sed -n 's/^pp = //p' "$dir/rpck/next_world"); layout=$(sed -n 's/^layout = //p' "$dir/rpck/next_world")
  echo "ok: re-pack to pp=$pp layout=$layout: $(grep -o 'repack: .*' "$dir/rp1.out" | head -c 160)"
  timeout -k 10 300 mpiexec -n "$pp" "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/rp" parallel.pp="$pp" \
    balance.initial="explicit:$layout" ckpt.dir="$dir/rpck" > "$dir/rp2.out" 2>&1 || fail "smaller world failed"
  bits rp /steps/loss
  cmp -s "$dir/full.steps.loss" "$dir/rp.steps.loss" && echo "ok: re-packed run bit-identical" || fail "re-packed run's losses differ"
else
  fail "no next_world written"
fi
# A traced run resumed from an earlier checkpoint traces the steps it redoes
# once: /trace/events is cut back to the resumed step like every per-step
# dataset. Steps 2-5 traced, checkpoints at 3 and 6; ckpt-6 removed (as if
# the job died before writing it), the rerun resumes at 3 and redoes 4-6.
trace_run() { timeout -k 10 120 mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/tr" \
  parallel.pp=2 train.steps=6 ckpt.dir="$dir/trck" ckpt.every=3 run.trace_from=2 run.trace_steps=4 \
  > "$dir/tr$1.out" 2>&1 || fail "traced run $1 failed: $(tail -n 2 "$dir/tr$1.out")"; }
trace_run 1
rows1=$(/usr/bin/python3 -c "import h5py,sys; print(len(h5py.File(sys.argv[1],'r')['/trace/events']))" "$dir/tr/runlog.h5")
rm -f "$dir/trck/ckpt-6.h5"
trace_run 2
grep -q "resumed from .*step 3" "$dir/tr2.out" || fail "traced rerun did not resume at step 3: $(grep -o 'resumed from.*' "$dir/tr2.out")"
/usr/bin/python3 - "$dir/tr/runlog.h5" "$rows1" <<'PY' || fail "/trace/events after a resume is wrong"
import sys, h5py, numpy as np
e = h5py.File(sys.argv[1], 'r')['/trace/events'][:]
steps = e[:, 0].astype(int)
assert sorted(set(steps)) == [2, 3, 4, 5], sorted(set(steps))
assert np.all(np.diff(steps) >= 0), steps              # each step once, in order
assert len(e) == int(sys.argv[2]), (len(e), sys.argv[2])  # as many rows as the first run
print(f"ok: resumed traced run: {len(e)} rows, steps 2-5 once each")
PY
finish
