#!/usr/bin/env bash
# The one-call GPU check: configure and build for the local GPU (sm_90a by default), run the GPU
# test suites, compute-sanitizer (memcheck, racecheck, initcheck, synccheck) on small shapes,
# `kvq validate` and the quantize bandwidth benchmark; logs and CSV/JSON under $OUT; a short
# summary table last. Exits non-zero if any step fails.
#
#   OUT=results/device bash scripts/device_run.sh          # any CUDA machine with the build deps
#   KVQ_COMMIT=abc123 OUT=... bash scripts/device_run.sh    # a copy of the tree without .git
#   CUDA_ARCHS="80;90a" OUT=... bash scripts/device_run.sh  # other architectures
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device}
mkdir -p "$OUT"
build=${KVQ_BUILD_DIR:-build-gpu}
kvq=$build/experiments/kvq
declare -a summary
status=0
logs=$OUT/logs
mkdir -p "$logs"
step() {  # step NAME LOGFILE COMMAND...: run, log, record [OK]/[FAIL]
  local name=$1 log=$2
  shift 2
  local start=$SECONDS
  if "$@" > "$logs/$log" 2>&1; then
    summary+=("[OK]   $name ($((SECONDS - start)) s)")
  else
    summary+=("[FAIL] $name ($((SECONDS - start)) s, exit $?, see logs/$log)")
    status=1
  fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt" 2>&1
# A tree without .git (shipped to a GPU machine) names its commit in KVQ_COMMIT.
export KVQ_COMMIT=${KVQ_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
echo "commit $KVQ_COMMIT" >> "$OUT/gpu.txt"
export KVQ_DRIVER=${KVQ_DRIVER:-$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)}
nvcc --version | tail -n 2 >> "$OUT/gpu.txt"

configure_and_build() {
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" \
        -DKVQ_PYTHON="${KVQ_PYTHON:-python3}" &&
  cmake --build "$build" -j "$(nproc)"
}
step "build (sm ${CUDA_ARCHS:-90a})" build.log configure_and_build
if [[ ! -x $kvq ]]; then
  printf '%s\n' "${summary[@]}"
  tail -n 30 "$logs/build.log"
  exit 1
fi

step "GPU and CPU test suites (ctest, C++)" tests.log \
  ctest --test-dir "$build" --output-on-failure -j 4 -E "^python_"
step "Hugging Face capture test (torch, transformers)" capture_hf.log python3 tests/python/run_hf_tests.py

sanitize() {  # every tool on the quick gate; any finding fails
  local tool
  for tool in memcheck racecheck initcheck synccheck; do
    echo "== compute-sanitizer --tool $tool"
    timeout "${SANITIZER_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 1 --print-limit 20 \
      "$kvq" validate --quick --report "/tmp/kvq-sanitize-$tool.json" || return 1
  done
}
step "compute-sanitizer memcheck/racecheck/initcheck/synccheck" sanitizers.log sanitize

step "kvq validate (every variant)" validate.log "$kvq" validate --report "$OUT/validate.json"
step "kvq bench-quantize" bench_quantize.log "$kvq" bench-quantize --csv "$OUT/quantize_bandwidth.csv"
if [[ ${KVQ_NCU:-1} == 1 ]]; then  # where the fused kernel's time goes (first launch: int8-head, Hkv=1)
  step "ncu profile of quantize-groupthread" ncu.log ncu -k regex:groupthread -c 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section LaunchStats "$kvq" bench-quantize --reps 1 --csv /tmp/kvq-ncu.csv
fi

{
  echo "== $(head -n 2 "$OUT/gpu.txt" | tail -n 1)"
  grep -E "^\[(OK|FAIL)\] +(quantize-[a-z]+:|codec)|^\[TIME\]" "$logs/validate.log"
  grep -E "SUMMARY" "$logs/sanitizers.log" | sed 's/^/compute-sanitizer: /'
  echo
  sed -n '/device-to-device copy/,$p' "$logs/bench_quantize.log"
  echo
  printf '%s\n' "${summary[@]}"
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
# $OUT keeps few files: the logs travel as one archive.
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$logs"
exit $status
