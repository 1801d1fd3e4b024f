#!/usr/bin/env bash
# model.vocab_pad (docs/config.md, docs/weights.md): the embedding's rows
# padded to a multiple, the padded rows zero and never predicted. A
# padded and an unpadded run from the same seed give the same bits of
# every loss, validation loss and gradient norm (the padded rows are never
# read, their gradients are zero); the padded rows of the checkpoint's
# parameters and Adam moments are still exactly zero after training;
# eval gives the same window losses; a checkpoint of one padding is
# refused by a run of another; import-hf --vocab-pad pads a GPT-2 that
# evaluates as the unpadded import and exports the same bytes (the
# unpadded vocabulary); and bad values exit 2 with one message.
set -u
. "$(dirname "$0")/lib.sh"
need_dynmo
work_dir

# ---- training: the same bits with and without padding ----
# vocab 257 (the bytes and one more): 320 rows when padded to 64
tiny_config "$dir/t.ini" model.vocab=257 train.eval_every=2
train plain 2 "$dir/t.ini" parallel.pp=2 "ckpt.dir=$dir/ck-plain" && finite plain 4
train padded 2 "$dir/t.ini" parallel.pp=2 model.vocab_pad=64 "ckpt.dir=$dir/ck-padded" \
  && finite padded 4
kept=(/steps/loss /eval/loss /steps/grad_norm)
bits plain "${kept[@]}" && bits padded "${kept[@]}" \
  && same plain padded "model.vocab_pad = 64 and none" "${kept[@]}"
train padded1 1 "$dir/t.ini" model.vocab_pad=64 "ckpt.dir=$dir/ck-padded1" \
  && bits padded1 "${kept[@]}" && same padded padded1 "padded on 1 rank and on pp = 2" "${kept[@]}"

# ---- the checkpoint: 320 rows, the last 63 zero in params and both moments ----
ckpt=$dir/ck-padded/ckpt-4.h5
"$DYNMO" check-ckpt "$ckpt" >/dev/null || fail "check-ckpt refuses the padded checkpoint"
h5dump -H -d /embedding/params/wte "$ckpt" | grep -q "DATASPACE  SIMPLE { ( 320, 32 )" \
  || fail "the padded checkpoint's wte is not (320, 32): $(h5dump -H -d /embedding/params/wte "$ckpt" | grep DATASPACE)"
for part in params adam_m adam_v; do
  rows=$(h5dump -d "/embedding/$part/wte" -s 257,0 -c 63,32 -y -w 0 "$ckpt" \
    | sed -n '/DATA {/,/}/p' | tr -s ' ,' '\n' | grep -cE '^-?[0-9]')
  nonzero=$(h5dump -d "/embedding/$part/wte" -s 257,0 -c 63,32 -y -w 0 "$ckpt" \
    | sed -n '/DATA {/,/}/p' | tr -s ' ,' '\n' | grep -E '^-?[0-9]' | grep -cvE '^-?0$')
  [ "$rows" = 2016 ] && [ "$nonzero" = 0 ] \
    && echo "ok: the 63 padded rows of /embedding/$part/wte are zero after 4 steps" \
    || fail "/embedding/$part/wte: $nonzero of the $rows padded values are not zero"
done
[ "$(h5dump -d /embedding/params/wte -s 256,0 -c 1,32 -y -w 0 "$ckpt" | sed -n '/DATA {/,/}/p' \
     | tr -s ' ,' '\n' | grep -E '^-?[0-9]' | grep -cvE '^-?0$')" -gt 0 ] \
  || fail "row 256 (a used token) is zero: the check of the padded rows cannot fail"

# ---- eval: the same window losses ----
for run in plain padded; do
  "$DYNMO" eval --checkpoint "$dir/ck-$run/ckpt-4.h5" --data "$dir/data/val.bin" \
    --window-losses "$dir/$run.windows" > "$dir/$run.eval" || fail "eval of $run exited $?"
