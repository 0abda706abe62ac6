"""An MoE model on 4 data-parallel ranks with expert parallelism, against one process training the
same model on the same global batch (tests/python/moe/test_expert_parallel.py).

    moe_worker.py EP STAGES OPTIMIZER DROP [client | tp | save DIR | load DIR]

EP: ep_size (2 or 4); STAGES: ZeRO 0-3, or several comma-separated, run one after the other by
the same processes (each with its own model and engine: one start of the ranks serves them); OPTIMIZER: sgd (no momentum, gradient clipping that clips)
or adamw; DROP: dropless or capacity; "client": the optimizer is the script's torch.optim one over
DeepSpeed's split_params_into_different_moe_groups_for_optimizer groups; "tp": tensor parallelism 2
(the dense MLP split by a plan, the MoE layer whole on each tensor rank), so dp 2 with EP over it
and two micro-batches a step per data rank; "save DIR": a checkpoint
after 2 of the 3 steps; "load DIR": starts from it (on 4 ranks or 2, at this EP and STAGE) and
trains the last step. On 2 ranks each takes 2 micro-batches a step (gradient accumulation), so the
global batch is the same. The experts are initialized by their global index (distinct,
so an expert reached on the wrong rank shows); every rank gets its own micro-batch. The reference
runs the 4 micro-batches one after the other through one model holding all experts and averages
the 4 losses (each rank's router balances over its own tokens, as DeepSpeed's does). Checked every
step: the loss averaged over the ranks and the gradient norm; at the end every parameter (a rank's
experts against the reference's experts of the same global index). Prints "ok" on rank 0."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera
from tessera.moe import MoE, split_params_into_different_moe_groups_for_optimizer
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown

RANKS, HIDDEN, EXPERTS, MICRO, SEQ, STEPS = 4, 8, 4, 2, 6, 3
LR = {"sgd": 0.2, "adamw": 0.01}
CLIP = 0.3


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 12), nn.Linear(12, HIDDEN)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, ep_size, first_expert, drop_tokens):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(HIDDEN, HIDDEN)
        self.up, self.down = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)  # split under "tp"
        self.moe = MoE(HIDDEN, Expert(), num_experts=EXPERTS, ep_size=ep_size, k=2, drop_tokens=drop_tokens,
                       capacity_factor=1.0, min_capacity=0, top2_2nd_expert_sampling=False)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        for i, e in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
            torch.manual_seed(100 + first_expert + i)
            for p in e.parameters():
                nn.init.normal_(p, std=0.4)

    def forward(self, x, y):
        h = torch.tanh(self.inp(x))
        h = h + self.down(F.gelu(self.up(h)))
        m, l_aux, _ = self.moe(h)
        return ((self.out(h + m) - y) ** 2).mean() + 0.01 * l_aux


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(MICRO, SEQ, HIDDEN, generator=g), torch.randn(MICRO, SEQ, HIDDEN, generator=g)


def optimizer_of(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LR[kind])
    return torch.optim.AdamW(params, lr=LR[kind], weight_decay=0.01)


def reference(kind, drop_tokens, steps=STEPS):
    """[(loss, grad norm)] per step and the model trained `steps` steps."""
    model = Net(1, 0, drop_tokens)
    opt = optimizer_of(kind, model.parameters())
    seen = []
    for step in range(steps):
        opt.zero_grad()
        loss = sum(model(*batch(step, r)) for r in range(RANKS)) / RANKS
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP if kind == "sgd" else 1e9)
        opt.step()
        seen.append((loss.item(), norm.item()))
    return seen, model


def close(a, b, what, rtol=1e-5, atol=1e-6):
    assert abs(a - b) <= atol + rtol * abs(b), "%s: %r, the reference %r" % (what, a, b)


def check_parameters(engine, model, ref, first, when):
    """Every parameter against the reference's (a local expert i against its expert first + i)."""
    rank = tessera.comm.get_rank()
    ref_params = dict(ref.named_parameters())
    with engine.gathered_parameters():
        for n, p in model.named_parameters():
            p = tessera.tensor_parallel.full_tensor(p)  # a tensor-parallel slice made whole
            if ".deepspeed_experts." in n:
                head, tail = n.split(".deepspeed_experts.")
                i, rest = tail.split(".", 1)
                n_ref = "%s.deepspeed_experts.%d.%s" % (head, first + int(i), rest)
            else:
                n_ref = n
            q = ref_params[n_ref].detach()
            diff = (p.detach() - q).abs().max().item()
            assert diff <= 1e-6 + 1e-5 * q.abs().max().item(), "rank %d %s, %s: differs from the reference's %s by %g" % (
                rank, when, n, n_ref, diff)


