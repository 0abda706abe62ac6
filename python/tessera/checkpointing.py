"""Activation checkpointing with DeepSpeed's API (deepspeed.checkpointing).

    tessera.checkpointing.configure(None, deepspeed_config=config)   # or tessera.initialize does it
    y = tessera.checkpointing.checkpoint(block, x)                    # in a model's forward
    tessera.checkpointing.checkpoint_modules(model)                   # or: wrap the blocks' forwards

checkpoint(function, *args) runs `function` without keeping its intermediate activations: forward
keeps only the tensor arguments, backward runs `function` again with gradients on, from the same
random state (so dropout draws the same masks), and back-propagates through that (Chen et al. 2016,
"Training Deep Nets with Sublinear Memory Cost": the activations of n blocks cost O(inputs) plus
one block's, for one more forward).

The config's `activation_checkpointing` section (tessera.initialize passes it to configure()):
  partition_activations   with tensor parallelism, each tensor rank keeps 1/t of every saved input
                          (they are the same on all of them) and all-gathers it before recomputing;
                          under sequence parallelism the inputs are split already and stay whole
  cpu_checkpointing       the saved inputs wait in host memory (on a CPU rank they are there already)
  contiguous_memory_optimization, number_checkpoints
                          DeepSpeed preallocates one GPU buffer for all partitioned inputs; here each
                          is its own allocation (the CPU block cache reuses them): accepted, no effect
  synchronize_checkpoint_boundary   torch.cuda.synchronize() around each checkpoint (GPU only)
  profile                 time spent in checkpointed forwards and recomputations: stats()

The RNG tracker (get_rng_tracker, DeepSpeed's get_cuda_rng_tracker) keeps named generator states
for dropout inside tensor-parallel regions: model_parallel_seed(seed) seeds the default generator
with `seed` (the same on every tensor rank: replicated activations draw the same masks) and the
tracker's "model-parallel-rng" with seed + 2718 + tensor rank (split activations draw different
ones); `with get_rng_tracker().fork():` draws from the latter.
"""
import contextlib
import json
import os
import time

import torch

from . import comm

__all__ = ["configure", "is_configured", "reset", "set_sequence_parallel", "checkpoint", "checkpoint_modules", "get_rng_tracker",
           "get_cuda_rng_tracker", "model_parallel_seed", "model_parallel_cuda_manual_seed", "measure_saved_bytes",
           "stats", "CheckpointFunction"]

_KEYS = ("partition_activations", "contiguous_memory_optimization", "cpu_checkpointing", "number_checkpoints",
         "synchronize_checkpoint_boundary", "profile")
_DEFAULTS = dict(partition_activations=False, contiguous_memory_optimization=False, cpu_checkpointing=False,
                 number_checkpoints=None, synchronize_checkpoint_boundary=False, profile=False)
_options = dict(_DEFAULTS)
_configured = False
_stats = {"checkpoints": 0, "recomputations": 0, "partitioned_inputs": 0, "forward_s": 0.0, "recompute_s": 0.0}
# Set by tessera.tensor_parallel.parallelize(sequence_parallel=True) through set_sequence_parallel():
# a block's input is then this rank's part of the sequence, different on every tensor rank, so
# there is nothing to partition.
_sequence_parallel = False


def set_sequence_parallel(enabled=True):
    """The model's checkpointed inputs are split along the sequence across the tensor ranks
    (sequence parallelism): partition_activations has nothing left to partition."""
    global _sequence_parallel
    _sequence_parallel = bool(enabled)


def configure(mpu_=None, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None):
    """DeepSpeed's signature. `deepspeed_config`: a path, JSON text or dict whose
    "activation_checkpointing" section sets the options; the keyword arguments override it.
    `mpu_` is accepted and unused: the tensor group is tessera's parallel context's."""
    global _configured
    section = {}
    if deepspeed_config is not None:
        cfg = deepspeed_config
        if isinstance(cfg, str):
            cfg = json.load(open(cfg)) if os.path.exists(cfg) else json.loads(cfg)
        section = dict(cfg.get("activation_checkpointing") or {})
        unknown = sorted(set(section) - set(_KEYS))
        if unknown:
            raise ValueError("tessera.checkpointing.configure: activation_checkpointing has unknown key(s) %s "
                             "(expected %s)" % (", ".join(unknown), ", ".join(_KEYS)))
    _options.update(_DEFAULTS)
    _options.update({k: v for k, v in section.items() if v is not None})
    for key, value in (("partition_activations", partition_activations),
                       ("contiguous_memory_optimization", contiguous_checkpointing),
                       ("number_checkpoints", num_checkpoints), ("cpu_checkpointing", checkpoint_in_cpu),
                       ("synchronize_checkpoint_boundary", synchronize), ("profile", profile)):
        if value is not None:
            _options[key] = value
    _configured = True


