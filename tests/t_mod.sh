#!/usr/bin/env bash
# Mixture of depths end to end (issue 17; docs/mod-hash.md): a small GPT
# with a MoD block every second layer, causal routing (the MLP predictor,
# 16 hidden units, decides, so the tokens processed vary), on 2 stages x 2
# replicas, where
#   - a balanced run (balance.method=random: a new layout, and live
#     migration, every step) gives the same loss and /mod/tokens bits as
#     the static run; so do 1 stage x 2 replicas and 4 stages x 1 replica;
#   - top-k routing processes exactly ceil(capacity x T) tokens per
#     sequence (the /mod/tokens count is fixed), and is bit-identical too;
#   - causal routing's predictors' BCE (/mod/predictor_bce) starts at ln 2
#     and is bit-identical across layouts; top-k has none;
#   - a checkpoint at step 2 on 2 stages resumed on 1 rank continues with
#     the same bits (its /mod rows: the router and the MLP predictor, /mod
#     format 2), and refuses to load into another model (exit 2), another
#     predictor width among them;
#   - a checkpoint of the dynmo before the MLP predictor (/mod format 1,
#     tests/data/ckpt/mod-format1.h5) is refused by check-ckpt and by a
#     resume: exit 2, naming the format;
#   - configs/mod.ini runs on 2 and 4 ranks (shortened by overrides).
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/mod.ini" model.mod_every=2 model.mod_capacity=0.25 mod.routing=causal \
  mod.predictor_hidden=16 parallel.dp=2 train.micro_batches=2
tiny_config "$dir/topk.ini" model.mod_every=2 model.mod_capacity=0.25 mod.routing=topk \
  parallel.dp=2 train.micro_batches=2
# run NAME CONFIG RANKS [overrides...]: its losses' bits, the tokens each
# MoD block processed and, with causal routing, its predictor's BCE;
# same_mod A B WHAT compares them (the BCE where A has one)
run() {
  train "$1" "$3" "$2" "${@:4}" && bits "$1" /steps/loss /mod/tokens &&
    { ! has "$1" /mod/predictor_bce || bits "$1" /mod/predictor_bce; }
}
same_mod() {
  if [ -e "$dir/$1.mod.predictor_bce" ]; then same "$@" /steps/loss /mod/tokens /mod/predictor_bce
  else same "$@" /steps/loss /mod/tokens; fi
}
run static "$dir/mod.ini" 4 parallel.pp=2
run random "$dir/mod.ini" 4 parallel.pp=2 balance.method=random balance.every=1 && {
  same_mod static random "MoD causal, random re-layout every step vs static (2 x 2)"
  grep -q "migrated [0-9]* blocks" "$dir/random.out" || fail "no migration shown in the step lines"
  grep -q "MoD [0-9.]*% tokens" "$dir/random.out" || fail "no MoD share in the step lines"
}
run onestage "$dir/mod.ini" 2 parallel.pp=1 && same_mod static onestage "1 stage x 2 replicas vs 2 x 2"
run four "$dir/mod.ini" 4 parallel.pp=4 parallel.dp=1 train.micro_batches=4
run four_random "$dir/mod.ini" 4 parallel.pp=4 parallel.dp=1 train.micro_batches=4 \
  balance.method=random balance.every=1 && same_mod four four_random "4 stages, random re-layout every step vs static"
run tstatic "$dir/topk.ini" 2 parallel.pp=2 parallel.dp=1
run trandom "$dir/topk.ini" 2 parallel.pp=2 parallel.dp=1 balance.method=random balance.every=1 &&
  same_mod tstatic trandom "MoD top-k, random re-layout every step vs static (2 stages)"
