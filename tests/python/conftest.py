"""Shared helpers for the Python tests (run by scripts/test.sh after ctest, or `pytest tests/python`).

They import tessera as installed into the interpreter's environment (`make python`: pip install
--no-build-isolation -e . into the project venv; no PYTHONPATH) and start multi-rank jobs through
build/bin/tessera launch (TESSERA_BUILD_DIR or BUILD_DIR overrides build/).
"""
import atexit
import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")  # the programs each rank runs (imported by tests too)
BUILD_DIR = os.environ.get("TESSERA_BUILD_DIR") or os.path.join(ROOT, os.environ.get("BUILD_DIR", "build"))
CLI = os.path.join(BUILD_DIR, "bin", "tessera")
ZYGOTE = os.path.join(HERE, "rank_zygote.py")

for _path in (WORKERS, HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (tests/python/gpu/test_gpu.py; `ctest -L gpu`)")
    config.addinivalue_line("markers", "serial: runs alone, never beside another test (it rebuilds or reinstalls the "
                                       "package the others import: scripts/test.sh runs these after the rest)")


def free_port():
    """A TCP port nobody listens on now (for MASTER_PORT), below the kernel's ephemeral range: a port
    the kernel hands out (bind to port 0) can be taken as the local end of another test's connection
    before the job listens on it ("Address already in use"); ports below the range only by a bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            below = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        below = 32768
    for _ in range(200):
        port = random.randint(10000, max(10001, below - 1))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError("free_port: no port below the ephemeral range could be bound in 200 tries")


def child_env(base=None, **extra):
    """The environment for a job's ranks (`base`, default this process's): the workers' folder on
    PYTHONPATH (they import each other; tessera comes from the environment's install), and no
    launcher variables inherited from whatever runs pytest."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = WORKERS + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")


def cluster_unavailable():
    """Why this machine cannot make the emulated hosts of scripts/cluster.sh (None: it can)."""
    try:
        result = subprocess.run([CLUSTER, "check"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        return str(e)
    return None if result.returncode == 0 else result.stderr.strip()


@contextlib.contextmanager
def emulated_hosts(count, rate=None):
    """scripts/cluster.sh's `count` hosts (links shaped to `rate`, e.g. "100mbit") for the block, taken
    down after it; the test is skipped, with the reason, where this machine cannot make them. Yields
    the host numbers 1..count (host K is 10.213.0.K)."""
    why = cluster_unavailable()
    if why is not None:
        pytest.skip("emulated cluster unavailable: %s" % why)
    subprocess.run([CLUSTER, "up", str(count)] + ([rate] if rate else []), check=True, capture_output=True, text=True,
                   timeout=60)
    try:
        yield list(range(1, count + 1))
    finally:
        down = subprocess.run([CLUSTER, "down"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, "scripts/cluster.sh down failed: %s" % (down.stdout + down.stderr)


def peer_python(variable, setup_script):
    """The python of a peer's venv from PyPI (DeepSpeed, Hivemind; bench/peer_venv.sh): scripts/test.sh
    makes it and exports `variable`; run alone, the test makes it with bench/`setup_script`."""
    python = os.environ.get(variable)
    if not python:
        r = subprocess.run([os.path.join(ROOT, "bench", setup_script)], capture_output=True, text=True, timeout=900)
        check(r)
        python = r.stdout.strip().splitlines()[-1]
    return python


_ENVIRONMENT_AT_START = dict(os.environ)  # before any test's monkeypatch: what the zygote starts with
_zygote = {}  # this pytest process's warm interpreter (tests/python/rank_zygote.py): "socket", "process"


def rank_interpreter():
    """The command a rank's Python starts with: a client of this process's zygote (forked from an
    interpreter with torch and tessera imported, tests/python/rank_zygote.py), or sys.executable
    where the zygote cannot start or TESSERA_TEST_FRESH_RANKS=1."""
    if os.environ.get("TESSERA_TEST_FRESH_RANKS") == "1":
        return [sys.executable]
    if "socket" not in _zygote:
        folder = tempfile.mkdtemp(prefix="tessera-zygote-")
        path = os.path.join(folder, "socket")
        # OMP_NUM_THREADS: what the launcher gives each rank (libgomp reads it once, at load)
        env = child_env(_ENVIRONMENT_AT_START, OMP_NUM_THREADS="1")
        process = subprocess.Popen([sys.executable, ZYGOTE, "serve", path], env=env, cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = process.stdout.readline().strip() == "ready"
        _zygote.update(socket=path if ready else None, process=process, folder=folder)
        if not ready:
            process.kill()
        atexit.register(stop_zygote)
    return [sys.executable, "-S", ZYGOTE, "run", _zygote["socket"]] if _zygote["socket"] else [sys.executable]


def stop_zygote():
    process = _zygote.get("process")
    if process is not None and process.poll() is None:
        process.kill()
        process.wait()
    shutil.rmtree(_zygote.get("folder", ""), ignore_errors=True)


def launch(nproc, argv, timeout=240, flags=(), fresh_interpreter=False, **kwargs):
    """Runs `python argv...` on `nproc` local ranks through tessera launch (with its `flags`);
    returns CompletedProcess. Each rank is forked from this process's warm interpreter
    (rank_interpreter()) unless `fresh_interpreter` (a test of the rank's process itself, e.g. one
    that uses CUDA) or the command is not a script (`-m`, `-c`)."""
    if not os.path.exists(CLI):
        pytest.fail("%s not built (run `make build` or scripts/build.sh tessera_cli)" % CLI)
    python = [sys.executable] if fresh_interpreter or str(argv[0]).startswith("-") else rank_interpreter()
    # A port free when chosen can be taken before rank 0 binds it (another test's Gloo pairs listen on
    # ephemeral ports): that job never started, so it is run again on another port.
    for attempt in range(3):
        cmd = [CLI, "launch", "--nproc-per-node", str(nproc), "--master-port", str(free_port()), "--timeout", "120"] + \
            list(flags) + ["--"] + python + list(argv)
        result = subprocess.run(cmd, env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                                **kwargs)
        if result.returncode == 0 or "could not host the rendezvous store" not in (result.stdout or "") + (result.stderr or ""):
            return result
    return result


def check(result):
    """Fails the test with the job's output when it did not exit 0."""
    if result.returncode != 0:
        pytest.fail("exit status %d\n--- stdout\n%s\n--- stderr\n%s" % (result.returncode, result.stdout[-6000:],
                                                                       result.stderr[-6000:]))
    return result
