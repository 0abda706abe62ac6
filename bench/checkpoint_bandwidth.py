"""Checkpoint save and load bandwidth against the disk's own, measured in the same run (issue 18).

Every rank builds the example GPT (examples/python/models.py), takes one AdamW step (so the
moments are not zeros), then, timed between barriers:
  raw write   each rank writes as many bytes as its checkpoint file holds, in 64 MiB writes, then
              fsync: what the disk gives a plain sequential writer with the same parallelism
  save        engine.save_checkpoint (safetensors files, checksums, fsyncs, rename, latest)
  raw read    each rank reads its raw file back (the page cache is dropped first when permitted)
  load        engine.load_checkpoint of the same checkpoint (every tensor's checksum verified)
Rank 0 prints the bytes, each bandwidth and the ratios save/raw write and load/raw read.

Then the cost of a save to the training around it (checkpoint.async_save, issue 46), each timed
between barriers over the same --steps training steps (micro-batch --micro of --seq tokens):
  steps             the steps alone
  + sync save       a synchronous save, then the steps
  + async save      save_checkpoint(async_save=True), the steps while its thread writes, then
                    wait_for_checkpoint(); also the save call alone (the host copy) and whether
                    the write had ended when the steps did
printed with their ratios to the steps alone.

  tessera launch --nproc-per-node 2 -- python bench/checkpoint_bandwidth.py [--dir D] [--stage 1]
        [--layers 12 --embd 768 --heads 12] [--rounds 3] [--steps 8 --micro 4 --seq 256]
"""
import argparse
import json
import os
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
import tessera  # noqa: E402
from models import Gpt  # noqa: E402

CHUNK = 64 << 20


def drop_page_cache():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def raw_write(path, nbytes):
    buf = os.urandom(1 << 20) * 64
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = nbytes
    while left > 0:
        left -= os.write(fd, memoryview(buf)[:min(CHUNK, left)])
    os.fsync(fd)
    os.close(fd)


def raw_read(path):
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, CHUNK):
        pass
    os.close(fd)


def timed(fn):
    tessera.comm.barrier()
    start = time.perf_counter()
    fn()
    tessera.comm.barrier()
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/tessera_ckpt_bench")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    a = ap.parse_args()
    model = Gpt(vocab=50304, block_size=a.seq, n_layer=a.layers, n_head=a.heads, n_embd=a.embd, seed=1)
    config = {"train_micro_batch_size_per_gpu": a.micro, "steps_per_print": 1000,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": a.stage}}
    engine, _, _, _ = tessera.initialize(model=model, config=config)
    x = torch.randint(0, 50304, (a.micro, a.seq + 1))

    def train(steps):
        for _ in range(steps):
            engine.backward(engine(x[:, :-1], x[:, 1:]))
            engine.step()

    train(1)
    rank = tessera.comm.get_rank()
    params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        shutil.rmtree(a.dir, ignore_errors=True)
        os.makedirs(a.dir)
    tessera.comm.barrier()
    rows = []
    for r in range(a.rounds):
        save_s = timed(lambda: engine.save_checkpoint(a.dir, tag="round%d" % r))
        ckpt = os.path.join(a.dir, "round%d" % r)
        mine = os.path.getsize(os.path.join(ckpt, "rank%05d.safetensors" % rank))
        total = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
        raw = os.path.join(a.dir, "raw%d.bin" % rank)
        write_s = timed(lambda: raw_write(raw, mine))
        dropped = drop_page_cache()
        read_s = timed(lambda: raw_read(raw))
        drop_page_cache()
        load_s = timed(lambda: engine.load_checkpoint(a.dir, tag="round%d" % r))
        os.remove(raw)
        rows.append((total, save_s, write_s, load_s, read_s, dropped))
        if r > 0 and rank == 0:
            shutil.rmtree(os.path.join(a.dir, "round%d" % (r - 1)))
    # The cost of a save to the steps around it.
    steps_s, sync_s, async_s, call_s, pending_after = [], [], [], [], []
    for r in range(a.rounds):
        steps_s.append(timed(lambda: train(a.steps)))
        sync_s.append(timed(lambda: (engine.save_checkpoint(a.dir, tag="sync%d" % r), train(a.steps))))
        start = time.perf_counter()

        def async_round():
            engine.save_checkpoint(a.dir, tag="async%d" % r, async_save=True)
            call_s.append(time.perf_counter() - start)
            train(a.steps)
            pending_after.append(engine.checkpoint_in_flight())
            engine.wait_for_checkpoint()
        tessera.comm.barrier()
        start = time.perf_counter()
        async_s.append(timed(async_round))
        if rank == 0:
            for tag in ("sync%d" % r, "async%d" % r):
                shutil.rmtree(os.path.join(a.dir, tag), ignore_errors=True)
    if rank == 0:
        print("checkpoint bandwidth: GPT %.1fM parameters, AdamW, ZeRO %d, %d ranks, %s" %
              (params / 1e6, a.stage, tessera.comm.get_world_size(), a.dir))
        for total, save_s, write_s, load_s, read_s, dropped in rows:
            gb = total / 1e9
            print("  %.3f GB  save %.2f s (%.2f GB/s) raw write %.2f s (%.2f GB/s) ratio %.2f | "
                  "load %.2f s (%.2f GB/s) raw read %.2f s (%.2f GB/s) ratio %.2f%s" %
                  (gb, save_s, gb / save_s, write_s, gb / write_s, write_s / save_s,
                   load_s, gb / load_s, read_s, gb / read_s, read_s / load_s,
                   "" if dropped else " (page cache not dropped: reads may come from memory)"))
        print("save during training: %d steps of micro-batch %d x %d tokens" % (a.steps, a.micro, a.seq))
        for r in range(a.rounds):
            print("  steps %.2f s | + sync save %.2f s (%.3fx) | + async save %.2f s (%.3fx), the call %.3f s, "
                  "written %s the steps" % (steps_s[r], sync_s[r], sync_s[r] / steps_s[r], async_s[r],
                                            async_s[r] / steps_s[r], call_s[r],
                                            "after" if pending_after[r] else "before the end of"))
        print(json.dumps({"rows": rows, "steps_s": steps_s, "sync_s": sync_s, "async_s": async_s, "call_s": call_s}))
    engine.close()


if __name__ == "__main__":
    main()
