#!/usr/bin/env bash
# GPT-2 weights in and out (docs/weights.md), against files and numbers
# transformers made (tests/data/hf, its make_fixtures.py): import-hf of a
# random GPT-2 saved by transformers; eval of it within 1e-4 (relative)
# of transformers' loss on the same windows; export-hf gives back the
# tensors transformers wrote bit for bit, under the same names, shapes and
# dtypes, and a re-import exports the same bytes; F16 and BF16 files are
# converted to float32 exactly; training resumed from
# the imported checkpoint gives finite losses, the same bits on 1 rank and
# under pp = 2, and a config of another model is refused. eval through the
# pipeline: trained dense, MoE, MoD and hash-attention checkpoints give
# the validation loss their runs logged, and the same window losses on 1
# rank, on 2 and 3 stages, on 2 stages x 2 replicas and under another
# layout (the schemes' models on 2 stages, and 2 x 2). Every bad input
# exits 2 with one message and leaves nothing behind.
set -u
. "$(dirname "$0")/lib.sh"
need_dynmo
work_dir

# ---- import, and eval against transformers' losses ----
out=$("$DYNMO" import-hf "$hf/gpt2-tiny" --out "$dir/tiny.h5") || fail "import-hf exited $?"
grep -q "^channels = 32$" <<<"$out" && grep -q "^seed = 1337$" <<<"$out" \
  || fail "import-hf does not print the model keys: $out"
"$DYNMO" check-ckpt "$dir/tiny.h5" >/dev/null || fail "check-ckpt refuses the imported checkpoint"
while read -r _ T _ windows _ tokens _ want; do
  got=$("$DYNMO" eval --checkpoint "$dir/tiny.h5" --data "$hf/tokens.bin" --seq "$T") \
    || { fail "eval --seq $T exited $?"; continue; }
  loss=$(sed -n 's/^loss: //p' <<<"$got")
  grep -q "^tokens: $tokens predicted in $windows windows" <<<"$got" \
    || fail "eval --seq $T: not $tokens tokens in $windows windows: $got"
  awk -v a="$loss" -v b="$want" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d;
        printf "  seq '"$T"': dynmo %s, transformers %s, relative difference %.1e\n", a, b, d;
        exit !(d <= 1e-4) }' || fail "eval --seq $T: loss $loss, transformers' $want"
  # on 2 and 3 ranks (shares of the windows, 3 uneven): the same loss line
  for ranks in 2 3; do
    more=$(timeout -k 10 120 mpiexec -n $ranks "$DYNMO" eval --checkpoint "$dir/tiny.h5" \
      --data "$hf/tokens.bin" --seq "$T" < /dev/null) || { fail "eval on $ranks ranks exited $?"; continue; }
    [ "$(grep '^loss:' <<<"$more")" = "$(grep '^loss:' <<<"$got")" ] \
      && grep -q "^tokens: $tokens predicted in $windows windows.*, $ranks ranks x" <<<"$more" \
      && echo "ok: eval --seq $T on $ranks ranks: $(grep '^loss:' <<<"$more"), as on one" \
      || fail "eval --seq $T on $ranks ranks: $more; one rank: $got"
  done
done < "$hf/losses.txt"

# ---- export: transformers' tensors back, bit for bit ----
"$DYNMO" export-hf "$dir/tiny.h5" --out "$dir/export" >/dev/null || fail "export-hf exited $?"
/usr/bin/python3 - "$hf/gpt2-tiny/model.safetensors" "$dir/export/model.safetensors" <<'EOF' \
  || fail "the exported safetensors differ from transformers'"
import json, struct, sys
def read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return header, data[8 + n:]
(theirs, tdata), (ours, odata) = read(sys.argv[1]), read(sys.argv[2])
if sorted(theirs) != sorted(ours):
    sys.exit("names differ: %s" % sorted(set(theirs) ^ set(ours)))
