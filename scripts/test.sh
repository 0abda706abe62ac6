#!/usr/bin/env bash
# Runs the whole suite (Catch2 through ctest). Multi-rank tests start real processes on localhost
# through build/bin/tessera launch, so they run one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure --timeout 300 "$@"
