#!/usr/bin/env bash
# next/int8-residual-segment (checked out) against main's quantize files in .ab/files, on both
# bench inputs (uniform, gaussian-rows), then the quantize gate and memcheck on this tree.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
rm -rf build-ab-*
s=$SECONDS
V='^quantize-(tokenteam|groupthread|tensor2pass)$'
for input in ${INPUTS:-uniform gaussian-rows}; do
  mkdir -p "$R/ab"
  OUT=$R/ab KVQ_AB_BENCH=quantize KVQ_QUANTIZE_VARIANTS="$V" KVQ_QUANTIZE_INPUT=$input KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=Int8:Int8" \
    KVQ_SCHEMES=${QSCHEMES:-'^(int8-head|int8-head-asym|int8-g32|int8-token|int4-token-asym|int4-head-asym|int4-g32-asym|int8-tensor)$'} \
    KVQ_AB_ROUNDS=${ROUNDS:-2} KVQ_AB_PACK=1 KVQ_COMMIT=${HEAD_COMMIT:-unknown} KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} \
    bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
  echo "ab $input rc=$? at $((SECONDS - s)) s"; cat "$R/ab/ab.txt"
  mv "$R/ab/ab.txt" "$R/ab_$input.txt"; mv "$R/ab/ab_runs.tgz" "$R/ab_${input}_runs.tgz"; rm -rf "$R/ab"
done
K=build-ab-head/experiments/kvq
$K validate --variant "$V" --report /tmp/v.json > /tmp/validate.txt 2>&1
echo "validate rc=$? at $((SECONDS - s)) s"; grep -E "\[FAIL\]|cases, " /tmp/validate.txt | tee "$R/validate_summary.txt"
timeout 90 compute-sanitizer --tool memcheck $K validate --variant "$V" --quick --report /tmp/m.json > /tmp/mc.txt 2>&1
echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY|cases, " /tmp/mc.txt | tee "$R/memcheck_summary.txt"
echo "done at $((SECONDS - s)) s"