for name, t in theirs.items():
    o = ours[name]
    if (t["dtype"], t["shape"]) != (o["dtype"], o["shape"]):
        sys.exit("%s: %s %s here, %s %s by transformers" % (name, o["dtype"], o["shape"],
                                                             t["dtype"], t["shape"]))
    if tdata[slice(*t["data_offsets"])] != odata[slice(*o["data_offsets"])]:
        sys.exit("%s: other bytes" % name)
print("ok: export: %d tensors, transformers' names, shapes, dtypes and bytes" % len(theirs))
EOF
"$DYNMO" import-hf "$dir/export" --out "$dir/again.h5" >/dev/null || fail "re-import exited $?"
"$DYNMO" export-hf "$dir/again.h5" --out "$dir/export2" >/dev/null || fail "re-export exited $?"
cmp -s "$dir/export/model.safetensors" "$dir/export2/model.safetensors" \
  && echo "ok: import(export(import)) exports the same bytes" || fail "a re-import differs"
"$DYNMO" export-hf "$dir/again.h5" --out "$dir/export" >/dev/null \
  || fail "export-hf does not replace its own earlier export"

# ---- F16 and BF16 files: converted exactly ----
# The fixture's tensors rounded to half (Python's struct 'e', to nearest
# even) and cut to bfloat16: each export must hold exactly the float32
# values of those 16-bit ones.
/usr/bin/python3 - "$hf/gpt2-tiny" "$dir" <<'EOF'
import json, os, shutil, struct, sys
src, out = sys.argv[1], sys.argv[2]
data = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header, body = json.loads(data[8:8 + n]), data[8 + n:]
for kind in ("F16", "BF16"):
    os.makedirs(os.path.join(out, kind), exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(out, kind))
    new, chunks, offset = {"__metadata__": header["__metadata__"]}, [], 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        raw = body[t["data_offsets"][0]:t["data_offsets"][1]]
        floats = struct.unpack("<%df" % (len(raw) // 4), raw)
        if kind == "F16":
            half = struct.pack("<%de" % len(floats), *floats)
        else:
            half = b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
        chunks.append(half)
        new[name] = {"dtype": kind, "shape": t["shape"], "data_offsets": [offset, offset + len(half)]}
        offset += len(half)
    text = json.dumps(new).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, kind, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
EOF
for kind in F16 BF16; do
  "$DYNMO" import-hf "$dir/$kind" --out "$dir/$kind.h5" >/dev/null || { fail "import-hf of $kind exited $?"; continue; }
  "$DYNMO" export-hf "$dir/$kind.h5" --out "$dir/$kind-export" >/dev/null || { fail "export-hf of $kind exited $?"; continue; }
  /usr/bin/python3 - "$dir/$kind/model.safetensors" "$dir/$kind-export/model.safetensors" "$kind" <<'EOF' \
    || fail "$kind: not converted exactly"
import json, struct, sys
def read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n]); header.pop("__metadata__")
    return header, data[8 + n:]
