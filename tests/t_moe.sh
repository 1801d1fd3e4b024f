#!/usr/bin/env bash
# Mixture of experts end to end (issue 16, part 1; docs/moe.md): a small MoE
# GPT (every other block an MoE block of 4 experts, top-2) on 2 stages x 2
# replicas, where
#   - a balanced run (balance.method=random: a new layout, and live
#     migration, every step) gives the same loss bits, expert counts and
#     biases as the static run, for the softmax router with a capacity and
#     for the sigmoid router whose bias moves every step (so the bias
#     travels with its block);
#   - one stage with the same 2 replicas gives the same bits too;
#   - a checkpoint (schema version 3) passes check-ckpt, h5py reads every
#     dataset v3.def lists, its rows hold the blocks' parameters once and
#     nothing else (no padding: the Adam second moments are > 0), a resume
#     under another layout continues with the same bits, a flipped byte in
#     an expert's row is found and named, and a dense checkpoint is refused
#     by an MoE run;
#   - top-1 routers learn from the loss (their Adam moments are not 0);
#   - dynmo inspect summarises the experts' load per MoE block;
#   - configs/moe.ini runs (shortened by overrides);
#   - bad MoE settings are exit 2 with one message.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
py=/usr/bin/python3
moe=(model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=64
     parallel.dp=2 train.micro_batches=2)
tiny_config "$dir/moe.ini" "${moe[@]}" moe.capacity_factor=1.25 moe.drop=probs
tiny_config "$dir/sigmoid.ini" "${moe[@]}" moe.router=sigmoid moe.bias_rate=0.01
tiny_config "$dir/dense.ini"
# run NAME CONFIG RANKS [overrides...]: $dir/CONFIG.ini on RANKS ranks, the
# bits of its losses, expert counts and biases; same_moe A B WHAT
# compares them
moe_bits=(/steps/loss /moe/tokens /moe/dropped /moe/bias)
run() { train "$1" "$3" "$dir/$2.ini" "${@:4}" && bits "$1" "${moe_bits[@]}"; }
same_moe() { same "$1" "$2" "$3" "${moe_bits[@]}"; }

# Static and balanced, the same pp and dp; and one stage.
run static moe 4 parallel.pp=2
run random moe 4 parallel.pp=2 balance.method=random balance.every=1 && {
  same_moe static random "random re-layout every step (softmax, capacity 1.25)"
  grep -q "migrated [0-9]* blocks" "$dir/random.out" || fail "no migration shown in the step lines"
}
run onestage moe 2 parallel.pp=1 && same_moe static onestage "1 stage x 2 replicas vs 2 x 2"
run sig-static sigmoid 4 parallel.pp=2
run sig-random sigmoid 4 parallel.pp=2 balance.method=random balance.every=1 &&
  same_moe sig-static sig-random "random re-layout every step (sigmoid router, bias moving)"
$py - "$dir" <<'PY' || fail "the run logs' /moe datasets are wrong"
import sys, h5py, numpy as np
d = sys.argv[1]
s = h5py.File(d + "/static/runlog.h5", "r")
t, dr = s["/moe/tokens"][:], s["/moe/dropped"][:]
# 3 MoE blocks (1, 3, 5) x 4 experts; each step routes batch x seq x k pairs per block
assert t.shape == (4, 12) and dr.shape == t.shape and s["/moe/aux_loss"].shape == (4, 3), t.shape
assert (t.reshape(4, 3, 4).sum(axis=2) == 8 * 32 * 2).all(), t
assert (dr >= 0).all() and (dr <= t).all() and dr.sum() > 0, dr
assert (s["/moe/bias"][:] == 0).all(), "the softmax router has no bias"
b = h5py.File(d + "/sig-static/runlog.h5", "r")["/moe/bias"][:]
assert np.abs(b[-1]).max() > 0 and np.allclose(np.abs(b) * 100, np.round(np.abs(b) * 100), atol=1e-4), b
assert (h5py.File(d + "/sig-static/runlog.h5", "r")["/moe/dropped"][:] == 0).all(), "dropless"
print("ok: /moe/tokens sum to batch x seq x k per block, drops within them; the sigmoid "
      "router's bias moved in steps of bias_rate")
PY

