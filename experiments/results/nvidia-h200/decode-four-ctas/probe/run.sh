#!/usr/bin/env bash
# A/B: int4 kernels with registers budgeted for 4 CTAs/SM (KVQ_TC_MIN_CTAS=4) against this commit.
set -uo pipefail
R=$OUT
mkdir -p "$R/ab"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
OUT=$R/ab KVQ_AB_CMAKE='-DKVQ_TC_PAIRS=Int4:Int4' KVQ_AB_CMAKE_HEAD='-DKVQ_TC_TUNING=KVQ_TC_MIN_CTAS=4' \
  KVQ_SCHEMES=int4-head-asym,int4-g32-asym KVQ_SHAPES='seed000|llama8b/B(8|64)/' KVQ_AB_ROUNDS=3 KVQ_AB_PACK=1 \
  KVQ_COMMIT=min-ctas-4 KVQ_BASE_COMMIT=39d0e0d bash scripts/device_ab.sh .ab/base 2> "$R/ab/device_ab.err"
echo "ab rc=$?"
cat "$R/ab/ab.txt"
grep -h "spill\|registers" build-ab-head/*.log 2>/dev/null | head
tail -5 "$R/ab/device_ab.err"
