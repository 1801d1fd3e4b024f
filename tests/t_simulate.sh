#!/usr/bin/env bash
# `dynmo simulate` against recorded run logs (tests/data/sim: layer
# freezing on 2 ranks, static uniform and balanced by partition-time every
# 10 steps, a static mixture-of-depths run on 2 ranks, and a static MoE
# run with its experts over 2 ranks on 4 ranks;
# tests/data/sim/README.md says how they were recorded):
# - fed each run's own costs and trajectory (the cost model fitted to the
#   run, and each step's measured costs), the simulated step times are
#   within 5% of the measured ones (median over the steps after the
#   first; 10% for the MoE run's 4 ranks on 2 cores), both with the
#   run's own layouts and with its policy re-simulated, and the
#   simulation ranks static and balanced as the measurement does;
# - the output is one file per policy, kind "simulation", that inspect and
#   report read; two runs write the same bytes of data (deterministic);
# - a deeper model (96 blocks on 32 stages, 1,000 steps) keeps frozen
#   blocks a prefix, and runs in seconds;
# - with 2 replicas, twice the tokens and a step lengthened by the
#   gradient sums;
# - a scenario drives the balancer (frozen blocks cost no backward);
# - bad input (a log without per-block costs, more stages than blocks, a
#   scenario with a missing block, an --out holding other files) is exit 2
#   with one message and leaves no output behind.
# Run from the repository root with $DYNMO set (tests/run.sh).
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
if [ ! -x "$DYNMO" ]; then
  echo "skip: no dynmo binary at $DYNMO"
  exit 77
fi
if ! /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  echo "skip: no python3-h5py"
  exit 77
fi
work=$(mktemp -d /tmp/dynmo-t-simulate.XXXXXX)
trap 'rm -rf "$work"' EXIT
data=${SIM_DATA:-tests/data/sim}

# number NAME REGEX FILE: the first match of REGEX's \K group in FILE.
number() { grep -oP -- "$2" "$3" | head -1; }

# ---- validation against the recorded runs --------------------------------
# Within 5% (median over the steps after the first) with the cost model
# fitted to the run and with the run's measured costs of each step, both
# replaying the run's layouts and re-running its policy.
for way in static balanced; do
  out=$work/$way.out
  if ! "$DYNMO" simulate --from-run $data/freeze-2-$way --validate --policies static-uniform \
      >"$out" 2>&1; then
    fail "validate $way: exit status $? ($(tail -1 "$out"))"; continue
  fi
  grep validation: "$out"
  for costs in measured fitted; do
    for kind in replay policy; do
      if [ $kind = replay ]; then line=$(grep "validation: $costs costs, replay" "$out")
      else line=$(grep "validation: $costs costs" "$out" | tail -1); fi
      err=$(grep -oP 'median error \K[0-9.]+' <<<"$line")
      if [ -z "$err" ] || awk -v e="$err" 'BEGIN { exit !(e > 5) }'; then
        fail "validate $way ($costs costs, $kind): median error ${err:-?}% > 5%"
      else
        echo "ok: validate $way ($costs costs, $kind): median error $err% <= 5%"
      fi
    done
  done
  eval "meas_$way=$(grep -oP 'simulated, \K[0-9.]+(?= measured)' <<<"$line")"
done
# The simulator's ranking of partition-time against static-uniform, from
# each run's costs, against the measured ranking of the two runs (their
# mean steps after the first).
for way in static balanced; do
  speedup=$("$DYNMO" simulate --from-run $data/freeze-2-$way --policies static-uniform,partition-time |
            grep -oP 'best balancer: partition-time, \K[0-9.]+')
  if [ -n "$speedup" ] && [ -n "${meas_static:-}" ] && [ -n "${meas_balanced:-}" ] &&
     awk -v s="$speedup" -v a="$meas_static" -v b="$meas_balanced" 'BEGIN { exit !((s - 1) * (a - b) > 0) }'; then
    echo "ok: ranking from the $way run's costs: partition-time ${speedup}x; measured static $meas_static ms, balanced $meas_balanced ms"
  else
    fail "ranking from the $way run's costs: partition-time ${speedup:-?}x; measured static ${meas_static:-?} ms, balanced ${meas_balanced:-?} ms"
  fi
