"""The example GPT (causal, 2 layers) trained with context parallelism against one process training
the same model on the same sequences (tests/python/context_parallel/test_context_parallel.py).

    context_gpt_worker.py METHOD CP STAGE OPTIMIZER [tp N] [bf16] [checkpointing] [+ METHOD CP ...]

Several cases separated by "+" run one after the other by the same ranks (each with its own model
and engine: one start of the processes serves them all).

METHOD: ulysses or ring; CP: context_parallel.size; "zero_init": the model built under
tessera.zero.Init (partitioned over data x context; each rank draws from its own seed, rank 0's win); the world is data x CP (x tensor N with "tp");
STAGE: ZeRO 0-3; OPTIMIZER: sgd (no momentum, clipping that clips: a wrong gradient scale shows) or
adamw. Each step's global batch is DATA micro-batches of SEQ tokens; data rank d takes row block d,
and its context ranks each their part of every sequence (tessera.sequence.shard, the method's
layout) with the global positions; the loss is tessera.sequence.cross_entropy (the mean over the
whole sequence's tokens). Checked every step: the loss (the same on every rank of a context group,
averaged over data ranks) and the gradient norm; at the end every parameter. fp32 within the tensor-
parallel tolerance (1e-5 relative; AdamW's parameters 5e-5 absolute); bf16 within 2e-2. Prints "ok" on rank 0."""
import os
import sys

import torch

import tessera
from tessera import sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python"))
from models import Gpt  # noqa: E402
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown

SEQ, MICRO, STEPS, VOCAB = 32, 2, 3, 64
LR = {"sgd": 0.5, "adamw": 0.01}
CLIP = 0.5


def model_of():
    return Gpt(vocab=VOCAB, block_size=SEQ, n_layer=2, n_head=4, n_embd=32, seed=7)


def batch(step, rows):
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def optimizer_config(kind):
    if kind == "sgd":
        return {"type": "SGD", "params": {"lr": LR[kind]}}
    return {"type": "AdamW", "params": {"lr": LR[kind], "weight_decay": 0.01}}


def reference(kind, dp):
    model = model_of()
    opt = torch.optim.SGD(model.parameters(), lr=LR[kind]) if kind == "sgd" else \
        torch.optim.AdamW(model.parameters(), lr=LR[kind], weight_decay=0.01)
    seen = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, dp * MICRO)
        loss = model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        seen.append((loss.item(), norm.item()))
    return seen, model


def main():
    case = []
    for arg in sys.argv[1:] + ["+"]:
        if arg != "+":
            case.append(arg)
            continue
        run_case(case[0], int(case[1]), int(case[2]), case[3], case[4:])
        case = []


def run_case(method, cp, stage, kind, more):
    tp = int(more[more.index("tp") + 1]) if "tp" in more else 1
    bf16 = "bf16" in more
    world = tessera.comm.get_world_size()
    dp = world // (cp * tp)
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 100,
              "gradient_clipping": CLIP, "optimizer": optimizer_config(kind),
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 2000},
              "context_parallel": {"size": cp, "method": method}}
    if tp > 1:
        config["tensor_parallel"] = {"tp_size": tp}
    if bf16:
        config["bf16"] = {"enabled": True}
    if "checkpointing" in more:
        config["activation_checkpointing"] = {"partition_activations": False}
    if "deepspeed_key" in more:  # DeepSpeed's name for the degree
        del config["context_parallel"]
        config["sequence_parallel_size"] = cp
    if "zero_init" in more:  # built partitioned over data x context (each rank from another seed: the
        # values come from rank 0 of that group)
        with tessera.zero.Init(config=config):
            model = Gpt(vocab=VOCAB, block_size=SEQ, n_layer=2, n_head=4, n_embd=32, seed=7 + tessera.comm.get_rank(),
                        gathered=lambda p: tessera.zero.GatheredParameters(p, modifier_rank=0))
    else:
        model = model_of()
    engine, _, _, _ = tessera.initialize(model=model, config=config)
    context = tessera.comm.parallel_context()
    assert context.group_size("context") == cp and engine.dp_world_size == dp, (context.describe(), engine.dp_world_size)
    data_rank = engine.dp_rank
    want, ref = reference(kind, dp)
    tol = 2e-2 if bf16 else 1e-5
    for step in range(STEPS):
        x, y = batch(step, dp * MICRO)
        x, y = (t[data_rank * MICRO:(data_rank + 1) * MICRO] for t in (x, y))
        x, y = sequence.shard(x, dim=1), sequence.shard(y, dim=1)
        loss = engine(x, y, pos=sequence.positions(SEQ), loss_fn=sequence.cross_entropy)
        engine.backward(loss)
        engine.step()
        mean = tessera.comm.all_reduce(torch.tensor([loss.item()], dtype=torch.float64), "avg", "world").item()
        for what, got, ref_value in (("loss", mean, want[step][0]), ("gradient norm", engine.get_global_grad_norm(),
                                                                      want[step][1])):
            assert abs(got - ref_value) <= 1e-6 + tol * abs(ref_value), "step %d %s: %r, the reference %r" % (
                step, what, got, ref_value)
    ref_params = dict(ref.named_parameters())
    with engine.gathered_parameters():
        for n, p in model.named_parameters():
            p = tessera.tensor_parallel.full_tensor(p).detach().float()
            q = ref_params[n].detach()
            diff = (p - q).abs().max().item()
            # Adam divides by the root of the second moment: near-zero gradients (biases) turn rounding
            # differences of the order of 1e-7 into parameter differences of a few 1e-5
            atol = 5e-5 if kind == "adamw" and not bf16 else 1e-6
            assert diff <= atol + tol * max(1.0, q.abs().max().item()), "rank %d %s differs by %g" % (
                tessera.comm.get_rank(), n, diff)
    if tessera.comm.get_rank() == 0:
        print("ok %s cp %d stage %d %s" % (method, cp, stage, kind), " ".join(more), flush=True)


if __name__ == "__main__":
    worker_exit.run(main)
