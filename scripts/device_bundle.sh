#!/usr/bin/env bash
# scripts/device_bundle.sh: dynmo for a lent GPU machine (docs/gpu.md,
# "Running on a lent GPU"), built HERE (Debian 12) into one archive that
# the device tool carries there, where Debian's MPICH, parallel HDF5,
# OpenBLAS, cairo and json-c are not installed.
#
#   scripts/device_bundle.sh [--no-cuda] [--build DIR] [--out DIR] [--max-mib N]
#
# 1. builds a portable dynmo (ARCH=-march=x86-64-v2) into DIR (default
#    build/device): dynmo, libdynmo_emulate.so, gpu/check_ops, and, unless
#    --no-cuda, the CUDA plugin libdynmo_cuda.so for the H200 (sm_90 plus
#    compute_90 PTX) with nvcc (CUDA_HOME, as the Makefile picks it);
# 2. collects every shared library `ldd` lists for those and for MPICH's
#    mpiexec.hydra and hydra_pmi_proxy, except the C library family and
#    CUDA's, which must be the target's own (libc, libm, libpthread, libdl,
#    librt, libresolv, ld-linux, libgcc_s, libstdc++, libcuda, libcudart,
#    libcublas*, libnccl, libnvidia*), each stripped (--strip-unneeded),
#    and UCX's cma module (lib/ucx/);
# 3. lays them out as dynmo-device/ (bin/ mpiexec, lib/, build/ as a
#    BUILD directory for scripts/check_gpu.sh, share/ the text check_gpu.sh
#    prepares, MANIFEST) and writes ONE archive, OUT/dynmo-device.tar.xz
#    (OUT default .devbundle, ignored by git), and prints its size and
#    whether the repository's tracked files plus the archive fit the device
#    tool's 64 MiB.
# The binaries under build/ and bin/mpiexec are small sh wrappers that set
# LD_LIBRARY_PATH for themselves only (lib/, then $DYNMO_DEVICE_CUDA_LIBS,
# which scripts/device_session.sh finds there, then the caller's) and exec the real ELF
# beside them (NAME.bin; mpiexec.hydra): python3 and torch on the target
# never see Debian's libraries.
# Exit: 0 written; 1 a build or a library failed, or the archive exceeds
# --max-mib (default 40); 2 usage.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=build/device out=.devbundle cuda=1 max_mib=40
while [ $# -gt 0 ]; do
  case $1 in
    --no-cuda) cuda=0 ;;
    --build) build=${2:?--build DIR}; shift ;;
    --out) out=${2:?--out DIR}; shift ;;
    --max-mib) max_mib=${2:?--max-mib N}; shift ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_bundle.sh: unknown argument '$1' (--no-cuda, --build DIR, --out DIR, --max-mib N)" >&2; exit 2 ;;
  esac
  shift
done
arch=-march=x86-64-v2
gencode='-gencode=arch=compute_90,code=[sm_90,compute_90]'
say() { echo "device_bundle: $*"; }
die() { echo "device_bundle: $*" >&2; exit 1; }
jobs=2

# 1. the build
say "building $build/dynmo, libdynmo_emulate.so, gpu/check_ops (ARCH=$arch)"
make --no-print-directory -s -j$jobs SANITIZE= BUILD="$build" ARCH="$arch" \
  "$build/dynmo" "$build/libdynmo_emulate.so" "$build/gpu/check_ops" || die "make failed"
if [ $cuda = 1 ]; then
  cuda_home=${CUDA_HOME:-/usr}
  [ -n "${CUDA_HOME:-}" ] || { [ -x /usr/local/cuda/bin/nvcc ] && cuda_home=/usr/local/cuda; }
  [ -x "$cuda_home/bin/nvcc" ] || die "no nvcc at $cuda_home/bin/nvcc (set CUDA_HOME, or --no-cuda for a bundle without the plugin)"
  say "building $build/libdynmo_cuda.so ($("$cuda_home/bin/nvcc" --version | tail -n 1); $gencode)"
  make --no-print-directory -s -j$jobs SANITIZE= USE_CUDA=1 CUDA_HOME="$cuda_home" BUILD="$build" ARCH="$arch" \
    "CUDA_GENCODE=$gencode" "$build/libdynmo_cuda.so" || die "make USE_CUDA=1 failed"
