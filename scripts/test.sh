#!/usr/bin/env bash
# Set up, build, and run every test suite (GPU suites report skipped without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir "${KVQ_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
