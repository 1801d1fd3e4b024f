#!/usr/bin/env bash
# The main job (make demo): prepares the default corpus on first use, then
# trains the demo GPT with progress lines and a closing summary.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNMO=${DYNMO:-build/dynmo}
export DYNMO
scripts/prepare-corpus.sh
echo "demo: training configs/demo.ini (progress every 10 steps; about 2-3 minutes on 2 cores)"
"$DYNMO" train --config configs/demo.ini "$@"
echo "demo: outputs in runs/demo/ (runlog.h5: per-step loss, timing; read it with"
echo "      build/dynmo inspect runs/demo/runlog.h5 or h5dump)"
