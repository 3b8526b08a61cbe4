#!/usr/bin/env bash
# The sanitizer lane (run by .ci/run after scripts/test.sh): the CPU parts built with
# AddressSanitizer + UndefinedBehaviorSanitizer (no CUDA; kvq, kvq_tests, kvq_cluster_tests), then the CPU
# test suite, the command-line tests and the fuzz corpus run under them (the real-Slurm test runs
# once, in scripts/test.sh). Any report fails the lane.
# Needs .venv (scripts/setup.sh). Environment: KVQ_SANITIZE_BUILD_DIR (default build-asan).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${KVQ_SANITIZE_BUILD_DIR:-build-asan}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
mkdir -p "$build_dir"
echo "kvq sanitize: configuring and building kvq and kvq_tests in $build_dir (ASan + UBSan)"
t0=$SECONDS
# The numeric core (quant/, reference/: the suites' hot loops) at -O1, the rest at -O0: instrumented
# JSON, CLI11 and HDF5 glue compiles in half the time at -O0 and is never hot. Warnings are the main
# build's job. Ninja for a new build folder, as in scripts/setup.sh.
generator=()
[[ ! -f $build_dir/CMakeCache.txt ]] && command -v ninja >/dev/null && generator=(-G Ninja)
if ! cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g" \
     -DKVQ_CORE_CXX_FLAGS=-O1 -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DKVQ_CUDA=OFF \
     -DKVQ_PYTHON_MODULE=OFF -DKVQ_WERROR=OFF -DKVQ_PYTHON="$PWD/.venv/bin/python" > "$build_dir/configure.log" 2>&1; then
  tail -n 40 "$build_dir/configure.log" >&2
  exit 1
fi
if ! cmake --build "$build_dir" -j "$(nproc)" --target kvq kvq_tests kvq_cluster_tests > "$build_dir/build.log" 2>&1; then
  grep -E "error|Error" "$build_dir/build.log" | head -n 40 >&2
  exit 1
fi
echo "kvq sanitize: built in $((SECONDS - t0)) s"
# Reports abort the process (a failed test); the check-dump children inherit these settings.
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp:print_suppressions=0
# Everything that runs kvq's C++ but the fresh fuzz batch (the main run has it; here the corpus
# covers the same paths): not the plots and notebooks, nor the Python-only suites (the GGUF loader,
# compare_runs and compare_evals, the peers', the HF capture's).
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" \
  -E "plots_and_notebooks|capture_hf|bench_peers|gguf_llama|compare_runs|compare_evals|fuzz_fresh|slurm_cluster"
echo "kvq sanitize: done in $((SECONDS - t0)) s"
