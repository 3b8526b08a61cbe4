#!/usr/bin/env bash
# The CPU benchmark: kvq's fp64 reference beside PyTorch's CPU SDPA (fp32) on the DESIGN.md decode
# shapes. Makes .venv-torch (torch from PyPI, a large download) on first use. Not part of CI.
# Arguments go to bench_cpu_vs_torch.py, e.g. --filter 'seed002|llama8b/B1/'.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
if [[ ! -x .venv-torch/bin/python ]] || ! .venv-torch/bin/python -c "import torch" 2>/dev/null; then
  python3 -m venv .venv-torch
  .venv-torch/bin/pip install -q torch
fi
.venv-torch/bin/python experiments/bench/bench_cpu_vs_torch.py --kvq "${KVQ_BUILD_DIR:-build}/experiments/kvq" "$@"
