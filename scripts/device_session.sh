#!/usr/bin/env bash
# scripts/device_session.sh: the one command of a lent GPU machine's call
# (docs/gpu.md, "Running on a lent GPU"). Runs there from the repository
# root, with the archive scripts/device_bundle.sh wrote here carried along
# (carry [".devbundle"]); runnable on any machine for testing.
#
#   scripts/device_session.sh [ARCHIVE]     (default .devbundle/dynmo-device.tar.xz)
#
# 1. unpacks the archive into a fresh prefix under /tmp (removed at exit
#    unless KEEP=1; under .devbundle/ when /tmp is noexec), with xz, else
#    python3's tarfile (or with DEVICE_UNPACK=python);
# 2. finds the target's libcudart.so.13, libcublas.so.13, libcublasLt.so.13,
#    libnccl.so.2 and libcuda.so.1 (/usr/local/cuda*/lib64, the usual
#    system dirs, python3's site-packages/nvidia/*, ldconfig) and hands
#    their dirs to the bundle's wrappers (DYNMO_DEVICE_CUDA_LIBS); puts
#    the bundle's bin/ (mpiexec, dynmo) first in PATH;
# 3. writes the machine's facts to $OUT/env.txt (GPU, driver, nvcc, the
#    libraries and where, CPU, glibc, python3, torch and CUDA);
# 4. checks the bundle's programs load (ldd): a bundled library that needs
#    a newer glibc than the target's is set aside for the target's own copy
#    where it has one; then that `dynmo --help` runs;
# 5. `DEVICE=cuda scripts/check_gpu.sh` on the bundle, into $OUT/check-gpu.log
#    (when a GPU answers but the CUDA plugin cannot load, says which library
#    is missing and runs DEVICE=emulate instead, into check-gpu-emulate.log);
# 6. bench/gpu.sh with the bundle's dynmo and plugin, into
#    $OUT/bench-gpu.log (it also writes gpu-bench.log, gpu-bench-table.txt);
# 7. a summary (also in $OUT/session.log).
# All of it within DEVICE_BUDGET seconds (default 480): check-gpu gets what
# is left less DEVICE_BENCH_SECONDS (default 170) for the benchmark. Never
# needs the network, apt or root.
# Exit: 0 every check passed and every dynmo run measured; 1 something ran
# and failed; 2 no GPU here (the GPU parts say 'no GPU'; the bundle was
# checked as far as it goes); 3 the bundle cannot run here (no archive,
# unpack failed, dynmo does not start).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
repo=$PWD
budget=${DEVICE_BUDGET:-480}
bench_seconds=${DEVICE_BENCH_SECONDS:-170}
archive=${1:-.devbundle/dynmo-device.tar.xz}
OUT=${OUT:-$repo/device-out}
mkdir -p "$OUT" || exit 3
exec > >(tee "$OUT/session.log") 2>&1
tee_pid=$!
summary=()
note() { echo "device_session: $*"; summary+=("$*"); }
left() { echo $((budget - SECONDS)); }
finish() { # STATUS
  echo "== device_session summary ($(date -u +%Y-%m-%dT%H:%MZ), $SECONDS s of $budget):"
  printf '  %s\n' "${summary[@]}"
  echo "device_session: exit $1"
  # let tee finish session.log before the call ends
  exec 1>&- 2>&-
  wait "$tee_pid" 2>/dev/null
  exit "$1"
}
echo "== device_session: $(hostname), $(date -u +%Y-%m-%dT%H:%MZ), budget $budget s, OUT=$OUT"

# 1. unpack
[ -f "$archive" ] || { note "no bundle at $archive: run scripts/device_bundle.sh where dynmo builds and carry .devbundle"; finish 3; }
# /tmp, unless it is mounted noexec: then the repository's ignored .devbundle/
base=/tmp
if findmnt -no OPTIONS -T /tmp 2>/dev/null | grep -qw noexec; then
  base=$repo/.devbundle; mkdir -p "$base"; note "/tmp is noexec: unpacking under $base"
fi
prefix=$(mktemp -d "$base/dynmo-device.XXXXXX") || { note "mktemp under $base failed"; finish 3; }
[ -n "${KEEP:-}" ] || trap 'rm -rf "$prefix"' EXIT
if [ "${DEVICE_UNPACK:-}" != python ] && command -v xz >/dev/null; then
  tar -C "$prefix" -xJf "$archive"
else
  python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}))' \
    "$archive" "$prefix"
fi || { note "unpacking $archive failed"; finish 3; }
p=$prefix/dynmo-device
[ -x "$p/build/dynmo" ] || { note "$archive holds no dynmo-device/build/dynmo"; finish 3; }
note "bundle: $(head -n 1 "$p/MANIFEST") -> $p"