done
cmp -s "$dir/plain.windows" "$dir/padded.windows" \
  && echo "ok: eval: $(head -1 "$dir/padded.eval") padded and not, the same window losses" \
  || fail "eval: the padded model's window losses differ"

# ---- a checkpoint of another padding is refused ----
train_refused other-padding "its embedding has 320 rows .*but 257 in this run" 2 "$dir/t.ini" \
  parallel.pp=2 train.steps=6 "ckpt.dir=$dir/ck-padded"

# ---- import-hf --vocab-pad: evaluates and exports as the unpadded import ----
"$DYNMO" import-hf "$hf/gpt2-tiny" --out "$dir/tiny.h5" >/dev/null || fail "import-hf exited $?"
out=$("$DYNMO" import-hf "$hf/gpt2-tiny" --out "$dir/tiny64.h5" --vocab-pad 64) \
  || fail "import-hf --vocab-pad 64 exited $?"
grep -q "^vocab_pad = 64$" <<<"$out" || fail "import-hf --vocab-pad does not print the key: $out"
h5dump -H -d /embedding/params/wte "$dir/tiny64.h5" | grep -q "( 128, 32 )" \
  || fail "import-hf --vocab-pad 64 of vocab 96: wte is not (128, 32)"
for ckpt in tiny tiny64; do
  "$DYNMO" eval --checkpoint "$dir/$ckpt.h5" --data "$hf/tokens.bin" --seq 32 \
    --window-losses "$dir/$ckpt.windows" > "$dir/$ckpt.eval" || fail "eval of $ckpt exited $?"
  "$DYNMO" export-hf "$dir/$ckpt.h5" --out "$dir/$ckpt-hf" > /dev/null || fail "export of $ckpt exited $?"
done
want=$(awk '$2 == 32 { print $8 }' "$hf/losses.txt")
cmp -s "$dir/tiny.windows" "$dir/tiny64.windows" \
  && echo "ok: eval of the padded import: $(head -1 "$dir/tiny64.eval") (transformers: $want), as unpadded" \
  || fail "eval of the padded import differs from the unpadded one"
cmp -s "$dir/tiny-hf/model.safetensors" "$dir/tiny64-hf/model.safetensors" \
  && cmp -s "$dir/tiny-hf/config.json" "$dir/tiny64-hf/config.json" \
  && echo "ok: export-hf of the padded import: the unpadded GPT-2's bytes" \
  || fail "export-hf of the padded import differs from the unpadded export"
tiny_config "$dir/hf.ini" model.layers=2 model.channels=32 model.heads=4 model.vocab=96 \
  model.vocab_pad=64 model.max_seq=32 train.seq=16 train.batch=4 train.micro_batches=2 \
  train.steps=2 "data.train=$hf/tokens.bin" "data.val=$hf/tokens.bin" "ckpt.resume=$dir/tiny64.h5"
train hf64 2 "$dir/hf.ini" parallel.pp=2 "ckpt.dir=$dir/ck-hf64" && finite hf64 2

# ---- bad values: exit 2, one message ----
train_refused pad-zero 'model.vocab_pad = 0 is out of range' 1 "$dir/t.ini" model.vocab_pad=0
train_refused pad-word "model.vocab_pad" 1 "$dir/t.ini" model.vocab_pad=wide
train_refused pad-rows 'padded to a multiple of model.vocab_pad = 3 is 1048578 rows, more than 2\^20' \
  1 "$dir/t.ini" model.vocab=1048576 model.vocab_pad=3
expect_error "import-hf: --vocab-pad 0" "--vocab-pad '0' is not an integer from 1 to 65536" \
  "$DYNMO" import-hf "$hf/gpt2-tiny" --out "$dir/zero.h5" --vocab-pad 0
[ ! -e "$dir/zero.h5" ] || fail "import-hf --vocab-pad 0 wrote $dir/zero.h5"
finish
