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
# steps) on $dir/data, with each override written as its own section line
# after it (libinih: a later key wins). Tests append further sections.
tiny_config() {
  local file=$1; shift
  cat > "$file" <<INI
[model]
layers = 6
channels = 32
heads = 2
max_seq = 32
[train]
batch = 8
seq = 32
micro_batches = 4
steps = 4
lr = 3e-3
warmup = 1
[data]
train = $dir/data/train.bin
val = $dir/data/val.bin
INI
  local kv
  for kv in "$@"; do
    printf '[%s]\n%s = %s\n' "${kv%%.*}" "$(cut -d= -f1 <<<"${kv#*.}")" "${kv#*=}" >> "$file"
  done
}