# /mod/tokens: [steps, MoD blocks] = [4, 3]; top-k takes ceil(0.25 x 32) = 8
# of each sequence's 32 tokens: 8 sequences x 8 = 64 per block and step
/usr/bin/python3 - "$dir" <<'PY' || fail "/mod/tokens or /mod/predictor_bce is wrong"
import sys, h5py, numpy as np
d = sys.argv[1]
t = h5py.File(d + "/tstatic/runlog.h5", "r")["/mod/tokens"][:]
c = h5py.File(d + "/static/runlog.h5", "r")["/mod/tokens"][:]
assert t.shape == (4, 3) and (t == 64).all(), t
assert c.shape == (4, 3) and (c >= 0).all() and (c <= 256).all(), c
print(f"ok: /mod/tokens: top-k 64 of 256 per block and step; causal {c.min():.0f}..{c.max():.0f}")
# the causal predictors' BCE: the MLP's matrices start small (N(0, 0.02)),
# its biases at 0, so each starts within 0.01 of ln 2 and is trained from
# there; top-k has no predictor
b = h5py.File(d + "/static/runlog.h5", "r")["/mod/predictor_bce"][:]
assert b.shape == (4, 3) and np.isfinite(b).all() and (b > 0).all(), b
assert abs(b[0] - np.log(2)).max() < 0.01, b[0]
assert "/mod/predictor_bce" not in h5py.File(d + "/tstatic/runlog.h5", "r")
print(f"ok: /mod/predictor_bce: causal {b.min():.4f}..{b.max():.4f} (ln 2 = 0.6931 at step 1); none with top-k")
PY
# inspect summarises /mod/tokens (run log) and the MoD keys (checkpoint, below)
"$DYNMO" inspect "$dir/tstatic/runlog.h5" > "$dir/inspect.out" 2>&1 &&
  grep -q "mixture of depths: 3 MoD blocks (every 2), tokens processed per block and step of 256: 64 (25.0%)" "$dir/inspect.out" &&
  echo "ok: inspect: $(grep 'mixture of depths' "$dir/inspect.out" | cut -c1-100)" ||
  { fail "inspect does not summarise /mod/tokens"; cat "$dir/inspect.out"; }
# the report draws /mod/tokens beside the per-block cost
"$DYNMO" report "$dir/static/runlog.h5" --out "$dir/report" > "$dir/report.out" 2>&1 &&
  grep -q "MoD tokens processed" "$dir/report/index.html" &&
  echo "ok: report: the MoD blocks' share of tokens beside the cost" ||
  { fail "the report does not show /mod/tokens"; cat "$dir/report.out"; }
# checkpoint and resume: 2 stages for 2 steps, then 1 rank to step 4
run full "$dir/mod.ini" 2 parallel.pp=2 parallel.dp=1 ckpt.dir="$dir/ca" ckpt.every=2
run part "$dir/mod.ini" 2 parallel.pp=2 parallel.dp=1 ckpt.dir="$dir/cb" ckpt.every=2 train.steps=2
run part "$dir/mod.ini" 1 parallel.pp=1 parallel.dp=1 ckpt.dir="$dir/cb" ckpt.every=2 &&
  same_mod full part "checkpoint at step 2 on 2 stages, resumed on 1 rank"
"$DYNMO" check-ckpt "$dir/cb/ckpt-2.h5" > "$dir/check.out" 2>&1 &&
  echo "ok: check-ckpt passes a MoD checkpoint (/model keys, /mod rows)" ||
  { fail "check-ckpt refuses a MoD checkpoint"; cat "$dir/check.out"; }
/usr/bin/python3 - "$dir/cb/ckpt-2.h5" <<'PY' || fail "the MoD checkpoint's keys or rows are wrong"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
m = f["/model"].attrs
assert m["mod_every"] == 2 and m["mod_capacity"] == "0.25" and m["mod_routing"] == "causal", dict(m)
assert m["attention"] == "dense" and m["hash_buckets"] == 0, dict(m)
a = f["/mod"].attrs
assert a["format"] == 2 and a["predictor_hidden"] == 16, dict(a)
# the router (32), then the predictor: W1 16 x 32, b1 16, w2 16, b2 1
assert f["/mod/params"].shape == (3, 32 + 16 * 32 + 2 * 16 + 1) and f["/blocks/params"].shape[0] == 6
print("ok: MoD checkpoint: /model mod_every 2, capacity 0.25, causal; /mod format 2, "
      "predictor_hidden 16; /mod/params 3 x 577 (router 32, MLP predictor 545)")
PY
"$DYNMO" inspect "$dir/cb/ckpt-2.h5" 2>&1 | grep -q "mixture of depths: every 2 blocks (3 MoD blocks), capacity 0.25, causal routing by an MLP predictor of hidden width 16" &&
  echo "ok: inspect shows a checkpoint's MoD keys" || fail "inspect does not show a checkpoint's MoD keys"
