#!/usr/bin/env bash
# The one-call GPU check: configure and build for the local GPU (sm_90a by default), run the GPU
# test suites, compute-sanitizer (memcheck, racecheck, initcheck, synccheck) on small shapes,
# `kvq validate`, the quantize bandwidth benchmark, the decode peers (bench_peers.py) and `kvq bench`;
# logs and CSV/JSON under $OUT; a short summary table last. Exits non-zero if any step fails.
# KVQ_PHASE=check (build, tests, sanitizers, validate) or bench (build, benchmarks, sweep latency)
# splits the work over two calls of a 10-minute device limit; the default runs both. The bench phase
# ends by comparing every timing with the newest committed run on the same GPU (compare_runs.py) and
# judging the speed targets from the run's own CSVs (targets.py, in summary.txt).
# Narrower runs: KVQ_SHAPES, KVQ_SCHEMES, KVQ_DECODE_VARIANTS (passed to kvq bench), KVQ_BENCH_QUANTIZE=0,
# KVQ_BENCH_PAGED=0, KVQ_NCU=0, KVQ_SANITIZE=0, KVQ_VALIDATE_VARIANTS (regex for kvq validate), KVQ_VALIDATE_DUMPS (dumps,
# space-separated, that the decode variants are validated on as well).
#
#   OUT=results/device bash scripts/device_run.sh          # any CUDA machine with the build deps
#   KVQ_COMMIT=abc123 OUT=... bash scripts/device_run.sh    # a copy of the tree without .git, or with a
#                                                           # stale one (the device tool's copy: pass it always)
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
# A tree shipped to a GPU machine names its commit in KVQ_COMMIT: its .git may be missing or stale
# (device copies have reported main's HEAD while a branch was checked out).
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

phase=${KVQ_PHASE:-all}
if [[ $phase != bench ]]; then
step "GPU and CPU test suites (ctest, C++)" tests.log \
  ctest --test-dir "$build" --output-on-failure -j 4 -E "^python_|^fuzz_"  # those run in CI
step "Hugging Face capture test (torch, transformers)" capture_hf.log python3 tests/python/run_hf_tests.py
# The suites that need kvq._gpu and a CUDA device (CI skips them): kvq.gpu, the GPU eval engine, kvq.ops.
step "GPU Python suites (kvq.gpu, GPU eval engine, torch ops, serving loop)" gpu_python.log \
  env PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" KVQ_BIN="$kvq" python3 -m pytest -q -p no:cacheprovider \
  tests/python/test_gpu_python.py tests/python/test_gpu_engine.py tests/python/test_ops.py tests/python/test_serve_paged.py

sanitize() {  # every tool on the quick gate; any finding fails
  local tool
  for tool in memcheck racecheck initcheck synccheck; do
    echo "== compute-sanitizer --tool $tool"
    timeout "${SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 1 --print-limit 20 \
      "$kvq" validate --quick --variant "${SANITIZE_VARIANTS:-quantize|decode-splitk\$|decode-cudacore|decode-tc}" \
      --report "/tmp/kvq-sanitize-$tool.json" || return 1
  done
}
if [[ ${KVQ_SANITIZE:-1} == 1 ]]; then
  step "compute-sanitizer memcheck/racecheck/initcheck/synccheck" sanitizers.log sanitize
fi

step "kvq validate (every variant)" validate.log "$kvq" validate --report "$OUT/validate.json" \
  --variant "${KVQ_VALIDATE_VARIANTS:-.}"
# Users' dumps (e.g. a real capture from data/capture.py): every decode variant on every layer and query.
for dump in ${KVQ_VALIDATE_DUMPS:-}; do
  name=$(basename "$dump" .h5)
  step "kvq validate --dump $name (decode variants)" "validate_$name.log" "$kvq" validate --variant '^decode' \
    --dump "$dump" --reruns 20 --report "$OUT/validate_$name.json"
done
fi
if [[ $phase != check ]]; then
if [[ ${KVQ_BENCH_QUANTIZE:-1} == 1 ]]; then
  step "kvq bench-quantize" bench_quantize.log "$kvq" bench-quantize --csv "$OUT/quantize_bandwidth.csv"
