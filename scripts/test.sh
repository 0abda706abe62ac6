#!/usr/bin/env bash
# Runs the whole suite: the C++ tests (Catch2 through ctest), then the Python tests (pytest,
# tests/python) with the interpreter the build was configured with. Multi-rank tests start real
# processes on localhost through build/bin/tessera launch, so they run one at a time.
# Arguments go to ctest (e.g. -R engine); PYTEST_ARGS to pytest (e.g. PYTEST_ARGS="-k parity").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure --timeout 300 "$@"

if grep -q '^TESSERA_BUILD_PYTHON:BOOL=OFF' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "[test] Python tests skipped: configured with -DTESSERA_BUILD_PYTHON=OFF"
  exit 0
fi
python=$(cat "$build/.tessera-python" 2>/dev/null || scripts/setup.sh | tail -n 1)
echo "[test] pytest tests/python ($python)"
# Every failure counts, including pytest's exit status 5 ("no tests collected").
status=0
TESSERA_BUILD_DIR="$(cd "$build" && pwd)" "$python" -m pytest tests/python -q -p no:cacheprovider ${PYTEST_ARGS:-} || status=$?
if [ "$status" -eq 5 ]; then
  echo "[test] pytest collected no tests in tests/python: failing" >&2
fi
exit "$status"
