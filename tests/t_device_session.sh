#!/usr/bin/env bash
# The lent-GPU bundle (docs/gpu.md, "Running on a lent GPU"), without a GPU:
# - scripts/device_bundle.sh builds the portable dynmo (in $BUILD/device)
#   and writes its archive (into a temporary dir), under 40 MiB, with the
#   repository's tracked files under the device tool's 64 MiB; it carries
#   MPICH, HDF5, OpenBLAS, cairo and json-c but none of the C library
#   family nor CUDA's; without nvcc it is built --no-cuda (says skip:);
# - unpacked, every library the bundle's programs need that is not glibc's
#   or CUDA's resolves into the bundle (ldd with the wrappers' path), and
#   a 2-rank run on train.device=emulate through the bundle's mpiexec
#   loads every such library from the bundle (LD_DEBUG=files), its proxy
#   from the bundle (UCX's cma module among them, without which MPI_Finalize
#   could hang), and trains its 4 steps;
# - scripts/device_session.sh on that archive (unpacked by python3's
#   tarfile, its fallback without xz), with a stand-in nvidia-smi
#   that finds no GPU: exit 2 within 120 s, 'no GPU' for check-gpu and
#   bench-gpu, dynmo started from the bundle, env.txt, the logs, its
#   prefix removed; with no archive: exit 3 and what to do.
set -u
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d /tmp/dynmo-t-device.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# 1. the bundle
flags=()
if [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && [ ! -x /usr/bin/nvcc ]; then
  echo "skip: no nvcc: the bundle without the CUDA plugin (--no-cuda)"
  flags=(--no-cuda)
fi
env -u SANITIZE scripts/device_bundle.sh "${flags[@]}" --build "$BUILD/device" --out "$tmp/bundle" \
  > "$tmp/bundle.log" 2>&1
rc=$?
archive=$tmp/bundle/dynmo-device.tar.xz
if [ $rc -ne 0 ] || [ ! -f "$archive" ]; then
  fail "device_bundle.sh: exit $rc: $(tail -n 3 "$tmp/bundle.log")"; finish
fi
grep '^device_bundle: archive\|^device_bundle: tracked' "$tmp/bundle.log" | sed 's/^/ok: /'
bytes=$(stat -c %s "$archive")
tracked=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f 1)
[ "$bytes" -lt $((40 * 1048576)) ] || fail "the archive is $bytes bytes, over 40 MiB"
[ $((bytes + tracked)) -lt $((64 * 1048576)) ] || fail "tracked files ($tracked) + archive ($bytes) over 64 MiB"

mkdir "$tmp/prefix"
tar -C "$tmp/prefix" -xJf "$archive" || { fail "the archive does not unpack"; finish; }
p=$tmp/prefix/dynmo-device
for lib in libmpich.so.12 libhdf5_mpich.so.103 libhdf5_mpich_hl.so.100 libopenblas.so.0 libcairo.so.2 libjson-c.so.5; do
  [ -f "$p/lib/$lib" ] || fail "the bundle does not carry $lib"
