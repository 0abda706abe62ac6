"""The Python API in one process: errors (config errors name their JSON path, wrong types give
TypeError), zero-copy parameters, the engine's state, and the JSONL metrics."""
import json
import os

import pytest
import torch
import torch.nn as nn

import tessera


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def config(**overrides):
    c = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 2}}
    c.update(overrides)
    return c


def train(engine, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
        loss = nn.functional.mse_loss(engine(x.to(engine.compute_dtype)).float(), y)  # as in DeepSpeed: inputs follow the compute dtype
        engine.backward(loss)
        engine.step()
    return loss


# --- config errors -----------------------------------------------------------------------------

def test_config_error_is_a_value_error_naming_every_json_path():
    bad = config(zero_optimization={"stage": 7, "overlap_com": True}, train_batch_sise=8)
    bad["optimizer"]["params"]["lr"] = "fast"
    with pytest.raises(tessera.ConfigError) as info:
        tessera.initialize(model=mlp(), config=bad)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "zero_optimization.stage: found 7, expected a value in [0, 3]" in message
    assert 'zero_optimization.overlap_com: unknown key; did you mean "overlap_comm"?' in message
    assert 'train_batch_sise: unknown key; did you mean "train_batch_size"?' in message
    assert "optimizer.params.lr" in message


def test_config_file_errors_name_the_file_and_path(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": "yes"}}')
    with pytest.raises(tessera.ConfigError, match=r"fp16\.enabled"):
        tessera.initialize(model=mlp(), config=str(path))
    with pytest.raises(tessera.ConfigError, match="missing.json"):
        tessera.initialize(model=mlp(), config=tmp_path / "missing.json")  # os.PathLike


def test_config_file_and_json_text_are_accepted(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config()))
    for c in (str(path), path, json.dumps(config())):
        engine, _, _, _ = tessera.initialize(model=mlp(), config=c)
        assert engine.train_micro_batch_size_per_gpu() == 4


def test_engine_refusals_are_value_errors():
    with pytest.raises(tessera.ConfigError, match="aio.use_gds: not implemented yet"):
        tessera.initialize(model=mlp(), config=config(aio={"use_gds": True}))
    m = mlp()
    with pytest.raises(ValueError, match="leaf tensor"):
        tessera.initialize(model=m, config=config(), model_parameters=[m[0].weight * 2])
    with pytest.raises(ValueError, match="appears twice"):
        tessera.initialize(model=m, config=config(), model_parameters=[m[0].weight, m[0].weight])
    with pytest.raises(ValueError, match="'betas'"):
        tessera.initialize(model=m, config=config(), model_parameters=[{"params": [m[0].weight], "betas": (0.9, 0.9)}])
    with pytest.raises(ValueError, match="optimizer section too; give one of them"):
        tessera.initialize(model=m, config=config(), optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    no_optimizer = {k: v for k, v in config().items() if k != "optimizer"}
    with pytest.raises(tessera.ConfigError, match="zero_allow_untested_optimizer"):  # ZeRO-2: DeepSpeed's consent key
        tessera.initialize(model=m, config=no_optimizer, optimizer=torch.optim.RMSprop(m.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="amsgrad=True in param group 0"):
        tessera.initialize(model=m, config=no_optimizer, optimizer=torch.optim.Adam(m.parameters(), amsgrad=True))
    with pytest.raises(ValueError, match="differ in betas"):
        tessera.initialize(model=m, config=no_optimizer, optimizer=torch.optim.Adam(
            [{"params": [m[0].weight]}, {"params": [m[2].weight], "betas": (0.8, 0.9)}]))
    with pytest.raises(ValueError, match="mpu= is not supported"):
        tessera.initialize(model=m, config=config(), mpu=object())


# --- wrong types -------------------------------------------------------------------------------

def test_wrong_types_raise_type_error():
    m = mlp()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        tessera.initialize(model="gpt", config=config())
    with pytest.raises(TypeError, match="config must be a path"):
        tessera.initialize(model=m, config=42)
    with pytest.raises(TypeError, match="missing config"):
        tessera.initialize(model=m)
    with pytest.raises(TypeError, match="not JSON-serializable"):
        tessera.initialize(model=m, config=config(steps_per_print=object()))
    with pytest.raises(TypeError, match="model_parameters must be"):
        tessera.initialize(model=m, config=config(), model_parameters=m[0].weight)
    with pytest.raises(TypeError, match=r"model_parameters\[1\] must be a torch.Tensor, got int"):
        tessera.initialize(model=m, config=config(), model_parameters=[m[0].weight, 3])
    with pytest.raises(TypeError, match=r"\['lr'\] must be a number, got str"):
        tessera.initialize(model=m, config=config(), model_parameters=[{"params": m.parameters(), "lr": "fast"}])
    with pytest.raises(TypeError, match="mixes tensors and param-group dicts"):
        tessera.initialize(model=m, config=config(), model_parameters=[m[0].weight, {"params": [m[2].weight]}])

    engine, _, _, _ = tessera.initialize(model=mlp(), config=config())
    with pytest.raises(TypeError, match="loss must be a torch.Tensor, got float"):
        engine.backward(1.0)
    with pytest.raises(ValueError, match="one element"):
        engine.backward(engine(torch.randn(4, 8)))
    with pytest.raises(RuntimeError, match="does not require grad"):
        with torch.no_grad():
            engine.backward(engine(torch.randn(4, 8)).sum())
    with pytest.raises(TypeError, match="must be ints"):
        engine.record_batch("4")
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        tessera.comm.all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="unknown op"):
        tessera.comm.all_reduce(torch.ones(2), op="prod")
    with pytest.raises(TypeError):  # the extension itself: pybind11's TypeError, not a crash
        tessera._C.load_config(5, 1)
    assert engine.global_steps == 0  # nothing above reached the engine


# --- zero copy, state ----------------------------------------------------------------------------

def test_parameters_become_views_into_one_flat_buffer_and_train_in_place():
    m = mlp()
    params = list(m.parameters())
    before = [p.detach().clone() for p in params]
    engine, _, _, _ = tessera.initialize(model=m, config=config(zero_optimization={"stage": 0}))
    after_init = list(m.parameters())
    assert all(a is b for a, b in zip(params, after_init))  # the same nn.Parameter objects
    storages = {p.untyped_storage().data_ptr() for p in params}
    assert len(storages) == 1  # one group: one flat buffer holds every parameter
    assert all(torch.equal(p, b) for p, b in zip(params, before))  # values kept
    assert all(p.grad is None for p in params)
    train(engine, 3)
    assert not any(torch.equal(p, b) for p, b in zip(params, before))  # the module's own tensors moved
    assert all(p.grad is None for p in params)  # gradients live in the engine's fp32 buffers
    assert engine.module is m


def test_the_module_trains_with_plain_pytorch_once_its_engine_is_gone():
    import gc

    m = mlp()
    first, _, _, _ = tessera.initialize(model=m, config=config())
    train(first, 2)
    second, _, _, _ = tessera.initialize(model=m, config=config())  # a newer engine takes the parameters over
    del first
    gc.collect()
    before = [p.detach().clone() for p in m.parameters()]
    train(second, 1)  # the first engine's end left the second's hooks in place
    assert all(p.grad is None for p in m.parameters())
    assert not any(torch.equal(p, b) for p, b in zip(m.parameters(), before))
    del second
    gc.collect()
    m(torch.randn(4, 8)).sum().backward()  # no engine left: autograd fills .grad as usual
    assert all(p.grad is not None for p in m.parameters())


def test_bf16_turns_the_module_parameters_bf16():
    m = mlp()
    engine, _, _, _ = tessera.initialize(model=m, config=config(bf16={"enabled": True}))
    assert engine.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    loss = train(engine, 2)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_engine_state_follows_deepspeed():
    m = mlp()
    c = config(gradient_accumulation_steps=2, fp16={"enabled": True, "initial_scale_power": 8},
               scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                                         "warmup_num_steps": 10, "warmup_type": "linear"}})
    groups = [{"params": [m[0].weight, m[2].weight]}, {"params": [m[0].bias, m[2].bias], "lr": 5e-3, "name": "b"}]
    engine, _, _, _ = tessera.initialize(model=m, config=c, model_parameters=groups)
    assert engine.gradient_accumulation_steps() == 2 and engine.train_batch_size() == 8
    assert engine.world_size == 1 and engine.dp_world_size == 1 and engine.global_rank == 0
    assert engine.loss_scale == 256.0
    assert not engine.is_gradient_accumulation_boundary()
    train(engine, 1)
    assert engine.is_gradient_accumulation_boundary() and engine.global_steps == 0
    train(engine, 1)
    assert engine.global_steps == 1 and engine.micro_steps == 2
    train(engine, 2)  # WarmupLR starts at warmup_min_lr (0): DeepSpeed's schedule, step for step
    lr = engine.get_lr()
    assert len(lr) == 2 and lr[0] > 0 and lr[1] == pytest.approx(lr[0] / 2)
    assert engine.get_global_grad_norm() > 0
    assert engine.eval() is engine and not m.training
    engine.train()
    assert m.training
    m.vocabulary = "bytes"
    assert engine.vocabulary == "bytes" and engine.training  # attributes the engine lacks are the module's
    assert engine.modules is not None and len(list(engine.parameters())) == 4
    assert engine.memory_report()["total"] > 0
    times = engine.wall_clock_breakdown()
    assert times["optimizer_steps"] == engine.global_steps
    assert set(times) == {"forward_s", "backward_s", "reduce_wait_s", "optimizer_s", "allgather_wait_s", "optimizer_steps"}
    assert all(v >= 0 for v in times.values()) and times["backward_s"] > 0 and times["optimizer_s"] > 0


