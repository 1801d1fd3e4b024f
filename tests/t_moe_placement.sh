#!/usr/bin/env bash
# Expert placement (moe.placement, docs/moe.md): experts moved between
# the ranks of an expert-parallel group change where they run, never what
# is computed, where
#   - a random placement every step (moe.placement=random, the test aid)
#     gives the loss, gradient-norm, expert-count and bias bits of ep=1:
#     2 stages x 2 replicas with ep=2 (also with a random block layout
#     every step, blocks migrating with their placement), 1 stage x 4
#     replicas with ep=4 (one group) and ep=2 (two groups);
#   - copies of experts (moe.replicas_max), random ones every step on
#     ep=2 (2 stages) and ep=4, and the planner's under balanced, give
#     the ep=1 bits; /moe/copies counts them;
#   - moe.placement=balanced with pp=1 on skewed routing (no balancing
#     loss, no bias) moves experts at its decisions, with the ep=1 bits;
#     /moe/placement records the rank of each expert per step, and
#     /moe/rank_load is the busiest rank's rows under that placement;
#   - a checkpoint written under a moved placement is the same bits as
#     one of ep=1 and resumes under ep=1 and under the static placement
#     with the uninterrupted run's losses;
#   - bad settings exit 2 with one message.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
moe_configs 8   # moe.ini, sigmoid.ini, dense.ini; run, same_moe (lib.sh)
tiny_config "$dir/skewed.ini" "${moe[@]}" moe.router=sigmoid moe.aux_loss=0 moe.z_loss=0 train.steps=8
train_limit=300