# Checkpoints: schema version 3, resharded on load.
run ck moe 4 parallel.pp=2 ckpt.dir="$dir/ck" ckpt.every=2 ckpt.keep=3 && {
  same_moe static ck "a run that checkpoints"
  out=$("$DYNMO" check-ckpt "$dir/ck/ckpt-2.h5" 2>&1) && grep -q "ok: schema version 3, step 2" <<<"$out" \
    && echo "ok: check-ckpt: ${out##*ok: }" || fail "check-ckpt of an MoE checkpoint: $out"
  $py - "$dir/ck/ckpt-2.h5" checkpoint_schema/v3.def <<'PY' && echo "ok: h5py reads every dataset v3.def lists, with its shape; the rows hold what the blocks compute with, no padding" || fail "v3 file and v3.def disagree"
import re, sys, h5py
f = h5py.File(sys.argv[1], "r")
assert f.attrs["schema_version"] == 3 and f["model"].attrs["moe_every"] == 2
m = {k: int(v) for k, v in f["model"].attrs.items() if not isinstance(v, (str, bytes))}
routing = {k: f["model"].attrs[k] for k in ("moe_router", "moe_capacity_factor", "moe_drop")}
assert routing == {"moe_router": "softmax", "moe_capacity_factor": "0", "moe_drop": "probs"} or \
    routing["moe_router"] in ("softmax", "sigmoid"), routing
C, E, H, L = m["channels"], m["experts"], m["expert_hidden"], m["layers"]
M = L // m["moe_every"]
shared, mlp = 4 * C * C + 8 * C, 8 * C * C + 5 * C
dims = dict(layers=L, block_params=m["block_params"], vocab=m["vocab"], max_seq=m["max_seq"],
            channels=C, pp=int(f.attrs["world_pp"]), dp=int(f.attrs["world_dp"]),
            history=f["layout/history_step"].shape[0], moe_layers=M, experts=E,
            router_params=E * C, expert_rows=M * E, expert_params=2 * H * C + H + C,
            shared_params=shared, dense_layers=L - M, mlp_params=mlp,
            placed_layers=M if "moe/state/placement" in f else 0)
n = 0
for line in open(sys.argv[2]):
    x = re.match(r'SCHEMA_DATASET\("([^"]+)", (\w+), "(\w+)", "(\w*)"\)', line)
    if not x or dims[x[3]] == 0:   # a dataset of no rows is not written
        assert not x or x[1][1:] not in f, x[1]
        continue
    shape = (dims[x[3]],) + ((dims[x[4]],) if x[4] else ())
    assert f[x[1]].shape == shape and f[x[1]].fletcher32, (x[1], f[x[1]].shape, shape)
    f[x[1]][...]
    n += 1
assert n == 34, n
# every parameter of a block is in one row, once, and nothing else is: the
# blocks' slabs (3 dense blocks of 12 C^2 + 13 C, 3 MoE blocks of the
# shared tensors, the router and E experts) are the floats of the rows
slab = (L - M) * (shared + mlp) + M * (shared + E * C + E * dims["expert_params"])
rows = sum(f[name].size for name in ("blocks/params", "mlp/params", "moe/router/params",
                                     "moe/experts/params"))
assert rows == slab, (rows, slab)
# and none of them is padding: the Adam second moments are > 0
for name in ("blocks/adam_v", "mlp/adam_v", "moe/router/adam_v", "moe/experts/adam_v"):
    v = f[name][...]
    assert (v > 0).mean() > 0.99, (name, (v == 0).sum(), v.size)
PY
  run resumed moe 4 parallel.pp=2 balance.initial=explicit:5,1 ckpt.dir="$dir/ck" \
    ckpt.resume="$dir/ck/ckpt-2.h5" && $py - "$dir" <<'PY' && echo "ok: resumed from step 2 on layout 5,1: steps 3-4 bit-identical" || fail "resume changed the losses"
import sys, h5py
d = sys.argv[1]
a = h5py.File(d + "/static/runlog.h5", "r")
b = h5py.File(d + "/resumed/runlog.h5", "r")
assert (a["/steps/loss"][2:].view("u4") == b["/steps/loss"][2:].view("u4")).all()
assert (a["/moe/tokens"][2:] == b["/moe/tokens"][2:]).all()
assert (b["/moe/tokens"][:2] == -1).all(), "filler rows"
PY
  # The routing decides what each token computes: kept in the checkpoint and
  # compared on resume like the shape (moe.router changed silently before).
  for change in moe.router=sigmoid moe.capacity_factor=0 moe.drop=slot; do
    expect_error "resume with $change" "written for a different model: its MoE routing is moe.router softmax, moe.capacity_factor 1.25, moe.drop probs in the checkpoint" \
      timeout -k 10 60 mpiexec -n 2 "$DYNMO" train --config "$dir/moe.ini" parallel.pp=2 parallel.dp=1 "$change" \
      run.out_dir="$dir/changed" ckpt.dir="$dir/changed-ck" ckpt.resume="$dir/ck/ckpt-2.h5"
  done
  cp "$dir/ck/ckpt-2.h5" "$dir/router.h5"
  $py -c 'import sys, h5py; h5py.File(sys.argv[1], "a")["model"].attrs["moe_router"] = "gumbel"' "$dir/router.h5"
  expect_error "check-ckpt of a checkpoint with an unknown router" "are not a routing this dynmo knows" \
    "$DYNMO" check-ckpt "$dir/router.h5"
  expect_error "resume of a checkpoint with an unknown router" "not a routing this dynmo knows" \
    timeout -k 10 60 "$DYNMO" train --config "$dir/moe.ini" parallel.dp=1 run.out_dir="$dir/changed" \
    ckpt.resume="$dir/router.h5"
  cp "$dir/ck/ckpt-2.h5" "$dir/flipped.h5"
  $py - "$dir/flipped.h5" <<'PY' || fail "could not flip a byte"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
offset = f["/moe/experts/params"].id.get_chunk_info_by_coord((5, 0)).byte_offset   # MoE block 1, expert 1
f.close()
with open(sys.argv[1], "r+b") as g:
    g.seek(offset + 100)
    b = g.read(1)
    g.seek(offset + 100)
    g.write(bytes([b[0] ^ 0x10]))
PY
  expect_error "check-ckpt a flipped expert" "flipped.h5: .*Fletcher32 checksum mismatch in /moe/experts/params \(row 5\)" \
    "$DYNMO" check-ckpt "$dir/flipped.h5"
  # a dense block's MLP rows missing; /mlp rows in a file whose every block
  # is an MoE block (written by test_checkpoint, moe_every 1)
  cp "$dir/ck/ckpt-2.h5" "$dir/no-mlp.h5"
  $py -c "import h5py, sys; del h5py.File(sys.argv[1], 'r+')['/mlp/adam_v']" "$dir/no-mlp.h5"
  expect_error "check-ckpt without the dense blocks' MLP moments" "no-mlp.h5: incomplete: dataset /mlp/adam_v is missing" \
    "$DYNMO" check-ckpt "$dir/no-mlp.h5"
  mpiexec -n 1 "$BUILD/tests/test_checkpoint" --save "$dir/all-moe" --step 10 --layers 2 --channels 8 \
    --heads 2 --vocab 16 --max-seq 8 --moe-every 1 --experts 2 --top-k 1 --expert-hidden 8 >/dev/null &&
  $py -c "import h5py, sys; h5py.File(sys.argv[1], 'r+').create_dataset('/mlp/params', (1, 557), 'f4', chunks=(1, 557), fletcher32=True)" \
    "$dir/all-moe/ckpt-10.h5" &&
  expect_error "check-ckpt /mlp rows where every block is an MoE block" "ckpt-10.h5: /mlp/params is in the file, but dense_layers is 0 for this model" \
    "$DYNMO" check-ckpt "$dir/all-moe/ckpt-10.h5"
}
# Top-1: the gate is the chosen expert's probability (Switch Transformer),
# so the routers learn from the loss alone: after 3 steps without the
# balancing losses or weight decay every element of every router's Adam
# second moment is > 0 (a gate renormalised over one expert is 1, and left
# all of them 0).
run top1 moe 2 parallel.pp=1 model.top_k=1 moe.aux_loss=0 moe.z_loss=0 train.weight_decay=0 \
  train.steps=3 ckpt.dir="$dir/top1-ck" ckpt.every=3 && $py - "$dir/top1-ck/ckpt-3.h5" <<'PY' \
  && echo "ok: top-1: every router's Adam second moment > 0 after 3 steps (the routers learn)" \
  || fail "top-1: a router got no gradient from the loss"
