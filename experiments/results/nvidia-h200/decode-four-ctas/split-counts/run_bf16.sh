#!/usr/bin/env bash
# Split counts 1-4 at the bench shapes where one split's CTAs fill the SMs with short keys (llama8b / SmolLM2 B = 64 T = 1K).
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
KVQ_COMMIT=${HEAD_COMMIT:-unknown} cmake -S . -B build-sw -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF -DKVQ_TC_TUNING= "-DKVQ_TC_PAIRS=Bf16:Bf16" > "$R/build.log" 2>&1
cmake --build build-sw -j 16 --target kvq >> "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"
OUT=$R/sw KVQ=build-sw/experiments/kvq KVQ_SPLITS="0 1 2 3 4" KVQ_ROUNDS=2 \
  KVQ_SCHEMES=bf16 KVQ_SHAPES='smollm2/B(32|64)/|llama8b/B(32|64)/' \
  timeout 150 bash experiments/bench/sweep_splits.sh > /dev/null 2> "$R/sweep.err"
echo "sweep rc=$? at $((SECONDS - s)) s"
cat "$R/sw/sweep.txt"
tar -czf "$R/sw.tgz" -C "$R" sw && rm -rf "$R/sw"; gzip -f "$R/build.log"
