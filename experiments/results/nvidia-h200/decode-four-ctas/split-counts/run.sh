#!/usr/bin/env bash
# Split counts 1-4 at the bench shapes where one split's CTAs fill the SMs (llama8b / SmolLM2 B = 64 T = 1K, seed000
# B = 256 / 512). SWEEP_PAIRS / SWEEP_SCHEMES / SWEEP_SHAPES / SWEEP_TIMEOUT narrow it (the bf16 sweep, sw_bf16.tgz:
# SWEEP_PAIRS=Bf16:Bf16 SWEEP_SCHEMES=bf16 SWEEP_SHAPES='smollm2/B(32|64)/|llama8b/B(32|64)/' SWEEP_TIMEOUT=150).
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
KVQ_COMMIT=${HEAD_COMMIT:-unknown} cmake -S . -B build-sw -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF -DKVQ_TC_TUNING= "-DKVQ_TC_PAIRS=${SWEEP_PAIRS:-Int4:Int4;Int8:Int8;Bf16:Bf16;Fp8E4m3:Fp8E4m3}" > "$R/build.log" 2>&1
cmake --build build-sw -j 16 --target kvq >> "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"
OUT=$R/sw KVQ=build-sw/experiments/kvq KVQ_SPLITS="0 1 2 3 4" KVQ_ROUNDS=2 \
  KVQ_SCHEMES=${SWEEP_SCHEMES:-int8-head,int4-g32-asym,int4-head-asym,bf16,fp8-e4m3} \
  KVQ_SHAPES=${SWEEP_SHAPES:-'llama8b/B64/T1024|smollm2/B64/T1024|seed000/B(256|512)/'} \
  timeout "${SWEEP_TIMEOUT:-300}" bash experiments/bench/sweep_splits.sh > /dev/null 2> "$R/sweep.err"
echo "sweep rc=$? at $((SECONDS - s)) s"
cat "$R/sw/sweep.txt"
tar -czf "$R/sw.tgz" -C "$R" sw && rm -rf "$R/sw"; gzip -f "$R/build.log"
