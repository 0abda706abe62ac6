"""The estimator's activation bytes per layer (tessera.estimate) against what autograd saves for
backward in one block of the example GPT (tessera.checkpointing.measure_saved_bytes), on every rank
of a tensor group of the world size: tensor parallelism with and without sequence parallelism, and
full activation checkpointing (with partitioned inputs). fp32, no dropout, SDPA: the estimator's
per-layer term is sbh(16/t' + 48/t) + the log-sum-exp, t' = t under SP else 1; the measured adds
LayerNorm's per-row mean and rstd, which the formula leaves out. Prints one line per case on rank 0
and exits non-zero when one is off by more than 0.5% + LayerNorm's statistics.
"""
import os
import sys

import torch

import tessera
from tessera import checkpointing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python"))
from models import Gpt  # noqa: E402

L, C, H, S, B = 2, 128, 4, 64, 2


def measured(t, sp, ckpt, partition):
    model = Gpt(n_layer=L, n_head=H, n_embd=C, block_size=S)
    checkpointing.reset()
    if t > 1:
        tessera.tensor_parallel.parallelize(model, sequence_parallel=sp)
    if ckpt:
        checkpointing.configure(None, partition_activations=partition)
        checkpointing.checkpoint_modules(model)
    x = torch.randn(B, S, C, requires_grad=True)  # under SP the first block's hook keeps this rank's part
    with checkpointing.measure_saved_bytes() as saved:
        model.transformer.h[0](x)
    return saved["bytes"]


def estimated(t, sp, ckpt, partition):
    request = dict(layers=L, hidden=C, heads=H, seq_len=S, micro_batch=B, vocab=256, precision="fp32",
                   dropout=False, attention="sdpa", tp=t, gpus_per_node=max(t, 1),
                   activation_checkpointing="full" if ckpt else "none")
    if sp:
        request["sequence_parallel"] = True
    if partition:
        request["config"] = {"train_micro_batch_size_per_gpu": B, "tensor_parallel": {"tp_size": t},
                             "activation_checkpointing": {"partition_activations": True}}
    return tessera.estimate(**request)["activations"]["per_layer_bytes"]


def main():
    t = tessera.comm.get_world_size()
    tessera.comm.init_distributed(backend="gloo", tensor_parallel=t)
    rank = tessera.comm.get_rank()
    cases = [(t, False, False, False), (t, True, False, False), (t, True, True, False), (t, False, True, True)]
    if t == 1:
        cases = [(1, False, False, False), (1, False, True, False)]
    layer_norm_stats = 2 * 2 * (S // t) * B * 4  # two norms' mean and rstd, per row of this rank's sequence
    bad = []
    for case in cases:
        got, want = measured(*case), estimated(*case)
        off = abs(got - want)
        ok = off <= 0.005 * want + (layer_norm_stats * (t if not case[1] else 1) if not case[2] else 0)
        if rank == 0:
            print("tp %d sp %-5s ckpt %-5s partition %-5s: measured %8d, estimated %8d bytes (%+.2f%%)%s"
                  % (case[0], case[1], case[2], case[3], got, want, 100.0 * (got - want) / want, "" if ok else "  <- off"))
        if not ok:
            bad.append(case)
    sys.stdout.flush()
    if bad:
        raise SystemExit("activation bytes differ from the estimator in %s" % bad)
    # Leave together and without the interpreter's teardown: torch 2.11's c10d objects sometimes
    # abort ("terminate called without an active exception") when destroyed at interpreter exit
    # after a peer has gone (bench/gpt_train.py does the same).
    tessera.comm.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()  # main ends the process itself, after a barrier
