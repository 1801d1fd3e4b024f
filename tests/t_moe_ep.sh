#!/usr/bin/env bash
# Expert parallelism end to end (issue 16, part 2; docs/moe.md): the MoE
# GPT of t_moe.sh with its experts split over parallel.ep ranks of each
# stage's replicas, tokens sent to their experts and back by polled
# all-to-all, where
#   - ep=2 gives the same loss, expert-count and bias bits as ep=1 on the
#     same pp x dp over 20 steps (the owner runs each source's rows apart
#     and returns their gradients, which the source adds as ep=1 does);
#   - so do ep=2 (two expert groups) and ep=4 on one stage of 4 replicas,
#     and ep=2 with layer freezing (frozen MoE blocks);
#   - a balanced run (balance.method=random, live migration every step)
#     with ep=2 gives the same bits as the static one, for both routers;
#   - with ep=2 an MoE block's slab holds its rank's experts only (the
#     start-up line's sizes);
#   - a checkpoint written with ep=2 (each expert's rows by its owner) is
#     the same bits as one written with ep=1, and each resumes under the
#     other ep and another pp with the same bits as the uninterrupted run,
#     and so does one of two expert groups (dp=4 ep=2) resumed with ep=4;
#   - configs/moe.ini runs as pp=2 dp=2 ep=2 on 4 ranks (shortened), with
#     the losses of ep=1;
#   - /moe/rank_load (ep > 1) is the busiest expert rank's rows over the
#     mean's: with one expert group what the counts give, with two at
#     least that;
#   - on fewer CPUs than ranks the balancer predicts with the replicas'
#     CPU shares, and the run log records them;
#   - ep not dividing dp or E is exit 2 with one message.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
moe_configs 20   # moe.ini, sigmoid.ini, dense.ini; run, same_moe (lib.sh)
train_limit=300

run ep1 moe 4 parallel.pp=2 parallel.ep=1
run ep2 moe 4 parallel.pp=2 parallel.ep=2 && same_moe ep1 ep2 "ep=2 vs ep=1, 2 stages x 2 replicas, 20 steps"
grep -q "expert parallelism: 4 experts per MoE block over 2 ranks" "$dir/ep2.out" ||
  fail "the ep=2 run does not say it splits the experts"
