#!/usr/bin/env bash
# The direction of dependencies (shared/DESIGN.md): tests/include_direction.py
# reads every #include of src/ and include/dynmo/; it must find no module
# including one above it or another module's private header. It is also fed
# a tree with planted violations, which it must report by file and line.
set -u
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3
$py tests/include_direction.py . || fail "src/ breaks the direction of dependencies"
planted=$(mktemp -d); trap 'rm -rf "$planted"' EXIT
mkdir -p "$planted/src/ckpt" "$planted/src/balance" "$planted/src/model" "$planted/include/dynmo"
printf '#include "dynmo/core.h"\n#include "dynmo/pipe.h"\n' > "$planted/src/ckpt/a.c"
printf '#include <mpi.h>\n' > "$planted/src/balance/b.c"
printf '#include "dyn/scheme.h"\n#include "model/internal.h"\n' > "$planted/src/model/c.c"
printf '#include "dynmo/tools.h"\n' > "$planted/include/dynmo/world.h"
out=$($py tests/include_direction.py "$planted")
rc=$?
[ $rc -eq 1 ] || fail "planted violations: exit $rc, want 1"
for want in "src/ckpt/a.c:2: ckpt includes dynmo/pipe.h, a module above it" \
            "src/balance/b.c:1: balance includes <mpi.h>" \
            "src/model/c.c:1: model includes dyn/scheme.h, module dyn's private header" \
            "include/dynmo/world.h:1: world includes dynmo/tools.h, a module above it"; do
  grep -qF "$want" <<<"$out" && echo "ok: reported: $want" || fail "not reported: $want (got: $out)"
done
grep -q "model/internal.h" <<<"$out" && fail "a module's own private header was reported"
finish
