#!/usr/bin/env bash
# The final tree's quantize kernels: every bench-quantize row, compared with the newest committed H200 run
# (compare_runs.py), the quantize targets (targets.py), and the gate over every quantize variant.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
export KVQ_COMMIT=${HEAD_COMMIT:-unknown}
cmake -S . -B build-final -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON_MODULE=OFF \
  -DKVQ_TC_PAIRS=Int8:Int8 > /tmp/cfg.log 2>&1 && cmake --build build-final -j "$(nproc)" --target kvq > /tmp/build.log 2>&1
echo "build rc=$? at $((SECONDS - s)) s"
K=build-final/experiments/kvq
KVQ_COMMIT=${HEAD_COMMIT:-unknown} $K bench-quantize --csv "$R/quantize_bandwidth.csv" > "$R/bench_quantize.txt" 2>&1
echo "bench rc=$? at $((SECONDS - s)) s"
python3 experiments/bench/compare_runs.py "$R/quantize_bandwidth.csv" --results experiments/results \
  --times .ab/run_times.json --csv-out "$R/regressions.csv" > "$R/regressions.txt" 2>&1
echo "compare rc=$?"; tail -25 "$R/regressions.txt"
python3 experiments/bench/targets.py --quantize "$R/quantize_bandwidth.csv" > "$R/targets.txt" 2>&1
echo "targets rc=$?"; cat "$R/targets.txt" | head -30
$K validate --variant '^quantize' --report /tmp/v.json > /tmp/validate.txt 2>&1
echo "validate rc=$? at $((SECONDS - s)) s"
grep -E "\[FAIL\]|cases, " /tmp/validate.txt > "$R/validate_quantize_summary.txt"; cat "$R/validate_quantize_summary.txt"
echo "done at $((SECONDS - s)) s"
