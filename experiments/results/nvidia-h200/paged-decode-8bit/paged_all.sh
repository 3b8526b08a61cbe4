#!/usr/bin/env bash
# bench_paged over every quantized pair at pages of 16 (NHD, shuffled), H200
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
export KVQ_COMMIT=${KVQ_COMMIT:-unknown}; echo "commit $KVQ_COMMIT" >> $OUT/gpu.txt
start=$SECONDS
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON=python3 \
  "-DKVQ_TC_PAIRS=${PAIRS_BUILD}" > $OUT/build.log 2>&1 && cmake --build build-gpu -j 16 --target _gpu _core >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $((SECONDS-start)) s"
PYTHONPATH=build-gpu/python timeout ${BENCH_TIMEOUT:-420} python3 experiments/bench/bench_paged.py --out $OUT/paged.csv \
  --pages ${PAGES:-16} --pairs "${PAIRS_RE}" --shapes "${SHAPES_RE:-.}" --reps ${REPS:-30} 2> $OUT/bench.log | tee $OUT/summary.txt
tail -3 $OUT/bench.log
echo "total $((SECONDS-start)) s"