import sys, h5py
v = h5py.File(sys.argv[1], "r")["/moe/router/adam_v"][...]
assert (v > 0).all(), ((v == 0).sum(), v.size)
PY
# Layer freezing keeps a state of its own (/dyn, dyn.def) beside the MoE
# rows: the checkpoint passes check-ckpt and resumes with the
# uninterrupted run's losses.
run frz moe 2 parallel.pp=1 dyn.kind=freeze ckpt.dir="$dir/frz-ck" ckpt.every=2 ckpt.keep=2 &&
  run frz-resumed moe 2 parallel.pp=1 dyn.kind=freeze ckpt.dir="$dir/frz-ck2" \
    ckpt.resume="$dir/frz-ck/ckpt-2.h5" && {
  out=$("$DYNMO" check-ckpt "$dir/frz-ck/ckpt-2.h5" 2>&1) && grep -q "ok: schema version 3" <<<"$out" ||
    fail "check-ckpt of a frozen MoE model's checkpoint: $out"
  $py - "$dir" <<'PY' && echo "ok: layer freezing with MoE blocks: the checkpoint (with /dyn) checks and resumes, steps 3-4 bit-identical" || fail "freezing with MoE: the resumed losses differ"
import sys, h5py
d = sys.argv[1]
a = h5py.File(d + "/frz/runlog.h5", "r")["/steps/loss"][2:]
b = h5py.File(d + "/frz-resumed/runlog.h5", "r")["/steps/loss"][2:]
assert (a.view("u4") == b.view("u4")).all(), (a, b)
PY
}
timeout -k 10 60 mpiexec -n 2 "$DYNMO" train --config "$dir/dense.ini" run.out_dir="$dir/dense-ck" \
  parallel.pp=2 ckpt.dir="$dir/dense-ck" train.steps=1 train.warmup=0 > "$dir/dense-ck.out" 2>&1 ||
  fail "dense run with a checkpoint: $(tail -n 3 "$dir/dense-ck.out")"
