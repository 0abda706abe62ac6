"""Baseline for bench_collectives: the same collectives through torch.distributed (Gloo).

Run under a launcher that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (tessera launch or torchrun).
Rank 0 prints one JSON object per result, in bench_collectives' format with "impl": "torch".
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def time_it(iterations, op):
    op()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        op()
    dist.barrier()
    return (time.perf_counter() - start) / iterations


def main():
    max_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    mb = 1
    while mb <= max_mb:
        nbytes = mb << 20
        elements = nbytes // 4
        iterations = 20 if mb <= 4 else 5 if mb <= 64 else 2
        full = torch.ones(elements)
        piece = torch.ones(elements // n)
        cases = [
            ("allreduce", 2.0 * (n - 1) / n, lambda: dist.all_reduce(full)),
            ("reduce_scatter", (n - 1) / n, lambda: dist.reduce_scatter_tensor(piece, full)),
            ("allgather", (n - 1) / n, lambda: dist.all_gather_into_tensor(full, piece)),
        ]
        for name, factor, op in cases:
            try:
                seconds = time_it(iterations, op)
            except RuntimeError as e:  # older Gloo lacks reduce_scatter
                if rank == 0:
                    print(json.dumps({"impl": "torch", "collective": name, "ranks": n, "bytes": nbytes,
                                      "error": str(e).splitlines()[0]}), flush=True)
                continue
            if rank == 0:
                print(json.dumps({"impl": "torch", "collective": name, "ranks": n, "bytes": nbytes,
                                  "seconds": round(seconds, 6),
                                  "busbw_gbps": round(nbytes * factor / seconds / 1e9, 3)}), flush=True)
        mb *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
