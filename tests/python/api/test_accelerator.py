"""tessera.accelerator (DeepSpeed's get_accelerator), tessera.utils and tessera.runtime.utils, the
names DeepSpeed's own training scripts import: on this CPU machine the accelerator answers what a
CPU rank is (its device, the launcher's local rank and size, Gloo, bf16/fp16 from the CPU's flags,
the process's memory), the override picks it and refuses what torch cannot give, the loader repeats
with a new epoch each pass, and set_random_seed makes runs repeat. (test_gpu.py asks the CUDA one.)"""
import os
import subprocess
import sys

import pytest
import torch

import tessera
from tessera import accelerator
from tessera.accelerator import get_accelerator
from tessera.runtime.utils import set_random_seed
from tessera.utils import RepeatingLoader, log_dist


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        return next(set(l.split(":", 1)[1].split()) for l in f if l.startswith("flags"))


def fresh(code, **env):
    """Runs `code` in a new interpreter (get_accelerator() chooses once per process)."""
    full = {k: v for k, v in os.environ.items() if k not in ("TESSERA_ACCELERATOR", "DS_ACCELERATOR")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answers on a machine without a GPU")
def test_on_a_cpu_machine_the_accelerator_is_the_cpu(monkeypatch):
    acc = get_accelerator()
    assert acc is get_accelerator()  # chosen once
    assert acc.device_name() == acc.device_name(1) == acc.current_device_name() == "cpu"
    assert acc.device(0) == torch.device("cpu")
    assert acc.communication_backend_name() == "gloo"
    assert acc.is_available() and acc.is_synchronized_device()
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert acc.current_device() == 1 and acc.device_count() == 2
    flags = cpu_flags()
    assert acc.is_bf16_supported() == bool(flags & {"avx512_bf16", "amx_bf16"})
    assert acc.is_fp16_supported() == bool(flags & {"avx512_fp16", "amx_fp16"})
    assert acc.supported_dtypes()[0] == torch.float32
    assert (torch.bfloat16 in acc.supported_dtypes()) == acc.is_bf16_supported()
    # Memory: the process's resident set, its peak, the machine's.
    before = acc.memory_allocated()
    held = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
    assert acc.memory_allocated() >= before + (48 << 20)
    assert acc.max_memory_allocated() >= acc.memory_allocated()
    del held
    acc.empty_cache()
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() < before + (48 << 20)
    assert 0 < acc.available_memory() <= acc.total_memory()
    # Tensors, streams, pinning, RNG.
    t = acc.FloatTensor([1.0, 2.0])
    assert t.dtype == torch.float32 and acc.on_accelerator(t)
    assert acc.pin_memory(t) is t and not acc.is_pinned(t)
    with acc.stream(acc.Stream):
        acc.synchronize()
    acc.manual_seed_all(3)
    a = torch.rand(4)
    acc.manual_seed(3)
    assert torch.equal(a, torch.rand(4))
    with pytest.raises(NotImplementedError, match="no op builders"):
        acc.create_op_builder("CPUAdamBuilder")


def test_the_override_picks_the_accelerator_and_refuses_what_is_not_there():
    r = fresh("from tessera.accelerator import get_accelerator as g; print(g().device_name(0))",
              TESSERA_ACCELERATOR="cpu")
    assert r.returncode == 0 and r.stdout.strip() == "cpu", r.stderr
    r = fresh("from tessera.accelerator import get_accelerator as g; g()", DS_ACCELERATOR="npu")
    assert r.returncode != 0 and "DS_ACCELERATOR='npu' is not an accelerator tessera has" in r.stderr, r.stderr
    if not torch.cuda.is_available():
        r = fresh("from tessera.accelerator import get_accelerator as g; g()", TESSERA_ACCELERATOR="cuda")
        assert r.returncode != 0 and "torch sees no CUDA device" in r.stderr, r.stderr


def test_set_accelerator_installs_another():
    mine = accelerator.CpuAccelerator()
    old = get_accelerator()
    try:
        accelerator.set_accelerator(mine)
        assert get_accelerator() is mine
    finally:
        accelerator.set_accelerator(old)


def test_repeating_loader_starts_again_with_the_next_epoch():
    data = torch.utils.data.TensorDataset(torch.arange(6))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(data, batch_size=3, sampler=sampler)
    it = iter(RepeatingLoader(loader))
    passes = [[int(x) for _ in range(2) for x in next(it)[0]] for _ in range(3)]  # three passes of 2 batches
    assert all(sorted(p) == list(range(6)) for p in passes)
    assert passes[0] != passes[1] or passes[1] != passes[2]  # each pass shuffled anew (set_epoch)
    assert sampler.epoch == 2


def test_set_random_seed_repeats_python_numpy_and_torch():
    import random
    import numpy as np

    def draw():
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    set_random_seed(11)
    first = draw()
    set_random_seed(11)
    assert draw() == first


def test_log_dist_logs_on_the_ranks_named(caplog):
    with caplog.at_level("INFO", logger="tessera"):
        tessera.utils.logger.propagate = True  # to caplog's handler, for this test
        try:
            log_dist("hello from the ranks named", ranks=[0])
            log_dist("not on rank 0", ranks=[1])
        finally:
            tessera.utils.logger.propagate = False
    messages = {(r.getMessage(), r.filename) for r in caplog.records}
    assert messages == {("[Rank 0] hello from the ranks named", "test_accelerator.py")}, messages


def test_the_deepspeed_spellings_work_with_tessera():
    """`deepspeed.utils.RepeatingLoader` after only `import deepspeed`, and the from-imports."""
    r = fresh("import tessera\n"
              "print(tessera.utils.RepeatingLoader.__name__, tessera.runtime.utils.set_random_seed.__name__,\n"
              "      tessera.accelerator.get_accelerator().device_name())\n"
              "from tessera.accelerator import get_accelerator\n"
              "from tessera.utils import RepeatingLoader, logger, log_dist\n"
              "from tessera.runtime.utils import set_random_seed\n"
              "from tessera import get_accelerator\n"
              "from tessera.utils.logging import logger\n"
              "from tessera.runtime.config import LAMB_OPTIMIZER, ONEBIT_LAMB_OPTIMIZER\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["RepeatingLoader", "set_random_seed"], r.stdout


def test_the_engine_answers_what_deepspeed_scripts_ask():
    """optimizer_name() (compared with deepspeed.runtime.config's names), steps_per_print(), destroy()."""
    from tessera.runtime.config import LAMB_OPTIMIZER
    model = torch.nn.Linear(4, 2)
    engine, _, _, _ = tessera.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "steps_per_print": 7,
        "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}})
    assert engine.optimizer_name() == LAMB_OPTIMIZER
    assert engine.steps_per_print() == 7
    engine.destroy()
