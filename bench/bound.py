#!/usr/bin/python3
"""The layout bound of a measured run (issues 6, 7 and 30): `dynmo plan
--from-run` on the run's mean costs over steps [first, last) (0-based, as
a slice; `--step first+1-last`), and the predicted step time of each
static layout over that of the optimal partition (partition-time): the
speedup a perfect balancer could get. `dynmo plan` takes the embedding
and head from the end stages' time beyond their blocks, the updates, the
run's sharing of processors and its turns (docs/balance.md).
A run of `balance.units = sublayer` (its log has /units/) gets a second
bound: the best static whole-block layout's predicted step over the
optimal partition of the units (the halves' own measured costs), printed
as `bound sublayer`.

usage: bench/bound.py RUNLOG.h5 FIRST LAST STAGES MICRO_BATCHES [DYNMO]"""
import os, re, subprocess, sys

path, first, last, S, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
dynmo = sys.argv[6] if len(sys.argv) > 6 else "build/dynmo"
run = os.path.dirname(path) or "."


def plan(*extra):
    cmd = [dynmo, "plan", "--from-run", run, "--step", f"{first + 1}-{last}", "--stages", S,
           "--micro-batches", m, "--method", "static-uniform,static-params,partition-time",
           *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench/bound.py: {' '.join(cmd)}: {out.stderr.strip()}")
    pred, method = {}, None
    for line in out.stdout.splitlines():
        if line.startswith("method: "): method = line.split()[1]
        if line.startswith("step_ms: ") and method: pred[method] = float(line.split()[1])
        if line.startswith("layout: ") and method: pred[method + "/layout"] = line.split()[1]
    return out.stdout, pred


text, blocks = plan("--units", "block")
print(text.splitlines()[0])
for line in text.splitlines():
    if line.startswith("processors:"): print(line)
opt = blocks["partition-time"]
for k in ("static-uniform", "static-params"):
    print(f"bound {k}: predicted {blocks[k]:.1f} ms / optimal {opt:.1f} ms "
          f"({blocks['partition-time/layout']}) = {blocks[k]/opt:.3f}x")
if re.search(r"sublayer units of", (units := plan())[0].splitlines()[0]):
    best = min(blocks["static-uniform"], blocks["static-params"])
    uopt = units[1]["partition-time"]
    print(f"bound sublayer: best static blocks {best:.1f} ms / optimal units {uopt:.1f} ms "
          f"({units[1]['partition-time/layout']}) = {best/uopt:.3f}x")
