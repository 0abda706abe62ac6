#!/usr/bin/env bash
# For a GPU machine without apt: downloads the Debian packages whose headers the build needs
# (nlohmann-json, spdlog, fmt, Catch2, CLI11, gloo, zlib) on a machine with apt, and unpacks them into
# .devdeps/ at the project root. Copy .devdeps along, then configure with
#   -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)');$PWD/.devdeps/usr"
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >> .git/info/exclude
# libfmt9/libspdlog1.10: the shared objects the CMake configs of fmt and spdlog name (used
# header-only, but CMake checks they exist); zlib: the examples' Fashion-MNIST reader.
pkgs=(nlohmann-json3-dev libspdlog-dev libfmt-dev catch2 libcli11-dev libgloo-dev libfmt9 libspdlog1.10
      zlib1g-dev zlib1g)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download "${pkgs[@]}" >/dev/null)
rm -rf .devdeps && mkdir -p .devdeps
for deb in "$tmp"/*.deb; do dpkg -x "$deb" .devdeps; done
rm -rf .devdeps/usr/share/doc .devdeps/usr/share/man
du -sh .devdeps
