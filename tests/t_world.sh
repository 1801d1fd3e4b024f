#!/usr/bin/env bash
# A failing MPI call ends the whole job with exit 1 and one message naming
# the rank, file:line, the call and MPI's own error text (world.h,
# WORLD_MPI): DYNMO_TEST_MPI_FAULT=send makes the last rank send to a rank
# that does not exist. No rank may hang (timeout), and no other rank
# prints a message of its own.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/t.ini"
for ranks in 1 3; do
  DYNMO_TEST_MPI_FAULT=send timeout 60 mpiexec -n $ranks "$DYNMO" train --config "$dir/t.ini" \
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
finish
