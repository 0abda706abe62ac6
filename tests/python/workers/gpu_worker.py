"""One single-GPU parity run for test_gpu.py, in its own process (NCCL, world size 1: the process
groups of a pytest process may already be Gloo's). Trains the example GPT on cuda:0 through tessera
and through a plain PyTorch loop from the same weights and batches, and prints one JSON line.

    python tests/python/workers/gpu_worker.py --stage 2 --optimizer AdamW --dtype bf16

The plain loop: fp32 -> the model itself with torch.optim (AdamW / SGD with momentum) and
clip_grad_norm_; bf16 -> the model in bf16 with fp32 master copies that torch.optim updates from
the bf16 gradients widened to fp32, then copied back (what DeepSpeed's bf16 mode does); the
module's (bf16) parameters are compared. With --delayed N (offload_optimizer.delayed_param_update)
the plain loop steps fp32 master copies in both dtypes and, after N steps, copies them into the
model just before each step rather than after it, so each forward and backward runs one update
behind (ZeRO-Offload's DPU); the last update reaches the model at the end. With --async-save DIR the
engine then saves asynchronously, steps once more while the file is written, and loads the save back.
Before each of tessera's steps after the first, the worker writes "tessera-step N" to stderr; CUDA's
sync debug mode ("warn") writes a line for each synchronizing call, so the test counts them.
"""
import argparse
import copy
import json
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))
from models import Gpt  # noqa: E402

import tessera  # noqa: E402


def groups(model, weight_decay):
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def batches(args):
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    return [torch.randint(256, (args.micro, args.seq + 1), device=args.device, generator=gen) for _ in range(args.steps)]


