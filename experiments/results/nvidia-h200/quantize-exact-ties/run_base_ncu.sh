#!/usr/bin/env bash
# ncu before/after (int8-head groupthread, int4-token-asym tokenteam, Hkv 8) and memcheck of the
# IntegerCoder kernels with exact_code.
set -uo pipefail
R=$OUT; mkdir -p "$R"
s=$SECONDS
V='^quantize-(groupthread|tokenteam|tensor2pass)$'
mkdir -p "$R/ab"
OUT=$R/ab KVQ_AB_BENCH=quantize KVQ_QUANTIZE_VARIANTS="$V" KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=Int8:Int8" \
  KVQ_SCHEMES='^(int8-head|int4-token-asym)$' KVQ_AB_ROUNDS=1 KVQ_COMMIT=${HEAD_COMMIT:-unknown} \
  KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
echo "ab rc=$? at $((SECONDS - s)) s"; rm -rf "$R/ab"
sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
for side in base head; do
  for c in "int8-head groupthread_int8" "int4-token-asym token_kernel"; do
    set -- $c
    timeout 100 ncu $sec -k regex:$2 -c 1 build-ab-$side/experiments/kvq bench-quantize --schemes "^$1\$" \
      --variant "$V" --reps 1 --csv /tmp/n.csv > "$R/ncu_${1}_$side.txt" 2>&1
    echo "ncu $1 $side rc=$? at $((SECONDS - s)) s"
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy|Block Size|Grid Size" "$R/ncu_${1}_$side.txt" | head -10
  done
done
K=build-ab-head/experiments/kvq
timeout 150 compute-sanitizer --tool memcheck $K validate --variant "$V" --quick --report /tmp/m.json > "$R/memcheck_quantize.txt" 2>&1
echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY|\[OK\]|\[FAIL\]" "$R/memcheck_quantize.txt" | tail -5
echo "done at $((SECONDS - s)) s"