fi

# 2. the libraries. keep_lib NAME: 0 when the bundle carries it.
keep_lib() {
  case $1 in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) return 1 ;;
    libgcc_s.so*|libstdc++.so*) return 1 ;;
    libcuda.so*|libcudart.so*|libcublas*|libnccl.so*|libnvidia*) return 1 ;;
  esac
  return 0
}
hydra=$(command -v mpiexec.hydra) || die "no mpiexec.hydra (Debian's mpich)"
proxy=$(command -v hydra_pmi_proxy || echo "$(dirname "$hydra")/hydra_pmi_proxy")
[ -x "$proxy" ] || die "no hydra_pmi_proxy beside $hydra"
elves=("$build/dynmo" "$build/gpu/check_ops" "$build/libdynmo_emulate.so" "$hydra" "$proxy")
[ $cuda = 1 ] && elves+=("$build/libdynmo_cuda.so")

stage=$(mktemp -d /tmp/dynmo-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
p=$stage/dynmo-device
mkdir -p "$p/bin" "$p/lib/ucx" "$p/build/gpu" "$p/share"
declare -A from=()
for elf in "${elves[@]}"; do
  # ldd lists the whole closure; the CUDA libraries it cannot find here
  # (a build without them) are the target's anyway
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    keep_lib "$name" || continue
    [ "$path" != "not" ] || die "ldd $elf: $name not found here"
    from[$name]=$path
  done < <(ldd "$elf")
done
# UCX's cross-memory-attach module (cma): without it two ranks on one node
# fall back to UCX's tcp, and 1 MPI_Finalize in ~15 hung (measured with
# mpiexec -verbose). Its own needs (libucs, libuct, libucm, libnuma) are
# carried already; the InfiniBand modules are not (one node, and they need
# libibverbs).
[ -n "${from[libuct.so.0]:-}" ] || die "ldd found no libuct.so.0 (MPICH's UCX)"
cma=$(dirname "$(readlink -f "${from[libuct.so.0]}")")/ucx/libuct_cma.so.0
[ -f "$cma" ] || cma=$(dirname "${from[libuct.so.0]}")/ucx/libuct_cma.so.0
[ -f "$cma" ] || die "no UCX cma module beside ${from[libuct.so.0]} (Debian's libucx0)"
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] && keep_lib "$name" || continue
  [ -n "${from[$name]:-}" ] || die "UCX's cma module needs $name, which the bundle does not carry"
done < <(ldd "$cma")
for name in "${!from[@]}"; do
  cp -L "${from[$name]}" "$p/lib/$name"
  chmod u+w "$p/lib/$name"
  strip --strip-unneeded "$p/lib/$name"
done
cp -L "$cma" "$p/lib/ucx/libuct_cma.so.0"
chmod u+w "$p/lib/ucx/libuct_cma.so.0"
strip --strip-unneeded "$p/lib/ucx/libuct_cma.so.0"

