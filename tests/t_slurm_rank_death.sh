#!/usr/bin/env bash
# A rank lost without dynmo's say, on a real, private Slurm: the chain
# script runs dynmo train on 2 tasks (srun --mpi=pmi2); task 1 is killed
# with SIGKILL mid-run, as the out-of-memory killer or a lost node would.
# The other rank is left waiting for its messages. The job must end
# within the chain's --task-wait (srun --wait; 5 s here) plus a margin, not
# hold its allocation to the time limit; the chain must stop at link 1
# with a message that names the lost rank and how to resume; the newest
# checkpoint must pass check-ckpt and resume. Skipped (77) when Slurm cannot
# be installed or started.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/slurm-lib.sh"
slurm_chain_test_begin death
tiny_config run.ini train.steps=1000000 run.out_dir="$dir/out" ckpt.dir="$dir/ckpt" ckpt.every=20
job=$(sbatch --parsable --ntasks=2 --output="$dir/chain.log" "$script" --dynmo "$DYNMO" \
      --task-wait 5 --config run.ini parallel.pp=2) || fail "sbatch failed"
job=${job%%;*}
for _ in $(seq 1 600); do grep -q "^step 100/" chain.log 2>/dev/null && break; sleep 0.1; done
grep -q "^step 100/" chain.log || fail "the run did not reach step 100: $(tail -n 3 chain.log)"
grep -q "srun --mpi=pmi2 --ntasks=2 --wait=5" chain.log || fail "the chain did not run srun with --wait=5"
# task 1's process, as Slurm lists the step's tasks (PID JOBID STEPID LOCALID GLOBALID)
victim=$(scontrol listpids "$job" 2>/dev/null | awk 'NR > 1 && $3 != "batch" && $5 == 1 { print $1 }' | head -n 1)
[ -n "$victim" ] || fail "no pid for task 1 of job $job: $(scontrol listpids "$job" 2>&1)"
killed_at=$(date +%s)
kill -9 "$victim" 2>/dev/null || fail "could not kill task 1 (pid $victim)"
for _ in $(seq 1 600); do [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break; sleep 0.1; done
took=$(( $(date +%s) - killed_at ))
if [ -z "$(squeue -h -j "$job" 2>/dev/null)" ]; then
  echo "ok: task 1 killed: the job ended $took s later (--task-wait 5), state $(slurm_job_field "$job" JobState)"
else
  fail "task 1 killed: the job still runs after $took s ($(squeue -h -j "$job"))"
  scancel "$job"
fi
grep "dynmo-chain" chain.log | tail -n 2
grep -q "error: dynmo .*the chain stops at link 1.*submit again with ckpt.resume=auto" chain.log \
  && echo "ok: the chain stopped at link 1 and says how to resume" \
  || fail "the chain's last words do not stop it with a resume hint: $(grep dynmo-chain chain.log | tail -n 1)"
grep -q "submitted job" chain.log && fail "the chain submitted another job after losing a rank"
latest=$(cat "$dir/ckpt/latest" 2>/dev/null)
[ -n "$latest" ] || fail "no latest checkpoint"
if "$DYNMO" check-ckpt "$dir/ckpt/$latest" > check.out 2>&1; then
  echo "ok: the newest checkpoint ($latest) passes check-ckpt"
else
  fail "the newest checkpoint $latest fails check-ckpt: $(tail -n 2 check.out)"
fi
step=$(sed -n 's/^ckpt-\([0-9]*\)\.h5$/\1/p' <<<"$latest")
timeout -k 10 120 mpiexec -n 2 "$DYNMO" train --config run.ini parallel.pp=2 ckpt.resume=auto \
  train.steps=$((step + 3)) run.out_dir="$dir/resumed" > resumed.out 2>&1 \
  && grep -q "resumed from .*$latest at step $step" resumed.out \
  && echo "ok: resumed from $latest and ran to step $((step + 3))" \
  || fail "resuming from $latest failed: $(tail -n 3 resumed.out)"
finish
