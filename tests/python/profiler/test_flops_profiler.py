"""The flops profiler (python/tessera/flops_profiler.py): a linear layer's count is exact, the example
GPT's forward + backward is within 5% of the standard estimate 6N + 12·L·d·T flops a token
(Kaplan et al. 2020; N the matmul parameters, the tied head's included), and the engine profiles
its profile_step on rank 0 only, with the MFU against a given peak."""
import os
import sys

import pytest
import torch

from checkpoint_cases import TINY, config, run_jobs
from tessera.flops_profiler import FlopsProfiler, get_model_profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python"))
from models import Gpt  # noqa: E402


def test_a_linear_layer_is_counted_exactly():
    layer = torch.nn.Linear(48, 80)
    x = torch.randn(3, 7, 48)
    flops, macs, params = get_model_profile(layer, args=[x], print_profile=False, as_string=False)
    assert macs == 3 * 7 * 48 * 80 and flops == 2 * macs and params == 48 * 80 + 80


def test_gpt_forward_and_backward_is_6n_plus_attention():
    L, d, T, V, B = 4, 128, 64, 256, 2
    model = Gpt(vocab=V, block_size=T, n_layer=L, n_head=4, n_embd=d)
    prof = FlopsProfiler(model)
    prof.start_profile()
    with torch.no_grad():
        model(torch.randint(0, V, (B, T)))
    prof.stop_profile()
    # N: the weights of the blocks' matmuls, and the head (the embedding, tied).
    n = sum(p.numel() for name, p in model.named_parameters() if name.endswith("weight") and p.dim() == 2
            and ".h." in name) + V * d
    expected = B * T * (6 * n + 12 * L * d * T)
    measured = 3 * prof.get_total_flops()  # backward = 2 × forward
    assert measured == pytest.approx(expected, rel=0.05)
    block = prof.module_flops(model.transformer.h[0])
    assert 0 < block < prof.get_total_flops() / L  # a block's count is inside the model's
    assert prof.module_flops(model.transformer.h) == pytest.approx(L * block, rel=1e-9)  # a ModuleList: its blocks'
    text = prof.print_model_profile(module_depth=3, output_file=os.devnull)
    assert "Top 1 modules" in text and "depth 3:" in text and "'Block'" in text and "(0): Block(" in text


def test_the_engine_profiles_its_profile_step_on_rank_0(tmp_path):
    report = tmp_path / "flops.txt"
    c = config(stage=1, flops_profiler={"enabled": True, "profile_step": 2, "output_file": str(report),
                                        "peak_tflops": 1.0, "module_depth": 1})
    run_jobs(tmp_path, 2, [dict(TINY, config=c, steps=3)])
    text = report.read_text()
    assert text.count("Profile Summary at step 2:") == 1  # rank 0 alone, once
    for line in ("data parallel size:", "fwd flops per GPU:", "bwd latency:", "iter latency:",
                 "MFU = FLOPS per GPU / peak (1 TFLOPS):", "Aggregated Profile per GPU", "Detailed Profile per GPU"):
        assert line in text, line
    assert "): Unit(" not in text  # the modules' report: the binding turns the C++ units' profiler off