# 2. the target's CUDA libraries. find_lib NAME: the first path that has it.
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
py_paths=$(python3 -c 'import sys; print("\n".join(p for p in sys.path if p))' 2>/dev/null)
find_lib() {
  local d f
  for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/local/cuda-*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu \
           /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib; do
    [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  while read -r d; do
    [ -n "$d" ] && [ -d "$d/nvidia" ] || continue
    f=$(find "$d/nvidia" -maxdepth 3 -name "$1" 2>/dev/null | head -n 1)
    [ -n "$f" ] && { echo "$f"; return 0; }
  done <<<"$py_paths"
  f=$("$ldconfig" -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }')
  [ -n "$f" ] && echo "$f"
}
cuda_dirs="" missing=() found_lines=()
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcuda.so.1; do
  f=$(find_lib "$lib")
  if [ -z "$f" ]; then missing+=("$lib"); found_lines+=("$lib: not found"); continue; fi
  found_lines+=("$lib: $f")
  d=$(dirname "$f")
  case ":$cuda_dirs:" in *":$d:"*) ;; *) cuda_dirs=${cuda_dirs:+$cuda_dirs:}$d ;; esac
done
export DYNMO_DEVICE_CUDA_LIBS=$cuda_dirs
export PATH=$p/bin:$PATH
# hydra starts the ranks on this node by fork, never ssh
export HYDRA_LAUNCHER=fork
if [ ${#missing[@]} -gt 0 ]; then note "CUDA libraries not found here: ${missing[*]}"
else note "CUDA libraries found in: $cuda_dirs"; fi

# 3. the facts
gpu_list=$(nvidia-smi -L 2>/dev/null | grep '^GPU ' || true)
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)"
  echo "os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")  kernel: $(uname -r)"
  echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null || echo '?')  (the bundle: $(sed -n 3p "$p/MANIFEST"))"
  echo "cpu: $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores, $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "gpus: ${gpu_list:-no GPU (nvidia-smi -L: $( (nvidia-smi -L || true) 2>&1 | head -n 1))}"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>/dev/null | sed 's/^/  /'
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
  echo "nvcc: ${nvcc:-none} $([ -n "$nvcc" ] && "$nvcc" --version | tail -n 1)"
  echo "gcc: $(gcc --version 2>/dev/null | head -n 1 || echo none)"
  echo "libraries for the CUDA plugin:"; printf '  %s\n' "${found_lines[@]}"
  echo "python3: $(command -v python3 || echo none) $(python3 --version 2>&1)"
  timeout -k 10 60 python3 - <<'PY' 2>&1 | sed 's/^/  /'
import importlib
for name in ("numpy", "h5py", "mpi4py"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:
        print(name, "missing:", e)
try:
    import torch
    ok = torch.cuda.is_available()
    print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", ok,
          torch.cuda.get_device_name(0) if ok else "")
except Exception as e:
    print("torch missing:", e)
PY
  echo "xz: $(command -v xz || echo 'none (unpacked with python3 tarfile)')  ldd: $(command -v ldd || echo none)"
  echo "the bundle's MANIFEST:"; sed 's/^/  /' "$p/MANIFEST"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" | head -n 20

# 4. the bundle loads. bundle_ldd: what ldd says of its programs, errors included.
elves=("$p/build/dynmo.bin" "$p/build/gpu/check_ops.bin" "$p/bin/mpiexec.hydra" "$p/bin/hydra_pmi_proxy"
       "$p/build/libdynmo_emulate.so")
bundle_ldd() { local f; for f in "${elves[@]}"; do LD_LIBRARY_PATH=$p/lib ldd "$f" 2>&1; done; }
system_has() { "$ldconfig" -p 2>/dev/null | grep -q "^[[:space:]]*$1 " ||
  ls /lib/x86_64-linux-gnu/"$1" /usr/lib/x86_64-linux-gnu/"$1" /lib64/"$1" /usr/lib64/"$1" >/dev/null 2>&1; }
