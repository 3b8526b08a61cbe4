#!/usr/bin/env bash
# The gate of this tree on the full build (every pair), then memcheck over decode-tc's quick gate.
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
start=$SECONDS
cmake -S . -B build-full -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON_MODULE=OFF > $R/build.log 2>&1 \
  && cmake --build build-full -j 16 --target kvq >> $R/build.log 2>&1 || { echo build failed; tail -20 $R/build.log; exit 1; }
echo "built in $((SECONDS - start)) s"
start=$SECONDS
build-full/experiments/kvq validate --variant '^decode-tc$' --report $R/validate.json > $R/validate.log 2>&1
echo "validate rc=$? in $((SECONDS - start)) s"; tail -n 2 $R/validate.log; grep -c "^\[OK\]" $R/validate.log
start=$SECONDS
timeout 170 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 build-full/experiments/kvq validate --quick \
  --variant '^decode-tc$' --report /tmp/memcheck.json > $R/memcheck.log 2>&1
echo "memcheck rc=$? in $((SECONDS - start)) s"; grep -E "SUMMARY|FAIL\]" $R/memcheck.log | tail -3; tail -n 2 $R/memcheck.log
gzip -f $R/validate.json $R/validate.log $R/memcheck.log $R/build.log
