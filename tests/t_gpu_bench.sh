#!/usr/bin/env bash
# bench/gpu.sh (make bench-gpu, docs/gpu-bench.md) without a GPU:
# - no GPU (nvidia-smi missing, failing, or listing none): exit 2, one
#   line saying "no GPU", within seconds, and the line in $OUT's log;
# - its FLOP helper: the parameter counts of ref.ini and gpt2-small.ini
#   equal the PyTorch peer's model's (when /usr/bin/python3 has torch),
#   and FLOPs per token x dynmo bench's tokens/s on ref.ini gives the
#   GFLOP/s dynmo bench prints (the same formula, within rounding);
# - the whole run on a fake H200 (a stand-in nvidia-smi, dynmo and
#   python): per config a row for each of fp32, tf32 and bf16, dynmo run
#   with that train.precision and PyTorch with TF32 off, --tf32, --bf16,
#   the TFLOP/s, shares of that precision's peak and ratio from the
#   stand-ins' tokens/s, a refused dynmo shown as refused, exit 1; with no
#   GPU_BENCH_BUDGET left nothing starts; the real dynmo refusing an
#   unloadable plugin is shown as refused too;
# - bench/torch_gpt.py --device cpu still trains 2 steps of a tiny shape,
#   also with --bf16 (autocast on the CPU) (skip: without torch).
# Run from the repository root with $DYNMO set (tests/run.sh).
set -u
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
fake=$(mktemp -d /tmp/dynmo-t-gpu-bench.XXXXXX)
trap 'rm -rf "$fake"' EXIT
mkdir -p "$fake/nogpu" "$fake/failing" "$fake/h200" "$fake/out"

# --- no GPU ---------------------------------------------------------------
no_gpu() {   # NAME PATH-PREFIX
  local name=$1 start out rc secs
  start=$(date +%s.%N)
  out=$(env PATH="$2" OUT="$fake/out" bench/gpu.sh 2>&1); rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  if [ $rc -ne 2 ]; then fail "$name: exit $rc, want 2: $out"; return; fi
  if [ "$(wc -l <<<"$out")" -ne 1 ] || ! grep -q 'no GPU' <<<"$out"; then
    fail "$name: want one line saying 'no GPU', got: $out"; return
  fi
  awk -v s="$secs" 'BEGIN{exit !(s < 5)}' || fail "$name: took $secs s"
  grep -qF "$out" "$fake/out/gpu-bench.log" || fail "$name: the line is not in \$OUT/gpu-bench.log"
  echo "ok: $name: exit 2 in $secs s: $out"
}
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver (fake)"\nexit 9\n' \
  > "$fake/failing/nvidia-smi"
printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' > "$fake/nogpu/nvidia-smi"
chmod +x "$fake/failing/nvidia-smi" "$fake/nogpu/nvidia-smi"
no_gpu "nvidia-smi failing" "$fake/failing:$PATH"
no_gpu "nvidia-smi without devices" "$fake/nogpu:$PATH"
if ! command -v nvidia-smi > /dev/null; then
  no_gpu "no nvidia-smi" "$PATH"
fi

