"""Baseline for bench/run_engine_vs_ddp.sh: the GPT example trained with PyTorch DDP over Gloo.

The same byte-level GPT as examples/models/gpt.cpp (vocab 256, block 128, 4 layers, 4 heads,
128 dims, pre-LayerNorm, causal SDPA, GELU-tanh MLP, LM head tied to the token embedding, 842,496
parameters), registered in the same order and initialized with the same draws: one
torch.Generator seeded with --seed gives N(0, 0.02) to every weight with dim >= 2, in registration
order, N(0, 0.02/sqrt(2·n_layer)) to the two residual projections of each block, ones to the
LayerNorm weights and zeros to the biases. This is what Gpt's constructor does with at::normal on
a CPU generator, so the initial parameters are bit-identical (checked: the first step's loss is
the same as train_gpt's to the printed digits).

The data are examples/data/fortunes_corpus.cpp's, byte for byte: the fortunes files read in name
order into one string with "\\n%\\n" after each fortune, the last ~5% held out, and for optimizer
step s a global batch of micro × world sequences of 128 + 1 bytes at offsets
splitmix64(base + row) mod (train bytes − 128), base = splitmix64(splitmix64(seed ^ 0x7472) ^ s);
rank r trains on rows [r·micro, (r+1)·micro).

Training: fp32, torch.optim.AdamW (lr, betas, eps, weight decay groups as nanoGPT and Gpt's
param_groups: decay = dim >= 2, no_decay = biases and LayerNorm), fused=True when the CPU build has
the fused kernel, else foreach; clip_grad_norm_ at --clip (0: none); DistributedDataParallel with
gradient_as_bucket_view=True and --bucket-cap-mb (DDP's default when omitted).

Run under a launcher that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (tessera launch, torchrun).
The first --warmup steps are not timed. Rank 0 prints one JSON line:
  {"impl": "ddp", "ranks", "micro_batch", "steps", "samples_per_s", "tokens_per_s", "step_ms",
   "peak_rss_bytes": [rank 0, rank 1, ...], "peak_rss_max_bytes", "final_loss", ...}
peak RSS is each rank's ru_maxrss (the whole process: interpreter, torch, model, activations).
"time_per_step_ms" splits rank 0's timed steps into data (sampling the batch), forward (+ loss.item()),
backward (autograd with DDP's overlapped allreduces, up to the last one's completion) and optimizer
(clip_grad_norm_, AdamW, zero_grad).
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

FORTUNES = "/usr/share/games/fortunes"
MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------------------------------------
# Data: examples/data/fortunes_corpus.cpp


def splitmix64(x):
    """splitmix64 on a numpy uint64 array (wrapping arithmetic, as in C++)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def splitmix64_int(x):
    return int(splitmix64(np.array([x & MASK64], dtype=np.uint64))[0])


def append_fortunes(content, out):
    count = 0
    current = bytearray()

    def flush():
        nonlocal count, current
        while current and current[-1] in b"\n\r ":
            current.pop()
        if current:
            out.extend(current)
            out.extend(b"\n%\n")
            count += 1
        current = bytearray()

    lines = content.split(b"\n")
    if content.endswith(b"\n"):
        lines.pop()  # the C++ loop stops at the end of the content: no empty last line
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        if line == b"%":
            flush()
        else:
            current.extend(line)
            current.extend(b"\n")
    flush()
    return count


