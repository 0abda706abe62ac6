"""The 1-bit optimizers through the Python API on 2 ranks (tests/python/onebit_worker.py): every step
after the warm-up equals a plain PyTorch simulation of both ranks started from the engine's state;
the phases follow each optimizer's schedule; the state is exposed by name."""
import json

import pytest
import torch

from conftest import check, launch

W, C, L = "warm-up", "compressed", "local"
CASES = [
    {"type": "OneBitAdam", "lr": 1e-2, "weight_decay": 0.01, "clip": 0.5, "seed": 3, "steps": 8,
     "params": {"freeze_step": 3},
     "phases": [W] * 3 + [C] * 5},
    # Small scalers, so 20 steps see every branch: full-precision variance updates whose interval
    # doubles (t = 1, 2, 4, 6, 8), 1-bit gradient steps between them, then local steps whose sync
    # interval grows 1 -> 2 -> 4.
    {"type": "ZeroOneAdam", "lr": 1e-2, "weight_decay": 0.01, "clip": 0.5, "seed": 4, "steps": 20,
     "params": {"var_freeze_step": 10, "var_update_scaler": 2, "local_step_scaler": 3, "local_step_clipper": 4},
     "phases": [W, W, C, W, C, W, C, W, C, C, C, C, C, C, L, C, L, L, L, C]},
    {"type": "OneBitLamb", "lr": 1e-2, "weight_decay": 0.01, "clip": 0.5, "seed": 5, "steps": 8,
     "params": {"freeze_step": 3},
     "phases": [W] * 3 + [C] * 5},
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onebit")
    cases = folder / "cases.json"
    cases.write_text(json.dumps(CASES))
    out = folder / "results.pt"
    check(launch(2, ["tests/python/onebit_worker.py", str(cases), str(out)]))
    return torch.load(out)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["type"] for c in CASES])
def test_each_step_after_the_warm_up_equals_the_simulation(results, index):
    check_against_simulation(CASES[index], results[index])


def check_against_simulation(case, result):
    """One case's result from onebit_worker.py (also used by test_gpu.py's run on CUDA tensors)."""
    assert result["phases"] == case["phases"]
    assert result["simulated"] == sum(p != W for p in case["phases"]) + (
        sum(p == W for p in case["phases"]) if case["type"] == "ZeroOneAdam" else 0)
    worst = result["worst"]
    assert worst["params"] < 1e-6, worst
    assert worst["exp_avg"] < 1e-6, worst
    assert worst["errors"] < 1e-6, worst
    assert worst["norm"] < 1e-5, worst
    for key in ("momentum_accumulator", "exp_avg_sq_fresh", "counters", "last_factor"):
        assert worst.get(key, 0.0) < 1e-6, worst


def test_the_state_is_named_like_deepspeeds(results):
    names = {c["type"]: set(r["state"]) for c, r in zip(CASES, results)}
    common = {"0.exp_avg", "0.exp_avg_sq", "0.worker_error", "0.server_error"}
    assert names["OneBitAdam"] == common
    assert names["ZeroOneAdam"] == common | {"0.momentum_accumulator", "0.counters"}
    assert names["OneBitLamb"] == common | {"0.exp_avg_sq_fresh", "0.lamb_coeff_freeze", "0.last_factor"}