# 3. the binaries and their wrappers. wrapper FILE REAL: FILE execs REAL
# (a path relative to FILE's directory) with the bundle's libraries.
wrapper() {
  local up=$3
  cat > "$1" <<EOF
#!/bin/sh
# dynmo-device wrapper (scripts/device_bundle.sh): the bundle's libraries
# for this program only, then the CUDA libraries device_session.sh found,
# then the caller's LD_LIBRARY_PATH.
here=\$(cd "\$(dirname "\$0")" && pwd)
# UCX (MPICH's) loads transport modules from lib/ucx (cma; shared memory
# and tcp are built in), never the modules of another UCX on the machine.
UCX_MODULE_DIR="\$here/${up}lib/ucx" LD_LIBRARY_PATH="\$here/${up}lib\${DYNMO_DEVICE_CUDA_LIBS:+:\$DYNMO_DEVICE_CUDA_LIBS}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/$2" "\$@"
EOF
  chmod 755 "$1"
}
cp "$build/dynmo" "$p/build/dynmo.bin"
cp "$build/gpu/check_ops" "$p/build/gpu/check_ops.bin"
cp "$build/libdynmo_emulate.so" "$p/build/"
[ $cuda = 1 ] && cp "$build/libdynmo_cuda.so" "$p/build/"
strip --strip-debug "$p/build/dynmo.bin" "$p/build/gpu/check_ops.bin" "$p"/build/*.so
wrapper "$p/build/dynmo" dynmo.bin ../
wrapper "$p/build/gpu/check_ops" check_ops.bin ../../
cp -L "$hydra" "$p/bin/mpiexec.hydra"
cp -L "$proxy" "$p/bin/hydra_pmi_proxy"
strip --strip-unneeded "$p/bin/mpiexec.hydra" "$p/bin/hydra_pmi_proxy"
# hydra starts hydra_pmi_proxy from the directory of the mpiexec it ran
# as (argv[0]), so the wrapper execs bin/mpiexec.hydra by its full path;
# the proxy and the ranks inherit the wrapper's LD_LIBRARY_PATH.
wrapper "$p/bin/mpiexec" mpiexec.hydra ../
wrapper "$p/bin/dynmo" ../build/dynmo.bin ../
cp /usr/share/common-licenses/GPL-3 "$p/share/GPL-3"

glibc=$(for f in "$p"/lib/* "$p"/bin/*.hydra "$p"/bin/hydra_pmi_proxy "$p"/build/*.bin "$p"/build/gpu/*.bin "$p"/build/*.so; do
          objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -n 1 || true)
glibcxx=$(objdump -T "$p"/build/*.so "$p"/lib/* 2>/dev/null | grep -o 'GLIBCXX_[0-9][0-9.]*' | sort -uV | tail -n 1 || true)
{
  echo "dynmo-device bundle, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built on: $(. /etc/os-release; echo "$PRETTY_NAME"), $(ldd --version | head -n 1), ARCH=$arch, cuda plugin: $([ $cuda = 1 ] && echo "yes ($gencode)" || echo no)"
  echo "needs on the target: glibc >= ${glibc#GLIBC_}${glibcxx:+, libstdc++ with $glibcxx}, libgcc_s$([ $cuda = 1 ] && echo ', libcudart.so.13, libcublas.so.13, libcublasLt.so.13, libnccl.so.2, libcuda.so.1')"
  echo "libraries carried (from this machine):"
  for name in $(printf '%s\n' "${!from[@]}" | sort); do echo "  $name <= ${from[$name]}"; done
  echo "  ucx/libuct_cma.so.0 <= $cma"
} > "$p/MANIFEST"

mkdir -p "$out"
archive=$out/dynmo-device.tar.xz
tar -C "$stage" -cf - dynmo-device | xz -T$jobs -6 > "$archive.tmp"
mv "$archive.tmp" "$archive"
bytes=$(stat -c %s "$archive")
tracked=$(git -C "$repo" ls-files -z | (cd "$repo" && du -cb --files0-from=- 2>/dev/null) | tail -n 1 | cut -f 1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
say "$(wc -l < "$p/MANIFEST" | awk '{print $1 - 4}') libraries carried; needs glibc >= ${glibc#GLIBC_} on the target"
say "archive $archive: $(mib "$bytes") ($(du -sb "$p" | cut -f 1 | xargs -I{} awk -v b={} 'BEGIN { printf "%.1f MiB", b / 1048576 }') unpacked)"
say "tracked files $(mib "$tracked") + archive = $(mib $((tracked + bytes))) of the device tool's 64 MiB"
if [ "$bytes" -gt $((max_mib * 1048576)) ]; then
  die "the archive is over --max-mib $max_mib MiB"
fi
