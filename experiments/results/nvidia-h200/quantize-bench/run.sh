#!/usr/bin/env bash
# The final tree: every bench-quantize row (compare_runs.py against the newest committed H200 run,
# targets.py), the gate over every quantize variant, ncu of the int4 groupthread launches (first
# launch, Hkv 1: planar and FBGEMM rows) and of tokenteam int4-token-asym / int8-token, memcheck.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
rm -rf build-ab-* build-final
export KVQ_COMMIT=${HEAD_COMMIT:-unknown}
cmake -S . -B build-final -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON_MODULE=OFF \
  -DKVQ_TC_TUNING= -DKVQ_TC_PAIRS=Int8:Int8 > /tmp/cfg.log 2>&1 && cmake --build build-final -j "$(nproc)" --target kvq > /tmp/build.log 2>&1
echo "build rc=$? at $((SECONDS - s)) s"
K=build-final/experiments/kvq
$K bench-quantize --csv "$R/quantize_bandwidth.csv" > "$R/bench_quantize.txt" 2>&1
echo "bench rc=$? at $((SECONDS - s)) s"
python3 experiments/bench/compare_runs.py "$R/quantize_bandwidth.csv" --results experiments/results --times .ab/run_times.json \
  --csv-out "$R/regressions.csv" > "$R/regressions.txt" 2>&1
echo "compare rc=$?"; tail -25 "$R/regressions.txt"
python3 experiments/bench/targets.py --quantize "$R/quantize_bandwidth.csv" > "$R/targets.txt" 2>&1
echo "targets rc=$?"; head -40 "$R/targets.txt"
sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
for c in "int4-head-asym planar groupthread_kernelItLNS_10InputDtypeE2ELb1ELb1E groupthread" \
         "int4-head-asym fbgemm groupthread_kernelItLNS_10InputDtypeE2ELb1ELb0E groupthread" \
         "int4-token-asym planar token_kernel tokenteam" "int8-token planar token_kernel tokenteam"; do
  set -- $c
  timeout 60 ncu $sec --kernel-name-base mangled -k regex:$3 -c 1 $K bench-quantize --schemes "^$1\$" \
    --variant "^quantize-$4\$" --reps 1 --csv /tmp/n.csv > "$R/ncu_${1}_$2.txt" 2>&1
  echo "ncu $1 $2 rc=$? at $((SECONDS - s)) s"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy" "$R/ncu_${1}_$2.txt" | head -8
done
$K validate --variant '^quantize' --report /tmp/v.json > /tmp/validate.txt 2>&1
echo "validate rc=$? at $((SECONDS - s)) s"
grep -E "\[FAIL\]|cases, " /tmp/validate.txt > "$R/validate_quantize_summary.txt"; cat "$R/validate_quantize_summary.txt"
timeout 120 compute-sanitizer --tool memcheck $K validate --variant '^quantize-groupthread$' --quick --report /tmp/m.json > "$R/memcheck_groupthread.txt" 2>&1
echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY|cases, " "$R/memcheck_groupthread.txt" | tail -3
tar czf "$R/ncu.tgz" -C "$R" $(cd "$R" && ls ncu_*.txt) && rm "$R"/ncu_*.txt
echo "done at $((SECONDS - s)) s"
