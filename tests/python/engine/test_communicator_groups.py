"""A param group reduced over a communicator of its own, from Python (the C++ engine's
ParamGroup::communicator; tests/zero/test_group_communicators.cpp covers it in C++ with clipping,
accumulation and bf16): on 4 ranks, tessera.comm.split_axis makes "expert_data" out of the data
axis, a group named with "communicator": "expert_data" averages over it while the dense group
averages over all 4, at ZeRO 0-3, against a reference of every rank computed by hand
(tests/python/workers/communicator_groups_worker.py)."""
import pytest

from conftest import check, launch


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_group_on_its_own_communicator_matches_the_reference(stage):
    result = check(launch(4, ["tests/python/workers/communicator_groups_worker.py", str(stage)]))
    assert "ok stage %d" % stage in result.stdout, result.stdout + result.stderr


def test_a_client_optimizers_param_group_keeps_its_communicator():
    result = check(launch(4, ["tests/python/workers/communicator_groups_worker.py", "1", "client"]))
    assert "ok stage 1" in result.stdout, result.stdout + result.stderr


def test_a_param_group_communicator_must_be_a_str():
    import torch
    import tessera
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"model_parameters\[0\]\['communicator'\] must be a str"):
        tessera.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD"}},
                           model_parameters=[{"params": list(model.parameters()), "communicator": 2}])
