#!/bin/bash
# `dynmo simulate --hardware` and `dynmo calibrate` end to end
# (docs/simulate.md, "The hardware model"): calibrate (--quick, 2 ranks)
# writes a hardware file that simulate reads; every shipped file prices
# the reference config; the predictions scale as the op model must (a
# deeper model costs more by its blocks, the faster GPU predicts the
# shorter step); a run's states drive the config's shape; and the bad
# inputs exit 2 with one message naming the problem. No check depends on
# a measured time.
cd "$(dirname "$0")/.." || exit 1
source tests/lib.sh
need_dynmo
work_dir

step_of() {   # the ms of the 'predicted step:' line of stdin
  sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p'
}

# calibrate writes a file simulate reads
if mpiexec -n 2 "$DYNMO" calibrate --out "$dir/cpu.ini" --quick > "$dir/calibrate.out" 2>&1; then
  echo "ok: calibrate --quick wrote $(grep -c '^point' "$dir/cpu.ini") GEMM and attention points"
  # the measured extras: each product's backward, attention and hash attention by direction,
  # GELU's, the layernorm's and AdamW's bandwidths
  for key in backward_point hash_point gelu_gbs layernorm_gbs adamw_gbs; do
    grep -q "^$key = " "$dir/cpu.ini" || fail "calibrate wrote no $key"
  done
  sed -n '/^\[attention\]/,/^\[/p' "$dir/cpu.ini" | grep -Eq '^point = [0-9]+ [0-9]+ [0-9.e+-]+ [0-9.e+-]+$' \
    || fail "calibrate wrote no [attention] point (T head_size forward backward)"
  out=$("$DYNMO" simulate --hardware "$dir/cpu.ini" --config configs/ref.ini --stages 1 \
        --policies static-uniform 2>&1) || fail "simulate on the calibrated file: $out"
  ms=$(step_of <<<"$out")
  awk -v v="$ms" 'BEGIN { exit !(v > 0) }' && echo "ok: predicted step on this machine: $ms ms" \
    || fail "no positive 'predicted step' on the calibrated file: $out"
else
  fail "calibrate --quick: $(tail -5 "$dir/calibrate.out")"
fi
# rank 1 measuring beside rank 0 (one thread each, as two ranks on two cores)
if mpiexec -n 2 "$DYNMO" calibrate --out "$dir/peer.ini" --quick --threads 1 --busy-peer \
     > "$dir/peer.out" 2>&1 \
   && grep -q '^name = .*1 threads, beside a busy peer' "$dir/peer.ini" \
   && "$DYNMO" simulate --hardware "$dir/peer.ini" --config configs/ref.ini --stages 1 \
        --policies static-uniform | grep -q "^predicted step"; then
  echo "ok: calibrate --busy-peer writes a file simulate reads"
else
  fail "calibrate --busy-peer: $(tail -3 "$dir/peer.out")"
fi
# the device path (device buffers, copies, synchronize) on the emulated device
if mpiexec -n 2 "$DYNMO" calibrate --out "$dir/emulate.ini" --quick train.device=emulate \
     > "$dir/emulate.out" 2>&1 \
   && "$DYNMO" simulate --hardware "$dir/emulate.ini" --config configs/ref.ini --stages 1 \
        --policies static-uniform | grep -q "^predicted step"; then
  echo "ok: calibrate on the emulated device writes a file simulate reads"
else
  fail "calibrate train.device=emulate: $(tail -3 "$dir/emulate.out")"
fi
expect_error "calibrate on one rank" "mpiexec -n 2" "$DYNMO" calibrate --out "$dir/one.ini" --quick
expect_error "calibrate without --out" "--out HW.ini is required" \
  mpiexec -n 2 "$DYNMO" calibrate --quick

# every shipped file prices the reference config; the H100 beats the A100
declare -A step
for hw in h100-sxm h200 a100; do
  out=$("$DYNMO" simulate --hardware hardware/$hw.ini --config configs/ref.ini --stages 1 \
        --policies static-uniform 2>&1) || { fail "$hw: $out"; continue; }
  step[$hw]=$(step_of <<<"$out")
  echo "ok: $hw: predicted step ${step[$hw]} ms"
done
awk -v h="${step[h100-sxm]}" -v a="${step[a100]}" 'BEGIN { exit !(h > 0 && h < a) }' \
  && echo "ok: the H100's step is shorter than the A100's" \
  || fail "H100 ${step[h100-sxm]} ms is not below A100 ${step[a100]} ms"

