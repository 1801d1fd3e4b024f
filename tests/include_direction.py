#!/usr/bin/env python3
"""Reads every #include "..." line of src/ and include/dynmo/ and reports
each one that breaks the direction of dependencies of shared/DESIGN.md
(core; world; model and balance; dyn; ckpt; pipe; tools): a module may
include the public headers (include/dynmo/X.h) of modules below it and
its own headers, never a module above it, never another module's private
header (src/X/...), and the pure modules never MPI: balance (pure
functions over arrays) and model (the model never calls MPI) include
neither dynmo/world.h nor <mpi.h>. Two more trees: kernels/ (the CUDA
plugin and the emulated device, behind the op table) sits beside model:
it includes the model's public headers (backend.h and the per-token code
shared with the CPU ops), never MPI, world or anything above the model,
never a module's private header; fuzz/ sits above tools: it includes any
public header and the private headers of tools only (it drives a
command's readers). Prints one line per violation, naming file and line,
and exits 1 if there is any.

usage: include_direction.py [ROOT]"""
import os
import re
import sys

LEVEL = {"core": 0, "world": 1, "model": 2, "balance": 2, "dyn": 3, "ckpt": 4,
         "pipe": 5, "tools": 6}
NO_MPI = {"model", "balance", "kernels"}
# Trees outside src/ and the level each sits at, with the modules whose
# private headers it may include.
OUTSIDE = {"kernels": (2, set()), "fuzz": (7, {"tools"})}
# Public headers named otherwise than their module: include/dynmo/X.h -> module.
PUBLIC_OF = {"backend": "model", "rotation_group": "model", "topk_route": "model", "exit_confidence": "model",
             "mod_predictor": "model", "shared_fn": "model", "block_ext": "model",
             "schema": "dyn", "schema_tables": "dyn", "moe": "dyn"}
root = sys.argv[1] if len(sys.argv) > 1 else "."
include_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def level_of(module):
    return OUTSIDE[module][0] if module in OUTSIDE else LEVEL[module]


def check(path, module, problems):
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        m = include_re.match(line)
        if not m:
            continue
        quote, target = m.groups()
        where = f"{os.path.relpath(path, root)}:{number}"
        if quote == "<":
            if target == "mpi.h" and module in NO_MPI:
                problems.append(f"{where}: {module} includes <mpi.h>; {module} never calls MPI")
            continue
        parts = target.split("/")
        if parts[0] == "dynmo" and len(parts) == 2:
            other = PUBLIC_OF.get(parts[1][:-2], parts[1][:-2])
            if other not in LEVEL:
                problems.append(f"{where}: includes {target}, which is no module's public header")
            elif other == "world" and module in NO_MPI:
                problems.append(f"{where}: {module} includes {target}; {module} never calls MPI")
            elif module == "kernels" and other != "model":
                problems.append(f"{where}: kernels includes {target}; the kernels include the "
                                f"model's public headers only")
            elif other != module and module != "kernels" and LEVEL[other] >= level_of(module):
                problems.append(f"{where}: {module} includes {target}, a module "
                                f"{'above' if LEVEL[other] > level_of(module) else 'beside'} it "
                                f"(order: core; world; model, balance; dyn; ckpt; pipe; tools)")
        elif len(parts) >= 2 and parts[0] in LEVEL:
            if parts[0] != module and parts[0] not in OUTSIDE.get(module, (0, set()))[1]:
                problems.append(f"{where}: {module} includes {target}, module {parts[0]}'s "
                                f"private header")
        elif len(parts) == 1 and module in OUTSIDE:
            continue  # a header beside the file in its own tree (kernels/common.cuh)
        elif len(parts) == 1 and not path.startswith(os.path.join(root, "src")):
            problems.append(f"{where}: a public header includes {target}")
        elif len(parts) == 1:
            continue  # a private header beside the file, in its own module
        elif not target.startswith("../../checkpoint_schema/"):
            problems.append(f"{where}: includes {target}, outside any module")


problems = []
checked = 0
for module in LEVEL:
    src = os.path.join(root, "src", module)
    for dirpath, _, files in os.walk(src):
        for name in sorted(files):
            if name.endswith((".c", ".h")):
                check(os.path.join(dirpath, name), module, problems)
                checked += 1
    names = [module] + [h for h, m in PUBLIC_OF.items() if m == module]
    for name in names:
        public = os.path.join(root, "include", "dynmo", name + ".h")
        if os.path.exists(public):
            check(public, module, problems)
            checked += 1
for module in OUTSIDE:
    for dirpath, _, files in os.walk(os.path.join(root, module)):
        for name in sorted(files):
            if name.endswith((".c", ".h", ".cu", ".cuh")):
                check(os.path.join(dirpath, name), module, problems)
                checked += 1
for dirpath, _, files in os.walk(os.path.join(root, "src")):
    top = os.path.relpath(dirpath, os.path.join(root, "src")).split(os.sep)[0]
    if top != "." and top not in LEVEL:
        problems.append(f"src/{top}: a directory that is no module of DESIGN.md")
for p in problems:
    print(p)
print(f"{checked} files checked, {len(problems)} violations")
sys.exit(1 if problems else 0)
