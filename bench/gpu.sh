#!/usr/bin/env bash
# make bench-gpu: issue 20's GPU benchmark in one command, for a session
# that is lent a GPU for a few minutes (docs/gpu-bench.md). On a machine
# with a GPU it
#   1. prints the GPU (nvidia-smi -L) and its fp32, TF32 and bf16 peaks;
#   2. brings $BUILD/dynmo and the CUDA plugin $BUILD/libdynmo_cuda.so up
#      to date (make USE_CUDA=1, for the GPU's own architecture), unless
#      DYNMO and DYNMO_CUDA_PLUGIN both name the binaries to use;
#   3. runs `dynmo bench` with train.device=cuda for each config
#      (configs/ref.ini, configs/gpt2-small.ini) and each precision of
#      GPU_BENCH_PRECISIONS (train.precision = fp32, tf32, bf16: the
#      operands of every cuBLAS product; docs/gpu.md), GPU_BENCH_WARMUP
#      untimed + GPU_BENCH_STEPS timed steps, each run under a timeout,
#      all of them within GPU_BENCH_BUDGET seconds of the start;
#   4. runs the PyTorch peer (bench/torch_gpt.py --device cuda) on the same
#      shapes in the same precisions (fp32 with TF32 off, --tf32, --bf16:
#      torch.autocast to bfloat16), when a python3 has a torch that sees
#      the GPU (/usr/bin/python3, python3; or only $PYTHON);
#   5. prints one table: per config and precision, tokens/s, achieved
#      TFLOP/s and the share of the GPU's peak for that precision, for
#      dynmo and for PyTorch, and their ratio.
# A piece that cannot run (plugin build fails, dynmo refuses cuda, no
# torch) prints one line saying why, and the rest still runs. With OUT
# set (the device tool copies $OUT back) the output also goes to
# $OUT/gpu-bench.log and the table to $OUT/gpu-bench-table.txt.
# Exit status: 0 when every dynmo run measured; 1 when one did not (the
# table says why); 2 when there is no GPU (nothing else is tried).
#
# FLOPs per token of one training step, forward and backward (as dynmo
# bench's GFLOP/s, src/tools/bench.c):
#     6 N + 12 L T C,   N = L * 12 C^2 + V C
# N is the weights the matrix products use: per block qkv 3 C^2, the
# attention projection C^2, the MLP 8 C^2; the head V C (tied to the
# embedding). Biases, layernorms and the embedding lookups do no
# products and are left out. 12 L T C is attention's Q K^T and att V over
# the whole T x T square (forward 4 T C per layer, backward twice that),
# the usual convention, although the causal half is skipped. Achieved
# TFLOP/s = tokens/s * FLOPs per token / 1e12.
#
#   bench/gpu.sh                    the benchmark
#   bench/gpu.sh --flops CONFIG     the model's sizes and FLOPs per token, no GPU needed
# Knobs: GPU_BENCH_CONFIGS, GPU_BENCH_PRECISIONS (fp32 tf32 bf16),
# GPU_BENCH_STEPS (10), GPU_BENCH_WARMUP (3),
# GPU_BENCH_TIMEOUT (seconds per run, 150), GPU_BENCH_BUDGET (seconds for
# the whole script, 420: a run that would start later is not started and
# says so), GPU_BENCH_TORCH_ARGS (added to
# each PyTorch run, e.g. --compile), PYTHON, BUILD, DYNMO, DYNMO_CUDA_PLUGIN.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# model_sizes CONFIG: "V S L NH C B T" from the config's [model] and
# [train] sections; exit 2 naming the key when one is missing.
model_sizes() {
  awk -v file="$1" '
    { sub(/[;#].*/, ""); gsub(/[ \t\r]/, "") }
    /^\[.*\]$/ { section = substr($0, 2, length($0) - 2); next }
    /=/ { split($0, kv, "="); value[section "." kv[1]] = kv[2] }
    END {
      n = split("model.vocab model.max_seq model.layers model.heads model.channels train.batch train.seq", keys, " ")
      for (i = 1; i <= n; i++) {
        if (!(keys[i] in value)) { printf "gpu.sh: %s has no %s\n", file, keys[i] > "/dev/stderr"; exit 2 }
        line = line (i > 1 ? " " : "") value[keys[i]]
      }
      print line
    }' "$1"
}

# flops CONFIG: one line, "params P matmul_params N flops_per_token F
# tokens_per_step B*T"; P counts every parameter (what PyTorch's model
# has: wte V C, wpe S C, per block 12 C^2 + 13 C, the final layernorm 2 C).
flops() {
  local sizes
  sizes=$(model_sizes "$1") || return 2
  awk -v s="$sizes" 'BEGIN {
    split(s, a, " "); V = a[1]; S = a[2]; L = a[3]; C = a[5]; B = a[6]; T = a[7]
    params = V * C + S * C + L * (12 * C * C + 13 * C) + 2 * C
    matmul = L * 12 * C * C + V * C
    printf "params %d matmul_params %d flops_per_token %d tokens_per_step %d\n",
           params, matmul, 6 * matmul + 12 * L * T * C, B * T
  }'
}

if [ "${1:-}" = --flops ]; then
  [ $# -eq 2 ] || { echo "usage: bench/gpu.sh --flops CONFIG" >&2; exit 2; }
  flops "$2"; exit
fi
[ $# -eq 0 ] || { echo "usage: bench/gpu.sh [--flops CONFIG] (docs/gpu-bench.md)" >&2; exit 2; }

BUILD=${BUILD:-build}
given_binaries=0
[ -n "${DYNMO:-}" ] && [ -n "${DYNMO_CUDA_PLUGIN:-}" ] && given_binaries=1
DYNMO=${DYNMO:-$BUILD/dynmo}
build_dir=$BUILD; [[ $build_dir = /* ]] || build_dir=$PWD/$BUILD
export DYNMO_CUDA_PLUGIN=${DYNMO_CUDA_PLUGIN:-$build_dir/libdynmo_cuda.so}
configs=${GPU_BENCH_CONFIGS:-configs/ref.ini configs/gpt2-small.ini}
precisions=${GPU_BENCH_PRECISIONS:-fp32 tf32 bf16}
steps=${GPU_BENCH_STEPS:-10}
warmup=${GPU_BENCH_WARMUP:-3}
limit=${GPU_BENCH_TIMEOUT:-150}
budget=${GPU_BENCH_BUDGET:-420}
read -r -a torch_extra <<<"${GPU_BENCH_TORCH_ARGS:-}"
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" || OUT=; fi
table_file=${OUT:+$OUT/gpu-bench-table.txt}

# peaks NAME: "fp32 tf32 bf16" dense TFLOP/s from the vendor's data
# sheets for the GPUs we know, "? ? ?" for any other (the share is then
# printed as ?).
peaks() {
  case $1 in
    *H200*NVL*|*H100*PCIe*|*H100*NVL*) echo "? ? ?" ;;
    *H200*|*H100*SXM*|*H100*HBM3*) echo "67 495 989" ;;
    *A100*) echo "19.5 156 312" ;;
    *) echo "? ? ?" ;;
  esac
}

# tflops TOKENS_PER_S FLOPS_PER_TOKEN PEAK: "T share" (share in % of
# PEAK, or ? when the peak is unknown); "- -" without a measurement.
tflops() {
  awk -v r="$1" -v f="$2" -v p="$3" 'BEGIN {
    if (r == "" || r !~ /^[0-9.]+$/) { print "- -"; exit }
    t = r * f / 1e12
    if (p ~ /^[0-9.]+$/) printf "%.2f %.1f%%\n", t, 100 * t / p; else printf "%.2f ?\n", t
  }'
}

# run_limited LOG CMD...: runs CMD into LOG under the per-run timeout, cut
# to what is left of the budget; returns its status (124: timed out), or
# 125 without starting it when under 20 s are left.
run_limited() {
  local log=$1 left=$((budget - SECONDS)); shift
  [ "$left" -ge 20 ] || { echo "not started: GPU_BENCH_BUDGET ($budget s) spent" > "$log"; return 125; }
  timeout --kill-after=10 "$((left < limit ? left : limit))" "$@" > "$log" 2>&1
}

main() {
  # 1. the GPU
  local gpus
  if ! command -v nvidia-smi > /dev/null; then
    echo "gpu.sh: no GPU: nvidia-smi is not installed on $(hostname); nothing measured (run on a GPU node: docs/gpu-bench.md)"
    return 2
  fi
  if ! gpus=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$gpus"; then
    echo "gpu.sh: no GPU: nvidia-smi -L on $(hostname) says '$(head -n 1 <<<"$gpus")'; nothing measured (run on a GPU node: docs/gpu-bench.md)"
    return 2
  fi
  local name fp32_peak tf32_peak bf16_peak
  echo "== GPU: $gpus" | head -n 4
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  read -r fp32_peak tf32_peak bf16_peak <<<"$(peaks "${name:-$gpus}")"
  echo "== peak (dense, data sheet): fp32 $fp32_peak TFLOP/s, TF32 tensor cores $tf32_peak TFLOP/s, bf16 tensor cores $bf16_peak TFLOP/s${name:+ ($name)}"
  echo "== each precision against its own peak: dynmo's train.precision (the operands of its cuBLAS products; outputs, weights and everything else fp32) beside PyTorch with TF32 off, --tf32, and --bf16 (torch.autocast; docs/gpu-bench.md)"

  # 2. the build
  local have_plugin=1
  if [ $given_binaries = 0 ]; then
    local cap gencode=()
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    [[ $cap =~ ^[0-9]+$ ]] && gencode=("CUDA_GENCODE=-gencode=arch=compute_$cap,code=sm_$cap")
    echo "== building: make -j$(nproc) USE_CUDA=1 ${gencode[*]} $BUILD/dynmo $BUILD/libdynmo_cuda.so"
    if ! make --no-print-directory -j"$(nproc)" USE_CUDA=1 "${gencode[@]}" BUILD="$BUILD" \
           "$BUILD/dynmo" "$BUILD/libdynmo_cuda.so" > "$tmp/build.log" 2>&1; then
      tail -n 15 "$tmp/build.log" | sed 's/^/   /'
      echo "== build failed (log above): dynmo is not benchmarked; PyTorch still runs"
    fi
  fi
  if [ ! -x "$DYNMO" ] || [ ! -f "$DYNMO_CUDA_PLUGIN" ]; then
    have_plugin=0
    echo "== dynmo: no $DYNMO or no $DYNMO_CUDA_PLUGIN: dynmo is not benchmarked"
  fi

  # The python whose torch sees the GPU.
  local python="" candidate torch_version="no torch with CUDA"
  for candidate in ${PYTHON:-/usr/bin/python3 python3}; do
    if "$candidate" -c 'import torch; assert torch.cuda.is_available()' > /dev/null 2>&1; then
      python=$candidate; break
    fi
  done
  if [ -n "$python" ]; then
    torch_version="torch $("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
    echo "== PyTorch: $python, $torch_version"
  else
    echo "== PyTorch: no python3 here has a torch that sees the GPU (tried ${PYTHON:-/usr/bin/python3 python3}): the PyTorch columns stay empty"
  fi

  # 3, 4. the runs
  local rows=() config precision status=0 peak
  for config in $configs; do
    local sizes V S L NH C B T per_token label
    sizes=$(model_sizes "$config") || { status=1; continue; }
    read -r V S L NH C B T <<<"$sizes"
    per_token=$(flops "$config" | awk '{print $6}')
    label=$(basename "$config" .ini)
    echo "== $label: L=$L C=$C NH=$NH V=$V, batch $B x $T; $(flops "$config")"
    for precision in $precisions; do
      case $precision in
        fp32) peak=$fp32_peak ;; tf32) peak=$tf32_peak ;; bf16) peak=$bf16_peak ;;
        *) echo "   GPU_BENCH_PRECISIONS: '$precision' is not fp32, tf32 or bf16: skipped"; status=1; continue ;;
      esac
      local dynmo_rate="" dynmo_note="not run" torch_rate=""
      [ $have_plugin = 1 ] && measure_dynmo "$config" "$precision"
      [ -n "$dynmo_rate" ] || status=1
      [ -n "$python" ] && measure_torch "$python" "$precision"
      local d d_share t t_share ratio
      read -r d d_share <<<"$(tflops "$dynmo_rate" "$per_token" "$peak")"
      read -r t t_share <<<"$(tflops "$torch_rate" "$per_token" "$peak")"
      ratio=$(awk -v a="$dynmo_rate" -v b="$torch_rate" \
        'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else print "-" }')
      rows+=("$label|$precision|${dynmo_rate:-$dynmo_note}|$d|$d_share|${torch_rate:--}|$t|$t_share|$ratio")
    done
  done

  # 5. the table
  {
    echo "== GPU benchmark, $(date -u +%Y-%m-%dT%H:%MZ), ${name:-$(head -n 1 <<<"$gpus")}: peaks fp32 $fp32_peak, TF32 $tf32_peak, bf16 $bf16_peak TFLOP/s; $torch_version; $warmup warm-up + $steps timed steps (medians); %peak against the row's precision"
    printf '%-11s | %-9s | %-17s %7s %6s | %-12s %7s %6s | %s\n' \
      config precision "dynmo tok/s" TFLOP/s "%peak" "torch tok/s" TFLOP/s "%peak" "dynmo/torch"
    local row f
    for row in "${rows[@]}"; do
      IFS='|' read -r -a f <<<"$row"
      printf '%-11s | %-9s | %-17s %7s %6s | %-12s %7s %6s | %s\n' "${f[@]}"
    done
  } | tee "${table_file:-/dev/null}"
  return $status
}

# measure_dynmo CONFIG PRECISION: `dynmo bench` on cuda with
# train.precision = PRECISION; sets dynmo_rate (tokens/s, or empty) and
# dynmo_note (why not).
measure_dynmo() {
  local rc
  echo "   dynmo bench --config $1 --warmup $warmup --steps $steps train.device=cuda train.precision=$2"
  run_limited "$tmp/dynmo.log" "$DYNMO" bench --config "$1" --warmup "$warmup" \
    --steps "$steps" train.device=cuda train.precision="$2"
  rc=$?
  grep -E '^bench:|error' "$tmp/dynmo.log" | sed 's/^/   /'
  case $rc in
    0) dynmo_rate=$(sed -n 's/^bench: median .*, \([0-9.]*\) tokens\/s,.*/\1/p' "$tmp/dynmo.log")
       dynmo_note="" ;;
    2) dynmo_note="refused (exit 2)"
       echo "   dynmo refused train.device=cuda train.precision=$2 (exit 2; message above)" ;;
    124|137) dynmo_note="timed out"
       echo "   dynmo: no result in time (GPU_BENCH_TIMEOUT $limit s, GPU_BENCH_BUDGET $budget s)" ;;
    125) dynmo_note="not started"
       echo "   dynmo: not started, GPU_BENCH_BUDGET ($budget s) spent" ;;
    *) dynmo_note="failed (exit $rc)"
       tail -n 5 "$tmp/dynmo.log" | sed 's/^/   /'
       echo "   dynmo failed (exit $rc)" ;;
  esac
}

# measure_torch PYTHON PRECISION: the PyTorch peer on the config's shape
# (V S L NH C B T of the caller) with TF32 off (fp32), --tf32 or --bf16;
# sets torch_rate (tokens/s, or empty).
measure_torch() {
  local python=$1 mode=$2 flag=() rc
  case $mode in tf32) flag=(--tf32) ;; bf16) flag=(--bf16) ;; esac
  echo "   PyTorch $mode: bench/torch_gpt.py --device cuda ${flag[*]} --warmup-steps $warmup --steps $steps ${torch_extra[*]}"
  run_limited "$tmp/torch.log" "$python" bench/torch_gpt.py --device cuda "${flag[@]}" \
    --warmup-steps "$warmup" --steps "$steps" --vocab "$V" --max-seq "$S" --layers "$L" \
    --heads "$NH" --channels "$C" --batch "$B" --seq "$T" "${torch_extra[@]}"
  rc=$?
  sed 's/^/     /' "$tmp/torch.log" | tail -n 6
  case $rc in
    0) torch_rate=$(sed -n 's/^tokens\/s \([0-9.]*\);.*/\1/p' "$tmp/torch.log") ;;
    124|137) echo "   PyTorch $mode: no result in time (GPU_BENCH_TIMEOUT $limit s, GPU_BENCH_BUDGET $budget s)" ;;
    125) echo "   PyTorch $mode: not started, GPU_BENCH_BUDGET ($budget s) spent" ;;
    *) echo "   PyTorch $mode: failed (exit $rc)" ;;
  esac
}

# Made here, not in main: with OUT set main runs in a pipeline's subshell,
# whose exit would not run this shell's trap.
tmp=$(mktemp -d /tmp/dynmo-gpu-bench.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
if [ -n "${OUT:-}" ]; then
  main 2>&1 | tee "$OUT/gpu-bench.log"
  exit "${PIPESTATUS[0]}"
fi
main
