#!/usr/bin/env bash
# Paged / contiguous for the 8-bit pairs at pages of 16, 32, 64 and 128 tokens, NHD and HND pools
# (shuffled), over a build of those pairs only (H200).
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
echo "commit ${KVQ_COMMIT:-unknown}" >> $OUT/gpu.txt
start=$SECONDS
{ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON=python3 \
    "-DKVQ_TC_PAIRS=Int8:Int8;Fp8E4m3:Fp8E4m3" && cmake --build build-gpu -j 16 --target _gpu _core; } > $OUT/build.log 2>&1 ||
  { echo "BUILD FAIL"; tail -20 $OUT/build.log; exit 1; }
echo "build $((SECONDS-start)) s"
for layout in nhd hnd; do
  PYTHONPATH=build-gpu/python timeout 150 python3 experiments/bench/bench_paged.py --out $OUT/paged_$layout.csv \
    --pages 16 32 64 128 --layout $layout --pairs "int8-head|fp8" --shapes . > /dev/null 2> $OUT/$layout.err
  echo "$layout rc=$? $((SECONDS-start)) s"
done
