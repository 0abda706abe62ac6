"""The DeepSpeed import test's runs (tests/python/checkpoint/test_deepspeed_import.py), one per launch:

    tessera launch --nproc-per-node 2 -- <deepspeed venv python> deepspeed_checkpoint_worker.py deepspeed SPEC OUT
    tessera launch --nproc-per-node 2 -- <project python> deepspeed_checkpoint_worker.py tessera SPEC OUT

Both build the same small example GPT from one seed and train it on the same global batches of the
`fortunes` corpus (rank r of W takes rows [r·micro, (r+1)·micro) of each micro step's global
batch), with one DeepSpeed config (AdamW, WarmupLR, gradient clipping, accumulation, the spec's
ZeRO stage and dtype).

  deepspeed  trains spec["steps"] steps, saves a checkpoint into spec["save_dir"], loads it back
             (DeepSpeed's own load), trains spec["more"] steps and records their losses
  tessera    loads spec["load_dir"] (a checkpoint `tessera checkpoint import-deepspeed` wrote) at
             its own ZeRO stage spec["tessera_stage"] (and its own number of ranks, spec["micro"]
             scaled to keep the global batch), trains spec["more"] steps and records their losses

Rank 0 writes {"losses": [...], "steps", "skipped", "lr", "scale": the counters, the next step's
learning rate and the loss scale at the end}, and DeepSpeed also "before" (the losses before its
save) and "at_save" (its skipped steps and loss scaler's state when it saved).
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
from data import FortunesCorpus  # noqa: E402
from models import Gpt  # noqa: E402

SEQ = 32


def ds_config(spec, stage):
    c = {"train_micro_batch_size_per_gpu": spec["micro"], "gradient_accumulation_steps": spec["accumulation"],
         "gradient_clipping": 1.0, "steps_per_print": 1000000,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.1, "torch_adam": True}},
         "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                      "warmup_num_steps": 40}},
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 5000, "allgather_bucket_size": 5000,
                               "stage3_param_persistence_threshold": 0}}
    if spec["dtype"] == "bf16":
        c["bf16"] = {"enabled": True}
    elif spec["dtype"] == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 20, "loss_scale_window": 1000, "hysteresis": 2}
    return c


def model_and_groups(spec):
    model = Gpt(vocab=256, block_size=SEQ, n_layer=2, n_head=2, n_embd=32, seed=spec["seed"])
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2]},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    return model, groups


def train(engine, corpus, spec, rank, world, first_step, steps, all_reduce):
    """steps optimizer steps from global step first_step; the losses averaged over the ranks."""
    micro, acc = spec["micro"], spec["accumulation"]
    losses = []
    for step in range(first_step, first_step + steps):
        total = 0.0
        for m in range(acc):
            x, y = corpus.sample(micro * world, SEQ, step * acc + m, seed=spec["seed"])
            x, y = x[rank * micro:(rank + 1) * micro], y[rank * micro:(rank + 1) * micro]
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.float().item() / acc
        t = torch.tensor([total], dtype=torch.float64)
        all_reduce(t)
        losses.append(t.item() / world)
    return losses


def run_deepspeed(spec):
    import deepspeed
    import torch.distributed as dist
    if spec["dtype"] == "fp16":
        # DeepSpeed's CPU accelerator refuses fp16 by a capability flag; its fp16 optimizers and loss
        # scaler run on the CPU all the same (torch has fp16 CPU kernels), so the flag is lifted.
        from deepspeed.accelerator import get_accelerator
        get_accelerator().is_fp16_supported = lambda: True
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, groups = model_and_groups(spec)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups,
                                           config=ds_config(spec, spec["stage"]))
    corpus = FortunesCorpus()
    before = train(engine, corpus, spec, rank, world, 0, spec["steps"], dist.all_reduce)
    scaler = engine.optimizer.loss_scaler
    at_save = {"skipped": engine.skipped_steps, "scale": float(scaler.cur_scale),
               **{k: int(getattr(scaler, k)) for k in ("cur_iter", "last_overflow_iter", "cur_hysteresis")
                  if hasattr(scaler, k)}}
    engine.save_checkpoint(spec["save_dir"])
    engine.load_checkpoint(spec["save_dir"])
    after = train(engine, corpus, spec, rank, world, engine.global_steps, spec["more"], dist.all_reduce)
    result = {"before": before, "at_save": at_save, "losses": after, "steps": engine.global_steps,
              "lr": engine.get_lr()[0], "skipped": engine.skipped_steps,
              "scale": float(engine.optimizer.loss_scaler.cur_scale)}
    dist.barrier()
    return rank, result


def run_tessera(spec):
    import tessera
    model, groups = model_and_groups(spec)
    engine, _, _, _ = tessera.initialize(model=model, model_parameters=groups,
                                         config=ds_config(spec, spec["tessera_stage"]))
    rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
    engine.load_checkpoint(spec["load_dir"])
    after = train(engine, FortunesCorpus(), spec, rank, world, engine.global_steps, spec["more"], tessera.comm.all_reduce)
    result = {"losses": after, "steps": engine.global_steps, "lr": engine.get_lr()[0],
              "skipped": engine.skipped_steps, "scale": float(engine.loss_scale)}
    engine.close()
    return rank, result


def main():
    impl, spec_path, out_path = sys.argv[1:4]
    spec = json.load(open(spec_path))
    torch.manual_seed(spec["seed"])
    rank, result = (run_deepspeed if impl == "deepspeed" else run_tessera)(spec)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