fi
# Decode: the peers first (torch), then every kvq variant with the peers beside it, same run.
# FBGEMM's INT4 kernel comes from the fbgemm-gpu-genai wheel in .whl/ (README), unzipped onto PYTHONPATH;
# FlashInfer from the wheels in .whl/flashinfer/ (README), unzipped the same way with the ninja its JIT
# build runs. Its kernels build at first use into the run's temp dir, or come prebuilt for sm_90a from
# the zip beside the wheels (only on an sm_90 GPU; one that does not load is built instead).
peers_path=${PYTHONPATH:-}
peers_env=()
fbgemm_wheel=$(ls .whl/fbgemm_gpu_genai-*.whl 2> /dev/null | head -n 1)
if [[ -z $fbgemm_wheel ]]; then
  summary+=("[SKIP] FBGEMM peer: no .whl/fbgemm_gpu_genai-*.whl (README, 'FBGEMM peer')")
else
  fbgemm_dir=$(mktemp -d /tmp/kvq-fbgemm.XXXXXX)
  if python3 -m zipfile -e "$fbgemm_wheel" "$fbgemm_dir"; then
    peers_path=$fbgemm_dir${peers_path:+:$peers_path}
  else
    summary+=("[FAIL] FBGEMM peer: cannot unzip $fbgemm_wheel")
    status=1
  fi
