#!/usr/bin/env bash
# Quantize A/B on the device (multi_ab.sh: this tree against the files in .ab/variants/*/), then the
# gate and memcheck on this tree's build. QSCHEMES / QVARIANT: bench-quantize's --schemes / --variant.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
V=${QVARIANT:-'^quantize-tokenteam$'}
OUT=$R SCHEMES="${QSCHEMES:-^(int8-token|int4-token-asym|fp8-e4m3-token)$}" VARIANT="$V" ROUNDS=${ROUNDS:-3} \
  bash .ab/multi_ab.sh 2> "$R/multi_ab.err"; echo "ab rc=$? at $((SECONDS - s)) s"; tail -3 "$R/multi_ab.err"
K=build-m/experiments/kvq
$K validate --variant "$V" --report /tmp/v.json > /tmp/validate.txt 2>&1
echo "validate rc=$? at $((SECONDS - s)) s"; grep -E "\[FAIL\]|cases, " /tmp/validate.txt | tee "$R/validate_summary.txt"
timeout 150 compute-sanitizer --tool memcheck $K validate --variant "$V" --quick --report /tmp/m.json > /tmp/mc.txt 2>&1
echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY|cases, " /tmp/mc.txt | tee "$R/memcheck_summary.txt"
echo "done at $((SECONDS - s)) s"
