"""DeepSpeed's flops profiler (its flops_profiler config and profiling/flops_profiler/profiler.py) for
Python modules: per module, the parameters, the multiply-accumulates (MACs) and floating-point
operations of the forward, its latency and FLOP/s; the model's totals with the backward's, and the
model FLOPs utilization against a given peak.

    {"flops_profiler": {"enabled": true, "profile_step": 2, "module_depth": -1, "top_modules": 1,
                        "detailed": true, "output_file": null, "peak_tflops": 989}}

profiles, on global rank 0, every forward of optimizer step `profile_step` (counted from 1) and
prints the report at the end of that step (to output_file when given). Without an engine:

    flops, macs, params = tessera.flops_profiler.get_model_profile(model, args=[x])

How it counts (DeepSpeed's rules): while profiling, torch's functions that do the arithmetic are
wrapped, and each call adds to every module whose forward is running (so a module's count holds
its children's): linear MACs = numel(input) · out_features; matmul, bmm, mm, baddbmm, addmm
MACs = numel(a) · b.shape[-1]; scaled_dot_product_attention MACs = numel(q) · Lk + numel(q[:-1]) ·
Lk · dv (the whole score matrix, causal or not); convolutions MACs = numel(output) · in_channels /
groups · kernel size; flops = 2 · MACs for all of these; layer_norm and rms_norm 5 (4 without
affine) flops an element, relu, gelu, silu, softmax one; embedding and dropout none. The backward
is 2 × the forward's flops, plus recompute_fwd_factor × the forward for activation checkpointing.
Latency: a module's forward from its pre-hook to its hook (on a GPU after synchronizing); the
step's backward and optimizer times come from the engine's wall-clock breakdown.
"""
import functools
import math
import sys
import time
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["FlopsProfiler", "get_model_profile", "number_to_string"]


