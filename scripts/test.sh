#!/usr/bin/env bash
# Runs the whole suite: the C++ tests (Catch2 through ctest), then the Python tests (pytest,
# tests/python) with the interpreter the build was configured with. Multi-rank tests start real
# processes on localhost through build/bin/tessera launch, so they run one at a time.
# Arguments go to ctest (e.g. -R engine); PYTEST_ARGS to pytest (e.g. PYTEST_ARGS="-k parity").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
# Each runner writes its timings (JUnit XML) for the slowest-tests list printed at the end.
timings="$build/test-timings"
rm -rf "$timings" && mkdir -p "$timings"
slowest() { "${python:-python3}" scripts/slowest_tests.py "$timings/ctest.xml" "$timings/pytest.xml" || true; }
ctest_status=0
ctest --test-dir "$build" --output-on-failure --timeout 300 --output-junit "$(cd "$timings" && pwd)/ctest.xml" "$@" ||
  ctest_status=$?
if [ "$ctest_status" -ne 0 ]; then
  slowest
  exit "$ctest_status"
fi

if grep -q '^TESSERA_BUILD_PYTHON:BOOL=OFF' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "[test] Python tests skipped: configured with -DTESSERA_BUILD_PYTHON=OFF"
  slowest
  exit 0
fi
python=$(cat "$build/.tessera-python" 2>/dev/null || scripts/setup.sh | tail -n 1)
echo "[test] pytest tests/python ($python)"
# Every failure counts, including pytest's exit status 5 ("no tests collected").
status=0
TESSERA_BUILD_DIR="$(cd "$build" && pwd)" "$python" -m pytest tests/python -q -p no:cacheprovider --junitxml "$timings/pytest.xml" ${PYTEST_ARGS:-} || status=$?
if [ "$status" -eq 5 ]; then
  echo "[test] pytest collected no tests in tests/python: failing" >&2
fi
slowest
exit "$status"
