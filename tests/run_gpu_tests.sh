#!/usr/bin/env bash
# ctest's gpu_python test: runs tests/python/gpu/test_gpu.py with the given interpreter, or exits 77
# (ctest: skipped) with the reason where that interpreter's torch sees no CUDA device.
set -uo pipefail
python=${1:-python3}
cd "$(dirname "$0")/.."
if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "skipped: no CUDA device visible to $python's torch (the GPU tests need one)"
  exit 77
fi
exec "$python" -m pytest tests/python/gpu/test_gpu.py -v -p no:cacheprovider
