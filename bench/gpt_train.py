"""One GPT training run for the benchmarks, through PyTorch DDP, tessera's Python API or DeepSpeed.

    tessera launch --nproc-per-node 2 -- python bench/gpt_train.py --impl tessera --stage 2
    (bench/run_gpt_compare.sh and bench/run_engine_vs_ddp.sh run it; DeepSpeed runs in the venv
    bench/setup_deepspeed.sh makes, with DS_ACCELERATOR=cpu on a machine without a GPU)

The same model, data and optimizer for every --impl:
- the example GPT (examples/python/models.py: pre-LayerNorm, causal SDPA, GELU-tanh MLP, LM head
  tied to the token embedding) at --layers × --embd with --heads, initialized from one generator
  seeded with --seed, so every implementation starts from identical weights;
- the `fortunes` corpus (examples/python/data.py): for step s the same global batch of
  micro × world sequences of 128 tokens everywhere; rank r trains on rows [r·micro, (r+1)·micro);
- fp32, AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices and 0 on biases
  and LayerNorm), gradient clipping at --clip, a constant learning rate.

  ddp        torch DistributedDataParallel over Gloo (gradient_as_bucket_view, bucket_cap_mb =
             --bucket elements × 4 bytes unless --ddp-default-bucket), torch.optim.AdamW (fused
             kernel when the CPU build has it, else foreach), clip_grad_norm_
  tessera    tessera.initialize with ZeRO --stage, reduce/allgather bucket --bucket, overlap_comm
  deepspeed  deepspeed.initialize with ZeRO --stage, the same bucket sizes and overlap_comm (its
             own AdamW: the CPU accelerator's fused Adam op), Gloo
  fsdp2      torch's fully_shard on each block and the root (ZeRO-3's peer; reshard after forward),
             torch.optim.AdamW (foreach), clip_grad_norm_, Gloo

The first --warmup steps are not timed. Rank 0 prints one JSON line: samples_per_s, step_ms,
peak_rss_bytes (each rank's ru_maxrss: the whole process), final_loss (the last step's loss
averaged over ranks), and time_per_step_ms on rank 0 measured around the calls every
implementation has: data, forward (the model call + loss.item()), backward, step. tessera adds
its own disjoint split (engine.wall_clock_breakdown()): backward, reduce wait, optimizer,
allgather wait (the next forward's waits for updated parameters).
"""
import argparse
import ctypes
import gc
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from data import FORTUNES, FortunesCorpus  # noqa: E402
from models import Gpt  # noqa: E402

SEQ_LEN = 128


def resident_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


def param_groups(model, weight_decay):
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def adamw_params(args):
    return {"lr": args.lr, "betas": list(args.betas), "eps": args.eps, "weight_decay": args.weight_decay}


def engine_config(args):
    """The DeepSpeed-style config tessera and DeepSpeed both get."""
    zero = {"stage": args.stage, "reduce_bucket_size": int(args.bucket), "allgather_bucket_size": int(args.bucket),
            "overlap_comm": True, "contiguous_gradients": True}
    if args.stage == 3 and args.live:  # ZeRO-3's limits (elements), the same for tessera and DeepSpeed
        for key in ("stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size"):
            zero[key] = int(args.live)
    if args.offload != "none":  # optimizer offload, the same section for tessera and DeepSpeed
        zero["offload_optimizer"] = {"device": args.offload}
        if args.offload == "nvme":
            zero["offload_optimizer"].update({"nvme_path": args.nvme_path, "buffer_count": args.nvme_buffers,
                                              "pipeline_read": True, "pipeline_write": True})
            zero["sub_group_size"] = int(args.sub_group)
    if args.super_offload:  # tessera: each bucket's host step speculated during the backward
        zero["offload_optimizer"]["super_offload"] = True
    if args.offload_param != "none":  # ZeRO-3's parameter shards (ZeRO-Infinity with nvme)
        zero["offload_param"] = {"device": args.offload_param}
        if args.offload_param == "nvme":
            zero["offload_param"].update({"nvme_path": args.nvme_path, "buffer_count": args.nvme_buffers})
    extra = {}
    if "nvme" in (args.offload, args.offload_param):
        extra["aio"] = {"block_size": 1 << 20, "queue_depth": 8, "intra_op_parallelism": 1,
                        "single_submit": False, "overlap_events": True}
    if args.tp > 1:  # tessera's automatic plan (tessera.tensor_parallel.auto_plan)
        extra["tensor_parallel"] = {"tp_size": args.tp, "sequence_parallel": args.sp}
    if args.monitors:  # every monitor (wandb and comet offline without an API key) and the comms logger
        section = {"enabled": True, "output_path": args.monitors, "job_name": "gpt_train"}
        extra.update(csv_monitor=section, tensorboard=section, wandb={"enabled": True, "project": "gpt_train"},
                     comet={"enabled": True, "project": "gpt_train", "samples_log_interval": 1},
                     comms_logger={"enabled": True}, wall_clock_breakdown=True, memory_breakdown=True)
    if args.flops_profile:
        extra["flops_profiler"] = {"enabled": True, "profile_step": args.flops_profile, "detailed": False,
                                   "output_file": os.path.join(args.monitors or "/tmp", "flops.txt")}
    return {**extra,"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": 1,
            "steps_per_print": 10**9, "gradient_clipping": args.clip,
            "optimizer": optimizer_section(args), "zero_optimization": zero}


