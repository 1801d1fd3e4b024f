#!/usr/bin/env bash
# jobscripts/run-local.sh with MPICH's mpiexec and tests/mock-dynmo.sh in
# place of dynmo (docs/jobs.md is the contract):
#  1. 4 ranks re-pack to 2 (status 3), SIGUSR1 to the script is forwarded and
#     the ranks exit 75, the same world is relaunched and finishes (0);
#  2. SIGTERM to the script: the ranks checkpoint (75) and the chain stops;
#  3. a failing status (5) stops the chain with that status;
#  4. bad input: no ckpt.dir, no -n, --task-wait 0, a stale next_world, a
#     next_world whose ranks are not pp x dp: each stops with a message
#     naming the problem.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
chain=$here/../jobscripts/run-local.sh
mock=$here/mock-dynmo.sh
command -v mpiexec >/dev/null || { echo "skipped: no mpiexec (MPICH)"; exit 77; }
dir=$(mktemp -d /tmp/dynmo-local-chain.XXXXXX)
chain_pid=
trap '[ -n "$chain_pid" ] && kill -TERM "$chain_pid" 2>/dev/null; rm -rf "$dir"' EXIT
cd "$dir" || exit 1

# ---- 1. re-pack, SIGUSR1, relaunch after 75, done ---------------------------
printf '[ckpt]\ndir = %s/a/ckpt ; found by the chain\n' "$dir" >a.ini
"$chain" -n 4 --dynmo "$mock" --config a.ini mock.plan=repack:2,wait,done >a.log 2>&1 &
chain_pid=$!
if mock_ready "$dir/a/ckpt" 2 2; then
    kill -USR1 "$chain_pid"
else
    fail "launch 2 never reached the mock's wait"
fi
wait "$chain_pid"; status=$?; chain_pid=
[ $status -eq 0 ] || fail "chain 1 exited $status, want 0"
record=$dir/a/ckpt/mock.record
want1="link=1 ntasks= size=4 args=train --config a.ini mock.plan=repack:2,wait,done"
want2="link=2 ntasks= size=2 args=train --config a.ini mock.plan=repack:2,wait,done parallel.pp=2 parallel.dp=1 balance.initial=explicit:3,3 ckpt.resume=auto"
want3="link=3 ntasks= size=2 args=train --config a.ini mock.plan=repack:2,wait,done parallel.pp=2 parallel.dp=1 balance.initial=explicit:3,3 ckpt.resume=auto"
mock_launches "$record" "$want1" "$want2" "$want3"
ranks=$dir/a/ckpt/mock.ranks
[ "$(grep -c '^link=1 .*size=4' "$ranks")" -eq 4 ] || fail "launch 1 did not run 4 ranks"
[ "$(grep -c '^link=2 .*size=2 signal=USR1' "$ranks")" -eq 2 ] \
    || fail "SIGUSR1 did not reach both ranks of launch 2: $(grep '^link=2 ' "$ranks" | tr '\n' ';')"
[ "$(grep -c '^link=3 .*size=2' "$ranks")" -eq 2 ] || fail "launch 3 did not run 2 ranks"
grep -q "sending SIGUSR1 to the ranks (pids " a.log || fail "the script did not signal the ranks themselves"
grep -q "run: mpiexec -n 4 " a.log || fail "launch 1 was not mpiexec -n 4"
grep -q "run: mpiexec -n 2 " a.log || fail "launch 2 was not mpiexec -n 2"
[ $failures -eq 0 ] && echo "ok: re-pack 4 -> 2 ranks, SIGUSR1 forwarded, 75 relaunched, done"

# ---- 2. SIGTERM stops the chain ----------------------------------------------
"$chain" -n 2 --dynmo "$mock" --ckpt-dir "$dir/b" --config a.ini mock.plan=wait,done >b.log 2>&1 &
chain_pid=$!
if mock_ready "$dir/b" 1 2; then
    kill -TERM "$chain_pid"
