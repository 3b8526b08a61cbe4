#!/usr/bin/env bash
# Tile experiments for the tensor-core decode kernels: builds kvq once per configuration of the
# tile knobs (gpu/decode_tc_traits.cuh: KVQ_TC_STEP_TOKENS, KVQ_TC_STAGES, KVQ_TC_MIN_CTAS), records
# each kernel's registers and spills, and times every configuration with `kvq bench` in one run.
#
#   OUT=results/tune KVQ_TC_CONFIGS="default KVQ_TC_STAGES=2 KVQ_TC_STAGES=2,KVQ_TC_STEP_TOKENS=64" \
#     bash experiments/bench/tune_decode_tc.sh
# A configuration is a comma-separated list of NAME=VALUE ("default": the traits as committed).
# KVQ_SHAPES / KVQ_SCHEMES narrow the benchmark; KVQ_BENCH_ARGS adds kvq bench options (e.g. --splits 4);
# KVQ_CMAKE_ARGS adds configure options (e.g. -DKVQ_TC_PAIRS=Bf16:Bf16: only the pairs measured, a
# shorter build); KVQ_TUNE_ROUNDS > 1 times the configurations in turn that many times (decode-<name>-r<i>.csv).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/tune}
mkdir -p "$OUT"
build=${KVQ_BUILD_DIR:-build-tune}
configs=${KVQ_TC_CONFIGS:-default}
schemes=${KVQ_SCHEMES:-bf16,int8-head,int8-tensor,int4-head-asym,int4-g32-asym}
export KVQ_COMMIT=${KVQ_COMMIT:-$(git rev-parse --short=12 HEAD 2> /dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
echo "commit $KVQ_COMMIT" >> "$OUT/gpu.txt"

tag() { echo "$1" | tr -c 'A-Za-z0-9_\n' '-'; }  # a file-name-safe label
for config in $configs; do
  defs=${config//,/;}
  [[ $config == default ]] && defs=""
  name=$(tag "$config")
  echo "== configuration $config"
  # shellcheck disable=SC2086
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" \
    -DKVQ_TC_TUNING="$defs" ${KVQ_CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1
  cmake --build "$build" --target kvq -j "$(nproc)" > "$OUT/build-$name.log" 2>&1 || {
    tail -n 40 "$OUT/build-$name.log"
    exit 1
  }
  cp "$build/experiments/kvq" "$build/kvq-$name"
  # registers and spills of the tensor-core kernels
  cuobjdump --dump-resource-usage "$build/kvq-$name" 2> /dev/null | grep -A1 "decode_tc_kernel" |
    grep -v "^--" > "$OUT/resources-$name.txt" || true
done
rounds=${KVQ_TUNE_ROUNDS:-1}
for ((round = 1; round <= rounds; ++round)); do
  for config in $configs; do
    name=$(tag "$config")
    suffix=$([[ $rounds -gt 1 ]] && echo "-r$round" || true)
    echo "== bench $config$suffix"
    # shellcheck disable=SC2086
    "$build/kvq-$name" bench --variant '^decode-tc$' --schemes "$schemes" --shapes "${KVQ_SHAPES:-.}" \
      --csv "$OUT/decode-$name$suffix.csv" ${KVQ_BENCH_ARGS:-} > "$OUT/bench-$name$suffix.log"
    grep "decode-tc" "$OUT/bench-$name$suffix.log" || true
  done
done
