#!/usr/bin/env bash
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
OUT=$R SCHEMES='^(int4-head-asym|int4-g32-asym|int8-head-asym|int8-head|int8-g32)$' VARIANT='^quantize-groupthread$' ROUNDS=${ROUNDS:-2} \
  bash .ab/multi_ab.sh 2> "$R/multi_ab.err"; echo "ab rc=$? at $((SECONDS - s)) s"; tail -3 "$R/multi_ab.err"
