"""The 1-bit optimizers through the Python API on 2 ranks (tests/python/workers/onebit_worker.py): every step
after the warm-up equals a plain PyTorch simulation of both ranks started from the engine's state;
the phases follow each optimizer's schedule; the state is exposed by name."""
import json

import pytest
import torch

from conftest import check, launch
from onebit_cases import CASES, check_against_simulation

@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onebit")
    cases = folder / "cases.json"
    cases.write_text(json.dumps(CASES))
    out = folder / "results.pt"
    check(launch(2, ["tests/python/workers/onebit_worker.py", str(cases), str(out)]))
    return torch.load(out)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["type"] for c in CASES])
def test_each_step_after_the_warm_up_equals_the_simulation(results, index):
    check_against_simulation(CASES[index], results[index])


def test_the_state_is_named_like_deepspeeds(results):
    names = {c["type"]: set(r["state"]) for c, r in zip(CASES, results)}
    common = {"0.exp_avg", "0.exp_avg_sq", "0.worker_error", "0.server_error"}
    assert names["OneBitAdam"] == common
    assert names["ZeroOneAdam"] == common | {"0.momentum_accumulator", "0.counters"}
    assert names["OneBitLamb"] == common | {"0.exp_avg_sq_fresh", "0.lamb_coeff_freeze", "0.last_factor"}
