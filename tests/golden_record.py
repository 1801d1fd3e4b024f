#!/usr/bin/env python3
"""Writes the record of one run log to stdout: every step's loss as the
bits of its float32, every validation loss likewise, and the layout of
every step. t_golden.sh compares these records with the ones kept in
tests/reference/golden/, so a change that alters any result of a run
shows as a diff naming the run, the step and the value.

usage: golden_record.py NAME RUNLOG"""
import sys
import h5py
import numpy as np

name, path = sys.argv[1], sys.argv[2]
with h5py.File(path, "r") as f:
    loss = np.asarray(f["/steps/loss"][:], dtype="<f4")
    layout = f["/layout/history"][:] if "/layout/history" in f else None
    eval_step = f["/eval/step"][:] if "/eval/step" in f else []
    eval_loss = np.asarray(f["/eval/loss"][:], dtype="<f4") if "/eval/loss" in f else []
print(f"run {name}")
for i, v in enumerate(loss):
    row = "" if layout is None else " layout " + ",".join(str(int(x)) for x in layout[i])
    print(f"step {i + 1} loss {v.view('<u4'):08x} ({v:.6f}){row}")
for s, v in zip(eval_step, eval_loss):
    print(f"eval {int(s)} loss {np.float32(v).view('<u4'):08x} ({v:.6f})")
