#!/usr/bin/env bash
# `dynmo report` in a browser (issue 19): two real 2-stage runs, one
# re-balanced at random every 2 steps with steps 2 and 3 traced (blocks
# move before step 3) and one static, are reported together; headless
# Chromium opens index.html from the file system (no server) and a script
# of this test, run inside a copy of the page, checks that every figure
# loaded (no broken image) and has ink (non-blank pixels in several
# colours), both the inline SVG and the PNG file each figure links to. The
# page must also hold the figures the runs support (loss, throughput, and
# per run layout, costs, and the timeline of the traced run before and
# after its migration) and the speedup sentence.
#
# When Chromium is missing or cannot start here, the test says exactly why
# and exits 77 (skipped); tests/t_report.sh checks the page without it.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
work_dir
py=/usr/bin/python3
tiny_config "$dir/t.ini" parallel.pp=2 train.steps=6 train.eval_every=3 \
  run.trace_from=2 run.trace_steps=2 balance.every=2
for run in "balanced balance.method=random" "static balance.method=none"; do
  set -- $run
  timeout -k 10 120 mpiexec -n 2 "$DYNMO" train --config "$dir/t.ini" run.out_dir="$dir/$1" "$2" \
    > "$dir/$1.out" 2>&1 || { fail "$1 run exited $?"; tail -n 5 "$dir/$1.out"; finish; }
done
out=$("$DYNMO" report "$dir/balanced/runlog.h5" "$dir/static/runlog.h5" --out "$dir/report" 2>&1) \
  || { fail "report exited $?: $out"; finish; }
echo "$out"
page=$dir/report/index.html
for f in loss throughput layout-1 layout-2 cost-1 cost-2 timeline-1 timeline-2; do
  [ -s "$dir/report/$f.svg" ] && [ -s "$dir/report/$f.png" ] || fail "figure $f missing"
done
grep -q "step 2 (before the layout change) and step 3 (after it)" "$page" \
  && echo "ok: the timeline draws steps 2 and 3, before and after the migration" \
  || fail "the timeline does not draw the steps around the migration"
grep -q 'id="speedup-2">balanced runs [0-9.]*x as fast as static' "$page" \
  && echo "ok: the speedup is stated" || fail "no speedup sentence"

if ! command -v chromium >/dev/null; then
  echo "skip: chromium is not installed (Debian package chromium; scripts/setup.sh installs it)"
  exit 77
fi
# The check runs inside a copy of the page beside it (same directory, so
# the PNG links resolve); the report itself holds no script.
$py - "$page" "$dir/report/check.html" <<'PY'
import sys
script = r"""<pre id="dynmo-test-result">pending</pre><script>
function ink(img, label) {
  if (!img.complete || img.naturalWidth === 0) return label + " BROKEN";
  const c = document.createElement("canvas");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const x = c.getContext("2d");
  x.drawImage(img, 0, 0);
  const d = x.getImageData(0, 0, c.width, c.height).data;
  let inked = 0; const colours = new Set();
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] > 0 && (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240)) inked++;
    colours.add((d[i] >> 4) * 256 + (d[i + 1] >> 4) * 16 + (d[i + 2] >> 4));
  }
  return label + " " + c.width + "x" + c.height + " ink " + (inked / (d.length / 4)).toFixed(4) +
         " colours " + colours.size;
}
// The PNG files load as images of the page (added while it is parsed, so
// that the load event waits for them too).
const pngs = document.createElement("div");
pngs.hidden = true;
for (const a of document.querySelectorAll("figure a"))
  if (a.href.endsWith(".png")) {
    const img = document.createElement("img");
    img.src = a.href;
    img.dataset.label = "png " + a.href.split("/").pop();
    pngs.appendChild(img);
  }
document.body.appendChild(pngs);
window.addEventListener("load", () => {
  const lines = [];
  for (const img of document.images)
    lines.push(ink(img, img.dataset.label || "svg " + img.closest("figure").id));
  document.getElementById("dynmo-test-result").textContent = lines.join("\n") + "\nDONE";
});
</script>"""
page = open(sys.argv[1]).read()
open(sys.argv[2], "w").write(page.replace("</body>", script + "</body>"))
PY
timeout -k 10 120 chromium --headless --no-sandbox --disable-gpu --allow-file-access-from-files \
  --virtual-time-budget=20000 --dump-dom "file://$dir/report/check.html" \
  > "$dir/dom.html" 2> "$dir/chromium.err"
rc=$?
if [ $rc -ne 0 ] || ! grep -q 'id="dynmo-test-result"' "$dir/dom.html"; then
  why=$(grep -v -e dbus -e '^$' "$dir/chromium.err" | tail -n 1)
  echo "skip: headless chromium could not render the page here (exit $rc): ${why:-no output}"
  exit 77
fi
$py - "$dir/dom.html" "$dir/report" <<'PY' && echo "ok: every figure loaded in Chromium, SVG and PNG, with ink" \
  || fail "a figure did not load or is blank in Chromium"
import html, os, re, sys
dom = open(sys.argv[1]).read()
m = re.search(r'<pre id="dynmo-test-result">(.*?)</pre>', dom, re.S)
lines = html.unescape(m.group(1)).strip().split("\n") if m else []
print("\n".join(lines))
figures = sorted(f[:-4] for f in os.listdir(sys.argv[2]) if f.endswith(".svg"))
if not lines or lines[-1] != "DONE":
    print("the check did not finish"); sys.exit(1)
seen = {"svg": set(), "png": set()}
ok = True
for line in lines[:-1]:
    kind, name, *rest = line.split()
    name = name.replace("fig-", "").replace(".png", "")
    seen[kind].add(name)
    if rest[0] == "BROKEN":
        ok = False; print("broken:", line); continue
    share, colours = float(rest[2]), int(rest[4])
    if share < 0.01 or colours < 4:
        ok = False; print("blank:", line)
for kind in seen:
    if sorted(seen[kind]) != figures:
        ok = False; print(kind, "checked", sorted(seen[kind]), "of", figures)
sys.exit(0 if ok else 1)
PY
finish
