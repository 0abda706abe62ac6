"""One GPT-with-MoE training run for bench/run_moe_compare.sh, through tessera or DeepSpeed.

    tessera launch --nproc-per-node 4 -- python bench/moe_train.py --impl tessera --experts 8 --ep 2

The model is the example GPT (examples/python/models.py) whose every other block's MLP is an MoE
layer (tessera.moe.MoE or deepspeed.moe.layer.MoE, the same arguments): --experts experts of
hidden 4·C/k each, top --k, so that a token's active MLP parameters equal the dense GPT's (the
baseline, --experts 0). Expert e is initialized from a generator seeded with --seed + 1000 + e, the
rest as the example GPT, identically for both implementations. The loss adds 0.01 · l_aux of each
MoE layer. fp32, AdamW, clipping 1.0, ZeRO --stage, Gloo; rank r trains on rows [r·micro, (r+1)·micro)
of each step's global batch of `fortunes`.

Rank 0 prints one JSON line: samples_per_s (median step after --warmup), step_ms, peak RSS of every
rank, final_loss; tessera adds the all-to-all's calls, bytes and seconds per step on the
expert-parallel group, and each rank's engine buffers of expert and dense optimizer state.
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
from models import Gpt  # noqa: E402

SEQ_LEN = 128


class Expert(nn.Module):
    def __init__(self, n_embd, hidden):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(n_embd, hidden), nn.Linear(hidden, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class MoeMlp(nn.Module):
    def __init__(self, moe_class, args):
        super().__init__()
        self.moe = moe_class(hidden_size=args.embd, expert=Expert(args.embd, 4 * args.embd // args.k),
                             num_experts=args.experts, ep_size=args.ep, k=args.k, capacity_factor=args.capacity_factor,
                             min_capacity=4, drop_tokens=not args.dropless, use_rts=False,
                             top2_2nd_expert_sampling=False)
        self.l_aux = None

    def forward(self, x):
        out, self.l_aux, _ = self.moe(x)
        return out


class WithAux(nn.Module):
    """The GPT's cross-entropy plus 0.01 times each MoE layer's load-balancing loss."""

    def __init__(self, gpt, moes):
        super().__init__()
        self.gpt, self.moes = gpt, moes

    def forward(self, x, y):
        loss = self.gpt(x, y)
        for m in self.moes:
            loss = loss + 0.01 * m.l_aux
        return loss


def build(args, moe_class, ep_rank):
    gpt = Gpt(n_layer=args.layers, n_head=args.heads, n_embd=args.embd, seed=args.seed)
    moes = []
    if args.experts:
        local = args.experts // args.ep
        for l, block in enumerate(gpt.transformer.h):
            if (l + 1) % 2:
                continue
            block.mlp = MoeMlp(moe_class, args)
            moes.append(block.mlp)
            with torch.no_grad():
                gen = torch.Generator().manual_seed(args.seed + 7 * l)
                block.mlp.moe.deepspeed_moe.gate.wg.weight.normal_(0, 0.02, generator=gen)
                for i, expert in enumerate(block.mlp.moe.deepspeed_moe.experts.deepspeed_experts):
                    gen = torch.Generator().manual_seed(args.seed + 1000 * (l + 1) + ep_rank * local + i)
                    for p in expert.parameters():
                        p.normal_(0, 0.02, generator=gen) if p.dim() >= 2 else p.zero_()
    return WithAux(gpt, moes)


def groups(model, weight_decay, split):
    base = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": weight_decay, "name": "decay"},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0, "name": "no_decay"}]
    return split(base) if split else base


def config(args):
    return {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.1}},
            "zero_optimization": {"stage": args.stage, "reduce_bucket_size": int(args.bucket),
                                  "allgather_bucket_size": int(args.bucket), "overlap_comm": True}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=["tessera", "deepspeed"], required=True)
    ap.add_argument("--experts", type=int, default=8, help="0: the dense GPT")
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--capacity-factor", type=float, default=1.0)
    ap.add_argument("--dropless", action="store_true")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--bucket", type=float, default=5e6)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    if args.impl == "tessera":
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import tessera
        from tessera.moe import MoE, split_params_into_different_moe_groups_for_optimizer as split
        rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
        model = build(args, MoE, rank % args.ep)
        engine, _, _, _ = tessera.initialize(model=model, config=config(args),
                                             model_parameters=groups(model, 0.1, split if args.experts else None))
        all_reduce = lambda t: tessera.comm.all_reduce(t)  # noqa: E731
    else:
        import deepspeed
        import torch.distributed as dist
        from deepspeed.moe.layer import MoE
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer as split
        deepspeed.init_distributed(dist_backend="gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = build(args, MoE, rank % args.ep)
        engine, _, _, _ = deepspeed.initialize(model=model, config=config(args),
                                               model_parameters=groups(model, 0.1, split if args.experts else None))

        def all_reduce(t):
            dist.all_reduce(t)
            return t
    corpus = FortunesCorpus(FORTUNES)
    times, loss, exchanged_rows = [], 0.0, 0
    for step in range(args.steps):
        if step == args.warmup and args.impl == "tessera":
            context = tessera.comm.parallel_context()
            ep_group = "ep_size_%d" % args.ep
            if args.experts and args.ep > 1:
                context.stats(ep_group, True)
            context.stats("data", True)
        x, y = corpus.sample(args.micro * world, SEQ_LEN, step, args.seed)
        x, y = x[rank * args.micro:(rank + 1) * args.micro], y[rank * args.micro:(rank + 1) * args.micro]
        t0 = time.perf_counter()
        out = engine(x, y)
        engine.backward(out)
        engine.step()
        loss = out.item()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            if args.impl == "tessera":  # rows sent and received, forward and backward
                exchanged_rows += sum(2 * (m.moe.deepspeed_moe.tokens_routed - m.moe.deepspeed_moe.tokens_dropped +
                                           m.moe.deepspeed_moe.rows_received) for m in model.moes)
    step_s = statistics.median(times)
    timed = args.steps - args.warmup
    rss = torch.zeros(world, dtype=torch.float64)
    rss[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    all_reduce(rss)
    mean_loss = torch.tensor([loss], dtype=torch.float64)
    all_reduce(mean_loss)
    result = {"impl": args.impl, "experts": args.experts, "ep": args.ep, "k": args.k, "world": world,
              "stage": args.stage, "samples_per_s": args.micro * world / step_s, "step_ms": 1000 * step_s,
              "peak_rss_bytes": [int(v) for v in rss.tolist()], "final_loss": mean_loss.item() / world,
              "parameters_this_rank": sum(p.numel() for p in model.parameters())}
    if args.impl == "tessera":
        if args.experts and args.ep > 1:
            a2a = context.stats(ep_group).get("all_to_all", [0, 0, 0, 0])
            result["all_to_all"] = {"calls_per_step": a2a[0] / timed, "bytes_per_step": a2a[1] / timed,
                                    "seconds_per_step": a2a[2] / timed, "share_of_step": a2a[2] / timed / step_s}
        result["groups"] = engine.group_memory()
        if args.experts and args.ep > 1:
            # per step: the kept rows each way (dispatch and combine, forward and backward), and
            # each MoE layer's exchange of E per-expert counts (8 bytes each) before its dispatch
            result["all_to_all_formula_bytes"] = (exchanged_rows * args.embd * 4 / timed +
                                                  len(model.moes) * args.experts * 8)
    if rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
