#!/usr/bin/env bash
# FP8 head / gG schemes through groupthread_int8_kernel: gate, memcheck, bench-quantize of the FP8 and int8 head rows.
set -uo pipefail
R=$OUT; s=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
cmake -S . -B build-ab-tree -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON_MODULE=OFF \
  -DKVQ_TC_TUNING= "-DKVQ_TC_PAIRS=Int8:Int8" > /tmp/b.log 2>&1 && cmake --build build-ab-tree -j 16 --target kvq >> /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "built in $((SECONDS - s)) s"
K=build-ab-tree/experiments/kvq
$K validate --variant '^quantize-groupthread$' --report /tmp/v.json > "$R/validate_groupthread.txt" 2>&1
echo "validate rc=$?"; grep -c "\[FAIL\]" "$R/validate_groupthread.txt"; grep -c "fp8" "$R/validate_groupthread.txt"; tail -2 "$R/validate_groupthread.txt"
compute-sanitizer --tool memcheck $K validate --variant '^quantize-groupthread$' --quick --report /tmp/m.json > "$R/memcheck_groupthread.txt" 2>&1
echo "memcheck rc=$?"; tail -2 "$R/memcheck_groupthread.txt"
for round in 1 2; do $K bench-quantize --schemes '^(fp8-e4m3-head|int8-head)$' --variant 'generic|groupthread' --csv "$R/bench_fp8_$round.csv" > "$R/bench_fp8_$round.txt" 2>&1; done
cat "$R/bench_fp8_1.txt" "$R/bench_fp8_2.txt" | grep -E "fp8|int8"
echo "done at $((SECONDS - s)) s"