class FortunesCorpus:
    def __init__(self, directory=FORTUNES, validation_fraction=0.05):
        if not os.path.isdir(directory):
            sys.exit(f"fortunes corpus: folder not found ({directory}); install it with `apt-get install fortunes`")
        names = sorted(n for n in os.listdir(directory)
                       if os.path.isfile(os.path.join(directory, n))
                       and not n.endswith((".dat", ".u8")) and not n.startswith("."))
        text = bytearray()
        self.fortunes = 0
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                self.fortunes += append_fortunes(f.read(), text)
        if self.fortunes == 0:
            sys.exit(f"fortunes corpus: no fortune files found ({directory})")
        self.text = np.frombuffer(bytes(text), dtype=np.uint8)
        size = len(text)
        self.split = size
        if validation_fraction > 0:
            target = int(size * (1.0 - validation_fraction))
            boundary = bytes(text).find(b"\n%\n", target)
            self.split = target if boundary < 0 else boundary + 3
            if self.split >= size:
                self.split = target

    def sample(self, batch, seq_len, step, seed):
        """The train split's global batch for `step`: inputs and targets, int64 [batch, seq_len]."""
        starts = self.split - seq_len
        base = splitmix64_int(splitmix64_int(seed ^ 0x7472) ^ step)
        rows = np.arange(batch, dtype=np.uint64) + np.uint64(base)
        offsets = (splitmix64(rows) % np.uint64(starts)).astype(np.int64)
        window = self.text[offsets[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int64)
        window = torch.from_numpy(window)
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()


# ---------------------------------------------------------------------------------------------
# Model: examples/models/gpt.cpp


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = Mlp(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab=256, block_size=128, n_layer=4, n_head=4, n_embd=128, seed=1234):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)),
            ln_f=nn.LayerNorm(n_embd, eps=1e-5),
        ))
        # Gpt's initialization, draw for draw: the parameters are registered in the C++ order.
        gen = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2.0 * n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = residual_std if name.endswith("c_proj.weight") else 0.02
                    p.copy_(torch.normal(0.0, std, tuple(p.shape), generator=gen))
                elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                    p.fill_(1.0)
                else:
                    p.zero_()

    def forward(self, idx, targets):
        t = self.transformer
        pos = torch.arange(idx.size(1), device=idx.device)
        x = t.wte(idx) + t.wpe(pos)
        for block in t.h:
            x = block(x)
        logits = F.linear(t.ln_f(x), t.wte.weight)  # tied LM head
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


# ---------------------------------------------------------------------------------------------


def make_optimizer(model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=args.lr, betas=tuple(args.betas), eps=args.eps)
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kwargs), "foreach"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro", type=int, default=8, help="sequences per rank per step")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=20, help="first steps, not timed")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.95])
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient clipping max norm (0: none)")
    ap.add_argument("--bucket-cap-mb", type=float, default=None,
                    help="DDP bucket_cap_mb (MiB); omitted: DDP's default, 25 MiB plus a 1 MiB first bucket "
                         "(an explicit value also caps the first bucket, so every bucket is this size)")
    ap.add_argument("--fortunes", default=FORTUNES)
    args = ap.parse_args()
    if args.steps <= args.warmup:
        sys.exit("--steps must exceed --warmup")

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    corpus = FortunesCorpus(args.fortunes)
    model = Gpt(seed=args.seed)
    seq_len = 128
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb,
                                              gradient_as_bucket_view=True)
    optimizer, kernel = make_optimizer(model, args)
    params = list(model.parameters())

    loss_value = 0.0
    start = None
    split = {"data_ms": 0.0, "forward_ms": 0.0, "backward_ms": 0.0, "optimizer_ms": 0.0}  # timed steps, rank 0
    for step in range(args.steps):
        t0 = time.perf_counter()
        if step == args.warmup:
            start = t0
            split = dict.fromkeys(split, 0.0)
        inputs, targets = corpus.sample(args.micro * world, seq_len, step, args.seed)
        mine = slice(rank * args.micro, (rank + 1) * args.micro)
        t1 = time.perf_counter()
        loss = ddp(inputs[mine], targets[mine])
        loss_value = loss.item()
        t2 = time.perf_counter()
        loss.backward()  # DDP's bucketed allreduces run during it; it returns once all are done
        t3 = time.perf_counter()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # keep the bucket views (gradient_as_bucket_view)
        t4 = time.perf_counter()
        for key, dt in zip(split, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            split[key] += 1000 * dt
    seconds = time.perf_counter() - start
    timed = args.steps - args.warmup

    mean_loss = torch.tensor([loss_value], dtype=torch.float64)
    dist.all_reduce(mean_loss)
    rss = [None] * world
    dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if rank == 0:
        samples = args.micro * world * timed
        print(json.dumps({
            "impl": "ddp", "ranks": world, "micro_batch": args.micro, "steps": timed, "warmup_steps": args.warmup,
            "samples_per_s": round(samples / seconds, 2), "tokens_per_s": round(samples * seq_len / seconds, 1),
            "step_ms": round(1000 * seconds / timed, 2),
            "peak_rss_bytes": rss, "peak_rss_max_bytes": max(rss),
            "final_loss": round(mean_loss.item() / world, 6),
            "time_per_step_ms": {k: round(v / timed, 2) for k, v in split.items()},
            "parameters": sum(p.numel() for p in params), "adamw": kernel, "threads": torch.get_num_threads(),
            "bucket_cap_mb": args.bucket_cap_mb if args.bucket_cap_mb is not None else "default",
            "torch": torch.__version__,
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