(h16, d16), (h32, d32), kind = read(sys.argv[1]), read(sys.argv[2]), sys.argv[3]
for name, t in h16.items():
    raw = d16[slice(*t["data_offsets"])]
    if kind == "F16":
        want = struct.pack("<%df" % (len(raw) // 2), *struct.unpack("<%de" % (len(raw) // 2), raw))
    else:
        want = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
    if d32[slice(*h32[name]["data_offsets"])] != want:
        sys.exit("%s: %s differs" % (kind, name))
print("ok: %s: %d tensors converted to float32 exactly" % (kind, len(h16)))
EOF
done

# ---- training from the imported checkpoint ----
tiny_config "$dir/tiny.ini" model.layers=2 model.channels=32 model.heads=4 model.vocab=96 \
  model.max_seq=32 train.seq=16 train.batch=4 train.micro_batches=2 train.steps=3 \
  "data.train=$hf/tokens.bin" "data.val=$hf/tokens.bin" "ckpt.resume=$dir/tiny.h5"
train resumed1 1 "$dir/tiny.ini" "ckpt.dir=$dir/ckpt1" && finite resumed1 3
grep -q "resumed from $dir/tiny.h5 at step 0" "$dir/resumed1.out" || fail "resumed1 did not resume"
train resumed2 2 "$dir/tiny.ini" parallel.pp=2 "ckpt.dir=$dir/ckpt2" && finite resumed2 3
same resumed1 resumed2 "imported GPT-2 trained on 1 rank and on pp = 2" /steps/loss
train_refused other-model "written for a different model: model.channels is 32 in the checkpoint" \
  1 "$dir/tiny.ini" model.channels=16 model.heads=2 "ckpt.dir=$dir/ckpt3"

# ---- eval under pipeline layouts, and of MoE, MoD and hash-attention models ----
# A validation file of exactly 32 windows of 32 + 1 tokens (an llm.c
# shard), and runs whose validation pass (4 batches of 8, one window a
# micro-batch) reads each of them once: eval of the final checkpoint must
# give the validation loss the run logged (the same forward, summed in
# another order: within 1e-6 relative), and each window's loss the same
# bits on 1 rank, on 2 and 3 ranks as stages, on 2 stages x 2 replicas
# and under another layout.
/usr/bin/python3 - "$dir/val32.bin" <<'EOF'
import struct, sys
raw = open("/usr/share/common-licenses/GPL-3", "rb").read()[5000:5000 + 32 * 32 + 1]
header = [0] * 256
header[0], header[1], header[2] = 20240520, 1, len(raw)
open(sys.argv[1], "wb").write(struct.pack("<256i", *header) + struct.pack("<%dH" % len(raw), *raw))
EOF
eval_windows() {   # eval_windows NAME CKPT RANKS [ARGS...]: $dir/NAME.windows, its output in $dir/NAME.eval
  timeout -k 10 120 mpiexec -n "$3" "$DYNMO" eval --checkpoint "$2" --data "$dir/val32.bin" \
    --window-losses "$dir/$1.windows" "${@:4}" > "$dir/$1.eval" < /dev/null \
    || { fail "eval $1 exited $?: $(cat "$dir/$1.eval")"; return 1; }
}
validation=(train.micro_batches=8 train.eval_every=4 train.eval_batches=4 "data.val=$dir/val32.bin")
for kind in dense moe mod hash; do
  case $kind in
    dense) extra=() ;;
    moe) extra=(model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=64
                moe.capacity_factor=1.25 moe.drop=probs) ;;
    mod) extra=(model.mod_every=2 model.mod_capacity=0.25 mod.routing=causal
                mod.predictor_hidden=16) ;;
    hash) extra=(model.attention=hash hash.buckets=4) ;;
  esac
  tiny_config "$dir/$kind.ini" "${validation[@]}" "${extra[@]}"
  train "val-$kind" 2 "$dir/$kind.ini" parallel.pp=2 "ckpt.dir=$dir/ck-$kind" || continue
  bits "val-$kind" /eval/loss || continue
  ckpt4=$dir/ck-$kind/ckpt-4.h5
  eval_windows "$kind-1" "$ckpt4" 1 || continue
  /usr/bin/python3 - "$dir/val-$kind.eval.loss" "$dir/$kind-1.windows" "$kind" <<'EOF' \
    || fail "$kind: eval differs from the validation loss the run logged"
