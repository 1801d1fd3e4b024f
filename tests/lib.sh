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
