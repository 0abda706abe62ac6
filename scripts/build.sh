#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), configures CMake with Ninja and ccache against the
# LibTorch inside the venv's PyTorch, and builds everything, or the targets given as arguments.
#   BUILD_DIR  build folder (default build)     JOBS  parallel compile jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys leave out the build folder, so `pip install .` (build/pip-*, pyproject.toml) reuses
# these objects: the same sources with the same flags compile once.
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
python=$(scripts/setup.sh | tail -n 1)
build=${BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ] || [ "$(cat "$build/.tessera-python" 2>/dev/null)" != "$python" ]; then
  torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$build" -G Ninja "${launcher[@]}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DPython_EXECUTABLE="$python" ${CMAKE_ARGS:-}
  echo "$python" > "$build/.tessera-python"
fi
targets=()
[ $# -gt 0 ] && targets=(--target "$@")
cmake --build "$build" -j "${JOBS:-$(nproc)}" "${targets[@]}"
