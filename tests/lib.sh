# Helpers for shell tests (tests/README.md lists them): expect_error NAME
# REGEX CMD... runs CMD and wants exit status 2 and stderr matching REGEX
# (grep -E). finish exits 0 if nothing failed.
failures=0
DYNMO=${DYNMO:-build/dynmo}
BUILD=${BUILD:-build}
fail() { echo "FAIL: $*"; failures=$((failures+1)); }
# need_dynmo: skip the test (exit 77, saying why) where $DYNMO is not built
need_dynmo() { [ -x "$DYNMO" ] || { echo "skip: no dynmo binary at $DYNMO"; exit 77; }; }
need_h5py() { /usr/bin/python3 -c "import h5py" 2>/dev/null || { echo "skip: no python3-h5py"; exit 77; }; }
expect_error() {
  local name=$1 regex=$2; shift 2
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ]; then fail "$name: exit $rc, want 2 (stderr: $out)"; return; fi
  if ! grep -Eq -- "$regex" <<<"$out"; then fail "$name: message '$out' does not match /$regex/"; return; fi
  echo "ok: $name: $out"
}
finish() {
  if [ $failures -gt 0 ]; then echo "$failures failures"; exit 1; fi
  exit 0
}

# two_cpus: the first two CPUs this test may run on, as "a,b" (for taskset
# -c and mpiexec -bind-to user:a,b), so that a check of how ranks share
# CPUs runs the same on a machine of 2 CPUs and one of 64. The tests need 2.
two_cpus() {
  local cpus
  cpus=$(/usr/bin/python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(",".join(map(str, c[:2])) if len(c) >= 2 else "")')
  [ -n "$cpus" ] || { echo "FAIL: the tests need 2 CPUs, this process may use $(nproc)" >&2; exit 1; }
  echo "$cpus"
}

# work_dir: makes $dir, a temporary directory removed at exit (after
# killing this test's background jobs), with the GPL-3 text prepared as a
# token dataset in $dir/data.
work_dir() {
  dir=$(mktemp -d)
  trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
  "$DYNMO" prepare --out "$dir/data" /usr/share/common-licenses/GPL-3 >/dev/null || fail "prepare"
}

# hf: the Hugging Face fixtures (tests/data/hf: the tiny GPT-2,
# tokens.bin, losses.txt), wherever the test runs from.
hf=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/data/hf

# tiny_config FILE [section.key=value ...]: the small GPT the pipeline
# tests train (6 blocks of 32 channels, batch 8 x 32 in 4 micro-batches, 4
# steps) on $dir/data. An override replaces the key's line or adds the key
# to its section: every section and every key appears once (a config file
# that repeats either is an error; docs/config.md).
tiny_config() {
  local file=$1; shift
  local settings=(model.layers=6 model.channels=32 model.heads=2 model.max_seq=32
                  train.batch=8 train.seq=32 train.micro_batches=4 train.steps=4
                  train.lr=3e-3 train.warmup=1
                  "data.train=$dir/data/train.bin" "data.val=$dir/data/val.bin")
  local kv i replaced
  for kv in "$@"; do
    replaced=0
    for i in "${!settings[@]}"; do
      if [ "${settings[i]%%=*}" = "${kv%%=*}" ]; then settings[i]=$kv; replaced=1; fi
    done
    [ $replaced = 1 ] || settings+=("$kv")
  done
  local sections=() section key
  for kv in "${settings[@]}"; do
    section=${kv%%.*}
    [[ " ${sections[*]} " == *" $section "* ]] || sections+=("$section")
  done
  for section in "${sections[@]}"; do
    echo "[$section]"
    for kv in "${settings[@]}"; do
      [ "${kv%%.*}" = "$section" ] || continue
      key=${kv%%=*}
      echo "${key#*.} = ${kv#*=}"
    done
  done > "$file"
}

# Runs to compare, in $dir (work_dir):
# train NAME RANKS CONFIG [section.key=value ...]: dynmo train of CONFIG on
# RANKS ranks under mpiexec (and under taskset -c $train_cpus when a test
# sets it), run.out_dir=$dir/NAME, its output in $dir/NAME.out, stopped
# after $train_limit seconds (default 180; a test sets its own). A run
# that fails fails the test, shows its last lines, and returns 1.
train() {
  local name=$1 ranks=$2 config=$3; shift 3
  timeout -k 10 "${train_limit:-180}" ${train_cpus:+taskset -c "$train_cpus"} \
    mpiexec -n "$ranks" "$DYNMO" train --config "$config" run.out_dir="$dir/$name" "$@" \
    > "$dir/$name.out" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then fail "$name exited $rc"; tail -n 5 "$dir/$name.out"; return 1; fi
}

# finite RUN N: RUN's run log holds N losses in /steps/loss, each a finite
# number (printed); fails the test otherwise.
finite() {
  bits "$1" /steps/loss || return
  /usr/bin/python3 - "$dir/$1.steps.loss" "$2" <<'EOF' && echo "ok: $1: $2 finite losses" || fail "$1: not $2 finite losses"
import math, struct, sys
data = open(sys.argv[1], "rb").read()
losses = struct.unpack("<%df" % (len(data) // 4), data)
print("  losses:", " ".join("%.4f" % x for x in losses))
sys.exit(0 if len(losses) == int(sys.argv[2]) and all(math.isfinite(x) for x in losses) else 1)
EOF
}

# bits RUN DATASET...: the raw little-endian bytes of each DATASET of
# $dir/RUN/runlog.h5 in $dir/RUN.<dataset, / as .> (/steps/loss:
# $dir/RUN.steps.loss). A dataset the log lacks fails the test and
# returns 1. has RUN DATASET: whether the log holds DATASET.
bits() {
  local run=$1 d file; shift
  for d in "$@"; do
    file=${d#/}
    h5dump -b LE -d "$d" -o "$dir/$run.${file//\//.}" "$dir/$run/runlog.h5" >/dev/null 2>&1 \
      || { fail "$run: no $d"; return 1; }
  done
}
has() { h5dump -H -d "$2" "$dir/$1/runlog.h5" >/dev/null 2>&1; }

# same A B WHAT DATASET...: runs A and B have the same bits of every
# DATASET (as bits kept them): one ok line, or a failure naming the first
# that differs (and return 1).
same() {
  local a=$1 b=$2 what=$3 d file; shift 3
  for d in "$@"; do
    file=${d#/}; file=${file//\//.}
    cmp -s "$dir/$a.$file" "$dir/$b.$file" || { fail "$what: $d differs"; return 1; }
  done
  echo "ok: $what: $* bit-identical"
}

# moe_configs STEPS: the mixture-of-experts tests' configs in $dir, the
# tiny GPT with MoE blocks 1, 3, 5 of 4 experts (top-2, hidden 64) on 2
# replicas of 2 micro-batches: moe.ini (softmax, capacity 1.25 dropping by
# score, STEPS steps), sigmoid.ini (the sigmoid router and its bias, 6
# steps) and dense.ini; then run NAME CONFIG RANKS [overrides...] trains
# $dir/CONFIG.ini on RANKS ranks and keeps the bits of its losses,
# gradient norms, expert counts and biases (moe_bits), and same_moe A B
# WHAT compares them.
moe_configs() {
  moe=(model.moe_every=2 model.experts=4 model.top_k=2 model.expert_hidden=64
       parallel.dp=2 train.micro_batches=2)
  tiny_config "$dir/moe.ini" "${moe[@]}" moe.capacity_factor=1.25 moe.drop=probs train.steps="$1"
  tiny_config "$dir/sigmoid.ini" "${moe[@]}" moe.router=sigmoid moe.bias_rate=0.01 train.steps=6
  tiny_config "$dir/dense.ini"
  moe_bits=(/steps/loss /steps/grad_norm /moe/tokens /moe/dropped /moe/bias)
  run() { train "$1" "$3" "$dir/$2.ini" "${@:4}" && bits "$1" "${moe_bits[@]}"; }
  same_moe() { same "$1" "$2" "$3" "${moe_bits[@]}"; }
}

# same_ckpt A B WHAT: every dataset of checkpoint file B is in checkpoint
# file A with the same bytes (A may hold more): one ok line, or a failure.
same_ckpt() {
  /usr/bin/python3 - "$1" "$2" <<'PY' && echo "ok: $3: every dataset of $(basename "$2") bit-identical" || fail "$3: the checkpoints differ"
import sys, h5py
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
b.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert names, sys.argv[2]
for n in names:
    assert a[n][()].tobytes() == b[n][()].tobytes(), n
PY
}

# same_tail A B N WHAT: the last N losses of runs A and B (their run logs'
# /steps/loss) are the same bits: one ok line, or a failure.
same_tail() {
  /usr/bin/python3 - "$dir/$1/runlog.h5" "$dir/$2/runlog.h5" "$3" <<'PY' && echo "ok: $4: the last $3 losses bit-identical" || fail "$4: the losses differ"
import sys, h5py
a = h5py.File(sys.argv[1], "r")["/steps/loss"][:]
b = h5py.File(sys.argv[2], "r")["/steps/loss"][:]
n = int(sys.argv[3])
assert len(a) >= n and len(b) >= n and (a[-n:] == b[-n:]).all(), (a, b)
PY
}

# train_refused NAME REGEX RANKS CONFIG [section.key=value ...]: dynmo
# train of CONFIG on RANKS ranks (mpiexec, 60 s at most) must exit 2 with
# one line of output holding "error", matching REGEX (grep -E).
train_refused() {
  local name=$1 regex=$2 ranks=$3 config=$4; shift 4
  local out rc
  out=$(timeout -k 10 60 mpiexec -n "$ranks" "$DYNMO" train --config "$config" \
        run.out_dir="$dir/bad" "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] || { fail "$name: exit $rc, want 2: $out"; return; }
  grep -Eq -- "$regex" <<<"$out" || { fail "$name: '$out' does not match /$regex/"; return; }
  [ "$(grep -c 'error' <<<"$out")" -eq 1 ] || { fail "$name: more than one message: $out"; return; }
  echo "ok: $name: $out"
}

# The job-chain tests, with tests/mock-dynmo.sh in place of dynmo:
# mock_ready CKPT LINK COUNT waits at most 30 s until COUNT ranks of
# launch LINK sleep in the mock's `wait` action, ready for a signal (and
# returns 1 if they never do); mock_launches RECORD LINE... wants the
# mock's record of a chain's launches (CKPT/mock.record) to be these
# lines, one per launch, in order.
mock_ready() {
  local ckpt=$1 link=$2 count=$3 waited=0
  while [ "$(ls "$ckpt"/mock.ready."$link".* 2>/dev/null | wc -l)" -lt "$count" ]; do
    [ $waited -ge 300 ] && return 1
    sleep 0.1; waited=$((waited + 1))
  done
}
mock_launches() {
  local record=$1 k=0 line; shift
  for line in "$@"; do
    k=$((k + 1))
    [ "$(sed -n "${k}p" "$record")" = "$line" ] \
      || fail "launch $k ran '$(sed -n "${k}p" "$record")', want '$line'"
  done
  [ "$(wc -l <"$record")" -eq $# ] || fail "$(wc -l <"$record") launches, want $#"
}
