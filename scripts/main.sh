#!/usr/bin/env bash
# The main job: set up, build, sweep every quantization scheme over the bundled real capture (or
# the dumps given as arguments), draw the figures, run the bundled model end to end with its KV cache
# quantized (kvq eval, without arguments only), and say where everything is.
# Arguments go to `kvq sweep`, e.g.  bash scripts/main.sh my_capture.h5 --k int8-head --v int4-g32-asym
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${KVQ_RESULTS:-results/sweep}
dump=data/dumps/stories260k.h5
for arg in "$@"; do
  if [[ $arg == *.h5 ]]; then dump=$arg; break; fi
done
"${KVQ_BUILD_DIR:-build}"/experiments/kvq sweep --out "$out" "$@"
echo
.venv/bin/python notebooks/kvq_plots.py "$out" --dump "$dump"
echo
echo "Results in $out/: sweep.csv (one row per layer and K/V scheme pair), sweep_heads.csv (per head),"
echo "sweep.json (run metadata), plots/*.png. Notebooks: notebooks/error_vs_group_size.ipynb, notebooks/tradeoff.ipynb."
if (($# == 0)); then
  # End to end: stories260K over data/texts/tinystory.txt, every layer's cache quantized as tokens
  # arrive, beside the sweep's attention error for the same pairs (the kvq module is in build/python).
  echo
  eval_out=${KVQ_EVAL_RESULTS:-results/eval}
  PYTHONPATH="${KVQ_BUILD_DIR:-build}/python" .venv/bin/python experiments/eval/kvq_eval.py --out "$eval_out" \
    --sweep "$out/sweep.csv"
  echo "Rank the pairs by end-to-end KL: ${KVQ_BUILD_DIR:-build}/experiments/kvq recommend $eval_out/eval.csv --max-kld 0.001"
fi
