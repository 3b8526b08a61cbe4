#!/usr/bin/env bash
# Every bench-quantize row on both inputs, the regression check against the newest committed H200 rows,
# and targets.py per input.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
export KVQ_COMMIT=${HEAD_COMMIT:-unknown}
cmake -S . -B build-final -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON_MODULE=OFF \
  -DKVQ_TC_TUNING= -DKVQ_TC_PAIRS=Int4:Int4 > /tmp/cfg.log 2>&1 && cmake --build build-final -j "$(nproc)" --target kvq > /tmp/build.log 2>&1
echo "build rc=$? at $((SECONDS - s)) s"
K=build-final/experiments/kvq
$K bench-quantize --input uniform,gaussian-rows --csv "$R/quantize_bandwidth.csv" > "$R/bench_quantize.txt" 2>&1
echo "bench rc=$? at $((SECONDS - s)) s"
python3 experiments/bench/compare_runs.py "$R/quantize_bandwidth.csv" --results experiments/results --times .ab/run_times.json \
  --csv-out "$R/regressions.csv" > "$R/regressions.txt" 2>&1
echo "compare rc=$?"; tail -30 "$R/regressions.txt"
for input in uniform gaussian-rows; do
  python3 experiments/bench/targets.py --quantize "$R/quantize_bandwidth.csv" --input $input --all > "$R/targets_$input.txt" 2>&1
  echo "targets $input rc=$?"; grep -E "MET|NOT MET" "$R/targets_$input.txt"
done
echo "done at $((SECONDS - s)) s"
