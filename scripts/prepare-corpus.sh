#!/usr/bin/env bash
# Prepares the default corpus, the King James Bible from Debian's
# bible-kjv-text package, into data/kjv/ (kjv.txt, train.bin, val.bin),
# unless it is already there. Uses $DYNMO (default build/dynmo).
#
# The package stores the text in its own container, not as plain text:
# /usr/lib/bible.data is a header ("EC02Compressed Data File"), a big-endian
# uint32 block size (65536) and block count N at offsets 84 and 88, N+1
# big-endian uint32 file offsets from offset 92, and N blocks, each an LZW
# stream in the format of compress(1) whose 3-byte magic (1f 9d 90) is
# stored once, just before the first block. We put the magic back in front
# of each block and let gzip (which reads compress(1) streams) expand it.
# docs/data.md says more.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
out=data/kjv
source_file=/usr/lib/bible.data
# sha256 of the text from bible-kjv-text 4.38 (Debian 12); the text has not
# changed in decades, so a different sum means the extraction went wrong or
# the package changed: worth a look, not fatal.
expected_sha256=e53aaf0af1e58f259e35d0d9f7ca1bbe154fd77bb95471279b37b34d3c397a98
expected_bytes=4404475

if [ -f "$out/train.bin" ] && [ -f "$out/val.bin" ]; then
  echo "corpus: $out already prepared"
  exit 0
fi
if [ ! -r "$source_file" ]; then
  echo "corpus: $source_file not found: install the Debian package bible-kjv-text (scripts/setup.sh)" >&2
  exit 2
fi
if [ ! -x "$DYNMO" ]; then
  echo "corpus: no dynmo binary at $DYNMO: run make first (or set DYNMO)" >&2
  exit 2
fi
if [ "$(head -c 4 "$source_file")" != "EC02" ]; then
  echo "corpus: $source_file is not in the expected EC02 container format" >&2
  exit 2
fi

mkdir -p "$out"
text="$out/kjv.txt"
partial=$(mktemp "$out/.kjv.txt.XXXXXX")
trap 'rm -f "$partial"' EXIT

read -r block_bytes blocks < <(od -An -tu4 --endian=big -j 84 -N 8 "$source_file")
mapfile -t offsets < <(od -An -v -w4 -tu4 --endian=big -j 92 -N $(( (blocks + 1) * 4 )) "$source_file" | tr -d ' ')
magic_at=$(( offsets[0] - 3 ))
for (( i = 0; i < blocks; i++ )); do
  {
    dd if="$source_file" iflag=skip_bytes,count_bytes skip="$magic_at" count=3 status=none
    dd if="$source_file" iflag=skip_bytes,count_bytes skip="${offsets[i]}" \
       count=$(( offsets[i + 1] - offsets[i] )) status=none
  } | gzip -dc >>"$partial"
done

bytes=$(stat -c %s "$partial")
if [ "$bytes" -gt $(( blocks * block_bytes )) ] || [ "$bytes" -le $(( (blocks - 1) * block_bytes )) ]; then
  echo "corpus: extracted $bytes bytes from $blocks blocks of $block_bytes: the extraction went wrong" >&2
  exit 1
fi
if LC_ALL=C grep -q '[^[:print:][:space:]]' "$partial"; then
  echo "corpus: the extracted text is not plain ASCII: the extraction went wrong" >&2
  exit 1
fi
sha256=$(sha256sum "$partial" | cut -d' ' -f1)
if [ "$sha256" != "$expected_sha256" ] || [ "$bytes" -ne "$expected_bytes" ]; then
  echo "corpus: warning: $text has $bytes bytes, sha256 $sha256;" \
       "expected $expected_bytes bytes, sha256 $expected_sha256" >&2
fi
chmod 644 "$partial"
mv "$partial" "$text"
trap - EXIT
echo "corpus: $text: $bytes bytes of English text ($(wc -l <"$text") lines)"

"$DYNMO" prepare --out "$out" "$text"