def optimizer_section(args):
    """AdamW, or with --optimizer one of the 1-bit family (tessera: optim/onebit.h) whose warm-up ends
    at --freeze (freeze_step; 0/1 Adam's var_freeze_step)."""
    params = adamw_params(args)
    if args.optimizer == "ZeroOneAdam":
        params["var_freeze_step"] = args.freeze
    elif args.optimizer != "AdamW":
        params["freeze_step"] = args.freeze
    return {"type": args.optimizer, "params": params}


class TorchDistributedGather:
    def gather(self, values):
        out = [None] * self.world
        self.dist.all_gather_object(out, values)
        return out


class EngineCalls:
    """tessera and DeepSpeed engines are called alike: engine(x, y), backward(loss), step()."""

    def forward(self, x, y):
        return self.engine(x, y)

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.engine.step()


class Ddp(TorchDistributedGather):
    """PyTorch's own data parallelism: the baseline."""

    def __init__(self, model, args):
        import torch.distributed as dist
        self.dist = dist
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        cap = None if args.ddp_default_bucket else args.bucket * 4 / 2**20
        self.module = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap, gradient_as_bucket_view=True)
        groups = param_groups(model, args.weight_decay)
        kwargs = dict(lr=args.lr, betas=tuple(args.betas), eps=args.eps)
        try:
            self.optimizer, self.kernel = torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
        except (RuntimeError, ValueError):
            self.optimizer, self.kernel = torch.optim.AdamW(groups, foreach=True, **kwargs), "foreach"
        self.params, self.clip = list(model.parameters()), args.clip
        self.describe = {"adamw": self.kernel, "bucket_cap_mb": cap if cap is not None else "default"}

    def forward(self, x, y):
        return self.module(x, y)

    def backward(self, loss):
        loss.backward()  # DDP's bucketed allreduces run during it; it returns once all are done

    def step(self):
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)  # keep the bucket views

    def close(self):
        # DDP's reducer holds the group and autograd hooks: drop it first, then the group.
        del self.module, self.optimizer
        gc.collect()
        self.dist.barrier()
        self.dist.destroy_process_group()


