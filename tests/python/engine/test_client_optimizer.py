"""A script's own torch optimizer of a kind tessera does not implement, run as given over the engine's
flat shards (tessera/client_optimizer.py; DeepSpeed's zero_allow_untested_optimizer), in this process
on one rank. Parity on 2 ranks at ZeRO 1-3 is in test_parity.py; checkpoints (exact resume, resharding)
in test_checkpoint_resume.py.
"""
import os

import pytest
import torch

import tessera


class Lion(torch.optim.Optimizer):
    """A script's own optimizer (Chen et al. 2023, Algorithm 1), its state made at the first step."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)


def make_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 12), torch.nn.Tanh(),
                               torch.nn.Linear(12, 2))


def batches(n):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)) for _ in range(n)]


def config(stage, **extra):
    c = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000, "gradient_clipping": 0.5,
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 100}}
    c.update(extra)
    return c


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def test_a_script_optimizer_with_a_client_scheduler_matches_plain_pytorch():
    """Lion (the script's own class) and a LambdaLR built on the optimizer initialize returns: the
    schedule's learning rate drives the engine, clipping included, as in the plain PyTorch loop."""
    model, ref = make_model(), make_model()
    schedule = lambda step: 1.0 / (1 + step)  # noqa: E731
    engine, optimizer, _, scheduler = tessera.initialize(
        model=model, optimizer=Lion(model.parameters(), lr=1e-2, weight_decay=0.1),
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule),
        config=config(1, zero_allow_untested_optimizer=True))
    assert "Lion" in repr(optimizer) and engine.config["optimizer"]["type"].endswith("Lion")
    ref_opt = Lion(ref.parameters(), lr=1e-2, weight_decay=0.1)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, schedule)
    for step, (x, y) in enumerate(batches(5)):
        loss = loss_of(engine, x, y)
        engine.backward(loss)
        engine.step()
        ref_opt.zero_grad()
        ref_loss = loss_of(ref, x, y)
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
        ref_sched.step()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6), step
        assert engine.get_lr()[0] == pytest.approx(1e-2 * schedule(step + 1)), step
        for a, b in zip(model.parameters(), ref.parameters()):
            assert (a - b).abs().max().item() < 1e-6, step
    # the state lives in the engine's shard-long buffers; the memory report counts it
    assert engine.memory_report()["optimizer_states"] == 4 * sum(p.numel() for p in model.parameters())


def test_under_zero_it_needs_zero_allow_untested_optimizer():
    model = make_model()
    with pytest.raises(tessera.ConfigError) as e:
        tessera.initialize(model=model, optimizer=torch.optim.Adagrad(model.parameters()), config=config(2))
    assert "zero_allow_untested_optimizer" in str(e.value) and "torch.optim.Adagrad" in str(e.value)
    # stage 0 runs it without the key, as DeepSpeed does
    engine, _, _, _ = tessera.initialize(model=model, optimizer=torch.optim.Adagrad(model.parameters()), config=config(0))
    x, y = batches(1)[0]
    engine.backward(loss_of(engine, x, y))
    engine.step()


def test_nvme_offload_and_other_bad_input_are_refused(tmp_path):
    model = make_model()
    nvme = config(2, zero_allow_untested_optimizer=True)
    nvme["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": str(tmp_path)}
    with pytest.raises(tessera.ConfigError, match="zero_optimization.offload_optimizer.device"):
        tessera.initialize(model=model, optimizer=torch.optim.Adagrad(model.parameters()), config=nvme)
    stepped = torch.optim.RMSprop(model.parameters())
    loss_of(model, *batches(1)[0]).backward()
    stepped.step()
    with pytest.raises(ValueError, match="has stepped already"):
        tessera.initialize(model=model, optimizer=stepped, config=config(0))
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        tessera.initialize(model=model, optimizer=object(), config=config(0))
    with pytest.raises(ValueError, match="optimizer section too"):
        tessera.initialize(model=model, optimizer=torch.optim.Adagrad(model.parameters()),
                           config=config(0, optimizer={"type": "Adam", "params": {"lr": 1e-3}}))


def test_a_failed_load_leaves_the_optimizer_as_it_was(tmp_path):
    """The load makes the optimizer's state to read into (it appears at the first step); when the
    load then fails, that state goes, and training continues as a fresh engine's would."""
    def engine_of():
        model = make_model()
        opt = torch.optim.RMSprop(model.parameters(), lr=1e-2, momentum=0.9)
        return tessera.initialize(model=model, optimizer=opt, config=config(1, zero_allow_untested_optimizer=True))[0]

    def train(engine, data):
        out = []
        for x, y in data:
            loss = loss_of(engine, x, y)
            engine.backward(loss)
            engine.step()
            out.append(loss.item())
        return out

    saver = engine_of()
    train(saver, batches(2))
    saver.save_checkpoint(str(tmp_path), tag="good")
    path = saver.save_checkpoint(str(tmp_path), tag="bad")
    data_file = next(f for f in sorted(os.listdir(path)) if f.endswith(".safetensors"))
    with open(os.path.join(path, data_file), "r+b") as f:  # damage the tensors' bytes, not the header
        f.seek(-16, os.SEEK_END)
        f.write(b"\xff" * 16)
    damaged, fresh = engine_of(), engine_of()
    with pytest.raises(RuntimeError, match=data_file):
        damaged.load_checkpoint(str(tmp_path), tag="bad")
    assert damaged.memory_report()["optimizer_states"] == 0
    assert train(damaged, batches(3)) == train(fresh, batches(3))
    loaded = engine_of()
    loaded.load_checkpoint(str(tmp_path), tag="good")  # the same state made, and read into
    assert loaded.memory_report()["optimizer_states"] == saver.memory_report()["optimizer_states"] > 0
    with pytest.raises(RuntimeError, match=data_file):  # a failed load after a good one keeps what that loaded
        loaded.load_checkpoint(str(tmp_path), tag="bad")
    assert loaded.memory_report()["optimizer_states"] == saver.memory_report()["optimizer_states"]
    assert train(loaded, batches(3)[2:]) == train(saver, batches(3)[2:])


def test_a_config_one_cycle_cycles_betas_and_leaves_sgd_momentum_alone():
    """DeepSpeed's OneCycle with cycle_momentum sets an optimizer's betas; RMSprop's momentum 0 stays 0."""
    one_cycle = {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2, "cycle_first_step_size": 2,
                                                "cycle_momentum": True, "cycle_min_mom": 0.8, "cycle_max_mom": 0.9}}
    model = make_model()
    rmsprop = torch.optim.RMSprop(model.parameters())
    engine, _, _, _ = tessera.initialize(model=model, optimizer=rmsprop, config=config(0, scheduler=one_cycle))
    lion_model = make_model()
    lion_engine, lion_opt, _, _ = tessera.initialize(model=lion_model, optimizer=Lion(lion_model.parameters()),
                                                     config=config(0, scheduler=one_cycle))
    for x, y in batches(3):
        for e in (engine, lion_engine):
            e.backward(loss_of(e, x, y))
            e.step()
    assert rmsprop.param_groups[0]["momentum"] == 0 and rmsprop.state
    assert not any("momentum_buffer" in state for state in rmsprop.state.values())
    assert 0.8 <= lion_opt.param_groups[0]["betas"][0] < 0.9  # cycled down from 0.9 over the first 2 steps
