#!/usr/bin/env bash
# `dynmo prepare` on bad input: each case must exit 2 with one line
# "dynmo: error: ..." naming the problem, and leave no output behind (no
# train.bin, val.bin or temporary file; a previous good output untouched).
# Also checks --help and one good run. Needs $DYNMO (tests/run.sh sets it).
set -u
. "$(dirname "$0")/lib.sh"
need_dynmo
work=$(mktemp -d /tmp/dynmo-t-prepare.XXXXXX)
trap 'rm -rf "$work"' EXIT

printf 'In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void.\n' >"$work/good.txt"
for i in $(seq 1 40); do echo "line $i of some ordinary English text." ; done >>"$work/good.txt"
: >"$work/empty.txt"
printf 'a' >"$work/tiny.txt"
mkdir "$work/a-directory"
echo "not a directory" >"$work/plain-file"

# refused NAME KEYWORD OUTDIR ARGS...: prepare ARGS exits 2, one error line
# with KEYWORD, nothing written under OUTDIR.
refused() {
  local name=$1 keyword=$2 out=$3; shift 3
  "$DYNMO" prepare "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  [ $rc -eq 2 ] || fail "$name: exit $rc, want 2 ($(cat "$work/stderr"))"
  local lines
  lines=$(wc -l <"$work/stderr")
  [ "$lines" -eq 1 ] || fail "$name: $lines lines on stderr, want 1: $(cat "$work/stderr")"
  grep -q '^dynmo: error: ' "$work/stderr" || fail "$name: no 'dynmo: error:' prefix: $(cat "$work/stderr")"
  grep -qF -- "$keyword" "$work/stderr" || fail "$name: message lacks '$keyword': $(cat "$work/stderr")"
  if [ -n "$out" ] && [ -d "$out" ]; then
    local left
    left=$(find "$out" -type f \( -name 'train.bin' -o -name 'val.bin' -o -name '*.tmp.*' \) -newer "$work/stamp" | head -n 3)
    [ -z "$left" ] || fail "$name: left output behind: $left"
  fi
  echo "ok   $name: $(cat "$work/stderr")"
}

touch "$work/stamp"
sleep 1   # so that -newer tells new files from the stamp
out="$work/out"
refused "no arguments"          "no output directory"  "$out"
refused "no --out"              "no output directory"  "$out" "$work/good.txt"
refused "no input files"        "no input files"       "$out" --out "$out"
refused "missing file"          "$work/missing.txt"    "$out" --out "$out" "$work/missing.txt"
refused "missing second file"   "$work/missing.txt"    "$out" --out "$out" "$work/good.txt" "$work/missing.txt"
refused "directory as input"    "cannot read $work/a-directory" "$out" --out "$out" "$work/a-directory"
if [ "$(id -u)" -ne 0 ]; then
  cp "$work/good.txt" "$work/unreadable.txt"; chmod 000 "$work/unreadable.txt"
  refused "unreadable file"     "cannot open $work/unreadable.txt" "$out" --out "$out" "$work/unreadable.txt"
else
  echo "note: running as root, so a chmod 000 file is still readable; the directory case covers read errors"
fi
refused "empty file"            "empty: $work/empty.txt has no bytes" "$out" --out "$out" "$work/empty.txt"
refused "all files empty"       "empty"                "$out" --out "$out" "$work/empty.txt" "$work/empty.txt"
refused "too small to split"    "too small"            "$out" --out "$out" "$work/tiny.txt"
refused "unknown flag"          "unknown option '--bogus'" "$out" --bogus --out "$out" "$work/good.txt"
refused "unknown short flag"    "unknown option '-x'"  "$out" -x --out "$out" "$work/good.txt"
for f in 0 0.51 1 -0.1 abc nan inf 0.1x ""; do
  refused "--val-fraction '$f'" "--val-fraction must be a number in (0, 0.5], got '$f'" \
    "$out" --out "$out" --val-fraction "$f" "$work/good.txt"
done
refused "--val-fraction=0.9"    "got '0.9'"            "$out" --out "$out" --val-fraction=0.9 "$work/good.txt"
refused "--val-fraction no value" "--val-fraction needs a value" "$out" --out "$out" "$work/good.txt" --val-fraction
refused "--out no value"        "--out needs a value"  "$out" "$work/good.txt" --out
refused "--out empty"           "--out needs a directory" "$out" --out= "$work/good.txt"
refused "--out under a file"    "cannot create output directory $work/plain-file/sub" \
  "" --out "$work/plain-file/sub" "$work/good.txt"
[ -e "$out" ] && fail "argument errors created $out"

# A good run: exit 0, summary names both outputs, sizes match the input.
"$DYNMO" prepare --out "$out" "$work/good.txt" >"$work/stdout" 2>"$work/stderr" \
  || fail "good run: exit $?: $(cat "$work/stderr")"
grep -qF "$out/train.bin" "$work/stdout" && grep -qF "$out/val.bin" "$work/stdout" \
  || fail "good run: summary does not name the outputs: $(cat "$work/stdout")"
bytes=$(stat -c %s "$work/good.txt")
train=$(stat -c %s "$out/train.bin"); val=$(stat -c %s "$out/val.bin")
[ $(( (train - 64) / 2 + (val - 64) / 2 )) -eq "$bytes" ] \
  || fail "good run: train $train + val $val bytes do not hold $bytes tokens"
[ "$(head -c 8 "$out/train.bin")" = DYNMOTOK ] || fail "good run: train.bin lacks the magic"
"$DYNMO" prepare --help >"$work/stdout" 2>&1 || fail "--help: exit $?"
grep -q 'usage: dynmo prepare' "$work/stdout" || fail "--help: no usage line"

# A failing run into a directory with good outputs leaves them untouched.
sum_before=$(cat "$out/train.bin" "$out/val.bin" | md5sum)
touch "$work/stamp"; sleep 1
refused "bad run over good output" "$work/missing.txt" "$out" --out "$out" "$work/good.txt" "$work/missing.txt"
# train.bin that is not a token file (a directory in the way, a user's
# file of that name) is refused before anything is written, and stays.
blocked="$work/blocked"
mkdir -p "$blocked/train.bin/x"
refused "output blocked"        "train.bin exists and is not a token file" "$blocked" --out "$blocked" "$work/good.txt"
left=$(find "$blocked" -name '*.tmp.*' -o -name val.bin)
[ -z "$left" ] && [ -d "$blocked/train.bin/x" ] || fail "output blocked: left $left"
mine="$work/mine"; mkdir -p "$mine"; echo "my notes" > "$mine/val.bin"
refused "a user's val.bin"      "val.bin exists and is not a token file" "" --out "$mine" "$work/good.txt"
[ "$(cat "$mine/val.bin")" = "my notes" ] && [ ! -e "$mine/train.bin" ] || fail "a user's val.bin was replaced"
# Never onto its own input: the input named train.bin in --out.
cp "$work/good.txt" "$mine/train.bin"; rm "$mine/val.bin"
refused "its own input"         "train.bin is one of the inputs" "" --out "$mine" "$mine/train.bin"
cmp -s "$mine/train.bin" "$work/good.txt" || fail "prepare replaced its own input"
[ "$(cat "$out/train.bin" "$out/val.bin" | md5sum)" = "$sum_before" ] || fail "good output changed"

[ $failures -gt 0 ] || echo "all prepare error cases pass"
finish
