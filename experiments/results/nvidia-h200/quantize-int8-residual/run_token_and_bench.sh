#!/usr/bin/env bash
# int8 codes by the residual (groupthread int8, tokenteam int8) and exact_code without branches:
# A/B of the tokenteam rows against .ab/files, then every bench-quantize row of this tree
# (compare_runs, targets), ncu of int8-head groupthread, the quantize gate and memcheck.
set -uo pipefail
R=$OUT; mkdir -p "$R/ab"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
rm -rf build-ab-*
s=$SECONDS
OUT=$R/ab KVQ_AB_BENCH=quantize KVQ_QUANTIZE_VARIANTS='^quantize-(tokenteam|groupthread)$' KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=Int8:Int8" \
  KVQ_SCHEMES='^(int8-token|int4-token-asym|int8-head|int4-head-asym)$' \
  KVQ_AB_ROUNDS=2 KVQ_AB_PACK=1 KVQ_COMMIT=${HEAD_COMMIT:-unknown} KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} \
  bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
echo "ab rc=$? at $((SECONDS - s)) s"; cat "$R/ab/ab.txt"
mv "$R/ab/ab.txt" "$R/ab_token.txt"; mv "$R/ab/ab_runs.tgz" "$R/ab_token_runs.tgz"; rm -rf "$R/ab"
K=build-ab-head/experiments/kvq
mkdir -p "$R/bench"
$K bench-quantize --csv "$R/bench/quantize_bandwidth.csv" > "$R/bench/bench_quantize.txt" 2>&1
echo "bench rc=$? at $((SECONDS - s)) s"
python3 experiments/bench/compare_runs.py "$R/bench/quantize_bandwidth.csv" --results experiments/results --times .ab/run_times.json \
  --csv-out "$R/bench/regressions.csv" > "$R/bench/regressions.txt" 2>&1
echo "compare rc=$?"; tail -22 "$R/bench/regressions.txt"
python3 experiments/bench/targets.py --quantize "$R/bench/quantize_bandwidth.csv" > "$R/bench/targets.txt" 2>&1
echo "targets rc=$?"; head -34 "$R/bench/targets.txt"
sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
timeout 60 ncu $sec --kernel-name-base mangled -k regex:groupthread_int8 -c 1 $K bench-quantize --schemes '^int8-head$' \
  --variant '^quantize-groupthread$' --reps 1 --csv /tmp/n.csv > "$R/bench/ncu_int8_head.txt" 2>&1
echo "ncu rc=$? at $((SECONDS - s)) s"
grep -E "Duration|DRAM Throughput|Executed Instructions  |Registers Per|Achieved Occupancy|Avg. Active Threads" "$R/bench/ncu_int8_head.txt" | head -8
$K validate --variant '^quantize' --report /tmp/v.json > /tmp/validate.txt 2>&1
echo "validate rc=$? at $((SECONDS - s)) s"
grep -E "\[FAIL\]|cases, " /tmp/validate.txt > "$R/validate_quantize_summary.txt"; cat "$R/validate_quantize_summary.txt"
timeout 120 compute-sanitizer --tool memcheck $K validate --variant '^quantize-(groupthread|tokenteam|tensor2pass)$' --quick --report /tmp/m.json > /tmp/mc.txt 2>&1
echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY|cases, " /tmp/mc.txt | tee "$R/memcheck_summary.txt"
tar czf "$R/bench.tgz" -C "$R" bench && rm -rf "$R/bench"
echo "done at $((SECONDS - s)) s"
