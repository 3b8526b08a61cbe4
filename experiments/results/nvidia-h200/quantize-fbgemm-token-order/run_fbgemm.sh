#!/usr/bin/env bash
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
OUT=$R SCHEMES='^(int4-head-asym|int4-g32-asym|int4-head)$' VARIANT='^quantize-groupthread$' ROUNDS=${ROUNDS:-3} \
  bash .ab/multi_ab.sh 2> "$R/multi_ab.err"; echo "ab rc=$? at $((SECONDS - s)) s"; tail -3 "$R/multi_ab.err"
K=build-m/experiments/kvq
V='^quantize-groupthread$'
$K validate --variant "$V" --report /tmp/v.json > /tmp/validate.txt 2>&1
echo "validate rc=$? at $((SECONDS - s)) s"; grep -E "\[FAIL\]|cases, " /tmp/validate.txt | tee "$R/validate_summary.txt"
timeout 150 compute-sanitizer --tool memcheck $K validate --variant '^quantize-groupthread$' --quick --report /tmp/m.json > /tmp/mc.txt 2>&1
echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY|cases, " /tmp/mc.txt | tee "$R/memcheck_summary.txt"
echo "done at $((SECONDS - s)) s"
