#!/usr/bin/env bash
# A clean build of this tree (a warm machine keeps build dirs whose objects may predate the copied
# sources), then ncu of the head kernels (first launch, Hkv 1) and memcheck of the IntegerCoder kernels.
set -uo pipefail
R=$OUT; mkdir -p "$R"
s=$SECONDS
V='^quantize-(groupthread|tokenteam|tensor2pass)$'
rm -rf build-ab-tree build-ab-base build-ab-head build-clean
cmake -S . -B build-clean -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF -DKVQ_TC_TUNING= -DKVQ_TC_PAIRS=Int8:Int8 > "$R/build.log" 2>&1 &&
  cmake --build build-clean -j "$(nproc)" --target kvq >> "$R/build.log" 2>&1
echo "build rc=$? at $((SECONDS - s)) s"
K=build-clean/experiments/kvq
sec="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
for c in "int8-head groupthread_int8" "int4-token-asym token_kernel"; do
  set -- $c
  timeout 60 ncu $sec -k regex:$2 -c 1 $K bench-quantize --schemes "^$1\$" --variant "$V" --reps 1 --csv /tmp/n.csv > "$R/ncu_${1}_head.txt" 2>&1
  echo "ncu $1 rc=$? at $((SECONDS - s)) s"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy" "$R/ncu_${1}_head.txt" | head -8
done
timeout 100 compute-sanitizer --tool memcheck $K validate --variant "$V" --quick --report /tmp/m.json > "$R/memcheck_quantize.txt" 2>&1
echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY|\[OK\]|\[FAIL\]" "$R/memcheck_quantize.txt" | tail -5
