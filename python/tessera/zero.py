"""ZeRO stage 3 from Python: what deepspeed.zero offers for partitioned parameters.

At stage 3 each rank keeps 1/N of every large parameter; a parameter holds data only while the
unit that uses it runs (the engine gathers and releases it, zero/partitioned_parameters.h).
Read elsewhere, a released parameter is NaN (in its shape); gather them for a while instead:

    with tessera.zero.GatheredParameters(engine.module.parameters()):
        print(engine.module.lm_head.weight.norm())
    with tessera.zero.GatheredParameters(model.parameters(), modifier_rank=0):
        if engine.dp_rank == 0:
            model.head.weight.normal_()   # rank 0's values reach every rank's shard when the block ends

At stages 0-2 (or for tensors no engine partitions) GatheredParameters does nothing.

Building a model too large for one rank: zero.Init partitions each module's parameters as soon as
the module is built (DeepSpeed's zero.Init), so no rank ever holds the whole model:

    with tessera.zero.Init(config=cfg):
        model = MyModel()          # each rank keeps 1/N of every parameter
    engine, _, _, _ = tessera.initialize(model=model, config=cfg)
"""
import functools
import json
import weakref

import torch
from torch.overrides import TorchFunctionMode

from . import _C, comm
from ._config import config_text

# Partitioned parameter (by id) -> the engine that owns it (a weak reference).
_owners = {}


def register_engine(engine, params):
    ref = weakref.ref(engine)
    for p in params:
        _owners[id(p)] = ref


def unregister_engine(params):
    for p in params:
        _owners.pop(id(p), None)


def _engines_of(params):
    if isinstance(params, torch.Tensor):
        params = [params]
    engines = []
    for p in params:
        ref = _owners.get(id(p))
        engine = ref() if ref is not None else None
        if engine is not None and all(engine is not e for e in engines):
            engines.append(engine)
    return engines


