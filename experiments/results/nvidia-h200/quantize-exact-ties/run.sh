#!/usr/bin/env bash
# near_tie_code (elements near a half-step decided by the residual, no division, no reload) against
# main's whole-lane division fallback. A/B of the IntegerCoder kernels + gate of the quantize variants.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
V='^quantize-(groupthread|tokenteam|tensor2pass)$'
mkdir -p "$R/ab"
OUT=$R/ab KVQ_AB_BENCH=quantize KVQ_QUANTIZE_VARIANTS="$V" KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=Int8:Int8" \
  KVQ_SCHEMES='^(int8-head|int8-head-asym|int8-g32|int4-head-asym|int8-token|int4-token-asym|int8-tensor|int4-tensor|int8-tensor-asym|fp8-e4m3-token)$' \
  KVQ_AB_ROUNDS=${ROUNDS:-3} KVQ_AB_PACK=1 KVQ_COMMIT=${HEAD_COMMIT:-unknown} KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} \
  bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
echo "ab rc=$? at $((SECONDS - s)) s"; cat "$R/ab/ab.txt"; tail -3 "$R/ab/device_ab.err"
mv "$R/ab/ab.txt" "$R/ab.txt"; mv "$R/ab/ab_runs.tgz" "$R/ab_runs.tgz"; rm -rf "$R/ab"
K=build-ab-head/experiments/kvq
$K validate --variant "$V" --report /tmp/v.json > "$R/validate_quantize.txt" 2>&1
echo "validate rc=$? at $((SECONDS - s)) s"; grep -c "\[FAIL\]" "$R/validate_quantize.txt"; tail -3 "$R/validate_quantize.txt"
echo "done at $((SECONDS - s)) s"