expect_error "a dense checkpoint into an MoE run" "model.moe_every is 0 in the checkpoint but 2 in this run" \
  mpiexec -n 2 "$DYNMO" train --config "$dir/moe.ini" run.out_dir="$dir/x" parallel.pp=1 \
  ckpt.dir="$dir/dense-ck"

# inspect: the most and least loaded expert of every MoE block.
out=$("$DYNMO" inspect "$dir/static/runlog.h5") && grep -q "3 MoE blocks of 4 experts, top-2, over 4 steps" <<<"$out" &&
  [ "$(grep -cE '^ +[135] +[0-9]+ +expert [0-3] +[0-9.]+% +expert [0-3] +[0-9.]+% +[0-9.]+%$' <<<"$out")" = 3 ] &&
  echo "ok: inspect: $(grep -A4 'mixture of experts' <<<"$out" | sed -n 3p)" || fail "inspect's MoE summary: $out"
"$DYNMO" inspect --json "$dir/static/runlog.h5" | $py -c "
import json, sys
m = json.load(sys.stdin)['moe']
assert [b['layer'] for b in m['blocks']] == [1, 3, 5] and m['experts'] == 4
for b in m['blocks']:
    assert b['most_loaded']['share'] >= 0.25 >= b['least_loaded']['share'] and b['routed'] == 4 * 512
" && echo "ok: inspect --json: moe.blocks" || fail "inspect --json has no moe summary"

# configs/moe.ini itself, shortened.
timeout -k 10 300 mpiexec -n 4 "$DYNMO" train --config configs/moe.ini train.steps=3 train.warmup=1 \
  train.eval_every=3 train.eval_batches=1 run.log_every=1 data.train="$dir/data/train.bin" \
  data.val="$dir/data/val.bin" run.out_dir="$dir/config" > "$dir/config.out" 2>&1 &&
  grep -q "^step 3/3 .*val " "$dir/config.out" && echo "ok: configs/moe.ini (3 steps, 2 stages x 2 replicas)" \
  || { fail "configs/moe.ini: $(tail -n 3 "$dir/config.out")"; }

# Bad MoE settings: exit 2, one message.
# bad NAME REGEX RANKS overrides...: dense.ini so changed is refused
bad() { train_refused "$1" "$2" "$3" "$dir/dense.ini" "${@:4}"; }
bad "E < k" "model.top_k = 3 exceeds model.experts = 2" 1 model.moe_every=1 model.experts=2 model.top_k=3
bad "negative capacity" "moe.capacity_factor = -0.5 is out of range \[0, 1000\]" 1 model.moe_every=1 moe.capacity_factor=-0.5
bad "MoE keys without MoE blocks" "MoE keys are set .* but model.moe_every = 0" 1 model.experts=4
bad "[moe] without MoE blocks" "MoE keys are set .* but model.moe_every = 0" 1 moe.aux_loss=0.1
bad "ep does not divide dp" "parallel.ep = 2 does not divide parallel.dp = 1" 1 model.moe_every=1 parallel.ep=2
bad "ep does not divide E" "parallel.ep = 4 does not divide model.experts = 6" 4 model.moe_every=1 model.experts=6 parallel.dp=4 parallel.ep=4 train.micro_batches=2
bad "bias with softmax" "moe.bias_rate = 0.1 needs moe.router = sigmoid" 1 model.moe_every=1 moe.bias_rate=0.1
bad "unknown router" "moe.router = 'topk' must be softmax or sigmoid" 1 model.moe_every=1 moe.router=topk
bad "unknown drop" "moe.drop = 'random' must be probs, position or slot" 1 model.moe_every=1 moe.drop=random
bad "moe_every > layers" "model.moe_every = 7 exceeds model.layers = 6" 1 model.moe_every=7
bad "MoE with pruning" "model.moe_every = 2 with dyn.kind = prune: mixture of experts and pruning do not combine yet" 1 model.moe_every=2 dyn.kind=prune
finish
