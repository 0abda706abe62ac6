# Source it in a shell after the two commands (`make demo`, `make test`) or `make python`:
#   source scripts/env.sh
# puts the project venv first on PATH: its python, pip and torchrun (the torch tessera was built
# against), and the `tessera` package and command those commands installed into it (editable:
# `pip install --no-build-isolation -e .`); build/bin after it. No PYTHONPATH. The commands in
# README.md and docs/ assume it (tests/python/api/test_docs.py runs them that way).
# `pip install --no-build-isolation .` into an environment of your own replaces it (docs/python.md).
_tessera_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
_tessera_venv=${TESSERA_VENV:-$HOME/.cache/tessera/venv}
if [ ! -x "$_tessera_venv/bin/python" ]; then
  echo "scripts/env.sh: no virtual environment at $_tessera_venv yet: run make test (or make python) first" >&2
else
  export VIRTUAL_ENV="$_tessera_venv"
  export PATH="$_tessera_venv/bin:$_tessera_root/${BUILD_DIR:-build}/bin:$PATH"
fi
unset _tessera_root _tessera_venv
