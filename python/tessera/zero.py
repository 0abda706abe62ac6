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
"""
import weakref

import torch

# Partitioned parameter (by id) -> the engine that owns it (a weak reference).
_owners = {}


def _register(engine, params):
    ref = weakref.ref(engine)
    for p in params:
        _owners[id(p)] = ref


def _unregister(params):
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
    zero.GatheredParameters; all of an engine's parameters are gathered, not only those named).
    modifier_rank: the data-parallel rank whose changes to the parameters count; when the block
    ends, its values are broadcast and become every rank's shards and fp32 master copy (None: the
    parameters are only read). Collective: every rank of the data group enters the block."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        self._engines = _engines_of(params) if enabled else []
        self._modifier_rank = modifier_rank

    def __enter__(self):
        for engine in self._engines:
            engine._c.gather_all_parameters()
        return self

    def __exit__(self, exc_type, exc, tb):
        for engine in self._engines:
            try:
                if self._modifier_rank is not None and exc_type is None:
                    with torch.no_grad():
                        engine._c.write_back_parameters(self._modifier_rank)
            finally:
                engine._c.release_all_parameters()
        return False


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


def _install_fetching(module, cengine):
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


def _restore(installed):
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


__all__ = ["GatheredParameters"]