done
for f in "$p"/lib/*; do
  case $(basename "$f") in
    libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|libresolv*|ld-linux*|libgcc_s*|libstdc++*|libcuda*|libcublas*|libnccl*)
      fail "the bundle carries $(basename "$f"), which must be the target's" ;;
  esac
done
for f in bin/mpiexec bin/mpiexec.hydra bin/hydra_pmi_proxy build/dynmo build/dynmo.bin build/gpu/check_ops \
         build/gpu/check_ops.bin build/libdynmo_emulate.so share/GPL-3 MANIFEST; do
  [ -e "$p/$f" ] || fail "the bundle has no $f"
done
[ ${#flags[@]} -gt 0 ] || [ -f "$p/build/libdynmo_cuda.so" ] || fail "the bundle has no libdynmo_cuda.so"
# without UCX's cma module two ranks talk over tcp, and MPI_Finalize hung
# in about 1 of 15 runs
[ -f "$p/lib/ucx/libuct_cma.so.0" ] || fail "the bundle does not carry UCX's cma module (lib/ucx)"

# 2. every non-glibc, non-CUDA library from the bundle
glibc_or_cuda() {
  case $1 in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|libresolv*|libgcc_s*|libstdc++*) return 0 ;;
    libcuda*|libcublas*|libnccl*|libnvidia*) return 0 ;;
  esac
  return 1
}
checked=0
for f in "$p/build/dynmo.bin" "$p/build/gpu/check_ops.bin" "$p/bin/mpiexec.hydra" "$p/bin/hydra_pmi_proxy" \
         "$p/build/libdynmo_emulate.so" "$p/build/libdynmo_cuda.so"; do
  [ -f "$f" ] || continue
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    glibc_or_cuda "$name" && continue
    checked=$((checked + 1))
    case $path in "$p/lib/"*) ;; *) fail "$(basename "$f"): $name resolves to $path, not into the bundle" ;; esac
  done < <(LD_LIBRARY_PATH=$p/lib ldd "$f")
done
[ $checked -gt 50 ] && echo "ok: ldd: $checked non-glibc, non-CUDA needs of the bundle's programs, all in the bundle" \
  || fail "ldd found only $checked libraries to check"
help=$("$p/build/dynmo" --help 2>&1) && grep -q '^usage: dynmo' <<<"$help" \
  && echo "ok: the bundled dynmo starts: $(head -n 1 <<<"$help")" || fail "the bundled dynmo --help: $help"

# 3. a 2-rank run through the bundle's mpiexec on the emulated device
dir=$tmp/run
mkdir -p "$dir" "$tmp/lddebug"
"$p/build/dynmo" prepare --out "$dir/data" "$p/share/GPL-3" > /dev/null || fail "bundled dynmo prepare"
tiny_config "$dir/run.ini" "run.out_dir=$dir/out" parallel.pp=2 train.device=emulate > "$dir/run.ini"
mpiexec=$(PATH=$p/bin:$PATH command -v mpiexec)
[ "$mpiexec" = "$p/bin/mpiexec" ] || fail "mpiexec in PATH is $mpiexec, not the bundle's"
PATH=$p/bin:$PATH HYDRA_LAUNCHER=fork LD_DEBUG=files LD_DEBUG_OUTPUT=$tmp/lddebug/ld \
  timeout -k 10 120 mpiexec -verbose -n 2 dynmo train --config "$dir/run.ini" > "$dir/run.out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  fail "2 ranks on emulate through the bundle: exit $rc: $(grep -v '^\s*\[\|^ ' "$dir/run.out" | grep -m 3 -i error)"
else
  steps=$(h5dump -d /steps/loss -H "$dir/out/runlog.h5" 2>/dev/null | grep -o 'DATASPACE *SIMPLE { ( [0-9]*' | grep -o '[0-9]*$')
  [ "$steps" = 4 ] && echo "ok: 2 ranks on train.device=emulate through the bundle's mpiexec: 4 steps" \
    || fail "2 ranks on emulate: runlog has ${steps:-no} steps, want 4"
fi
grep -q "Proxy launch args: $p/bin/hydra_pmi_proxy " "$dir/run.out" \
  && echo "ok: hydra started the bundle's hydra_pmi_proxy" || fail "hydra did not start $p/bin/hydra_pmi_proxy: $(grep -m 1 'Proxy launch args' "$dir/run.out")"
loaded=$(cat "$tmp"/lddebug/ld.* 2>/dev/null | sed -n 's/.*calling init: //p' | sort -u)
outside=$(while read -r f; do
  [ -n "$f" ] || continue
  glibc_or_cuda "$(basename "$f")" && continue
  case $f in "$p/"*) ;; *) echo "$f" ;; esac
done <<<"$loaded")
n_bundle=$(grep -c "^$p/" <<<"$loaded")
if [ -z "$outside" ] && [ "$n_bundle" -gt 20 ]; then
  echo "ok: the run's processes loaded $n_bundle libraries, every non-glibc one from the bundle (LD_DEBUG)"
else
  fail "the run loaded from outside the bundle: $(head -n 5 <<<"$outside" | tr '\n' ' ') ($n_bundle from the bundle)"
fi
grep -q "calling init: $p/build/libdynmo_emulate.so" <<<"$(cat "$tmp"/lddebug/ld.*)" \
  || fail "the run did not load the bundle's libdynmo_emulate.so"
grep -q "calling init: $p/\(.*/\)\?lib/ucx/libuct_cma.so.0" <<<"$(cat "$tmp"/lddebug/ld.*)" \
  && echo "ok: the ranks loaded UCX's cma module from the bundle" || fail "the run did not load the bundle's UCX cma module"
