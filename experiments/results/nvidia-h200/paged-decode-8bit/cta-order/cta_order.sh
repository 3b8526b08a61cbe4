#!/usr/bin/env bash
# decode-tc's CTA order (KVQ_TC_HEADS_INNER: none = splits of a (b, KV head) consecutive, paged = the
# KV heads of a (b, split) consecutive in paged launches, all = in every launch): the full build, the
# GPU Python suites, then bench_paged for the 8-bit pairs, pages of 16, NHD and HND, interleaved rounds.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
echo "commit ${KVQ_COMMIT:-unknown}" >> $OUT/gpu.txt
start=$SECONDS
{ cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON=python3 &&
  cmake --build build-gpu -j 16; } > $OUT/build.log 2>&1 || { echo "BUILD FAIL"; tail -20 $OUT/build.log; exit 1; }
echo "build $((SECONDS-start)) s"
PYTHONPATH=build-gpu/python KVQ_BIN=build-gpu/experiments/kvq timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/python/test_ops.py tests/python/test_serve_paged.py > $OUT/gpu_python.log 2>&1
echo "pytest rc=$? $(tail -n 1 $OUT/gpu_python.log) $((SECONDS-start)) s"
run() {  # mode layout round
  KVQ_TC_HEADS_INNER=$1 PYTHONPATH=build-gpu/python timeout 100 python3 experiments/bench/bench_paged.py \
    --out $OUT/$2_$1_$3.csv --pages 16 --layout $2 --pairs "${PAIRS_RE:-int8-head|fp8}" --shapes "${SHAPES_RE:-.}" > /dev/null 2>&1
  echo "$2 $1 round $3 rc=$? $((SECONDS-start)) s"
}
for r in $(seq ${ROUNDS:-2}); do
  for m in none paged all; do run $m nhd $r; done
  for m in none paged; do run $m hnd $r; done
done
cd $OUT && tar czf csv.tar.gz *.csv && rm -f *.csv
