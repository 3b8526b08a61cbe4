#!/usr/bin/env bash
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
OUT=$R SCHEMES='^(int4-head-asym|int4-g32-asym|q5_1)$' VARIANT='^quantize-(groupthread|generic)$' INPUT=uniform ROUNDS=${ROUNDS:-1} \
  bash .ab/multi_ab.sh 2> "$R/multi_ab.err"; echo "ab rc=$? at $((SECONDS - s)) s"
K=build-m/experiments/kvq
timeout 60 $K validate --variant '^quantize-groupthread$' --quick --report /tmp/v.json > /tmp/validate.txt 2>&1
echo "validate rc=$? at $((SECONDS - s)) s"; grep -E "\[FAIL\]|cases, " /tmp/validate.txt | tee "$R/validate_summary.txt"
