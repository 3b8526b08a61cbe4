#!/usr/bin/env bash
# Fp8Coder (two multiplies and a paired conversion) in quantize-groupthread / -tokenteam / -tensor2pass
# against main's encode() by division. PHASE=ab: A/B (main's four gpu files laid over this tree) + gate.
# PHASE=check: the device tests (exhaustive Fp8Coder check), memcheck, ncu base/head.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
V='^quantize-(groupthread|tokenteam|tensor2pass)$'
if [[ ${PHASE:-ab} == ab ]]; then
  mkdir -p "$R/ab"
  OUT=$R/ab KVQ_AB_BENCH=quantize KVQ_QUANTIZE_VARIANTS="$V" KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=Int8:Int8" \
    KVQ_SCHEMES='^(fp8-e4m3-head|fp8-e4m3-token|fp8-e4m3-tensor|int8-head|int8-token|int8-tensor)$' \
    KVQ_AB_ROUNDS=3 KVQ_AB_PACK=1 KVQ_COMMIT=${HEAD_COMMIT:-unknown} KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} \
    bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
  echo "ab rc=$? at $((SECONDS - s)) s"; cat "$R/ab/ab.txt"; tail -3 "$R/ab/device_ab.err"
  mv "$R/ab/ab.txt" "$R/ab.txt"; mv "$R/ab/ab_runs.tgz" "$R/ab_runs.tgz"; rm -rf "$R/ab"
  K=build-ab-head/experiments/kvq
  $K validate --variant "$V" --report /tmp/v.json > "$R/validate_quantize.txt" 2>&1
  echo "validate rc=$? at $((SECONDS - s)) s"; grep -c "\[FAIL\]" "$R/validate_quantize.txt"; tail -3 "$R/validate_quantize.txt"
else
  cmake --build build-ab-tree -j "$(nproc)" --target kvq_gpu_tests kvq > "$R/build_tests.log" 2>&1
  echo "build rc=$? at $((SECONDS - s)) s"
  T=$(find build-ab-tree -name kvq_gpu_tests -type f | head -1)
  $T -tc='*fp8*,*Fp8Coder*' -s > "$R/test_gpu_fp8.txt" 2>&1
  echo "tests rc=$? at $((SECONDS - s)) s"; grep -E "MESSAGE|scale|test cases|assertions" "$R/test_gpu_fp8.txt" | head -20
  K=build-ab-tree/experiments/kvq
  compute-sanitizer --tool memcheck $K validate --variant "$V" --quick --report /tmp/m.json > "$R/memcheck_quantize.txt" 2>&1
  echo "memcheck rc=$? at $((SECONDS - s)) s"; tail -2 "$R/memcheck_quantize.txt"
  sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
  for side in base head; do
    for c in "fp8-e4m3-head groupthread" "fp8-e4m3-tensor tensor_encode"; do
      set -- $c
      ncu $sec -k regex:$2 -c 1 build-ab-$side/experiments/kvq bench-quantize --schemes "^$1\$" \
        --variant "$V" --reps 1 --csv /tmp/n.csv > "$R/ncu_${1}_$side.txt" 2>&1
      echo "ncu $1 $side rc=$?"
      grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy" "$R/ncu_${1}_$side.txt" | head -8
    done
  done
fi
echo "done at $((SECONDS - s)) s"
