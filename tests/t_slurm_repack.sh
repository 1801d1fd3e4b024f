#!/usr/bin/env bash
# The real thing on a real, private Slurm (issue 5): jobscripts/dynmo-chain.sbatch
# runs dynmo train on 4 tasks (srun --mpi=pmi2); the re-pack planner decides
# that fewer stages keep the step time, dynmo checkpoints and exits 3, the
# script submits the next job with the smaller task count, which resumes
# (resharding the checkpoint) and finishes. The chain's loss trajectory must
# be bit-identical to an unbroken one-rank run. Skipped (77) when Slurm
# cannot be installed or started.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/slurm-lib.sh"
slurm_chain_test_begin repack
tiny_config run.ini train.steps=40 train.lr=1e-3 train.warmup=2 run.out_dir="$dir/out" \
  ckpt.dir="$dir/ckpt" repack.enable=1 repack.every=10 repack.epsilon=5 repack.min_ranks=2
timeout -k 10 120 "$DYNMO" train --config run.ini run.out_dir="$dir/full" repack.enable=0 ckpt.dir= > full.out 2>&1 \
  || fail "unbroken run failed: $(tail -n 3 full.out)"
job1=$(sbatch --parsable --ntasks=4 --output="$dir/chain.log" "$script" --dynmo "$DYNMO" \
       --config run.ini parallel.pp=4) || fail "sbatch failed"
job1=${job1%%;*}
slurm_wait_queue_empty 120 || fail "the chain did not end within 120 s: $(squeue -h)"
cat chain.log | grep -E "dynmo-chain|repack:|resumed from|summary" | head -20
grep -q "repack: step 10: " chain.log || fail "no re-pack decision in the chain log"
grep -q "resumed from .*ckpt-10.h5 at step 10" chain.log || fail "the smaller job did not resume from step 10"
jobs=$(sed -n 's/.*dynmo-chain: submitted job \([0-9]*\):.*/\1/p' chain.log)
[ -n "$jobs" ] || fail "no next job was submitted"
for job in $job1 $jobs; do
  echo "job $job: $(slurm_job_field "$job" NumTasks) tasks, $(slurm_job_field "$job" JobState), exit $(slurm_job_field "$job" ExitCode)"
done
[ "$(slurm_job_field "$job1" NumTasks)" = 4 ] || fail "first job did not have 4 tasks"
last=$(tail -n1 <<<"$jobs")
[ "$(slurm_job_field "$last" NumTasks)" = 2 ] || fail "the last job has $(slurm_job_field "$last" NumTasks) tasks, want 2"
[ "$(slurm_job_field "$last" JobState)" = COMPLETED ] || fail "the last job did not complete"
bits full /steps/loss
bits out /steps/loss
cmp -s "$dir/full.steps.loss" "$dir/out.steps.loss" && echo "ok: Slurm chain 4 -> 2 tasks: losses bit-identical to the unbroken run" \
  || fail "the chain's losses differ from the unbroken run"
finish