done

# A recorded mixture-of-depths run (configs/mod.ini, 2 ranks, 60 steps):
# its MoD blocks cost 0.2-4.6 ms, its dense ones about 9 ms a micro-batch
# (forward + backward). Each stage holds 3 of each, so the step time is
# within 5% even without the MoD feature; the per-block fit is not (48%
# without it, 5.0% with it): at most 10%.
# within OUT LABEL LIMIT: OUT's replayed validation, fitted and measured
# costs, each within LIMIT% (median over the steps after the first)
within() {
  local costs err
  for costs in fitted measured; do
    err=$(grep "validation: $costs costs, replay" "$1" | grep -oP 'median error \K[0-9.]+')
    if [ -z "$err" ] || awk -v e="$err" -v l="$3" 'BEGIN { exit !(e > l) }'; then
      fail "$2 ($costs costs): median error ${err:-?}% > $3%"
    else echo "ok: $2 ($costs costs): median error $err% <= $3%"; fi
  done
}

out=$work/mod-recorded.out
if "$DYNMO" simulate --from-run $data/mod-2-static --validate --policies static-uniform >"$out" 2>&1; then
  grep -q "states: mod_tokens$" "$out" || fail "recorded MoD run: the fit does not use mod_tokens"
  per_block=$(grep -oP 'median error \K[0-9.]+(?=% per block)' "$out")
  if [ -n "$per_block" ] && awk -v e="$per_block" 'BEGIN { exit !(e <= 10) }'; then
    echo "ok: recorded MoD run: the fit's median error per block $per_block% <= 10%"
  else fail "recorded MoD run: the fit's median error per block ${per_block:-?}% > 10%"; fi
  within "$out" "recorded MoD run" 5
else fail "recorded MoD run: exit status $? ($(tail -1 "$out"))"; fi

# A recorded MoE run with its experts split over 2 ranks (configs/moe.ini:
# 2 stages x 2 replicas, ep = 2, 4 ranks on 2 cores, 120 steps): the two
# replicas' ranks take turns on each CPU (the log's group_shares, 0.5) and
# each MoE block's micro-batch waits for 5 expert exchange rounds. Within
# 10% (4 shared ranks); without the exchange rounds (--exchange-ms 0) the
# simulated steps are over 20% short.
out=$work/moe-recorded.out
if "$DYNMO" simulate --from-run $data/moe-4-static --validate --policies static-uniform >"$out" 2>&1; then
  grep -q "2 stages x 2 replicas.*its replicas included" "$out" ||
    fail "recorded MoE run: not simulated as 2 replicas sharing the CPUs ($(head -1 "$out"))"
  grep -q "all-to-all over parallel.ep = 2 ranks: 3 + 2 exchange rounds a micro-batch, 0.280 ms" "$out" ||
    fail "recorded MoE run: no exchange rounds at this machine's 0.28 ms ($(grep transfer: "$out"))"
  within "$out" "recorded MoE run, experts over 2 ranks" 10
  "$DYNMO" simulate --from-run $data/moe-4-static --validate --policies static-uniform \
    --exchange-ms 0 >"$out.0" 2>&1
  err=$(grep "validation: fitted costs, replay" "$out.0" | grep -oP 'median error \K[0-9.]+')
  if [ -n "$err" ] && awk -v e="$err" 'BEGIN { exit !(e > 20) }'; then
    echo "ok: recorded MoE run without the exchange rounds: median error $err% > 20%"
  else fail "recorded MoE run without the exchange rounds: median error ${err:-?}% (expected > 20%)"; fi
else fail "recorded MoE run: exit status $? ($(tail -1 "$out"))"; fi

