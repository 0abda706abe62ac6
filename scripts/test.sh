#!/usr/bin/env bash
# Runs the whole suite: the C++ tests (Catch2 through ctest), then the Python tests (pytest,
# tests/python) with the interpreter the build was configured with. Multi-rank tests start real
# processes on localhost through build/bin/tessera launch (one thread per rank). Tests run
# TEST_JOBS at a time (default: the machine's cores; ctest -j, pytest-xdist by module), which the
# ranks' waits leave room for (measured on 2 cores: ctest 767 -> 646 s, pytest 15% less); the
# Python tests marked `serial` (they rebuild or reinstall the package) run alone afterwards.
# Arguments go to ctest (e.g. -R engine); PYTEST_ARGS to pytest (e.g. PYTEST_ARGS="-k parity").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
# Each runner writes its timings (JUnit XML) for the slowest-tests list printed at the end.
timings="$build/test-timings"
rm -rf "$timings" && mkdir -p "$timings"
slowest() {
  "${python:-python3}" scripts/slowest_tests.py "$timings/ctest.xml" "$timings/pytest.xml" "$timings/pytest-serial.xml" || true
}
jobs=${TEST_JOBS:-$(nproc)}
python_tests=1
grep -q '^TESSERA_BUILD_PYTHON:BOOL=OFF' "$build/CMakeCache.txt" 2>/dev/null && python_tests=0
# The peers' venvs for the Python tests (DeepSpeed for the checkpoint import tests, Hivemind for the
# collaborative ones) are made or checked while ctest runs: on a fresh machine that is minutes of
# downloads and installs, mostly waiting.
peers="$timings/peers"
mkdir -p "$peers"
if [ "$python_tests" -eq 1 ]; then
  bench/setup_deepspeed.sh > "$peers/deepspeed.out" 2> "$peers/deepspeed.err" & deepspeed_setup=$!
  bench/setup_hivemind.sh > "$peers/hivemind.out" 2> "$peers/hivemind.err" & hivemind_setup=$!
fi
# Waits for a peer's setup (in this shell: the background job is its child), shows what it logged,
# and sets peer_python_is to the last line it printed, its venv's python; a failed setup fails the tests.
peer_python() {
  local status=0
  wait "$2" || status=$?
  cat "$peers/$1.err" >&2
  if [ "$status" -ne 0 ]; then
    echo "[test] bench/setup_$1.sh failed with status $status (its output above)" >&2
    exit 1
  fi
  peer_python_is=$(tail -n 1 "$peers/$1.out")
}
ctest_status=0
start=$SECONDS
ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 300 --output-junit "$(cd "$timings" && pwd)/ctest.xml" "$@" ||
  ctest_status=$?
echo "[test] ctest: $((SECONDS - start)) s wall, $jobs at a time"
if [ "$ctest_status" -ne 0 ]; then
  slowest
  exit "$ctest_status"
fi

if [ "$python_tests" -eq 0 ]; then
  echo "[test] Python tests skipped: configured with -DTESSERA_BUILD_PYTHON=OFF"
  slowest
  exit 0
fi
python=$(cat "$build/.tessera-python" 2>/dev/null || scripts/setup.sh | tail -n 1)
echo "[test] pytest tests/python ($python)"
export TESSERA_BUILD_DIR="$(cd "$build" && pwd)"
# DeepSpeed from PyPI in its own venv (reusing this torch), for the checkpoint import tests.
peer_python deepspeed "$deepspeed_setup"
export TESSERA_DEEPSPEED_PYTHON=$peer_python_is
# Hivemind from PyPI in its own venv (reusing this torch and tessera), for the collaborative tests.
peer_python hivemind "$hivemind_setup"
export TESSERA_HIVEMIND_PYTHON=$peer_python_is
parallel=() how="one at a time"
if [ "$jobs" -gt 1 ] && "$python" -c 'import xdist' 2>/dev/null; then
  parallel=(-n "$jobs" --dist loadscope)  # a module's tests on one worker: its fixtures run once
  how="$jobs at a time"
fi
status=0
start=$SECONDS
"$python" -m pytest tests/python -q -p no:cacheprovider "${parallel[@]}" -m "not serial" --junitxml "$timings/pytest.xml" \
  ${PYTEST_ARGS:-} || status=$?
serial=0
"$python" -m pytest tests/python -q -p no:cacheprovider -m serial --junitxml "$timings/pytest-serial.xml" \
  ${PYTEST_ARGS:-} || serial=$?
echo "[test] pytest: $((SECONDS - start)) s wall ($how, then the serial tests alone)"
# Every failure counts, including pytest's exit status 5 ("no tests collected") when neither pass
# collected any; one pass may select none when PYTEST_ARGS narrows the run.
if [ "$status" -eq 5 ] && [ "$serial" -eq 5 ]; then
  echo "[test] pytest collected no tests in tests/python: failing" >&2
elif [ "$status" -eq 5 ]; then
  status=$serial
elif [ "$status" -eq 0 ] && [ "$serial" -ne 5 ]; then
  status=$serial
fi
slowest
exit "$status"
