"""What the engine prints about itself: `tessera report` (engine/cli/report_command.cpp) and
memory_breakdown's line (engine/progress.h's memory_line)."""
import subprocess

import torch

import tessera
from conftest import CLI, check, child_env


def test_report_names_what_it_finds():
    out = check(subprocess.run([CLI, "report"], env=child_env(), capture_output=True, text=True, timeout=120)).stdout
    for expected in ("LibTorch", torch.__version__.split("+")[0], "Adam kernel", "bf16 arithmetic", "GPUs",
                     "io_uring queue", "libaio queue", "tensorboard", "wandb", "comet_ml", "transformers"):
        assert expected in out, (expected, out)
    assert "not installed" not in out.split("tensorboard", 1)[1].splitlines()[0]  # the test venv has it


def test_memory_breakdown_prints_the_engines_buffers(capfd):
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 2, "memory_breakdown": True,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    engine, _, _, _ = tessera.initialize(model=model, config=config)
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 256)).pow(2).mean())
        engine.step()
    report = engine.memory_report()
    engine.close()
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("memory |")]
    assert len(lines) == 1, lines  # every steps_per_print steps
    line = lines[0]
    assert "parameters %.1f |" % (report["parameters"] / 2**20) in line
    assert "optimizer states %.1f |" % (report["optimizer_states"] / 2**20) in line
    assert "engine %.1f MiB" % (report["total"] / 2**20) in line and "peak rss" in line
