"""For test_interrupt.py. `train`: trains a small model forever, printing "ready" once training has
begun; `late`: rank 1 sleeps before joining, so rank 0 waits in the rendezvous; `die`: rank 1 exits
at step 3 and rank 0 prints the error it gets."""
import os
import sys
import time

import torch
import torch.nn as nn

import tessera


def main():
    mode = sys.argv[1]
    if mode == "late" and tessera.comm.get_rank() == 1:
        print("rank 1 sleeping", flush=True)
        time.sleep(120)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    engine, _, _, _ = tessera.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 64, "steps_per_print": 10 ** 6,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}})
    step = 0
    while True:
        if mode == "die" and step == 3 and tessera.comm.get_rank() == 1:
            os._exit(3)
        x = torch.randn(64, 256)
        loss = (engine(x) - x).pow(2).mean()
        try:
            engine.backward(loss)
            engine.step()
        except tessera.CommError as e:
            if mode != "die":
                raise
            print("error type %s\n%s" % (type(e).__name__, e), flush=True)
            sys.exit(1)
        step += 1
        if step == 3:
            print("ready rank %d" % engine.global_rank, flush=True)


if __name__ == "__main__":
    main()  # no KeyboardInterrupt handler: what an ordinary user script does