# ---- the fit recovers known costs ---------------------------------------
# A synthetic early-exit log whose block costs are exactly forward
# 1 + 2a + 0.5a^2 ms and backward twice that (a: the block's active share),
# update 0.1 ms, and no embedding or head time: the model line must give
# them back.
mkdir -p "$work/synthetic"
/usr/bin/python3 - $data/freeze-2-static/runlog.h5 "$work/synthetic/runlog.h5" <<'PY'
import sys, h5py, numpy as np
src = h5py.File(sys.argv[1], "r")
config = src.attrs["config"]
config = config.decode() if isinstance(config, bytes) else config
lines = [l for l in config.splitlines() if not l.startswith(("dyn.kind", "model.layers"))]
config = "\n".join(lines + ["dyn.kind = early_exit", "model.layers = 4"]) + "\n"
T, L, S, m = 30, 4, 2, 4
rng = np.random.default_rng(1)
active = rng.uniform(0.05, 1.0, (T, L)).astype(np.float32)
fwd = (1 + 2 * active + 0.5 * active ** 2).astype(np.float32)
bwd, update = 2 * fwd, np.full((T, L), 0.1, np.float32)
busy = np.stack([m * (fwd[:, :2] + bwd[:, :2]).sum(1) + 0.2, m * (fwd[:, 2:] + bwd[:, 2:]).sum(1) + 0.2], 1)
with h5py.File(sys.argv[2], "w") as f:
    f.attrs["kind"] = "runlog"
    f.attrs["config"] = config
    f["/steps/step_ms"] = (busy.max(1) * 1.2).astype(np.float32)
    f["/layers/fwd_ms"], f["/layers/bwd_ms"], f["/layers/update_ms"] = fwd, bwd, update
    f["/layers/active"] = active
    f["/layout/history"] = np.tile(np.array([2, 2], np.int32), (T, 1))
    f["/stages/busy_ms"] = busy.astype(np.float32)
    f["/stages/update_ms"] = np.full((T, S), 0.2, np.float32)
PY
"$DYNMO" simulate --from-run "$work/synthetic" --policies static-uniform >"$work/synthetic.out" 2>&1 ||
  fail "synthetic log: exit $? ($(tail -1 "$work/synthetic.out"))"
want="model: a full block 3.500 + 7.000 ms a micro-batch, 0.100 ms update; embedding 0.000 + 0.000, head 0.000 + 0.000; at 10% of the tokens, 90% sparsity, a quarter of the tiles: 1.205 + 2.410"
if grep -qxF "$want" "$work/synthetic.out"; then echo "ok: the fit recovers known costs"
else fail "the fit: $(grep model: "$work/synthetic.out"), want: $want"; fi

# ---- MoD and MoE states: the fit recovers known dependences --------------
# Synthetic logs of 4 blocks (batch 8 x seq 64 = 512 tokens a step):
# - MoD (model.mod_every = 2: blocks 1 and 3): each MoD block processes a
#   random share m of the step's tokens (/mod/tokens = 512 m), dense blocks
#   all; forward 1 + 2m + 0.5m^2 ms (dense blocks: m = 1), backward twice;
# - MoE (every block, 8 experts over parallel.ep = 2 ranks: experts 0-3 and
#   4-7): random routed and dropped pairs per expert; the busiest rank's
#   kept pairs over routed / 2 is the load g; forward 1 + 2g ms, backward
#   twice. A fit that ignored the dropped pairs or the expert-to-rank map
#   would not give these lines back.
/usr/bin/python3 - $data/freeze-2-static/runlog.h5 "$work" <<'PY'
import os, sys, h5py, numpy as np
src = h5py.File(sys.argv[1], "r")
config = src.attrs["config"]
config = config.decode() if isinstance(config, bytes) else config
base = [l for l in config.splitlines() if not l.startswith(("dyn.", "model.layers", "parallel."))]
T, L, S, m = 30, 4, 2, 4
rng = np.random.default_rng(2)
def write(name, extra, fwd, datasets):
    os.makedirs(sys.argv[2] + "/" + name)
    bwd, update = 2 * fwd, np.full((T, L), 0.1, np.float32)
    busy = np.stack([m * (fwd[:, :2] + bwd[:, :2]).sum(1), m * (fwd[:, 2:] + bwd[:, 2:]).sum(1)], 1)
    with h5py.File(sys.argv[2] + "/" + name + "/runlog.h5", "w") as f:
        f.attrs["kind"] = "runlog"
        f.attrs["config"] = "\n".join(base + ["model.layers = 4", "parallel.pp = 2"] + extra) + "\n"
        f["/steps/step_ms"] = (busy.max(1) * 1.2).astype(np.float32)
        f["/layers/fwd_ms"], f["/layers/bwd_ms"] = fwd.astype(np.float32), bwd.astype(np.float32)
        f["/layers/update_ms"] = update
        f["/layout/history"] = np.tile(np.array([2, 2], np.int32), (T, 1))
        f["/stages/busy_ms"] = busy.astype(np.float32)
        f["/stages/update_ms"] = np.full((T, S), 0.0, np.float32)
        for k, v in datasets.items(): f[k] = v
