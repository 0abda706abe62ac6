"""A job that survives restarts (tests/python/launch/test_restarts.py, test_cluster.py): parity_worker's
TinyNet through tessera.initialize at ZeRO-2, a checkpoint after every optimizer step
(checkpoint.save_interval 1) and checkpoint.auto_resume, so a restarted job continues from its latest
checkpoint by itself. Each step's global batch is a function of the step alone (engine.global_steps
after the resume), so a resumed job sees the batches an uninterrupted one would. Rank 0 prints
"step N loss L" (L exact, repr) for every step it trains.

  restart_worker.py SAVE_DIR STEPS [--die-at K] [--hang-at K] [--every-attempt] [--rank R]
                    [--no-fresh-start] [--elastic]

--die-at K: rank R (1) kills itself (SIGKILL) as it starts step K (once --wait-for's file exists,
when given); --hang-at K: it stops itself (SIGSTOP), a hang only the launcher's hang_timeout_s can see. Only on the first attempt
(TESSERA_RESTART_COUNT unset) unless --every-attempt. --no-fresh-start: checkpoint.
start_fresh_if_missing false (a missing checkpoint is an error). --elastic: DeepSpeed's elasticity
section decides the batch layout (a global batch of 8: micro-batch 2 × 1 step on 4 ranks, × 2
steps on 2), so the job goes on at another world size with the same batches."""
import argparse
import os
import signal
import time

import torch

import tessera
from parity_worker import TinyNet, global_batch
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("save_dir")
    ap.add_argument("steps", type=int)
    ap.add_argument("--die-at", type=int)
    ap.add_argument("--hang-at", type=int)
    ap.add_argument("--every-attempt", action="store_true")
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--no-fresh-start", action="store_true")
    ap.add_argument("--elastic", action="store_true")
    ap.add_argument("--wait-for", help="--die-at/--hang-at happen once this file exists (the test's go)")
    args = ap.parse_args()
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
              "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": 300},
              "checkpoint": {"save_interval": 1, "save_dir": args.save_dir, "auto_resume": True,
                             "start_fresh_if_missing": not args.no_fresh_start}}
    if args.elastic:
        del config["train_batch_size"], config["train_micro_batch_size_per_gpu"]
        config["elasticity"] = {"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": [2], "version": 0.2}
    engine, _, _, _ = tessera.initialize(model=TinyNet(7), config=config)
    dp, me, micro = engine.dp_world_size, engine.dp_rank, engine.train_micro_batch_size_per_gpu()
    gas = engine.gradient_accumulation_steps()
    first_attempt = "TESSERA_RESTART_COUNT" not in os.environ
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        print("layout: batch %d = micro %d x steps %d x ranks %d%s" % (engine.train_batch_size(), micro, gas, dp,
              " (elastic)" if engine.elasticity_enabled() else ""), flush=True)
    case = {"micro": engine.train_batch_size(), "gas": 1, "dp": 1, "seed": 7}
    for step in range(engine.global_steps, args.steps):
        if rank == args.rank and (first_attempt or args.every_attempt):
            while args.wait_for and step in (args.die_at, args.hang_at) and not os.path.exists(args.wait_for):
                time.sleep(0.05)
            if step == args.die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == args.hang_at:
                os.kill(os.getpid(), signal.SIGSTOP)
        x, y = global_batch(case, step)
        total = 0.0
        for m in range(gas):
            rows = slice((m * dp + me) * micro, (m * dp + me + 1) * micro)
            loss = engine(x[rows], y[rows])
            engine.backward(loss)
            engine.step()
            total += loss.item()
        mean = tessera.comm.all_reduce(torch.tensor([total / gas], dtype=torch.float64), "avg", "data").item()
        if rank == 0:
            print("step %d loss %r" % (step, mean), flush=True)


if __name__ == "__main__":
    worker_exit.run(main)
