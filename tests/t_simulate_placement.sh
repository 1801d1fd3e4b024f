#!/usr/bin/env bash
# `dynmo simulate --placement balanced [--replicas-max R] [--ep N]`
# (docs/simulate.md, "Expert placement"): the recorded MoE run of
# tests/data/sim (configs/moe.ini, 8 experts, top-2, its routing skewed:
# the busiest of 2 expert ranks 1.04-1.96x the mean) has its per-expert
# counts placed by the trainer's placement planner on the simulated
# expert-parallel ranks:
# - on 2 and on 4 ranks, the predicted step with placement balanced is
#   shorter than with static, and with copies no longer than without;
# - each MoE block's busiest-rank load at each step (the output's
#   /layers/moe_load) is the least busiest rank over every placement of
#   that step's counts, found here by brute force, and the static one the
#   rank sums of experts e / (E / ep); with 2 copies no block-step's load
#   is above its load without them, and the mean is lower;
# - on a hardware file the config's moe.placement = balanced prices a
#   shorter step than static;
# - bad input (an ep that does not divide the experts, balanced with
#   ep = 1, copies without balanced or beyond E - E / ep, a run without
#   MoE blocks, a run whose busiest rank never varied (ep = 1),
#   --validate with a placement, --placement with --hardware, an unknown
#   placement, an ep the replicas do not fill): each exits 2 with one
#   message.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
need_h5py
need_dynmo
work_dir
data=${SIM_DATA:-tests/data/sim}
run=$data/moe-4-static

# step_of ARGS...: the static-uniform ms/step of the run simulated with ARGS.
step_of() {
  "$DYNMO" simulate --from-run $run --policies static-uniform "$@" 2>&1 |
    awk '$1 == "static-uniform" { print $2 }'
}
for ep in 2 4; do
  shape=(--ep $ep --replicas $ep)
  static=$(step_of "${shape[@]}" --placement static)
  balanced=$(step_of "${shape[@]}" --placement balanced)
  copies=$(step_of "${shape[@]}" --placement balanced --replicas-max 2)
  echo "ep = $ep: static $static, balanced $balanced, balanced + 2 copies $copies ms/step"
  awk -v s="$static" -v b="$balanced" -v c="$copies" \
    'BEGIN { exit !(s > 0 && b > 0 && c > 0 && b < s && c <= b) }' &&
    echo "ok: ep = $ep: balanced is cheaper than static, copies no dearer" ||
    fail "ep = $ep: static ${static:-?}, balanced ${balanced:-?}, copies ${copies:-?} ms/step"
done

# On a hardware file the config's parallel.ep and moe.placement place the
# run's counts the same way.
hw() {
  "$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/moe.ini --from-run $run \
    parallel.dp=4 parallel.ep=4 train.batch=16 "$@" --policies static-uniform 2>&1 |
    grep -oP 'predicted step: \K[0-9.]+'
}
static=$(hw moe.placement=static); balanced=$(hw moe.placement=balanced)
awk -v s="$static" -v b="$balanced" 'BEGIN { exit !(s > 0 && b > 0 && b < s) }' &&
  echo "ok: --hardware, ep = 4: balanced $balanced ms, static $static ms" ||
  fail "--hardware, ep = 4: balanced ${balanced:-?} ms, static ${static:-?} ms"

# The loads the simulation priced, against brute force on the counts.
for placement in static balanced; do
  "$DYNMO" simulate --from-run $run --policies static-uniform --ep 4 --replicas 4 \
    --placement $placement --out "$dir/$placement" >"$dir/$placement.out" 2>&1 ||
    { fail "--placement $placement --out: exit $? ($(tail -1 "$dir/$placement.out"))"; continue; }
  grep "^experts:" "$dir/$placement.out"
  /usr/bin/python3 - $run/runlog.h5 "$dir/$placement/static-uniform.h5" $placement <<'PY' ||
