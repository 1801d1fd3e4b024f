#!/usr/bin/env bash
# Regenerates the checkpoint fixtures in this directory (tests/data/ckpt/):
# small files that tests/t_checkpoint.sh feeds to `dynmo check-ckpt`, to
# the loader and to resume=auto. Each is the tiny model below (2 layers of
# 8 channels, vocab 16, max_seq 8: about 60 kB a file), written by a real
# 2-rank save and then damaged in one precise way:
#
#   good.h5             a valid checkpoint (step 10, 2 stages x 1 replica)
#   other-model.h5      valid, but 12 channels: loading it into the tiny
#                       model is a model mismatch naming model.channels
#   flipped.h5          one bit flipped inside the chunk of /blocks/params
#                       row 1: a Fletcher32 checksum mismatch on read
#   truncated.h5        good.h5 cut to half its size
#   schema-v99.h5       root attribute schema_version = 99
#   no-complete.h5      root attribute complete removed (a writer that died
#                       before finishing)
#   missing-dataset.h5  /blocks/adam_v deleted
#   corrupt-step20.h5   a valid step-20 checkpoint of the same model whose
#                       /blocks/adam_m row 0 has a flipped bit
#
# and values no run can have written (each one field of good.h5 changed,
# its checksums intact), which check-ckpt and the loader must refuse:
#
#   step-1e12.h5        step, optimizer_steps and lr_schedule_step 10^12
#                       (train.steps is an int)
#   steps-disagree.h5   optimizer_steps 9 at step 10 (dynmo writes all
#                       three equal)
#   cursor-2e62.h5      /data/cursor[0] = 2^62, beyond step x train.batch +
#                       train.batch = 10 x 64 + 64
#   cursor-negative.h5  /data/cursor[0] = -1
#   heads-2e32.h5       /model heads = 2^32 + 2 (an int would read 2)
#   no-batch.h5         a config text without its train.batch line
#
# Two fixtures are not made here, because this dynmo can no longer write them
# (and this script never removes them):
#
#   schema-v2-moe.h5    a checkpoint of schema version 2, what dynmo wrote
#                       for a model with mixture-of-experts blocks before
#                       version 3 (an MoE block's shared tensors zero-padded
#                       to a dense block's /blocks row): the tiny model
#                       with block 1 an MoE block of 2 experts (moe_every
#                       2, top-2, hidden 8), generation 0's values and MoE
#                       state, step 10, written by 2 stages. Made with the
#                       library of commit ea125ee (the last to write version
#                       2) and this tree's tests/test_checkpoint.c (its MoE
#                       options): mpiexec -n 2 build/tests/test_checkpoint
#                       --save DIR --step 10 --layers 2 --channels 8 --heads
#                       2 --vocab 16 --max-seq 8 --moe-every 2 --experts 2
#                       --top-k 2 --expert-hidden 8. It must still load,
#                       every value as written (tests/t_checkpoint.sh).
#
#   mod-format1.h5      a causal mixture-of-depths checkpoint (vocab 256, 2
#                       layers of 8 channels, block 1 a MoD block, step 2)
#                       written by the dynmo before the MLP predictor: /mod
#                       in format 1 (no attribute format; a linear predictor
#                       pred_w (C) after the router), which this dynmo
#                       refuses, naming the format (tests/t_mod.sh)
#
# tests/t_checkpoint.sh assembles checkpoint directories from these (a
# latest naming a missing file, a latest naming corrupt-step20.h5 beside a
# good ckpt-10.h5, a lone ckpt-10.h5.tmp) so that no file is committed twice.
#
# Usage: tests/data/ckpt/make.sh   (from the repository root, after `make`;
# BUILD names the build directory, default build). Needs mpiexec and
# /usr/bin/python3 with h5py. Run it again whenever the schema changes
# (a new schema version gets new fixtures; keep the old good.h5 as
# schema-v1-good.h5 so that the refusal of old files stays tested).
set -eu
cd "$(dirname "$0")/../../.."
BUILD=${BUILD:-build}
bin="$BUILD/tests/test_checkpoint"
out=tests/data/ckpt
[ -x "$bin" ] || { echo "make.sh: build $bin first (make BUILD=$BUILD)" >&2; exit 1; }
work=$(mktemp -d /tmp/dynmo-ckpt-fixtures.XXXXXX)
trap 'rm -rf "$work"' EXIT
tiny=(--layers 2 --channels 8 --heads 2 --vocab 16 --max-seq 8)
mpiexec -n 2 "$bin" --save "$work/a" --step 10 "${tiny[@]}" >/dev/null
mpiexec -n 2 "$bin" --save "$work/b" --step 10 --layers 2 --channels 12 --heads 2 \
  --vocab 16 --max-seq 8 >/dev/null
mpiexec -n 2 "$bin" --save "$work/c" --step 20 --fill 1 "${tiny[@]}" >/dev/null

made=(good other-model corrupt-step20 flipped truncated schema-v99 no-complete
      missing-dataset step-1e12 steps-disagree cursor-2e62 cursor-negative heads-2e32 no-batch)
for f in "${made[@]}"; do rm -f "$out/$f.h5"; done
cp "$work/a/ckpt-10.h5" "$out/good.h5"
cp "$work/b/ckpt-10.h5" "$out/other-model.h5"
cp "$work/c/ckpt-20.h5" "$out/corrupt-step20.h5"
for f in flipped truncated schema-v99 no-complete missing-dataset \
         step-1e12 steps-disagree cursor-2e62 cursor-negative heads-2e32 no-batch; do
  cp "$out/good.h5" "$out/$f.h5"
done
size=$(stat -c %s "$out/good.h5")
truncate -s $((size / 2)) "$out/truncated.h5"
/usr/bin/python3 - "$out" <<'PY'
import sys, h5py
out = sys.argv[1]

def flip(path, dataset, row):
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info_by_coord((row, 0))
    with open(path, "r+b") as raw:
        at = info.byte_offset + info.size // 2
        raw.seek(at)
        byte = raw.read(1)[0]
        raw.seek(at)
        raw.write(bytes([byte ^ 0x10]))

flip(f"{out}/flipped.h5", "/blocks/params", 1)
flip(f"{out}/corrupt-step20.h5", "/blocks/adam_m", 0)
with h5py.File(f"{out}/schema-v99.h5", "r+") as f:
    f.attrs.modify("schema_version", 99)
with h5py.File(f"{out}/no-complete.h5", "r+") as f:
    del f.attrs["complete"]
with h5py.File(f"{out}/missing-dataset.h5", "r+") as f:
    del f["/blocks/adam_v"]
with h5py.File(f"{out}/step-1e12.h5", "r+") as f:
    for name in ("step", "optimizer_steps", "lr_schedule_step"):
        f["training"].attrs.modify(name, 10**12)
with h5py.File(f"{out}/steps-disagree.h5", "r+") as f:
    f["training"].attrs.modify("optimizer_steps", 9)
with h5py.File(f"{out}/cursor-2e62.h5", "r+") as f:
    f["data/cursor"][0] = 2**62
with h5py.File(f"{out}/cursor-negative.h5", "r+") as f:
    f["data/cursor"][0] = -1
with h5py.File(f"{out}/heads-2e32.h5", "r+") as f:
    f["model"].attrs.modify("heads", 2**32 + 2)
with h5py.File(f"{out}/no-batch.h5", "r+") as f:
    config = f.attrs["config"]
    config = config.decode() if isinstance(config, bytes) else config
    kept = [line for line in config.split("\n") if not line.startswith("train.batch")]
    f.attrs.modify("config", "\n".join(kept))
PY
du -sh "$out"