SAVED_AT = 2  # save and load: the checkpoint after this many steps


def main():
    ep, kind, drop, more = int(sys.argv[1]), sys.argv[3], sys.argv[4], sys.argv[5:]
    for stage in (int(s) for s in sys.argv[2].split(",")):
        run_case(ep, stage, kind, drop, more)


def run_case(ep, stage, kind, drop, more):
    drop_tokens = drop == "capacity"
    rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
    tp = 2 if more == ["tp"] else 1
    data_rank, dp = rank // tp, world // tp  # the grid's tensor axis is innermost
    local = EXPERTS // ep
    first = (data_rank % ep) * local  # expert-parallel rank = data rank mod ep (adjacent data ranks)
    model = Net(ep, first, drop_tokens)
    if tp > 1:  # the dense MLP split over the tensor group; the MoE layer stays whole on each tensor rank
        tessera.tensor_parallel.parallelize(model, {"up": "colwise", "down": "rowwise"}, tp_size=tp)
    accumulation = RANKS // dp  # the same 4 micro-batches a step on fewer data ranks
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": accumulation,
              "steps_per_print": 100, "zero_optimization": {"stage": stage, "reduce_bucket_size": 200}}
    if kind == "sgd":
        config["optimizer"] = {"type": "SGD", "params": {"lr": LR[kind]}}
        config["gradient_clipping"] = CLIP
    else:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": LR[kind], "weight_decay": 0.01}}
    if tp > 1:
        config["tensor_parallel"] = {"tp_size": tp}
    if more == ["client"]:
        del config["optimizer"]
        groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                       "name": "all"})
        engine, _, _, _ = tessera.initialize(model=model, config=config, optimizer=optimizer_of(kind, groups))
    else:
        engine, _, _, _ = tessera.initialize(model=model, config=config)
    context = tessera.comm.parallel_context()
    assert engine.dp_rank == data_rank and engine.dp_world_size == dp
    assert context.group_size("ep_size_%d" % ep) == ep and context.group_rank("ep_size_%d" % ep) == data_rank % ep
    assert model.moe.global_expert_index(0) == first
    # The experts' groups are laid out over the ranks that hold the same experts (world / ep of
    # them), the dense ones over every data rank; with AdamW each rank keeps 2 floats per element
    # of its shard: its experts' state is 1/(world/ep) of theirs, not whole (DeepSpeed#7156).
    layouts = engine.group_memory()
    experts = [g for g in layouts if ".deepspeed_experts." in g["first_parameter"]]
    assert experts and len(experts) < len(layouts), layouts
    for g in layouts:
        want_comm, want_ranks = ("ep_size_%d_data" % ep, dp // ep) if g in experts else ("data", dp)
        assert (g["communicator"], g["ranks"]) == (want_comm, want_ranks), g
        partitions = want_ranks if stage > 0 else 1
        assert g["shard_numel"] * partitions == g["numel"], g
        if kind == "adamw":
            assert g["state_bytes"] == 8 * g["shard_numel"], g
    want, ref = reference(kind, drop_tokens)
    start = 0
    if more[:1] == ["load"]:
        engine.load_checkpoint(more[1])
        start = SAVED_AT
        check_parameters(engine, model, reference(kind, drop_tokens, SAVED_AT)[1], first, "after the load")
    for step in range(start, STEPS):
        losses = []
        for a in range(accumulation):
            loss = engine(*batch(step, a * dp + data_rank))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        mean = tessera.comm.all_reduce(torch.tensor([sum(losses) / len(losses)], dtype=torch.float64), "avg",
                                       "world").item()
        close(mean, want[step][0], "step %d loss" % step)
        close(engine.get_global_grad_norm(), want[step][1], "step %d gradient norm" % step)
        if more[:1] == ["save"] and step + 1 == SAVED_AT:
            engine.save_checkpoint(more[1])
    check_parameters(engine, model, ref, first, "at the end")
    if rank == 0:
        print("ok ep %d stage %d %s %s" % (ep, stage, kind, drop), " ".join(more[:1]), flush=True)


if __name__ == "__main__":
    worker_exit.run(main)
