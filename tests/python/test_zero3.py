"""ZeRO-3 from Python on 2 ranks (tests/python/zero3_worker.py says what each check does): memory
released as it goes, evaluation, GatheredParameters with and without a modifier rank, a unit
called twice in one forward, and a unit order that changes between steps, each against plain
PyTorch. (Parity with torch at every step, on 1 and 2 ranks, in fp32 and bf16, including the
example GPT with its tied head, is in test_parity.py.)"""
import pytest

from conftest import check, launch

CHECKS = ["memory", "eval", "gathered", "twice", "reorder", "order", "init", "init_plain"]


@pytest.fixture(scope="module")
def run():
    return check(launch(2, ["tests/python/zero3_worker.py"] + CHECKS))


@pytest.mark.parametrize("name", CHECKS)
def test_zero3(run, name):
    assert ("ok %s" % name) in run.stdout, run.stdout + run.stderr


def test_zero3_reorder_is_reported(run):
    assert "recording the order again" in run.stderr + run.stdout


def test_zero3_init_memory():
    """Alone in its processes: the peak RSS of building the model is measured."""
    result = check(launch(2, ["tests/python/zero3_worker.py", "init_memory"]))
    assert "ok init_memory" in result.stdout, result.stdout + result.stderr
    print(result.stdout)
