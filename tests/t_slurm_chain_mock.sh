#!/usr/bin/env bash
# jobscripts/dynmo-chain.sbatch on a real, private Slurm (tests/slurm-lib.sh)
# with tests/mock-dynmo.sh in place of dynmo (docs/jobs.md is the contract):
#  1. 4 tasks re-pack to 2 (status 3), the 2-task job gets SIGUSR1 in the
#     batch shell only (as --signal=B:USR1 sends it), forwards it, the ranks
#     exit 75, the same job is resubmitted, and the third job finishes (0);
#     one log file holds the whole chain;
#  2. SIGTERM to the batch shell, and a plain scancel: the ranks checkpoint
#     (75) and the chain stops;
#  3. the mpiexec launcher inside Slurm: a re-pack from 2 tasks to 1,
#     SIGUSR1 forwarded through the job steps, 75, then a failing status (5)
#     that stops the chain.
# Skipped (77) when Slurm cannot be installed or started.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/slurm-lib.sh"
script=$here/../jobscripts/dynmo-chain.sbatch
mock=$here/mock-dynmo.sh
slurm_start || exit 77
dir=$(mktemp -d /tmp/dynmo-chain-test.XXXXXX)
chmod 755 "$dir"
trap 'slurm_stop; rm -rf "$dir"' EXIT
cd "$dir" || exit 1

# The job ids a chain log says were submitted, in order.
submitted_jobs() {
    sed -n 's/.*dynmo-chain: submitted job \([0-9]*\):.*/\1/p' "$1"
}

# ---- 1. re-pack, USR1 forwarding, resubmission after 75, done --------------
printf '[ckpt]\ndir = %s/a/ckpt ; the chain finds it here\n' "$dir" >a.ini
job1=$(sbatch --parsable --ntasks=4 --output="$dir/a.log" "$script" --dynmo "$mock" \
       --config a.ini mock.plan=repack:2,wait,done) || fail "sbatch of the first job failed"
job1=${job1%%;*}
if mock_ready "$dir/a/ckpt" 2 2; then
    job2=$(submitted_jobs a.log | head -n 1)
    scancel --batch --signal=USR1 "$job2" || fail "scancel --batch --signal=USR1 $job2 failed"
else
    fail "the 2-task job never reached the mock's wait"
fi
slurm_wait_queue_empty 40 || fail "chain 1 did not end within 40 s: $(squeue -h)"
mapfile -t jobs < <(submitted_jobs a.log)
[ ${#jobs[@]} -eq 2 ] || fail "chain 1 submitted ${#jobs[@]} jobs (${jobs[*]}), want 2"
job2=${jobs[0]:-0} job3=${jobs[1]:-0}
for job in "$job1" "$job2" "$job3"; do
    state=$(slurm_job_field "$job" JobState)
    [ "$state" = COMPLETED ] || fail "job $job: $state ($(slurm_job_field "$job" ExitCode)), want COMPLETED"
done
[ "$(slurm_job_field "$job1" NumTasks)" = 4 ] || fail "job $job1 has $(slurm_job_field "$job1" NumTasks) tasks, want 4"
[ "$(slurm_job_field "$job2" NumTasks)" = 2 ] || fail "job $job2 has $(slurm_job_field "$job2" NumTasks) tasks, want 2"
[ "$(slurm_job_field "$job3" NumTasks)" = 2 ] || fail "job $job3 has $(slurm_job_field "$job3" NumTasks) tasks, want 2"
# afterany: a job starts only after the one before it ended.
for pair in "$job1 $job2" "$job2 $job3"; do
    set -- $pair
    end=$(slurm_job_field "$1" EndTime) start=$(slurm_job_field "$2" StartTime)
    [[ "$start" > "$end" || "$start" == "$end" ]] || fail "job $2 started at $start, before job $1 ended at $end"
done
grep -q "submitted job $job2: link 2, 2 tasks, world 2:1:3,3, after job $job1 (afterany:$job1)" a.log \
    || fail "no submission line for job $job2 with 2 tasks after $job1"
grep -q "submitted job $job3: link 3, 2 tasks, world 2:1:3,3, after job $job2 (afterany:$job2)" a.log \
    || fail "no submission line for job $job3 with 2 tasks after $job2"
record=$dir/a/ckpt/mock.record
want1="link=1 ntasks=4 size=4 args=train --config a.ini mock.plan=repack:2,wait,done"
want2="link=2 ntasks=2 size=2 args=train --config a.ini mock.plan=repack:2,wait,done parallel.pp=2 parallel.dp=1 balance.initial=explicit:3,3 ckpt.resume=auto"
want3="link=3 ntasks=2 size=2 args=train --config a.ini mock.plan=repack:2,wait,done parallel.pp=2 parallel.dp=1 balance.initial=explicit:3,3 ckpt.resume=auto"
mock_launches "$record" "$want1" "$want2" "$want3"
ranks=$dir/a/ckpt/mock.ranks
[ "$(grep -c '^link=1 .*size=4' "$ranks")" -eq 4 ] || fail "launch 1 did not run 4 ranks: $(grep -c '^link=1 ' "$ranks")"
[ "$(grep -c '^link=2 .*size=2 signal=USR1' "$ranks")" -eq 2 ] \
    || fail "SIGUSR1 did not reach both ranks of launch 2: $(grep '^link=2 ' "$ranks" | tr '\n' ';')"
[ "$(grep -c '^link=3 .*size=2' "$ranks")" -eq 2 ] || fail "launch 3 did not run 2 ranks"
for job in "$job1" "$job2" "$job3"; do
    grep -q "dynmo-chain: job $job, link" a.log || fail "the chain log lacks job $job"
done
grep -q "sending SIGUSR1 to srun (pid" a.log || fail "the batch shell did not report SIGUSR1"
grep -q "training finished: the chain ends at link 3" a.log || fail "chain 1 did not end with status 0"
[ $failures -eq 0 ] && echo "ok: re-pack 4 -> 2 tasks, SIGUSR1 forwarded, 75 resubmitted, done (jobs $job1 $job2 $job3)"

# ---- 2. SIGTERM stops the chain ----------------------------------------------
# 2a: to the batch shell alone; 2b: a plain scancel, which sends SIGTERM to the
# ranks and the shell, and SIGKILL KillWait (5) seconds later: the mock's
# 2-second checkpoint must finish in between.
for variant in 2a 2b; do
    printf '[ckpt]\ndir = %s/%s/ckpt\n' "$dir" "$variant" >"$variant.ini"
    job=$(sbatch --parsable --ntasks=2 --output="$dir/$variant.log" "$script" --dynmo "$mock" \
          --config "$variant.ini" mock.plan=wait,done mock.write_s=2) || fail "sbatch of chain $variant failed"
    job=${job%%;*}
    if mock_ready "$dir/$variant/ckpt" 1 2; then
        case $variant in
            2a) scancel --batch --signal=TERM "$job" || fail "scancel --batch --signal=TERM $job failed" ;;
            2b) scancel "$job" || fail "scancel $job failed" ;;
        esac
    else
        fail "chain $variant never reached the mock's wait"
    fi
    state=$(slurm_wait_job "$job" 20)
    exit_code=$(slurm_job_field "$job" ExitCode)
    [ "$exit_code" = 75:0 ] || fail "chain $variant: job $job ended $state, exit code $exit_code, want 75:0"
    slurm_wait_queue_empty 10 || fail "chain $variant left jobs: $(squeue -h)"
    [ -z "$(submitted_jobs "$variant.log")" ] || fail "chain $variant submitted $(submitted_jobs "$variant.log") after SIGTERM"
    [ "$(grep -c ' wrote$' "$dir/$variant/ckpt/mock.ranks")" -eq 2 ] \
        || fail "chain $variant: not every rank finished its checkpoint: $(tr '\n' ';' <"$dir/$variant/ckpt/mock.ranks")"
    grep -q "checkpointed and stopped on SIGTERM" "$variant.log" || fail "chain $variant did not say it stopped on SIGTERM"
