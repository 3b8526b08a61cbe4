#!/usr/bin/env bash
# Split counts of windowed (+w128) decodes against their plain schemes at seed000 B = 32-128: whether a
# quantized split count that leaves the window's CTAs room brings +w128 within 1.1x of plain.
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
cmake -S . -B build-sw -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF "-DKVQ_TC_PAIRS=Int4:Int4;Int8:Int8;Bf16:Bf16" > "$R/build.log" 2>&1
cmake --build build-sw -j 16 --target kvq >> "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"
OUT=$R/sw KVQ=build-sw/experiments/kvq KVQ_SPLITS="${SPLITS:-0 1 2 3 4 6}" KVQ_ROUNDS=2 \
  KVQ_SCHEMES=int4-g32-asym,int4-g32-asym+w128,int8-head,int8-head+w128,int4-head-asym,int4-head-asym+w128 \
  KVQ_SHAPES="${SHAPES:-seed000/B(32|64|128)/}" \
  timeout 330 bash experiments/bench/sweep_splits.sh > /dev/null 2> "$R/sweep.err"
echo "sweep rc=$? at $((SECONDS - s)) s"
cat "$R/sw/sweep.txt"
tar -czf "$R/sw.tgz" -C "$R" sw && rm -rf "$R/sw"; gzip -f "$R/build.log"
