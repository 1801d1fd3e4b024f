#!/usr/bin/env bash
# `dynmo simulate` on a run of balance.units = sublayer (docs/simulate.md,
# "Units of placement"): a 6-block model trained on 2 ranks with units is
# simulated with 12 units, each priced by its own fit to the run's
# measured unit costs (/units/fwd_ms, /units/bwd_ms, /units/update_ms):
# - the run's own layouts (in units) replay under --validate;
# - the units' costs come from the log: a copy of the run whose attention
#   units cost exactly 3 times its MLP units forward (the block sums kept)
#   gives attention 75% of the forward and unit costs equal to the logged
#   ones, where the FLOPs share of the same shape is another figure; the
#   same run of whole blocks with --split-blocks keeps the FLOPs share;
#   `dynmo report` reads the simulation's output (its config counts each
#   unit as a block);
# - bad input (a sublayer log without /units/bwd_ms or with a negative
#   unit time, --attention-share on
#   a sublayer run, --validate --split-blocks on a run of whole blocks)
#   exits 2 with one message.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
need_dynmo
need_h5py
work_dir
tiny_config "$dir/tiny.ini" train.steps=10
train sub 2 "$dir/tiny.ini" balance.units=sublayer parallel.pp=2 || finish
train whole 2 "$dir/tiny.ini" parallel.pp=2 || finish

# ---- the run itself, with units ------------------------------------------
out=$dir/sub.sim
if "$DYNMO" simulate --from-run "$dir/sub" --validate --policies static-uniform >"$out" 2>&1; then
  grep -q "^simulate: 6 blocks (12 units), 2 stages" "$out" && echo "ok: 6 blocks simulated as 12 units" ||
    fail "the sublayer run is not simulated as 12 units: $(head -1 "$out")"
  grep -q "as the run measured them (balance.units = sublayer)" "$out" ||
    fail "the units are not priced from the run's measurements: $(grep 'units of placement' "$out")"
  # The step times of so small a run are mostly the waits of a shared
  # machine: the error is printed, the replay of the unit layouts checked.
  line=$(grep "validation: measured costs, replay" "$out")
  grep -q "the run's layout at 10 of 10 steps" <<<"$line" &&
    echo "ok: the run's unit layouts replayed ($line)" || fail "replay: not the run's unit layouts: $line"
else fail "simulate of the sublayer run: exit status $? ($(tail -1 "$out"))"; fi

# ---- the units' costs come from the log ----------------------------------
cp -r "$dir/sub" "$dir/three"
/usr/bin/python3 - "$dir/three/runlog.h5" <<'PY' || fail "could not rewrite the unit costs"
import h5py, numpy, sys
with h5py.File(sys.argv[1], "a") as f:
    for d in ("fwd_ms", "bwd_ms", "update_ms"):
        units = f["/units/" + d][...]
        block = units[:, 0::2] + units[:, 1::2]
        # attention 3/4 of each block forward, 1/4 backward; MLP the rest
        share = {"fwd_ms": 0.75, "bwd_ms": 0.25, "update_ms": 0.5}[d]
        units[:, 0::2] = share * block
        units[:, 1::2] = (1 - share) * block
        f["/units/" + d][...] = units.astype(numpy.float32)
PY
out=$dir/three.sim
if "$DYNMO" simulate --from-run "$dir/three" --policies static-uniform --out "$dir/three-out" >"$out" 2>&1; then
  line=$(grep "units of placement" "$out")
  measured=$(grep -oP 'attention \K[0-9]+(?=% of the forward)' <<<"$line")
  flops=$(grep -oP 'its FLOPs share \K[0-9]+' <<<"$line")
  [ "$measured" = 75 ] && [ -n "$flops" ] && [ "$flops" != 75 ] &&
    echo "ok: attention $measured% of the forward as logged (the FLOPs share $flops%)" ||
    fail "attention ${measured:-?}% of the forward, FLOPs share ${flops:-?}%: not the logged 75% ($line)"
  /usr/bin/python3 - "$dir/three/runlog.h5" "$dir/three-out/static-uniform.h5" <<'PY' ||