share = rng.uniform(0.05, 1.0, (T, 2))
mshare = np.ones((T, L)); mshare[:, 1::2] = share
write("mod", ["model.mod_every = 2", "model.mod_capacity = 0.125", "mod.routing = causal"],
      1 + 2 * mshare + 0.5 * mshare ** 2, {"/mod/tokens": (512 * share).astype(np.float32)})
E = 8
routed = rng.integers(50, 400, (T, L * E)).astype(np.int32)
dropped = (routed * rng.uniform(0, 0.3, (T, L * E))).astype(np.int32)
kept = (routed - dropped).reshape(T, L, 2, E // 2).sum(3)
load = kept.max(2) * 2 / routed.reshape(T, L, E).sum(2)
write("moe", ["model.moe_every = 1", "model.experts = 8", "model.top_k = 2", "parallel.dp = 2",
              "parallel.ep = 2"], 1 + 2 * load, {"/moe/tokens": routed, "/moe/dropped": dropped})
PY
for scheme in mod moe; do
  "$DYNMO" simulate --from-run "$work/$scheme" --policies static-uniform >"$work/$scheme.out" 2>&1 ||
    fail "synthetic $scheme log: exit $? ($(tail -1 "$work/$scheme.out"))"
done
want="model: a full block 3.500 + 7.000 ms a micro-batch, 0.100 ms update; embedding 0.000 + 0.000, head 0.000 + 0.000; at 10% of the tokens, 90% sparsity, a quarter of the tiles: 1.205 + 2.410"
if grep -qxF "$want" "$work/mod.out" && grep -q "states: mod_tokens$" "$work/mod.out"; then
  echo "ok: the fit recovers MoD's dependence on tokens processed"
else fail "MoD fit: $(grep -E 'model:|states' "$work/mod.out"), want: $want"; fi
want="model: a full block 3.000 + 6.000 ms a micro-batch, 0.100 ms update; embedding 0.000 + 0.000, head 0.000 + 0.000; at 10% of the tokens, 90% sparsity, a quarter of the tiles, the busiest expert rank 1.5x the mean: 4.000 + 8.000"
if grep -qxF "$want" "$work/moe.out" && grep -q "states: moe_load$" "$work/moe.out"; then
  echo "ok: the fit recovers MoE's dependence on the busiest expert rank"
else fail "MoE fit: $(grep -E 'model:|states' "$work/moe.out"), want: $want"; fi
# Mapped onto 8 blocks, MoD blocks stay every second one (1, 3, 5, 7).
"$DYNMO" simulate --from-run "$work/mod" --blocks 8 --policies static-uniform --out "$work/mod8" \
  >"$work/mod8.out" 2>&1 || fail "MoD on 8 blocks: exit $? ($(tail -1 "$work/mod8.out"))"
/usr/bin/python3 - "$work/mod8/static-uniform.h5" <<'PY' || fail "MoD on 8 blocks: the pattern"
import sys, h5py, numpy as np
share = h5py.File(sys.argv[1], "r")["/layers/mod_tokens_share"][:]
assert share.shape == (30, 8), share.shape
assert np.all(share[:, 0::2] == 1) and np.all(share[:, 1::2] < 1), share[:3]
print("ok: MoD on 8 blocks: blocks 1, 3, 5, 7 process %.2f-%.2f of the tokens, the others all"
      % (share[:, 1::2].min(), share[:, 1::2].max()))
PY

# ---- output: files of kind simulation, deterministic ----------------------
for k in 1 2 2; do   # sim2 twice: over an earlier simulation's directory
  "$DYNMO" simulate --from-run $data/freeze-2-balanced --out "$work/sim$k" >"$work/sim$k.out" 2>&1 ||
    fail "simulate --out: exit $? ($(tail -1 "$work/sim$k.out"))"
done
for policy in static-uniform static-params partition-time partition-params diffusion-time \
              diffusion-params repack; do
  [ -f "$work/sim1/$policy.h5" ] || fail "no $policy.h5 in the output"
done
if cmp -s "$work/sim1/summary.txt" "$work/sim2/summary.txt" &&
   /usr/bin/python3 - "$work/sim1" "$work/sim2" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(d + "/partition-time.h5", "r") for d in sys.argv[1:3])