class Tessera(EngineCalls):
    def __init__(self, model, args):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import tessera
        self.tessera = tessera
        self.engine, _, _, _ = tessera.initialize(model=model, config=engine_config(args),
                                         model_parameters=param_groups(model, args.weight_decay))
        self.rank, self.world = tessera.comm.get_rank(), tessera.comm.get_world_size()
        self.dp_rank, self.dp = self.engine.dp_rank, self.engine.dp_world_size
        self.describe = {"tp": args.tp, "sequence_parallel": args.sp} if args.tp > 1 else {}

    def reset_comm_stats(self):
        context = self.tessera.comm.parallel_context()
        for group in ("data", "tensor"):
            context.stats(group, True)

    def comm_bytes(self):
        """Bytes this rank sent into collectives per group since the reset: {group: {collective: bytes}}."""
        context = self.tessera.comm.parallel_context()
        return {g: {k: v[1] for k, v in context.stats(g).items() if v[1]} for g in ("data", "tensor")}

    def comm_totals(self):
        """The data group since the reset: bytes this rank put on the wire (Communicator's sent_bytes)
        and seconds from each collective's call until its wait returned, summed."""
        stats = self.tessera.comm.parallel_context().stats("data").values()
        return {"sent_bytes": sum(v[3] for v in stats), "seconds": sum(v[2] for v in stats)}

    def breakdown(self):
        return self.engine.wall_clock_breakdown()

    def gather(self, values):
        t = torch.zeros(self.world, len(values), dtype=torch.float64)
        t[self.rank] = torch.tensor(values, dtype=torch.float64)
        self.tessera.comm.all_reduce(t)
        return [[int(v) for v in row] for row in t.tolist()]

    def close(self):
        self.engine.close()
        del self.engine  # its swap files go with it (the process leaves through os._exit below)
        gc.collect()


class DeepSpeed(EngineCalls, TorchDistributedGather):
    def __init__(self, model, args):
        import deepspeed
        import torch.distributed as dist
        self.dist = dist
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, args.weight_decay), config=engine_config(args))
        self.describe = {"deepspeed": deepspeed.__version__, "optimizer": type(self.optimizer).__name__,
                         "basic_optimizer": type(getattr(self.optimizer, "optimizer", self.optimizer)).__name__}

    def close(self):
        self.dist.barrier()


class Fsdp2(Ddp):
    """PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) on the CPU over Gloo: each block is sharded
    and resharded after its forward, then the root (embeddings, final norm; the tied head reads the
    embedding in the root's forward). torch.optim.AdamW (foreach) on the DTensor shards; forward,
    backward (FSDP2's reduce-scatters are waited for by its end), step and close as DDP's."""

    def __init__(self, model, args):
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        self.dist = dist
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cpu", (self.world,))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh)
        self.module = model
        self.params, self.clip = list(model.parameters()), args.clip
        self.optimizer = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=tuple(args.betas),
                                           eps=args.eps, foreach=True)
        self.describe = {"fsdp2": "fully_shard per block, then the root", "adamw": "foreach"}


IMPLS = {"ddp": Ddp, "tessera": Tessera, "deepspeed": DeepSpeed, "fsdp2": Fsdp2}


