#!/usr/bin/env bash
# Training from other tools' token files (docs/data.md): the tiny model
# trains a few steps from a Megatron dataset written by megatron-core, from
# an llm.c shard and from a list and a pattern of files, on 1 rank and on
# 2 (pp = 2), with GPT-2's vocab (uint16 ids) and Llama 3's (int32 ids
# above 65,535). The same ids as a dynmo file, a Megatron dataset and an
# llm.c shard give bit-identical losses, and so does pp = 2. Bad inputs
# exit 2 with one message naming the file and the problem, on every rank.
set -u
. "$(dirname "$0")/lib.sh"
need_dynmo
work_dir
fixtures=$PWD/tests/data/tokens
[ -f "$fixtures/gpt2_megatron.idx" ] || fixtures=$(cd "$(dirname "$0")" && pwd)/data/tokens


tiny_config "$dir/gpt2.ini" model.vocab=50257 "data.train=$fixtures/gpt2_megatron"
tiny_config "$dir/llama3.ini" model.vocab=128256 "data.train=$fixtures/llama3_megatron"

# GPT-2's vocab, uint16 ids: three formats of the same ids, one rank and two
train dynmo1 1 "$dir/gpt2.ini" "data.train=$fixtures/gpt2_dynmo.bin" && finite dynmo1 4
train megatron1 1 "$dir/gpt2.ini" && finite megatron1 4
train llmc1 1 "$dir/gpt2.ini" "data.train=$fixtures/gpt2_llmc.bin" && finite llmc1 4
same dynmo1 megatron1 "dynmo file and Megatron dataset of the same ids" /steps/loss
same dynmo1 llmc1 "dynmo file and llm.c shard of the same ids" /steps/loss
train megatron2 2 "$dir/gpt2.ini" parallel.pp=2 && finite megatron2 4
same megatron1 megatron2 "Megatron dataset on 1 rank and on pp = 2" /steps/loss
train llmc2 2 "$dir/gpt2.ini" parallel.pp=2 "data.train=$fixtures/gpt2_llmc.bin" && finite llmc2 4
same megatron1 llmc2 "Megatron dataset on 1 rank and llm.c shard on pp = 2" /steps/loss

# a list, a pattern (the same two files in byte order) and end-of-text tokens
cp "$fixtures/gpt2_llmc.bin" "$dir/shard_1.bin"
cp "$fixtures/gpt2_dynmo.bin" "$dir/shard_2.bin"
train list1 1 "$dir/gpt2.ini" "data.train=$dir/shard_1.bin,$dir/shard_2.bin" && finite list1 4
train pattern2 2 "$dir/gpt2.ini" parallel.pp=2 "data.train=$dir/shard_*.bin" && finite pattern2 4
same list1 pattern2 "a list on 1 rank and the pattern of the same files on pp = 2" /steps/loss
train eot2 2 "$dir/gpt2.ini" parallel.pp=2 "data.train=$fixtures/gpt2_megatron,$dir/shard_1.bin" \
  data.eot=50256 && finite eot2 4

# Llama 3's vocab: int32 (Megatron) and uint32 (llm.c) ids above 65,535
train llama1 1 "$dir/llama3.ini" && finite llama1 4
train llama2 2 "$dir/llama3.ini" parallel.pp=2 "data.train=$fixtures/llama3_llmc.bin" && finite llama2 4
same llama1 llama2 "int32 Megatron ids on 1 rank and uint32 llm.c ids on pp = 2" /steps/loss

# bad inputs: exit 2, one message naming the file and the problem, on 1
# rank and on 2 (both ranks see it; neither waits for the other)
cp "$fixtures/gpt2_megatron.idx" "$dir/cut.idx"
head -c 2000 "$fixtures/gpt2_megatron.bin" > "$dir/cut.bin"
for ranks in 1 2; do
  pp=parallel.pp=$ranks
  train_refused "token above model.vocab ($ranks)" \
    "Megatron data $fixtures/gpt2_megatron.bin: token 50256 at byte 0 \(position 0\) is not below model.vocab 1000" \
    $ranks "$dir/gpt2.ini" $pp model.vocab=1000
  train_refused "int32 ids the vocab cannot hold ($ranks)" \
    "Megatron data $fixtures/llama3_megatron.bin: token 128255 .* is not below model.vocab 65536" \
    $ranks "$dir/llama3.ini" $pp model.vocab=65536
  train_refused "data shorter than its index ($ranks)" \
    "Megatron data $dir/cut.bin is 2000 bytes, but its index $dir/cut.idx says 2350" \
    $ranks "$dir/gpt2.ini" $pp "data.train=$dir/cut"
  train_refused "a pattern that matches nothing ($ranks)" \
    "token file pattern $dir/none_\*.bin matches no file" \
    $ranks "$dir/gpt2.ini" $pp "data.train=$dir/none_*.bin"
  train_refused "an empty list element ($ranks)" "has an empty element \(element 2\)" \
    $ranks "$dir/gpt2.ini" $pp "data.train=$dir/shard_1.bin,,$dir/shard_2.bin"
  train_refused "a Megatron .bin named for its prefix ($ranks)" \
    "name the prefix $fixtures/gpt2_megatron" \
    $ranks "$dir/gpt2.ini" $pp "data.train=$fixtures/gpt2_megatron.bin"
done
train_refused "data.eot not below model.vocab" "data.eot = 50257 is not below model.vocab = 50257" \
  1 "$dir/gpt2.ini" data.eot=50257
[ ! -e "$dir/bad/runlog.h5" ] || fail "a refused start left a run log behind"
finish
