"""GPT training on one GPU in bf16: tessera's engine against a plain PyTorch training loop.

    python bench/gpu_gpt.py --impl plain   --size 350m --micro 16 --seq 1024
    python bench/gpu_gpt.py --impl tessera --size 350m --micro 16 --seq 1024 --stage 0
    (bench/run_gpu.sh builds tessera on the GPU machine, runs the GPU tests, then this script for
    every size, implementation and micro-batch, and collects the JSON lines)

The same model, data and optimizer for both implementations:
- the example GPT (examples/python/models.py: pre-LayerNorm, causal SDPA attention, GELU-tanh MLP,
  LM head tied to the token embedding) with GPT-2's padded vocabulary (50304), made and drawn on
  the GPU from --seed; sizes: 350m = 24 x 1024 (16 heads), 1.3b = 24 x 2048 (16 heads);
- synthetic tokens (uniform over the vocabulary, drawn on the GPU from --seed and the step): the
  throughput does not depend on the text, and no data loader competes for the host;
- AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices, 0 on biases and
  LayerNorm), gradient clipping at 1.0, constant learning rate.

  plain    fp32 parameters, torch.autocast(bf16) around the forward, torch.optim.AdamW(fused=True),
           clip_grad_norm_(foreach=True), zero_grad(set_to_none=True): PyTorch's own mixed precision
  plain-master  the engine's bf16 scheme as a plain loop: bf16 parameters, fp32 master copies
           updated by torch.optim.AdamW(fused=True), gradients widened and parameters written back
           by torch._foreach_copy_ (the baseline for the engine's own overhead)
  tessera  tessera.initialize with "bf16": {"enabled": true} (bf16 parameters and activations,
           fp32 master weights, gradients and Adam states, as DeepSpeed's bf16 mode) at ZeRO --stage

The first --warmup steps are not timed; the timed steps run between two torch.cuda.synchronize().
Prints one JSON line: tokens_per_s, step_ms, mfu (model FLOPs per token 6·N + 12·L·d·T, PaLM's
appendix B, N without the position embedding, over --peak-tflops, 989 for an H100 SXM's dense
bf16), peak GPU memory (allocated and reserved), the final loss. Exit code 3 when the micro-batch
does not fit (the runner then tries a smaller one).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from models import Gpt  # noqa: E402

VOCAB = 50304
SIZES = {"tiny": (2, 256, 4), "125m": (12, 768, 12), "350m": (24, 1024, 16), "1.3b": (24, 2048, 16)}


def param_groups(model, weight_decay):
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


class Plain:
    def __init__(self, model, args):
        self.model = model
        self.params = list(model.parameters())
        self.optimizer = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95),
                                           eps=1e-8, fused=True)
        self.clip = args.clip

    def train_step(self, x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(x, y)
        loss.backward()
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss


class PlainMaster:
    """What the engine does in bf16, written as a plain loop: bf16 parameters, fp32 master copies
    that fused AdamW updates, the bf16 gradients widened by one multi-tensor copy, the masters
    copied back by another."""

    def __init__(self, model, args):
        self.model = model.to(torch.bfloat16)
        self.params = list(model.parameters())
        self.masters = [p.detach().float().requires_grad_() for p in self.params]
        for m in self.masters:
            m.grad = torch.zeros_like(m)
        index = {id(p): i for i, p in enumerate(self.params)}
        groups = [{"params": [self.masters[index[id(p)]] for p in g["params"]], "weight_decay": g["weight_decay"]}
                  for g in param_groups(model, args.weight_decay)]
        self.optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
        self.master_grads = [m.grad for m in self.masters]
        self.clip = args.clip

    def train_step(self, x, y):
        loss = self.model(x, y)
        loss.backward()
        torch._foreach_copy_(self.master_grads, [p.grad for p in self.params])
        for p in self.params:
            p.grad = None
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.masters, self.clip, foreach=True)
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.masters)
        return loss


class Tessera:
    def __init__(self, model, args):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import tessera
        zero = {"stage": args.stage, "overlap_comm": True, "contiguous_gradients": True}
        if args.bucket:
            zero["reduce_bucket_size"] = zero["allgather_bucket_size"] = int(args.bucket)
        if args.offload:  # ZeRO-Offload: the optimizer on the host's cores, pinned buffers
            zero["offload_optimizer"] = {"device": args.offload, "pin_memory": True}
            if args.offload == "nvme":  # its state (and the fp32 master) in files, streamed in tiles
                zero["offload_optimizer"].update(nvme_path=args.nvme_path, buffer_count=4, pipeline_read=True,
                                                 pipeline_write=True)
                zero["sub_group_size"] = int(args.sub_group_size)
        if args.offload_param:  # ZeRO-3's shards in host memory too
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        if args.delayed is not None:  # ZeRO-Offload's delayed parameter update after that many steps
            zero["offload_optimizer"]["delayed_param_update"] = {"enabled": True, "warmup_steps": args.delayed}
        if args.super_offload:  # the host step of each bucket speculated during the backward
            zero["offload_optimizer"]["super_offload"] = True
        config = {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": 1,
                  "steps_per_print": 10**9, "gradient_clipping": args.clip, "bf16": {"enabled": True},
                  "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                            "weight_decay": args.weight_decay}},
                  "zero_optimization": zero}
        self.engine, _, _, _ = tessera.initialize(model=model, config=config,
                                         model_parameters=param_groups(model, args.weight_decay))

    def train_step(self, x, y):
        loss = self.engine(x, y)
        self.engine.backward(loss)
        self.engine.step()
        return loss


IMPLS = {"plain": Plain, "plain-master": PlainMaster, "tessera": Tessera}


def flops_per_token(model, n_layer, n_embd, seq):
    n = sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name)
    return 6 * n + 12 * n_layer * n_embd * seq


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=sorted(IMPLS), required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="350m")
    ap.add_argument("--stage", type=int, default=0, help="tessera's ZeRO stage")
    ap.add_argument("--bucket", type=float, default=0, help="tessera's reduce/allgather bucket (elements; 0: the default)")
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--offload", nargs="?", const="cpu", choices=("cpu", "nvme"),
                    help="tessera: offload_optimizer.device (cpu when given alone)")
    ap.add_argument("--nvme-path", default="/tmp", help="offload_optimizer.nvme_path with --offload nvme")
    ap.add_argument("--sub-group-size", type=float, default=1e8, help="sub_group_size with --offload nvme")
    ap.add_argument("--offload-param", action="store_true", help="tessera (stage 3): offload_param.device cpu")
    ap.add_argument("--delayed", type=int, help="tessera with --offload cpu: delayed_param_update after this many "
                    "steps (within --warmup, so every timed step is delayed)")
    ap.add_argument("--super-offload", action="store_true", help="tessera with --offload cpu: offload_optimizer."
                    "super_offload (each bucket's host step overlapped with the backward, validated at the step)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_gpt.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    n_layer, n_embd, n_head = SIZES[args.size]
    try:
        model = Gpt(vocab=VOCAB, block_size=args.seq, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                    seed=args.seed, device="cuda")
        parameters = sum(p.numel() for p in model.parameters())
        fpt = flops_per_token(model, n_layer, n_embd, args.seq)
        impl = IMPLS[args.impl](model, args)
        gen = torch.Generator(device="cuda")
        losses = []
        for step in range(args.steps):
            if step == args.warmup:
                torch.cuda.synchronize()
                start = time.perf_counter()
            gen.manual_seed(args.seed * 1000003 + step)
            tokens = torch.randint(VOCAB, (args.micro, args.seq + 1), device="cuda", generator=gen)
            loss = impl.train_step(tokens[:, :-1], tokens[:, 1:])
            losses.append(loss.detach())
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    except torch.cuda.OutOfMemoryError as e:
        print("out of memory at micro %d: %s" % (args.micro, str(e).splitlines()[0]), file=sys.stderr)
        sys.exit(3)
    except RuntimeError as e:
        if "out of memory" in str(e):
            print("out of memory at micro %d: %s" % (args.micro, str(e).splitlines()[0]), file=sys.stderr)
            sys.exit(3)
        raise
    timed = args.steps - args.warmup
    tokens_per_s = args.micro * args.seq * timed / seconds
    name = args.impl
    if args.impl == "tessera":
        name = "tessera-zero%d" % args.stage + ("-offload" if args.offload == "cpu" else "-offload-nvme" if args.offload
                                                 else "") + ("-params" if args.offload_param else "") + \
            ("-dpu" if args.delayed is not None else "") + ("-super" if args.super_offload else "")
    print(json.dumps({
        "impl": name, "size": args.size, "parameters": parameters, "layers": n_layer, "embd": n_embd,
        "micro_batch": args.micro, "seq": args.seq, "steps": timed,
        "tokens_per_s": round(tokens_per_s, 1), "step_ms": round(1000 * seconds / timed, 2),
        "mfu": round(fpt * tokens_per_s / (args.peak_tflops * 1e12), 4), "flops_per_token": fpt,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "first_loss": round(losses[0].item(), 5), "final_loss": round(losses[-1].item(), 5),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "host_cores": os.cpu_count(),
        # super_offload: how many steps kept their speculated chunks, and how many were redone
        "speculation": impl.engine.speculation_counts() if args.super_offload else None,
    }), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip the interpreter's teardown of CUDA and NCCL state


if __name__ == "__main__":
    main()
