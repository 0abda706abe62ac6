"""Training scripts written the way DeepSpeed's tutorials write them, run through tessera (the import
is the only change), and the same loops in plain PyTorch on one process over the global batch
(tests/python/api/test_deepspeed_style.py compares them).

  deepspeed_style_worker.py SCRIPT OUT.json [--reference] [--dp N] [--resume DIR]

SCRIPT:
  cnn_data       a small CNN; training_data= gives the DataLoader (DistributedSampler over the
                 data-parallel ranks), the optimizer and a WarmupLR schedule come from the config
  gpt_client     a tiny GPT; a client torch.optim.AdamW with two param groups (no decay on biases
                 and norms) and a Hugging Face-style cosine schedule with warm-up (a LambdaLR built
                 on the client optimizer); clipping 1.0
  sgd_gas        an MLP; a client SGD with momentum, gradient accumulation 2, a StepLR passed as a
                 callable that builds it from tessera's optimizer
  adam_l2        an MLP; a client torch.optim.Adam with weight decay (L2, not AdamW's), no scheduler
  sgd_gas_torch  sgd_gas with PyTorch's loss.backward() before engine.step()
  dist_args      an MLP, written like DeepSpeed's CIFAR tutorial: argparse with --local_rank (from
                 `tessera launch --pass-local-rank`) and add_config_arguments (the config is
                 args.deepspeed_config), init_distributed() first, its own DataLoader with
                 DistributedSampler(dataset) and no arguments, torch.distributed.all_reduce of the
                 loss for logging and a barrier at the end

Each rank writes {"losses": [...], "lrs": [...], "params": {name: flat list}} (rank 0 to OUT, the
others to OUT.rankR): its every step's loss and the learning rate the step used; the reference
writes "rank_losses", what each rank's micro-batches give. --reference runs the plain PyTorch loop on one process with the global batch (--dp N ranks'
worth of micro-batches per step).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

STEPS = 6
MICRO = 4
SEED = 7


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 10)

    def forward(self, x, y):
        h = F.max_pool2d(torch.relu(self.conv(x)), 2)
        return F.cross_entropy(self.fc(h.flatten(1)), y)


class TinyGpt(torch.nn.Module):
    def __init__(self, vocab=32, dim=16, seq=8):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, dim)
        self.wpe = torch.nn.Embedding(seq, dim)
        self.ln = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
        self.ln_f = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        h = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        h = h + self.mlp(self.ln(h))
        logits = self.head(self.ln_f(h))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    def forward(self, x, y):
        return F.mse_loss(self.net(x), y)


def dataset(script):
    g = torch.Generator().manual_seed(123)
    n = 128  # enough batches for every step at 2 ranks and accumulation 2
    if script == "cnn_data":
        return torch.utils.data.TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
    if script == "gpt_client":
        idx = torch.randint(0, 32, (n, 9), generator=g)
        return torch.utils.data.TensorDataset(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())
    return torch.utils.data.TensorDataset(torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g))


def cosine_with_warmup(optimizer, warmup, total):
    """Hugging Face's get_cosine_schedule_with_warmup, written out (transformers is not installed)."""
    def factor(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def no_decay_groups(model, weight_decay):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def setup(script):
    """(model, config, client optimizer or None, lr scheduler or callable or None, gradient accumulation)."""
    torch.manual_seed(SEED)
    base = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 1000}
    if script == "cnn_data":
        model = Cnn()
        config = dict(base, gradient_accumulation_steps=1,
                      optimizer={"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
                      scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                                "warmup_num_steps": 3, "warmup_type": "linear"}})
        return model, config, None, None, 1
    if script == "gpt_client":
        model = TinyGpt()
        optimizer = torch.optim.AdamW(no_decay_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95), eps=1e-6)
        scheduler = cosine_with_warmup(optimizer, 2, STEPS)
        config = dict(base, gradient_accumulation_steps=1, gradient_clipping=1.0)
        return model, config, optimizer, scheduler, 1
    if script == "dist_args":  # the config comes from args.deepspeed_config (the test writes this one there)
        config = dict(base, gradient_accumulation_steps=1,
                      optimizer={"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.05}},
                      scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.02,
                                                                "warmup_num_steps": 2, "warmup_type": "linear"}})
        return Mlp(), config, None, None, 1
    if script == "adam_l2":  # torch's Adam: weight decay added to the gradient (L2), not decoupled
        model = Mlp()
        return model, dict(base, gradient_accumulation_steps=1), torch.optim.Adam(
            model.parameters(), lr=0.01, weight_decay=0.1), None, 1
    model = Mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    config = dict(base, gradient_accumulation_steps=2)
    return model, config, optimizer, (lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)), 2


def build(script):
    import tessera as deepspeed  # the one line a DeepSpeed script changes

    model, config, optimizer, scheduler, gas = setup(script)
    data = dataset(script)
    kwargs = {"training_data": data}
    if optimizer is not None:
        kwargs.update(optimizer=optimizer, lr_scheduler=scheduler)
    else:
        kwargs["model_parameters"] = model.parameters()
    engine, optimizer, loader, scheduler = deepspeed.initialize(model=model, config=config, **kwargs)
    assert loader is engine.training_dataloader and len(loader) == len(data) // (MICRO * engine.dp_world_size)
    assert isinstance(optimizer, torch.optim.Optimizer)
    return engine, optimizer, loader, gas