def is_configured():
    return _configured


def reset():
    """Back to the defaults (DeepSpeed's reset() frees its contiguous buffers; there are none here)."""
    global _configured, _sequence_parallel
    _options.update(_DEFAULTS)
    _configured = _sequence_parallel = False
    for k in _stats:
        _stats[k] = 0 if isinstance(_stats[k], int) else 0.0


def stats():
    """Counts and seconds of checkpointed forwards and recomputations (timed when profile is on)."""
    return dict(_stats)


# ---- random state ----

class RngTracker:
    """Named generator states: fork(name) runs its block drawing from that state and keeps what it
    advanced to, leaving the default generator's state as it was."""

    def __init__(self):
        self._states = {}

    def reset(self):
        self._states = {}

    def get_states(self):
        return {k: v.clone() for k, v in self._states.items()}

    def set_states(self, states):
        self._states = {k: v.clone() for k, v in states.items()}

    def add(self, name, seed):
        if name in self._states:
            raise ValueError("tessera.checkpointing: RNG state %r already exists" % name)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self._states[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        if name not in self._states:
            raise ValueError("tessera.checkpointing: no RNG state %r (model_parallel_seed() adds it)" % name)
        saved = torch.get_rng_state()
        torch.set_rng_state(self._states[name])
        try:
            yield
        finally:
            self._states[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


_tracker = RngTracker()


def get_rng_tracker():
    return _tracker


get_cuda_rng_tracker = get_rng_tracker  # DeepSpeed's and Megatron's name


def model_parallel_seed(seed):
    """The default generator gets `seed` on every rank; the tracker's "model-parallel-rng" gets
    seed + 2718 + this rank's tensor-parallel rank (Megatron's offset)."""
    if comm.is_initialized() and not comm.axes_made():
        raise RuntimeError("tessera.checkpointing.model_parallel_seed: the tensor-parallel degree is not known yet "
                           "(init_distributed() makes only the world group); call it after tessera.initialize(), or "
                           "call tessera.init_distributed(tensor_parallel=...) first")
    tensor_rank = comm.parallel_context().group_rank("tensor") if comm.axes_made() else 0
    torch.manual_seed(seed)
    _tracker.reset()
    _tracker.add("model-parallel-rng", seed + 2718 + tensor_rank)


model_parallel_cuda_manual_seed = model_parallel_seed


def _rng_state():
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda, _tracker.get_states()


def _set_rng_state(state):
    cpu, cuda, tracked = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    _tracker.set_states(tracked)


# ---- the checkpoint ----

def _tensor_group():
    """(context, t, rank) of the tensor group when partitioning applies, else None."""
    if not _options["partition_activations"] or _sequence_parallel or not comm.axes_made():
        return None
    ctx = comm.parallel_context()
    t = ctx.group_size("tensor")
    return (ctx, t, ctx.group_rank("tensor")) if t > 1 else None


def _stash(x):
    """What forward keeps of one tensor argument: (kept tensor, how to rebuild the argument)."""
    x = x.detach()
    group = _tensor_group()
    device = x.device
    if group is not None and x.numel() % group[1] == 0 and x.numel() >= group[1]:
        _, t, rank = group
        kept = x.reshape(-1).chunk(t)[rank].clone()  # the whole input can go once nothing else holds it
        how = ("partitioned", x.shape, device)
        _stats["partitioned_inputs"] += 1
    else:
        kept, how = x, ("whole", x.shape, device)
    if _options["cpu_checkpointing"] and kept.device.type != "cpu":
        kept = kept.to("cpu", non_blocking=True)
    return kept, how


def _unstash(kept, how):
    kind, shape, device = how
    if kept.device != device:
        kept = kept.to(device, non_blocking=True)
    if kind == "whole":
        return kept
    from . import _C
    return _C.tensor_parallel.gather_from_tensor_region(kept.contiguous(), comm.parallel_context(), 0).view(shape)


# An argument that requires grad, so that a checkpoint's outputs do even when none of its tensor
# arguments does (the parameters used inside are not arguments): their gradients still flow.
_REQUIRES_GRAD = torch.empty(0, requires_grad=True)


class CheckpointFunction(torch.autograd.Function):
    """forward(run_function, always_requires_grad, *args) without a graph; backward recomputes it
    and back-propagates. Call it through checkpoint()."""

    @staticmethod
    def forward(ctx, run_function, always_requires_grad, *args):
        sync = _options["synchronize_checkpoint_boundary"] and torch.cuda.is_available()
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter() if _options["profile"] else None
        ctx.run_function = run_function
        ctx.rng = _rng_state()
        with torch.no_grad():
            outputs = run_function(*args)
        ctx.slots = []  # per argument: None (tensor, in saved_tensors) or the argument itself
        kept, ctx.hows, ctx.requires = [], [], []
        for a in args:
            if torch.is_tensor(a):
                k, how = _stash(a)
                kept.append(k)
                ctx.hows.append(how)
                ctx.requires.append(a.requires_grad)
                ctx.slots.append(None)
            else:
                ctx.slots.append(a)
        ctx.save_for_backward(*kept)
        _stats["checkpoints"] += 1
        if start is not None:
            _stats["forward_s"] += time.perf_counter() - start
        if sync:
            torch.cuda.synchronize()
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        start = time.perf_counter() if _options["profile"] else None
        tensors = iter([_unstash(k, how).detach().requires_grad_(req)
                        for k, how, req in zip(ctx.saved_tensors, ctx.hows, ctx.requires)])
        args = [next(tensors) if slot is None else slot for slot in ctx.slots]
        current = _rng_state()
        _set_rng_state(ctx.rng)  # the forward's random draws again (dropout masks)
        try:
            with torch.enable_grad():
                outputs = ctx.run_function(*args)
        finally:
            _set_rng_state(current)
        if torch.is_tensor(outputs):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if torch.is_tensor(o) and o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        _stats["recomputations"] += 1
        if start is not None:
            _stats["recompute_s"] += time.perf_counter() - start
        return (None, None) + tuple(a.grad if torch.is_tensor(a) and slot is None else None
                                    for a, slot in zip(args, ctx.slots))


def checkpoint(function, *args):
    """function(*args), its activations recomputed in backward instead of kept (DeepSpeed's
    deepspeed.checkpointing.checkpoint). Positional arguments only; tensors among them are saved."""
    return CheckpointFunction.apply(function, _REQUIRES_GRAD, *args)


def checkpoint_modules(model, names=None):
    """Wraps the forward of each module named in `names` (default: the entries of the model's
    longest nn.ModuleList, i.e. its transformer blocks) in checkpoint(); returns their names. The
    modules must take positional arguments only."""
    named = dict(model.named_modules())
    if names is None:
        lists = [(n, m) for n, m in named.items() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
        if not lists:
            raise ValueError("tessera.checkpointing.checkpoint_modules: the model has no nn.ModuleList of blocks; "
                             "give the module names")
        prefix, blocks = max(lists, key=lambda nm: len(nm[1]))
        names = ["%s.%d" % (prefix, i) if prefix else str(i) for i in range(len(blocks))]
    for name in names:
        if name not in named:
            raise ValueError("tessera.checkpointing.checkpoint_modules: %r is not a module of the model" % name)
        module = named[name]
        if getattr(module, "_tessera_checkpointed", False):
            continue
        inner = module.forward

        def forward(*args, _inner=inner, _name=name, **kwargs):
            if kwargs:
                raise TypeError("tessera.checkpointing: the checkpointed module %s takes positional arguments only, "
                                "got %s" % (_name, ", ".join(kwargs)))
            return checkpoint(_inner, *args)

        module.forward = forward
        module._tessera_checkpointed = True
    return list(names)


@contextlib.contextmanager
def measure_saved_bytes():
    """Counts the bytes autograd saves for backward inside the block (each storage once): the
    activation memory of a forward, as the estimator means it. Yields a dict; read "bytes" after."""
    seen = set()
    result = {"bytes": 0, "tensors": 0}

    def pack(t):
        if isinstance(t._base if t._base is not None else t, torch.nn.Parameter):
            return t  # a parameter or a view of one (linear saves weight.t()), not an activation
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.device)
        if key not in seen and storage.nbytes():
            seen.add(key)
            result["bytes"] += storage.nbytes()
            result["tensors"] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result
