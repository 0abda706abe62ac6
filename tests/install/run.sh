#!/usr/bin/env bash
# ctest install_find_package: installs the build tree into a temporary prefix, builds
# tests/install/ (an outside program) against it with find_package(tessera), and runs it.
#   run.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
work="$build/install-test"  # a fixed place: ccache then serves the consumer's compile next time
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# Only the prefix: LibTorch is found through the package (the torch tessera was built against).
cmake -S "$here" -B "$work/consumer" -G Ninja "${launcher[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/consumer" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/consumer/consumer"
