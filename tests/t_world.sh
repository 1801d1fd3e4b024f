#!/usr/bin/env bash
# A failing MPI call ends the whole job with exit 1 and one message naming
# the rank, file:line, the call and MPI's own error text (world.h,
# WORLD_MPI): DYNMO_TEST_MPI_FAULT=send makes the last rank send to a rank
# that does not exist. No rank may hang (timeout), and no other rank
# prints a message of its own.
# A hung MPI_Finalize ends within DYNMO_FINALIZE_SECONDS with the run's
# status and a warning naming the rank (world.h, world_finalize; on 3
# ranks every rank's bound ends it, and some rank's warning must show):
# DYNMO_TEST_MPI_FAULT=finalize keeps the last rank from reaching it; the
# run's log is complete; an ordinary run prints no such warning.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/t.ini"
for ranks in 1 3; do
  DYNMO_TEST_MPI_FAULT=send timeout -k 10 60 mpiexec -n $ranks "$DYNMO" train --config "$dir/t.ini" \
    parallel.pp=$ranks run.out_dir="$dir/out$ranks" > "$dir/out$ranks.txt" 2> "$dir/err$ranks.txt"
  rc=$?
  last=$((ranks - 1))
  [ $rc -eq 1 ] || fail "$ranks ranks: exit $rc, want 1"
  ours=$(grep -c 'internal error' "$dir/err$ranks.txt")
  [ "$ours" -eq 1 ] || fail "$ranks ranks: $ours messages, want 1: $(cat "$dir/err$ranks.txt")"
  msg=$(grep 'internal error' "$dir/err$ranks.txt")
  grep -Eq "^\[rank $last\] src/world/world.c:[0-9]+: internal error: MPI_Isend\(.*\): .*[Rr]ank" <<<"$msg" \
    && echo "ok: $ranks ranks: $msg" || fail "$ranks ranks: message does not name rank $last, file:line, the call and MPI's text: $msg"
  grep -q '^step' "$dir/out$ranks.txt" && fail "$ranks ranks: trained after the failure"
done

steps_in() { h5dump -d /steps/loss -H "$1" 2>/dev/null | grep -o 'DATASPACE *SIMPLE { ( [0-9]*' | grep -o '[0-9]*$'; }
for ranks in 2 3; do
  start=$SECONDS
  DYNMO_FINALIZE_SECONDS=3 DYNMO_TEST_MPI_FAULT=finalize timeout -k 10 60 mpiexec -n $ranks "$DYNMO" train \
    --config "$dir/t.ini" parallel.pp=$ranks run.out_dir="$dir/fin$ranks" > "$dir/fin$ranks.txt" 2> "$dir/fin$ranks.err"
  rc=$?
  secs=$((SECONDS - start))
  last=$((ranks - 1))
  # mpiexec's own verdict on a job whose every rank left MPI_Finalize by
  # its bound: 0, or under load (docs/STATUS.md) 1 though each rank exited
  # 0 (about 1 run in 10 on 3 ranks; seen once on 2, in a fresh clone's
  # make check), or 9 when the launcher, seeing the
  # first ranks go, SIGKILLed the last one an instant before its own bound
  # fired. 1 counts only when every rank says it exited with the run's
  # status 0; 9 only when all ranks but one say so (the killed one cannot).
  exited=$(grep -c "^\[rank [0-9]*\] MPI_Finalize did not return within 3 s; exiting 0" "$dir/fin$ranks.err")
  [ $rc -eq 0 ] || { [ $rc -eq 1 ] && [ "$exited" -eq $ranks ]; } \
    || { [ $rc -eq 9 ] && [ $ranks -gt 2 ] && [ "$exited" -ge $((ranks - 1)) ]; } \
    || fail "$ranks ranks, a rank that never finalizes: exit $rc, want 0: $(tail -n 3 "$dir/fin$ranks.err")"
  [ $secs -lt 30 ] || fail "$ranks ranks, a rank that never finalizes: $secs s"
  # who warns: usually the stuck one, but the bounds of the ranks waiting
  # for it end together with its own, and mpiexec may drop the last lines
  # of a rank whose peers have gone (docs/STATUS.md; seen on 2 ranks too
  # under load), so some rank's
  who='[0-9]*'
  grep -q "^\[rank $who\] MPI_Finalize did not return within 3 s; exiting 0" "$dir/fin$ranks.err" \
    && echo "ok: $ranks ranks, rank $last never finalizes: exit 0 in $secs s: $(grep -m 1 "MPI_Finalize" "$dir/fin$ranks.err")" \
    || fail "$ranks ranks: no warning from rank $who: $(cat "$dir/fin$ranks.err")"
  [ "$(steps_in "$dir/fin$ranks/runlog.h5")" = 4 ] || fail "$ranks ranks: the run log does not hold 4 steps"
done
DYNMO_FINALIZE_SECONDS=3 timeout -k 10 60 mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" parallel.pp=2 \
  run.out_dir="$dir/plain" > "$dir/plain.txt" 2> "$dir/plain.err" || fail "an ordinary 2-rank run: exit $?"
grep -q 'MPI_Finalize' "$dir/plain.err" && fail "an ordinary run warned: $(cat "$dir/plain.err")"
out=$(DYNMO_FINALIZE_SECONDS=soon timeout -k 10 60 mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" \
  parallel.pp=2 run.out_dir="$dir/bad" 2>&1 >/dev/null)
rc=$?
[ $rc -eq 2 ] && grep -q '^dynmo: error: DYNMO_FINALIZE_SECONDS=soon: want whole seconds' <<<"$out" \
  && [ ! -e "$dir/bad/runlog.h5" ] \
  && echo "ok: DYNMO_FINALIZE_SECONDS=soon: exit 2 before training: $(grep -m 1 DYNMO_FINALIZE <<<"$out")" \
  || fail "DYNMO_FINALIZE_SECONDS=soon: exit $rc: $out"
finish
