#!/usr/bin/env bash
# int4 groupthread: C (invariant-divisor indexing, encode()), B (+ IntegerCoder, segment retried by the
# residual, 5 blocks/SM), A (+ IntegerCoder per chunk via encode_chunk, 4 blocks/SM) against main.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
rm -rf build-ab-*
s=$SECONDS
V='^quantize-groupthread$'
for v in ${VARIANTS:-C B A}; do
  cp .ab/v$v/gpu/quantize_groupthread.cu gpu/quantize_groupthread.cu
  mkdir -p "$R/ab$v"
  OUT=$R/ab$v KVQ_AB_BENCH=quantize KVQ_QUANTIZE_VARIANTS="$V" KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=Int8:Int8" \
    KVQ_SCHEMES='^(int4-head-asym|int4-g64-asym|int4-g32-asym|int4-head|int4-g32)$' \
    KVQ_AB_ROUNDS=${ROUNDS:-3} KVQ_AB_PACK=1 KVQ_COMMIT=${HEAD_COMMIT:-unknown}-$v KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} \
    bash scripts/device_ab.sh .ab/files 2> "$R/ab$v/device_ab.err"
  echo "ab $v rc=$? at $((SECONDS - s)) s"; cat "$R/ab$v/ab.txt"; tail -2 "$R/ab$v/device_ab.err"
  mv "$R/ab$v/ab.txt" "$R/ab_$v.txt"; rm -rf "$R/ab$v"
  if [[ ${VALIDATE:-1} == 1 ]]; then
    build-ab-head/experiments/kvq validate --variant "$V" --report /tmp/v.json > "$R/validate_$v.txt" 2>&1
    echo "validate $v rc=$? at $((SECONDS - s)) s"; grep -c "\[FAIL\]" "$R/validate_$v.txt"; tail -2 "$R/validate_$v.txt"
  fi
done
echo "done at $((SECONDS - s)) s"