def run_tessera(script, out, resume_dir=None):
    """With resume_dir: half the steps, save_checkpoint, then a new model, optimizer, scheduler and
    engine that load_checkpoint and train the other half (the scheduler's state comes back)."""
    engine, optimizer, loader, gas = build(script)
    losses, lrs = [], []
    batches = iter(loader)
    for step in range(STEPS):
        if resume_dir and step == STEPS // 2:
            engine.save_checkpoint(resume_dir, client_state={"step": step})
            engine, optimizer, loader, gas = build(script)
            _, client_state = engine.load_checkpoint(resume_dir)
            assert client_state == {"step": step}, client_state
        lrs.append(optimizer.param_groups[0]["lr"])
        step_loss = 0.0
        for _ in range(gas):
            x, y = next(batches)
            loss = engine(x, y)
            if script.endswith("_torch"):
                loss.backward()
            else:
                engine.backward(loss)
            engine.step()
            step_loss += loss.item() / gas
        losses.append(step_loss)
        assert engine.was_step_applied()
    write_result(engine, out, {"losses": losses, "lrs": lrs, "dp": engine.dp_world_size})


def write_result(engine, out, result):
    with engine.gathered_parameters():
        result["params"] = {n: p.detach().double().reshape(-1).tolist() for n, p in engine.module.named_parameters()}
    result["get_lr"] = engine.get_lr()
    result["stage"] = engine.zero_optimization_stage()
    if engine.global_rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    else:
        with open(out + ".rank%d" % engine.global_rank, "w") as f:
            json.dump(result, f)


def run_dist_args(out, argv):
    import tessera as deepspeed
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description="an MLP, DeepSpeed-tutorial style")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)),
                        help="local rank passed from distributed launcher (torchrun: the environment)")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args(argv)
    assert args.deepspeed and args.deepspeed_config

    deepspeed.init_distributed()
    assert args.local_rank == int(os.environ["LOCAL_RANK"]), (args.local_rank, os.environ["LOCAL_RANK"])
    torch.manual_seed(SEED)
    model = Mlp()
    data = dataset("dist_args")
    sampler = torch.utils.data.distributed.DistributedSampler(data)  # torch.distributed's default group
    loader = iter(torch.utils.data.DataLoader(data, batch_size=MICRO, sampler=sampler))
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    assert engine.local_rank == args.local_rank and engine.global_rank == dist.get_rank()
    losses, lrs, mean_losses = [], [], []
    for _ in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        x, y = next(loader)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        metric = loss.detach().clone()
        dist.all_reduce(metric)  # a script's own logging: the mean loss over the ranks
        mean_losses.append(metric.item() / dist.get_world_size())
    dist.barrier()
    write_result(engine, out, {"losses": losses, "lrs": lrs, "mean_losses": mean_losses, "dp": engine.dp_world_size})


def run_reference(script, out, dp):
    model, config, optimizer, scheduler, gas = setup(script)
    if optimizer is None:  # the config's AdamW and DeepSpeed's linear WarmupLR: step s (from 0) runs at
        # max_lr * (s - 1) / warmup_num_steps, at least min_lr (0): the constructor's lr, then iteration 0's
        p = config["optimizer"]["params"]
        optimizer = torch.optim.AdamW(model.parameters(), lr=p["lr"], weight_decay=p["weight_decay"])
        w = config["scheduler"]["params"]["warmup_num_steps"]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, max(0, s - 1) / w))
    elif scheduler is None:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    elif callable(scheduler) and not hasattr(scheduler, "step"):
        scheduler = scheduler(optimizer)
    data = dataset(script)
    # The same global order as the ranks' DistributedSamplers: one replica, the same seed and epoch.
    sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True)
    loader = iter(torch.utils.data.DataLoader(data, batch_size=MICRO * dp, sampler=sampler))
    clip = config.get("gradient_clipping", 0.0)
    rank_losses, lrs = [[] for _ in range(dp)], []
    for step in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        step_losses = [0.0] * dp
        for _ in range(gas):
            x, y = next(loader)
            # rank r's micro-batch is rows r, r + dp, ...; the gradient is the mean of the ranks' means
            per_rank = [model(x[r::dp], y[r::dp]) for r in range(dp)]
            (sum(per_rank) / (dp * gas)).backward()
            for r in range(dp):
                step_losses[r] += per_rank[r].item() / gas
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        for r in range(dp):
            rank_losses[r].append(step_losses[r])
    with open(out, "w") as f:
        json.dump({"rank_losses": rank_losses, "lrs": lrs,
                   "params": {n: p.detach().double().reshape(-1).tolist() for n, p in model.named_parameters()}}, f)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("script", choices=["cnn_data", "gpt_client", "sgd_gas", "adam_l2", "sgd_gas_torch", "dist_args"])
    ap.add_argument("out")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--resume", help="a directory: save half-way, load into a new engine, go on")
    a, rest = ap.parse_known_args()
    if a.reference:
        run_reference(a.script.replace("_torch", ""), a.out, a.dp)
    elif a.script == "dist_args":
        run_dist_args(a.out, rest)
    else:
        assert not rest, rest
        run_tessera(a.script, a.out, a.resume)
    sys.stdout.flush()