def test_comm_in_one_process():
    tessera.comm.init_distributed(backend="gloo")  # CPU tensors below (a GPU machine's "auto" is NCCL)
    assert tessera.comm.is_initialized()
    assert tessera.comm.get_rank() == 0 and tessera.comm.get_world_size() == 1
    assert tessera.comm.get_local_rank() == 0
    t = torch.tensor([3.0, 4.0])
    assert tessera.comm.all_reduce(t) is t and t.tolist() == [3.0, 4.0]
    tessera.comm.barrier()
    assert "rank 0 of 1" in tessera.comm.describe()


# --- metrics ---------------------------------------------------------------------------------------

def test_csv_monitor_writes_one_jsonl_record_per_step(tmp_path):
    c = config(gradient_accumulation_steps=2,
               csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "run1"})
    engine, _, _, _ = tessera.initialize(model=mlp(), config=c)
    train(engine, 10)
    engine.close()
    path = tmp_path / "run1" / "metrics.jsonl"
    assert engine.monitor.path == str(path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    for r in records:
        assert {"loss", "lr", "loss_scale", "grad_norm", "samples_per_s", "step_ms", "time_s"} <= set(r)
        assert r["samples_per_s"] > 0 and r["lr"] == pytest.approx(1e-2)
    assert records[-1]["loss"] == pytest.approx(engine.last_step_loss)


def test_no_metrics_file_without_csv_monitor(tmp_path):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        engine, _, _, _ = tessera.initialize(model=mlp(), config=config())
        train(engine, 2)
    finally:
        os.chdir(cwd)
    assert not engine.monitor.enabled and engine.monitor.path is None and os.listdir(tmp_path) == []


def test_estimate_from_python_matches_the_engine_accounting():
    # fp32 Adam, ZeRO 2, 1B parameters on 8 GPUs: model states 4Ψ + 12Ψ/N bytes per GPU.
    result = tessera.estimate(params=1_000_000_000, zero=2, gpus_per_node=8, gpu_mem=80)
    psi, n = 1_000_000_000, 8
    assert abs(result["per_gpu"]["model_states_bytes"] - (4 * psi + 12 * psi / n)) / (4 * psi + 12 * psi / n) < 0.01
    assert isinstance(result["fits"], bool)
    assert "total_bytes" in result["per_node_cpu"] and "total_bytes" in result["per_node_nvme"]
    with pytest.raises(ValueError, match="zero"):
        tessera.estimate(params=1000, zero=7)


def test_plan_from_python_is_the_cli_answer():
    import subprocess

    from conftest import CLI

    request = dict(preset="gpt2-medium", gpus_per_node=8, gpu_mem=6, bf16=True, global_batch=32)
    answer = tessera.plan(top=2, **request)
    cli = json.loads(subprocess.run([CLI, "plan", "--preset", "gpt2-medium", "--gpus-per-node", "8", "--gpu-mem", "6",
                                     "--bf16", "--global-batch", "32", "--top", "2", "--json"],
                                    check=True, capture_output=True, text=True).stdout)
    assert [r["layout"] for r in answer["ranked"]] == [r["layout"] for r in cli["ranked"]]
    assert answer["best"] == cli["best"] == answer["ranked"][0]["config"]
    assert "config" in answer["ranked"][1] and "config" not in answer["ranked"][2]  # top=2
    assert answer["rejected_by_kind"]["memory"] > 0
    with pytest.raises(ValueError, match="global_batch"):
        tessera.plan(preset="gpt2-medium")
    with pytest.raises(ValueError, match='unknown plan option "global_bach"; did you mean "global_batch"'):
        tessera.plan(preset="gpt2-medium", global_bach=8)


def test_auto_layout_from_python_is_tessera_config_checks(tmp_path):
    import subprocess

    from conftest import CLI

    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": "auto"},
              "tensor_parallel": {"tp_size": "auto"}, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}
    plan = {"preset": "tessera-gpt", "device": "cpu", "cpu_mem": 16}
    resolved = json.loads(tessera.resolve_auto_layout(config, 2, plan))
    path = tmp_path / "auto.json"
    path.write_text(json.dumps(config))
    check = subprocess.run([CLI, "config", "check", str(path), "--world-size", "2", "--plan", json.dumps(plan)],
                           check=True, capture_output=True, text=True)
    effective = json.loads(check.stdout)
    assert "tessera: auto layout for 2 ranks" in check.stderr
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        assert resolved[key] == effective[key]
    assert resolved["zero_optimization"]["stage"] == effective["zero_optimization"]["stage"]
    assert resolved.get("tensor_parallel", {}).get("tp_size", 1) == effective["tessera_layout"]["tensor_parallel_size"]
    assert json.loads(tessera.resolve_auto_layout(resolved, 2, plan)) == resolved  # nothing left to choose
    with pytest.raises(ValueError, match="train_batch_size"):
        tessera.resolve_auto_layout({"zero_optimization": {"stage": "auto"}}, 2, plan)


