#!/usr/bin/env bash
# Hivemind (the pinned version, from PyPI; its wheel carries the libp2p daemon p2pd) in its own
# virtual environment that REUSES the project venv's PyTorch and tessera, as bench/setup_deepspeed.sh
# does for DeepSpeed: a .pth file adds the project venv's site-packages as a site directory. Idempotent;
# prints the venv's python on its last line. The collaborative-training tests and benchmark call it.
#
#   TESSERA_HIVEMIND_VENV  where it lives (default ~/.cache/tessera/hivemind-venv)
#   HIVEMIND_VERSION       default 1.1.12
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
project_python=$("$here/scripts/setup.sh" | tail -n 1)
venv=${TESSERA_HIVEMIND_VENV:-$HOME/.cache/tessera/hivemind-venv}
version=${HIVEMIND_VERSION:-1.1.12}
log() { echo "[setup-hivemind] $*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
  base=$("$project_python" -c 'import sys; print(sys._base_executable)')
  log "creating $venv with $base"
  "$base" -m venv "$venv"
fi
site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
project_site=$("$project_python" -c 'import site; print(site.getsitepackages()[0])')
# addsitedir rather than a plain path line: the project site's own .pth files run too (tessera's
# editable install is a finder they import).
echo "import site; site.addsitedir('$project_site')" > "$site/tessera-project-venv.pth"
if ! "$venv/bin/python" -c "import hivemind, sys; sys.exit(hivemind.__version__ != '$version')" >/dev/null 2>&1; then
  log "installing hivemind==$version (reusing torch from $project_site)"
  "$venv/bin/pip" install -q "hivemind==$version" >&2
fi
"$venv/bin/python" -c "import torch, hivemind, tessera._C; assert torch.__file__.startswith('$project_site'), torch.__file__" >&2
echo "$venv/bin/python"
