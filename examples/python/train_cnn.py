#!/usr/bin/env python3
"""train_cnn.py: a small CNN (a plain torch.nn.Module, models.Cnn) on Fashion-MNIST, trained through
tessera with whatever the DeepSpeed-style config asks for.

    tessera launch --nproc-per-node 2 -- python examples/python/train_cnn.py --config configs/zero1_fp32.json --steps 500 --eval-every 250
    python examples/python/train_cnn.py --config configs/zero0_fp32.json --steps 100     # one process

The Python twin of examples/train_cnn.cpp: same model, same initialization, same batches (every rank
draws the same GLOBAL batch per optimizer step and trains on its own rows of it). With --eval-every K,
loss and accuracy on the 10,000 test images (split over the data-parallel ranks) every K steps and at
the end. Rank 0 ends with `final loss: <value>`: the last optimizer step's loss (mean over its
micro-steps), averaged over the data-parallel ranks.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

try:
    import tessera
except ImportError:  # run from a checkout without PYTHONPATH=python: use the checkout's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import tessera

from data import FASHION_MNIST, FashionMnist
from models import Cnn

EVAL_CHUNK = 500  # test images per forward


def data_parallel_sum(*values):
    t = torch.tensor(values, dtype=torch.float64)
    return tessera.comm.all_reduce(t, op="sum", group="data").tolist()


def evaluate(engine, data):
    """Loss and accuracy on the whole test set, split over the data-parallel ranks."""
    n = data.size("test")
    dp, me = engine.dp_world_size, engine.dp_rank
    begin, end = me * n // dp, (me + 1) * n // dp
    loss_sum = correct = 0.0
    engine.eval()
    with torch.no_grad():
        for b in range(begin, end, EVAL_CHUNK):
            images, labels = data.range(b, min(EVAL_CHUNK, end - b))
            logits = engine(images).float()
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).sum().item()
    engine.train()
    loss_sum, correct = data_parallel_sum(loss_sum, correct)
    return loss_sum / n, correct / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="DeepSpeed-style JSON config file, or the JSON text itself")
    ap.add_argument("--steps", type=int, required=True, help="optimizer steps")
    ap.add_argument("--seed", type=int, default=1234, help="model initialization and data order (default 1234)")
    ap.add_argument("--eval-every", type=int, default=0, help="test loss and accuracy every K steps and at the end (0: never)")
    ap.add_argument("--data", default=FASHION_MNIST, help="the Fashion-MNIST folder (default %(default)s)")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be >= 1")

    torch.manual_seed(args.seed)
    data = FashionMnist(args.data)
    model = Cnn(seed=args.seed)
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "name": "decay"},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0, "name": "no_decay"}]
    engine, _, _, _ = tessera.initialize(model=model, config=args.config, model_parameters=groups)

    micro = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    dp, me = engine.dp_world_size, engine.dp_rank
    leader = engine.global_rank == 0
    if leader:
        print("train_cnn.py: %s" % tessera.comm.describe())
        print("train_cnn.py: CNN %d parameters (%s); Fashion-MNIST %d train / %d test images"
              % (sum(p.numel() for p in model.parameters()), str(engine.compute_dtype).replace("torch.", ""),
                 data.size("train"), data.size("test")))
        print("train_cnn.py: %d steps of %d images (%d per rank x %d micro-steps x %d data-parallel ranks)"
              % (args.steps, micro * accumulation * dp, micro, accumulation, dp))
        if engine.monitor.path:
            print("train_cnn.py: metrics -> %s" % engine.monitor.path)
        sys.stdout.flush()

    engine.train()
    last_loss = 0.0
    start = time.perf_counter()
    for step in range(args.steps):
        images, labels = data.sample(micro * dp * accumulation, step, args.seed)
        step_loss = 0.0
        for m in range(accumulation):
            rows = slice((m * dp + me) * micro, (m * dp + me + 1) * micro)
            loss = F.cross_entropy(engine(images[rows]).float(), labels[rows])
            engine.backward(loss)
            engine.step()
            step_loss += loss.item()
        last_loss = step_loss / accumulation
        if args.eval_every > 0 and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
            train = data_parallel_sum(last_loss)[0] / dp
            test_loss, accuracy = evaluate(engine, data)
            if leader:
                print("step %d: train loss %.4f, test loss %.4f, test accuracy %.2f%%"
                      % (step + 1, train, test_loss, 100 * accuracy), flush=True)

    final = data_parallel_sum(last_loss)[0] / dp
    engine.close()
    if leader:
        print("train_cnn.py: %d steps in %.1f s" % (args.steps, time.perf_counter() - start))
        print("final loss: %.6f" % final, flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C (tessera launch forwards it to every rank)
        print("train_cnn.py: rank %d interrupted" % tessera.comm.get_rank(), file=sys.stderr, flush=True)
        sys.exit(130)