done
[ $failures -eq 0 ] && echo "ok: SIGTERM to the batch shell, and scancel: checkpoint (75) and the chain stops"

# ---- 3. mpiexec inside Slurm; a failure stops the chain -----------------------
# Re-pack 2 -> 1, SIGUSR1 to the batch shell reaches the rank through
# scancel's job-step signal, 75 resubmits, then status 5 stops the chain.
printf '[ckpt]\ndir = %s/c/ckpt\n' "$dir" >c.ini
job=$(DYNMO_LAUNCHER=mpiexec sbatch --parsable --ntasks=2 --output="$dir/c.log" "$script" \
      --dynmo "$mock" --config c.ini mock.plan=repack:1,wait,exit:5) || fail "sbatch of chain 3 failed"
job=${job%%;*}
if mock_ready "$dir/c/ckpt" 2 1; then
    scancel --batch --signal=USR1 "$(submitted_jobs c.log | head -n 1)" || fail "scancel --batch --signal=USR1 failed"
else
    fail "chain 3 never reached the mock's wait"
fi
slurm_wait_queue_empty 30 || fail "chain 3 did not end within 30 s: $(squeue -h)"
mapfile -t jobs < <(submitted_jobs c.log)
[ ${#jobs[@]} -eq 2 ] || fail "chain 3 submitted ${#jobs[@]} jobs, want 2"
for job in "${jobs[@]}"; do
    [ "$(slurm_job_field "$job" NumTasks)" = 1 ] || fail "job $job has $(slurm_job_field "$job" NumTasks) tasks, want 1"
done
last=${jobs[1]:-0}
[ "$(slurm_job_field "$last" ExitCode)" = 5:0 ] || fail "job $last exit code $(slurm_job_field "$last" ExitCode), want 5:0"
grep -q "run: mpiexec -n 2 " c.log || fail "chain 3 did not launch with mpiexec -n 2"
grep -q "sent SIGUSR1 to the job steps of job" c.log || fail "chain 3 did not signal the job steps"
grep -q "dynmo failed with status 5: the chain stops at link 3" c.log || fail "chain 3 did not report status 5"
[ "$(grep -c '^link=1 .*size=2' "$dir/c/ckpt/mock.ranks")" -eq 2 ] || fail "mpiexec did not start 2 ranks"
[ "$(grep -c '^link=2 .*size=1 wrote' "$dir/c/ckpt/mock.ranks")" -eq 1 ] || fail "the rank of link 2 did not checkpoint"
[ $failures -eq 0 ] && echo "ok: mpiexec launcher: re-pack 2 -> 1, SIGUSR1 via the job steps, 75, status 5 stops the chain"

if [ $failures -gt 0 ]; then
    for log in a 2a 2b c; do echo "--- $log.log"; cat "$dir/$log.log" 2>/dev/null; done
fi
finish
