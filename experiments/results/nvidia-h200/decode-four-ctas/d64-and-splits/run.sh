#!/usr/bin/env bash
# D = 64 kernels (SmolLM2) at 4 CTAs/SM, then split sweeps of int4-head on both builds: residency vs split count.
set -uo pipefail
R=$OUT
mkdir -p "$R/ab" "$R/sw"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
OUT=$R/ab KVQ_AB_CMAKE='-DKVQ_TC_PAIRS=Int4:Int4;Int8:Int8' KVQ_AB_CMAKE_HEAD='-DKVQ_TC_TUNING=KVQ_TC_MIN_CTAS=4' \
  KVQ_SCHEMES=int4-head-asym,int4-g32-asym,int8-head KVQ_SHAPES='smollm2/' KVQ_AB_ROUNDS=2 KVQ_AB_PACK=1 \
  KVQ_COMMIT=min-ctas-4 KVQ_BASE_COMMIT=39d0e0d bash scripts/device_ab.sh .ab/base 2> "$R/ab/device_ab.err"
echo "ab rc=$?"
cat "$R/ab/ab.txt"
for side in base head; do
  OUT=$R/sw/$side KVQ=build-ab-$side/experiments/kvq KVQ_SPLITS="0 1 2 3 4" KVQ_ROUNDS=1 KVQ_SCHEMES=int4-head-asym \
    KVQ_SHAPES='llama8b/B64/T1024|seed000/B(128|256|512)/' bash experiments/bench/sweep_splits.sh > /dev/null 2>&1
  echo "== $side"; cat "$R/sw/$side/sweep.txt"
done
tar -czf "$R/sw.tgz" -C "$R" sw && rm -rf "$R/sw"
