#!/usr/bin/env bash
# Installs everything tessera needs, idempotently, and fast when it is already there:
#   1. Debian packages (headers-only C++ dependencies, Ninja, ccache, data sets),
#   2. a Python virtual environment outside the clone with the pinned packages of
#      scripts/requirements.txt (PyTorch provides LibTorch for the C++ build).
# Prints the venv's python path on its last line so callers can capture it.
#
#   TESSERA_VENV   where the virtual environment lives (default ~/.cache/tessera/venv)
#   TESSERA_PYTHON the interpreter to create it with (default python3)
#   TESSERA_TORCH_PYTHON  instead of the venv, build against this interpreter's own torch, as it is
#                  (nothing is installed into it; it needs torch 2.x, and matplotlib for `tessera plot`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${TESSERA_VENV:-$HOME/.cache/tessera/venv}
python=${TESSERA_PYTHON:-python3}

apt_packages=(
  nlohmann-json3-dev libspdlog-dev libfmt-dev catch2 libcli11-dev liburing-dev libaio-dev
  libgloo-dev zlib1g-dev ninja-build ccache libopenmpi-dev fortunes dataset-fashion-mnist
  python3-dev  # Python.h for the extension tessera._C, when the venv comes from Debian's python3
  iproute2     # ip and ss: scripts/cluster.sh's emulated hosts, tests/python/launch/test_cluster.py's socket check
  openssh-server openssh-client pdsh  # an sshd on each emulated host; tessera launch --hostfile (--launcher pdsh)
  munge slurmctld slurmd slurm-client  # scripts/cluster.sh slurm: SLURM on the emulated hosts (--launcher slurm, srun)
)

log() { echo "[setup] $*" >&2; }

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >&2
fi

if [ -n "${TESSERA_TORCH_PYTHON:-}" ]; then
  if ! "$TESSERA_TORCH_PYTHON" -c 'import torch' >/dev/null 2>&1; then
    log "TESSERA_TORCH_PYTHON=$TESSERA_TORCH_PYTHON cannot import torch"
    exit 1
  fi
  "$TESSERA_TORCH_PYTHON" -c 'import sys; print(sys.executable)'
  exit 0
fi

# The venv is rebuilt only when requirements.txt changes (its hash is stamped inside the venv).
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
stamp="$venv/.tessera-requirements"
if [ ! -x "$venv/bin/python" ]; then
  log "creating virtual environment $venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing pinned Python packages into $venv (first time: several GB for torch)"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -r "$here/requirements.txt" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
