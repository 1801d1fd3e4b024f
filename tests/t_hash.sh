#!/usr/bin/env bash
# Hash-sparse attention end to end (issue 17; docs/mod-hash.md): a small
# GPT with model.attention = hash (4 buckets) on 2 stages x 2 replicas, where
#   - a balanced run (balance.method=random: a new layout, and live
#     migration, every step) gives the same loss bits as the static run
#     (the rotations depend on the seed, the block and the step only);
#   - 1 stage x 2 replicas and 4 stages x 1 replica give the same bits;
#   - one bucket gives a loss within 1e-4 of dense attention;
#   - /hash/tiles records the tiles each block visited, the same for both;
#   - /hash/own_key_only records the share of query rows that had no key
#     of their bucket but their own (0 with one bucket), the same for both,
#     and dynmo inspect shows it;
#   - a resume on another layout continues with the same bits;
#   - configs/hash.ini runs on 2 and 4 ranks (shortened by overrides).
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/hash.ini" model.attention=hash hash.buckets=4 parallel.dp=2 \
  train.micro_batches=2
tiny_config "$dir/one.ini" model.attention=hash hash.buckets=1
tiny_config "$dir/dense.ini"
# run NAME CONFIG RANKS [overrides...]: its losses' bits, and with hash
# attention the tiles each block visited and its own-key-only shares;
# same_hash A B WHAT compares them
hashed=(/hash/tiles /hash/own_key_only)
run() {
  train "$1" "$3" "$2" "${@:4}" && bits "$1" /steps/loss &&
    { ! has "$1" /hash/tiles || bits "$1" "${hashed[@]}"; }
}
same_hash() { same "$1" "$2" "$3" /steps/loss "${hashed[@]}"; }
run static "$dir/hash.ini" 4 parallel.pp=2
run random "$dir/hash.ini" 4 parallel.pp=2 balance.method=random balance.every=1 && {
  same_hash static random "hash attention, random re-layout every step vs static"
  grep -q "migrated [0-9]* blocks" "$dir/random.out" || fail "no migration shown in the step lines"
}
run onestage "$dir/hash.ini" 2 parallel.pp=1 && same_hash static onestage "1 stage x 2 replicas vs 2 x 2"
run one "$dir/one.ini" 1
run dense "$dir/dense.ini" 1
/usr/bin/python3 - "$dir" <<'PY' || fail "one bucket is not dense attention"
import sys, numpy as np
d = sys.argv[1]
a = np.fromfile(d + "/one.steps.loss", "<f4"); b = np.fromfile(d + "/dense.steps.loss", "<f4")
diff = np.abs(a - b).max()
print(f"ok: one bucket vs dense attention: {len(a)} step losses, max |diff| {diff:.3g}")
sys.exit(0 if len(a) == len(b) and diff <= 1e-4 else 1)
PY
# /hash/tiles: [steps, layers]; one bucket visits every causal tile: per
# (sequence, head) nt (nt + 1) / 2 with nt = T / 32 = 1, forward and backward,
# so 2 x batch 8 x 2 heads = 32 per block and step
/usr/bin/python3 - "$dir" <<'PY' || fail "/hash/tiles is wrong"
import sys, h5py, numpy as np
d = sys.argv[1]
t = h5py.File(d + "/static/runlog.h5", "r")["/hash/tiles"][:]
one = h5py.File(d + "/one/runlog.h5", "r")["/hash/tiles"][:]
assert t.shape == (4, 6) and (t >= 0).all() and t.sum() > 0, t
assert (one == 32).all(), one
assert (t <= 32).all(), t
print(f"ok: /hash/tiles: 4 bucket runs visit {t.mean():.1f} of 32 tiles per block and step; one bucket all 32")
PY
# /hash/own_key_only: [steps, layers], a share in [0, 1]; with one bucket
# every query finds its own key in its bucket, so 0
/usr/bin/python3 - "$dir" <<'PY' || fail "/hash/own_key_only is wrong"
import sys, h5py, numpy as np
d = sys.argv[1]
s = h5py.File(d + "/static/runlog.h5", "r")["/hash/own_key_only"][:]
one = h5py.File(d + "/one/runlog.h5", "r")["/hash/own_key_only"][:]
assert s.shape == (4, 6) and (s >= 0).all() and (s <= 1).all() and s.max() > 0, s
assert (one == 0).all(), one
print(f"ok: /hash/own_key_only: 4 buckets at T 32: {100 * s.mean():.2f}% of the query rows "
      f"(block max {100 * s.mean(axis=0).max():.2f}%) had only their own key; one bucket 0")