def block_cache_stats(args):
    """tessera's large-block CPU allocator's counters ({} for other implementations or with it off)."""
    if args.impl != "tessera":
        return {}
    import tessera
    return tessera._C.cpu_block_cache_stats()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=sorted(IMPLS), required=True)
    ap.add_argument("--stage", type=int, default=0, help="ZeRO stage (tessera, deepspeed)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--micro", type=int, default=8, help="sequences per rank per step")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=20, help="first steps, not timed")
    ap.add_argument("--bucket", type=float, default=5e6, help="reduce/allgather bucket in elements (DDP: × 4 bytes)")
    ap.add_argument("--live", type=float, default=0,
                    help="ZeRO-3: stage3_max_live_parameters, _max_reuse_distance and _prefetch_bucket_size "
                         "(elements; 0: DeepSpeed's defaults, which release nothing below ~1B parameters)")
    ap.add_argument("--offload", choices=["none", "cpu", "nvme"], default="none",
                    help="zero_optimization.offload_optimizer.device (tessera, deepspeed)")
    ap.add_argument("--offload-param", choices=["none", "cpu", "nvme"], default="none",
                    help="zero_optimization.offload_param.device (ZeRO-3; tessera, deepspeed)")
    ap.add_argument("--super-offload", action="store_true", help="with --offload cpu: offload_optimizer.super_offload "
                    "(tessera; on CPU ranks with TESSERA_HOST_STAGING=1)")
    ap.add_argument("--nvme-path", default="/tmp", help="offload_*.nvme_path (a rank-private file per group)")
    ap.add_argument("--nvme-buffers", type=int, default=4, help="offload_optimizer.buffer_count, offload_param's too")
    ap.add_argument("--sub-group", type=float, default=1e7, help="sub_group_size: the NVMe step's tile, in elements")
    ap.add_argument("--ddp-default-bucket", action="store_true", help="DDP's own buckets (25 MiB + a 1 MiB first)")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel.tp_size (tessera)")
    ap.add_argument("--sp", action="store_true", help="tensor_parallel.sequence_parallel (tessera)")
    ap.add_argument("--monitors", default="", help="a directory: enable csv_monitor, tensorboard, wandb and comet "
                                                   "(offline) there, the comms logger, wall_clock_breakdown and "
                                                   "memory_breakdown (tessera; docs/monitoring.md)")
    ap.add_argument("--flops-profile", type=int, default=0, help="flops_profiler.profile_step (tessera; 0: off)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.95])
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient clipping max norm (0: none)")
    ap.add_argument("--optimizer", default="AdamW", choices=["AdamW", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"],
                    help="the 1-bit family at ZeRO stage 0 (tessera; DeepSpeed 0.19.8 no longer has them)")
    ap.add_argument("--freeze", type=int, default=5, help="the 1-bit optimizers' freeze_step / var_freeze_step")
    ap.add_argument("--fortunes", default=FORTUNES)
    ap.add_argument("--rss-trace", action="store_true", help="report this rank's resident set after every step")
    ap.add_argument("--zero-init", action="store_true", help="tessera ZeRO-3: build the model under tessera.zero.Init")
    ap.add_argument("--malloc-trim", action="store_true",
                    help="diagnostic: glibc malloc_trim(0) after every step (hands freed heap back to the OS)")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        sys.exit("--steps must exceed --warmup")

    if args.impl == "tessera":
        # As a training script does: tessera is imported before the model is built, so the model's
        # tensors already come from its CPU allocator (csrc/cpu_block_cache.h).
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import tessera  # noqa: F401
    corpus = FortunesCorpus(args.fortunes)
    if args.zero_init:  # built partitioned (tessera.zero.Init): no rank ever holds the whole model
        import tessera
        with tessera.zero.Init(config=engine_config(args)):
            model = Gpt(n_layer=args.layers, n_head=args.heads, n_embd=args.embd, seed=args.seed,
                        gathered=lambda p: tessera.zero.GatheredParameters(p, modifier_rank=0))
    else:
        model = Gpt(n_layer=args.layers, n_head=args.heads, n_embd=args.embd, seed=args.seed)
    parameters = sum(p.numel() for p in model.parameters())
    impl = IMPLS[args.impl](model, args)
    rank, world = impl.rank, impl.world
    breakdown = getattr(impl, "breakdown", None)

    outer = {"data_ms": 0.0, "forward_ms": 0.0, "backward_ms": 0.0, "step_ms": 0.0}
    trim = ctypes.CDLL("libc.so.6").malloc_trim if args.malloc_trim else None
    rss_trace = []
    start, inner_start, cache_start, loss_value = None, None, {}, 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        if step == args.warmup:
            start = t0
            if hasattr(impl, "reset_comm_stats"):
                impl.reset_comm_stats()
            outer = dict.fromkeys(outer, 0.0)
            inner_start = breakdown() if breakdown else None
            cache_start = block_cache_stats(args)
        # rank r of the data-parallel group takes rows [r·micro, (r+1)·micro) (tensor ranks share theirs)
        dp_rank, dp = getattr(impl, "dp_rank", rank), getattr(impl, "dp", world)
        inputs, targets = corpus.sample(args.micro * dp, SEQ_LEN, step, args.seed)
        mine = slice(dp_rank * args.micro, (dp_rank + 1) * args.micro)
        x, y = inputs[mine], targets[mine]
        t1 = time.perf_counter()
        loss = impl.forward(x, y)
        loss_value = loss.item()
        t2 = time.perf_counter()
        impl.backward(loss)
        t3 = time.perf_counter()
        impl.step()
        t4 = time.perf_counter()
        for key, dt in zip(outer, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            outer[key] += 1000 * dt
        if trim:
            trim(0)
        if args.rss_trace:
            rss_trace.append(resident_mib())
    seconds = time.perf_counter() - start
    timed = args.steps - args.warmup
    if args.impl == "tessera" and "nvme" in (args.offload, args.offload_param):  # through the swap files per step (mean)
        m = impl.engine.memory_report()
        impl.swapped = round((m["offload_read_bytes"] + m["offload_written_bytes"]) / args.steps)
    inner = None
    if breakdown:
        end = breakdown()
        inner = {k.replace("_s", "_ms"): round(1000 * (end[k] - inner_start[k]) / timed, 2)
                 for k in ("forward_s", "backward_s", "reduce_wait_s", "optimizer_s", "allgather_wait_s")}

    cache_end = block_cache_stats(args)
    comm_bytes = impl.comm_bytes() if hasattr(impl, "comm_bytes") else None
    comm_totals = impl.comm_totals() if hasattr(impl, "comm_totals") else None
    phase = getattr(getattr(impl, "engine", None), "optimizer_phase", "") if args.impl == "tessera" else ""
    rows = impl.gather([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, round(loss_value * 1e9)])
    rss = [r[0] for r in rows]
    if rank == 0:
        samples = args.micro * getattr(impl, "dp", world) * timed
        name = args.impl if args.impl in ("ddp", "fsdp2") else "%s-zero%d" % (args.impl, args.stage)
        result = {
            "impl": name, "ranks": world, "parameters": parameters, "layers": args.layers, "embd": args.embd,
            "micro_batch": args.micro, "steps": timed, "warmup_steps": args.warmup,
            "samples_per_s": round(samples / seconds, 3), "tokens_per_s": round(samples * SEQ_LEN / seconds, 1),
            "step_ms": round(1000 * seconds / timed, 2),
            "peak_rss_bytes": rss, "peak_rss_max_bytes": max(rss),
            "final_loss": round(sum(r[1] for r in rows) / 1e9 / world, 6),
            "time_per_step_ms": {k: round(v / timed, 2) for k, v in outer.items()},
            "threads": torch.get_num_threads(), "torch": torch.__version__, "bucket": args.bucket,
        }
        if inner:
            result["engine_time_per_step_ms"] = inner
        if comm_totals:  # rank 0's data group per timed step: bytes sent, communication time
            result["data_sent_bytes_per_step"] = round(comm_totals["sent_bytes"] / timed)
            result["data_comm_ms_per_step"] = round(1000 * comm_totals["seconds"] / timed, 2)
        if args.optimizer != "AdamW":
            result["optimizer"] = args.optimizer
            result["freeze"] = args.freeze
            result["phase_at_end"] = phase
        if comm_bytes:  # rank 0's bytes into collectives per timed step, by group
            result["comm_bytes_per_step"] = {g: {k: round(v / timed) for k, v in c.items()} for g, c in comm_bytes.items()}
        if cache_end:  # rank 0's large-block allocator over the timed steps (csrc/cpu_block_cache.h)
            result["block_cache"] = {"misses_per_step": round((cache_end["misses"] - cache_start["misses"]) / timed, 2),
                                     "peak_in_use_mib": round(cache_end["peak_in_use_bytes"] / 2**20, 1)}
        if args.rss_trace:
            result["rss_mib_after_each_step"] = rss_trace
        if args.malloc_trim:
            result["malloc_trim"] = True
        result.update(impl.describe)
        if args.offload != "none":
            result["offload"] = args.offload
        if args.offload_param != "none":
            result["offload_param"] = args.offload_param
        if args.super_offload:  # steps that kept their speculated chunks, and those redone
            result["speculation"] = impl.engine.speculation_counts()
        if getattr(impl, "swapped", None):
            result["swapped_bytes_per_step"] = impl.swapped
        print(json.dumps(result), flush=True)
    impl.close()
    # torch 2.11 sometimes aborts at interpreter exit after DDP ("terminate called without an
    # active exception", after the results above are out): leave without the interpreter's teardown.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
