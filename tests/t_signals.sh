#!/usr/bin/env bash
# Exit statuses a job chain can trust (issue 15): a signal to one rank
# stops every rank at the same step boundary; with ckpt.dir it checkpoints
# and exits 75, without one it exits 128 + the signal (nothing was saved,
# so a chain must not resubmit); SIGINT is treated like SIGTERM.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/t.ini" train.steps=100000 train.warmup=1
# The ranks: children of the hydra proxy below timeout and mpiexec.
ranks_of() { pgrep -P "$(pgrep -P "$(pgrep -P "$1" | head -n1)" -f hydra_pmi_proxy | head -n1)" 2>/dev/null; }
# stop NAME SIGNAL WANT [key=value...]: 2 ranks, SIGNAL to the last rank
# once step 3 is logged; wants exit WANT.
stop() {
  local name=$1 sig=$2 want=$3; shift 3
  timeout -s KILL 120 mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" parallel.pp=2 \
    run.out_dir="$dir/$name" "$@" > "$dir/$name.out" 2>&1 &
  local pid=$! i
  for i in $(seq 1 600); do
    grep -q '^step 3/' "$dir/$name.out" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break; sleep 0.05
  done
  kill -"$sig" $(ranks_of $pid | tail -n1) 2>/dev/null || fail "$name: no rank to signal"
  wait $pid; local rc=$?
  [ $rc -eq "$want" ] && echo "ok: $name: SIG$sig gave $rc: $(grep '^signal:' "$dir/$name.out")" \
    || fail "$name: SIG$sig gave exit $rc, want $want: $(tail -n 3 "$dir/$name.out")"
}
stop term-no-ckpt TERM 143
grep -q 'no ckpt.dir: stopping without a checkpoint; exiting with status 143' "$dir/term-no-ckpt.out" \
  || fail "term-no-ckpt: no message saying nothing was saved"
stop usr1-no-ckpt USR1 138
stop int-no-ckpt INT 130
stop int-ckpt INT 75 ckpt.dir="$dir/ck"
ls "$dir/ck"/ckpt-*.h5 >/dev/null 2>&1 && echo "ok: int-ckpt: $(ls "$dir/ck")" || fail "int-ckpt: no checkpoint written"
finish
