#!/usr/bin/env bash
# DeepSpeed (the pinned version, from PyPI) in its own virtual environment that REUSES the project
# venv's PyTorch (bench/peer_venv.sh). Idempotent; prints the venv's python on its last line (as
# scripts/setup.sh does). Benchmarks that compare with DeepSpeed call it. Also DeepSpeed
# 0.19.7's package alone in $venv/deepspeed-0.19.7 (the last release with elastic training).
#
#   TESSERA_DEEPSPEED_VENV  where it lives (default ~/.cache/tessera/deepspeed-venv)
#   DEEPSPEED_VERSION       default 0.19.8
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${TESSERA_DEEPSPEED_VENV:-$HOME/.cache/tessera/deepspeed-venv}
version=${DEEPSPEED_VERSION:-0.19.8}
log() { echo "[setup-deepspeed] $*" >&2; }
"$here/bench/peer_venv.sh" "$venv" >/dev/null  # asserts the venv's torch is the project venv's
# Installed already: one import says so (each import of torch costs seconds; make test runs this).
if ! "$venv/bin/python" -c "import deepspeed, sys; sys.exit(deepspeed.__version__ != '$version')" >/dev/null 2>&1; then
  project_site=$("$venv/bin/python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  log "installing deepspeed==$version (reusing torch from $project_site)"
  "$venv/bin/pip" install -q wheel setuptools >&2
  # No build isolation: DeepSpeed's setup imports torch, which only this environment can see.
  # DS_BUILD_OPS=0: its C++ ops (CPU Adam) are compiled on first use instead.
  DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-build-isolation "deepspeed==$version" >&2
  # pip must not have brought a torch of its own.
  "$venv/bin/python" -c "import torch, deepspeed; assert torch.__file__.startswith('$project_site'), torch.__file__" >&2
fi
# DeepSpeed 0.19.8 removed elastic training; its last release with deepspeed.elasticity, 0.19.7, goes
# beside it (its package alone, run with this venv's dependencies: PYTHONPATH=$venv/deepspeed-0.19.7)
# for tests/python/engine/test_elasticity.py.
if [ ! -f "$venv/deepspeed-0.19.7/deepspeed/elasticity/elasticity.py" ]; then
  log "installing deepspeed==0.19.7 into $venv/deepspeed-0.19.7 (its elasticity module)"
  rm -rf "$venv/deepspeed-0.19.7"
  DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-build-isolation --no-deps --target "$venv/deepspeed-0.19.7" \
    "deepspeed==0.19.7" >&2
fi
echo "$venv/bin/python"
