#!/usr/bin/python3
"""Expert skew of an MoE run (issue 16) from its run log's /moe/ datasets,
over steps [first, last): per MoE block, the most-routed expert's pairs
over the mean expert's (per step, then averaged; and at its worst step),
the busier expert-parallel rank's kept pairs over the mean of the ranks
(experts split into EP equal ranges, as parallel.ep does), the share of
pairs dropped, and the block's measured forward + backward time. The
last lines: how far the blocks' times and kept pairs spread (max/min),
and how closely they go together (correlation over the blocks).

usage: bench/moe_skew.py RUNLOG.h5 FIRST LAST EP"""
import sys
import h5py
import numpy as np

path, first, last, ep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
f = h5py.File(path, "r")
cfg = f.attrs["config"]
cfg = cfg.decode() if isinstance(cfg, bytes) else cfg
keys = {k.strip(): v.strip() for k, v in (l.split("=", 1) for l in cfg.splitlines() if "=" in l)}
E, every = int(keys["model.experts"]), int(keys["model.moe_every"])
routed = f["/moe/tokens"][first:last].astype(float)
dropped = f["/moe/dropped"][first:last].astype(float)
M = routed.shape[1] // E
routed, dropped = routed.reshape(-1, M, E), dropped.reshape(-1, M, E)
kept = routed - dropped
time = f["/layers/fwd_ms"][first:last] + f["/layers/bwd_ms"][first:last]
print(f"{path}: steps {first + 1}..{last}, {M} MoE blocks of {E} experts, ep {ep}")
print(" block  busiest expert/mean (mean, worst)  busier ep rank/mean  dropped  fwd+bwd ms")
block_ms, block_kept = [], []
for j in range(M):
    layer = (j + 1) * every - 1
    ratio = routed[:, j].max(axis=1) / routed[:, j].mean(axis=1)
    ranks = kept[:, j].reshape(-1, ep, E // ep).sum(axis=2)
    rank_ratio = ranks.max(axis=1) / np.maximum(ranks.mean(axis=1), 1)
    share = dropped[:, j].sum() / routed[:, j].sum()
    ms = time[:, layer].mean()
    block_ms.append(ms)
    block_kept.append(ranks.max(axis=1).mean())
    print(f" {layer:5d}  {ratio.mean():8.2f}x {ratio.max():6.2f}x        {rank_ratio.mean():6.2f}x"
          f"          {100 * share:5.1f}%  {ms:8.2f}")
block_ms, block_kept = np.array(block_ms), np.array(block_kept)
corr = np.corrcoef(block_ms, block_kept)[0, 1] if M > 1 else float("nan")
print(f"MoE blocks' fwd+bwd: max/min {block_ms.max() / block_ms.min():.2f}; busiest rank's kept "
      f"pairs: max/min {block_kept.max() / block_kept.min():.2f}; correlation {corr:.2f}")
