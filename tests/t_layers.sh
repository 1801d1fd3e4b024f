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
mkdir -p "$planted/kernels" "$planted/fuzz"
printf '#include "common.cuh"\n#include "dynmo/backend.h"\n#include <mpi.h>\n#include "dynmo/ckpt.h"\n#include "model/internal.h"\n' > "$planted/kernels/k.cu"
printf '#include "dynmo/ckpt.h"\n#include "tools/plan/plan.h"\n#include "ckpt/h5util.h"\n' > "$planted/fuzz/f.c"
out=$($py tests/include_direction.py "$planted")
rc=$?
[ $rc -eq 1 ] || fail "planted violations: exit $rc, want 1"
for want in "src/ckpt/a.c:2: ckpt includes dynmo/pipe.h, a module above it" \
            "src/balance/b.c:1: balance includes <mpi.h>" \
            "src/model/c.c:1: model includes dyn/scheme.h, module dyn's private header" \
            "include/dynmo/world.h:1: world includes dynmo/tools.h, a module above it" \
            "kernels/k.cu:3: kernels includes <mpi.h>" \
            "kernels/k.cu:4: kernels includes dynmo/ckpt.h; the kernels include the model's public headers only" \
            "kernels/k.cu:5: kernels includes model/internal.h, module model's private header" \
            "fuzz/f.c:3: fuzz includes ckpt/h5util.h, module ckpt's private header"; do
  grep -qF "$want" <<<"$out" && echo "ok: reported: $want" || fail "not reported: $want (got: $out)"
done
grep -q "src/model/c.c:2" <<<"$out" && fail "a module's own private header was reported"
grep -qE "kernels/k.cu:[12]:|fuzz/f.c:[12]:" <<<"$out" && fail "an allowed include of kernels/ or fuzz/ was reported"
finish
