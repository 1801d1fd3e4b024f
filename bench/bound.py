#!/usr/bin/python3
"""The layout bound of a measured run (issues 6, 7 and 30): from a run log's
per-block profile averaged over steps [first, last), write the costs CSV
that `dynmo plan` reads (embed and head rows from the first and last
stage's compute beyond their blocks), run `dynmo plan`, and print the
predicted step time of each static layout over that of the optimal
partition (partition-time): the speedup a perfect balancer could get.
Blocks' updates at the step's end (/layers/update_ms, once a step) go in the
CSV's update_ms column when the log has them.
When the run's stages shared processors (run log attributes stage_groups,
group_cores and group_turns), `dynmo plan` predicts with the same sharing.
A run of `balance.units = sublayer` (its log has /units/) gets a second
bound: the best static whole-block layout's predicted step over the
optimal partition of the units (`dynmo plan --units sublayer` on the
halves' own measured costs), printed as `bound sublayer`.

usage: bench/bound.py RUNLOG.h5 FIRST LAST STAGES MICRO_BATCHES [DYNMO]"""
import subprocess, sys, tempfile
import h5py, numpy as np

path, first, last, S, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dynmo = sys.argv[6] if len(sys.argv) > 6 else "build/dynmo"
f = h5py.File(path, "r")
busy = f["/stages/busy_ms"][first:last].mean(axis=0)[:S]
unit_layout = f["/layout/history"][last - 1][:S]
cfg = f.attrs["config"]
cfg = cfg.decode() if isinstance(cfg, bytes) else cfg
keys = {k.strip(): v.strip() for k, v in (l.split("=", 1) for l in cfg.splitlines() if "=" in l)}
C = int(keys["model.channels"])
sublayer = keys.get("balance.units", "block") == "sublayer" and "/units/fwd_ms" in f
if sublayer and np.any(unit_layout % 2):
    sys.exit(f"{path}: step {last} splits a block ({unit_layout}): bound.py wants a static "
             "run of whole blocks")
block_layout = unit_layout // 2 if sublayer else unit_layout
L = f["/layers/fwd_ms"].shape[1]
params = np.full(L, 12 * C * C + 13 * C, dtype=float)
every = int(keys.get("model.moe_every", "0"))
if every > 0:   # MoE blocks: shared tensors, router, every expert (docs/moe.md)
    E, H = int(keys["model.experts"]), int(keys["model.expert_hidden"]) or 4 * C
    for l in range(every - 1, L, every):
        params[l] = 4 * C * C + 8 * C + E * C + E * (2 * H * C + H + C)
if "/layers/sparsity" in f:
    params = params * (1 - f["/layers/sparsity"][last - 1])
# Once a step: each block's update and each stage's whole step end (logs
# older than these datasets: none, the step end stays in busy per micro-batch)
with_update = "/layers/update_ms" in f and len(f["/layers/update_ms"]) == len(f["/layers/fwd_ms"])
stage_update = (f["/stages/update_ms"][first:last].mean(axis=0)[:S] if with_update
                else np.zeros(S))


def costs(group):
    """fwd, bwd, update, params of the rows of /layers (group 'layers') or
    /units (group 'units': block j's attention 2j, its MLP 2j + 1)."""
    fwd = f[f"/{group}/fwd_ms"][first:last].mean(axis=0)
    bwd = f[f"/{group}/bwd_ms"][first:last].mean(axis=0)
    update = (f[f"/{group}/update_ms"][first:last].mean(axis=0) if with_update
              else np.zeros(len(fwd)))
    if group == "layers":
        return fwd, bwd, update, params
    share = np.tile([(4 * C * C + 6 * C) / (12 * C * C + 13 * C),
                     (8 * C * C + 7 * C) / (12 * C * C + 13 * C)], L)
    return fwd, bwd, update, np.repeat(params, 2) * share


def predict(group, layout, units):
    fwd, bwd, update, prm = costs(group)
    starts = np.concatenate([[0], np.cumsum(layout)])
    def extra(stage):  # per micro-batch compute beyond the stage's rows, update apart
        b = slice(starts[stage], starts[stage + 1])
        return max(0.0, (busy[stage] - stage_update[stage]) / m - (fwd[b].sum() + bwd[b].sum()))
    def extra_update(stage):  # once a step: the stage's update beyond its rows'
        b = slice(starts[stage], starts[stage + 1])
        return max(0.0, stage_update[stage] - update[b].sum())
    e, h = extra(0), extra(S - 1)
    eu, hu = extra_update(0), extra_update(S - 1)
    with tempfile.NamedTemporaryFile("w", suffix=f"-{group}.csv", delete=False) as csv:
        csv.write("layer,fwd_ms,bwd_ms,params,mem_bytes,update_ms\n")
        csv.write(f"embed,{e/3:.6f},{2*e/3:.6f},0,0,{eu:.6f}\n")
        for l in range(len(fwd)):
            csv.write(f"{l},{fwd[l]:.6f},{bwd[l]:.6f},{prm[l]:.0f},{int(16*prm[l])},"
                      f"{update[l]:.6f}\n")
        csv.write(f"head,{h/3:.6f},{2*h/3:.6f},0,0,{hu:.6f}\n")
    cmd = [dynmo, "plan", "--costs", csv.name, "--stages", str(S), "--micro-batches", str(m),
           "--units", units]
    if "stage_groups" in f.attrs:   # the run's stages shared processors: predict with that
        cmd += ["--stage-groups", ",".join(str(int(g)) for g in f.attrs["stage_groups"]),
                "--group-cores", ",".join(f"{c:.17g}" for c in f.attrs["group_cores"])]
        if "group_turns" in f.attrs and int(f.attrs["group_turns"][0]) == 1:
            cmd += ["--sharing", "turns"]   # its ranks took turns (parallel.turns)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    pred, method = {}, None
    for line in out.splitlines():
        if line.startswith("method: "): method = line.split()[1]
        if line.startswith("step_ms: ") and method: pred[method] = float(line.split()[1])
        if line.startswith("layout: ") and method: pred[method + "/layout"] = line.split()[1]
    return csv.name, out, pred


name, out, pred = predict("layers", block_layout, "block")
opt = pred["partition-time"]
print(f"costs: {name} (steps {first}..{last-1} of {path})")
for line in out.splitlines():
    if line.startswith("processors:"): print(line)
for k in ("static-uniform", "static-params"):
    print(f"bound {k}: predicted {pred[k]:.1f} ms / optimal {opt:.1f} ms "
          f"({pred['partition-time/layout']}) = {pred[k]/opt:.3f}x")
if sublayer:
    best = min(pred["static-uniform"], pred["static-params"])
    uname, _, upred = predict("units", unit_layout, "sublayer")
    uopt = upred["partition-time"]
    print(f"costs: {uname} (units)")
    print(f"bound sublayer: best static blocks {best:.1f} ms / optimal units {uopt:.1f} ms "
          f"({upred['partition-time/layout']}) = {best/uopt:.3f}x")
