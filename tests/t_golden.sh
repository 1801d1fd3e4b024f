#!/usr/bin/env bash
# The golden records: short runs of every config in configs/ (shrunk to a
# tiny model on the GPL-3 text) on 1, 2 and 4 ranks, with live migration
# (balance.method=random, whose layouts come from the seed, not from
# timings), checkpoint and resume under another layout, and a re-pack with
# its smaller world. Each run's losses (as float32 bits), validation losses
# and layout of every step are compared with tests/reference/golden/, kept
# from before a change that must not alter results (issue 14's refactor).
#
# The bits depend on the BLAS kernels OpenBLAS picks for the CPU (its core
# name is in the record). Every machine compares losses within 1e-3
# relative and layouts exactly (what another core must meet); where the
# core is the record's, the bits must be identical too. Both comparisons
# (tests/golden_compare.py) first check themselves on altered copies of the
# records, so each runs, and can fail, everywhere. GOLDEN_RECORD=1 rewrites
# the records instead; GOLDEN_KEEP=DIR keeps this run's records in DIR.
set -u
. "$(dirname "$0")/lib.sh"
work_dir
py=/usr/bin/python3
golden=$PWD/tests/reference/golden
out=$dir/records; mkdir -p "$out"
core=$($py -c 'import ctypes; l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())')

shrink=(model.layers=8 model.channels=32 model.heads=2 model.max_seq=32 train.seq=32
        train.batch=8 train.micro_batches=4 train.steps=8 train.warmup=2 train.eval_every=4
        train.eval_batches=1 run.log_every=1 data.train="$dir/data/train.bin"
        data.val="$dir/data/val.bin")
declare -A dyn=(
  [demo]=""
  [ref]=""
  [freeze]="dyn.freeze_window=2 dyn.freeze_every=2 dyn.freeze_threshold=10 dyn.freeze_max=4"
  [early_exit]="dyn.exit_warmup=2 dyn.exit_threshold=0.05"
  [prune]="dyn.prune_start=2 dyn.prune_every=2 dyn.prune_steps=2 dyn.csr_sparsity=0.5"
)

# run NAME RANKS CONFIG [key=value...]: trains into $dir/NAME; wants exit
# $want (0 unless set).
run() {
  local name=$1 ranks=$2 config=$3; shift 3
  # shellcheck disable=SC2086
  timeout -k 10 300 mpiexec -n "$ranks" "$DYNMO" train --config "configs/$config.ini" "${shrink[@]}" \
    ${dyn[$config]} run.out_dir="$dir/$name" "$@" > "$dir/$name.out" 2>&1
  local rc=$?
  [ $rc -eq "${want:-0}" ] || { fail "$name: exit $rc, want ${want:-0}: $(tail -n 3 "$dir/$name.out")"; return 1; }
  $py tests/golden_record.py "$name" "$dir/$name/runlog.h5" > "$out/$name.txt" || fail "$name: no record"
}

for c in demo ref freeze early_exit prune; do
  run "$c-1" 1 "$c" parallel.pp=1
  run "$c-2" 2 "$c" parallel.pp=2 balance.method=random balance.every=3
  run "$c-4" 4 "$c" parallel.pp=2 parallel.dp=2 balance.method=random balance.every=2 \
    ckpt.dir="$dir/$c-ck" ckpt.every=4 ckpt.keep=3
  run "$c-4r" 4 "$c" parallel.pp=4 balance.method=random balance.every=3 \
    ckpt.dir="$dir/$c-ck" ckpt.resume="$dir/$c-ck/ckpt-4.h5"
done

want=3 run repack-4 4 ref parallel.pp=4 ckpt.dir="$dir/rp-ck" repack.enable=1 repack.every=4 \
  repack.epsilon=5
pp=$(sed -n 's/^pp = //p' "$dir/rp-ck/next_world" 2>/dev/null)
layout=$(sed -n 's/^layout = //p' "$dir/rp-ck/next_world" 2>/dev/null)
if [ -n "$pp" ]; then
  echo "re-pack: pp=$pp layout=$layout" >> "$out/repack-4.txt"
  run repack-next "$pp" ref parallel.pp="$pp" balance.initial="explicit:$layout" ckpt.dir="$dir/rp-ck"
else
  fail "re-pack wrote no next_world"
fi

[ -n "${GOLDEN_KEEP:-}" ] && cp -r "$out" "$GOLDEN_KEEP"
if [ "${GOLDEN_RECORD:-0}" = 1 ]; then
  rm -f "$golden"/*.txt
  cp "$out"/*.txt "$golden"/
  echo "$core" > "$golden/blas-core"
  echo "recorded $(ls "$golden"/*.txt | wc -l) runs on OpenBLAS core $core"
  finish
fi

recorded_core=$(cat "$golden/blas-core")
# The comparator itself, on altered copies of the kept records (filler rows
# included): both ways of comparing are checked here on every machine.
$py tests/golden_compare.py self-test "$golden"/*.txt || fail "the golden comparator is wrong"
for want_file in "$golden"/*.txt; do
  name=$(basename "$want_file" .txt)
  have=$out/$name.txt
  [ -f "$have" ] || { fail "$name: not run"; continue; }
  # Within 1e-3 on every machine: what another OpenBLAS core must meet.
  if ! $py tests/golden_compare.py near "$want_file" "$have" 2> "$dir/$name.near"; then
    fail "$name differs from the record beyond 1e-3: $(cat "$dir/$name.near")"
  elif [ "$core" = "$recorded_core" ]; then
    if $py tests/golden_compare.py bits "$want_file" "$have" 2> "$dir/$name.bits"; then
      echo "ok: $name: $(grep -c '^step' "$have") steps bit-identical to the record (and within 1e-3)"
    else
      fail "$name differs from the record: $(cat "$dir/$name.bits")"
    fi
  else
    echo "ok: $name: within 1e-3 of the record (OpenBLAS core $core, recorded on $recorded_core: bits not compared)"
  fi
done
finish
