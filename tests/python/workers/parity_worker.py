"""A small torch.nn model trained through tessera, and the same model trained with plain PyTorch.

Both sides see the same model (same seed), the same global batch per optimizer step and the same
hyper-parameters; the engine splits each global batch over data-parallel ranks and accumulation
steps exactly as the examples do (micro-step m, rank r: rows [(m*dp + r)*micro, ... + micro)).

  tessera_run(case)   trains through tessera (every rank calls it); returns, on every rank, the step
                      losses (mean over the step's micro-batches and the data-parallel ranks), the
                      engine's gradient norms and the flattened parameters after every step.
  reference_run(case) the plain PyTorch run in one process: for each step, every micro-batch's
                      loss / (gas * dp) backward (the average the engine's reductions compute),
                      clip_grad_norm_, torch.optim.AdamW (fused kernel where available, else
                      foreach).

As a program (under tessera launch or torchrun) it runs the cases of a JSON file and rank 0 saves
the results with torch.save:  parity_worker.py CASES.json OUT_FILE
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python"))
from models import Gpt  # noqa: E402
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown

IN, HIDDEN, OUT = 16, 32, 4
VOCAB, BLOCK = 64, 16  # case["model"] == "gpt": the example GPT (tied LM head), 2 layers of 32


class TinyNet(nn.Module):
    """Linear, LayerNorm, GELU, Linear, tanh, Linear: 1,796 parameters in 8 tensors."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, OUT)
        with torch.no_grad():  # LayerNorm's affine parameters away from 1/0, so decay matters for them too
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x, y):
        x = x.to(self.fc1.weight.dtype)
        h = torch.tanh(self.fc2(F.gelu(self.norm(self.fc1(x)))))
        return F.mse_loss(self.head(h).float(), y)


class TinyGpt(Gpt):
    """The example GPT, small: its LM head reads the embedding's weight in the root's forward,
    outside any unit (ZeRO-3 gathers it on access)."""

    def __init__(self, seed, n_head=2):
        super().__init__(vocab=VOCAB, block_size=BLOCK, n_layer=2, n_head=n_head, n_embd=32, seed=seed)


def make_model(case):
    return TinyGpt(case["seed"], case.get("heads", 2)) if case.get("model") == "gpt" else TinyNet(case["seed"])