for name in ["/steps/step_ms", "/layout/history", "/stages/busy_ms", "/balance/decisions"]:
    if not np.array_equal(a[name][:], b[name][:], equal_nan=True): sys.exit(name + " differs")
PY
then echo "ok: two simulations are identical"; else fail "two simulations differ"; fi
"$DYNMO" inspect --json "$work/sim1/partition-time.h5" >"$work/inspect.json" 2>&1 &&
  grep -q '"kind": "simulation"' "$work/inspect.json" && echo "ok: inspect reads a simulation" ||
  fail "inspect: $(head -3 "$work/inspect.json")"
"$DYNMO" report "$work/sim1/static-uniform.h5" "$work/sim1/partition-time.h5" --out "$work/report" \
  >"$work/report.out" 2>&1 && [ -f "$work/report/index.html" ] &&
  echo "ok: report reads simulations" || fail "report: $(tail -2 "$work/report.out")"

# ---- a deeper model: frozen blocks stay a prefix; seconds -----------------
start=$(date +%s.%N)
"$DYNMO" simulate --from-run $data/freeze-2-balanced --blocks 96 --stages 32 --steps 1000 \
  --out "$work/deep" >"$work/deep.out" 2>&1 || fail "96 blocks on 32 stages: exit $?"
secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "96 blocks, 32 stages, 1,000 steps, 7 policies: $secs s (load $(cut -d' ' -f1 /proc/loadavg))"
awk -v s="$secs" 'BEGIN { exit !(s > 120) }' && fail "96 x 32 x 1000 took $secs s (> 120)"
/usr/bin/python3 - "$work/deep/partition-time.h5" $data/freeze-2-balanced/runlog.h5 <<'PY' ||
import sys, h5py, numpy as np
sim, run = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
frozen = sim["/layers/frozen"][:]
assert frozen.shape == (1000, 96), frozen.shape
for row in frozen:   # a prefix: never a frozen block after a training one
    assert not np.any(np.diff(row) > 0), row
measured = (run["/layers/update_ms"][-1] == 0).mean()
assert abs(frozen[-1].mean() - measured) <= 1.5 / 32, (frozen[-1].mean(), measured)
assert np.all(sim["/layers/bwd_ms"][:][frozen == 1] == 0)
assert set(np.unique(sim["/steps/ranks"][:])) <= set(range(1, 33))
print("ok: 96 blocks: frozen prefix, last step %.3f frozen (run: %.3f)" % (frozen[-1].mean(), measured))
PY
  fail "96 blocks: the frozen trajectory"