grep -q 'MPI_Finalize did not return' "$dir/run.out" && fail "a rank's MPI_Finalize hung: $(grep -m 2 MPI_Finalize "$dir/run.out")"

# 4. device_session.sh here: no GPU (a stand-in nvidia-smi that finds none)
mkdir -p "$tmp/fakebin" "$tmp/out"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2\nexit 9\n' \
  > "$tmp/fakebin/nvidia-smi"
chmod +x "$tmp/fakebin/nvidia-smi"
before=$(ls -d /tmp/dynmo-device.* 2>/dev/null | sort)
start=$SECONDS
PATH=$tmp/fakebin:$PATH OUT=$tmp/out DEVICE_UNPACK=python timeout -k 10 120 scripts/device_session.sh "$archive" > "$tmp/session.out" 2>&1
rc=$?
secs=$((SECONDS - start))
after=$(ls -d /tmp/dynmo-device.* 2>/dev/null | sort)
if [ $rc -eq 2 ]; then echo "ok: device_session.sh without a GPU: exit 2 in $secs s"
else fail "device_session.sh without a GPU: exit $rc (want 2) in $secs s: $(tail -n 12 "$tmp/session.out")"; fi
summary=$(sed -n '/device_session summary/,$p' "$tmp/session.out")
for want in "dynmo starts: usage: dynmo" "no GPU: nvidia-smi finds none" "check-gpu: exit 1; 0 passed, failed: device: nvidia-smi finds no GPU" \
            "bench-gpu: no GPU, nothing measured" "device_session: exit 2"; do
  grep -qF "$want" <<<"$summary" || fail "the session's summary lacks '$want': $summary"
done
for f in env.txt session.log check-gpu.log bench-gpu.log; do
  [ -s "$tmp/out/$f" ] || fail "the session wrote no $f into OUT"
done
grep -q '^gpus: no GPU' "$tmp/out/env.txt" && grep -q '^libraries for the CUDA plugin:' "$tmp/out/env.txt" \
  && echo "ok: env.txt: $(grep '^gpus:' "$tmp/out/env.txt")" || fail "env.txt: $(head -n 8 "$tmp/out/env.txt")"
grep -q 'no GPU' "$tmp/out/bench-gpu.log" || fail "bench-gpu.log does not say no GPU"
[ "$before" = "$after" ] || fail "the session left its prefix: $(comm -13 <(echo "$before") <(echo "$after"))"
# the plugin's own libraries (cudart, cuBLAS, NCCL) are found here; the
# driver's libcuda.so.1 only where a driver is installed
if [ ${#flags[@]} -eq 0 ]; then
  if ! grep -q 'CUDA plugin: ' <<<"$summary" || grep -q 'libdynmo_cuda.so cannot load' <<<"$summary"; then
    fail "the plugin's CUDA libraries: $(grep 'CUDA' <<<"$summary")"
  else echo "ok: $(grep -m 1 'CUDA plugin: ' <<<"$summary" | sed 's/^ *//')"; fi
fi

# no archive: exit 3, saying what to do
OUT=$tmp/out2 timeout -k 10 30 scripts/device_session.sh "$tmp/none.tar.xz" > "$tmp/none.out" 2>&1
rc=$?
[ $rc -eq 3 ] && grep -q 'run scripts/device_bundle.sh' "$tmp/none.out" && echo "ok: no archive: exit 3" \
  || fail "no archive: exit $rc: $(tail -n 3 "$tmp/none.out")"
finish
