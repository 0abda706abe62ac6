"""The layer check (tests/check_layers.py) passes on the tree and fails on an upward #include."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CHECK = os.path.join(ROOT, "tests", "check_layers.py")


def run(root):
    return subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)


def test_the_tree_includes_only_downward():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_upward_and_sideways_includes_fail(tmp_path):
    root = str(tmp_path)
    write(root, "optim/ok.h", '#include "parallel/communicator.h"\n#include <vector>\n')
    assert run(root).returncode == 0
    write(root, "zero/bad.h", '#pragma once\n#include "engine/engine.h"  // ModelDescription\n')
    write(root, "engine/engine.cpp", '#include "engine/estimator/estimator.h"\n')
    write(root, "engine/config/config.h", '#include "engine/engine.h"\n')
    write(root, "parallel/x.cpp", '#include "tests/subprocess.h"\n')
    r = run(root)
    assert r.returncode == 1
    assert "zero/bad.h:2: zero includes engine/engine.h, from engine, which is above it" in r.stdout
    assert "engine/engine.cpp:1: engine includes engine/estimator/estimator.h, from engine/estimator, " \
           "which is on the same level as it" in r.stdout
    assert "engine/config/config.h:1: engine/config includes engine/engine.h" in r.stdout
    assert "parallel/x.cpp:1: includes tests/subprocess.h" in r.stdout
