#!/usr/bin/env bash
# The main job: set up, build, run the accuracy sweep, say where the results are.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=results/sweep
"${KVQ_BUILD_DIR:-build}"/experiments/kvq sweep --out "$out" "$@"
echo
echo "Results: $out/sweep.csv (one row per layer and scheme pair) and $out/sweep.json (run metadata)."
