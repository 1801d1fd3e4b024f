#!/usr/bin/env bash
# End to end on one rank: prepare a small corpus, train a tiny GPT twice with
# the same seed (bit-identical /steps/loss), once with another thread count
# (bit-identical too), check the loss falls, the progress lines and the
# summary, and that a different seed gives different losses.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
cat > "$dir/tiny.ini" <<INI
[model]
layers = 2
channels = 64
heads = 4
max_seq = 64
[train]
batch = 8
seq = 64
micro_batches = 2
steps = 30
lr = 3e-3
warmup = 3
eval_every = 10
[data]
train = $dir/data/train.bin
val = $dir/data/val.bin
INI
run() { # run NAME [overrides...]: one rank, without mpiexec
  local name=$1; shift
  "$DYNMO" train --config "$dir/tiny.ini" run.out_dir="$dir/$name" "$@" > "$dir/$name.out" 2>&1 \
    || { fail "train $name exited $?"; cat "$dir/$name.out"; return 1; }
  bits "$name" /steps/loss
}
run a train.threads=2
run b train.threads=2
run c train.threads=1
run d train.threads=2 train.seed=7
cmp -s "$dir/a.steps.loss" "$dir/b.steps.loss" || fail "same seed, same threads: losses differ"
cmp -s "$dir/a.steps.loss" "$dir/c.steps.loss" || fail "1 thread vs 2 threads: losses differ"
cmp -s "$dir/a.steps.loss" "$dir/d.steps.loss" && fail "another seed gave the same losses"
# train.threads = 0 is what the rank may use: its CPUs (taskset, a binding,
# a Slurm cpuset) over the ranks that share them, not the node's count.
cpus=$(two_cpus)
threads_of() { # threads_of CPUS RANKS: the threads per rank the start-up line names
  timeout -k 10 60 taskset -c "$1" mpiexec -n "$2" "$DYNMO" train --config "$dir/tiny.ini" \
    run.out_dir="$dir/threads" train.steps=1 train.warmup=0 train.eval_every=0 parallel.pp="$2" 2>&1 |
    sed -n 's/.*; \([0-9]*\) threads per rank$/\1/p'
}
for want in "${cpus%%,*} 1 1" "$cpus 1 2" "$cpus 2 1"; do
  set -- $want
  have=$(threads_of "$1" "$2")
  [ "$have" = "$3" ] && echo "ok: $2 rank(s) on CPUs $1: $have thread(s) per rank" ||
    fail "$2 rank(s) on CPUs $1: '${have}' threads per rank, want $3"
done
grep -Eq '^step 30/30 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| grad norm [0-9.]+ \| [0-9]+ ms \| [0-9]+ tok/s \| ETA' "$dir/a.out" \
  || fail "no progress line for step 30: $(tail -n 3 "$dir/a.out")"
grep -q 'run log: ' "$dir/a.out" || fail "no summary"
first=$(sed -n 's/.*loss: \([0-9.]*\) at the first step, \([0-9.]*\) at the last/\1/p' "$dir/a.out")
last=$(sed -n 's/.*loss: \([0-9.]*\) at the first step, \([0-9.]*\) at the last/\2/p' "$dir/a.out")
awk -v f="$first" -v l="$last" 'BEGIN{exit !(f > 5.0 && l < f - 1.0)}' \
  || fail "loss did not fall enough: first '$first' last '$last'"
echo "loss $first -> $last"
finish