PY
if "$DYNMO" inspect "$dir/static/runlog.h5" > "$dir/inspect.out" 2>&1 &&
   grep -q "hash attention: .* of the query rows had no key of their bucket but their own" \
     "$dir/inspect.out" &&
   "$DYNMO" inspect "$dir/static/runlog.h5" --json | /usr/bin/python3 -c '
import json, sys; h = json.load(sys.stdin)["hash"]
assert 0 < h["own_key_only_share"] <= 1 and h["steps"] == 4, h'; then
  echo "ok: inspect: $(grep "^hash attention" "$dir/inspect.out")"
else
  fail "inspect does not show /hash/own_key_only"; cat "$dir/inspect.out"
fi
"$DYNMO" report "$dir/static/runlog.h5" --out "$dir/report" > "$dir/report.out" 2>&1 &&
  grep -q "hash tiles visited" "$dir/report/index.html" &&
  echo "ok: report: the share of causal tiles visited beside the cost" ||
  { fail "the report does not show /hash/tiles"; cat "$dir/report.out"; }
# checkpoint and resume: 2 stages for 2 steps, then 1 rank to step 4, the
# same bits as 4 steps on 2 stages (the rotations follow the step, not the run)
run full "$dir/hash.ini" 2 parallel.pp=2 parallel.dp=1 ckpt.dir="$dir/ca" ckpt.every=2
run part "$dir/hash.ini" 2 parallel.pp=2 parallel.dp=1 ckpt.dir="$dir/cb" ckpt.every=2 train.steps=2
run part "$dir/hash.ini" 1 parallel.pp=1 parallel.dp=1 ckpt.dir="$dir/cb" ckpt.every=2 &&
  same_hash full part "checkpoint at step 2 on 2 stages, resumed on 1 rank"
# the checkpoint records attention and buckets (/model attention, hash_buckets)
# and refuses a run with other ones: exit 2, one message
refused() { # refused NAME CONFIG WHAT PATTERN [overrides...]
  local name=$1 config=$2 what=$3 pattern=$4; shift 4
  timeout -k 10 120 mpiexec -n 1 "$DYNMO" train --config "$config" parallel.pp=1 parallel.dp=1 \
    run.out_dir="$dir/$name" ckpt.dir="$dir/cb" train.steps=6 "$@" > "$dir/$name.out" 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && grep -q "$pattern" "$dir/$name.out" && [ "$(grep -c . "$dir/$name.out")" -le 3 ]; then
    echo "ok: $what: exit 2, one message"
  else
    fail "$what: exit $rc"; cat "$dir/$name.out"
  fi
}
refused todense "$dir/dense.ini" "hash checkpoint into a dense run" \
  "attention is hash with 4 hash buckets in the checkpoint but dense with 0 in this run"
refused eight "$dir/hash.ini" "hash checkpoint into 8 buckets" \
  "attention is hash with 4 hash buckets in the checkpoint but hash with 8" hash.buckets=8
short=(model.layers=4 train.steps=2 train.warmup=1 train.eval_every=0 "data.train=$dir/data/train.bin"
       "data.val=$dir/data/val.bin")
run cfg2 configs/hash.ini 2 "${short[@]}" parallel.pp=2 parallel.dp=1 &&
  echo "ok: configs/hash.ini on 2 ranks; $("$DYNMO" inspect "$dir/cfg2/runlog.h5" | grep "^hash attention")"
run cfg4 configs/hash.ini 4 "${short[@]}" parallel.pp=2 parallel.dp=2 && echo "ok: configs/hash.ini on 4 ranks"
finish
