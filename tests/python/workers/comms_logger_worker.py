"""The comms logger's run (tests/python/comms/test_comms_logger.py): a small MLP on 2 ranks at ZeRO
2 (its gradients reduce-scattered and its parameters all-gathered over the data group) with
comms_logger enabled and verbose, 3 steps; then every rank calls log_summary(show_straggler=True,
return_dict=True). Rank 0 writes {"summary": the dict, "stats": {group: the communicator's own
per-collective statistics}}.

    tessera launch --nproc-per-node 2 -- python comms_logger_worker.py OUT
"""
import json
import sys

import torch

import tessera
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": 500},
              "comms_logger": {"enabled": True, "verbose": True}}
    engine, _, _, _ = tessera.initialize(model=model, config=config)
    for step in range(3):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step * 10 + engine.global_rank))
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    context = tessera.comm.parallel_context()
    stats = {g: {op: list(v) for op, v in context.stats(g).items()} for g in ("world", "data")}
    result = engine.comms_logger.log_summary(show_straggler=True, return_dict=True)
    if engine.global_rank == 0:
        summary = {g: {"size": s["size"], "ops": {op: {str(k): v for k, v in rows.items()} for op, rows in s["ops"].items()}}
                   for g, s in result["summary"].items()}
        with open(sys.argv[1], "w") as f:
            json.dump({"summary": summary, "stats": stats, "straggler": result["straggler_analysis"]}, f)
    engine.close()


if __name__ == "__main__":
    worker_exit.run(main)
