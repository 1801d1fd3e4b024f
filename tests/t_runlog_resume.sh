#!/usr/bin/env bash
# The run log across resumes (issue 28): every per-step dataset holds one
# row per step of the run whatever the resume changed.
# - 2 stages, checkpoint at step 4, resumed on 4 stages into the same
#   run.out_dir: the per-stage datasets widen (the first steps' new cells
#   NaN, their layouts 0), and the run finishes (it ended in an internal
#   error after a step);
# - the same resume into a new run.out_dir: steps 1-4 filler everywhere;
# - MoE on 2 replicas with ep = 2 resumed with ep = 1 and the reverse:
#   /moe/rank_load (written only with ep > 1) gets filler rows where the
#   segment did not write it, never stops short or starts mid-run;
# - back onto fewer stages: the wide datasets keep their width, filler past
#   the stages there are.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
tiny_config "$dir/t.ini" train.steps=8 ckpt.every=4 ckpt.keep=3
run() { # run NAME RANKS overrides...
  local name=$1 ranks=$2; shift 2
  timeout -k 10 180 mpiexec -n "$ranks" "$DYNMO" train --config "$dir/t.ini" "$@" \
    > "$dir/$name.out" 2>&1 || { fail "$name: exit $?: $(tail -n 3 "$dir/$name.out")"; return 1; }
}
# check RUNLOG STEPS PYTHON-ASSERTIONS: every per-step dataset has STEPS rows, then the assertions
check() {
  local log=$1 steps=$2 what=$3; shift 3
  /usr/bin/python3 - "$log" "$steps" "$@" <<'PY' && echo "ok: $what" || fail "$what"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r"); steps = int(sys.argv[2])
events = ("/eval/", "/trace/events", "/balance/decisions")
def visit(name, obj):
    if isinstance(obj, h5py.Dataset) and not any(("/" + name).startswith(e) for e in events):
        assert obj.shape[0] == steps, f"/{name} has {obj.shape[0]} rows for {steps} steps"
f.visititems(visit)
for expr in sys.argv[3:]:
    assert eval(expr), expr
PY
}

run two 2 parallel.pp=2 run.out_dir="$dir/log" ckpt.dir="$dir/ck" train.steps=4
run four 4 parallel.pp=4 run.out_dir="$dir/log" ckpt.dir="$dir/ck" ckpt.resume=auto &&
  check "$dir/log/runlog.h5" 8 "2 -> 4 stages into the same run.out_dir: 8 rows, widened" \
    'f["/stages/busy_ms"].shape == (8, 4)' \
    'np.isnan(f["/stages/busy_ms"][:4, 2:]).all() and not np.isnan(f["/stages/busy_ms"][:4, :2]).any()' \
    'not np.isnan(f["/stages/busy_ms"][4:]).any()' \
    '(f["/layout/history"][:4, 2:] == 0).all() and (f["/layout/history"][:4].sum(1) == 6).all()' \
    '(f["/layout/history"][4:].sum(1) == 6).all() and (f["/layout/history"][4:] > 0).all()'
run fresh 4 parallel.pp=4 run.out_dir="$dir/fresh" ckpt.dir="$dir/ck-fresh" \
    ckpt.resume="$dir/ck/ckpt-4.h5" &&
  check "$dir/fresh/runlog.h5" 8 "resumed into a new run.out_dir: 8 rows, steps 1-4 filler" \
    'np.isnan(f["/steps/loss"][:4]).all() and not np.isnan(f["/steps/loss"][4:]).any()' \
    '(f["/layout/history"][:4] == 0).all() and (f["/steps/ranks"][:4] == 0).all()'
run back 2 parallel.pp=2 run.out_dir="$dir/log" ckpt.dir="$dir/ck" ckpt.resume="$dir/ck/ckpt-4.h5" &&
  check "$dir/log/runlog.h5" 8 "4 -> 2 stages again: the wide datasets keep 4 columns, NaN past 2" \
    'f["/stages/busy_ms"].shape == (8, 4) and np.isnan(f["/stages/busy_ms"][4:, 2:]).all()' \
    '(f["/layout/history"][4:, 2:] == 0).all()'

# MoE: ep = 2 writes /moe/rank_load, ep = 1 does not.
moe=(model.layers=4 model.moe_every=1 model.experts=4 model.top_k=2 model.expert_hidden=64
     parallel.pp=1 parallel.dp=2)
run ep2 2 "${moe[@]}" parallel.ep=2 run.out_dir="$dir/moe" ckpt.dir="$dir/ck-moe" train.steps=4
run ep1 2 "${moe[@]}" parallel.ep=1 run.out_dir="$dir/moe" ckpt.dir="$dir/ck-moe" ckpt.resume=auto &&
  check "$dir/moe/runlog.h5" 8 "MoE ep 2 -> 1: /moe/rank_load has 8 rows, NaN where ep = 1" \
    'not np.isnan(f["/moe/rank_load"][:4]).any() and np.isnan(f["/moe/rank_load"][4:]).all()'
run ep1a 2 "${moe[@]}" parallel.ep=1 run.out_dir="$dir/moe1" ckpt.dir="$dir/ck-moe1" train.steps=4
run ep2a 2 "${moe[@]}" parallel.ep=2 run.out_dir="$dir/moe1" ckpt.dir="$dir/ck-moe1" ckpt.resume=auto &&
  check "$dir/moe1/runlog.h5" 8 "MoE ep 1 -> 2: /moe/rank_load starts at step 1 with 4 NaN rows" \
    'np.isnan(f["/moe/rank_load"][:4]).all() and not np.isnan(f["/moe/rank_load"][4:]).any()'
# What reads the log reads it whole.
"$DYNMO" inspect "$dir/log/runlog.h5" > "$dir/inspect.out" 2>&1 || fail "inspect of the widened log: $(tail -n 2 "$dir/inspect.out")"
"$DYNMO" report "$dir/log/runlog.h5" "$dir/moe/runlog.h5" --out "$dir/report" > "$dir/report.out" 2>&1 \
  && echo "ok: report reads both resumed logs" || fail "report of the resumed logs: $(tail -n 2 "$dir/report.out")"
finish