# twice the blocks: the blocks' time doubles, the embedding and head do not
# (2 x step(L) - step(2L) is the extras: more than 0, less than step(L))
one=$("$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/ref.ini \
      model.layers=8 --stages 1 --policies static-uniform | step_of)
two=$("$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/ref.ini \
      model.layers=16 --stages 1 --policies static-uniform | step_of)
awk -v a="$one" -v b="$two" 'BEGIN { e = 2 * a - b; exit !(e > 0 && e < a) }' \
  && echo "ok: 8 blocks $one ms, 16 blocks $two ms" \
  || fail "8 blocks $one ms, 16 blocks $two ms: not the blocks' time doubled"

# pipeline stages of the paper's shape on the H100, through every policy
out=$("$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/ref.ini \
      model.layers=24 model.channels=1024 model.heads=16 train.seq=1024 model.max_seq=1024 \
      train.batch=32 train.micro_batches=32 parallel.pp=8 --steps 20 2>&1) \
  || fail "8 stages on the H100: $out"
grep -q "^partition-time" <<<"$out" && grep -q "^predicted step" <<<"$out" \
  && echo "ok: 8 stages on the H100: $(grep '^predicted step' <<<"$out")" \
  || fail "8 stages on the H100: $out"

# a run's trajectory of states drives the config's shape
out=$("$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/freeze.ini \
      model.layers=48 parallel.pp=4 train.batch=16 train.micro_batches=16 \
      --from-run tests/data/sim/freeze-2-static --steps 40 2>&1) || fail "--from-run: $out"
grep -q "the run's states, mapped by relative depth" <<<"$out" && grep -q "^repack" <<<"$out" \
  && echo "ok: --from-run with --hardware" \
  || fail "--from-run with --hardware: $out"

# a state whose scheme the config does not run is neutral: the MoE run's
# expert loads leave the dense reference model's step as it is
alone=$("$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/ref.ini --stages 1 \
        --policies static-uniform | step_of)
driven=$("$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/ref.ini --stages 1 \
         --policies static-uniform --from-run tests/data/sim/moe-4-static | step_of)
[ -n "$alone" ] && [ "$alone" = "$driven" ] \
  && echo "ok: an MoE run's states leave a dense config at $alone ms" \
  || fail "an MoE run's states changed a dense config: $alone ms alone, $driven ms driven"

# bad input
sed '/^memory_gb/d' hardware/h100-sxm.ini > "$dir/missing.ini"
expect_error "a missing figure" "\\[device\\] memory_gb is missing" \
  "$DYNMO" simulate --hardware "$dir/missing.ini" --config configs/ref.ini
sed 's/^bandwidth_gbs = 2700/bandwidth_gbs = 27000/' hardware/h100-sxm.ini > "$dir/absurd.ini"
expect_error "achieved above peak" "bandwidth_gbs = 27000 is above peak_bandwidth_gbs" \
  "$DYNMO" simulate --hardware "$dir/absurd.ini" --config configs/ref.ini
sed 's/^peak_tflops = 989/peak_tflops = -989/' hardware/h100-sxm.ini > "$dir/negative.ini"
expect_error "a negative rate" "peak_tflops = -989 is out of range" \
  "$DYNMO" simulate --hardware "$dir/negative.ini" --config configs/ref.ini
expect_error "--hardware with --validate" "--hardware with --validate" \
  "$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/ref.ini --validate
expect_error "--hardware without --config" "--hardware needs --config" \
  "$DYNMO" simulate --hardware hardware/h100-sxm.ini
expect_error "--config without --hardware" "go with --hardware" \
  "$DYNMO" simulate --from-run tests/data/sim/freeze-2-static --config configs/ref.ini
expect_error "a shape too large for the memory" \
  "stage 0 of 1 needs [0-9.]+ GB .*more than the 80 GB of H100" \
  "$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/ref.ini \
  model.layers=48 model.channels=8192 model.heads=64 train.seq=2048 model.max_seq=2048 --stages 1
expect_error "a bad override" "model.channels" \
  "$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/ref.ini model.channels=x
expect_error "no hardware file" "cannot read hardware file" \
  "$DYNMO" simulate --hardware "$dir/none.ini" --config configs/ref.ini
finish
