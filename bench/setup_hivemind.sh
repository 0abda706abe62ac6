#!/usr/bin/env bash
# Hivemind (the pinned version, from PyPI; its wheel carries the libp2p daemon p2pd) in its own
# virtual environment that REUSES the project venv's PyTorch and tessera (bench/peer_venv.sh).
# Idempotent; prints the venv's python on its last line. The collaborative-training tests and benchmark call it.
#
#   TESSERA_HIVEMIND_VENV  where it lives (default ~/.cache/tessera/hivemind-venv)
#   HIVEMIND_VERSION       default 1.1.12
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${TESSERA_HIVEMIND_VENV:-$HOME/.cache/tessera/hivemind-venv}
version=${HIVEMIND_VERSION:-1.1.12}
log() { echo "[setup-hivemind] $*" >&2; }
"$here/bench/peer_venv.sh" "$venv" >/dev/null  # asserts the venv's torch is the project venv's
# Installed already: one import says so (each import of torch costs seconds; make test runs this).
# (tessera._C: the project's tessera is seen from here.)
if ! "$venv/bin/python" -c "import hivemind, sys, tessera._C; sys.exit(hivemind.__version__ != '$version')" >/dev/null 2>&1; then
  project_site=$("$venv/bin/python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  log "installing hivemind==$version (reusing torch from $project_site)"
  "$venv/bin/pip" install -q "hivemind==$version" >&2
  # pip must not have brought a torch of its own.
  "$venv/bin/python" -c "import torch, hivemind, tessera._C; assert torch.__file__.startswith('$project_site'), torch.__file__" >&2
fi
echo "$venv/bin/python"