import h5py, numpy, sys
run, sim = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
for d in ("fwd_ms", "bwd_ms"):
    logged = run["/units/" + d][1:]
    simulated = sim["/layers/" + d][...]
    assert simulated.shape[1] == 12, simulated.shape
    # constant states: each half's fit is the mean of its logged costs
    # after the first step, then again without those more than 4 median
    # absolute residuals off (docs/simulate.md, "The cost model")
    for h in (0, 1):
        y = logged[:, h::2].astype(numpy.float64).ravel()
        first = y.mean()
        limit = 4 * numpy.median(numpy.abs(y - first)) + 1e-6
        want = y[numpy.abs(y - first) <= limit].mean()
        got = simulated[:, h::2]
        print("  %s %s: simulated %.5f-%.5f ms, the logged units' fit %.5f" %
              (d, "attention" if h == 0 else "MLP", got.min(), got.max(), want))
        assert numpy.all(numpy.abs(got - want) <= 1e-4 * want), (d, h, got, want)
    ratio = simulated[:, 0::2].sum() / simulated.sum()
    assert abs(ratio - (0.75 if d == "fwd_ms" else 0.25)) < 0.02, (d, ratio)
print("ok: the simulated units' costs are the logged ones, not a FLOPs share")
PY
  fail "the simulated unit costs are not the logged ones"
  "$DYNMO" report "$dir/three-out/static-uniform.h5" --out "$dir/report" >"$dir/report.out" 2>&1 &&
    echo "ok: dynmo report reads the simulation of the sublayer run" ||
    fail "dynmo report of the sublayer run's simulation: $(tail -1 "$dir/report.out")"
else fail "simulate of the rewritten sublayer run: exit status $? ($(tail -1 "$out"))"; fi

# A run of whole blocks keeps the FLOPs share under --split-blocks.
out=$dir/whole.sim
if "$DYNMO" simulate --from-run "$dir/whole" --split-blocks --policies static-uniform >"$out" 2>&1; then
  grep -q "^simulate: 6 blocks (12 units)" "$out" &&
    grep -q "units of placement: the attention and the MLP of each block (attention $flops% of its time)" "$out" &&
    echo "ok: whole blocks with --split-blocks: the FLOPs share ($flops%)" ||
    fail "whole blocks with --split-blocks: $(grep 'units of placement' "$out")"
else fail "--split-blocks on whole blocks: exit status $? ($(tail -1 "$out"))"; fi

# ---- bad input ------------------------------------------------------------
cp -r "$dir/sub" "$dir/nounits"
/usr/bin/python3 -c "
import h5py, sys
with h5py.File(sys.argv[1], 'a') as f: del f['/units/bwd_ms']" "$dir/nounits/runlog.h5"
expect_error "a sublayer log without its units' costs" "sublayer without /units/bwd_ms" \
  "$DYNMO" simulate --from-run "$dir/nounits"
cp -r "$dir/sub" "$dir/negative"
/usr/bin/python3 -c "
import h5py, sys
with h5py.File(sys.argv[1], 'a') as f:
    d = f['/units/fwd_ms']; v = d[...]; v[3, 5] = -1; d[...] = v" "$dir/negative/runlog.h5"
expect_error "a negative unit time" "unit 5 at step 4 has forward -1" \
  "$DYNMO" simulate --from-run "$dir/negative"
expect_error "--attention-share on a sublayer run" "--attention-share: .* units' costs are measured" \
  "$DYNMO" simulate --from-run "$dir/sub" --split-blocks --attention-share 0.5
expect_error "--validate --split-blocks on whole blocks" "--validate with --split-blocks" \
  "$DYNMO" simulate --from-run "$dir/whole" --validate --split-blocks
finish