# --- units --------------------------------------------------------------------------------------

class TiedLm(nn.Module):
    """Embedding, two blocks in a ModuleList, and a head whose weight IS the embedding's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def lm_loss(engine, g):
    idx = torch.randint(0, 10, (4, 5), generator=g)
    return nn.functional.cross_entropy(engine(idx).reshape(-1, 10), idx.reshape(-1))


def test_module_units_report_forward_then_backward_in_reverse():
    engine, _, _, _ = tessera.initialize(model=TiedLm(), config=config(gradient_accumulation_steps=2))
    units = engine.units()
    assert [u["name"] for u in units] == ["emb", "blocks.0", "blocks.1", "head"]
    assert units[3]["params"] == ["emb.weight"] and units[3]["shared"] == ["emb.weight"]  # tied, owned by emb
    assert units[3]["numel"] == 0 and units[0]["numel"] == 80
    g = torch.Generator().manual_seed(0)
    engine.record_unit_events()
    for _ in range(2):
        engine.backward(lm_loss(engine, g))
        engine.step()
    events = engine.unit_events()
    one = []
    for u in range(4):
        one += [(u, "forward_begin"), (u, "forward_end")]
    for u in (3, 2, 1, 0):
        one += [(u, "backward_begin"), (u, "backward_end")]
    assert events == one * 2
    assert all(u["forwards"] == 2 and u["backwards"] == 2 for u in engine.units())
    assert engine.unit_events() == []  # read and cleared


def test_units_can_be_named_and_a_wrong_name_is_refused():
    engine, _, _, _ = tessera.initialize(model=TiedLm(), config=config(), units=["emb", "blocks"])
    assert [u["name"] for u in engine.units()] == ["emb", "blocks"]  # the head owns nothing more: no <root>
    with pytest.raises(ValueError, match=r"units: 'block' is not a module of the model \(did you mean 'blocks'\?\)"):
        tessera.initialize(model=TiedLm(), config=config(), units=["block"])
    m = mlp()
    engine, _, _, _ = tessera.initialize(model=m, config=config(), units=["0"])
    assert [u["name"] for u in engine.units()] == ["0", "<root>"]  # the rest of the parameters


def test_backward_with_output_gradients_equals_backward_of_the_loss():
    """backward(outputs, output_grads) runs autograd from the outputs with the given gradients: the
    same update as backward(loss) when the gradients are dloss/doutputs, already scaled."""
    def run(split):
        m = mlp()
        engine, _, _, _ = tessera.initialize(model=m, config=config(optimizer={"type": "SGD", "params": {"lr": 0.1}}))
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
        out = engine(x)
        if split:
            grad = 2 * (out.detach() - y) / out.numel()  # d mse / d out
            engine.backward(out, grad)
        else:
            engine.backward(nn.functional.mse_loss(out, y))
        engine.step()
        return [p.detach().clone() for p in m.parameters()]

    for a, b in zip(run(True), run(False)):
        assert torch.allclose(a, b, atol=1e-6)


def test_overlap_comm_leaves_the_allgather_to_the_next_forward_on_two_ranks():
    """ZeRO 2, 2 ranks, overlap_comm: step() returns with the allgather in flight (the module's
    units report their forward), the next forward waits for it unit by unit, so the losses equal
    a run without overlap_comm; state_dict() waits, and then every rank holds the same values."""
    from conftest import WORKERS, check, launch

    r = check(launch(2, [os.path.join(WORKERS, "overlap_worker.py")]))
    out = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("{")))
    assert out["losses_overlap"] == out["losses_plain"]
    assert out["in_flight_overlap"] == [True] * 4 and out["in_flight_plain"] == [False] * 4
    assert out["after_state_dict"] is False
    assert out["ranks_agree"]
    # The breakdown's parts are disjoint: together they fit in the time since the engine was built.
    for times, elapsed in out["breakdowns"]:
        assert times["optimizer_steps"] == 4 and all(v >= 0 for v in times.values())
        parts = sum(v for k, v in times.items() if k.endswith("_s"))
        assert parts <= elapsed


def test_add_config_arguments_gives_initialize_its_config(tmp_path):
    import argparse

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config()))
    parser = tessera.add_config_arguments(argparse.ArgumentParser())
    for flag in ("--deepspeed_config", "--tessera_config"):
        args = parser.parse_args(["--deepspeed", flag, str(path)])
        assert args.deepspeed and args.deepspeed_config == str(path)
        engine, optimizer, loader, scheduler = tessera.initialize(args=args, model=mlp())
        assert engine.train_micro_batch_size_per_gpu() == 4 and loader is None and scheduler is None
        assert isinstance(optimizer, torch.optim.Optimizer) and optimizer.param_groups[0]["lr"] == engine.get_lr()[0]


def test_deepspeed_engine_names_tessera_lacks_say_so():
    engine, _, _, _ = tessera.initialize(model=mlp(), config=config())
    with pytest.raises(AttributeError, match="DeepSpeed's engine has it, tessera does not implement it"):
        engine.get_mom()
    with pytest.raises(AttributeError, match="no_such_name"):
        engine.no_such_name
    assert (engine.fp16_enabled(), engine.bfloat16_enabled(), engine.zero_optimization_stage()) == (False, False, 2)


def test_loss_backward_needs_no_engine_backward_but_not_mixed_and_not_under_fp16(capfd):
    """loss.backward() then engine.step() equals engine.backward(loss) (gradient accumulation 2, SGD:
    a wrong 1/gas would show in the parameters); one window cannot mix the two; fp16 refuses it."""
    results = []
    for torch_way in (False, True):
        engine, _, _, _ = tessera.initialize(model=mlp(), config=config(
            gradient_accumulation_steps=2, steps_per_print=2, optimizer={"type": "SGD", "params": {"lr": 0.1}}))
        g = torch.Generator().manual_seed(3)
        for _ in range(4):
            loss = nn.functional.mse_loss(engine(torch.randn(4, 8, generator=g)), torch.randn(4, 2, generator=g))
            loss.backward() if torch_way else engine.backward(loss)
            engine.step()
        results.append((torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()]),
                        engine.get_global_grad_norm()))
        assert engine.global_steps == 2
    assert torch.equal(results[0][0], results[1][0]) and results[0][1] == pytest.approx(results[1][1], rel=1e-12)
    assert "loss n/a" in capfd.readouterr().out  # the engine never saw the loss: the progress line says so

    engine, _, _, _ = tessera.initialize(model=mlp(), config=config(gradient_accumulation_steps=2))
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    engine.backward(nn.functional.mse_loss(engine(x), y))
    engine.step()
    with pytest.raises(RuntimeError, match="mixes engine.backward\\(loss\\) and loss.backward\\(\\)"):
        nn.functional.mse_loss(engine(x), y).backward()

    engine, _, _, _ = tessera.initialize(model=mlp(), config=config(fp16={"enabled": True}))
    with pytest.raises(RuntimeError, match="call engine.backward\\(loss\\) instead"):
        nn.functional.mse_loss(engine(x.half()).float(), y).backward()
    engine.backward(nn.functional.mse_loss(engine(x.half()).float(), y))  # the engine goes on
    engine.step()
    assert engine.global_steps == 1


def test_init_distributed_takes_deepspeeds_arguments_and_makes_torch_distributed_work():
    import datetime

    import torch.distributed as dist

    tessera.init_distributed(dist_backend="gloo", distributed_port=29500, verbose=False,
                             timeout=datetime.timedelta(minutes=5), rank=0, world_size=1)
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="init_method='tcp://h:1' is not supported"):
        tessera.init_distributed(init_method="tcp://h:1")
    with pytest.raises(ValueError, match="rank=3 but the environment"):
        tessera.init_distributed(rank=3)


def test_fp16_auto_cast_casts_the_forwards_floating_inputs():
    c = config(fp16={"enabled": True, "auto_cast": True}, zero_optimization={"stage": 1})
    engine, _, _, _ = tessera.initialize(model=mlp(), config=c)
    seen = []
    engine.module[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    x = torch.randn(4, 8)  # fp32, as the data loader gives it
    loss = nn.functional.mse_loss(engine(x).float(), torch.randn(4, 2))
    engine.backward(loss)
    engine.step()
    assert seen == [torch.float16] and x.dtype == torch.float32
    assert engine.config["fp16"]["auto_cast"] is True


# What DeepSpeed's engine and top-level module expose that training scripts use: each name tessera has
# works; each it lacks raises an AttributeError that says so.
DEEPSPEED_ENGINE_NAMES_TESSERA_HAS = [
    "forward", "backward", "step", "train", "eval", "module", "optimizer", "lr_scheduler", "training_dataloader",
    "local_rank", "global_rank", "world_size", "dp_world_size", "device", "global_steps", "micro_steps",
    "skipped_steps", "fp16_enabled", "bfloat16_enabled", "gradient_accumulation_steps",
    "train_micro_batch_size_per_gpu", "train_batch_size", "get_lr", "get_global_grad_norm", "was_step_applied",
    "zero_optimization_stage", "is_gradient_accumulation_boundary", "save_checkpoint", "load_checkpoint",
    "save_16bit_model", "zero_grad", "state_dict", "parameters", "named_parameters",
]


def test_every_deepspeed_name_is_there_or_says_tessera_lacks_it():
    from tessera.engine import _DEEPSPEED_ENGINE_NAMES

    engine, _, _, _ = tessera.initialize(model=mlp(), config=config())
    for name in DEEPSPEED_ENGINE_NAMES_TESSERA_HAS:
        assert getattr(engine, name) is not None or name in ("lr_scheduler", "training_dataloader"), name
    for name in sorted(_DEEPSPEED_ENGINE_NAMES):
        with pytest.raises(AttributeError, match="DeepSpeed's engine has it, tessera does not implement it"):
            getattr(engine, name)
    for name in ("initialize", "init_distributed", "add_config_arguments", "comm", "zero", "checkpointing", "pipe"):
        assert getattr(tessera, name) is not None, name
    for name in sorted(tessera._DEEPSPEED_MODULE_NAMES):
        with pytest.raises(AttributeError, match="DeepSpeed has deepspeed.%s, tessera does not implement it" % name):
            getattr(tessera, name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'$"):
        tessera.no_such_thing


def test_a_client_scheduler_that_cycles_momentum_is_refused_by_name():
    """OneCycleLR cycles AdamW's beta1 through the param groups; the engine reads only lr there, so
    the step says so instead of training with betas the scheduler did not ask for."""
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=10)  # cycle_momentum=True
    engine, _, _, _ = tessera.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                         config={"train_micro_batch_size_per_gpu": 4})
    train(engine, 1)  # the first step runs at the betas initialize saw; the scheduler then moves beta1
    with pytest.raises(ValueError, match="'betas' changed .* cycle_momentum=False"):
        train(engine, 1)
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=10, cycle_momentum=False)
    engine, optimizer, _, _ = tessera.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                 config={"train_micro_batch_size_per_gpu": 4})
    train(engine, 3)
    assert engine.get_lr()[0] == pytest.approx(scheduler.get_last_lr()[0]) and engine.global_steps == 3


def test_a_loss_backward_that_raises_drops_its_window_and_training_goes_on():
    """A loss.backward() that raises inside autograd never reaches its end: the next forward drops
    that window (as a failed engine.backward(loss) does) and training goes on from a fresh one."""
    engine, _, _, _ = tessera.initialize(model=mlp(), config=config(gradient_accumulation_steps=2,
                                                                    optimizer={"type": "SGD", "params": {"lr": 0.1}}))
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    out = engine(x)

    def fail(grad):
        raise RuntimeError("out of memory (simulated)")
    out.register_hook(fail)
    with pytest.raises(RuntimeError, match="simulated"):
        nn.functional.mse_loss(out, y).backward()
    for _ in range(2):  # one whole window
        nn.functional.mse_loss(engine(x), y).backward()
        engine.step()
    assert engine.global_steps == 1 and engine.micro_steps == 2
