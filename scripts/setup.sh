#!/usr/bin/env bash
# Installs, from Debian's archive, whatever dynmo's build, tests and demo
# need and is not yet installed; `--bench` adds the benchmark peer
# (python3-torch, large), `--fuzz` clang with libFuzzer and the sanitizer
# runtimes (`make fuzz`). Idempotent; needs root (or sudo) only when
# something is missing. The Slurm tests install slurmctld/slurmd themselves.
set -euo pipefail
packages=(
  build-essential pkg-config
  mpich libmpich-dev libhdf5-mpich-dev hdf5-tools
  zlib1g-dev                        # run-log readers inflate compressed chunks to check them
  libopenblas-dev
  libcairo2-dev fonts-dejavu-core   # dynmo report draws its figures with cairo
  libjson-c-dev                     # dynmo trace and inspect --json write JSON with json-c
  bible-kjv-text          # the default English corpus (docs/data.md)
  python3 python3-numpy python3-h5py         # run-log checks in the tests
  chromium                  # the tests render dynmo report's page headless
)
if [ "${1:-}" = "--bench" ]; then
  packages+=(python3-torch)                  # the PyTorch peer of make bench
fi
if [ "${1:-}" = "--fuzz" ]; then
  # clang alone recommends, not depends on, the runtimes libFuzzer needs
  packages+=(clang libclang-rt-dev)
fi
# The CUDA plugin's compiler and libraries (make check builds the plugin;
# docs/gpu.md), only where no nvcc is installed: Debian has them in
# contrib/non-free. Where the apt sources lack them, the CUDA tests skip
# (status 77) and say so.
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
  for p in nvidia-cuda-toolkit libnccl-dev; do
    if apt-cache show "$p" >/dev/null 2>&1; then
      packages+=("$p")
    else
      echo "setup: $p is not in this machine's apt sources (Debian contrib/non-free); the CUDA tests will skip"
    fi
  done
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
