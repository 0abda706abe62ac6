"""Activation checkpointing (tessera.checkpointing) against the same model without it.

- The example GPT with every block checkpointed: the same loss and bit-identical gradients as
  without, and autograd saves measurably fewer bytes (counted with saved_tensors_hooks).
- Dropout inside a checkpoint: recomputation restores the random state, so the gradients equal the
  plain run's, and the caller's generator ends where the plain run's does.
- The RNG tracker: fork() draws its own stream and leaves the default generator alone.
- configure(): from a config's activation_checkpointing section, unknown keys refused;
  tessera.initialize configures it.
- Through the engine on 2 ranks (ZeRO 1, 2 and 3; tensor parallelism with partition_activations):
  parity_worker's GPT with its blocks checkpointed against single-process PyTorch.
"""
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import check, launch
from parity_cases import GPT, GPT_PARAM_TOL, case, compare, write_cases

import tessera
from tessera import checkpointing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python"))
from models import Gpt  # noqa: E402


def grads_of(model):
    return [p.grad.clone() for p in model.parameters()]


def gpt_loss(model, seed=5):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (4, 65), generator=g)
    return model(tokens[:, :-1], tokens[:, 1:])


def test_checkpointed_gpt_has_the_same_gradients_and_saves_less():
    plain, ckpt = Gpt(n_layer=4, seed=3), Gpt(n_layer=4, seed=3)
    assert checkpointing.checkpoint_modules(ckpt) == ["transformer.h.%d" % i for i in range(4)]
    with checkpointing.measure_saved_bytes() as plain_saved:
        loss_plain = gpt_loss(plain)
    with checkpointing.measure_saved_bytes() as ckpt_saved:
        loss_ckpt = gpt_loss(ckpt)
    assert loss_ckpt.item() == loss_plain.item()
    loss_plain.backward()
    before = checkpointing.stats()["recomputations"]
    loss_ckpt.backward()
    assert checkpointing.stats()["recomputations"] == before + 4
    for a, b in zip(grads_of(plain), grads_of(ckpt)):
        assert torch.equal(a, b)
    # Four blocks keep only their inputs (4 x B*T*C floats); the embedding and head keep theirs.
    assert ckpt_saved["bytes"] < 0.5 * plain_saved["bytes"], (ckpt_saved, plain_saved)
    block_input = 4 * 64 * 128 * 4
    assert ckpt_saved["bytes"] >= 4 * block_input


class DropoutBlock(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(F.dropout(F.gelu(self.fc1(x)), p=0.5, training=True))


def test_dropout_is_recomputed_with_the_same_masks():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    plain, ckpt = DropoutBlock(), DropoutBlock()
    torch.manual_seed(42)
    plain(x).square().sum().backward()
    after_plain = torch.rand(1)
    torch.manual_seed(42)
    checkpointing.checkpoint(ckpt, x).square().sum().backward()
    after_ckpt = torch.rand(1)
    for a, b in zip(grads_of(plain), grads_of(ckpt)):
        assert torch.equal(a, b)
    assert torch.equal(after_plain, after_ckpt)  # the recomputation did not advance the caller's stream


def test_rng_tracker_forks_its_own_stream():
    checkpointing.model_parallel_seed(123)
    tracker = checkpointing.get_cuda_rng_tracker()
    default_next = torch.get_rng_state()
    with tracker.fork():
        a = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), default_next)
    with tracker.fork():
        b = torch.rand(3)
    assert not torch.equal(a, b)  # the tracked stream advanced
    torch.manual_seed(123 + 2718)
    assert torch.equal(a, torch.rand(3))  # tensor rank 0: seed + 2718
    with pytest.raises(ValueError, match="no RNG state"):
        with tracker.fork("other"):
            pass


def test_configure_reads_the_section_and_refuses_unknown_keys():
    checkpointing.configure(None, deepspeed_config={"activation_checkpointing": {"partition_activations": True,
                                                                                  "profile": True}},
                            checkpoint_in_cpu=True)
    assert checkpointing._options["partition_activations"] and checkpointing._options["cpu_checkpointing"]
    with pytest.raises(ValueError, match="partition_activation"):
        checkpointing.configure(None, deepspeed_config={"activation_checkpointing": {"partition_activation": True}})
    checkpointing.reset()
    assert not checkpointing.is_configured()


CASES = [case(1, dp=2, ckpt=True, **GPT), case(2, dp=2, ckpt=True, **GPT), case(3, dp=2, ckpt=True, **GPT),
         case(2, dp=1, tp=2, ckpt=True, partition=True, **GPT), case(1, dp=1, tp=2, sp=True, ckpt=True, partition=True, **GPT)]


def test_engine_with_checkpointed_blocks_matches_torch(tmp_path):
    out = tmp_path / "ckpt.pt"
    check(launch(2, ["tests/python/workers/parity_worker.py", write_cases(tmp_path, CASES[:3]), str(out)]))
    for got, c in zip(torch.load(out), CASES[:3]):
        compare(got, c, param_tol=GPT_PARAM_TOL)
        assert got["recomputations"] == c["steps"] * c["gas"] * 2  # both blocks, every micro-step


def test_tensor_parallel_with_partitioned_activations_matches_torch(tmp_path):
    """tp 2 with partition_activations: each rank keeps half of every block's input; then tp 2 with
    sequence parallelism, whose inputs are split already (nothing more is partitioned)."""
    out = tmp_path / "ckpt_tp.pt"
    check(launch(2, ["tests/python/workers/parity_worker.py", write_cases(tmp_path, CASES[3:]), str(out)]))
    got = torch.load(out)
    micro_steps = CASES[3]["steps"] * CASES[3]["gas"]
    for result, c in zip(got, CASES[3:]):
        compare(result, c, param_tol=GPT_PARAM_TOL)
        assert result["recomputations"] == micro_steps * 2
    assert got[0]["partitioned_inputs"] == micro_steps * 2  # one input per block and micro-step
    assert got[1]["partitioned_inputs"] == 0  # under SP (counted from the reset before it)