def number_to_string(n, units=None, precision=2):
    """DeepSpeed's style: 1.23 G, 4.5 M (params use B for 10⁹)."""
    for value, unit in ((1e12, "T"), (1e9, units or "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= value:
            return "%.*f %s" % (precision, n / value, unit)
    return "%.*f " % (precision, n)


def _numel(shape):
    return int(math.prod(shape))


# --- what each wrapped function costs: (flops, macs) ------------------------------------------------

def _linear(input, weight, bias=None):
    macs = input.numel() * weight.shape[0]
    return 2 * macs, macs


def _matmul(a, b, *args, **kwargs):
    macs = a.numel() * b.shape[-1]
    return 2 * macs, macs


def _addmm(bias, a, b, *args, **kwargs):  # addmm / baddbmm: bias + a @ b
    macs = a.numel() * b.shape[-1]
    return 2 * macs + bias.numel(), macs


def _sdpa(q, k, v, *args, **kwargs):
    lk, dv = k.shape[-2], v.shape[-1]
    macs = q.numel() * lk + _numel(q.shape[:-1]) * lk * dv
    return 2 * macs, macs


def _conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, out=None):
    # The output's size is the result's; the wrapper passes it in as `out`.
    macs = out.numel() * (weight.shape[1]) * _numel(weight.shape[2:])
    return 2 * macs, macs


def _norm(input, normalized_shape, weight=None, bias=None, *args, **kwargs):
    return input.numel() * (5 if weight is not None else 4), 0


def _elementwise(input, *args, **kwargs):
    return input.numel(), 0


def _nothing(*args, **kwargs):
    return 0, 0


_FUNCTIONS = [  # (module, name, cost)
    (F, "linear", _linear), (torch, "matmul", _matmul), (torch, "mm", _matmul), (torch, "bmm", _matmul),
    (torch.Tensor, "matmul", _matmul), (torch.Tensor, "__matmul__", _matmul), (torch.Tensor, "mm", _matmul),
    (torch.Tensor, "bmm", _matmul), (torch, "addmm", _addmm), (torch, "baddbmm", _addmm),
    (F, "scaled_dot_product_attention", _sdpa), (F, "conv1d", _conv), (F, "conv2d", _conv), (F, "conv3d", _conv),
    (F, "layer_norm", _norm), (F, "relu", _elementwise), (F, "gelu", _elementwise), (F, "silu", _elementwise),
    (F, "softmax", _elementwise), (F, "embedding", _nothing), (F, "dropout", _nothing),
]
if hasattr(F, "rms_norm"):
    _FUNCTIONS.append((F, "rms_norm", _norm))


class FlopsProfiler:
    """Counts `model`'s forward arithmetic between start_profile() and stop_profile() (DeepSpeed's
    FlopsProfiler calls); print_model_profile() reports it."""

    def __init__(self, model, recompute_fwd_factor=0.0):
        self.model = model
        self.recompute_fwd_factor = float(recompute_fwd_factor)
        self.started = False
        self._hooks, self._saved, self._stack = [], [], []
        self.reset_profile()

    # --- counting ---------------------------------------------------------------------------------
    def reset_profile(self):
        self.flops, self.macs, self.latency = {}, {}, {}  # by module, inclusive of its children
        self.forwards = 0

    def _add(self, flops, macs):
        for m in self._stack:
            self.flops[m] = self.flops.get(m, 0) + flops
            self.macs[m] = self.macs.get(m, 0) + macs

    def _wrap(self, owner, name, cost):
        original = getattr(owner, name)

        @functools.wraps(original)
        def counted(*args, **kwargs):
            out = original(*args, **kwargs)
            if self._stack:
                try:
                    if cost is _conv:
                        f, m = cost(*args, out=out, **kwargs)
                    else:
                        f, m = cost(*args, **kwargs)
                except (TypeError, IndexError, AttributeError):  # an unusual call: counted as nothing
                    f, m = 0, 0
                self._add(f, m)
            return out
        setattr(owner, name, counted)
        self._saved.append((owner, name, original))

    def _synchronize(self):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def start_profile(self):
        """Wraps torch's functions and hooks every module's forward."""
        if self.started:
            return
        self.started = True
        for owner, name, cost in _FUNCTIONS:
            self._wrap(owner, name, cost)
        starts = {}

        def enter(module, inputs):
            self._synchronize()
            starts[module] = time.perf_counter()
            self._stack.append(module)

        def leave(module, inputs, output):
            self._synchronize()
            if self._stack and self._stack[-1] is module:
                self._stack.pop()
            self.latency[module] = self.latency.get(module, 0.0) + time.perf_counter() - starts.pop(module, time.perf_counter())
            if module is self.model:
                self.forwards += 1
        for m in self.model.modules():
            self._hooks.append(m.register_forward_pre_hook(enter))
            self._hooks.append(m.register_forward_hook(leave))

    def stop_profile(self):
        """Puts torch's functions back and removes the hooks (the counts stay)."""
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved = []
        for h in self._hooks:
            h.remove()
        self._hooks, self._stack = [], []
        self.started = False

    def end_profile(self):
        self.stop_profile()
        self.reset_profile()

    # --- totals -----------------------------------------------------------------------------------
    def _of(self, table, module):
        """A module's count: its own when its forward ran (children included), else its children's
        summed (a ModuleList or ModuleDict is never called)."""
        if module in table:
            return table[module]
        return sum(self._of(table, child) for child in module.children())

    def module_flops(self, module):
        return self._of(self.flops, module)

    def module_macs(self, module):
        return self._of(self.macs, module)

    def module_latency(self, module):
        return self._of(self.latency, module)

    def get_total_flops(self, as_string=False):
        n = self.module_flops(self.model)
        return number_to_string(n) + "FLOPs" if as_string else n

    def get_total_macs(self, as_string=False):
        n = self.module_macs(self.model)
        return number_to_string(n) + "MACs" if as_string else n

    def get_total_duration(self, as_string=False):
        s = self.module_latency(self.model)
        return "%.2f ms" % (1000 * s) if as_string else s

    def get_total_params(self, as_string=False):
        n = sum(p.numel() for p in self.model.parameters())
        return number_to_string(n, units="B") if as_string else n

    # --- the report -------------------------------------------------------------------------------
    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True, output_file=None,
                            layout=None, step_times=None, peak_tflops=None, batch_size=None):
        """DeepSpeed's report. layout: {"world", "data", "tensor", "pipe"} sizes; step_times: the
        profiled step's {"forward_s", "backward_s", "step_s"} (the engine's wall-clock split);
        peak_tflops: the device's peak, for the MFU."""
        lines = []
        out = lines.append
        layout = layout or {"world": 1, "data": 1, "tensor": 1, "pipe": 1}
        mp = layout["tensor"] * layout["pipe"]
        params, fwd_flops, fwd_macs = self.get_total_params(), self.get_total_flops(), self.get_total_macs()
        fwd_latency = self.get_total_duration()
        bwd_factor = 2.0 + self.recompute_fwd_factor

        def row(label, value):
            out("%-60s %s" % (label + ":", value))
        out("\n" + "-" * 26 + " tessera Flops Profiler " + "-" * 26)
        out("Profile Summary at step %d:" % profile_step)
        out("Notations: data parallel size (dp_size), model parallel size (mp_size), number of parameters (params), "
            "number of multiply-accumulate operations (MACs), number of floating-point operations (flops), "
            "floating-point operations per second (FLOPS), fwd latency (forward propagation latency), bwd latency "
            "(backward propagation latency), step (weights update latency), iter latency (sum of fwd, bwd and step "
            "latency)\n")
        row("world size", layout["world"])
        row("data parallel size", layout["data"])
        row("model parallel size", mp)
        if batch_size is not None:
            row("batch size per GPU", batch_size)
        row("params per GPU", number_to_string(params, units="B"))
        row("params of model = params per GPU * mp_size", number_to_string(params * mp, units="B"))
        row("fwd MACs per GPU", number_to_string(fwd_macs) + "MACs")
        row("fwd flops per GPU", number_to_string(fwd_flops))
        row("fwd flops of model = fwd flops per GPU * mp_size", number_to_string(fwd_flops * mp))
        row("fwd latency", "%.2f ms" % (1000 * fwd_latency))
        row("fwd FLOPS per GPU = fwd flops per GPU / fwd latency",
            number_to_string(fwd_flops / fwd_latency if fwd_latency else 0) + "FLOPS")
        if step_times:
            bwd, step = step_times["backward_s"], step_times["step_s"]
            iteration = fwd_latency + bwd + step
            row("bwd latency", "%.2f ms" % (1000 * bwd))
            row("bwd FLOPS per GPU = %g * fwd flops per GPU / bwd latency" % bwd_factor,
                number_to_string(bwd_factor * fwd_flops / bwd if bwd else 0) + "FLOPS")
            row("fwd+bwd FLOPS per GPU = %g * fwd flops per GPU / (fwd+bwd latency)" % (bwd_factor + 1),
                number_to_string((bwd_factor + 1) * fwd_flops / (fwd_latency + bwd) if fwd_latency + bwd else 0) + "FLOPS")
            row("step latency", "%.2f ms" % (1000 * step))
            row("iter latency", "%.2f ms" % (1000 * iteration))
            achieved = (bwd_factor + 1) * fwd_flops / iteration if iteration else 0
            row("FLOPS per GPU = %g * fwd flops per GPU / iter latency" % (bwd_factor + 1), number_to_string(achieved) + "FLOPS")
            if batch_size is not None and iteration:
                row("samples/second", "%.2f" % (batch_size * layout["data"] / iteration))
            if peak_tflops:
                row("MFU = FLOPS per GPU / peak (%g TFLOPS)" % peak_tflops, "%.2f%%" % (100 * achieved / (peak_tflops * 1e12)))
        out("\n" + "-" * 26 + " Aggregated Profile per GPU " + "-" * 26)
        out("Top %d modules in terms of params, MACs or fwd latency at different model depths:" % top_modules)
        by_depth = self._by_depth()
        depths = sorted(by_depth) if module_depth < 0 else [d for d in sorted(by_depth) if d <= module_depth]
        for d in depths:
            agg = by_depth[d]

            def top(key, fmt):
                best = sorted(agg.items(), key=lambda kv: -kv[1][key])[:top_modules]
                return "{%s}" % ", ".join("'%s': '%s'" % (cls, fmt(v[key])) for cls, v in best)
            out("depth %d:" % d)
            out("    params      - %s" % top("params", lambda v: number_to_string(v, units="B")))
            out("    MACs        - %s" % top("macs", lambda v: number_to_string(v) + "MACs"))
            out("    fwd latency - %s" % top("latency", lambda v: "%.2f ms" % (1000 * v)))
        if detailed:
            out("\n" + "-" * 26 + " Detailed Profile per GPU " + "-" * 26)
            out("Each module: params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
                "percentage of total fwd latency, fwd FLOPS")
            self._detailed(self.model, "", 0, module_depth, out, params, fwd_macs, fwd_latency)
        out("-" * 76)
        text = "\n".join(lines) + "\n"
        if output_file:
            import os
            directory = os.path.dirname(output_file)
            if directory:
                os.makedirs(directory, exist_ok=True)
            with open(output_file, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
        return text

    def _params(self, module):
        return sum(p.numel() for p in module.parameters())

    def _by_depth(self):
        """{depth: {class name: {"params", "macs", "latency"}}} summed over the modules at that depth."""
        out = {}

        def walk(module, depth):
            agg = out.setdefault(depth, {}).setdefault(type(module).__name__, {"params": 0, "macs": 0, "latency": 0.0})
            agg["params"] += self._params(module)
            agg["macs"] += self.module_macs(module)
            agg["latency"] += self.module_latency(module)
            for child in module.children():
                walk(child, depth + 1)
        walk(self.model, 0)
        return out

    def _detailed(self, module, name, depth, max_depth, out, total_params, total_macs, total_latency):
        params, macs, latency = self._params(module), self.module_macs(module), self.module_latency(module)
        flops = self.module_flops(module)

        def share(a, b):
            return 100.0 * a / b if b else 0.0
        out("%s(%s): %s(%s, %.2f%% Params, %s, %.2f%% MACs, %.2f ms, %.2f%% latency, %s)" % (
            "  " * depth, name or "model", type(module).__name__, number_to_string(params, units="B"),
            share(params, total_params), number_to_string(macs) + "MACs", share(macs, total_macs), 1000 * latency,
            share(latency, total_latency), number_to_string(flops / latency if latency else 0) + "FLOPS"))
        if max_depth < 0 or depth < max_depth:
            for child_name, child in module.named_children():
                self._detailed(child, child_name, depth + 1, max_depth, out, total_params, total_macs, total_latency)


class EngineProfiler:
    """The engine's use of the profiler (the config's flops_profiler section): profile every forward
    of step `profile_step` on global rank 0, print at the end of that step."""

    def __init__(self, engine, section):
        # A weak reference: the engine holds this object, and a cycle would keep the engine (and its
        # hooks on the module) alive after the script drops it until the cycle collector ran.
        self.engine = weakref.proxy(engine)
        self.section = section or {}
        self.enabled = bool(self.section.get("enabled")) and engine.global_rank == 0
        self.profiler = None
        self._times_before = None

    def before_forward(self):
        if not self.enabled or self.profiler is not None:
            return
        if self.engine.global_steps + 1 != int(self.section.get("profile_step", 1)):
            return
        self.profiler = FlopsProfiler(self.engine.module, self.section.get("recompute_fwd_factor", 0.0))
        self._times_before = self.engine.wall_clock_breakdown()
        self.profiler.start_profile()

    def after_step(self):
        if self.profiler is None or not self.profiler.started:
            return
        self.profiler.stop_profile()
        now, before = self.engine.wall_clock_breakdown(), self._times_before
        times = {"backward_s": (now["backward_s"] - before["backward_s"]) + (now["reduce_wait_s"] - before["reduce_wait_s"]),
                 "step_s": (now["optimizer_s"] - before["optimizer_s"]) + (now["allgather_wait_s"] - before["allgather_wait_s"])}
        e = self.engine
        self.profiler.print_model_profile(
            profile_step=e.global_steps, module_depth=int(self.section.get("module_depth", -1)),
            top_modules=int(self.section.get("top_modules", 1)), detailed=bool(self.section.get("detailed", True)),
            output_file=self.section.get("output_file"), step_times=times,
            layout={"world": e.world_size, "data": e.dp_world_size, "tensor": e.config["tensor_parallel"]["tp_size"],
                    "pipe": 1},
            peak_tflops=self.section.get("peak_tflops"),
            batch_size=e.config["train_micro_batch_size_per_gpu"] * e.config["gradient_accumulation_steps"])
        self.enabled = False  # once


def get_model_profile(model, input_shape=None, args=None, kwargs=None, print_profile=True, detailed=True,
                      module_depth=-1, top_modules=1, warm_up=1, as_string=True, output_file=None,
                      ignore_modules=None, mode="forward"):
    """DeepSpeed's get_model_profile: runs `model` in eval mode on args/kwargs (or a random tensor of
    input_shape) warm_up times, then once profiled; returns (flops, macs, params), as strings when
    as_string. mode "forward" only; ignore_modules is accepted and unused."""
    if mode != "forward":
        raise ValueError("tessera.flops_profiler.get_model_profile: mode %r: only \"forward\" is profiled" % mode)
    args, kwargs = list(args or []), dict(kwargs or {})
    if input_shape is not None:
        args = [torch.ones(()).new_empty(input_shape, dtype=next(model.parameters()).dtype).normal_()]
    model.eval()
    with torch.no_grad():
        for _ in range(warm_up):
            model(*args, **kwargs)
        prof = FlopsProfiler(model)
        prof.start_profile()
        model(*args, **kwargs)
        prof.stop_profile()
    if print_profile:
        prof.print_model_profile(module_depth=module_depth, top_modules=top_modules, detailed=detailed,
                                 output_file=output_file)
    flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
    if as_string:
        return number_to_string(flops), number_to_string(macs) + "MACs", number_to_string(params, units="B")
    return flops, macs, params
