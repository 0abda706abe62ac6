"""DeepSpeed's "elasticity" section (engine/config/elasticity.h): for each config and data-parallel
size, the batch triple `tessera config check --world-size N` resolves is the one DeepSpeed computes
(deepspeed.elasticity.compute_elastic_config of DeepSpeed 0.19.7 from PyPI, the last release with
elastic training: 0.19.8 removed it; bench/setup_deepspeed.sh installs it beside 0.19.8), and a size
DeepSpeed refuses is refused naming the valid ones."""
import json
import os
import subprocess

import pytest

from conftest import CLI, check, peer_python

# (elasticity section, data-parallel sizes): versions 0.1 and 0.2, ties both ways, lcm bases,
# node-level counting, a size outside the valid ones (0.2's fallback batch; 0.1's error).
CASES = [
    ({"max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6], "min_gpus": 1, "max_gpus": 10000, "version": 0.1},
     [1, 2, 3, 4, 5, 6, 8, 10, 12, 7, 9]),
    ({"max_train_batch_size": 100, "micro_batch_sizes": [3, 5], "min_gpus": 2, "max_gpus": 16, "version": 0.1,
      "prefer_larger_batch": False}, [2, 3, 4, 5, 6, 7]),
    ({"max_train_batch_size": 512, "micro_batch_sizes": [8, 16], "version": 0.2, "num_gpus_per_node": 4,
      "min_gpus": 4, "max_gpus": 64}, [4, 8, 12, 16, 32, 3, 6]),
    ({"max_train_batch_size": 960, "micro_batch_sizes": [2, 3, 4], "version": 0.2, "num_gpus_per_node": 8,
      "model_parallel_size": 2, "min_gpus": 8, "max_gpus": 128}, [4, 8, 12, 16, 5]),
    ({"max_train_batch_size": 64, "micro_batch_sizes": [1, 2], "version": 0.2}, [1, 2, 3, 4, 5, 6, 7, 8]),
    ({"max_train_batch_size": 37, "micro_batch_sizes": [4], "version": 0.2, "prefer_larger_batch": False}, [1, 2, 3]),
]

DEEPSPEED_SCRIPT = """
import json, sys
from deepspeed.elasticity import compute_elastic_config
out = []
for section, sizes in json.load(open(sys.argv[1])):
    for size in sizes:
        config = {"elasticity": dict(section, enabled=True)}
        try:
            batch, valid, micro = compute_elastic_config(config, "0.19.7", world_size=size)
            out.append({"batch": int(batch), "micro": int(micro), "gas": int(batch) // (int(micro) * size),
                        "valid": [int(v) for v in valid]})
        except Exception as e:
            out.append({"error": type(e).__name__})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def deepspeed_python():
    return peer_python("TESSERA_DEEPSPEED_PYTHON", "setup_deepspeed.sh")


def tessera_layout(tmp_path, section, size):
    path = tmp_path / "elastic.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW"}, "elasticity": dict(section, enabled=True)}))
    r = subprocess.run([CLI, "config", "check", str(path), "--world-size", str(size)], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr}
    c = json.loads(r.stdout)
    return {"batch": c["train_batch_size"], "micro": c["train_micro_batch_size_per_gpu"],
            "gas": c["gradient_accumulation_steps"]}


def test_the_elastic_batch_is_deepspeeds_at_every_size(deepspeed_python, tmp_path):
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(CASES))
    (tmp_path / "ds.py").write_text(DEEPSPEED_SCRIPT)
    elastic = os.path.join(os.path.dirname(os.path.dirname(deepspeed_python)), "deepspeed-0.19.7")
    r = subprocess.run([deepspeed_python, str(tmp_path / "ds.py"), str(cases)], capture_output=True, text=True,
                       env=dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=elastic), timeout=300)
    check(r)
    assert "deepspeed-0.19.7" in subprocess.run([deepspeed_python, "-c", "import deepspeed; print(deepspeed.__file__)"],
                                                capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=elastic),
                                                timeout=120).stdout
    expected = json.loads(r.stdout.strip().splitlines()[-1])
    got = [tessera_layout(tmp_path, section, size) for section, sizes in CASES for size in sizes]
    refused = 0
    for (section, size), want, have in zip([(s, n) for s, sizes in CASES for n in sizes], expected, got):
        if "error" in want:
            refused += 1
            assert "error" in have and "is not one the elastic batch" in have["error"], (section, size, want, have)
            assert "elasticity" in have["error"] and "valid sizes [" in have["error"], have["error"]
        else:
            assert have == {k: want[k] for k in ("batch", "micro", "gas")}, (section, size, want, have)
    assert 0 < refused < len(got)  # both kinds of size were tried


def test_batch_keys_beside_elasticity_are_an_error_unless_ignored(tmp_path):
    section = {"enabled": True, "max_train_batch_size": 64, "micro_batch_sizes": [2, 4], "version": 0.1}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW"}, "train_batch_size": 32, "elasticity": section}))
    r = subprocess.run([CLI, "config", "check", str(path), "--world-size", "2"], capture_output=True, text=True)
    assert r.returncode != 0 and "error: train_batch_size: " in r.stderr, r.stderr
    assert "elasticity.ignore_non_elastic_batch_info" in r.stderr, r.stderr
    section["ignore_non_elastic_batch_info"] = True
    path.write_text(json.dumps({"optimizer": {"type": "AdamW"}, "train_batch_size": 32, "elasticity": section}))
    r = subprocess.run([CLI, "config", "check", str(path), "--world-size", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["train_batch_size"] != 32  # the elastic batch, not the ignored one
    for bad, where in [({"micro_batch_sizes": []}, "elasticity.micro_batch_sizes"),
                       ({"version": 0.3}, "elasticity.version"),
                       ({"model_parallel_size": 2}, "elasticity.model_parallel_size"),
                       ({"min_gpus": 8, "max_gpus": 4}, "elasticity.min_gpus")]:
        path.write_text(json.dumps({"optimizer": {"type": "AdamW"}, "elasticity": dict(section, **bad)}))
        r = subprocess.run([CLI, "config", "check", str(path), "--world-size", "2"], capture_output=True, text=True)
        assert r.returncode != 0 and "error: %s: " % where in r.stderr, (bad, r.stderr)
