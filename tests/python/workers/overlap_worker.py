"""Run by test_api.py on 2 ranks: ZeRO 2 with overlap_comm and the module's units. After step() the
allgather of the updated parameters is in flight; the next forward waits unit by unit and the
losses match a run without overlap_comm; state_dict() waits, and then every rank holds the same
parameters. Prints one JSON line on rank 0."""
import json
import time

import torch
import torch.nn as nn

import tessera
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def run(overlap):
    config = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": 2, "overlap_comm": overlap, "reduce_bucket_size": 1200}}
    start = time.perf_counter()  # the first forward's time counts from the engine's construction
    engine, _, _, _ = tessera.initialize(model=Net(), config=config)
    g = torch.Generator().manual_seed(1 + engine.dp_rank)
    losses, in_flight = [], []
    for _ in range(4):
        x, y = torch.randn(4, 32, generator=g), torch.randn(4, 4, generator=g)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        in_flight.append(engine._c.parameters_in_flight)
        losses.append(loss.item())
    state = engine.state_dict()  # waits for the allgathers
    after = engine._c.parameters_in_flight
    breakdown = (engine.wall_clock_breakdown(), time.perf_counter() - start)
    flat = torch.cat([t.reshape(-1) for t in state.values()])
    same = flat.clone()
    tessera.comm.broadcast(same, src=0)
    return losses, in_flight, after, bool(torch.equal(flat, same)), breakdown


def main():
    plain = run(False)
    overlap = run(True)
    if tessera.comm.get_rank() == 0:
        print(json.dumps({"losses_plain": plain[0], "losses_overlap": overlap[0], "in_flight_plain": plain[1],
                          "in_flight_overlap": overlap[1], "after_state_dict": overlap[2],
                          "ranks_agree": overlap[3] and plain[3], "breakdowns": [plain[4], overlap[4]]}), flush=True)
    return 0


if __name__ == "__main__":
    worker_exit.run(main)