import struct, sys
data = open(sys.argv[1], "rb").read()
logged = struct.unpack("<%df" % (len(data) // 4), data)[-1]
windows = [float(x) for x in open(sys.argv[2])]
mine = sum(windows) / len(windows)
d = abs(mine - logged) / logged
print("  %s: eval %.9f, the run's validation %.9f, relative difference %.1e"
      % (sys.argv[3], mine, logged, d))
sys.exit(not (len(windows) == 32 and d <= 1e-6))
EOF
  for grid in "2 --pp 2" "3 --pp 3" "4 --pp 2" "2 --pp 2 --layout explicit:5,1"; do
    [ $kind = dense ] || [ "$grid" = "2 --pp 2" ] || [ "$grid" = "4 --pp 2" ] || continue
    name="$kind-${grid// /}"
    # shellcheck disable=SC2086
    eval_windows "$name" "$ckpt4" $grid || continue
    cmp -s "$dir/$kind-1.windows" "$dir/$name.windows" \
      && [ "$(grep '^loss:' "$dir/$name.eval")" = "$(grep '^loss:' "$dir/$kind-1.eval")" ] \
      && echo "ok: eval $kind on $grid: $(grep '^pipeline:' "$dir/$name.eval"): the same bits" \
      || fail "eval $kind on $grid: other window losses than on one rank"
  done
done
grep -q "^pipeline: 2 stages (blocks 3,3) x 2 replicas" "$dir/dense-4--pp2.eval" \
  || fail "eval on 4 ranks with --pp 2 is not 2 stages x 2 replicas"
grep -q "^pipeline: 2 stages (blocks 5,1)" "$dir/dense-2--pp2--layoutexplicit:5,1.eval" \
  || fail "eval --layout explicit:5,1 is not that layout"
# the checkpoint's parallel.pp (2) is the default when it divides the ranks
eval_windows default-pp "$dir/ck-dense/ckpt-4.h5" 2 \
  && grep -q "^pipeline: 2 stages (blocks 3,3) x 1 replica," "$dir/default-pp.eval" \
  || fail "eval on 2 ranks of a pp = 2 checkpoint: not its 2 stages"
expect_error "eval: --pp not dividing the ranks" '--pp 2 does not divide the 3 ranks' \
  mpiexec -n 3 "$DYNMO" eval --checkpoint "$dir/ck-dense/ckpt-4.h5" --data "$dir/val32.bin" --pp 2
expect_error "eval: --window-losses in no directory" 'cannot create .*/none/w.txt.tmp' \
  mpiexec -n 2 "$DYNMO" eval --checkpoint "$dir/ck-dense/ckpt-4.h5" --data "$dir/val32.bin" \
  --window-losses "$dir/none/w.txt"
expect_error "eval: --pp beyond the blocks" '--pp 7 exceeds the model.s 6 blocks' \
  "$DYNMO" eval --checkpoint "$dir/ck-dense/ckpt-4.h5" --data "$dir/val32.bin" --pp 7

# ---- bad input: exit 2, one message, nothing left behind ----
bad_model() {   # bad_model NAME: a copy of the fixture to spoil
  mkdir -p "$dir/$1" && cp "$hf/gpt2-tiny/config.json" "$hf/gpt2-tiny/model.safetensors" "$dir/$1/"
}
refused_config() {   # refused_config NAME REGEX SED-SCRIPT: config.json changed by SED-SCRIPT
  bad_model "$1" && sed -i "$3" "$dir/$1/config.json"
  expect_error "import-hf: $1" "$2" "$DYNMO" import-hf "$dir/$1" --out "$dir/$1.h5"
  [ ! -e "$dir/$1.h5" ] || fail "$1: $dir/$1.h5 written"
}
refused_config relu 'activation_function = "relu"' 's/"gelu_new"/"relu"/'
refused_config n_inner 'n_inner = 64' 's/"n_inner": null/"n_inner": 64/'
refused_config epsilon 'layer_norm_epsilon = 1e-06' 's/1e-05/1e-06/'
refused_config untied 'tie_word_embeddings = false' 's/"n_head"/"tie_word_embeddings": false, "n_head"/'
refused_config layer_idx 'scale_attn_by_inverse_layer_idx = true' 's/"scale_attn_by_inverse_layer_idx": false/"scale_attn_by_inverse_layer_idx": true/'
refused_config upcast 'reorder_and_upcast_attn = true' 's/"reorder_and_upcast_attn": false/"reorder_and_upcast_attn": true/'
refused_config model_type 'model_type = "llama"' 's/"gpt2"/"llama"/'
refused_config no_vocab 'has no vocab_size' '/"vocab_size"/d; s/"use_cache": true,/"use_cache": true/'
refused_config heads 'n_head = 5 does not divide' 's/"n_head": 4/"n_head": 5/'
refused_config layers3 'no tensor h\.2\.ln_1\.weight' 's/"n_layer": 2/"n_layer": 3/'
refused_config wider 'wte.weight has shape [(]96, 32[)], but config.json makes it [(]96, 64[)]' 's/"n_embd": 32/"n_embd": 64/'
refused_config not_json 'config.json is not JSON' 's/{/[[/'
bad_model truncated && truncate -s 50000 "$dir/truncated/model.safetensors"
expect_error "import-hf: truncated" 'outside the .* bytes of data' \
  "$DYNMO" import-hf "$dir/truncated" --out "$dir/truncated.h5"
bad_model header && printf '\xff\xff\xff\xff' | dd of="$dir/header/model.safetensors" conv=notrunc status=none
expect_error "import-hf: header length" 'header length field' \
  "$DYNMO" import-hf "$dir/header" --out "$dir/header.h5"
mkdir -p "$dir/empty"
expect_error "import-hf: no config" 'cannot read .*config.json' \
  "$DYNMO" import-hf "$dir/empty" --out "$dir/empty.h5"
expect_error "import-hf: --out exists" 'exists; dynmo never replaces' \
  "$DYNMO" import-hf "$hf/gpt2-tiny" --out "$dir/tiny.h5"
expect_error "import-hf: --out .tmp" 'ends in .tmp' \
  "$DYNMO" import-hf "$hf/gpt2-tiny" --out "$dir/x.h5.tmp"
expect_error "import-hf: two ranks" 'runs on one rank' \
  mpiexec -n 2 "$DYNMO" import-hf "$hf/gpt2-tiny" --out "$dir/two.h5"
[ ! -e "$dir/two.h5" ] || fail "import-hf on two ranks wrote $dir/two.h5"
mkdir -p "$dir/mine" && echo notes > "$dir/mine/notes.txt"
expect_error "export-hf: a user's directory" 'notes.txt' \
  "$DYNMO" export-hf "$dir/tiny.h5" --out "$dir/mine"
[ "$(ls "$dir/mine")" = notes.txt ] || fail "export-hf touched $dir/mine"
expect_error "export-hf: MoE" 'cannot be a GPT-2: its blocks are not all dense GPT-2 blocks \(mixture of experts: every 2 blocks' \
  "$DYNMO" export-hf "$PWD/tests/data/ckpt/schema-v2-moe.h5" --out "$dir/moe"
cp "$dir/tiny.h5" "$dir/cut.h5" && truncate -s 200000 "$dir/cut.h5"
expect_error "export-hf: truncated checkpoint" 'cut.h5: .*truncated' \
  "$DYNMO" export-hf "$dir/cut.h5" --out "$dir/cut"
[ ! -e "$dir/cut" ] || fail "export-hf of a truncated checkpoint wrote $dir/cut"
expect_error "eval: --seq beyond max_seq" 'beyond the model.s 32 positions' \
  "$DYNMO" eval --checkpoint "$dir/tiny.h5" --data "$hf/tokens.bin" --seq 33
expect_error "eval: tokens beyond vocab" 'not below|beyond|vocab' \
  "$DYNMO" eval --checkpoint "$dir/tiny.h5" --data "$dir/data/train.bin"
expect_error "eval: no checkpoint" 'no-such.h5' \
  "$DYNMO" eval --checkpoint "$dir/no-such.h5" --data "$hf/tokens.bin"
left=$(ls -A "$dir" | grep '^\.dynmo-\|\.tmp$')
[ -z "$left" ] || fail "left behind: $left"
finish