refused() { # refused NAME WHAT PATTERN [overrides...]: resume from cb must exit 2 with PATTERN
  local name=$1 what=$2 pattern=$3; shift 3
  timeout -k 10 120 mpiexec -n 1 "$DYNMO" train --config "${config:-$dir/mod.ini}" parallel.pp=1 parallel.dp=1 \
    run.out_dir="$dir/$name" ckpt.dir="$dir/cb" train.steps=6 "$@" > "$dir/$name.out" 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && grep -q "$pattern" "$dir/$name.out" && [ "$(grep -c . "$dir/$name.out")" -le 3 ]; then
    echo "ok: $what: exit 2, $(grep -o "$pattern.*" "$dir/$name.out" | head -1 | cut -c1-90)"
  else
    fail "$what: exit $rc"; cat "$dir/$name.out"
  fi
}
refused every "MoD checkpoint into mod_every 3" "mixture of depths is model.mod_every 2" model.mod_every=3
refused capacity "MoD checkpoint into capacity 0.5" "mod_capacity 0.25" model.mod_capacity=0.5
config=$dir/topk.ini refused routing "MoD checkpoint into top-k routing" "mod.routing causal" \
  parallel.pp=1
refused hidden "MoD checkpoint into a predictor of 8 units" "mod.predictor_hidden 16 in the checkpoint but 2, 0.25, causal, 8" \
  mod.predictor_hidden=8
# a checkpoint of the dynmo before the MLP predictor: /mod in format 1
old=tests/data/ckpt/mod-format1.h5
expect_error "check-ckpt: a /mod format-1 checkpoint" "mod-format1.h5: its mixture-of-depths rows \(/mod\) are in format 1 .*reads /mod format 2 only" \
  "$DYNMO" check-ckpt "$old"
expect_error "resume from a /mod format-1 checkpoint" "mod-format1.h5: its mixture-of-depths rows \(/mod\) are in format 1" \
  "$DYNMO" train --config "$dir/mod.ini" parallel.dp=1 model.layers=2 model.channels=8 model.max_seq=8 \
  train.seq=8 run.out_dir="$dir/old" ckpt.dir="$dir/old-ck" ckpt.resume="$old"
# with layer freezing: the checkpoint carries /mod and freezing's /dyn state
# together; a resume on 1 rank continues with the same bits (blocks freeze
# in steps 2-4)
fr=(dyn.kind=freeze dyn.freeze_window=1 dyn.freeze_every=1 dyn.freeze_threshold=100)
run ffull "$dir/mod.ini" 2 parallel.pp=2 parallel.dp=1 ckpt.dir="$dir/fa" ckpt.every=2 "${fr[@]}"
run fpart "$dir/mod.ini" 2 parallel.pp=2 parallel.dp=1 ckpt.dir="$dir/fb" ckpt.every=2 train.steps=2 "${fr[@]}"
run fpart "$dir/mod.ini" 1 parallel.pp=1 parallel.dp=1 ckpt.dir="$dir/fb" ckpt.every=2 "${fr[@]}" && {
  h5ls "$dir/fb/ckpt-2.h5/dyn" >/dev/null 2>&1 && h5ls "$dir/fb/ckpt-2.h5/mod" >/dev/null 2>&1 ||
    fail "the MoD + freeze checkpoint lacks /mod or /dyn"
  grep -q "frozen [1-9]" "$dir/ffull.out" || fail "no block froze"
  same_mod ffull fpart "MoD with freezing: checkpoint (/mod and /dyn) at step 2 on 2 stages, resumed on 1 rank"
}
short=(model.layers=4 train.steps=2 train.warmup=1 train.eval_every=0 "data.train=$dir/data/train.bin"
       "data.val=$dir/data/val.bin")
run cfg2 configs/mod.ini 2 "${short[@]}" parallel.pp=2 && echo "ok: configs/mod.ini on 2 ranks"
run cfg4 configs/mod.ini 4 "${short[@]}" parallel.pp=4 && echo "ok: configs/mod.ini on 4 ranks"
finish
