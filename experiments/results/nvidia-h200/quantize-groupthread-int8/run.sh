#!/usr/bin/env bash
# groupthread_int8_kernel (held segment, IntegerCoder, 4 blocks an SM) for int8 planar codes against main's
# groupthread: A/B (main's file laid over this tree), the gate and memcheck, ncu of one int8-head launch each.
set -uo pipefail
R=$OUT; mkdir -p "$R/ab"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
OUT=$R/ab KVQ_AB_BENCH=quantize KVQ_QUANTIZE_VARIANTS='^quantize-groupthread$' KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=Int8:Int8" \
  KVQ_AB_ROUNDS=3 KVQ_AB_PACK=1 KVQ_COMMIT=${HEAD_COMMIT:-unknown} KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} \
  bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
echo "ab rc=$? at $((SECONDS - s)) s"; cat "$R/ab/ab.txt"; tail -3 "$R/ab/device_ab.err"
mv "$R/ab/ab.txt" "$R/ab.txt"; mv "$R/ab/ab_runs.tgz" "$R/ab_runs.tgz"; rm -rf "$R/ab"
K=build-ab-head/experiments/kvq
$K validate --variant '^quantize-groupthread$' --report /tmp/v.json > "$R/validate_groupthread.txt" 2>&1
echo "validate rc=$?"; grep -c "\[FAIL\]" "$R/validate_groupthread.txt"; tail -2 "$R/validate_groupthread.txt"
compute-sanitizer --tool memcheck $K validate --variant '^quantize-groupthread$' --quick --report /tmp/m.json > "$R/memcheck_groupthread.txt" 2>&1
echo "memcheck rc=$?"; tail -2 "$R/memcheck_groupthread.txt"
sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis"
for side in base head; do
  ncu $sec -k regex:groupthread -c 1 build-ab-$side/experiments/kvq bench-quantize --schemes '^int8-head$' \
    --variant '^quantize-groupthread$' --reps 1 --csv /tmp/n.csv > "$R/ncu_int8_head_$side.txt" 2>&1
  echo "ncu $side rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy|Warp Cycles Per Issued|groupthread" "$R/ncu_int8_head_$side.txt" | head -12
done
echo "done at $((SECONDS - s)) s"