def groups_of(model, case):
    """Two groups as torch.optim param groups: matrices decay (the config's weight_decay), vectors do
    not and use twice the base learning rate."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "name": "decay"},
            {"params": rest, "weight_decay": 0.0, "lr": 2 * case["lr"], "name": "no_decay"}]


def client_optimizer_of(case, groups):
    """case["client"]: a torch optimizer tessera does not implement, which it runs as given over its
    flat shards (tessera/client_optimizer.py), over the same two groups."""
    groups[0]["weight_decay"] = case["weight_decay"]
    if case["client"] == "Adagrad":  # makes its state at construction
        return torch.optim.Adagrad(groups, lr=case["lr"])
    return torch.optim.RMSprop(groups, lr=case["lr"], momentum=0.9)


def global_batch(case, step):
    n = case["micro"] * case["gas"] * case["dp"]
    g = torch.Generator().manual_seed(case["seed"] * 1000 + step)
    if case.get("model") == "gpt":
        tokens = torch.randint(0, VOCAB, (n, BLOCK + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    x = torch.randn(n, IN, generator=g)
    y = 3 * torch.randn(n, OUT, generator=g)  # large targets: gradient norms well above the clip
    return x, y


def config_of(case):
    return {
        "train_micro_batch_size_per_gpu": case["micro"],
        "gradient_accumulation_steps": case["gas"],
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": case["lr"], "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": case["weight_decay"]}},
        "gradient_clipping": case["clip"],
        # tp > 1: tessera.initialize applies its automatic plan (tessera.tensor_parallel.auto_plan)
        "tensor_parallel": {"tp_size": case.get("tp", 1), "sequence_parallel": case.get("sp", False)},
        "bf16": {"enabled": case.get("bf16", False)},
        # Small buckets: several per group, padded to the number of ranks.
        "zero_optimization": {"stage": case["stage"], "reduce_bucket_size": 300, "allgather_bucket_size": 300,
                              # ZeRO-3: every parameter partitioned, each unit released after use,
                              # prefetch of about one unit
                              "stage3_param_persistence_threshold": case.get("persist", 0),
                              "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 1500},
    }


def flat(model):
    return torch.cat([p.detach().double().reshape(-1).cpu() for p in model.parameters()])


def tessera_run(case):
    """case["device"]: "cpu" (default) or "cuda" (the model, batches and engine there)."""
    device = torch.device(case.get("device", "cpu"))
    model = make_model(case).to(device)
    config = config_of(case)
    if case.get("ckpt"):  # every block's activations recomputed in backward (tessera.checkpointing)
        tessera.checkpointing.reset()
        tessera.checkpointing.checkpoint_modules(model)
        config["activation_checkpointing"] = {"partition_activations": case.get("partition", False)}
    recomputed = tessera.checkpointing.stats()["recomputations"]
    groups, optimizer = groups_of(model, case), None
    if case.get("client"):
        del config["optimizer"]
        config["zero_allow_untested_optimizer"] = True
        groups, optimizer = None, client_optimizer_of(case, groups)
    engine, _, _, _ = tessera.initialize(model=model, config=config, model_parameters=groups, optimizer=optimizer)
    dp, me, micro = engine.dp_world_size, engine.dp_rank, case["micro"]
    assert dp == case["dp"], (dp, case)
    losses, norms, params = [], [], []
    for step in range(case["steps"]):
        x, y = global_batch(case, step)
        total = 0.0
        for m in range(case["gas"]):
            rows = slice((m * dp + me) * micro, (m * dp + me + 1) * micro)
            loss = engine(x[rows].to(device), y[rows].to(device))
            if case.get("torch_backward"):  # PyTorch's way: the step divides by gradient_accumulation_steps
                loss.backward()
            else:
                engine.backward(loss)
            engine.step()
            total += loss.item()
        t = torch.tensor([total / case["gas"]], dtype=torch.float64)
        losses.append(tessera.comm.all_reduce(t, "avg", "data").item())
        norms.append(engine.get_global_grad_norm())
        with engine.gathered_parameters():  # ZeRO-3: whole while read (no-op at stages 0-2)
            if case.get("tp", 1) > 1:  # the tensor-parallel slices gathered into the single-device shapes
                params.append(torch.cat([t.double().reshape(-1) for _, t in tessera.tensor_parallel.full_parameters(model)]))
            else:
                params.append(flat(model))
    assert engine.global_steps == case["steps"] and engine.micro_steps == case["steps"] * case["gas"]
    return {"losses": losses, "grad_norms": norms, "params": params, "lr": engine.get_lr(),
            "dtype": str(engine.compute_dtype),
            "sliced": [n for n, p in model.named_parameters() if hasattr(p, "_tessera_tensor_parallel")],
            "recomputations": tessera.checkpointing.stats()["recomputations"] - recomputed,
            "partitioned_inputs": tessera.checkpointing.stats()["partitioned_inputs"]}


def reference_run(case):
    device = torch.device(case.get("device", "cpu"))
    model = make_model(case).to(device)
    groups = groups_of(model, case)
    groups[0]["weight_decay"] = case["weight_decay"]
    for g in groups:
        del g["name"]
    kwargs = dict(lr=case["lr"], betas=(0.9, 0.95), eps=1e-8)
    if case.get("client"):
        opt = client_optimizer_of(case, groups)
    else:
        try:
            opt = torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, ValueError):
            opt = torch.optim.AdamW(groups, foreach=True, **kwargs)
    params = list(model.parameters())
    dp, micro, gas = case["dp"], case["micro"], case["gas"]
    losses, norms, snapshots = [], [], []
    for step in range(case["steps"]):
        x, y = global_batch(case, step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(gas):
            for r in range(dp):
                rows = slice((m * dp + r) * micro, (m * dp + r + 1) * micro)
                loss = model(x[rows].to(device), y[rows].to(device))
                (loss / (gas * dp)).backward()
                total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, case["clip"]) if case["clip"] > 0 else \
            torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        opt.step()
        losses.append(total / (gas * dp))
        norms.append(float(norm))
        snapshots.append(flat(model))
    return {"losses": losses, "grad_norms": norms, "params": snapshots}


def init_distributed_first():
    """DeepSpeed's order: deepspeed.init_distributed() before initialize(); torch.distributed then works
    on the same rendezvous, and the config's tensor_parallel.tp_size still applies at initialize()."""
    tessera.init_distributed()
    assert torch.distributed.is_initialized()
    assert torch.distributed.get_rank() == tessera.comm.get_rank()
    assert torch.distributed.get_world_size() == tessera.comm.get_world_size()
    t = torch.tensor([float(tessera.comm.get_rank() + 1)])
    torch.distributed.all_reduce(t)
    n = tessera.comm.get_world_size()
    assert t.item() == n * (n + 1) / 2, t


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = sys.argv[2]
    if "--gloo" in sys.argv[3:]:  # several ranks sharing one GPU: NCCL refuses that, Gloo stages through the host
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        tessera.init_distributed(dist_backend="gloo")
    if "--init-distributed-first" in sys.argv[3:]:
        init_distributed_first()
    results = [tessera_run(case) for case in cases]
    if tessera.comm.get_rank() == 0:
        torch.save(results, out)


if __name__ == "__main__":
    worker_exit.run(main)