# ---- data parallelism: twice the tokens, a step no shorter (gradient sums) --
for d in 1 2; do
  "$DYNMO" simulate --from-run $data/freeze-2-static --policies static-uniform --stages 4 \
    --replicas $d | awk '$1 == "static-uniform" { print $2, $3 }' >"$work/dp$d"
done
if awk 'NR == FNR { ms = $1; tok = $2; next } { exit !($1 > ms && $2 / tok > 1.9 && $2 / tok <= 2) }' \
    "$work/dp1" "$work/dp2"; then
  echo "ok: 2 replicas: $(cat "$work/dp2") against $(cat "$work/dp1") (ms/step, tokens/s)"
else
  fail "2 replicas: $(cat "$work/dp2") against $(cat "$work/dp1") (ms/step, tokens/s)"
fi

# ---- a scenario ----------------------------------------------------------
{ echo "step,block,frozen"
  for b in $(seq 0 7); do echo "1,$b,0"; done
  for b in $(seq 0 7); do echo "20,$b,$([ $b -lt 5 ] && echo 1 || echo 0)"; done
} >"$work/scenario.csv"
"$DYNMO" simulate --from-run $data/freeze-2-balanced --scenario "$work/scenario.csv" --stages 2 \
  --steps 60 --policies static-uniform,partition-time --out "$work/scen" >"$work/scen.out" 2>&1 ||
  fail "scenario: exit $? ($(tail -1 "$work/scen.out"))"
/usr/bin/python3 - "$work/scen" <<'PY' || fail "scenario: the balancer's answer"
import sys, h5py
static = h5py.File(sys.argv[1] + "/static-uniform.h5", "r")
balanced = h5py.File(sys.argv[1] + "/partition-time.h5", "r")
assert list(static["/layout/history"][-1]) == [4, 4]
# blocks 0-4 frozen from step 20: stage 0 gets cheaper, so it takes blocks
last = list(balanced["/layout/history"][-1])
assert last[0] > 4, last
assert balanced["/steps/step_ms"][-1] < static["/steps/step_ms"][-1]
print("ok: scenario: the balancer moves to", last)
PY

# ---- bad input ------------------------------------------------------------
cp -r $data/freeze-2-static "$work/nocost"
/usr/bin/python3 -c "
import h5py, sys
with h5py.File(sys.argv[1], 'a') as f: del f['/layers/fwd_ms']" "$work/nocost/runlog.h5"
expect_error "a log without per-block costs" "has no /layers/fwd_ms" \
  "$DYNMO" simulate --from-run "$work/nocost" --out "$work/bad1"
expect_error "stages over blocks" "--stages 40 is more than the 32 blocks" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --stages 40 --out "$work/bad2"
grep -v '^20,3,' "$work/scenario.csv" >"$work/missing.csv"
expect_error "a scenario with a missing block" "step 20 has no row for block 3" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --scenario "$work/missing.csv" --out "$work/bad3"
expect_error "a scenario state the run cannot price" "sets active, but .* has no active" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --scenario <(printf 'step,block,active\n1,0,0.5\n1,1,1\n') \
  --stages 1 --out "$work/bad4"
expect_error "a scenario MoD share over 1" "mod_tokens '1.5' is not a number in \[0, 1\]" \
  "$DYNMO" simulate --from-run "$work/mod" --scenario <(printf 'step,block,mod_tokens\n1,0,1\n1,1,1.5\n') \
  --stages 1 --out "$work/bad6"
expect_error "a negative scenario MoE load" "moe_load '-0.5' is not a number in \[0, 1024\]" \
  "$DYNMO" simulate --from-run "$work/moe" --scenario <(printf 'step,block,moe_load\n1,0,-0.5\n1,1,1\n') \
  --stages 1 --out "$work/bad7"
expect_error "a scenario MoD share the run cannot price" "sets mod_tokens, but .* has no mod_tokens" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --scenario <(printf 'step,block,mod_tokens\n1,0,0.5\n1,1,1\n') \
  --stages 1 --out "$work/bad8"