if command -v ldd >/dev/null; then
  mkdir -p "$p/lib.unused"
  for round in 1 2 3 4 5 6 7 8; do
    errors=$(bundle_ldd | grep -o "version \`[^']*' not found (required by [^)]*)" | sort -u)
    [ -n "$errors" ] || break
    moved=0
    while read -r line; do
      lib=${line##*required by }; lib=${lib%)}
      case $lib in "$p"/lib/*) ;; *) continue ;; esac
      [ -f "$lib" ] || continue
      if system_has "$(basename "$lib")"; then
        mv "$lib" "$p/lib.unused/" && moved=1
        v=${line#version ?}; v=${v%%\'*}
        note "glibc: the bundle's $(basename "$lib") needs $v, this machine has $(getconf GNU_LIBC_VERSION 2>/dev/null); using the machine's own $(basename "$lib")"
      fi
    done <<<"$errors"
    [ $moved = 1 ] || break
  done
  [ -z "$errors" ] || note "glibc: still unresolved: $(head -n 3 <<<"$errors" | tr '\n' ' ')"
  notfound=$(bundle_ldd | awk '/=> not found/ { print $1 }' | sort -u | tr '\n' ' ')
  [ -z "$notfound" ] || note "the bundle's programs miss: $notfound"
fi
if ! help=$("$p/build/dynmo" --help 2>&1) || ! grep -q '^usage: dynmo' <<<"$help"; then
  echo "$help" | head -n 5
  note "dynmo does not start here: $(head -n 1 <<<"$help")"
  finish 3
fi
note "dynmo starts: $(head -n 1 <<<"$help")"

plugin_ok=1 why=""
if [ ! -f "$p/build/libdynmo_cuda.so" ]; then
  plugin_ok=0 why="the bundle has no libdynmo_cuda.so (built with --no-cuda)"
elif command -v ldd >/dev/null; then
  nf=$(LD_LIBRARY_PATH=$p/lib${cuda_dirs:+:$cuda_dirs} ldd "$p/build/libdynmo_cuda.so" 2>&1 | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')
  [ -z "$nf" ] || plugin_ok=0 why="libdynmo_cuda.so cannot load: $nf not found on this machine"
fi
# cudart opens the driver's libcuda.so.1 itself: without it no device opens
if [ $plugin_ok = 1 ] && [[ " ${missing[*]} " == *" libcuda.so.1 "* ]]; then
  plugin_ok=0 why="no libcuda.so.1 (the driver's library) found on this machine: cudart will find no device"
fi
[ $plugin_ok = 1 ] && note "CUDA plugin: its libraries resolve" || note "CUDA plugin: $why"

# 5. check-gpu
gpu=1
[ -n "$gpu_list" ] || gpu=0
check_rc=-
if [ $gpu = 0 ]; then
  note "no GPU: nvidia-smi finds none on $(hostname); check-gpu and bench-gpu can only say so"
fi
check_limit=$(( $(left) - bench_seconds ))
[ $check_limit -ge 60 ] || check_limit=60
echo "== check-gpu: DEVICE=cuda scripts/check_gpu.sh (BUILD=$p/build, at most $check_limit s)"
BUILD=$p/build DEVICE=cuda CHECK_GPU_TEXT=$p/share/GPL-3 timeout --kill-after=10 "$check_limit" \
  scripts/check_gpu.sh 2>&1 | tee "$OUT/check-gpu.log"
check_rc=${PIPESTATUS[0]}
case $check_rc in
  0) note "check-gpu: all passed ($(grep -c '^  PASS' "$OUT/check-gpu.log") checks)" ;;
  124|137) note "check-gpu: stopped after $check_limit s (DEVICE_BUDGET); $(grep -c '^check-gpu: PASS' "$OUT/check-gpu.log") passed before" ;;
  *) note "check-gpu: exit $check_rc; $(grep -c '^  PASS' "$OUT/check-gpu.log") passed, failed: $(grep '^  FAIL' "$OUT/check-gpu.log" | head -n 3 | sed 's/^  FAIL *//' | cut -c 1-110 | tr '\n' ';')$([ $gpu = 0 ] && echo ' (no GPU)')" ;;
esac
if [ $gpu = 1 ] && [ $plugin_ok = 0 ] && [ "$(left)" -gt $((bench_seconds + 60)) ]; then
  echo "== check-gpu on the emulated device instead (the plugin cannot load)"
  BUILD=$p/build DEVICE=emulate CHECK_GPU_TEXT=$p/share/GPL-3 timeout --kill-after=10 \
    "$(( $(left) - bench_seconds ))" scripts/check_gpu.sh 2>&1 | tee "$OUT/check-gpu-emulate.log"
  note "check-gpu DEVICE=emulate (the bundle on this CPU): exit ${PIPESTATUS[0]}"
fi

# 6. bench-gpu
bench_budget=$(( $(left) - 10 ))
if [ $bench_budget -lt 30 ]; then
  bench_rc=125; note "bench-gpu: not started, DEVICE_BUDGET spent"
else
  echo "== bench-gpu: bench/gpu.sh (DYNMO=$p/build/dynmo, GPU_BENCH_BUDGET=$bench_budget)"
  DYNMO=$p/build/dynmo DYNMO_CUDA_PLUGIN=$p/build/libdynmo_cuda.so GPU_BENCH_BUDGET=$bench_budget OUT=$OUT \
    timeout --kill-after=10 "$((bench_budget + 5))" bench/gpu.sh 2>&1 | tee "$OUT/bench-gpu.log"
  bench_rc=${PIPESTATUS[0]}
  case $bench_rc in
    0) note "bench-gpu: every dynmo run measured (table: gpu-bench-table.txt)" ;;
    2) note "bench-gpu: no GPU, nothing measured" ;;
    *) note "bench-gpu: exit $bench_rc: dynmo measured on $(awk -F'|' 'NR > 2 && $3 ~ /^ *[0-9]/' "$OUT/gpu-bench-table.txt" 2>/dev/null | wc -l) of $(awk 'NR > 2' "$OUT/gpu-bench-table.txt" 2>/dev/null | wc -l) rows (gpu-bench-table.txt, bench-gpu.log say why)" ;;
  esac
fi

# 7. the summary
[ -f "$OUT/gpu-bench-table.txt" ] && { echo "== the benchmark's table:"; cat "$OUT/gpu-bench-table.txt"; }
if [ $gpu = 0 ]; then finish 2; fi
if [ "$check_rc" = 0 ] && [ "$bench_rc" = 0 ]; then finish 0; fi
finish 1
