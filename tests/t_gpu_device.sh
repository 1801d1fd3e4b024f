#!/usr/bin/env bash
# train.device: cpu, cuda or emulate; cuda loads the CUDA plugin (docs/gpu.md).
# Without a plugin, with something that is not one, with one built for
# another table, or with one that finds no GPU: exit status 2 and one
# message naming the problem, on one rank and on two (no rank hangs), and
# nothing written. Fake plugins are built here with gcc: no CUDA needed.
# The ranks of a node spread over its devices (on the emulated device).
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/run.ini" "run.out_dir=$dir/out" train.steps=1 > "$dir/run.ini"

expect_error "unknown device" "train.device = 'gpu' must be cpu, cuda or emulate" \
  "$DYNMO" train --config "$dir/run.ini" train.device=gpu
expect_error "no plugin at DYNMO_CUDA_PLUGIN" \
  "train.device = cuda: cannot load the CUDA plugin $dir/none.so .*make USE_CUDA=1" \
  env DYNMO_CUDA_PLUGIN="$dir/none.so" "$DYNMO" train --config "$dir/run.ini" train.device=cuda
[ -e "$dir/out" ] && fail "run.out_dir created although the device was refused"

# The plugin is looked for beside the binary when DYNMO_CUDA_PLUGIN is unset.
mkdir -p "$dir/bin" && cp "$DYNMO" "$dir/bin/dynmo"
expect_error "no plugin beside the binary" \
  "cannot load the CUDA plugin $dir/bin/libdynmo_cuda.so" \
  env -u DYNMO_CUDA_PLUGIN "$dir/bin/dynmo" train --config "$dir/run.ini" train.device=cuda

# Fake plugins: no entry symbol; an entry built for another table; one
# that reports no device.
fake() {
  local name=$1 body=$2
  printf '#include <stdio.h>\n#include "dynmo/backend.h"\n%s\n' "$body" > "$dir/$name.c"
  gcc -shared -fPIC -I"$(dirname "$0")/../include" -o "$dir/$name.so" "$dir/$name.c" ||
    fail "building the fake plugin $name"
}
fake nosymbol 'int something_else(void) { return 0; }'
fake oldabi 'int dynmo_cuda_backend_open(struct dm_backend *t, const struct dm_backend_host *h,
  char *err, size_t n) { (void)h; (void)err; (void)n; t->abi = 999; return 0; }'
fake nodevice 'int dynmo_cuda_backend_open(struct dm_backend *t, const struct dm_backend_host *h,
  char *err, size_t n) { (void)t; (void)h; snprintf(err, n, "no CUDA device (fake)"); return -1; }'
expect_error "not a plugin" "$dir/nosymbol.so is not a dynmo CUDA plugin \(no symbol dynmo_cuda_backend_open\)" \
  env DYNMO_CUDA_PLUGIN="$dir/nosymbol.so" "$DYNMO" train --config "$dir/run.ini" train.device=cuda
expect_error "another table" "$dir/oldabi.so: it was built for backend table 999, this dynmo has [0-9]+: rebuild it" \
  env DYNMO_CUDA_PLUGIN="$dir/oldabi.so" "$DYNMO" train --config "$dir/run.ini" train.device=cuda
expect_error "no device" "train.device = cuda: $dir/nodevice.so: no CUDA device \(fake\)" \
  env DYNMO_CUDA_PLUGIN="$dir/nodevice.so" "$DYNMO" train --config "$dir/run.ini" train.device=cuda
expect_error "bench refuses it too" "no CUDA device \(fake\)" \
  env DYNMO_CUDA_PLUGIN="$dir/nodevice.so" "$DYNMO" bench --config "$dir/run.ini" train.device=cuda

# Two ranks: one message, both exit 2, within the time limit.
out=$(DYNMO_CUDA_PLUGIN="$dir/nodevice.so" timeout -k 10 60 mpiexec -n 2 "$DYNMO" train \
      --config "$dir/run.ini" train.device=cuda 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || fail "two ranks: exit $rc, want 2 ($out)"
[ "$(grep -c 'no CUDA device (fake)' <<<"$out")" = 1 ] || fail "two ranks: not one message: $out"
[ -e "$dir/out" ] && fail "run.out_dir created although the device was refused"

# The op checker of make check-gpu, on the CPU table against itself.
"$BUILD/gpu/check_ops" cpu > "$dir/ops.log" 2>&1 || fail "check_ops cpu: $(tail -n 3 "$dir/ops.log")"
grep -q "check_ops: 0 of [1-9][0-9]* checks failed" "$dir/ops.log" || fail "check_ops cpu: $(tail -n 1 "$dir/ops.log")"

# train.device = cpu is the default and trains, and names no device.
out=$("$DYNMO" train --config "$dir/run.ini" train.device=cpu 2>&1) || fail "train.device=cpu"
grep -q '^device:' <<<"$out" && fail "a cpu run names a device: $(grep '^device:' <<<"$out")"

# Each rank of a node takes its own device while there are enough, as the
# CUDA plugin does (backend_device_for): 3 ranks on an emulated node of 2
# devices take 0, 1, 0 (the emulator names each process's device at exit
# with DYNMO_EMULATE_ALLOC_COUNTS=1), and rank 0 names its own at start-up.
rm -rf "$dir/out"
DYNMO_EMULATE_DEVICES=2 DYNMO_EMULATE_ALLOC_COUNTS=1 timeout -k 10 60 mpiexec -n 3 "$DYNMO" train \
  --config "$dir/run.ini" train.device=emulate parallel.pp=3 > "$dir/place.out" 2>&1 \
  || fail "3 ranks on 2 emulated devices: exit $?: $(tail -n 3 "$dir/place.out")"
placed=$(sed -n 's/^emulate: device \([0-9]*\) of 2, local rank \([0-9]*\) of 3$/\2:\1/p' "$dir/place.out" \
  | sort | tr '\n' ' ')
[ "$placed" = "0:0 1:1 2:0 " ] && echo "ok: 3 ranks on 2 devices take (local rank:device) $placed" \
  || fail "3 ranks on 2 devices: (local rank:device) '$placed', want '0:0 1:1 2:0 '"
grep -q '^device: emulated device 0 of 2 .*(rank 0; 3 ranks on its node)$' "$dir/place.out" \
  && echo "ok: $(grep -m 1 '^device:' "$dir/place.out")" || fail "no device line: $(head -n 3 "$dir/place.out")"
expect_error "DYNMO_EMULATE_DEVICES=0" "DYNMO_EMULATE_DEVICES=0: want a device count in 1..64" \
  env DYNMO_EMULATE_DEVICES=0 "$DYNMO" train --config "$dir/run.ini" train.device=emulate
finish
