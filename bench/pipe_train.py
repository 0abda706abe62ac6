"""One pipeline-parallel training run for bench/run_pp_schedules.sh, through tessera.pipe or
DeepSpeed's pipeline engine, on the same layers and data.

    tessera launch --nproc-per-node 4 -- python bench/pipe_train.py --impl tessera --stages 4 --schedule zb_h1

The model is the example GPT (examples/python/models.py's Block) as a layer list both engines take
unchanged: the token embedding (tied with the head), the position embedding, --layers blocks, the
final LayerNorm, the tied head. fp32, AdamW, clipping 1.0, Gloo; --micro-batches micro-batches of
--micro sequences of 128 bytes of `fortunes` a step on each data-parallel rank.

Rank 0 prints one JSON line: samples_per_s (median step after --warmup), step_ms, peak RSS of every
rank, final_loss; tessera adds each stage's measured idle fraction in the last batch (1 − time in
forward/backward / the batch) beside the simulator's for the same schedule timed with the costs
read off that batch (each stage's chunks' F, B and W, the transfers' measured latency, the loads
and step: parallel/pipeline/measured_costs.h) and with the balanced model's (the stages' mean
costs, sends free), and the activations held; where each stage's idle time went (waiting in receives, the other non-compute
instructions, between instructions); each stage's chunks' mean F, B and W are in
simulator_costs_s["chunk_costs"].
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
from data import FORTUNES, FortunesCorpus  # noqa: E402
from models import Block  # noqa: E402

SEQ_LEN, VOCAB = 128, 256


class TokenEmbedding(nn.Module):
    """The token embedding; its weight is also the head's (a tied layer in both engines)."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, dim) * 0.02)

    def forward(self, idx):
        return F.embedding(idx, self.weight)


class PositionEmbedding(nn.Module):
    def __init__(self, block_size, dim):
        super().__init__()
        self.wpe = nn.Embedding(block_size, dim)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)

    def forward(self, x):
        return x + self.wpe(torch.arange(x.size(1), device=x.device))


def head(module, x):
    return F.linear(x, module.weight)


def loss_fn(logits, labels):
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def layers(pipe, args):
    return [pipe.TiedLayerSpec("embed", TokenEmbedding, VOCAB, args.embd),
            pipe.LayerSpec(PositionEmbedding, SEQ_LEN, args.embd),
            *[pipe.LayerSpec(Block, args.embd, args.heads) for _ in range(args.layers)],
            pipe.LayerSpec(nn.LayerNorm, args.embd),
            pipe.TiedLayerSpec("embed", TokenEmbedding, VOCAB, args.embd, forward_fn=head)]


def config(args):
    return {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": args.micro_batches,
            "steps_per_print": 10**9, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.1}},
            "zero_optimization": {"stage": args.stage, "stage3_param_persistence_threshold": 0},
            "pipeline": {"stages": args.stages, "schedule": args.schedule, "virtual_stages": args.virtual,
                         "zero3_gather": args.zero3_gather}}


def idle_parts(timeline):
    """Where the stage's non-compute time went in its last batch (seconds): waiting in receives,
    in the other instructions (loads, posting sends, the tied reduction, the step), and between
    instructions (the executor's own work)."""
    compute = ("Forward", "Backward", "BackwardWeight")
    recv = sum(end - start for op, _, _, start, end in timeline if op.startswith("Recv"))
    other = sum(end - start for op, _, _, start, end in timeline if op not in compute and not op.startswith("Recv"))
    gaps = sum(max(0.0, b[3] - a[4]) for a, b in zip(timeline, timeline[1:])) + (timeline[0][3] if timeline else 0.0)
    return [recv, other, gaps]


OPS = ["LoadMicroBatch", "RecvActivation", "Forward", "SendActivation", "RecvGrad", "Backward", "SendGrad",
       "BackwardWeight", "ReduceTiedGrads", "OptimizerStep"]


def gather_timelines(report, stages, stage, data_rank, rank, world, all_reduce):
    """The first data rank's stages' last-batch timelines, on every rank: per stage its (op,
    micro-batch, chunk, start, end) in program order, the times on the host's monotonic clock."""
    where = torch.zeros(world, 3, dtype=torch.float64)  # stage, data rank, instructions
    where[rank] = torch.tensor([stage, data_rank, len(report["timeline"])], dtype=torch.float64)
    all_reduce(where)
    rows = torch.zeros(world, int(where[:, 2].max().item()), 5, dtype=torch.float64)
    rows[rank, :len(report["timeline"])] = torch.tensor(
        [[OPS.index(op), mb, chunk, report["began"] + start, report["began"] + end]
         for op, mb, chunk, start, end in report["timeline"]], dtype=torch.float64)
    all_reduce(rows)
    timelines = [None] * stages
    for r, (s, d, n) in enumerate(where.tolist()):
        if int(d) == 0:
            timelines[int(s)] = [(OPS[int(op)], int(mb), int(chunk), start, end)
                                 for op, mb, chunk, start, end in rows[r, :int(n)].tolist()]
    return timelines


