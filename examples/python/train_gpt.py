#!/usr/bin/env python3
"""train_gpt.py: a byte-level GPT (a plain torch.nn.Module, models.Gpt) on the `fortunes` corpus,
trained through tessera with whatever the DeepSpeed-style config asks for (ZeRO stage, bf16/fp16,
optimizer, schedule, clipping, gradient accumulation, csv_monitor metrics).

    tessera launch --nproc-per-node 2 -- python examples/python/train_gpt.py --config configs/zero2_bf16.json --steps 200
    torchrun --nproc-per-node 2 examples/python/train_gpt.py --config configs/zero2_bf16.json --steps 200
    python examples/python/train_gpt.py --config configs/zero0_fp32.json --steps 50     # one process

The Python twin of examples/train_gpt.cpp: same model, same initialization, same batches. Every rank
draws the same GLOBAL batch for each optimizer step (train_batch_size sequences); micro-step m uses
its rows [m*dp*micro, (m+1)*dp*micro), of which this rank trains on its own `micro`. At the end rank 0
prints `final loss: <value>`: the last optimizer step's loss (mean over its micro-steps), averaged
over the data-parallel ranks.
"""
import argparse
import os
import sys
import time

import torch

try:
    import tessera
except ImportError:  # run from a checkout without PYTHONPATH=python: use the checkout's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import tessera

from data import FORTUNES, FortunesCorpus
from models import Gpt

EVAL_BATCHES = 16  # fixed validation batches, the same at every evaluation


def validation_loss(engine, corpus, micro, seed):
    dp, me = engine.dp_world_size, engine.dp_rank
    total = 0.0
    with torch.no_grad():
        for i in range(EVAL_BATCHES):
            inputs, targets = corpus.sample(micro * dp, engine.module.block_size, i, seed, validation=True)
            rows = slice(me * micro, (me + 1) * micro)
            total += engine(inputs[rows], targets[rows]).item()
    return data_parallel_mean(total / EVAL_BATCHES)


def data_parallel_mean(value):
    t = torch.tensor([value], dtype=torch.float64)
    return tessera.comm.all_reduce(t, op="avg", group="data").item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="DeepSpeed-style JSON config file, or the JSON text itself")
    ap.add_argument("--steps", type=int, required=True, help="optimizer steps")
    ap.add_argument("--seed", type=int, default=1234, help="model initialization and data order (default 1234)")
    ap.add_argument("--eval-every", type=int, default=0, help="validation loss every K steps and at the end (0: never)")
    ap.add_argument("--fortunes", default=FORTUNES, help="the corpus folder (default %(default)s)")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be >= 1")

    torch.manual_seed(args.seed)
    corpus = FortunesCorpus(args.fortunes)
    # At ZeRO-3 the model is built partitioned (each rank keeps 1/N of every layer as it is made; the
    # custom initialization writes through GatheredParameters); at stages 0-2 Init does nothing.
    with tessera.zero.Init(config=args.config):
        model = Gpt(seed=args.seed, gathered=lambda p: tessera.zero.GatheredParameters(p, modifier_rank=0))
    # Weight decay on matrices only; the decay group's value comes from the config.
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "name": "decay"},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0, "name": "no_decay"}]
    engine, _, _, _ = tessera.initialize(model=model, config=args.config, model_parameters=groups)

    micro = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    dp, me = engine.dp_world_size, engine.dp_rank
    seq_len = model.block_size
    leader = engine.global_rank == 0
    if leader:
        print("train_gpt.py: %s" % tessera.comm.describe())
        print("train_gpt.py: GPT %d parameters (%s); fortunes corpus %d bytes (%d held out)"
              % (sum(p.numel() for p in model.parameters()), str(engine.compute_dtype).replace("torch.", ""),
                 len(corpus), len(corpus) - corpus.split))
        print("train_gpt.py: %d steps of %d sequences (%d per rank x %d micro-steps x %d data-parallel ranks)"
              % (args.steps, micro * accumulation * dp, micro, accumulation, dp))
        if engine.monitor is not None:
            print("train_gpt.py: metrics -> %s" % engine.monitor.path)
        sys.stdout.flush()

    engine.train()
    last_loss = 0.0
    start = time.perf_counter()
    for step in range(args.steps):
        inputs, targets = corpus.sample(micro * dp * accumulation, seq_len, step, args.seed)
        step_loss = 0.0
        for m in range(accumulation):
            rows = slice((m * dp + me) * micro, (m * dp + me + 1) * micro)
            loss = engine(inputs[rows], targets[rows])  # counts the micro-batch's samples and tokens
            engine.backward(loss)
            engine.step()
            step_loss += loss.item()
        last_loss = step_loss / accumulation
        if args.eval_every > 0 and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
            train = data_parallel_mean(last_loss)
            val = validation_loss(engine, corpus, micro, args.seed)
            if leader:
                print("step %d: train loss %.4f, validation loss %.4f" % (step + 1, train, val), flush=True)

    final = data_parallel_mean(last_loss)
    engine.close()
    if leader:
        print("train_gpt.py: %d steps in %.1f s" % (args.steps, time.perf_counter() - start))
        print("final loss: %.6f" % final, flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C (tessera launch forwards it to every rank)
        print("train_gpt.py: rank %d interrupted" % tessera.comm.get_rank(), file=sys.stderr, flush=True)
        sys.exit(130)
