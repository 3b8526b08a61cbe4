#!/usr/bin/env bash
# mxfp4's exponent read from amax's bits (the double log2 only within 2^-12 below a power of two)
# against main's double log2 per block: A/B (main's quant/block_formats.hpp laid over this tree),
# the gate over quantize-generic's block formats and the device exponent check.
set -uo pipefail
R=$OUT; mkdir -p "$R/ab"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
OUT=$R/ab KVQ_AB_BENCH=quantize KVQ_QUANTIZE_VARIANTS='^quantize-generic$' KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=Int8:Int8" \
  KVQ_SCHEMES='^(mxfp4|q4_0|nvfp4)$' KVQ_AB_ROUNDS=3 KVQ_AB_PACK=1 \
  KVQ_COMMIT=${HEAD_COMMIT:-unknown} KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} \
  bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
echo "ab rc=$? at $((SECONDS - s)) s"; cat "$R/ab/ab.txt"; tail -3 "$R/ab/device_ab.err"
mv "$R/ab/ab.txt" "$R/ab.txt"; mv "$R/ab/ab_runs.tgz" "$R/ab_runs.tgz"; rm -rf "$R/ab"
K=build-ab-head/experiments/kvq
$K validate --variant '^quantize-generic$' --report /tmp/v.json 2>&1 | grep -E "mxfp4|\[FAIL\]|cases," > "$R/validate_generic_mxfp4.txt"
echo "validate rc=$? at $((SECONDS - s)) s"; grep -c "\[FAIL\]" "$R/validate_generic_mxfp4.txt"; grep "cases," "$R/validate_generic_mxfp4.txt"
cmake --build build-ab-tree -j "$(nproc)" --target kvq_gpu_tests > "$R/build_tests.log" 2>&1
T=$(find build-ab-tree -name kvq_gpu_tests -type f | head -1)
$T -tc='*mxfp4*' -s > "$R/test_gpu_mxfp4.txt" 2>&1
echo "tests rc=$? at $((SECONDS - s)) s"; grep -E "test cases|assertions" "$R/test_gpu_mxfp4.txt"
for side in base head; do
  ncu --section SpeedOfLight --section InstructionStats --section Occupancy -k regex:block_quantize -c 1 \
    build-ab-$side/experiments/kvq bench-quantize --schemes '^mxfp4$' --variant '^quantize-generic$' --reps 1 \
    --csv /tmp/n.csv > "$R/ncu_mxfp4_$side.txt" 2>&1
  echo "ncu $side rc=$?"; grep -E "Duration|DRAM Throughput|Executed Instructions  |Registers Per" "$R/ncu_mxfp4_$side.txt"
done
echo "done at $((SECONDS - s)) s"
