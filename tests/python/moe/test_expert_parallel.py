"""Expert parallelism on 4 ranks against one process (tests/python/workers/moe_worker.py): dp 4 with
ep 2 and ep 4, ZeRO 0-3, dropless and with a capacity, SGD with clipping and AdamW: the loss and the
gradient norm every step and every parameter at the end, within 1e-5 relative; and a script's
torch.optim optimizer over DeepSpeed's MoE param groups."""
import pytest

from conftest import check, launch


def run(ep, stages, optimizer, drop, *more, ranks=4):
    """`stages`: a ZeRO stage or a list of them, run one after the other by one launch of the ranks."""
    stages = stages if isinstance(stages, list) else [stages]
    result = check(launch(ranks, ["tests/python/workers/moe_worker.py", str(ep), ",".join(map(str, stages)), optimizer,
                                  drop] + [str(m) for m in more]))
    for stage in stages:
        assert "ok ep %d stage %d %s %s" % (ep, stage, optimizer, drop) in result.stdout, result.stdout + result.stderr


def test_dropless_ep2_sgd_matches_one_process_at_zero_0_to_3():
    run(2, [0, 1, 2, 3], "sgd", "dropless")


def test_dropless_ep4_adamw_matches_one_process_at_zero_0_and_3():
    run(4, [0, 3], "adamw", "dropless")


def test_with_a_capacity_ep2_adamw_matches_one_process_at_zero_1_and_2():
    run(2, [1, 2], "adamw", "capacity")


@pytest.mark.parametrize("stage, optimizer", [(1, "sgd"), (2, "adamw")])
def test_tensor_parallel_2_by_expert_parallel_2_matches_one_process(stage, optimizer):
    run(2, stage, optimizer, "dropless", "tp")


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


def test_a_checkpoint_resumes_exactly_and_loads_at_another_data_parallel_size_and_ep_size(tmp_path):
    """Saved at dp 4, ep 2, ZeRO-2 with AdamW after 2 steps; the third step after a load equals the
    uninterrupted run's: on the same layout, on 2 ranks (dp 2, ep 2, ZeRO-1, two micro-batches a
    step) and at ep 4 (each expert read from the file its global index named)."""
    run(2, 2, "adamw", "dropless", "save", tmp_path)
    run(2, 2, "adamw", "dropless", "load", tmp_path)
    run(2, 1, "adamw", "dropless", "load", tmp_path, ranks=2)
    run(4, 3, "adamw", "dropless", "load", tmp_path)


DIFFERING = """
import torch, tessera
from tessera.moe import MoE
rank = tessera.comm.get_rank()
model = MoE(4, torch.nn.Linear(4, 4), num_experts=4, ep_size=2 if rank == 0 else 1)
try:
    tessera.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD"}})
except ValueError as e:
    print("rank %d: %s" % (rank, e), flush=True)
"""


def test_moe_layers_that_differ_between_ranks_are_refused_on_every_rank():
    result = check(launch(2, ["-c", DIFFERING]))
    for rank in (0, 1):
        assert "rank %d: tessera.initialize: the ranks' MoE layers differ" % rank in result.stdout, result.stdout + result.stderr


ONE_BIT = """
import torch, tessera
from tessera.moe import MoE
model = MoE(4, torch.nn.Linear(4, 4), num_experts=2, ep_size=2)
try:
    tessera.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1,
                                            "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}}})
except ValueError as e:
    print("refused: %s" % e, flush=True)
"""


def test_one_bit_optimizers_refuse_expert_parallel_groups():
    result = check(launch(2, ["-c", ONE_BIT]))
    assert "OneBitAdam steps each rank's own gradient" in result.stdout and "use Adam or AdamW with MoE" in result.stdout, \
        result.stdout + result.stderr


SEQUENCE_PARALLEL = """
import torch, tessera
from tessera.moe import MoE
model = torch.nn.Sequential(torch.nn.Linear(4, 4), MoE(4, torch.nn.Linear(4, 4), num_experts=2))
try:
    tessera.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD"},
                                            "tensor_parallel": {"tp_size": 2, "sequence_parallel": True}})
except ValueError as e:
    print("refused: %s" % e, flush=True)
"""


def test_a_python_moe_layer_under_sequence_parallelism_is_refused():
    result = check(launch(2, ["-c", SEQUENCE_PARALLEL]))
    assert "refused: tessera.initialize: the MoE layer '1' under tensor_parallel.sequence_parallel" in result.stdout, \
        result.stdout + result.stderr
