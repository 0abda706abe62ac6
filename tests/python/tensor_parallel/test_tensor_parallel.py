"""Tensor parallelism (tessera.tensor_parallel, parallel/tensor_parallel/) against references.

- Every region crossing's forward and backward against closed forms, column/row-parallel linear
  layers (with and without sequence parallelism), a fused q|k|v split, the vocabulary-parallel
  embedding and cross-entropy, and the errors for sizes that do not divide: on 2 and 4 ranks
  (tensor_parallel_worker.py).
- The example GPT (2 layers of 32, tied LM head) trained through tessera.initialize with
  `tensor_parallel.tp_size` and no plan (the automatic plan), against the same GPT in plain PyTorch
  in one process (parity_worker.reference_run): every step's loss, gradient norm (clipping active)
  and every parameter, gathered from its slices. tp = 2 and 4, with and without sequence
  parallelism, ZeRO 0-3, and tp = 2 x dp = 2 with ZeRO 1, 2 and 3.
- The estimator's activation bytes per layer (tessera.estimate) against the bytes autograd saves in
  one block (activation_memory_worker.py): tp 1 and 2, with and without sequence parallelism and
  full checkpointing (partitioned inputs too).
Tolerances are the data-parallel GPT's (test_parity.py): parameters 1e-5, losses 2e-6 relative,
norms 1e-5 relative.
"""
import pytest
import torch

from conftest import check, launch
from parity_cases import GPT, GPT_PARAM_TOL, case, compare, write_cases


@pytest.mark.parametrize("ranks", [2, 4])
def test_regions_and_layers_match_closed_forms(ranks):
    result = check(launch(ranks, ["tests/python/workers/tensor_parallel_worker.py"]))
    assert "tensor parallel checks passed" in result.stdout


def tp_case(stage, tp, dp=1, sp=False, heads=2):
    return case(stage, dp=dp, tp=tp, sp=sp, heads=heads, **GPT)


TP2 = [tp_case(0, 2), tp_case(0, 2, sp=True), tp_case(1, 2, sp=True), tp_case(2, 2, sp=True), tp_case(3, 2, sp=True)]
TP4 = [tp_case(0, 4, heads=4), tp_case(2, 4, sp=True, heads=4)]
TP2_DP2 = [tp_case(1, 2, dp=2, sp=True), tp_case(2, 2, dp=2), tp_case(2, 2, dp=2, sp=True), tp_case(3, 2, dp=2, sp=True)]


def run_cases(tmp_path, ranks, cases):
    out = tmp_path / "tp.pt"
    check(launch(ranks, ["tests/python/workers/parity_worker.py", write_cases(tmp_path, cases), str(out)]))
    return torch.load(out)


@pytest.mark.parametrize("ranks,cases", [(2, TP2), (4, TP4), (4, TP2_DP2)], ids=["tp2", "tp4", "tp2xdp2"])
def test_gpt_matches_single_process_torch(tmp_path, ranks, cases):
    got = run_cases(tmp_path, ranks, cases)
    for result, c in zip(got, cases):
        compare(result, c, param_tol=GPT_PARAM_TOL)
        # the automatic plan split every block's four projections (weights, and the column-parallel biases)
        assert len(result["sliced"]) == 2 * 6, result["sliced"]


def test_tp_config_after_init_distributed(tmp_path):
    """DeepSpeed's order, init_distributed() then initialize(): the world group (and torch.distributed)
    first, the tensor group from the config's tp_size at initialize."""
    c = tp_case(1, 2, sp=True)
    out = tmp_path / "tp.pt"
    check(launch(2, ["tests/python/workers/parity_worker.py", write_cases(tmp_path, [c]), str(out), "--init-distributed-first"]))
    compare(torch.load(out)[0], c, param_tol=GPT_PARAM_TOL)


@pytest.mark.parametrize("ranks", [1, 2])
def test_estimator_activation_bytes_match_what_autograd_saves(ranks):
    result = check(launch(ranks, ["tests/python/workers/activation_memory_worker.py"]))
    assert result.stdout.count("measured") == (2 if ranks == 1 else 4), result.stdout