def torch_optimizer(params, args):
    if args.optimizer == "SGD":
        return torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def reference_run(model, data, args):
    losses = []
    if args.dtype == "fp32" and args.delayed is None:
        params = list(model.parameters())
        optimizer = torch_optimizer(groups(model, args.weight_decay), args)
        for tokens in data:
            loss = model(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            if args.clip > 0:  # 0: no clipping, as gradient_clipping 0 means
                torch.nn.utils.clip_grad_norm_(params, args.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses, [p.detach().float() for p in params]
    master = {id(p): p.detach().clone().float().requires_grad_() for p in model.parameters()}
    if args.dtype == "bf16":
        model.to(torch.bfloat16)
    params = list(model.parameters())
    master_groups = [{"params": [master[id(p)] for p in g["params"]], "weight_decay": g["weight_decay"]}
                     for g in groups(model, args.weight_decay)]
    # model.to() keeps the Parameter objects, so ids still match
    optimizer = torch_optimizer(master_groups, args)
    masters = [master[id(p)] for p in params]

    def to_model():
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m)
    for step, tokens in enumerate(data, start=1):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        for p, m in zip(params, masters):
            m.grad = p.grad.float()
            p.grad = None
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(masters, args.clip)
        delayed = args.delayed is not None and step > args.delayed
        if delayed:
            to_model()  # the update before this one reaches the model now; this one at the next step
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not delayed:
            to_model()
        losses.append(loss.item())
    to_model()
    return losses, [p.detach().float() for p in params]


def tessera_run(model, data, args):
    optimizer = {"type": args.optimizer, "params": {"lr": args.lr}}
    if args.optimizer == "SGD":
        optimizer["params"]["momentum"] = 0.9
    else:
        optimizer["params"].update(betas=[0.9, 0.95], eps=1e-8)
    if args.optimizer == "OneBitAdam":  # compressed from step 3 on
        optimizer["params"]["freeze_step"] = 2
    config = {"train_micro_batch_size_per_gpu": args.micro, "gradient_clipping": args.clip,
              "steps_per_print": 10**9, "optimizer": optimizer, "bf16": {"enabled": args.dtype == "bf16"},
              "zero_optimization": {"stage": args.stage, "reduce_bucket_size": args.bucket,
                                    "allgather_bucket_size": args.bucket, "overlap_comm": True,
                                    # ZeRO-3: every parameter partitioned and each block released
                                    # after use (the defaults would keep this small model whole)
                                    "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
                                    "stage3_prefetch_bucket_size": args.bucket}}
    if args.comm_dtype:
        config["communication_data_type"] = args.comm_dtype
    if args.offload in ("pinned", "pageable"):  # ZeRO-Offload: master, state and gradient copy in host memory
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": args.offload == "pinned"}
    elif args.offload == "nvme":  # and the state (the master in bf16) on in files, in small tiles
        config["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": args.nvme_path,
                                                            "pin_memory": True, "buffer_count": 4,
                                                            "pipeline_read": True, "pipeline_write": True}
        config["zero_optimization"]["sub_group_size"] = 5000
    if args.delayed is not None:  # ZeRO-Offload's delayed parameter update after args.delayed steps
        config["zero_optimization"]["offload_optimizer"]["delayed_param_update"] = {"enabled": True,
                                                                                   "warmup_steps": args.delayed}
    if args.super_offload:  # each bucket's host step speculated during the backward, validated at the step
        config["zero_optimization"]["offload_optimizer"]["super_offload"] = True
    if args.offload_param == "cpu":  # ZeRO-3's shards in host memory too
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    elif args.offload_param == "nvme":  # or in files, read around each gather and each step
        config["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": args.param_path,
                                                        "buffer_count": 3}
    engine, _, _, _ = tessera.initialize(model=model, config=config, model_parameters=groups(model, args.weight_decay))
    tessera_run.allocated_after_init = torch.cuda.memory_allocated() if args.device == "cuda" else 0
    losses = []
    for step, tokens in enumerate(data):
        if step > 0 and args.count_syncs:
            print("tessera-step %d" % step, file=sys.stderr, flush=True)
            torch.cuda.set_sync_debug_mode("warn")
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()
        if args.count_syncs:
            torch.cuda.set_sync_debug_mode("default")
        losses.append(loss.item())
    print("tessera-done", file=sys.stderr, flush=True)
    tessera_run.checkpoint_max_abs = None
    if args.async_save:
        # An asynchronous save (its image pinned, copied from the device), a step that changes every
        # buffer while the thread writes, then the checkpoint loaded back: the parameters at the save.
        with engine.gathered_parameters():
            saved = [p.detach().float().clone() for p in engine.module.parameters()]
        engine.save_checkpoint(args.async_save, tag="async", async_save=True)
        engine.backward(engine(data[0][:, :-1], data[0][:, 1:]))
        engine.step()
        engine.wait_for_checkpoint()
        engine.load_checkpoint(args.async_save, tag="async")
        with engine.gathered_parameters():
            loaded = [p.detach().float().clone() for p in engine.module.parameters()]
        tessera_run.checkpoint_max_abs = max((a - b).abs().max().item() for a, b in zip(saved, loaded))
    tessera_run.speculation = engine.speculation_counts()
    with engine.gathered_parameters():  # ZeRO-3: whole while read (no-op at stages 0-2)
        params = [p.detach().float().clone() for p in engine.module.parameters()]
    return losses, params, engine.device.type


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=0)
    ap.add_argument("--optimizer", choices=("AdamW", "SGD", "OneBitAdam"), default="AdamW",
                    help="OneBitAdam: no plain-PyTorch reference (the test compares backends)")
    ap.add_argument("--backend", choices=("auto", "gloo"), default="auto",
                    help="gloo: the collectives staged through host memory instead of NCCL")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--bucket", type=int, default=20000, help="small: several buckets")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--comm-dtype", choices=("fp32", "bf16", "fp16"), help="communication_data_type")
    ap.add_argument("--count-syncs", action="store_true")
    ap.add_argument("--offload", choices=("pinned", "pageable", "nvme"),
                    help="zero_optimization.offload_optimizer.device cpu, with pin_memory true or false; or nvme")
    ap.add_argument("--nvme-path", help="offload_optimizer.nvme_path with --offload nvme")
    ap.add_argument("--offload-param", nargs="?", const="cpu", choices=("cpu", "nvme"),
                    help="offload_param.device (stage 3): cpu (the default), or nvme with --param-path")
    ap.add_argument("--param-path", help="offload_param.nvme_path with --offload-param nvme")
    ap.add_argument("--delayed", type=int, help="offload_optimizer.delayed_param_update after this many steps")
    ap.add_argument("--super-offload", action="store_true", help="offload_optimizer.super_offload (the host step "
                    "speculated during the backward)")
    ap.add_argument("--async-save", help="a directory: save asynchronously after training, step, load it back")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the worker itself (TESSERA_HOST_STAGING=1)")
    args = ap.parse_args()
    warnings.simplefilter("always")  # every synchronizing call, not the first per line
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.backend == "gloo":
        tessera.init_distributed(dist_backend="gloo")
    model = Gpt(vocab=256, block_size=args.seq, n_layer=2, n_head=4, n_embd=64, seed=args.seed, device=args.device)
    reference = copy.deepcopy(model)
    data = batches(args)
    got_losses, got_params, device = tessera_run(model, data, args)
    if args.optimizer == "OneBitAdam":
        print(json.dumps({"device": device, "backend": tessera.comm.parallel_context().backend, "losses": got_losses,
                          "params": [p.flatten().tolist() for p in got_params]}), flush=True)
        return
    ref_losses, ref_params = reference_run(reference, data, args)
    print(json.dumps({
        "device": device,
        "numel": sum(p.numel() for p in reference.parameters()),
        "allocated_after_init": tessera_run.allocated_after_init,
        "losses": got_losses, "reference_losses": ref_losses,
        "loss_max_abs": max(abs(a - b) for a, b in zip(got_losses, ref_losses)),
        "param_max_abs": max((a - b).abs().max().item() for a, b in zip(got_params, ref_params)),
        "speculation": tessera_run.speculation,
        "checkpoint_max_abs": tessera_run.checkpoint_max_abs,
    }), flush=True)


if __name__ == "__main__":
    main()