fi
unzip_flashinfer() {  # unzip_flashinfer DIR: wheels (and prebuilt kernels) into DIR/site, ninja into DIR/bin
  local f
  for f in .whl/flashinfer/*.whl; do python3 -m zipfile -e "$f" "$1/site" || return 1; done
  if [[ $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -n 1) == 9.0 ]]; then
    for f in .whl/flashinfer/*-sm90a-*.zip; do
      if [[ -e $f ]]; then python3 -m zipfile -e "$f" "$1/site" || return 1; fi
    done
  fi
  mkdir -p "$1/bin" && cp "$1"/site/ninja-*.data/scripts/ninja "$1/bin/" && chmod +x "$1/bin/ninja"
}
if ! compgen -G ".whl/flashinfer/*.whl" > /dev/null; then
  summary+=("[SKIP] FlashInfer peer: no .whl/flashinfer/*.whl (README, 'FlashInfer peer')")
else
  flashinfer_dir=$(mktemp -d /tmp/kvq-flashinfer.XXXXXX)
  if unzip_flashinfer "$flashinfer_dir"; then
    peers_path=$flashinfer_dir/site${peers_path:+:$peers_path}
    peers_env+=("PATH=$flashinfer_dir/bin:$PATH" "FLASHINFER_WORKSPACE_BASE=$flashinfer_dir")
  else
    summary+=("[FAIL] FlashInfer peer: cannot unzip .whl/flashinfer/ into $flashinfer_dir")
    status=1
  fi
fi
[[ -n $peers_path ]] && peers_env+=("PYTHONPATH=$peers_path")
step "peers: cuDNN, FlashAttention-2, FBGEMM INT4 (bench_peers.py)" peers.log \
  env "${peers_env[@]}" python3 experiments/bench/bench_peers.py --out "$OUT/peers.csv" --shapes "${KVQ_SHAPES:-.}" \
  --peers '^(cudnn|flash2|fbgemm)'
# FlashInfer in a process of its own: with its modules loaded, FBGEMM's kernel stopped with an
# illegal instruction (H100, fbgemm-gpu-genai 1.6.0, flashinfer 0.6.18). Its rows join peers.csv.
step "peers: FlashInfer FP8/bf16 (bench_peers.py)" peers_flashinfer.log \
  env "${peers_env[@]}" python3 experiments/bench/bench_peers.py --out "$logs/peers_flashinfer.csv" \
  --shapes "${KVQ_SHAPES:-.}" --peers '^flashinfer'
[[ -s $logs/peers_flashinfer.csv && -s $OUT/peers.csv ]] && tail -n +2 "$logs/peers_flashinfer.csv" >> "$OUT/peers.csv"
bench_args=(--shapes "${KVQ_SHAPES:-.}" --variant "${KVQ_DECODE_VARIANTS:-.}")
[[ -n ${KVQ_SCHEMES:-} ]] && bench_args+=(--schemes "$KVQ_SCHEMES")
step "kvq bench (decode)" bench.log "$kvq" bench --peers "$OUT/peers.csv" --csv "$OUT/decode.csv" "${bench_args[@]}"
# Issue 33: decode-tc over pages of 16 tokens beside the same cache contiguous, NHD and HND pools, one CSV.
paged_bench() {
  local layout
  for layout in nhd hnd; do
    PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" python3 experiments/bench/bench_paged.py --layout "$layout" \
      --pages 16 --shapes "${KVQ_SHAPES:-.}" --out "$logs/paged_$layout.csv" || return 1
  done
  { cat "$logs/paged_nhd.csv"; tail -n +2 "$logs/paged_hnd.csv"; } > "$OUT/paged.csv"
}
[[ ${KVQ_BENCH_PAGED:-1} == 1 ]] && step "paged vs contiguous decode, NHD and HND (bench_paged.py)" paged.log paged_bench
# No silent regressions: every decode and quantize row against the newest committed run on this GPU.
# A tree without .git orders the committed runs by experiments/results/.run_times.json: write it
# where git is (compare_runs.py --write-times) and carry it along; without it the report warns.
compare_with_committed() {
  local csvs=()
  for f in "$OUT/decode.csv" "$OUT/quantize_bandwidth.csv"; do [[ -s $f ]] && csvs+=("$f"); done
  ((${#csvs[@]})) && python3 experiments/bench/compare_runs.py "${csvs[@]}" --results experiments/results \
    --csv-out "$OUT/regressions.csv"
}
step "timings vs the newest committed run (5 %)" regressions.log compare_with_committed
# The speed targets judged from this run's CSVs (ratios within the run; the summary lists the misses).
judge_targets() {
  local args=()
  [[ -s $OUT/decode.csv ]] && args+=(--decode "$OUT/decode.csv")
  [[ -s $OUT/quantize_bandwidth.csv ]] && args+=(--quantize "$OUT/quantize_bandwidth.csv")
  [[ -s $OUT/paged.csv ]] && args+=(--paged "$OUT/paged.csv")
  ((${#args[@]})) && python3 experiments/bench/targets.py "${args[@]}" > "$logs/targets.txt"
}
step "speed targets (targets.py)" targets.log judge_targets
# The sweep on the bundled dump with each pair's decode latency (the trade-off plot's x axis).
sweep_and_plot() {
  "$kvq" sweep --out "$logs/sweep" && cp "$logs/sweep/sweep.csv" "$OUT/sweep.csv" &&
  python3 notebooks/kvq_plots.py "$logs/sweep" --out "$logs/figures" &&
  cp "$logs/figures/tradeoff.png" "$OUT/tradeoff.png"
}
step "kvq sweep with latency columns, trade-off plot" sweep.log sweep_and_plot
if [[ ${KVQ_NCU:-1} == 1 ]]; then  # where the decode kernels' time goes: seed000 B=128, CUDA-core int8 and tensor-core int4
  ncu_decode() {  # ncu_decode KERNEL_REGEX SCHEME VARIANT
    ncu -k "regex:$1" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats --section SourceCounters \
      "$kvq" bench --shapes seed000 --schemes "$2" --variant "$3" --reps 30 --csv /tmp/kvq-ncu.csv
  }
  step "ncu profile of decode-splitk (int8-head, seed000)" ncu.log ncu_decode '^decode_kernel' int8-head '^decode-splitk$'
  step "ncu profile of decode-tc (int4-head-asym FBGEMM rows, seed000)" ncu_tc.log \
    ncu_decode decode_tc_kernel int4-head-asym:fbgemm '^decode-tc$'
fi
fi

{
  echo "== $(head -n 2 "$OUT/gpu.txt" | tail -n 1)"
  [[ -f $logs/validate.log ]] && grep -E "^\[(OK|FAIL)\] +(quantize-[a-z0-9]+:|decode-[a-z0-9-]+:|codec)|^\[TIME\]" "$logs/validate.log"
  [[ -f $logs/sanitizers.log ]] && grep -E "SUMMARY" "$logs/sanitizers.log" | sed 's/^/compute-sanitizer: /'
  echo
  [[ -f $logs/bench_quantize.log ]] && sed -n '/device-to-device copy/,$p' "$logs/bench_quantize.log" && echo
  for f in "$logs/peers.log" "$logs/peers_flashinfer.log"; do
    [[ -f $f ]] && grep -E "^\[(OK|FAIL)\] fbgemm|^\[FAIL\] flashinfer|^FBGEMM rows skipped|^FlashInfer " "$f"
  done
  [[ -f $logs/bench.log ]] && grep -E "^read-only bandwidth" "$logs/bench.log" && sed -n '/fastest variant/,$p' "$logs/bench.log"
  echo
  [[ -f $logs/regressions.log ]] && cat "$logs/regressions.log" && echo
  [[ -f $logs/targets.txt ]] && cat "$logs/targets.txt" && echo
  printf '%s\n' "${summary[@]}"
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
# $OUT keeps few files: the logs travel as one archive.
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$logs"
exit $status