run ep2-random moe 4 parallel.pp=2 parallel.ep=2 balance.method=random balance.every=1 && {
  same_moe ep2 ep2-random "ep=2, random re-layout every step vs static"
  grep -q "migrated [0-9]* blocks" "$dir/ep2-random.out" || fail "no migration shown in the step lines"
}
# One stage of 4 replicas: two expert groups of 2 (ep=2), one of 4 (ep=4).
run dp4-ep1 sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=1
run dp4-ep2 sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=2 && same_moe dp4-ep1 dp4-ep2 "1 stage x 4 replicas: ep=2 vs ep=1"
run dp4-ep4 sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=4 && same_moe dp4-ep1 dp4-ep4 "1 stage x 4 replicas: ep=4 vs ep=1"
# /moe/rank_load, the busiest expert rank's rows over the mean rank's:
# with one expert group (ep2) what the summed counts give; with two
# (dp4-ep2) at least that (the worst group's busiest rank); none at ep=1.
/usr/bin/python3 - "$dir" <<'PY' && echo "ok: /moe/rank_load: one group as its counts give, two groups at least the summed counts' figure, none at ep=1" || fail "/moe/rank_load is wrong"
import sys, h5py, numpy as np
d = sys.argv[1]
def from_counts(run, ep):
    f = h5py.File(d + "/" + run + "/runlog.h5", "r")
    t = f["/moe/tokens"][:].astype(float) - f["/moe/dropped"][:]
    E = 4
    t = t.reshape(t.shape[0], -1, ep, E // ep).sum(axis=3)   # [steps, blocks, ranks]
    return f["/moe/rank_load"][:], t.max(axis=2) * ep / t.sum(axis=2)
got, want = from_counts("ep2", 2)
assert got.shape == want.shape and np.allclose(got, want, rtol=1e-6), (got[0], want[0])
got, want = from_counts("dp4-ep2", 2)
assert (got >= want * (1 - 1e-6)).all() and (got > want * (1 + 1e-6)).any(), (got[0], want[0])
for run in ("ep1", "dp4-ep1"):
    assert "/moe/rank_load" not in h5py.File(d + "/" + run + "/runlog.h5", "r"), run
PY
run sig-ep1 sigmoid 4 parallel.pp=2 parallel.ep=1
run sig-ep2-random sigmoid 4 parallel.pp=2 parallel.ep=2 balance.method=random balance.every=1 &&
  same_moe sig-ep1 sig-ep2-random "sigmoid router, bias moving: ep=2 balanced vs ep=1 static"

# Layer freezing with ep=2: frozen MoE blocks skip the expert gradient
# sums and their norm terms alike; the ep=1 bits.
freeze=(dyn.kind=freeze dyn.freeze_window=2 dyn.freeze_every=2 dyn.freeze_threshold=10
        dyn.freeze_max=4 train.steps=12)
run freeze-ep1 moe 4 parallel.pp=2 parallel.ep=1 "${freeze[@]}"
run freeze-ep2 moe 4 parallel.pp=2 parallel.ep=2 "${freeze[@]}" && {
  grep -q "frozen 4/6" "$dir/freeze-ep2.out" || fail "freeze with ep=2: blocks 1 and 3 (MoE) never froze"
  same_moe freeze-ep1 freeze-ep2 "layer freezing (MoE blocks 1, 3 frozen): ep=2 vs ep=1"
}

# Each rank holds only its experts: the start-up line gives an MoE
# block's slab on each rank and with every expert.
slab=$(grep -o "slab is [0-9.]* MiB on each rank ([0-9.]* MiB" "$dir/ep2.out" | head -n 1)
read -r held all < <(sed 's/slab is \([0-9.]*\) MiB on each rank (\([0-9.]*\) MiB/\1 \2/' <<<"$slab")
if [ -n "${held:-}" ] && awk -v h="$held" -v a="$all" 'BEGIN { exit !(h < a) }'; then
  echo "ok: ep=2: an MoE block's slab is $held MiB on each rank ($all MiB with every expert)"
else
  fail "ep=2 does not say its MoE slab is smaller: '$slab'"
fi

# Checkpoints written with ep=2 (each /moe/experts row by its owner) and
# with ep=1 hold the same bits, and each resumes under the other ep and
# another pp with the uninterrupted run's losses.
run ck moe 4 parallel.pp=2 parallel.ep=2 train.steps=6 ckpt.dir="$dir/ck" ckpt.every=3 ckpt.keep=3
run ck1 moe 4 parallel.pp=2 parallel.ep=1 train.steps=6 ckpt.dir="$dir/ck1" ckpt.every=3 ckpt.keep=3
"$DYNMO" check-ckpt "$dir/ck/ckpt-3.h5" > "$dir/check.out" 2>&1 ||
  fail "check-ckpt refuses the ep=2 checkpoint: $(tail -n 2 "$dir/check.out")"
same_ckpt "$dir/ck/ckpt-3.h5" "$dir/ck1/ckpt-3.h5" "ckpt-3 of ep=2 and of ep=1"
for resume in "ep1 ck 4 parallel.pp=2 parallel.ep=1" "pp1 ck 2 parallel.pp=1 parallel.ep=2" \
              "ep2 ck1 4 parallel.pp=2 parallel.ep=2" "pp1-ep2 ck1 2 parallel.pp=1 parallel.ep=2"; do
  set -- $resume
  name=resume-$2-$1 from=$2 ranks=$3; shift 3
  run "$name" moe "$ranks" "$@" train.steps=6 ckpt.dir="$dir/$name-ck" ckpt.resume="$dir/$from/ckpt-3.h5" &&
    same_tail ck "$name" 3 "ckpt-3 of $from resumed as $name"
done

# Two expert groups on one stage (dp=4 ep=2): the first group writes the
# expert rows; resumed with ep=4 (one group), the losses of dp=4 ep=1.
run dp4-ck sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=2 ckpt.dir="$dir/dp4-ck" ckpt.every=3 ckpt.keep=3 &&
  run dp4-resume-ep4 sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=4 ckpt.dir="$dir/dp4-resume-ck" \
    ckpt.resume="$dir/dp4-ck/ckpt-3.h5" &&
  /usr/bin/python3 - "$dir" <<'PY' && echo "ok: ckpt-3 of dp=4 ep=2 (two expert groups) resumed with ep=4: steps 4-6 bit-identical" || fail "dp=4: the ep=2 checkpoint resumed with ep=4 changed the losses"
import sys, h5py
d = sys.argv[1]
a = h5py.File(d + "/dp4-ep1/runlog.h5", "r")["/steps/loss"][:]
b = h5py.File(d + "/dp4-resume-ep4/runlog.h5", "r")["/steps/loss"][:]
assert len(a) == 6 and (a[-3:] == b[-3:]).all(), (a, b)
PY

# configs/moe.ini as pp=2 dp=2 ep=2 on 4 ranks, shortened, against its ep=1,
# on two CPUs whatever the machine has (the replica shares below).
cpus=$(two_cpus)
for ep in 1 2; do
  timeout -k 10 300 taskset -c "$cpus" mpiexec -n 4 "$DYNMO" train --config configs/moe.ini parallel.ep=$ep train.steps=3 \
    train.warmup=1 train.eval_every=3 train.eval_batches=1 run.log_every=1 \
    data.train="$dir/data/train.bin" data.val="$dir/data/val.bin" run.out_dir="$dir/config-ep$ep" \
    > "$dir/config-ep$ep.out" 2>&1 && grep -q "^step 3/3 .*val " "$dir/config-ep$ep.out" ||
    fail "configs/moe.ini with ep=$ep: $(tail -n 3 "$dir/config-ep$ep.out")"
  bits "config-ep$ep" /steps/loss
done
cmp -s "$dir/config-ep1.steps.loss" "$dir/config-ep2.steps.loss" &&
  echo "ok: configs/moe.ini as pp=2 dp=2 ep=2 (3 steps): the losses of ep=1, bit for bit" ||
  fail "configs/moe.ini: ep=2 and ep=1 losses differ"
# A stage's busy time holds its blocks' profiles (each MoE block's its
# busiest expert rank's) and its own other work, never less: what the
# end-stage extras (embedding, head) are read from.
/usr/bin/python3 - "$dir/config-ep2/runlog.h5" 4 <<'PY' && echo "ok: ep=2: each stage's busy time covers its blocks' profiles (end-stage extras >= 0)" || fail "ep=2: a stage's busy time is less than its blocks' profiles"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r"); m = int(sys.argv[2])
busy, layout = f["/stages/busy_ms"][:], f["/layout/history"][:]
blocks = m * (f["/layers/fwd_ms"][:] + f["/layers/bwd_ms"][:]) + f["/layers/update_ms"][:]
for t in range(busy.shape[0]):
    begin = 0
    for s, n in enumerate(layout[t]):
        own = blocks[t, begin:begin + n].sum(); begin += n
        assert busy[t, s] >= own * (1 - 1e-4), (t, s, busy[t, s], own)
PY
# On two CPUs for its 4 ranks the two replicas' ranks take turns on each
# CPU: the balancer predicts with their half-CPU shares (processor
# sharing), and the run log records them (group_shares).
shares=$(h5dump -a group_shares "$dir/config-ep2/runlog.h5" 2>/dev/null | grep -oP '\(0\): \K.*')
if grep -q "the balancer predicts with the replicas' shares of the CPUs (0.5 of a CPU" \
     "$dir/config-ep2.out" && [ "$shares" = "0.5, 0.5" ]; then
  echo "ok: 2 x 2 ranks on 2 CPUs: the balancer predicts with shares 0.5, recorded as group_shares"
else fail "2 x 2 ranks on 2 CPUs: no replica shares (log: $(grep -m1 'processors: the' "$dir/config-ep2.out"), group_shares: ${shares:-none})"; fi

# bad NAME REGEX RANKS overrides...: dense.ini so changed is refused
bad() { train_refused "$1" "$2" "$3" "$dir/dense.ini" "${@:4}"; }
bad "ep does not divide dp" "parallel.ep = 2 does not divide parallel.dp = 1" 1 model.moe_every=1 parallel.ep=2
bad "ep does not divide E" "parallel.ep = 4 does not divide model.experts = 6" 4 model.moe_every=1 model.experts=6 parallel.dp=4 parallel.ep=4 train.micro_batches=2
bad "ep without MoE blocks" "parallel.ep = 2 needs MoE blocks" 2 parallel.dp=2 parallel.ep=2 train.micro_batches=2
finish
