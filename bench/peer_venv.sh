#!/usr/bin/env bash
# A virtual environment for a peer from PyPI (DeepSpeed, Hivemind) that REUSES the project venv's
# PyTorch and tessera: created with the project venv's interpreter (torch's compiled modules must
# load in it), and a .pth file that adds the project venv's site-packages as a site directory (its
# own .pth files run too: tessera's editable install is a finder they import), so pip sees torch as
# installed and nobody downloads it twice. Idempotent.
#
#   bench/peer_venv.sh VENV    prints VENV's python on its last line
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=$1
project_python=$("$here/scripts/setup.sh" | tail -n 1)
if [ ! -x "$venv/bin/python" ]; then
  base=$("$project_python" -c 'import sys; print(sys._base_executable)')
  echo "[peer-venv] creating $venv with $base" >&2
  "$base" -m venv "$venv"
fi
site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
project_site=$("$project_python" -c 'import site; print(site.getsitepackages()[0])')
echo "import site; site.addsitedir('$project_site')" > "$site/tessera-project-venv.pth"
"$venv/bin/python" -c "import torch; assert torch.__file__.startswith('$project_site'), torch.__file__" >&2
echo "$venv/bin/python"