# moved RUN: the run log's /moe/placement holds a placement other than
# the static one at some step.
moved() {
  /usr/bin/python3 - "$dir/$1/runlog.h5" "$2" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r"); ep = int(sys.argv[2])
p = f["/moe/placement"][:]
E = 4
static = np.tile(np.arange(E) // (E // ep), p.shape[1] // E)
assert (p >= 0).all() and (p < ep).all(), p
for t in range(p.shape[0]):
    for b in range(p.shape[1] // E):
        assert (np.bincount(p[t, b * E:(b + 1) * E], minlength=ep) == E // ep).all(), (t, b, p[t])
sys.exit(0 if (p != static).any() else 1)
PY
}

run ep1 moe 4 parallel.pp=2 parallel.ep=1
run ep2-random moe 4 parallel.pp=2 parallel.ep=2 moe.placement=random && {
  same_moe ep1 ep2-random "ep=2, a random expert placement every step vs ep=1"
  moved ep2-random 2 || fail "ep=2 random: /moe/placement never left the static placement"
}
run ep2-random-relayout moe 4 parallel.pp=2 parallel.ep=2 moe.placement=random \
  balance.method=random balance.every=1 &&
  same_moe ep1 ep2-random-relayout "ep=2, random placement and random block layout every step vs ep=1"

run dp4-ep1 sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=1
run dp4-ep4 sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=4 moe.placement=random &&
  same_moe dp4-ep1 dp4-ep4 "1 stage x 4 replicas, ep=4, random placement every step vs ep=1"
run dp4-ep2 sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=2 moe.placement=random &&
  same_moe dp4-ep1 dp4-ep2 "1 stage x 4 replicas, two groups of ep=2, random placement vs ep=1"

# Copies of experts (moe.replicas_max): random copies every step, each
# serving random sources of its expert's group, with the ep=1 bits; the
# run log's /moe/copies counts them.
copied() {
  /usr/bin/python3 - "$dir/$1/runlog.h5" <<'PY'
import sys, h5py
c = h5py.File(sys.argv[1], "r")["/moe/copies"][:]
sys.exit(0 if (c > 0).any() and (c >= 0).all() else 1)
PY
}
run ep2-copies moe 4 parallel.pp=2 parallel.ep=2 moe.placement=random moe.replicas_max=2 && {
  same_moe ep1 ep2-copies "ep=2, random placement and 2 random expert copies every step vs ep=1"
  copied ep2-copies || fail "ep=2 with copies: /moe/copies never counted a copy"
}
run dp4-ep4-copies sigmoid 4 parallel.pp=1 parallel.dp=4 parallel.ep=4 moe.placement=random \
  moe.replicas_max=3 &&
  same_moe dp4-ep1 dp4-ep4-copies "1 stage x 4 replicas, ep=4, 3 random expert copies every step vs ep=1"

# Balanced on skewed routing (sigmoid scores, no bias, no balancing loss),
# one stage, a decision every 2 steps.
run skew-ep1 skewed 2 parallel.pp=1 parallel.ep=1
run skew-balanced skewed 2 parallel.pp=1 parallel.ep=2 moe.placement=balanced balance.every=2 && {
  same_moe skew-ep1 skew-balanced "pp=1, ep=2, moe.placement=balanced vs ep=1"
  grep -q "^placement: step [0-9]*: block [0-9]*: busiest expert rank .*: moving" "$dir/skew-balanced.out" &&
    moved skew-balanced 2 && echo "ok: balanced placement moved experts on skewed routing" ||
    fail "balanced placement never moved an expert: $(grep -m2 '^placement' "$dir/skew-balanced.out")"
  /usr/bin/python3 - "$dir/skew-balanced/runlog.h5" <<'PY' && echo "ok: /moe/rank_load is the busiest rank's rows under the recorded placement" || fail "/moe/rank_load does not follow the placement"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
t = f["/moe/tokens"][:].astype(float) - f["/moe/dropped"][:]
p, got = f["/moe/placement"][:], f["/moe/rank_load"][:]
steps, cols = t.shape
want = np.zeros(got.shape)
for s in range(steps):
    for b in range(cols // 4):
        rows = np.zeros(2)
        for e in range(4):
            rows[p[s, b * 4 + e]] += t[s, b * 4 + e]
        want[s, b] = rows.max() * 2 / rows.sum()
assert np.allclose(got, want, rtol=1e-6), (got, want)
PY
}
run skew-copies skewed 2 parallel.pp=1 parallel.ep=2 moe.placement=balanced balance.every=2 \
  moe.replicas_max=2 && {
  same_moe skew-ep1 skew-copies "pp=1, ep=2, moe.placement=balanced with moe.replicas_max=2 vs ep=1"
  grep -q "^placement: step [0-9]*: block [0-9]*: [0-9] expert copies, busiest expert rank" \
    "$dir/skew-copies.out" && copied skew-copies &&
    echo "ok: balanced placement copied hot experts on skewed routing" ||
    fail "balanced placement never copied an expert: $(grep -m2 '^placement' "$dir/skew-copies.out")"
}

# A checkpoint under a moved placement: the ep=1 checkpoint's bits, and
# resumed under ep=1 and the static placement with the same losses.
run ck moe 4 parallel.pp=2 parallel.ep=2 moe.placement=random train.steps=6 \
  ckpt.dir="$dir/ck" ckpt.every=3 ckpt.keep=3
run ck1 moe 4 parallel.pp=2 parallel.ep=1 train.steps=6 ckpt.dir="$dir/ck1" ckpt.every=3 ckpt.keep=3
"$DYNMO" check-ckpt "$dir/ck/ckpt-3.h5" > "$dir/check.out" 2>&1 ||
  fail "check-ckpt refuses the checkpoint of a moved placement: $(tail -n 2 "$dir/check.out")"
same_ckpt "$dir/ck/ckpt-3.h5" "$dir/ck1/ckpt-3.h5" "ckpt-3 under a random placement against ep=1's"
/usr/bin/python3 - "$dir" <<'PY' && echo "ok: ckpt-3 keeps the placement of its step (an order of the experts per MoE block), ep=1's none" || fail "the placement is not kept"
import sys, h5py
a, b = h5py.File(sys.argv[1] + "/ck/ckpt-3.h5", "r"), h5py.File(sys.argv[1] + "/ck1/ckpt-3.h5", "r")
p = a["moe/state/placement"][()]
assert "moe/state/placement" not in b and p.shape == (3, 4), p.shape
assert sorted(p.ravel()) == sorted(list(range(4)) * 3), p
PY
for resume in "ep1 parallel.ep=1" "static parallel.ep=2" "balanced parallel.ep=2 moe.placement=balanced" \
  "copies parallel.ep=2 moe.placement=random moe.replicas_max=2"; do
  set -- $resume
  name=resume-$1; shift
  run "$name" moe 4 parallel.pp=2 "$@" train.steps=6 ckpt.dir="$dir/$name-ck" \
    ckpt.resume="$dir/ck/ckpt-3.h5" && same_tail ck "$name" 3 "ckpt-3 of a random placement resumed as $name"
done
# Resumed with moe.placement=balanced, step 4 runs under the kept
# placement: the one the uninterrupted run had at step 4.
/usr/bin/python3 - "$dir" <<'PY' && echo "ok: resumed with moe.placement=balanced, step 4 runs under the checkpoint's placement" || fail "the balanced resume did not take the kept placement"
import sys, h5py
d = sys.argv[1]
a = h5py.File(d + "/ck/runlog.h5", "r")["/moe/placement"][:]
b = h5py.File(d + "/resume-balanced/runlog.h5", "r")["/moe/placement"][:]
assert (a[-3] == b[-3]).all() and (a[-3] != a[0] * 0 + [0, 0, 1, 1] * 3).any(), (a, b)
PY

bad() { train_refused "$1" "$2" "$3" "$4.ini" "${@:5}"; }
bad "balanced with ep=1" "moe.placement = balanced moves experts between expert-parallel ranks, but parallel.ep = 1" \
  2 "$dir/moe" moe.placement=balanced
bad "balanced without MoE" "MoE keys are set" 1 "$dir/dense" moe.placement=balanced
bad "unknown placement" "moe.placement = 'even' must be static, balanced or random" 2 "$dir/moe" \
  parallel.ep=2 moe.placement=even
bad "negative replicas" "moe.replicas_max = -1 must be 0 .. 2" 2 "$dir/moe" parallel.ep=2 moe.replicas_max=-1
bad "too many replicas" "moe.replicas_max = 3 must be 0 .. 2" 2 "$dir/moe" parallel.ep=2 moe.replicas_max=3
bad "copies without placement" "moe.replicas_max = 1 copies hot experts at the placement decisions, but moe.placement = static" \
  2 "$dir/moe" parallel.ep=2 moe.replicas_max=1
finish
