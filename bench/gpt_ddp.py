"""Baseline for bench/run_engine_vs_ddp.sh: the GPT example trained with PyTorch DDP over Gloo.

The same byte-level GPT as examples/models/gpt.cpp (examples/python/models.py, imported) (vocab 256, block 128, 4 layers, 4 heads,
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
import gc
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

# The model and the data are the examples' own (examples/python/), which match the C++ ones.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from data import FORTUNES, FortunesCorpus  # noqa: E402
from models import Gpt  # noqa: E402


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
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb,
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
    # DDP's reducer holds the process group and autograd hooks: drop it first, then the group. Even
    # so torch 2.11 sometimes aborts at interpreter exit ("terminate called without an active
    # exception", after the results above are out), so leave without the interpreter's teardown.
    del ddp, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
