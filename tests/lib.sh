# Helpers for shell tests: expect_error NAME REGEX CMD... runs CMD, wants
# exit status 2 and stderr matching REGEX (grep -E), and exactly one line of
# error output. finish exits 0 if nothing failed.
failures=0
DYNMO=${DYNMO:-build/dynmo}
BUILD=${BUILD:-build}
fail() { echo "FAIL: $*"; failures=$((failures+1)); }
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