# --- the FLOP helper --------------------------------------------------------
field() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'; }
ref=$(bench/gpu.sh --flops configs/ref.ini) || fail "--flops configs/ref.ini"
small=$(bench/gpu.sh --flops configs/gpt2-small.ini) || fail "--flops configs/gpt2-small.ini"
echo "ok: ref.ini: $ref"
echo "ok: gpt2-small.ini: $small"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  for pair in "ref:$ref" "gpt2-small:$small"; do
    name=${pair%%:*}
    want=$(bench/gpu.sh --flops "configs/$name.ini" | field params)
    read -r V S L NH C _ <<<"$(awk '{sub(/[;#].*/, ""); gsub(/[ \t]/, "")} /=/ {split($0, kv, "="); v[kv[1]] = kv[2]}
      END {print v["vocab"], v["max_seq"], v["layers"], v["heads"], v["channels"]}' "configs/$name.ini")"
    got=$(/usr/bin/python3 -c "import sys; sys.path.insert(0, 'bench'); import torch_gpt
m = torch_gpt.GPT($V, $S, $L, $NH, $C); print(sum(p.numel() for p in m.parameters()))")
    if [ "$got" = "$want" ]; then echo "ok: $name: $want parameters, as torch_gpt.py's model"
    else fail "$name: gpu.sh counts $want parameters, torch_gpt.py's model has $got"; fi
  done
else
  echo "skip: parameter counts against torch_gpt.py (no torch for /usr/bin/python3)"
fi
bench_out=$("$DYNMO" bench --config configs/ref.ini --warmup 1 --steps 2 2>&1) || fail "dynmo bench ref.ini: $bench_out"
rate=$(sed -n 's/^bench: median .*, \([0-9.]*\) tokens\/s, \([0-9.]*\) GFLOP\/s.*/\1/p' <<<"$bench_out")
gflops=$(sed -n 's/^bench: median .*, \([0-9.]*\) tokens\/s, \([0-9.]*\) GFLOP\/s.*/\2/p' <<<"$bench_out")
per_token=$(field flops_per_token <<<"$ref")
if [ -z "$rate" ] || [ -z "$gflops" ]; then
  fail "no tokens/s or GFLOP/s in dynmo bench's output: $bench_out"
elif awk -v r="$rate" -v f="$per_token" -v g="$gflops" 'BEGIN{d = r * f / 1e9; exit !(d > 0.99 * g && d < 1.01 * g)}'; then
  echo "ok: $per_token FLOPs/token x $rate tokens/s = $(awk -v r="$rate" -v f="$per_token" 'BEGIN{printf "%.1f", r * f / 1e9}') GFLOP/s; dynmo bench says $gflops"
else
  fail "$per_token FLOPs/token x $rate tokens/s is not dynmo bench's $gflops GFLOP/s"
fi

# --- a fake H200 -------------------------------------------------------------
cat > "$fake/h200/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-fake)" ;;
  *query-gpu=name*) echo "NVIDIA H200" ;;
  *query-gpu=compute_cap*) echo "9.0" ;;
  *) exit 1 ;;
esac
EOF
# dynmo: on ref.ini 1e6 tokens/s with fp32 products, 1.5e6 with tf32,
# 4e6 with bf16 (a run without train.precision fails: gpu.sh must name
# it); refuses cuda (exit 2) on any other config.
cat > "$fake/dynmo" <<'EOF'
#!/bin/sh
case "$*" in
  *configs/ref.ini*train.device=cuda*train.precision=fp32*) rate=1000000 ;;
  *configs/ref.ini*train.device=cuda*train.precision=tf32*) rate=1500000 ;;
  *configs/ref.ini*train.device=cuda*train.precision=bf16*) rate=4000000 ;;
  *configs/ref.ini*) echo "dynmo: no train.precision given (fake)" >&2; exit 1 ;;
  *) echo "dynmo: error: train.device = cuda: refused (fake)" >&2; exit 2 ;;
esac
echo "bench: median 2.0 ms/step over 10 steps (after 3 warm-up), $rate tokens/s, 44433.4 GFLOP/s, peak RSS 100 MiB (rank 0)"
echo "bench: loss 5.5000 -> 5.0000 on a fixed batch: ok"
EOF
# python: torch sees a GPU; 5e5 tokens/s in fp32, 2e6 with TF32, 8e6 with bf16.
cat > "$fake/python3" <<'EOF'
#!/bin/bash
case "$1" in
  -c) [[ $2 == *version* ]] && echo "0.0-fake CUDA 0.0"; exit 0 ;;
  bench/torch_gpt.py)
    rate=500000; [[ " $* " == *" --tf32 "* ]] && rate=2000000; [[ " $* " == *" --bf16 "* ]] && rate=8000000
    echo "torch 0.0-fake on cuda: $*"; echo "tokens/s $rate; peak RSS 1.0 MiB" ;;
  *) exit 1 ;;
esac
EOF
chmod +x "$fake/h200/nvidia-smi" "$fake/dynmo" "$fake/python3"
: > "$fake/plugin.so"
failures_before=$failures
out=$(env PATH="$fake/h200:$PATH" DYNMO="$fake/dynmo" DYNMO_CUDA_PLUGIN="$fake/plugin.so" \
        PYTHON="$fake/python3" OUT="$fake/out" bench/gpu.sh 2>&1); rc=$?