else
    fail "chain 2 never reached the mock's wait"
fi
wait "$chain_pid"; status=$?; chain_pid=
[ $status -eq 75 ] || fail "chain 2 exited $status after SIGTERM, want 75"
[ "$(wc -l <"$dir/b/mock.record")" -eq 1 ] || fail "chain 2 relaunched after SIGTERM"
grep -q "args=.* ckpt.dir=$dir/b\$" "$dir/b/mock.record" || fail "--ckpt-dir did not reach dynmo as the last override"
[ "$(grep -c 'signal=USR1' "$dir/b/mock.ranks")" -eq 2 ] || fail "the forwarded signal did not reach both ranks"
grep -q "checkpointed and stopped on SIGTERM" b.log || fail "chain 2 did not say it stopped"
[ $failures -eq 0 ] && echo "ok: SIGTERM: checkpoint (75) and the chain stops"

# ---- 3. another status stops the chain ----------------------------------------
"$chain" -n 2 --dynmo "$mock" --config a.ini ckpt.dir="$dir/c" mock.plan=exit:5 >c.log 2>&1
status=$?
[ $status -eq 5 ] || fail "chain 3 exited $status, want 5"
grep -q "dynmo failed with status 5: the chain stops at launch 1" c.log || fail "chain 3 did not report status 5"
[ $failures -eq 0 ] && echo "ok: status 5 stops the chain"

# ---- 4. bad input -----------------------------------------------------------
printf '[model]\nlayers = 6\n' >no-ckpt.ini
expect_error "no ckpt.dir" "no checkpoint directory" "$chain" -n 2 --dynmo "$mock" --config no-ckpt.ini mock.plan=done
expect_error "no -n" "give the number of ranks" "$chain" --dynmo "$mock" --config a.ini mock.plan=done
expect_error "--task-wait 0" "--task-wait '0' must be a whole number of seconds" "$chain" -n 2 \
  --dynmo "$mock" --task-wait 0 --config a.ini mock.plan=done

# A mock that exits 3 without writing next_world, leaving an old one.
mkdir -p "$dir/d"
printf 'ranks = 2\npp = 2\ndp = 1\nlayout = 3,3\nstep = 10\ncheckpoint = ckpt-10.h5\n' >"$dir/d/next_world"
: >"$dir/d/ckpt-10.h5"
touch -d '1 hour ago' "$dir/d/next_world"
"$chain" -n 2 --dynmo "$mock" --config a.ini ckpt.dir="$dir/d" mock.plan=exit:3 >d.log 2>&1
status=$?
[ $status -eq 1 ] || fail "stale next_world: exit $status, want 1"
grep -q "next_world: older than this job" d.log || fail "stale next_world: $(tail -n 1 d.log)"

# A next_world written now but inconsistent, by a mock that exits 3.
cat >"$dir/bad-mock.sh" <<EOF
#!/bin/bash
printf 'ranks = 3\npp = 2\ndp = 1\nlayout = 3,3\nstep = 10\ncheckpoint = ckpt-10.h5\n' >"$dir/d/next_world"
exit 3
EOF
chmod +x "$dir/bad-mock.sh"
"$chain" -n 1 --dynmo "$dir/bad-mock.sh" --config a.ini ckpt.dir="$dir/d" >e.log 2>&1
status=$?
[ $status -eq 1 ] || fail "ranks != pp x dp: exit $status, want 1"
grep -q "ranks = 3 is not pp x dp = 2 x 1" e.log || fail "ranks != pp x dp: $(tail -n 1 e.log)"
[ $failures -eq 0 ] && echo "ok: no ckpt.dir, no -n, --task-wait 0, a stale next_world, ranks != pp x dp"

if [ $failures -gt 0 ]; then
    for log in a b c d e; do echo "--- $log.log"; cat "$dir/$log.log" 2>/dev/null; done
fi
finish