expect_error "a scenario MoE load the run cannot price" "sets moe_load, but .* has no moe_load" \
  "$DYNMO" simulate --from-run "$work/mod" --scenario <(printf 'step,block,moe_load\n1,0,1.2\n1,1,1\n') \
  --stages 1 --out "$work/bad9"
mkdir "$work/taken" && echo keep >"$work/taken/notes.txt"
expect_error "an --out holding other files" "holds notes.txt" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --out "$work/taken"
# Never onto its own input: the run directory keeps its run log.
cp -r $data/freeze-2-static "$work/run"
before=$(md5sum "$work/run/runlog.h5")
expect_error "--out the run it reads" "--out $work/run holds the input $work/run" \
  "$DYNMO" simulate --from-run "$work/run" --out "$work/run"
expect_error "--out a parent of the run it reads" "--out $work holds the input" \
  "$DYNMO" simulate --from-run "$work/run" --out "$work"
[ "$(md5sum "$work/run/runlog.h5")" = "$before" ] || fail "simulate --out its input changed the run log"
# An h5 file of the user's named like a policy's is not simulate's to replace.
mkdir "$work/mine" && echo keep >"$work/mine/repack.h5"
expect_error "an --out holding a file named like a policy's" "holds repack.h5, which dynmo simulate did not write" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --out "$work/mine"
[ "$(cat "$work/mine/repack.h5")" = keep ] || fail "simulate replaced the user's repack.h5"
expect_error "too many block-steps" "1000000 steps x 100 blocks is too large to simulate" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --steps 1000000 --blocks 100 --out "$work/bad5"
expect_error "--policies ''" "--policies '' names no policy" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --policies ''
# A re-pack decided at the last step restarts nothing (the job ends there),
# and without a static policy there is no speedup to print (it was nanx).
out=$("$DYNMO" simulate --from-run $data/freeze-2-balanced --policies repack,partition-time \
      --repack-every 5 --epsilon 0.9 --steps 5 2>&1) || fail "repack at the last step: exit $?"
rows=$(grep -E '^(repack|partition-time) ' <<<"$out" | awk '{print $2, $7}' | sort -u | wc -l)
if [ "$rows" -eq 1 ] && grep -q "no re-pack decision before the last step" <<<"$out" &&
   ! grep -qi nan <<<"$out"; then
  echo "ok: a re-pack at the last step charges no restart; no static policy prints no nan"
else fail "repack at the last step or no static policy: $out"; fi
expect_error "an unknown policy" "'fastest' is not a policy" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --policies fastest
for k in 1 2 3 4 5 6 7 8 9; do [ -e "$work/bad$k" ] && fail "bad input $k left $work/bad$k"; done
[ "$(cat "$work/taken/notes.txt")" = keep ] && [ "$(ls "$work/taken")" = notes.txt ] ||
  fail "the refused --out was changed"
# --schedule zb: the controller and the predictor run ZB-H1's lists (weight
# gradients half of each backward); the same layout predicts a shorter step
# than under 1F1B.
step_under() {
  "$DYNMO" simulate --from-run $data/freeze-2-static --policies static-uniform "$@" |
    awk '$1 == "static-uniform" { print $2 }'
}
one=$(step_under); zb=$(step_under --schedule zb)
"$DYNMO" simulate --from-run $data/freeze-2-static --policies static-uniform --schedule zb |
  grep -q "m = 4, zb," || fail "--schedule zb: the header does not name zb"
awk -v a="$zb" -v b="$one" 'BEGIN { exit !(a > 0 && a < b) }' &&
  echo "ok: --schedule zb: static-uniform $zb ms/step, 1f1b $one" ||
  fail "--schedule zb: static-uniform ${zb:-?} ms/step, not below 1f1b's ${one:-?}"
leftovers=$(ls -a "$work" | grep -c '\.tmp-')
[ "$leftovers" -eq 0 ] && echo "ok: nothing half-written left behind" ||
  fail "$leftovers temporary directories left in $work"
finish
