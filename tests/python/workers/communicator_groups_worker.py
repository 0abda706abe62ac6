"""A param group on a communicator of its own, from Python, on 4 ranks (tests/python/engine/
test_communicator_groups.py): tessera.comm.split_axis("data", [("expert_data", 2), ("expert", 2)])
before initialize; the model's "dense" group is averaged over the 4 data ranks, its "experts" group
(each expert-rank's own weights: ranks r and r+2 hold the same ones) over its 2 expert_data ranks.
Against a reference computed here for every rank (the same seed and batches): SGD without momentum,
no clipping, 3 steps, ZeRO stage from argv; with "client" after it, the groups (and their
"communicator") are a script's torch.optim.SGD's param groups. Prints "ok" on rank 0."""
import sys

import torch
import torch.nn as nn

import tessera
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown

RANKS, WIDTH, MICRO, LR = 4, 8, 2, 0.1


class Model(nn.Module):
    def __init__(self, expert_rank):
        super().__init__()
        torch.manual_seed(5)
        self.dense = nn.Linear(WIDTH, WIDTH)
        torch.manual_seed(100 + expert_rank)  # the experts differ across the expert axis
        self.expert = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x, y):
        return ((self.expert(torch.tanh(self.dense(x))) - y) ** 2).mean()


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(MICRO, WIDTH, generator=g), torch.randn(MICRO, WIDTH, generator=g)


def reference(steps):
    """Every rank's model trained by hand: dense gradients averaged over all 4 ranks, the experts'
    over ranks with the same expert rank (data rank r: expert rank r % 2, expert_data rank r // 2)."""
    models = [Model(r % 2) for r in range(RANKS)]
    for step in range(steps):
        grads = []
        for r, m in enumerate(models):
            m.zero_grad()
            m(*batch(step, r)).backward()
            grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
        for r, m in enumerate(models):
            with torch.no_grad():
                for n, p in m.named_parameters():
                    peers = range(RANKS) if n.startswith("dense") else [q for q in range(RANKS) if q % 2 == r % 2]
                    p -= LR * sum(grads[q][n] for q in peers) / len(peers)
    return models


def main():
    stage = int(sys.argv[1])
    tessera.comm.split_axis("data", [("expert_data", 2), ("expert", 2)])
    rank = tessera.comm.get_rank()
    model = Model(rank % 2)
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 100,
              "optimizer": {"type": "SGD", "params": {"lr": LR}}, "zero_optimization": {"stage": stage}}
    groups = [{"params": list(model.dense.parameters()), "name": "dense"},
              {"params": [model.expert.weight], "name": "experts", "communicator": "expert_data"}]
    if len(sys.argv) > 2 and sys.argv[2] == "client":  # the groups on a script's torch.optim.SGD
        del config["optimizer"]
        engine, _, _, _ = tessera.initialize(model=model, config=config, optimizer=torch.optim.SGD(groups, lr=LR))
    else:
        engine, _, _, _ = tessera.initialize(model=model, config=config, model_parameters=groups)
    assert tessera.comm.parallel_context().group_size("expert_data") == 2
    assert tessera.comm.parallel_context().group_rank("expert_data") == rank // 2
    steps = 3
    for step in range(steps):
        loss = engine(*batch(step, rank))
        engine.backward(loss)
        engine.step()
    want = reference(steps)[rank]
    with engine.gathered_parameters():
        for (n, p), q in zip(model.named_parameters(), want.parameters()):
            diff = (p.detach() - q.detach()).abs().max().item()
            assert diff < 1e-6, "rank %d, %s: differs from the reference by %g" % (rank, n, diff)
    # The experts stay different across the expert axis (a data-group average would make them equal).
    other = tessera.comm.all_reduce(model.expert.weight.detach().clone(), "sum", "expert")
    assert not torch.allclose(other / 2, model.expert.weight.detach()), "the experts were averaged over 'expert'"
    if rank == 0:
        print("ok stage %d" % stage, flush=True)


if __name__ == "__main__":
    worker_exit.run(main)
