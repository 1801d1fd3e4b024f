#!/usr/bin/env bash
# Issue 17 measurements: mixture of depths (configs/mod.ini) and hash
# attention (configs/hash.ini) on RANKS ranks (default "2 4"), one pipeline
# stage per rank, each three ways -- static uniform, static params,
# balanced (partition-time every K steps) -- and, for hash, the same model
# with dense attention (static uniform), for the cost of a hash block
# against a dense one at the same length. Per run: the step time, bubble
# and imbalance of the steps after SETTLE; per scheme and rank count: the
# per-block cost (forward + backward) spread over the blocks and over
# training (its first and last windows), the tokens (MoD) or tiles (hash)
# behind it, the layout bound of the uniform run (bench/bound.py) and the
# balanced run's speedup over the best static one against that bound.
# Usage: bench/mod_hash_schemes.sh [STEPS] [SETTLE] [K]
# SCHEMES= (default "mod hash"); HASH_SEQ= (default 1024: T of the hash
# runs, configs/hash.ini's 2048 takes four times longer); OUT= the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
STEPS=${1:-60}; SETTLE=${2:-30}; K=${3:-10}
out=${OUT:-runs/bench-mod-hash}; mkdir -p "$out"
seq=${HASH_SEQ:-1024}
echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for ranks in ${RANKS:-2 4}; do
  for scheme in ${SCHEMES:-mod hash}; do
    common=(parallel.pp="$ranks" parallel.dp=1 train.steps="$STEPS" train.eval_every=0
            run.log_every=10)
    [ "$scheme" = hash ] && common+=(model.max_seq="$seq" train.seq="$seq")
    ways="uniform params balanced"
    [ "$scheme" = hash ] && ways="$ways dense"
    for way in $ways; do
      args=(balance.method=none balance.initial=uniform)
      [ "$way" = params ] && args=(balance.method=none balance.initial=params)
      [ "$way" = balanced ] && args=(balance.method=partition-time balance.initial=uniform
                                     balance.every="$K")
      [ "$way" = dense ] && args+=(model.attention=dense)
      name=$scheme-$ranks-$way
      config=configs/$scheme.ini
      if [ "$way" = dense ]; then   # the same model without the [hash] section
        grep -v '^\[hash\]\|^buckets' "$config" > "$out/$scheme-dense.ini"
        config=$out/$scheme-dense.ini
      fi
      mpiexec -n "$ranks" "$DYNMO" train --config "$config" "${common[@]}" \
        run.out_dir="$out/$name" "${args[@]}" > "$out/$name.out" 2>&1 ||
        { echo "$name failed:"; tail -n 3 "$out/$name.out"; exit 1; }
    done
    /usr/bin/python3 - "$out" "$scheme" "$ranks" "$SETTLE" "$STEPS" "$ways" <<'PY'
import sys, h5py, numpy as np
out, scheme, ranks, settle, steps, ways = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6].split()
ms = {}
for way in ways:
    f = h5py.File(f"{out}/{scheme}-{ranks}-{way}/runlog.h5", "r")
    s = f["/steps/step_ms"][settle:]
    ms[way] = np.mean(s)
    layout = ",".join(str(int(x)) for x in f["/layout/history"][-1][:ranks])
    print(f"{scheme}-{ranks}-{way:9s} step {np.mean(s):7.1f} ms  bubble "
          f"{np.mean(f['/steps/bubble_ratio'][settle:]):.3f}  imbalance "
          f"{np.mean(f['/steps/imbalance'][settle:]):.3f}  layout {layout}  loss at the end "
          f"{f['/steps/loss'][-1]:.6f}")
f = h5py.File(f"{out}/{scheme}-{ranks}-uniform/runlog.h5", "r")
cost = f["/layers/fwd_ms"][:] + f["/layers/bwd_ms"][:]
early, late = cost[1:1 + 5].mean(axis=0), cost[settle:].mean(axis=0)
print(f"per-block fwd+bwd ms, steps 2-6:  " + " ".join(f"{x:.1f}" for x in early))
print(f"per-block fwd+bwd ms, from {settle + 1}: " + " ".join(f"{x:.1f}" for x in late))
print(f"spread over the blocks (max/min): steps 2-6 {early.max()/early.min():.2f}, "
      f"from {settle + 1} {late.max()/late.min():.2f}; over training per block "
      f"(early/late): {(early/late).min():.2f}..{(early/late).max():.2f}")
if scheme == "mod":
    t = f["/mod/tokens"][:]
    print(f"MoD tokens per block and step (of {int(round(f['/steps/tokens_per_s'][0] * f['/steps/step_ms'][0] / 1e3))}): "
          f"step 1 {t[0].mean():.0f}, steps 2-6 {t[1:6].mean():.0f}, from {settle + 1} {t[settle:].mean():.0f}")
else:
    t = f["/hash/tiles"][:]
    d = h5py.File(f"{out}/{scheme}-{ranks}-dense/runlog.h5", "r")
    dense = (d["/layers/fwd_ms"][settle:] + d["/layers/bwd_ms"][settle:]).mean()
    print(f"hash tiles per block and step: {t[settle:].mean(axis=0).min():.0f}..{t[settle:].mean(axis=0).max():.0f}; "
          f"a hash block {late.mean():.1f} ms against a dense one {dense:.1f} ms: "
          f"{dense / late.mean():.2f}x")
best = min(ms["uniform"], ms["params"])
print(f"balanced {ms['balanced']:.1f} ms vs best static {best:.1f} ms: {best / ms['balanced']:.3f}x")
PY
    mb=$(sed -n 's/^micro_batches *= *//p' "configs/$scheme.ini")
    bound=$(/usr/bin/python3 bench/bound.py "$out/$scheme-$ranks-uniform/runlog.h5" "$SETTLE" "$STEPS" "$ranks" "$mb" "$DYNMO" | grep '^bound static-uniform' || true)
    echo "$bound"
  done
done
