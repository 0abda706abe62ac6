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
# The Python package (tessera._C and a `tessera` command in the venv) is installed editable with
# pip, as a user would (pyproject.toml; build/pip-*): target tessera_python, or everything.
targets=()
python_package=$([ $# -eq 0 ] && echo yes || echo no)
for t in "$@"; do
  if [ "$t" = tessera_python ]; then python_package=yes; else targets+=("$t"); fi
done
if [ $# -eq 0 ] || [ ${#targets[@]} -gt 0 ]; then
  [ ${#targets[@]} -gt 0 ] && targets=(--target "${targets[@]}")
  cmake --build "$build" -j "${JOBS:-$(nproc)}" "${targets[@]}"
fi
if [ "$python_package" = yes ] && ! grep -q '^TESSERA_BUILD_PYTHON:BOOL=OFF' "$build/CMakeCache.txt"; then
  echo "[build] pip install --no-build-isolation -e . ($python)"
  # CXX: CMake's default compiler name, as this script's build used (scikit-build-core would pick
  # g++), so that ccache serves both builds.
  CXX=${CXX:-c++} CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} "$python" -m pip install --no-build-isolation --no-deps -q -e . ||
    { echo "[build] pip install -e . failed (its log is above)" >&2; exit 1; }
fi
