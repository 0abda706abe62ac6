"""Expert parallelism on 4 ranks against one process (tests/python/workers/moe_worker.py): dp 4 with
ep 2 and ep 4, ZeRO 0-3, dropless and with a capacity, SGD with clipping and AdamW: the loss and the
gradient norm every step and every parameter at the end, within 1e-5 relative; and a script's
torch.optim optimizer over DeepSpeed's MoE param groups."""
import pytest

from conftest import check, launch


def run(ep, stage, optimizer, drop, *more):
    result = check(launch(4, ["tests/python/workers/moe_worker.py", str(ep), str(stage), optimizer, drop] + list(more)))
    assert "ok ep %d stage %d %s %s" % (ep, stage, optimizer, drop) in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_dropless_ep2_sgd_matches_one_process(stage):
    run(2, stage, "sgd", "dropless")


@pytest.mark.parametrize("stage", [0, 3])
def test_dropless_ep4_adamw_matches_one_process(stage):
    run(4, stage, "adamw", "dropless")


@pytest.mark.parametrize("stage", [1, 2])
def test_with_a_capacity_ep2_adamw_matches_one_process(stage):
    run(2, stage, "adamw", "capacity")


def test_a_client_optimizer_over_deepspeeds_moe_param_groups_matches_one_process():
    run(2, 2, "sgd", "dropless", "client")


def test_a_client_optimizer_group_mixing_experts_and_dense_parameters_is_refused():
    import torch
    import tessera
    from tessera.moe import MoE
    model = MoE(4, torch.nn.Linear(4, 4), num_experts=2)
    with pytest.raises(ValueError, match=r"mixes expert parameters .*tessera.moe.split_params_into_different_moe_groups"):
        tessera.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1},
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
