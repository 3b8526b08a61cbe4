#!/usr/bin/env bash
# ncu of the bf16 kernel, main (16-key steps) and this tree (32-key steps where a split's CTAs fit on the SMs).
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
b() { cmake -S . -B build-ncu -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON_MODULE=OFF \
      -DKVQ_TC_PAIRS=Bf16:Bf16 > $R/build_$1.log 2>&1 && cmake --build build-ncu -j 16 --target kvq >> $R/build_$1.log 2>&1 \
      && cp build-ncu/experiments/kvq /tmp/kvq-$1; }
start=$SECONDS; b head || { tail $R/build_head.log; exit 1; }; echo "head built $((SECONDS-start)) s"
saved=$(mktemp -d); files=$(cd .ab/files && find . -type f | sed 's|^\./||')
for f in $files; do mkdir -p $saved/$(dirname $f); cp $f $saved/$f; cp .ab/files/$f $f; done
b main || { tail $R/build_main.log; }; echo "main built $((SECONDS-start)) s"
for f in $files; do cp $saved/$f $f; done
for side in main head; do
  OUT=$R/$side KVQ_BIN=/tmp/kvq-$side KVQ_NCU_WARM=1 KVQ_PROFILE_CASES="bf16@smollm2/B8/T8192 bf16@llama8b/B1/T1024" \
    bash experiments/bench/profile_decode_tc.sh 2>&1 | tail -30
done
rm -f $R/build_*.log