def write_timeline(path, timelines):
    """bench/plot_pipeline.py's JSON lines (train_gpt --timeline's), from the first stage's start."""
    origin = min(t[0][3] for t in timelines)
    with open(path, "w") as f:
        for s, timeline in enumerate(timelines):
            for op, mb, chunk, start, end in timeline:
                f.write(json.dumps({"stage": s, "op": op, "micro_batch": mb, "chunk": chunk,
                                    "start": start - origin, "end": end - origin}) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=["tessera", "deepspeed"], required=True)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b", help="tessera: 1f1b, gpipe, zb_h1, interleaved_1f1b, zb_v (with --virtual 2)")
    ap.add_argument("--virtual", type=int, default=1)
    ap.add_argument("--stage", type=int, default=1, help="ZeRO stage")
    ap.add_argument("--zero3-gather", default="step")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeline", help="tessera: write the last batch's instructions as run (JSON lines, "
                                       "bench/plot_pipeline.py), every stage on one clock")
    args = ap.parse_args()

    if args.impl == "tessera":
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import tessera
        from tessera import pipe
        model = pipe.PipelineModule(layers(pipe, args), num_stages=args.stages, loss_fn=loss_fn,
                                    partition_method="type:Block", seed_layers=True, base_seed=args.seed,
                                    virtual_stages=args.virtual, placement="v" if args.schedule == "zb_v" else "loop")
        engine, _, _, _ = tessera.initialize(model=model, config=config(args))
        rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
        stage = model.stage_id
        data_rank = tessera.comm.parallel_context().group_rank("data")
        all_reduce = lambda t: tessera.comm.all_reduce(t)  # noqa: E731
    else:
        import deepspeed
        import torch.distributed as dist
        from deepspeed import pipe
        deepspeed.init_distributed(dist_backend="gloo")
        # seed_layers: DeepSpeed 0.19.8 passes a numpy integer to random.seed, which refuses it
        torch.manual_seed(args.seed)
        model = pipe.PipelineModule(layers(pipe, args), num_stages=args.stages, loss_fn=loss_fn,
                                    partition_method="type:Block")
        cfg = config(args)
        del cfg["pipeline"]
        cfg["zero_optimization"] = {"stage": args.stage}
        engine, _, _, _ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
        rank, world = dist.get_rank(), dist.get_world_size()
        stage = model.stage_id
        data_rank = engine.grid.data_parallel_id

        def all_reduce(t):
            dist.all_reduce(t)
            return t
    dp = world // args.stages
    corpus = FortunesCorpus(FORTUNES)
    times, loss = [], 0.0
    for step in range(args.steps):
        # The step's global batch; micro-batch m of data rank d is its rows [(m·dp + d)·micro, +micro).
        x, y = corpus.sample(args.micro * dp * args.micro_batches, SEQ_LEN, step, args.seed)
        rows = [slice((m * dp + data_rank) * args.micro, (m * dp + data_rank + 1) * args.micro)
                for m in range(args.micro_batches)]
        it = iter([(x[r], y[r]) for r in rows])
        t0 = time.perf_counter()
        loss = float(engine.train_batch(it))
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    rss = torch.zeros(world, dtype=torch.float64)
    rss[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    all_reduce(rss)
    result = {"impl": args.impl, "stages": args.stages, "schedule": args.schedule if args.impl == "tessera" else "1f1b",
              "virtual": args.virtual, "stage": args.stage, "world": world,
              "samples_per_s": args.micro * dp * args.micro_batches / step_s, "step_ms": 1000 * step_s,
              "peak_rss_bytes": [int(v) for v in rss.tolist()], "final_loss": loss,
              "parameters_this_rank": sum(p.numel() for p in model.parameters())}
    if args.impl == "tessera":
        # Each stage's last batch: measured idle and activations, and the simulator's with the costs
        # read off that batch (tessera._C.pipeline.measured_costs: each stage's chunks' F, B and W,
        # the transfers' latency, the loads and step), from the first data rank's stages' timelines
        # on the host's clock; beside it the balanced model's (the stages' mean costs, free sends).
        report = engine.last_report()
        timelines = gather_timelines(report, args.stages, stage, data_rank, rank, world, all_reduce)
        if args.timeline and rank == 0:
            write_timeline(args.timeline, timelines)
        costs = tessera._C.pipeline.measured_costs(args.schedule, args.stages, args.micro_batches, args.virtual, timelines)
        sim = tessera._C.pipeline.simulate(args.schedule, args.stages, args.micro_batches, args.virtual,
                                           **{k: v for k, v in costs.items() if k != "timed_transfers"})
        # The balanced model: every stage's chunks at the stages' mean costs, sends free.
        balanced = tessera._C.pipeline.simulate(args.schedule, args.stages, args.micro_batches, args.virtual,
                                                forward=costs["forward"], backward=costs["backward"],
                                                weight_share=costs["weight_share"])
        # The idle to expect with the costs' spread (each instruction's cost redrawn from its kind's
        # in this batch, 200 draws), and the batch replayed with each instruction's own cost.
        expected = tessera._C.pipeline.expected_idle(args.schedule, args.stages, args.micro_batches, args.virtual,
                                                     timelines)
        result["simulator_costs_s"] = costs
        mine = torch.zeros(world, 15, dtype=torch.float64)
        mine[rank] = torch.tensor([stage, report["idle_fraction"], sim["idle_fraction"][stage], report["peak_activations"],
                                   sim["peak_activations"][stage], report["seconds"], *idle_parts(report["timeline"]),
                                   balanced["idle_fraction"][stage], expected["mean"][stage], expected["low"][stage],
                                   expected["high"][stage], expected["replayed"][stage], expected["measured"][stage]],
                                  dtype=torch.float64)
        all_reduce(mine)
        result["stages_last_batch"] = [
            {"stage": int(r[0]), "idle": r[1], "simulated_idle": r[2], "held": int(r[3]), "simulated_held": int(r[4]),
             "batch_s": r[5], "recv_wait_s": r[6], "other_instructions_s": r[7], "between_instructions_s": r[8],
             "simulated_idle_balanced": r[9], "expected_idle": r[10], "expected_idle_range": [r[11], r[12]],
             "replayed_idle": r[13], "idle_on_shared_span": r[14]}
            for r in mine.tolist()]
    if rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
