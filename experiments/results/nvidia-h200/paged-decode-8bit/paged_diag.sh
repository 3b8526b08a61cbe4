#!/usr/bin/env bash
# paged 8-bit pairs: shuffled / in-order pools, NHD / HND, 2 vs 3 stages (H200)
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
echo "commit ${KVQ_COMMIT:-unknown}" >> $OUT/gpu.txt
start=$SECONDS
b() { # dir extra-cuda-flags
  cmake -S . -B $1 -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON=python3 \
   "-DKVQ_TC_PAIRS=Int8:Int8;Fp8E4m3:Fp8E4m3" "-DCMAKE_CUDA_FLAGS=$2" > $OUT/build_$1.log 2>&1 && cmake --build $1 -j 8 --target _gpu _core >> $OUT/build_$1.log 2>&1
}
b build-gpu "" & b build-s3 "-DKVQ_TC_STAGES=3" & wait
echo "builds $((SECONDS-start)) s"; ls build-gpu/python/kvq build-s3/python/kvq 2>&1 | grep -c _gpu
run() { # name build extra-args
  PYTHONPATH=$2/python timeout 150 python3 experiments/bench/bench_paged.py --out $OUT/$1.csv --pages 16 \
    --pairs 'int8-head|fp8' --shapes "${SHAPES_RE:-.}" ${@:3} 2> $OUT/$1.log | sed "s/^/$1: /"
}
run nhd_shuffled build-gpu
run nhd_inorder build-gpu --pool-order in-order
run hnd_shuffled build-gpu --layout hnd
[[ -e build-s3/python/kvq ]] && run nhd_shuffled_s3 build-s3
echo "total $((SECONDS-start)) s"
