"""`pip install --no-build-isolation .` into a fresh virtual environment builds the extension and the
`tessera` command against the torch already there; `import tessera` and `tessera` then work from
another directory with no PYTHONPATH; an isolated build fails saying to add --no-build-isolation.

The fresh venv sees the project venv's packages (torch, scikit-build-core) through a .pth file, the
way the DeepSpeed venv of bench/ reuses them: `--system-site-packages` would only reach the system
Python's. The build goes to build/pip-<wheel tag> and reuses the objects of `make build` through
ccache (scripts/build.sh exports CCACHE_NOHASHDIR), so it compiles little.
"""
import os
import site
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

pytestmark = pytest.mark.serial  # builds in build/pip-<tag>, the folder the project venv's extension is built in

TRAIN = textwrap.dedent("""
    import torch, tessera
    model = torch.nn.Linear(4, 2)
    engine, optimizer, _, _ = tessera.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    for _ in range(2):
        loss = engine(torch.randn(2, 4)).pow(2).mean()
        engine.backward(loss)
        engine.step()
    print("trained", engine.global_steps, tessera.__file__)
""")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.setdefault("CCACHE_NOHASHDIR", "true")
    env.setdefault("CXX", "c++")  # CMake's default, which `make build` used (scikit-build-core would say g++)
    env.update(extra)
    return env


def run(args, cwd, timeout=1800, **kwargs):
    return subprocess.run(args, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("install")
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "project-venv.pth"), "w") as f:  # torch, pip and scikit-build-core from here
        f.write("\n".join(site.getsitepackages()) + "\n")
    return folder, python


def test_an_isolated_build_says_to_turn_isolation_off(venv):
    folder, python = venv
    result = run([str(python), "-m", "pip", "install", "--no-deps", ROOT], cwd=folder, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    if "pip install --no-build-isolation ." not in output and "No matching distribution found for scikit-build-core" in output:
        pytest.skip("pip could not fetch scikit-build-core for the isolated build environment (offline)")
    assert "pip install --no-build-isolation ." in output, output[-6000:]


def test_pip_install_then_import_and_the_command_work_elsewhere(venv):
    folder, python = venv
    result = run([str(python), "-m", "pip", "install", "--no-build-isolation", "--no-deps", ROOT], cwd=folder)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    trained = run([str(python), "-c", TRAIN], cwd=elsewhere, timeout=300)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "trained 2" in trained.stdout
    location = trained.stdout.split()[-1]
    assert location.startswith(str(folder / "venv")) and not location.startswith(ROOT), location
    cli = folder / "venv" / "bin" / "tessera"
    assert cli.exists()
    checked = run([str(cli), "config", "check", os.path.join(ROOT, "configs", "zero2_fp32.json")], cwd=elsewhere,
                  timeout=120)
    assert checked.returncode == 0 and '"train_batch_size"' in checked.stdout, checked.stdout + checked.stderr
    # the command on the environment's PATH, as after `source venv/bin/activate`
    path_env = clean_env(PATH=str(folder / "venv" / "bin") + os.pathsep + os.environ["PATH"])
    launched = subprocess.run(["tessera", "launch", "--nproc-per-node", "1", "--", "python", "-c", TRAIN],
                              cwd=elsewhere, env=path_env, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0 and "trained 2" in launched.stdout, launched.stdout + launched.stderr


def test_an_editable_install_imports_the_checkouts_sources(venv):
    """`pip install -e .`: the package's Python files are the checkout's (edits show without a
    reinstall); the extension is the one built in build/pip-<tag>."""
    folder, python = venv
    result = run([str(python), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e", ROOT], cwd=folder)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    probe = run([str(python), "-c", "import tessera, tessera._C as c; print(tessera.__file__); print(c.__file__)"],
                cwd=folder, timeout=300)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    package, extension = probe.stdout.split()
    assert package == os.path.join(ROOT, "python", "tessera", "__init__.py"), package
    assert extension.endswith(os.path.join("tessera", "_C.so")), extension
    trained = run([str(python), "-c", TRAIN], cwd=folder, timeout=300)
    assert trained.returncode == 0 and "trained 2" in trained.stdout, trained.stdout + trained.stderr