[ $rc -eq 1 ] || fail "fake H200: exit $rc, want 1 (gpt2-small refused)"
table=$(cat "$fake/out/gpu-bench-table.txt" 2>/dev/null) || fail "fake H200: no \$OUT/gpu-bench-table.txt"
# ref, x 44433408 FLOPs per token: fp32 dynmo 1e6 = 44.43 TFLOP/s, 66.3%
# of 67, torch 5e5 22.22, 33.2%, ratio 2.00; tf32 dynmo 1.5e6 66.65, 13.5%
# of 495, torch 2e6 88.87, 18.0%, 0.75; bf16 dynmo 4e6 177.73, 18.0% of
# 989, torch 8e6 355.47, 35.9%, 0.50. gpt2-small: dynmo refused; torch x
# 854654976: 427.33 (637.8%), 1709.31 (345.3%), 6837.24 (691.3%).
row() { grep -E "^$1 +\| $2 " <<<"$table" | tr -s ' '; }
wants=("ref | fp32 | 1000000 44.43 66.3% | 500000 22.22 33.2% | 2.00"
       "ref | tf32 | 1500000 66.65 13.5% | 2000000 88.87 18.0% | 0.75"
       "ref | bf16 | 4000000 177.73 18.0% | 8000000 355.47 35.9% | 0.50"
       "gpt2-small | fp32 | refused (exit 2) - - | 500000 427.33 637.8% | -"
       "gpt2-small | tf32 | refused (exit 2) - - | 2000000 1709.31 345.3% | -"
       "gpt2-small | bf16 | refused (exit 2) - - | 8000000 6837.24 691.3% | -")
for want in "${wants[@]}"; do
  read -r config _ precision _ <<<"$want"
  [ "$(row "$config" "$precision")" = "$want" ] ||
    fail "fake H200: $config $precision row '$(row "$config" "$precision")', want '$want'"
done
[ "$(grep -cE '^(ref|gpt2-small) ' <<<"$table")" -eq 6 ] || fail "fake H200: not 6 rows: $table"
grep -q 'peaks fp32 67, TF32 495, bf16 989 TFLOP/s' <<<"$table" || fail "fake H200: peaks not in the table's title: $table"
grep -q 'dynmo refused train.device=cuda' <<<"$out" || fail "fake H200: no line saying dynmo refused: $out"
[ "$failures" -eq "$failures_before" ] && echo "ok: fake H200: exit 1, table:" && sed 's/^/    /' <<<"$table"

# No budget left: nothing is started, and the table says so.
out=$(env PATH="$fake/h200:$PATH" DYNMO="$fake/dynmo" DYNMO_CUDA_PLUGIN="$fake/plugin.so" \
        PYTHON="$fake/python3" GPU_BENCH_BUDGET=0 GPU_BENCH_CONFIGS=configs/ref.ini bench/gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$(grep -cE '^ref +\| (fp32|tf32|bf16) +\| not started +- +- \| - ' <<<"$out")" -eq 3 ] &&
   [ "$(grep -c 'not started, GPU_BENCH_BUDGET (0 s) spent' <<<"$out")" -eq 6 ]; then
  echo "ok: GPU_BENCH_BUDGET=0: exit 1, nothing started, six lines say so"
else
  fail "GPU_BENCH_BUDGET=0: exit $rc: $out"
fi

# The real dynmo with a plugin it cannot load: refused, and said so.
out=$(env PATH="$fake/h200:$PATH" DYNMO="$DYNMO" DYNMO_CUDA_PLUGIN="$fake/plugin.so" PYTHON="$fake/none" \
        GPU_BENCH_CONFIGS=configs/ref.ini bench/gpu.sh 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q 'dynmo: error: train.device = cuda: cannot load the CUDA plugin' <<<"$out" &&
   [ "$(grep -cE '^ref +\| (fp32|tf32|bf16) +\| refused \(exit 2\)' <<<"$out")" -eq 3 ] &&
   grep -q 'PyTorch: no python3' <<<"$out"; then
  echo "ok: the real dynmo refusing an unloadable plugin: exit 1, row 'refused (exit 2)', no PyTorch said"
else
  fail "the real dynmo refusing an unloadable plugin: exit $rc: $out"
fi

# --- the PyTorch peer on the CPU ----------------------------------------------
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  if out=$(/usr/bin/python3 bench/torch_gpt.py --device cpu --warmup-steps 1 --steps 2 --layers 2 \
             --channels 64 --heads 2 --seq 64 --max-seq 64 --batch 4 2>&1); then
    echo "ok: torch_gpt.py --device cpu: $(tail -n 1 <<<"$out")"
  else
    fail "torch_gpt.py --device cpu: $out"
  fi
  if out=$(/usr/bin/python3 bench/torch_gpt.py --device cpu --bf16 --warmup-steps 1 --steps 2 \
             --layers 2 --channels 64 --heads 2 --seq 64 --max-seq 64 --batch 4 2>&1) &&
     grep -q 'bf16 autocast' <<<"$out"; then
    echo "ok: torch_gpt.py --device cpu --bf16: $(tail -n 1 <<<"$out")"
  else
    fail "torch_gpt.py --device cpu --bf16: $out"
  fi
else
  echo "skip: torch_gpt.py --device cpu (no torch for /usr/bin/python3)"
fi
finish