import h5py, numpy, sys
log, sim, placement = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), sys.argv[3]
E, ep = 8, 4
per = E // ep
kept = log["/moe/tokens"][...].astype(numpy.float64) - log["/moe/dropped"][...]
loads = sim["/layers/moe_load"][...]
assert loads.shape == (kept.shape[0], kept.shape[1] // E), (loads.shape, kept.shape)

def least_busiest(x):
    """The least busiest-rank load over every split of x into groups of per."""
    best = [float("inf")]
    def place(rest, most):
        if most >= best[0]:
            return
        if not rest:
            best[0] = most
            return
        first, others = rest[0], rest[1:]
        import itertools
        for mates in itertools.combinations(range(len(others)), per - 1):
            group = [first] + [others[i] for i in mates]
            left = [others[i] for i in range(len(others)) if i not in mates]
            place(left, max(most, sum(x[g] for g in group)))
    place(list(range(len(x))), 0.0)
    return best[0]

worst = 0.0
for t in range(kept.shape[0]):
    for j in range(loads.shape[1]):
        x = kept[t, j * E:(j + 1) * E]
        total = log["/moe/tokens"][t, j * E:(j + 1) * E].sum()
        if placement == "static":
            busiest = max(x[r * per:(r + 1) * per].sum() for r in range(ep))
        else:
            busiest = least_busiest(list(x))
        want = busiest * ep / total if total > 0 else 1.0
        worst = max(worst, abs(loads[t, j] - want) / want)
print("ok: %s: every block's busiest-rank load is the %s one (largest relative difference %.2g)"
      % (placement, "placement planner's optimal" if placement == "balanced" else "static", worst))
sys.exit(0 if worst < 1e-5 else 1)
PY
  fail "--placement $placement: the priced loads are not the placement's"
done

# With copies, no block's busiest rank at any step is above its load without.
"$DYNMO" simulate --from-run $run --policies static-uniform --ep 4 --replicas 4 \
  --placement balanced --replicas-max 2 --out "$dir/copies" >"$dir/copies.out" 2>&1 ||
  fail "--replicas-max 2 --out: exit $? ($(tail -1 "$dir/copies.out"))"
/usr/bin/python3 - "$dir/balanced/static-uniform.h5" "$dir/copies/static-uniform.h5" <<'PY' ||
import h5py, sys
without = h5py.File(sys.argv[1], "r")["/layers/moe_load"][...]
copies = h5py.File(sys.argv[2], "r")["/layers/moe_load"][...]
assert without.shape == copies.shape
worse = (copies > without + 1e-6).sum()
print("ok: with 2 copies: mean busiest rank %.4fx the mean, %.4fx without; %d block-steps higher"
      % (copies.mean(), without.mean(), worse))
sys.exit(0 if worse == 0 and copies.mean() < without.mean() else 1)
PY
  fail "copies raised a block's busiest rank, or lowered none"

# ---- bad input ------------------------------------------------------------
expect_error "an ep that does not divide the experts" "--ep 3 does not divide the run's 8 experts" \
  "$DYNMO" simulate --from-run $run --ep 3 --replicas 3
expect_error "balanced with ep = 1" "ep = 1 holds them all on one" \
  "$DYNMO" simulate --from-run $run --ep 1 --placement balanced
expect_error "copies without balanced" "--replicas-max 2 copies hot experts .* the placement is static" \
  "$DYNMO" simulate --from-run $run --placement static --replicas-max 2
expect_error "copies beyond E - E / ep" "--replicas-max 5 is more than the 4 experts" \
  "$DYNMO" simulate --from-run $run --placement balanced --replicas-max 5
expect_error "a run without MoE blocks" "has no MoE blocks" \
  "$DYNMO" simulate --from-run $data/freeze-2-static --placement balanced
# A run with its experts on one rank: its busiest rank never varied.
cp -r $run "$dir/one"
/usr/bin/python3 - "$dir/one/runlog.h5" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "a") as f:
    del f["/moe/rank_load"]
    f.attrs["config"] = f.attrs["config"].replace("parallel.ep = 2", "parallel.ep = 1")
PY
expect_error "a run whose busiest rank never varied" "never varied in .* so the fit has no cost" \
  "$DYNMO" simulate --from-run "$dir/one" --ep 2 --replicas 2 --placement balanced
expect_error "--placement with --hardware" "--hardware places experts as its config says" \
  "$DYNMO" simulate --hardware hardware/h100-sxm.ini --config configs/moe.ini --placement balanced
expect_error "--validate with a placement" "--validate simulates the run itself: leave out --ep" \
  "$DYNMO" simulate --from-run $run --validate --placement balanced
expect_error "an unknown placement" "--placement: 'hot' is not static or balanced" \
  "$DYNMO" simulate --from-run $run --placement hot
expect_error "an ep the replicas do not fill" "--ep 4 needs the replicas \(--replicas 2\) a multiple" \
  "$DYNMO" simulate --from-run $run --ep 4 --replicas 2
finish