class GatheredParameters:
    """Every parameter of the engines that own `params` is whole inside the block (DeepSpeed's
    zero.GatheredParameters; all of an engine's parameters are gathered, not only those named),
    and so are those of `params` built under zero.Init and not handed to an engine yet (only
    those: custom initialization one parameter or module at a time).
    modifier_rank: the data-parallel rank whose changes to the parameters count; when the block
    ends, its values are broadcast and become every rank's shards and fp32 master copy (None: the
    parameters are only read). Collective: every rank of the data group enters the block."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.Tensor):
            params = [params]
        params = list(params) if enabled and params is not None else []
        self._engines = _engines_of(params)
        self._modifier_rank = modifier_rank
        self._built = {}  # id(init) -> (its C++ half, [parameters it holds])
        for p in params:
            init = getattr(p, "_tessera_init", None)
            if init is not None and init.holds(p):
                self._built.setdefault(id(init), (init, []))[1].append(p)

    def __enter__(self):
        for init, params in self._built.values():
            init.gather(params)
        for engine in self._engines:
            engine._c.gather_all_parameters()
        return self

    def __exit__(self, exc_type, exc, tb):
        modify = self._modifier_rank is not None and exc_type is None
        for init, params in self._built.values():
            init.release(params, int(self._modifier_rank) if modify else -1)
        for engine in self._engines:
            try:
                if modify:
                    with torch.no_grad():
                        engine._c.write_back_parameters(self._modifier_rank)
            finally:
                engine._c.release_all_parameters()
        return False


def _module_classes():
    """torch.nn.Module and every subclass defined so far."""
    seen, stack = set(), [torch.nn.Module]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
    return seen


class Init:
    """Builds a model partitioned across the data-parallel ranks (DeepSpeed's zero.Init).

    Inside the block, when a module's __init__ returns, its trainable parameters that are not
    partitioned yet are: rank 0's values are broadcast (one collective per module), each rank keeps
    its 1/N chunk of each, and the parameter keeps its shape, dtype and requires_grad but holds no
    bytes (it reads as NaN). Peak memory while building is the chunks plus one module.
    tessera.initialize() then builds the engine's buffers from the chunks, bucket by bucket.

    config (or config_dict_or_path): the config tessera.initialize() will get; the block joins the
    process groups for its parallel degrees. With zero_optimization.stage other than 3, or
    enabled=False, the block does nothing. plan: the planner's request tessera.initialize() will
    get, when the config's layout keys are "auto" (docs/planner.md): Init resolves them the same
    way and partitions when the stage chosen is 3. dtype: parameters are converted to it before they are
    partitioned. module: partition an already built module instead of using a `with` block.
    Custom initialization after a module is built (a root's __init__ writing into its children's
    weights: `p.copy_(...)`, `nn.init.normal_(p)`, `p.data.fill_(...)`) takes effect: inside the
    block an in-place write to a partitioned parameter runs inside GatheredParameters(p,
    modifier_rank=0) (every rank builds the model, so every rank makes the same writes; rank 0's
    values are kept, as if the model were built whole there). Writing through the gather explicitly
    still works.
    Frozen parameters (requires_grad False) and buffers stay whole. Every rank builds the model.
    """

    _active = None  # the Init whose block is open (blocks nest: the outermost one partitions)

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 plan=None):
        if config is not None and config_dict_or_path is not None:
            raise ValueError("tessera.zero.Init: give config or config_dict_or_path, not both")
        if config is None:
            config = config_dict_or_path
        if data_parallel_group is not None or mpu is not None:
            raise ValueError("tessera.zero.Init: data_parallel_group= and mpu= are not supported: the process groups "
                             "come from the config's parallel degrees, as tessera.initialize() makes them")
        if remote_device not in (None, "none"):
            raise ValueError("tessera.zero.Init: remote_device=%r is not supported: parameters are partitioned on the "
                             "device they are built on (offload is set in the config's zero_optimization)"
                             % (remote_device,))
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError("tessera.zero.Init: dtype must be a floating-point torch.dtype, got %r" % (dtype,))
        self._dtype = dtype
        self._cinit = None
        self._wrapped = {}  # class -> its own __init__
        self._entered = False
        if not enabled:
            return
        if config is None:
            raise TypeError("tessera.zero.Init: missing config (a path, JSON text or a dict: the one tessera.initialize() "
                            "gets)")
        text = config_text(config, "tessera.zero.Init")
        try:  # "auto" layout keys: the stage the planner will choose in tessera.initialize(..., plan=plan)
            text, _ = _C.resolve_auto_layout(text, comm.get_world_size(), json.dumps(plan or {}))
        except (ValueError, RuntimeError) as e:
            if plan is not None:
                raise
            raise ValueError("tessera.zero.Init: the config leaves layout keys to the planner (\"auto\"), so the ZeRO "
                             "stage is not known yet: give plan= (the model and hardware request tessera.initialize "
                             "gets) so that Init partitions for the stage the planner chooses (%s)" % e) from None
        cfg, _ = _C.load_config(text, comm.get_world_size())
        if cfg.zero_stage != 3:
            return
        # The backend initialize() will ask for: Gloo for a model built on the CPU, else NCCL where a GPU is.
        device = torch.get_default_device()
        backend = "gloo" if device.type == "cpu" else "auto"
        context = comm.parallel_context(backend, cfg.tensor, cfg.pipe, device=device, context=cfg.context)
        self._cinit = _C.PartitionedInit(context)
        if module is not None:
            if not isinstance(module, torch.nn.Module):
                raise TypeError("tessera.zero.Init: module must be a torch.nn.Module")
            self._partition(module)

    def _partition(self, module):
        params = [p for p in module.parameters() if p.requires_grad and getattr(p, "_tessera_init", None) is None]
        if not params:
            return
        if self._dtype is not None:
            for p in params:
                if p.dtype != self._dtype:
                    p.data = p.data.to(self._dtype)
        self._cinit.partition(params)
        for p in params:
            p._tessera_init = self._cinit

    def _wrap(self, cls):
        original = cls.__dict__.get("__init__")
        if original is None or cls in self._wrapped:
            return
        init = self

        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            # Only the most derived class's __init__ partitions: a subclass may still write into the
            # parameters its base made.
            outermost = "_tessera_building" not in module.__dict__
            if outermost:
                module.__dict__["_tessera_building"] = True
            try:
                original(module, *args, **kwargs)
            finally:
                if outermost:
                    module.__dict__.pop("_tessera_building", None)
            if outermost and Init._active is init:
                init._partition(module)

        cls.__init__ = __init__
        self._wrapped[cls] = original

    def __enter__(self):
        if self._cinit is None or Init._active is not None:
            return self
        Init._active = self
        self._entered = True
        self._writes = _WritesThroughGather()
        self._writes.__enter__()
        for cls in _module_classes():
            if cls is not torch.nn.Module:
                self._wrap(cls)
        # Classes defined inside the block are wrapped when they are defined.
        self._own_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")
        init, previous = self, self._own_init_subclass

        def __init_subclass__(cls, **kwargs):
            if previous is not None:
                previous.__get__(None, cls)(**kwargs)
            else:
                super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            init._wrap(cls)

        torch.nn.Module.__init_subclass__ = classmethod(__init_subclass__)
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self._entered:
            return False
        for cls, original in self._wrapped.items():
            cls.__init__ = original
        self._wrapped.clear()
        if self._own_init_subclass is not None:
            torch.nn.Module.__init_subclass__ = self._own_init_subclass
        else:
            del torch.nn.Module.__init_subclass__
        Init._active = None
        self._entered = False
        self._writes.__exit__(exc_type, exc, tb)
        return False


def _partitioned(t):
    """The parameter `t` is, or whose `.data` alias it is, when zero.Init holds its chunks; else None."""
    p = getattr(t, "_tessera_data_of", t)
    init = getattr(p, "_tessera_init", None)
    return p if init is not None and init.holds(p) else None


class _WritesThroughGather(TorchFunctionMode):
    """Inside zero.Init: an in-place write (a function or method whose name ends in "_", or
    __setitem__) to a partitioned parameter, or to its `.data`, runs on the parameter gathered
    (GatheredParameters(p, modifier_rank=0)), so the write reaches every rank's chunk instead of
    failing on the released placeholder (whose one element every position aliases)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__" and args and getattr(func, "__self__", None) is torch.Tensor.data:
            # `p.data`: an alias that remembers its parameter, so that a write through it gathers.
            out = func(*args, **kwargs)
            p = _partitioned(args[0])
            if p is not None:
                out._tessera_data_of = p
            return out
        writes = name == "__setitem__" or (name.endswith("_") and not name.startswith("__"))
        # The tensor written: the first argument (a method's self), or nn.init's `tensor=` keyword.
        key = None if args else next((k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), None)
        written = args[0] if args else kwargs.get(key)
        target = _partitioned(written) if writes and isinstance(written, torch.Tensor) else None
        if target is None:
            return func(*args, **kwargs)
        with GatheredParameters([target], modifier_rank=0), torch.no_grad():
            # The gathered values live in new storage: the write goes there, not to the placeholder.
            if args:
                func(target.detach(), *args[1:], **kwargs)
            else:
                func(**dict(kwargs, **{key: target.detach()}))
        return written


class _InForward:
    """Whether the model's forward is running (root module hooks): only then does a read gather.
    Elsewhere a gather would be a collective that one rank alone may start (a log line on rank 0)."""

    def __init__(self):
        self.depth = 0

    def enter(self, module, inputs):
        self.depth += 1

    def leave(self, module, inputs, output):
        self.depth = max(0, self.depth - 1)


class _FetchingParameters(dict):
    """A module's `_parameters` at ZeRO-3: during the forward, reading a parameter through the module
    (`self.weight`) outside the unit that lists it (a tied weight read by the parent's forward)
    gathers it first, as DeepSpeed's ZeROOrderedDict does. Iteration (parameters(), state_dict)
    does not gather."""

    __slots__ = ("_cengine", "_forward")

    def __init__(self, parameters, cengine, forward):
        super().__init__(parameters)
        self._cengine = cengine
        self._forward = forward

    def __getitem__(self, name):
        p = dict.__getitem__(self, name)
        if p is not None and self._forward.depth:
            self._cengine.fetch_parameter(p)
        return p


def install_fetching(module, cengine):
    """Replaces the `_parameters` of every submodule that has parameters and hooks the root's forward;
    returns what to undo."""
    forward = _InForward()
    hooks = [module.register_forward_pre_hook(forward.enter), module.register_forward_hook(forward.leave)]
    replaced = []
    for m in module.modules():
        if m._parameters and not isinstance(m._parameters, _FetchingParameters):
            replaced.append((m, m._parameters))
            m._parameters = _FetchingParameters(m._parameters, cengine, forward)
    return hooks, replaced


def restore_fetching(installed):
    if not installed:
        return
    hooks, replaced = installed
    for h in hooks:
        h.remove()
    for m, original in replaced:
        current = m._parameters
        original.clear()
        original.update(dict.items(current))
        m._parameters = original


__all__ = ["GatheredParameters", "Init"]
