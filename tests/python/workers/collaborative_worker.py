"""One peer of a collaborative run (tests/python/collaborative/): parity_worker's TinyNet through
tessera.initialize (AdamW) and tessera.collaborative.Collaboration. Writes a JSON file: per round,
this peer's parameters just before it, its weight (samples since the last round), the group's size
and the parameters after it; with --eval, the loss on a fixed batch after each step.

  collaborative_worker.py SPEC.json OUT.json

SPEC: {"run_id", "peer" (index: its data and seed), "steps", "samples" (per rank and step), "target",
       "maddrs_out": file to write this peer's DHT addresses to (the first peer), "maddrs_in": file
       to read initial peers from, "min_group", "outer_lr", "compression", "stage", "wait_rounds":
       after its steps, keep calling step(0) until this many rounds ran, "step_delay": seconds
       between steps, "die_after_rounds": SIGKILL itself at the step after this many rounds,
       "host": the address its DHT listens on (127.0.0.1)}
Besides OUT.json (rank 0's), OUT.json.rounds holds the number of rounds so far, and every rank
writes its final parameters to OUT.json.rankN."""
import json
import os
import signal
import sys
import time

import torch

import tessera
import tessera.collaborative
from parity_worker import TinyNet, global_batch


def flat_parameters(engine):
    with engine.gathered_parameters():
        return torch.cat([p.detach().float().reshape(-1) for p in engine.module.parameters()])


def main():
    spec = json.load(open(sys.argv[1]))
    out_path = sys.argv[2]
    micro = spec["samples"]
    config = {"train_micro_batch_size_per_gpu": micro, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
              "zero_optimization": {"stage": spec.get("stage", 0)}}
    engine, _, _, _ = tessera.initialize(model=TinyNet(7), config=config)
    initial = []
    if spec.get("maddrs_in"):
        while not os.path.exists(spec["maddrs_in"]):
            time.sleep(0.1)
        initial = json.load(open(spec["maddrs_in"]))
    collab = tessera.collaborative.Collaboration(
        engine, run_id=spec["run_id"], target_batch_size=spec["target"], initial_peers=initial,
        outer_lr=spec.get("outer_lr"), compression=spec.get("compression", "none"),
        min_group_size=spec.get("min_group", 2), matchmaking_time=spec.get("matchmaking", 3.0),
        averaging_timeout=spec.get("timeout", 20.0), host_maddrs=["/ip4/%s/tcp/0" % spec.get("host", "127.0.0.1")])
    if spec.get("maddrs_out") and tessera.comm.get_rank() == 0:
        tmp = spec["maddrs_out"] + ".tmp"
        json.dump(collab.visible_maddrs(), open(tmp, "w"))
        os.replace(tmp, spec["maddrs_out"])
    result = {"rounds": [], "joined_epoch": collab.local_epoch, "joined": flat_parameters(engine).tolist()}
    dp, me = engine.dp_world_size, engine.dp_rank
    case = {"micro": micro, "gas": 1, "dp": dp, "seed": 100 + spec["peer"]}  # the peer's batch: micro per rank

    rank = tessera.comm.get_rank()

    def collab_step(samples):
        before = flat_parameters(engine)
        if collab.step(samples):
            r = dict(collab.rounds[-1])
            r.update(before=before.tolist(), after=flat_parameters(engine).tolist(), epoch_after=collab.local_epoch)
            result["rounds"].append(r)
            if rank == 0:
                with open(out_path + ".rounds.tmp", "w") as f:
                    f.write(str(len(result["rounds"])))
                os.replace(out_path + ".rounds.tmp", out_path + ".rounds")

    for step in range(spec["steps"]):
        if spec.get("die_after_rounds") is not None and len(result["rounds"]) >= spec["die_after_rounds"]:
            os.kill(os.getpid(), signal.SIGKILL)  # a peer gone mid-run, without a word to the others
        x, y = global_batch(case, step)
        rows = slice(me * micro, (me + 1) * micro)
        loss = engine(x[rows], y[rows])
        engine.backward(loss)
        engine.step()
        collab_step(micro * dp)
        if spec.get("step_delay"):
            time.sleep(spec["step_delay"])
    deadline = time.time() + spec.get("wait_seconds", 60)
    while len(result["rounds"]) < spec.get("wait_rounds", 0) and time.time() < deadline:
        collab_step(0)
        time.sleep(0.1)
    result["final"] = flat_parameters(engine).tolist()
    json.dump(result["final"], open(out_path + ".rank%d" % rank, "w"))
    if rank == 0:
        json.dump(result, open(out_path, "w"))
    collab.shutdown()


if __name__ == "__main__":
    sys.exit(main())
